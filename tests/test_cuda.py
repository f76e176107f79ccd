"""GPU kernels against the host build of the same source (skipped without a card and a CUDA build).

Every family runs on the CUDA library and on the host library with the same float32 inputs: values,
first derivatives (JVP, VJP) and second derivatives (VJP-JVP through the Jacobian's backward), for pool
model 0 on both paths (K = 32 puts the states in registers, K = 10 keeps them in device scratch) and for
the tabulated pool layouts. Tolerance: both builds run the same float32 arithmetic, but the device uses
fused multiply-adds and its own transcendental functions, so they agree to float32 round-off accumulated
over the train: 1e-5 of the largest entry for values (issue 6), 1e-4 for first and 1e-3 for second
derivatives (the same budget as the kernels against the oracle).
"""

from __future__ import annotations

import dataclasses
import math
import os

import numpy as np
import pytest
import torch
from conftest import carried_train, column_rel_err, folding_train, rel_max_err, shot_train

from blochsim import engine
from blochsim._reference import play
from blochsim.engine.bind import kernel_inputs
from blochsim.engine.functions import EpgSimulate
from blochsim.engine.program import compile_program
from blochsim.engine.tissue import pack_tissue
from blochsim.sequence import (
    Delay,
    Excitation,
    Inversion,
    SequenceDescription,
    SSFPFidReadout,
    TissueProperties,
    mrf_description,
)

pytestmark = pytest.mark.cuda  # skipped without a card and a CUDA build (conftest)

POOLS = {
    "free": {},
    "mt": dict(bound_fraction=0.1, bound_exchange_hz=4.3, t1_bound_ms=1000.0),
    "poolb": dict(pool_b_fraction=0.15, pool_b_exchange_hz=10.0, t1_pool_b_ms=500.0, t2_pool_b_ms=20.0),
    "poolb+mt": dict(pool_b_fraction=0.15, pool_b_exchange_hz=10.0, t1_pool_b_ms=500.0, t2_pool_b_ms=20.0,
                     bound_fraction=0.1, bound_exchange_hz=4.3),
    "five": dict(pool_b_fraction=0.15, pool_b_exchange_hz=10.0, t1_pool_b_ms=500.0, t2_pool_b_ms=20.0,
                 pool_c_fraction=0.05, pool_c_exchange_hz=20.0, t1_pool_c_ms=800.0, t2_pool_c_ms=40.0,
                 pool_c_shift_hz=50.0, pool_d_fraction=0.03, pool_d_exchange_hz=30.0, t1_pool_d_ms=900.0,
                 t2_pool_d_ms=60.0, pool_d_shift_hz=-80.0, bound_fraction=0.1, bound_exchange_hz=4.3),
}


