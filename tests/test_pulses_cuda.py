"""Pulses played per voxel on a GPU (slice profiles, static shims, dynamic pTx): the CUDA kernels through the
public API with every tensor made on the card, held to the host build (float32 on both sides) and the float64
oracle.

Each case runs at sizes that take each CUDA mapping of the complex path (csrc/include/blochsim/launch_rules.hpp):
a warp per voxel (up to 3,000 kernel voxels), groups of 8 or 4 lanes (up to 32 orders, more voxels), a thread per
voxel (more than 32 orders, past 10,000 voxels); the adjoints a warp per voxel (up to 64 orders) or a thread
(more). A slice-resolved call of V tissues at P positions is V * P kernel voxels.

Tolerances, relative to the largest entry: values 1e-5, first derivatives 1e-4, second 1e-3 against the host
build (float32 round-off on both sides, as tests/test_cuda.py); against the oracle values 1e-5 plus the
interpolation of the default 64 knots (9e-8, tests/test_pulses_engine.py).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from conftest import rel_max_err
from test_pulses_engine import DEFINITIONS, channel_maps, dynamic_pulse, shimmed, spin_echo, train

from blochsim import execution
from blochsim._reference import play
from blochsim.engine import jacobian, simulate
from blochsim.sequence import (
    ExactSliceProfile,
    Excitation,
    Readout,
    Refocusing,
    SequenceDescription,
    TissueProperties,
    ideal_rf_definition,
    rf_definition,
)
from blochsim.simulators import MRFSimulator

pytestmark = pytest.mark.cuda  # skipped without a card and a CUDA build (conftest)

F64 = torch.float64
CARD = "cuda"

#: (tissues, positions, orders): warp (117 kernel voxels), groups (6,300), thread forward (12,600 at 40 orders)
#: with the thread adjoint at 80 orders.
SIZES = {"warp": (13, 9, 8), "groups": (700, 9, 16), "thread": (1400, 9, 40), "thread_adjoint": (40, 9, 80)}


def tissue_on(device, voxels, **extra):
    g = torch.Generator().manual_seed(voxels)
    fields = dict(t1_ms=(500 + 1000 * torch.rand(voxels, generator=g)).to(device),
                  t2_ms=(30 + 80 * torch.rand(voxels, generator=g)).to(device),
                  b1=(0.8 + 0.4 * torch.rand(voxels, generator=g)).to(device))
    fields.update(extra)
    return TissueProperties(**fields)


@pytest.mark.parametrize("size", list(SIZES))
@pytest.mark.parametrize("case", ["spin_echo", "train"])
def test_slice_profiles_on_the_card(case, size):
    voxels, positions, states = SIZES[size]
    description = spin_echo() if case == "spin_echo" else train([0.3, -0.7, 1.2, 0.5])
    profile = ExactSliceProfile(positions)
    card = simulate(description, tissue_on(CARD, voxels), states=states, across_slice=profile)
    host = simulate(description, tissue_on("cpu", voxels), states=states, across_slice=profile)
    assert card.device.type == "cuda"
    assert rel_max_err(card.cpu(), host) < 1e-5  # see the module docstring
    first = {k: v[:3].double() for k, v in tissue_on("cpu", voxels).items() if isinstance(v, torch.Tensor)}
    oracle = play(description, TissueProperties(**first), states=states, across_slice=profile).signal
    assert rel_max_err(card[:3].cpu(), oracle) < 1e-5  # the first three voxels (module docstring)


@pytest.mark.parametrize("size", ["warp", "groups", "thread"])
def test_slice_profiles_with_uniform_b1_on_the_card(size):
    """B1 and its phase the same in every voxel: decode_events_kernel forms each profiled pulse's rotation once per
    (event, position) and the forward kernels read it (pulses.hpp pairs_per_launch); the adjoint forms its own
    per voxel. Values and the flips' gradients held to the host build, values to the oracle."""
    voxels, positions, states = SIZES[size]
    profile = ExactSliceProfile(positions)

    def run(device):
        flips = torch.tensor([0.3, -0.7, 1.2, 0.5], device=device, requires_grad=True)
        t = tissue_on(device, voxels, b1=0.9, b1_phase_rad=0.4)
        signal = simulate(train(flips), t, states=states, repetitions=2, across_slice=profile)
        (grad,) = torch.autograd.grad((signal.abs() ** 2).sum(), (flips,))
        return signal.detach().cpu(), grad.cpu()

    (card, card_grad), (host, host_grad) = run(CARD), run("cpu")
    assert rel_max_err(card, host) < 1e-5  # see the module docstring
    assert rel_max_err(card_grad, host_grad) < 1e-4
    first = {k: v[:3].double() for k, v in tissue_on("cpu", voxels).items() if isinstance(v, torch.Tensor)}
    first.update(b1=0.9, b1_phase_rad=0.4)
    oracle = play(train([0.3, -0.7, 1.2, 0.5]), TissueProperties(**first), states=states, repetitions=2,
                  across_slice=profile).signal
    assert rel_max_err(card[:3], oracle) < 1e-5  # the first three voxels (module docstring)


