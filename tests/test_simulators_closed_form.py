"""The closed-form simulators (API.md 5.2) and their function forms (API.md 5.3).

Every class, and its function form called positionally in the order API.md 5.3 gives, is held to an
independent float64 computation (tests/_closed_forms.py, or here): the textbook formula in NumPy/math (Ernst, spin echo,
inversion recovery, multi-echo, double angle, diffusion tensor as g^T D g with the full 3x3 matrix,
Lorentzians, multi-peak fat summed peak by peak, Schmitt's IR-TrueFISP in its T1/T2 form, the MP2RAGE
signal equation of Marques 2010 with GRE2 propagated backwards from the steady state), a pulse-by-pulse
recursion (Look-Locker, MOLLI, HSFP), a 3x3 linear solve of the Bloch fixed point (bSSFP) or an adaptive
quadrature of the Buxton convolution (ASL). Float64 closed forms are held to REL = 1e-10 relative (round-off
of a few dozen float64 operations is ~1e-15; the margin covers cancellations such as 1 - E1 near E1 = 1).

The rest checks the public contract: shapes (voxel shape, then the broadcast of the protocol arrays),
dtypes (float32 by default, float64 in -> float64 out; complex for bSSFP, SPGR, MGRE and IR-MGRE), the
Jacobian's shapes and values (against central finite differences), reverse and second-order autograd,
the caller's array library, and the errors of API.md 10.
"""

from __future__ import annotations

import cmath
import inspect
import math

import _closed_forms as C
import numpy as np
import pytest
import torch
from conftest import f64, rel_max_err

from blochsim.simulators.asl import ASLSimulator, asl_sim
from blochsim.simulators.bssfp import IRbSSFPSimulator, bssfp_sim, bSSFPSimulator, irbssfp_sim
from blochsim.simulators.cest import LorentzianSimulator, lorentzian_sim
from blochsim.simulators.diffusion import TENSOR, DiffusionSimulator, diffusion_sim
from blochsim.simulators.gradient_echo import (
    FAT_SPECTRA,
    IRMultiGradientEchoSimulator,
    MultiGradientEchoSimulator,
    irmultigradientecho_sim,
    multigradientecho_sim,
)
from blochsim.simulators.hsfp import HSFPSimulator, hsfp_sim
from blochsim.simulators.looklocker import LookLockerSimulator, MOLLISimulator, looklocker_sim, molli_sim
from blochsim.simulators.mp2rage import MP2RAGESimulator, mp2rage_sim
from blochsim.simulators.relaxometry import (
    DoubleAngleSimulator,
    InversionRecoverySimulator,
    MultiEchoSimulator,
    SpinEchoSimulator,
    doubleangle_sim,
    inversionrecovery_sim,
    multiecho_sim,
    spinecho_sim,
)
from blochsim.simulators.spgr import SPGRSimulator, spgr_sim

F64 = torch.float64
DEG = math.pi / 180.0
REL = 1e-10  # see the module docstring

# The Jacobians are forward mode, which loads torch's forward-mode decompositions; they script with torch.jit:
# a deprecation warning of torch's, not ours.
pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")


def col(values) -> torch.Tensor:
    """A float64 column: voxels on axis 0, a singleton axis that broadcasts against a row."""
    return f64(values).reshape(-1, 1)


def exact(**values) -> dict:
    """Tissue values as float64 tensors. A Python number given for a tissue property becomes a float32 tensor
    (API.md 1.5: numbers count as float32), so 0.7 would enter a float64 computation as 0.699999988."""
    return {name: f64(value) for name, value in values.items()}


# -- signals against independent float64 references ---------------------------------------------------
def test_spgr_is_the_ernst_signal():
    flip, tr, te = [3.0, 12.0, 45.0], 8.0, 4.5
    t1, t2s, b0, cs = [300.0, 900.0, 1500.0, 2500.0], [20.0, 45.0, 80.0], -15.0, 12.0
    expected = np.zeros((4, 3, 3), complex)
    for i, j, k in np.ndindex(4, 3, 3):
        expected[i, j, k] = (0.7 * C.ernst(flip[k] * DEG, tr, t1[i]) * math.exp(-te / t2s[j])
                             * cmath.exp(2j * math.pi * (cs - b0) * te * 1e-3))
    tissue = exact(T1=col(t1), T2star=t2s, B0=b0, chemshift=cs, M0=0.7)
    signal = SPGRSimulator(flip=f64(flip), TR=tr, TE=te).simulate(**tissue)
    assert signal.dtype == torch.complex128 and rel_max_err(signal, expected) < REL
    assert rel_max_err(spgr_sim(f64(flip), te, tr, **tissue), expected) < REL
    # On resonance the value is the real, positive Ernst signal (API.md 1.6); without T2star no decay.
    plain = SPGRSimulator(flip=20.0, TR=10.0, TE=5.0).simulate(T1=f64(800.0))
    assert rel_max_err(plain, C.ernst(20 * DEG, 10.0, 800.0)) < REL


@pytest.mark.parametrize("phase_inc", [180.0, 90.0, 0.0])
def test_bssfp_against_the_bloch_fixed_point(phase_inc):
    flip, tr, te, cs = [20.0, 45.0, 70.0], 6.0, 2.5, 7.0
    t1, t2, b0 = [600.0, 1200.0], [40.0, 150.0], [-60.0, -11.0, 0.0, 23.0, 80.0]
    expected = np.zeros((2, 2, 5, 3), complex)
    for i, j, k, n in np.ndindex(*expected.shape):
        expected[i, j, k, n] = 1.3 * C.bssfp_fixed_point(flip[n], tr, te, t1[i], t2[j], b0[k], cs, phase_inc)
    tissue = exact(T1=f64(t1).reshape(2, 1, 1), T2=col(t2), B0=b0, chemshift=cs, M0=1.3)
    signal = bSSFPSimulator(flip=f64(flip), TR=tr, TE=te, phase_inc=phase_inc).simulate(**tissue)
    assert signal.dtype == torch.complex128 and signal.shape == (2, 2, 5, 3) and rel_max_err(signal, expected) < REL
    positional = bssfp_sim(f64(flip), te, tr, tissue["T1"], tissue["T2"], None, phase_inc, f64(b0), cs, f64(1.3))
    assert rel_max_err(positional, expected) < REL


