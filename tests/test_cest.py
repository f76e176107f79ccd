"""`CESTSimulator` and `cest_sim` (API.md 5.1, 5.3): Z-spectra in the spirit of the BMsim challenge of
pulseq-cest (Herz et al., MRM 2021;86:1845), against the continuous Bloch-McConnell solution and the
float64 oracle.

Two phantoms under continuous-wave saturation (one long rectangular pulse): a creatine-like two-pool
phantom (water T1 3000 ms, T2 2000 ms; creatine 0.001 of M0, exchanging at 50 Hz, 2 ppm at 3 T) and a
white-matter-like one (water, an amide pool at 3.5 ppm and a semisolid pool with a super-Lorentzian
line). The simulator plays the pulse as hard pulses one dwell apart (`SampledPulse`), a splitting of the
continuous motion that is second order in the dwell; `bloch_mcconnell` below solves the continuous
equations exactly (one matrix exponential), with the engine's exchange convention (API.md 3.3). The
engine runs at coarse dwells; the oracle plays the same spectrum at a finer one; both converge to the
continuous answer.
"""

from __future__ import annotations

import inspect
import math

import numpy as np
import pytest
import torch
from conftest import rel_max_err

from blochsim._reference import play
from blochsim.physics.constants import GAMMA_BAR_HZ_PER_T
from blochsim.physics.lineshape import absorption_lineshape
from blochsim.sequence import TissueProperties
from blochsim.simulators.cest import CESTSimulator, cest_sim

F64 = torch.float64
PPM_HZ = 1e-6 * GAMMA_BAR_HZ_PER_T * 3.0  # 1 ppm at 3 T, 127.7 Hz

pytestmark = [
    # Forward mode through the oracle scripts torch's decompositions: a deprecation warning of torch's.
    pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning"),
]

#: Creatine-like phantom (public names, and the pool list of `bloch_mcconnell`).
CREATINE = dict(T1=3000.0, T2=2000.0, poolB_fraction=0.001, poolB_exchange=50.0, poolB_shift=2.0 * PPM_HZ,
                poolB_T1=1000.0, poolB_T2=100.0)
CREATINE_POOLS = dict(t1=3000.0, t2=2000.0, pools=[(0.001, 50.0, 1000.0, 100.0, 2.0 * PPM_HZ)])

#: White-matter-like phantom: amide 3.5 ppm, semisolid 13.9 % exchanging at 23 Hz, T2b 9 us.
WHITE_MATTER = dict(T1=1000.0, T2=70.0, poolB_fraction=0.0009, poolB_exchange=30.0, poolB_shift=3.5 * PPM_HZ,
                    poolB_T1=1000.0, poolB_T2=10.0, bound_fraction=0.139, bound_exchange=23.0, bound_T1=1000.0,
                    bound_T2=0.009)
WHITE_MATTER_POOLS = dict(t1=1000.0, t2=70.0, pools=[(0.0009, 30.0, 1000.0, 10.0, 3.5 * PPM_HZ)],
                          semisolid=(0.139, 23.0, 1000.0, 0.009))

_FIELDS = {"T1": "t1_ms", "T2": "t2_ms", "M0": "m0", "B0": "b0_hz", "B1": "b1", "poolB_fraction": "pool_b_fraction",
           "poolB_exchange": "pool_b_exchange_hz", "poolB_shift": "pool_b_shift_hz", "poolB_T1": "t1_pool_b_ms",
           "poolB_T2": "t2_pool_b_ms", "bound_fraction": "bound_fraction", "bound_exchange": "bound_exchange_hz",
           "bound_T1": "t1_bound_ms", "bound_T2": "t2_bound_ms"}


def tissue_fields(public: dict) -> dict:
    return {_FIELDS[name]: value for name, value in public.items()}


