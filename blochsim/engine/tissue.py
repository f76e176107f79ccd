"""Tissue checks and packing: named properties -> flat per-voxel buffers for the kernels.

The one packing of the engine: `engine.simulate`, `EpgEngine` and `Simulator` all pack through
`pack_tissue`, which checks every property given (`check_tissue`, under the caller's names) and reads
which maps sit at their identity value in one host sync.

A property left at its identity value is not sent (null pointer: its physics is off). A property given
as a tensor is sent as one value broadcast to every voxel (stride 0) when it holds one element, else
expanded to the voxel shape and flattened; the expansion is a torch op, so autograd sums gradients back
over broadcast axes. A pool is present when its fraction is nonzero somewhere or carries a derivative.

Work runs on one device (`tissue_device`): the device of the first tissue tensor off the CPU, else the
CPU, unless the caller names one.
"""

from __future__ import annotations

import cmath
import math
from collections.abc import Mapping
from dataclasses import dataclass

import torch

from .. import _native as nat
from .._arrays import LastResult, broadcast_shapes, differentiated
from ..sequence.tissue import IDENTITY, POOL_LETTERS, TissueProperties

__all__ = ["PackedTissue", "PoolModel", "pack_tissue", "tissue_device", "check_tissue", "check_values", "Accepted",
           "FIELD_RANGES", "TIME_FIELDS", "broadcast_error"]

#: Relaxation times: NaN or negative is an error; 0 (clamped to 1e-6 ms: it relaxes at once) and inf (it
#: never relaxes) are allowed.
TIME_FIELDS = ("t1_ms", "t2_ms", "t1_bound_ms", "t2_bound_ms", "t2_prime_ms") + tuple(
    f"t{n}_pool_{p}_ms" for p in "bcde" for n in (1, 2)
)
_FRACTIONS = ("bound_fraction", "pool_b_fraction", "pool_c_fraction", "pool_d_fraction", "pool_e_fraction")


@dataclass(frozen=True)
class Accepted:
    """The accepted values of a property: never NaN; numbers from `low` (None: no bound; excluded when
    `low_open`) to `high` (None: no bound), +inf when `infinite`. `text` says that range, with its unit, in
    the error message."""

    low: float | None
    infinite: bool
    text: str
    high: float | None = None
    low_open: bool = False

    @classmethod
    def time(cls, what: str) -> Accepted:
        """A relaxation time: >= 0 ms or inf; 0 is clamped to 1e-6 ms. `what` says what inf means."""
        return cls(0.0, True, f"a time >= 0 ms, not NaN (0 relaxes at once: it is clamped to 1e-6 ms; {what})")

    @classmethod
    def finite(cls, unit: str) -> Accepted:
        """Any finite number."""
        return cls(None, False, f"a finite number ({unit})")


_time, _finite = Accepted.time, Accepted.finite

_RATE = Accepted(0.0, False, "a finite exchange rate >= 0 Hz")
_FRACTION = Accepted(0.0, False, "a finite fraction >= 0 (the pool fractions of a voxel sum to <= 1)")

#: The accepted range of every `TissueProperties` field (tests/test_input_checks.py walks them all).
FIELD_RANGES = {
    "t1_ms": _time("inf: no T1 recovery"),
    "t2_ms": _time("inf: no T2 decay"),
    "m0": _finite("a.u."),
    "b1": _finite("fraction of the nominal flip"),
    "b1_phase_rad": _finite("rad"),
    "b0_hz": _finite("Hz"),
    "inversion_efficiency": _finite("fraction"),
    "t2_prime_ms": _time("inf: no intravoxel spread"),
    "diffusion_um2_per_ms": Accepted(0.0, False, "a finite diffusivity >= 0 um^2/ms"),
    "velocity_m_per_s": _finite("m/s"),
    "bound_fraction": _FRACTION,
    "bound_exchange_hz": _RATE,
    "t1_bound_ms": _time("inf: no T1 recovery"),
    "t2_bound_ms": Accepted(0.0, False, "a finite time >= 0 ms (the T2 of the semisolid lineshape, which is "
                                        "undefined at inf)"),
    **{name: rule for p in "bcde" for name, rule in (
        (f"pool_{p}_fraction", _FRACTION), (f"pool_{p}_exchange_hz", _RATE),
        (f"t1_pool_{p}_ms", _time("inf: no T1 recovery")), (f"t2_pool_{p}_ms", _time("inf: no T2 decay")),
        (f"pool_{p}_shift_hz", _finite("Hz")))},
}