def test_bssfp_published_value():
    # API.md 5.2: 0.1332 (+i on resonance) at T1/T2 = 1000/100, 60 degrees, TR 10, TE 5; the incumbent gives
    # 0.2111. Float32 by default: round-off ~1e-7 of the value.
    value = complex(bSSFPSimulator(flip=60.0, TR=10.0, TE=5.0).simulate(T1=1000.0, T2=100.0))
    assert abs(value - 0.1332j) < 5e-5 and abs(value.real) < 1e-6
    exact = complex(bssfp_sim(60.0, 5.0, 10.0, f64(1000.0), 100.0))
    # Two float64 evaluations of one closed form: tens of ulp of 0.13 apart (1.3e-15 seen on one machine's libm).
    assert abs(exact - C.bssfp_fixed_point(60.0, 10.0, 5.0, 1000.0, 100.0, 0.0, 0.0, 180.0)) < 1e-14
    # TE defaults to TR/2: the function form's TE=None is dropped, so the class default applies.
    assert complex(bssfp_sim(60.0, None, 10.0, f64(1000.0), 100.0)) == exact


def test_irbssfp_schmitt():
    flip, ti = 50.0, [0.0, 50.0, 300.0, 1000.0, 4000.0]
    t1, t2, b1, eff = [800.0, 1400.0], 90.0, 0.9, 0.95
    expected = np.zeros((2, 5))
    for i, k in np.ndindex(2, 5):
        expected[i, k] = 2.0 * C.ir_truefisp(b1 * flip * DEG, ti[k], t1[i], t2, eff)
    tissue = exact(T1=f64(t1), T2=t2, B1=b1, inv_efficiency=eff, M0=2.0)
    assert rel_max_err(IRbSSFPSimulator(flip=flip, TI=f64(ti)).simulate(**tissue), expected) < REL
    assert rel_max_err(irbssfp_sim(flip, f64(ti), f64(t1), t2, None, f64(b1), f64(eff), 2.0), expected) < REL


@pytest.mark.parametrize("spectrum", sorted(FAT_SPECTRA))
def test_multigradientecho_multipeak_fat(spectrum):
    te, ff, t2s, fat_t2s, b0, phase, field = [1.1, 2.3, 3.5, 4.7], [0.0, 0.2, 0.6], 30.0, 15.0, 25.0, 20.0, 1.5
    expected = [[C.water_fat(t, peaks=FAT_SPECTRA[spectrum], fat_fraction=f, fat_phase_deg=phase, b0_hz=b0, t2s_ms=t2s,
                             fat_t2s_ms=fat_t2s, field_t=field) for t in te] for f in ff]
    expected = 0.8 * np.array(expected)
    tissue = exact(fat_fraction=f64(ff), T2star=t2s, fat_T2star=fat_t2s, B0=b0, fat_phase=phase, M0=0.8)
    sim = MultiGradientEchoSimulator(TE=f64(te), field_strength=field, fat_spectrum=spectrum)
    assert rel_max_err(sim.simulate(**tissue), expected) < REL
    form = multigradientecho_sim(f64(te), None, field, spectrum, t2s, fat_t2s, f64(ff), phase, b0, f64(0.8))
    assert rel_max_err(form, expected) < REL
    # The fat peaks alias at 3 T: with ff = 1 and no decay |S| < 1 away from TE = 0 (the peaks dephase).
    pure = MultiGradientEchoSimulator(TE=f64([0.0, 1.2])).simulate(fat_fraction=1.0)
    assert abs(float(pure[0].abs()) - 1) < 1e-12 and float(pure[1].abs()) < 0.9


def test_irmultigradientecho_each_species_recovers_then_decays():
    ti, te = [100.0, 100.0, 600.0, 600.0], [1.2, 2.4, 1.2, 2.4]  # a flattened (TI, TE) grid
    t1, fat_t1, eff, fat_eff, ff, t2s = [900.0, 1500.0], 300.0, 0.95, 0.9, 0.3, 35.0
    expected = np.zeros((2, 4), complex)
    for i, k in np.ndindex(2, 4):
        water = (1 - ff) * C.inversion_recovery(ti[k], t1[i], eff)
        fat = ff * C.inversion_recovery(ti[k], fat_t1, fat_eff)
        expected[i, k] = C.water_fat(te[k], peaks=FAT_SPECTRA["hamilton2011"], fat_fraction=ff, fat_phase_deg=0.0,
                                     b0_hz=10.0, t2s_ms=t2s, fat_t2s_ms=t2s, field_t=3.0, water=water, fat=fat)
    tissue = exact(T1=f64(t1), fat_T1=fat_t1, inv_efficiency=eff, fat_inv_efficiency=fat_eff, fat_fraction=ff,
                   T2star=t2s, B0=10.0)
    assert rel_max_err(IRMultiGradientEchoSimulator(TI=f64(ti), TE=f64(te)).simulate(**tissue), expected) < REL
    form = irmultigradientecho_sim(f64(ti), f64(te), f64(t1), None, 3.0, "hamilton2011", t2s, fat_t1, None,
                                   f64(eff), f64(fat_eff), f64(ff), 0.0, 10.0)
    assert rel_max_err(form, expected) < REL


