"""`torch.func.vmap` over `simulate` (API.md 2.4) and the torch.func transforms nested with it.

Under vmap the engine runs one ordinary call per batch entry (`blochsim.engine.vmap`), so every result
must equal a Python loop of the same calls stacked first. Both run the same float32 kernels on the same
values; they may differ only by float32 rounding where a value is formed in another order (a slice of a
batch against a tensor made alone), hence a relative tolerance of 1e-6 rather than bit equality.
Derivatives from different modes (reverse against forward) round differently in float32 over the
8-event train: 1e-5 of the largest entry.
"""

from __future__ import annotations

import pytest
import torch
from conftest import column_rel_err, rel_max_err
from torch.func import grad, jacfwd, jacrev, vmap

from blochsim import engine
from blochsim.sequence import EpgEngine, TissueProperties, mrf_description
from blochsim.simulators import FSESimulator, MRFSimulator

F64 = torch.float64
REL = 1e-6  # float32 rounding of values formed in another order (module doc)
MODES = 1e-5  # reverse against forward mode, float32 over 8 events (module doc)
FLIPS = torch.linspace(10.0, 40.0, 8)
FLIP_BATCH = torch.stack([FLIPS, 1.5 * FLIPS, 0.5 * FLIPS])  # (3, 8): three protocols
T1 = torch.tensor([800.0, 1200.0])
T1_BATCH = torch.tensor([[800.0, 1200.0], [900.0, 1000.0], [500.0, 700.0]])  # (3, 2): three T1 maps


def mrf(flip, t1):
    return MRFSimulator(TR=10.0, TI=20.0).simulate(flip=flip, T1=t1, T2=60.0)


# -- the engine -----------------------------------------------------------------------------------
def test_engine_vmap_over_tissue_maps():
    description = mrf_description(torch.deg2rad(FLIPS).to(F64), 0.01, inversion_time_s=0.02)

    def tissue(t1):
        return TissueProperties(t1_ms=t1, t2_ms=torch.tensor(60.0))

    got = vmap(lambda t1: engine.simulate(description, tissue(t1), states=10))(T1_BATCH)
    want = torch.stack([engine.simulate(description, tissue(t1), states=10) for t1 in T1_BATCH])
    assert got.shape == (3, 2, 8) and rel_max_err(got, want) < REL

    signal, J = vmap(lambda t1: engine.jacobian(description, tissue(t1), ("t1_ms",), states=10))(T1_BATCH)
    runs = [engine.jacobian(description, tissue(t1), ("t1_ms",), states=10) for t1 in T1_BATCH]
    assert J.shape == (3, 2, 1, 8) and rel_max_err(J, torch.stack([j for _, j in runs])) < REL
    assert rel_max_err(signal, want) < REL

    result = vmap(lambda t1: EpgEngine().simulate(description, tissue(t1)).signal)(T1_BATCH)
    loop = torch.stack([EpgEngine().simulate(description, tissue(t1)).signal for t1 in T1_BATCH])
    assert rel_max_err(result, loop) < REL


# -- simulators -----------------------------------------------------------------------------------
def test_simulator_vmap_over_tissue_and_flips():
    got = vmap(lambda t1: mrf(FLIPS, t1))(T1_BATCH)
    assert got.shape == (3, 2, 8) and rel_max_err(got, torch.stack([mrf(FLIPS, t1) for t1 in T1_BATCH])) < REL

    want = torch.stack([mrf(f, T1) for f in FLIP_BATCH])
    assert rel_max_err(vmap(lambda f: mrf(f, T1))(FLIP_BATCH), want) < REL
    assert rel_max_err(vmap(lambda f: mrf(f, T1), in_dims=1)(FLIP_BATCH.T), want) < REL
    # flips fixed on the simulator (its constructor), and a batch nested in a batch
    bound = vmap(lambda f: MRFSimulator(TR=10.0, TI=20.0, flip=f).simulate(T1=T1, T2=60.0))(FLIP_BATCH)
    assert rel_max_err(bound, want) < REL
    both = vmap(vmap(mrf, in_dims=(None, 0)), in_dims=(0, None))(FLIP_BATCH, T1_BATCH)
    assert both.shape == (3, 3, 2, 8)
    assert rel_max_err(both, torch.stack([torch.stack([mrf(f, t1) for t1 in T1_BATCH]) for f in FLIP_BATCH])) < REL
    # nothing batched: one call serves the batch
    assert rel_max_err(vmap(lambda f: mrf(FLIPS, T1) * f)(torch.ones(2)), torch.stack([mrf(FLIPS, T1)] * 2)) < REL

    sim = MRFSimulator(TR=10.0)
    signal, J = vmap(lambda t1: sim.jacobian(("T1", "T2"), flip=FLIPS, T1=t1, T2=60.0))(T1_BATCH)
    runs = [sim.jacobian(("T1", "T2"), flip=FLIPS, T1=t1, T2=60.0) for t1 in T1_BATCH]
    assert J.shape == (3, 2, 2, 8) and column_rel_err(J, torch.stack([j for _, j in runs])) < REL  # T1, T2

    fse = FSESimulator(ESP=10.0)  # a TrainLoop simulator (and refocusing flips)
    got = vmap(lambda f: fse.simulate(flip=f, T1=T1, T2=60.0))(3 * FLIP_BATCH)
    assert rel_max_err(got, torch.stack([fse.simulate(flip=f, T1=T1, T2=60.0) for f in 3 * FLIP_BATCH])) < REL


# -- derivatives through vmap -------------------------------------------------------------------------
def test_gradients_through_vmap():
    flips = FLIP_BATCH.clone().requires_grad_()
    loop = FLIP_BATCH.clone().requires_grad_()
    vmap(lambda f: mrf(f, T1))(flips).abs().square().sum().backward()
    torch.stack([mrf(f, T1) for f in loop]).abs().square().sum().backward()
    assert rel_max_err(flips.grad, loop.grad) < REL and loop.grad.abs().min() > 0

    def cost(f):
        return mrf(f, T1).abs().square().sum()

    mapped = grad(lambda fb: vmap(lambda f: mrf(f, T1))(fb).abs().square().sum())(FLIP_BATCH)
    assert rel_max_err(mapped, loop.grad) < REL
    with pytest.raises(NotImplementedError, match=r"grad\(vmap\(f\)\), or torch.func.jacrev"):
        vmap(grad(cost))(FLIP_BATCH)  # the batch sits below the grad transform: it cannot be sliced

    maps = T1_BATCH.clone().requires_grad_()
    torch.stack([mrf(FLIPS, t1) for t1 in maps]).real.sum().backward()
    assert rel_max_err(grad(lambda tb: vmap(lambda t1: mrf(FLIPS, t1))(tb).real.sum())(T1_BATCH), maps.grad) < REL


def test_jacrev_and_jacfwd_match_forward_mode():
    _, J = MRFSimulator(TR=10.0, TI=20.0).jacobian("T1", flip=FLIPS, T1=T1, T2=60.0)  # (2, 8)
    expected = torch.stack([torch.diag_embed(J.real.T[s]) for s in range(8)], 1)  # d signal[v, s] / d T1[w]
    reverse = jacrev(lambda t1: mrf(FLIPS, t1).real)(T1)  # a vmap over the VJP: EpgVjp's vmap rule
    forward = jacfwd(lambda t1: mrf(FLIPS, t1).real)(T1)  # a vmap over JVP tangents: EpgJacobian's rule
    assert reverse.shape == forward.shape == (2, 8, 2)
    assert rel_max_err(reverse, expected) < MODES and rel_max_err(forward, expected) < MODES
