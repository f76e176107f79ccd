"""RF and shim definitions.

An `RfDefinition` is the shape of a pulse; an RF event plays it at an amplitude.
Envelopes `w(t)` are complex and dimensionless up to the definition's
normalization; time is in s (shapes store it in RF raster units).

The one rule the engine needs (see `RfDefinition.signed_flip`): an RF event of
amplitude `a` playing definition `d` turns by the signed flip
`alpha = a * 2*pi*|I|` about the phase `phi = event phase + arg(I)`, where
`I = d.integral()` is the complex area `sum_k w_k * dt_k` in s of the combined
envelope. Definitions from `rf_definition` and the ideal pulse have `|I| = 1/(2*pi)`
s, so `alpha = a`: an amplitude in rad is the flip.
"""

from __future__ import annotations

import cmath
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from .events import RfMode, check_finite

__all__ = ["RfShape", "decompress_shape", "RfDefinition", "rf_definition", "ideal_rf_definition", "ShimDefinition"]

#: Relative area below which an envelope counts as having none (|int w dt| <= this * int |w| dt):
#: normalizing a cancelling waveform would otherwise blow its rounding error up into a flip.
ZERO_AREA_RTOL = 1e-9


def decompress_shape(packed: Any, num_uncompressed: int, *, scale: float = 1.0) -> np.ndarray:
    """Decode a Pulseq shape: run-length decoding of its derivative, then a cumulative sum.

    In the encoding, a value written twice is followed by the count of further
    repetitions (so `v v 3` is five `v`). `packed` that already has
    `num_uncompressed` samples is taken as decoded and passes through. Returns a
    float32 array of `num_uncompressed` samples times `scale`. A truncated or
    invalid encoding (a bad count, too few or too many samples) raises `ValueError`.
    """
    data = np.asarray(packed, dtype=np.float64)
    n = int(num_uncompressed)
    if data.ndim != 1:
        raise ValueError(f"packed must be a 1-D array of samples, got shape {data.shape}")
    if n < 1:
        raise ValueError(f"num_uncompressed must be >= 1, got {num_uncompressed!r}")
    if not np.isfinite(data).all():
        raise ValueError("packed holds NaN or an infinity")
    if data.size == n:
        return (data * scale).astype(np.float32)
    derivative = np.empty(n, dtype=np.float64)
    i = j = 0
    while i < data.size:
        value = data[i]
        if i + 1 < data.size and data[i + 1] == value:
            if i + 2 >= data.size:
                raise ValueError(f"packed is truncated: the repeated value {value} at index {i} has no count")
            count = data[i + 2]
            if count < 0 or count != round(count):
                raise ValueError(f"packed has an invalid repeat count {count} at index {i + 2}: "
                                 "a count is a whole number >= 0")
            run, i = int(count) + 2, i + 3
        else:
            run, i = 1, i + 1
        if j + run > n:
            raise ValueError(f"packed decodes to more than num_uncompressed = {n} samples")
        derivative[j:j + run] = value
        j += run
    if j != n:
        raise ValueError(f"packed is truncated: it decodes to {j} samples, num_uncompressed = {n}")
    return (np.cumsum(derivative) * scale).astype(np.float32)


@dataclass(frozen=True)
class RfShape:
    """A Pulseq-style compressed shape of `num_uncompressed` samples; `samples` may already be decoded."""

    num_uncompressed: int
    samples: np.ndarray

    def __post_init__(self) -> None:
        samples = np.asarray(self.samples, dtype=np.float32).reshape(-1)
        samples.flags.writeable = False
        object.__setattr__(self, "samples", samples)
        object.__setattr__(self, "num_uncompressed", int(self.num_uncompressed))
        if self.num_uncompressed < 1:
            raise ValueError(f"num_uncompressed must be >= 1, got {self.num_uncompressed}")

    def decompress(self, scale: float = 1.0) -> np.ndarray:
        """The decoded samples (float32, `(num_uncompressed,)`) times `scale`."""
        return decompress_shape(self.samples, self.num_uncompressed, scale=scale)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, RfShape):
            return NotImplemented
        return self.num_uncompressed == other.num_uncompressed and np.array_equal(self.samples, other.samples)

    def __hash__(self) -> int:
        return hash((self.num_uncompressed, self.samples.tobytes()))


