"""A sequence diagram: RF pulses (flip in degrees) and ADC samples against time."""

from __future__ import annotations

import math
from typing import Any

from ._figure import new_axis

__all__ = ["sequence"]


def _first(value: Any) -> float:
    """A float from a number or the first entry of a (per-train) tensor."""
    return float(value.detach().reshape(-1)[0]) if hasattr(value, "detach") else float(value)


def sequence(description: Any, axis: Any = None, *, upto_s: float | None = None) -> Any:
    """Draw RF stems (flip in degrees) and ADC markers of a `SequenceDescription` against time in ms; returns
    the axis.

    `upto_s` (s) limits the plot to events up to that time. An RF event with one value per train is drawn
    with its first train's flip.
    """
    from ..sequence.events import EventType, as_float

    axis = new_axis(axis, "SequenceDescription.plot")
    rf_ms, flips_deg, adc_ms = [], [], []
    for event in description.events:
        t_ms = as_float(event.timestamp_us) * 1e-3
        if upto_s is not None and t_ms > upto_s * 1e3:
            break
        if event.type == EventType.RF:
            definition = description.rf_definitions[event.rf_definition_id]
            flip, _ = definition.flip_angle(_first(event.rf_amplitude_hz),
                                            rf_raster_time_s=description.rf_raster_time_s)
            rf_ms.append(t_ms)
            flips_deg.append(math.degrees(flip))
        elif event.type == EventType.ADC:
            adc_ms.append(t_ms)
    if rf_ms:
        axis.stem(rf_ms, flips_deg, label="RF")
    if adc_ms:
        axis.plot(adc_ms, [0.0] * len(adc_ms), "rv", label="ADC")
    axis.set_xlabel("time (ms)")
    axis.set_ylabel("flip (deg)")
    if rf_ms or adc_ms:
        axis.legend(loc="upper right", fontsize="small")
    return axis
