"""Ready-made descriptions of common trains (API.md section 6.4). Angles in rad, times in s.

Per-shot arguments are a scalar (repeated) or one value per shot; a tensor stays
differentiable (its entries land in the event params, its durations in the
timestamps). Each builder also takes `crusher_dephasing_rad` and `voxel_size_m`,
passed to the `SequenceDescription`. RF and ADC phases match shot by shot, so each
sample is demodulated by its own pulse's phase.

Each builder lays its events out directly (`_train`): it validates a per-shot
array once, as a whole, and builds the events the operators would emit, with the
same values (the entries selected from the caller's tensors, so autograd reaches
them), timestamps (durations added one by one in play order, as `compose` adds
them) and types. Where a value would fail a check, the builder composes the
operators instead, which raise their own errors.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from .._arrays import differentiated
from .description import SequenceDescription
from .events import AdcRole, EventAction, EventType, RfUse, as_float, check_action, trusted_event
from .operators import Delay, Excitation, FSEReadout, Inversion, Refocusing, SPGRReadout, SSFPFidReadout, _time_s

__all__ = ["fse_description", "mrf_description", "mpnrage_description", "mprage_description", "spgr_description"]


def _split(name: str, value: Any, count: int | None = None) -> tuple[list, Any]:
    """Split `value` along its last axis into per-shot values (floats or tensors); also returns the
    array they come from (a float or a tensor), for the checks made on it as a whole.

    A scalar gives `count` copies (one if `count` is None); an array of last axis
    `count` gives its entries (or columns, for a leading train axis).
    """
    if not isinstance(value, torch.Tensor):
        array = np.asarray(value, dtype=np.float64)
        value = float(array) if array.ndim == 0 else torch.as_tensor(array)
    if not isinstance(value, torch.Tensor) or value.dim() == 0:
        return [value] * (1 if count is None else count), value
    if value.dim() > 2 or (count is not None and value.shape[-1] != count):
        expected = "a scalar" + (f" or {count} values (last axis)" if count is not None else " or a 1-D/2-D array")
        raise ValueError(f"{name} must be {expected}, got shape {tuple(value.shape)}")
    return list(value.unbind(-1)), value


def _describe(ops: list, crusher_dephasing_rad: float, voxel_size_m: float | None) -> SequenceDescription:
    return SequenceDescription.from_operators(*ops, crusher_dephasing_rad=crusher_dephasing_rad,
                                              voxel_size_m=voxel_size_m)


# -- the direct layout ------------------------------------------------------------------------
# Each check below is the operators' check of one value (`_value`, `_time_s`), made once over the
# whole array; a False or None answer sends the builder to the operators, which raise.
def _values_ok(source: Any) -> bool:
    """Whether the per-shot values split from `source` are all real and finite (what `_value` accepts)."""
    if isinstance(source, torch.Tensor):
        return not source.is_complex() and bool(torch.isfinite(source.detach()).all())
    return math.isfinite(source)


def _durations(source: Any, shots: list) -> list | None:
    """The per-shot durations split from `source` as `Delay` holds them (floats, or 0-d float64 tensors),
    or None unless each is a single finite time >= 0."""
    if not isinstance(source, torch.Tensor):
        return shots if 0.0 <= source < math.inf else None
    if source.dim() > 1 or source.is_complex() or source.dtype == torch.bool:
        return None
    detached = source.detach()
    if not bool((torch.isfinite(detached) & (detached >= 0)).all()):
        return None
    if source.dtype == torch.float64:
        return shots
    wide = source.to(torch.float64)  # `_time_s` widens each duration; once here
    return [wide] * len(shots) if source.dim() == 0 else list(wide.unbind(-1))


def _timeline(steps: list) -> tuple[list, Any]:
    """The moments `t[0] = 0.0`, `t[k + 1] = t[k] + steps[k]` (s) of a train laid out from 0 s.

    Returns the moments in us (`t[k] * 1e6`, the timestamps of the events played at
    them) and the last moment in s. The durations are added one by one, as `compose`
    adds them, so each moment has the value and type the operators give it: a float
    until the first tensor step, then a 0-d float64 tensor, which carries a derivative
    (reverse or forward mode) from the first step that does.
    """
    first = next((k for k, step in enumerate(steps) if isinstance(step, torch.Tensor)), len(steps))
    t = 0.0
    stamps = [0.0]
    for step in steps[:first]:
        t += step
        stamps.append(t * 1e6)
    rest = steps[first:]
    if not rest:
        return stamps, t
    if not all(step.is_cpu for step in rest if isinstance(step, torch.Tensor)):
        for step in rest:  # the operators' sums, one tensor at a time
            t = t + step
            stamps.append(t * 1e6)
        return stamps, t
    # Cumulative sums: on the CPU they add one by one, in order, so each moment is the sum the operators
    # make (test_builders_speed holds them to it), in one call that autograd sees through. The steps
    # before the first one with a derivative are summed apart, so the moments before it carry none.
    tracked = next((k for k, step in enumerate(rest) if differentiated(step)), len(rest))
    for part in (rest[:tracked], rest[tracked:]):
        if part:
            column = [t if isinstance(t, torch.Tensor) else torch.tensor(t, dtype=torch.float64, device="cpu")]
            column += (step if isinstance(step, torch.Tensor) else torch.tensor(step, dtype=torch.float64,
                                                                                 device="cpu") for step in part)
            moments = torch.stack(column).cumsum(0)[1:]
            stamps += (moments * 1e6).unbind()
            t = moments[-1]
    return stamps, t


_RF, _ADC, _WAIT = EventType.RF, EventType.ADC, EventType.WAIT
_NONE = check_action(EventAction.NONE)
_CRUSHED = check_action(EventAction.CRUSH_BEFORE | EventAction.CRUSH_AFTER)  # as `Refocusing(crushed=True)`
_DEPHASE = check_action(EventAction.CRUSH_AFTER)  # as `Dephase()`
_SPOIL = check_action(EventAction.SPOIL_AFTER)  # as `Spoil()`


def _finish(events: list, end_s: Any, crusher_dephasing_rad, voxel_size_m) -> SequenceDescription | None:
    """The description of `events`, in time order, ending at `end_s`; None past the float range (the
    operators then report the event whose timestamp is not finite)."""
    if not math.isfinite(as_float(end_s) * 1e6):
        return None
    return SequenceDescription._from_ordered_events(tuple(events), end_s, crusher_dephasing_rad=crusher_dephasing_rad,
                                                    voxel_size_m=voxel_size_m)


def _train(head: list, flips: list, phases: list, trs: list | None, roles: list, wait_action: EventAction,
           crusher_dephasing_rad, voxel_size_m) -> SequenceDescription | None:
    """`head` (`[]` or `[Inversion(), Delay(lead_s)]`), then per shot `Excitation(a, p) @ Readout(p, role=r)
    @ Delay(0.0, action=wait_action) @ Delay(tr)` (`SSFPFidReadout` or `SPGRReadout`), laid out directly;
    None where the operators must check a value (`trs` None: a duration that is not a time)."""
    if trs is None:
        return None
    events: list = []
    steps: list = []
    if head:
        inversion, delay = head  # both play at 0 s: the inversion takes no time
        events += inversion.emit(0.0) + delay.emit(0.0)
        steps.append(delay.duration_s)
    stamps, end_s = _timeline(steps + trs)
    excitation = RfUse.EXCITATION
    for t, a, p, role in zip(stamps[len(steps):-1], flips, phases, roles, strict=True):
        events += (trusted_event(_RF, t, (0, excitation, a, p, 0.0, 0, 0.0), _NONE),
                   trusted_event(_ADC, t, (role, p, True), _NONE),
                   trusted_event(_WAIT, t, (), wait_action),
                   trusted_event(_WAIT, t, (), _NONE))
    return _finish(events, end_s, crusher_dephasing_rad, voxel_size_m)


def fse_description(flip_rad, echo_spacing_s, *, phases_rad=0, excitation_flip_rad=math.pi / 2,
                    excitation_phase_rad=math.pi / 2, repetition_time_s=None, crusher_dephasing_rad=0.0,
                    voxel_size_m=None) -> SequenceDescription:
    """A CPMG echo train: an excitation at 0, refocusing pulse j at `(j + 1/2) * echo_spacing_s`, echo j at
    `(j + 1) * echo_spacing_s`, demodulated by its refocusing phase.

    `flip_rad` is `(ETL,)`, or `(trains, ETL)` for one train per row (each event then
    holds a `(trains,)` tensor). The repetition ends at the last echo, or at
    `repetition_time_s` (which must not come before it).
    """
    flips, flip_source = _split("flip_rad", flip_rad)
    phases, phase_source = _split("phases_rad", phases_rad, len(flips))
    half_s = _time_s("echo_spacing_s", echo_spacing_s) / 2
    if _values_ok(flip_source) and _values_ok(phase_source):
        description = _fse_train(flips, phases, half_s, excitation_flip_rad, excitation_phase_rad,
                                 repetition_time_s, crusher_dephasing_rad, voxel_size_m)
        if description is not None:
            return description
    ops = [Excitation(excitation_flip_rad, excitation_phase_rad)]
    for flip, phase in zip(flips, phases, strict=True):
        ops.append(Delay(half_s) @ Refocusing(flip, phase) @ Delay(half_s) @ FSEReadout(phase))
    if repetition_time_s is not None:
        rest_s = _time_s("repetition_time_s", repetition_time_s) - 2 * half_s * len(flips)
        if as_float(rest_s) < 0:
            raise ValueError(f"repetition_time_s = {as_float(repetition_time_s)} s ends before the last echo at "
                             f"{2 * as_float(half_s) * len(flips)} s; give at least ETL * echo_spacing_s")
        ops.append(Delay(rest_s))
    return _describe(ops, crusher_dephasing_rad, voxel_size_m)


def _fse_train(flips, phases, half_s, excitation_flip_rad, excitation_phase_rad, repetition_time_s,
               crusher_dephasing_rad, voxel_size_m) -> SequenceDescription | None:
    """`fse_description`'s layout, direct (see `_train`)."""
    try:
        events = list(Excitation(excitation_flip_rad, excitation_phase_rad).emit(0.0))
        half_s = _time_s("duration_s", half_s)
        steps = [half_s] * (2 * len(flips))
        if repetition_time_s is not None:
            rest_s = _time_s("repetition_time_s", repetition_time_s) - 2 * half_s * len(flips)
            if as_float(rest_s) < 0:
                return None
            steps.append(_time_s("duration_s", rest_s))
    except ValueError:
        return None
    stamps, end_s = _timeline(steps)
    refocusing, echo = RfUse.REFOCUSING, AdcRole.ECHO_CENTER
    for k, (a, p) in enumerate(zip(flips, phases, strict=True)):
        start, pulse, sample = stamps[2 * k], stamps[2 * k + 1], stamps[2 * k + 2]
        events += (trusted_event(_WAIT, start, (), _NONE),
                   trusted_event(_RF, pulse, (0, refocusing, a, p, 0.0, 0, 0.0), _CRUSHED),
                   trusted_event(_WAIT, pulse, (), _NONE),
                   trusted_event(_ADC, sample, (echo, p, True), _NONE),
                   trusted_event(_WAIT, sample, (), _NONE))
    if repetition_time_s is not None:
        events.append(trusted_event(_WAIT, stamps[-2], (), _NONE))
    return _finish(events, end_s, crusher_dephasing_rad, voxel_size_m)


