"""The `Simulator` surface (API.md section 2), the engine-facing names of 6.4, and structure resolution.

Physics is checked against the float64 oracle `blochsim._reference.play` (or the engine's float64
kernels where the oracle would need thousands of playings); the kernels run in float32, so values are
compared at 1e-5 of the largest sample, first derivatives at 1e-4 and second at 1e-3 of the largest
entry (API.md parity targets), a Jacobian's of each column's own (conftest.column_rel_err).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.autograd.forward_ad as fwAD
from conftest import column_rel_err, rel_max_err

import blochsim
from blochsim import engine
from blochsim._reference import play
from blochsim.model import (
    BALANCED,
    REFOCUSED,
    SPOILED,
    UNBALANCED,
    EventOperators,
    Simulator,
    SpinPhysics,
)
from blochsim.sequence import (
    EpgEngine,
    Excitation,
    FSEReadout,
    SequenceDescription,
    SimulationResult,
    SPGRReadout,
    SSFPFidReadout,
    TissueProperties,
    bSSFPReadout,
    mrf_description,
    pack_description,
)
from blochsim.simulators import MRFSimulator

F64 = torch.float64

# Forward mode (the oracle's Jacobians, closed forms, pool tables) loads torch's forward-mode decompositions,
# which script with torch.jit: a deprecation warning of torch's, not ours.
pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")


class IRFisp(Simulator):
    """API.md 2.4's example: an inversion, then FISP repetitions (the layout converts to float32 itself)."""

    readout = SSFPFidReadout
    states = 16

    def layout(self, *, flip, TR, TI=10.0):
        ops = [self.operators.inversion(), self.operators.delay(TI * 1e-3)]
        for a in torch.as_tensor(flip, dtype=torch.float32):
            ops.append(self.operators.excitation(torch.deg2rad(a)) @ self.operators.readout(duration_s=TR * 1e-3))
        return ops


class OneTR(Simulator):
    """One repetition time: an excitation, then the model's readout over TR (ms). For steady states."""

    def layout(self, *, flip, TR, phase=0.0):
        p = phase * math.pi / 180
        return [self.operators.excitation(torch.deg2rad(torch.as_tensor(flip, dtype=F64)), p)
                @ self.operators.readout(p, duration_s=TR * 1e-3)]


def one_tr(operators, **fixed):
    return type("OneTR", (OneTR,), {"model": SpinPhysics(operators=operators)})(**fixed)


class Ernst(Simulator):
    """A closed form: the spoiled steady state (real)."""

    model = SpinPhysics(properties={"T1": None, "M0": None})

    def evaluate(self, properties, *, flip, TR):
        a = torch.deg2rad(torch.as_tensor(flip))
        tissue = {k: v[..., None] if a.dim() else v for k, v in properties.items()}  # samples last
        e1 = torch.exp(-torch.as_tensor(TR) / tissue["T1"])
        return tissue.get("M0", 1.0) * (1 - e1) * torch.sin(a) / (1 - e1 * torch.cos(a))


def crlb(J):
    """Stand-in for blochsim.optim.crlb: the diagonal of the inverse Fisher information, (..., P, S) -> (..., P)."""
    real = torch.cat([J.real, J.imag], -1)
    return torch.diagonal(torch.linalg.inv(real @ real.transpose(-1, -2)), dim1=-2, dim2=-1)


# -- construction and class machinery ----------------------------------------------------------------
def test_simulator_itself_cannot_be_instantiated():
    with pytest.raises(TypeError, match="subclass it"):
        Simulator()


def test_subclass_without_layout_or_evaluate():
    class Nothing(Simulator):
        pass

    with pytest.raises(TypeError, match="layout\\(\\) nor evaluate\\(\\)"):
        Nothing()


def test_handler_slots_move_into_the_model():
    assert "readout" not in IRFisp.__dict__
    assert IRFisp.model.operators.readout is SSFPFidReadout
    assert IRFisp.model.operators.excitation is Excitation
    assert Simulator.model.operators.readout is not SSFPFidReadout  # the base model is untouched

    class ModelWins(Simulator):
        readout = SSFPFidReadout
        model = SpinPhysics(operators=SPOILED)

        def layout(self, *, flip):
            return []

    assert ModelWins.model.operators.readout is SPGRReadout


def test_presets():
    assert BALANCED.readout is bSSFPReadout and UNBALANCED.readout is SSFPFidReadout
    assert SPOILED.readout is SPGRReadout and REFOCUSED.readout is FSEReadout
    assert not BALANCED.refocusing(math.pi).emit(0.0)[0].action  # uncrushed
    assert UNBALANCED.refocusing(math.pi).emit(0.0)[0].action  # crushed
    assert EventOperators().preparation is Excitation


def test_spin_physics():
    model = SpinPhysics(properties={"T1": "t1_ms", "T2": "t2_ms", "ATT": None}, fixed={"m0": 2.0})
    with pytest.raises(dataclass_error()):
        model.fixed = {}
    assert model.fields == {"T1": "t1_ms", "T2": "t2_ms"}
    tissue = model.tissue({"T1": 800.0, "T2": 60.0, "ATT": 5.0, "B0": 3.0})
    assert (tissue.t1_ms, tissue.t2_ms, tissue.m0, tissue.b0_hz) == (800.0, 60.0, 2.0, 3.0)
    with pytest.raises(ValueError, match="not a TissueProperties field"):
        SpinPhysics(properties={"T1": "t1"})
    with pytest.raises(ValueError, match="not a TissueProperties field"):
        SpinPhysics(fixed={"T2": 100.0})


