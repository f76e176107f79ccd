"""The train axis (API.md 1.4): event values of shape (trains,) give (trains, *voxel_shape, samples).

The engine runs one program per train from the sliced values, so a run with a train axis must equal the
separate single-train runs stacked first: values, Jacobians and gradients. The separate runs play the
same float64 values through the same float32 kernels; they may differ only where a value is computed in
another order (a builder's vectorized rows against one row), hence 1e-6 of the largest entry (float32
rounding), not bit equality.
"""

from __future__ import annotations

import math

import pytest
import torch
from conftest import column_rel_err, rel_max_err

from blochsim import engine
from blochsim.engine import TrainAxisError, compile_program, split_trains
from blochsim.model import BALANCED, Simulator, SpinPhysics
from blochsim.sequence import EpgEngine, SequenceDescription, TissueProperties, mrf_description, pack_description
from blochsim.sequence.events import RfUse, SequenceEvent
from blochsim.sequence.operators import Delay, Excitation, Readout, SampledPulse, Spoil
from blochsim.simulators import (
    FLASHSimulator,
    MPnRAGESimulator,
    MPRAGESimulator,
    MRFSimulator,
    StimulatedEchoSimulator,
    TrueFISPSimulator,
    fmSSFPSimulator,
)

F64 = torch.float64
TISSUE = TissueProperties(t1_ms=torch.tensor([800.0, 1200.0]), t2_ms=torch.tensor([60.0, 90.0]))
REL = 1e-6  # float32 rounding of values computed in another order (module doc)


def flips(trains: int, n: int) -> torch.Tensor:
    return torch.deg2rad(torch.linspace(5.0, 60.0, trains * n, dtype=F64)).reshape(trains, n).flip(1)


# -- the engine ---------------------------------------------------------------------------------------
def test_engine_stacks_trains_values_jacobian_and_gradients():
    flip = flips(3, 12).requires_grad_()  # (trains, N)
    description = mrf_description(flip, 0.01, inversion_time_s=0.02)
    one = [mrf_description(flip[k], 0.01, inversion_time_s=0.02) for k in range(3)]

    got = engine.simulate(description, TISSUE, states=10)
    want = torch.stack([engine.simulate(d, TISSUE, states=10) for d in one])
    assert got.shape == (3, 2, 12) and rel_max_err(got, want) < REL

    (grad,) = torch.autograd.grad(got.abs().square().sum(), flip)
    (separate,) = torch.autograd.grad(want.abs().square().sum(), flip)
    assert rel_max_err(grad, separate) < REL and grad.abs().min() > 0  # every train's flips are reached

    signal, J = engine.jacobian(description, TISSUE, ("t1_ms", "t2_ms"), states=10)
    runs = [engine.jacobian(d, TISSUE, ("t1_ms", "t2_ms"), states=10) for d in one]
    assert signal.shape == (3, 2, 12) and J.shape == (3, 2, 2, 12)
    assert rel_max_err(signal, torch.stack([s for s, _ in runs])) < REL
    assert column_rel_err(J, torch.stack([j for _, j in runs])) < REL  # per column: T1 and T2 (conftest)


def test_engine_trains_of_phases_and_frequencies():
    # RF and ADC phases per train (the complex path), and SampledPulse offsets per train, which the
    # semisolid lineshape reads from each pulse's frequency.
    phase = torch.tensor([0.0, 0.7, 2.0], dtype=F64)
    offset = torch.tensor([-300.0, 0.0, 500.0], dtype=F64)
    w = torch.full((16,), 2 * math.pi * 150.0, dtype=F64)

    def description(p, f):
        return SequenceDescription.from_operators(
            SampledPulse(w, 1e-4, phase_rad=p, offset_hz=f), Spoil(), Delay(1e-3),
            Excitation(math.pi / 3, p), Readout(p), Delay(5e-3), Excitation(math.pi / 4, 2 * p), Readout(2 * p))

    tissue = TissueProperties(t1_ms=1000.0, t2_ms=torch.tensor([50.0, 70.0]), bound_fraction=0.1,
                              bound_exchange_hz=20.0, t1_bound_ms=1000.0, t2_bound_ms=0.009)
    got = engine.simulate(description(phase, offset), tissue, states=4)
    want = torch.stack([engine.simulate(description(phase[k], offset[k]), tissue, states=4) for k in range(3)])
    assert got.shape == (3, 2, 2) and rel_max_err(got, want) < REL