@pytest.mark.parametrize("size", ["warp", "thread_adjoint"])
def test_slice_profile_derivatives_on_the_card(size):
    voxels, positions, states = SIZES[size]
    profile = ExactSliceProfile(positions)
    _, jac_card = jacobian(spin_echo(), tissue_on(CARD, voxels), ("t1_ms", "t2_ms", "b1"), states=states,
                           across_slice=profile)
    _, jac_host = jacobian(spin_echo(), tissue_on("cpu", voxels), ("t1_ms", "t2_ms", "b1"), states=states,
                           across_slice=profile)
    assert rel_max_err(jac_card.cpu(), jac_host) < 1e-4  # see the module docstring

    def gradients(device):
        flips = torch.tensor([math.pi / 2, 2.6], device=device, requires_grad=True)
        t = tissue_on(device, voxels)
        b1 = t.b1.clone().requires_grad_()
        d = SequenceDescription.from_operators(
            Excitation(flips[0], math.pi / 2, definition_id=1), (5e-3, Refocusing(flips[1], definition_id=2)),
            (10e-3, Readout()), rf_definitions=DEFINITIONS)
        signal = simulate(d, TissueProperties(t1_ms=t.t1_ms, t2_ms=t.t2_ms, b1=b1), states=states,
                          across_slice=profile)
        first = torch.autograd.grad((signal.abs() ** 2).sum(), (flips, b1), create_graph=True)
        second = torch.autograd.grad(first[0].sum(), flips)  # the VJP-JVP kernel
        return [g.detach().cpu() for g in first + second]

    for got, want, bound in zip(gradients(CARD), gradients("cpu"), (1e-4, 1e-4, 1e-3), strict=True):
        assert rel_max_err(got, want) < bound  # see the module docstring


@pytest.mark.parametrize("size", ["warp", "groups", "thread_adjoint"])
def test_static_shims_on_the_card(size):
    voxels, _, states = SIZES[size]

    def run(device):
        magnitudes = torch.tensor([1.0, 0.5], device=device, requires_grad=True)
        phases = torch.tensor([0.0, 1.0], device=device, requires_grad=True)
        b1, phase = (x.float().to(device).requires_grad_() for x in channel_maps(voxels, seed=7))
        t = TissueProperties(t1_ms=torch.full((voxels,), 900.0, device=device), t2_ms=60.0, b1=b1,
                             b1_phase_rad=phase)
        signal = simulate(shimmed(magnitudes, phases), t, states=states)
        grads = torch.autograd.grad((signal.abs() ** 2).sum(), (magnitudes, phases, b1, phase))
        return [signal.detach().cpu()] + [g.cpu() for g in grads]

    card, host = run(CARD), run("cpu")
    assert rel_max_err(card[0], host[0]) < 1e-5  # see the module docstring
    for got, want in zip(card[1:], host[1:], strict=True):
        assert rel_max_err(got, want) < 1e-4


