"""Every event-train simulator of API.md 5.1 against a reference built without our description layer.

The other simulator tests hand `sim.describe()` to both the engine and the oracle, so a wrong layout (a TR
1 % long, a flip on the wrong pulse, a sample in the wrong place, a phase cycle off by one pulse) plays the
same in both and passes. Here each simulator's public result is held to the textbook sequence written out
in this file: a short float64 EPG (Weigel 2015, JMRI 41:266: F+, F-, Z arrays, rotation, relaxation, shift),
a hard-pulse Bloch-McConnell simulation (CEST), or a closed form from the literature (tests/_closed_forms.py).
Nothing here is built with blochsim.sequence, blochsim._reference or blochsim.simulators._formulas.

Each check can fail: each test also plays its reference with a small deliberate error in the protocol (a
time 1 % off, a flip 1 degree off, a phase cycle off by one pulse, ...) and asserts that the comparison
then rejects the simulator's result.

Tolerances: the simulators run float32 kernels; a float64 reference of the same sequence agrees to float32
round-off accumulated over the train, 1e-5 of the largest sample (at most a few hundred events; the engine
against the oracle is held to the same, tests/test_simulators_trains.py). Where a test needs another bound,
its reason is beside it.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.linalg
import torch
from _closed_forms import (
    GAMMA_BAR_HZ_PER_T,
    mp2rage_signal_equation,
    mprage_centre,
    spoiled_train,
    stimulated_echoes,
)
from conftest import rel_max_err

from blochsim.simulators import (
    CESTSimulator,
    FLASHSimulator,
    FSESimulator,
    HyperechoSimulator,
    MP2RAGESimulator,
    MPnRAGESimulator,
    MPRAGESimulator,
    MRFSimulator,
    StimulatedEchoSimulator,
    TrueFISPSimulator,
    fmSSFPSimulator,
)

DEG = math.pi / 180
VALUES = 1e-5  # float32 kernels against a float64 reference: see the module docstring

#: Three voxels (ms), used by most tests.
T1 = np.array([700.0, 1100.0, 1600.0])
T2 = np.array([45.0, 80.0, 130.0])


def t(values) -> torch.Tensor:
    """A float64 (or complex128) tensor of `values`."""
    values = np.asarray(values)
    return torch.as_tensor(values.astype(np.complex128 if np.iscomplexobj(values) else np.float64))


def check(got, reference, tol: float, wrong: dict) -> None:
    """`got` agrees with `reference` to `tol` (relative to its largest sample), and each reference in `wrong`
    (the same sequence with one deliberate error, named by its key) is rejected at the same tolerance."""
    err = rel_max_err(got, t(reference))
    assert err < tol, f"simulator against the reference: {err:.3g} (tolerance {tol})"
    for what, other in wrong.items():
        miss = rel_max_err(got, t(other))
        assert miss > tol, f"the check cannot fail: a reference with {what} is accepted ({miss:.3g} < {tol})"


# -- the reference EPG ------------------------------------------------------------------------------------
# (Mx, My, Mz) -> (F+, F-, Z) for each order: F+ = Mx + i My, F- = its conjugate (Weigel 2015, eq. 5).
TO_EPG = np.array([[1, 1j, 0], [1, -1j, 0], [0, 0, 1]])
FROM_EPG = np.linalg.inv(TO_EPG)


def rotation(alpha, phi) -> np.ndarray:
    """(..., 3, 3): the right-handed rotation of (Mx, My, Mz) by `alpha` (rad) about (cos phi, sin phi, 0)
    (API.md 1.6), by Rodrigues' formula R = I + sin(a) K + (1 - cos(a)) K^2."""
    alpha, phi = np.broadcast_arrays(np.asarray(alpha, dtype=float), np.asarray(phi, dtype=float))
    nx, ny = np.cos(phi), np.sin(phi)
    zero = np.zeros_like(nx)
    k = np.stack([np.stack([zero, zero, ny], -1), np.stack([zero, zero, -nx], -1),
                  np.stack([-ny, nx, zero], -1)], -2)
    s, c = np.sin(alpha)[..., None, None], np.cos(alpha)[..., None, None]
    return np.eye(3) + s * k + (1 - c) * (k @ k)