def test_train_lengths_must_agree():
    mixed = SequenceDescription.from_operators(Excitation(torch.tensor([0.1, 0.2], dtype=F64)),
                                               Readout(torch.tensor([0.0, 1.0, 2.0], dtype=F64)))
    with pytest.raises(ValueError, match=r"rf_amplitude_hz has 2 entries and events\[1\].adc_phase_rad has 3"):
        engine.simulate(mixed, TISSUE)
    square = SequenceDescription(0, 10.0, (SequenceEvent.rf(0.0, 0, RfUse.EXCITATION, torch.ones(2, 2)),
                                           SequenceEvent.adc(1.0)), {0: mixed.rf_definitions[0]})
    with pytest.raises(ValueError, match=r"events\[0\].rf_amplitude_hz has shape \(2, 2\)"):
        engine.simulate(square, TISSUE)


def test_split_trains_and_the_program_cache():
    single = mrf_description(flips(1, 6)[0], 0.01)
    assert split_trains(single) is None
    assert compile_program(single, states=8) is not None  # one train compiles as before, and is kept
    assert compile_program(single, states=8).flip_rad is compile_program(single, states=8).flip_rad

    constant = mrf_description(flips(2, 6), 0.01)
    with pytest.raises(TrainAxisError) as error:  # a NotImplementedError for callers of one train
        compile_program(constant, states=8)
    assert len(error.value.parts) == 2 and split_trains(constant) is error.value.parts  # split once, kept
    part = error.value.parts[1]
    assert compile_program(part, states=8).flip_rad is compile_program(part, states=8).flip_rad

    differentiated = mrf_description(flips(2, 6).requires_grad_(), 0.01)
    assert split_trains(differentiated) is not split_trains(differentiated)  # fresh graphs every call


# -- simulators ---------------------------------------------------------------------------------------
def test_mrf_trains_equal_separate_calls():
    sim = MRFSimulator(TI=20.0)
    flip = torch.rad2deg(flips(2, 10))
    tissue = dict(T1=torch.tensor([800.0, 1200.0]), T2=60.0)
    per_tr = torch.linspace(8, 14, 20, dtype=F64).reshape(2, 10)
    # a shared TR (flips per train: the engine's train axis); a TR per train, (2, 1) or (2, N): one layout each
    for tr, rows in ((10.0, (10.0, 10.0)), (torch.tensor([[9.0], [12.0]]), (9.0, 12.0)), (per_tr, per_tr.unbind())):
        got = sim.simulate(flip=flip, TR=tr, **tissue)
        want = torch.stack([sim.simulate(flip=flip[k], TR=rows[k], **tissue) for k in (0, 1)])
        assert got.shape == (2, 2, 10) and rel_max_err(got, want) < REL

    signal, J = sim.jacobian(("T1", "T2"), flip=flip, TR=10.0, **tissue)
    _, J1 = sim.jacobian(("T1", "T2"), flip=flip[1], TR=10.0, **tissue)
    assert J.shape == (2, 2, 2, 10) and column_rel_err(J[1], J1) < REL
    assert sim.simulate(flip=flip[:1], TR=10.0, **tissue).shape == (1, 2, 10)  # one row keeps its axis

    with pytest.raises(ValueError, match="flip has 2, phases has 3 trains"):
        sim.simulate(flip=flip, TR=10.0, phases=torch.zeros(3, 10), **tissue)
    with pytest.raises(ValueError, match="describe\\(\\) one train at a time"):
        sim.describe(flip=flip, TR=torch.full((2, 1), 10.0))
    assert sim.describe(flip=flip, TR=10.0).events[2].rf_amplitude_hz.shape == (2,)


