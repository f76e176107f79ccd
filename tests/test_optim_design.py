"""`Bounded`, `SequenceDesign` and the worked example examples/design_mrf.py."""

from __future__ import annotations

import importlib.util
import math
import warnings
from pathlib import Path

import pytest
import torch

from blochsim.optim import Bounded, SequenceDesign, SequenceOptimization

F64 = torch.float64


def test_bounded_maps_into_its_limits():
    b = Bounded(torch.tensor([0.0, 35.0, 70.0]), 0.0, 70.0)
    inside = b.initial
    assert bool((inside > 0).all() and (inside < 70).all())
    # Values on a limit start a thousandth of the width inside; the middle stays.
    torch.testing.assert_close(inside, torch.tensor([0.07, 35.0, 69.93]))
    torch.testing.assert_close(b.value(b.free()), inside)
    extreme = b.value(torch.tensor([-1e4, 0.0, 1e4]))
    assert float(extreme[0]) >= 0.0 and float(extreme[2]) <= 70.0


def test_bounded_limits_broadcast_and_errors():
    b = Bounded(torch.zeros(2, 3), torch.tensor([-1.0, -2.0, -3.0]), 5.0)
    assert b.lower.shape == (2, 3) and float(b.lower[1, 2]) == -3.0
    with pytest.raises(ValueError, match=r"lower must be below upper everywhere; at index \(1,\)"):
        Bounded(torch.zeros(3), torch.tensor([0.0, 2.0, 0.0]), torch.tensor([1.0, 1.0, 1.0]))
    with pytest.raises(ValueError, match="does not broadcast"):
        Bounded(torch.zeros(3), torch.zeros(4), 1.0)
    with pytest.raises(ValueError, match="finite"):
        Bounded(torch.tensor([float("nan")]), 0.0, 1.0)
    with pytest.warns(UserWarning, match=r"1 initial value\(s\) lie outside"):
        b = Bounded([-5.0, 0.5], 0.0, 1.0)
    assert 0.0 < float(b.initial[0]) < 0.01


def quadratic(target):
    def cost(x, y):
        return ((x - target) ** 2).sum() + (y - 2.0) ** 2

    return cost


def test_minimize_reaches_a_bounded_optimum():
    """The unconstrained optimum of x lies past the upper limit: x settles just below it, y at its optimum."""
    design = SequenceDesign(quadratic(torch.tensor([0.3, 5.0])), x=Bounded([0.5, 0.5], 0.0, 1.0), y=0.0)
    assert design.names == ("x", "y")
    result = design.minimize(iterations=400, learning_rate=0.05)
    assert isinstance(result, SequenceOptimization) and result.steps == 400
    x, y = result.parameters["x"], result.parameters["y"]
    assert abs(float(x[0]) - 0.3) < 1e-3 and 0.99 < float(x[1]) < 1.0  # the limit holds
    assert abs(float(y) - 2.0) < 1e-2
    assert result.loss.shape == (400,) and result.loss[0] > result.loss[-1]
    assert result.history["x"].shape == (400, 2) and result.seconds_per_iteration.shape == (400,)
    torch.testing.assert_close(result.history["x"][0], torch.tensor([0.5, 0.5]))  # the values of loss[0]
    assert float(result.loss[0]) == pytest.approx(0.2**2 + 4.5**2 + 4.0, rel=1e-6)


def test_lbfgs_callback_and_stop():
    seen = []

    def callback(step, parameters, loss):
        seen.append((step, float(loss), parameters["x"].clone()))
        return step == 4

    design = SequenceDesign(quadratic(torch.tensor([0.3])), x=Bounded([0.6], 0.0, 1.0), y=torch.zeros((), dtype=F64))
    result = design.minimize(iterations=50, optimizer_factory=lambda p: torch.optim.LBFGS(p, max_iter=5),
                             callback=callback)
    assert result.stopped_early and result.steps == 5 and [s for s, _, _ in seen] == [0, 1, 2, 3, 4]
    assert seen[0][1] == pytest.approx(float(result.loss[0]))
    assert abs(float(result.parameters["x"][0]) - 0.3) < 1e-4


def test_design_errors():
    with pytest.raises(ValueError, match="at least one parameter"):
        SequenceDesign(quadratic(0.0))
    with pytest.raises(ValueError, match="one element"):
        SequenceDesign(lambda x: x * 2, x=torch.ones(3))()
    with pytest.raises(ValueError, match="iterations"):
        SequenceDesign(lambda x: x.sum(), x=torch.ones(3)).minimize(iterations=0)
    design = SequenceDesign(lambda x: (x.log()).sum(), x=torch.ones(2))
    with pytest.raises(FloatingPointError, match="not finite at step"):
        design.minimize(iterations=200, learning_rate=1.0)
    assert bool(torch.isfinite(design.values()["x"]).all())


def test_values_are_in_limits_and_differentiable():
    design = SequenceDesign(lambda flip: flip.sum(), flip=Bounded(torch.full((4,), 30.0), 0.0, 70.0))
    values = design.values()
    assert values["flip"].requires_grad
    design().backward()
    assert design.free["flip"].grad is not None
    assert math.isclose(float(design().detach()), 120.0, rel_tol=1e-5)


def load_example():
    path = Path(__file__).resolve().parent.parent / "examples" / "design_mrf.py"
    spec = importlib.util.spec_from_file_location("design_mrf", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_worked_example_lowers_the_bound(tmp_path, capsys):
    """examples/design_mrf.py at its CPU size (12 tissues, 200 repetitions), a few steps: the bound drops."""
    example = load_example()
    plot = tmp_path / "schedule.png"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # matplotlib's backend notes, if any
        out = example.main(["--iterations", "6", "--states", "10", "--plot", str(plot)])
    assert out["after"] < out["before"]
    flips = out["result"].parameters["flip"]
    assert flips.shape == (200,) and bool((flips > 0).all() and (flips < 70).all())
    printed = capsys.readouterr().out
    assert "before" in printed and "after" in printed and "time per iteration" in printed
    if out["plotted"]:
        assert plot.stat().st_size > 1000
