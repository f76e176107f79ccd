"""`SequenceDescription`: one repetition's events plus its RF and shim definitions."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from .columns import COLUMNS_KEY
from .events import SequenceEvent, as_float, check_nonnegative
from .operators import compose
from .rf import ideal_rf_definition

__all__ = ["SequenceDescription"]

#: Where `_from_ordered_events` keeps the callable that makes the events, until they are first read.
_MAKE_EVENTS = "_blochsim_make_events"
#: The ideal pulse of definition id 0 in every description laid out here: one frozen definition, whose
#: constants are worked out once (and the compiler's layout, keyed by definition, is kept across descriptions).
_IDEAL = ideal_rf_definition()


@dataclass(frozen=True)
class SequenceDescription:
    """One repetition of a sequence.

    `events` are in time order (`timestamp_us` non-decreasing, us from the repetition
    start); `tr_duration_us` is the time from one repetition's start to the next.
    Timestamps and `tr_duration_us` are floats, or 0-d float64 tensors where a
    duration was a tensor (see `operators`): the engine differentiates durations
    through the intervals between timestamps.
    `rf_definitions` maps definition id -> `RfDefinition`; `shim_definitions` maps
    shim id -> `ShimDefinition`. `crusher_dephasing_rad` is the winding of one
    unbalanced gradient across one voxel of length `voxel_size_m` (m); both give
    diffusion and flow their geometry.

    A builder's description (`sequence.builders`) makes its events where `events` is first read; the
    engine reads the columns laid out beside them instead. A copy or a pickle holds the events.
    """

    subsequence_index: int
    tr_duration_us: Any
    events: tuple
    rf_definitions: dict
    shim_definitions: dict = field(default_factory=dict)
    crusher_dephasing_rad: float = 0.0
    voxel_size_m: float | None = None
    rf_raster_time_s: float = 1e-6

    def __post_init__(self) -> None:
        object.__setattr__(self, "events", tuple(self.events))
        for i, event in enumerate(self.events):
            if not isinstance(event, SequenceEvent):
                raise ValueError(f"events[{i}] must be a SequenceEvent, got {type(event).__name__}")
        check_nonnegative("tr_duration_us", self.tr_duration_us, "us")
        previous = -math.inf
        for i, event in enumerate(self.events):
            t = as_float(event.timestamp_us)
            if t < previous:
                raise ValueError(
                    f"events must be in time order: events[{i}].timestamp_us = {t} us comes before "
                    f"events[{i - 1}].timestamp_us = {previous} us"
                )
            previous = t
        if self.events and as_float(self.tr_duration_us) < previous:
            raise ValueError(
                f"tr_duration_us = {as_float(self.tr_duration_us)} us is shorter than the last event's "
                f"timestamp_us = {previous} us: a repetition must contain its events"
            )
        self._check_settings()
        for i, event in enumerate(self.events):
            if event.type == 1 and event.rf_definition_id not in self.rf_definitions:
                raise ValueError(
                    f"events[{i}] plays RF definition {event.rf_definition_id}, which rf_definitions "
                    f"does not hold (it holds {sorted(self.rf_definitions)})"
                )

    def _check_settings(self) -> None:
        check_nonnegative("crusher_dephasing_rad", abs(float(self.crusher_dephasing_rad)), "rad")
        if self.voxel_size_m is not None:
            v = float(self.voxel_size_m)
            if not (math.isfinite(v) and v > 0):
                raise ValueError(f"voxel_size_m must be None or a finite length > 0 m, got {self.voxel_size_m!r}")
        r = float(self.rf_raster_time_s)
        if not (math.isfinite(r) and r > 0):
            raise ValueError(f"rf_raster_time_s must be > 0 s, got {self.rf_raster_time_s!r}")

    @classmethod
    def _from_ordered_events(cls, events: Any, end_s: Any, *, crusher_dephasing_rad: float = 0.0,
                             voxel_size_m: float | None = None) -> SequenceDescription:
        """What `from_operators` gives for operators that emit `events` and end at `end_s` (s), from
        `start_s = 0` with the ideal definition 0 and no shims, for callers (the builders) whose events
        are `SequenceEvent`s in time order that end by `end_s` and play definition 0 only: the checks
        of each event are skipped, those of the settings are not.

        `events` is a tuple, or a callable that returns it, called where `events` is first read: the
        engine reads a builder's columns instead (`sequence.columns`), so a train of a thousand events
        is simulated without making them."""
        description = object.__new__(cls)
        lazy = callable(events)
        for name, value in (("subsequence_index", 0), ("tr_duration_us", end_s * 1e6),
                            (_MAKE_EVENTS if lazy else "events", events),
                            ("rf_definitions", {0: _IDEAL}), ("shim_definitions", {}),
                            ("crusher_dephasing_rad", crusher_dephasing_rad), ("voxel_size_m", voxel_size_m),
                            ("rf_raster_time_s", 1e-6)):
            object.__setattr__(description, name, value)
        check_nonnegative("tr_duration_us", description.tr_duration_us, "us")
        description._check_settings()
        return description

    def __getattr__(self, name: str) -> Any:
        # Reached only for an attribute not set: the events of `_from_ordered_events` given as a callable.
        make = self.__dict__.get(_MAKE_EVENTS) if name == "events" else None
        if make is None:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        events = self.__dict__.setdefault("events", make())  # a second reader keeps the first one's events
        self.__dict__.pop(_MAKE_EVENTS, None)
        return events

    def __getstate__(self) -> dict:
        # A copy or a pickle holds the events themselves, not the columns laid out beside them (in a
        # copy, `events` is often replaced).
        self.events  # noqa: B018 - made here if not yet
        return {k: v for k, v in self.__dict__.items() if k != COLUMNS_KEY}

    @property
    def adc_events(self) -> tuple:
        """The ADC events, in order."""
        return tuple(e for e in self.events if e.type == 2)

    @classmethod
    def from_operators(
        cls,
        *parts: Any,
        rf_definitions: dict | None = None,
        shim_definitions: dict | None = None,
        subsequence_index: int = 0,
        crusher_dephasing_rad: float = 0.0,
        voxel_size_m: float | None = None,
        start_s: Any = 0.0,
        rf_raster_time_s: float = 1e-6,
    ) -> SequenceDescription:
        """One repetition laid out from operators and `(offset_s, op)` pairs (see `compose`).

        `tr_duration_us` is the end of the layout in us (`end_s * 1e6`, a 0-d float64
        tensor when a duration was a tensor). Definition id 0 is the ideal pulse unless
        `rf_definitions` gives another; the ids `rf_definitions` adds are kept as given.
        """
        events, end_s = compose(*parts, start_s=start_s)
        definitions = {0: _IDEAL}
        definitions.update(rf_definitions or {})
        return cls(subsequence_index, end_s * 1e6, events, definitions, dict(shim_definitions or {}),
                   crusher_dephasing_rad, voxel_size_m, rf_raster_time_s)

    @classmethod
    def from_pulseq(cls, source: Any, **settings: Any) -> SequenceDescription:
        """One repetition of a Pulseq 1.4/1.5 file (a path, its bytes, a stream or a pypulseq `Sequence`):
        `read_pulseq_description(source, **settings)`, which says how blocks become events."""
        from ._pulseq import read_pulseq_description

        return read_pulseq_description(source, **settings)

    def plot(self, axis: Any = None, *, upto_s: float | None = None) -> Any:
        """Draw RF stems (flip in degrees) and ADC markers against time in ms; returns the axis.

        `upto_s` (s) limits the plot to events up to that time. An RF event with one
        value per train is drawn with its first train's flip. Needs matplotlib
        (`blochsim.plot.sequence`).
        """
        from ..plot import sequence

        return sequence(self, axis, upto_s=upto_s)
