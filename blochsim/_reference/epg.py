"""The float64 reference EPG engine: the oracle every fast kernel is held to.

Written for clarity, not speed. Every operation is a float64/complex128 torch
expression without in-place updates, so derivatives come from torch autograd.
References: Weigel 2015 (EPG, "Extended phase graphs: dephasing, RF pulses, and
echoes - pure and simple", JMRI 41:266) and Malik 2018 (EPG-X, exchange and MT,
MRM 80:767).

States
------
Per voxel and pool, orders k = 0..K-1 (K = `states`): F+(k), F-(k), Z(k), in
units of M0. They are the signed-order Fourier coefficients F_n of the
transverse magnetization, with F+(k) = F_k and F-(k) = conj(F_{-k}), and Z(k)
for k >= 0. Every phase factor that physics applies to F_n is applied
conjugated to F-(k): F-(k) gets the conjugate of the factor F_{-k} gets.

Pools: index 0 is free water, then the exchanging pools b..e that are present
(fraction given as a tensor, or a nonzero number), then the semisolid pool if
present (`bound_fraction` a tensor or nonzero). Free water and pools b..e are
"water-like": they carry transverse magnetization, are rotated by pulses and are
summed into samples. The semisolid pool is longitudinal only. Equilibrium: Z(0)
of pool p is its fraction f_p, with f_free = 1 - (sum of all other fractions).
The initial state is equilibrium at the start of the first repetition (t = 0).

Gradient lobes
--------------
Gradients are not events: each shift is the lobe of one unit of dephasing Δk,
played at constant amplitude over a span of time. A WAIT without an action
only marks time (the engine drops it when it compiles), so spans run between
the other events, the "bounds" (pulses, readouts, WAITs that shift or spoil):
across the repetition's end on later repetitions, from t = 0 to the first
bound on the first. A CRUSH_AFTER or SHIFT_AFTER shift's lobe fills the span
after its event, a CRUSH_BEFORE shift's the span before it; a span that no
shift faces carries no gradient, and one of length 0 plays its lobes at once.
A lobe shorter than the time between two pulses is a span of its own, the
shifting WAIT at one end and another bound at the other: after a readout,
`Delay(d) @ Delay(0, action=CRUSH_BEFORE)` is a lobe of length d, and
`Dephase() @ Delay(d)` a lobe up to the next bound.
A span with L lobes, `behind` of them made by the bound that opens it (the
SHIFT_AFTER of a spoiling event is not made; its CRUSH_AFTER is, on states the
spoiler then clears), takes a state stored at signed order n from order
n - behind at its start to n - behind + L at its end, linearly in time
(Weigel 2015: the dephasing moves while a gradient is on and stands while
none is). An interval (the Δt between two consecutive events) that starts s
into a span of length T then moves it from μ = n - behind + L·s/T to μ + u,
u = L·Δt/T; an interval that is its whole span, or lies in one of length 0,
from μ = n - behind to μ + L.

Events
------
Events play in description order, the repetition `repetitions` times. Δt is the
time since the previous event: for the first event of the first repetition its
timestamp; for the first event of a later repetition
tr_duration_us - (last timestamp) + (first timestamp). Each event does, in order:

1. Interval (skipped when Δt is exactly 0 and carries no gradient).
   a. Relaxation, precession, exchange (Bloch-McConnell, each pool exchanging
      with free water only; rate free -> p is k_p·f_p, p -> free is k_p·f_free).
      Longitudinal, every order: dZ/dt = A·Z (+ R1·Zeq on order 0 only), with
      A = -diag(R1) + X, X the exchange matrix over all pools. Transverse, water-
      like pools only: dF/dt = C·F with C = -diag(R2) - i·2π·diag(B0 + shift) + X_w,
      X_w the exchange matrix of the water-like pools alone (the semisolid pool
      has no transverse magnetization to exchange: as in EPG-X, free-water
      transverse states do not exchange with it, and lose nothing to it). F+(k) evolves with exp(C·Δt),
      F-(k) with its conjugate. Both are solved exactly with a matrix
      exponential (`_expm`, scaling and squaring of a Taylor sum, accurate to
      rounding; torch.linalg.matrix_exp is not, for short intervals); the affine
      order-0 longitudinal part with the augmented (P+1)x(P+1) generator
      [[A, R1·Zeq], [0, 0]]. Relaxation times
      are clamped to >= 1e-6 ms (T = 0 gives zero signal, not NaN); T = inf
      means no relaxation.
   b. Diffusion, if the crusher geometry exists (crusher_dephasing_rad != 0 and
      voxel_size_m given): Δk = crusher_dephasing_rad/voxel_size_m (rad/m),
      b = D·1e-9·Δk²·Δt (D in um²/ms). Z(k) *= exp(-k²b); a transverse state of
      signed order n (n = k for F+(k), n = -k for F-(k)), taken from μ to μ + u
      (Gradient lobes), *= exp(-(μ² + μu + u²/3)b): Weigel's b of a dephasing
      that moves linearly from μ to μ + u (n²+n+1/3 for one lobe over a state
      stored at n, n² with no lobe).
   c. Flow, same geometry, velocity v (m/s): F_n turns by exp(-i(μ + u/2)Δk·v·Δt),
      its mean order times the distance moved (F-(k) gets the conjugate of the
      factor for n = -k), Z(k) by exp(-i·k·Δk·v·Δt).
   d. Washout, if voxel_size_m is given and v is nonzero (a tensor counts as
      nonzero): every state *= w, and (1 - w)·f_p is added to Z(0) of each pool
      p, with W(t) = 1 - min(|v|t/voxel_size_m, 1) over the span: w =
      W(s + Δt)/W(s) (0 once W(s) is 0), so that the intervals of a span
      wash out as the span does at once, W(T) (an interval that is its
      whole span or lies in one of length 0: w = W(Δt)).
2. CRUSH_BEFORE: shift.
3. RF. Use INVERSION: Z(k) of every water-like pool *= -inversion_efficiency
   (transverse states untouched, no saturation). Otherwise
   (α, φ0) = definition.signed_flip(amplitude, rf_raster_time_s=...), with
   the description's rf_raster_time_s (as for S below), α_eff = α·B1,
   φ = event phase + φ0 + B1phase, and every order of every water-like pool is
   rotated with c = cos(α_eff/2), s = sin(α_eff/2) by
       [[ c²,                   e^{2iφ}s²,           -i·e^{iφ}·sin α_eff ],
        [ e^{-2iφ}s²,           c²,                   i·e^{-iφ}·sin α_eff ],
        [ -(i/2)e^{-iφ}sin α_eff, (i/2)e^{iφ}sin α_eff, cos α_eff          ]]
   acting on (F+, F-, Z). Then the semisolid Z(k), every order, *=
   exp(S·α_eff²·G(f_rf - B0)), S = definition.saturation(rf_raster_time_s=...),
   f_rf the event frequency, G the lineshape (lineshape.py) at T2b = t2_bound_ms.
4. ADC, on the last repetition only, if kept by `record` ("all": every ADC;
   "acquired": not role NON_ACQUIRED; "echo": is_echo):
   sample = M0 · Σ_water-like pools F+(0) · exp(-iψ), ψ the ADC phase,
   times exp(-|τ|/T2') when T2' acts (see T2' below).
5. CRUSH_AFTER: shift.
6. SPOIL_AFTER: every transverse state (all orders, all pools) = 0, Z kept.
   Otherwise SHIFT_AFTER: shift.

Shift: F+(k) -> F+(k+1) (F+(K-1) is lost), F-(k) -> F-(k-1) (F-(K-1) becomes
0), then the new F+(0) = conj(new F-(0)); Z unchanged.

The final states returned are those after the last event of the last
repetition (no evolution to the end of the repetition; a last WAIT inside a
span leaves its lobes part played).

T2'
---
T2' acts when `t2_prime_ms` is finite somewhere or is a tensor that requires
grad. Each recorded sample is multiplied by exp(-|τ|/T2') (T2' clamped like the
relaxation times), τ its signed unrefocused time. Walking the played stream
(every repetition), a *pulse* is a non-inversion RF event (an inversion leaves
F+/F- alone); a *stretch* runs from one pulse to the next and holds the shifts
in between (the next pulse's CRUSH_BEFORE included, the first pulse's
CRUSH_AFTER and SHIFT_AFTER included). A stretch in which a spoil happens is
ignored. Every other stretch must wind steadily: with T_w = (sum of their
durations) / (sum of their shifts), each stretch of duration D and w shifts has
|D - w·T_w| <= 1e-6·max(D, w·T_w) + 1 ns, else ValueError (a balanced stretch,
D > 0 with w = 0, or a variable TR). A sample then has τ = (its time - its last
pulse's time) - T_w·(shifts since that pulse, up to the sample); τ = 0 when no
pulse precedes it or a spoil happened since its pulse (its signal is 0). A
sample with shifts since its pulse and no T_w (no stretch winds) raises
ValueError. Why: a Lorentzian off-resonance spread multiplies a pathway that
precessed a net time τ by exp(-|τ|/T2'), and with steady winding every pathway
that reaches F+(0) at a sample has precessed T_w times its net order plus the
open time since its pulse.

Not modelled here: static shims (shim_id != 0); they raise NotImplementedError
rather than being ignored.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from .._arrays import broadcast_shapes, differentiated
from ..sequence.events import USER_ACTIONS, AdcRole, EventAction, EventType, RfUse
from ..sequence.tissue import POOL_LETTERS, TissueProperties
from .lineshape import LINESHAPES, absorption_lineshape

__all__ = ["ReferenceResult", "play", "simulate_reference"]

REAL = torch.float64
COMPLEX = torch.complex128

#: Relaxation times (ms) are clamped to at least this, so T = 0 decays to 0 instead of dividing by 0.
MIN_RELAXATION_MS = 1e-6

RECORD_MODES = ("all", "acquired", "echo")


@dataclass(frozen=True)
class ReferenceResult:
    """What `play` returns.

    signal: complex128, (*voxel_shape, samples), the recorded ADC samples of the last repetition.
    fplus, fminus, z: complex128, (*voxel_shape, pools, states), the states after the last event;
    pool 0 is free water, then the exchanging pools present (b..e), then the semisolid pool if
    present (its fplus and fminus are zero).
    """

    signal: torch.Tensor
    fplus: torch.Tensor
    fminus: torch.Tensor
    z: torch.Tensor


def _f64(value: Any) -> torch.Tensor:
    """A float64 tensor of `value`, keeping a tensor's autograd graph."""
    if isinstance(value, torch.Tensor):
        return value.to(REAL)
    return torch.tensor(float(value), dtype=REAL)


