"""Gradient lobes of finite duration: flow's first moment and diffusion's b-value, lobe by lobe.

Each shift is the lobe of one unit of dephasing, played at constant amplitude over the stretch of time between
its event and the neighbouring event that is not a plain WAIT (the oracle's module docstring, "Gradient
lobes"). A lobe shorter than the time between two pulses is written as its own stretch: a WAIT that shifts at
one end and a readout (or another event) at the other. Here spin echoes with unbalanced lobes of different
lengths and positions, a CPMG train whose crushers fill the half echo spacings and an MRF train whose
gradient fills each TR are held to `_isochromats` (spins across the voxel, moving at v; an exact b-value for
diffusion), a reference that knows nothing of EPG orders or of blochsim's description layer: the oracle, and
the kernels through engine.simulate (float64, real and complex paths).

Tolerance 1e-12 relative to the largest sample, for every comparison here: the reference averages the spins
of a uniform grid, which is exact (not a sample) for every EPG order below the spin count (the orders here
reach 60 of 4,000), and the EPG keeps every order that can return to 0; what is left is float64 round-off
over a few hundred operations per spin and per state (~1e-14 seen).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from _isochromats import Played, isochromat_signal, pathway_b_value
from conftest import rel_max_err

from blochsim._reference import play
from blochsim.engine import simulate
from blochsim.sequence import (
    EventAction,
    EventType,
    RfUse,
    SequenceDescription,
    SequenceEvent,
    TissueProperties,
    fse_description,
    mrf_description,
)
from blochsim.sequence.events import as_float
from blochsim.sequence.rf import ideal_rf_definition

E, A = SequenceEvent, EventAction
TOL = 1e-12  # see the module docstring
STATES = 8  # the spin echoes reach order 3; the CPMG train 2 x 6 = 12 is cut where no echo can come back

#: One turn of the crusher across a 0.1 mm voxel: dk = 6.3e4 rad/m. Over a 10 ms stretch, v = 2 mm/s turns
#: order 1 by 1.3 rad and washes out 20 %; D = 2.5 um^2/ms attenuates it by exp(-0.1).
CRUSHER_RAD = 2 * math.pi
VOXEL_M = 1e-4
DK = CRUSHER_RAD / VOXEL_M
T1_MS, T2_MS = 1000.0, 100.0
VELOCITIES = (0.002, -0.0013)  # m/s, one per voxel
DIFFUSIVITIES = (2.5, 0.7)  # um^2/ms, one per voxel


def ms(t: float) -> float:
    return t * 1e-3


# ---------------------------------------------------------------------------------------------
# Spin echoes with unbalanced lobes, written four ways
# ---------------------------------------------------------------------------------------------

#: Each layout: (events as (kind, t_ms, action, flip or None), lobes as (start_ms, duration_ms)). kind "rf"
#: is the excitation (t = 0) or the refocusing pulse (t = 10 ms), "adc" a readout, "wait" a WAIT. Lobe A
#: (before the refocusing pulse) and lobe B (after it) differ in length and in their distance from the pulse,
#: so the echo keeps a first moment (flow turns it) and each stretch without a gradient weighs the order it
#: holds (k^2, not Weigel's k^2 + k + 1/3 of a winding stretch).
LAYOUTS = {
    # A: a WAIT shifting after it opens it and a readout closes it; B: a readout opens it and a WAIT that
    # shifts ahead of itself closes it. The trailing WAIT's lobe runs across the end of the repetition.
    "after_then_before": (
        [("rf", 0, A.NONE), ("wait", 1, A.CRUSH_AFTER), ("adc", 3, A.NONE), ("rf", 10, A.NONE),
         ("adc", 12, A.NONE), ("wait", 12.5, A.CRUSH_BEFORE), ("adc", 20, A.NONE), ("adc", 26, A.NONE),
         ("wait", 27, A.SHIFT_AFTER)],
        [(1, 2), (12, 0.5), (27, 3)],
    ),
    "before_then_after": (
        [("rf", 0, A.NONE), ("adc", 1, A.NONE), ("wait", 3, A.CRUSH_BEFORE), ("rf", 10, A.NONE),
         ("wait", 12, A.SHIFT_AFTER), ("adc", 12.5, A.NONE), ("adc", 20, A.NONE), ("adc", 26, A.NONE)],
        [(1, 2), (12, 0.5)],
    ),
    # The refocusing pulse's own crushers, reaching back to a readout at 8 ms and on to one at 11 ms.
    "crushed_pulse": (
        [("rf", 0, A.NONE), ("adc", 8, A.NONE), ("rf", 10, A.CRUSH_BEFORE | A.CRUSH_AFTER), ("adc", 11, A.NONE),
         ("adc", 20, A.NONE), ("adc", 26, A.NONE)],
        [(8, 2), (10, 1)],
    ),
    # Three lobes in one stretch, two of them shifted in before it (a WAIT with CRUSH_AFTER and SHIFT_AFTER)
    # and one after (a CRUSH_BEFORE), and three to return: orders up to 3, a readout at order 3 between.
    "three_lobes": (
        [("rf", 0, A.NONE), ("wait", 1, A.CRUSH_AFTER | A.SHIFT_AFTER), ("wait", 3, A.CRUSH_BEFORE),
         ("adc", 5, A.NONE), ("rf", 10, A.NONE), ("wait", 12, A.CRUSH_AFTER | A.SHIFT_AFTER),
         ("adc", 12.5, A.CRUSH_BEFORE), ("adc", 20, A.NONE), ("adc", 26, A.NONE)],
        [(1, 2)] * 3 + [(12, 0.5)] * 3,
    ),
}
TR_MS = 30.0


def spin_echo(layout: str, *, excitation_rad: float, refocusing_rad: float, excitation_phase_rad: float = 0.0,
              repetitions: int = 1, plain_waits_ms: tuple = (), late_us=0.0) -> tuple:
    """(description, Played) of a layout: the same numbers, the one as blochsim events, the other as the
    reference's pulses, readouts and lobes over `repetitions` repetitions of TR_MS. Pulses: the excitation
    about `excitation_phase_rad`, the refocusing pulse about x. `plain_waits_ms`: WAITs without an action,
    added to the description only (they mark time and change nothing). `late_us` (a number or a 0-d tensor,
    description only) moves every event from the refocusing pulse on, and the end, that much later."""
    events, lobes = LAYOUTS[layout]
    items, made = [], []
    for kind, t, action in events:
        t_us = t * 1e3 + (late_us if t >= 10 else 0.0)
        if kind == "rf":
            flip, phase = (excitation_rad, excitation_phase_rad) if t == 0 else (refocusing_rad, 0.0)
            made.append(E.rf(t_us, 0, RfUse.EXCITATION if t == 0 else RfUse.REFOCUSING, flip, phase, action=action))
            items.append(("rf", ms(t), flip, phase))
        elif kind == "adc":
            made.append(E.adc(t_us, phase_rad=0.0, action=action))
            items.append(("adc", ms(t), 0.0))
        else:
            made.append(E.wait(t_us, action))
    made += [E.wait(t * 1e3) for t in plain_waits_ms]
    made.sort(key=lambda e: as_float(e.timestamp_us))  # stable: a plain WAIT lands after the events at its time
    description = SequenceDescription(0, TR_MS * 1e3 + late_us, tuple(made), {0: ideal_rf_definition(0)},
                                      crusher_dephasing_rad=CRUSHER_RAD, voxel_size_m=VOXEL_M)
    tr = ms(TR_MS)
    played = Played(
        items=tuple((item[0], item[1] + r * tr, *item[2:]) for r in range(repetitions) for item in items),
        lobes=tuple((ms(s) + r * tr, ms(d)) for r in range(repetitions) for s, d in lobes),
    )
    return description, played


def last_repetition(samples: np.ndarray, description: SequenceDescription) -> np.ndarray:
    per_repetition = sum(e.type == EventType.ADC for e in description.events)
    return samples[-per_repetition:]


def flowing_tissue() -> TissueProperties:
    return TissueProperties(T1_MS, T2_MS, velocity_m_per_s=torch.tensor(VELOCITIES, dtype=torch.float64))


def isochromats(played: Played, description) -> torch.Tensor:
    """The reference's samples of the last repetition, one row per voxel of flowing_tissue()."""
    rows = [last_repetition(isochromat_signal(played, t1_ms=T1_MS, t2_ms=T2_MS, velocity_m_per_s=v,
                                              crusher_dephasing_rad=CRUSHER_RAD, voxel_size_m=VOXEL_M),
                            description) for v in VELOCITIES]
    return torch.as_tensor(np.stack(rows))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_spin_echo_flow_matches_isochromats(layout):
    """Flow through a spin echo (80 / 150 degrees: FID, echo and stimulated pathways, played twice) whose
    lobes are unbalanced: the oracle and the kernels turn each stretch's states by its own first moment."""
    description, played = spin_echo(layout, excitation_rad=math.radians(80), refocusing_rad=math.radians(150),
                                    excitation_phase_rad=math.pi / 2, repetitions=2)
    expected = isochromats(played, description)
    oracle = play(description, flowing_tissue(), states=STATES, repetitions=2).signal
    engine = simulate(description, flowing_tissue(), states=STATES, repetitions=2, dtype=torch.float64,
                      path="complex")
    assert rel_max_err(oracle, expected) < TOL
    assert rel_max_err(engine, expected) < TOL


