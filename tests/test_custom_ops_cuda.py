"""The custom ops and compiled simulations on a CUDA device (run by the GPU suite; skipped without a GPU).

* `torch.library.opcheck` of every op on CUDA tensors (float32, the device kernels' dtype): the real path and
  pools.
* The ops' first and second derivatives on the device equal the eager Functions' (the same kernel calls; the
  device VJP sums per-event parameter gradients over voxels with atomics, whose order varies between calls).
* torch.compile with Inductor (fullgraph) of the MRF loss built from flip tensors on the device: loss and flip
  gradient against eager.
* mode="reduce-overhead" (CUDA graphs): called in a loop, every call against eager, and no graph skipped
  (Inductor counts a skip when a graph holds a host tensor, a host sync or a dynamic shape; the plan's
  constants and value operations must all be on the device).
"""

from __future__ import annotations

import pytest
import torch
from conftest import STATES, T1_MS, T2_MS, mrf, rel_max_err

from blochsim import _tracing, engine
from blochsim.engine import ops
from blochsim.engine.bind import kernel_inputs
from blochsim.engine.functions import EpgSimulate
from blochsim.engine.simulate import prepare
from blochsim.sequence import TissueProperties, mrf_description

pytestmark = pytest.mark.cuda

OPS = torch.ops.blochsim
CUDA = torch.device("cuda")
F32 = torch.float32


def cuda_tissue(pooled: bool) -> TissueProperties:
    fields = {"t1_ms": torch.tensor(T1_MS, device=CUDA), "t2_ms": torch.tensor(T2_MS, device=CUDA)}
    if pooled:
        fields.update(bound_fraction=torch.tensor((0.1, 0.05, 0.15), device=CUDA), bound_exchange_hz=20.0,
                      t2_bound_ms=0.012, pool_b_fraction=torch.tensor((0.1, 0.2, 0.05), device=CUDA),
                      pool_b_exchange_hz=8.0, t1_pool_b_ms=400.0, t2_pool_b_ms=15.0)
    return TissueProperties(**fields)


def kernel_call(pooled: bool):
    tissue = cuda_tissue(pooled)
    program, packed = prepare(mrf(), tissue, states=STATES, repetitions=1, record="all", dtype=F32, path="auto",
                              checkpoint_stride=4)
    static, inputs = kernel_inputs(program, packed, dict(tissue.items()))
    return static, [None if x is None else x.detach().clone().requires_grad_() for x in inputs]


@pytest.mark.parametrize("pooled", [False, True], ids=["real", "pooled"])
def test_opcheck_on_cuda(pooled):
    static, inputs = kernel_call(pooled)
    args = ops.static_args(static)
    g = torch.Generator(device=CUDA).manual_seed(0)
    tangents = [None if x is None else torch.randn((2,) + tuple(x.shape), generator=g, dtype=x.dtype, device=CUDA)
                for x in inputs]
    cotangent = torch.complex(*(torch.randn(static.num_voxels, static.num_samples, generator=g, device=CUDA)
                                for _ in range(2)))
    wanted = [x is not None for x in inputs]
    plain = [None if x is None else x.detach() for x in inputs]
    torch.library.opcheck(OPS.epg_forward.default, (*args, *inputs))
    torch.library.opcheck(OPS.epg_jvp.default, (*args, *inputs, *tangents))
    torch.library.opcheck(OPS.epg_vjp.default, (*args, wanted, cotangent, *inputs))
    torch.library.opcheck(OPS.epg_vjp_jvp.default, (*args, wanted, True, cotangent, cotangent * 0.5, *plain,
                                                    *[None if t is None else t[:1] for t in tangents]))


def test_op_derivatives_on_cuda_equal_the_eager_functions():
    static, inputs = kernel_call(pooled=True)
    leaves = [x for x in inputs if x is not None]
    results = []
    for run in (lambda: OPS.epg_forward(*ops.static_args(static), *inputs), lambda: EpgSimulate.apply(static, *inputs)):
        signal = run()
        grads = torch.autograd.grad((signal.abs() ** 2).sum(), leaves, create_graph=True)
        # A real scalar of the gradients (complex table gradients by their real and imaginary parts).
        inner = sum(torch.view_as_real(g).sum() if g.is_complex() else g.sum() for g in grads)
        hvp = torch.autograd.grad(inner, leaves, allow_unused=True)
        results.append([signal, *grads, *hvp])
    # Atomic sums over the voxels change order between calls, so each tensor differs by a few float32 ulps of
    # the terms summed; a wrong registration (a missing or doubled term) differs by whole terms. A term is at most
    # the largest entry of its group (the gradients, the HVPs), and an entry that cancels to near zero (an HVP
    # part of -7e-9 where the terms are ~0.1) keeps the rounding of its terms: the bound is 1e-5 of the tensor's
    # own largest entry plus 1e-6 of its group's.
    groups = [[0], list(range(1, 1 + len(leaves))), list(range(1 + len(leaves), len(results[0])))]
    for group in groups:
        present = [i for i in group if results[1][i] is not None]
        group_scale = max((float(results[1][i].abs().max()) for i in present), default=0.0)
        for i in group:
            op_value, function_value = results[0][i], results[1][i]
            assert (op_value is None) == (function_value is None), i
            if op_value is None:
                continue
            bound = 1e-5 * float(function_value.abs().max()) + 1e-6 * group_scale
            assert float((op_value - function_value).abs().max()) <= bound, (i, bound)


