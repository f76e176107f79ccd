"""`blochsim.physics`: the super-Lorentzian held to the adaptive quadrature it replaced.

The engine's pool tables and the oracle both read `blochsim.physics.lineshape`. Its super-Lorentzian
was integrated with scipy's adaptive quadrature (epsrel 1e-13, the magic angle a breakpoint); it is now a
composite Gauss-Legendre rule in numpy, so that scipy is not imported by the engine. scipy stays a test
dependency: it computes the old values here.
"""

from __future__ import annotations

import math
import warnings

import pytest
import torch

from blochsim.physics.lineshape import SUPER_LORENTZIAN_CUTOFF_HZ, _super_lorentzian_integrals, super_lorentzian

integrate = pytest.importorskip("scipy.integrate")

OFFSETS_HZ = (1000.0, 1200.0, 2000.0, 5000.0, 1e4, 5e4, 1e5, 1e6)
T2B_S = (1e-7, 1e-6, 1.2e-5, 5e-5, 1e-4, 1e-3)


def _adaptive(offset_hz: float, t2b_s: float) -> tuple[float, float]:
    """(G, dG/dΔf) by scipy's adaptive quadrature, as the lineshape computed them before."""
    x = 2.0 * math.pi * offset_hz * t2b_s
    norm = math.sqrt(2.0 / math.pi) * t2b_s

    def value(u: float) -> float:
        d = 3.0 * u * u - 1.0
        return 0.0 if d == 0.0 else norm / abs(d) * math.exp(-2.0 * (x / d) ** 2)

    def slope(u: float) -> float:
        d = 3.0 * u * u - 1.0
        return 0.0 if d == 0.0 else -4.0 / offset_hz * (x / d) ** 2 * value(u)

    options = dict(points=[1.0 / math.sqrt(3.0)], epsabs=0.0, epsrel=1e-13, limit=500)
    with warnings.catch_warnings():  # it warns at its own roundoff limit, near 1e-13
        warnings.simplefilter("ignore")
        return integrate.quad(value, 0.0, 1.0, **options)[0], integrate.quad(slope, 0.0, 1.0, **options)[0]


@pytest.mark.parametrize("t2b_s", T2B_S)
def test_super_lorentzian_matches_the_adaptive_quadrature(t2b_s):
    for offset_hz in OFFSETS_HZ:
        old_g, old_slope = _adaptive(offset_hz, t2b_s)
        g, slope = _super_lorentzian_integrals(offset_hz, t2b_s)
        if old_g < 1e-290:  # subnormal: ~8 digits left (1e6 Hz at 50 us is exp(-2 x^2 / 4) ~ 1e-400: both 0)
            assert abs(g - old_g) <= 1e-300
            continue
        # The adaptive rule was asked for 1e-13 relative; the two rules measured at most 2.6e-13 apart
        # (the composite rule converges to 4e-14 against twice the nodes and panels).
        assert abs(g - old_g) <= 1e-12 * old_g, (offset_hz, t2b_s, g, old_g)
        assert abs(slope - old_slope) <= 1e-12 * abs(old_slope), (offset_hz, t2b_s, slope, old_slope)


def test_super_lorentzian_below_the_cutoff_is_the_old_quadratic():
    t2b_ms = 0.012
    g_c, slope_c = _adaptive(SUPER_LORENTZIAN_CUTOFF_HZ, t2b_ms * 1e-3)
    b = slope_c / (2.0 * SUPER_LORENTZIAN_CUTOFF_HZ)
    offsets = torch.tensor([0.0, 300.0, -700.0, 999.0], dtype=torch.float64)
    expected = g_c - b * SUPER_LORENTZIAN_CUTOFF_HZ**2 + b * offsets**2
    got = super_lorentzian(offsets, t2b_ms)
    # As above: both the value and the slope at the cutoff agree to 1e-12 relative, and the quadratic is
    # about the size of the value there (a ~ 2 g_c), so 1e-12 of the largest value holds.
    assert float((got - expected).abs().max()) <= 1e-12 * float(expected.abs().max())
