"""Pulses as rotations: spinor composition, slice positions, and the Cayley-Klein pair of an RF definition.

**Convention.** A rotation is the SU(2) matrix `U = [[a, b], [-conj(b), conj(a)]]` of the right-handed
rotation of the magnetization (the rotation convention: a 0-phase pulse turns +z to `-i sin(alpha)`), and
`(a, b)` is its first row. A rotation by angle `|n|` about `n = (nx, ny, nz)` is `a = cos(|n|/2) - i nz sin(|n|/2)/|n|`,
`b = -i (nx - i ny) sin(|n|/2)/|n|`: an on-resonance real drive of area t gives `(cos t/2, -i sin t/2)`, and a
spin at +z ends at `Mxy = -2 conj(a b)`, `Mz = |a|^2 - |b|^2`. Composition in play order is the matrix product
`U_last ... U_first`. On the EPG states (F+, F-, Z) the rotation is

    [[ conj(a)^2,      -conj(b)^2,      -2 conj(a) conj(b) ],
     [ -b^2,            a^2,            -2 a b             ],
     [ conj(a) b,       a conj(b),      |a|^2 - |b|^2      ]]

(`T R T^-1`, with `R_ij = tr(U^H s_i U s_j) / 2` the 3x3 rotation and `F+- = Mx +- i My`), which is
Weigel 2015's eq. 15 for `a = cos(alpha/2)`, `b = -i e^{-i phi} sin(alpha/2)`. An RF phase `phi` applied to a
pulse (its drive times `e^{i phi}`) takes `b` to `b e^{-i phi}` and leaves `a`.

**Slice positions** are in slice thicknesses (the passband is `[-1/2, 1/2]`). A definition of bandwidth `BW`
(Hz) plays at position x against an off-resonance of `x BW g(t)` Hz, `g` its relative slice-select gradient
(1 where it has none), so a sample of span `dt` turns the spin about z by `-2 pi x BW g dt` (the
off-resonance convention: B0 > 0 turns transverse magnetization by `-2 pi B0 t`). The rotation of a pulse is
referenced to its middle: the slice gradient's own precession before and after the middle is taken off
(`U_ref = Rz(-psi_after) U Rz(-psi_before)`), as a refocusing lobe and a symmetric design do, so that the
EPG, which plays the pulse at one instant, sees the rotation the spins keep.
"""

from __future__ import annotations

import cmath
import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

__all__ = ["compose_spinor", "ExactSliceProfile", "exact_slice_profile", "slice_profile_of", "unit_drives",
           "definition_spinor", "profile_knots", "spinor_rotation"]

REAL = torch.float64
COMPLEX = torch.complex128

#: Below this squared rotation angle (rad^2) the per-sample spinor takes its Taylor series: cos(r/2) and
#: sin(r/2)/r as power series in q = r^2 have no square root, so they and their derivatives are finite at
#: q = 0 (a zero drive with no turn: a sample of an envelope's zero crossing at the slice centre). At 1e-8 the
#: third terms are below 1e-24.
_SERIES_BELOW = 1e-8