class Epg:
    """F+(k), F-(k), Z(k), k = 0 .. orders-1, of V voxels in units of M0, from equilibrium at t = 0 ms.

    `to(t_ms)` relaxes and precesses up to t_ms; `rf` rotates every order (TO_EPG R FROM_EPG, Weigel's T
    matrix); `shift` winds one order (F+(k) -> F+(k+1), F-(k+1) -> F-(k), F+(0) = conj F-(0)); `spoil`
    zeroes the transverse states; `sample(psi)` is F+(0) e^{-i psi}. `orders` must hold every order the
    sequence reaches: a shift that would push a state past the last order raises.
    """

    def __init__(self, orders, t1_ms, t2_ms, b0_hz=0.0):
        self.t1, self.t2, self.b0 = (np.asarray(v, dtype=float) for v in np.broadcast_arrays(t1_ms, t2_ms, b0_hz))
        voxels = self.t1.shape
        self.fp = np.zeros((*voxels, orders), complex)
        self.fm = np.zeros((*voxels, orders), complex)
        self.z = np.zeros((*voxels, orders), complex)
        self.z[..., 0] = 1.0
        self.now_ms = 0.0

    def to(self, t_ms: float) -> None:
        dt = t_ms - self.now_ms
        assert dt >= -1e-9, (t_ms, self.now_ms)
        e1, e2 = np.exp(-dt / self.t1)[..., None], np.exp(-dt / self.t2)[..., None]
        turn = np.exp(-2j * math.pi * self.b0 * dt * 1e-3)[..., None]  # F+ turns by -2 pi B0 t (API.md 1.6)
        self.fp = self.fp * e2 * turn
        self.fm = self.fm * e2 * turn.conj()
        self.z = self.z * e1
        self.z[..., 0] += 1 - e1[..., 0]
        self.now_ms = t_ms

    def rf(self, alpha, phi) -> None:
        t_matrix = TO_EPG @ rotation(np.broadcast_to(alpha, self.t1.shape), phi) @ FROM_EPG  # (V, 3, 3)
        states = t_matrix @ np.stack([self.fp, self.fm, self.z], -2)
        self.fp, self.fm, self.z = states[..., 0, :], states[..., 1, :], states[..., 2, :]

    def shift(self) -> None:
        assert not self.fp[..., -1].any(), "the reference's orders are too few for this sequence"
        self.fp = np.concatenate([np.zeros_like(self.fp[..., :1]), self.fp[..., :-1]], -1)
        self.fm = np.concatenate([self.fm[..., 1:], np.zeros_like(self.fm[..., :1])], -1)
        self.fp[..., 0] = self.fm[..., 0].conj()

    def spoil(self) -> None:
        self.fp, self.fm = np.zeros_like(self.fp), np.zeros_like(self.fm)

    def invert(self, efficiency=1.0) -> None:
        self.z = self.z * -np.asarray(efficiency)[..., None]

    def inversion_prologue(self, inversion_ms, spoiler_ms, efficiency) -> float:
        """An ideal inversion in the middle of `inversion_ms`, then `spoiler_ms` and a spoiler, from t = 0: returns
        the time the train after it starts."""
        self.to(inversion_ms / 2)
        self.invert(efficiency)
        start = inversion_ms + spoiler_ms
        self.to(start)
        self.spoil()
        return start

    def sample(self, psi=0.0) -> np.ndarray:
        return self.fp[..., 0] * np.exp(-1j * psi)


def hamming_sinc(flip_rad: float, samples: int, bandwidth_time: float) -> np.ndarray:
    """Per-sample flips (rad, signed) of a Hamming-windowed sinc with `bandwidth_time` zero crossings across
    the pulse, sampled at the midpoints of `samples` equal steps and scaled to the area `flip_rad`."""
    x = (np.arange(samples) + 0.5) / samples - 0.5  # -1/2 .. 1/2 of the pulse
    shape = np.sinc(bandwidth_time * x) * (0.54 + 0.46 * np.cos(2 * math.pi * x))
    return flip_rad * shape / shape.sum()


def play_pulse(epg: Epg, start_ms, flip_rad, phase_rad, b1, *, duration_ms=0.0, dwell_ms=0.01, bandwidth_time=4.0,
               window=hamming_sinc) -> None:
    """A hard pulse at `start_ms` (duration 0), or a shaped one from `start_ms` played as one hard pulse at the
    midpoint of each dwell, with free evolution between (the hard-pulse approximation of a Bloch simulation)."""
    if duration_ms == 0:
        epg.to(start_ms)
        epg.rf(flip_rad * b1, phase_rad)
        return
    n = round(duration_ms / dwell_ms)
    for k, a in enumerate(window(flip_rad, n, bandwidth_time)):
        epg.to(start_ms + (k + 0.5) * dwell_ms)
        epg.rf(a * b1, phase_rad)


