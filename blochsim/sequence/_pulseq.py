"""Pulseq files as `SequenceDescription`s: `read_pulseq_description`.

A `.seq` file (Pulseq 1.4 or 1.5) is a list of blocks; `TRSize` (a definition the file must carry)
says how many blocks make one repetition, and one repetition becomes the description:

* **RF blocks** become RF events at the pulse centre (block start + delay + centre). The amplitude is
  the flip, `2*pi*|int signal dt|` (rad); the phase and frequency offsets are copied (a negative
  amplitude adds pi to the phase). Rows that differ only in amplitude, phase or frequency share one
  `RfDefinition` (ids 0, 1, ... by first use). The slice-select gradient is |(gx, gy, gz)| at the
  centre (0 below 1e-3 Hz/m); a selective pulse gets `bandwidth_hz = gradient x reference
  thickness`, the reference thickness being the first selective excitation's small-tip FWHM
  bandwidth over its gradient, so slice positions are in units of that slice.
* **ADC blocks** become ADC events at `delay + c*dwell`, c the (fractional, between sample centres)
  position where the axes the readout sweeps come closest to k = 0 (`_pulseq_kspace`). `is_echo`
  marks a position some repetition of which reaches the scan's least |k| (within 1e-5 of the largest
  |k| sampled, + 1e-6 1/m). When a repetition holds several readouts and exactly one is an echo, that
  one is ECHO_CENTER and the others NON_CENTER; otherwise every readout is SINGLE. The demodulation
  phase is the ADC's phase offset plus what its frequency offset turns by the sample placed.
* **Other blocks** become WAITs at their start. `tr_duration_us` is the window's duration.

Samples of an RF shape span from the midpoint with their neighbours (the first from the pulse start,
the last as far past it as the first lies after the start): the integral of a shape on the raster
is `raster * sum`, that of a shape sampled at its edges (pypulseq's block pulse, times 0 and T) the
trapezoid rule. A time shape whose samples are not evenly spaced is refused.

Pulseq 1.4 files do not say what a pulse is for. Here, as in pypulseq, a pulse of at most 90.01
degrees excites; a larger one refocuses when a readout follows it before the next excitation, and
inverts otherwise. A 1.5 file states each pulse's use and is read as stated.
"""

from __future__ import annotations

import dataclasses
import math
import os
import tempfile
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from ._pulseq_file import RF_USE_LETTERS, PulseqFile, parse_pulseq_text, unique_rows
from ._pulseq_kspace import GradientLibrary, block_start_k, readout_positions
from .description import SequenceDescription
from .events import AdcRole, EventAction, EventType, RfUse, trusted_event
from .rf import ZERO_AREA_RTOL, RfDefinition, RfShape, rf_definition

__all__ = ["read_pulseq_description"]

#: Slice-select gradient (Hz/m) below which a pulse counts as not selective.
SLICE_GRADIENT_FLOOR_HZ_PER_M = 1e-3
#: A readout is an echo where |k| comes within ECHO_RTOL * (largest |k| sampled) + ECHO_ATOL_PER_M of the
#: scan's least |k|: the file's numbers carry 6 to 9 significant digits.
ECHO_RTOL, ECHO_ATOL_PER_M = 1e-5, 1e-6
#: How far (s) an event may end past its block: block durations are whole rasters of the file.
FIT_TOLERANCE_S = 1e-8
#: Relative spread of a time shape's steps that still counts as even (the shape is stored to 9 digits).
EVEN_RTOL = 1e-6
#: Pulseq's 1.4 rule: pulses of at most this many degrees excite.
EXCITATION_MAX_DEG = 90.01
#: The proton's gyromagnetic ratio (Hz/T), for ppm offsets (pypulseq's value).
GAMMA_HZ_PER_T = 42.576e6
_USE_OF_LETTER = dict(zip(RF_USE_LETTERS, (RfUse.EXCITATION, RfUse.REFOCUSING, RfUse.INVERSION, RfUse.SATURATION,
                                           RfUse.PREPARATION, RfUse.OTHER, RfUse.UNKNOWN), strict=True))