def test_custom_simulator_with_a_per_train_argument():
    class PhaseCycled(Simulator):
        """A balanced train whose RF phase advances by `increment` (deg, one per train) each TR."""

        model = SpinPhysics(operators=BALANCED)

        def layout(self, *, flip, increment, TR=5.0, n=8):
            a, step = torch.deg2rad(torch.as_tensor(flip, dtype=F64)), torch.deg2rad(increment)
            return [self.operators.excitation(a, k * step) @ self.operators.readout(k * step, duration_s=TR * 1e-3)
                    for k in range(n)]

    sim = PhaseCycled(flip=30.0)
    increment = torch.tensor([0.0, 90.0, 180.0], dtype=F64, requires_grad=True)
    tissue = dict(T1=1000.0, T2=torch.tensor([50.0, 100.0]), B0=torch.tensor([[0.0], [20.0]]))
    got = sim.simulate(increment=increment, **tissue)
    want = torch.stack([sim.simulate(increment=increment[k], **tissue) for k in range(3)])
    assert got.shape == (3, 2, 2, 8) and rel_max_err(got, want) < REL
    (grad,) = torch.autograd.grad(got.real.sum(), increment)
    (separate,) = torch.autograd.grad(want.real.sum(), increment)
    assert rel_max_err(grad, separate) < REL

    _, J = sim.jacobian("T2", increment=increment.detach(), **tissue)
    assert J.shape == (3, 2, 2, 8)
    assert rel_max_err(J[2], sim.jacobian("T2", increment=increment[2].detach(), **tissue)[1]) < REL
    raw = Simulator.from_description(sim.describe(increment=increment.detach()), model=PhaseCycled.model)
    assert rel_max_err(raw.simulate(**tissue), want.detach()) < REL


def test_epg_engine_stacks_trains_under_one_set_of_labels():
    flip = flips(2, 6)
    description = mrf_description(flip, 0.01, inversion_time_s=0.02)
    one = [mrf_description(flip[k], 0.01, inversion_time_s=0.02) for k in (0, 1)]
    for settings in (dict(repetitions=1), dict(repetitions=3, record_every=True), dict(repetitions="auto")):
        packed = pack_description(description, **settings)
        assert len(packed.trains) == 2
        got = EpgEngine().simulate(description, TISSUE, events=packed)
        want = [EpgEngine().simulate(d, TISSUE, events=pack_description(d, **settings)) for d in one]
        assert got.signal.shape == (2,) + tuple(want[0].signal.shape), settings
        assert rel_max_err(got.signal, torch.stack([w.signal for w in want])) < REL, settings
        for label in ("time_us", "event_index", "repetition", "echo", "echo_index"):
            assert torch.equal(getattr(got, label), getattr(want[0], label)), (settings, label)
    assert EpgEngine().simulate(description, TISSUE).signal.shape == (2, 2, 6)  # packed on the way
    assert pack_description(one[0]).trains == ()


# -- the per-shot layouts -----------------------------------------------------------------------------
PER_SHOT = [  # (simulator, extra tissue); 4 shots each
    pytest.param(MPnRAGESimulator(nshots=4, TR=10.0, TI=20.0), {}, id="mpnrage"),
    pytest.param(MPRAGESimulator(TI=900.0, TRspgr=8.0, nshots=4), {}, id="mprage"),
    pytest.param(FLASHSimulator(TR=10.0, TE=3.0, nshots=4), dict(T2=60.0), id="flash-shaped"),  # sample by sample
    pytest.param(FLASHSimulator(TR=10.0, TE=3.0, nshots=4, pulse_duration=0.0, rf_spoiling=117.0), dict(T2=60.0),
                 id="flash-rf-spoiled"),
    pytest.param(TrueFISPSimulator(TR=10.0, nshots=4), dict(T2=60.0, B0=torch.tensor([[0.0], [15.0]])),
                 id="truefisp-shaped"),
    pytest.param(fmSSFPSimulator(TR=10.0, nshots=4), dict(T2=60.0, B0=15.0), id="fmssfp"),
    pytest.param(fmSSFPSimulator(TR=10.0, nshots=4, pulse_duration=1.0), dict(T2=60.0), id="fmssfp-shaped"),
]


# A pulse played sample by sample is hundreds of small steps: each float32 run of the sampled FLASH is
# within 2.2e-6 of the same run in float64 (the column and the separate calls, 2026-12-03), so two runs whose
# event values differ in their last bit may differ by the two errors together.
SAMPLED_REL = 5e-6


