"""Compile a `SequenceDescription` into a kernel program.

A program is the *structure* (per-event action bits and sample slots, the path, the order count) plus
*values* (interval lengths, flips, phases) as torch tensors built from the description's own numbers,
so autograd carries gradients from the kernels back to whatever tensors the description was made of.

Event semantics are those of `blochsim._reference` (its module docstring). WAIT events with no action
only mark time, so they are dropped; their time goes into the next event's interval.

The compiler reads the events as columns (`sequence.columns`): a builder's, laid out with vector ops, or
one walk over the events. What the structure alone decides (`_layout`) is kept for the last structure
seen, so a loop that rebuilds one train with new values (a gradient step over its flips) compiles it
with a few vector ops on the values.
"""

from __future__ import annotations

import cmath
import copy
import dataclasses
import math
import operator
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

from .. import _native as nat
from .._arrays import differentiated, transformed
from ..sequence.columns import COLUMNS_KEY, columns_of
from ..sequence.events import AdcRole, EventAction, EventType, trusted_event
from ..sequence.spinor import slice_profile_of
from .pulses import PulsePlan, plan_pulses

__all__ = ["Program", "TrainAxisError", "compile_program", "default_states", "shifts_per_repetition",
           "split_trains", "windings", "values_of", "unroll"]

_WINDING = int(EventAction.CRUSH_BEFORE | EventAction.CRUSH_AFTER | EventAction.SHIFT_AFTER)
_RECORD_MODES = ("all", "acquired", "echo")


@dataclass
class Program:
    """A compiled program. `action`/`record` are int32 numpy arrays; the values are float64 tensors."""

    action: np.ndarray  # [E] bs_action bits
    record: np.ndarray  # [E] sample slot or -1
    dt_s: torch.Tensor  # [E]
    dt_wrap_s: torch.Tensor  # [1]
    flip_rad: torch.Tensor  # [E] signed flips (real path: half turns folded in)
    phase_rad: torch.Tensor  # [E] RF phase, or ADC demodulation phase (real path: relative to the axis)
    num_repetitions: int
    num_samples: int
    num_states: int
    path: int
    crusher_dk_rad_per_m: float
    voxel_size_m: float
    sample_events: list  # description index of each recorded sample
    sat_per_rad2: np.ndarray  # [E] saturation constant S of each rotating pulse's definition (0 elsewhere)
    rf_hz: np.ndarray  # [E] frequency offset of each rotating pulse, Hz
    axis_phase_rad: float = 0.0  # the common pulse axis on the real path
    # Per-voxel pulses (engine.pulses): per event its row of the field, profile and spinor tables (-1: none;
    # None: no event has one), and what the rows play.
    field_row: np.ndarray | None = None
    profile_row: np.ndarray | None = None
    spinor_row: np.ndarray | None = None
    pulses: PulsePlan | None = None
    # What was moved to a device: device -> (action, record), (device, dtype) -> values. Shallow copies of
    # a program share it, so each entry keeps the arrays it was made from and serves only those.
    bound: dict = field(default_factory=dict, repr=False, compare=False)
    # (tensor, version counter, requires_grad) of each tensor the values were read from, for a program that
    # may be kept for reuse (`compile_program`); None for one that may not (its values carry a derivative).
    sources: tuple | None = field(default=None, repr=False, compare=False)

    @property
    def constant(self) -> bool:
        """No value carries a derivative: the program can be reused by later calls."""
        return not any(differentiated(v) for v in (self.dt_s, self.dt_wrap_s, self.flip_rad, self.phase_rad))

    @property
    def current(self) -> bool:
        """Whether the program may be reused: its values were read from tensors that have not changed in
        place since (a version counter moves with every in-place change) nor been made to require grad."""
        if self.sources is None:
            return False
        for tensor, version, grad in self.sources:
            if tensor._version != version or tensor.requires_grad is not grad:
                return False
        return True

    def structure_on(self, device) -> tuple:
        """(action, record) as int32 tensors on `device`, made once per device."""
        hit = self.bound.get(device)
        if hit is None or hit[0] is not self.action or hit[1] is not self.record:
            on_device = (torch.from_numpy(self.action).to(device), torch.from_numpy(self.record).to(device))
            hit = self.bound[device] = (self.action, self.record, on_device)
            _HOST_ACTIONS[on_device[0]] = self.action
        return hit[2]

    def rows_on(self, device) -> tuple:
        """(field_row, profile_row, spinor_row) as int32 tensors on `device` (None where absent), once per
        device."""
        own = (self.field_row, self.profile_row, self.spinor_row)
        hit = self.bound.get(("rows", device))
        if hit is None or not all(a is b for a, b in zip(hit[0], own, strict=True)):
            on_device = tuple(None if r is None else torch.from_numpy(r).to(device) for r in own)
            hit = self.bound[("rows", device)] = (own, on_device)
        return hit[1]


