"""Design and reconstruction blocks on the card (issue 24), through the public API with tensors made there,
against the same calls on the host build.

Bounds, relative to the largest entry: values 1e-5 and first derivatives 1e-4 (tests/test_cuda.py's budget:
float32 sums in another order); second-order results (a CRLB gradient, an HVP) 1e-3, one more cancelling sum
of products (test_engine_derivatives.py's float32 second-order bound). The card runs float32 kernels, so
the dot-product test there is held to 1e-4: its two sides are the float32 JVP and VJP kernels' derivatives
contracted in another order (float64 runs on the host are exact to 1e-12, tests/test_model_operator.py).
"""

from __future__ import annotations

import pytest
import torch
from conftest import rel_max_err

from blochsim import ModelOperator, Subspace, hvp
from blochsim.optim import Bounded, SequenceDesign, crlb
from blochsim.sequence import TissueProperties, mrf_description, simulate_subspace
from blochsim.simulators import MRFSimulator

pytestmark = pytest.mark.cuda  # skipped without a card and a CUDA build (conftest)

CARD = torch.device("cuda")
HOST = torch.device("cpu")
SIM = MRFSimulator(TR=10.0, states=16)


def tissues(device):
    return (torch.linspace(300.0, 2000.0, 64, device=device), torch.linspace(30.0, 200.0, 64, device=device))


def flips(device):
    return torch.cat([torch.linspace(5, 60, 50), torch.linspace(60, 5, 50)]).to(device)


def crlb_cost(device):
    t1, t2 = tissues(device)

    def cost(flip):
        _, J = SIM.jacobian(("T1", "T2"), flip=flip, T1=t1, T2=t2)
        bound = crlb(J, noise_variance=1e-4)
        return (bound[..., 0].sqrt() / t1 + bound[..., 1].sqrt() / t2).mean()

    return cost


def test_crlb_gradient_on_the_card():
    results = {}
    for device in (HOST, CARD):
        flip = flips(device).requires_grad_()
        value = crlb_cost(device)(flip)
        (grad,) = torch.autograd.grad(value, flip)
        assert grad.device.type == device.type
        results[device.type] = (value.detach().cpu(), grad.cpu())
    assert rel_max_err(results["cuda"][0], results["cpu"][0]) < 1e-4
    assert rel_max_err(results["cuda"][1], results["cpu"][1]) < 1e-3


def test_design_loop_on_the_card():
    design = SequenceDesign(crlb_cost(CARD), flip=Bounded(flips(CARD), 0.0, 70.0))
    result = design.minimize(iterations=3)
    assert result.parameters["flip"].device.type == "cuda"
    assert result.loss.shape == (3,) and bool(torch.isfinite(result.loss).all())


def test_hvp_on_the_card():
    out = {}
    for device in (HOST, CARD):
        t1, t2 = tissues(device)

        def cost(flip, t1=t1, t2=t2):
            return (SIM.simulate(flip=flip, T1=t1, T2=t2).abs() ** 2).sum()

        v = torch.linspace(-1.0, 1.0, 100, device=device)
        out[device.type] = hvp(cost, flips(device), v).cpu()
    assert rel_max_err(out["cuda"], out["cpu"]) < 1e-3


def test_model_operator_on_the_card():
    results = {}
    for device in (HOST, CARD):
        acquisition = MRFSimulator(flip=flips(device), TR=10.0, states=16)
        op = ModelOperator(acquisition, "T1", "T2", bounds={"T1": (100.0, 4000.0), "T2": (5.0, 500.0)})
        t1, t2 = tissues(device)
        x = op.initial((64,), T1=t1, T2=t2)
        g = torch.Generator().manual_seed(0)
        u = torch.randn(x.shape, generator=g).to(device)
        w = torch.randn((64, 100), dtype=torch.complex64, generator=g).to(device)
        y, jvp, vjp = op(x), op.A_jvp(x, u), op.A_vjp(x, w)
        assert y.device.type == device.type and vjp.device.type == device.type
        left, right = float((jvp.conj() * w).real.sum()), float((u * vjp).sum())
        assert abs(left - right) <= 1e-4 * abs(left)
        results[device.type] = (y.cpu(), jvp.cpu(), vjp.cpu())
    for host, card in zip(results["cpu"], results["cuda"], strict=True):
        assert rel_max_err(card, host) < 1e-4


def test_subspace_on_the_card():
    description = mrf_description(torch.deg2rad(flips(HOST)), 0.01)
    out = {}
    for device in (HOST, CARD):
        t1, t2 = tissues(device)
        tissue = TissueProperties(t1_ms=t1[:, None], t2_ms=t2[None, :])
        sub = simulate_subspace(description, tissue, rank=6, nstates=16, chunk_size=1000)
        assert sub.dictionary.device.type == device.type and sub.basis.device.type == device.type
        fitted = Subspace.fit(sub.expand(sub.dictionary), rank=3)
        assert fitted.basis.device.type == device.type
        out[device.type] = sub.dictionary.cpu()
    # The basis is fixed in phase per column, so the coefficients compare directly (float32 signals).
    assert rel_max_err(out["cuda"], out["cpu"]) < 1e-4