def dataclass_error():
    import dataclasses

    return dataclasses.FrozenInstanceError


def test_members():
    sim = MRFSimulator(flip=[10.0, 20.0], TR=10.0, T1=900.0)
    assert sim.variables == ("flip", "TR", "TI", "phases")
    assert sim.exposes == ("T1", "T2", "M0", "B1", "inv_efficiency")
    assert set(sim.accepts) >= {"T1", "B0", "bound_fraction", "poolE_shift", "bound_T2"}
    assert dict(sim.protocol) == {"flip": [10.0, 20.0], "TR": 10.0} and dict(sim.bound) == {"T1": 900.0}
    with pytest.raises(TypeError):
        sim.protocol["TR"] = 5.0
    assert sim.rf_raster_time_s == 1e-6 and sim.operators is UNBALANCED
    assert sim.repetition_s(0.25, flip=1.0) == 0.25
    played = sim.played(TI=5.0, states=4)
    assert set(played) == {"flip", "TR", "TI"} and played["flip"].dtype == F64
    closed = Ernst(TR=10.0)
    assert closed.variables == () and closed.accepts == closed.exposes == ("T1", "M0")


# -- errors (API.md 10) ---------------------------------------------------------------------------
def test_unknown_names_suggest_the_nearest():
    sim = MRFSimulator(flip=[10.0], TR=10.0)
    with pytest.raises(TypeError, match="unknown argument 'T22' \\(did you mean 'T2'\\?\\).*MRFSimulator|"
                                        "MRFSimulator.*unknown argument 'T22' \\(did you mean 'T2'\\?\\)"):
        sim.simulate(T1=1000.0, T22=80.0)
    with pytest.raises(TypeError, match="did you mean 'flip'"):
        MRFSimulator(flp=[10.0])
    with pytest.raises(TypeError, match="did you mean 'TR'"):
        sim.bind(TRR=5.0)


def test_nstates_points_to_states():
    for call in (lambda: MRFSimulator(nstates=4), lambda: MRFSimulator(flip=[1.0], TR=1.0).bind(nstates=4),
                 lambda: MRFSimulator(flip=[1.0], TR=1.0).simulate(T1=1.0, T2=1.0, nstates=4)):
        with pytest.raises(TypeError, match="'states'"):
            call()


def test_missing_required_names_the_three_places():
    with pytest.raises(TypeError, match="MRFSimulator needs 'T2' \\(ms\\).*call.*constructor.*bind"):
        MRFSimulator(flip=[10.0], TR=10.0).simulate(T1=1000.0)
    with pytest.raises(TypeError, match="needs 'flip' \\(deg\\)"):
        MRFSimulator(TR=10.0).simulate(T1=1000.0, T2=80.0)


def test_closed_form_rejects_names_it_does_not_model():
    with pytest.raises(TypeError, match="closed form and does not model 'B1'.*T1, M0"):
        Ernst(TR=10.0).simulate(flip=30.0, T1=1000.0, B1=0.9)
    with pytest.raises(TypeError, match="did you mean"):
        Ernst(TR=10.0).simulate(flip=30.0, T11=1000.0)


def test_bad_settings():
    sim = MRFSimulator(flip=[10.0], TR=10.0)
    with pytest.raises(ValueError, match="record must be one of"):
        sim.simulate(T1=1.0, T2=1.0, record="last")
    with pytest.raises(ValueError, match="states must be an integer >= 1"):
        MRFSimulator(states=0)
    with pytest.raises(ValueError, match="repetitions must be"):
        sim.bind(repetitions=0)
    with pytest.raises(TypeError, match="constructor only"):
        sim.simulate(T1=1.0, T2=1.0, voxel_size_m=1e-3)
    with pytest.raises(TypeError, match="RfDefinition"):
        sim.bind(pulse="sinc")
    with pytest.raises(ValueError, match="across_slice must be an int >= 1"):
        sim.simulate(T1=1.0, T2=1.0, across_slice=0)
    with pytest.raises(TypeError, match="across_slice must be None, an int >= 1 .* or an ExactSliceProfile"):
        sim.simulate(T1=1.0, T2=1.0, across_slice="5")
    # Shims make B1 a channel map, so a layout's pulse without a shim id has no field to play.
    with pytest.raises(ValueError, match="is a pulse without a shim"):
        sim.simulate(T1=1.0, T2=1.0, shims={1: blochsim.ShimDefinition(1, [1.0], [0.0])})


def test_bad_relaxation_times():
    sim = MRFSimulator(flip=[10.0, 20.0], TR=10.0)
    with pytest.raises(ValueError,
                       match="T1 must be a time >= 0 ms.*2 of 3 value\\(s\\) are bad, the first at index \\(1,\\)"):
        sim.simulate(T1=torch.tensor([1000.0, float("nan"), -2.0]), T2=80.0)
    with pytest.raises(ValueError, match="T2 must be a time >= 0 ms"):
        sim.simulate(T1=1000.0, T2=-1.0)
    zero = sim.simulate(T1=torch.tensor([0.0, 1000.0]), T2=torch.tensor([0.0, 80.0]))  # 0 is allowed (clamped)
    assert torch.isfinite(zero.real).all()


def test_shapes_that_do_not_broadcast():
    with pytest.raises(ValueError, match="T1 \\(3,\\), T2 \\(4,\\).*T1 \\(3,\\) and T2 \\(4,\\) conflict"):
        MRFSimulator(flip=[10.0], TR=10.0).simulate(T1=torch.ones(3), T2=torch.ones(4))


