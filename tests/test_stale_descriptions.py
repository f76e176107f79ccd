"""A kept program never serves the values of a description tensor that has since changed in place.

The engine keeps a description's compiled program on it (`engine.program.compile_program`), a
`from_description` simulator keeps it in its structure cache, and `pack_description` in its packing. Each is
reused only while the tensors its values were read from keep their version counters (an in-place change
bumps the counter) and do not require grad. Each test changes a tensor in place between two calls and
holds the second call, values and gradients, to the same call on a description built afresh from the new
values, which no cache has seen: the results must be identical (the same kernels on the same numbers), not
merely close. A wrong (stale) value differs by orders more than round-off.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from blochsim import engine
from blochsim.model import UNBALANCED, Simulator, SpinPhysics
from blochsim.sequence import (
    EpgEngine,
    EventType,
    Excitation,
    RfUse,
    SequenceDescription,
    SSFPFidReadout,
    TissueProperties,
    fse_description,
    mrf_description,
    pack_description,
)
from blochsim.simulators import MRFSimulator

F64 = torch.float64
N = 24
T1_MS = torch.tensor([700.0, 1100.0, 1600.0])
T2_MS = torch.tensor([45.0, 80.0, 120.0])


def tissue(t1=T1_MS):
    return TissueProperties(t1_ms=t1, t2_ms=T2_MS)


def builder(flips):
    """A builder's description (its columns laid out beside the events, sources named)."""
    return mrf_description(flips, 0.01)


def operators(flips):
    """The same train from operators (walked by the compiler); events hold views `flips[k]` of `flips`.
    (Not `flips.unbind()`: torch refuses to differentiate through the views of a multi-output view op once
    their base changed in place, whatever holds them.)"""
    return SequenceDescription.from_operators(
        *[Excitation(flips[k]) @ SSFPFidReadout(duration_s=0.01) for k in range(len(flips))])


def trains(flips):
    """Four trains of six refocusing pulses (a `(trains,)` value per event, views of `flips`): one program per
    train, the parts kept on the description."""
    return fse_description(flips.view(4, 6), 0.01)


MAKERS = {"builder": builder, "operators": operators, "trains": trains}


def flip_ramp(**kwargs):
    return torch.linspace(0.2, 0.7, N, dtype=F64, **kwargs)


def change(flips):
    with torch.no_grad():
        flips[3] = 0.05
        flips[7] += 0.3


@pytest.mark.parametrize("make", list(MAKERS))
def test_engine_simulate_sees_an_in_place_change(make):
    flips = flip_ramp()
    description = MAKERS[make](flips)
    before = engine.simulate(description, tissue(), states=8)
    engine.simulate(description, tissue(), states=8)  # served from the kept program
    change(flips)
    after = engine.simulate(description, tissue(), states=8)
    fresh = engine.simulate(MAKERS[make](flips.clone()), tissue(), states=8)
    assert torch.equal(after, fresh)
    assert not torch.allclose(after, before)  # the change shows: the check above proves something


@pytest.mark.parametrize("make", list(MAKERS))
def test_engine_gradients_see_an_in_place_change(make):
    """Along the tissue (the kept program is constant) and along the flips (compiled every call)."""
    flips = flip_ramp()
    description = MAKERS[make](flips)
    t1 = T1_MS.clone().requires_grad_()
    engine.simulate(description, tissue(t1), states=8).abs().sum().backward()
    change(flips)
    t1.grad = None
    engine.simulate(description, tissue(t1), states=8).abs().sum().backward()
    t1_fresh = T1_MS.clone().requires_grad_()
    engine.simulate(MAKERS[make](flips.clone()), tissue(t1_fresh), states=8).abs().sum().backward()
    assert torch.equal(t1.grad, t1_fresh.grad)

    flips = flip_ramp(requires_grad=True)
    description = MAKERS[make](flips)
    engine.simulate(description, tissue(), states=8).abs().sum().backward()
    change(flips)
    flips.grad = None
    engine.simulate(description, tissue(), states=8).abs().sum().backward()
    fresh = flips.detach().clone().requires_grad_()
    engine.simulate(MAKERS[make](fresh), tissue(), states=8).abs().sum().backward()
    assert torch.equal(flips.grad, fresh.grad)


def test_a_tensor_made_to_require_grad_after_the_program_was_kept():
    flips = flip_ramp()
    description = builder(flips)
    engine.simulate(description, tissue(), states=8)  # kept: nothing requires grad
    flips.requires_grad_()
    engine.simulate(description, tissue(), states=8).abs().sum().backward()
    fresh = flips.detach().clone().requires_grad_()
    engine.simulate(builder(fresh), tissue(), states=8).abs().sum().backward()
    assert flips.grad is not None and torch.equal(flips.grad, fresh.grad)


