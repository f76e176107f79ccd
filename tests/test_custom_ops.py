"""The kernel passes as custom ops (`blochsim::epg_*`, blochsim/engine/ops.py), on the host.

For each op, the three checks of pytorch/extension-cpp: its values against a reference, its gradients
against the reference's, and `torch.library.opcheck` (schema, fake tensor, autograd registration, AOT
dispatch with dynamic shapes). The reference of values is the float64 oracle (`blochsim._reference.play`);
the reference of derivatives is the eager engine's autograd Functions (blochsim/engine/functions.py, held to
the oracle by tests/test_engine_derivatives.py), which run the same kernel passes: the ops' autograd wiring
must give the very same numbers (compared exactly). Then the vmap rules: a batch of tissue or of tangents is
one kernel call, other batches a loop, each equal to the calls made one by one.

Four kernel calls cover the inputs: the real path (T1, T2 maps), the complex path (B0, B1 phase, diffusion
and flow with a crusher), pools (a semisolid and an exchanging pool: the tables, T complex) and a slice
profile (a profile table, 5 positions per voxel, a B1 map). Float64 throughout, 3 voxels, 10 orders: seconds.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import STATES, T1_MS, T2_MS, f64, mrf, mrf_quadratic, rel_max_err, tissue

from blochsim._reference import play
from blochsim.engine import kernels, ops
from blochsim.engine.bind import kernel_inputs
from blochsim.engine.functions import EpgJacobian, EpgSimulate
from blochsim.engine.pulses import across_positions
from blochsim.engine.simulate import prepare
from blochsim.sequence import (
    ExactSliceProfile,
    Excitation,
    SequenceDescription,
    SSFPFidReadout,
    TissueProperties,
    ideal_rf_definition,
    rf_definition,
)

OPS = torch.ops.blochsim
F64 = torch.float64


def _profiled_train() -> SequenceDescription:
    """Three profiled sinc excitations, each followed by a FISP readout."""
    t = np.linspace(-3, 3, 120)
    sinc = rf_definition(np.sinc(t) * np.hanning(122)[1:-1], dwell_s=1e-5, bandwidth_hz=6 / 120e-5,
                         definition_id=1)
    parts = []
    for k, flip in enumerate((0.5, 0.8, 1.1)):
        parts += [(k * 8e-3, Excitation(flip, 0.0, definition_id=1)), (k * 8e-3 + 2e-3, SSFPFidReadout())]
    return SequenceDescription.from_operators(*parts, rf_definitions={0: ideal_rf_definition(), 1: sinc})


#: Slice positions of the profiled case, with 512 profile knots: the interpolation's error is then ~2e-11,
#: below the oracle comparison's 1e-10 (tests/test_pulses_engine.py measures the rate).
ACROSS_SLICE = ExactSliceProfile(5, bins=512)


def _case(name: str):
    """(description, tissue, across_slice) of a case."""
    if name == "real":
        return mrf(), tissue(), None
    if name == "complex":
        return mrf_quadratic(geometry="crusher"), tissue(("b0_hz", "b1_phase_rad", "diffusion_um2_per_ms",
                                                           "velocity_m_per_s")), None
    if name == "profiled":  # a slice profile table, the voxels played at 5 positions, a B1 map
        return _profiled_train(), tissue(("b1",)), ACROSS_SLICE
    # Pools: a semisolid pool and exchanging pool b, fractions per voxel (tables [V, ...], T complex).
    return mrf(), TissueProperties(t1_ms=f64(T1_MS), t2_ms=f64(T2_MS), bound_fraction=f64((0.1, 0.05, 0.15)),
                                   bound_exchange_hz=20.0, t1_bound_ms=1000.0, t2_bound_ms=0.012,
                                   pool_b_fraction=f64((0.1, 0.2, 0.05)), pool_b_exchange_hz=8.0,
                                   t1_pool_b_ms=400.0, t2_pool_b_ms=15.0), None


CASES = ("real", "complex", "pooled", "profiled")


def kernel_call(name: str):
    """(Static, inputs) of a case: float64, the oracle's orders, every floating input a leaf requiring grad."""
    description, tissue_, across_slice = _case(name)
    program, packed = prepare(description, tissue_, states=STATES, repetitions=1, record="all", dtype=F64,
                              path="auto", checkpoint_stride=4, across_slice=across_slice)
    fields = dict(tissue_.items())
    if across_slice is not None:  # as engine.bind.run: each voxel once per position, positions innermost
        packed, fields = across_positions(packed, fields, program.pulses.positions)
    static, inputs = kernel_inputs(program, packed, fields)
    return static, [None if x is None else x.detach().clone().requires_grad_() for x in inputs]