T1 = torch.tensor(T1_MS)
T2 = torch.tensor(T2_MS)


def mrf_loss(flip_rad):
    tissue = TissueProperties(t1_ms=T1.to(flip_rad.device), t2_ms=T2.to(flip_rad.device))
    signal = engine.simulate(mrf_description(flip_rad, 0.01, inversion_time_s=0.02), tissue, states=16)
    return (signal.abs() ** 2).sum() + signal.real.sum()


def pooled_loss(flip_rad):
    tissue = cuda_tissue(pooled=True)
    signal = engine.simulate(mrf_description(flip_rad, 0.01, inversion_time_s=0.02), tissue, states=16)
    return (signal.abs() ** 2).sum() + signal.real.sum()


def eager(flip_rad, loss_fn):
    x = flip_rad.detach().requires_grad_()
    loss = loss_fn(x)
    return loss.detach(), torch.autograd.grad(loss, x)[0]


# 1e-5 relative: float32 kernels on the same inputs; Inductor computes the value operations (flips into event
# values, phases wrapped) in its own fused kernels, whose float32 round-off (~1e-7) may differ from eager's, and
# the gradient sums over ~100 events.
TOL = 1e-5


@pytest.mark.parametrize("pooled", [False, True], ids=["free_water", "pooled"])
@pytest.mark.parametrize("mode", ["default", "reduce-overhead"])
def test_compiled_mrf_on_cuda(mode, pooled):
    """The MRF loss compiled on the device; with pools, the pool tables' operations (thousands: a matrix
    exponential per interval) are traced too, their constant parts (distinct intervals) computed once."""
    torch._dynamo.utils.counters.clear()
    loss_fn = pooled_loss if pooled else mrf_loss
    compiled = torch.compile(loss_fn, fullgraph=True, mode=mode)
    for k in range(4):  # reduce-overhead: warm-up, capture, replays
        x = torch.linspace(0.2, 1.2, 40, device=CUDA).mul(1 + 0.05 * k).requires_grad_()
        loss = compiled(x)
        loss.backward()
        expected_loss, expected_grad = eager(x, loss_fn)
        assert rel_max_err(loss.detach(), expected_loss) < TOL
        assert rel_max_err(x.grad, expected_grad) < TOL
    assert torch._dynamo.utils.counters["inductor"]["cudagraph_skips"] == 0
    _assert_plan_on_device()


def _assert_plan_on_device():
    plan = getattr(_tracing._PLANS, _tracing._KEYS[next(k for k in reversed(_tracing._KEYS))][0])
    for node in plan.graph.nodes:  # no host tensor is left in the plan
        if node.op == "get_attr":
            assert getattr(plan, node.target).device.type == "cuda", node.target
        if node.op == "call_function":
            assert node.kwargs.get("device") != torch.device("cpu"), node.format_node()


def test_compiled_simulator_on_cuda():
    """A Simulator made outside the compiled function (its protocol on the device), called inside it: the
    simulator reaches the plan by identity (torch before 2.13 cannot pass an object to the plan)."""
    from blochsim.simulators import MRFSimulator

    flips = torch.linspace(10.0, 60.0, 40, device=CUDA)
    sim = MRFSimulator(flip=flips, TR=10.0, states=16)
    t1, t2 = T1.to(CUDA), T2.to(CUDA)

    def loss_fn(flip_deg):
        return torch.view_as_real(sim.simulate(flip=flip_deg, T1=t1, T2=t2)).square().sum()

    compiled = torch.compile(loss_fn, fullgraph=True, mode="reduce-overhead")
    for k in range(4):
        x = (flips * (1 + 0.05 * k)).requires_grad_()
        loss = compiled(x)
        loss.backward()
        expected_loss, expected_grad = eager(x, loss_fn)
        assert rel_max_err(loss.detach(), expected_loss) < TOL
        assert rel_max_err(x.grad, expected_grad) < TOL
    _assert_plan_on_device()