# -- MRF (FISP) ---------------------------------------------------------------------------------------------
def mrf_reference(flips_deg, tr_ms, ti_ms, phases_deg, *, t1, t2, b1, m0, efficiency):
    """Inversion at 0, TI, then per TR: pulse, FID sample (demodulated by the pulse phase), one order of
    dephasing, TR of free evolution. Times +i (API.md 1.6)."""
    epg = Epg(len(flips_deg) + 2, t1, t2)
    epg.invert(efficiency)
    now, out = ti_ms, []
    for a, tr, p in zip(flips_deg, tr_ms, phases_deg, strict=True):
        epg.to(now)
        epg.rf(a * DEG * b1, p * DEG)
        out.append(1j * m0 * epg.sample(p * DEG))
        epg.shift()
        now += tr
    return np.stack(out, -1)


def test_mrf_against_an_independent_epg():
    n = 24
    flips = np.concatenate([np.linspace(5, 60, 12), np.linspace(60, 10, 12)])
    tr = np.linspace(8.0, 14.0, n)
    phases = 117.0 * np.arange(n) * np.arange(1, n + 1) / 2  # quadratic RF phase: pulses on many axes
    tissue = dict(t1=T1, t2=T2, b1=np.array([0.85, 1.0, 1.1]), m0=np.array([1.0, 1.3, 0.7]),
                  efficiency=np.array([1.0, 0.9, 0.95]))
    got = MRFSimulator(flip=t(flips), TR=t(tr), TI=25.0, phases=t(phases)).simulate(
        T1=t(T1), T2=t(T2), B1=t(tissue["b1"]), M0=t(tissue["m0"]), inv_efficiency=t(tissue["efficiency"]),
        states=n + 2)  # every order the 24 TRs reach: no truncation on either side
    check(got, mrf_reference(flips, tr, 25.0, phases, **tissue), VALUES, {
        "TR 1 % long": mrf_reference(flips, tr * 1.01, 25.0, phases, **tissue),
        "every flip 1 degree more": mrf_reference(flips + 1.0, tr, 25.0, phases, **tissue),
        "TI 1 % long": mrf_reference(flips, tr, 25.25, phases, **tissue),
        "the phases one TR late": mrf_reference(flips, tr, 25.0, np.roll(phases, 1), **tissue),
    })


# -- FSE and hyperechoes (CPMG) -----------------------------------------------------------------------------
def cpmg_reference(pulses, esp_ms, tr_ms, *, t1, t2, b1, m0, demodulate=None, exc=(90.0, 90.0), playings=2):
    """Excitation (exc flip, exc phase) at 0, then refocusing pulses `pulses` = [(flip, phase) deg] ESP apart,
    the first ESP/2 after it, crushed (one order of dephasing each side), an echo midway between pulses,
    demodulated by its pulse's phase (or by `demodulate` deg); the transverse states spoiled after the last
    echo; the next playing TR after the excitation. The last playing's echoes."""
    epg = Epg(2 * playings * len(pulses) + 2, t1, t2)
    for playing in range(playings):
        start, echoes = playing * tr_ms, []
        play_pulse(epg, start, exc[0] * DEG, exc[1] * DEG, b1)
        for j, (a, p) in enumerate(pulses):
            epg.to(start + (j + 0.5) * esp_ms)
            epg.shift()
            epg.rf(a * DEG * b1, p * DEG)
            epg.shift()
            epg.to(start + (j + 1) * esp_ms)
            echoes.append(m0 * epg.sample((p if demodulate is None else demodulate) * DEG))
        epg.spoil()
    return np.stack(echoes, -1)


FSE_FLIPS = np.array([150.0, 120.0, 170.0, 140.0, 160.0, 130.0])
FSE_PHASES = np.array([0.0, 10.0, 0.0, -15.0, 5.0, 0.0])


def test_fse_against_an_independent_epg():
    tissue = dict(t1=T1, t2=T2, b1=np.array([0.9, 1.0, 1.05]), m0=np.array([1.5, 1.0, 0.8]))
    got = FSESimulator(flip=t(FSE_FLIPS), ESP=9.0, phases=t(FSE_PHASES), TR=400.0).simulate(
        T1=t(T1), T2=t(T2), B1=t(tissue["b1"]), M0=t(tissue["m0"]), states=30)  # 2 x 12 shifts: no truncation

    def reference(flips=FSE_FLIPS, esp=9.0, tr=400.0, exc=(90.0, 90.0)):
        return cpmg_reference(list(zip(flips, FSE_PHASES, strict=True)), esp, tr, exc=exc, **tissue)

    check(got, reference(), VALUES, {
        "ESP 1 % long": reference(esp=9.09),
        "every refocusing flip 1 degree more": reference(flips=FSE_FLIPS + 1.0),
        "TR 1 % long (the second playing's starting Mz)": reference(tr=404.0),
        "an excitation 1 degree more": reference(exc=(91.0, 90.0)),
    })


