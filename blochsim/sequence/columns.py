"""A description's events as columns: one array per thing the engine's compiler reads.

Per event the compiler reads its type and action bits; of an RF event whether it inverts, and of a
rotating one (any other use) its definition id, amplitude, phase and frequency offset; of an ADC
event its role, echo flag and demodulation phase. `EventColumns` holds those in event order:
structure and frequencies as NumPy arrays, the other values as float64 tensors that keep autograd
(reverse and forward mode) to whatever the description was made of. An inversion's rotation values
are not read (it flips Z): its entries are 0, as are those an event of another type does not have.

The builders lay their columns out with a few vector ops beside their events (`attach`), so a train
of a thousand events with differentiated flips compiles without visiting its events one by one; any
other description is walked once, event by event (`walk`). Both give the same columns, value by
value (tests/test_event_columns.py holds them to it).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .._arrays import differentiated
from .events import EventType, RfUse

__all__ = ["EventColumns", "attach", "columns_of", "sources", "walk", "COLUMNS_KEY"]

#: Where `attach` keeps the columns on a description (a copy with other events must drop it).
COLUMNS_KEY = "_blochsim_columns"


@dataclass(frozen=True, eq=False)
class EventColumns:
    """The compiler's view of N events, in event order (module doc)."""

    kind: np.ndarray  # [N] int8 EventType
    action: np.ndarray  # [N] int32 action bits as the events hold them (USER_ACTIONS)
    inversion: np.ndarray  # [N] bool: an RF event of use INVERSION
    definition_id: np.ndarray  # [N] int64 RF definition of a rotating pulse, -1 elsewhere
    adc_role: np.ndarray  # [N] int8 AdcRole of an ADC event, 0 elsewhere
    is_echo: np.ndarray  # [N] bool is_echo of an ADC event, False elsewhere
    frequency_hz: np.ndarray  # [N] float64 frequency offset of a rotating pulse, Hz; 0 elsewhere
    timestamp_us: torch.Tensor  # [N] float64, us
    timestamp_differentiated: np.ndarray  # [N] bool: the event's own timestamp carries a derivative
    amplitude_hz: torch.Tensor  # [N] float64 amplitude of a rotating pulse; 0 elsewhere
    phase_rad: torch.Tensor  # [N] float64 phase of a rotating pulse or demodulation phase of an ADC; 0 elsewhere
    rf_phase_differentiated: bool  # a rotating pulse's phase carries a derivative (the real path then cannot hold it)
    sources: tuple = ()  # (tensor, version counter, requires_grad) per tensor the events hold views of, when laid out

    def __len__(self) -> int:
        return len(self.kind)

    @staticmethod
    def concat(*parts: EventColumns) -> EventColumns:
        """The events of `parts` one after the other."""
        arrays = {name: np.concatenate([getattr(p, name) for p in parts])
                  for name in ("kind", "action", "inversion", "definition_id", "adc_role", "is_echo", "frequency_hz",
                               "timestamp_differentiated")}
        values = {name: torch.cat([getattr(p, name) for p in parts])
                  for name in ("timestamp_us", "amplitude_hz", "phase_rad")}
        return EventColumns(**arrays, **values,
                            rf_phase_differentiated=any(p.rf_phase_differentiated for p in parts),
                            sources=sum((p.sources for p in parts), ()))

    @property
    def current(self) -> bool:
        """No source changed in place, nor was made to require grad, since the columns were laid out (the
        events would show the change)."""
        return all(tensor._version == version and tensor.requires_grad is grad
                   for tensor, version, grad in self.sources)


def sources(values) -> tuple:
    """`EventColumns.sources` of the tensors among `values`."""
    return tuple((v, v._version, v.requires_grad) for v in values if isinstance(v, torch.Tensor))


def attach(description, columns: EventColumns | None):
    """Keep `columns` (the columns of `description`'s own events, made by its builder) on `description`;
    returns `description`. None attaches nothing."""
    if columns is not None and description is not None:
        object.__setattr__(description, COLUMNS_KEY, columns)
    return description


def columns_of(description) -> EventColumns | None:
    """The columns of `description`'s events: those its builder attached while their sources are unchanged,
    else walked (`walk`).

    None when an event value has a train axis (a tensor of more than one entry): one program cannot
    hold it (`engine.program.split_trains`).
    """
    kept = getattr(description, COLUMNS_KEY, None)
    return kept if kept is not None and kept.current else walk(description.events)


