"""Absorption lineshapes G(Δf) of the semisolid (MT) pool, in s, for the engine's pool tables and the oracle.

A pulse of effective flip α (rad) at frequency f_rf saturates the semisolid pool's
longitudinal magnetization by exp(S·α²·G(f_rf − B0)), with S from the RF
definition (1/s per rad²). Each G is normalized over angular
frequency, ∫G d(2πΔf) = 1 (Graham & Henkelman 1997; Malik 2018, EPG-X).

With Δf in Hz, T2b the semisolid T2 (tissue field `t2_bound_ms`, converted to s)
and x = 2π·Δf·T2b:

* ``"gaussian"``:          G = T2b/√(2π) · exp(−x²/2)
* ``"lorentzian"``:        G = (T2b/π) / (1 + x²)
* ``"super-lorentzian"``:  G = ∫₀¹ √(2/π) · T2b/|3u²−1| · exp(−2·(x/(3u²−1))²) du
  (the default), integrated numerically in float64 by composite Gauss-Legendre
  (`_super_lorentzian_integrals` says how the panels are laid). The integral diverges as Δf → 0; for
  |Δf| < `SUPER_LORENTZIAN_CUTOFF_HZ` (1 kHz) it is replaced by the even
  quadratic a + b·Δf² that matches the value and the slope of the integral at
  |Δf| = 1 kHz, which removes the divergence smoothly (C¹ at the cutoff).

The Gaussian and Lorentzian are torch expressions, differentiable in Δf and T2b.
The super-Lorentzian is computed with numpy per distinct (|Δf|, T2b) pair and is
returned as constant data: no derivative flows through it.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import torch

__all__ = [
    "LINESHAPES",
    "SUPER_LORENTZIAN_CUTOFF_HZ",
    "absorption_lineshape",
    "gaussian",
    "lorentzian",
    "super_lorentzian",
]

#: Names accepted by `absorption_lineshape` (and by `play(..., lineshape=)`).
LINESHAPES = ("super-lorentzian", "gaussian", "lorentzian")

#: Below this |Δf| (Hz) the super-Lorentzian is the quadratic continuation.
SUPER_LORENTZIAN_CUTOFF_HZ = 1000.0

#: Gauss-Legendre nodes and weights on [-1, 1], 24 per panel: with the panels below, G and its slope
#: converge to ~4e-14 relative (against 48 nodes on twice the panels, Δf 1 kHz-1 MHz, T2b 0.1 us-10 ms).
_NODES, _WEIGHTS = np.polynomial.legendre.leggauss(24)
#: Uniform panels per side of the magic angle, beside the graded ones.
_UNIFORM_PANELS = 16


def _float64(value) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        return value.to(torch.float64)
    return torch.tensor(float(value), dtype=torch.float64)


def gaussian(offset_hz, t2_bound_ms) -> torch.Tensor:
    """Gaussian lineshape T2b/√(2π)·exp(−(2πΔf·T2b)²/2) in s; broadcasts its arguments."""
    t2b_s = _float64(t2_bound_ms) * 1e-3
    x = 2.0 * math.pi * _float64(offset_hz) * t2b_s
    return t2b_s / math.sqrt(2.0 * math.pi) * torch.exp(-0.5 * x**2)


def lorentzian(offset_hz, t2_bound_ms) -> torch.Tensor:
    """Lorentzian lineshape (T2b/π)/(1 + (2πΔf·T2b)²) in s; broadcasts its arguments."""
    t2b_s = _float64(t2_bound_ms) * 1e-3
    x = 2.0 * math.pi * _float64(offset_hz) * t2b_s
    return (t2b_s / math.pi) / (1.0 + x**2)


def _super_lorentzian_integrals(offset_hz: float, t2b_s: float) -> tuple[float, float]:
    """(G, dG/dΔf) of the super-Lorentzian integral at Δf = offset_hz > 0, in s and s/Hz.

    dG/dΔf is the integral of the Δf-derivative of the integrand,
    −(4/Δf)·x_d²·(integrand), with x_d = 2πΔf·T2b/d and d = 3u²−1.

    The integrand vanishes at the magic angle (d = 0) with every derivative and rises over |d| of the
    order of x, so each side of it is cut into panels whose |d| ends double from x/8 (below, the
    integrand is under exp(−128) of its peak) and into 16 uniform ones (for x near or past the far end);
    each panel is mapped back to u, where the integrand is smooth, and summed with 24 Gauss-Legendre
    nodes. Against scipy's adaptive quadrature (epsrel 1e-13), which this replaced, it agrees to 3e-13
    (tests/test_physics.py).
    """
    x = 2.0 * math.pi * offset_hz * t2b_s
    norm = math.sqrt(2.0 / math.pi) * t2b_s
    g = slope = 0.0
    for sign, far in ((1.0, 2.0), (-1.0, 1.0)):  # d in (0, 2] for u above the magic angle, [-1, 0) below
        near = min(x / 8.0, far / _UNIFORM_PANELS)
        graded = x * 2.0 ** np.arange(-3, 64)
        ends = np.unique(np.concatenate([[near], graded[(graded > near) & (graded < far)],
                                         far * np.arange(1, _UNIFORM_PANELS + 1) / _UNIFORM_PANELS]))
        u_ends = np.sqrt((1.0 + sign * ends) / 3.0)
        lo, hi = u_ends[:-1, None], u_ends[1:, None]
        u = 0.5 * (hi - lo) * _NODES + 0.5 * (hi + lo)
        weights = 0.5 * np.abs(hi - lo) * _WEIGHTS
        d = 3.0 * u * u - 1.0
        value = norm / np.abs(d) * np.exp(-2.0 * (x / d) ** 2)
        g += float(np.sum(weights * value))
        slope += float(np.sum(weights * value * (-4.0 / offset_hz * (x / d) ** 2)))
    return g, slope


@functools.lru_cache(maxsize=4096)
def _super_lorentzian_scalar(abs_offset_hz: float, t2b_s: float) -> float:
    cutoff = SUPER_LORENTZIAN_CUTOFF_HZ
    if abs_offset_hz >= cutoff:
        return _super_lorentzian_integrals(abs_offset_hz, t2b_s)[0]
    g_c, slope_c = _super_lorentzian_integrals(cutoff, t2b_s)
    b = slope_c / (2.0 * cutoff)  # d/dΔf (a + bΔf²) = 2bΔf matches the slope at the cutoff
    a = g_c - b * cutoff**2  # and a + b·cutoff² matches the value
    return a + b * abs_offset_hz**2


def super_lorentzian(offset_hz, t2_bound_ms) -> torch.Tensor:
    """Super-Lorentzian lineshape in s (constant data: no autograd), shape = broadcast of the inputs."""
    offset = _float64(offset_hz).detach()
    t2b_s = _float64(t2_bound_ms).detach() * 1e-3
    offset, t2b_s = torch.broadcast_tensors(offset, t2b_s)
    pairs = zip(offset.reshape(-1).tolist(), t2b_s.reshape(-1).tolist(), strict=True)
    values = [_super_lorentzian_scalar(abs(f), t) for f, t in pairs]
    return torch.tensor(values, dtype=torch.float64).reshape(offset.shape)


def absorption_lineshape(name: str, offset_hz, t2_bound_ms) -> torch.Tensor:
    """G(offset_hz) in s for the lineshape `name` (one of `LINESHAPES`), T2b in ms."""
    shapes = {"super-lorentzian": super_lorentzian, "gaussian": gaussian, "lorentzian": lorentzian}
    if name not in shapes:
        raise ValueError(f"lineshape must be one of {LINESHAPES}, got {name!r}")
    return shapes[name](offset_hz, t2_bound_ms)