def _inside(t: torch.Tensor, accepted: Accepted) -> torch.Tensor:
    """Where the tensor `t` is accepted (a bool tensor of its shape), in two or three ops: a comparison is
    False at NaN."""
    if t.is_complex():
        return torch.isfinite(t)
    if accepted.low is None:
        inside = t > -math.inf if accepted.infinite else torch.isfinite(t)
    else:
        inside = t > accepted.low if accepted.low_open else t >= accepted.low
        if not accepted.infinite:
            inside = inside & (t < math.inf)
    return inside if accepted.high is None else inside & (t <= accepted.high)


def _outside(t: torch.Tensor, accepted: Accepted) -> torch.Tensor:
    """Where the tensor `t` is not accepted."""
    return ~_inside(t, accepted)


def _outside_number(x, accepted: Accepted) -> bool:
    """Whether the Python number `x` is not accepted (as `_outside`, without a tensor)."""
    if isinstance(x, complex):
        return not cmath.isfinite(x)
    x = float(x)
    if math.isnan(x) or x == -math.inf or (x == math.inf and not accepted.infinite):
        return True
    low, high = accepted.low, accepted.high
    return (low is not None and (x <= low if accepted.low_open else x < low)) or (high is not None and x > high)


def _range_error(name: str, value, accepted: Accepted) -> ValueError:
    t = value.detach() if isinstance(value, torch.Tensor) else torch.tensor(value)
    bad = _outside(t, accepted)
    count = int(bad.sum())
    index = tuple(int(i) for i in bad.nonzero()[0]) if t.dim() else ()
    first = t.reshape(-1)[bad.reshape(-1)][0].item()
    return ValueError(f"{name} must be {accepted.text}; {count} of {t.numel()} value(s) are bad, the first at "
                      f"index {index}: {first}")


def check_values(values: dict, ranges: dict, names: dict | None = None, extra=()) -> list:
    """Raise ValueError for the first of `values` (`{key: number or tensor}`) outside its range in `ranges`.

    The message names the property (`names` maps keys to the public names the caller used), the number
    of bad values, the first bad index and the accepted range. Keys without a range are not checked.
    Every tensor check, and the bool tensors of `extra` (the caller's own checks), are read back in one
    host sync; returns the values of `extra` as Python bools.
    """
    names = names or {}
    checks, owners = [], []
    for key, value in values.items():
        accepted = ranges.get(key)
        if accepted is None:
            continue
        if not isinstance(value, torch.Tensor):
            if _outside_number(value, accepted):
                raise _range_error(names.get(key, key), value, accepted)
        elif value.numel():
            checks.append(_inside(value.detach(), accepted).all())
            owners.append(key)
    if not checks and not extra:
        return []
    device = (checks or list(extra))[0].device
    flags = torch.stack([c if c.device == device else c.to(device) for c in checks + list(extra)]).tolist()  # the sync
    for key, good in zip(owners, flags, strict=False):
        if not good:
            raise _range_error(names.get(key, key), values[key], ranges[key])
    return flags[len(owners):]


def check_tissue(fields: dict, names: dict | None = None, extra=()) -> list:
    """Raise ValueError for a tissue field outside its range (`FIELD_RANGES`, `check_values`), or for pool
    fractions summing past 1 in a voxel. `fields` maps `TissueProperties` field names to the values given;
    `names` maps them to the public names of the messages. One host sync, which also reads the bool
    tensors of `extra`; returns their values."""
    names = names or {}
    given = [f for f in _FRACTIONS if f in fields and (isinstance(fields[f], torch.Tensor) or fields[f] != 0)]
    total, over = None, []
    maps = any(isinstance(fields[f], torch.Tensor) for f in given)
    if maps:
        try:
            total = sum(fields[f].detach().to(torch.float64) if isinstance(fields[f], torch.Tensor)
                        else torch.tensor(float(fields[f]), dtype=torch.float64) for f in given)
            over = [(total > 1 + 1e-6).any()]  # 1e-6: fractions meant to sum to 1, rounded in float32
        except RuntimeError:  # they do not broadcast: the packing names every shape
            total = None
    flags = check_values(fields, FIELD_RANGES, names, list(extra) + over)
    if over:
        exceeded, flags = flags[-1], flags[:-1]
    else:  # numbers only (or no fractions) are summed in Python; maps that do not broadcast, reported later
        exceeded = not maps and sum(float(fields[f]) for f in given) > 1 + 1e-6
    if exceeded:
        if not over:
            total = torch.tensor(sum(float(fields[f]) for f in given), dtype=torch.float64)
        flat = total.reshape(-1)
        worst = int(flat.argmax())
        raise ValueError(
            f"the semisolid and exchanging pool fractions ({' + '.join(names.get(f, f) for f in given)}) share the "
            f"voxel with free water, so they must sum to <= 1; the worst voxel (flat index {worst}) sums to "
            f"{flat[worst].item():.6g}"
        )
    return flags