def bloch_mcconnell(offset_ppm, *, t1, t2, pools=(), semisolid=None, b1sat_ut=1.0, duration_ms=100.0,
                    recovery_ms=6.5, b0_hz=0.0):
    """Mz of the water-like pools after continuous-wave saturation, a spoiled recovery, at the 90-degree read.

    The Bloch-McConnell equations in the frame of the RF (at `offset_ppm` of 3 T), solved exactly:
    water-like pools (free water, then `pools` = (fraction, exchange Hz, T1, T2, shift Hz)) carry
    (Mx, My, Mz) and precess at `-2 pi (B0 + shift - f_rf)`; the semisolid pool (fraction, exchange,
    T1, T2b ms) carries Mz only, saturated at `pi w1^2 G(f_rf - B0)` (G the oracle's super-Lorentzian).
    Exchange with free water only, as API.md 3.3 writes it: pool p gains k_p f_p of the free water and
    returns k_p f_free. Free water's transverse magnetization exchanges with the water-like pools only
    (EPG-X): the semisolid pool takes and returns longitudinal magnetization alone.
    """
    f_rf = offset_ppm * PPM_HZ
    w1 = 2 * math.pi * GAMMA_BAR_HZ_PER_T * 1e-6 * b1sat_ut
    fractions = [p[0] for p in pools] + ([semisolid[0]] if semisolid else [])
    f_free = 1.0 - sum(fractions)
    water = [(f_free, 0.0, t1, t2, 0.0), *pools]
    size = 3 * len(water) + (1 if semisolid else 0) + 1  # the last entry is the constant 1

    def generator(rf: bool) -> torch.Tensor:
        a = torch.zeros(size, size, dtype=F64)
        for p, (f, k, r1_ms, r2_ms, shift) in enumerate(water):
            x, y, z = 3 * p, 3 * p + 1, 3 * p + 2
            wz, wx = -2 * math.pi * (b0_hz + shift - f_rf), (w1 if rf else 0.0)
            a[x, x] = a[y, y] = -1e3 / r2_ms
            a[z, z], a[z, -1] = -1e3 / r1_ms, 1e3 / r1_ms * f
            a[x, y], a[y, x], a[y, z], a[z, y] = -wz, wz, -wx, wx
            if p:  # exchange with free water, every component
                for c in range(3):
                    a[3 * p + c, c] += k * f
                    a[3 * p + c, 3 * p + c] -= k * f_free
                    a[c, c] -= k * f
                    a[c, 3 * p + c] += k * f_free
        if semisolid:
            f, k, r1_ms, t2b_ms = semisolid
            s = 3 * len(water)
            a[s, s], a[s, -1] = -1e3 / r1_ms, 1e3 / r1_ms * f
            if rf:
                g = absorption_lineshape("super-lorentzian", torch.tensor(f_rf - b0_hz, dtype=F64),
                                         torch.tensor(t2b_ms, dtype=F64))
                a[s, s] -= math.pi * w1**2 * float(g)
            a[s, 2] += k * f
            a[s, s] -= k * f_free
            a[2, 2] -= k * f
            a[2, s] += k * f_free
            # No transverse loss into the semisolid pool: as in EPG-X, free water's transverse magnetization
            # does not exchange with it (blochsim._reference, step 1a).
        return a

    m = torch.zeros(size, dtype=F64)
    m[-1] = 1.0
    for p, (f, *_) in enumerate(water):
        m[3 * p + 2] = f
    if semisolid:
        m[3 * len(water)] = semisolid[0]
    m = torch.linalg.matrix_exp(generator(True) * duration_ms * 1e-3) @ m
    m[: 3 * len(water)] = torch.where(torch.arange(3 * len(water)) % 3 == 2, m[: 3 * len(water)], 0.0)  # spoil
    m = torch.linalg.matrix_exp(generator(False) * recovery_ms * 1e-3) @ m
    return sum(float(m[3 * p + 2]) for p in range(len(water)))


#: 5000 hard pulses 0.1 ms apart against the continuous solution: the splitting error, second order in the
#: dwell, is largest next to the water line (8e-4 measured at +-1 ppm, 1e-4 from 2 ppm out), plus float32
#: round-off of about 1e-4 (engine against oracle on the same description).
SPLITTING_500MS = 1.5e-3


