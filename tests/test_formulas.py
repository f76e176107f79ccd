"""The closed-form physics (blochsim.simulators._formulas) against independent float64 computations.

Every expected value is computed in float64 (here, or by tests/_closed_forms.py, which imports nothing
of blochsim), either from the textbook formula written out separately (math/cmath/NumPy, a different
algebraic form where one exists) or from a numeric solution
that does not share code with the function: a 3x3 linear solve of the Bloch fixed point (bSSFP), a
shot-by-shot recursion run to its steady state (Look-Locker, MOLLI, MP2RAGE, HSFP), an adaptive
quadrature of the convolution integral (ASL). Closed forms are held to 1e-10 relative (float64
round-off of a few dozen operations is ~1e-15; the margin covers cancellations such as 1 - E near
E = 1). Numeric references state beside each test how far their iteration converged.
"""

from __future__ import annotations

import cmath
import math

import _closed_forms as C
import numpy as np
import pytest
import torch
from conftest import f64, rel_max_err

import blochsim.simulators._formulas as F
from blochsim.physics.fat_spectra import FAT_SPECTRA
from blochsim.simulators.diffusion_tensor import TENSOR

F64 = torch.float64
DEG = math.pi / 180.0
REL = 1e-10  # see the module docstring


# ---------------------------------------------------------------------------------------------
# Gradient echo
# ---------------------------------------------------------------------------------------------


def test_spgr_is_the_ernst_signal_with_the_closed_form_phase():
    t1, t2s, m0 = [300.0, 900.0, 1500.0], [20.0, 45.0, 80.0], [0.7, 1.0, 1.2 - 0.3j]
    b0, cs = [-15.0, 0.0, 40.0], [0.0, 12.0, -3.0]
    flip, tr, te = f64([3.0, 12.0, 45.0, 80.0]), 8.0, f64([2.0, 3.0, 4.5, 7.0])
    col = lambda x: torch.as_tensor(x).reshape(-1, 1)  # noqa: E731
    signal = F.spgr(
        flip,
        tr,
        te,
        T1=col(f64(t1)),
        T2star=col(f64(t2s)),
        M0=col(torch.tensor(m0, dtype=torch.complex128)),
        B0=col(f64(b0)),
        chemshift=col(f64(cs)),
    )
    assert signal.dtype == torch.complex128 and signal.shape == (3, 4)
    expected = np.zeros((3, 4), complex)
    for v in range(3):
        for j in range(4):
            a, t = float(flip[j]) * DEG, float(te[j])
            expected[v, j] = (m0[v] * C.ernst(a, tr, t1[v]) * math.exp(-t / t2s[v])
                              * cmath.exp(2j * math.pi * (cs[v] - b0[v]) * t / 1e3))
    assert rel_max_err(signal, expected) < REL
    # Without T2star there is no decay, and on resonance the value is real and positive (API.md 1.6).
    plain = F.spgr(f64(20.0), 10.0, 5.0, T1=800.0)
    assert rel_max_err(plain, C.ernst(20 * DEG, 10.0, 800.0)) < REL


@pytest.mark.parametrize("spectrum", sorted(FAT_SPECTRA))
def test_multigradientecho_water_plus_multipeak_fat(spectrum):
    te = [1.1, 2.3, 3.5, 4.7, 5.9, 7.1]
    ff, phase, b0, t2s, fat_t2s, field = [0.0, 0.2, 0.6], [0.0, 15.0, -30.0], [0.0, -25.0, 60.0], 30.0, 15.0, 1.5
    col = lambda x: f64(x).reshape(-1, 1)  # noqa: E731
    m0 = torch.tensor([1.0, 0.5 + 0.5j, -0.3j], dtype=torch.complex128).reshape(-1, 1)
    signal = F.multigradientecho(
        f64(te),
        T2star=t2s,
        fat_T2star=fat_t2s,
        M0=m0,
        B0=col(b0),
        fat_fraction=col(ff),
        fat_phase=col(phase),
        field_strength=field,
        fat_spectrum=spectrum,
    )
    expected = [
        [
            complex(m0[v, 0])
            * C.water_fat(t, peaks=FAT_SPECTRA[spectrum], fat_fraction=ff[v], fat_phase_deg=phase[v], b0_hz=b0[v],
                          t2s_ms=t2s, fat_t2s_ms=fat_t2s, field_t=field)
            for t in te
        ]
        for v in range(3)
    ]
    assert signal.dtype == torch.complex128
    assert rel_max_err(signal, expected) < REL
    # fat_T2star defaults to T2star; without T2star nothing decays, so |S(0)| = |M0|.
    one_r2 = F.multigradientecho(f64(te), T2star=t2s, fat_fraction=0.3, fat_spectrum=spectrum)
    expected = [
        C.water_fat(t, peaks=FAT_SPECTRA[spectrum], fat_fraction=0.3, fat_phase_deg=0, b0_hz=0, t2s_ms=t2s,
                    fat_t2s_ms=t2s, field_t=3.0)
        for t in te
    ]
    assert rel_max_err(one_r2, expected) < REL
    assert abs(float(F.multigradientecho(f64(0.0), fat_fraction=0.4, fat_spectrum=spectrum).abs()) - 1) < 1e-14