@pytest.mark.parametrize("sim, extra", PER_SHOT)
def test_per_shot_flips_with_a_train_axis_equal_separate_calls(request, sim, extra):
    flip = torch.tensor([[5.0, 7.0, 9.0, 11.0], [10.0, 12.0, 14.0, 16.0], [20.0, 15.0, 10.0, 5.0]], dtype=F64)
    tissue = dict(T1=torch.tensor([800.0, 1200.0]), **extra)
    tol = SAMPLED_REL if "shaped" in request.node.callspec.id else REL
    got = sim.simulate(flip=flip, **tissue)
    want = torch.stack([sim.simulate(flip=flip[k], **tissue) for k in range(3)])
    assert got.shape == want.shape and got.shape[0] == 3 and rel_max_err(got, want) < tol
    column = sim.simulate(flip=flip[:, :1], **tissue)  # (trains, 1): one flip per train, every shot
    assert rel_max_err(column, torch.stack([sim.simulate(flip=flip[k, 0], **tissue) for k in range(3)])) < tol

    if isinstance(sim, (FLASHSimulator, MPRAGESimulator)):  # gradients reach every train's flips
        a, b = flip.clone().requires_grad_(), flip.clone().requires_grad_()
        sim.simulate(flip=a, **tissue).abs().sum().backward()
        torch.stack([sim.simulate(flip=b[k], **tissue) for k in range(3)]).abs().sum().backward()
        # The gradients sum the same sampled steps in float32 as the values: the same bound (1.2e-6 seen for
        # the sampled FLASH with the host's SIMD-lane kernels, 2026-12-04).
        assert rel_max_err(a.grad, b.grad) < tol and a.grad.abs().sum(1).min() > 0


def test_per_train_phases_of_the_spoiled_trains():
    flip = torch.tensor([[5.0, 7.0, 9.0, 11.0], [10.0, 12.0, 14.0, 16.0]], dtype=F64)
    phases = torch.tensor([[0.0, 10.0, 30.0, 60.0], [0.0, 50.0, 150.0, 300.0]], dtype=F64)
    tissue = dict(T1=torch.tensor([800.0, 1200.0]), B0=torch.tensor([[0.0], [10.0]]))
    for sim in (MPnRAGESimulator(nshots=4, TR=10.0, TI=20.0), MPRAGESimulator(TI=900.0, TRspgr=8.0, nshots=4)):
        got = sim.simulate(flip=flip, phases=phases, **tissue)
        want = torch.stack([sim.simulate(flip=flip[k], phases=phases[k], **tissue) for k in (0, 1)])
        assert rel_max_err(got, want) < REL
        shared = sim.simulate(flip=flip[0], phases=phases, **tissue)  # a 1-D flip is shared by the trains
        assert rel_max_err(shared, torch.stack([sim.simulate(flip=flip[0], phases=p, **tissue) for p in phases])) < REL


def test_stimulated_echo_trains_and_per_shot_shape_errors():
    sim = StimulatedEchoSimulator(TE=20.0, TM=30.0)
    flip = torch.tensor([[90.0, 90.0, 90.0], [60.0, 70.0, 80.0]])
    tissue = dict(T1=torch.tensor([800.0, 1200.0]), T2=60.0)
    got = sim.simulate(flip=flip, **tissue)
    assert got.shape == (2, 2, 2)
    assert rel_max_err(got, torch.stack([sim.simulate(flip=f, **tissue) for f in flip])) < REL
    with pytest.raises(ValueError, match=r"flip must be a scalar .* 3 flips, or one row per train, \(trains, 3\)"):
        sim.simulate(flip=torch.ones(2, 2), **tissue)
    mpnrage = MPnRAGESimulator(nshots=4, flip=7.0)
    with pytest.raises(ValueError, match=r"flip must be .* \(trains, 4\) or \(trains, 1\); got shape \(2, 3\)"):
        mpnrage.simulate(flip=torch.ones(2, 3), TR=10.0, T1=900.0)
    with pytest.raises(ValueError, match=r"TR must be a scalar \(ms\) or one value per shot \(4\); got shape"):
        mpnrage.simulate(TR=torch.full((2, 4), 10.0), T1=900.0)  # a duration sets the shared timeline
