"""benchmarks/api_cases.py's cases on the host: the `_jac` case (the `_hvp` case's first half) and the
forward timed before each derivative."""
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
from api_cases import case_fn, with_forwards  # noqa: E402


def test_the_jacobian_and_hvp_cases_give_their_derivatives():
    device = torch.device("cpu")
    jac = case_fn("epg_complex_jac", 3, device)()
    flips = case_fn("epg_complex_hvp", 3, device)()  # the flip gradient of sum |J|^2 of that Jacobian
    assert jac.shape == (3, 2, 500) and jac.is_complex() and jac.grad_fn is not None  # (tissues, T1 T2, samples)
    assert bool(torch.isfinite(jac).all()) and all(bool(jac[:, p].abs().amax() > 0) for p in (0, 1))
    assert flips.shape == (500,) and bool(flips.abs().amax() > 0)


def test_each_derivative_case_follows_its_forward():
    cases = with_forwards([("epg_real_jac", 10), ("epg_real_hvp", 10), ("pooled_grad", 20)])
    assert cases == [("epg_real", 10), ("epg_real_jac", 10), ("epg_real_hvp", 10), ("pooled", 20),
                     ("pooled_grad", 20)]