def _is_given(value: Any) -> bool:
    """A pool is present when its fraction is a tensor (any value) or a nonzero number."""
    return isinstance(value, torch.Tensor) or float(value) != 0.0


# ---------------------------------------------------------------------------------------------
# Tissue -> per-voxel pool tables
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Pools:
    """Per-voxel pool tables, each broadcast to voxel_shape on the leading axes.

    fraction, r1_per_s, exchange_hz: (*V, P); r2_per_s, shift_hz: (*V, Pw) (water-like pools).
    exchange_hz[..., 0] is unused (free water is the hub of the exchange).
    """

    voxel_shape: torch.Size
    water: int  # Pw, the number of water-like pools
    semisolid: bool
    fraction: torch.Tensor
    r1_per_s: torch.Tensor
    exchange_hz: torch.Tensor
    r2_per_s: torch.Tensor
    shift_hz: torch.Tensor

    @property
    def count(self) -> int:
        return self.fraction.shape[-1]


def _relaxation_fields() -> list[str]:
    names = ["t1_ms", "t2_ms", "t1_bound_ms", "t2_bound_ms"]
    for letter in POOL_LETTERS:
        names += [f"t1_pool_{letter}_ms", f"t2_pool_{letter}_ms"]
    return names


def _fraction_fields() -> list[str]:
    return ["bound_fraction"] + [f"pool_{letter}_fraction" for letter in POOL_LETTERS]


