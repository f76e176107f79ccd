"""Properties of the kernels that need no oracle: bitwise determinism across thread counts, agreement of the
real and complex paths, independence from the checkpoint stride, the refusal of third derivatives, and
errors for bad input.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import (
    CASES,
    DTYPES,
    F64,
    PATHS,
    STATES,
    T1_MS,
    T2_MS,
    column_rel_err,
    f64,
    rel_max_err,
    tissue,
)

from blochsim.engine import jacobian, simulate
from blochsim.sequence import TissueProperties

# engine.jacobian takes forward-mode derivatives of its packing, which loads torch's forward-mode decompositions;
# they script with torch.jit (deprecated in recent torch): a warning of torch's. See
# test_jacobian_does_not_load_forward_mode_decompositions.
pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")

# ---------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------


def many_voxels(count: int, *, complex_path: bool) -> dict:
    """`count` distinct voxels (float64 leaves that require grad) with every switch of the path on."""
    j = torch.arange(count, dtype=F64)
    x = {
        "t1_ms": 300.0 + 40.0 * j,
        "t2_ms": 30.0 + 3.0 * j,
        "b1": 0.8 + 0.4 * j / count,
        "m0": 1.0 + 0.01 * j,
        "inversion_efficiency": 0.9 + 0.1 * j / count,
        "diffusion_um2_per_ms": 0.5 + 0.05 * j,
    }
    if complex_path:
        x.update(b0_hz=-20.0 + j, b1_phase_rad=0.01 * j - 0.2, velocity_m_per_s=0.0005 * j - 0.01)
    return {k: v.requires_grad_() for k, v in x.items()}


def event_leaves(case_name: str, path: str) -> dict:
    n = CASES[case_name].shots
    j = torch.arange(n, dtype=F64)
    x = {"flips": (0.3 + 0.5 * torch.sin(0.7 * j).abs()), "tr_s": f64(0.01)}
    if path == "complex":
        x["phases"] = 0.2 * torch.cos(1.1 * j)
    return {k: v.requires_grad_() for k, v in x.items()}


def build(case_name: str, events: dict, voxels: dict):
    description = CASES[case_name].build(geometry="crusher", **events)
    return description, TissueProperties(**voxels)


def all_results(case_name: str, path: str, dtype, *, voxels: int = 48, **kw) -> dict:
    """Signal, VJP (event values summed over voxels, and per-voxel tissue), Jacobian, and the gradient of a
    Jacobian cost (second-order adjoint): everything the host kernels compute, as one dict of tensors."""
    events = event_leaves(case_name, path)
    tissue_ = many_voxels(voxels, complex_path=path == "complex")
    description, tissue_props = build(case_name, events, tissue_)
    reps = CASES[case_name].repetitions
    signal = simulate(description, tissue_props, states=STATES, repetitions=reps, dtype=dtype, path=path, **kw)
    w = torch.randn(signal.shape, generator=torch.Generator().manual_seed(0), dtype=signal.dtype)
    leaves = {**events, **tissue_}
    out = {"signal": signal.detach()}
    vjp = torch.autograd.grad((w.conj() * signal).real.sum(), list(leaves.values()), allow_unused=True,
                              retain_graph=True)  # the description's graph serves the Jacobian too
    out.update({f"vjp/{k}": g for k, g in zip(leaves, vjp, strict=True) if g is not None})
    _, J = jacobian(description, tissue_props, ("t1_ms", "t2_ms"), states=STATES, repetitions=reps, dtype=dtype,
                    path=path, **kw)
    out["jacobian"] = J.detach()
    second = torch.autograd.grad(J.abs().pow(2).sum(), list(leaves.values()), allow_unused=True)
    out.update({f"second/{k}": g for k, g in zip(leaves, second, strict=True) if g is not None})
    return out


def assert_identical(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), f"{key} differs: max |diff| = {float((a[key] - b[key]).abs().max())}"


# ---------------------------------------------------------------------------------------------
# Determinism across thread counts
# ---------------------------------------------------------------------------------------------


def _pool_can_have_two_threads() -> bool:
    # The kernels' thread pool is sized once per process from BLOCHSIM_NUM_THREADS, else the hardware.
    env = os.environ.get("BLOCHSIM_NUM_THREADS", "")
    if env.strip().isdigit() and int(env) > 0:
        return int(env) >= 2
    return (os.cpu_count() or 1) >= 2


@pytest.mark.skipif(not _pool_can_have_two_threads(), reason="the kernel thread pool has one thread here")
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(("case_name", "path"), [("mrf", "real"), ("mrf_quadratic", "complex"), ("spgr", "complex")])
def test_bitwise_identical_for_one_and_two_threads(monkeypatch, case_name, path, dtype):
    """48 voxels (3 blocks of 16): every result, including event-value gradients summed over voxels, is the
    same bit for bit with 1 and 2 threads. The pool is sized when first used (so it is warmed here with the
    variable unset); kernels.num_threads() reads BLOCHSIM_NUM_THREADS at each call and caps the threads."""
    monkeypatch.delenv("BLOCHSIM_NUM_THREADS", raising=False)
    simulate(CASES["mrf"].build(), tissue(), states=2)  # size the pool, if nothing has yet
    monkeypatch.setenv("BLOCHSIM_NUM_THREADS", "1")
    one = all_results(case_name, path, dtype)
    monkeypatch.setenv("BLOCHSIM_NUM_THREADS", "2")
    two = all_results(case_name, path, dtype)
    again = all_results(case_name, path, dtype)
    assert_identical(one, two)
    assert_identical(two, again)


def test_voxel_results_do_not_depend_on_their_block():
    """A voxel's signal and tissue gradients are the same whether it is alone or voxel 37 of 48 (3rd block)."""
    full = all_results("mrf_quadratic", "complex", torch.float32)
    events = event_leaves("mrf_quadratic", "complex")
    voxels = {k: v.detach()[37:38].clone().requires_grad_() for k, v in many_voxels(48, complex_path=True).items()}
    description, props = build("mrf_quadratic", events, voxels)
    signal = simulate(description, props, states=STATES, dtype=torch.float32, path="complex")
    assert torch.equal(signal.detach(), full["signal"][37:38])
    w = torch.randn(full["signal"].shape, generator=torch.Generator().manual_seed(0), dtype=signal.dtype)[37:38]
    g = torch.autograd.grad((w.conj() * signal).real.sum(), voxels["t1_ms"])[0]
    assert torch.equal(g, full["vjp/t1_ms"][37:38])