def _shapes(name: str, value: Any, *, optional: bool) -> Any:
    """An `RfShape`, a tuple of them (one per channel), or None; raw arrays become decoded shapes."""
    if value is None:
        if optional:
            return None
        raise ValueError(f"{name} is required")
    if isinstance(value, (tuple, list)):
        if not value:
            raise ValueError(f"{name} must hold at least one channel's shape")
        return tuple(_shapes(f"{name}[{i}]", v, optional=False) for i, v in enumerate(value))
    if isinstance(value, RfShape):
        return value
    array = np.asarray(value, dtype=np.float32).reshape(-1)
    if array.size == 0:
        raise ValueError(f"{name} is empty")
    return RfShape(array.size, array)


def _raster(rf_raster_time_s: float) -> float:
    r = float(rf_raster_time_s)
    if not (math.isfinite(r) and r > 0):
        raise ValueError(f"rf_raster_time_s must be a finite time > 0 s, got {rf_raster_time_s!r}")
    return r


@dataclass(frozen=True)
class RfDefinition:
    """The shape of an RF pulse.

    Fields: `id`; `bandwidth_hz` (0: not slice-selective); `num_bands` (1-8) with
    `band_frequency_offsets_hz` (one per band) and `band_bandwidth_hz` (each band's);
    `total_b1sq_power` (`int |w|^2 dt` in s, informative); `magnitude` and `phase`
    (cycles) as `RfShape`s, or per-channel tuples of them for a dynamic pTx pulse (a
    single phase shape serves every channel); `time` (sample centres in raster units,
    shared by the channels) and `gradient` (relative slice-select gradient) as
    `RfShape`s or None. `sample_duration_s`, when set, is the span in s of every
    sample whatever the raster; the ideal pulse uses it.

    **Signed-flip rule.** An event of amplitude `a` plays the rotation of signed flip
    `alpha = a * 2*pi*|I|` about phase `phi = event phase + arg(I)`, with
    `I = integral()`; `signed_flip(a)` returns `(alpha, arg(I))`. `flip_angle(a)`
    returns the same rotation as `(|alpha|, phase)`, the form of the incumbent.
    """

    id: int
    bandwidth_hz: float
    num_bands: int
    band_frequency_offsets_hz: tuple
    band_bandwidth_hz: float
    total_b1sq_power: float
    magnitude: Any
    phase: Any = None
    time: Any = None
    gradient: Any = None
    sample_duration_s: float | None = None
    _memo: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if isinstance(self.id, bool) or int(self.id) != self.id or int(self.id) < 0:
            raise ValueError(f"id must be an integer >= 0, got {self.id!r}")
        object.__setattr__(self, "id", int(self.id))
        for name in ("bandwidth_hz", "band_bandwidth_hz", "total_b1sq_power"):
            value = float(getattr(self, name))
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be finite and >= 0, got {getattr(self, name)!r}")
            object.__setattr__(self, name, value)
        bands = int(self.num_bands)
        if not 1 <= bands <= 8:
            raise ValueError(f"num_bands must be 1 to 8, got {self.num_bands!r}")
        object.__setattr__(self, "num_bands", bands)
        offsets = tuple(float(f) for f in np.asarray(self.band_frequency_offsets_hz, dtype=np.float64).reshape(-1))
        if len(offsets) != bands or not all(math.isfinite(f) for f in offsets):
            raise ValueError(f"band_frequency_offsets_hz must hold num_bands = {bands} finite offsets (Hz), "
                             f"got {self.band_frequency_offsets_hz!r}")
        object.__setattr__(self, "band_frequency_offsets_hz", offsets)
        object.__setattr__(self, "magnitude", _shapes("magnitude", self.magnitude, optional=False))
        object.__setattr__(self, "phase", _shapes("phase", self.phase, optional=True))
        for name in ("time", "gradient"):
            shape = _shapes(name, getattr(self, name), optional=True)
            if isinstance(shape, tuple):
                raise ValueError(f"{name} is shared by the channels: give one RfShape, not a tuple")
            object.__setattr__(self, name, shape)
        if self.sample_duration_s is not None:
            span = float(self.sample_duration_s)
            if not (math.isfinite(span) and span > 0):
                raise ValueError(f"sample_duration_s must be None or a time > 0 s, got {self.sample_duration_s!r}")
            object.__setattr__(self, "sample_duration_s", span)

    # -- envelopes ----------------------------------------------------------------------------
    @property
    def channel_count(self) -> int:
        """Number of channels driving their own waveform."""
        return len(self.magnitude) if isinstance(self.magnitude, tuple) else 1

    def channel_envelopes(self) -> np.ndarray:
        """Complex128 envelopes `(channels, samples)`; mismatched lengths raise `ValueError`."""
        if "envelopes" not in self._memo:
            channels = self.channel_count
            mags = self.magnitude if isinstance(self.magnitude, tuple) else (self.magnitude,)
            if self.phase is None:
                phases = (None,) * channels
            elif isinstance(self.phase, tuple):
                if len(self.phase) != channels:
                    raise ValueError(f"phase has {len(self.phase)} channel shapes, magnitude has {channels}")
                phases = self.phase
            else:
                phases = (self.phase,) * channels
            rows = []
            for c, (mag, cycles) in enumerate(zip(mags, phases, strict=True)):
                m = mag.decompress().astype(np.float64)
                p = np.zeros_like(m) if cycles is None else cycles.decompress().astype(np.float64)
                if p.shape != m.shape or (rows and m.shape != rows[0].shape):
                    raise ValueError(f"channel {c}: magnitude has {m.size} samples, phase {p.size}, "
                                     f"channel 0 {rows[0].size if rows else m.size}; they must match")
                rows.append(m * np.exp(2j * np.pi * p))
            envelopes = np.stack(rows)
            envelopes.flags.writeable = False
            self._memo["envelopes"] = envelopes
        return self._memo["envelopes"]

    def complex_envelope(self) -> np.ndarray:
        """`(samples,)`, or `(channels, samples)` for a multi-channel pulse; complex128."""
        envelopes = self.channel_envelopes()
        return envelopes[0] if self.channel_count == 1 else envelopes

    def combined_envelope(self) -> np.ndarray:
        """The sum over channels, `(samples,)` complex128; flip, integral and saturation are read from it."""
        return self.channel_envelopes().sum(axis=0)

    def gradient_waveform(self) -> np.ndarray | None:
        """Relative slice-select gradient per sample (float64), or None if it is constant."""
        if self.gradient is None:
            return None
        g = self.gradient.decompress().astype(np.float64)
        if g.size != self.channel_envelopes().shape[1]:
            raise ValueError(f"gradient has {g.size} samples, the envelope {self.channel_envelopes().shape[1]}")
        return None if np.all(g == g[0]) else g

    def sample_durations(self, *, rf_raster_time_s: float = 1e-6) -> np.ndarray:
        """Span of each sample in s (float64).

        With `time`, each sample spans the distance between its neighbours' midpoints
        (the end samples mirror their one neighbour); without it, one raster step.
        `sample_duration_s`, when set, overrides both.
        """
        raster = _raster(rf_raster_time_s)
        n = self.channel_envelopes().shape[1]
        if self.sample_duration_s is not None:
            return np.full(n, self.sample_duration_s)
        if self.time is None or n == 1:
            return np.full(n, raster)
        t = self.time.decompress().astype(np.float64) * raster
        if t.size != n:
            raise ValueError(f"time has {t.size} samples, the envelope {n}; they must match")
        if not np.all(np.diff(t) > 0):
            raise ValueError("time must increase strictly from sample to sample")
        return np.gradient(t)

    # -- derived quantities ---------------------------------------------------------------------
    def rf_mode(self) -> RfMode:
        """DYNAMIC for more than one channel; INSTANT for a constant envelope without bandwidth; else PROFILED."""
        if "mode" not in self._memo:
            w = self.combined_envelope()
            if self.channel_count > 1:
                mode = RfMode.DYNAMIC
            elif self.bandwidth_hz == 0 and np.all(w == w[0]):
                mode = RfMode.INSTANT
            else:
                mode = RfMode.PROFILED
            self._memo["mode"] = mode
        return self._memo["mode"]

    def integral(self, *, rf_raster_time_s: float = 1e-6) -> complex:
        """Complex `int w dt` in s over the combined envelope: `sum_k w_k * dt_k`.

        A single sample spans no time, so its integral is 0, unless `sample_duration_s`
        gives it one (the ideal pulse: exactly 1/(2*pi) s).
        """
        key = ("integral", _raster(rf_raster_time_s))
        if key not in self._memo:
            w = self.combined_envelope()
            if w.size == 1 and self.sample_duration_s is None:
                area = 0j
            else:
                area = complex(np.sum(w * self.sample_durations(rf_raster_time_s=rf_raster_time_s)))
            self._memo[key] = area
        return self._memo[key]

    def saturation(self, *, rf_raster_time_s: float = 1e-6) -> float:
        """`S = -pi * int |w|^2 dt / |int w dt|^2` in 1/s per rad^2 (Malik 2018 scaling); 0 for zero area.

        The bound pool's Z is multiplied by `exp(S * alpha^2 * G(f_rf - B0))` per pulse.
        A rectangular pulse of length T has S = -pi/T; the ideal pulse S = -2*pi^2.
        """
        key = ("saturation", _raster(rf_raster_time_s))
        if key not in self._memo:
            area = abs(self.integral(rf_raster_time_s=rf_raster_time_s))
            if area == 0:
                self._memo[key] = 0.0
            else:
                w = self.combined_envelope()
                power = float(np.sum(np.abs(w) ** 2 * self.sample_durations(rf_raster_time_s=rf_raster_time_s)))
                self._memo[key] = -math.pi * (power / area) / area  # divided twice: exact -2*pi^2 for the ideal pulse
        return self._memo[key]

    def flip_angle(self, amplitude_hz: Any, *, rf_raster_time_s: float = 1e-6) -> tuple[Any, Any]:
        """`(2*pi*|amp * I|, arg(amp * I))` with `I = integral()`: the flip (rad, >= 0) and the phase
        (rad) the definition adds. A tensor amplitude gives (differentiable) tensors, an array arrays."""
        area = self.integral(rf_raster_time_s=rf_raster_time_s)
        if isinstance(amplitude_hz, torch.Tensor):
            z = amplitude_hz * area
            return 2 * math.pi * z.abs(), torch.angle(z)
        if np.ndim(amplitude_hz) > 0:
            z = np.asarray(amplitude_hz, dtype=np.float64) * area
            return 2 * np.pi * np.abs(z), np.angle(z)
        z = complex(amplitude_hz) * area
        return 2 * math.pi * abs(z), cmath.phase(z)

    def signed_flip(self, amplitude: Any, *, rf_raster_time_s: float = 1e-6) -> tuple[Any, float]:
        """`(alpha, extra_phase) = (amplitude * 2*pi*|I|, arg(I))`, the engine's signed form.

        The rotation is by `alpha` (rad, negative for a negative amplitude) about the
        event phase + `extra_phase`. A tensor amplitude gives a tensor `alpha` (same
        shape, differentiable); `extra_phase` is a float, a constant of the definition.
        """
        area = self.integral(rf_raster_time_s=rf_raster_time_s)
        return amplitude * (2 * math.pi * abs(area)), cmath.phase(area)


