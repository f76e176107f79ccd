"""An independent float64 Bloch simulation of shaped pulses across a slice, for the tests of the oracle's slice
profiles and parallel transmit: NumPy magnetization vectors turned sample by sample by Rodrigues' formula.

It knows nothing of Cayley-Klein pairs, EPG orders or blochsim's pulse code. A pulse is its samples: each
sample k turns the magnetization right-handedly about (Re d_k, Im d_k, tau_k) by the vector's length (rad),
d_k = amplitude * 2 pi * w_k * dt_k * e^{i phase} (the RF nutation of the definition's normalized envelope w:
a definition's |int w dt| is 1/(2 pi), so the amplitude in rad is the flip) and
tau_k = -2 pi x BW dt_k the slice-select gradient's precession at slice position x (an off-
resonance f turns the transverse magnetization by -2 pi f t; position x in slice thicknesses sees
f = x BW). The EPG plays a pulse at one instant with its rotation referenced to the pulse middle; the
spins here get exactly that physically: a prewinder undoing the first half's gradient precession,
the pulse with its gradient on, and a rewinder undoing the second half's (z turns of minus those areas).

Crushers are spins over one period of the crusher pattern: spin j at crusher phase zeta_j = 2 pi j / N, a
crusher turns its transverse magnetization by e^{i zeta_j} (the engine's shift F_n -> F_{n+1}); the grid mean
of e^{i n zeta} is 0 for 0 < |n| < N, so the mean over the spins is the voxel's F+(0) for every order below N.
"""

from __future__ import annotations

import math

import numpy as np


def rodrigues(m: np.ndarray, n: np.ndarray) -> np.ndarray:
    """m (..., 3) turned right-handedly by |n| about n (..., 3)."""
    angle = np.linalg.norm(n, axis=-1, keepdims=True)
    unit = np.where(angle > 0, n / np.where(angle > 0, angle, 1.0), 0.0)
    c, s = np.cos(angle), np.sin(angle)
    return m * c + np.cross(unit, m) * s + unit * np.sum(unit * m, axis=-1, keepdims=True) * (1 - c)


def turn_z(m: np.ndarray, psi) -> np.ndarray:
    """m turned right-handedly about z by psi (broadcasting): Mx + i My -> (Mx + i My) e^{i psi}."""
    p = (m[..., 0] + 1j * m[..., 1]) * np.exp(1j * np.asarray(psi))
    return np.stack([p.real, p.imag, np.broadcast_to(m[..., 2], p.shape)], -1)


def play_pulse(m: np.ndarray, envelope: np.ndarray, durations_s: np.ndarray, amplitude: float, phase_rad: float,
               positions: np.ndarray, bandwidth_hz: float, *, channel_weights=None) -> np.ndarray:
    """m (P, ..., 3) after the pulse at each slice position (positions (P,)), referenced to its middle.

    envelope: (samples,) complex, the definition's normalized envelope; or with `channel_weights` (C, ...)
    complex, the per-channel envelopes (C, samples), each voxel (the trailing axes of the weights) driven by
    sum_c weights_c * envelope_c.
    """
    x = positions.reshape((-1,) + (1,) * (m.ndim - 2))
    total = durations_s.sum()
    starts = np.concatenate([[0.0], np.cumsum(durations_s)[:-1]])
    before = np.clip((total / 2 - starts) / durations_s, 0.0, 1.0)  # each sample's share before the middle
    per_sample_tau = -2 * math.pi * bandwidth_hz * durations_s  # the gradient's z turns at x = 1
    m = turn_z(m, -x * (per_sample_tau * before).sum())  # the prewinder
    for k in range(durations_s.size):
        if channel_weights is None:
            w = envelope[k]
        else:
            w = np.tensordot(envelope[:, k], channel_weights, axes=1)
        d = amplitude * 2 * math.pi * w * durations_s[k] * np.exp(1j * phase_rad)
        d = np.broadcast_to(d, m.shape[:-1])
        tz = np.broadcast_to(x * per_sample_tau[k], m.shape[:-1])
        n = np.stack([d.real, d.imag, tz], -1)
        m = rodrigues(m, n)
    return turn_z(m, -(x * (per_sample_tau * (1 - before)).sum()))


def relax(m: np.ndarray, dt_s: float, t1_ms: float, t2_ms: float) -> np.ndarray:
    e1, e2 = math.exp(-dt_s * 1e3 / t1_ms), math.exp(-dt_s * 1e3 / t2_ms)
    return np.stack([m[..., 0] * e2, m[..., 1] * e2, 1 + (m[..., 2] - 1) * e1], -1)


def crush(m: np.ndarray, zeta: np.ndarray) -> np.ndarray:
    """One unit of dephasing: spin j (the last voxel axis before the vector) turned by e^{i zeta_j}."""
    return turn_z(m, zeta)