def test_hyperecho_against_an_independent_epg():
    flips, phases = np.array([60.0, 130.0, 90.0]), np.array([10.0, 40.0, 70.0])
    tissue = dict(t1=T1, t2=T2, b1=np.array([1.1, 1.0, 0.9]), m0=1.0)
    got = HyperechoSimulator(flip=t(flips), phases=t(phases), ESP=8.0, TR=600.0).simulate(
        T1=t(T1), T2=t(T2), B1=t(tissue["b1"]), states=32)  # 2 x 14 shifts

    def reference(esp=8.0, mirror=-1.0, central=180.0):
        # Hennig & Scheffler 2001: the pulses, a central pulse, then the pulses in reverse order with the sign of
        # flip and phase inverted; every echo demodulated at phase 0.
        pulses = [*zip(flips, phases, strict=True), (central, 0.0)]
        pulses += [(mirror * a, mirror * p) for a, p in zip(flips[::-1], phases[::-1], strict=True)]
        return cpmg_reference(pulses, esp, 600.0, demodulate=0.0, **tissue)

    want = reference()
    check(got, want, VALUES, {
        "ESP 1 % long": reference(esp=8.08),
        "the mirrored pulses not negated": reference(mirror=1.0),
        "a central pulse 1 degree more": reference(central=181.0),
    })
    # The hyperecho: without relaxation the last echo recovers the excited magnetization (here B1 scales every
    # pulse, so the central one is 198, 180 and 162 degrees; only the 180 refocuses fully).
    free = cpmg_reference([*zip(flips, phases, strict=True), (180.0, 0.0), *zip(-flips[::-1], -phases[::-1],
                                                                                 strict=True)],
                          8.0, 600.0, demodulate=0.0, t1=np.inf, t2=np.inf, b1=1.0, m0=1.0, playings=1)
    assert abs(free[-1] - 1.0) < 1e-12


# -- the stimulated echo (Hahn 1950) --------------------------------------------------------------------------
def test_stimulated_echo_against_the_closed_form():
    tissue = dict(t1=T1, t2=T2, b1=np.array([0.85, 1.0, 1.1]), m0=np.array([1.2, 1.0, 0.9]))
    flips = (70.0, 110.0, 50.0)
    got = StimulatedEchoSimulator(flip=list(flips), TE=20.0, TM=150.0).simulate(
        T1=t(T1), T2=t(T2), B1=t(tissue["b1"]), M0=t(tissue["m0"]), B0=t([7.0, -31.0, 0.0]))  # echoes: B0-blind
    check(got, stimulated_echoes(flips, 20.0, 150.0, **tissue), VALUES, {
        "TE 1 % long": stimulated_echoes(flips, 20.2, 150.0, **tissue),
        "TM 1 % long": stimulated_echoes(flips, 20.0, 151.5, **tissue),
        "the third flip 1 degree more": stimulated_echoes((70.0, 110.0, 51.0), 20.0, 150.0, **tissue),
    })


# -- MPnRAGE, MPRAGE, MP2RAGE: inversion-prepared spoiled trains --------------------------------------------
def test_mpnrage_against_the_spoiled_recursion():
    n = 40
    flips, tr = np.linspace(5.0, 9.0, n), np.linspace(10.0, 14.0, n)
    tissue = dict(t1=T1, b1=np.array([0.9, 1.0, 1.1]), m0=np.array([1.3, 1.0, 0.8]),
                  efficiency=np.array([0.95, 1.0, 0.9]))
    got = MPnRAGESimulator(nshots=n, flip=t(flips), TR=t(tr), TI=30.0, phases=t(np.arange(n) * 7.0)).simulate(
        T1=t(T1), B1=t(tissue["b1"]), M0=t(tissue["m0"]), inv_efficiency=t(tissue["efficiency"]))
    check(got, spoiled_train(flips, tr, 30.0, **tissue), VALUES, {
        "TR 1 % long": spoiled_train(flips, tr * 1.01, 30.0, **tissue),
        "every flip 1 degree more": spoiled_train(flips + 1.0, tr, 30.0, **tissue),
        "TI 1 % long": spoiled_train(flips, tr, 30.3, **tissue),
    })