def _validate_tissue(values: dict, voxel_shape: torch.Size) -> None:
    for name in _relaxation_fields():
        t = values[name].detach()
        if bool(torch.isnan(t).any()):
            raise ValueError(f"{name} holds NaN; relaxation times must be numbers >= 0 ms (inf = no relaxation)")
        if bool((t < 0).any()):
            raise ValueError(
                f"{name} holds a negative value ({float(t.min())} ms); relaxation times must be >= 0 ms"
            )
    total = torch.zeros(voxel_shape, dtype=REAL)
    for name in _fraction_fields():
        f = values[name].detach()
        if not bool((f >= 0).all()):  # also catches NaN
            bad = f[~(f >= 0)].reshape(-1)[0]
            raise ValueError(f"{name} must be >= 0 in every voxel (a fraction of M0), got {float(bad)}")
        total = total + f
    # 1e-12 of slack so that fractions meant to sum to 1 are not rejected for float rounding.
    if bool((total > 1.0 + 1e-12).any()):
        worst = int(torch.argmax(total))
        index = tuple(int(i) for i in torch.unravel_index(torch.tensor(worst), voxel_shape)) if voxel_shape else ()
        raise ValueError(
            f"pool fractions (bound_fraction + pool_b..e_fraction) must sum to <= 1 in every voxel; "
            f"voxel {index} sums to {float(total.reshape(-1)[worst])}"
        )
    t2_prime = values["t2_prime_ms"].detach()
    if not bool((t2_prime >= 0).all()):  # also catches NaN
        raise ValueError("t2_prime_ms must be >= 0 ms in every voxel (inf = no T2'), it holds NaN or a negative value")


def _pools(tissue: TissueProperties) -> tuple[_Pools, dict]:
    """Pool tables and the float64 field values (broadcast to the voxel shape) of `tissue`."""
    raw = dict(tissue.items())
    tensors = [v for v in raw.values() if isinstance(v, torch.Tensor)]
    voxel_shape = broadcast_shapes(*(t.shape for t in tensors)) if tensors else torch.Size([])
    values = {name: torch.broadcast_to(_f64(v), voxel_shape) for name, v in raw.items()}
    _validate_tissue(values, voxel_shape)

    def rate(name: str) -> torch.Tensor:  # ms -> 1/s, clamped; inf -> 0
        return 1e3 / torch.clamp(values[name], min=MIN_RELAXATION_MS)

    letters = [x for x in POOL_LETTERS if _is_given(raw[f"pool_{x}_fraction"])]
    semisolid = _is_given(raw["bound_fraction"])
    other_fractions = [values[f"pool_{x}_fraction"] for x in letters]
    if semisolid:
        other_fractions.append(values["bound_fraction"])
    f_free = 1.0 - sum(other_fractions, torch.zeros(voxel_shape, dtype=REAL))

    fraction = [f_free] + other_fractions
    r1 = [rate("t1_ms")] + [rate(f"t1_pool_{x}_ms") for x in letters]
    exchange = [torch.zeros(voxel_shape, dtype=REAL)] + [values[f"pool_{x}_exchange_hz"] for x in letters]
    r2 = [rate("t2_ms")] + [rate(f"t2_pool_{x}_ms") for x in letters]
    shift = [torch.zeros(voxel_shape, dtype=REAL)] + [values[f"pool_{x}_shift_hz"] for x in letters]
    if semisolid:
        r1.append(rate("t1_bound_ms"))
        exchange.append(values["bound_exchange_hz"])
    pools = _Pools(
        voxel_shape=voxel_shape,
        water=1 + len(letters),
        semisolid=semisolid,
        fraction=torch.stack(fraction, -1),
        r1_per_s=torch.stack(r1, -1),
        exchange_hz=torch.stack(exchange, -1),
        r2_per_s=torch.stack(r2, -1),
        shift_hz=torch.stack(shift, -1),
    )
    return pools, values