def _count_windings(a: np.ndarray) -> int:
    shift_after = ((a & nat.SHIFT_AFTER) != 0) & ((a & nat.SPOIL_AFTER) == 0)
    return int(((a & nat.CRUSH_BEFORE) != 0).sum() + ((a & nat.CRUSH_AFTER) != 0).sum() + shift_after.sum())


def shifts_per_repetition(description) -> int:
    """Windings of one repetition: events with CRUSH_BEFORE, CRUSH_AFTER or SHIFT_AFTER count once per bit."""
    n = 0
    for e in description.events:
        bits = int(e.action)
        n += bool(bits & EventAction.CRUSH_BEFORE) + bool(bits & EventAction.CRUSH_AFTER)
        n += bool(bits & EventAction.SHIFT_AFTER) and not bits & EventAction.SPOIL_AFTER
    return n


#: The most EPG orders a call may ask for. A voxel's state holds 3 complex values per order (more with pools:
#: up to 16), and the adjoint keeps several copies per voxel, so 2**16 orders already take ~1.5 MiB of float32
#: state per voxel per copy; no train winds that far usefully (orders past 1 + repetitions x windings per
#: repetition stay zero), and a larger count is a slip that would otherwise fail while allocating.
MAX_STATES = 1 << 16


def check_states(states, name: str = "states") -> int | None:
    """`states` as an int (NumPy integers accepted), None kept; ValueError naming `name` for anything but an
    integer in 1..MAX_STATES."""
    if states is None:
        return None
    try:
        count = operator.index(states)  # ints and NumPy integers; not bools, floats or strings
    except TypeError:
        count = None
    if count is None or isinstance(states, bool) or count < 1:
        raise ValueError(f"{name} must be an integer >= 1 (EPG orders) or None (automatic), got {states!r}")
    if count > MAX_STATES:
        raise ValueError(f"{name}={count} asks for more EPG orders than blochsim allocates ({MAX_STATES} = 2**16): "
                         "each voxel's state holds 3 complex values per order, and orders past 1 + repetitions x "
                         "windings per repetition stay zero; give fewer states, or None for the automatic count")
    return count


def default_states(description, repetitions: int) -> int:
    """The default EPG orders: max(8, min(64, 1 + repetitions x windings per repetition))."""
    return max(8, min(64, 1 + repetitions * shifts_per_repetition(description)))


#: The host array of each action tensor that structure_on placed on a device: the adjoints size their
#: store by it (replay_slots) without reading the device.
_HOST_ACTIONS = torch.utils.weak.WeakIdKeyDictionary()
#: replay_slots per action tensor, by (repetitions, stride): a call's plan asks for several strides, and
#: calls repeat.
_SLOTS = torch.utils.weak.WeakIdKeyDictionary()
#: The actions of an event that makes a pass over the states (event_loop.hpp passes_over_states).
_PASS = nat.INTERVAL | nat.INVERSION | nat.ROTATE


def slots_at(action: torch.Tensor, repetitions: int) -> Callable[[int], int]:
    """stride -> replay_slots of the program whose action tensor is `action` (on the host, or placed on a device
    by structure_on), or 0 (one slot per event) where its host array is not at hand."""
    action = plain(action)
    host = action.numpy() if action.device.type == "cpu" else _HOST_ACTIONS.get(action)
    if host is None:
        return lambda stride: 0
    memo = _SLOTS.setdefault(action, {})

    def at(stride: int) -> int:
        key = (repetitions, stride)
        if key not in memo:
            memo[key] = replay_slots(host, repetitions, stride)
        return memo[key]

    return at