@pytest.mark.parametrize(("nshots", "before"), [((12, 20), 12), (33, 16)])  # a total: the odd shot after
def test_mprage_against_the_closed_form(nshots, before):
    tissue = dict(t1=T1, m0=np.array([1.1, 1.0, 0.9]), efficiency=np.array([0.9, 1.0, 0.95]))
    got = MPRAGESimulator(TI=300.0, flip=8.0, TRspgr=9.0, nshots=nshots, phases=3.0).simulate(
        T1=t(T1), M0=t(tissue["m0"]), inv_efficiency=t(tissue["efficiency"]))
    check(got, mprage_centre(300.0, 8.0, 9.0, before, **tissue), VALUES, {
        "TRspgr 1 % long": mprage_centre(300.0, 8.0, 9.09, before, **tissue),
        "the flip 1 degree more": mprage_centre(300.0, 9.0, 9.0, before, **tissue),
        "TI 1 % long": mprage_centre(303.0, 8.0, 9.0, before, **tissue),
        "the shot after the centre sampled": mprage_centre(300.0 + 9.0, 8.0, 9.0, before + 1, **tissue),
    })


def test_mp2rage_event_train_against_the_closed_form():
    sim = MP2RAGESimulator(TI=[700.0, 2500.0], flip=[4.0, 5.0], TRspgr=7.0, TRmp2rage=5000.0, nshots=(60, 100))
    tissue = dict(t1=np.array([800.0, 1400.0, 2000.0]), m0=np.array([1.2, 1.0, 0.9]),
                  efficiency=np.array([0.96, 1.0, 0.9]))
    train = MP2RAGESimulator.from_description(sim.describe())  # the class settings: SPOILED, states=1, acquired
    got = train.simulate(T1=t(tissue["t1"]), M0=t(tissue["m0"]), inv_efficiency=t(tissue["efficiency"]),
                         repetitions="auto") * 1j  # from_description: the raw -i sin(a) Mz

    def reference(ti=(700.0, 2500.0), flips=(4.0, 5.0), tr=7.0, cycle=5000.0, before=60):
        return tissue["m0"][:, None] * mp2rage_signal_equation(ti, flips, tr, cycle, before, 160 - before,
                                                               tissue["t1"], tissue["efficiency"])

    check(got, reference(), VALUES, {
        "TRspgr 1 % long": reference(tr=7.07),
        "TI[0] 1 % long": reference(ti=(707.0, 2500.0)),
        "flip[1] 1 degree more": reference(flips=(4.0, 6.0)),
        "TRmp2rage 1 % long": reference(cycle=5050.0),
        "the sampled shot one later": reference(ti=(707.0, 2507.0), before=61),
    })
    # The closed-form simulate agrees with it too (the same physics, written in _formulas).
    closed = sim.simulate(T1=t(tissue["t1"]), M0=t(tissue["m0"]), inv_efficiency=t(tissue["efficiency"]))
    assert rel_max_err(closed, t(reference())) < VALUES


# -- FLASH --------------------------------------------------------------------------------------------------
def flash_reference(flips_deg, tr_ms, te_ms, *, t1, t2, b0, b1, m0, efficiency=1.0, rf_spoiling=None,
                    inversion_ms=None, spoiler_ms=0.0, duration_ms=0.0, dwell_ms=0.01, window=hamming_sinc):
    """An optional ideal inversion in the middle of `inversion_ms`, `spoiler_ms` and a spoiler; then per shot
    a pulse (hard, or a shaped one from its start) of phase rf_spoiling n(n+1)/2, the sample TE after its
    centre demodulated by that phase, then ideal spoiling or (RF spoiling) one order of dephasing; TR from
    pulse start to pulse start. The raw engine value (API.md 1.6)."""
    epg = Epg(len(flips_deg) + 2, t1, t2, b0)
    start = 0.0 if inversion_ms is None else epg.inversion_prologue(inversion_ms, spoiler_ms, efficiency)
    out = []
    for n, a in enumerate(flips_deg):
        phase = 0.0 if rf_spoiling is None else rf_spoiling * DEG * n * (n + 1) / 2
        play_pulse(epg, start + n * tr_ms, a * DEG, phase, b1, duration_ms=duration_ms, dwell_ms=dwell_ms,
                   window=window)
        epg.to(start + n * tr_ms + duration_ms / 2 + te_ms)
        out.append(m0 * epg.sample(phase))
        epg.spoil() if rf_spoiling is None else epg.shift()
    return np.stack(out, -1)