# ---------------------------------------------------------------------------------------------
# Real and complex paths
# ---------------------------------------------------------------------------------------------

#: Each path is within 1e-6 (float32) / 1e-15 (float64) of the oracle (test_engine_forward.py) and they
#: compute in different orders, so they agree to twice the forward tolerance; derivatives to twice theirs.
PATH_AGREEMENT = {torch.float32: 2e-5, torch.float64: 2e-12}
PATH_AGREEMENT_GRAD = {torch.float32: 2e-4, torch.float64: 2e-10}


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case_name", [name for name, case in CASES.items() if case.real_ok])
def test_real_and_complex_paths_agree(case_name, dtype):
    """On sequences whose pulses share one axis (MRF; SPGR; bSSFP, whose alternation the real path folds into
    signed flips): the signal, the VJP, the Jacobian and the gradient of a Jacobian cost agree."""
    results = {}
    for path in PATHS:
        events = {k: v for k, v in event_leaves(case_name, "real").items()}
        voxels = many_voxels(5, complex_path=False)
        description, props = build(case_name, events, voxels)
        reps = CASES[case_name].repetitions
        signal = simulate(description, props, states=STATES, repetitions=reps, dtype=dtype, path=path)
        leaves = {**events, **voxels}
        w = torch.randn(signal.shape, generator=torch.Generator().manual_seed(0), dtype=signal.dtype)
        vjp = torch.autograd.grad((w.conj() * signal).real.sum(), list(leaves.values()), retain_graph=True)
        _, J = jacobian(description, props, ("t1_ms", "t2_ms", "b1"), states=STATES, repetitions=reps, dtype=dtype,
                        path=path)
        second = torch.autograd.grad(J.abs().pow(2).sum(), [events["flips"], voxels["t1_ms"]])
        results[path] = (signal, vjp, J, second)
    real, cplx = results["real"], results["complex"]
    assert rel_max_err(real[0], cplx[0]) < PATH_AGREEMENT[dtype]
    for a, b in zip(real[1], cplx[1], strict=True):
        if not b.any():  # the inversion efficiency of a train without an inversion: exactly 0 on both paths
            assert not a.any()
            continue
        assert rel_max_err(a, b) < PATH_AGREEMENT_GRAD[dtype]
    assert column_rel_err(real[2], cplx[2]) < PATH_AGREEMENT_GRAD[dtype]  # T1, T2, B1: units decades apart
    for a, b in zip(real[3], cplx[3], strict=True):
        assert rel_max_err(a, b) < 10 * PATH_AGREEMENT_GRAD[dtype]  # second order: one more cancelling sum