def test_cuda_requests():
    assert issubclass(blochsim.CudaBuildMismatch, ImportError)
    sim = MRFSimulator(flip=[10.0], TR=10.0)
    if torch.version.cuda is None:
        with pytest.raises(RuntimeError, match="built without CUDA.*blochsim\\[cu12\\]"):
            sim.simulate(T1=1.0, T2=1.0, device="cuda")
        with pytest.raises(RuntimeError, match="without CUDA"):
            sim.to("cuda:0")
        with pytest.raises(RuntimeError, match="without CUDA"):
            sim.simulate(T1=1.0, T2=1.0, execution="cuda")
    else:
        with pytest.raises((blochsim.CudaBuildMismatch, NotImplementedError)):
            sim.simulate(T1=1.0, T2=1.0, device="cuda")
    assert sim.simulate(T1=1.0, T2=1.0, device="cpu", execution="cpu").shape == (1,)


# -- shapes, dtypes and array libraries ----------------------------------------------------------------
def test_shapes_broadcast_into_the_voxel_shape():
    sim = MRFSimulator(flip=torch.linspace(10, 40, 6), TR=10.0)
    assert sim.simulate(T1=1000.0, T2=80.0).shape == (6,)
    assert sim.simulate(T1=torch.ones(7, 1) * 900, T2=80.0).shape == (7, 1, 6)  # [fix]: not (7, 1, 1, 6)
    T1, T2 = torch.tensor([[800.0], [900.0], [1000.0], [1100.0]]), torch.tensor([40.0, 60, 80, 100, 120])
    out = sim.simulate(T1=T1, T2=T2)
    assert out.shape == (4, 5, 6) and out.dtype == torch.complex64
    flat = sim.simulate(T1=torch.tensor([800.0, 900, 1000, 1100]).repeat_interleave(5),
                        T2=torch.tensor([40.0, 60, 80, 100, 120]).repeat(4))
    assert rel_max_err(out.reshape(20, 6), flat) < 1e-6


def test_array_libraries():
    sim = MRFSimulator(flip=[10.0, 20.0, 30.0], TR=10.0)
    assert isinstance(sim.simulate(T1=np.array([800.0, 1000.0]), T2=80.0), np.ndarray)
    assert isinstance(sim.simulate(T1=1000.0, T2=torch.tensor(80.0)), torch.Tensor)
    assert isinstance(sim.simulate(T1=1000.0, T2=80.0), torch.Tensor)  # no array anywhere: torch
    bound = MRFSimulator(flip=np.array([10.0, 20.0, 30.0]), TR=10.0)  # [fix]: bound arrays decide
    assert isinstance(bound.simulate(T1=1000.0, T2=80.0), np.ndarray)
    assert isinstance(bound.simulate(T1=torch.tensor(1000.0), T2=80.0), torch.Tensor)  # the call's array first
    signal, jac = sim.jacobian("T1", T1=np.array([1000.0]), T2=80.0)
    assert isinstance(signal, np.ndarray) and isinstance(jac, np.ndarray) and jac.dtype == np.complex64
    assert np.allclose(sim.simulate(T1=np.float32(1000.0), T2=[80.0]), sim.simulate(T1=1000.0, T2=80.0).numpy())


def test_bind_to_describe():
    sim = MRFSimulator(TR=10.0)
    bound = sim.bind(flip=[10.0, 20.0], T2=80.0, states=12)
    assert "flip" not in sim.protocol and bound.protocol["flip"] == [10.0, 20.0]
    assert bound.simulate(T1=1000.0).shape == (2,)
    d = bound.describe()
    assert isinstance(d, SequenceDescription) and len(d.adc_events) == 2
    assert len(bound.describe(flip=[5.0, 6.0, 7.0]).adc_events) == 3  # [fix]: the rest from the fixed protocol
    assert math.isclose(float(d.tr_duration_us), 20000.0)
    moved = bound.to("cpu")
    assert moved.simulate(T1=1000.0).shape == (2,) and moved is not bound
    with pytest.raises(TypeError, match="no protocol"):
        MRFSimulator.from_description(d).describe(flip=[1.0])


def test_repetition_s_sets_the_repetition():
    class Padded(OneTR):
        model = SpinPhysics(operators=SPOILED)

        def repetition_s(self, played_s, *, TR, **protocol):
            return played_s + 0.1  # 100 ms of recovery after the layout

    sim = Padded(flip=30.0, TR=5.0)
    assert math.isclose(float(sim.describe().tr_duration_us), 105000.0)
    two = sim.simulate(T1=1000.0, T2=80.0, repetitions=2)
    expected = play(sim.describe(), TissueProperties(t1_ms=1000.0, t2_ms=80.0), states=8, repetitions=2).signal
    assert rel_max_err(two, expected) < 1e-5


def test_pulse_replaces_definition_zero():
    pulse = blochsim.rf_definition(np.hanning(64), dwell_s=1e-5)
    d = MRFSimulator(flip=[10.0], TR=10.0, pulse=pulse).describe()
    assert d.rf_definitions[0] is pulse