def _exchange_matrix(fraction: torch.Tensor, exchange_hz: torch.Tensor) -> torch.Tensor:
    """Bloch-McConnell exchange generator (*V, P, P) in 1/s, every pool exchanging with pool 0.

    Pool 0 (free water) loses k_p·f_p to pool p and gains k_p·f_free from it, so the columns sum
    to zero (total magnetization conserved) and (f_free, f_p, ...) is in the null space.
    """
    count = fraction.shape[-1]
    zero = torch.zeros_like(fraction[..., 0])
    to_pool = [exchange_hz[..., p] * fraction[..., p] for p in range(count)]  # free -> p
    to_free = [exchange_hz[..., p] * fraction[..., 0] for p in range(count)]  # p -> free
    rows = [[zero] * count for _ in range(count)]
    rows[0][0] = -sum(to_pool[1:], zero)
    for p in range(1, count):
        rows[0][p] = to_free[p]
        rows[p][0] = to_pool[p]
        rows[p][p] = -to_free[p]
    return torch.stack([torch.stack(row, -1) for row in rows], -2)


# ---------------------------------------------------------------------------------------------
# The state and the operators on it
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _State:
    """fplus, fminus: (*V, Pw, K) water-like pools; z: (*V, P, K) all pools. complex128."""

    fplus: torch.Tensor
    fminus: torch.Tensor
    z: torch.Tensor


def _equilibrium(pools: _Pools, states: int) -> _State:
    shape = (*pools.voxel_shape, pools.water, states)
    first_order = torch.zeros(states, dtype=REAL)
    first_order[0] = 1.0  # a constant, not a tensor that needs grad
    z = pools.fraction[..., None] * first_order
    zero = torch.zeros(shape, dtype=COMPLEX)
    return _State(zero, zero, z.to(COMPLEX))


def _shift(state: _State) -> _State:
    """One unit of dephasing: F+(k) -> F+(k+1), F-(k) -> F-(k-1), new F+(0) = conj(new F-(0))."""
    fminus = torch.cat([state.fminus[..., 1:], torch.zeros_like(state.fminus[..., :1])], -1)
    fplus = torch.cat([fminus[..., :1].conj(), state.fplus[..., :-1]], -1)
    return _State(fplus, fminus, state.z)


def _spoil(state: _State) -> _State:
    return _State(torch.zeros_like(state.fplus), torch.zeros_like(state.fminus), state.z)


@dataclass(frozen=True)
class _Interval:
    """The evolution over one interval Δt, precomputed once per event position.

    z_propagator (*V, P, P) and z0_recovery (*V, P): Z(k) -> z_propagator·Z(k), plus z0_recovery on
    Z(0). f_propagator (*V, Pw, Pw): F+(k) -> f_propagator·F+(k), F-(k) -> conj(f_propagator)·F-(k).
    The *_factor tensors (*V, 1, K) (or None) multiply the states afterwards (diffusion, flow and
    washout folded together, in that order; they commute, all being per-state factors), and
    washout_recovery (*V, P) (or None) is then added to Z(0).
    """

    z_propagator: torch.Tensor
    z0_recovery: torch.Tensor
    f_propagator: torch.Tensor
    fplus_factor: torch.Tensor | None
    fminus_factor: torch.Tensor | None
    z_factor: torch.Tensor | None
    washout_recovery: torch.Tensor | None

    def apply(self, state: _State) -> _State:
        z = self.z_propagator.to(COMPLEX) @ state.z
        z = _add_to_order0(z, self.z0_recovery)
        fplus = self.f_propagator @ state.fplus
        fminus = self.f_propagator.conj() @ state.fminus
        if self.fplus_factor is not None:
            fplus = fplus * self.fplus_factor
            fminus = fminus * self.fminus_factor
            z = z * self.z_factor
        if self.washout_recovery is not None:
            z = _add_to_order0(z, self.washout_recovery)
        return _State(fplus, fminus, z)


def _add_to_order0(z: torch.Tensor, per_pool: torch.Tensor) -> torch.Tensor:
    """z (*V, P, K) with per_pool (*V, P) added to order 0, without writing into z."""
    first_order = torch.zeros(z.shape[-1], dtype=REAL)
    first_order[0] = 1.0
    return z + (per_pool[..., None] * first_order).to(COMPLEX)