FLASH_TISSUE = dict(t1=T1, t2=T2, b0=np.array([0.0, 40.0, -25.0]), b1=np.array([0.9, 1.0, 1.1]),
                    m0=np.array([1.0, 1.2, 0.8]))


def flash_public(tissue: dict) -> dict:
    return dict(T1=t(tissue["t1"]), T2=t(tissue["t2"]), B0=t(tissue["b0"]), B1=t(tissue["b1"]), M0=t(tissue["m0"]))


def test_flash_rf_spoiled_and_inverted_against_an_independent_epg():
    flips = np.array([8.0, 12.0, 15.0, 10.0, 9.0, 14.0, 11.0, 13.0])
    tissue = {**FLASH_TISSUE, "efficiency": np.array([0.95, 1.0, 0.9])}
    sim = FLASHSimulator(flip=t(flips), TR=6.0, TE=2.5, nshots=8, pulse_duration=0, rf_spoiling=117.0,
                         inversion="ideal", inversion_duration=8.0, spoiler=3.0)
    got = sim.simulate(**flash_public(tissue), inv_efficiency=t(tissue["efficiency"]), states=10)  # 8 shifts

    def reference(flips=flips, tr=6.0, te=2.5, increment=117.0, spoiler=3.0):
        return flash_reference(flips, tr, te, rf_spoiling=increment, inversion_ms=8.0, spoiler_ms=spoiler, **tissue)

    check(got, reference(), VALUES, {
        "TR 1 % long": reference(tr=6.06),
        "TE 1 % long": reference(te=2.525),
        "every flip 1 degree more": reference(flips=flips + 1.0),
        "an RF-spoiling increment 1 degree more": reference(increment=118.0),
        "the spoiler 1 % long": reference(spoiler=3.03),
    })


def test_flash_shaped_pulses_against_a_hard_pulse_bloch_simulation():
    flips = np.array([10.0, 14.0, 18.0])
    tissue = FLASH_TISSUE
    sim = FLASHSimulator(flip=t(flips), TR=8.0, TE=3.0, nshots=3, pulse_duration=1.0, dwell=0.02)
    got = sim.simulate(**flash_public(tissue))

    def reference(te=3.0, window=hamming_sinc):
        return flash_reference(flips, 8.0, te, duration_ms=1.0, dwell_ms=0.02, window=window, **tissue)

    def hann(flip_rad, samples, bandwidth_time):  # the window a slip could give: Hann instead of Hamming
        x = (np.arange(samples) + 0.5) / samples - 0.5
        shape = np.sinc(bandwidth_time * x) * (0.5 + 0.5 * np.cos(2 * math.pi * x))
        return flip_rad * shape / shape.sum()

    check(got, reference(), VALUES, {
        "TE 1 % long": reference(te=3.03),
        "TE measured from the pulse start, not its centre": reference(te=2.5),
        "a Hann window": reference(window=hann),
    })


# -- balanced trains: TrueFISP and fmSSFP ---------------------------------------------------------------------
def balanced_reference(flips_deg, phases_rad, tr_ms, te_ms, *, t1, t2, b0, b1, m0, start_ms=0.0, sampled=None,
                       prepare=None, efficiency=1.0, inversion_ms=None, spoiler_ms=0.0, duration_ms=0.0,
                       dwell_ms=0.01):
    """A balanced train (nothing winds: the EPG stays in order 0, a single isochromat): an optional ideal
    inversion in the middle of `inversion_ms`, `spoiler_ms` and a spoiler; an optional preparation pulse
    `prepare` = (flip deg, phase rad, lead ms) whose centre is `lead` before the first pulse's; then pulse j
    (flip, phase) starting TR apart, sampled TE after its centre (when `sampled[j]`), demodulated by its phase.
    The raw engine value."""
    epg = Epg(1, t1, t2, b0)
    start = start_ms if inversion_ms is None else epg.inversion_prologue(inversion_ms, spoiler_ms, efficiency)
    if prepare is not None:
        flip, phase, lead = prepare
        play_pulse(epg, start, flip * DEG, phase, b1, duration_ms=duration_ms, dwell_ms=dwell_ms)
        start += lead
    out = []
    for j, (a, p) in enumerate(zip(flips_deg, phases_rad, strict=True)):
        play_pulse(epg, start + j * tr_ms, a * DEG, p, b1, duration_ms=duration_ms, dwell_ms=dwell_ms)
        if sampled is None or sampled[j]:
            epg.to(start + j * tr_ms + duration_ms / 2 + te_ms)
            out.append(m0 * epg.sample(p))
    return np.stack(out, -1)