def present(inputs) -> list:
    return [x for x in inputs if x is not None]


def real_loss(signal: torch.Tensor, seed: int) -> torch.Tensor:
    """A real scalar of every sample: sum Re(conj(w) s) + sum |s|^2, w fixed random complex weights."""
    g = torch.Generator().manual_seed(seed)
    w = torch.complex(torch.randn(signal.shape, generator=g, dtype=F64), torch.randn(signal.shape, generator=g,
                                                                                   dtype=F64))
    return (w.conj() * signal).real.sum() + (signal.abs() ** 2).sum()


@pytest.mark.parametrize("name", CASES)
def test_forward_op_matches_oracle(name):
    # 1e-10 relative: float64 kernels against the float64 oracle (tests/test_engine_forward.py sees ~1e-14).
    static, inputs = kernel_call(name)
    signal = OPS.epg_forward(*ops.static_args(static), *inputs)
    description, tissue_, across_slice = _case(name)
    expected = play(description, tissue_, states=STATES, across_slice=across_slice).signal
    positions = 1 if across_slice is None else int(across_slice.positions().numel())
    signal = signal.reshape(-1, positions, signal.shape[-1]).mean(1)  # the samples averaged over the slice
    assert rel_max_err(signal.reshape(expected.shape), expected) < 1e-10


@pytest.mark.parametrize("name", CASES)
def test_op_gradients_equal_the_eager_functions(name):
    """First and second order through the ops' registered autograd equal the eager Functions' exactly: both
    run the same VJP and VJP-JVP kernel calls on the same inputs."""
    static, inputs = kernel_call(name)
    leaves = present(inputs)
    results = []
    for run in (lambda: OPS.epg_forward(*ops.static_args(static), *inputs), lambda: EpgSimulate.apply(static, *inputs)):
        grads = torch.autograd.grad(real_loss(run(), 0), leaves, create_graph=True)
        # A Hessian-vector product: the gradient of <grads, v> (the VJP op's backward, the VJP-JVP kernel).
        g = torch.Generator().manual_seed(1)
        inner = sum((gr * torch.randn(gr.shape, generator=g, dtype=gr.dtype)).real.sum() for gr in grads)
        hvp = torch.autograd.grad(inner, leaves, allow_unused=True)
        results.append([*grads, *hvp])
    for op_value, function_value in zip(*results, strict=True):
        if function_value is None:
            assert op_value is None
        else:
            assert torch.equal(op_value, function_value)


@pytest.mark.parametrize("name", ["real", "pooled"])
def test_jvp_op_and_its_backward_equal_the_eager_jacobian(name):
    """The JVP along two random directions (in the flips, the tissue and the pool tables), and the gradient of a
    cost of the signal and the Jacobian with respect to the inputs and the directions, equal EpgJacobian's
    exactly."""
    static, inputs = kernel_call(name)
    g = torch.Generator().manual_seed(2)
    tangents = [None if x is None or i < kernels.NUM_EVENT_INPUTS and i != 2 else
                torch.randn((2,) + tuple(x.shape), generator=g, dtype=x.dtype).requires_grad_()
                for i, x in enumerate(inputs)]
    leaves = present(inputs) + present(tangents)
    results = []
    for run in (lambda: OPS.epg_jvp(*ops.static_args(static), *inputs, *tangents),
                lambda: EpgJacobian.apply(static, len(inputs), *inputs, *tangents)):
        signal, jac = run()
        cost = real_loss(signal, 3) + real_loss(jac, 4)
        results.append([signal, jac, *torch.autograd.grad(cost, leaves, allow_unused=True)])
    for op_value, function_value in zip(*results, strict=True):
        assert (op_value is None) == (function_value is None)
        if op_value is not None:
            assert torch.equal(op_value, function_value)


