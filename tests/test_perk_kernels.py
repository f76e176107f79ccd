"""PERK's kernels (csrc/perk.h) against the float64 PyTorch reference (blochsim/estimators/perk_reference.py).

For each pass (the regression on random features, its VJP with respect to the input rows, and the streaming
fit's sums): values and gradients against the reference, gradcheck of the autograd Function in float64, the
same bits for any thread count, each narrower instruction set of the host build, and the C ABI's refusals.
Shapes are chosen to leave every edge of the tiles partial (F not a multiple of the 64-feature tile, D of the
register block, V of the 32-voxel block) and to split more than 16 heads over calls.

Tolerances: float64 runs the same sums as the reference in another order (1e-12 of the largest entry). The
reference of a float32 run is the float64 reference on the float32-rounded inputs, so what is left is the
kernel's own float32 arithmetic: u = W x + b is a sum of D products, off by about eps32 * sum |W_fj x_j|
(6e-8 * ~40 here, 2.4e-6 rad), and cos/sin carry that error into every feature; the outputs sum F such
features against the heads. 2e-5 of the largest entry bounds it with margin (measured at most 2.3e-6).
"""

from __future__ import annotations

import ctypes
import math
import os
import subprocess
import sys

import pytest
import torch

from blochsim.estimators import perk_kernels as kernels
from blochsim.estimators import perk_reference as reference

F64 = torch.float64
# (V, D, F, T): one of everything; partial tiles everywhere; a realistic size; more heads than one call takes.
SHAPES = [(1, 1, 1, 1), (37, 13, 70, 3), (100, 200, 1000, 5), (5, 7, 129, 17)]
TOLERANCE = {torch.float64: 1e-12, torch.float32: 2e-5}  # see the module docstring


def problem(V, D, F, T, seed=0):
    """Inputs of a PERK pass in float64: rows x, features W (length scale ~2) and b, heads H, offsets c and a
    cotangent G, at the scales PERK sees (unit-norm-like rows, |u| up to ~10)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(V, D, generator=g, dtype=F64) / math.sqrt(D) * 3
    W = torch.randn(F, D, generator=g, dtype=F64) * 2
    b = torch.rand(F, generator=g, dtype=F64) * 2 * math.pi
    H = torch.randn(T, F, generator=g, dtype=F64) / math.sqrt(F)
    c = torch.randn(T, generator=g, dtype=F64)
    G = torch.randn(V, T, generator=g, dtype=F64)
    return x, W, b, H, c, G


def rel_err(actual, expected) -> float:
    return float((actual.double() - expected).abs().max() / expected.abs().max().clamp_min(1e-300))


def rounded(dtype, *tensors):
    """The tensors in `dtype` and, as the reference's inputs, those values back in float64."""
    low = [t.to(dtype) for t in tensors]
    return low, [t.double() for t in low]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("shape", SHAPES)
def test_regression_against_reference(shape, dtype):
    x, W, b, H, c, _ = problem(*shape)
    (xl, Wl, bl, Hl, cl), (xr, Wr, br, Hr, cr) = rounded(dtype, x, W, b, H, c)
    out = kernels.regression(xl, kernels.RandomFeatures.of(Wl, bl), Hl, cl)
    assert out.dtype == dtype and out.shape == (shape[0], shape[3])
    assert rel_err(out, reference.regression(xr, Wr, br, Hr, cr)) < TOLERANCE[dtype]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("shape", SHAPES)
def test_vjp_against_reference_gradient(shape, dtype):
    """The kernel VJP against torch's autograd of the reference (not the reference's own VJP formula)."""
    x, W, b, H, c, G = problem(*shape)
    (xl, Wl, bl, Hl, Gl), (xr, Wr, br, Hr, Gr) = rounded(dtype, x, W, b, H, G)
    grad = kernels.regression_vjp(xl, kernels.RandomFeatures.of(Wl, bl), Hl, Gl)
    xr = xr.clone().requires_grad_()
    (expected,) = torch.autograd.grad((reference.regression(xr, Wr, br, Hr, c) * Gr).sum(), xr)
    assert grad.dtype == dtype and grad.shape == x.shape
    assert rel_err(grad, expected) < TOLERANCE[dtype]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("shape", SHAPES)
def test_accumulate_against_reference(shape, dtype):
    x, W, b, _, _, G = problem(*shape)
    (xl, Wl, bl, Gl), (xr, Wr, br, Gr) = rounded(dtype, x, W, b, G)
    F, T = W.shape[0], G.shape[1]
    total, gram, cross = (torch.full(s, 0.5, dtype=F64) for s in ((F,), (F, F), (F, T)))  # added to, not set
    kernels.accumulate(xl, kernels.RandomFeatures.of(Wl, bl), Gl, feature_sum=total, feature_gram=gram,
                       feature_target=cross)
    expected = reference.accumulate(xr, Wr, br, Gr)
    for got, want in zip((total, gram, cross), expected, strict=True):
        assert rel_err(got - 0.5, want) < TOLERANCE[dtype]
    assert torch.equal(gram, gram.T)  # one tile computes both halves