def _sample_spinors(drive: torch.Tensor, turn: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(a, b) of each sample's rotation about (Re drive, Im drive, turn), elementwise."""
    q = drive.real**2 + drive.imag**2 + turn**2
    small = q < _SERIES_BELOW
    r = torch.sqrt(torch.where(small, torch.ones_like(q), q))
    cos_half = torch.where(small, 1 - q / 8 + q**2 / 384, torch.cos(r / 2))
    sin_over = torch.where(small, 0.5 - q / 48 + q**2 / 3840, torch.sin(r / 2) / r)  # sin(r/2) / r
    a = torch.complex(cos_half, -turn * sin_over)
    b = -1j * drive.conj() * sin_over
    return a, b


def _sample_spinors_with_slope(unit: torch.Tensor, theta: torch.Tensor, turn: torch.Tensor) -> tuple:
    """(a, b, da/dtheta, db/dtheta) of each sample's rotation about (Re d, Im d, turn), d = theta * unit.

    With q = |d|^2 + turn^2, C(q) = cos(sqrt(q)/2) and S(q) = sin(sqrt(q)/2)/sqrt(q): a = C - i turn S,
    b = -i conj(d) S, dq/dtheta = 2 theta |unit|^2, C' = -S/4, S' = (C/2 - S)/(2q) (series below
    `_SERIES_BELOW`: -1/48 + q/1920)."""
    drive = theta * unit
    unit2 = unit.real**2 + unit.imag**2
    q = theta**2 * unit2 + turn**2
    small = q < _SERIES_BELOW
    safe = torch.where(small, torch.ones_like(q), q)
    r = torch.sqrt(safe)
    cos_half = torch.where(small, 1 - q / 8 + q**2 / 384, torch.cos(r / 2))
    sin_over = torch.where(small, 0.5 - q / 48 + q**2 / 3840, torch.sin(r / 2) / r)
    d_sin_over = torch.where(small, -1 / 48 + q / 1920, (cos_half / 2 - sin_over) / (2 * safe))
    dq = 2 * theta * unit2
    a = torch.complex(cos_half, -turn * sin_over)
    b = -1j * drive.conj() * sin_over
    da = torch.complex(-sin_over / 4 * dq, -turn * d_sin_over * dq)
    db = -1j * unit.conj() * (sin_over + theta * d_sin_over * dq)
    return a, b, da, db


def _compose_with_slope(unit: torch.Tensor, theta: torch.Tensor, turns: torch.Tensor) -> tuple:
    """(a, b, da/dtheta, db/dtheta) of the composition of samples driven by theta * unit (samples on dim 0),
    by the product rule through the pairwise products."""
    unit, theta, turns = torch.broadcast_tensors(unit, theta, turns)
    a, b, da, db = _sample_spinors_with_slope(unit, theta, turns)
    while a.shape[0] > 1:
        n = a.shape[0] // 2 * 2
        a2, b2, da2, db2 = a[1:n:2], b[1:n:2], da[1:n:2], db[1:n:2]  # later
        a1, b1, da1, db1 = a[0:n:2], b[0:n:2], da[0:n:2], db[0:n:2]  # earlier
        pa, pb = _product((a2, b2), (a1, b1))
        pda = da2 * a1 + a2 * da1 - db2 * b1.conj() - b2 * db1.conj()
        pdb = da2 * b1 + a2 * db1 + db2 * a1.conj() + b2 * da1.conj()
        if n < a.shape[0]:
            pa, pb, pda, pdb = (torch.cat([x, y[n:]]) for x, y in ((pa, a), (pb, b), (pda, da), (pdb, db)))
        a, b, da, db = pa, pb, pda, pdb
    return a[0], b[0], da[0], db[0]


def _product(later: tuple, earlier: tuple) -> tuple:
    """First row of U_later U_earlier from the first rows (a, b) of both."""
    a2, b2 = later
    a1, b1 = earlier
    return a2 * a1 - b2 * b1.conj(), a2 * b1 + b2 * a1.conj()


def _stacked(values: Any, name: str, dtype) -> torch.Tensor | list:
    if isinstance(values, torch.Tensor):
        return values
    if isinstance(values, np.ndarray):
        return torch.as_tensor(values)
    if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
        raise TypeError(f"{name} must be a tensor indexed by sample along dim 0, or an iterable of one tensor per "
                        f"sample, got {type(values).__name__}")
    return [v if isinstance(v, torch.Tensor) else torch.as_tensor(v, dtype=dtype) for v in values]


def compose_spinor(drive: Any, turn_z: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """Compose per-sample rotations in play order into one Cayley-Klein pair `(a, b)` (complex128).

    Sample k rotates about `(Re drive_k, Im drive_k, turn_z_k)` by its length (rad): the drive is the RF
    nutation of the sample (its complex B1 times gamma times its span), `turn_z` the precession about z over
    it. `drive` is a tensor indexed by sample along dim 0 (real or complex), or an iterable yielding one
    tensor per sample; `turn_z` is a tensor shared by every sample, or an iterable of one tensor per sample
    (its length must match the drive's). Each sample's drive and turn broadcast against each other, and the
    result has their broadcast shape: e.g. a drive `(samples, 1)` and a turn `(positions,)` give a pair per
    position. Differentiable through both (torch autograd), also where a sample's rotation is zero. See the
    module docstring for the convention: an on-resonance real drive with area t gives `(cos t/2, -i sin t/2)`,
    and a spin at +z ends at `Mxy = -2 conj(a b)`, `Mz = |a|^2 - |b|^2`. Raises ValueError for no samples or
    mismatched lengths.
    """
    drives = _stacked(drive, "drive", COMPLEX)
    per_sample_turn = not isinstance(turn_z, (torch.Tensor, np.ndarray, int, float))
    turns = _stacked(turn_z, "turn_z", REAL) if per_sample_turn else torch.as_tensor(turn_z)
    count = drives.shape[0] if isinstance(drives, torch.Tensor) and drives.dim() else len(drives) if \
        isinstance(drives, list) else 0
    if isinstance(drives, torch.Tensor) and drives.dim() == 0:
        raise ValueError("drive must be indexed by sample along dim 0; got a 0-d tensor")
    if count == 0:
        raise ValueError("drive holds no samples: a pulse needs at least one")
    if per_sample_turn and len(turns) != count:
        raise ValueError(f"turn_z holds {len(turns)} per-sample turns, drive {count} samples; they must match")
    if isinstance(drives, list):
        drives = torch.stack(torch.broadcast_tensors(*[d.to(COMPLEX) for d in drives]))
    drives = drives.to(COMPLEX)
    if per_sample_turn:
        turns = torch.stack(torch.broadcast_tensors(*[t.to(REAL) for t in turns]))
    else:
        turns = turns.to(REAL).unsqueeze(0)
    return _compose(drives, turns)


def _compose(drives: torch.Tensor, turns: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """compose_spinor of stacked per-sample drives and turns (samples on dim 0; they broadcast)."""
    drives, turns = torch.broadcast_tensors(drives, turns)
    a, b = _sample_spinors(drives, turns)
    while a.shape[0] > 1:  # pairwise products, play order kept: (U1 U0), (U3 U2), ...; an odd last one waits
        n = a.shape[0] // 2 * 2
        pa, pb = _product((a[1:n:2], b[1:n:2]), (a[0:n:2], b[0:n:2]))
        if n < a.shape[0]:
            pa, pb = torch.cat([pa, a[n:]]), torch.cat([pb, b[n:]])
        a, b = pa, pb
    return a[0], b[0]


def spinor_rotation(a: torch.Tensor, b: torch.Tensor) -> tuple:
    """The rotation of `(a, b)` on the EPG states (F+, F-, Z), as a 3x3 nested tuple (module docstring)."""
    ac, bc = a.conj(), b.conj()
    return (
        (ac * ac, -(bc * bc), -2 * ac * bc),
        (-(b * b), a * a, -2 * a * b),
        (ac * b, a * bc, a * ac - b * bc),
    )


# ---- slice positions --------------------------------------------------------------------------------------
def _positive(name: str, value: Any) -> float:
    x = float(value)
    if not (math.isfinite(x) and x > 0):
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    return x


@dataclass(frozen=True, eq=False)
class ExactSliceProfile:
    """Where across the slice a slice-resolved simulation plays its pulses, and how it tabulates them.

    `points`: an int >= 1, that many positions evenly spaced over `[-extent/2, extent/2]` slice thicknesses
    (ends included; one point is the centre), or a 1-D tensor of explicit positions (in slice thicknesses).
    `extent` (> 0): the span the positions cover, in slice thicknesses (the passband is `[-1/2, 1/2]`; the
    default 2.0 takes in the transition bands). `bins` (>= 2) knots of effective flip on `[0, theta_max]`
    (rad) tabulate each profiled pulse's Cayley-Klein pair per position for the kernels (cubic Hermite
    interpolation); an effective flip `|flip * B1|` above `theta_max` raises ValueError there. The tissue is
    replicated per position and the signal averaged over the positions.
    """

    points: Any = 21
    extent: float = 2.0
    bins: int = 64
    theta_max: float = 2 * math.pi

    def __post_init__(self) -> None:
        points = self.points
        if isinstance(points, (torch.Tensor, np.ndarray, list, tuple)):
            t = torch.as_tensor(points, dtype=REAL).detach().cpu()
            if t.dim() != 1 or t.numel() == 0 or not bool(torch.isfinite(t).all()):
                raise ValueError(f"points must be an int >= 1 or a non-empty 1-D array of finite positions "
                                 f"(slice thicknesses), got {points!r}")
            t = t.clone()
            t.requires_grad_(False)
            object.__setattr__(self, "points", t)
        else:
            if isinstance(points, bool) or not isinstance(points, (int, np.integer)) or int(points) < 1:
                raise ValueError(f"points must be an int >= 1 or a 1-D array of positions, got {points!r}")
            object.__setattr__(self, "points", int(points))
        object.__setattr__(self, "extent", _positive("extent", self.extent))
        if isinstance(self.bins, bool) or not isinstance(self.bins, (int, np.integer)) or int(self.bins) < 2:
            raise ValueError(f"bins must be an int >= 2 (knots of effective flip), got {self.bins!r}")
        object.__setattr__(self, "bins", int(self.bins))
        object.__setattr__(self, "theta_max", _positive("theta_max", self.theta_max))

    def positions(self) -> torch.Tensor:
        """The positions, float64 `(points,)`, in slice thicknesses."""
        if isinstance(self.points, torch.Tensor):
            return self.points.clone()
        if self.points == 1:
            return torch.zeros(1, dtype=REAL)
        return torch.linspace(-self.extent / 2, self.extent / 2, self.points, dtype=REAL)

    def key(self) -> tuple:
        """What identifies the profile for caches: positions, bins and theta_max."""
        return (self.positions().numpy().tobytes(), self.bins, self.theta_max)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ExactSliceProfile) and self.key() == other.key()

    def __hash__(self) -> int:
        return hash(self.key())


def exact_slice_profile(points: Any = 21, *, extent: float = 2.0, bins: int = 64,
                        theta_max: float = 2 * math.pi) -> ExactSliceProfile:
    """`ExactSliceProfile(points, extent, bins, theta_max)`."""
    return ExactSliceProfile(points, extent, bins, theta_max)


def slice_profile_of(across_slice: Any, name: str = "across_slice") -> ExactSliceProfile | None:
    """`across_slice` as a profile: None stays None, an int N is `ExactSliceProfile(points=N)`; anything
    else but an `ExactSliceProfile` raises (naming `name`)."""
    if across_slice is None or isinstance(across_slice, ExactSliceProfile):
        return across_slice
    if isinstance(across_slice, bool) or not isinstance(across_slice, (int, np.integer)):
        raise TypeError(f"{name} must be None, an int >= 1 (positions across the slice) or an ExactSliceProfile, "
                        f"got {across_slice!r}")
    if int(across_slice) < 1:
        raise ValueError(f"{name} must be an int >= 1 (positions across the slice), got {across_slice!r}")
    return ExactSliceProfile(points=int(across_slice))


# ---- the pulse of an RF definition --------------------------------------------------------------------------
@dataclass(frozen=True)
class UnitDrives:
    """An RF definition's samples, normalized to unit effective flip (arrays, float64/complex128).

    drives: `(channels, samples)` complex, `w_ck dt_k e^{-i arg I} / |I|` with `I` the combined envelope's
    integral, so that the channels' sum over samples is 1 (a flip of 1 rad about x at phase 0);
    turns_per_position: `(samples,)`, the z turn (rad) of each sample at position 1 (it scales with the
    position): `-2 pi BW g_k dt_k`; before_middle: `(samples,)`, the fraction of each sample's span before the
    pulse's middle (for the reference to the middle).
    """

    drives: np.ndarray
    turns_per_position: np.ndarray
    before_middle: np.ndarray


def unit_drives(definition, *, rf_raster_time_s: float = 1e-6) -> UnitDrives:
    """`UnitDrives` of `definition` (memoized on it). Raises ValueError for a definition of zero area."""
    key = ("unit_drives", float(rf_raster_time_s))
    memo = definition._memo
    if key not in memo:
        area = definition.integral(rf_raster_time_s=rf_raster_time_s)
        if area == 0:
            raise ValueError(f"RF definition {definition.id} has zero area: its pulse has no flip to normalize")
        dt = definition.sample_durations(rf_raster_time_s=rf_raster_time_s)
        drives = definition.channel_envelopes() * dt * (cmath.exp(-1j * cmath.phase(area)) / abs(area))
        gradient = definition.gradient_waveform()
        g = np.ones_like(dt) if gradient is None else gradient
        turns = -2 * math.pi * definition.bandwidth_hz * g * dt
        starts = np.concatenate([[0.0], np.cumsum(dt)[:-1]])
        middle = dt.sum() / 2
        before = np.clip((middle - starts) / dt, 0.0, 1.0)
        memo[key] = UnitDrives(drives, turns, before)
    return memo[key]


def _reference_to_middle(units: UnitDrives, x: torch.Tensor, *pairs: torch.Tensor) -> tuple:
    """U_ref = Rz(-psi_after) U Rz(-psi_before), psi the slice gradient's z turn: a and b of each (a, b) of
    `pairs` (a flat list a, b, a, b, ...) turned accordingly (a derivative along the flip turns alike)."""
    turns = torch.from_numpy(units.turns_per_position).to(x.device)
    before = torch.from_numpy(units.before_middle).to(x.device)
    psi_before = (turns * before).sum() * x
    psi_after = (turns * (1 - before)).sum() * x
    turn_a, turn_b = torch.exp(0.5j * (psi_after + psi_before)), torch.exp(0.5j * (psi_after - psi_before))
    return tuple(p * (turn_a if i % 2 == 0 else turn_b) for i, p in enumerate(pairs))


def profile_knots(definition, theta: torch.Tensor, positions: torch.Tensor, *,
                  rf_raster_time_s: float = 1e-6) -> tuple:
    """(a, b, da/dtheta, db/dtheta), complex128 `(positions, knots)`, of a single-channel `definition` at the
    effective flips `theta` (knots,) and `positions` (positions,): `definition_spinor` and its derivative along
    the flip, for the kernels' profile tables (the engine's `engine.pulses`)."""
    units = unit_drives(definition, rf_raster_time_s=rf_raster_time_s)
    if units.drives.shape[0] != 1:
        raise ValueError(f"RF definition {definition.id} drives {units.drives.shape[0]} channels: a profile table "
                         "holds single-channel pulses")
    x = positions.to(REAL).reshape(-1, 1)
    unit = torch.from_numpy(units.drives[0]).reshape(-1, 1, 1)
    turn = torch.from_numpy(units.turns_per_position).reshape(-1, 1, 1) * x
    a, b, da, db = _compose_with_slope(unit, theta.to(REAL).reshape(1, 1, -1), turn)
    return _reference_to_middle(units, x, a, b, da, db)


def definition_spinor(definition, flip_rad: Any, positions: Any, *, channel_field: Any = None,
                      rf_raster_time_s: float = 1e-6) -> tuple[torch.Tensor, torch.Tensor]:
    """The Cayley-Klein pair `(a, b)` (complex128, phase 0, referenced to the pulse middle) of `definition`
    played at effective flip `flip_rad` at slice `positions`.

    `flip_rad`: the signed effective flip (rad; the event's flip times B1), a number or a tensor; `positions`:
    a tensor of positions in slice thicknesses; the two broadcast into the result's shape. The event's RF
    phase (its own, plus `arg I` of the definition, plus B1phase) is applied afterwards (`b e^{-i phi}`).
    `channel_field`: for a multi-channel (dynamic pTx) definition, the complex field of each channel,
    `(channels, *shape)` broadcasting with the result: sample k drives `sum_c field_c * drives[c, k]`. A
    single-channel definition takes none (B1 scales the flip). Differentiable through `flip_rad` and
    `channel_field`. Computed on the device of `channel_field`, else of `flip_rad`.
    """
    units = unit_drives(definition, rf_raster_time_s=rf_raster_time_s)
    device = channel_field.device if isinstance(channel_field, torch.Tensor) else \
        flip_rad.device if isinstance(flip_rad, torch.Tensor) else None
    flip = flip_rad if isinstance(flip_rad, torch.Tensor) else torch.tensor(float(flip_rad), dtype=REAL)
    flip = flip.to(device=device, dtype=REAL)
    x = torch.as_tensor(positions, dtype=REAL).to(device)
    channels = units.drives.shape[0]
    drives = torch.from_numpy(units.drives).to(device)  # (C, n)
    if channel_field is None:
        if channels > 1:
            raise ValueError(f"RF definition {definition.id} drives {channels} channels: give each channel's field "
                             "(B1 and B1phase with a leading channel axis)")
        per_sample = drives[0]
    else:
        field = torch.as_tensor(channel_field).to(COMPLEX)
        if field.shape[0] != channels:
            raise ValueError(f"channel_field has {field.shape[0]} channels, RF definition {definition.id} drives "
                             f"{channels}")
        # sum_c field_c drives_ck, with the samples leading: (n, *shape)
        per_sample = torch.tensordot(drives.T, field, dims=1)
    dims = max(per_sample.dim() - 1, flip.dim(), x.dim())
    per_sample = per_sample.reshape(per_sample.shape[:1] + (1,) * (dims + 1 - per_sample.dim()) + per_sample.shape[1:])
    drive = flip * per_sample
    turns = torch.from_numpy(units.turns_per_position).to(device)
    a, b = _compose(drive, turns.reshape((-1,) + (1,) * dims) * x)
    return _reference_to_middle(units, x, a, b)
