"""The `dtype` run setting of event-train simulators: float64 kernels and complex128 results on request.

By default an event train computes in float32 and returns complex64 (API.md 1.5). `dtype=torch.float64` (or
`torch.complex128`) runs the float64 kernels and returns complex128, which the float64 oracle holds to
round-off (1e-12 of the largest sample here: float64 over a few hundred events, ~1e-14 seen), where the
float32 result is 1e-7 to 1e-5 off: each check below would fail if the setting were ignored.
"""

from __future__ import annotations

import pytest
import torch
import torch.autograd.forward_ad as fwAD
from conftest import rel_max_err, simulator_oracle

from blochsim.model import UNBALANCED, Simulator, SpinPhysics
from blochsim.simulators import FSESimulator, MPnRAGESimulator, MRFSimulator, SPGRSimulator

# Forward mode through the oracle loads torch's forward-mode decompositions, which script with torch.jit:
# a deprecation warning of torch's, not ours.
pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")

F64 = torch.float64
T1 = torch.tensor([700.0, 1300.0], dtype=F64)
T2 = torch.tensor([40.0, 90.0], dtype=F64)
#: float64 kernels against the float64 oracle: round-off over a few hundred events (~1e-14 seen).
DOUBLE_TOL = 1e-12
#: What the float32 kernels leave (~1e-6 seen): far above DOUBLE_TOL, so a float32 run cannot pass as double.
SINGLE_ERROR = 1e-8


SIMULATORS = {
    "mrf": (lambda: MRFSimulator(flip=torch.linspace(5.0, 70.0, 200, dtype=F64), TR=10.0, states=20),
            dict(t1_ms=T1, t2_ms=T2), 20),
    "fse": (lambda: FSESimulator(flip=torch.linspace(120.0, 170.0, 12, dtype=F64), ESP=9.0, TR=600.0, states=30),
            dict(t1_ms=T1, t2_ms=T2, b1=0.9), 30),
    "mpnrage": (lambda: MPnRAGESimulator(nshots=60, flip=7.0, TR=12.0, TI=30.0),
                dict(t1_ms=T1, t2_ms=100.0), 1),
}
PUBLIC = {"t1_ms": "T1", "t2_ms": "T2", "b1": "B1"}


@pytest.mark.parametrize("name", list(SIMULATORS))
def test_float64_agrees_with_the_float64_oracle(name):
    make, fields, states = SIMULATORS[name]
    sim = make()
    tissue = {PUBLIC[k]: v for k, v in fields.items() if k in PUBLIC}
    expected = simulator_oracle(sim, fields, states=states)
    single = sim.simulate(**tissue)
    # The float32 result is right to float32 round-off (1e-5 of the largest sample), not to float64's.
    assert single.dtype == torch.complex64 and SINGLE_ERROR < rel_max_err(single, expected) < 1e-5
    for dtype in (F64, torch.complex128):
        for _ in range(3):  # the structure cache: walked, then resolved, then evaluated from the resolved map
            double = sim.simulate(**tissue, dtype=dtype)
            assert double.dtype == torch.complex128 and rel_max_err(double, expected) < DOUBLE_TOL
    assert sim.simulate(**tissue, dtype=torch.complex64).dtype == torch.complex64
    assert torch.equal(sim.simulate(**tissue, dtype=torch.float32), single)


def test_constructor_bind_and_from_description_take_dtype():
    flips = torch.linspace(5.0, 70.0, 120, dtype=F64)
    sim = MRFSimulator(flip=flips, TR=10.0, states=20)
    expected = simulator_oracle(sim, dict(t1_ms=T1, t2_ms=T2), states=20)
    for double in (MRFSimulator(flip=flips, TR=10.0, states=20, dtype=F64), sim.bind(dtype=F64)):
        got = double.simulate(T1=T1, T2=T2)
        assert got.dtype == torch.complex128 and rel_max_err(got, expected) < DOUBLE_TOL
    stored = Simulator.from_description(sim.describe(), model=SpinPhysics(operators=UNBALANCED), states=20, dtype=F64)
    got = stored.simulate(T1=T1, T2=T2)  # the raw engine value: no post-rotation
    assert got.dtype == torch.complex128 and rel_max_err(got * 1j, expected) < DOUBLE_TOL


def test_float64_jacobian_and_gradient():
    flips = torch.linspace(5.0, 70.0, 30, dtype=F64)
    sim = MRFSimulator(flip=flips, TR=10.0, states=20)
    signal, jac = sim.jacobian(("T1", "T2"), T1=T1, T2=T2, dtype=F64)
    assert signal.dtype == jac.dtype == torch.complex128
    for p, field in enumerate(("t1_ms", "t2_ms")):
        fields = dict(t1_ms=T1, t2_ms=T2)
        with fwAD.dual_level():
            fields[field] = fwAD.make_dual(fields[field], torch.ones_like(fields[field]))
            expected = fwAD.unpack_dual(simulator_oracle(sim, fields, states=20)).tangent
        # Each column on its own scale (dS/dT1 ~1e-4 per ms, dS/dT2 ~1e-3): float64 round-off, 1e-10 for
        # derivatives (the forward-mode kernels against the oracle's forward mode, ~1e-13 seen).
        assert rel_max_err(jac[..., p, :], expected) < 1e-10

    leaf = flips.clone().requires_grad_()
    sim.simulate(flip=leaf, T1=T1, T2=T2, dtype=F64).abs().sum().backward()
    reference = flips.clone().requires_grad_()
    simulator_oracle(sim, dict(t1_ms=T1, t2_ms=T2), states=20, flip=reference).abs().sum().backward()
    assert rel_max_err(leaf.grad, reference.grad) < 1e-10  # the reverse kernels in float64, as above


def test_steady_state_keeps_float64():
    sim = MPnRAGESimulator(nshots=40, flip=7.0, TR=12.0)
    double = sim.simulate(T1=T1, repetitions="auto", dtype=F64)
    assert double.dtype == torch.complex128
    assert sim.simulate(T1=T1, repetitions="auto").dtype == torch.complex64


@pytest.mark.parametrize("bad", [torch.float16, torch.int32, torch.bfloat16, "float64", F64.__class__])
def test_other_dtypes_are_refused(bad):
    sim = MRFSimulator(flip=[10.0, 20.0], TR=10.0)
    with pytest.raises(ValueError, match="dtype must be torch.float32 or torch.complex64 .* torch.float64 or "
                                         "torch.complex128"):
        sim.simulate(T1=1000.0, T2=80.0, dtype=bad)
    with pytest.raises(ValueError, match="dtype must be"):
        sim.bind(dtype=bad)


def test_a_closed_form_refuses_dtype():
    with pytest.raises(TypeError, match="SPGRSimulator is a closed form: it computes in the promoted dtype of its "
                                        "inputs"):
        SPGRSimulator(flip=10.0, TR=10.0, TE=5.0).simulate(T1=1000.0, dtype=F64)