def oracle(sim, public: dict, offset: float, **protocol) -> torch.Tensor:
    """The oracle's value at one offset: the read's sample times +i, real."""
    description = sim.describe(offsets=offset, **protocol)
    return (play(description, TissueProperties(**tissue_fields(public)), states=1).signal * 1j).real


# -- Z-spectra against the continuous solution --------------------------------------------------------
def test_creatine_z_spectrum():
    offsets = torch.tensor([-15.0, -4.0, -3.0, -2.0, -1.0, 0.0, 1.0, 2.0, 3.0, 4.0, 15.0])
    z = CESTSimulator(pulse_duration=500.0, dwell=0.1).simulate(offsets=offsets, **CREATINE)
    assert z.dtype == torch.float32 and z.shape == (11,)
    exact = torch.tensor([bloch_mcconnell(float(o), duration_ms=500.0, **CREATINE_POOLS) for o in offsets])
    assert float((z - exact).abs().max()) < SPLITTING_500MS
    assert abs(float(z[0]) - 1) < 1e-3 and abs(float(z[-1]) - 1) < 1e-3  # ~1 far off resonance
    assert int(torch.argmin(z)) == 5  # the water dip, at 0 ppm
    asymmetry = z[[4, 3, 2, 1]] - z[[6, 7, 8, 9]]  # Z(-d) - Z(+d), d = 1..4 ppm
    assert int(torch.argmax(asymmetry)) == 1 and float(asymmetry[1]) > 0.02  # the creatine dip, at +2 ppm


def test_white_matter_z_spectrum():
    offsets = torch.tensor([-15.0, -3.5, 0.0, 3.5, 15.0])
    z = CESTSimulator(pulse_duration=500.0, dwell=0.1).simulate(offsets=offsets, **WHITE_MATTER)
    exact = torch.tensor([bloch_mcconnell(float(o), duration_ms=500.0, **WHITE_MATTER_POOLS) for o in offsets])
    assert float((z - exact).abs().max()) < SPLITTING_500MS
    assert float(z[3]) < float(z[1]) - 1e-3  # the amide dip at +3.5 ppm; the semisolid line is symmetric
    assert abs(float(z[0] - z[4])) < 1e-4 and float(z[4]) < 0.95  # semisolid saturation far off resonance


# -- the engine at coarse dwells and the oracle at a finer one converge ---------------------------------
@pytest.mark.parametrize("phantom", ["creatine", "white_matter"])
def test_engine_and_finer_oracle_converge(phantom):
    public, pools = (CREATINE, CREATINE_POOLS) if phantom == "creatine" else (WHITE_MATTER, WHITE_MATTER_POOLS)
    offsets = [-3.5, 2.0]
    protocol = dict(pulse_duration=40.0, B1sat=2.0)
    exact = torch.tensor([bloch_mcconnell(o, duration_ms=40.0, b1sat_ut=2.0, **pools) for o in offsets])
    engine = {d: CESTSimulator(dwell=d, **protocol).simulate(offsets=offsets, **public) for d in (0.2, 0.1, 0.05)}
    coarse = CESTSimulator(dwell=0.2, **protocol)
    same = torch.cat([oracle(coarse, public, o) for o in offsets])
    assert float((engine[0.2] - same).abs().max()) < 3e-5  # one description: float32 round-off over 200 pulses
    fine = torch.cat([oracle(CESTSimulator(dwell=0.025, **protocol), public, o) for o in offsets])
    # The oracle at 0.025 ms: splitting error 6e-5 at 2 ppm (measured; 4x less per halving of the dwell).
    assert float((fine - exact).abs().max()) < 1e-4
    errors = [float((engine[d] - exact).abs().max()) for d in (0.2, 0.1, 0.05)]
    # The engine's error falls 4x per halving (measured 3.9x and 4.0x at 2 ppm, the worst offset here) ...
    assert errors[1] < errors[0] / 3 and errors[2] < errors[1] / 3
    # ... so at 0.05 ms it agrees with the finer oracle to its own splitting error (2.3e-4 at 2 ppm).
    assert float((engine[0.05] - fine).abs().max()) < 3e-4


