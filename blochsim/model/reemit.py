"""`Simulator.from_description`'s re-emission of a stored description through a class's handlers."""

from __future__ import annotations

import inspect

import torch

from ..sequence.description import SequenceDescription
from ..sequence.events import EventType, RfUse
from ..sequence.operators import (
    compose,
)
from .vocabulary import (
    EventOperators,
)

_SLOT_OF_USE = {RfUse.REFOCUSING: "refocusing", RfUse.INVERSION: "inversion", RfUse.SATURATION: "saturation",
                RfUse.PREPARATION: "preparation", RfUse.OTHER: "other"}


def _accepted(handler) -> set | None:
    """The keyword names `handler` accepts, or None when it takes **kwargs."""
    try:
        params = inspect.signature(handler).parameters.values()
    except (TypeError, ValueError):
        return None
    if any(p.kind == p.VAR_KEYWORD for p in params):
        return None
    return {p.name for p in params}


def _reemit(description: SequenceDescription, operators: EventOperators) -> SequenceDescription:
    parts = []
    for index, event in enumerate(description.events):
        at_s = event.timestamp_us * 1e-6
        if event.type == EventType.RF:
            handler = getattr(operators, _SLOT_OF_USE.get(event.rf_use, "excitation"))
            offered = {"flip_rad": event.rf_amplitude_hz, "phase_rad": event.rf_phase_rad,
                       "definition_id": event.rf_definition_id, "frequency_hz": event.rf_frequency_hz,
                       "offset_hz": event.rf_frequency_hz, "shim_id": event.rf_shim_id}
        elif event.type == EventType.ADC:
            handler = operators.readout
            offered = {"phase_rad": event.adc_phase_rad, "role": event.adc_role, "is_echo": event.is_echo}
        else:
            continue
        accepted = _accepted(handler)
        kwargs = {k: v for k, v in offered.items() if accepted is None or k in accepted}
        if event.type == EventType.RF and event.rf_use == RfUse.INVERSION and accepted is not None:
            kwargs = {k: v for k, v in kwargs.items() if k in accepted}
        if event.type == EventType.RF and event.rf_shim_id != 0 and "shim_id" not in kwargs:
            raise ValueError(f"events[{index}] plays shim_id={event.rf_shim_id}, but the handler its use goes to "
                             f"({handler!r}) takes no shim_id: playing it unshimmed would be another sequence")
        parts.append((at_s, handler(**kwargs)))
    events, end_s = compose(*parts)
    tr_us = description.tr_duration_us
    if float(end_s * 1e6 if not isinstance(end_s, torch.Tensor) else end_s.detach() * 1e6) > float(
            tr_us.detach() if isinstance(tr_us, torch.Tensor) else tr_us):
        tr_us = end_s * 1e6
    return SequenceDescription(description.subsequence_index, tr_us, events, dict(description.rf_definitions),
                               dict(description.shim_definitions), description.crusher_dephasing_rad,
                               description.voxel_size_m, description.rf_raster_time_s)


#: Protocol times between pulses, which must be > 0: at 0 every pulse of the train plays at once.