def rf_definition(waveform: Any, *, dwell_s: float, bandwidth_hz: float = 0.0, definition_id: int = 0,
                  band_frequency_offsets_hz: Any = None, band_bandwidth_hz: float | None = None,
                  rf_raster_time_s: float = 1e-6) -> RfDefinition:
    """An `RfDefinition` from a complex envelope `(samples,)` or `(channels, samples)`, one sample per `dwell_s` s.

    The envelope is scaled by a positive factor so that `|int w dt| = 1/(2*pi)` s over
    the combined envelope, so an event amplitude in rad is the flip; the waveform's
    phase is kept (an event then turns about its phase + arg(int w dt)). When
    `dwell_s` differs from `rf_raster_time_s`, a `time` shape places the samples.
    A non-zero `bandwidth_hz` makes the pulse slice-selective; multiband pulses give
    1 to 8 `band_frequency_offsets_hz` (default one band at 0 Hz), each
    `band_bandwidth_hz` wide (default `bandwidth_hz`). Raises `ValueError` for an empty
    envelope, a non-positive dwell or raster, a band count outside 1-8, or zero area
    (a single sample has none: use `ideal_rf_definition` for a hard pulse).
    """
    if isinstance(waveform, torch.Tensor):
        waveform = waveform.detach().cpu().numpy()
    w = np.asarray(waveform, dtype=np.complex128)
    if w.ndim not in (1, 2) or w.size == 0:
        raise ValueError(f"waveform must be a non-empty envelope of shape (samples,) or (channels, samples), "
                         f"got shape {w.shape}")
    if not np.isfinite(w).all():
        raise ValueError("waveform holds NaN or an infinity")
    dwell = float(dwell_s)
    if not (math.isfinite(dwell) and dwell > 0):
        raise ValueError(f"dwell_s must be a finite time > 0 s, got {dwell_s!r}")
    raster = _raster(rf_raster_time_s)
    check_finite("bandwidth_hz", bandwidth_hz)
    offsets = (0.0,) if band_frequency_offsets_hz is None else tuple(np.atleast_1d(band_frequency_offsets_hz))
    if not 1 <= len(offsets) <= 8:
        raise ValueError(f"band_frequency_offsets_hz must give 1 to 8 bands, got {len(offsets)}")
    channels = w if w.ndim == 2 else w[None]
    n = channels.shape[1]
    time = None if abs(dwell / raster - 1) <= 1e-9 else RfShape(n, (np.arange(n) + 0.5) * (dwell / raster))

    def build(scale: float, power: float) -> RfDefinition:
        mags = tuple(RfShape(n, np.abs(c) * scale) for c in channels)
        phases = tuple(RfShape(n, np.angle(c) / (2 * np.pi)) for c in channels)
        single = w.ndim == 1
        return RfDefinition(
            definition_id, bandwidth_hz, len(offsets), offsets,
            bandwidth_hz if band_bandwidth_hz is None else band_bandwidth_hz, power,
            mags[0] if single else mags, phases[0] if single else phases, time,
        )

    raw = build(1.0, 0.0)
    area = abs(raw.integral(rf_raster_time_s=raster))
    durations = raw.sample_durations(rf_raster_time_s=raster)
    if area <= ZERO_AREA_RTOL * float(np.sum(np.abs(raw.combined_envelope()) * durations)) or area == 0:
        raise ValueError(f"waveform has zero area (|int w dt| = {area} s over {n} sample(s)): it cannot be "
                         "normalized to a flip; a single sample has none, use ideal_rf_definition for a hard pulse")
    scale = 1 / (2 * math.pi * area)
    power = float(np.sum(np.abs(raw.combined_envelope() * scale) ** 2 * durations))
    return build(scale, power)