def broadcast_error(shapes: dict) -> ValueError:
    """ValueError naming every property with its shape and the first pair that does not broadcast."""
    names = list(shapes)
    pair = None
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            try:
                broadcast_shapes(shapes[a], shapes[b])
            except ValueError:
                pair = (a, b)
                break
        if pair:
            break
    given = ", ".join(f"{k} {tuple(v)}" for k, v in shapes.items())
    conflict = f"; {pair[0]} {tuple(shapes[pair[0]])} and {pair[1]} {tuple(shapes[pair[1]])} conflict" if pair else ""
    return ValueError(f"tissue properties must broadcast against each other (NumPy rules): {given}{conflict}")


def tissue_device(fields: Mapping) -> torch.device:
    """Where work on this tissue runs: the device of the first tensor off the CPU, else the CPU."""
    for value in fields.values():
        if isinstance(value, torch.Tensor) and value.device.type != "cpu":
            return value.device
    return torch.device("cpu")


@dataclass(frozen=True)
class PoolModel:
    """Which pools a tissue has: water-like pool letters after free water, and the semisolid pool."""

    letters: tuple  # exchanging pools present, in order b, c, d, e
    semisolid: bool

    @property
    def num_transverse(self) -> int:
        return 1 + len(self.letters)

    @property
    def num_longitudinal(self) -> int:
        return self.num_transverse + int(self.semisolid)

    @property
    def pooled(self) -> bool:
        return self.num_longitudinal > 1


@dataclass
class PackedTissue:
    voxel_shape: tuple
    num_voxels: int
    values: tuple  # NUM_TISSUE entries: a [V] or [1] tensor of the kernel dtype, or None (identity)
    phase_physics: bool  # B0, B1phase, v or a pool shift given: the complex path is needed
    pools: PoolModel
    dtype: torch.dtype  # of the buffers: the kernels' number type
    device: torch.device  # where the buffers are
    # The channel fields B1_c e^{i B1phase_c}, (C, V or 1) complex128, when B1 and B1phase carry a channel axis
    # (shims or dynamic pTx: engine.pulses); None otherwise. B1 and B1phase are then not sent as tissue.
    transmit: torch.Tensor | None = None


#: Fields always sent, whatever their value: the relaxation times of free water.
_ALWAYS = ("t1_ms", "t2_ms")
_PHASE_FIELDS = ("b0_hz", "b1_phase_rad", "velocity_m_per_s")
_POOL_SHIFTS = tuple(f"pool_{x}_shift_hz" for x in POOL_LETTERS)


def pack_tissue(tissue, *, dtype: torch.dtype = torch.float32, device=None, active=(), names=None,
                channels: int | None = None) -> PackedTissue:
    """Pack `tissue` for the kernels: a `TissueProperties`, or a mapping `{engine field: number or tensor}`
    of the fields given (`t1_ms` and `t2_ms` among them; the others default to their identity value).

    Every field given is checked (`check_tissue`: NaN, a negative time, fractions past 1, ...) and a
    ValueError names it by `names` (engine field -> the caller's public name). Fields named in
    `active` are sent, and count as present, even at their identity value (a Jacobian needs them). T2'
    (`t2_prime_ms`) acts on the samples, not the states: it is not packed (`engine.t2_prime`).
    Buffers are made on `device` (default: `tissue_device`). One host sync.
    `channels` (the description's shims or dynamic pTx pulses, `engine.pulses.transmit_channels`): B1 and
    B1phase carry a leading axis of that many channels (a number is every channel's) and are packed as the
    complex channel fields `transmit` (C, V); they cannot be differentiated along in forward mode.

    The last packing is kept while its tensors are the same and unmodified and nothing is differentiated
    (`LastResult`): a loop that changes only the sequence packs and checks its tissue once.
    """
    device = None if device is None else torch.device(device)
    settings = (dtype, device, tuple(active), channels)
    owner = tissue if isinstance(tissue, TissueProperties) else None
    kept = _LAST_PACKING.kept_for(owner, settings) if owner is not None else None
    if kept is None:
        fields = dict(tissue.items())
        kept, key = _LAST_PACKING.lookup(settings, fields.items())
        if kept is None:
            kept = _pack(fields, dtype, tissue_device(fields) if device is None else device, active, names or {},
                         channels)
            _LAST_PACKING.keep(key, kept, owner=owner)
        elif owner is not None:  # kept for this object: the next call of it skips the walk over its fields
            _LAST_PACKING.keep(key, kept, owner=owner)
    return kept


