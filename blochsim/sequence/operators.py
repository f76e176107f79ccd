"""Operators: modules of sequence events placed in time.

An `Operator` is a function `emit(start_s) -> tuple[SequenceEvent, ...]` plus the
stretch of time `duration_s` it occupies. Operators compose back to back with `@`,
and `compose` lays out a repetition from operators and `(offset_s, op)` pairs.

Conventions (the engine and the packer rely on them):

* Times given to operators are in s, angles in rad, frequencies in Hz; event
  timestamps are in us (`timestamp_us = start_s * 1e6`).
* Time arithmetic is float64. A timestamp (and `duration_s`, and the `end_s` of
  `compose`) is a Python float while every duration before it is a number; it is a
  0-d float64 tensor as soon as one is a tensor. Gradients with respect to a
  `Delay`'s duration therefore reach every later timestamp and the repetition's
  end: a compiler differentiates the intervals `t[i] - t[i-1]`.
* Value arguments (flip, phase, frequency) are Python floats or tensors, kept as
  given in the event params so that they stay differentiable. A 1-D tensor holds
  one value per train (the leading train axis).
* The event structure (count, kinds, actions, ids) of every shipped operator
  depends on structural arguments only, never on values: a zero-length `Delay`
  still emits its WAIT event.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from .events import (
    AdcRole,
    EventAction,
    EventType,
    RfUse,
    SequenceEvent,
    as_float,
    check_action,
    check_finite,
    trusted_event,
)

__all__ = [
    "Operator",
    "compose",
    "module",
    "register_operator",
    "operator",
    "operator_names",
    "Excitation",
    "Refocusing",
    "Inversion",
    "Saturation",
    "SampledPulse",
    "Readout",
    "Delay",
    "Dephase",
    "Spoil",
    "bSSFPReadout",
    "SSFPFidReadout",
    "SSFPEchoReadout",
    "SPGRReadout",
    "FSEReadout",
]


# -- value helpers ----------------------------------------------------------------------------
def _time_s(name: str, value: Any) -> Any:
    """A finite time >= 0 in s: a Python float, or a 0-d float64 tensor (kept differentiable)."""
    if type(value) is float and 0.0 <= value < math.inf:  # the common case, checked at once
        return value
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise ValueError(f"{name} must be a single time in s (a number or 0-d tensor: trains share one "
                             f"timeline), got shape {tuple(value.shape)}")
        value = value if value.dim() == 0 else value.reshape(())
        value = value if value.dtype == torch.float64 else value.to(torch.float64)
        ok = bool(torch.isfinite(value.detach())) and bool(value.detach() >= 0)
    else:
        try:
            value = float(value)
        except (TypeError, ValueError):
            raise ValueError(f"{name} must be a time in s (a number or 0-d tensor), got {value!r}") from None
        ok = math.isfinite(value) and value >= 0
    if not ok:
        raise ValueError(f"{name} must be a finite time >= 0 s, got {value!r}")
    return value


def _value(name: str, value: Any) -> Any:
    """A finite angle (rad) or frequency (Hz): a float, or a tensor of shape () or (trains,) kept as given."""
    if type(value) is float and math.isfinite(value):  # the common case, checked at once
        return value
    if not isinstance(value, torch.Tensor):
        try:
            array = np.asarray(value, dtype=np.float64)
        except (TypeError, ValueError):
            raise ValueError(f"{name} must be a real number, or one per train, got {value!r}") from None
        # A copy: a tensor sharing a NumPy array's memory would change, unseen by any version counter, with it.
        value = float(array) if array.ndim == 0 else torch.tensor(array)
    if isinstance(value, torch.Tensor):
        if value.dim() > 1:
            raise ValueError(f"{name} must be a scalar or 1-D (one value per train), got shape {tuple(value.shape)}")
        if value.is_complex():
            raise ValueError(f"{name} must be real, got a complex tensor")
    check_finite(name, value)
    return value


def _index(name: str, value: Any) -> int:
    """A definition or shim id: an int >= 0."""
    try:
        ok = not isinstance(value, bool) and int(value) == value and int(value) >= 0
    except (TypeError, ValueError):
        ok = False
    if not ok:
        raise ValueError(f"{name} must be an integer >= 0, got {value!r}")
    return int(value)


def _at(event: SequenceEvent, start_s: Any) -> SequenceEvent:
    """`event` moved to `start_s` (s). The prototype was validated when it was built and `start_s` is a sum
    of validated durations, so the copy skips `__post_init__` (half the cost of building a long train)."""
    return trusted_event(event.type, start_s * 1e6, event.params, event.action)


# -- Operator and composition -----------------------------------------------------------------
class Operator:
    """A module of events: `emit(start_s)` returns its events, `duration_s` (s) is the time it occupies.

    `a @ b` plays `a`, then `b` from `a`'s start + `a.duration_s`; the durations add.
    `name` is only for `repr`.
    """

    __slots__ = ("emit", "duration_s", "name")

    def __init__(self, emit: Callable[[Any], tuple], duration_s: Any = 0.0, *, name: str | None = None) -> None:
        if not callable(emit):
            raise TypeError(f"emit must be a callable emit(start_s) -> tuple of SequenceEvent, got {emit!r}")
        self.emit = emit
        self.duration_s = _time_s("duration_s", duration_s)
        self.name = name

    def __matmul__(self, other: Operator) -> Operator:
        if not isinstance(other, Operator):
            return NotImplemented
        # Chains are kept flat, so a long `a @ b @ c @ ...` does not nest one call per `@`.
        chain = _Chain(_links(self) + _links(other))
        return Operator(chain, chain.duration_s)

    def __repr__(self) -> str:
        return f"Operator({self.name or 'custom'}, duration_s={self.duration_s!r})"


class _Chain:
    """`emit` of operators played back to back."""

    def __init__(self, links: tuple) -> None:
        self.links = links
        self.duration_s = _end(0.0, links)

    def __call__(self, start_s: Any) -> tuple:
        events: list = []
        for op in self.links:
            events.extend(op.emit(start_s))
            start_s = start_s + op.duration_s
        return tuple(events)


def _links(op: Operator) -> tuple:
    """The operators `op` plays back to back: its chain's links, or `op` itself. A chain re-wrapped
    with another duration (`Operator(chain_op.emit, other_s)`) stays one link."""
    chain = op.emit
    if isinstance(chain, _Chain) and (chain.duration_s is op.duration_s
                                  or as_float(chain.duration_s) == as_float(op.duration_s)):
        return chain.links
    return (op,)


def _end(start_s: Any, links: tuple) -> Any:
    """`start_s` plus the links' durations, added one by one in play order, exactly as `_Chain` places
    them: float rounding then never puts an event past the end it computes."""
    for op in links:
        start_s = start_s + op.duration_s
    return start_s


def compose(*parts: Any, start_s: Any = 0.0) -> tuple[tuple, Any]:
    """Lay out `parts` from `start_s` (s) and return `(events, end_s)`.

    A bare `Operator` starts where the previous part ended (its start + its
    `duration_s`); an `(offset_s, op)` pair starts at `start_s + offset_s`, and the
    parts after it follow it. `end_s` is the latest end of any part (`start_s` if
    there is none). Events are sorted stably by time, so simultaneous events keep
    their play order.
    """
    start = _time_s("start_s", start_s)
    cursor, end = start, start
    events: list = []
    for i, part in enumerate(parts):
        if isinstance(part, Operator):
            op, at = part, cursor
        elif isinstance(part, tuple) and len(part) == 2 and isinstance(part[1], Operator):
            op, at = part[1], start + _time_s(f"parts[{i}] offset_s", part[0])
        else:
            raise TypeError(f"parts[{i}] must be an Operator or an (offset_s, Operator) pair, got {part!r}")
        emitted = tuple(op.emit(at))
        for event in emitted:
            if not isinstance(event, SequenceEvent):
                raise TypeError(f"parts[{i}] emitted {type(event).__name__}, expected SequenceEvent")
        events.extend(emitted)
        cursor = _end(at, _links(op))
        if as_float(cursor) >= as_float(end):
            end = cursor
    events.sort(key=lambda e: as_float(e.timestamp_us))
    return tuple(events), end


def module(*parts: Any, duration_s: Any) -> Operator:
    """Package `parts` (as in `compose`, offsets relative to the module start) into one operator.

    `duration_s` (s) is given, not derived: events may lie past it (overlapping the
    next module), and it is the caller's choice.
    """
    parts = tuple(parts)
    return Operator(lambda start_s: compose(*parts, start_s=start_s)[0], duration_s, name="module")


# -- the 14 operators -------------------------------------------------------------------------
def _rf_operator(name, use, flip_rad, phase_rad, duration_s, definition_id, frequency_hz, shim_id, action,
                 frequency_name="frequency_hz"):
    proto = SequenceEvent.rf(
        0.0,
        _index("definition_id", definition_id),
        use,
        _value("flip_rad", flip_rad),
        _value("phase_rad", phase_rad),
        _value(frequency_name, frequency_hz),
        _index("shim_id", shim_id),
        action=check_action(action),
    )
    return Operator(lambda start_s: (_at(proto, start_s),), duration_s, name=name)


def Excitation(flip_rad, phase_rad=0.0, *, duration_s=0.0, definition_id=0, frequency_hz=0.0, shim_id=0,
               action=EventAction.NONE) -> Operator:
    """One RF event (use EXCITATION) of flip `flip_rad` about `phase_rad` at the module start.

    The module occupies `duration_s` (s), but the rotation is not spread over it:
    definition 0 turns instantly, a shaped definition turns through its integral.
    """
    return _rf_operator("excitation", RfUse.EXCITATION, flip_rad, phase_rad, duration_s, definition_id,
                        frequency_hz, shim_id, action)


def Refocusing(flip_rad, phase_rad=0.0, *, crushed=True, duration_s=0.0, definition_id=0, frequency_hz=0.0,
               shim_id=0) -> Operator:
    """One RF event (use REFOCUSING); `crushed=True` winds one order before and after it
    (action CRUSH_BEFORE | CRUSH_AFTER)."""
    action = EventAction.CRUSH_BEFORE | EventAction.CRUSH_AFTER if crushed else EventAction.NONE
    return _rf_operator("refocusing", RfUse.REFOCUSING, flip_rad, phase_rad, duration_s, definition_id,
                        frequency_hz, shim_id, action)


def Inversion(*, duration_s=0.0, flip_rad=math.pi, phase_rad=0.0, definition_id=0) -> Operator:
    """One RF event (use INVERSION): the engine sets Z -> -inv_efficiency * Z of the water-like pools."""
    return _rf_operator("inversion", RfUse.INVERSION, flip_rad, phase_rad, duration_s, definition_id, 0.0, 0,
                        EventAction.NONE)


def Saturation(definition_id, flip_rad, *, offset_hz=0.0, phase_rad=0.0, duration_s=0.0, shim_id=0) -> Operator:
    """One RF event (use EXCITATION) played at `offset_hz` (its `frequency_hz`); its power saturates
    the bound pool according to the shape of definition `definition_id`."""
    return _rf_operator("saturation", RfUse.EXCITATION, flip_rad, phase_rad, duration_s, definition_id,
                        offset_hz, shim_id, EventAction.NONE, frequency_name="offset_hz")


def SampledPulse(waveform_rad_per_s, dwell_s, *, phase_rad=0.0, offset_hz=0.0, definition_id=0,
                 shim_id=0) -> Operator:
    """A waveform played sample by sample: one hard RF event (use EXCITATION) per sample.

    Sample k (k = 0..n-1) plays at its midpoint `t_k = (k + 1/2) * dwell_s` from the
    module start, with amplitude `|w_k| * dwell_s` (the flip in rad for the ideal
    definition), phase `phase_rad + arg(w_k) - 2*pi*offset_hz*t_k` and frequency
    `offset_hz`. Free evolution runs between samples; the module spans `n * dwell_s`.

    `waveform_rad_per_s` is a real or complex 1-D array or tensor (a tensor stays
    differentiable). `phase_rad` and `offset_hz` are scalars, or arrays of one entry
    per train: with more than one entry, each event's phase (and frequency) param is
    a tensor of shape `(trains,)`, the leading train axis (the
    engine runs one program per train and stacks the results first).
    """
    w = waveform_rad_per_s
    if not isinstance(w, torch.Tensor):
        w = torch.as_tensor(np.asarray(w, dtype=np.complex128 if np.iscomplexobj(w) else np.float64))
    if w.dim() != 1 or w.numel() == 0:
        raise ValueError(f"waveform_rad_per_s must be a non-empty 1-D waveform, got shape {tuple(w.shape)}")
    if not bool(torch.isfinite(w.detach()).all()):
        raise ValueError("waveform_rad_per_s must be finite (rad/s), it holds NaN or an infinity")
    dwell = _time_s("dwell_s", dwell_s)
    if as_float(dwell) <= 0:
        raise ValueError(f"dwell_s must be > 0 s, got {dwell_s!r}")
    phase, offset = _train_values("phase_rad", phase_rad, w.device), _train_values("offset_hz", offset_hz, w.device)
    # The arithmetic below on one device: that of any value given off the CPU (a waveform on the host with
    # offsets on a GPU, or the reverse). The compiler copies the events' values to the host, once per train.
    device = next((t.device for t in (w, phase, offset, dwell) if isinstance(t, torch.Tensor) and not t.is_cpu),
                  w.device)
    w, phase, offset = (t.to(device) for t in (w, phase, offset))
    if offset.numel() > 1 and _index("definition_id", definition_id) != 0:
        raise ValueError(f"definition_id must be 0 when offset_hz has more than one entry (got {offset.numel()} "
                         f"offsets and definition_id={definition_id!r}): a shaped definition takes one offset")
    if phase.numel() > 1 and offset.numel() > 1 and phase.numel() != offset.numel():
        raise ValueError(f"phase_rad and offset_hz give different train counts ({phase.numel()} and "
                         f"{offset.numel()}); give one entry, or the same number of entries, for each")
    n = w.numel()
    trains = max(phase.numel(), offset.numel()) > 1
    # (n,) sample midpoints from the module start, in s
    t_s = (torch.arange(n, dtype=torch.float64, device=device) + 0.5) * dwell
    amplitude = w.abs() * dwell  # (n,)
    phases = phase + torch.angle(w)[:, None] - 2 * math.pi * offset * t_s[:, None]  # (n, trains or 1)
    phases = phases if trains else phases[:, 0]
    # Plain numbers in give plain numbers out; a tensor anywhere upstream keeps its graph.
    tensor_in = [isinstance(v, torch.Tensor) for v in (waveform_rad_per_s, dwell_s, phase_rad, offset_hz)]
    amplitudes = amplitude.unbind(0) if any(tensor_in[:2]) else amplitude.tolist()
    phases = phases.unbind(0) if trains or any(tensor_in) else phases.tolist()
    if offset.numel() > 1 or tensor_in[3]:
        frequency = offset if offset.numel() > 1 else offset.reshape(())
    else:
        frequency = float(offset)
    definition, shim = _index("definition_id", definition_id), _index("shim_id", shim_id)
    # Built directly: the waveform, phases and offsets were validated above as whole arrays.
    protos = [SequenceEvent(EventType.RF, 0.0, (definition, RfUse.EXCITATION, amplitudes[k], phases[k], frequency,
                                                shim, 0.0)) for k in range(n)]
    offsets_us = (t_s * 1e6).unbind(0) if tensor_in[1] else (t_s * 1e6).tolist()

    def emit(start_s):
        start_us = start_s * 1e6
        return tuple(dataclasses.replace(p, timestamp_us=start_us + dt)
                     for p, dt in zip(protos, offsets_us, strict=True))

    return Operator(emit, n * dwell, name="sampled-pulse")


def _train_values(name: str, value: Any, device: torch.device) -> torch.Tensor:
    """`value` as a 1-D float tensor of one entry per train (a scalar gives one entry)."""
    if isinstance(value, torch.Tensor):
        tensor = value
    else:
        try:
            tensor = torch.as_tensor(np.asarray(value, dtype=np.float64), device=device)
        except (TypeError, ValueError):
            raise ValueError(f"{name} must be a real number or one per train, got {value!r}") from None
    if tensor.dim() > 1 or tensor.numel() == 0 or tensor.is_complex():
        raise ValueError(f"{name} must be a real scalar or a non-empty 1-D array (one per train), "
                         f"got shape {tuple(tensor.shape)}")
    check_finite(name, tensor)
    return tensor.reshape(-1)


def Readout(phase_rad=0.0, *, role=AdcRole.SINGLE, is_echo=None, duration_s=0.0,
            action=EventAction.NONE) -> Operator:
    """One ADC event at the module start, demodulated by `phase_rad`. `is_echo` None follows `role`: a
    NON_ACQUIRED readout is not an echo, any other is (`is_echo=True` with NON_ACQUIRED: ValueError)."""
    proto = SequenceEvent.adc(0.0, role, _value("phase_rad", phase_rad), is_echo=is_echo,
                              action=check_action(action))
    return Operator(lambda start_s: (_at(proto, start_s),), duration_s, name="readout")


def Delay(duration_s, *, action=EventAction.NONE) -> Operator:
    """One WAIT event at the module start; free evolution runs over `duration_s` (s)."""
    proto = SequenceEvent.wait(0.0, check_action(action))
    return Operator(lambda start_s: (_at(proto, start_s),), duration_s, name="delay")


def Dephase() -> Operator:
    """A zero-length WAIT with CRUSH_AFTER: every order advances by one."""
    return Delay(0.0, action=EventAction.CRUSH_AFTER)


def Spoil() -> Operator:
    """A zero-length WAIT with SPOIL_AFTER: every transverse order is zeroed."""
    return Delay(0.0, action=EventAction.SPOIL_AFTER)


def bSSFPReadout(phase_rad=0.0, *, duration_s=0.0, role=AdcRole.SINGLE, is_echo=None) -> Operator:
    """`Readout`, then `Delay(duration_s)`. Balanced: no winding."""
    return Readout(phase_rad, role=role, is_echo=is_echo) @ Delay(duration_s)


def SSFPFidReadout(phase_rad=0.0, *, duration_s=0.0, role=AdcRole.SINGLE, is_echo=None) -> Operator:
    """`Readout`, `Dephase`, `Delay(duration_s)` (FISP: samples the FID, then winds one order)."""
    return Readout(phase_rad, role=role, is_echo=is_echo) @ Dephase() @ Delay(duration_s)


def SSFPEchoReadout(phase_rad=0.0, *, duration_s=0.0, role=AdcRole.SINGLE, is_echo=None) -> Operator:
    """`Dephase`, `Readout`, `Delay(duration_s)` (PSIF: samples the echo formed by the preceding excitation)."""
    return Dephase() @ Readout(phase_rad, role=role, is_echo=is_echo) @ Delay(duration_s)


def SPGRReadout(phase_rad=0.0, *, duration_s=0.0, role=AdcRole.SINGLE, is_echo=None) -> Operator:
    """`Readout`, `Spoil`, `Delay(duration_s)`."""
    return Readout(phase_rad, role=role, is_echo=is_echo) @ Spoil() @ Delay(duration_s)


def FSEReadout(phase_rad=0.0, *, duration_s=0.0, is_echo=True) -> Operator:
    """`Readout(role=ECHO_CENTER)`, then `Delay(duration_s)`. No gradient action: the crushers
    belong to the refocusing pulses."""
    return Readout(phase_rad, role=AdcRole.ECHO_CENTER, is_echo=is_echo) @ Delay(duration_s)


# -- registry ---------------------------------------------------------------------------------
_REGISTRY: dict[str, Callable[..., Operator]] = {}


def _key(name: str) -> str:
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"an operator name must be a non-empty string, got {name!r}")
    return name.strip().lower().replace("_", "-")


def register_operator(name: str, factory: Callable[..., Operator]) -> None:
    """Register `factory` (a callable returning an `Operator`) under `name`.

    Names are case-insensitive and `_` reads as `-`; a name already taken raises `ValueError`.
    """
    key = _key(name)
    if not callable(factory):
        raise TypeError(f"factory for operator {name!r} must be callable, got {factory!r}")
    if key in _REGISTRY:
        raise ValueError(f"operator name {name!r} is already registered (as {key!r}); choose another name")
    _REGISTRY[key] = factory


def operator(name: str) -> Callable[..., Operator]:
    """The factory registered under `name` (case-insensitive, `_` reads as `-`)."""
    key = _key(name)
    try:
        return _REGISTRY[key]
    except KeyError:
        near = difflib.get_close_matches(key, list(_REGISTRY), n=1)
        hint = f" (did you mean {near[0]!r}?)" if near else ""
        raise ValueError(f"no operator named {name!r}{hint}; registered: {', '.join(_REGISTRY)}") from None


def operator_names() -> tuple[str, ...]:
    """Registered names, in registration order (the 14 shipped ones first)."""
    return tuple(_REGISTRY)


for _name, _factory in (
    ("excitation", Excitation),
    ("refocusing", Refocusing),
    ("inversion", Inversion),
    ("saturation", Saturation),
    ("sampled-pulse", SampledPulse),
    ("readout", Readout),
    ("delay", Delay),
    ("dephase", Dephase),
    ("spoil", Spoil),
    ("bssfp-readout", bSSFPReadout),
    ("ssfp-fid-readout", SSFPFidReadout),
    ("ssfp-echo-readout", SSFPEchoReadout),
    ("spgr-readout", SPGRReadout),
    ("fse-readout", FSEReadout),
):
    register_operator(_name, _factory)
del _name, _factory