def replay_slots(action: np.ndarray, repetitions: int, stride: int) -> int:
    """The states the adjoints keep while they replay a stretch (bs_program checkpoint_slots): the
    most events that touch the states (relax, rotate or invert) within one stretch of `stride` events, the
    stretches starting at multiples of `stride` over every repetition's events. At least 1."""
    passes = np.tile((np.asarray(action) & _PASS) != 0, repetitions)
    ends = np.concatenate([[0], np.cumsum(passes)])
    starts = np.arange(0, passes.size, stride)
    per_stretch = ends[np.minimum(starts + stride, passes.size)] - ends[starts]
    return max(1, int(per_stretch.max(initial=0)))


def plain(t: torch.Tensor) -> torch.Tensor:
    """`t` without torch.func's wrappers (every tensor made under a transform is wrapped and has no storage).

    Only for reading values that carry no derivative (structure, constants); derivatives flow through
    the autograd Functions, which torch.func calls with unwrapped tensors."""
    while torch._C._functorch.is_functorch_wrapped_tensor(t):
        t = torch._C._functorch.get_unwrapped(t)
    return t


_WINDING = nat.CRUSH_BEFORE | nat.CRUSH_AFTER | nat.SHIFT_AFTER
_RF, _ADC = int(EventType.RF), int(EventType.ADC)  # ints: NumPy compares them ~5x faster than enums
_CACHE = "_blochsim_programs"


# -- train axis --------------------------------------------------------------------
class _PerTrain(Exception):
    """Raised inside `_compile` at the first event value with more than one entry."""


class TrainAxisError(NotImplementedError):
    """A description whose event values carry a train axis, given to a compiler of one train.

    `engine.simulate`, `engine.jacobian`, the simulators and `EpgEngine.simulate` (through
    `pack_description`) run `parts` (`split_trains`), one program per train; any other caller sees the
    message.
    """

    def __init__(self, parts: list):
        super().__init__(f"this description has a train axis ({len(parts)} trains: event values of shape "
                         f"({len(parts)},)) and this caller takes one train; blochsim.engine.simulate and jacobian "
                         "and EpgEngine.simulate take them all, or give one train at a time "
                         "(blochsim.engine.split_trains)")
        self.parts = parts


#: Event values that may carry a train axis: (event type, index in params, name of the accessor).
_TRAIN_VALUES = {EventType.RF: ((2, "rf_amplitude_hz"), (3, "rf_phase_rad"), (4, "rf_frequency_hz")),
                 EventType.ADC: ((1, "adc_phase_rad"),)}
_TRAINS = "_blochsim_trains"


def split_trains(description) -> list | None:
    """One description per train, or None when `description` has one train.

    An event value (RF amplitude, phase and frequency, ADC phase) is a number or a 0-d or one-element
    tensor shared by every train, or a 1-D tensor of one value per train; all of those have one length T.
    Train k holds entry k of each (autograd flows back through the indexing); times, the repetition
    and the definitions are shared: the trains have one timeline. Raises ValueError for per-train values
    of different lengths, of more than one axis, or of none. The parts are kept on `description` while
    no per-train value carries a derivative.
    """
    kept = getattr(description, _TRAINS, None)
    if kept is not None:
        return kept or None
    found = {}  # event index -> [(param index, value)]
    length, first, constant = None, None, True
    for i, event in enumerate(description.events):
        for index, name in _TRAIN_VALUES.get(event.type, ()):
            value = event.params[index]
            if not isinstance(value, torch.Tensor) or value.numel() == 1:
                continue
            where = f"events[{i}].{name}"
            if value.dim() != 1 or value.numel() == 0:
                raise ValueError(f"{where} has shape {tuple(value.shape)}: an event value is a scalar or 1-D, one "
                                 "value per train (the leading train axis)")
            if length is None:
                length, first = value.numel(), where
            elif value.numel() != length:
                raise ValueError(f"event values disagree on the number of trains: {first} has {length} entries and "
                                 f"{where} has {value.numel()}; give every per-train value the same length (a "
                                 "scalar is shared by every train)")
            found.setdefault(i, []).append((index, value))
            constant = constant and not differentiated(value)
    parts = [_train(description, found, k) for k in range(length)] if found else []
    if constant and hasattr(description, "__dict__"):
        object.__setattr__(description, _TRAINS, parts)
    return parts or None