def read_pulseq_description(source: Any, *, tr_index: int | None = None, subsequence_index: int = 0,
                            crusher_dephasing_rad: float = 0.0, voxel_size_m: float | None = None
                            ) -> SequenceDescription:
    """One repetition of a Pulseq 1.4 or 1.5 sequence as a `SequenceDescription`.

    `source` is a path to a `.seq` file, its bytes, a binary or text stream, or an in-memory
    pypulseq (or pypulseqpp) `Sequence`, which is written out and read back. The file must define
    `TRSize`, the blocks per repetition. The repetition read is `tr_index` (0-based), else the
    file's `TRRef` (0-based), else the earliest repetition that holds a readout; that last choice is
    refused when the repetitions that read out play different pulses (compared by shape and flip,
    not phase or frequency). `RadiofrequencyRasterTime` sets the description's RF raster (default
    1e-6 s). Gradient moments are not read: `crusher_dephasing_rad` and `voxel_size_m` give the
    description its diffusion and flow geometry. Extensions (labels, triggers, soft delays, ...)
    are not read; a warning names them.

    Raises `ValueError` naming the section and line for a file that is malformed, cut short, or
    holds what this reader does not take (an RF and an ADC in one block, an unevenly timed pulse, a
    pulse without area other than an inversion), and for a missing `TRSize`, a bad `tr_index` or
    ambiguous repetitions.
    """
    file = parse_pulseq_text(_source_bytes(source))
    _warn_extensions(file)
    return _Reader(file).description(tr_index, subsequence_index, crusher_dephasing_rad, voxel_size_m)


def _source_bytes(source: Any) -> bytes:
    if isinstance(source, (str, os.PathLike)):
        path = Path(source)
        if not path.is_file():
            raise FileNotFoundError(f"source: no Pulseq file at {str(path)!r}")
        return path.read_bytes()
    if isinstance(source, (bytes, bytearray, memoryview)):
        return bytes(source)
    if hasattr(source, "add_block") and callable(getattr(source, "write", None)):  # a pypulseq Sequence
        with tempfile.TemporaryDirectory() as folder:
            path = Path(folder) / "sequence.seq"
            source.write(str(path))
            return path.read_bytes()
    if callable(getattr(source, "read", None)):
        data = source.read()
        if isinstance(data, str):
            return data.encode("utf-8")
        if isinstance(data, (bytes, bytearray)):
            return bytes(data)
        raise TypeError(f"source.read() returned {type(data).__name__}; a stream must give text or bytes")
    raise TypeError(f"source must be a path to a .seq file, its bytes, a stream, or a pypulseq Sequence; got "
                    f"{type(source).__name__}")


def _warn_extensions(file: PulseqFile) -> None:
    names = list(dict.fromkeys(file.extensions))
    if not names and "EXTENSIONS" not in file.tables:
        return
    listed = ", ".join(names) if names else "extension lists without a specification"
    warnings.warn(f"the Pulseq file's extensions are not read: {listed} (they do not change what is played "
                  "here: labels, triggers and soft delays leave the pulses and readouts as written)", UserWarning,
                  stacklevel=3)


@dataclasses.dataclass
class _Envelope:
    """A pulse shape as played: sample times (s from the pulse start), complex samples, their spans (s)."""

    times_s: np.ndarray
    samples: np.ndarray
    spans_s: np.ndarray
    integral: complex  # int w dt (s)
    centre_s: float  # where the pulse peaks (the 1.4 centre: middle of the plateau of |w| >= 0.99999 max)
    end_s: float
    step_s: float | None  # the even step of the samples, None when uneven
    edge: bool  # sampled at its edges (times 0, d, 2d, ...) rather than at the centres of its steps


def _envelope(file: PulseqFile, mag_id: int, phase_id: int, time_id: int, raster_s: float, user: str) -> _Envelope:
    magnitude = file.shape(mag_id, user=user)
    phase = np.zeros(magnitude.size) if phase_id == 0 else file.shape(phase_id, user=user)
    if phase.size != magnitude.size:
        raise ValueError(f"{user}: its magnitude shape {mag_id} has {magnitude.size} samples, its phase shape "
                         f"{phase_id} {phase.size}; they must match")
    samples = magnitude * np.exp(2j * np.pi * phase)
    n = samples.size
    if time_id == 0:
        times = (np.arange(n) + 0.5) * raster_s
    else:
        times = file.shape(time_id, user=user) * raster_s
        if times.size != n:
            raise ValueError(f"{user}: its time shape {time_id} has {times.size} samples, its magnitude {n}")
        if times[0] < 0 or np.any(np.diff(times) <= 0):
            raise ValueError(f"{user}: the times of its time shape {time_id} must start at >= 0 and increase")
    bounds = np.concatenate([[0.0], 0.5 * (times[1:] + times[:-1]), [times[-1] + times[0]]])
    spans = np.diff(bounds)
    steps = np.diff(times)
    step = None
    if n == 1:
        step = 2 * times[0] if times[0] > 0 else None
    elif np.all(np.abs(steps - steps[0]) <= EVEN_RTOL * steps[0]):
        step = float(steps[0])
    edge = step is not None and n > 1 and times[0] <= EVEN_RTOL * step
    if step is not None and not edge and abs(times[0] - step / 2) > EVEN_RTOL * step:
        step = None  # even steps, but not starting at 0 or half a step: not a shape of its own kind
    peak = np.abs(samples)
    top = np.flatnonzero(peak >= 0.99999 * peak.max()) if peak.max() > 0 else np.arange(n)
    centre = 0.5 * (times[top[0]] + times[top[-1]])
    end = n * raster_s if time_id == 0 else float(times[-1])
    return _Envelope(times, samples, spans, complex(np.sum(samples * spans)), float(centre), end, step, edge)