class _PerTrain(Exception):
    """An event value with more than one entry."""


def _f64(value) -> torch.Tensor:
    if value.dim() == 0:
        return value if value.dtype == torch.float64 else value.to(torch.float64)
    if value.numel() != 1:
        raise _PerTrain
    return value.to(torch.float64).reshape(())


def vector(items: list) -> torch.Tensor:
    """Numbers and one-entry tensors as one float64 vector on the host, keeping autograd links (one stack,
    not one op each). Raises `_PerTrain` at a tensor of more than one entry.

    The compiler works on the host: tensors on another device (a protocol on a GPU) are stacked there
    and copied over once per device, not once per event, and autograd carries their gradients back.
    """
    where = [i for i, v in enumerate(items) if isinstance(v, torch.Tensor)]
    if not where:
        return torch.tensor(items, dtype=torch.float64)
    stacked = _stack_on_host([items[i] for i in where])
    if len(where) == len(items):
        return stacked
    base = torch.tensor([0.0 if isinstance(v, torch.Tensor) else v for v in items], dtype=torch.float64)
    return base.index_put((torch.tensor(where),), stacked)


def _stack_on_host(tensors: list) -> torch.Tensor:
    """One-entry tensors as one float64 CPU vector, in order: one stack and one copy per device."""
    devices = {t.device for t in tensors}
    if len(devices) == 1:
        stacked = torch.stack([_f64(t) for t in tensors])
        return stacked if stacked.is_cpu else stacked.cpu()
    groups = {device: [k for k, t in enumerate(tensors) if t.device == device] for device in devices}
    order = [k for ks in groups.values() for k in ks]
    parts = [torch.stack([_f64(tensors[k]) for k in ks]).cpu() for ks in groups.values()]
    place = torch.empty(len(order), dtype=torch.long)
    place[torch.tensor(order)] = torch.arange(len(order))
    return torch.cat(parts).index_select(0, place)


def _frequencies(values: list) -> np.ndarray:
    """The RF frequency offsets (Hz) of the events, structure: read without autograd, in one copy."""
    if all(type(x) is float for x in values):
        return np.array(values, dtype=np.float64)
    return np.asarray(vector(values).detach().tolist(), dtype=np.float64)  # tolist: also under torch.func


_RF, _ADC = EventType.RF, EventType.ADC


def walk(events) -> EventColumns | None:
    """The columns of `events` (`SequenceEvent`s), read one event at a time; None at a value with a train
    axis."""
    n = len(events)
    kind = np.zeros(n, dtype=np.int8)
    action = np.zeros(n, dtype=np.int32)
    inversion = np.zeros(n, dtype=bool)
    definition_id = np.full(n, -1, dtype=np.int64)
    adc_role = np.zeros(n, dtype=np.int8)
    is_echo = np.zeros(n, dtype=bool)
    frequencies = [0.0] * n
    timestamp_differentiated = np.zeros(n, dtype=bool)
    times, amplitudes, phases = [], [0.0] * n, [0.0] * n
    rf_phase_differentiated = False
    try:
        for i, event in enumerate(events):
            kind[i], action[i] = event.type, int(event.action)
            times.append(event.timestamp_us)
            timestamp_differentiated[i] = differentiated(event.timestamp_us)
            params = event.params
            if event.type is _RF:
                if params[1] is RfUse.INVERSION:
                    inversion[i] = True
                    continue
                definition_id[i] = params[0]
                amplitudes[i], phases[i], frequencies[i] = params[2], params[3], params[4]
                rf_phase_differentiated = rf_phase_differentiated or differentiated(params[3])
            elif event.type is _ADC:
                adc_role[i], phases[i], is_echo[i] = params[0], params[1], bool(params[2])
        times, amplitudes, phases = vector(times), vector(amplitudes), vector(phases)
        frequency_hz = _frequencies(frequencies)
    except _PerTrain:
        return None
    return EventColumns(kind, action, inversion, definition_id, adc_role, is_echo, frequency_hz, times,
                        timestamp_differentiated, amplitudes, phases, rf_phase_differentiated)