def test_third_order_is_refused():
    static, inputs = kernel_call("real")
    t1 = inputs[kernels.NUM_EVENT_INPUTS]
    (grad,) = torch.autograd.grad(real_loss(OPS.epg_forward(*ops.static_args(static), *inputs), 0), t1,
                                  create_graph=True)
    (second,) = torch.autograd.grad(grad.sum(), t1, create_graph=True)
    with pytest.raises(RuntimeError, match="first and second derivatives only"):
        torch.autograd.grad(second.sum(), t1)


def _op_samples(name: str) -> dict:
    """op -> the arguments opcheck calls it with."""
    static, inputs = kernel_call(name)
    args = ops.static_args(static)
    g = torch.Generator().manual_seed(5)
    tangents = [None if x is None else torch.randn((2,) + tuple(x.shape), generator=g, dtype=x.dtype)
                for x in inputs]
    cotangent = torch.complex(*(torch.randn(static.num_voxels, static.num_samples, generator=g, dtype=F64)
                                for _ in range(2)))
    wanted = [x is not None for x in inputs]
    plain = [None if x is None else x.detach() for x in inputs]
    # The VJP-JVP op ends the chain (its backward refuses: no third order), so it is checked without grad.
    return {
        "epg_forward": (*args, *inputs),
        "epg_jvp": (*args, *inputs, *tangents),
        "epg_vjp": (*args, wanted, cotangent, *inputs),
        "epg_vjp_jvp": (*args, wanted, True, cotangent, cotangent * 0.5, *plain,
                        *[None if t is None else t[:1] for t in tangents]),
    }


@pytest.mark.parametrize("name", CASES)
@pytest.mark.parametrize("op", ["epg_forward", "epg_jvp", "epg_vjp", "epg_vjp_jvp"])
def test_opcheck(op, name):
    torch.library.opcheck(getattr(OPS, op).default, _op_samples(name)[op])