def test_fat_peaks_sit_below_water_with_the_documented_sign():
    # The main methylene peak (-3.4 ppm) at 3 T is -434.3 Hz; with e^{+i 2 pi f TE} a pure-fat signal turns
    # like B0 = +434 Hz does for water. Checked on the one-peak spectrum given as a (ppm, amplitude) pair.
    te = f64([0.3, 0.7, 1.3])
    fat = F.multigradientecho(te, fat_fraction=1.0, fat_spectrum=((-3.4,), (1.0,)))
    water_shifted = F.multigradientecho(te, B0=3.4e-6 * C.GAMMA_BAR_HZ_PER_T * 3.0)
    assert rel_max_err(fat, water_shifted) < REL


def test_irmultigradientecho_each_species_recovers_then_decays():
    ti, te = [100.0, 400.0, 900.0, 2000.0], [1.2, 2.4, 3.6, 4.8]  # a flattened (TI, TE) grid
    t1, fat_t1, eff, fat_eff, ff = 1200.0, 350.0, 0.95, 0.9, 0.25
    signal = F.irmultigradientecho(
        f64(ti),
        f64(te),
        T1=t1,
        fat_T1=fat_t1,
        T2star=25.0,
        fat_T2star=12.0,
        B0=7.0,
        fat_fraction=ff,
        fat_phase=20.0,
        inv_efficiency=eff,
        fat_inv_efficiency=fat_eff,
    )
    expected = []
    for a, t in zip(ti, te, strict=True):
        water = (1 - ff) * C.inversion_recovery(a, t1, eff)
        fat = ff * C.inversion_recovery(a, fat_t1, fat_eff)
        expected.append(
            C.water_fat(t, peaks=FAT_SPECTRA["hamilton2011"], fat_fraction=ff, fat_phase_deg=20.0, b0_hz=7.0,
                        t2s_ms=25.0, fat_t2s_ms=12.0, field_t=3.0, water=water, fat=fat)
        )
    assert rel_max_err(signal, expected) < REL
    # Defaults: fat_T1 = T1, fat_inv_efficiency = inv_efficiency: both species recover alike.
    same = F.irmultigradientecho(f64(ti), 0.0, T1=t1, fat_fraction=ff, inv_efficiency=eff)
    assert rel_max_err(same, [C.inversion_recovery(a, t1, eff) for a in ti]) < REL


# ---------------------------------------------------------------------------------------------
# bSSFP, IR-TrueFISP, HSFP
# ---------------------------------------------------------------------------------------------


def test_bssfp_matches_the_numeric_steady_state():
    b0 = [-70.0, -23.0, 0.0, 11.0, 50.0]
    cases = [
        (60.0, 10.0, 5.0, 1000.0, 100.0, 0.0, 180.0),
        (30.0, 4.5, 2.0, 600.0, 40.0, 8.0, 180.0),
        (45.0, 6.0, 1.5, 1200.0, 200.0, -5.0, 90.0),
        (10.0, 3.0, 3.0, 800.0, 80.0, 0.0, 0.0),
    ]
    for flip, tr, te, t1, t2, cs, inc in cases:
        signal = F.bssfp(f64(flip), tr, te, T1=t1, T2=t2, B0=f64(b0), chemshift=cs, phase_inc=inc)
        expected = [C.bssfp_fixed_point(flip, tr, te, t1, t2, b, cs, inc) for b in b0]
        assert rel_max_err(signal, expected) < REL, (flip, tr, te, t1, t2, cs, inc)