def _expm(x: torch.Tensor) -> torch.Tensor:
    """exp of a batch of square matrices (..., n, n): scaling and squaring of a degree-18 Taylor sum.

    Why not torch.linalg.matrix_exp: it picks its polynomial degree from a backward-error bound
    relative to ||x||, which for short intervals (||x|| ~ 1e-2 and below) leaves up to ~3e-14 error
    in exp(x) and up to ~5e-9 relative error in the small recovery entries (1 - E1): too coarse for
    an oracle that double-precision kernels are held to at 1e-12. Scaling until ||x/2^s||_1 <= 1/4
    and summing 18 terms leaves a truncation error of 0.25^19/19! ~ 5e-29, so only rounding remains
    (Moler & Van Loan 2003, "Nineteen dubious ways...", method 3). s is one integer for the whole
    batch (from the largest column sum), read from detached values: autograd differentiates the
    polynomial and the squarings.
    """
    norm = float(x.detach().abs().sum(-2).amax()) if x.numel() else 0.0
    if not math.isfinite(norm):
        raise ValueError("an interval generator holds a non-finite rate (check B0, shifts and exchange rates)")
    squarings = max(0, math.ceil(math.log2(norm / 0.25))) if norm > 0.25 else 0
    x = x / 2**squarings
    term = torch.eye(x.shape[-1], dtype=x.dtype).expand_as(x)
    total = term
    for j in range(1, 19):
        term = term @ x / j
        total = total + term
    for _ in range(squarings):
        total = total @ total
    return total


@dataclass(frozen=True)
class _Span:
    """Where an interval lies in its span (Gradient lobes in the module docstring).

    behind: the shifts of the bound that opens the span (none for the one from t = 0); lobes: those and
    the CRUSH_BEFORE of the bound that closes it. elapsed_s, length_s: float64 tensors, the span's
    time before the interval and its whole length; None when the interval is the whole span. from_start:
    the span opens at t = 0 (first repetition only; on later ones it opens in the repetition before).
    """

    behind: int
    lobes: int
    elapsed_s: torch.Tensor | None = None
    length_s: torch.Tensor | None = None
    from_start: bool = False


def _plain(event) -> bool:
    """A WAIT without an action: it only marks time."""
    return event.type == EventType.WAIT and not int(event.action) & int(USER_ACTIONS)


def _shifts_after(event) -> int:
    bits = int(event.action)
    return bool(bits & EventAction.CRUSH_AFTER) + bool(
        bits & EventAction.SHIFT_AFTER and not bits & EventAction.SPOIL_AFTER)


def _spans(events, dts: list, later_dts: list, *, first: bool) -> list[_Span]:
    """The _Span of each event's interval on the first repetition (`first`) or on a later one. `dts`: the
    intervals of that repetition; `later_dts`: those of a later one, for the parts of a span that lie in the
    repetition after it (or, on a later repetition, in the one before)."""
    n = len(events)
    plain = [_plain(e) for e in events]
    if all(plain):  # nothing shifts: no lobes, and every interval washes out alone
        return [_Span(0, 0)] * n

    def dt_at(u: int) -> torch.Tensor:  # the interval before event u, counted from this repetition's first
        return dts[u] if 0 <= u < n else later_dts[u % n]

    spans = []
    for i in range(n):
        opens = i - 1  # the bound before event i's interval; -1 on the first repetition: t = 0
        while (opens >= 0 or not first) and plain[opens % n]:
            opens -= 1
        closes = i
        while plain[closes % n]:
            closes += 1
        from_start = first and opens < 0
        behind = 0 if from_start else _shifts_after(events[opens % n])
        lobes = behind + bool(int(events[closes % n].action) & EventAction.CRUSH_BEFORE)
        if opens == i - 1 and closes == i:
            spans.append(_Span(behind, lobes, from_start=from_start))
            continue
        pieces = [dt_at(u) for u in range(opens + 1, closes + 1)]
        zero = torch.zeros((), dtype=REAL)
        spans.append(_Span(behind, lobes, sum(pieces[: i - opens - 1], zero), sum(pieces, zero), from_start))
    return spans