def test_a_description_of_numpy_values_holds_copies():
    """A NumPy array changes in place without a version counter: the builders and operators copy it, so a
    description is what it was built from, before and after the array changes."""
    flips = np.linspace(0.2, 0.7, N)
    description = builder(flips)
    per_train = np.array([0.3, 0.6])
    pulse = Excitation(per_train).emit(0.0)[0]
    flips[3], per_train[0] = 0.05, 0.05
    amplitudes = [float(e.rf_amplitude_hz) for e in description.events if e.type == EventType.RF
                  and e.rf_use == RfUse.EXCITATION]
    assert amplitudes == np.linspace(0.2, 0.7, N).tolist()
    assert pulse.rf_amplitude_hz.tolist() == [0.3, 0.6]


def test_epg_engine_with_a_packed_description():
    flips = flip_ramp()
    description = builder(flips)
    packed = pack_description(description, nstates=8)
    EpgEngine().simulate(description, tissue(), events=packed, nstates=8)
    change(flips)
    after = EpgEngine().simulate(description, tissue(), events=packed, nstates=8).signal
    assert torch.equal(after, engine.simulate(builder(flips.clone()), tissue(), states=8))
    # A differentiated description is compiled on every call: a kept program's graph is freed by the
    # first backward, and the second would fail.
    flips = flip_ramp(requires_grad=True)
    description = builder(flips)
    packed = pack_description(description, nstates=8)
    grads = []
    for _ in range(2):
        EpgEngine().simulate(description, tissue(), events=packed, nstates=8).signal.abs().sum().backward()
        grads.append(flips.grad)
        flips.grad = None
    assert torch.equal(grads[0], grads[1])


def test_from_description_sees_an_in_place_change():
    model = SpinPhysics(operators=UNBALANCED)
    flips = flip_ramp()
    sim = Simulator.from_description(operators(flips), model=model, states=8)
    before = sim.simulate(T1=T1_MS, T2=T2_MS)
    change(flips)
    after = sim.simulate(T1=T1_MS, T2=T2_MS)
    fresh = Simulator.from_description(operators(flips.clone()), model=model, states=8).simulate(T1=T1_MS, T2=T2_MS)
    assert torch.equal(after, fresh) and not torch.allclose(after, before)


def test_from_description_gradients_after_no_grad_and_an_in_place_change():
    """A first call under no_grad keeps nothing that a later call with grad would need."""
    model = SpinPhysics(operators=UNBALANCED)
    flips = flip_ramp(requires_grad=True)
    sim = Simulator.from_description(operators(flips), model=model, states=8)
    with torch.no_grad():
        sim.simulate(T1=T1_MS, T2=T2_MS)
    change(flips)
    sim.simulate(T1=T1_MS, T2=T2_MS).abs().sum().backward()
    fresh = flips.detach().clone().requires_grad_()
    Simulator.from_description(operators(fresh), model=model, states=8).simulate(T1=T1_MS, T2=T2_MS).abs().sum(
    ).backward()
    assert flips.grad is not None and torch.equal(flips.grad, fresh.grad)


@pytest.mark.parametrize("dtype", [torch.float32, F64], ids=str)
def test_simulator_with_a_bound_protocol_tensor(dtype):
    """The structure cache's states (first call, resolution, verification, resolved) each see the change."""
    flips_deg = torch.linspace(10.0, 40.0, N, dtype=dtype)
    sim = MRFSimulator(flip=flips_deg, TR=10.0, states=8)
    for step in range(4):
        with torch.no_grad():
            flips_deg[step] += 5.0
        got = sim.simulate(T1=T1_MS, T2=T2_MS)
        fresh = MRFSimulator(flip=flips_deg.clone(), TR=10.0, states=8).simulate(T1=T1_MS, T2=T2_MS)
        # The resolved call evaluates the affine map A p + b where a walk compiles the layout: the same
        # float64 values to rounding (1e-16 relative), which the float32 kernels cannot tell apart beyond
        # a few ulps of the largest sample.
        torch.testing.assert_close(got, fresh, rtol=0, atol=1e-6 * float(fresh.abs().max()))

    flips_deg = torch.linspace(10.0, 40.0, N, dtype=dtype, requires_grad=True)
    sim = MRFSimulator(flip=flips_deg, TR=10.0, states=8)
    for step in range(4):
        with torch.no_grad():
            flips_deg[step] += 5.0
        flips_deg.grad = None
        sim.simulate(T1=T1_MS, T2=T2_MS).abs().sum().backward()
        fresh = flips_deg.detach().clone().requires_grad_()
        MRFSimulator(flip=fresh, TR=10.0, states=8).simulate(T1=T1_MS, T2=T2_MS).abs().sum().backward()
        # As above, through the float32 backward kernels: a few ulps of the largest entry.
        torch.testing.assert_close(flips_deg.grad, fresh.grad, rtol=0, atol=1e-5 * float(fresh.grad.abs().max()))