def mrf_description(flip_rad, repetition_time_s, *, inversion_time_s=0, phases_rad=0, inversion=True,
                    crusher_dephasing_rad=0.0, voxel_size_m=None) -> SequenceDescription:
    """MR fingerprinting (FISP): an ideal inversion and a `Delay(inversion_time_s)`, then per TR
    `Excitation(flip, phase) @ SSFPFidReadout(phase, duration_s=TR)`.

    `repetition_time_s` and `phases_rad` are scalars or one per flip. [ours]
    `inversion=False` drops the inversion and its delay.
    """
    flips, flip_source = _split("flip_rad", flip_rad)
    trs, tr_source = _split("repetition_time_s", repetition_time_s, len(flips))
    phases, phase_source = _split("phases_rad", phases_rad, len(flips))
    ops = [Inversion(), Delay(inversion_time_s)] if inversion else []
    if _values_ok(flip_source) and _values_ok(phase_source):
        description = _train(ops, flips, phases, _durations(tr_source, trs), [AdcRole.SINGLE] * len(flips),
                             _DEPHASE, crusher_dephasing_rad, voxel_size_m)
        if description is not None:
            return description
    ops += [Excitation(a, p) @ SSFPFidReadout(p, duration_s=tr) for a, tr, p in zip(flips, trs, phases, strict=True)]
    return _describe(ops, crusher_dephasing_rad, voxel_size_m)


