"""Sequence events: the enums and the frozen `SequenceEvent`.

Times on events are in microseconds from the start of the repetition; angles in
rad; frequencies in Hz. `params` may hold torch tensors, which keeps a
description differentiable with respect to them.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["EventType", "EventAction", "RfUse", "AdcRole", "RfMode", "SequenceEvent", "USER_ACTIONS"]


class EventType(enum.IntEnum):
    """Kind of event, in the pulserver SEQDESC numbering."""

    WAIT = 0
    RF = 1
    ADC = 2


class EventAction(enum.IntFlag):
    """Bits of the packed action word.

    A user sets CRUSH_BEFORE, CRUSH_AFTER, SPOIL_AFTER and SHIFT_AFTER; packing adds
    INVERSION, RECORD, EXCITATION and REFOCUSING, derived from the RF use.
    """

    NONE = 0
    CRUSH_BEFORE = 1
    CRUSH_AFTER = 2
    INVERSION = 4
    SPOIL_AFTER = 8
    SHIFT_AFTER = 16
    RECORD = 32
    EXCITATION = 64
    REFOCUSING = 128


#: The action bits an event may carry; the others are set by packing.
USER_ACTIONS = (
    EventAction.CRUSH_BEFORE | EventAction.CRUSH_AFTER | EventAction.SPOIL_AFTER | EventAction.SHIFT_AFTER
)


class RfUse(enum.IntEnum):
    """What an RF pulse is for (the whole Pulseq set)."""

    UNKNOWN = 0
    EXCITATION = 1
    REFOCUSING = 2
    INVERSION = 3
    SATURATION = 4
    PREPARATION = 5
    OTHER = 6


class AdcRole(enum.IntEnum):
    NON_ACQUIRED = 0
    SINGLE = 1
    ECHO_CENTER = 2
    NON_CENTER = 3


class RfMode(enum.IntEnum):
    """How a pulse's rotation is formed (mutually exclusive)."""

    INSTANT = 0
    PROFILED = 1
    DYNAMIC = 2


def as_float(value: Any) -> float:
    """A Python float from a number or a one-element tensor, read without autograd (no warning, no graph)."""
    return float(value.detach()) if isinstance(value, torch.Tensor) else float(value)


def check_finite(name: str, value: Any) -> None:
    """Raise `ValueError` if `value` (number or tensor) holds NaN or an infinity."""
    if type(value) is float:  # the common case first
        ok = math.isfinite(value)
    elif isinstance(value, torch.Tensor):
        if value.numel() == 1 and not value.is_complex():  # one value: item() is ~10x cheaper than a reduction
            ok = math.isfinite(value.item())
        else:
            ok = bool(torch.isfinite(value.detach()).all())
    else:
        ok = math.isfinite(float(value))
    if not ok:
        raise ValueError(f"{name} must be finite (a real number of rad or Hz), got {value!r}")


def check_nonnegative(name: str, value: Any, unit: str) -> None:
    """Raise `ValueError` unless `value` is finite and >= 0."""
    check_finite(name, value)
    if isinstance(value, torch.Tensor):
        ok = value.item() >= 0 if value.numel() == 1 and not value.is_complex() else bool((value.detach() >= 0).all())
    else:
        ok = float(value) >= 0
    if not ok:
        raise ValueError(f"{name} must be >= 0 {unit}, got {value!r}")


def check_action(action: Any) -> EventAction:
    """Validate an action word given by a user: only USER_ACTIONS bits are accepted."""
    if type(action) is EventAction or type(action) is int:  # hot path: a table look-up, no enum call
        checked = _USER_ACTION_WORDS.get(action)
        if checked is not None:
            return checked
    try:
        bits = int(action)
    except (TypeError, ValueError):
        raise ValueError(f"action must be an EventAction (or int of its bits), got {action!r}") from None
    if bits < 0 or bits & ~int(USER_ACTIONS):
        raise ValueError(
            f"action has unknown bits {bits & ~int(USER_ACTIONS) if bits >= 0 else bits!r}: accepted are "
            "CRUSH_BEFORE=1, CRUSH_AFTER=2, SPOIL_AFTER=8, SHIFT_AFTER=16 (packing adds the others)"
        )
    return EventAction(bits)


#: bits -> EventAction for every word of USER_ACTIONS bits (the values `check_action` returns).
_USER_ACTION_WORDS = {bits: EventAction(bits) for bits in range(int(USER_ACTIONS) + 1) if not bits & ~int(USER_ACTIONS)}

#: Params per event type.
_PARAM_COUNTS = {EventType.WAIT: 0, EventType.RF: 7, EventType.ADC: 3}

_NOT_ACQUIRED_ECHO = ("is_echo=True contradicts role NON_ACQUIRED: a readout that is not acquired is not an echo "
                      "(record='echo' keeps acquired echoes only); leave is_echo unset (it follows the role) or give "
                      "role SINGLE, ECHO_CENTER or NON_CENTER")