class _Reader:
    """One file's blocks, pulses, gradients and readouts, worked out for the whole scan at once."""

    def __init__(self, file: PulseqFile) -> None:
        self.file = file
        self.blocks = file.blocks
        self.block_raster_s = file.definition_number("BlockDurationRaster")
        if self.block_raster_s is None:
            raise ValueError("[DEFINITIONS] has no BlockDurationRaster: block durations are counted in it "
                             "(pypulseq writes 1e-05)")
        self.rf_raster_s = file.definition_number("RadiofrequencyRasterTime", 1e-6)
        grad_raster = file.definition_number("GradientRasterTime")
        if grad_raster is None and "GRADIENTS" in file.tables:
            line = int(file.tables["GRADIENTS"].lines[0])
            raise ValueError(f"[GRADIENTS] line {line}: arbitrary gradients are timed on GradientRasterTime, which "
                             "[DEFINITIONS] does not give")
        self.durations_s = self.blocks[:, 1] * self.block_raster_s
        self.gradients = GradientLibrary(file, grad_raster or 1e-5)
        self.has_rf, self.has_adc = self.blocks[:, 2] != 0, self.blocks[:, 6] != 0
        both = np.flatnonzero(self.has_rf & self.has_adc)
        if both.size:
            b = both[0]
            raise ValueError(f"[BLOCKS] line {file.block_lines[b]}: block {b + 1} plays an RF pulse and a readout; "
                             "this reader takes them in separate blocks")
        self._ppm_hz = None
        self._read_pulses()
        self._check_fits()
        self._read_kspace()

    # -- pulses ---------------------------------------------------------------------------------
    def _read_pulses(self) -> None:
        file, rf = self.file, self.file.tables.get("RF")
        self.envelopes: dict = {}
        if rf is None:
            self.rf_block_rows = np.zeros(0, dtype=np.int64)
            self.rf_blocks = np.zeros(0, dtype=np.int64)
            return
        col = rf.column
        self.rf_amplitude = col("amplitude_hz")
        self.rf_triple = np.column_stack([col("mag_id"), col("phase_id"), col("time_id")]).astype(np.int64)
        self.rf_delay_us = col("delay_us")
        self.rf_delay_s = self.rf_delay_us * 1e-6
        negative = np.flatnonzero((self.rf_delay_s < 0) | (self.rf_triple[:, 0] == 0))
        if negative.size:
            raise ValueError(f"[RF] line {rf.lines[negative[0]]}: a pulse needs a magnitude shape (id >= 1) and a "
                             "delay >= 0 us")
        self.rf_centre_s = np.zeros(rf.ids.size)
        self.rf_integral = np.zeros(rf.ids.size, dtype=np.complex128)
        self.rf_end_s = np.zeros(rf.ids.size)
        triples, triple_of = unique_rows(self.rf_triple)
        for u, triple in enumerate(triples):
            rows = np.flatnonzero(triple_of == u)
            user = f"[RF] line {rf.lines[rows[0]]} (RF event {rf.ids[rows[0]]})"
            if triple[2] < 0:
                raise ValueError(f"{user}: time shape {triple[2]} (half-raster RF) is not read; give the sample "
                                 "times as a time shape")
            envelope = _envelope(file, *map(int, triple), self.rf_raster_s, user)
            self.envelopes[tuple(map(int, triple))] = envelope
            self.rf_centre_s[rows] = envelope.centre_s
            self.rf_integral[rows] = envelope.integral
            self.rf_end_s[rows] = envelope.end_s
        self.rf_centre_us = self.rf_centre_s * 1e6
        if file.version[1] >= 5:
            self.rf_centre_us = col("center_us")
            self.rf_centre_s = self.rf_centre_us * 1e-6
        self.rf_flip_rad = 2 * np.pi * np.abs(self.rf_amplitude * self.rf_integral)
        self.rf_blocks = np.flatnonzero(self.has_rf)
        self.rf_block_rows = rf.rows_of(self.blocks[self.rf_blocks, 2])[0]
        self.rf_block_use = self._uses()

    def _uses(self) -> np.ndarray:
        """The `RfUse` of the pulse of every RF block (1.5: as written; 1.4: the rule in the module doc)."""
        rf = self.file.tables["RF"]
        rows = self.rf_block_rows
        if rf.uses is not None:
            letters = np.array(rf.uses)
            return np.array([_USE_OF_LETTER[u] for u in letters[rows]], dtype=np.int64) if rows.size else rows
        flips_deg = np.degrees(self.rf_flip_rad[rows])
        excites = flips_deg <= EXCITATION_MAX_DEG
        next_excitation = _next_of(self.rf_blocks[excites], self.rf_blocks, self.blocks.shape[0])
        next_readout = _next_of(np.flatnonzero(self.has_adc), self.rf_blocks, self.blocks.shape[0])
        return np.where(excites, RfUse.EXCITATION,
                        np.where(next_readout < next_excitation, RfUse.REFOCUSING, RfUse.INVERSION)).astype(np.int64)

    # -- timing ---------------------------------------------------------------------------------
    def _check_fits(self) -> None:
        """Every event starts at >= 0 and ends within its block."""
        file, blocks = self.file, self.blocks
        if self.rf_blocks.size:
            rows = self.rf_block_rows
            ends = self.rf_delay_s[rows] + np.maximum(self.rf_end_s[rows], self.rf_centre_s[rows])
            self._refuse_overrun(self.rf_blocks, ends, "its RF pulse", file.tables["RF"].lines[rows])
            if (self.rf_centre_s[rows] < 0).any():
                row = rows[np.flatnonzero(self.rf_centre_s[rows] < 0)[0]]
                raise ValueError(f"[RF] line {file.tables['RF'].lines[row]}: the pulse centre must be >= 0 us")
        adc_blocks = np.flatnonzero(self.has_adc)
        if adc_blocks.size:
            adc = file.tables["ADC"]
            rows = adc.rows_of(blocks[adc_blocks, 6])[0]
            self.adc_dwell_ns, self.adc_delay_us = adc.column("dwell_ns")[rows], adc.column("delay_us")[rows]
            num, dwell_s, delay_s = adc.column("num")[rows], self.adc_dwell_ns * 1e-9, self.adc_delay_us * 1e-6
            bad = np.flatnonzero((num < 1) | (dwell_s <= 0) | (delay_s < 0))
            if bad.size:
                raise ValueError(f"[ADC] line {adc.lines[rows[bad[0]]]}: a readout takes num >= 1 samples, a dwell "
                                 "> 0 ns and a delay >= 0 us")
            self._refuse_overrun(adc_blocks, delay_s + num * dwell_s, "its readout", adc.lines[rows])
            self.adc_blocks, self.adc_rows = adc_blocks, rows
            self.adc_num, self.adc_dwell_s, self.adc_delay_s = num.astype(np.int64), dwell_s, delay_s
        else:
            self.adc_blocks = np.zeros(0, dtype=np.int64)
        for axis, name in enumerate("xyz"):
            ids = blocks[:, 3 + axis]
            used = np.flatnonzero(ids != 0)
            if used.size:
                rows = self.gradients._rows(ids[used])
                self._refuse_overrun(used, self.gradients.end_s[rows], f"its g{name} gradient",
                                     self.gradients.first_line[rows])

    def _refuse_overrun(self, blocks: np.ndarray, ends_s: np.ndarray, what: str, lines: np.ndarray) -> None:
        over = np.flatnonzero(ends_s > self.durations_s[blocks] + FIT_TOLERANCE_S)
        if over.size:
            k = over[0]
            b = blocks[k]
            raise ValueError(f"[BLOCKS] line {self.file.block_lines[b]}: block {b + 1} lasts "
                             f"{self.durations_s[b] * 1e6:.6g} us, but {what} (line {lines[k]}) runs to "
                             f"{ends_s[k] * 1e6:.6g} us")

    # -- k-space --------------------------------------------------------------------------------
    def _read_kspace(self) -> None:
        n = self.blocks.shape[0]
        ids = self.blocks[:, 3:6]
        areas = self.gradients.areas(ids.reshape(-1)).reshape(n, 3)
        before = np.zeros((n, 3))
        sign = np.ones(n)
        self.rf_tau_s = self.rf_tau_us = np.zeros(0)
        self.rf_gradient = np.zeros((0, 3))
        if self.rf_blocks.size:
            rows = self.rf_block_rows
            self.rf_tau_s = self.rf_delay_s[rows] + self.rf_centre_s[rows]
            self.rf_tau_us = self.rf_delay_us[rows] + self.rf_centre_us[rows]
            taus = np.repeat(self.rf_tau_s[:, None], 3, axis=1)
            integral, value = self.gradients.evaluate(ids[self.rf_blocks], taus)
            before[self.rf_blocks] = integral
            self.rf_gradient = value
            # pypulseq's rule: a pulse of unstated use excites, as far as k-space goes
            excites = (self.rf_block_use == RfUse.EXCITATION) | (self.rf_block_use == RfUse.UNKNOWN)
            sign[self.rf_blocks] = np.where(excites, 0.0, np.where(self.rf_block_use == RfUse.REFOCUSING, -1.0, 1.0))
        k_start = block_start_k(areas, before, sign)
        if self.adc_blocks.size:
            self.adc_c, self.adc_k, peak = readout_positions(
                self.gradients, ids[self.adc_blocks], self.adc_num, self.adc_dwell_s, self.adc_delay_s,
                k_start[self.adc_blocks])
            self.adc_central = self.adc_k <= self.adc_k.min() + ECHO_RTOL * peak + ECHO_ATOL_PER_M

    # -- the description ------------------------------------------------------------------------
    def description(self, tr_index, subsequence_index, crusher_dephasing_rad, voxel_size_m) -> SequenceDescription:
        size = self.file.definition_index("TRSize", minimum=1)
        n = self.blocks.shape[0]
        if size is None:
            raise ValueError("[DEFINITIONS] has no TRSize: give the number of blocks in one repetition (e.g. "
                             "seq.set_definition('TRSize', 5) in pypulseq before writing)")
        if n % size:
            raise ValueError(f"[DEFINITIONS] line {self.file.definitions['TRSize'][1]}: TRSize {size} does not "
                             f"divide the {n} blocks into whole repetitions")
        first = self._window(tr_index, size, n // size) * size
        window = np.arange(first, first + size)
        events = self._events(window, size)
        definitions = self._definitions
        tr_us = float(self.blocks[window, 1].sum() * (self.block_raster_s * 1e6))
        return SequenceDescription(int(subsequence_index), tr_us, events, definitions, {},
                                   crusher_dephasing_rad, voxel_size_m, self.rf_raster_s)

    def _window(self, tr_index, size: int, repetitions: int) -> int:
        if tr_index is not None:
            if isinstance(tr_index, bool) or not isinstance(tr_index, (int, np.integer)) or not \
                    0 <= tr_index < repetitions:
                raise ValueError(f"tr_index must be an int from 0 to {repetitions - 1} (the file holds "
                                 f"{repetitions} repetitions of TRSize {size} blocks), got {tr_index!r}")
            return int(tr_index)
        reference = self.file.definition_index("TRRef", minimum=0)
        if reference is not None:
            if reference >= repetitions:
                raise ValueError(f"[DEFINITIONS] line {self.file.definitions['TRRef'][1]}: TRRef {reference} is past "
                                 f"the last repetition ({repetitions - 1}; TRSize {size})")
            return reference
        acquiring = np.flatnonzero(self.has_adc.reshape(repetitions, size).any(axis=1))
        if acquiring.size == 0:
            raise ValueError("no repetition holds a readout: give tr_index= to say which one to read")
        self._check_same_pulses(acquiring, size, repetitions)
        return int(acquiring[0])

    def _check_same_pulses(self, acquiring: np.ndarray, size: int, repetitions: int) -> None:
        if acquiring.size < 2 or self.rf_blocks.size == 0:
            return
        rows = self.rf_block_rows
        identity = np.column_stack([self.rf_triple[rows].astype(np.float64), self.rf_amplitude[rows]])
        keys = np.zeros(self.blocks.shape[0], dtype=np.int64)
        keys[self.rf_blocks] = unique_rows(identity)[1] + 1
        played = keys.reshape(repetitions, size)[acquiring]
        differ = np.argwhere(played != played[0])
        if differ.size:
            k, offset = differ[0]
            a, b = acquiring[0] * size + offset, acquiring[k] * size + offset
            raise ValueError(f"the repetitions that read out play different pulses: repetition {acquiring[0]} and "
                             f"repetition {acquiring[k]} differ at block {a + 1} and block {b + 1} (lines "
                             f"{self.file.block_lines[a]} and {self.file.block_lines[b]}); give tr_index= (or the "
                             "definition TRRef) to say which repetition to read")

    def _events(self, window: np.ndarray, size: int) -> tuple:
        # Block starts in whole rasters, then us: timestamps carry no rounding of sums in s
        rasters = np.concatenate([[0], np.cumsum(self.blocks[window, 1])[:-1]])
        raster_us = self.block_raster_s * 1e6
        rf_at = {int(b): k for k, b in enumerate(self.rf_blocks)} if self.rf_blocks.size else {}
        adc_at = {int(b): k for k, b in enumerate(self.adc_blocks)} if self.adc_blocks.size else {}
        echo_at_offset = np.zeros(size, dtype=bool)
        if self.adc_blocks.size:
            np.logical_or.at(echo_at_offset, self.adc_blocks % size, self.adc_central)
        readouts = [int(b) for b in window if int(b) in adc_at]
        echoes = [b for b in readouts if echo_at_offset[b % size]]
        centre_role = len(readouts) > 1 and len(echoes) == 1
        self._definitions, self._definition_of = {}, {}
        events = []
        for offset, b in enumerate(window):
            b = int(b)
            start_us = float(rasters[offset] * raster_us)
            if b in rf_at:
                events.append(self._rf_event(rf_at[b], start_us))
            elif b in adc_at:
                echo = bool(echo_at_offset[b % size])
                role = (AdcRole.ECHO_CENTER if echo else AdcRole.NON_CENTER) if centre_role else AdcRole.SINGLE
                events.append(self._adc_event(adc_at[b], start_us, role, echo))
            else:
                events.append(trusted_event(EventType.WAIT, start_us, (), EventAction.NONE))
        return tuple(events)

    def _rf_event(self, k: int, start_us: float):
        rf = self.file.tables["RF"]
        row = int(self.rf_block_rows[k])
        amplitude = float(self.rf_amplitude[row])
        phase = float(rf.column("phase_rad")[row]) + (math.pi if amplitude < 0 else 0.0)
        frequency = float(rf.column("freq_hz")[row])
        if "freq_ppm" in rf.columns:
            frequency += float(rf.column("freq_ppm")[row]) * self._ppm(f"[RF] line {rf.lines[row]}",
                                                                      rf.column("freq_ppm")[row])
            phase += float(rf.column("phase_ppm")[row]) * self._ppm(f"[RF] line {rf.lines[row]}",
                                                                   rf.column("phase_ppm")[row])
        gradient = float(np.sqrt((self.rf_gradient[k] ** 2).sum()))
        gradient = 0.0 if gradient < SLICE_GRADIENT_FLOOR_HZ_PER_M else gradient
        use = RfUse(int(self.rf_block_use[k]))
        time_us = start_us + float(self.rf_tau_us[k])
        flip = float(self.rf_flip_rad[row])
        _check_finite(f"[RF] line {rf.lines[row]}", time_us=time_us, flip_rad=flip, phase_rad=phase,
                      frequency_hz=frequency, slice_select_gradient_hz_per_m=gradient)
        definition = self._definition(k, row, gradient, use)
        params = (definition, use, flip, phase, frequency, 0, gradient)
        return trusted_event(EventType.RF, time_us, params, EventAction.NONE)

    def _adc_event(self, k: int, start_us: float, role: AdcRole, echo: bool):
        adc = self.file.tables["ADC"]
        row = int(self.adc_rows[k])
        c, dwell_s = float(self.adc_c[k]), float(self.adc_dwell_s[k])
        phase = float(adc.column("phase_rad")[row])
        frequency = float(adc.column("freq_hz")[row])
        if "freq_ppm" in adc.columns:
            line = f"[ADC] line {adc.lines[row]}"
            frequency += float(adc.column("freq_ppm")[row]) * self._ppm(line, adc.column("freq_ppm")[row])
            phase += float(adc.column("phase_ppm")[row]) * self._ppm(line, adc.column("phase_ppm")[row])
            shape_id = int(adc.column("phase_id")[row])
            if shape_id:
                modulation = self.file.shape(shape_id, user=f"{line} (phase modulation)")
                if modulation.size != self.adc_num[k]:
                    raise ValueError(f"{line}: its phase modulation shape {shape_id} has {modulation.size} samples, "
                                     f"the readout {self.adc_num[k]}")
                phase += float(modulation[min(int(c), modulation.size - 1)])
        phase += 2 * math.pi * frequency * c * dwell_s  # the receiver turns from the readout's start
        time_us = start_us + float(self.adc_delay_us[k]) + c * float(self.adc_dwell_ns[k]) * 1e-3
        _check_finite(f"[ADC] line {adc.lines[row]}", time_us=time_us, phase_rad=phase)
        params = (role, phase, bool(echo))
        return trusted_event(EventType.ADC, time_us, params, EventAction.NONE)

    def _ppm(self, where: str, value: float) -> float:
        """Hz (or rad per rad/MHz) per ppm: the Larmor frequency in MHz, from the B0 definition (T)."""
        if value == 0:
            return 0.0
        if self._ppm_hz is None:
            b0 = self.file.definition_number("B0")
            if b0 is None:
                raise ValueError(f"{where}: an offset in ppm needs the field strength; the file gives no B0 "
                                 "definition (in T)")
            self._ppm_hz = GAMMA_HZ_PER_T * b0 * 1e-6
        return self._ppm_hz

    # -- definitions ----------------------------------------------------------------------------
    def _definition(self, k: int, row: int, gradient_hz_per_m: float, use: RfUse) -> int:
        rf = self.file.tables["RF"]
        triple = tuple(int(v) for v in self.rf_triple[row])
        envelope = self.envelopes[triple]
        user = f"[RF] line {rf.lines[row]} (RF event {rf.ids[row]})"
        bandwidth = gradient_hz_per_m * self._reference_thickness_m() if gradient_hz_per_m else 0.0
        relative = self._relative_gradient(k, envelope, gradient_hz_per_m)
        key = (triple, round(bandwidth, 6), None if relative is None else relative.tobytes(),
               use == RfUse.INVERSION)
        if key not in self._definition_of:
            definition_id = len(self._definitions)
            self._definitions[definition_id] = _rf_definition(envelope, definition_id, bandwidth, self.rf_raster_s,
                                                               relative, use, user)
            self._definition_of[key] = definition_id
        return self._definition_of[key]

    def _relative_gradient(self, k: int, envelope: _Envelope, gradient_hz_per_m: float) -> np.ndarray | None:
        """|g| at each sample (of the definition) over |g| at the centre; None when it does not change."""
        if not gradient_hz_per_m or envelope.step_s is None:
            return None
        times = _definition_times(envelope)
        b = int(self.rf_blocks[k])
        delay = float(self.rf_delay_s[int(self.rf_block_rows[k])])
        ids = np.repeat(self.blocks[b, 3:6][None, :], times.size, axis=0)
        value = self.gradients.evaluate(ids, np.repeat((delay + times)[:, None], 3, axis=1))[1]
        relative = np.sqrt((value ** 2).sum(axis=1)) / gradient_hz_per_m
        return None if np.all(np.abs(relative - 1) <= 1e-6) else relative

    def _reference_thickness_m(self) -> float:
        """The first selective excitation's small-tip FWHM bandwidth over its gradient (m); the first
        selective pulse of any use when no excitation is selective."""
        if not hasattr(self, "_thickness_m"):
            strength = np.sqrt((self.rf_gradient ** 2).sum(axis=1))
            selective = strength >= SLICE_GRADIENT_FLOOR_HZ_PER_M
            excitations = np.flatnonzero(selective & (self.rf_block_use == RfUse.EXCITATION))
            k = int(excitations[0]) if excitations.size else int(np.flatnonzero(selective)[0])
            row = int(self.rf_block_rows[k])
            envelope = self.envelopes[tuple(int(v) for v in self.rf_triple[row])]
            rf = self.file.tables["RF"]
            if envelope.step_s is None:
                raise ValueError(f"[RF] line {rf.lines[row]}: the reference slice comes from this pulse, whose time "
                                 "shape is uneven")
            self._thickness_m = _fwhm_hz(envelope, f"[RF] line {rf.lines[row]}") / strength[k]
        return self._thickness_m


def _definition_times(envelope: _Envelope) -> np.ndarray:
    """Sample times (s from the pulse start) of the definition made from `envelope`: its own on a
    centred grid, the midpoints of its steps when it is sampled at its edges."""
    if envelope.edge:
        return 0.5 * (envelope.times_s[1:] + envelope.times_s[:-1])
    return envelope.times_s


def _played(envelope: _Envelope) -> np.ndarray:
    """The samples as the definition holds them: each spans one step (edge-sampled shapes by the mean of
    the two samples that bound the step)."""
    if envelope.edge:
        return 0.5 * (envelope.samples[1:] + envelope.samples[:-1])
    return envelope.samples


def _rf_definition(envelope: _Envelope, definition_id: int, bandwidth_hz: float, raster_s: float,
                   relative: np.ndarray | None, use: RfUse, user: str) -> RfDefinition:
    if envelope.step_s is None:
        raise ValueError(f"{user}: its time shape spaces the samples unevenly (or starts them neither at 0 nor half "
                         "a step in); a pulse is read as samples of one dwell each")
    samples, dwell = _played(envelope), envelope.step_s
    area = abs(complex(np.sum(samples)) * dwell)
    if not (math.isfinite(area) and np.isfinite(np.sum(np.abs(samples) ** 2))):
        raise ValueError(f"{user}: the pulse's samples overflow a float64 when summed")
    if area <= ZERO_AREA_RTOL * float(np.sum(np.abs(samples))) * dwell:
        if use != RfUse.INVERSION:
            raise ValueError(f"{user}: the pulse has no area (|int w dt| = {area:.3g} s): its rotation is not the "
                             "integral of its envelope (an adiabatic pulse?); only an inversion may play one")
        definition = _raw_definition(samples, dwell, definition_id, bandwidth_hz, raster_s)
    elif samples.size == 1:
        scale = 1 / (2 * math.pi * area)
        magnitude, phase = np.abs(samples) * scale, np.angle(samples) / (2 * np.pi)
        definition = RfDefinition(definition_id, bandwidth_hz, 1, (0.0,), bandwidth_hz, float(
            magnitude[0] ** 2 * dwell), RfShape(1, magnitude), RfShape(1, phase), sample_duration_s=dwell)
    else:
        definition = rf_definition(samples, dwell_s=dwell, bandwidth_hz=bandwidth_hz, definition_id=definition_id,
                                   rf_raster_time_s=raster_s)
    if relative is not None:
        definition = dataclasses.replace(definition, gradient=RfShape(relative.size, relative))
    return definition


def _raw_definition(samples, dwell_s, definition_id, bandwidth_hz, raster_s) -> RfDefinition:
    """A definition of an envelope without area, kept as it is (an inversion's rotation is not read from it)."""
    n = samples.size
    peak = float(np.abs(samples).max()) or 1.0
    magnitude, phase = np.abs(samples) / peak, np.angle(samples) / (2 * np.pi)
    time = None if abs(dwell_s / raster_s - 1) <= 1e-9 else RfShape(n, (np.arange(n) + 0.5) * (dwell_s / raster_s))
    return RfDefinition(definition_id, bandwidth_hz, 1, (0.0,), bandwidth_hz,
                        float(np.sum(magnitude ** 2) * dwell_s), RfShape(n, magnitude), RfShape(n, phase), time,
                        sample_duration_s=dwell_s if n == 1 else None)


def _fwhm_hz(envelope: _Envelope, where: str) -> float:
    """The full width at half maximum (Hz) of |int w(t) exp(-2 pi i f t) dt|, the small-tip slice profile."""
    samples, dwell = _played(envelope), envelope.step_s
    size = 1 << int(math.ceil(math.log2(max(4096, 64 * samples.size))))
    spectrum = np.abs(np.fft.fftshift(np.fft.fft(samples, size)))
    frequencies = np.fft.fftshift(np.fft.fftfreq(size, dwell))
    peak = int(spectrum.argmax())
    half = 0.5 * spectrum[peak]
    below = spectrum < half
    left, right = np.flatnonzero(below[:peak]), np.flatnonzero(below[peak:])
    if left.size == 0 or right.size == 0:
        raise ValueError(f"{where}: the reference pulse's spectrum never falls to half its peak: it has no slice "
                         "width to measure")

    def crossing(i: int, j: int) -> float:  # linear interpolation of the half-maximum between bins i and j
        return frequencies[i] + (half - spectrum[i]) / (spectrum[j] - spectrum[i]) * (frequencies[j] - frequencies[i])

    lo, hi = int(left[-1]), peak + int(right[0])
    return float(crossing(hi - 1, hi) - crossing(lo, lo + 1))


def _check_finite(where: str, **values: float) -> None:
    """ValueError naming the row when a value worked out from it is not finite (its numbers overflow)."""
    for name, value in values.items():
        if not math.isfinite(value):
            raise ValueError(f"{where}: the {name} worked out from this row is {value} (its numbers, or the "
                             "gradients of its block, overflow a float64)")


def _next_of(sorted_blocks: np.ndarray, after: np.ndarray, never: int) -> np.ndarray:
    """For each block in `after`, the first of `sorted_blocks` past it (`never` when none is)."""
    return np.append(sorted_blocks, never)[np.searchsorted(sorted_blocks, after, side="right")]