@pytest.mark.parametrize("duration_ms", [0.0, 1.0])
def test_truefisp_against_an_independent_bloch_simulation(duration_ms):
    n, flip, tr = 8, 40.0, 4.0
    tissue = {**FLASH_TISSUE, "b0": np.array([0.0, 30.0, -55.0]), "efficiency": np.array([0.95, 1.0, 0.9])}
    sim = TrueFISPSimulator(flip=flip, TR=tr, nshots=n, pulse_duration=duration_ms, dwell=0.05, inversion="ideal",
                            spoiler=2.0)
    got = sim.simulate(**flash_public(tissue), inv_efficiency=t(tissue["efficiency"]))

    def reference(tr=tr, te=tr / 2, flips=(flip,) * n, prep=(flip / 2, math.pi, tr / 2), alternate=math.pi):
        phases = alternate * (np.arange(n) % 2)
        return balanced_reference(flips, phases, tr, te, prepare=prep, inversion_ms=10.0, spoiler_ms=2.0,
                                  duration_ms=duration_ms, dwell_ms=0.05, **tissue)

    # Shaped pulses: 9 pulses of 20 samples, each a float32 rotation (6.4e-6 seen against 4e-15 for the same
    # description on the float64 kernels); hard pulses: 6e-7, the default bound.
    tol = 2e-5 if duration_ms else VALUES
    check(got, reference(), tol, {
        "TR 1 % long": reference(tr=tr * 1.01, te=tr / 2, prep=(flip / 2, math.pi, tr / 2)),
        "TE 1 % long": reference(te=tr / 2 * 1.01),
        "every flip 1 degree more": reference(flips=(flip + 1,) * n, prep=((flip + 1) / 2, math.pi, tr / 2)),
        "the alpha/2 pulse at the first pulse's phase": reference(prep=(flip / 2, 0.0, tr / 2)),
        "the alpha/2 pulse 1 % early": reference(prep=(flip / 2, math.pi, tr / 2 * 1.01)),
        "no phase alternation": reference(alternate=0.0),
    })


def test_fmssfp_against_an_independent_bloch_simulation():
    flips, n, sweeps, tr = np.array([30.0, 35.0, 40.0, 45.0, 50.0]), 5, 2, 5.0
    tissue = {**FLASH_TISSUE, "b0": np.array([0.0, 25.0, -60.0])}
    got = fmSSFPSimulator(flip=t(flips), TR=tr, nshots=n, sweeps=sweeps).simulate(**flash_public(tissue))

    def reference(tr=tr, flips=flips, offset=0):
        # Foxall 2002: the RF phase advances by pi + 2 pi m / nshots from pulse m - 1 to pulse m of a sweep (m
        # counts from 0 in each sweep), continuously over `sweeps` unsampled sweeps and the sampled one.
        total = (sweeps + 1) * n
        steps = [0.0] + [math.pi + 2 * math.pi * ((j + offset) % n) / n for j in range(1, total)]
        phases = np.cumsum(steps)
        return balanced_reference(np.tile(flips, sweeps + 1), phases, tr, tr / 2,
                                  sampled=np.arange(total) >= sweeps * n, **tissue)

    check(got, reference(), VALUES, {
        "TR 1 % long": reference(tr=tr * 1.01),
        "every flip 1 degree more": reference(flips=flips + 1.0),
        "the frequency sweep one pulse late": reference(offset=-1),
    })