def _spoiled_shots(flips, trs, phases, roles):
    shots = zip(flips, trs, phases, roles, strict=True)
    return [Excitation(a, p) @ SPGRReadout(p, duration_s=tr, role=r) for a, tr, p, r in shots]


def mpnrage_description(nshots, flip_rad, repetition_time_s, *, inversion_time_s=0, phases_rad=0,
                        crusher_dephasing_rad=0.0, voxel_size_m=None) -> SequenceDescription:
    """MPnRAGE: an inversion, `Delay(inversion_time_s)`, then `nshots` spoiled shots
    `Excitation @ SPGRReadout(duration_s=TR)`, each sampled at its pulse."""
    if isinstance(nshots, bool) or int(nshots) != nshots or int(nshots) <= 0:
        raise ValueError(f"nshots must be an integer > 0, got {nshots!r}")
    n = int(nshots)
    flips, flip_source = _split("flip_rad", flip_rad, n)
    head = [Inversion(), Delay(inversion_time_s)]
    trs, tr_source = _split("repetition_time_s", repetition_time_s, n)
    phases, phase_source = _split("phases_rad", phases_rad, n)
    roles = [AdcRole.SINGLE] * n
    if _values_ok(flip_source) and _values_ok(phase_source):
        description = _train(head, flips, phases, _durations(tr_source, trs), roles, _SPOIL, crusher_dephasing_rad,
                             voxel_size_m)
        if description is not None:
            return description
    ops = head + _spoiled_shots(flips, trs, phases, roles)
    return _describe(ops, crusher_dephasing_rad, voxel_size_m)