@pytest.mark.parametrize("path", ["real", "complex"])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_spin_echo_diffusion_matches_b_value(layout, path):
    """Diffusion through an ideal 90 / 180 spin echo with unbalanced lobes (both pulses about x, so the real path
    takes it too): one pathway carries the signal, so each sample is the diffusion-free one times exp(-D b), b
    the integral of k^2 over the pathway (each lobe weighs k^2 + k dk + dk^2 / 3 over its length, each stretch
    without a gradient k^2)."""
    description, played = spin_echo(layout, excitation_rad=math.pi / 2, refocusing_rad=math.pi)
    b = torch.as_tensor(pathway_b_value(played, DK))  # s/m^2, per sample
    still = torch.as_tensor(isochromat_signal(played, t1_ms=T1_MS, t2_ms=T2_MS, velocity_m_per_s=0.0,
                                              crusher_dephasing_rad=CRUSHER_RAD, voxel_size_m=VOXEL_M))
    d = torch.tensor(DIFFUSIVITIES, dtype=torch.float64)
    expected = still * torch.exp(-d[:, None] * 1e-9 * b)
    tissue = TissueProperties(T1_MS, T2_MS, diffusion_um2_per_ms=d)
    oracle = play(description, tissue, states=STATES).signal
    engine = simulate(description, tissue, states=STATES, dtype=torch.float64, path=path)
    assert float(b.max()) * DIFFUSIVITIES[0] * 1e-9 > 1e-3  # the attenuation is nine decades above TOL
    assert rel_max_err(oracle, expected) < TOL
    assert rel_max_err(engine, expected) < TOL