# -- CEST: pulsed saturation, a hard-pulse Bloch-McConnell simulation ------------------------------------------
def cest_reference(offsets_ppm, *, b1sat_ut, npulses, pulse_ms, delay_ms, recovery_ms, dwell_ms, t1, t2, b0, b1, m0,
                   pool, field_t=3.0, continuous_phase=True):
    """Z of water and one exchanging pool `pool` = (fraction, exchange Hz, T1, T2 ms, shift Hz) after pulsed
    saturation: per offset, from equilibrium, `npulses` rectangular pulses of B1sat at the offset, each played
    as one hard pulse at the midpoint of each dwell (phase -2 pi f t, continuous across pulses: the delays do
    not advance it, as pulseq-cest plays them), `delay_ms` apart; then spoiling, `recovery_ms`, a 90-degree read
    (B1 scales it). Between pulses the Bloch-McConnell equations (API.md 3.3: pool p gains k f_p of the free
    water and returns k f_free) are solved exactly. Returns M0 sin(90 B1) (Mz_water + Mz_pool), real."""
    fraction, k, t1b, t2b, shift = pool
    free = 1.0 - fraction
    out = []
    for offset in offsets_ppm:
        f_rf = offset * 1e-6 * GAMMA_BAR_HZ_PER_T * field_t
        a = np.zeros((7, 7))  # (Mx, My, Mz) of water, of the pool, and the constant 1
        for p, (r1, r2, hz, eq) in enumerate([(1e3 / t1, 1e3 / t2, b0, free), (1e3 / t1b, 1e3 / t2b, b0 + shift,
                                                                                fraction)]):
            x, y, z = 3 * p, 3 * p + 1, 3 * p + 2
            w = 2 * math.pi * hz  # F+ turns by -w t: dMx/dt = w My, dMy/dt = -w Mx
            a[x, x] = a[y, y] = -r2
            a[x, y], a[y, x] = w, -w
            a[z, z], a[z, 6] = -r1, r1 * eq
        for c in range(3):  # exchange, every component
            a[c, c] -= k * fraction
            a[c, 3 + c] += k * free
            a[3 + c, c] += k * fraction
            a[3 + c, 3 + c] -= k * free

        def evolve(m, ms, gen=a):
            return scipy.linalg.expm(gen * ms * 1e-3) @ m

        step = scipy.linalg.expm(a * dwell_ms * 1e-3)
        half = scipy.linalg.expm(a * dwell_ms * 0.5e-3)
        m = np.array([0, 0, free, 0, 0, fraction, 1.0])
        n = round(pulse_ms / dwell_ms)
        alpha = 2 * math.pi * GAMMA_BAR_HZ_PER_T * b1sat_ut * 1e-6 * dwell_ms * 1e-3 * b1
        for j in range(npulses):
            for s in range(n):
                m = half @ m if s == 0 else step @ m
                elapsed_ms = (j * pulse_ms if continuous_phase else 0.0) + (s + 0.5) * dwell_ms
                phase = -2 * math.pi * f_rf * elapsed_ms * 1e-3
                r = rotation(alpha, phase)
                m = np.concatenate([r @ m[:3], r @ m[3:6], m[6:]])
            m = half @ m
            if j < npulses - 1:
                m = evolve(m, delay_ms)
        m[[0, 1, 3, 4]] = 0.0  # spoiled
        m = evolve(m, recovery_ms)
        out.append(m0 * math.sin(math.pi / 2 * b1) * (m[2] + m[5]))
    return np.array(out)


def test_cest_against_a_hard_pulse_bloch_mcconnell_simulation():
    offsets = np.array([-3.0, -1.0, 0.5, 2.0, 4.0])
    ppm_hz = 1e-6 * GAMMA_BAR_HZ_PER_T * 3.0
    tissue = dict(t1=1000.0, t2=70.0, b0=20.0, b1=0.95, m0=1.1, pool=(0.01, 50.0, 900.0, 30.0, 2.0 * ppm_hz))
    protocol = dict(B1sat=2.0, npulses=2, pulse_duration=10.0, interpulse_delay=5.0, recovery=6.5, dwell=0.1)
    got = CESTSimulator(**protocol).simulate(
        offsets=t(offsets), T1=1000.0, T2=70.0, B0=20.0, B1=0.95, M0=1.1, poolB_fraction=0.01,
        poolB_exchange=50.0, poolB_T1=900.0, poolB_T2=30.0, poolB_shift=2.0 * ppm_hz)

    def reference(b1sat=2.0, delay=5.0, recovery=6.5, continuous=True, offsets=offsets):
        return cest_reference(offsets, b1sat_ut=b1sat, npulses=2, pulse_ms=10.0, delay_ms=delay,
                              recovery_ms=recovery, dwell_ms=0.1, continuous_phase=continuous, **tissue)

    # float32 over 200 hard pulses and their intervals: 3e-5 of the largest value (tests/test_cest.py measures the
    # engine against the oracle on one description at that bound).
    check(got, reference(), 3e-5, {
        "B1sat 1 % more": reference(b1sat=2.02),
        "every offset 1 % farther": reference(offsets=offsets * 1.01),
        "the interpulse delay 1 % long": reference(delay=5.05),
        "the recovery 5 % long": reference(recovery=6.825),  # 1 %, 0.065 ms, moves Z by 4e-5 only
        "each pulse starting at phase 0": reference(continuous=False),
    })
