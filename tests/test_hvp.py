"""`blochsim.hvp`: Hessian-vector products of costs of simulations w.r.t. protocol tensors.

References, float64: double backward through the oracle (`blochsim._reference.play`, pure torch autograd),
and central differences of the engine's gradient. Tolerances: against the oracle 1e-9 relative to the largest
entry (one more differentiation than the first-order 1e-10 of test_engine_derivatives.py); against central
differences of the gradient with a step of 1e-4 (deg or ms) 1e-6 (truncation ~h^2 x the third derivative,
~1e-8 relative here; rounding ~1e-14/1e-4).
"""

from __future__ import annotations

import math

import pytest
import torch
from conftest import rel_max_err

from blochsim import hvp
from blochsim._reference import play
from blochsim.optim import crlb
from blochsim.sequence import TissueProperties
from blochsim.simulators import MRFSimulator, SPGRSimulator

F64 = torch.float64
T1 = torch.tensor([500.0, 1100.0, 1800.0], dtype=F64)
T2 = torch.tensor([45.0, 90.0, 140.0], dtype=F64)
SIM = MRFSimulator(TR=10.0, states=10)
TARGET = torch.linspace(-0.3, 0.2, 24, dtype=F64)


def engine_cost(flip, TR):
    """A nonlinear cost of the signal: squared distance of |signal| to a target, plus a quartic term."""
    s = SIM.simulate(flip=flip, TR=TR, T1=T1, T2=T2, dtype=F64)
    return ((s.abs() - TARGET) ** 2).sum() + (s.real**4).sum()


def oracle_cost(flip, TR):
    s = play(SIM.describe(flip=flip, TR=TR), TissueProperties(t1_ms=T1, t2_ms=T2), states=10).signal
    s = s * 1j  # MRFSimulator's post-rotation (x +i)
    return ((s.abs() - TARGET) ** 2).sum() + (s.real**4).sum()


def point():
    g = torch.Generator().manual_seed(3)
    flip = torch.linspace(10, 60, 24, dtype=F64) + torch.rand(24, dtype=F64, generator=g)
    return {"flip": flip, "TR": torch.tensor(10.0, dtype=F64)}, {"flip": torch.randn(24, dtype=F64, generator=g),
                                                                  "TR": torch.tensor(0.7, dtype=F64)}


def double_backward(cost, x: dict, v: dict) -> dict:
    leaves = {k: t.clone().requires_grad_() for k, t in x.items()}
    grads = torch.autograd.grad(cost(**leaves), list(leaves.values()), create_graph=True)
    inner = sum((g * v[k]).sum() for g, k in zip(grads, leaves, strict=True))
    return dict(zip(leaves, torch.autograd.grad(inner, list(leaves.values())), strict=True))


def gradient(cost, x: dict) -> dict:
    leaves = {k: t.clone().requires_grad_() for k, t in x.items()}
    return dict(zip(leaves, torch.autograd.grad(cost(**leaves), list(leaves.values())), strict=True))


def test_hvp_matches_double_backward_through_the_oracle():
    x, v = point()
    got = hvp(engine_cost, x, v)
    expected = double_backward(oracle_cost, x, v)
    for name in x:
        assert rel_max_err(got[name], expected[name]) < 1e-9, name


def test_hvp_matches_differences_of_the_gradient():
    x, v = point()
    got = hvp(engine_cost, x, v)
    h = 1e-4
    up = gradient(engine_cost, {k: x[k] + h * v[k] for k in x})
    down = gradient(engine_cost, {k: x[k] - h * v[k] for k in x})
    for name in x:
        assert rel_max_err(got[name], (up[name] - down[name]) / (2 * h)) < 1e-6, name


def test_structures_and_return_gradient():
    x, v = point()
    by_name = hvp(engine_cost, x, v)
    as_tuple = hvp(engine_cost, (x["flip"], x["TR"]), (v["flip"], v["TR"]))
    assert isinstance(as_tuple, tuple)
    torch.testing.assert_close(as_tuple[0], by_name["flip"], rtol=0, atol=0)  # the same passes in the same order
    single = hvp(lambda f: engine_cost(f, x["TR"]), x["flip"], v["flip"])
    assert single.shape == (24,)
    value, grad, product = hvp(engine_cost, x, v, return_gradient=True)
    expected = gradient(engine_cost, x)
    assert value.dim() == 0 and rel_max_err(grad["flip"], expected["flip"]) < 1e-12  # the same pass
    assert x["flip"].grad is None and not x["flip"].requires_grad  # the point is left alone


def test_a_parameter_the_cost_does_not_reach_gets_zeros():
    x, v = point()
    got = hvp(lambda flip, TR, unused: engine_cost(flip, TR) + 3.0 * TR, {**x, "unused": torch.ones(2, dtype=F64)},
              {**v, "unused": torch.ones(2, dtype=F64)})
    assert torch.equal(got["unused"], torch.zeros(2, dtype=F64))
    linear = hvp(lambda a: (2.0 * a).sum(), torch.ones(3, dtype=F64), torch.ones(3, dtype=F64))
    assert torch.equal(linear, torch.zeros(3, dtype=F64))


