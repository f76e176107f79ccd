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
   f_rf the event frequency, G the lineshape (`blochsim.physics.lineshape`) at T2b = t2_bound_ms.
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

Transmission and the slice
--------------------------
`blochsim._reference.pulse` plays the pulses: hard rotations, or per voxel the Cayley-Klein pair of
`blochsim.sequence.spinor` (its module docstring: the convention, the 3x3 form, positions in slice
thicknesses, the reference to the pulse middle). Channels: when an RF event plays a static shim
(shim_id > 0) or a DYNAMIC (multi-channel) definition, B1 and B1phase carry a leading channel axis C (a number
is every channel's), the channel fields are B1_c e^{i B1phase_c}, a shim's field is sum_c w_c B1_c
e^{i B1phase_c}, and every rotating pulse must then play a shim or a dynamic definition. `across_slice`
(an int or an `ExactSliceProfile`) replicates the tissue over the profile's positions (a trailing voxel
axis) and averages the samples over them; a PROFILED definition is then composed per position and voxel
(without it, every definition turns by its integral, at the slice centre of a real envelope). Not modelled:
the semisolid pool under a dynamic pulse (NotImplementedError), and the slice position's frequency offset in
the semisolid lineshape (the saturation takes the nominal effective flip at every position).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch

from .._arrays import differentiated
from ..physics.lineshape import LINESHAPES
from ..sequence.events import AdcRole, EventAction, EventType, RfMode, RfUse
from ..sequence.spinor import slice_profile_of
from ..sequence.tissue import TissueProperties
from .interval import _Interval, _interval, _Span, _spans
from .pulse import _pulse, _sample, _Transmit
from .state import _equilibrium, _shift, _spoil
from .tissue import (
    COMPLEX,
    MIN_RELAXATION_MS,
    REAL,
    _f64,
    _pools,
)

__all__ = ["ReferenceResult", "play", "simulate_reference"]

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
    across_slice=None,
) -> ReferenceResult:
    """Play `description` `repetitions` times on `tissue` and return the samples and final states.

    description: a `SequenceDescription`; tissue: `TissueProperties` whose fields are numbers or
    float tensors broadcasting to voxel_shape (cast to float64; B1 and B1phase with a leading channel axis
    when the description plays shims or dynamic pTx pulses); states: K >= 1 configuration orders
    per pool; repetitions >= 1, samples come from the last one; record: "all", "acquired" or "echo";
    lineshape: the semisolid absorption lineshape (see `blochsim.physics.lineshape`); across_slice: None,
    an int or an `ExactSliceProfile` (the module docstring, "Transmission and the slice").

    The oracle runs on the CPU: tissue and event tensors must be CPU tensors.

    Returns a `ReferenceResult`: signal (*voxel_shape, samples), averaged over the slice positions, and the
    final states (*voxel_shape, pools, states), with a positions axis after voxel_shape when slice-resolved;
    all complex128. The semantics are in the module docstring.
    Raises ValueError for bad arguments, NaN or negative relaxation times, and fractions < 0
    or summing to more than 1.
    """
    _check_settings(states, repetitions, record, lineshape)
    profile = slice_profile_of(across_slice)
    tissue, transmit = _transmission(description, tissue, profile)
    pools, values = _pools(tissue)
    steps = _prepare(description, tissue, pools, values, states, lineshape, transmit)
    state, samples, walk = _repeat(description.events, steps, pools, values, states, repetitions, record)
    result = _result(tissue, pools, values, state, samples, walk)
    if profile is None:
        return result
    return dataclasses.replace(result, signal=result.signal.mean(-2))


def _channel_count(description) -> int | None:
    """Channels the description's RF events drive: from their shims (ids > 0) and dynamic definitions; None
    when none plays either. ValueError when they disagree."""
    counts = {}
    for i, event in enumerate(description.events):
        if event.type != EventType.RF or event.rf_use == RfUse.INVERSION:
            continue
        shim_id = int(event.rf_shim_id)
        if shim_id != 0:
            shim = description.shim_definitions.get(shim_id)
            if shim is None:
                raise ValueError(f"events[{i}] plays shim_id={shim_id}, which shim_definitions does not hold "
                                 f"(ids: {sorted(description.shim_definitions)})")
            counts.setdefault(shim.channel_count, i)
        definition = description.rf_definitions[event.rf_definition_id]
        if definition.rf_mode() == RfMode.DYNAMIC:
            counts.setdefault(definition.channel_count, i)
    if len(counts) > 1:
        raise ValueError("the shims and dynamic definitions drive different channel counts: "
                         + ", ".join(f"{c} (events[{i}])" for c, i in counts.items()))
    return next(iter(counts), None)