def test_real_path_refused_where_it_cannot_hold():
    """path="real" with pulses on several axes, or with B0 / B1phase / v, is a ValueError, not a silent switch."""
    with pytest.raises(ValueError, match="path='real'"):
        simulate(CASES["mrf_quadratic"].build(), tissue(), states=STATES, path="real")
    with pytest.raises(ValueError, match="path='real'"):
        simulate(CASES["cpmg"].build(), tissue(), states=STATES, path="real")
    for field in ("b0_hz", "b1_phase_rad", "velocity_m_per_s"):
        with pytest.raises(ValueError, match="path='real'"):
            simulate(CASES["mrf"].build(), tissue((field,)), states=STATES, path="real")
    flips = torch.full((12,), 0.5, dtype=F64)
    phases = torch.zeros(12, dtype=F64, requires_grad=True)  # a differentiated phase needs the complex path
    with pytest.raises(ValueError, match="path='real'"):
        simulate(CASES["mrf"].build(flips=flips, phases=phases), tissue(), states=STATES, path="real")


# ---------------------------------------------------------------------------------------------
# Checkpoint stride
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(("case_name", "path"), [("mrf", "real"), ("cpmg", "complex"), ("spgr", "complex")])
def test_checkpoint_stride_changes_nothing(case_name, path, dtype):
    """Strides 1, 3, 7 and one larger than the events played give the results of the default (4) bit for bit:
    a replay from a checkpoint repeats the same operations on the same values. Includes a Hessian-vector
    product (the second-order adjoint replays too)."""
    events_played = len(CASES[case_name].build().events) * CASES[case_name].repetitions

    def results(stride):
        out = all_results(case_name, path, dtype, voxels=20, checkpoint_stride=stride)
        events = event_leaves(case_name, path)
        voxels = many_voxels(4, complex_path=path == "complex")
        description, props = build(case_name, events, voxels)
        signal = simulate(description, props, states=STATES, repetitions=CASES[case_name].repetitions, dtype=dtype,
                          path=path, checkpoint_stride=stride)
        leaves = [events["flips"], voxels["t1_ms"]]
        g = torch.autograd.grad(signal.abs().pow(2).sum(), leaves, create_graph=True)
        hv = torch.autograd.grad(g[0].sum() + (g[1] * 100.0).sum(), leaves)
        out["hvp/flips"], out["hvp/t1_ms"] = hv
        return out

    reference = results(4)
    for stride in (1, 3, 7, events_played + 5):
        assert_identical(results(stride), reference)


