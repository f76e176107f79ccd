"""Pulse waveforms played sample by sample (`SampledPulse`), and the RF definition their samples play.

Waveforms are in rad/s, sampled at the midpoints of `dwell` steps, `(k + 1/2) dwell` from the pulse
start, which is where `SampledPulse` plays them. Each sample is a hard pulse of area `w_k dwell`.

* `sinc_pulse`: a Hamming-windowed sinc of `bandwidth_time` zero crossings across the pulse
  (`bandwidth_time / 2` each side), scaled so that its area is the flip.
* `hyperbolic_secant`: the adiabatic inversion of Silver, Joseph and Hoult (Phys Rev A 1985;31:2753),
  `w(t) = w1 sech(beta t)^(1 + i mu)`, i.e. amplitude `w1 sech(beta t)` and instantaneous frequency
  `-mu beta tanh(beta t) / 2 pi`, with the values of Bernstein, King and Zhou (Handbook of MRI Pulse
  Sequences, 2004, section 6.2): peak 14 uT, beta = 800 1/s, mu = 4.9.
* `sampled_definition`: the RF definition of one sample. A sample is a rectangle one dwell long, so
  its semisolid saturation `S alpha^2 G` with `S = -pi / dwell` adds up to
  `-pi w1^2 G` per unit time, the continuous-wave rate (Graham & Henkelman 1997), whatever the dwell.
  The ideal pulse (`S = -2 pi^2`) would give `-2 pi^2 w1^2 dwell^2 G` per sample, which vanishes as the
  dwell shrinks. Its envelope is constant and it has no bandwidth, so it turns instantly (mode
  INSTANT) and an event amplitude in rad is the flip, as for the ideal pulse.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import torch

from ..physics.constants import GAMMA_RAD_PER_S_PER_T
from ..sequence.rf import RfDefinition, RfShape

__all__ = ["HS_PEAK_T", "HS_BETA_PER_S", "HS_MU", "sample_count", "sinc_pulse",
           "hyperbolic_secant", "sampled_definition"]

#: The adiabatic inversion (Bernstein et al. 2004): peak B1 (T), beta (1/s), mu (dimensionless).
HS_PEAK_T = 14e-6
HS_BETA_PER_S = 800.0
HS_MU = 4.9


def sample_count(name: str, duration_ms: float, dwell_ms: float) -> int:
    """The number of dwell steps in `duration_ms`, which must be a whole number of them (to 1e-6 steps)."""
    if not (math.isfinite(dwell_ms) and dwell_ms > 0):
        raise ValueError(f"dwell must be a time > 0 ms, got {dwell_ms!r}")
    if not (math.isfinite(duration_ms) and duration_ms > 0):
        raise ValueError(f"{name} must be a time > 0 ms, got {duration_ms!r}")
    steps = duration_ms / dwell_ms
    n = round(steps)
    if n < 1 or abs(steps - n) > 1e-6 * max(1.0, steps):
        raise ValueError(f"{name} = {duration_ms} ms is not a whole number of dwell = {dwell_ms} ms steps "
                         f"({steps:.6g}); choose a dwell that divides it")
    return n


def _midpoints(n: int) -> np.ndarray:
    """Sample midpoints as fractions of the pulse, centred: (k + 1/2)/n - 1/2, in (-1/2, 1/2)."""
    return (np.arange(n) + 0.5) / n - 0.5


@functools.lru_cache(maxsize=64)
def _sinc_shape(n: int, bandwidth_time: float) -> torch.Tensor:
    """The unit-area (sum = 1) windowed sinc of n samples, float64."""
    x = _midpoints(n)
    shape = (0.54 + 0.46 * np.cos(2.0 * math.pi * x)) * np.sinc(bandwidth_time * x)
    total = shape.sum()
    if not abs(total) > 0:
        raise ValueError(f"bandwidth_time = {bandwidth_time} gives a sinc with no area over {n} samples")
    return torch.from_numpy(shape / total)


def sinc_pulse(flip_rad, *, duration_ms: float, bandwidth_time: float, dwell_ms: float):
    """A Hamming-windowed sinc of area `flip_rad`, in rad/s, `(duration_ms / dwell_ms,)`.

    `flip_rad` may be a tensor (the waveform is then a differentiable float64 tensor). Negative lobes
    are negative samples: `SampledPulse` plays them with phase pi.
    """
    n = sample_count("pulse_duration", duration_ms, dwell_ms)
    if not (math.isfinite(bandwidth_time) and bandwidth_time >= 0):
        raise ValueError(f"bandwidth_time must be a number >= 0 (sinc zero crossings), got {bandwidth_time!r}")
    shape = _sinc_shape(n, float(bandwidth_time))
    return flip_rad * shape / (dwell_ms * 1e-3)


def hyperbolic_secant(duration_ms: float, dwell_ms: float) -> np.ndarray:
    """The adiabatic hyperbolic-secant inversion over `duration_ms`, complex rad/s, centred on the pulse."""
    n = sample_count("inversion_duration", duration_ms, dwell_ms)
    t_s = _midpoints(n) * duration_ms * 1e-3
    bt = HS_BETA_PER_S * t_s
    sech = 1.0 / np.cosh(bt)
    w1 = GAMMA_RAD_PER_S_PER_T * HS_PEAK_T
    return w1 * sech * np.exp(1j * HS_MU * np.log(sech))


@functools.lru_cache(maxsize=64)
def sampled_definition(dwell_ms: float) -> RfDefinition:
    """Definition 0 for pulses played sample by sample: a rectangle one dwell long (see the module doc).

    The stored height is float32, so the span is chosen from it to keep the area exactly 1/(2 pi) s.
    """
    if not (math.isfinite(dwell_ms) and dwell_ms > 0):
        raise ValueError(f"dwell must be a time > 0 ms, got {dwell_ms!r}")
    height = float(np.float32(1.0 / (2.0 * math.pi * dwell_ms * 1e-3)))
    span_s = 1.0 / (2.0 * math.pi * height)
    return RfDefinition(0, 0.0, 1, (0.0,), 0.0, height * height * span_s, RfShape(1, np.array([height])),
                        sample_duration_s=span_s)