def _train(description, found: dict, k: int):
    """Train `k` of `description`: its per-train event values replaced by entry `k`."""
    events = list(description.events)
    for i, values in found.items():
        params = list(events[i].params)
        for index, value in values:
            params[index] = value[k]
        event = events[i]
        events[i] = trusted_event(event.type, event.timestamp_us, tuple(params), event.action)
    part = copy.copy(description)
    for memo in (_CACHE, _TRAINS, COLUMNS_KEY):  # they describe the whole description's events
        part.__dict__.pop(memo, None)
    object.__setattr__(part, "events", tuple(events))
    return part


def compile_program(description, *, repetitions: int = 1, record: str = "all", states: int | None = None,
                    complex_states: bool = False, checkpoint_stride: int = 4, slice_profile=None) -> Program:
    """Compile `description` for the kernels.

    `complex_states=True` forces the complex path (the caller sets it when tissue asks for phase physics:
    B0, B1phase, v or pool shifts). Otherwise the real path is taken when every rotating pulse shares one
    phase axis modulo half turns and no RF phase is differentiated. The events are read as columns
    (`sequence.columns`: those the description's builder laid out, else one walk over its events), then
    compiled with a few vector ops per array; each RF definition is read once.

    A program whose values carry no derivative is kept on its description (per set of arguments) and
    later calls reuse it, with its values already on the device they ran on, while the tensors it was
    read from are unchanged (`Program.current`): a tensor of the description changed in place (`with
    torch.no_grad(): flips[3] = ...`) bumps its version counter, and the next call compiles afresh
    (`_value_sources`). Differentiated programs are compiled on every call.
    A description with a train axis raises `TrainAxisError`, whose `parts` are its trains (`split_trains`).
    `slice_profile` (an `ExactSliceProfile`, or an int of positions) plays PROFILED definitions per slice
    position (`engine.pulses`); static shims and dynamic pTx pulses are planned whatever it is.
    """
    if not isinstance(checkpoint_stride, int) or checkpoint_stride < 1:
        raise ValueError(f"checkpoint_stride must be an integer >= 1, got {checkpoint_stride!r}")
    if record not in ("all", "acquired", "echo"):
        raise ValueError(f"record must be one of ('all', 'acquired', 'echo'), got {record!r}")
    if not isinstance(repetitions, int) or isinstance(repetitions, bool) or repetitions < 1:
        raise ValueError(f"repetitions must be an integer >= 1, got {repetitions!r}")
    states = check_states(states)
    slice_profile = slice_profile_of(slice_profile)
    key = (repetitions, record, states, complex_states, checkpoint_stride,
           None if slice_profile is None else slice_profile.key())
    cache = getattr(description, _CACHE, None)
    kept = None if cache is None else cache.get(key)
    if kept is not None and kept.current:
        return copy.copy(kept)  # callers may set fields (states, phases) on theirs
    trains = getattr(description, _TRAINS, None)
    if trains:  # split by an earlier call: skip the partial compile
        raise TrainAxisError(trains)
    try:
        program = _compile(description, repetitions, record, states, complex_states, slice_profile)
    except _PerTrain:
        raise TrainAxisError(split_trains(description)) from None
    if not program.constant or not hasattr(description, "__dict__"):
        return program
    sources = _value_sources(description)
    # Under no_grad a differentiated description compiles to constants: keep only what grad mode would.
    if sources is None or not torch.is_grad_enabled() and any(differentiated(t) for t, _, _ in sources):
        return program
    program.sources = sources
    if cache is None:
        cache = {}
        object.__setattr__(description, _CACHE, cache)
    cache[key] = program
    return copy.copy(program)


