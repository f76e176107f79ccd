"""An isochromat reference for gradient lobes of finite duration: spins across one period of the crusher
pattern, moving at a constant velocity, in NumPy float64.

It knows nothing of EPG orders or shifts, nor of blochsim's description layer: a sequence is its hard pulses
and readouts, in play order, and its gradient lobes, each a constant gradient over [start_s, start_s +
duration_s] whose area dephases one unit dk = crusher_dephasing_rad / voxel_size_m (rad/m). The tests build a
blochsim description from the same numbers and hold the oracle and the kernels to this.

The physics, per spin j at x_j(t) = x_j + v t (m), with transverse magnetization p = m_x + i m_y and m_z:
- a gradient g(t) (rad/m/s, its integral over a lobe is dk) turns p by exp(+i g x_j(t) dt): the engine's
  shift F_n -> F_{n+1} is m(x) -> m(x) e^{i dk x} for m(x) = sum_n F_n e^{i n dk x}. Over a piece of constant
  g the phase is g * dt * (x_j(t_a) + x_j(t_b)) / 2 exactly (x_j is linear in t);
- relaxation: p *= exp(-dt/T2), m_z -> 1 + (m_z - 1) exp(-dt/T1) (M0 = 1);
- washout, as the model defines it (API.md 3.3), over each interval between consecutive breakpoints (pulses,
  readouts, lobe starts and ends; the tests' descriptions have an event at each and nowhere else, so these
  are the engine's intervals): every spin's magnetization m -> w m + (1 - w) m_eq, w = 1 - min(|v| dt / L, 1);
- a pulse of flip a about (cos phi, sin phi, 0) rotates (m_x, m_y, m_z) by Rodrigues' formula (right-handed:
  a pulse of phase 0 takes m_z = 1 to p = -i sin a, API.md 1.6);
- a readout of phase psi samples mean_j(p_j) e^{-i psi}.
The spins sit on a uniform grid over one period 2 pi / dk of the pattern. Every spin sees the same sequence, so
the magnetization at time t is periodic in x and the spins in the voxel at any time are the grid, shifted:
the grid mean of e^{i n dk x} is exactly 0 for 0 < |n| < spins, so the mean is the voxel's F_0 to rounding
for every order below the spin count, with no sampling noise.

Diffusion is not simulated with spins (a random walk would be noisy). For a sequence of ideal 90 and 180
degree pulses only one coherence pathway carries transverse magnetization, and each sample of it is
multiplied by exp(-D b), b = integral of k(t)^2 dt over the pathway's dephasing k(t): k rises by dk over each
lobe at constant rate and changes sign at each 180 (`pathway_b_value`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Played:
    """A sequence as the reference plays it. Times in s, angles in rad.

    items: in play order (times non-decreasing), ("rf", t_s, flip_rad, phase_rad) or ("adc", t_s, phase_rad).
    lobes: (start_s, duration_s), duration > 0; each dephases one unit dk at constant gradient. Lobes may
    overlap (their gradients add).
    """

    items: tuple
    lobes: tuple

    def breakpoints(self) -> list:
        times = {item[1] for item in self.items}
        for start, duration in self.lobes:
            times |= {start, start + duration}
        return sorted(times)


def _rotate(p: np.ndarray, z: np.ndarray, flip_rad: float, phase_rad: float) -> tuple:
    """Rodrigues' rotation by flip_rad about n = (cos phase, sin phase, 0) of (Re p, Im p, z)."""
    nx, ny = math.cos(phase_rad), math.sin(phase_rad)
    c, s = math.cos(flip_rad), math.sin(flip_rad)
    mx, my = p.real, p.imag
    along = nx * mx + ny * my  # n . m
    # m' = m cos a + (n x m) sin a + n (n . m)(1 - cos a), with n x m = (ny z, -nx z, nx my - ny mx)
    mx2 = mx * c + ny * z * s + nx * along * (1 - c)
    my2 = my * c - nx * z * s + ny * along * (1 - c)
    z2 = z * c + (nx * my - ny * mx) * s
    return mx2 + 1j * my2, z2


def isochromat_signal(played: Played, *, t1_ms: float, t2_ms: float, velocity_m_per_s: float,
                      crusher_dephasing_rad: float, voxel_size_m: float, spins: int = 4000) -> np.ndarray:
    """The samples (complex128, one per readout) of `played` for one voxel (see the module docstring)."""
    dk = crusher_dephasing_rad / voxel_size_m  # rad/m
    period_m = 2 * math.pi / dk
    x0 = (np.arange(spins) + 0.5) * period_m / spins  # positions at t = 0, m
    v = velocity_m_per_s
    p = np.zeros(spins, dtype=np.complex128)
    z = np.ones(spins)
    samples = []
    now = 0.0
    items = list(played.items)
    for t in played.breakpoints():
        dt = t - now
        if dt > 0:
            # Gradient over [now, t]: the lobes covering it (breakpoints include every lobe's ends).
            rate = sum(dk / d for s, d in played.lobes if s <= now and t <= s + d)  # rad/m/s
            if rate:
                p = p * np.exp(1j * rate * dt * (2 * x0 + v * (now + t)) / 2)
            p = p * math.exp(-dt / (t2_ms * 1e-3))
            e1 = math.exp(-dt / (t1_ms * 1e-3))
            z = 1 + (z - 1) * e1
            if v:
                w = 1 - min(abs(v) * dt / voxel_size_m, 1.0)
                p, z = w * p, w * z + (1 - w)
            now = t
        while items and items[0][1] == t:
            item = items.pop(0)
            if item[0] == "rf":
                p, z = _rotate(p, z, item[2], item[3])
            else:
                samples.append(p.mean() * np.exp(-1j * item[2]))
    assert not items, "every item lies on a breakpoint"
    return np.array(samples)


def pathway_b_value(played: Played, dk_rad_per_m: float) -> np.ndarray:
    """b (s/m^2) of the one transverse pathway at each readout, for a sequence of an excitation at t = 0 and
    ideal 180-degree refocusing pulses: the integral of k(t)^2 from the excitation, k rising by dk over each
    lobe and changing sign at each refocusing pulse. k is linear between breakpoints, so each piece
    integrates exactly to dt (k_a^2 + k_a k_b + k_b^2) / 3."""
    refocusing = [item for item in played.items if item[0] == "rf" and item[1] > 0]
    assert all(math.isclose(item[2], math.pi) for item in refocusing), "ideal 180-degree pulses only"
    items = list(played.items)
    k, b, now = 0.0, 0.0, 0.0
    values = []
    for t in played.breakpoints():
        dt = t - now
        if dt > 0:
            rate = sum(dk_rad_per_m / d for s, d in played.lobes if s <= now and t <= s + d)
            k_end = k + rate * dt
            b += dt * (k * k + k * k_end + k_end * k_end) / 3
            k, now = k_end, t
        while items and items[0][1] == t:
            item = items.pop(0)
            if item[0] == "rf" and item[1] > 0:
                k = -k
            elif item[0] == "adc":
                values.append(b)
    return np.array(values)
