"""Simulations under torch.compile(fullgraph=True) and torch.export (blochsim/_tracing.py).

A function that builds an MRF description from flip tensors, simulates and forms a loss compiles as one graph
(fullgraph=True raises at any graph break) and gives the eager loss and flip gradient, at its first inputs and
at others (no second plan, no recompilation: the structure was read once, the values are traced). The
gradient also comes out of the compiled function itself (torch.autograd.grad inside it). A Simulator call
and its Jacobian compile too. A call whose structure would depend on a value is refused, naming it. A module
simulating from tissue maps exports (strict) and its exported program, saved and loaded, gives the eager
signal.

The backend is "aot_eager": Dynamo's graph capture and AOTAutograd's forward and backward graphs, which is
what the plan must survive, without Inductor's code generation (about a minute per graph on a loaded CI
machine; the GPU tests in tests/test_custom_ops_cuda.py compile with Inductor and CUDA graphs). Each compile
here takes a few seconds.

Tolerance: 1e-12 relative, float64 kernels. The compiled graph runs the recorded operations of the eager
call and the same kernels; its backward sums the value operations' gradients in AOTAutograd's order, not
eager autograd's, which can move the last bits (~1e-16 each).
"""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from conftest import T1_MS, T2_MS, f64, rel_max_err

from blochsim import _tracing, engine
from blochsim.sequence import (
    EpgEngine,
    ExactSliceProfile,
    Excitation,
    SequenceDescription,
    SSFPFidReadout,
    TissueProperties,
    ideal_rf_definition,
    mrf_description,
    rf_definition,
)
from blochsim.simulators import MRFSimulator

TOL = 1e-12  # see the module docstring
F64 = torch.float64


def flips(scale: float = 1.0) -> torch.Tensor:
    return (torch.linspace(0.2, 1.2, 16, dtype=F64) * scale).requires_grad_()


def mrf_loss(flip_rad: torch.Tensor) -> torch.Tensor:
    """Build the train from the flips, simulate three voxels, and a real loss of the samples."""
    description = mrf_description(flip_rad, 0.01, inversion_time_s=0.02)
    tissue = TissueProperties(t1_ms=f64(T1_MS), t2_ms=f64(T2_MS), b1=f64((0.9, 1.0, 1.1)))
    signal = engine.simulate(description, tissue, states=8, dtype=F64)
    return (signal.abs() ** 2).sum() + signal.real.sum()


def eager_loss_and_grad(fn, x: torch.Tensor):
    x = x.detach().requires_grad_()
    loss = fn(x)
    return loss.detach(), torch.autograd.grad(loss, x)[0]


def test_compiled_mrf_loss_and_gradient_equal_eager():
    compiled = torch.compile(mrf_loss, fullgraph=True, backend="aot_eager")
    plans = len(_tracing._KEYS)
    for scale in (1.0, 0.7):  # the second call: other values, the same graph
        x = flips(scale)
        loss = compiled(x)
        loss.backward()
        expected_loss, expected_grad = eager_loss_and_grad(mrf_loss, x)
        assert rel_max_err(loss.detach(), expected_loss) < TOL
        assert rel_max_err(x.grad, expected_grad) < TOL
    assert len(_tracing._KEYS) == plans + 1  # planned once


def test_dynamic_shapes_give_one_plan_per_train_length():
    """Under dynamic=True (or torch.compile's automatic dynamic shapes, after a second length) a plan holds one
    structure: the number of flips is made static again, guarded, and each length gets its own plan."""
    compiled = torch.compile(mrf_loss, fullgraph=True, backend="aot_eager", dynamic=True)
    for count in (12, 16):
        x = (torch.linspace(0.2, 1.2, count, dtype=F64)).requires_grad_()
        loss = compiled(x)
        loss.backward()
        expected_loss, expected_grad = eager_loss_and_grad(mrf_loss, x)
        assert rel_max_err(loss.detach(), expected_loss) < TOL
        assert rel_max_err(x.grad, expected_grad) < TOL