def _value_sources(description) -> tuple | None:
    """(tensor, version counter, requires_grad) of each distinct tensor the compiler reads values of
    `description` from: the sources its builder named beside its columns (while they are current), else
    every tensor its events and `tr_duration_us` hold. A view shares its base's counter, so the events of
    a train that hold entries of one flip tensor count once. None when a tensor has no version counter
    (an inference tensor may change in place unseen): such a description is not kept."""
    kept = getattr(description, COLUMNS_KEY, None)
    if kept is not None and kept.current:
        tensors = [source[0] for source in kept.sources]
    else:
        tensors = [v for e in description.events for v in (e.timestamp_us, *e.params) if isinstance(v, torch.Tensor)]
    if isinstance(description.tr_duration_us, torch.Tensor):
        tensors.append(description.tr_duration_us)
    bases = {}
    for tensor in tensors:
        if tensor.is_inference():
            return None
        base = tensor if tensor._base is None else tensor._base
        bases[id(base)] = base
    return tuple((base, base._version, base.requires_grad) for base in bases.values())


def _host(t: torch.Tensor) -> np.ndarray:
    """The values of a CPU tensor as a NumPy array (through a list under forward-mode AD or torch.func, whose
    tensors have no storage to share)."""
    t = t.detach()
    return np.asarray(t.tolist()) if transformed() else t.numpy()


@dataclass(frozen=True)
class _Layout:
    """What the structure of a description's events decides for one record mode: which events the program
    plays and, per played event, its action bits (INTERVAL aside: that depends on the times), sample slot,
    definition constants and frequency offset."""

    kept: np.ndarray  # [N] bool: the events played (a WAIT without action only marks time)
    take: torch.Tensor | None  # [E] int64 indices of the played events; None when every event is played
    action: np.ndarray  # [E] int32 bs_action bits
    record: np.ndarray  # [E] int32 sample slot or -1
    samples: list  # [S] description index of each sample
    scale: np.ndarray  # [E] 2 pi |I| of a rotating pulse's definition, 1 elsewhere
    extra: np.ndarray  # [E] arg I of a rotating pulse's definition, rad; 0 elsewhere
    sat: np.ndarray  # [E] saturation constant S of a rotating pulse's definition; 0 elsewhere
    rf_hz: np.ndarray  # [E] frequency offset of a rotating pulse, Hz; 0 elsewhere


#: The columns that are structure (`_layout` reads nothing else of them).
_STRUCTURE = ("kind", "action", "inversion", "definition_id", "adc_role", "is_echo", "frequency_hz")
#: (key, definitions, layout) of the last layout made: a train rebuilt on every call with new values (a
#: gradient step over flips) has its structure read once. The key holds the structure columns byte by byte
#: and the identities of the definitions, which the tuple keeps alive so an identity is never reused.
_LAST_LAYOUT: tuple = (None, None, None)


def _layout(columns, description, record: str) -> _Layout:
    """The layout of `columns` (the events of `description`) for `record`, kept for the last structure seen."""
    global _LAST_LAYOUT
    definitions = description.rf_definitions
    structure = (getattr(columns, name) for name in _STRUCTURE)
    key = (record, description.rf_raster_time_s, tuple((k, id(v)) for k, v in definitions.items()),
           tuple((a.dtype.str, a.tobytes()) for a in structure))
    last = _LAST_LAYOUT  # one read: another thread may replace it
    if last[0] == key:
        return last[2]
    kind, inversion = columns.kind, columns.inversion
    rf, adc = kind == _RF, kind == _ADC
    rotating = rf & ~inversion
    if record == "all":
        recorded = adc
    elif record == "echo":
        recorded = adc & columns.is_echo
    else:
        recorded = adc & (columns.adc_role != AdcRole.NON_ACQUIRED)
    bits = (columns.action & (_WINDING | nat.SPOIL_AFTER)).astype(np.int32)
    bits[rotating] |= nat.ROTATE
    bits[rf & inversion] |= nat.INVERSION
    bits[recorded] |= nat.RECORD
    kept = rf | adc | (bits != 0)
    samples = np.flatnonzero(recorded)
    slot = np.full(len(columns), -1, dtype=np.int32)
    slot[samples] = np.arange(len(samples))

    # Per rotating pulse, its definition's 2 pi |I|, arg I and S, each definition read once.
    scale, extra, sat = np.ones(len(columns)), np.zeros(len(columns)), np.zeros(len(columns))
    raster = description.rf_raster_time_s
    for definition_id in np.unique(columns.definition_id[rotating]).tolist():
        definition = definitions[definition_id]
        area = definition.integral(rf_raster_time_s=raster)
        uses = rotating & (columns.definition_id == definition_id)
        scale[uses], extra[uses] = 2 * math.pi * abs(area), cmath.phase(area)
        sat[uses] = float(definition.saturation(rf_raster_time_s=raster))

    if kept.any():
        take = None if kept.all() else torch.from_numpy(np.flatnonzero(kept))
        played = [a[kept] for a in (bits, slot, scale, extra, sat, columns.frequency_hz)]
    else:  # nothing happens: one inert event keeps the program well formed
        take, played = None, [np.zeros(1, dtype=np.int32), np.full(1, -1, dtype=np.int32), np.ones(1),
                              np.zeros(1), np.zeros(1), np.zeros(1)]
    layout = _Layout(kept, take, played[0], played[1], samples.tolist(), *played[2:])
    _LAST_LAYOUT = (key, list(definitions.values()), layout)
    return layout


