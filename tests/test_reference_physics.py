"""The float64 reference engine (blochsim._reference) against textbook physics.

Every expected value is computed independently, in float64, from a closed form (here or in
tests/_closed_forms.py) or a published number. Unless a test says otherwise the tolerance is 1e-10
relative: the engine is exact up to float64 round-off (~1e-15 per operation, a few thousand operations), and where a
steady state is reached by playing repetitions, enough are played that the transient left over
is below 1e-15 (the bound is computed beside each test).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from _closed_forms import ernst, freeman_hill, inversion_recovery, spin_echo
from conftest import rel_max_err
from torch.autograd import forward_ad

from blochsim._reference import play, simulate_reference
from blochsim.physics.lineshape import SUPER_LORENTZIAN_CUTOFF_HZ
from blochsim.sequence import AdcRole, EventAction, RfUse, SequenceDescription, SequenceEvent, TissueProperties

try:
    from blochsim.sequence.rf import ideal_rf_definition
except ImportError:  # rf.py is being written concurrently; the stub has the same two methods
    from _rf_stub import ideal_rf_definition
from _rf_stub import StubRfDefinition

E = SequenceEvent
A = EventAction
DEG = math.pi / 180.0
REL = 1e-10  # see the module docstring


def describe(events, tr_us, *, definitions=None, **geometry) -> SequenceDescription:
    return SequenceDescription(0, tr_us, tuple(events), definitions or {0: ideal_rf_definition(0)}, **geometry)


def pulse(t_us, flip_rad, phase_rad=0.0, action=A.NONE, **kw):
    return E.rf(t_us, 0, RfUse.EXCITATION, flip_rad, phase_rad, action=action, **kw)


def e(t_ms, T_ms):
    return math.exp(-t_ms / T_ms)


# ---------------------------------------------------------------------------------------------
# Closed-form sequences
# ---------------------------------------------------------------------------------------------


def test_ernst_spgr_steady_state():
    t1, t2, tr, te, flip = 800.0, 60.0, 10.0, 3.0, 40 * DEG
    b0 = torch.tensor([0.0, 30.0], dtype=torch.float64)
    d = describe([pulse(0, flip), E.adc(te * 1e3, action=A.SPOIL_AFTER)], tr * 1e3)
    reps = 200  # transient (E1 cos a)^199 = 0.757^199 ~ 1e-24
    signal = simulate_reference(d, TissueProperties(t1, t2, b0_hz=b0), states=1, repetitions=reps)
    expected = -1j * ernst(flip, tr, t1) * e(te, t2) * torch.exp(-2j * math.pi * b0 * te * 1e-3)
    assert signal.shape == (2, 1)
    assert rel_max_err(signal[:, 0], expected) < REL


def test_cpmg_echoes_decay_with_t2_only():
    t1, t2, esp, n = 1000.0, 80.0, 10.0, 8
    events = [pulse(0, math.pi / 2, math.pi / 2)]
    for i in range(1, n + 1):
        events.append(pulse((i - 0.5) * esp * 1e3, math.pi, 0.0, A.CRUSH_BEFORE | A.CRUSH_AFTER))
        events.append(E.adc(i * esp * 1e3))
    d = describe(events, (n + 1) * esp * 1e3)
    b0 = torch.tensor([0.0, 17.3], dtype=torch.float64)  # the echoes refocus B0 exactly
    signal = simulate_reference(d, TissueProperties(t1, t2, b0_hz=b0), states=2 * n + 2)
    expected = torch.tensor([math.exp(-i * esp / t2) for i in range(1, n + 1)], dtype=torch.float64)
    assert rel_max_err(signal, expected.expand(2, n)) < REL


def test_spin_echo_with_partial_recovery():
    # 90(y) at 0, crushed 180(x) at TE/2, echo at TE, spoiled; repeated every TR.
    # Z just before the 90 in steady state: after the 180 at TE/2, Z = -(1 - E1(TE/2)); at TE it is
    # 1 - 2 E1(TE/2) + E1(TE); after TR - TE more: 1 - 2 E1(TR - TE/2) + E1(TR). The 90 resets Z to 0,
    # so the steady state holds from the second repetition on.
    t1, t2, tr, te = 700.0, 70.0, 500.0, 30.0
    events = [
        pulse(0, math.pi / 2, math.pi / 2),
        pulse(te / 2 * 1e3, math.pi, 0.0, A.CRUSH_BEFORE | A.CRUSH_AFTER),
        E.adc(te * 1e3, action=A.SPOIL_AFTER),
    ]
    signal = simulate_reference(describe(events, tr * 1e3), TissueProperties(t1, t2), states=3, repetitions=3)
    expected = spin_echo(te, tr, t1, t2)
    assert rel_max_err(signal, [expected]) < REL


@pytest.mark.parametrize("ti_ms", [50.0, 300.0, 900.0])
def test_inversion_recovery(ti_ms):
    t1 = 800.0
    efficiency = torch.tensor([1.0, 0.9], dtype=torch.float64)
    events = [E.rf(0, 0, RfUse.INVERSION, math.pi), pulse(ti_ms * 1e3, math.pi / 2), E.adc(ti_ms * 1e3)]
    tissue = TissueProperties(t1, 50.0, inversion_efficiency=efficiency)
    signal = simulate_reference(describe(events, ti_ms * 1e3 + 10), tissue, states=1)
    expected = -1j * inversion_recovery(ti_ms, t1, efficiency)  # 1 - 2 E1 at full efficiency
    assert rel_max_err(signal[:, 0], expected) < REL


def test_bssfp_phase_alternated_steady_state():
    # Freeman-Hill: right after each pulse |M| = sin a (1 - E1) / (1 - (E1 - E2) cos a - E1 E2), along
    # -y for a 0-phase pulse (F+ = -i|M|) and +y for a pi-phase pulse; demodulating by the pulse phase
    # gives -i|M| for both, times E2(TR/2) at TE = TR/2.
    t1, t2, tr, flip = 600.0, 100.0, 10.0, 60 * DEG
    events = [
        pulse(0, flip, 0.0),
        E.adc(tr / 2 * 1e3, phase_rad=0.0),
        pulse(tr * 1e3, flip, math.pi),
        E.adc(1.5 * tr * 1e3, phase_rad=math.pi),
    ]
    # The slowest transient decays per TR by exp(-TR (cos^2(a/2)/T1 + sin^2(a/2)/T2)) = exp(-0.0375):
    # 1000 TRs leave exp(-37.5) ~ 5e-17.
    signal = simulate_reference(describe(events, 2 * tr * 1e3), TissueProperties(t1, t2), states=1, repetitions=500)
    m = freeman_hill(flip, tr, t1, t2) * math.sqrt(e(tr, t2))
    assert rel_max_err(signal, [-1j * m, -1j * m]) < REL
    assert abs(float(torch.angle(signal[0])) + math.pi / 2) < 1e-12


def test_sycomore_published_values():
    # sycomore's EPG test suite; values printed to 5 decimals, hence the 5e-5 tolerance.
    rf = pulse(0, 47 * DEG, 23 * DEG)
    tissue = TissueProperties(1000.0, 100.0)
    after_pulse = play(describe([rf], 1e3), tissue, states=2)
    assert abs(complex(after_pulse.fplus[0, 0]) - (0.28576 - 0.67321j)) < 5e-5
    assert abs(complex(after_pulse.z[0, 0]) - 0.68200) < 5e-5
    shifted = pulse(0, 47 * DEG, 23 * DEG, A.SHIFT_AFTER)
    later = play(describe([shifted, E.wait(10_000)], 20e3), tissue, states=2)
    assert abs(complex(later.z[0, 0]) - 0.68516) < 5e-5
    assert abs(complex(later.fplus[0, 1]) - (0.25857 - 0.60915j)) < 5e-5


# ---------------------------------------------------------------------------------------------
# Invariants
# ---------------------------------------------------------------------------------------------


def test_rotations_and_shifts_conserve_magnetization():
    # Over signed orders n, the states are F_n (F+(k) = F_k, F-(k) = conj(F_-k)) and Z_n with
    # Z_-n = conj(Z_n). A pulse rotates each (F_n, conj(F_-n), Z_n) by a matrix that is unitary for
    # the weights (1/2, 1/2, 1), and a shift only relabels F_n -> F_n+1, so without relaxation
    #   I = sum_n |F_n|^2 + sum_n |Z_n|^2
    #     = sum_{k>=0} |F+(k)|^2 + sum_{k>=1} |F-(k)|^2 + |Z(0)|^2 + 2 sum_{k>=1} |Z(k)|^2
    # stays 1, as long as nothing is shifted past order K-1. Off-resonance only turns phases.
    gen = torch.Generator().manual_seed(7)
    events, t = [], 0.0
    for i in range(20):
        unit = torch.rand(2, generator=gen, dtype=torch.float64)
        flip, phase = (unit * torch.tensor([math.pi, 2 * math.pi], dtype=torch.float64)).tolist()
        action = A.SHIFT_AFTER if i % 4 != 3 else A.NONE
        events.append(pulse(t, flip, phase, action))
        t += 1500.0
    d = describe(events, t)
    tissue = TissueProperties(math.inf, math.inf, b0_hz=13.0)
    r = play(d, tissue, states=20)  # 15 shifts reach order 15 < K - 1
    fp, fm, z = r.fplus[0], r.fminus[0], r.z[0]
    invariant = (fp.abs() ** 2).sum() + (fm[1:].abs() ** 2).sum() + z[0].abs() ** 2 + 2 * (z[1:].abs() ** 2).sum()
    assert abs(float(invariant) - 1.0) < 1e-12
    assert float(z[0].abs() ** 2) < 0.9  # the magnetization is spread over orders: not a vacuous check
    assert abs(complex(fm[0]) - complex(fp[0]).conjugate()) < 1e-15


def _exchange_generator(fractions, exchange_hz, r1_per_s):
    """The Bloch-McConnell longitudinal generator, written out for pools [free, p1, p2, ...]."""
    count = len(fractions)
    a = np.zeros((count, count))
    for p in range(1, count):
        k = exchange_hz[p]
        a[0, 0] -= k * fractions[p]
        a[p, 0] += k * fractions[p]
        a[0, p] += k * fractions[0]
        a[p, p] -= k * fractions[0]
    return a - np.diag(r1_per_s)


def test_exchange_reaches_equilibrium():
    # Inversion, then 30 s: the slowest rate is >= 1/(300 ms), so exp(-100) of the disturbance is left.
    tissue = TissueProperties(200.0, 50.0, pool_b_fraction=0.2, pool_b_exchange_hz=20.0, t1_pool_b_ms=300.0)
    d = describe([E.rf(0, 0, RfUse.INVERSION, math.pi), E.wait(30e6)], 31e6)
    z = play(d, tissue, states=1).z[..., 0]
    assert z.shape == (2,)
    assert torch.allclose(z, torch.tensor([0.8, 0.2], dtype=torch.complex128), rtol=0, atol=1e-12)


@pytest.mark.parametrize("pool", ["b", "semisolid"])
def test_exchange_without_relaxation_conserves_total_z(pool):
    # Disturb the pools unequally, spoil, then wait: total Z is conserved and ends shared in the
    # ratio of the fractions (the exchange rate is k (f_p + f_free) = k, so 5 s leave exp(-100)).
    if pool == "b":
        # Pool b (shift 2500 Hz) turns by pi in 200 us relative to free water, so 90(x) then
        # 90(-x) returns free water to +z and puts pool b near -z.
        tissue = TissueProperties(math.inf, 100.0, pool_b_fraction=0.2, pool_b_exchange_hz=20.0,
                                  t1_pool_b_ms=math.inf, pool_b_shift_hz=2500.0)
        disturb = [pulse(0, math.pi / 2), pulse(200, math.pi / 2, math.pi, A.SPOIL_AFTER)]
        fraction = 0.2
    else:
        # A 90 saturates free water; the semisolid pool keeps (almost all of) its Z.
        tissue = TissueProperties(math.inf, 100.0, bound_fraction=0.15, bound_exchange_hz=20.0, t1_bound_ms=math.inf)
        disturb = [pulse(0, math.pi / 2, action=A.SPOIL_AFTER)]
        fraction = 0.15
    before = play(describe(disturb, 1e3), tissue, states=2).z  # (pools, states)
    after = play(describe(disturb + [E.wait(5e6)], 6e6), tissue, states=2).z
    assert float(before[1, 0].real) * (1 if pool == "semisolid" else -1) > 0.1  # really disturbed
    total = complex(before[:, 0].sum())
    assert abs(complex(after[:, 0].sum()) - total) < 1e-12
    expected = torch.tensor([(1 - fraction) * total, fraction * total], dtype=torch.complex128)
    assert torch.allclose(after[:, 0], expected, rtol=0, atol=1e-12)


def test_three_pool_recovery_matches_eigendecomposition():
    # Free water + pool b + semisolid: after a spoiled 90 (which also slightly saturates the
    # semisolid pool), Z(t) = Zeq + V exp(Lambda t) V^-1 (Z(0) - Zeq), with A = V Lambda V^-1 from
    # numpy (an eigendecomposition, not a matrix exponential). Zeq solves A Zeq + R1 Zeq = 0 because
    # the exchange terms vanish at Zeq = fractions.
    f = np.array([0.65, 0.2, 0.15])
    k = np.array([0.0, 12.0, 25.0])
    t1 = np.array([900.0, 400.0, 1100.0])
    tissue = TissueProperties(t1[0], 80.0, pool_b_fraction=f[1], pool_b_exchange_hz=k[1], t1_pool_b_ms=t1[1],
                              bound_fraction=f[2], bound_exchange_hz=k[2], t1_bound_ms=t1[2])
    wait_ms = 700.0
    d = describe([pulse(0, math.pi / 2, action=A.SPOIL_AFTER), E.wait(wait_ms * 1e3)], 1e6)
    z = play(d, tissue, states=1, lineshape="gaussian").z[:, 0]
    t2b_s = 12e-6
    g = t2b_s / math.sqrt(2 * math.pi)  # Gaussian lineshape on resonance
    z0 = np.array([f[0] * math.cos(math.pi / 2), f[1] * math.cos(math.pi / 2),
                   f[2] * math.exp(-2 * math.pi**2 * (math.pi / 2) ** 2 * g)])
    a = _exchange_generator(f, k, 1e3 / t1)
    lam, v = np.linalg.eig(a)
    propagator = (v @ np.diag(np.exp(lam * wait_ms * 1e-3)) @ np.linalg.inv(v)).real
    expected = f + propagator @ (z0 - f)
    assert rel_max_err(z, torch.from_numpy(expected)) < REL


def test_zero_exchange_gives_independent_pools():
    events = [
        pulse(0, 30 * DEG, 0.0, A.SHIFT_AFTER),
        pulse(4000, 70 * DEG, 0.4, A.SHIFT_AFTER),
        E.adc(6000),
        pulse(9000, 120 * DEG, 1.1, A.CRUSH_BEFORE),
        E.adc(12000, action=A.SHIFT_AFTER),
    ]
    d = describe(events, 15000)
    common = dict(b0_hz=12.0, b1=0.9)
    mixed = TissueProperties(900.0, 70.0, pool_b_fraction=0.25, pool_b_exchange_hz=0.0, t1_pool_b_ms=400.0,
                             t2_pool_b_ms=20.0, pool_b_shift_hz=-80.0, **common)
    free = play(d, TissueProperties(900.0, 70.0, **common), states=6, repetitions=3)
    b = play(d, TissueProperties(400.0, 20.0, b0_hz=12.0 - 80.0, b1=0.9), states=6, repetitions=3)
    r = play(d, mixed, states=6, repetitions=3)
    assert r.fplus.shape == (2, 6)
    assert rel_max_err(r.signal, 0.75 * free.signal + 0.25 * b.signal) < REL
    for name in ("fplus", "fminus", "z"):
        ours = getattr(r, name)
        assert rel_max_err(ours[0], 0.75 * getattr(free, name)[0]) < REL
        assert rel_max_err(ours[1], 0.25 * getattr(b, name)[0]) < REL


# ---------------------------------------------------------------------------------------------
# Semisolid saturation
# ---------------------------------------------------------------------------------------------


_GAUSS_LEGENDRE_600 = np.polynomial.legendre.leggauss(600)


def _super_lorentzian_gauss_legendre(df_hz: float, t2b_s: float) -> tuple[float, float]:
    """(G, dG/df) by Gauss-Legendre in theta (u = cos theta), split at the magic angle."""
    nodes, weights = _GAUSS_LEGENDRE_600
    magic = math.acos(1 / math.sqrt(3))
    x = 2 * math.pi * df_hz * t2b_s
    g = dg = 0.0
    for lo, hi in ((0.0, magic), (magic, math.pi / 2)):
        theta = 0.5 * (hi - lo) * nodes + 0.5 * (hi + lo)
        w = 0.5 * (hi - lo) * weights
        d = 3 * np.cos(theta) ** 2 - 1
        integrand = np.sin(theta) * math.sqrt(2 / math.pi) * t2b_s / np.abs(d) * np.exp(-2 * (x / d) ** 2)
        g += float(np.sum(w * integrand))
        dg += float(np.sum(w * integrand * (-4 * (x / d) ** 2 / df_hz)))
    return g, dg


def _expected_lineshape(name: str, df_hz: float, t2b_s: float) -> float:
    x = 2 * math.pi * df_hz * t2b_s
    if name == "gaussian":
        return t2b_s / math.sqrt(2 * math.pi) * math.exp(-(x**2) / 2)
    if name == "lorentzian":
        return t2b_s / math.pi / (1 + x**2)
    cutoff = 1000.0
    if abs(df_hz) >= cutoff:
        return _super_lorentzian_gauss_legendre(abs(df_hz), t2b_s)[0]
    g_c, slope_c = _super_lorentzian_gauss_legendre(cutoff, t2b_s)
    b = slope_c / (2 * cutoff)
    return g_c - b * cutoff**2 + b * df_hz**2


@pytest.mark.parametrize("lineshape", ["super-lorentzian", "gaussian", "lorentzian"])
def test_semisolid_saturation_follows_the_lineshape(lineshape):
    assert SUPER_LORENTZIAN_CUTOFF_HZ == 1000.0
    s, alpha, f_rf, f_bound = -3000.0, 1.2, 1000.0, 0.1
    b0 = torch.tensor([[1000.0], [-700.0], [800.0], [3000.0], [-4000.0]], dtype=torch.float64)  # offsets 0..5 kHz
    b1 = torch.tensor([1.0, 0.8], dtype=torch.float64)
    t2b_ms = 0.015
    d = describe([E.rf(0, 0, RfUse.SATURATION, alpha, 0.0, f_rf)], 1e3,
                 definitions={0: StubRfDefinition(0, saturation_per_rad2=s)})
    tissue = TissueProperties(math.inf, math.inf, b0_hz=b0, b1=b1, bound_fraction=f_bound, t1_bound_ms=math.inf,
                              t2_bound_ms=t2b_ms)
    r = play(d, tissue, states=2, lineshape=lineshape)
    assert r.z.shape == (5, 2, 2, 2) and r.fplus.shape == (5, 2, 2, 2)
    assert float(r.fplus[..., 1, :].abs().max()) == 0.0
    expected = torch.empty(5, 2, dtype=torch.float64)
    for i in range(5):
        for j in range(2):
            g = _expected_lineshape(lineshape, f_rf - float(b0[i, 0]), t2b_ms * 1e-3)
            expected[i, j] = f_bound * math.exp(s * (alpha * float(b1[j])) ** 2 * g)
    # Gauss-Legendre with 600 nodes on each side of the magic angle agrees with the adaptive
    # quadrature to ~1e-13 relative in G; the exponent is ~0.1, so Z agrees to well under 1e-10.
    assert rel_max_err(r.z[..., 1, 0], expected) < REL
    assert float(r.z[..., 1, 1].abs().max()) == 0.0  # higher orders stay empty
    free = (1 - f_bound) * torch.cos(alpha * b1)
    assert rel_max_err(r.z[..., 0, 0], free.expand(5, 2)) < REL


# ---------------------------------------------------------------------------------------------
# Diffusion, flow, washout
# ---------------------------------------------------------------------------------------------


#: The shifts the last pulse of _populated_orders makes after itself: their lobes fill the interval after it.
LAST_SHIFTS = {0: A.NONE, 1: A.SHIFT_AFTER, 2: A.CRUSH_AFTER | A.SHIFT_AFTER}


def _populated_orders(dt_us, shifts, **geometry):
    """Pulses and shifts at t = 0 (no interval between them), the last one making `shifts` shifts after
    itself, then one interval of dt_us up to a readout: a stretch holding `shifts` lobes, all of them
    already in the stored orders (0: a stretch without a gradient)."""
    events = [
        pulse(0, 60 * DEG, 0.0, A.SHIFT_AFTER),
        pulse(0, 50 * DEG, 0.3, A.SHIFT_AFTER),
        pulse(0, 70 * DEG, 1.0, A.SHIFT_AFTER),
        pulse(0, 40 * DEG, 2.0, LAST_SHIFTS[shifts]),
        E.adc(dt_us),
    ]
    return describe(events, dt_us + 1, **geometry)


def _lobe_weights(n: torch.Tensor, shifts: int) -> tuple:
    """Weigel's diffusion weight and the mean order of a state stored at signed order n over a stretch whose
    `shifts` lobes were all shifted in before it: its dephasing moves linearly from n - shifts to n."""
    m = n - shifts
    return m**2 + m * shifts + shifts**2 / 3, m + shifts / 2


@pytest.mark.parametrize("shifts", LAST_SHIFTS)
def test_diffusion_attenuates_by_signed_order(shifts):
    voxel, crusher, dt_s, d_um2_per_ms = 0.5e-3, 2 * math.pi, 0.05, 3.0
    desc = _populated_orders(dt_s * 1e6, shifts, crusher_dephasing_rad=crusher, voxel_size_m=voxel)
    still = play(desc, TissueProperties(math.inf, math.inf), states=6)
    moved = play(desc, TissueProperties(math.inf, math.inf, diffusion_um2_per_ms=d_um2_per_ms), states=6)
    b = d_um2_per_ms * 1e-9 * (crusher / voxel) ** 2 * dt_s
    k = torch.arange(6, dtype=torch.float64)
    # F+(k) is signed order n = k, F-(k) is n = -k (no lobe: n^2; one lobe shifted in: n^2 - n + 1/3).
    assert rel_max_err(moved.fplus[0], still.fplus[0] * torch.exp(-_lobe_weights(k, shifts)[0] * b)) < REL
    assert rel_max_err(moved.fminus[0], still.fminus[0] * torch.exp(-_lobe_weights(-k, shifts)[0] * b)) < REL
    assert rel_max_err(moved.z[0], still.z[0] * torch.exp(-(k**2) * b)) < REL
    # Orders populated (each shift after the last pulse moves F- down an order).
    assert float(still.fplus[0, 3].abs()) > 0.05 and float(still.fminus[0, 3 - shifts].abs()) > 0.05


@pytest.mark.parametrize("shifts", LAST_SHIFTS)
def test_flow_phase_and_washout(shifts):
    voxel, crusher, dt_s, v = 2e-3, math.pi, 0.004, 0.1
    desc = _populated_orders(dt_s * 1e6, shifts, crusher_dephasing_rad=crusher, voxel_size_m=voxel)
    still = play(desc, TissueProperties(math.inf, math.inf), states=6)
    moved = play(desc, TissueProperties(math.inf, math.inf, velocity_m_per_s=v), states=6)
    phase = crusher / voxel * v * dt_s
    w = 1 - min(abs(v) * dt_s / voxel, 1.0)  # 0.8
    k = torch.arange(6, dtype=torch.float64)
    # F_n turns by exp(-i f phase), f its mean order over the stretch; F-(k) = conj(F_-k) by the conjugate.
    fplus = w * still.fplus[0] * torch.exp(-1j * _lobe_weights(k, shifts)[1] * phase)
    fminus = w * still.fminus[0] * torch.exp(1j * _lobe_weights(-k, shifts)[1] * phase)
    assert rel_max_err(moved.fplus[0], fplus) < REL
    assert rel_max_err(moved.fminus[0], fminus) < REL
    z = w * still.z[0] * torch.exp(-1j * k * phase)
    z = z + torch.tensor([1 - w, 0, 0, 0, 0, 0], dtype=torch.complex128)  # inflow at equilibrium
    assert rel_max_err(moved.z[0], z) < REL


# ---------------------------------------------------------------------------------------------
# Conventions, shapes, derivatives, errors
# ---------------------------------------------------------------------------------------------


def test_phase_conventions_of_api_1_6():
    # 0-phase pulse gives -i sin a; B0 > 0 turns by -2 pi B0 t; B1 scales the flip, B1phase adds to
    # the RF phase, the ADC phase demodulates, M0 scales the sample.
    flip, t_ms, b0 = 0.7, 2.0, 50.0
    d = describe([pulse(0, flip, 0.2), E.adc(t_ms * 1e3, phase_rad=0.5)], 3e3)
    tissue = TissueProperties(1000.0, 100.0, b0_hz=b0, b1=0.8, b1_phase_rad=0.3, m0=2.5)
    signal = simulate_reference(d, tissue, states=1)
    expected = (2.5 * -1j * math.sin(0.8 * flip) * e(t_ms, 100.0)
                * np.exp(1j * (0.2 + 0.3 - 0.5 - 2 * math.pi * b0 * t_ms * 1e-3)))
    assert rel_max_err(signal, [expected]) < REL
    plain = simulate_reference(d, TissueProperties(1000.0, 100.0, b0_hz=b0), states=1)
    assert abs(float(torch.angle(plain[0])) - (-math.pi / 2 + 0.2 - 0.5 - 0.2 * math.pi)) < 1e-12


@pytest.mark.parametrize("dt_us", [1.0, 37.0, 1000.0, 1e5, 1e7])
def test_short_and_long_interval_recovery(dt_us):
    # A spoiled 90 leaves Z(0) = cos(pi/2) ~ 6e-17, then Z(0) = 1 - E1 + 6e-17 E1 after dt: the
    # recovery 1 - E1 is as small as 1e-9 here, and must still be right to 1e-10 relative.
    t1 = 1000.0
    d = describe([pulse(0, math.pi / 2, action=A.SPOIL_AFTER), E.wait(dt_us)], dt_us + 1)
    z = play(d, TissueProperties(t1, 50.0), states=1).z[0, 0]
    e1 = math.exp(-dt_us * 1e-3 / t1)
    assert rel_max_err(z, -math.expm1(-dt_us * 1e-3 / t1) + math.cos(math.pi / 2) * e1) < REL


def test_definition_flip_and_phase_are_used():
    # (alpha, extra_phase) come from the RF definition: a pulse of amplitude a plays flip 0.5 a
    # about the event phase + 0.4 here.
    definition = StubRfDefinition(0, flip_per_amplitude=0.5, extra_phase_rad=0.4)
    d = describe([pulse(0, 1.3, 0.2), E.adc(0)], 1e3, definitions={0: definition})
    signal = simulate_reference(d, TissueProperties(1000.0, 100.0), states=1)
    assert rel_max_err(signal, [-1j * np.exp(1j * 0.6) * math.sin(0.65)]) < REL


def test_zero_relaxation_time_gives_zero_not_nan():
    # (T1 = 0 recovers instantly, so a sample taken at a pulse would not be 0: sample 1 ms later.)
    d = describe([pulse(0, math.pi / 2), E.adc(1000), pulse(2000, math.pi / 3), E.adc(3000)], 4e3)
    t = torch.tensor([0.0, 100.0], dtype=torch.float64)
    signal = simulate_reference(d, TissueProperties(t, t), states=1, repetitions=2)
    assert torch.isfinite(signal).all()
    assert float(signal[0].abs().max()) == 0.0 and float(signal[1].abs().min()) > 0


def test_record_modes_and_last_repetition_only():
    events = [pulse(0, 0.5), E.adc(100, AdcRole.NON_ACQUIRED, is_echo=False), E.adc(200, AdcRole.SINGLE, is_echo=False),
              E.adc(300, AdcRole.ECHO_CENTER, is_echo=True)]
    d = describe(events, 1e3)
    tissue = TissueProperties(1000.0, 100.0)
    assert simulate_reference(d, tissue, states=1, repetitions=3).shape == (3,)
    assert simulate_reference(d, tissue, states=1, record="acquired").shape == (2,)
    echo = simulate_reference(d, tissue, states=1, repetitions=2, record="echo")
    assert rel_max_err(echo, simulate_reference(d, tissue, states=1, repetitions=2)[2:]) == 0.0
    assert simulate_reference(describe([pulse(0, 0.5)], 1e3), tissue, states=1).shape == (0,)


def test_voxel_shapes_broadcast():
    d = describe([pulse(0, 0.5, action=A.SHIFT_AFTER), E.adc(1000), pulse(2000, 1.0), E.adc(3000)], 4e3)
    t1 = torch.linspace(500, 1500, 4, dtype=torch.float64).reshape(4, 1)
    t2 = torch.linspace(20, 120, 5, dtype=torch.float64)
    r = play(d, TissueProperties(t1, t2, pool_b_fraction=0.1), states=3)
    assert r.signal.shape == (4, 5, 2) and r.signal.dtype == torch.complex128
    assert r.fplus.shape == r.fminus.shape == r.z.shape == (4, 5, 2, 3)
    one = play(d, TissueProperties(float(t1[2, 0]), float(t2[3]), pool_b_fraction=0.1), states=3)
    # The squaring count of the interval exponentials is shared by the batch, so rounding may differ.
    assert rel_max_err(r.signal[2, 3], one.signal) < 1e-13


def _small_problem(t1, t2, flip, b0, te_us):
    """A tiny multi-pool problem, differentiable in tissue, flip and an event time."""
    events = [pulse(0, flip, 0.3, A.SHIFT_AFTER), E.adc(te_us), pulse(5000, 2 * flip, 0.0, A.CRUSH_BEFORE),
              E.adc(7000, action=A.SHIFT_AFTER)]
    tissue = TissueProperties(t1, t2, b0_hz=b0, pool_b_fraction=0.2, pool_b_exchange_hz=15.0, pool_b_shift_hz=-40.0,
                              bound_fraction=0.1, bound_exchange_hz=10.0)
    return simulate_reference(describe(events, 9000), tissue, states=3, repetitions=2, lineshape="gaussian")


def _small_inputs():
    return (
        torch.tensor([300.0, 900.0], dtype=torch.float64, requires_grad=True),  # T1
        torch.tensor([40.0, 90.0], dtype=torch.float64, requires_grad=True),  # T2
        torch.tensor(0.6, dtype=torch.float64, requires_grad=True),  # flip
        torch.tensor(7.0, dtype=torch.float64, requires_grad=True),  # B0
        torch.tensor(2000.0, dtype=torch.float64, requires_grad=True),  # TE in us
    )


def test_first_and_second_derivatives_through_autograd():
    # Finite differences in float64 with eps 1e-6 agree to ~1e-9 here; the tolerances leave room.
    inputs = _small_inputs()
    assert torch.autograd.gradcheck(_small_problem, inputs, eps=1e-6, atol=1e-8, rtol=1e-6)
    assert torch.autograd.gradgradcheck(_small_problem, inputs, eps=1e-6, atol=1e-7, rtol=1e-5)


# torch registers its forward-mode decompositions with torch.jit.script on first use, which warns.
@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")
def test_forward_mode_is_the_adjoint_of_reverse_mode():
    # <J t, w> = <t, J^T w> (real inner product on the complex output): forward mode
    # (torch.autograd.forward_ad) and reverse mode through the same oracle agree to rounding.
    gen = torch.Generator().manual_seed(3)
    inputs = _small_inputs()
    tangents = tuple(torch.randn(x.shape, generator=gen, dtype=torch.float64) for x in inputs)
    with forward_ad.dual_level():
        duals = tuple(forward_ad.make_dual(x.detach(), t) for x, t in zip(inputs, tangents, strict=True))
        jvp = forward_ad.unpack_dual(_small_problem(*duals)).tangent
    y = _small_problem(*inputs)
    w = torch.randn(y.shape, generator=gen, dtype=torch.complex128)
    vjp = torch.autograd.grad((y.conj() * w).real.sum(), inputs)
    lhs = float((jvp.conj() * w).real.sum())
    rhs = float(sum((t * g).sum() for t, g in zip(tangents, vjp, strict=True)))
    assert abs(lhs - rhs) < 1e-12 * max(1.0, abs(lhs))


@pytest.mark.parametrize(
    "kwargs, tissue, match",
    [
        (dict(states=0), {}, "states"),
        (dict(states=2, repetitions=0), {}, "repetitions"),
        (dict(states=2, record="everything"), {}, "record"),
        (dict(states=2, lineshape="voigt"), {}, "lineshape"),
        (dict(states=2), dict(t1_ms=-1.0), "t1_ms"),
        (dict(states=2), dict(t2_ms=torch.tensor([50.0, math.nan])), "t2_ms"),
        (dict(states=2), dict(t2_pool_b_ms=-3.0), "t2_pool_b_ms"),
        (dict(states=2), dict(pool_b_fraction=-0.1), "pool_b_fraction"),
        (dict(states=2), dict(bound_fraction=torch.tensor([[0.2], [0.6]]), pool_c_fraction=torch.tensor([0.3, 0.5])),
         r"voxel \(1, 1\) sums to 1.1"),
    ],
)
def test_validation_errors(kwargs, tissue, match):
    fields = dict(t1_ms=1000.0, t2_ms=100.0)
    fields.update(tissue)
    d = describe([pulse(0, 0.5), E.adc(100)], 1e3)
    with pytest.raises(ValueError, match=match):
        play(d, TissueProperties(**fields), **kwargs)