def mprage_description(nshots_before, nshots_after, flip_rad, repetition_time_s, inversion_time_s, *,
                       phases_rad=0, crusher_dephasing_rad=0.0, voxel_size_m=None) -> SequenceDescription:
    """MPRAGE: an inversion, then `nshots_before + nshots_after` spoiled shots one `repetition_time_s` apart.

    The centre shot, the first of the `nshots_after`, is the only acquired one (role
    SINGLE; the others NON_ACQUIRED) and plays `inversion_time_s` after the inversion,
    so the first shot plays at `inversion_time_s - nshots_before * repetition_time_s`,
    which must not be negative.
    """
    before, after = int(nshots_before), int(nshots_after)
    if before != nshots_before or after != nshots_after or before < 0 or after < 1:
        raise ValueError(f"nshots_before must be an integer >= 0 and nshots_after >= 1 (it holds the centre shot), "
                         f"got {nshots_before!r} and {nshots_after!r}")
    n = before + after
    tr_s = _time_s("repetition_time_s", repetition_time_s)
    lead_s = _time_s("inversion_time_s", inversion_time_s) - before * tr_s
    if as_float(lead_s) < 0:
        raise ValueError(f"inversion_time_s = {as_float(inversion_time_s)} s comes before the first excitation: "
                         f"{before} shots of {as_float(tr_s)} s precede the centre shot; give at least "
                         f"{before * as_float(tr_s)} s")
    roles = [AdcRole.NON_ACQUIRED] * before + [AdcRole.SINGLE] + [AdcRole.NON_ACQUIRED] * (after - 1)
    head = [Inversion(), Delay(lead_s)]
    flips, flip_source = _split("flip_rad", flip_rad, n)
    phases, phase_source = _split("phases_rad", phases_rad, n)
    if _values_ok(flip_source) and _values_ok(phase_source):
        description = _train(head, flips, phases, [tr_s] * n, roles, _SPOIL, crusher_dephasing_rad, voxel_size_m)
        if description is not None:
            return description
    ops = head + _spoiled_shots(flips, [tr_s] * n, phases, roles)
    return _describe(ops, crusher_dephasing_rad, voxel_size_m)