def check_shims(description) -> None:
    """ValueError at the first RF event of `description` playing a shim id (other than 0) that its
    `shim_definitions` do not hold.

    A builder's description (its columns attached) plays shim 0 throughout and is not walked.
    """
    if getattr(description, COLUMNS_KEY, None) is not None:
        return
    for i, event in enumerate(description.events):
        if event.type is _RF_EVENT and event.params[5] != 0 and event.params[5] not in description.shim_definitions:
            raise ValueError(f"events[{i}] plays shim_id={event.params[5]}, which shim_definitions does not hold "
                             f"(ids: {sorted(description.shim_definitions)})")


_RF_EVENT = EventType.RF


def _compile(description, repetitions, record, states, complex_states, slice_profile=None) -> Program:
    columns = columns_of(description)
    if columns is None:
        raise _PerTrain
    layout = _layout(columns, description, record)
    if layout.kept.any():
        t_us, amplitude, phase_rad = columns.timestamp_us, columns.amplitude_hz, columns.phase_rad
        if layout.take is not None:  # one gather per value array
            t_us, amplitude, phase_rad = (v.index_select(0, layout.take) for v in (t_us, amplitude, phase_rad))
        if not columns.timestamp_differentiated[layout.kept].any():
            t_us = t_us.detach()  # only other moments carry a derivative (a dropped event's, the end): constant
    else:
        t_us = amplitude = phase_rad = torch.zeros(1, dtype=torch.float64)
    # The program's own arrays: the layout is kept for later calls and a caller may change its program's.
    action, records, sat, freqs = (a.copy() for a in (layout.action, layout.record, layout.sat, layout.rf_hz))
    samples, scale, extra = list(layout.samples), layout.scale, layout.extra
    definition_ids = columns.definition_id[layout.kept] if layout.kept.any() else np.full(1, -1)
    pulses = plan_pulses(description, layout.kept, action, definition_ids, slice_profile)

    dt_s = torch.diff(t_us, prepend=t_us.new_zeros(1)) * 1e-6
    tr_us = description.tr_duration_us  # on the host with the columns (a protocol on a GPU: copied, differentiable)
    tr_us = (tr_us.to(device=t_us.device, dtype=torch.float64) if isinstance(tr_us, torch.Tensor)
             else torch.tensor(float(tr_us), dtype=torch.float64)).reshape(1)
    dt_wrap_s = (tr_us - t_us[-1:] + t_us[:1]) * 1e-6
    if states is None:  # as engine.default_states counts it
        states = max(8, min(64, 1 + repetitions * _count_windings(action)))
    nonzero = _host(dt_s != 0)
    nonzero[0] |= bool(dt_wrap_s.detach()[0] != 0) and repetitions > 1
    action[nonzero | differentiated(dt_s)] |= nat.INTERVAL

    flip_rad = amplitude * torch.from_numpy(scale)
    if extra.any():
        phase_rad = phase_rad + torch.from_numpy(extra)
    rotating = (action & nat.ROTATE) != 0
    path, axis = nat.PATH_COMPLEX, 0.0
    if not complex_states and not columns.rf_phase_differentiated and pulses is None:
        turning = _host(phase_rad)[rotating]
        axis = float(turning[0]) if turning.size else 0.0
        turns = (turning - axis) / math.pi
        halves = np.round(turns)
        if not np.any(np.abs(turns - halves) > 1e-9):
            path = nat.PATH_REAL
            flipped = halves % 2 != 0
            if flipped.any():  # x * 1 and x - 0 are x: the common train skips both ops
                sign = np.ones(len(action))
                sign[rotating] = np.where(flipped, -1.0, 1.0)
                flip_rad = flip_rad * torch.from_numpy(sign)
            if axis != 0.0:
                phase_rad = torch.where(torch.from_numpy((action & nat.RECORD) != 0), phase_rad - axis, phase_rad)
        else:
            axis = 0.0

    geometry_dk = 0.0
    voxel = 0.0 if description.voxel_size_m is None else float(description.voxel_size_m)
    if description.crusher_dephasing_rad and description.voxel_size_m is not None:
        geometry_dk = float(description.crusher_dephasing_rad) / voxel
    return Program(
        action=action,
        record=records,
        dt_s=dt_s,
        dt_wrap_s=dt_wrap_s,
        flip_rad=flip_rad,
        phase_rad=phase_rad,
        num_repetitions=repetitions,
        num_samples=len(samples),
        num_states=states,
        path=path,
        crusher_dk_rad_per_m=geometry_dk,
        voxel_size_m=voxel,
        sample_events=samples,
        sat_per_rad2=sat,
        rf_hz=freqs,
        axis_phase_rad=axis,
        field_row=None if pulses is None else pulses.field_row,
        profile_row=None if pulses is None else pulses.profile_row,
        spinor_row=None if pulses is None else pulses.spinor_row,
        pulses=pulses,
    )


