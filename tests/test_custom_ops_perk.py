"""PERK's kernel passes as custom ops (`blochsim::perk_*`, blochsim/estimators/_perk_ops.py), on the host.

As for the EPG ops (tests/test_custom_ops.py): values against the float64 reference
(blochsim/estimators/perk_reference.py), the gradient against autograd through the reference, opcheck of each
op, and the vmap rule (a batch of input rows is one kernel call). The derivatives the kernels do not give are
refused. 1e-12 relative, float64: the kernels run the reference's sums in another order
(tests/test_perk_kernels.py).
"""

from __future__ import annotations

import pytest
import torch

import blochsim.estimators  # noqa: F401  (registers the PERK ops)
from blochsim.estimators import perk_kernels, perk_reference

OPS = torch.ops.blochsim
F64 = torch.float64
TOL = 1e-12  # see the module docstring


def problem(rows: int = 40, inputs: int = 3, features: int = 70, targets: int = 2, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, inputs, generator=g, dtype=F64)
    frequency = torch.randn(features, inputs, generator=g, dtype=F64)
    phase = torch.rand(features, generator=g, dtype=F64) * 6.28
    head = torch.randn(targets, features, generator=g, dtype=F64) / features
    offset = torch.randn(targets, generator=g, dtype=F64)
    return x, frequency, phase, head, offset


def rel_err(a, b) -> float:
    return float((a - b).abs().max() / b.abs().max())


def test_map_and_its_gradient_match_the_reference():
    x, frequency, phase, head, offset = problem()
    x = x.requires_grad_()
    out = OPS.perk_map(x, frequency, phase, head, offset)
    reference = perk_reference.regression(x, frequency, phase, head, offset)
    assert rel_err(out.detach(), reference.detach()) < TOL
    weights = torch.randn(out.shape, generator=torch.Generator().manual_seed(1), dtype=F64)
    (grad,) = torch.autograd.grad((out * weights).sum(), x)
    (expected,) = torch.autograd.grad((reference * weights).sum(), x)
    assert rel_err(grad, expected) < TOL


def test_accumulate_adds_the_reference_sums():
    x, frequency, phase, head, _ = problem()
    target = torch.randn(x.shape[0], 2, generator=torch.Generator().manual_seed(2), dtype=F64)
    F = frequency.shape[0]
    sums = [torch.ones(F, dtype=F64), torch.ones(F, F, dtype=F64), torch.ones(F, 2, dtype=F64)]
    OPS.perk_accumulate(x, frequency, phase, target, *sums)
    for got, expected in zip(sums, perk_reference.accumulate(x, frequency, phase, target), strict=True):
        assert rel_err(got - 1, expected) < TOL  # added to what was there


def test_opcheck():
    x, frequency, phase, head, offset = problem(rows=8, features=20)
    cotangent = torch.randn(8, 2, generator=torch.Generator().manual_seed(3), dtype=F64)
    torch.library.opcheck(OPS.perk_map.default, (x.requires_grad_(), frequency, phase, head, offset))
    torch.library.opcheck(OPS.perk_vjp.default, (x.detach(), frequency, phase, head, cotangent))
    F = frequency.shape[0]
    torch.library.opcheck(OPS.perk_accumulate.default, (x.detach(), frequency, phase, cotangent,
                                                        torch.zeros(F, dtype=F64), torch.zeros(F, F, dtype=F64),
                                                        torch.zeros(F, 2, dtype=F64)))


def test_derivatives_the_kernels_lack_are_refused():
    x, frequency, phase, head, offset = problem()
    out = OPS.perk_map(x.requires_grad_(), frequency, phase, head.requires_grad_(), offset)
    with pytest.raises(RuntimeError, match="input rows only"):
        out.sum().backward()
    x = x.detach().requires_grad_()
    (grad,) = torch.autograd.grad(OPS.perk_map(x, frequency, phase, head.detach(), offset).sum(), x,
                                  create_graph=True)
    with pytest.raises(RuntimeError, match="no second-order pass"):
        grad.sum().backward()


def test_vmap_over_rows_is_one_call(monkeypatch):
    x, frequency, phase, head, offset = problem()
    batch = torch.stack([x, 2 * x, -x])
    calls = []
    original = perk_kernels.regression

    def counted(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(perk_kernels, "regression", counted)
    out = torch.vmap(lambda rows: OPS.perk_map(rows, frequency, phase, head, offset))(batch)
    assert len(calls) == 1
    expected = torch.stack([original(b, perk_kernels.RandomFeatures.of(frequency, phase), head, offset)
                            for b in batch])
    assert torch.equal(out, expected)  # rows are independent: the same bits