# -- derivatives ----------------------------------------------------------------------------------------
def test_jacobian_shapes_and_values_against_the_engine():
    flips = torch.linspace(10, 50, 12)
    sim = MRFSimulator(flip=flips, TR=8.0, TI=20.0)
    T1, T2 = torch.tensor([[700.0], [1300.0]]), torch.tensor([50.0, 90.0, 150.0])
    signal, J = sim.jacobian(("T1", "T2", "B1"), T1=T1, T2=T2, B1=0.9)
    assert signal.shape == (2, 3, 12) and J.shape == (2, 3, 3, 12)
    d = mrf_description(torch.deg2rad(flips), 8e-3, inversion_time_s=20e-3)
    raw, raw_j = engine.jacobian(d, TissueProperties(t1_ms=T1, t2_ms=T2, b1=0.9), ("t1_ms", "t2_ms", "b1"), states=10)
    assert rel_max_err(signal, raw * 1j) < 1e-6 and column_rel_err(J, raw_j * 1j) < 1e-6
    one, J1 = sim.jacobian("T2", T1=T1, T2=T2, B1=0.9)
    assert J1.shape == (2, 3, 12) and rel_max_err(J1, J[..., 1, :]) < 1e-6
    _, Jt = sim.jacobian(("T2",), T1=T1, T2=T2)
    assert Jt.shape == (2, 3, 1, 12)


def test_jacobian_errors():
    sim = MRFSimulator(flip=[10.0, 20.0], TR=10.0)
    with pytest.raises(ValueError, match="did not give 'B1'"):
        sim.jacobian("B1", T1=1000.0, T2=80.0)
    with pytest.raises(ValueError, match="protocol argument.*build a cost and call backward\\(\\)"):
        sim.jacobian(("T1", "flip"), T1=1000.0, T2=80.0)
    with pytest.raises(ValueError, match="real float property"):
        sim.jacobian("T1", T1=np.array([1000, 1200]), T2=80.0)


def test_closed_form_simulate_and_jacobian():
    sim = Ernst(TR=10.0)
    T1 = torch.tensor([800.0, 1200.0])
    flip = torch.tensor([10.0, 20.0, 30.0])
    assert sim.simulate(flip=30.0, T1=T1).shape == (2,)  # a scalar protocol: no sample axis
    signal, J = sim.jacobian("T1", flip=flip, T1=T1)
    assert signal.shape == J.shape == (2, 3)
    h = 1e-3
    numeric = (sim.simulate(flip=flip, T1=T1.double() + h) - sim.simulate(flip=flip, T1=T1.double() - h)) / (2 * h)
    assert torch.allclose(J.double(), numeric, rtol=1e-4, atol=1e-10)
    _, Jt = sim.jacobian(("T1", "M0"), flip=flip, T1=T1, M0=torch.tensor(2.0))
    assert Jt.shape == (2, 2, 3)


def oracle_signal(description, t1, t2, *, states=10, **fields):
    return play(description, TissueProperties(t1_ms=t1, t2_ms=t2, **fields), states=states).signal


def test_reverse_mode_reaches_flips_tr_and_tissue():
    flip = torch.linspace(15, 45, 8, dtype=F64).requires_grad_()
    tr = torch.tensor(9.0, dtype=F64, requires_grad=True)
    t1 = torch.tensor([700.0, 1100.0], dtype=F64, requires_grad=True)
    sim = MRFSimulator(TI=15.0)
    weights = torch.linspace(1, 2, 8)
    cost = (sim.simulate(flip=flip, TR=tr, T1=t1, T2=70.0).real * weights).sum()
    grads = torch.autograd.grad(cost, (flip, tr, t1))
    flip_ref = flip.detach().clone().requires_grad_()
    tr_ref = tr.detach().clone().requires_grad_()
    t1_ref = t1.detach().clone().requires_grad_()
    description = sim.describe(flip=flip_ref, TR=tr_ref)
    cost_ref = ((oracle_signal(description, t1_ref, 70.0) * 1j).real * weights).sum()
    expected = torch.autograd.grad(cost_ref, (flip_ref, tr_ref, t1_ref))
    for got, want in zip(grads, expected, strict=True):
        assert rel_max_err(got, want) < 1e-4  # first derivatives: float32 kernels


def test_second_order_through_jacobian():
    """API.md 2.4's example: a cost of the Jacobian, then backward() to the flips (vs the oracle)."""
    flip = torch.linspace(10, 40, 8).requires_grad_()
    T1 = torch.tensor([800.0, 1200.0])
    sig, J = IRFisp(TR=8.0).jacobian(("T1", "T2"), flip=flip, T1=T1, T2=60.0)
    assert sig.dtype == torch.complex64 and sig.shape == (2, 8) and J.shape == (2, 2, 8)
    crlb(J).sum().backward()
    assert flip.grad.shape == (8,)

    flip_ref = flip.detach().double().requires_grad_()
    description = IRFisp(TR=8.0).describe(flip=flip_ref)
    columns = []
    for name in ("t1_ms", "t2_ms"):
        with fwAD.dual_level():
            t1 = T1.double()
            t2 = torch.tensor(60.0, dtype=F64)
            fields = {"t1_ms": t1, "t2_ms": t2}
            fields[name] = fwAD.make_dual(fields[name], torch.ones_like(fields[name]))
            columns.append(fwAD.unpack_dual(oracle_signal(description, states=16, t1=fields["t1_ms"],
                                                          t2=fields["t2_ms"])).tangent)
    J_ref = torch.stack(columns, -2)
    assert column_rel_err(J, J_ref) < 1e-4
    (grad_ref,) = torch.autograd.grad(crlb(J_ref).sum(), flip_ref)
    assert rel_max_err(flip.grad, grad_ref) < 1e-3  # second derivatives