def test_accumulate_skips_missing_accumulators():
    x, W, b, _, _, G = problem(40, 9, 100, 2)
    rf = kernels.RandomFeatures.of(W, b)
    cross = torch.zeros(100, 2, dtype=F64)
    kernels.accumulate(x, rf, G, feature_target=cross)
    assert rel_err(cross, reference.accumulate(x, W, b, G)[2]) < 1e-12


def test_gradcheck_float64():
    x, W, b, H, c, _ = problem(6, 5, 70, 3)
    rf = kernels.RandomFeatures.of(W, b)
    assert torch.autograd.gradcheck(lambda v: kernels.Regression.apply(v, rf, H, c), (x.requires_grad_(),))


def test_no_voxels():
    _, W, b, H, c, _ = problem(1, 4, 10, 2)
    rf = kernels.RandomFeatures.of(W, b)
    empty = torch.zeros(0, 4, dtype=F64)
    assert kernels.regression(empty, rf, H, c).shape == (0, 2)
    assert kernels.regression_vjp(empty, rf, H, torch.zeros(0, 2, dtype=F64)).shape == (0, 4)


def test_same_bits_for_any_thread_count(monkeypatch):
    x, W, b, H, c, G = problem(300, 50, 300, 4)
    x, W, b, H, c, G = (t.float() for t in (x, W, b, H, c, G))
    rf = kernels.RandomFeatures.of(W, b)
    results = []
    for threads in ("1", "2", "3"):
        monkeypatch.setenv("BLOCHSIM_NUM_THREADS", threads)
        gram = torch.zeros(300, 300, dtype=F64)
        kernels.accumulate(x, rf, G, feature_gram=gram)
        results.append((kernels.regression(x, rf, H, c), kernels.regression_vjp(x, rf, H, G), gram))
    for other in results[1:]:
        for a, b_ in zip(results[0], other, strict=True):
            assert torch.equal(a, b_)


_ISA_CHECK = """
import math, torch
from blochsim.estimators import perk_kernels as k, perk_reference as r
g = torch.Generator().manual_seed(1)
x = torch.randn(37, 13, generator=g, dtype=torch.float64); W = torch.randn(70, 13, generator=g, dtype=torch.float64)
b = torch.rand(70, generator=g, dtype=torch.float64) * 6; H = torch.randn(3, 70, generator=g, dtype=torch.float64)
c = torch.randn(3, dtype=torch.float64); G = torch.randn(37, 3, generator=g, dtype=torch.float64)
rf = k.RandomFeatures.of(W, b)
e = lambda a, b: float((a - b).abs().max() / b.abs().max())
gram = torch.zeros(70, 70, dtype=torch.float64)
k.accumulate(x, rf, None, feature_gram=gram)
print(max(e(k.regression(x, rf, H, c), r.regression(x, W, b, H, c)),
          e(k.regression_vjp(x, rf, H, G), r.regression_vjp(x, W, b, H, G)), e(gram, r.accumulate(x, W, b, None)[1])))
"""