def test_bssfp_published_number_and_on_resonance_phase():
    # API.md 5.2: 0.1332 at T1/T2 = 1000/100, 60 degrees, TR 10, TE 5 (the incumbent's 0.2111 used E2(TE)).
    value = complex(F.bssfp(f64(60.0), 10.0, 5.0, T1=1000.0, T2=100.0))
    assert abs(value.real) < 1e-15 and round(value.imag, 4) == 0.1332
    # Two algebraically equal float64 forms: they differ by tens of ulp of 0.13 (1.3e-15 seen on one machine's libm).
    assert abs(value.imag - C.freeman_hill(60 * DEG, 10.0, 1000.0, 100.0) * math.exp(-5 / 100)) < 1e-14
    # TE defaults to TR/2.
    assert rel_max_err(F.bssfp(f64(60.0), 10.0, T1=1000.0, T2=100.0), value) < REL


def test_bssfp_is_minus_the_engine_value_off_resonance():
    # The float64 reference engine plays the phase-cycled train (RF phase k * phase_inc, ADC demodulated by
    # the pulse phase); the closed form is minus its value (API.md 1.6), B0 turning the same way. The
    # slowest transient decays at most by E1 = e^{-10/100} per TR: 360 TRs leave e^{-36} ~ 2e-16.
    from blochsim._reference import simulate_reference
    from blochsim.sequence import RfUse, SequenceDescription, SequenceEvent, TissueProperties
    from blochsim.sequence.rf import ideal_rf_definition

    t1, t2, tr, te, flip = 100.0, 50.0, 10.0, 4.0, 50.0
    b0 = f64([-30.0, 0.0, 17.0])
    for inc, cycle in ((180.0, 2), (90.0, 4)):
        events = []
        for k in range(cycle):
            phase = k * inc * DEG
            events.append(SequenceEvent.rf(k * tr * 1e3, 0, RfUse.EXCITATION, flip * DEG, phase))
            events.append(SequenceEvent.adc((k * tr + te) * 1e3, phase_rad=phase))
        d = SequenceDescription(0, cycle * tr * 1e3, tuple(events), {0: ideal_rf_definition(0)})
        engine = simulate_reference(d, TissueProperties(t1, t2, b0_hz=b0), states=1, repetitions=360 // cycle)
        closed = F.bssfp(f64(flip), tr, te, T1=t1, T2=t2, B0=b0.reshape(-1, 1), phase_inc=inc)
        assert rel_max_err(closed.expand(3, cycle), -engine) < REL, inc


def test_irbssfp_single_exponential_approach():
    t1, t2 = f64([[900.0], [1500.0]]), f64([[60.0], [250.0]])
    ti = f64([0.0, 50.0, 300.0, 1200.0, 4000.0])
    flip, b1, eff, m0 = 50.0, 0.9, 0.96, 1.4
    signal = F.irbssfp(f64(flip), ti, T1=t1, T2=t2, M0=m0, B1=b1, inv_efficiency=eff)
    expected = np.zeros((2, 5))
    for v in range(2):
        for j, t in enumerate(ti.tolist()):
            expected[v, j] = m0 * C.ir_truefisp(b1 * flip * DEG, t, float(t1[v, 0]), float(t2[v, 0]), eff)
    assert signal.dtype == F64 and rel_max_err(signal, expected) < REL
    assert abs(float(signal[0, 0]) + m0 * eff * math.sin(b1 * flip * DEG / 2)) < 1e-15


@pytest.mark.parametrize("beta", [-1.0, 1.0, 0.5])
def test_hsfp_periodic_steady_state(beta):
    n = 120
    flips = [80 * math.sin(math.pi * j / (n - 1)) ** 2 + 5 * math.sin(0.3 * j) for j in range(n)]
    tr, t1, t2 = 5.0, f64([[700.0], [1300.0]]), f64([[50.0], [110.0]])
    signal = F.hsfp(f64(flips), tr, T1=t1, T2=t2, M0=f64([[1.0], [0.8]]), beta=beta)
    # Each pass contracts the start by |beta| e^{-sum TR R_n} <= e^{-3} here: 40 passes leave < 1e-50.
    expected = [
        [m * s for s in C.hsfp_periodic_state(flips, tr, float(t1[v, 0]), float(t2[v, 0]), beta, passes=40)]
        for v, m in enumerate((1.0, 0.8))
    ]
    assert signal.shape == (2, n) and rel_max_err(signal, expected) < REL


# ---------------------------------------------------------------------------------------------
# Look-Locker, MOLLI, MP2RAGE
# ---------------------------------------------------------------------------------------------


def test_looklocker_is_exact_on_the_pulse_grid():
    flip, tr, t1, b1, eff, m0 = 8.0, 12.0, 850.0, 1.1, 0.93, 1.3
    k = np.arange(0, 300, 7)
    a = b1 * flip * DEG
    from_eq, _ = C.look_locker_mz(-eff, a, tr, t1, 300)
    signal = F.looklocker(f64(flip), tr, f64(k * tr), T1=t1, M0=m0, B1=b1, inv_efficiency=eff)
    assert rel_max_err(signal, [m0 * from_eq[j] * math.sin(a) for j in k]) < REL
    # from_steady_state: the inversion acts on the train's own steady state, reached here by playing
    # 5000 pulses (transient (E1 cos a)^5000 ~ e^{-70}).
    _, steady = C.look_locker_mz(1.0, a, tr, t1, 5000)
    repeated, _ = C.look_locker_mz(-eff * steady, a, tr, t1, 300)
    signal = F.looklocker(f64(flip), tr, f64(k * tr), T1=t1, M0=m0, B1=b1, inv_efficiency=eff, from_steady_state=True)
    assert rel_max_err(signal, [m0 * repeated[j] * math.sin(a) for j in k]) < REL


def test_looklocker_short_tr_uses_the_continuous_steady_state():
    flip, tr, t1, eff = 6.0, 5.0, 1100.0, 1.0
    ti = f64([0.0, 100.0, 555.5, 2000.0])
    # A = M0 T1*/T1, the textbook three-parameter fit's A.
    expected = [C.look_locker_continuous(flip * DEG, tr, t, t1, eff) for t in ti.tolist()]
    assert rel_max_err(F.looklocker(f64(flip), tr, ti, T1=t1, short_TR=True), expected) < REL


def test_molli_blocks_with_free_recovery():
    readouts, recovery, flip, tr, eff, m0 = (5, 3, 2), 2400.0, 35.0, 900.0, 0.94, 1.1
    t1 = [400.0, 1200.0]
    signal = F.molli(f64(flip), tr, readouts, recovery, T1=f64(t1).reshape(-1, 1), M0=m0, inv_efficiency=eff)
    assert signal.shape == (2, sum(readouts))
    expected = [[m0 * mz * math.sin(flip * DEG) for mz in C.molli_mz(flip * DEG, tr, readouts, recovery, T1, eff)]
                for T1 in t1]
    assert rel_max_err(signal, expected) < REL


@pytest.mark.parametrize(
    "ti, flips, tr, tr_mp2rage, nshots",
    [
        ((800.0, 2700.0), (4.0, 5.0), 6.9, 6000.0, 160),
        ((700.0, 2500.0), (7.0, 5.0), 7.1, 5000.0, (40, 121)),
        ((1000.0, 3200.0), (6.0, 6.0), 6.5, 8250.0, 175),
    ],
)
def test_mp2rage_matches_the_shot_by_shot_recursion(ti, flips, tr, tr_mp2rage, nshots):
    before, after = (nshots // 2, nshots - nshots // 2) if isinstance(nshots, int) else nshots
    t1, eff, m0, b1 = [500.0, 1400.0, 2200.0], 0.96, 1.2, 1.05
    signal = F.mp2rage(
        f64(ti), f64(flips), tr, tr_mp2rage, nshots, T1=f64(t1).reshape(-1, 1), M0=m0, inv_efficiency=eff, B1=b1
    )
    # The cycle map contracts by eff e^{-TRmp2rage/T1} < 0.2 here: 25 cycles leave < 1e-17.
    expected = [
        [m0 * s for s in C.mp2rage_shot_by_shot(ti, [b1 * f for f in flips], tr, tr_mp2rage, before, after, T1, eff,
                                                cycles=25)]
        for T1 in t1
    ]
    assert signal.shape == (3, 2) and rel_max_err(signal, expected) < REL
    assert float(signal[2, 0]) < 0 < float(signal[2, 1])  # T1 = 2.2 s: still inverted at TI1, recovered by TI2
    scalar_flip = F.mp2rage(f64(ti), f64(flips[0]), tr, tr_mp2rage, nshots, T1=1000.0)
    both = F.mp2rage(f64(ti), f64([flips[0], flips[0]]), tr, tr_mp2rage, nshots, T1=1000.0)
    assert rel_max_err(scalar_flip, both) < REL


@pytest.mark.parametrize(
    "ti, tr_mp2rage, nshots, match",
    [
        ((500.0, 2700.0), 6000.0, 160, "block 1 cannot start before its inversion"),
        ((800.0, 1500.0), 6000.0, 160, "block 2 would start before block 1 ends"),
        ((800.0, 2700.0), 3000.0, 160, "block 2 must end within TRmp2rage"),
        ((800.0, 2700.0), 6000.0, (10, 0), "nshots"),
        ((800.0,), 6000.0, 160, "two inversion times"),
    ],
)
def test_mp2rage_timing_errors(ti, tr_mp2rage, nshots, match):
    with pytest.raises(ValueError, match=match):
        F.mp2rage(f64(ti), 4.0, 6.9, tr_mp2rage, nshots, T1=1000.0)


# ---------------------------------------------------------------------------------------------
# Relaxometry, diffusion, ASL, Lorentzian
# ---------------------------------------------------------------------------------------------


def test_relaxometry_textbook_formulas():
    ti, t1, t2, eff, m0, off = [30.0, 400.0, 1500.0], 900.0, 70.0, 0.92, 1.3, 0.05
    ir = F.inversion_recovery(f64(ti), T1=t1, M0=m0, inv_efficiency=eff, offset=off)
    assert rel_max_err(ir, [m0 * C.inversion_recovery(t, t1, eff) + off for t in ti]) < REL
    tr = 2000.0
    ir_tr = F.inversion_recovery(f64(ti), tr, T1=t1, M0=m0, inv_efficiency=eff, offset=off)
    # Mz before the inversion is 1 - e^{-(TR - TI)/T1} (the readout at TI saturates).
    assert rel_max_err(ir_tr, [m0 * C.inversion_recovery(t, t1, eff, tr) + off for t in ti]) < REL

    te = [10.0, 20.0, 40.0, 80.0]
    assert rel_max_err(F.multiecho(f64(te), T2=t2, M0=m0, offset=off), [m0 * math.exp(-t / t2) + off for t in te]) < REL

    tr = 600.0
    se = F.spin_echo(f64(te), tr, T1=t1, T2=t2, M0=m0)
    expected = [m0 * C.spin_echo(t, tr, t1, t2) for t in te]
    assert rel_max_err(se, expected) < REL
    se_ir = F.spin_echo(f64(te), tr, 250.0, T1=t1, T2=t2, M0=m0, inv_efficiency=eff)
    factor = C.inversion_recovery(250.0, t1, eff)
    assert rel_max_err(se_ir, [e * factor for e in expected]) < REL

    flips, b1 = [30.0, 60.0, 120.0], [[0.8], [1.15]]
    da = F.double_angle(f64(flips), B1=f64(b1), M0=m0)
    assert rel_max_err(da, [[m0 * math.sin(b[0] * f * DEG) for f in flips] for b in b1]) < REL


def test_diffusion_isotropic_and_tensor():
    b = [0.0, 500.0, 1000.0, 2000.0, 3000.0]
    iso = F.diffusion(f64(b), D=f64([[0.7], [3.0]]), M0=2.0)
    assert rel_max_err(iso, [[2.0 * math.exp(-x * d * 1e-3) for x in b] for d in (0.7, 3.0)]) < REL

    components = dict(zip(TENSOR, (1.7, 0.4, 0.3, 0.15, -0.05, 0.08), strict=True))
    rng = np.random.default_rng(3)
    g = rng.normal(size=(5, 3))
    g[0] = 0.0  # b = 0 has no direction
    signal = F.diffusion(f64(b), f64(g * 2.5), M0=1.0, **{k: f64(v) for k, v in components.items()})
    c = components
    tensor = np.array([[c["Dxx"], c["Dxy"], c["Dxz"]], [c["Dxy"], c["Dyy"], c["Dyz"]], [c["Dxz"], c["Dyz"], c["Dzz"]]])
    expected = [1.0] + [C.diffusion_tensor(b[j], g[j], tensor) for j in range(1, 5)]
    assert rel_max_err(signal, expected) < REL
    # An isotropic tensor gives the scalar result; off-diagonals left out are 0.
    diag = F.diffusion(f64(b), f64(g), Dxx=1.1, Dyy=1.1, Dzz=1.1)
    assert rel_max_err(diag, [math.exp(-x * 1.1e-3) for x in b]) < REL


@pytest.mark.parametrize("labelling", ["continuous", "pulsed"])
def test_asl_buxton_kinetic_model(labelling):
    t = [0.0, 400.0, 700.0, 1200.0, 1800.0, 2500.0, 3600.0, 5000.0]
    tau, att = 1800.0 if labelling == "continuous" else 800.0, [500.0, 1300.0]
    cbf, t1, m0, t1b, lam = [60.0, 25.0], 1330.0, 1.1, 1650.0, 0.9
    alpha = 0.85 if labelling == "continuous" else 0.98
    col = lambda x: f64(x).reshape(-1, 1)  # noqa: E731
    signal = F.asl(f64(t), tau, CBF=col(cbf), ATT=col(att), T1=t1, M0=m0, labelling=labelling)
    expected = [
        [C.buxton_asl(x, tau, cbf[v], att[v], t1, m0, t1b, lam, alpha, labelling) for x in t] for v in range(2)
    ]
    assert signal.dtype == F64 and rel_max_err(signal, expected) < 1e-10  # quadrature at 1e-13, closed form exact
    assert float(signal[1, 0]) == 0.0 and float(signal[1, 2]) == 0.0  # the bolus has not arrived


def test_lorentzian_pools():
    offsets = f64(np.linspace(-6, 6, 25))
    amplitudes, widths, shifts = [0.8, 0.1, 0.05], [1.5, 0.8, 3.0], [0.0, 3.5, -2.5]
    signal = F.lorentzian(offsets, amplitudes=amplitudes, widths=widths, shifts=shifts, M0=0.9)
    pools = list(zip(amplitudes, widths, shifts, strict=True))
    assert rel_max_err(signal, [C.lorentzian_z(x, pools, 0.9) for x in offsets.tolist()]) < REL


# ---------------------------------------------------------------------------------------------
# Dtypes, shapes, derivatives, validation
# ---------------------------------------------------------------------------------------------

#: name -> (call given a converter x for every numeric argument, complex result?)
CALLS = {
    "spgr": (lambda x: F.spgr(x(10.0), x(10.0), x(4.0), T1=x(900.0), T2star=x(40.0), B0=x(5.0)), True),
    "bssfp": (lambda x: F.bssfp(x(40.0), x(5.0), T1=x(900.0), T2=x(80.0), B0=x(5.0)), True),
    "multigradientecho": (lambda x: F.multigradientecho(x([1.0, 2.0]), T2star=x(30.0), fat_fraction=x(0.2)), True),
    "irmultigradientecho": (
        lambda x: F.irmultigradientecho(x([100.0, 500.0]), x([1.0, 2.0]), T1=x(900.0), fat_fraction=x(0.2)),
        True,
    ),
    "hsfp": (lambda x: F.hsfp(x([10.0, 30.0, 50.0]), x(5.0), T1=x(900.0), T2=x(80.0)), False),
    "irbssfp": (lambda x: F.irbssfp(x(40.0), x([0.0, 300.0]), T1=x(900.0), T2=x(80.0)), False),
    "looklocker": (lambda x: F.looklocker(x(8.0), x(10.0), x([0.0, 300.0]), T1=x(900.0)), False),
    "molli": (lambda x: F.molli(x(35.0), x(900.0), (3, 2), x(2000.0), T1=x(900.0)), False),
    "mp2rage": (lambda x: F.mp2rage(x([800.0, 2700.0]), x(4.0), x(6.9), x(6000.0), 160, T1=x(900.0)), False),
    "inversion_recovery": (lambda x: F.inversion_recovery(x([50.0, 400.0]), T1=x(900.0)), False),
    "multiecho": (lambda x: F.multiecho(x([10.0, 20.0]), T2=x(80.0)), False),
    "spin_echo": (lambda x: F.spin_echo(x([10.0, 20.0]), x(500.0), T1=x(900.0), T2=x(80.0)), False),
    "double_angle": (lambda x: F.double_angle(x([60.0, 120.0]), B1=x(0.9)), False),
    "diffusion": (lambda x: F.diffusion(x([0.0, 1000.0]), D=x(1.0)), False),
    "asl": (lambda x: F.asl(x([1000.0, 2500.0]), x(1800.0), CBF=x(60.0), ATT=x(800.0), T1=x(1300.0)), False),
    "lorentzian": (
        lambda x: F.lorentzian(x([-1.0, 0.0]), amplitudes=[x(0.5)], widths=[x(1.0)], shifts=[x(0.0)]),
        False,
    ),
}


@pytest.mark.parametrize("name", sorted(CALLS))
def test_dtype_promotion_and_real_or_complex(name):
    call, is_complex = CALLS[name]
    low = call(lambda value: value)  # Python numbers and lists: float32 (torch's default)
    high = call(f64)
    assert low.dtype == (torch.complex64 if is_complex else torch.float32)
    assert high.dtype == (torch.complex128 if is_complex else torch.float64)
    first = [True]

    def one_float64(value):  # a single float64 input promotes the whole computation
        if first[0]:
            first[0] = False
            return f64(value)
        return value

    assert call(one_float64).dtype == high.dtype
    assert rel_max_err(low, high) < 1e-5  # float32 round-off


def test_broadcasting_follows_the_trailing_sample_axis_rule():
    t1 = f64([700.0, 900.0, 1100.0, 1300.0]).reshape(4, 1, 1)
    t2 = f64([40.0, 60.0, 80.0, 100.0, 120.0]).reshape(5, 1)  # with T1: voxel shape (4, 5), trailing axis 1
    te = f64([2.0, 3.0, 4.0])
    assert F.bssfp(f64(30.0), 6.0, te, T1=t1, T2=t2).shape == (4, 5, 3)
    assert F.spgr(f64(10.0), 8.0, te, T1=t1, T2star=t2).shape == (4, 5, 3)
    assert F.spgr(f64(10.0), 8.0, 3.0, T1=t1[..., 0], T2star=t2[..., 0]).shape == (4, 5)  # scalar protocol
    assert F.hsfp(f64([10.0, 20.0, 30.0, 20.0, 10.0, 5.0]), 5.0, T1=t1, T2=t2).shape == (4, 5, 6)
    recovery = f64([2000.0, 3000.0]).reshape(2, 1, 1, 1)  # one train per recovery, stacked first
    assert F.molli(f64(35.0), 900.0, (5, 3, 3), recovery, T1=t1).shape == (2, 4, 1, 11)
    assert F.mp2rage(f64([800.0, 2700.0]), 4.0, 6.9, 6000.0, 160, T1=t1).shape == (4, 1, 2)
    ff = f64([0.1, 0.2, 0.3, 0.4]).reshape(4, 1, 1)
    assert F.multigradientecho(te, T2star=t2, fat_fraction=ff).shape == (4, 5, 3)
    g = f64([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]])
    assert F.diffusion(f64([500.0, 1000.0, 1500.0]), g, Dxx=t1 / 1e3, Dyy=t2 / 1e2, Dzz=1.0).shape == (4, 5, 3)
    # Each sample is the elementwise value: compare one voxel against a scalar call.
    full = F.bssfp(f64(30.0), 6.0, te, T1=t1, T2=t2, B0=f64([0.0, 20.0, -40.0]))
    one = F.bssfp(f64(30.0), 6.0, te[1], T1=t1[2, 0, 0], T2=t2[3, 0], B0=20.0)
    assert rel_max_err(full[2, 3, 1], one) < REL


def test_gradients_through_autograd():
    opts = dict(dtype=F64, requires_grad=True)
    t1, t2, b0 = torch.tensor([700.0, 1200.0], **opts), torch.tensor([50.0, 90.0], **opts), torch.tensor(13.0, **opts)
    assert torch.autograd.gradcheck(lambda a, b, c: F.bssfp(f64(35.0), 5.0, 2.0, T1=a, T2=b, B0=c), (t1, t2, b0))
    assert torch.autograd.gradgradcheck(lambda a, b: F.bssfp(f64(35.0), 5.0, T1=a, T2=b), (t1, t2))
    ti = torch.tensor([800.0, 2700.0], **opts)
    assert torch.autograd.gradcheck(
        lambda a, t: F.mp2rage(t, f64([4.0, 5.0]), 6.9, 6000.0, 160, T1=a.reshape(-1, 1)), (t1, ti)
    )
    cbf, att = torch.tensor([[60.0], [30.0]], **opts), torch.tensor([[700.0], [1100.0]], **opts)
    times = f64([500.0, 900.0, 1500.0, 3000.0])
    for labelling in ("continuous", "pulsed"):
        assert torch.autograd.gradcheck(
            lambda c, a, lab=labelling: F.asl(times, 1000.0, CBF=c, ATT=a, T1=1300.0, labelling=lab), (cbf, att)
        )
    flips = torch.tensor([10.0, 40.0, 70.0, 30.0], **opts)
    assert torch.autograd.gradcheck(
        lambda f, a, b: F.hsfp(f, 5.0, T1=a.reshape(-1, 1), T2=b.reshape(-1, 1)), (flips, t1, t2)
    )
    ff = torch.tensor(0.3, **opts)
    assert torch.autograd.gradcheck(
        lambda f, c, b: F.multigradientecho(f64([1.0, 2.5, 4.0]), T2star=b, B0=c, fat_fraction=f), (ff, b0, t2[0])
    )


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: F.spgr(10.0, 10.0, 4.0, T1=f64([900.0, -1.0])), "T1 must be a time >= 0 ms.*index \\(1,\\)"),
        (lambda: F.bssfp(30.0, 5.0, T1=900.0, T2=float("nan")), "T2 must be"),
        (lambda: F.multigradientecho(f64([1.0, float("nan")])), "TE must be"),
        (lambda: F.asl(1000.0, 1800.0, CBF=60.0, ATT=-5.0, T1=1300.0), "ATT must be"),
        (lambda: F.asl(1000.0, 1800.0, CBF=60.0, ATT=5.0, T1=1300.0, T1_blood=-1.0), "T1_blood must be"),
        (lambda: F.asl(1000.0, 1800.0, CBF=60.0, ATT=5.0, T1=1300.0, labelling="velocity"), "labelling"),
        (lambda: F.irmultigradientecho(100.0, 1.0, T1=900.0, fat_T1=-3.0), "fat_T1 must be"),
        (lambda: F.inversion_recovery(f64([100.0, 900.0]), 500.0, T1=900.0), "each TR must be >= its TI"),
        (lambda: F.spin_echo(40.0, 10.0, T1=900.0, T2=80.0), "TR must be >= TE/2"),
        (lambda: F.looklocker(95.0, 10.0, 100.0, T1=900.0), "90 degrees"),
        (lambda: F.looklocker(5.0, 0.0, 100.0, T1=900.0), "TR must be > 0"),
        (lambda: F.molli(35.0, 900.0, (5, 0), 2000.0, T1=900.0), "readouts"),
        (lambda: F.molli(35.0, 900.0, (5, 3), 2000.0, T1=f64([900.0, 1000.0])), "trailing singleton"),
        (lambda: F.hsfp(30.0, 5.0, T1=900.0, T2=80.0), "flip array"),
        (lambda: F.diffusion(f64([0.0, 1000.0]), D=1.0, Dxx=1.0), "either D or the tensor"),
        (lambda: F.diffusion(f64([0.0, 1000.0]), Dxx=1.0), "directions"),
        (lambda: F.diffusion(f64([1000.0]), f64([[0.0, 0.0, 0.0]]), Dxx=1.0), "zero direction"),
        (lambda: F.diffusion(f64([-1.0]), D=1.0), "b must be a b-value"),
        (lambda: F.multigradientecho(1.0, fat_spectrum="olive_oil"), "fat_spectrum"),
        (lambda: F.lorentzian(0.0, amplitudes=[1.0], widths=[1.0, 2.0], shifts=[0.0]), "one value per pool"),
        (lambda: F.multiecho(10.0, T2=80.0, M0=1j), "M0 must be real"),
    ],
)
def test_validation_names_the_argument(call, match):
    with pytest.raises((ValueError, TypeError), match=match):
        call()


def test_zero_and_infinite_times_are_allowed():
    # T = 0 is clamped to 1e-6 ms (no NaN), inf means no relaxation (API.md 10).
    assert torch.isfinite(F.spgr(f64(10.0), 10.0, 0.0, T1=0.0, T2star=0.0)).all()
    assert float(F.multiecho(f64([0.0, 50.0]), T2=float("inf"))[1]) == 1.0
    assert torch.isfinite(F.irbssfp(f64(40.0), f64([0.0, 100.0]), T1=float("inf"), T2=50.0)).all()