def test_third_order_is_refused():
    t1 = torch.tensor([900.0, 1100.0], requires_grad=True)
    signal = MRFSimulator(flip=[20.0, 30.0, 40.0], TR=10.0).simulate(T1=t1, T2=80.0)
    (g,) = torch.autograd.grad(signal.abs().sum(), t1, create_graph=True)
    (h,) = torch.autograd.grad(g.sum(), t1, create_graph=True)
    with pytest.raises(RuntimeError, match="first and second derivatives only"):
        torch.autograd.grad(h.sum(), t1)


# -- steady state ---------------------------------------------------------------------------------------
STEADY_CASES = [("spoiled", SPOILED, {}), ("balanced", BALANCED, {}),
                ("balanced off resonance", BALANCED, {"B0": 13.0}), ("fisp (winding)", UNBALANCED, {}),
                ("fisp phase 45", UNBALANCED, {"phase": 45.0})]


@pytest.mark.parametrize(("name", "operators", "extra"), STEADY_CASES, ids=[c[0] for c in STEADY_CASES])
def test_steady_state_against_many_repetitions(name, operators, extra):
    phase = extra.pop("phase", 0.0)
    sim = one_tr(operators, flip=30.0, TR=5.0, phase=phase)
    t1, t2 = torch.tensor([300.0, 1000.0, 2500.0]), torch.tensor([[30.0], [80.0], [200.0]])
    auto = sim.simulate(T1=t1, T2=t2, repetitions="auto", **extra)
    description = sim.describe()
    winding = EpgEngine().shifts_per_repetition(description) > 0
    tissue = TissueProperties(t1_ms=t1, t2_ms=t2, b0_hz=extra.get("B0", 0.0))
    explicit64 = engine.simulate(description, tissue, repetitions=5000, states=64 if winding else 8, dtype=F64)
    # The limit is exact to float64 rounding (2e-8 seen); the float32 narrowing bounds it at ~1e-7.
    assert rel_max_err(auto, explicit64) < 1e-6
    # Against the float32 engine, 5000 playings accumulate ~5e-6 of rounding themselves.
    assert rel_max_err(auto, sim.simulate(T1=t1, T2=t2, repetitions=5000, **extra)) < 1e-5


def test_wynn_removes_geometric_modes():
    from blochsim.engine.steady import wynn

    n = torch.arange(1, 8, dtype=F64)
    c = torch.tensor(2.0, dtype=F64, requires_grad=True)
    modes = (0.5 + 0.1j) * (0.9 + 0.2j) ** n - 0.3 * (-0.5) ** n + 0.2 * 0.6**n  # three modes: 7 terms suffice
    limit, dlimit, _ = wynn(c + modes, torch.ones(1, 7, dtype=torch.complex128))
    assert abs(complex(limit.detach()) - 2.0) < 1e-12 and abs(complex(dlimit[0].detach()) - 1.0) < 1e-9
    (grad,) = torch.autograd.grad(limit.real, c)
    assert abs(float(grad) - 1.0) < 1e-9
    converged, _, _ = wynn(torch.full((9,), 3.0, dtype=F64))  # no differences: no division by zero
    assert float(converged) == 3.0


def test_steady_state_is_differentiable():
    flip = torch.tensor(25.0, dtype=F64, requires_grad=True)
    t1 = torch.tensor([600.0, 1500.0], requires_grad=True)
    sim = one_tr(UNBALANCED, TR=6.0)
    auto = sim.simulate(flip=flip, T1=t1, T2=60.0, repetitions="auto")
    grads = torch.autograd.grad(auto.abs().sum(), (flip, t1))
    flip_ref = flip.detach().clone().requires_grad_()
    t1_ref = t1.detach().double().requires_grad_()
    explicit = engine.simulate(sim.describe(flip=flip_ref), TissueProperties(t1_ms=t1_ref, t2_ms=60.0),
                               repetitions=3000, states=64, dtype=F64)
    expected = torch.autograd.grad(explicit.abs().sum(), (flip_ref, t1_ref))
    for got, want in zip(grads, expected, strict=True):
        assert rel_max_err(got, want) < 1e-4
    signal, J = sim.jacobian(("T1", "T2"), flip=flip, T1=t1, T2=60.0, repetitions="auto")
    _, J_ref = engine.jacobian(sim.describe(flip=flip.detach()), TissueProperties(t1_ms=t1.detach().double(),
                               t2_ms=60.0), ("t1_ms", "t2_ms"), repetitions=3000, states=64, dtype=F64)
    assert J.shape == (2, 2, 1) and column_rel_err(J, J_ref) < 1e-4


# -- structure resolution ---------------------------------------------------------------------------------
def flips_of(n: int, shift: float) -> torch.Tensor:
    return torch.linspace(5, 60, n) + shift