def test_narrower_instruction_sets():
    """Each narrower instruction set's build of the tiles (picked once per process: a subprocess each, run side
    by side)."""
    runs = {isa: subprocess.Popen([sys.executable, "-c", _ISA_CHECK], env={**os.environ, "BLOCHSIM_HOST_ISA": isa},
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for isa in ("sse2", "avx2")}
    for isa, run in runs.items():
        out, err = run.communicate(timeout=300)
        assert run.returncode == 0, f"{isa}: {err}"
        assert float(out.strip()) < 1e-12, isa  # float64: the reference's sums in another order


def test_torch_path_without_kernels(monkeypatch):
    """A CUDA library without PERK kernels (the CUDA 12 package) runs the reference's torch arithmetic, in
    chunks, through the same functions: stood in for here by a host library that reports none."""
    x, W, b, H, c, G = problem(20000, 30, 100, 3)  # more rows than one torch chunk (FALLBACK_CHUNK)
    rf = kernels.RandomFeatures.of(W, b)
    ours = (kernels.regression(x, rf, H, c), kernels.regression_vjp(x, rf, H, G))
    total = torch.zeros(100, dtype=F64)
    kernels.accumulate(x, rf, None, feature_sum=total)
    monkeypatch.setattr(kernels, "_library", lambda device: None)
    torch_path = (kernels.regression(x, rf, H, c), kernels.regression_vjp(x, rf, H, G))
    total_torch = torch.zeros(100, dtype=F64)
    kernels.accumulate(x, rf, None, feature_sum=total_torch)
    for a, b_ in zip(ours + (total,), torch_path + (total_torch,), strict=True):
        assert rel_err(a, b_) < 1e-12  # float64 both ways: the same sums in another order


def test_column_count_checked():
    x, W, b, H, c, _ = problem(4, 6, 10, 2)
    with pytest.raises(ValueError, match=r"\(N, 6\)"):
        kernels.regression(x[:, :5], kernels.RandomFeatures.of(W, b), H, c)


def _map_args(x, rf, head, offset, out, *, dtype_code=0, outputs=None):
    return kernels._MapArgs(dtype_code, 1, None, rf.struct(), x.shape[0], head.shape[0] if outputs is None else outputs,
                            x.data_ptr(), head.data_ptr(), offset.data_ptr(), out.data_ptr())


def test_c_abi_refuses_bad_arguments():
    lib = kernels._library(torch.device("cpu"))
    x, W, b, H, c, _ = problem(4, 6, 10, 2)
    x, W, b, H, c = (t.float() for t in (x, W, b, H, c))
    rf = kernels.RandomFeatures.of(W, b)
    out = torch.empty(4, 2)
    cases = [
        (_map_args(x, rf, H, c, out, outputs=17), "num_outputs must be in 1..16, got 17"),
        (_map_args(x, rf, H, c, out, outputs=0), "num_outputs must be in 1..16, got 0"),
        (_map_args(x, rf, H, c, out, dtype_code=5), "dtype must be BS_FLOAT32 (0) or BS_FLOAT64 (1), got 5"),
    ]
    bad_features = _map_args(x, rf, H, c, out)
    bad_features.features.num_features = 0
    cases.append((bad_features, "features.num_features (F) must be >= 1, got 0"))
    for args, message in cases:
        assert lib.bs_perk_map(ctypes.byref(args)) != 0
        assert message in lib.bs_last_error().decode()
    small = kernels._AccumulateArgs(0, 1, None, rf.struct(), 4, 0, x.data_ptr(), None, None, None, None,
                                    out.data_ptr(), 16)
    assert lib.bs_perk_accumulate(ctypes.byref(small)) != 0
    assert "scratch must hold the chunk's features: 1024 bytes" in lib.bs_last_error().decode()
    assert lib.bs_perk_scratch_bytes(2, ctypes.byref(small)) == 4 * 64 * 4  # 4 samples x 10 features in a tile
    assert lib.bs_perk_scratch_bytes(7, ctypes.byref(small)) == -1
    assert "pass must be 0 (map), 1 (VJP) or 2 (accumulate), got 7" in lib.bs_last_error().decode()


# ---- the CUDA library (skipped without a card) ----------------------------------------------------------
# The device runs the same float32 arithmetic with fused multiply-adds and a different summation order (tiles
# of 16 products in shared memory, partial sums over feature splits), so it meets the same float32 bound.
CUDA_SHAPES = SHAPES + [(2000, 200, 1000, 5), (20000, 200, 1000, 3), (3, 400, 1000, 17)]


@pytest.mark.cuda
@pytest.mark.parametrize("shape", CUDA_SHAPES)
def test_cuda_against_reference(shape):
    assert kernels.has_kernels("cuda"), "the CUDA library has no PERK kernels"
    x, W, b, H, c, G = problem(*shape)
    (xl, Wl, bl, Hl, cl, Gl), (xr, Wr, br, Hr, cr, Gr) = rounded(torch.float32, x, W, b, H, c, G)
    rf = kernels.RandomFeatures.of(Wl.cuda(), bl.cuda())
    out = kernels.regression(xl.cuda(), rf, Hl.cuda(), cl.cuda())
    assert rel_err(out.cpu(), reference.regression(xr, Wr, br, Hr, cr)) < TOLERANCE[torch.float32]
    grad = kernels.regression_vjp(xl.cuda(), rf, Hl.cuda(), Gl.cuda())
    assert rel_err(grad.cpu(), reference.regression_vjp(xr, Wr, br, Hr, Gr)) < TOLERANCE[torch.float32]
    F, T = W.shape[0], G.shape[1]
    total, gram, cross = (torch.zeros(s, dtype=F64, device="cuda") for s in ((F,), (F, F), (F, T)))
    kernels.accumulate(xl.cuda(), rf, Gl.cuda(), feature_sum=total, feature_gram=gram, feature_target=cross)
    for got, want in zip((total, gram, cross), reference.accumulate(xr, Wr, br, Gr), strict=True):
        assert rel_err(got.cpu(), want) < TOLERANCE[torch.float32]


@pytest.mark.cuda
def test_cuda_same_bits_on_every_run():
    """No atomics: the feature splits are summed in a fixed order, so two runs agree bitwise."""
    x, W, b, H, c, G = (t.float().cuda() for t in problem(700, 64, 1000, 4))
    rf = kernels.RandomFeatures.of(W, b)
    first = (kernels.regression(x, rf, H, c), kernels.regression_vjp(x, rf, H, G))
    second = (kernels.regression(x, rf, H, c), kernels.regression_vjp(x, rf, H, G))
    for a, b_ in zip(first, second, strict=True):
        assert torch.equal(a, b_)