def spgr_description(flip_rad, repetition_time_s, echo_time_s, *, phases_rad=0, crusher_dephasing_rad=0.0,
                     voxel_size_m=None) -> SequenceDescription:
    """Spoiled gradient echo: per shot `Excitation`, `Delay(TE)`, `SPGRReadout(duration_s=TR - TE)`.

    A scalar `flip_rad` gives one shot; an array gives one shot per entry (with
    `phases_rad` scalar or per shot, e.g. RF spoiling). `echo_time_s` must not exceed
    `repetition_time_s`.
    """
    flips, flip_source = _split("flip_rad", flip_rad)
    phases, phase_source = _split("phases_rad", phases_rad, len(flips))
    te_s, tr_s = _time_s("echo_time_s", echo_time_s), _time_s("repetition_time_s", repetition_time_s)
    if as_float(te_s) > as_float(tr_s):
        raise ValueError(f"echo_time_s = {as_float(te_s)} s exceeds repetition_time_s = {as_float(tr_s)} s")
    if _values_ok(flip_source) and _values_ok(phase_source):
        description = _spgr_train(flips, phases, te_s, tr_s, crusher_dephasing_rad, voxel_size_m)
        if description is not None:
            return description
    ops = [Excitation(a, p) @ Delay(te_s) @ SPGRReadout(p, duration_s=tr_s - te_s)
           for a, p in zip(flips, phases, strict=True)]
    return _describe(ops, crusher_dephasing_rad, voxel_size_m)


def _spgr_train(flips, phases, te_s, tr_s, crusher_dephasing_rad, voxel_size_m) -> SequenceDescription | None:
    """`spgr_description`'s layout, direct (see `_train`)."""
    try:
        rest_s = _time_s("duration_s", tr_s - te_s)
    except ValueError:
        return None
    stamps, end_s = _timeline([te_s, rest_s] * len(flips))
    excitation, single = RfUse.EXCITATION, AdcRole.SINGLE
    events: list = []
    for k, (a, p) in enumerate(zip(flips, phases, strict=True)):
        pulse, sample = stamps[2 * k], stamps[2 * k + 1]
        events += (trusted_event(_RF, pulse, (0, excitation, a, p, 0.0, 0, 0.0), _NONE),
                   trusted_event(_WAIT, pulse, (), _NONE),
                   trusted_event(_ADC, sample, (single, p, True), _NONE),
                   trusted_event(_WAIT, sample, (), _SPOIL),
                   trusted_event(_WAIT, sample, (), _NONE))
    return _finish(events, end_s, crusher_dephasing_rad, voxel_size_m)