def test_value_only_calls_resolve_and_match_a_fresh_walk():
    sim = MRFSimulator(TR=10.0, TI=20.0)
    T1, T2 = torch.tensor([600.0, 1400.0]), torch.tensor([50.0, 110.0])
    results = [sim.simulate(flip=flips_of(40, 0.3 * k), T1=T1, T2=T2) for k in range(4)]
    (entry,) = sim._cache.entries.values()
    assert entry.state == "resolved" and entry.verified
    for k, result in enumerate(results):
        fresh = MRFSimulator(TR=10.0, TI=20.0, resolve=False).simulate(flip=flips_of(40, 0.3 * k), T1=T1, T2=T2)
        assert rel_max_err(result, fresh) < 1e-6  # the same program; values agree to float32 rounding
    # Gradients still reach the protocol through the affine map.
    flip = flips_of(40, 1.0).requires_grad_()
    sim.simulate(flip=flip, T1=T1, T2=T2).real.sum().backward()
    flip_ref = flips_of(40, 1.0).requires_grad_()
    MRFSimulator(TR=10.0, TI=20.0, resolve=False).simulate(flip=flip_ref, T1=T1, T2=T2).real.sum().backward()
    assert rel_max_err(flip.grad, flip_ref.grad) < 1e-5


def test_a_repeated_protocol_is_verified_at_a_second_point_when_resolved():
    """A protocol resolved at the point it was first seen has its map checked at a second point (each entry
    moved, unevenly), so a later call compares nothing with the first point (on a card, a wait). A map that
    is exact only at its point (a layout not affine in the protocol) stays unverified there, right at that
    point, and the next new point walks (test_a_layout_that_is_not_affine_keeps_walking): also one that
    agrees with its linearisation along every scaling of the point (a flip train normalised to its largest
    flip), which a scaled second point would have taken for affine."""
    sim = MRFSimulator(TR=10.0)
    same = flips_of(12, 0.0)
    first = sim.simulate(flip=same, T1=900.0, T2=80.0)
    again = sim.simulate(flip=same.clone(), T1=900.0, T2=80.0)  # resolved at the same point, checked elsewhere
    (entry,) = sim._cache.entries.values()
    assert entry.state == "resolved" and entry.verified and rel_max_err(again, first) < 1e-6
    new = sim.simulate(flip=flips_of(12, 3.0), T1=900.0, T2=80.0)
    walked = MRFSimulator(TR=10.0, resolve=False).simulate(flip=flips_of(12, 3.0), T1=900.0, T2=80.0)
    assert rel_max_err(new, walked) < 1e-6

    class Squared(Simulator):
        model = SpinPhysics(operators=UNBALANCED)
        states = 8

        def layout(self, *, flip):
            return [self.operators.excitation(torch.deg2rad(a) ** 2 / 2) @ self.operators.readout(duration_s=0.01)
                    for a in flip]

    class Normalised(Simulator):  # flips scaled so the largest is 60 degrees: homogeneous of degree 0
        model = SpinPhysics(operators=UNBALANCED)
        states = 8

        def layout(self, *, flip):
            angles = torch.deg2rad(flip) * (60.0 / flip.max())
            return [self.operators.excitation(a) @ self.operators.readout(duration_s=0.01) for a in angles]

    for cls in (Squared, Normalised):
        sim = cls()
        results = [sim.simulate(flip=flips_of(6, 0.0), T1=900.0, T2=80.0) for _ in range(3)]
        (entry,) = sim._cache.entries.values()
        assert entry.state == "resolved" and not entry.verified, cls
        want = cls(resolve=False).simulate(flip=flips_of(6, 0.0), T1=900.0, T2=80.0)
        assert all(rel_max_err(got, want) < 1e-6 for got in results)
        got = sim.simulate(flip=flips_of(6, 2.0), T1=900.0, T2=80.0)  # a new point walks, and is right
        assert rel_max_err(got, cls(resolve=False).simulate(flip=flips_of(6, 2.0), T1=900.0, T2=80.0)) < 1e-6


def test_the_second_points_walk_is_silent():
    """The map's check at the scaled protocol walks the layout at values the user never gave: what the layout
    warns of there is not the user's."""
    import warnings

    class Warns(Simulator):
        model = SpinPhysics(operators=UNBALANCED)
        states = 8

        def layout(self, *, flip):
            if float(flip.detach().max()) > 60.0:
                warnings.warn("a flip over 60 degrees", UserWarning, stacklevel=2)
            return [self.operators.excitation(torch.deg2rad(a)) @ self.operators.readout(duration_s=0.01) for a in flip]

    sim = Warns()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(3):
            sim.simulate(flip=torch.linspace(20.0, 59.0, 4), T1=900.0, T2=80.0)
    (entry,) = sim._cache.entries.values()
    assert entry.state == "resolved" and entry.verified


def test_a_train_axis_is_stacked_first():
    class Trains(Simulator):
        model = SpinPhysics(operators=UNBALANCED)

        def layout(self, *, flip):
            return [self.operators.excitation(torch.deg2rad(flip)) @ self.operators.readout(duration_s=0.01)]

    both = Trains(flip=torch.tensor([10.0, 20.0])).simulate(T1=900.0, T2=80.0)  # one flip per train
    assert both.shape == (2, 1) and torch.equal(both[1], Trains(flip=torch.tensor(20.0)).simulate(T1=900.0, T2=80.0))


def test_resolution_with_a_tensor_tr_and_phases():
    sim = MRFSimulator(TI=5.0)
    T1 = torch.tensor([900.0])
    for k in range(4):
        tr = torch.tensor([8.0 + k, 9.0, 10.0, 11.0 - 0.5 * k])
        phases = torch.tensor([0.0, 30.0 * k, 60.0, 10.0])
        got = sim.simulate(flip=flips_of(4, k), TR=tr, phases=phases, T1=T1, T2=70.0)
        want = MRFSimulator(TI=5.0, resolve=False).simulate(flip=flips_of(4, k), TR=tr, phases=phases, T1=T1,
                                                             T2=70.0)
        assert rel_max_err(got, want) < 1e-6
    (entry,) = sim._cache.entries.values()
    assert entry.state == "resolved"