def _interval(dt_s: torch.Tensor, span: _Span, pools: _Pools, values: dict, geometry: dict,
              states: int) -> _Interval:
    count, water = pools.count, pools.water
    exchange = _exchange_matrix(pools.fraction, pools.exchange_hz)

    # Longitudinal, augmented with the constant recovery term on order 0:
    #   d/dt [Z0; 1] = [[A, R1·Zeq], [0, 0]] · [Z0; 1].
    a = exchange - torch.diag_embed(pools.r1_per_s)
    recovery = pools.r1_per_s * pools.fraction
    augmented = torch.cat(
        [torch.cat([a, recovery[..., None]], -1), torch.zeros((*pools.voxel_shape, 1, count + 1), dtype=REAL)], -2
    )
    propagator = _expm(augmented * dt_s)
    z_propagator = propagator[..., :count, :count]
    z0_recovery = propagator[..., :count, count]

    # Transverse, water-like pools only.
    omega = 2.0 * math.pi * (values["b0_hz"][..., None] + pools.shift_hz)  # rad/s, (*V, Pw)
    # Exchange among the water-like pools only: free water loses no transverse magnetization to the
    # semisolid pool (EPG-X, Malik 2018), so X_w is built from them alone, not sliced from X.
    exchange_w = _exchange_matrix(pools.fraction[..., :water], pools.exchange_hz[..., :water])
    c = exchange_w.to(COMPLEX) - torch.diag_embed(pools.r2_per_s + 1j * omega)
    f_propagator = _expm(c * dt_s)

    fplus_factor = fminus_factor = z_factor = washout_recovery = None
    order = torch.arange(states, dtype=REAL)
    whole = span.length_s is None or float(span.length_s.detach()) == 0.0
    if geometry["crusher"]:
        dk = geometry["dk_rad_per_m"]
        b = (values["diffusion_um2_per_ms"] * 1e-9 * dk**2 * dt_s)[..., None, None]
        phase = (dk * values["velocity_m_per_s"] * dt_s)[..., None, None]  # rad per unit order
        # The dephasing over the interval, from stored order n: n + start to n + start + winding.
        if whole:
            start, winding = float(-span.behind), float(span.lobes)
        else:
            start = span.lobes * span.elapsed_s / span.length_s - span.behind
            winding = span.lobes * dt_s / span.length_s

        def weighed(n):  # Weigel's diffusion weight and the mean order of signed order n
            m = n + start
            return m**2 + m * winding + winding**2 / 3.0, m + winding / 2.0

        # F+(k) has signed order n = k; F-(k) = conj(F_{-k}) takes the conjugate of order -k's factor.
        c_plus, f_plus = weighed(order)
        c_minus, f_minus = weighed(-order)
        fplus_factor = torch.exp(-c_plus * b) * torch.exp(-1j * f_plus * phase)
        fminus_factor = torch.exp(-c_minus * b) * torch.exp(1j * f_minus * phase)
        z_factor = torch.exp(-(order**2) * b) * torch.exp(-1j * order * phase)
    if geometry["washout"]:
        speed = torch.abs(values["velocity_m_per_s"]) / geometry["voxel_size_m"]  # voxels per s
        if whole:
            w = 1.0 - torch.clamp(speed * dt_s, max=1.0)
        else:  # the span's washout, W(s + Δt) / W(s)
            left = 1.0 - torch.clamp(speed * span.elapsed_s, max=1.0)
            after = 1.0 - torch.clamp(speed * (span.elapsed_s + dt_s), max=1.0)
            w = torch.where(left > 0, after / torch.where(left > 0, left, 1.0), 0.0)
        w3 = w[..., None, None].to(COMPLEX)
        fplus_factor = w3 if fplus_factor is None else fplus_factor * w3
        fminus_factor = w3 if fminus_factor is None else fminus_factor * w3
        z_factor = w3 if z_factor is None else z_factor * w3
        washout_recovery = (1.0 - w)[..., None] * pools.fraction
    if fplus_factor is not None:
        shape = (*pools.voxel_shape, 1, states)
        fplus_factor, fminus_factor, z_factor = (
            torch.broadcast_to(x, shape) for x in (fplus_factor, fminus_factor, z_factor)
        )
    return _Interval(z_propagator, z0_recovery, f_propagator, fplus_factor, fminus_factor, z_factor, washout_recovery)


@dataclass(frozen=True)
class _Pulse:
    """One RF event as a function of the state: an inversion factor, or a rotation and saturation.

    inversion (*V) or None; rotation: 3x3 nested tuple of (*V) complex entries, acting on (F+, F-, Z);
    saturation (*V) real factor on the semisolid Z, or None.
    """

    inversion: torch.Tensor | None
    rotation: tuple | None
    saturation: torch.Tensor | None

    def apply(self, state: _State, water: int) -> _State:
        z_water, z_semisolid = state.z[..., :water, :], state.z[..., water:, :]
        if self.inversion is not None:
            z_water = z_water * (-self.inversion[..., None, None])
            return _State(state.fplus, state.fminus, torch.cat([z_water, z_semisolid], -2))
        (t00, t01, t02), (t10, t11, t12), (t20, t21, t22) = (
            tuple(entry[..., None, None] for entry in row) for row in self.rotation
        )
        fp, fm = state.fplus, state.fminus
        fplus = t00 * fp + t01 * fm + t02 * z_water
        fminus = t10 * fp + t11 * fm + t12 * z_water
        z_water = t20 * fp + t21 * fm + t22 * z_water
        if self.saturation is not None:
            z_semisolid = z_semisolid * self.saturation[..., None, None]
        return _State(fplus, fminus, torch.cat([z_water, z_semisolid], -2))


def _rotation(alpha: torch.Tensor, phi: torch.Tensor) -> tuple:
    """Weigel 2015 eq. 15, the rotation by alpha about (cos phi, sin phi, 0) on (F+, F-, Z)."""
    c2 = torch.cos(alpha / 2) ** 2
    s2 = torch.sin(alpha / 2) ** 2
    sin_a, cos_a = torch.sin(alpha), torch.cos(alpha)
    e = torch.exp(1j * phi)  # complex128
    ec = e.conj()
    return (
        (c2.to(COMPLEX), e**2 * s2, -1j * e * sin_a),
        (ec**2 * s2, c2.to(COMPLEX), 1j * ec * sin_a),
        (-0.5j * ec * sin_a, 0.5j * e * sin_a, cos_a.to(COMPLEX)),
    )