@dataclass(frozen=True)
class SequenceEvent:
    """One timestamped event of a repetition.

    `params` follows the argument order of `rf` (7 values: definition_id, use,
    amplitude_hz, phase_rad, frequency_hz, shim_id, slice_select_gradient_hz_per_m)
    and `adc` (3 values: role, phase_rad, is_echo); WAIT events have none. An ADC event of role
    NON_ACQUIRED is never an echo (ValueError otherwise).
    """

    type: EventType
    timestamp_us: float
    params: tuple = ()
    action: EventAction = EventAction.NONE

    def __post_init__(self) -> None:
        kind = self.type
        if type(kind) is not EventType:
            try:
                kind = EventType(int(kind))
            except ValueError:
                raise ValueError(f"type must be an EventType (WAIT=0, RF=1, ADC=2), got {self.type!r}") from None
            object.__setattr__(self, "type", kind)
        t = self.timestamp_us
        if not (type(t) is float and 0.0 <= t < math.inf):  # a finite float >= 0 needs no further look
            check_nonnegative("timestamp_us", t, "us")
        object.__setattr__(self, "action", check_action(self.action))
        expected = _PARAM_COUNTS[kind]
        if len(self.params) != expected:
            raise ValueError(f"a {kind.name} event takes {expected} params, got {len(self.params)}")
        if kind is EventType.ADC and self.params[2] and int(self.params[0]) == AdcRole.NON_ACQUIRED:
            raise ValueError(_NOT_ACQUIRED_ECHO)

    # -- constructors -------------------------------------------------------------------------
    @classmethod
    def wait(cls, timestamp_us: float, action: EventAction = EventAction.NONE) -> SequenceEvent:
        return cls(EventType.WAIT, timestamp_us, (), action)

    @classmethod
    def rf(
        cls,
        timestamp_us: float,
        definition_id: int,
        use: RfUse,
        amplitude_hz: Any,
        phase_rad: Any = 0.0,
        frequency_hz: Any = 0.0,
        shim_id: int = 0,
        slice_select_gradient_hz_per_m: float = 0.0,
        action: EventAction = EventAction.NONE,
    ) -> SequenceEvent:
        if type(use) is not RfUse:
            try:
                use = RfUse(int(use))
            except ValueError:
                raise ValueError(f"use must be an RfUse (0..6), got {use!r}") from None
        check_finite("amplitude_hz", amplitude_hz)
        check_finite("phase_rad", phase_rad)
        check_finite("frequency_hz", frequency_hz)
        if int(definition_id) < 0:
            raise ValueError(f"definition_id must be >= 0, got {definition_id!r}")
        if int(shim_id) < 0:
            raise ValueError(f"shim_id must be >= 0, got {shim_id!r}")
        params = (int(definition_id), use, amplitude_hz, phase_rad, frequency_hz, int(shim_id),
                  slice_select_gradient_hz_per_m)
        return cls(EventType.RF, timestamp_us, params, action)

    @classmethod
    def adc(
        cls,
        timestamp_us: float,
        role: AdcRole = AdcRole.SINGLE,
        phase_rad: Any = 0.0,
        *,
        is_echo: bool | None = None,
        action: EventAction = EventAction.NONE,
    ) -> SequenceEvent:
        """An ADC event. `is_echo` None follows the role: a readout that is not acquired (NON_ACQUIRED)
        is not an echo, every other one is. `is_echo=True` with role NON_ACQUIRED is a ValueError."""
        if type(role) is not AdcRole:
            try:
                role = AdcRole(int(role))
            except ValueError:
                raise ValueError(f"role must be an AdcRole (0..3), got {role!r}") from None
        check_finite("phase_rad", phase_rad)
        echo = role is not AdcRole.NON_ACQUIRED if is_echo is None else bool(is_echo)
        return cls(EventType.ADC, timestamp_us, (role, phase_rad, echo), action)

    # -- accessors ----------------------------------------------------------------------------
    def _param(self, kind: EventType, index: int, name: str) -> Any:
        if self.type != kind:
            raise AttributeError(f"{name} is defined for {kind.name} events, this is a {self.type.name} event")
        return self.params[index]

    @property
    def rf_definition_id(self) -> int:
        return self._param(EventType.RF, 0, "rf_definition_id")

    @property
    def rf_use(self) -> RfUse:
        return self._param(EventType.RF, 1, "rf_use")

    @property
    def rf_amplitude_hz(self) -> Any:
        return self._param(EventType.RF, 2, "rf_amplitude_hz")

    @property
    def rf_phase_rad(self) -> Any:
        return self._param(EventType.RF, 3, "rf_phase_rad")

    @property
    def rf_frequency_hz(self) -> Any:
        return self._param(EventType.RF, 4, "rf_frequency_hz")

    @property
    def rf_shim_id(self) -> int:
        return self._param(EventType.RF, 5, "rf_shim_id")

    @property
    def slice_select_gradient_hz_per_m(self) -> Any:
        return self._param(EventType.RF, 6, "slice_select_gradient_hz_per_m")

    @property
    def adc_role(self) -> AdcRole:
        return self._param(EventType.ADC, 0, "adc_role")

    @property
    def adc_phase_rad(self) -> Any:
        return self._param(EventType.ADC, 1, "adc_phase_rad")

    @property
    def is_echo(self) -> bool:
        return self._param(EventType.ADC, 2, "is_echo")


_new = object.__new__


def trusted_event(kind: EventType, timestamp_us: Any, params: tuple, action: EventAction) -> SequenceEvent:
    """A `SequenceEvent` built from values its caller has already validated, without `__post_init__`.

    For the hot paths of the package only (operators, builders): `kind` must be an
    `EventType` member, `timestamp_us` a finite time >= 0, `params` the tuple `rf` or
    `adc` builds (enum members, checked values) and `action` a value of `check_action`.
    The event is the one the dataclass constructor gives for the same values.
    """
    event = _new(SequenceEvent)
    event.__dict__.update(type=kind, timestamp_us=timestamp_us, params=params, action=action)
    return event