# ---------------------------------------------------------------------------------------------
# Third derivatives
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("path", PATHS)
def test_third_derivative_of_simulate_raises(path):
    flips = torch.full((12,), 0.5, dtype=F64, requires_grad=True)
    t1 = f64(T1_MS).requires_grad_()
    signal = simulate(CASES["mrf"].build(flips=flips), tissue(t1=t1), states=STATES, dtype=F64, path=path)
    (g,) = torch.autograd.grad(signal.abs().pow(2).sum(), flips, create_graph=True)
    (h,) = torch.autograd.grad(g.sum(), flips, create_graph=True)  # second order: allowed
    assert h.requires_grad
    with pytest.raises(RuntimeError, match="first and second derivatives"):
        torch.autograd.grad(h.sum(), flips)
    (h_t1,) = torch.autograd.grad(g.sum(), t1, create_graph=True)
    with pytest.raises(RuntimeError, match="first and second derivatives"):
        torch.autograd.grad(h_t1.sum(), t1)


@pytest.mark.parametrize("path", PATHS)
def test_third_derivative_through_jacobian_raises(path):
    """A Jacobian is one derivative, its cost's gradient the second; differentiating that again is refused."""
    flips = torch.full((12,), 0.5, dtype=F64, requires_grad=True)
    t1 = f64(T1_MS).requires_grad_()
    _, J = jacobian(CASES["mrf"].build(flips=flips), tissue(t1=t1), ("t1_ms", "t2_ms"), states=STATES, dtype=F64,
                    path=path)
    (g,) = torch.autograd.grad(J.abs().pow(2).sum(), flips, create_graph=True)
    with pytest.raises(RuntimeError, match="first and second derivatives"):
        torch.autograd.grad(g.sum(), flips)


# ---------------------------------------------------------------------------------------------
# Bad input
# ---------------------------------------------------------------------------------------------

DESCRIPTION = CASES["mrf"].build()


@pytest.mark.parametrize("run", ["simulate", "jacobian"])
@pytest.mark.parametrize(
    ("given", "match"),
    [
        ({"t1_ms": f64([800.0, float("nan"), 300.0])}, "t1_ms"),
        ({"t1_ms": f64([800.0, -1.0, 300.0])}, "t1_ms"),
        ({"t2_ms": f64([60.0, 40.0, float("nan")])}, "t2_ms"),
        ({"t2_ms": -5.0}, "t2_ms"),
        ({"bound_fraction": -0.1}, "bound_fraction"),
        ({"t1_ms": f64([800.0, 600.0, 300.0]), "t2_ms": f64([60.0, 40.0, 30.0, 20.0])}, "t1_ms .*t2_ms"),
        ({"b1": f64([1.0, 0.9])}, r"broadcast.*b1 \(2,\)"),
    ],
    ids=["nan-t1", "negative-t1", "nan-t2", "negative-t2", "negative-fraction", "shapes-t1-t2", "shapes-b1"],
)
def test_bad_tissue_names_the_property(given, match, run):
    values = {"t1_ms": f64(T1_MS), "t2_ms": f64(T2_MS), **given}
    with pytest.raises(ValueError, match=match):
        if run == "simulate":
            simulate(DESCRIPTION, TissueProperties(**values), states=STATES)
        else:
            jacobian(DESCRIPTION, TissueProperties(**values), ("t1_ms",), states=STATES)


def test_fractions_over_one_rejected():
    """Pool fractions summing past 1 leave free water a negative share: a ValueError giving the sum."""
    props = TissueProperties(t1_ms=f64(T1_MS), t2_ms=f64(T2_MS), bound_fraction=0.6, pool_b_fraction=0.5)
    with pytest.raises(ValueError, match=r"fraction.*sum.*1\.1"):
        simulate(DESCRIPTION, props, states=STATES)