def _pulse(event, description, pools: _Pools, values: dict, lineshape: str) -> _Pulse:
    if int(event.rf_shim_id) != 0:
        raise NotImplementedError("the reference engine does not model static shims (shim_id must be 0)")
    if event.rf_use == RfUse.INVERSION:
        return _Pulse(values["inversion_efficiency"], None, None)
    definition = description.rf_definitions[event.rf_definition_id]
    raster_s = description.rf_raster_time_s
    alpha, extra_phase = definition.signed_flip(event.rf_amplitude_hz, rf_raster_time_s=raster_s)
    alpha_eff = _f64(alpha) * values["b1"]
    phi = _f64(event.rf_phase_rad) + _f64(extra_phase) + values["b1_phase_rad"]
    saturation = None
    if pools.semisolid:
        s = _f64(definition.saturation(rf_raster_time_s=raster_s))
        offset_hz = _f64(event.rf_frequency_hz) - values["b0_hz"]
        t2b_ms = torch.clamp(values["t2_bound_ms"], min=MIN_RELAXATION_MS)
        g_s = absorption_lineshape(lineshape, offset_hz, t2b_ms)
        saturation = torch.exp(s * alpha_eff**2 * g_s).to(COMPLEX)
    return _Pulse(None, _rotation(alpha_eff, phi), saturation)


def _sample(state: _State, m0: torch.Tensor, adc_phase: torch.Tensor) -> torch.Tensor:
    return m0 * state.fplus[..., :, 0].sum(-1) * torch.exp(-1j * adc_phase)


class _Unrefocused:
    """The walk that times each recorded sample's unrefocused precession (T2' in the module docstring)."""

    def __init__(self) -> None:
        self.pulse_s = None  # time of the last pulse, or None before the first
        self.shifts = 0  # shifts since that pulse
        self.spoiled = False  # a spoil since that pulse
        self.stretches = []  # (duration in s, shifts) of each unspoiled pulse-to-pulse stretch
        self.samples = []  # (time since the pulse in s, shifts) of each recorded sample, or None (τ = 0)

    def shift(self) -> None:
        self.shifts += 1

    def spoil(self) -> None:
        self.spoiled = True

    def pulse(self, t_s: torch.Tensor) -> None:
        if self.pulse_s is not None and not self.spoiled:
            self.stretches.append((t_s - self.pulse_s, self.shifts))
        self.pulse_s, self.shifts, self.spoiled = t_s, 0, False

    def sample(self, t_s: torch.Tensor) -> None:
        carried = self.pulse_s is not None and not self.spoiled
        self.samples.append((t_s - self.pulse_s, self.shifts) if carried else None)

    def times_s(self) -> list:
        """τ of each recorded sample (float64 tensors, s); ValueError unless the stream winds steadily."""
        shifts = sum(w for _, w in self.stretches)
        per_shift = sum((d for d, _ in self.stretches), torch.zeros((), dtype=REAL)) / shifts if shifts else None
        period = None if per_shift is None else float(per_shift.detach())
        for d, w in self.stretches:
            duration, expected = float(d.detach()), 0.0 if period is None else period * w
            if abs(duration - expected) > 1e-6 * max(duration, expected) + 1e-9:
                rate = "no stretch winds" if period is None else f"one order per {period * 1e3} ms"
                raise ValueError(f"T2' needs a sequence that winds steadily: a pulse-to-pulse stretch of "
                                 f"{duration * 1e3} ms winds {w} order(s), while on average {rate}")
        taus = []
        for entry in self.samples:
            if entry is None:
                taus.append(torch.zeros((), dtype=REAL))
                continue
            since, w = entry
            if w and per_shift is None:
                raise ValueError(f"T2': a sample lies {w} shift(s) after its pulse but no pulse-to-pulse stretch "
                                 "winds, so its unrefocused time is undefined")
            taus.append(since if not w else since - per_shift * w)
        return taus


def _t2_prime_acts(raw: Any, value: torch.Tensor) -> bool:
    return differentiated(raw) or not bool(torch.isposinf(value.detach()).all())


def _kept(event, record: str) -> bool:
    if record == "all":
        return True
    if record == "acquired":
        return event.adc_role != AdcRole.NON_ACQUIRED
    return bool(event.is_echo)


# ---------------------------------------------------------------------------------------------
# Public entry points
# ---------------------------------------------------------------------------------------------