@pytest.mark.parametrize("layout", ["after_then_before", "three_lobes"])
def test_plain_waits_change_nothing(layout):
    """WAITs without an action, inside lobes and between them, only mark time: the oracle spreads a lobe over
    its whole stretch across them (and washes out over the stretch), as the engine, which drops them, does."""
    tissue = TissueProperties(T1_MS, T2_MS, velocity_m_per_s=torch.tensor(VELOCITIES, dtype=torch.float64),
                              diffusion_um2_per_ms=torch.tensor(DIFFUSIVITIES, dtype=torch.float64))
    plain, _ = spin_echo(layout, excitation_rad=math.radians(80), refocusing_rad=math.radians(150), repetitions=2)
    split, _ = spin_echo(layout, excitation_rad=math.radians(80), refocusing_rad=math.radians(150), repetitions=2,
                         plain_waits_ms=(0.0, 2.0, 3.0, 7.5, 12.2, 28.0, 29.0))
    expected = play(plain, tissue, states=STATES, repetitions=2).signal
    assert rel_max_err(play(split, tissue, states=STATES, repetitions=2).signal, expected) < TOL
    engine = simulate(split, tissue, states=STATES, repetitions=2, dtype=torch.float64, path="complex")
    assert rel_max_err(engine, expected) < TOL


# ---------------------------------------------------------------------------------------------
# The builders: CPMG crushers fill the half echo spacings, MRF's gradient fills each TR
# ---------------------------------------------------------------------------------------------


def test_cpmg_flow_matches_isochromats():
    """fse_description's crushers (CRUSH_BEFORE and CRUSH_AFTER on each refocusing pulse) each fill a half
    echo spacing, from the echo (or excitation) before to the pulse and from the pulse to its echo. Flow with
    150-120 degree refocusing: every pathway's stretches turn by their own first moments."""
    esp_ms, flips = 10.0, torch.tensor([150.0, 140.0, 130.0, 120.0, 135.0, 145.0]) * math.pi / 180
    description = fse_description(flips, ms(esp_ms), crusher_dephasing_rad=CRUSHER_RAD, voxel_size_m=VOXEL_M)
    items = [("rf", 0.0, math.pi / 2, math.pi / 2)]
    lobes = []
    for j, flip in enumerate(flips.tolist()):
        items += [("rf", ms((j + 0.5) * esp_ms), flip, 0.0), ("adc", ms((j + 1) * esp_ms), 0.0)]
        lobes += [(ms(j * esp_ms), ms(esp_ms / 2)), (ms((j + 0.5) * esp_ms), ms(esp_ms / 2))]
    played = Played(tuple(items), tuple(lobes))
    expected = isochromats(played, description)
    oracle = play(description, flowing_tissue(), states=2 * len(flips) + 1).signal
    engine = simulate(description, flowing_tissue(), states=2 * len(flips) + 1, dtype=torch.float64,
                      path="complex")
    assert rel_max_err(oracle, expected) < TOL
    assert rel_max_err(engine, expected) < TOL


