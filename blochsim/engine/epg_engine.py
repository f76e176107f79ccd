"""The engine on descriptions: `EpgEngine`, `SimulationResult`, `pack_description`.

The public API names them in `blochsim.sequence`, which re-exports them lazily (the description layer
imports no engine).

`EpgEngine().simulate(description, tissue)` plays a `SequenceDescription` on a `TissueProperties` and
returns the raw engine samples (no post-rotation) with one label per sample.
`pack_description` compiles a description once, for callers that hold the structure fixed and call
`simulate(..., events=packed)` many times. A description whose event values carry a train axis
(`engine.program.split_trains`) is packed as one description per train and simulated as one program
per train, stacked first; the trains share one timeline, hence one set of labels.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import torch

from .._arrays import to_tensor
from .._errors import check_device
from ..sequence.columns import vector
from ..sequence.description import SequenceDescription
from ..sequence.spinor import slice_profile_of
from ..sequence.tissue import TissueProperties
from .bind import run
from .program import (
    check_shims,
    check_states,
    compile_program,
    default_states,
    shifts_per_repetition,
    split_trains,
    unroll,
    values_of,
)
from .pulses import transmit_channels
from .steady import simulate_steady
from .tissue import pack_tissue, tissue_device
from .vmap import loop_under_vmap

__all__ = ["EpgEngine", "SimulationResult", "PackedDescription", "pack_description", "TissueProperties"]

_RECORD_MODES = ("all", "acquired", "echo")


@dataclass(frozen=True)
class SimulationResult:
    """Samples and one label per sample.

    signal: complex64 `(*voxel_shape, samples)`, the raw engine value `M0 sum F+(0) e^{-i psi}`;
        `(trains, *voxel_shape, samples)` for a description with a train axis (the labels are shared).
    time_us: float64 `(samples,)`, the ADC timestamp within its repetition (us).
    event_index: int64 `(samples,)`, the index of the ADC event in `description.events`.
    repetition: int64 `(samples,)`, the playing the sample was recorded in, from 0.
    echo: bool `(samples,)`, the ADC event's `is_echo` (the incumbent calls it an index).
    echo_index: int64 `(samples,)`, the echo number within its repetition (from 0), -1 for non-echo samples.
    """

    signal: torch.Tensor
    time_us: torch.Tensor
    event_index: torch.Tensor
    repetition: torch.Tensor
    echo: torch.Tensor
    echo_index: torch.Tensor


@dataclass(frozen=True, eq=False)
class PackedDescription:
    """A description compiled for the kernels (opaque; give it to `EpgEngine.simulate(events=...)`).

    `trains` holds one packing per train when the description has a train axis (empty otherwise).
    """

    description: SequenceDescription
    repetitions: int | str
    record: str
    states: int | None
    record_every: bool
    trains: tuple = ()
    slice_profile: object = None  # an ExactSliceProfile, or None (the slice centre)
    _programs: dict = field(default_factory=dict, repr=False)

    def program(self, complex_states: bool):
        """The compiled program (one per path), kept while its values carry no derivative and the tensors
        they were read from are unchanged (`Program.current`): a differentiated one is compiled on every
        call (a kept one would hold a graph that the first backward frees), and one whose description
        changed in place is compiled again."""
        kept = self._programs.get(complex_states)
        if kept is None or not kept.current:
            reps, states = self.repetitions, self.states
            if reps == "auto":
                reps = 1
                states = states if states is not None else default_states(self.description, 1 << 20)
            elif self.record_every:
                reps = 1  # every playing is laid out and recorded by `unroll`
                states = states if states is not None else default_states(self.description, self.repetitions)
            kept = compile_program(self.description, repetitions=reps, record=self.record, states=states,
                                   complex_states=complex_states, slice_profile=self.slice_profile)
            if kept.sources is not None:
                self._programs[complex_states] = kept
        return kept


def pack_description(description, *, repetitions=1, record="all", device=None, rf_raster_time_s=1e-6,
                     record_every=False, slice_profile=None, nstates=None) -> PackedDescription:
    """Compile `description` once for `EpgEngine.simulate(..., events=...)`.

    `record_every=True` records every playing, not only the last (samples `(repetitions x S)`, labelled
    by `repetition`). `slice_profile` (an int of positions or an `ExactSliceProfile`; `across_slice` of
    `EpgEngine.simulate`) plays PROFILED definitions per slice position and averages over them. A train
    axis in the event values is split here (`split_trains`, which raises ValueError for malformed per-train
    values).
    """
    if not isinstance(description, SequenceDescription):
        raise TypeError(f"description must be a SequenceDescription, got {type(description).__name__}")
    slice_profile = slice_profile_of(slice_profile, "slice_profile")
    check_device(device)
    if record not in _RECORD_MODES:
        raise ValueError(f"record must be one of {_RECORD_MODES}, got {record!r}")
    if repetitions != "auto" and (isinstance(repetitions, bool) or not isinstance(repetitions, int) or repetitions < 1):
        raise ValueError(f"repetitions must be an integer >= 1 or 'auto' (steady state), got {repetitions!r}")
    if record_every and repetitions == "auto":
        raise ValueError("record_every=True records each of a finite number of playings; give repetitions=N")
    states = check_states(nstates, "nstates")  # the public name is the engine's `nstates`; `states` inside
    check_shims(description)
    if rf_raster_time_s != 1e-6 and rf_raster_time_s != description.rf_raster_time_s:
        description = dataclasses.replace(description, rf_raster_time_s=rf_raster_time_s)
    trains = tuple(PackedDescription(part, repetitions, record, states, bool(record_every), (), slice_profile)
                   for part in split_trains(description) or ())
    return PackedDescription(description, repetitions, record, states, bool(record_every), trains, slice_profile)


def _tissue_fields(tissue: TissueProperties) -> dict:
    fields = {}
    for name, value in tissue.items():
        if isinstance(value, (bool, int, float)):
            fields[name] = float(value)
        else:
            fields[name] = to_tensor(value, name=name)
    return fields


class EpgEngine:
    """The EPG engine on `SequenceDescription`s. Stateless."""

    def shifts_per_repetition(self, description: SequenceDescription) -> int:
        """Windings of one repetition: CRUSH_BEFORE, CRUSH_AFTER and SHIFT_AFTER each count once."""
        return shifts_per_repetition(description)

    @loop_under_vmap
    def simulate(self, description: SequenceDescription, tissue: TissueProperties, *, repetitions=1, record="all",
                 nstates=None, across_slice=None, rf_raster_time_s=1e-6, device=None,
                 events: PackedDescription | None = None) -> SimulationResult:
        """Play `description` on `tissue` and return the samples of the last playing with their labels.

        `repetitions` is an int >= 1 or "auto" (steady state); `nstates` the EPG orders
        (None: automatic). `across_slice` (an int of positions or an `ExactSliceProfile`) plays PROFILED
        definitions per slice position, the tissue replicated per position, and averages the samples.
        `events` is a `pack_description` result for this description (its `slice_profile` then holds).
        B1 and B1phase carry a leading channel axis when the description defines shims or dynamic pTx
        pulses.
        Differentiable in reverse mode through every tensor of the description and the tissue. Event
        values with a train axis give a signal `(trains, *voxel_shape, samples)`, one program per train.
        Under `torch.func.vmap` the batch runs as a loop (`engine.vmap`).
        """
        if not isinstance(tissue, TissueProperties):
            raise TypeError(f"tissue must be a TissueProperties, got {type(tissue).__name__}")
        if events is None:
            events = pack_description(description, repetitions=repetitions, record=record, device=device,
                                      rf_raster_time_s=rf_raster_time_s, nstates=nstates, slice_profile=across_slice)
        elif not isinstance(events, PackedDescription):
            raise TypeError(f"events must come from pack_description, got {type(events).__name__}")
        elif across_slice is not None and slice_profile_of(across_slice) != events.slice_profile:
            raise ValueError(f"across_slice={across_slice!r} differs from the slice_profile the events were packed "
                             f"with ({events.slice_profile!r}): give it to pack_description, or leave it out here")
        check_device(device)
        fields = _tissue_fields(tissue)
        home = tissue_device(fields)
        if device is not None and torch.device(device) != home:
            fields = {k: v.to(device) if isinstance(v, torch.Tensor) else torch.tensor(v, device=device)
                      for k, v in fields.items()}
        work = home if device is None else torch.device(device)
        # The steady state is extrapolated in float64 on the host; the CUDA build runs float32 (engine.steady).
        dtype = torch.float64 if events.repetitions == "auto" and work.type == "cpu" else torch.float32
        channels = transmit_channels(events.description.shim_definitions, events.description.rf_definitions)
        packed = pack_tissue(fields, dtype=dtype, device=work, channels=channels)
        runs = [_play(part, packed, fields) for part in events.trains or (events,)]
        signal = torch.stack([s for s, _ in runs]) if events.trains else runs[0][0]
        return _labelled(signal.to(home), runs[0][1], events)


def _play(events: PackedDescription, packed, fields: dict) -> tuple:
    """(signal, program) of one packed train."""
    program = events.program(packed.phase_physics)
    if events.repetitions == "auto":
        signal, _ = simulate_steady(program, values_of(program), shifts_per_repetition(events.description), packed,
                                    fields)
    elif events.record_every:
        played, values = unroll(program, values_of(program), events.repetitions)
        signal, _ = run(played, packed, fields, values=values)
        program = played
    else:
        signal, _ = run(program, packed, fields)
    return signal, program


def _labelled(signal, program, events: PackedDescription) -> SimulationResult:
    adc = events.description.events
    index = list(program.sample_events)
    per_playing = len(index) // events.repetitions if events.record_every else len(index)
    times, echo, echo_index, repetition = [], [], [], []
    count = 0
    for k, i in enumerate(index):
        if per_playing and k % per_playing == 0:
            count = 0
        event = adc[i]
        times.append(event.timestamp_us)
        echo.append(bool(event.is_echo))
        echo_index.append(count if event.is_echo else -1)
        count += bool(event.is_echo)
        if events.record_every:
            repetition.append(k // per_playing)
        else:
            repetition.append(0 if events.repetitions == "auto" else events.repetitions - 1)
    return SimulationResult(
        signal=signal,
        time_us=vector(times).detach(),  # one copy to the host for timestamps on a GPU, not one per sample
        event_index=torch.tensor(index, dtype=torch.int64),
        repetition=torch.tensor(repetition, dtype=torch.int64),
        echo=torch.tensor(echo, dtype=torch.bool),
        echo_index=torch.tensor(echo_index, dtype=torch.int64),
    )