# -- derivatives --------------------------------------------------------------------------------------
def test_jacobian_against_the_oracle():
    sim = CESTSimulator(pulse_duration=2.0, dwell=0.05, B1sat=3.0, recovery=1.0)
    offsets = [-3.5, 1.0]
    names = ("T1", "T2", "poolB_fraction", "poolB_exchange", "poolB_shift", "bound_fraction", "bound_exchange", "B1")
    public = {**WHITE_MATTER, "B1": 0.9}
    signal, J = sim.jacobian(names, offsets=offsets, **public)
    assert signal.dtype == torch.float32 and signal.shape == (2,) and J.shape == (len(names), 2)
    # The oracle's derivatives by reverse mode: one backward per offset gives every name at once.
    columns, values = [], []
    for o in offsets:
        fields = {k: torch.tensor(v, dtype=F64, requires_grad=k in {_FIELDS[n] for n in names})
                  for k, v in tissue_fields(public).items()}
        value = (play(sim.describe(offsets=o), TissueProperties(**fields), states=1).signal * 1j).real.sum()
        grads = torch.autograd.grad(value, [fields[_FIELDS[n]] for n in names])
        columns.append(torch.stack(grads))
        values.append(float(value.detach()))
    want = torch.stack(columns, -1)
    assert rel_max_err(signal, torch.tensor(values, dtype=F64)) < 1e-5
    # Per name: the columns span six decades (per Hz of shift against per unit of fraction).
    for p, name in enumerate(names):
        assert rel_max_err(J[p], want[p]) < 1e-4, name


def test_gradient_to_the_saturation_protocol():
    b1sat, delay = torch.tensor(1.5, requires_grad=True), torch.tensor(4.0, requires_grad=True)
    sim = CESTSimulator(pulse_duration=4.0, npulses=3, dwell=0.1)
    sim.simulate(offsets=[-1.0, 3.5], B1sat=b1sat, interpulse_delay=delay, **WHITE_MATTER).sum().backward()
    b1sat_ref = torch.tensor(1.5, dtype=F64, requires_grad=True)
    delay_ref = torch.tensor(4.0, dtype=F64, requires_grad=True)
    total = sum(oracle(sim, WHITE_MATTER, o, B1sat=b1sat_ref, interpulse_delay=delay_ref).sum() for o in (-1.0, 3.5))
    total.backward()
    assert abs(float(b1sat.grad - b1sat_ref.grad)) < 1e-4 * abs(float(b1sat_ref.grad))
    assert abs(float(delay.grad - delay_ref.grad)) < 1e-4 * abs(float(delay_ref.grad))


# -- protocol -------------------------------------------------------------------------------------------
def test_pulsed_saturation_is_phase_continuous():
    # Two 10 ms pulses without a gap are one 20 ms pulse: pulse 2 starts at the phase pulse 1 ended with.
    split = CESTSimulator(pulse_duration=10.0, npulses=2, dwell=0.05).simulate(offsets=[-2.0, 1.5], **CREATINE)
    whole = CESTSimulator(pulse_duration=20.0, dwell=0.05).simulate(offsets=[-2.0, 1.5], **CREATINE)
    assert float((split - whole).abs().max()) < 1e-6  # float32 rounding
    pulsed = CESTSimulator(pulse_duration=5.0, npulses=3, interpulse_delay=7.5, dwell=0.05)
    got = pulsed.simulate(offsets=[2.0], **WHITE_MATTER)
    assert abs(float(got[0] - oracle(pulsed, WHITE_MATTER, 2.0))) < 3e-5  # float32 round-off, 300 pulses


def test_repeated_spectra_match_unresolved_runs():
    # Offsets share one resolved structure without a semisolid pool; with one, each offset keeps its own
    # (its RF frequency sets the lineshape). Either way a repeated call equals a fresh walk of each layout.
    for public in (CREATINE, WHITE_MATTER):
        sim, fresh = CESTSimulator(pulse_duration=5.0, dwell=0.1), CESTSimulator(pulse_duration=5.0, dwell=0.1,
                                                                                resolve=False)
        for offsets in ([-3.0, 1.0, 2.0], [0.5, -1.5, 3.5, 6.0], [2.5, -2.5]):
            got = sim.simulate(offsets=offsets, **public)
            assert float((got - fresh.simulate(offsets=offsets, **public)).abs().max()) < 1e-6