_LAST_PACKING = LastResult()


_TRANSMIT = ("b1", "b1_phase_rad")


def _channel_maps(fields: dict, channels: int, names: dict, active) -> dict:
    """B1 and B1phase with their channel axis checked: tensors (C, *V) or numbers (every channel's)."""
    for name in _TRANSMIT:
        if name in active:
            raise ValueError(f"a Jacobian along {names.get(name, name)} is not available while it carries a channel "
                             "axis (shims or dynamic pTx): differentiate the channel maps in reverse mode")
        value = fields.get(name)
        if isinstance(value, torch.Tensor) and value.dim() and value.shape[0] != channels:
            raise ValueError(f"{names.get(name, name)} must carry a leading channel axis of {channels} channels (the "
                             f"description's shims or dynamic pTx pulses), got shape {tuple(value.shape)}")
    return {name: fields.get(name, IDENTITY[name]) for name in _TRANSMIT}


def _transmit(maps: dict, channels: int, voxel_shape: tuple, device) -> torch.Tensor:
    """The channel fields (C, V or 1) complex128 from the checked maps."""
    parts = []
    for name in _TRANSMIT:
        value = maps[name]
        t = value.to(device=device, dtype=torch.float64) if isinstance(value, torch.Tensor) else \
            torch.tensor(float(value), dtype=torch.float64, device=device)
        parts.append(t.reshape((1,) * (1 + len(voxel_shape))) if t.dim() == 0 else
                     t.reshape(t.shape[:1] + (1,) * (1 + len(voxel_shape) - t.dim()) + t.shape[1:]))
    field = torch.polar(*torch.broadcast_tensors(*parts))
    if all(s == 1 for s in field.shape[1:]):  # one field per channel, shared by every voxel
        return field.expand((channels,) + field.shape[1:]).reshape(channels, 1)
    return field.expand((channels,) + tuple(voxel_shape)).reshape(channels, math.prod(voxel_shape))


def _pack(fields: dict, dtype, device, active, names: dict, channels: int | None = None) -> PackedTissue:
    shapes, checks, flagged = {}, [], []
    maps = None
    if channels is not None:
        maps = _channel_maps(fields, channels, names, active)
        fields = {k: v for k, v in fields.items() if k not in _TRANSMIT}
        for name in _TRANSMIT:  # their voxel axes join the voxel shape; the channel axis does not
            if isinstance(maps[name], torch.Tensor):
                shapes[names.get(name, name)] = maps[name].shape[1:]
    for field, value in fields.items():
        if isinstance(value, torch.Tensor):
            shapes[names.get(field, field)] = value.shape
            if field not in _ALWAYS and field not in active and not differentiated(value):
                checks.append((value.detach() != IDENTITY[field]).any())
                flagged.append(field)
    # Every given property is checked under the caller's names; the same host sync reads which maps differ
    # from their identity value.
    differs = dict(zip(flagged, check_tissue(fields, names, checks), strict=True))

    def acts(field: str) -> bool:
        """Whether `field` switches its physics on: given, and active, differentiated or off its identity."""
        value = fields.get(field)
        if value is None:
            return field in active
        if field in _ALWAYS or field in active:
            return True
        if isinstance(value, torch.Tensor):
            return differs.get(field, True)  # not flagged: differentiated
        return float(value) != IDENTITY[field]

    try:
        voxel_shape = broadcast_shapes(*shapes.values())
    except ValueError:
        raise broadcast_error(shapes) from None
    num_voxels = math.prod(voxel_shape)
    values = []
    for field in nat.TISSUE_PARAMS:
        if not acts(field):
            values.append(None)
            continue
        value = fields.get(field, IDENTITY.get(field))
        if isinstance(value, torch.Tensor):
            t = value.to(device=device, dtype=dtype)
        else:
            t = torch.full((1,), float(value), dtype=dtype, device=device)
        values.append(t.reshape(1) if t.numel() == 1 else t.expand(voxel_shape).reshape(-1).contiguous())
    pools = PoolModel(tuple(x for x in POOL_LETTERS if acts(f"pool_{x}_fraction")), acts("bound_fraction"))
    phase = any(acts(f) for f in _PHASE_FIELDS + _POOL_SHIFTS)
    transmit = None
    if maps is not None:
        check_values(maps, {name: FIELD_RANGES[name] for name in _TRANSMIT}, names)
        transmit = _transmit(maps, channels, tuple(voxel_shape), device)
        phase = True
    return PackedTissue(voxel_shape, num_voxels, tuple(values), phase, pools, dtype, device, transmit)