def test_closed_form_jacobian_costs_have_hessians():
    """A CRLB of the SPGR closed form is ordinary autograd: its Hessian exists (DESPOT1 angle design)."""

    def cost(flip):
        _, J = SPGRSimulator(TR=15.0, TE=0.0).jacobian(("M0", "T1"), flip=flip, T1=torch.tensor(1000.0, dtype=F64),
                                                        M0=torch.tensor(1.0, dtype=F64))
        return crlb(J)[1].sqrt() / 1000.0

    flip, v = torch.tensor([3.0, 17.0], dtype=F64), torch.tensor([1.0, -0.5], dtype=F64)
    got = hvp(cost, flip, v)
    h = 1e-4
    fd = (gradient(lambda flip: cost(flip), {"flip": flip + h * v})["flip"]
          - gradient(lambda flip: cost(flip), {"flip": flip - h * v})["flip"]) / (2 * h)
    assert rel_max_err(got, fd) < 1e-6


def test_event_train_jacobian_cost_is_a_third_derivative():
    def cost(flip):
        _, J = SIM.jacobian(("T1", "T2"), flip=flip, T1=T1, T2=T2, dtype=F64)
        return crlb(J).sum()

    flip = torch.linspace(10, 60, 24, dtype=F64)
    with pytest.raises(RuntimeError, match="third derivative"):
        hvp(cost, flip, torch.ones_like(flip))


def test_errors():
    x, v = point()
    with pytest.raises(ValueError, match="v has 1 tensors"):
        hvp(engine_cost, x, {"flip": v["flip"]})
    with pytest.raises(ValueError, match=r"v\['flip'\] has shape"):
        hvp(engine_cost, x, {"flip": v["flip"][:3], "TR": v["TR"]})
    with pytest.raises(ValueError, match="one element"):
        hvp(lambda flip, TR: SIM.simulate(flip=flip, TR=TR, T1=T1, T2=T2).abs(), x, v)
    with pytest.raises(ValueError, match="float tensor"):
        hvp(lambda n: n.sum(), torch.arange(3), torch.ones(3))
    assert math.isfinite(float(hvp(engine_cost, x, v)["TR"]))


def _count_kernel_passes(monkeypatch) -> dict:
    from blochsim.engine import kernels

    counts = {}

    def counting(name, kernel):
        def counted(*args, **kwargs):
            counts[name] = counts.get(name, 0) + 1
            return kernel(*args, **kwargs)
        return counted

    for name in ("forward", "jvp", "vjp", "vjp_jvp"):
        monkeypatch.setattr(kernels, name, counting(name, getattr(kernels, name)))
    return counts


def test_a_simulation_cost_runs_one_jvp_and_one_second_order_pass(monkeypatch):
    """Forward over reverse: the signal and its tangent from one JVP pass, then one VJP-JVP pass gives the
    gradient and H v (reverse over reverse ran a VJP for the gradient, the VJP-JVP, and a VJP for the cost's
    curvature; before the JVP gave the signal too, a plain forward ran ahead of it)."""
    x, v = point()
    counts = _count_kernel_passes(monkeypatch)
    got = hvp(engine_cost, x, v)
    assert counts.get("forward", 0) == 0 and counts.get("vjp", 0) == 0, counts
    assert counts["vjp_jvp"] == 1 and counts["jvp"] == 1, counts
    expected = double_backward(engine_cost, x, v)
    for name in x:
        assert rel_max_err(got[name], expected[name]) < 1e-12, name  # the same derivatives, rounded apart


def test_tangents_on_the_signal_or_on_the_events_alone():
    """A cost linear in the signal (its cotangent has no tangent), and a direction that moves only a factor
    of the cost outside the simulation (the events have no tangent, the signal's cotangent has)."""
    x, v = point()

    def linear(flip, TR):
        return SIM.simulate(flip=flip, TR=TR, T1=T1, T2=T2, dtype=F64).real.sum()

    def scaled(flip, TR, scale):
        return scale * engine_cost(flip, TR) ** 2

    for cost, at, along in ((linear, x, v), (scaled, {**x, "scale": torch.tensor(0.3, dtype=F64)},
                                             {"flip": torch.zeros(24, dtype=F64), "TR": torch.tensor(0.0, dtype=F64),
                                              "scale": torch.tensor(1.0, dtype=F64)})):
        got, expected = hvp(cost, at, along), double_backward(cost, at, along)
        for name in at:
            if not expected[name].any():  # d2/d scale2 of a cost linear in scale
                assert torch.equal(got[name], expected[name]), name
            else:
                assert rel_max_err(got[name], expected[name]) < 1e-12, name  # as above


class _NoForwardMode(torch.autograd.Function):
    """x ** 3 with a backward and no jvp: forward mode cannot run through it."""

    @staticmethod
    def forward(x):
        return x**3

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(inputs[0])

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return 3 * x**2 * g


def test_a_cost_without_forward_mode_gets_its_product_by_reverse_over_reverse():
    x, v = point()

    def cost(flip, TR):
        return _NoForwardMode.apply(engine_cost(flip, TR))

    got = hvp(cost, x, v)
    expected = double_backward(cost, x, v)
    for name in x:
        assert rel_max_err(got[name], expected[name]) < 1e-12, name  # the same passes as the reference


def test_inside_a_forward_mode_level_of_the_caller():
    """Forward-mode levels do not nest: inside the caller's, hvp runs reverse over reverse."""
    import torch.autograd.forward_ad as fwAD

    x, v = point()
    outside = hvp(engine_cost, x, v)
    with fwAD.dual_level():
        inside = hvp(engine_cost, x, v)
    for name in x:
        assert rel_max_err(inside[name], outside[name]) < 1e-12, name  # the two modes, rounded apart