def test_mrf_flow_matches_isochromats():
    """MRF (FISP): the winding after each readout fills the TR up to the next pulse. The sample at the pulse is
    blind to where in the TR the gradient plays (a uniform turn of every transverse state per TR, as an
    off-resonance, cancels on the way back to order 0), so this held before lobes were placed too; kept."""
    n, tr_ms = 60, 8.0
    flips = (10.0 + 50.0 * torch.sin(torch.arange(n, dtype=torch.float64) * 0.13) ** 2) * math.pi / 180
    description = mrf_description(flips, ms(tr_ms), inversion=False, crusher_dephasing_rad=CRUSHER_RAD,
                                  voxel_size_m=VOXEL_M)
    items, lobes = [], []
    for j, flip in enumerate(flips.tolist()):
        items += [("rf", ms(j * tr_ms), flip, 0.0), ("adc", ms(j * tr_ms), 0.0)]
        lobes.append((ms(j * tr_ms), ms(tr_ms)))
    played = Played(tuple(items), tuple(lobes))
    expected = isochromats(played, description)
    oracle = play(description, flowing_tissue(), states=n + 1).signal
    engine = simulate(description, flowing_tissue(), states=n + 1, dtype=torch.float64, path="complex")
    assert rel_max_err(oracle, expected) < TOL
    assert rel_max_err(engine, expected) < TOL


# ---------------------------------------------------------------------------------------------
# The kernels' other layouts and derivatives on lobed stretches, against the oracle
# ---------------------------------------------------------------------------------------------

#: Kernels against the oracle, derivatives: 1e-10 relative, as tests/test_engine_derivatives.py (float64
#: round-off of a cancelling sum over events, ~1e-13 seen there).
FIRST = 1e-10


@pytest.mark.parametrize("layout", LAYOUTS)
def test_pools_take_the_lobes(layout):
    """The tabulated layout (a second water pool exchanging with free water) applies the same lobes."""
    tissue = TissueProperties(T1_MS, T2_MS, velocity_m_per_s=torch.tensor(VELOCITIES, dtype=torch.float64),
                              diffusion_um2_per_ms=torch.tensor(DIFFUSIVITIES, dtype=torch.float64),
                              pool_b_fraction=0.2, pool_b_exchange_hz=30.0, t1_pool_b_ms=800.0, t2_pool_b_ms=40.0,
                              pool_b_shift_hz=15.0)
    description, _ = spin_echo(layout, excitation_rad=math.radians(80), refocusing_rad=math.radians(150),
                               excitation_phase_rad=math.pi / 2, repetitions=2)
    expected = play(description, tissue, states=STATES, repetitions=2).signal
    engine = simulate(description, tissue, states=STATES, repetitions=2, dtype=torch.float64, path="complex")
    assert rel_max_err(engine, expected) < TOL


@pytest.mark.parametrize("pools", [False, True])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_lobe_gradients_match_oracle(layout, pools):
    """Reverse mode through engine.simulate (the VJP kernel; with a second pool, its tabulated adjoint) against
    autograd through the oracle, for D, v and the time of the refocusing pulse (every later event moves with
    it: the stretch before it lengthens, the lobed ones keep their length): the order weights of every
    stretch enter the adjoint's parameter sums."""

    def gradients(run):
        d = torch.tensor(DIFFUSIVITIES, dtype=torch.float64, requires_grad=True)
        v = torch.tensor(VELOCITIES, dtype=torch.float64, requires_grad=True)
        late_us = torch.tensor(400.0, dtype=torch.float64, requires_grad=True)
        description, _ = spin_echo(layout, excitation_rad=math.radians(80), refocusing_rad=math.radians(150),
                                   excitation_phase_rad=math.pi / 2, repetitions=2, late_us=late_us)
        extra = {"pool_b_fraction": 0.2, "pool_b_exchange_hz": 30.0, "t2_pool_b_ms": 40.0} if pools else {}
        tissue = TissueProperties(T1_MS, T2_MS, diffusion_um2_per_ms=d, velocity_m_per_s=v, **extra)
        signal = run(description, tissue)
        weights = torch.linspace(0.5, 1.5, signal.shape[-1], dtype=torch.float64)
        loss = ((signal.real - 0.1) ** 2 * weights + signal.imag ** 3).sum()
        return torch.autograd.grad(loss, (d, v, late_us))

    expected = gradients(lambda desc, t: play(desc, t, states=STATES, repetitions=2).signal)
    got = gradients(lambda desc, t: simulate(desc, t, states=STATES, repetitions=2, dtype=torch.float64,
                                             path="complex"))
    for name, g, want in zip(("D", "v", "late_us"), got, expected, strict=True):
        assert rel_max_err(g, want) < FIRST, name