def _transmission(description, tissue: TissueProperties, profile) -> tuple:
    """(tissue, _Transmit): the channel fields taken off B1 and B1phase (which become 1 and 0, broadcast over
    the fields' voxel shape), and with a profile, every field given a trailing positions axis."""
    channels = _channel_count(description)
    fields = dict(tissue.items())
    field = None
    if channels is not None:
        maps = []
        for name in ("b1", "b1_phase_rad"):
            value = _f64(fields[name])
            if value.dim() == 0:
                value = value.reshape(1)  # every channel's
            elif value.shape[0] != channels:
                raise ValueError(f"{name} must carry a leading channel axis of {channels} channels (the shims' and "
                                 f"dynamic pulses'), got shape {tuple(value.shape)}")
            maps.append(value)
        dims = max(m.dim() for m in maps)  # the voxel axes align after the channel axis
        maps = [m.reshape(m.shape[:1] + (1,) * (dims - m.dim()) + m.shape[1:]) for m in maps]
        magnitude, phase = torch.broadcast_tensors(*maps)
        magnitude, phase = (m.expand((channels,) + m.shape[1:]) for m in (magnitude, phase))
        field = torch.polar(magnitude, phase)  # (C, *V)
        fields["b1"], fields["b1_phase_rad"] = torch.ones(field.shape[1:], dtype=REAL), 0.0
    positions = None
    if profile is not None:
        positions = profile.positions()
        count = positions.numel()
        for name, value in fields.items():
            if isinstance(value, torch.Tensor):
                fields[name] = value.unsqueeze(-1)
        t1 = _f64(fields["t1_ms"])  # expanded: it carries the positions axis into the voxel shape
        t1 = t1.reshape(1) if t1.dim() == 0 else t1
        fields["t1_ms"] = t1.expand(t1.shape[:-1] + (count,))
        if field is not None:
            field = field.unsqueeze(-1)
    return TissueProperties(**fields), _Transmit(field, positions)


def _check_settings(states, repetitions, record, lineshape) -> None:
    if isinstance(states, bool) or not isinstance(states, int) or states < 1:
        raise ValueError(f"states must be an int >= 1 (configuration orders per pool), got {states!r}")
    if isinstance(repetitions, bool) or not isinstance(repetitions, int) or repetitions < 1:
        raise ValueError(f"repetitions must be an int >= 1, got {repetitions!r}")
    if record not in RECORD_MODES:
        raise ValueError(f"record must be one of {RECORD_MODES}, got {record!r}")
    if lineshape not in LINESHAPES:
        raise ValueError(f"lineshape must be one of {LINESHAPES}, got {lineshape!r}")


@dataclass(frozen=True)
class _Steps:
    """What each event of a playing does, prepared once: its time, the interval before it in the first and
    in later repetitions (None: no time passes), and its pulse."""

    times_s: list  # float64 tensors, s from the repetition's start
    playing_s: torch.Tensor  # the repetition's length, s
    first: list  # _Interval | None per event, first repetition
    later: list  # per event, later repetitions: event 0's interval is the wrap
    pulses: dict  # event index -> its pulse, for RF events


def _prepare(description, tissue, pools, values, states: int, lineshape: str, transmit: _Transmit) -> _Steps:
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
        i: _pulse(i, e, description, pools, values, lineshape, transmit)
        for i, e in enumerate(events) if e.type == EventType.RF
    }
    playing_s = _f64(description.tr_duration_us) * 1e-6
    return _Steps(times_s, playing_s, intervals, later_intervals, pulses)


def _repeat(events, steps: _Steps, pools, values, states: int, repetitions: int, record: str) -> tuple:
    """Play the events `repetitions` times from equilibrium: (final state, samples of the last repetition,
    the unrefocused walk)."""
    state = _equilibrium(pools, states)
    samples = []
    walk = _Unrefocused()
    for repetition in range(repetitions):
        last = repetition == repetitions - 1
        for i, event in enumerate(events):
            step = steps.later[i] if repetition > 0 else steps.first[i]
            if step is not None:
                state = step.apply(state)
            t_s = repetition * steps.playing_s + steps.times_s[i]
            if event.action & EventAction.CRUSH_BEFORE:
                state = _shift(state)
                walk.shift()
            if event.type == EventType.RF:
                state = steps.pulses[i].apply(state, pools.water)
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
    return state, samples, walk


def _result(tissue, pools, values, state, samples: list, walk: _Unrefocused) -> ReferenceResult:
    """The samples (T2' applied) and the final states, the semisolid pool's transverse states zero."""
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
    across_slice=None,
) -> torch.Tensor:
    """`play(...).signal`: the complex128 samples, (*voxel_shape, samples)."""
    return play(
        description, tissue, states=states, repetitions=repetitions, record=record, lineshape=lineshape,
        across_slice=across_slice,
    ).signal