def test_loss_and_gradient_in_one_compiled_function():
    def loss_and_grad(flip_rad):
        loss = mrf_loss(flip_rad)
        return loss.detach(), torch.autograd.grad(loss, flip_rad)[0]

    with torch._dynamo.config.patch(trace_autograd_ops=True):  # torch.autograd.grad inside a compiled function
        compiled = torch.compile(loss_and_grad, fullgraph=True, backend="aot_eager")
        loss, grad = compiled(flips())
    expected_loss, expected_grad = eager_loss_and_grad(mrf_loss, flips())
    assert rel_max_err(loss, expected_loss) < TOL
    assert rel_max_err(grad, expected_grad) < TOL


def test_compiled_simulator_signal_and_jacobian():
    sim = MRFSimulator(flip=torch.linspace(10.0, 60.0, 16, dtype=F64), TR=10.0, states=8, dtype=F64)
    t1, t2 = f64(T1_MS), f64(T2_MS)

    def run(flip_deg):
        signal = sim.simulate(flip=flip_deg, T1=t1, T2=t2)
        _, jac = sim.jacobian(("T1", "T2"), flip=flip_deg, T1=t1, T2=t2)
        return (signal.abs() ** 2).sum() + (jac.abs() ** 2).sum()

    compiled = torch.compile(run, fullgraph=True, backend="aot_eager")
    for scale in (1.0, 1.2):
        x = (torch.linspace(10.0, 60.0, 16, dtype=F64) * scale).requires_grad_()
        loss = compiled(x)
        loss.backward()
        expected_loss, expected_grad = eager_loss_and_grad(run, x)
        assert rel_max_err(loss.detach(), expected_loss) < TOL
        assert rel_max_err(x.grad, expected_grad) < TOL


# The toy reads a value that requires grad (the plan marks every float that way): torch warns, as it should.
@pytest.mark.filterwarnings("ignore:Converting a tensor with requires_grad=True to a scalar:UserWarning")
def test_structure_read_from_a_value_is_refused():
    """A call that reads a value on the host to decide what it computes cannot be planned once."""
    def reads_a_value(x):
        return x * float(x[0])  # the value of x[0] becomes a constant of the recording

    def run(x):
        return _tracing.traced_call(reads_a_value, (x,), {})

    with pytest.raises(Exception, match="depends on the values of argument 0"):
        torch.compile(run, fullgraph=True, backend="aot_eager")(torch.tensor([2.0, 3.0]))


def test_plan_computes_its_constants_once():
    """Operations on constants alone (here a torch.unique, whose output shape depends on values, as the engine's
    distinct pool intervals do) are computed when the plan is made; a buffer the call fills in place is filled
    afresh on every call (run twice, the same result)."""
    def fills_a_buffer(x):
        rows = torch.unique(torch.tensor([3.0, 1.0, 3.0, 2.0], dtype=x.dtype))
        total = torch.zeros(3, dtype=x.dtype)
        total.add_(x * rows)
        return total

    compiled = torch.compile(lambda x: _tracing.traced_call(fills_a_buffer, (x,), {}), fullgraph=True,
                             backend="aot_eager")
    for x in (f64((1.0, 2.0, 3.0)), f64((-1.0, 0.5, 4.0))):
        assert torch.equal(compiled(x), fills_a_buffer(x))
    plan = getattr(_tracing._PLANS, _tracing._KEYS[next(k for k in reversed(_tracing._KEYS)
                                                         if k[0] is fills_a_buffer)][0])
    operations = {str(node.target) for node in plan.graph.nodes if node.op == "call_function"}
    assert not any("unique" in name or name.endswith("_.Tensor") for name in operations), operations