def ideal_rf_definition(definition_id: int = 0) -> RfDefinition:
    """The hard pulse: one sample of height 1 lasting 1/(2*pi) s, whatever the raster.

    Its integral is exactly 1/(2*pi) s (an amplitude in rad is the flip), it has no
    bandwidth, its mode is INSTANT, and `S = -pi * (1/(2*pi)) / (1/(2*pi))^2 = -2*pi^2`.
    """
    span = 1 / (2 * math.pi)
    return RfDefinition(definition_id, 0.0, 1, (0.0,), 0.0, span, RfShape(1, np.ones(1)), sample_duration_s=span)


@dataclass(frozen=True, eq=False)
class ShimDefinition:
    """A static pTx shim: one complex weight `magnitudes[c] * exp(1j * phases_rad[c])` per channel c.

    `magnitudes` (>= 0) and `phases_rad` are 1-D of one entry per channel: numbers
    (stored as tuples of floats) or tensors (kept, so gradients reach them).
    """

    id: int
    magnitudes: Any
    phases_rad: Any

    def __post_init__(self) -> None:
        if isinstance(self.id, bool) or int(self.id) != self.id or int(self.id) < 0:
            raise ValueError(f"id must be an integer >= 0, got {self.id!r}")
        object.__setattr__(self, "id", int(self.id))
        sizes = []
        for name in ("magnitudes", "phases_rad"):
            value = getattr(self, name)
            if not isinstance(value, torch.Tensor):
                value = tuple(float(v) for v in np.asarray(value, dtype=np.float64).reshape(-1))
                object.__setattr__(self, name, value)
            check = torch.as_tensor(value).detach()
            if check.dim() != 1 or check.numel() == 0:
                raise ValueError(f"{name} must be 1-D with one entry per channel, got shape {tuple(check.shape)}")
            check_finite(name, check)
            sizes.append(check.numel())
        if sizes[0] != sizes[1]:
            raise ValueError(f"magnitudes has {sizes[0]} channels, phases_rad {sizes[1]}; they must match")
        if bool((torch.as_tensor(self.magnitudes).detach() < 0).any()):
            raise ValueError(f"magnitudes must be >= 0, got {self.magnitudes!r}")

    @property
    def channel_count(self) -> int:
        return len(self.magnitudes)

    def weights(self) -> torch.Tensor:
        """The complex weights `(channels,)`: complex128 for numbers, else the tensors' complex dtype."""
        tensors = [v for v in (self.magnitudes, self.phases_rad) if isinstance(v, torch.Tensor)]
        device = tensors[0].device if tensors else None
        m, p = (v if isinstance(v, torch.Tensor) else torch.tensor(v, dtype=torch.float64, device=device)
                for v in (self.magnitudes, self.phases_rad))
        dtype = torch.promote_types(torch.promote_types(m.dtype, p.dtype), torch.float32)
        return torch.polar(m.to(dtype), p.to(dtype))