def train(n=40, quadratic=False):
    flips = torch.deg2rad(torch.cat([torch.linspace(5, 60, n // 2), torch.linspace(60, 2, n - n // 2)]))
    phases = [math.radians(117) * k * (k + 1) / 2 for k in range(n)] if quadratic else 0
    return flips, phases


def tissue(device, pools="free", n=300, b0=False):
    g = torch.Generator().manual_seed(1)
    t1 = torch.exp(torch.empty(n).uniform_(math.log(200), math.log(3000), generator=g))
    t2 = torch.minimum(torch.exp(torch.empty(n).uniform_(math.log(10), math.log(300), generator=g)), 0.9 * t1)
    extra = dict(POOLS[pools])
    if b0:
        extra["b0_hz"] = torch.linspace(-20, 20, n).to(device)
    return TissueProperties(t1_ms=t1.to(device), t2_ms=t2.to(device), **extra)


CASES = [(pools, quadratic, states) for pools in POOLS for quadratic in (False, True) for states in (10, 32, 40)
         if not (pools != "free" and states == 32)]
# Forward, JVP and the adjoints launch a warp per voxel (orders across lanes; 40 orders: two per lane) or a
# thread per voxel, and the value forward and the pool-model-0 adjoints (up to 32 orders) a group of 4 or 8
# lanes per voxel (launch_rules.hpp forward_lanes, adjoint_lanes); all are held to the host. The pool layouts
# here have their pool counts compiled (launch_rules.hpp with_fixed_pools: mt (1, 2), poolb (2, 2), poolb+mt
# (2, 3), five (4, 5)) in groups of 4 and, a warp per voxel at up to 32 orders, the float adjoint, the second
# order's adjoint and the JVPs of one or two tangents (fixed_pool_warp); groups of 8, the 32-lane value forward
# and 40 orders take the run-time pool counts.
MAPPINGS = ("warp", "thread", "lanes4", "lanes8")


@pytest.fixture(params=MAPPINGS)
def mapping(request, monkeypatch):
    monkeypatch.setenv("BLOCHSIM_CUDA_MAPPING", request.param)
    return request.param


@pytest.mark.parametrize("pools,quadratic,states", CASES)
def test_forward_matches_host(pools, quadratic, states, mapping):
    flips, phases = train(quadratic=quadratic)
    d = mrf_description(flips, 0.01, phases_rad=phases)
    gpu = engine.simulate(d, tissue("cuda", pools, b0=quadratic), states=states)
    cpu = engine.simulate(d, tissue("cpu", pools, b0=quadratic), states=states)
    assert gpu.device.type == "cuda"
    assert rel_max_err(gpu, cpu) < 1e-5


@pytest.mark.parametrize("pools,quadratic,states", CASES)
def test_first_and_second_derivatives_match_host(pools, quadratic, states, mapping):
    results = {}
    for device in ("cpu", "cuda"):
        flips, phases = train(quadratic=quadratic)
        flips = flips.to(torch.float64).requires_grad_()
        d = mrf_description(flips, 0.01, phases_rad=phases)
        t = tissue(device, pools, n=200, b0=quadratic)
        t1 = t.t1_ms.clone().requires_grad_()
        # M0's gradient reads each sample's F+(0) (an MRF sample is an event of its own: no pass, its own state)
        m0 = torch.linspace(0.8, 1.2, 200, device=device).requires_grad_()
        t = TissueProperties(**{**dict(t.items()), "t1_ms": t1, "m0": m0})
        signal = engine.simulate(d, t, states=states)
        g_flip, g_t1, g_m0 = torch.autograd.grad((signal.abs() ** 2).sum(), [flips, t1, m0])
        sig, J = engine.jacobian(d, t, ("t1_ms", "t2_ms"), states=states)
        h_flip, h_t1, h_m0 = torch.autograd.grad((J.abs() ** 2).sum(), [flips, t1, m0])
        results[device] = (signal, g_flip, g_t1, J, h_flip, h_t1, g_m0, h_m0)
    cpu, gpu = results["cpu"], results["cuda"]
    assert rel_max_err(gpu[0], cpu[0]) < 1e-5
    assert rel_max_err(gpu[1], cpu[1]) < 1e-4 and rel_max_err(gpu[2], cpu[2]) < 1e-4
    assert column_rel_err(gpu[3], cpu[3]) < 1e-4  # per column (conftest): dS/dT1 is ~6x below dS/dT2 here
    assert rel_max_err(gpu[4], cpu[4]) < 1e-3 and rel_max_err(gpu[5], cpu[5]) < 1e-3
    assert rel_max_err(gpu[6], cpu[6]) < 1e-4 and rel_max_err(gpu[7], cpu[7]) < 1e-3


@pytest.mark.parametrize("pools", ("mt", "poolb", "poolb+mt"))
@pytest.mark.parametrize("states", (10, 32))
def test_pool_second_order_groups_match_host(pools, states, monkeypatch):
    """The second order's adjoint with its pool counts compiled in groups of 16 lanes (2 orders a lane, two
    voxels a warp; launch_rules.hpp fixed_pool_second_order_groups), forced (BLOCHSIM_CUDA_ADJOINT_LANES=16)
    where the rule takes them (pools (1, 2), (2, 2)) and where it keeps the warp ((2, 3)), the first-order
    and Jacobian passes as the rules choose: test_first_and_second_derivatives_match_host's derivatives held
    to the host (its "warp" mapping runs the warp for every layout)."""
    monkeypatch.setenv("BLOCHSIM_CUDA_ADJOINT_LANES", "16")
    test_first_and_second_derivatives_match_host(pools, False, states, "auto")


@pytest.mark.parametrize("pools", ("free", "poolb+mt"))
@pytest.mark.parametrize("states", (10, 32, 40))  # 32: model 0 leaves the plain layouts (launch_rules.hpp)
def test_order_dependent_physics_matches_host(states, pools, mapping):
    """Diffusion and flow factors depend on the order: a lane must use its own orders, not 0..K/32, forward
    and in the adjoint (the gradients along D and v are sums over orders), with and without pool tables."""
    results = {}
    for device in ("cpu", "cuda"):
        flips, _ = train()
        flips = flips.to(torch.float64).requires_grad_()
        d = mrf_description(flips, 0.01, crusher_dephasing_rad=2 * math.pi, voxel_size_m=1e-3)
        t = tissue(device, pools)
        n = t.t1_ms.numel()
        D = torch.linspace(0.5, 3, n).to(device).requires_grad_()
        v = torch.linspace(-0.01, 0.01, n).to(device).requires_grad_()
        t = TissueProperties(**{**dict(t.items()), "diffusion_um2_per_ms": D, "velocity_m_per_s": v})
        signal = engine.simulate(d, t, states=states)
        results[device] = (signal, *torch.autograd.grad((signal.abs() ** 2).sum(), [flips, D, v]))
    cpu, gpu = results["cpu"], results["cuda"]
    assert rel_max_err(gpu[0], cpu[0]) < 1e-5
    assert all(rel_max_err(g, c) < 1e-4 for g, c in zip(gpu[1:], cpu[1:], strict=True))


@pytest.mark.parametrize("b1", ("map", "one value"))
@pytest.mark.parametrize("quadratic", (False, True))
@pytest.mark.parametrize("states", (10, 32))
def test_block_decoded_events_match_host(b1, quadratic, states, mapping):
    """The value forward decodes its events per block, 64 at a time (epg_device.cuh for_each_event), and
    forms each pulse once where B1 and its phase are one value for every voxel: a train of 150 events
    played twice (five chunks, the last partial, across the repetitions' seam), with B1 (and on the complex
    path its phase) per voxel or one value for all, held to the host."""
    flips, phases = train(n=150, quadratic=quadratic)
    d = mrf_description(flips, 0.01, phases_rad=phases)
    out = {}
    for device in ("cpu", "cuda"):
        t = tissue(device, n=301, b0=quadratic)
        n = t.t1_ms.numel()
        extra = {"b1": torch.linspace(0.7, 1.2, n) if b1 == "map" else torch.tensor(0.85)}
        if quadratic:
            extra["b1_phase_rad"] = torch.linspace(-0.3, 0.4, n) if b1 == "map" else torch.tensor(0.2)
        t = TissueProperties(**{**dict(t.items()), **{k: v.to(device) for k, v in extra.items()}})
        out[device] = engine.simulate(d, t, states=states, repetitions=2)
    assert out["cuda"].device.type == "cuda" and out["cuda"].shape == out["cpu"].shape
    assert rel_max_err(out["cuda"], out["cpu"]) < 1e-5


@pytest.mark.parametrize("pools", ("free", "poolb+mt"))
@pytest.mark.parametrize("phased", (False, True))
@pytest.mark.parametrize("states", (10, 32))
def test_folded_events_match_host(pools, phased, states, mapping):
    """The value forward folds an event that only samples or only shifts after into the event before it,
    where that keeps the order of what they do (epg_device.cuh fold_events): a train with each case
    (conftest.folding_train: 320 events, five chunks of decoded events), played twice, held to the host."""
    d = folding_train(phased=phased)
    out = {device: engine.simulate(d, tissue(device, pools, n=131), states=states, repetitions=2)
           for device in ("cpu", "cuda")}
    assert out["cuda"].device.type == "cuda" and out["cuda"].shape == out["cpu"].shape == (131, 152)
    assert rel_max_err(out["cuda"], out["cpu"]) < 1e-5


@pytest.mark.parametrize("states", (10, 32))
def test_carried_shifts_match_host(states, mapping):
    """The real register kernel carries shifts and spoilers into its one pass per event (event_loop.hpp
    step_forward_plain): conftest.carried_train, played twice, held to the host."""
    d = carried_train(blocks=12)
    out = {device: engine.simulate(d, tissue(device, n=131), states=states, repetitions=2, path="real")
           for device in ("cpu", "cuda")}
    assert out["cuda"].device.type == "cuda" and out["cuda"].shape == out["cpu"].shape == (131, 60)
    assert rel_max_err(out["cuda"], out["cpu"]) < 1e-5


@pytest.mark.parametrize("states", (10, 32))
def test_carried_shifts_gradients_match_host(states, mapping):
    """The adjoint of conftest.carried_train (samples with shifts pending, at a spoiler, after an interval;
    event_loop.hpp vjp_voxel_plain keeps such a sample's f0, not the state before it): the gradients of
    sum |signal|^2 along T1, T2, M0, B1 and the inversion efficiency, played twice, 131 voxels, held to the
    host each at its own scale (float32 both sides: 1e-4 of the largest entry, the module's first
    derivatives). At 32 orders and a thread per voxel the register adjoint runs it; at 10 the scratch one."""
    names = ("t1_ms", "t2_ms", "m0", "b1", "inversion_efficiency")
    grads = {}
    for device in ("cpu", "cuda"):
        t = tissue(device, n=131)
        leaves = {"t1_ms": t.t1_ms.clone().requires_grad_(), "t2_ms": t.t2_ms.clone().requires_grad_(),
                  "m0": torch.linspace(0.5, 1.5, 131).to(device).requires_grad_(),
                  "b1": torch.linspace(0.8, 1.2, 131).to(device).requires_grad_(),
                  "inversion_efficiency": torch.linspace(0.85, 1.0, 131).to(device).requires_grad_()}
        signal = engine.simulate(carried_train(blocks=12), TissueProperties(**leaves), states=states,
                                 repetitions=2, path="real")
        grads[device] = torch.autograd.grad((signal.abs() ** 2).sum(), [leaves[k] for k in names])
    for name, got, want in zip(names, grads["cuda"], grads["cpu"], strict=True):
        assert got.device.type == "cuda"
        assert rel_max_err(got, want) < 1e-4, name


#: The decoded events' case: what its gradients are taken along.
DECODED_EVENTS_FIELDS = ("flips", "phases", "adc_phases", "t2_ms", "m0", "b1")


def decoded_events_gradients(device, b1: str, n: int, events: int = 40) -> tuple:
    """(signal, {(order, input): derivative} along DECODED_EVENTS_FIELDS: the first order the gradient of
    Re<w, signal>, the second a Hessian-vector product of it) of a complex MRF train with its
    repetition time fixed (every sample an event of its own), played twice (the wrapped interval), B1 and its
    phase a map (one value a voxel) or one value for every voxel, n voxels on `device`: the case of the general
    adjoint reading its events as the launch decoded them (launch_rules.hpp decoded_general_events), the
    pulse's rotation from them only where B1 is one value, each repetition's pulse, sample and crusher one
    step (event_loop.hpp fold_at). The receiver's phases are inputs of their own (mrf_description would tie
    them to the pulses'), so a sample's phase gradient must land on its own event, not its fold's head."""
    flips, phases = train(n=events, quadratic=True)
    flips = flips.to(torch.float64).requires_grad_()
    phases = torch.tensor(phases, dtype=torch.float64).requires_grad_()
    adc_phases = (0.5 * phases.detach() + 0.3).requires_grad_()
    shots = zip(flips, phases, adc_phases, strict=True)
    d = SequenceDescription.from_operators(
        Inversion(), Delay(0), *(Excitation(a, p) @ SSFPFidReadout(q, duration_s=0.01) for a, p, q in shots))
    t = tissue(device, n=n, b0=True)
    leaves = {"t2_ms": t.t2_ms.clone().requires_grad_(),
              "m0": torch.linspace(0.8, 1.2, n, device=device).requires_grad_(),
              "b1": (torch.linspace(0.7, 1.2, n, device=device) if b1 == "map"
                     else torch.tensor(0.85, device=device)).requires_grad_()}
    phase = torch.linspace(-0.3, 0.4, n, device=device) if b1 == "map" else torch.tensor(0.2, device=device)
    t = TissueProperties(**{**dict(t.items()), **leaves, "b1_phase_rad": phase})
    signal = engine.simulate(d, t, states=20, path="complex", repetitions=2)
    # Re<w, signal>: sum |signal|^2 would not see the receiver's phases (|s e^{-i q}| = |s|); the second
    # order a Hessian-vector product of it (the double backward: the folds' values with their tangents)
    g = torch.Generator().manual_seed(7)
    w = torch.complex(torch.randn(signal.shape, generator=g), torch.randn(signal.shape, generator=g))
    inputs = [flips, phases, adc_phases, *leaves.values()]
    first = torch.autograd.grad((w.to(device).conj() * signal).real.sum(), inputs, create_graph=True)
    directions = [torch.randn(x.shape, generator=g, dtype=x.dtype).to(x.device) for x in inputs]
    second = torch.autograd.grad(sum((d * v).sum() for d, v in zip(first, directions, strict=True)), inputs)
    return signal.detach(), {**{("first", k): v.detach() for k, v in zip(DECODED_EVENTS_FIELDS, first, strict=True)},
                             **{("second", k): v for k, v in zip(DECODED_EVENTS_FIELDS, second, strict=True)}}


def assert_derivatives_close(got: dict, want: dict) -> None:
    """Each (order, input) derivative of `got` within the module's budget of `want`'s, at its own scale."""
    for key, value in want.items():
        assert rel_max_err(got[key].cpu(), value) < (1e-4 if key[0] == "first" else 1e-3), key


@pytest.mark.parametrize("b1", ("map", "one value"))
def test_general_adjoint_decoded_events_match_host(b1, mapping):
    """decoded_events_gradients at 131 voxels on the card, held to the host each at its own scale (the
    emulated card runs the same: test_cuda_on_host.py)."""
    (card, card_grads), (host, host_grads) = (decoded_events_gradients(device, b1, 131) for device in ("cuda", "cpu"))
    assert rel_max_err(card.cpu(), host) < 1e-5
    assert_derivatives_close(card_grads, host_grads)


def general_fold_gradients(device, train_name: str, b1: str, stride: int) -> tuple:
    """(signal, {(order, input): derivative}) of test_engine_lanes' train on the complex path (32 orders,
    float32, 21 voxels: padding groups in the last warp) at a checkpoint stride, every input made on `device`:
    the first order the gradient of Re<w, signal>, the second a Hessian-vector product of sum |signal|^2 (the
    double backward). The case of the general adjoint stepping the folds of the events its launch decoded
    (event_loop.hpp fold_at: a pulse, its sample and its crusher one step, the sample's F+(0) kept after the
    pulse, its demodulation and phase gradient its own event's; the second order's values its own) against
    the host, which steps every event. The trains: the carried shifts and spoilers of
    conftest.carried_train, the MRF train's inversion, SPGR's wrapped interval."""
    from test_engine_lanes import described, inputs

    leaves = {k: v.float().to(device).requires_grad_() for k, v in inputs(train_name, b1).items()}
    description, tissue_, repetitions = described(train_name, leaves)
    signal = engine.simulate(description, tissue_, states=32, repetitions=repetitions, dtype=torch.float32,
                             path="complex", checkpoint_stride=stride)
    g = torch.Generator().manual_seed(6)
    w = torch.complex(torch.randn(signal.shape, generator=g), torch.randn(signal.shape, generator=g))
    first = torch.autograd.grad((w.to(device).conj() * signal).real.sum(), list(leaves.values()),
                                retain_graph=True)
    power = (signal.real.square() + signal.imag.square()).sum()
    gradient = torch.autograd.grad(power, list(leaves.values()), create_graph=True)
    directions = [torch.randn(d.shape, generator=g).to(device) for d in gradient]
    second = torch.autograd.grad(sum((d * v).sum() for d, v in zip(gradient, directions, strict=True)),
                                 list(leaves.values()))
    return signal.detach(), {**{("first", k): v for k, v in zip(leaves, first, strict=True)},
                             **{("second", k): v for k, v in zip(leaves, second, strict=True)}}


#: Strides that start stretches on a head, on a folded sample and on a folded crusher, and leave some empty
#: (1 and 2 in the MRF train, whose repetitions are folds of three); B1 a map (each voxel's rotations) and one
#: value (the decoded rotations).
GENERAL_FOLD_CASES = [(train_name, b1, stride) for train_name, b1 in
                      (("mrf", "shared"), ("carried", "per_voxel"), ("spgr", "shared")) for stride in (1, 2, 3)]


@pytest.mark.parametrize(("train_name", "b1", "stride"), GENERAL_FOLD_CASES)
def test_general_adjoint_folds_match_host(train_name, b1, stride, mapping):
    """general_fold_gradients on the card, held to the host each derivative at its own scale (the emulated
    card runs the same: test_cuda_on_host.py)."""
    (card, card_grads), (host, host_grads) = (general_fold_gradients(device, train_name, b1, stride)
                                              for device in ("cuda", "cpu"))
    assert rel_max_err(card.cpu(), host) < 1e-5
    assert_derivatives_close(card_grads, host_grads)


@pytest.mark.parametrize("lanes", ("8", "16"))
@pytest.mark.parametrize(("train_name", "b1", "stride"), GENERAL_FOLD_CASES)
def test_second_order_groups_fold_like_host(train_name, b1, stride, lanes, monkeypatch):
    """general_fold_gradients with the complex second order's adjoint forced into groups of 8 or 16 lanes of
    the plain layout (BLOCHSIM_CUDA_ADJOINT_LANES; launch_rules.hpp plain_general_adjoint), held to the host."""
    monkeypatch.setenv("BLOCHSIM_CUDA_ADJOINT_LANES", lanes)
    (card, card_grads), (host, host_grads) = (general_fold_gradients(device, train_name, b1, stride)
                                              for device in ("cuda", "cpu"))
    assert rel_max_err(card.cpu(), host) < 1e-5
    assert_derivatives_close(card_grads, host_grads)


@pytest.mark.parametrize("n", (131, 40_000))  # 40,000 voxels: blocks of 128 threads (launch_rules.hpp threads_for)
def test_staged_samples_match_host(n, mapping):
    """The real register kernel keeps its samples in shared memory and writes them 8 at a time (epg_device.cuh
    StagedSamples): 13 samples a voxel, so a full burst and a partial one at the end, in blocks of 32 and of
    128 threads (a column of the staging per thread), held to the host."""
    flips, _ = train(n=13)
    d = mrf_description(flips, 0.01)
    out = {device: engine.simulate(d, tissue(device, n=n), states=32, repetitions=2, path="real")
           for device in ("cpu", "cuda")}
    assert out["cuda"].shape == out["cpu"].shape == (n, 13)
    assert rel_max_err(out["cuda"], out["cpu"]) < 1e-5


@pytest.mark.parametrize("n", (131, 4001))
def test_shots_match_host(n, monkeypatch):
    """The real register kernel runs a shot after a shot without asking the event what it is
    (epg_device.cuh step_shot, events_not_shot; chunks joined by join_chunks_kernel): conftest.shot_train,
    its shots broken by spoilers, inversions and a pulse without a sample across chunks, played twice (the
    first playing's shots sample nothing), held to the host."""
    monkeypatch.setenv("BLOCHSIM_CUDA_MAPPING", "thread")
    d = shot_train()
    out = {device: engine.simulate(d, tissue(device, n=n), states=32, repetitions=2, path="real")
           for device in ("cpu", "cuda")}
    assert out["cuda"].shape == out["cpu"].shape == (n, 149)
    assert rel_max_err(out["cuda"], out["cpu"]) < 1e-5


def test_repetition_times_that_change_match_host(monkeypatch):
    """The real register kernel keeps an interval's exponentials while its length repeats
    (epg_device.cuh for_each_plain_event): TRs that repeat, change and come back, an inversion delay and a
    second playing's wrap interval, held to the host."""
    monkeypatch.setenv("BLOCHSIM_CUDA_MAPPING", "thread")
    flips, _ = train(n=24)
    trs = torch.tensor([10.0, 10, 10, 12, 12, 8, 10, 10, 15, 15, 15, 15] * 2) * 1e-3
    d = mrf_description(flips, trs, inversion_time_s=0.02)
    out = {device: engine.simulate(d, tissue(device, n=300), states=32, repetitions=2, path="real")
           for device in ("cpu", "cuda")}
    assert rel_max_err(out["cuda"], out["cpu"]) < 1e-5
    same = engine.simulate(mrf_description(flips, 0.01, inversion_time_s=0.02), tissue("cuda", n=300), states=32,
                           repetitions=2, path="real")
    assert rel_max_err(same, out["cuda"]) > 1e-3  # the TRs matter: a kernel that kept the first one would fail


def test_staged_samples_out_of_order(monkeypatch):
    """Slots that do not follow the events' order (a program's `record` permuted) take the staging's
    per-thread writes, not the warp's writes across its voxels (StagedSamples): the same signal, its sample
    columns permuted, bit for bit, and the host's. 4001 voxels: whole warps and a part of one."""
    monkeypatch.setenv("BLOCHSIM_CUDA_MAPPING", "thread")
    flips, _ = train(n=13)
    program = compile_program(mrf_description(flips, 0.01), states=32)
    perm = np.random.default_rng(5).permutation(program.num_samples)
    record = np.where(program.record >= 0, perm[np.maximum(program.record, 0)], -1).astype(np.int32)
    shuffled = dataclasses.replace(program, record=record)
    out = {}
    for device in ("cpu", "cuda"):
        t = tissue(device, n=4001)
        out[device] = []
        for p in (program, shuffled):
            static, inputs = kernel_inputs(p, pack_tissue(t), dict(t.items()))
            out[device].append(EpgSimulate.apply(static, *inputs))
    ordered, permuted = out["cuda"]
    assert torch.equal(permuted[:, perm], ordered)
    assert rel_max_err(permuted, out["cpu"][1]) < 1e-5


def test_results_stay_on_the_device_and_odd_voxel_counts_work(mapping):
    flips, _ = train(n=12)
    d = mrf_description(flips, 0.01)
    for n in (1, 31, 33, 129):
        t = tissue("cuda", n=n)
        s = engine.simulate(d, t, states=32)
        assert s.device.type == "cuda" and s.shape == (n, 12)
        ref = engine.simulate(d, tissue("cpu", n=n), states=32)
        assert rel_max_err(s, ref) < 1e-5


@pytest.mark.skipif(os.environ.get("BLOCHSIM_SANITIZER_CASE") is None, reason="run by scripts/run_gpu_tests.sh")
def test_sanitizer_case():
    """A small case of every family, for compute-sanitizer (memcheck, racecheck)."""
    for mapping in MAPPINGS:
        os.environ["BLOCHSIM_CUDA_MAPPING"] = mapping
        try:
            for pools in POOLS:
                test_forward_matches_host(pools, True, 10, mapping)
                if mapping in ("warp", "thread"):  # groups of lanes: the value forward, and the adjoints below
                    test_first_and_second_derivatives_match_host(pools, True, 10, mapping)
            if mapping == "warp":  # the real fixed-pool second order (a semisolid pool: its saturation table)
                test_first_and_second_derivatives_match_host("poolb+mt", False, 10, mapping)
                with pytest.MonkeyPatch.context() as patch:  # the complex second order in plain groups
                    for group in ("plain16", "plain8"):
                        test_group_second_order_adjoints_match_the_oracle(group, 20, "complex", patch)
                with pytest.MonkeyPatch.context() as patch:  # the fixed-pool second order in groups of 16
                    test_pool_second_order_groups_match_host("poolb+mt", 10, patch)
            if mapping == "lanes8":  # the complex Jacobian (JVP) in groups of 8, its events decoded per block
                test_first_and_second_derivatives_match_host("free", True, 10, mapping)
            if mapping in ("lanes4", "lanes8"):  # the adjoints in groups, with padding groups (13 voxels)
                with pytest.MonkeyPatch.context() as patch:
                    test_group_adjoints_match_the_oracle(mapping, 20, "complex", patch)
                    test_group_second_order_adjoints_match_the_oracle(mapping, 20, "complex", patch)
                    # the real path's plain layout at 32 orders, both orders
                    test_group_adjoints_match_the_oracle(mapping, 32, "real", patch)
                    test_group_second_order_adjoints_match_the_oracle(mapping, 32, "real", patch)
            if mapping == "thread":  # the real register kernel (32 orders): its samples staged, per warp and not
                test_staged_samples_match_host(131, mapping)
                with pytest.MonkeyPatch.context() as patch:  # the plain adjoint, registers (32) and scratch (20)
                    for states in (32, 20):
                        test_group_adjoints_match_the_oracle(mapping, states, "real", patch)
                    test_group_second_order_adjoints_match_the_oracle(mapping, 20, "real", patch)
        finally:
            del os.environ["BLOCHSIM_CUDA_MAPPING"]


# ---- the adjoints in groups of lanes, against the float64 oracle -----------------------------------------
# BLOCHSIM_CUDA_MAPPING=lanes8|lanes4 forces the adjoints (VJP; VJP-JVP, the double backward) of pool model 0
# into groups of 8 or 4 lanes per voxel (vjp_warp_kernel with 4 or 8 orders a lane, 4 or 8 voxels a warp; the
# real plain layout at 32 orders takes the plain adjoint's scheme in groups, vjp_plain_lanes_kernel).
# 13 voxels: the last warp holds a voxel or five past the end (padding groups replay the last voxel and must
# write nothing, nor add to the event gradients); 20 orders: the lanes past order 19 hold no state.
# BLOCHSIM_CUDA_ADJOINT_LANES=16|32 (the "plain16", "plain32" cases) forces the plain adjoint's scheme into
# groups of 16 or 32 lanes (2 orders or 1 a lane) where it applies (the real path at 32 orders), and 8 or 16
# ("plain8", "plain16") the complex second order's general adjoint into groups of the plain layout (4 or 2
# orders a lane; launch_rules.hpp plain_general_adjoint); elsewhere the rules choose.
GROUP_VOXELS = 13
GROUP_CARD = "cuda"  # (the bodies pass on the host with "cpu": the same float32 budget)
GROUP_EVENTS = ("flips", "tr_s", "phases")


def force_group(monkeypatch, group: str) -> None:
    """Force the adjoints' mapping: BLOCHSIM_CUDA_MAPPING, or for "plainN" BLOCHSIM_CUDA_ADJOINT_LANES=N."""
    if group.startswith("plain"):
        monkeypatch.setenv("BLOCHSIM_CUDA_ADJOINT_LANES", group[len("plain"):])
    else:
        monkeypatch.setenv("BLOCHSIM_CUDA_MAPPING", group)


def group_inputs(path: str) -> dict:
    """Float64 values of a small MRF problem: 24 flips, the TR, RF phases (complex path), and per voxel T1, T2,
    B1 and M0 (and the B1 phase on the complex path; B0 is left out: a FISP train is blind to it)."""
    j = torch.arange(24, dtype=torch.float64)
    v = torch.linspace(0, 1, GROUP_VOXELS, dtype=torch.float64)
    x = {"flips": torch.deg2rad(10 + 50 * torch.sin(j / 7).abs()), "tr_s": torch.tensor(0.01, dtype=torch.float64),
         "t1_ms": 400 + 1600 * v, "t2_ms": 30 + 120 * v.flip(0), "b1": 0.8 + 0.35 * v, "m0": 0.7 + 0.6 * v}
    if path == "complex":
        x["phases"] = 0.3 * torch.sin(1.3 * j)
        x["b1_phase_rad"] = -0.3 + 0.7 * v
    return x


def group_signal(x: dict, path: str, states: int, device: str | None) -> torch.Tensor:
    """The signal of `x`: on the float64 oracle (device None) or the engine on `device` (float32)."""
    d = mrf_description(x["flips"], x["tr_s"], phases_rad=x.get("phases", 0))
    fields = {k: v for k, v in x.items() if k not in GROUP_EVENTS}
    if device is None:
        return play(d, TissueProperties(**fields), states=states).signal
    t = TissueProperties(**{k: v.to(device, torch.float32) for k, v in fields.items()})
    return engine.simulate(d, t, states=states, path=path)


def group_leaves(x: dict, device: str | None) -> dict:
    """Leaves where the user makes them: every protocol and tissue tensor on `device` in float32 (the engine's
    run), or float64 on the host (the oracle's, device None)."""
    if device is None:
        return {k: v.detach().clone().requires_grad_() for k, v in x.items()}
    return {k: v.to(device, torch.float32).requires_grad_() for k, v in x.items()}


def group_cotangent(shape) -> torch.Tensor:
    g = torch.Generator().manual_seed(7)
    return torch.complex(torch.randn(shape, dtype=torch.float64, generator=g),
                         torch.randn(shape, dtype=torch.float64, generator=g))


@pytest.mark.parametrize("path", ("real", "complex"))
@pytest.mark.parametrize("states", (20, 32))
@pytest.mark.parametrize("group", ("lanes8", "lanes4", "plain16", "plain32", "thread"))
def test_group_adjoints_match_the_oracle(group, states, path, monkeypatch):
    """The VJP in groups of lanes, and a thread per voxel (on the real path the plain step pair, its working
    states in registers at 32 orders and in device scratch at 20): d Re<w, signal> / d (flips, TR, phases, T1,
    T2, B1, M0, B1 phase) at 13 voxels, 20 and 32 orders, against the float64 oracle."""
    force_group(monkeypatch, group)
    x = group_inputs(path)
    w = group_cotangent((GROUP_VOXELS, 24))
    got, want = {}, {}
    for device, out in ((GROUP_CARD, got), (None, want)):
        leaf = group_leaves(x, device)
        signal = group_signal(leaf, path, states, device)
        cost = (w.to(signal.device, signal.dtype).conj() * signal).real.sum()
        out.update(zip(leaf, torch.autograd.grad(cost, list(leaf.values())), strict=True))
    for name in x:
        # float32 first derivatives: 1e-4 of the largest entry (the module docstring; a sum over events of
        # products of states and adjoint states, each with float32 round-off, that cancels)
        assert rel_max_err(got[name], want[name]) < 1e-4, name


@pytest.mark.parametrize("path", ("real", "complex"))
@pytest.mark.parametrize("states", (20, 32))
@pytest.mark.parametrize("group", ("lanes8", "lanes4", "plain8", "plain16", "plain32", "thread"))
def test_group_second_order_adjoints_match_the_oracle(group, states, path, monkeypatch):
    """The VJP-JVP in groups of lanes, and a thread per voxel (on the real path the plain step pair at dual
    numbers, its states in device scratch): the backward of the VJP, a Hessian-vector product by double
    backward of sum |signal - target|^2, over event values and tissue at once, 13 voxels, 20 and 32 orders
    (the real path's 32 in groups: its dual states fit a group's registers), against the oracle."""
    force_group(monkeypatch, group)
    x = group_inputs(path)
    target = 0.1 * group_cotangent((GROUP_VOXELS, 24))
    g = torch.Generator().manual_seed(5)
    direction = {k: 0.1 * (float(v.abs().mean()) or 1.0) * torch.randn(v.shape, dtype=torch.float64, generator=g)
                 for k, v in x.items()}  # each input moved by a tenth of its size, so none hides below another
    got, want = {}, {}
    for device, out in ((GROUP_CARD, got), (None, want)):
        leaf = group_leaves(x, device)
        signal = group_signal(leaf, path, states, device)
        loss = (signal - target.to(signal.device, signal.dtype)).abs().pow(2).sum()
        first = torch.autograd.grad(loss, list(leaf.values()), create_graph=True)
        gv = sum((gi * direction[k].to(gi.device, gi.dtype)).sum() for gi, k in zip(first, leaf, strict=True))
        out.update(zip(leaf, torch.autograd.grad(gv, list(leaf.values())), strict=True))
    for name in x:
        # float32 second derivatives: 1e-3 of the largest entry (the module docstring: one more cancelling sum
        # of products than a first derivative)
        assert rel_max_err(got[name], want[name]) < 1e-3, name