def test_a_plan_moves_whole_to_the_device_of_its_results():
    """A plan made on the host and moved to another device runs there with nothing left behind: every constant,
    factory and copy of the recording follows (checked on the "meta" device, where any host tensor left in
    the graph meets a meta tensor and raises). A B0 map: the complex path. (A plan with pools records ~2,000
    operations of the tables, ~15 s on a loaded CI machine: tests/test_custom_ops_cuda.py runs one on a GPU.)"""
    tissue = TissueProperties(t1_ms=f64(T1_MS), t2_ms=f64(T2_MS), b0_hz=f64((-5.0, 0.0, 3.0)))
    args = (_tracing.Deferred(mrf_description.__wrapped__, (flips(), 0.01), {}), tissue)
    tensors, objects = [], []
    spec = _tracing._flatten((args, {"states": 8}), tensors, objects)
    graph, _ = _tracing._record(engine.simulate.__wrapped__, spec, objects, tensors)
    host = graph(*tensors)[0]
    _tracing._move_to(graph, torch.device("meta"))
    graph.recompile()
    moved = graph(*[t.detach().to("meta") for t in tensors])[0]
    assert moved.device.type == "meta" and moved.shape == host.shape and moved.dtype == host.dtype


def test_a_deferred_description_says_what_it_offers():
    deferred = _tracing.Deferred(mrf_description, (flips(), 0.01), {})
    with pytest.raises(AttributeError, match="is built when a simulation uses it"):
        _ = deferred.events


def test_compiled_slice_profile_result_equals_eager():
    """EpgEngine.simulate across the slice (a profiled sinc excitation train, a B1 map; its description made
    outside the compiled function): the SimulationResult's signal and the T1 gradient equal eager."""
    t = np.linspace(-3, 3, 120)
    sinc = rf_definition(np.sinc(t) * np.hanning(122)[1:-1], dwell_s=1e-5, bandwidth_hz=6 / 120e-5, definition_id=1)
    parts = []
    for k, flip in enumerate((0.5, 0.8, 1.1)):
        parts += [(k * 8e-3, Excitation(flip, 0.0, definition_id=1)), (k * 8e-3 + 2e-3, SSFPFidReadout())]
    description = SequenceDescription.from_operators(*parts, rf_definitions={0: ideal_rf_definition(), 1: sinc})

    def signal(t1_ms):
        tissue = TissueProperties(t1_ms=t1_ms, t2_ms=torch.tensor(T2_MS), b1=torch.tensor((0.9, 1.0, 1.1)))
        return EpgEngine().simulate(description, tissue, across_slice=ExactSliceProfile(5), nstates=8).signal

    compiled = torch.compile(signal, fullgraph=True, backend="aot_eager")
    for scale in (1.0, 1.2):
        x, y = (torch.tensor(T1_MS).mul(scale).requires_grad_() for _ in range(2))
        got, expected = compiled(x), signal(y)
        (got.abs() ** 2).sum().backward()
        (expected.abs() ** 2).sum().backward()
        # 1e-6: float32 kernels (EpgEngine's dtype); the same operations and kernels, round-off where orders differ.
        assert rel_max_err(got.detach(), expected.detach()) < 1e-6
        assert rel_max_err(x.grad, y.grad) < 1e-6


class Fingerprints(torch.nn.Module):
    """An MRF dictionary's signal from tissue maps, for a reconstruction pipeline."""

    def __init__(self):
        super().__init__()
        self.sim = MRFSimulator(flip=torch.linspace(5.0, 60.0, 16), TR=10.0, states=8)

    def forward(self, t1_ms, t2_ms):
        return self.sim.simulate(T1=t1_ms, T2=t2_ms)


def test_export_of_a_simulating_module():
    module = Fingerprints()
    t1, t2 = torch.tensor(T1_MS), torch.tensor(T2_MS)
    program = torch.export.export(module, (t1, t2), strict=True)
    buffer = io.BytesIO()
    torch.export.save(program, buffer)
    buffer.seek(0)
    loaded = torch.export.load(buffer)
    other = (t1 * 1.3, t2 * 0.8)  # values other than the example's
    # 1e-6 relative: float32 kernels on the same inputs, the exported graph's value operations against the
    # eager engine's (the same operations, float32 round-off ~1e-7 where their order differs).
    assert rel_max_err(loaded.module()(*other), module(*other)) < 1e-6


def test_non_strict_export_is_refused_with_the_way_out():
    t1, t2 = torch.tensor(T1_MS), torch.tensor(T2_MS)
    with pytest.raises(Exception, match="strict=True"):
        torch.export.export(Fingerprints(), (t1, t2), strict=False)
