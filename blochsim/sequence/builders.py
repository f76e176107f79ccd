"""Ready-made descriptions of common trains. Angles in rad, times in s.

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

Beside the events, each builder lays out the columns the engine's compiler reads
(`sequence.columns`: a few vector ops on the caller's tensors), and it makes the
events themselves only where they are first read: simulating a train of 500
shots with differentiated flips, and its gradient, never visits 2,000 event
objects one by one.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from .._arrays import differentiated, transformed
from .._tracing import deferred_under_compile
from .columns import EventColumns, attach, sources, walk
from .description import SequenceDescription
from .events import AdcRole, EventAction, EventType, RfUse, as_float, check_action, trusted_event
from .operators import Delay, Excitation, FSEReadout, Inversion, Refocusing, SPGRReadout, SSFPFidReadout, _time_s

__all__ = ["fse_description", "mrf_description", "mpnrage_description", "mprage_description", "spgr_description"]


class _Shots:
    """Per-shot values: `count` copies of a scalar `source`, or the entries of a tensor `source` along its last
    axis (its columns, for a leading train axis). `entries()` gives them one by one (floats or tensors selected
    from `source`, so autograd reaches it); the direct layout reads `source` whole and splits it only where
    events are made."""

    __slots__ = ("source", "count")

    def __init__(self, source: Any, count: int):
        self.source, self.count = source, count

    def entries(self) -> list:
        source = self.source
        if not isinstance(source, torch.Tensor) or source.dim() == 0:
            return [source] * self.count
        if source.requires_grad:
            # Single views, not unbind's: autograd refuses the views of a multi-output op once their base has
            # changed in place, and the events outlive such a change (the engine then compiles them afresh).
            return [source.select(-1, k) for k in range(self.count)]
        return list(source.unbind(-1))


def _split(name: str, value: Any, count: int | None = None) -> _Shots:
    """`value` as per-shot values along its last axis (a float or a tensor, for the checks made on it as a
    whole).

    A scalar gives `count` copies (one if `count` is None); an array of last axis
    `count` gives its entries (or columns, for a leading train axis).
    """
    if not isinstance(value, torch.Tensor):
        array = np.asarray(value, dtype=np.float64)
        # A copy: a tensor sharing a NumPy array's memory would change, unseen by any version counter, with it.
        value = float(array) if array.ndim == 0 else torch.tensor(array)
    if not isinstance(value, torch.Tensor) or value.dim() == 0:
        return _Shots(value, 1 if count is None else count)
    if value.dim() > 2 or (count is not None and value.shape[-1] != count):
        expected = "a scalar" + (f" or {count} values (last axis)" if count is not None else " or a 1-D/2-D array")
        raise ValueError(f"{name} must be {expected}, got shape {tuple(value.shape)}")
    return _Shots(value, value.shape[-1])


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


def _durations(shots: _Shots) -> list | None:
    """The per-shot durations as `Delay` holds them (floats, or 0-d float64 tensors), or None unless each
    is a single finite time >= 0."""
    source = shots.source
    if not isinstance(source, torch.Tensor):
        return shots.entries() if 0.0 <= source < math.inf else None
    if source.dim() > 1 or source.is_complex() or source.dtype == torch.bool:
        return None
    detached = source.detach()
    if not bool((torch.isfinite(detached) & (detached >= 0)).all()):
        return None
    # `_time_s` widens each duration, and the compiler works on the host: once here for the whole train (a
    # GPU tensor is copied once; autograd carries the gradients of the timestamps back to it).
    wide = source.to("cpu", torch.float64)
    if wide is source:
        return shots.entries()
    return [wide] * shots.count if source.dim() == 0 else list(wide.unbind(-1))


def _timeline(steps: list) -> tuple[list, tuple, Any]:
    """The moments `t[0] = 0.0`, `t[k + 1] = t[k] + steps[k]` (s) of a train laid out from 0 s.

    Returns the moments in us (`t[k] * 1e6`, the timestamps of the events played at
    them); the same as one float64 vector with a bool array of which carry a
    derivative; and the last moment in s. The durations are added one by one, as
    `compose` adds them, so each moment has the value and type the operators give it:
    a float until the first tensor step, then a 0-d float64 tensor, which carries a
    derivative (reverse or forward mode) from the first step that does. A step on a
    GPU is copied to the host, where the compiler works (autograd reaches it).
    """
    steps = [step.cpu() if isinstance(step, torch.Tensor) and not step.is_cpu else step for step in steps]
    first = len(steps) if set(map(type, steps)) <= {float} else next(
        k for k, step in enumerate(steps) if isinstance(step, torch.Tensor))
    moments = np.cumsum(np.array([0.0] + steps[:first], dtype=np.float64))  # one by one, in order: `t += step`
    floats = torch.from_numpy(moments * 1e6)
    stamps, t = floats.tolist(), float(moments[-1])
    rest = steps[first:]
    if not rest:
        return stamps, (floats, np.zeros(len(stamps), dtype=bool)), t
    # Cumulative sums: on the CPU they add one by one, in order, so each moment is the sum the operators
    # make (test_builders_speed holds them to it), in one call that autograd sees through. The steps
    # before the first one with a derivative are summed apart, so the moments before it carry none.
    tracked = next((k for k, step in enumerate(rest) if differentiated(step)), len(rest))
    parts = [floats]
    carries = np.arange(len(steps) + 1) > first + tracked  # moment k + 1 is the sum up to step k
    for part in (rest[:tracked], rest[tracked:]):
        if part:
            column = [t if isinstance(t, torch.Tensor) else torch.tensor(t, dtype=torch.float64, device="cpu")]
            column += (step if isinstance(step, torch.Tensor) else torch.tensor(step, dtype=torch.float64,
                                                                                 device="cpu") for step in part)
            moments = torch.stack(column).cumsum(0)[1:]
            parts.append(moments * 1e6)
            stamps += parts[-1].unbind()
            t = moments[-1]
    return stamps, (torch.cat(parts), carries), t


_RF, _ADC, _WAIT = EventType.RF, EventType.ADC, EventType.WAIT
_NONE = check_action(EventAction.NONE)
_CRUSHED = check_action(EventAction.CRUSH_BEFORE | EventAction.CRUSH_AFTER)  # as `Refocusing(crushed=True)`
_DEPHASE = check_action(EventAction.CRUSH_AFTER)  # as `Dephase()`
_SPOIL = check_action(EventAction.SPOIL_AFTER)  # as `Spoil()`


def _finish(events, end_s: Any, crusher_dephasing_rad, voxel_size_m,
            columns: EventColumns | None = None) -> SequenceDescription | None:
    """The description of `events` (in time order; or a callable that makes them, `_later`), ending at
    `end_s`, with the columns of its events; None past the float range (the operators then report the
    event whose timestamp is not finite)."""
    if not math.isfinite(as_float(end_s) * 1e6):
        return None
    description = SequenceDescription._from_ordered_events(events, end_s, crusher_dephasing_rad=crusher_dephasing_rad,
                                                           voxel_size_m=voxel_size_m)
    return attach(description, columns)


def _later(make: Callable[[], list]) -> Callable[[], tuple] | tuple:
    """The events `make` makes, made where the description first needs them (`SequenceDescription`'s
    `events`), in the autograd mode of now: the shots' entries are selected from the caller's tensors
    then, so the engine, which reads the columns, never waits for a thousand event objects. Under
    forward-mode AD, a torch.func transform or inference mode the events are made now."""
    if transformed() or torch.is_inference_mode_enabled():
        return tuple(make())
    grad = torch.is_grad_enabled()

    def made() -> tuple:
        with torch.set_grad_enabled(grad):
            return tuple(make())

    return made


def _shot_values(source: Any, count: int) -> torch.Tensor | None:
    """The per-shot values of `source` as one float64 vector [count] on the host, each widened as the compiler
    widens an event's value (a GPU tensor is copied over once; autograd reaches it); None for a train axis,
    or a tensor made in inference mode."""
    if not isinstance(source, torch.Tensor):
        return torch.full((count,), source, dtype=torch.float64)
    if source.dim() > 1 or source.is_inference():
        return None
    wide = source.to("cpu", torch.float64)
    return wide.expand(count) if wide.dim() == 0 else wide


def _shot_columns(slots: tuple, stride: int, moments: tuple | None, flips: _Shots, phases: _Shots, roles: list,
                  head: tuple = (), tail: tuple = ()) -> EventColumns | None:
    """The columns of `head`, then of the shots, then of `tail` (`head`, `tail`: events), laid out with a few
    vector ops (`sequence.columns`); None where the compiler must walk the events instead.

    Shot k holds one event per slot `(type, action, offset)`: at moment `stride * k + offset` of `moments`
    (`_timeline`'s vector and which of its entries carry a derivative), an RF slot is a rotating pulse of
    definition 0 with flip k and phase k, an ADC slot a readout of role `roles[k]` (an echo unless
    NON_ACQUIRED) demodulated by phase k. The events hold the shots' entries, views of the caller's
    tensors: the columns name those tensors as their sources, so that an in-place change makes them stale.
    """
    count = len(roles)
    flip_rad, phase_rad = _shot_values(flips.source, count), _shot_values(phases.source, count)
    if moments is None or flip_rad is None or phase_rad is None or torch.is_inference_mode_enabled():
        return None
    stamps_us, carries = moments
    kinds = np.array([slot[0] for slot in slots], dtype=np.int8)
    rf, adc = kinds == _RF, kinds == _ADC
    role = np.zeros((count, len(slots)), dtype=np.int8)
    role[:, adc] = np.asarray(roles, dtype=np.int8)[:, None]
    echo = (role != AdcRole.NON_ACQUIRED) & adc  # a readout that is not acquired is not an echo
    at = (stride * np.arange(count)[:, None] + np.array([slot[2] for slot in slots])).reshape(-1)
    zero = torch.zeros(count, dtype=torch.float64)
    phases_of = torch.stack([phase_rad if rf[j] or adc[j] else zero for j in range(len(slots))], 1).reshape(-1)
    shots = EventColumns(
        kind=np.tile(kinds, count),
        action=np.tile(np.array([int(slot[1]) for slot in slots], dtype=np.int32), count),
        inversion=np.zeros(count * len(slots), dtype=bool),
        definition_id=np.tile(np.where(rf, 0, -1), count),
        adc_role=role.reshape(-1),
        is_echo=echo.reshape(-1),
        frequency_hz=np.zeros(count * len(slots)),
        timestamp_us=stamps_us.index_select(0, torch.from_numpy(at)),
        timestamp_differentiated=carries[at],
        amplitude_hz=torch.stack([flip_rad if rf[j] else zero for j in range(len(slots))], 1).reshape(-1),
        phase_rad=phases_of,
        rf_phase_differentiated=differentiated(phases_of),
        sources=sources([flips.source, phases.source] + [v for e in head + tail for v in e.params]),
    )
    parts = [walk(head) if head else None, shots, walk(tail) if tail else None]
    return EventColumns.concat(*(part for part in parts if part is not None))


def _train(head: list, flips: _Shots, phases: _Shots, trs: list | None, roles: list, wait_action: EventAction,
           crusher_dephasing_rad, voxel_size_m) -> SequenceDescription | None:
    """`head` (`[]` or `[Inversion(), Delay(lead_s)]`), then per shot `Excitation(a, p) @ Readout(p, role=r)
    @ Delay(0.0, action=wait_action) @ Delay(tr)` (`SSFPFidReadout` or `SPGRReadout`), laid out directly;
    None where the operators must check a value (`trs` None: a duration that is not a time)."""
    if trs is None:
        return None
    lead: tuple = ()
    steps: list = []
    if head:
        inversion, delay = head  # both play at 0 s: the inversion takes no time
        lead = inversion.emit(0.0) + delay.emit(0.0)
        steps.append(delay.duration_s)
    stamps, moments, end_s = _timeline(steps + trs)
    at = len(steps)  # the moment of the first shot
    slots = ((_RF, _NONE, at), (_ADC, _NONE, at), (_WAIT, wait_action, at), (_WAIT, _NONE, at))

    def events() -> list:
        events = list(lead)
        excitation = RfUse.EXCITATION
        for t, a, p, role in zip(stamps[at:-1], flips.entries(), phases.entries(), roles, strict=True):
            events += (trusted_event(_RF, t, (0, excitation, a, p, 0.0, 0, 0.0), _NONE),
                       trusted_event(_ADC, t, (role, p, role != AdcRole.NON_ACQUIRED), _NONE),
                       trusted_event(_WAIT, t, (), wait_action),
                       trusted_event(_WAIT, t, (), _NONE))
        return events

    columns = _shot_columns(slots, 1, moments, flips, phases, roles, head=lead)
    return _finish(_later(events), end_s, crusher_dephasing_rad, voxel_size_m, columns)


@deferred_under_compile
def fse_description(flip_rad, echo_spacing_s, *, phases_rad=0, excitation_flip_rad=math.pi / 2,
                    excitation_phase_rad=math.pi / 2, repetition_time_s=None, crusher_dephasing_rad=0.0,
                    voxel_size_m=None) -> SequenceDescription:
    """A CPMG echo train: an excitation at 0, refocusing pulse j at `(j + 1/2) * echo_spacing_s`, echo j at
    `(j + 1) * echo_spacing_s`, demodulated by its refocusing phase.

    `flip_rad` is `(ETL,)`, or `(trains, ETL)` for one train per row (each event then
    holds a `(trains,)` tensor). The repetition ends at the last echo, or at
    `repetition_time_s` (which must not come before it).
    """
    flips = _split("flip_rad", flip_rad)
    phases = _split("phases_rad", phases_rad, flips.count)
    half_s = _time_s("echo_spacing_s", echo_spacing_s) / 2
    if _values_ok(flips.source) and _values_ok(phases.source):
        description = _fse_train(flips, phases, half_s, excitation_flip_rad, excitation_phase_rad,
                                 repetition_time_s, crusher_dephasing_rad, voxel_size_m)
        if description is not None:
            return description
    ops = [Excitation(excitation_flip_rad, excitation_phase_rad)]
    for flip, phase in zip(flips.entries(), phases.entries(), strict=True):
        ops.append(Delay(half_s) @ Refocusing(flip, phase) @ Delay(half_s) @ FSEReadout(phase))
    if repetition_time_s is not None:
        rest_s = _time_s("repetition_time_s", repetition_time_s) - 2 * half_s * flips.count
        if as_float(rest_s) < 0:
            raise ValueError(f"repetition_time_s = {as_float(repetition_time_s)} s ends before the last echo at "
                             f"{2 * as_float(half_s) * flips.count} s; give at least ETL * echo_spacing_s")
        ops.append(Delay(rest_s))
    return _describe(ops, crusher_dephasing_rad, voxel_size_m)


def _fse_train(flips: _Shots, phases: _Shots, half_s, excitation_flip_rad, excitation_phase_rad, repetition_time_s,
               crusher_dephasing_rad, voxel_size_m) -> SequenceDescription | None:
    """`fse_description`'s layout, direct (see `_train`)."""
    try:
        lead = Excitation(excitation_flip_rad, excitation_phase_rad).emit(0.0)
        half_s = _time_s("duration_s", half_s)
        steps = [half_s] * (2 * flips.count)
        if repetition_time_s is not None:
            rest_s = _time_s("repetition_time_s", repetition_time_s) - 2 * half_s * flips.count
            if as_float(rest_s) < 0:
                return None
            steps.append(_time_s("duration_s", rest_s))
    except ValueError:
        return None
    stamps, moments, end_s = _timeline(steps)
    refocusing, echo = RfUse.REFOCUSING, AdcRole.ECHO_CENTER
    tail = (trusted_event(_WAIT, stamps[-2], (), _NONE),) if repetition_time_s is not None else ()
    slots = ((_WAIT, _NONE, 0), (_RF, _CRUSHED, 1), (_WAIT, _NONE, 1), (_ADC, _NONE, 2), (_WAIT, _NONE, 2))

    def events() -> list:
        events = list(lead)
        for k, (a, p) in enumerate(zip(flips.entries(), phases.entries(), strict=True)):
            start, pulse, sample = stamps[2 * k], stamps[2 * k + 1], stamps[2 * k + 2]
            events += (trusted_event(_WAIT, start, (), _NONE),
                       trusted_event(_RF, pulse, (0, refocusing, a, p, 0.0, 0, 0.0), _CRUSHED),
                       trusted_event(_WAIT, pulse, (), _NONE),
                       trusted_event(_ADC, sample, (echo, p, True), _NONE),
                       trusted_event(_WAIT, sample, (), _NONE))
        return events + list(tail)

    columns = _shot_columns(slots, 2, moments, flips, phases, [echo] * flips.count, lead, tail)
    return _finish(_later(events), end_s, crusher_dephasing_rad, voxel_size_m, columns)


@deferred_under_compile
def mrf_description(flip_rad, repetition_time_s, *, inversion_time_s=0, phases_rad=0, inversion=True,
                    crusher_dephasing_rad=0.0, voxel_size_m=None) -> SequenceDescription:
    """MR fingerprinting (FISP): an ideal inversion and a `Delay(inversion_time_s)`, then per TR
    `Excitation(flip, phase) @ SSFPFidReadout(phase, duration_s=TR)`.

    `repetition_time_s` and `phases_rad` are scalars or one per flip.
    `inversion=False` drops the inversion and its delay.
    """
    flips = _split("flip_rad", flip_rad)
    trs = _split("repetition_time_s", repetition_time_s, flips.count)
    phases = _split("phases_rad", phases_rad, flips.count)
    ops = [Inversion(), Delay(inversion_time_s)] if inversion else []
    if _values_ok(flips.source) and _values_ok(phases.source):
        description = _train(ops, flips, phases, _durations(trs), [AdcRole.SINGLE] * flips.count, _DEPHASE,
                             crusher_dephasing_rad, voxel_size_m)
        if description is not None:
            return description
    ops += [Excitation(a, p) @ SSFPFidReadout(p, duration_s=tr)
            for a, tr, p in zip(flips.entries(), trs.entries(), phases.entries(), strict=True)]
    return _describe(ops, crusher_dephasing_rad, voxel_size_m)


def _spoiled_shots(flips: _Shots, trs: list, phases: _Shots, roles):
    shots = zip(flips.entries(), trs, phases.entries(), roles, strict=True)
    return [Excitation(a, p) @ SPGRReadout(p, duration_s=tr, role=r) for a, tr, p, r in shots]


@deferred_under_compile
def mpnrage_description(nshots, flip_rad, repetition_time_s, *, inversion_time_s=0, phases_rad=0,
                        crusher_dephasing_rad=0.0, voxel_size_m=None) -> SequenceDescription:
    """MPnRAGE: an inversion, `Delay(inversion_time_s)`, then `nshots` spoiled shots
    `Excitation @ SPGRReadout(duration_s=TR)`, each sampled at its pulse."""
    if isinstance(nshots, bool) or int(nshots) != nshots or int(nshots) <= 0:
        raise ValueError(f"nshots must be an integer > 0, got {nshots!r}")
    n = int(nshots)
    flips = _split("flip_rad", flip_rad, n)
    head = [Inversion(), Delay(inversion_time_s)]
    trs = _split("repetition_time_s", repetition_time_s, n)
    phases = _split("phases_rad", phases_rad, n)
    roles = [AdcRole.SINGLE] * n
    if _values_ok(flips.source) and _values_ok(phases.source):
        description = _train(head, flips, phases, _durations(trs), roles, _SPOIL, crusher_dephasing_rad,
                             voxel_size_m)
        if description is not None:
            return description
    ops = head + _spoiled_shots(flips, trs.entries(), phases, roles)
    return _describe(ops, crusher_dephasing_rad, voxel_size_m)


@deferred_under_compile
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
    flips = _split("flip_rad", flip_rad, n)
    phases = _split("phases_rad", phases_rad, n)
    if _values_ok(flips.source) and _values_ok(phases.source):
        description = _train(head, flips, phases, [tr_s] * n, roles, _SPOIL, crusher_dephasing_rad, voxel_size_m)
        if description is not None:
            return description
    ops = head + _spoiled_shots(flips, [tr_s] * n, phases, roles)
    return _describe(ops, crusher_dephasing_rad, voxel_size_m)


@deferred_under_compile
def spgr_description(flip_rad, repetition_time_s, echo_time_s, *, phases_rad=0, crusher_dephasing_rad=0.0,
                     voxel_size_m=None) -> SequenceDescription:
    """Spoiled gradient echo: per shot `Excitation`, `Delay(TE)`, `SPGRReadout(duration_s=TR - TE)`.

    A scalar `flip_rad` gives one shot; an array gives one shot per entry (with
    `phases_rad` scalar or per shot, e.g. RF spoiling). `echo_time_s` must not exceed
    `repetition_time_s`.
    """
    flips = _split("flip_rad", flip_rad)
    phases = _split("phases_rad", phases_rad, flips.count)
    te_s, tr_s = _time_s("echo_time_s", echo_time_s), _time_s("repetition_time_s", repetition_time_s)
    if as_float(te_s) > as_float(tr_s):
        raise ValueError(f"echo_time_s = {as_float(te_s)} s exceeds repetition_time_s = {as_float(tr_s)} s")
    if _values_ok(flips.source) and _values_ok(phases.source):
        description = _spgr_train(flips, phases, te_s, tr_s, crusher_dephasing_rad, voxel_size_m)
        if description is not None:
            return description
    ops = [Excitation(a, p) @ Delay(te_s) @ SPGRReadout(p, duration_s=tr_s - te_s)
           for a, p in zip(flips.entries(), phases.entries(), strict=True)]
    return _describe(ops, crusher_dephasing_rad, voxel_size_m)


def _spgr_train(flips: _Shots, phases: _Shots, te_s, tr_s, crusher_dephasing_rad,
                voxel_size_m) -> SequenceDescription | None:
    """`spgr_description`'s layout, direct (see `_train`)."""
    try:
        rest_s = _time_s("duration_s", tr_s - te_s)
    except ValueError:
        return None
    stamps, moments, end_s = _timeline([te_s, rest_s] * flips.count)
    excitation, single = RfUse.EXCITATION, AdcRole.SINGLE
    slots = ((_RF, _NONE, 0), (_WAIT, _NONE, 0), (_ADC, _NONE, 1), (_WAIT, _SPOIL, 1), (_WAIT, _NONE, 1))

    def events() -> list:
        events: list = []
        for k, (a, p) in enumerate(zip(flips.entries(), phases.entries(), strict=True)):
            pulse, sample = stamps[2 * k], stamps[2 * k + 1]
            events += (trusted_event(_RF, pulse, (0, excitation, a, p, 0.0, 0, 0.0), _NONE),
                       trusted_event(_WAIT, pulse, (), _NONE),
                       trusted_event(_ADC, sample, (single, p, True), _NONE),
                       trusted_event(_WAIT, sample, (), _SPOIL),
                       trusted_event(_WAIT, sample, (), _NONE))
        return events

    columns = _shot_columns(slots, 2, moments, flips, phases, [single] * flips.count)
    return _finish(_later(events), end_s, crusher_dephasing_rad, voxel_size_m, columns)