def test_a_layout_that_is_not_affine_keeps_walking():
    class Squared(Simulator):
        model = SpinPhysics(operators=UNBALANCED)
        states = 8

        def layout(self, *, flip, TR):
            return [self.operators.excitation(torch.deg2rad(a) ** 2 / 2) @ self.operators.readout(duration_s=TR * 1e-3)
                    for a in flip]

    sim = Squared(TR=10.0)
    for k in range(3):
        got = sim.simulate(flip=flips_of(6, 2.0 * k), T1=900.0, T2=80.0)
        want = Squared(TR=10.0, resolve=False).simulate(flip=flips_of(6, 2.0 * k), T1=900.0, T2=80.0)
        assert rel_max_err(got, want) < 1e-6
    (entry,) = sim._cache.entries.values()
    assert entry.state == "walk"


def test_structure_keys():
    sim = MRFSimulator(TR=10.0)
    sim.simulate(flip=flips_of(5, 0), T1=900.0, T2=80.0)
    sim.simulate(flip=flips_of(6, 0), T1=900.0, T2=80.0)  # another length: another structure
    sim.simulate(flip=flips_of(5, 0), T1=900.0, T2=80.0, B0=10.0)  # the complex path: another program
    assert len(sim._cache.entries) == 3
    # Scalars are structural: a new TR is a new key, and right.
    a = sim.simulate(flip=flips_of(5, 0), TR=12.0, T1=900.0, T2=80.0)
    b = MRFSimulator(resolve=False).simulate(flip=flips_of(5, 0), TR=12.0, T1=900.0, T2=80.0)
    assert rel_max_err(a, b) < 1e-7


def test_from_description():
    sim = MRFSimulator(flip=[10.0, 20.0, 30.0], TR=10.0)
    d = sim.describe()
    with pytest.raises(ValueError, match="model"):
        Simulator.from_description(d)
    stored = MRFSimulator.from_description(d, states=10)
    assert stored.variables == () and stored.describe().tr_duration_us == d.tr_duration_us
    raw = stored.simulate(T1=1000.0, T2=80.0)
    shipped = sim.simulate(T1=1000.0, T2=80.0)
    assert rel_max_err(raw, shipped / 1j) < 1e-6  # no post-rotation: +i sin(a) where the class gives -sin(a)
    generic = Simulator.from_description(d, model=SpinPhysics(operators=UNBALANCED), states=10)
    assert rel_max_err(generic.simulate(T1=1000.0, T2=80.0), raw) < 1e-7
    _, J = stored.jacobian("T1", T1=torch.tensor([900.0, 1000.0]), T2=80.0)
    _, J_ref = sim.jacobian("T1", T1=torch.tensor([900.0, 1000.0]), T2=80.0)
    assert rel_max_err(J, J_ref / 1j) < 1e-6
    # The handlers supply the gradients: a spoiled model re-emits the same pulses with spoiling.
    spoiled = Simulator.from_description(d, model=SpinPhysics(operators=SPOILED), states=10)
    assert rel_max_err(spoiled.simulate(T1=1000.0, T2=80.0), raw) > 1e-3


def test_epg_engine():
    d = mrf_description(torch.deg2rad(torch.tensor([10.0, 20.0, 30.0])), 0.01)
    tissue = TissueProperties(t1_ms=torch.tensor([800.0, 1200.0]), t2_ms=80.0)
    result = EpgEngine().simulate(d, tissue, nstates=10)
    assert isinstance(result, SimulationResult)
    assert result.signal.shape == (2, 3) and result.signal.dtype == torch.complex64
    assert rel_max_err(result.signal, oracle_signal(d, tissue.t1_ms, 80.0)) < 1e-5
    assert result.time_us.tolist() == [0.0, 10000.0, 20000.0]
    assert result.echo.dtype == torch.bool and result.echo.all() and result.echo_index.tolist() == [0, 1, 2]
    assert result.repetition.tolist() == [0, 0, 0] and result.event_index.tolist() == [3, 7, 11]
    assert EpgEngine().shifts_per_repetition(d) == 3
    packed = pack_description(d, repetitions=2, record="all", device=None, nstates=10)
    again = EpgEngine().simulate(d, tissue, events=packed)
    assert again.repetition.tolist() == [1, 1, 1]
    assert rel_max_err(again.signal, engine.simulate(d, tissue, repetitions=2, states=10)) < 1e-6
    every = EpgEngine().simulate(d, tissue, events=pack_description(d, repetitions=2, record="all", device=None,
                                                                    record_every=True, nstates=10))
    assert every.signal.shape == (2, 6) and every.repetition.tolist() == [0, 0, 0, 1, 1, 1]
    assert rel_max_err(every.signal[:, 3:], again.signal) < 1e-6
    assert rel_max_err(every.signal[:, :3], result.signal) < 1e-6
    # Hard pulses only: a slice-resolved playing is the slice centre (tests/test_pulses_engine.py resolves
    # shaped ones).
    assert rel_max_err(EpgEngine().simulate(d, tissue, across_slice=3).signal, result.signal) < 1e-6