def play(
    description,
    tissue: TissueProperties,
    *,
    states: int,
    repetitions: int = 1,
    record: str = "all",
    lineshape: str = "super-lorentzian",
) -> ReferenceResult:
    """Play `description` `repetitions` times on `tissue` and return the samples and final states.

    description: a `SequenceDescription`; tissue: `TissueProperties` whose fields are numbers or
    float tensors broadcasting to voxel_shape (cast to float64); states: K >= 1 configuration orders
    per pool; repetitions >= 1, samples come from the last one; record: "all", "acquired" or "echo";
    lineshape: the semisolid absorption lineshape (see lineshape.py).

    The oracle runs on the CPU: tissue and event tensors must be CPU tensors.

    Returns a `ReferenceResult`: signal (*voxel_shape, samples) and the final states
    (*voxel_shape, pools, states), all complex128. The semantics are in the module docstring.
    Raises ValueError for bad arguments, NaN or negative relaxation times, and fractions < 0
    or summing to more than 1.
    """
    if isinstance(states, bool) or not isinstance(states, int) or states < 1:
        raise ValueError(f"states must be an int >= 1 (configuration orders per pool), got {states!r}")
    if isinstance(repetitions, bool) or not isinstance(repetitions, int) or repetitions < 1:
        raise ValueError(f"repetitions must be an int >= 1, got {repetitions!r}")
    if record not in RECORD_MODES:
        raise ValueError(f"record must be one of {RECORD_MODES}, got {record!r}")
    if lineshape not in LINESHAPES:
        raise ValueError(f"lineshape must be one of {LINESHAPES}, got {lineshape!r}")

    pools, values = _pools(tissue)
    crusher = float(description.crusher_dephasing_rad) != 0.0 and description.voxel_size_m is not None
    moving = isinstance(tissue.velocity_m_per_s, torch.Tensor) or float(tissue.velocity_m_per_s) != 0.0
    geometry = {
        "crusher": crusher,
        "washout": description.voxel_size_m is not None and moving,
        "dk_rad_per_m": float(description.crusher_dephasing_rad) / description.voxel_size_m if crusher else 0.0,
        "voxel_size_m": description.voxel_size_m,
    }

    events = description.events
    times_s = [_f64(e.timestamp_us) * 1e-6 for e in events]
    first_dts = [times_s[0]] + [times_s[i] - times_s[i - 1] for i in range(1, len(events))] if events else []
    wrap_dt = _f64(description.tr_duration_us) * 1e-6 - times_s[-1] + times_s[0] if events else None

    def interval(dt_s: torch.Tensor, span: _Span) -> _Interval | None:
        if not differentiated(dt_s) and float(dt_s) == 0.0:
            return None
        return _interval(dt_s, span, pools, values, geometry, states)

    later_dts = [wrap_dt] + first_dts[1:]
    first_spans = _spans(events, first_dts, later_dts, first=True)
    later_spans = _spans(events, later_dts, later_dts, first=False)
    intervals = [interval(dt, span) for dt, span in zip(first_dts, first_spans, strict=True)]  # first repetition
    # Later repetitions: event 0's interval is the wrap, and a span may cross the repetition's start.
    later_intervals = [
        step if i > 0 and not first_spans[i].from_start else interval(later_dts[i], later_spans[i])
        for i, step in enumerate(intervals)
    ]
    pulses = {
        i: _pulse(e, description, pools, values, lineshape) for i, e in enumerate(events) if e.type == EventType.RF
    }

    state = _equilibrium(pools, states)
    samples = []
    walk = _Unrefocused()
    playing_s = _f64(description.tr_duration_us) * 1e-6
    for repetition in range(repetitions):
        last = repetition == repetitions - 1
        for i, event in enumerate(events):
            step = later_intervals[i] if repetition > 0 else intervals[i]
            if step is not None:
                state = step.apply(state)
            t_s = repetition * playing_s + times_s[i]
            if event.action & EventAction.CRUSH_BEFORE:
                state = _shift(state)
                walk.shift()
            if event.type == EventType.RF:
                state = pulses[i].apply(state, pools.water)
                if event.rf_use != RfUse.INVERSION:
                    walk.pulse(t_s)
            elif event.type == EventType.ADC and last and _kept(event, record):
                samples.append(_sample(state, values["m0"], _f64(event.adc_phase_rad)))
                walk.sample(t_s)
            if event.action & EventAction.CRUSH_AFTER:
                state = _shift(state)
                walk.shift()
            if event.action & EventAction.SPOIL_AFTER:
                state = _spoil(state)
                walk.spoil()
            elif event.action & EventAction.SHIFT_AFTER:
                state = _shift(state)
                walk.shift()

    if samples and _t2_prime_acts(tissue.t2_prime_ms, values["t2_prime_ms"]):
        t2_prime_ms = torch.clamp(values["t2_prime_ms"], min=MIN_RELAXATION_MS)
        taus = walk.times_s()
        samples = [s * torch.exp(-tau.abs() * 1e3 / t2_prime_ms) for s, tau in zip(samples, taus, strict=True)]
    if samples:
        signal = torch.stack(samples, -1)
    else:
        signal = torch.zeros((*pools.voxel_shape, 0), dtype=COMPLEX)
    fplus, fminus = state.fplus, state.fminus
    if pools.semisolid:
        zero = torch.zeros_like(fplus[..., :1, :])
        fplus, fminus = torch.cat([fplus, zero], -2), torch.cat([fminus, zero], -2)
    return ReferenceResult(signal=signal, fplus=fplus, fminus=fminus, z=state.z)


def simulate_reference(
    description,
    tissue: TissueProperties,
    *,
    states: int,
    repetitions: int = 1,
    record: str = "all",
    lineshape: str = "super-lorentzian",
) -> torch.Tensor:
    """`play(...).signal`: the complex128 samples, (*voxel_shape, samples)."""
    return play(
        description, tissue, states=states, repetitions=repetitions, record=record, lineshape=lineshape
    ).signal