def test_scaling_units_and_shapes():
    sim = CESTSimulator(pulse_duration=5.0, dwell=0.1)
    base = sim.simulate(offsets=[-2.0, 2.0], **CREATINE)
    m0 = torch.tensor([[1.0], [2.5]])
    scaled = sim.simulate(offsets=[-2.0, 2.0], M0=m0, **CREATINE)
    assert scaled.shape == (2, 1, 2) and torch.allclose(scaled, m0[..., None] * base, rtol=1e-6)
    # B0 moves the whole spectrum: the water line at 0.5 ppm of 3 T.
    shifted = sim.simulate(offsets=[0.5], B0=0.5 * PPM_HZ, T1=1000.0, T2=100.0)
    assert float(shifted[0]) < sim.simulate(offsets=[0.0], B0=0.5 * PPM_HZ, T1=1000.0, T2=100.0)[0] - 0.05
    # ppm scale with the field: saturating on a water line moved by 2 ppm is the same at 3 T and 7 T.
    seven = CESTSimulator(pulse_duration=5.0, dwell=0.1, field_strength=7.0)
    at_7t = seven.simulate(offsets=[2.0], B0=2.0 * PPM_HZ * 7 / 3, T1=1000.0, T2=100.0)
    at_3t = sim.simulate(offsets=[2.0], B0=2.0 * PPM_HZ, T1=1000.0, T2=100.0)
    assert abs(float(at_7t[0] - at_3t[0])) < 1e-5 and float(at_3t[0]) < 0.3  # cos(w1 T) = 0.23 on resonance
    assert sim.simulate(offsets=3.0, **CREATINE).shape == (1,)  # a scalar offset gives one sample
    out = sim.simulate(offsets=np.array([-2.0, 2.0]), **CREATINE)
    assert isinstance(out, np.ndarray) and out.dtype == np.float32
    assert np.allclose(out, base.numpy(), atol=1e-7)


def test_errors_and_function_form():
    with pytest.raises(ValueError, match="offsets is empty"):
        CESTSimulator().simulate(offsets=[], T1=1000.0, T2=80.0)
    with pytest.raises(ValueError, match="not a whole number of dwell"):
        CESTSimulator(pulse_duration=1.0, dwell=0.3).simulate(offsets=[1.0], T1=1000.0, T2=80.0)
    with pytest.raises(ValueError, match=r"offsets reach 5109.3 Hz \(40 ppm at 3 T\).* give dwell < 0.09786 ms"):
        CESTSimulator(dwell=0.1).simulate(offsets=[2.0, -40.0], T1=1000.0, T2=80.0)  # Nyquist: 5 kHz
    with pytest.raises(ValueError, match="npulses must be an integer >= 1"):
        CESTSimulator(npulses=0).simulate(offsets=[1.0], T1=1000.0, T2=80.0)
    assert str(inspect.signature(cest_sim)) == (
        "(offsets, T1, T2, diff=None, field_strength=3.0, B1sat=1.0, npulses=1, pulse_duration=100.0, "
        "interpulse_delay=0.0, recovery=6.5, dwell=0.01, B1=1.0, B0=0.0, M0=1.0, device=None, **values)")
    offsets = np.array([-2.0, 2.0])
    out = cest_sim(offsets, 3000.0, 2000.0, pulse_duration=5.0, dwell=0.1, **{k: v for k, v in CREATINE.items()
                                                                          if k.startswith("pool")})
    assert isinstance(out, np.ndarray)
    assert np.allclose(out, CESTSimulator(pulse_duration=5.0, dwell=0.1).simulate(offsets=offsets, **CREATINE))
    signal, J = cest_sim(offsets, 3000.0, 2000.0, diff=("T2", "poolB_fraction"), pulse_duration=5.0, dwell=0.1,
                         poolB_fraction=0.001, poolB_exchange=50.0, poolB_shift=2 * PPM_HZ)
    assert signal.shape == (2,) and J.shape == (2, 2)