@pytest.mark.parametrize("size", ["warp", "groups"])
def test_dynamic_ptx_on_the_card(size):
    voxels, positions, states = SIZES[size]
    definitions = {0: ideal_rf_definition(), 3: dynamic_pulse(bandwidth_hz=8e3)}

    def run(device):
        flip = torch.tensor(1.2, device=device, requires_grad=True)
        b1, phase = (x.float().to(device).requires_grad_() for x in channel_maps(voxels, seed=3))
        d = SequenceDescription.from_operators(Excitation(flip, 0.4, definition_id=3), (2e-3, Readout()),
                                               rf_definitions=definitions)
        t = TissueProperties(t1_ms=torch.full((voxels,), 900.0, device=device), t2_ms=60.0, b1=b1,
                             b1_phase_rad=phase)
        signal = simulate(d, t, states=states, across_slice=ExactSliceProfile(positions))
        grads = torch.autograd.grad((signal.abs() ** 2).sum(), (flip, b1, phase))
        return [signal.detach().cpu()] + [g.cpu() for g in grads]

    card, host = run(CARD), run("cpu")
    assert rel_max_err(card[0], host[0]) < 1e-5  # see the module docstring
    for got, want in zip(card[1:], host[1:], strict=True):
        assert rel_max_err(got, want) < 1e-4


def test_slice_resolved_mrf_simulator_on_the_card():
    """The benchmark's shape through the Simulator, small: an MRF train of a shaped excitation across the slice,
    chunked on the card (a small budget) and whole, equal to the host."""
    t = np.linspace(-2, 2, 128)
    pulse = rf_definition(np.sinc(t) * np.hanning(130)[1:-1], dwell_s=1e-5, bandwidth_hz=4 / 1.28e-3)
    flips = list(10 + 50 * np.abs(np.sin(np.arange(100) / 15)))
    mrf = MRFSimulator(flip=flips, TR=10.0, pulse=pulse, states=16)
    g = torch.Generator().manual_seed(0)
    t1 = (500 + 1500 * torch.rand(2000, generator=g))
    card = mrf.simulate(T1=t1.to(CARD), T2=80.0, across_slice=16)
    with execution(CARD, budget_bytes=64 * 2**20):
        chunked = mrf.simulate(T1=t1.to(CARD), T2=80.0, across_slice=16)
    host = mrf.simulate(T1=t1, T2=80.0, across_slice=16)
    assert rel_max_err(card.cpu(), host) < 1e-5  # see the module docstring
    torch.testing.assert_close(chunked, card, rtol=0, atol=0)  # each voxel's arithmetic is the same


def test_warp_adjoint_at_voxel_counts_not_a_multiple_of_four():
    """The warp adjoint launches whole blocks of four voxels and interleaves its lanes' stores with that stride;
    sized for 32 V lanes, the store of the last lanes ran into the table cotangents behind it when V % 4 != 0
    (launch_rules.hpp vjp_state_bytes). Pool tables and shim fields are both table cotangents: gradients through
    each at 13 voxels, against the host."""
    from blochsim.sequence import mrf_description

    def run(device):
        flips = torch.linspace(0.2, 1.0, 12, device=device, requires_grad=True)
        t1 = torch.linspace(600.0, 1400.0, 13, device=device, requires_grad=True)
        bound = torch.full((13,), 0.1, device=device, requires_grad=True)
        t = TissueProperties(t1_ms=t1, t2_ms=60.0, bound_fraction=bound, bound_exchange_hz=4.3)
        signal = simulate(mrf_description(flips, 0.01), t, states=8)
        return [g.cpu() for g in torch.autograd.grad((signal.abs() ** 2).sum(), (flips, t1, bound))]

    for got, want in zip(run(CARD), run("cpu"), strict=True):
        assert rel_max_err(got, want) < 1e-4  # see the module docstring