# -- vmap rules ------------------------------------------------------------------------------------
def _counting(monkeypatch, entry: str) -> list:
    """Count the kernel calls of `engine.kernels.<entry>` (the ops' implementations call it)."""
    calls = []
    original = getattr(kernels, entry)

    def counted(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(kernels, entry, counted)
    return calls


def test_vmap_over_tissue_is_one_forward_call(monkeypatch):
    static, inputs = kernel_call("real")
    args = ops.static_args(static)
    inputs = [None if x is None else x.detach() for x in inputs]
    i = kernels.NUM_EVENT_INPUTS  # T1, batched: 4 maps of the 3 voxels
    t1_maps = inputs[i] * torch.linspace(0.5, 1.5, 4, dtype=F64)[:, None]

    def run(t1):
        return OPS.epg_forward(*args, *inputs[:i], t1, *inputs[i + 1:])

    calls = _counting(monkeypatch, "forward")
    batched = torch.vmap(run)(t1_maps)
    assert len(calls) == 1
    assert torch.equal(batched, torch.stack([run(t) for t in t1_maps]))  # voxels are independent: the same bits


def test_vmap_over_tissue_across_the_slice_loops(monkeypatch):
    """With a slice profile the kernel numbers its voxels by position (voxel u at position u % P): a batch is
    not folded into the voxel axis, but run entry by entry."""
    static, inputs = kernel_call("profiled")
    args = ops.static_args(static)
    inputs = [None if x is None else x.detach() for x in inputs]
    i = kernels.NUM_EVENT_INPUTS
    t1_maps = inputs[i] * torch.linspace(0.5, 1.5, 2, dtype=F64)[:, None]

    def run(t1):
        return OPS.epg_forward(*args, *inputs[:i], t1, *inputs[i + 1:])

    calls = _counting(monkeypatch, "forward")
    batched = torch.vmap(run)(t1_maps)
    assert len(calls) == 2
    assert torch.equal(batched, torch.stack([run(t) for t in t1_maps]))


def test_vmap_over_flips_loops(monkeypatch):
    static, inputs = kernel_call("real")
    args = ops.static_args(static)
    inputs = [None if x is None else x.detach() for x in inputs]
    flips = inputs[2] * torch.linspace(0.8, 1.2, 3, dtype=F64)[:, None]

    def run(flip):
        return OPS.epg_forward(*args, *inputs[:2], flip, *inputs[3:])

    calls = _counting(monkeypatch, "forward")
    batched = torch.vmap(run)(flips)
    assert len(calls) == 3
    assert torch.equal(batched, torch.stack([run(f) for f in flips]))


def test_vmap_over_tangents_is_one_jvp_call(monkeypatch):
    """jacfwd-like: a batch of tangent directions becomes more columns of one JVP call."""
    static, inputs = kernel_call("real")
    args = ops.static_args(static)
    inputs = [None if x is None else x.detach() for x in inputs]
    i = kernels.NUM_EVENT_INPUTS
    directions = torch.eye(3, dtype=F64)[:, None, :]  # 3 entries, each one tangent [1, V] of T1

    def run(t1_tangent):
        return OPS.epg_jvp(*args, *inputs, *[None] * i, t1_tangent, *[None] * (len(inputs) - i - 1))[1]

    calls = _counting(monkeypatch, "jvp")
    batched = torch.vmap(run)(directions)
    assert len(calls) == 1
    # 1e-12 relative: the same derivatives computed in kernel lanes of different widths (1 and 4 columns).
    assert rel_max_err(batched, torch.stack([run(d) for d in directions])) < 1e-12


def test_vmap_over_tissue_with_tangents_is_one_jvp_call(monkeypatch):
    static, inputs = kernel_call("real")
    args = ops.static_args(static)
    inputs = [None if x is None else x.detach() for x in inputs]
    i = kernels.NUM_EVENT_INPUTS
    t1_maps = inputs[i] * torch.linspace(0.5, 1.5, 2, dtype=F64)[:, None]
    tangent = torch.ones((1, 3), dtype=F64)

    def run(t1):
        return OPS.epg_jvp(*args, *inputs[:i], t1, *inputs[i + 1:], *[None] * i, tangent,
                           *[None] * (len(inputs) - i - 1))

    calls = _counting(monkeypatch, "jvp")
    signal, jac = torch.vmap(run)(t1_maps)
    assert len(calls) == 1
    one_by_one = [run(t) for t in t1_maps]
    assert torch.equal(signal, torch.stack([s for s, _ in one_by_one]))
    assert torch.equal(jac, torch.stack([j for _, j in one_by_one]))


def test_vmap_over_cotangents_loops():
    """jacrev-like: the VJP op vmapped over cotangent rows (a loop: each row sums its own event gradients)."""
    static, inputs = kernel_call("real")
    args = ops.static_args(static)
    inputs = [None if x is None else x.detach() for x in inputs]
    wanted = [x is not None for x in inputs]
    g = torch.Generator().manual_seed(6)
    rows = torch.complex(*(torch.randn(2, static.num_voxels, static.num_samples, generator=g, dtype=F64)
                           for _ in range(2)))

    def run(cotangent):
        return OPS.epg_vjp(*args, wanted, cotangent, *inputs)

    batched = torch.vmap(run)(rows)
    for b, row in enumerate(rows):
        for got, expected in zip(batched, run(row), strict=True):
            assert torch.equal(got[b], expected)