def test_fractions_over_one_names_the_fields():
    props = TissueProperties(t1_ms=f64(T1_MS), t2_ms=f64(T2_MS), bound_fraction=0.6, pool_b_fraction=0.5)
    with pytest.raises(ValueError, match="bound_fraction"):
        simulate(DESCRIPTION, props, states=STATES)


@pytest.mark.parametrize("states", [0, -3, 2.5, True])
def test_bad_states_rejected(states):
    with pytest.raises(ValueError, match="states"):
        simulate(DESCRIPTION, tissue(), states=states)
    with pytest.raises(ValueError, match="states"):
        jacobian(DESCRIPTION, tissue(), ("t1_ms",), states=states)


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"path": "fast"}, "path"),
        ({"dtype": torch.float16}, "dtype"),
        ({"repetitions": 0}, "repetitions"),
        ({"record": "some"}, "record"),
        ({"checkpoint_stride": 0}, "checkpoint_stride"),
    ],
)
def test_bad_call_arguments_rejected(kw, match):
    with pytest.raises(ValueError, match=match):
        simulate(DESCRIPTION, tissue(), states=STATES, **kw)


def test_jacobian_field_must_be_a_tissue_field():
    with pytest.raises(ValueError, match="t3_ms"):
        jacobian(DESCRIPTION, tissue(), ("t1_ms", "t3_ms"), states=STATES)


# ---------------------------------------------------------------------------------------------
# Forward-mode decompositions
# ---------------------------------------------------------------------------------------------

_FRESH_PROCESS = """
import sys, torch
from blochsim.engine import jacobian
from blochsim.sequence import TissueProperties, mrf_description
pools = dict(pool_b_fraction=0.15, pool_b_exchange_hz=10.0, t1_pool_b_ms=500.0, t2_pool_b_ms=20.0,
             bound_fraction=0.1, bound_exchange_hz=4.3, t1_bound_ms=1000.0) if sys.argv[1] == "pools" else {}
flips = torch.tensor([0.3, 0.5], requires_grad=True)
if sys.argv[1] == "closed form":
    from blochsim.simulators.spgr import SPGRSimulator
    _, J = SPGRSimulator(TR=10.0, TE=4.0).jacobian(("T1", "T2star"), flip=flips, T1=torch.tensor([800.0]),
                                                   T2star=40.0)
else:
    tissue = TissueProperties(t1_ms=torch.tensor([800.0]), t2_ms=60.0, **pools)
    _, J = jacobian(mrf_description(flips, 0.01), tissue, ("t1_ms", "t1_pool_b_ms" if pools else "t2_ms"))
torch.autograd.grad(J.abs().square().sum(), flips)
print(any(m in sys.modules for m in ("torch._decomp.decompositions_for_jvp", "torch._dynamo", "sympy")))
"""


@pytest.mark.parametrize("pools", ["free water", "pools", "closed form"])
def test_jacobian_does_not_load_forward_mode_decompositions(pools):
    """DESIGN.md section 4: structural derivatives of the package's bookkeeping are taken in reverse mode, "so a
    simulation never makes PyTorch register its forward-mode decompositions". Checked in a fresh process, with
    a second derivative through the Jacobian: neither torch's forward-mode decompositions, nor torch._dynamo
    (imported by the first dual-tensor-times-number op, about 5 s), nor sympy (imported by autograd.grad given
    grad_outputs, 2 s) is loaded; pool tables take their tangents by two reverse passes (docs/design.md)."""
    import blochsim

    root = Path(blochsim.__file__).resolve().parents[1]  # the blochsim this test imports (installed or not)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])}
    # Run outside the checkout: `python -c` puts the working directory first on sys.path.
    done = subprocess.run([sys.executable, "-c", _FRESH_PROCESS, pools], capture_output=True, text=True, env=env,
                          timeout=120, check=True, cwd=Path(blochsim.__file__).resolve().parents[2])
    assert done.stdout.strip().splitlines()[-1] == "False"