def windings(program: Program) -> int:
    """Shifts per repetition of a compiled program (as `shifts_per_repetition` counts them)."""
    return _count_windings(program.action)


def values_of(program: Program) -> tuple:
    """The four value arrays of a program, float64: (dt_s [E], dt_wrap_s [1], flip_rad [E], phase_rad [E])."""
    return program.dt_s, program.dt_wrap_s, program.flip_rad, program.phase_rad


def unroll(program, values: tuple, playings: int, *, stride: int = 1):
    """`playings x stride` playings of a program laid end to end, every `stride`-th recorded: (program, values).

    Sample slot `k * S + s` is sample s of playing `(k + 1) * stride` (counting from 1). The first event of
    every later playing waits the wrap interval, as in a program of that many repetitions. Every per-event
    array of the program (including ones added after this was written) is tiled.
    """
    n = playings * stride
    dt, dt_wrap, flip, phase = values
    E, S = len(program.action), program.num_samples
    later = torch.cat([dt_wrap.reshape(1), dt[1:]])
    changes = {"num_repetitions": 1, "num_samples": playings * S}
    for f in dataclasses.fields(program):
        value = getattr(program, f.name)
        if f.name == "record":
            tiled = np.tile(value, n)
            playing = np.repeat(np.arange(n), E)
            kept = (tiled >= 0) & ((playing + 1) % stride == 0)
            changes[f.name] = np.where(kept, tiled + ((playing + 1) // stride - 1) * S, -1).astype(np.int32)
        elif f.name == "action":
            tiled = np.tile(value, n) & ~nat.RECORD  # set again below where a slot is kept
            if n > 1 and (bool(dt_wrap.detach()[0] != 0) or dt_wrap.requires_grad):
                tiled[E::E] |= nat.INTERVAL
            changes[f.name] = tiled.astype(np.int32)
        elif f.name == "sample_events":
            changes[f.name] = list(value) * playings
        elif isinstance(value, np.ndarray) and value.shape[:1] == (E,):
            changes[f.name] = np.tile(value, (n,) + (1,) * (value.ndim - 1))
    unrolled = dataclasses.replace(program, **changes)
    unrolled.action[unrolled.record >= 0] |= nat.RECORD
    values = (torch.cat([dt] + [later] * (n - 1)), dt_wrap, flip.repeat(n), phase.repeat(n))
    return unrolled, values