def test_hsfp_periodic_steady_state():
    flips, tr, t1, t2, beta = [10.0, 40.0, 70.0, 50.0, 20.0, 5.0], 5.0, [700.0, 1300.0], 60.0, -1.0
    # 400 passes: the start converges like (beta prod A)^k, here < 0.92^k: 1e-14 by 400.
    expected = [C.hsfp_periodic_state(flips, tr, t, t2, beta, passes=400) for t in t1]
    assert rel_max_err(HSFPSimulator(flip=f64(flips), TR=tr).simulate(T1=f64(t1), T2=t2), expected) < 1e-9
    assert rel_max_err(hsfp_sim(f64(flips), tr, f64(t1), t2), expected) < 1e-9


def test_looklocker_is_exact_on_the_pulse_grid():
    flip, tr, t1, b1, eff = 8.0, 50.0, [600.0, 1100.0], 0.9, 0.97
    ti = f64([0.0, 50.0, 200.0, 1000.0, 3000.0])  # multiples of TR: pulses 0, 1, 4, 20, 60
    a = b1 * flip * DEG
    expected = [[C.look_locker_mz(-eff, a, tr, t, 61)[0][int(x) // 50] * math.sin(a) for x in ti] for t in t1]
    tissue = exact(T1=f64(t1), B1=b1, inv_efficiency=eff)
    assert rel_max_err(LookLockerSimulator(flip=flip, TR=tr, TI=ti).simulate(**tissue), expected) < REL
    assert rel_max_err(looklocker_sim(flip, tr, ti, f64(t1), None, False, False, f64(b1), f64(eff)), expected) < REL
    # from_steady_state: the inversion acts on the train's own steady state (a train run to convergence).
    steady = [C.look_locker_mz(1.0, a, tr, t, 2000)[1] for t in t1]
    expected = [[C.look_locker_mz(-eff * s, a, tr, t, 61)[0][int(x) // 50] * math.sin(a) for x in ti]
                for t, s in zip(t1, steady, strict=True)]
    out = LookLockerSimulator(flip=flip, TR=tr, TI=ti, from_steady_state=True).simulate(**tissue)
    assert rel_max_err(out, expected) < 1e-9
    # short_TR: the continuous-readout limit M_ss = R1/R1* (Deichmann & Haase 1992).
    t = 1100.0
    expected = [C.look_locker_continuous(flip * DEG, tr, x, t, 1.0) for x in ti.tolist()]
    assert rel_max_err(looklocker_sim(flip, tr, ti, f64(t), short_TR=True), expected) < REL


def test_molli_blocks_with_free_recovery():
    flip, tr, readouts, recovery, t1, eff = 35.0, 900.0, (5, 3, 3), 2500.0, [400.0, 1200.0], 0.96
    expected = [[mz * math.sin(flip * DEG) for mz in C.molli_mz(flip * DEG, tr, readouts, recovery, t, eff)]
                for t in t1]
    tissue = exact(T1=f64(t1), inv_efficiency=eff)
    sim = MOLLISimulator(flip=flip, TR=tr, readouts=readouts, recovery=recovery)
    assert rel_max_err(sim.simulate(**tissue), expected) < REL
    assert rel_max_err(molli_sim(flip, tr, list(readouts), recovery, f64(t1), inv_efficiency=f64(eff)), expected) < REL
    # A 1-D flip is one train per entry, stacked first.
    trains = sim.simulate(flip=f64([35.0, 20.0]), **tissue)
    assert trains.shape == (2, 2, 11) and rel_max_err(trains[0], expected) < REL


@pytest.mark.parametrize("nshots, split", [(176, (88, 88)), ((60, 100), (60, 100))])
def test_mp2rage_signal_equation(nshots, split):
    ti, flips, tr, tr_mp2rage, t1, eff = [900.0, 2750.0], [4.0, 5.0], 7.0, 6250.0, [700.0, 1400.0, 4000.0], 0.96
    expected = 1.5 * np.array([C.mp2rage_signal_equation(ti, flips, tr, tr_mp2rage, *split, t, eff) for t in t1])
    sim = MP2RAGESimulator(TI=ti, flip=flips, TRspgr=tr, TRmp2rage=tr_mp2rage, nshots=nshots)
    signal = sim.simulate(**exact(T1=t1, inv_efficiency=eff, M0=1.5))
    assert signal.dtype == F64 and signal.shape == (3, 2) and rel_max_err(signal, expected) < REL
    assert float(signal[2, 0]) < 0 < float(signal[2, 1])  # GRE1 while a long T1 is still inverted
    form = mp2rage_sim(f64(ti), f64(flips), tr, tr_mp2rage, nshots, f64(t1), None, f64(eff), 1.5)
    assert rel_max_err(form, expected) < REL
    assert sim.simulate(T1=1000.0, phases=30.0).shape == (2,)  # phases reach the event train only


def test_relaxometry_textbook_formulas():
    ti, tr, t1, eff = [50.0, 300.0, 900.0, 2000.0], 3000.0, [500.0, 1300.0], 0.93
    # Inversion recovery: the readout at TI saturates; Mz recovers for TR - TI, is inverted, recovers for TI.
    expected = [[C.inversion_recovery(x, t, eff, tr) + 0.05 for x in ti] for t in t1]
    tissue = exact(T1=f64(t1), inv_efficiency=eff, offset=0.05)
    assert rel_max_err(InversionRecoverySimulator(TI=f64(ti), TR=tr).simulate(**tissue), expected) < REL
    assert rel_max_err(inversionrecovery_sim(f64(ti), f64(t1), None, tr, f64(eff), f64(0.05)), expected) < REL
    full = [[C.inversion_recovery(x, t, eff) for x in ti] for t in t1]  # no TR: full recovery
    assert rel_max_err(inversionrecovery_sim(f64(ti), f64(t1), inv_efficiency=f64(eff)), full) < REL
    # Multi-echo.
    te, t2 = [10.0, 20.0, 40.0, 80.0], [30.0, 90.0]
    expected = [[2.0 * math.exp(-x / t) - 0.1 for x in te] for t in t2]
    multiecho = MultiEchoSimulator(TE=f64(te)).simulate(**exact(T2=f64(t2), M0=2.0, offset=-0.1))
    assert rel_max_err(multiecho, expected) < REL
    assert rel_max_err(multiecho_sim(f64(te), f64(t2), None, f64(-0.1), 2.0), expected) < REL
    # Spin echo: 90 (Mz = 0), TE/2 of recovery, 180 (Mz -> -Mz), TR - TE/2 of recovery, the next 90.
    te, tr, t2 = [10.0, 30.0, 80.0], 800.0, 70.0
    expected = [[C.spin_echo(x, tr, t, t2) for x in te] for t in t1]
    assert rel_max_err(SpinEchoSimulator(TE=f64(te), TR=tr).simulate(T1=f64(t1), T2=t2), expected) < REL
    assert rel_max_err(spinecho_sim(f64(te), tr, f64(t1), t2), expected) < REL
    expected = [[C.spin_echo(x, tr, t, t2) * C.inversion_recovery(400.0, t, eff) for x in te] for t in t1]
    assert rel_max_err(spinecho_sim(f64(te), tr, f64(t1), t2, None, 400.0, f64(eff)), expected) < REL
    # Double angle.
    b1 = [0.7, 1.0, 1.25]
    expected = [[0.9 * math.sin(b * a * DEG) for a in (60.0, 120.0)] for b in b1]
    double_angle = DoubleAngleSimulator(flip=f64([60.0, 120.0])).simulate(**exact(B1=f64(b1), M0=0.9))
    assert rel_max_err(double_angle, expected) < REL
    assert rel_max_err(doubleangle_sim(f64([60.0, 120.0]), f64(b1), None, f64(0.9)), expected) < REL


def test_diffusion_isotropic_and_tensor():
    b = [0.0, 500.0, 1000.0, 1000.0, 2000.0]
    g = [[0.0, 0.0, 0.0], [1.0, 0.0, 0.0], [0.0, 2.0, 0.0], [1.0, 1.0, 1.0], [1.0, -2.0, 0.5]]  # unnormalised
    d = [0.7, 1.5, 3.0]
    expected = [[0.9 * math.exp(-x * 1e-3 * y) for x in b] for y in d]
    assert rel_max_err(DiffusionSimulator(b=f64(b)).simulate(**exact(D=f64(d), M0=0.9)), expected) < REL
    assert rel_max_err(diffusion_sim(f64(b), None, None, f64(d), f64(0.9)), expected) < REL
    components = dict(Dxx=1.7, Dyy=0.4, Dzz=0.3, Dxy=0.1, Dxz=-0.05, Dyz=0.02)
    tensor = np.array([[1.7, 0.1, -0.05], [0.1, 0.4, 0.02], [-0.05, 0.02, 0.3]])
    expected = [1.0] + [C.diffusion_tensor(b[j], g[j], tensor) for j in range(1, 5)]
    tissue = {name: f64(components[name]) for name in TENSOR}
    assert rel_max_err(DiffusionSimulator(b=f64(b), directions=f64(g)).simulate(**tissue), expected) < REL
    assert rel_max_err(diffusion_sim(f64(b), None, f64(g), **tissue), expected) < REL


@pytest.mark.parametrize("labelling", ["continuous", "pulsed"])
def test_asl_buxton_kinetic_model(labelling):
    t, tau, cbf, att, t1, m0 = [0.0, 700.0, 1500.0, 2600.0, 4000.0], 1800.0, [60.0, 20.0], [600.0, 1300.0], 1330.0, 1.1
    alpha = 0.85 if labelling == "continuous" else 0.98  # the default efficiency of each labelling
    expected = [[C.buxton_asl(x, tau, c, a, t1, m0, 1650.0, 0.9, alpha, labelling) for x in t]
                for c, a in zip(cbf, att, strict=True)]
    sim = ASLSimulator(t=f64(t), tau=tau, labelling=labelling)
    signal = sim.simulate(**exact(CBF=f64(cbf), ATT=f64(att), T1=t1, M0=m0))
    assert rel_max_err(signal, expected) < 1e-10 and float(signal[1, 1]) == 0.0  # before the bolus arrives
    assert rel_max_err(asl_sim(f64(t), tau, f64(cbf), f64(att), t1, None, labelling, None, f64(m0)), expected) < 1e-10
    expected = [[C.buxton_asl(x, tau, c, a, t1, m0, 1500.0, 0.98, 0.7, labelling) for x in t]
                for c, a in zip(cbf, att, strict=True)]
    form = asl_sim(f64(t), tau, f64(cbf), f64(att), t1, None, labelling, 0.7, f64(m0), 1500.0, f64(0.98))
    assert rel_max_err(form, expected) < 1e-10


def test_lorentzian_pools():
    offsets = np.linspace(-6.0, 6.0, 13)
    pools = {1: (0.8, 1.5, 0.0), 2: (0.1, 0.8, 3.5), 3: (0.05, 3.0, -2.5)}
    expected = [C.lorentzian_z(x, pools.values(), 0.9) for x in offsets]
    tissue = {f"pool{k}_{part}": f64(v) for k, values in pools.items()
              for part, v in zip(("amplitude", "width", "shift"), values, strict=True)}
    sim = LorentzianSimulator(3, offsets=offsets)
    assert sim.exposes == ("M0", *tissue)
    assert rel_max_err(sim.simulate(M0=f64(0.9), **tissue), expected) < REL
    assert rel_max_err(lorentzian_sim(f64(offsets), 3, None, f64(0.9), **tissue), expected) < REL
    assert rel_max_err(LorentzianSimulator(offsets=offsets).simulate(**{k: v for k, v in tissue.items() if "1" in k}),
                       [C.lorentzian_z(x, [pools[1]]) for x in offsets]) < REL


# -- the function forms' signatures (API.md 5.3) ---------------------------------------------------------
SIGNATURES = {
    asl_sim: "t, tau, CBF, ATT, T1, diff=None, labelling='continuous', efficiency=None, M0=1.0, T1_blood=1650.0, "
             "partition=0.9, device=None, **values",
    bssfp_sim: "flip, TE, TR, T1, T2, diff=None, phase_inc=180.0, B0=0.0, chemshift=0.0, M0=1.0, device=None, "
               "**values",
    spgr_sim: "flip, TE, TR, T1, T2star, diff=None, B0=0.0, chemshift=0.0, M0=1.0, device=None, **values",
    mp2rage_sim: "TI, flip, TRspgr, TRmp2rage, nshots, T1, diff=None, inv_efficiency=1.0, M0=1.0, device=None, "
                 "**values",
    lorentzian_sim: "offsets, pools=1, diff=None, M0=1.0, device=None, **values",
    diffusion_sim: "b, diff=None, directions=None, D=None, M0=1.0, device=None, **values",
    doubleangle_sim: "flip, B1, diff=None, M0=1.0, device=None, **values",
    hsfp_sim: "flip, TR, T1, T2, diff=None, beta=-1.0, M0=1.0, device=None, **values",
    inversionrecovery_sim: "TI, T1, diff=None, TR=None, inv_efficiency=1.0, offset=0.0, M0=1.0, device=None, "
                           "**values",
    irbssfp_sim: "flip, TI, T1, T2, diff=None, B1=1.0, inv_efficiency=1.0, M0=1.0, device=None, **values",
    irmultigradientecho_sim: "TI, TE, T1, diff=None, field_strength=3.0, fat_spectrum='hamilton2011', T2star=None, "
                             "fat_T1=None, fat_T2star=None, inv_efficiency=1.0, fat_inv_efficiency=None, "
                             "fat_fraction=0.0, fat_phase=0.0, B0=0.0, M0=1.0, device=None, **values",
    looklocker_sim: "flip, TR, TI, T1, diff=None, short_TR=False, from_steady_state=False, B1=1.0, "
                    "inv_efficiency=1.0, M0=1.0, device=None, **values",
    molli_sim: "flip, TR, readouts, recovery, T1, diff=None, short_TR=False, B1=1.0, inv_efficiency=1.0, M0=1.0, "
               "device=None, **values",
    multiecho_sim: "TE, T2, diff=None, offset=0.0, M0=1.0, device=None, **values",
    multigradientecho_sim: "TE, diff=None, field_strength=3.0, fat_spectrum='hamilton2011', T2star=None, "
                           "fat_T2star=None, fat_fraction=0.0, fat_phase=0.0, B0=0.0, M0=1.0, device=None, **values",
    spinecho_sim: "TE, TR, T1, T2, diff=None, TI=None, inv_efficiency=1.0, M0=1.0, device=None, **values",
}


@pytest.mark.parametrize("form", list(SIGNATURES), ids=lambda f: f.__name__)
def test_function_form_signature(form):
    assert str(inspect.signature(form)) == f"({SIGNATURES[form]})"
    assert form.__module__ == f"blochsim.simulators.{form.__module__.rsplit('.', 1)[-1]}"


# -- one call per class, for the contract tests --------------------------------------------------------------
T1_COL = [[800.0], [1000.0], [1200.0], [1400.0]]  # (4, 1): with a (5,) property the voxel shape is (4, 5)
ROW = [0.5, 0.7, 0.9, 1.1, 1.3]

CASES = {  # name: (simulator, tissue as {name: (values, scale)}, names to differentiate, complex?)
    "ASL": (ASLSimulator(t=[500.0, 1500.0, 2500.0], tau=1800.0),
            dict(CBF=(ROW, 60.0), ATT=(T1_COL, 0.7), T1=(1300.0, 1.0)), ("CBF", "ATT", "T1"), False),
    "bSSFP": (bSSFPSimulator(flip=[30.0, 60.0], TR=5.0),
              dict(T1=(T1_COL, 1.0), T2=(ROW, 80.0), B0=(10.0, 1.0), M0=(1.0, 1.0)), ("T1", "T2", "B0", "M0"), True),
    "IRbSSFP": (IRbSSFPSimulator(flip=60.0, TI=[100.0, 500.0]),
                dict(T1=(T1_COL, 1.0), T2=(ROW, 80.0), B1=(0.9, 1.0)), ("T1", "T2", "B1"), False),
    "SPGR": (SPGRSimulator(flip=[5.0, 10.0], TR=10.0, TE=4.0),
             dict(T1=(T1_COL, 1.0), T2star=(ROW, 40.0), chemshift=(5.0, 1.0)), ("T1", "T2star", "chemshift"), True),
    "MGRE": (MultiGradientEchoSimulator(TE=[1.0, 2.0, 3.0]),
             dict(T2star=(T1_COL, 0.03), fat_fraction=(ROW, 0.2), B0=(3.0, 1.0), fat_phase=(10.0, 1.0)),
             ("T2star", "fat_fraction", "B0", "fat_phase"), True),
    "IRMGRE": (IRMultiGradientEchoSimulator(TI=[100.0, 100.0, 500.0], TE=[1.0, 2.0, 1.0]),
               dict(T1=(T1_COL, 1.0), fat_fraction=(ROW, 0.2), fat_T1=(300.0, 1.0)), ("T1", "fat_fraction", "fat_T1"),
               True),
    "HSFP": (HSFPSimulator(flip=[10.0, 40.0, 70.0, 30.0], TR=5.0), dict(T1=(T1_COL, 1.0), T2=(ROW, 80.0)),
             ("T1", "T2"), False),
    "LookLocker": (LookLockerSimulator(flip=8.0, TR=50.0, TI=[0.0, 100.0, 400.0]),
                   dict(T1=(T1_COL, 1.0), B1=(ROW, 0.9), inv_efficiency=(0.95, 1.0)), ("T1", "B1", "inv_efficiency"),
                   False),
    "MOLLI": (MOLLISimulator(flip=35.0, TR=900.0, readouts=(5, 3, 3), recovery=2000.0),
              dict(T1=(T1_COL, 1.0), B1=(ROW, 0.9)), ("T1", "B1"), False),
    "InversionRecovery": (InversionRecoverySimulator(TI=[100.0, 500.0], TR=3000.0),
                          dict(T1=(T1_COL, 1.0), offset=(ROW, 0.1)), ("T1", "offset"), False),
    "MultiEcho": (MultiEchoSimulator(TE=[10.0, 20.0]), dict(T2=(T1_COL, 0.1), M0=(ROW, 2.0)), ("T2", "M0"), False),
    "SpinEcho": (SpinEchoSimulator(TE=[10.0, 20.0], TR=1000.0, TI=300.0),
                 dict(T1=(T1_COL, 1.0), T2=(ROW, 80.0), inv_efficiency=(0.9, 1.0)), ("T1", "T2", "inv_efficiency"),
                 False),
    "DoubleAngle": (DoubleAngleSimulator(flip=[60.0, 120.0]), dict(B1=(T1_COL, 1e-3), M0=(ROW, 2.0)), ("B1", "M0"),
                    False),
    "Diffusion": (DiffusionSimulator(b=[0.0, 1000.0]), dict(D=(T1_COL, 1e-3), M0=(ROW, 2.0)), ("D", "M0"), False),
    "DiffusionTensor": (DiffusionSimulator(b=[0.0, 1000.0, 1000.0], directions=[[1.0, 0, 0], [1.0, 1.0, 0],
                                                                                 [0, 1.0, 0]]),
                        dict(Dxx=(T1_COL, 1e-3), Dyy=(ROW, 2.0), Dxy=(0.1, 1.0)), ("Dxx", "Dyy", "Dxy"), False),
    "Lorentzian": (LorentzianSimulator(2, offsets=[-3.0, 0.0, 3.0]),
                   dict(pool1_amplitude=(0.9, 1.0), pool1_width=(T1_COL, 1e-3), pool1_shift=(0.1, 1.0),
                        pool2_amplitude=(ROW, 0.1), pool2_width=(1.0, 1.0), pool2_shift=(3.5, 1.0)),
                   ("pool1_width", "pool2_amplitude", "pool1_shift"), False),
    "MP2RAGE": (MP2RAGESimulator(TI=[800.0, 2700.0], flip=[4.0, 5.0], TRspgr=6.9, TRmp2rage=6000.0, nshots=160),
                dict(T1=(T1_COL, 1.0), M0=(ROW, 2.0), inv_efficiency=(0.95, 1.0)), ("T1", "M0", "inv_efficiency"),
                False),
}
SAMPLES = {"ASL": 3, "bSSFP": 2, "IRbSSFP": 2, "SPGR": 2, "MGRE": 3, "IRMGRE": 3, "HSFP": 4, "LookLocker": 3,
           "MOLLI": 11, "InversionRecovery": 2, "MultiEcho": 2, "SpinEcho": 2, "DoubleAngle": 2, "Diffusion": 2,
           "DiffusionTensor": 3, "Lorentzian": 3, "MP2RAGE": 2}


def tissue_of(name, dtype=F64):
    return {key: torch.as_tensor(values, dtype=dtype) * scale for key, (values, scale) in CASES[name][1].items()}


@pytest.mark.parametrize("name", sorted(CASES))
def test_shapes_and_dtypes(name):
    sim, spec, _, is_complex = CASES[name]
    low = sim.simulate(**{key: (np.asarray(v) * s).tolist() for key, (v, s) in spec.items()})  # lists and numbers
    high = sim.simulate(**tissue_of(name))
    assert low.shape == high.shape == (4, 5, SAMPLES[name])  # (4, 1) x (5,) tissue, then the samples
    assert low.dtype == (torch.complex64 if is_complex else torch.float32)
    assert high.dtype == (torch.complex128 if is_complex else torch.float64)
    assert rel_max_err(low, high) < 1e-5  # float32 round-off of the same computation
    # A float64 protocol array promotes float32 tissue too.
    protocol = {key: np.asarray(value, dtype=np.float64) for key, value in sim.protocol.items()
                if isinstance(value, list) and key not in ("readouts", "nshots")}
    if protocol:
        assert sim.simulate(**tissue_of(name, torch.float32), **protocol).dtype == high.dtype
    # Scalar tissue: no voxel axis.
    scalar = sim.simulate(**{key: float(np.ravel(v)[0]) * s for key, (v, s) in spec.items()})
    assert scalar.shape == (SAMPLES[name],)


def test_sample_axis_rule():
    sim = SPGRSimulator(flip=10.0, TR=10.0, TE=5.0)
    t1, t2s = torch.full((4, 1), 900.0), torch.full((5,), 40.0)
    assert sim.simulate(T1=t1, T2star=t2s).shape == (4, 5)  # a scalar protocol gives no sample axis
    assert sim.simulate(T1=900.0).shape == ()
    assert sim.simulate(T1=t1, T2star=t2s, TE=[2.0, 4.0, 6.0]).shape == (4, 5, 3)
    assert sim.simulate(T1=t1, flip=torch.ones(3, 1) * 10, TE=[2.0, 4.0]).shape == (4, 1, 3, 2)  # 2-D samples
    assert sim.simulate(T1=torch.full((7, 1), 900.0), TE=[2.0, 4.0]).shape == (7, 1, 2)  # [fix]: not (7, 1, 1, 2)
    assert MultiGradientEchoSimulator(TE=[1.0, 2.0]).simulate().shape == (2,)  # no tissue at all
    assert MultiEchoSimulator(TE=20.0).simulate(T2=80.0).shape == ()
    # MP2RAGE always has its two samples; MOLLI sum(readouts), whatever the protocol's arrays.
    assert MP2RAGESimulator(TI=[800.0, 2700.0], flip=4.0, TRspgr=6.9, TRmp2rage=6000.0,
                            nshots=(80, 80)).simulate(T1=1000.0).shape == (2,)
    assert MOLLISimulator(flip=35.0, TR=900.0, readouts=(3, 5), recovery=[1000.0, 2000.0, 3000.0]).simulate(
        T1=t1, M0=t2s).shape == (3, 4, 5, 8)


@pytest.mark.parametrize("name", sorted(CASES))
def test_jacobian_against_finite_differences(name):
    sim, _, names, _ = CASES[name]
    tissue = tissue_of(name)
    signal, jac = sim.jacobian(names, **tissue)
    assert jac.shape == (4, 5, len(names), SAMPLES[name]) and jac.dtype == signal.dtype
    assert torch.equal(signal, sim.simulate(**tissue))
    for p, key in enumerate(names):
        h = 1e-6 * max(float(tissue[key].abs().max()), 1.0)  # central difference: error ~h^2 f''' + 1e-16 f / h
        up = sim.simulate(**{**tissue, key: tissue[key] + h})
        down = sim.simulate(**{**tissue, key: tissue[key] - h})
        assert rel_max_err(jac[..., p, :], (up - down) / (2 * h)) < 1e-6, key
    single_signal, single = sim.jacobian(names[0], **tissue)  # a name, not a sequence: no P axis
    assert single.shape == (4, 5, SAMPLES[name]) and torch.equal(single, jac[..., 0, :])


def test_jacobian_of_a_scalar_protocol_and_the_function_forms():
    _, jac = SPGRSimulator(flip=10.0, TR=10.0, TE=5.0).jacobian(("T1", "M0"), T1=f64([900.0, 1200.0]), M0=1.0)
    assert jac.shape == (2, 2)  # (*voxel, P): no sample axis
    signal, jac = spgr_sim(f64([5.0, 10.0]), 4.0, 10.0, f64([900.0, 1200.0]), 40.0, diff=("T1", "M0"))
    assert jac.shape == (2, 2, 2)
    assert rel_max_err(jac[:, 1], signal) < REL  # d/dM0 of M0 S is S; M0 was differentiated at its default 1.0
    _, jac = bssfp_sim(60.0, 5.0, 10.0, f64(1000.0), 100.0, diff="B0")
    assert jac.shape == () and jac.dtype == torch.complex128
    _, jac = lorentzian_sim([0.0, 1.0], 1, "pool1_width", pool1_amplitude=0.5, pool1_width=f64(1.0), pool1_shift=0.0)
    assert rel_max_err(jac, [0.0, -0.5 * 0.5 * 1.0 / (0.25 + 1.0) ** 2]) < REL  # -A (W/2) x^2 / ((W/2)^2 + x^2)^2


def test_reverse_mode_reaches_protocol_and_tissue_and_second_order():
    flip = f64([5.0, 10.0, 20.0]).requires_grad_()
    t1 = f64([900.0, 1200.0]).requires_grad_()
    sim = SPGRSimulator(TR=10.0, TE=4.0)
    sim.simulate(flip=flip, T1=t1, T2star=40.0).abs().sum().backward()
    assert flip.grad.shape == (3,) and t1.grad.shape == (2,) and bool((flip.grad != 0).all())
    # A Jacobian inside a cost, then backward (forward-over-reverse): the design gradient reaches the flips.
    flip.grad = None
    _, jac = sim.jacobian(("T1", "T2star"), flip=flip, T1=f64([900.0, 1200.0]), T2star=f64(40.0))
    cost = (jac.abs() ** 2).sum()
    (grad,) = torch.autograd.grad(cost, flip)
    h = 1e-4
    numeric = []
    for k in range(3):
        step = torch.zeros(3, dtype=F64)
        step[k] = h
        costs = [(sim.jacobian(("T1", "T2star"), flip=flip.detach() + s, T1=f64([900.0, 1200.0]),
                               T2star=f64(40.0))[1].abs() ** 2).sum() for s in (step, -step)]
        numeric.append((costs[0] - costs[1]) / (2 * h))
    assert rel_max_err(grad, torch.stack(numeric)) < 1e-6


def test_numpy_in_numpy_out():
    sim = MultiEchoSimulator(TE=[10.0, 20.0])
    out = sim.simulate(T2=np.array([40.0, 80.0]))
    assert isinstance(out, np.ndarray) and out.dtype == np.float64 and out.shape == (2, 2)
    signal, jac = sim.jacobian("T2", T2=np.array([40.0, 80.0]))
    assert isinstance(signal, np.ndarray) and isinstance(jac, np.ndarray)
    assert isinstance(sim.simulate(T2=80.0), torch.Tensor)  # no array anywhere: torch
    assert isinstance(MultiEchoSimulator(TE=np.array([10.0])).simulate(T2=80.0), np.ndarray)  # bound arrays decide
    assert isinstance(multiecho_sim(np.array([10.0, 20.0]), 80.0), np.ndarray)
    spgr = spgr_sim(np.array([10.0]), 4.0, 10.0, 900.0, 40.0)
    assert isinstance(spgr, np.ndarray) and spgr.dtype == np.complex128


def test_complex_m0_and_the_device_setting():
    # MGRE's M0 is a complex scale (a receive phase); complex64 keeps the float32 computation.
    sim = MultiGradientEchoSimulator(TE=[1.0, 2.0])
    plain = sim.simulate(T2star=30.0)
    scaled = sim.simulate(T2star=30.0, M0=torch.tensor(0.6 + 0.8j, dtype=torch.complex64))
    assert scaled.dtype == torch.complex64 and rel_max_err(scaled, plain * (0.6 + 0.8j)) < 1e-6
    with pytest.raises(ValueError, match="real float property"):
        sim.jacobian("M0", T2star=30.0, M0=torch.tensor(0.6 + 0.8j))
    assert spgr_sim([5.0, 10.0], 4.0, 10.0, 900.0, 40.0, device="cpu").device.type == "cpu"


def test_bind_and_fixed_values():
    sim = SpinEchoSimulator(TR=1000.0, T2=80.0).bind(TE=[10.0, 20.0])
    assert dict(sim.protocol) == {"TR": 1000.0, "TE": [10.0, 20.0]} and dict(sim.bound) == {"T2": 80.0}
    assert sim.variables == () and sim.accepts == sim.exposes == ("T1", "T2", "M0", "inv_efficiency")
    assert rel_max_err(sim.simulate(T1=f64(900.0)), spinecho_sim(f64([10.0, 20.0]), 1000.0, f64(900.0), 80.0)) < 1e-7


# -- errors (API.md 10) --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "call, error, match",
    [
        (lambda: SPGRSimulator(flip=10.0, TR=10.0, TE=4.0).simulate(T1=900.0, B1=0.9), TypeError,
         "SPGRSimulator is a closed form and does not model 'B1'; it models: T1, T2star, M0, B0, chemshift"),
        (lambda: SPGRSimulator(B1=0.9), TypeError, "does not model 'B1'"),
        (lambda: MultiEchoSimulator(TE=10.0).simulate(T2=80.0, T1=900.0), TypeError, "does not model 'T1'"),
        (lambda: MultiEchoSimulator(TE=10.0).simulate(T22=80.0), TypeError, "did you mean 'T2'"),
        (lambda: SPGRSimulator(flip=10.0, TR=10.0).simulate(T1=900.0), TypeError,
         "SPGRSimulator needs 'TE' \\(ms\\).*call.*constructor.*bind"),
        (lambda: bSSFPSimulator(flip=10.0, TR=10.0).simulate(T1=900.0), TypeError,
         "bSSFPSimulator needs 'T2' \\(ms\\)"),
        (lambda: asl_sim(1000.0, 1800.0, 60.0, None, 1300.0), TypeError, "ASLSimulator needs 'ATT' \\(ms\\)"),
        (lambda: DiffusionSimulator(b=1000.0).simulate(M0=1.0), TypeError, "needs 'D'.*Dxx"),
        (lambda: LorentzianSimulator(2, offsets=0.0).simulate(pool1_amplitude=1.0, pool1_width=1.0, pool1_shift=0.0),
         TypeError, "needs 'pool2_amplitude'"),
        (lambda: LorentzianSimulator(0), ValueError, "pools must be an integer >= 1"),
        (lambda: LorentzianSimulator(offsets=0.0).simulate(pool1_amplitude=1.0, pool1_width=1.0, pool1_shift=0.0,
                                                           pool2_width=1.0),
         TypeError, "unknown argument 'pool2_width'"),
        (lambda: SPGRSimulator(flip=10.0, TR=10.0, TE=4.0).simulate(T1=torch.ones(3), T2star=torch.ones(4)),
         ValueError, "T1 \\(3,\\), T2star \\(4,\\); T1 \\(3,\\) and T2star \\(4,\\) conflict"),
        (lambda: SPGRSimulator(flip=[10.0, 20.0], TR=10.0, TE=[1.0, 2.0, 3.0]).simulate(T1=900.0), ValueError,
         "protocol arrays must broadcast.*flip \\(2,\\), TE \\(3,\\)"),
        (lambda: SPGRSimulator(flip=10.0, TR=10.0, TE=4.0).simulate(T1=torch.tensor([900.0, -1.0, float("nan")])),
         ValueError, "T1 must be a time >= 0 ms.*2 of 3 value\\(s\\) are bad, the first at index \\(1,\\)"),
        (lambda: SPGRSimulator(flip=10.0, TR=10.0, TE=4.0).jacobian("flip", T1=900.0), ValueError,
         "protocol argument.*build a cost and call backward\\(\\)"),
        (lambda: SPGRSimulator(flip=10.0, TR=10.0, TE=4.0).jacobian("T2star", T1=900.0), ValueError,
         "did not give 'T2star'"),
        (lambda: mp2rage_sim([800.0, 2700.0], 4.0, 6.9, 3000.0, 160, 1000.0), ValueError,
         "block 2 must end within TRmp2rage"),
        (lambda: mp2rage_sim([300.0, 2700.0], 4.0, 6.9, 6000.0, 160, 1000.0), ValueError, "TI\\[0\\] must leave room"),
        (lambda: HSFPSimulator(flip=[10.0, 20.0], TR=5.0, beta=[1.0, -1.0]).simulate(T1=900.0, T2=80.0), ValueError,
         "beta must be a scalar"),
        (lambda: MOLLISimulator(flip=[[35.0]], TR=900.0, readouts=(5, 3), recovery=2000.0).simulate(T1=900.0),
         ValueError, "1-D arrays of one length"),
        (lambda: LookLockerSimulator(flip=95.0, TR=10.0, TI=100.0).simulate(T1=900.0), ValueError, "90 degrees"),
        (lambda: InversionRecoverySimulator(TI=[100.0, 900.0], TR=500.0).simulate(T1=900.0), ValueError,
         "each TR must be >= its TI"),
        (lambda: multigradientecho_sim(1.0, fat_spectrum="olive_oil"), ValueError, "fat_spectrum"),
    ],
)
def test_errors(call, error, match):
    with pytest.raises(error, match=match):
        call()


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_work_runs_where_the_tissue_is():
    t1 = torch.tensor([900.0, 1200.0], device="cuda")
    out = SPGRSimulator(flip=[5.0, 10.0], TR=10.0, TE=torch.tensor(4.0)).simulate(T1=t1, T2star=40.0)
    assert out.device.type == "cuda" and out.shape == (2, 2)
    assert rel_max_err(out.cpu(), spgr_sim([5.0, 10.0], 4.0, 10.0, t1.cpu(), 40.0)) < 1e-6