def test_pools_take_the_engine_binding():
    sim = MRFSimulator(flip=torch.linspace(10, 40, 6), TR=10.0)
    d = sim.describe()
    got = sim.simulate(T1=1000.0, T2=80.0, bound_fraction=0.1, bound_exchange=20.0)
    expected = oracle_signal(d, 1000.0, 80.0, bound_fraction=0.1, bound_exchange_hz=20.0) * 1j
    assert rel_max_err(got, expected) < 1e-5
    t1 = torch.tensor([800.0, 1200.0])
    for _ in range(3):  # walked, resolved, resolved: the pool tables are rebuilt from the resolved values
        signal, J = sim.jacobian(("T1", "bound_fraction"), T1=t1, T2=80.0, bound_fraction=0.1, bound_exchange=20.0)
    tissue = TissueProperties(t1_ms=t1, t2_ms=80.0, bound_fraction=0.1, bound_exchange_hz=20.0)
    raw, raw_j = engine.jacobian(d, tissue, ("t1_ms", "bound_fraction"), states=10)
    assert rel_max_err(signal, raw * 1j) < 1e-6 and column_rel_err(J, raw_j * 1j) < 1e-6


def test_rf_frequencies_moved_by_the_protocol_are_never_stale():
    # The semisolid saturation reads each pulse's frequency offset, which the affine values do not carry:
    # a structure whose frequencies follow a protocol tensor must not be served from another point.
    class Offset(Simulator):
        model = SpinPhysics(operators=UNBALANCED)

        def layout(self, *, offset_hz):
            return [self.operators.excitation(0.6, frequency_hz=offset_hz) @ self.operators.readout(duration_s=0.01)
                    for _ in range(4)]

    tissue = dict(T1=1000.0, T2=80.0, bound_fraction=0.15, bound_exchange=20.0)
    pulse = blochsim.rf_definition(np.hanning(200), dwell_s=1e-5)  # 2 ms: a power the lineshape reads
    sim = Offset(pulse=pulse)
    for hz in (100.0, 2000.0, 300.0, 50.0):  # walked, then every later point at another frequency
        got = sim.simulate(offset_hz=torch.tensor(hz), **tissue)
        want = Offset(resolve=False, pulse=pulse).simulate(offset_hz=torch.tensor(hz), **tissue)
        assert torch.equal(got, want), hz
    assert rel_max_err(sim.simulate(offset_hz=torch.tensor(100.0), **tissue),
                       sim.simulate(offset_hz=torch.tensor(2000.0), **tissue)) > 1e-4  # the test can tell them apart


def test_irfisp_example_runs():
    flip = torch.linspace(10, 40, 8).requires_grad_()
    sig, J = IRFisp(TR=8.0).jacobian(("T1", "T2"), flip=flip, T1=torch.tensor([800.0, 1200.0]), T2=60.0)
    crlb(J).sum().backward()
    assert sig.dtype == torch.complex64 and sig.shape == (2, 8) and J.shape == (2, 2, 8)
    assert flip.grad.shape == (8,) and torch.isfinite(flip.grad).all()


# -- devices (run where a GPU and a blochsim CUDA build are present: conftest skips `cuda` tests elsewhere) ---------
@pytest.mark.cuda
def test_work_runs_where_the_tissue_is():
    flip = torch.linspace(10, 50, 16).requires_grad_()
    sim = MRFSimulator(TR=10.0, TI=10.0)
    t1, t2 = torch.tensor([600.0, 900.0, 1500.0]), torch.tensor([[40.0], [90.0]])
    cpu = sim.simulate(flip=flip, T1=t1, T2=t2)
    for _ in range(3):  # walk, resolve, resolved
        gpu = sim.simulate(flip=flip, T1=t1.cuda(), T2=t2.cuda())
        assert gpu.device.type == "cuda" and rel_max_err(gpu.cpu(), cpu) < 1e-5
    moved = sim.simulate(flip=flip, T1=t1, T2=t2, device="cuda")  # the work on the GPU, the result back home
    assert moved.device.type == "cpu" and rel_max_err(moved, cpu) < 1e-5
    (grad_gpu,) = torch.autograd.grad(sim.simulate(flip=flip, T1=t1.cuda(), T2=t2.cuda()).real.sum(), flip)
    (grad_cpu,) = torch.autograd.grad(cpu.real.sum(), flip)
    assert rel_max_err(grad_gpu.cpu(), grad_cpu) < 1e-4
    _, J_gpu = sim.jacobian(("T1", "T2"), flip=flip, T1=t1.cuda(), T2=t2.cuda())
    _, J_cpu = sim.jacobian(("T1", "T2"), flip=flip, T1=t1, T2=t2)
    assert J_gpu.device.type == "cuda" and column_rel_err(J_gpu.cpu(), J_cpu) < 1e-4
    auto = sim.simulate(flip=flip, T1=t1.cuda(), T2=t2.cuda(), repetitions="auto")
    assert rel_max_err(auto.cpu(), sim.simulate(flip=flip, T1=t1, T2=t2, repetitions="auto")) < 1e-5
    bound = sim.to("cuda").bind(T2=t2.cuda())
    assert bound.simulate(flip=flip, T1=t1.cuda()).device.type == "cuda"


@pytest.mark.cuda
def test_cupy_in_cupy_out():
    cupy = pytest.importorskip("cupy")
    sim = MRFSimulator(flip=[10.0, 20.0, 30.0], TR=10.0)
    out = sim.simulate(T1=cupy.asarray([800.0, 1200.0]), T2=80.0)
    assert isinstance(out, cupy.ndarray) and out.shape == (2, 3)
    assert np.allclose(cupy.asnumpy(out), sim.simulate(T1=np.array([800.0, 1200.0]), T2=80.0), atol=1e-6)
