"""The CUDA build's adjoint passes run on the host, for checks without a card: kernel_emulation.cpp compiles
the launch plan (launch_plan.hpp vjp_pass, vjp_jvp_pass) and the kernels (csrc/cuda/epg_device.cuh) with g++
against cuda_on_host/ (a stand-in CUDA runtime: every warp of a grid at once, 32 threads each, shuffles
through the warp's slots), and the engine's adjoint calls are routed to it as engine.kernels routes a card's:
the scratch its bs_epg_scratch_bytes asks for (filled with 0xff bytes, NaN: the card's is uninitialised),
then the pass. Held to the host library through the public API: every input's gradient of Re<w, signal>
(first order) and a double-backward Hessian-vector product (second), 32 orders, float32, on an MRF train with
an inversion (B1 per voxel) and a train of carried shifts (B1 shared), 21 voxels (padding groups in the last
warp), with the adjoints in plain groups of 8 (the launch rules' choice at this size) and of 4
(BLOCHSIM_CUDA_MAPPING=lanes4). FULL=1 adds every train, checkpoint strides 1-16, and the benchmark's real
gradient and HVP (benchmarks/api_cases.py, 500 flips) on 3 tissues. EMULATION_CXXFLAGS adds compiler flags
(run.sh: the sanitizers).

Kept beside the variant (benchmarks/variants/plain-group-adjoint.patch) until it lands, then moved into tests/
with kernel_emulation.cpp and cuda_on_host/. Skips where the plain group kernel is not in the source tree (the
patch not applied) or no C++20 compiler is found."""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

HERE = Path(__file__).resolve().parent
ROOT = next((p for p in HERE.parents if (p / "csrc" / "cuda" / "epg_device.cuh").exists()), None)
if ROOT is not None:
    sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "benchmarks")]

#: float32 sums of the same terms in another order (per lane, then over the group and the warp's atomics):
#: first derivatives 1e-5 of each result's largest entry, second 1e-4 (one more chain of products).
FIRST, SECOND = 1e-5, 1e-4
FULL = os.environ.get("FULL") == "1"
CASES = [(train, b1, stride) for train in ("carried", "mrf", "spgr") for b1 in ("per_voxel", "shared")
         for stride in (1, 3, 4, 7, 16)] if FULL else [("mrf", "per_voxel", 4), ("carried", "shared", 4)]


@pytest.fixture(scope="module")
def emulation(tmp_path_factory):
    if ROOT is None or "vjp_plain_lanes_kernel" not in (ROOT / "csrc" / "cuda" / "epg_device.cuh").read_text():
        pytest.skip("the plain group kernel is not in this source tree (plain-group-adjoint.patch not applied)")
    compiler = shutil.which("g++")
    if compiler is None:
        pytest.skip("no g++")
    library = tmp_path_factory.mktemp("kernel_emulation") / "libkernel_emulation.so"
    command = [compiler, "-std=c++20", "-O1", "-fPIC", "-shared", "-pthread", *os.environ.get(
        "EMULATION_CXXFLAGS", "").split(), f"-I{HERE / 'cuda_on_host'}", f"-I{ROOT / 'csrc'}",
        f"-I{ROOT / 'csrc' / 'include'}", f"-I{ROOT / 'csrc' / 'cuda'}", str(HERE / "kernel_emulation.cpp"),
        "-o", str(library)]
    built = subprocess.run(command, capture_output=True, text=True)
    if built.returncode != 0 and "c++20" in built.stderr:
        pytest.skip(f"{compiler} does not take C++20")
    assert built.returncode == 0, built.stderr[-2000:]
    lib = ctypes.CDLL(str(library))
    lib.emul_last_error.restype = ctypes.c_char_p
    lib.emul_scratch_bytes.restype = ctypes.c_int64
    return lib


@pytest.fixture
def routed(emulation, monkeypatch):
    """Call it with True to run the engine's adjoints on the emulated card, False for the host library."""
    import blochsim.engine.kernels as K

    passes = {"bs_epg_vjp": (2, emulation.emul_vjp), "bs_epg_vjp_jvp": (3, emulation.emul_vjp_jvp)}
    host_call, on = K._call, [False]

    def call(st, entry, args):
        if not (on[0] and entry in passes):
            return host_call(st, entry, args)
        index, run = passes[entry]
        need = emulation.emul_scratch_bytes(index, ctypes.byref(args))
        assert need >= 0, emulation.emul_last_error().decode()
        scratch = torch.full((max(need, 1),), 0xFF, dtype=torch.uint8)
        args.scratch, args.scratch_bytes = scratch.data_ptr(), need
        assert run(ctypes.byref(args)) == 0, emulation.emul_last_error().decode()

    monkeypatch.setattr(K, "_call", call)
    return lambda value: on.__setitem__(0, value)


def results(train: str, b1: str, stride: int) -> dict:
    """First-order gradients and a Hessian-vector product of every input of the train (32 orders, float32)."""
    from test_engine_lanes import described, inputs

    from blochsim.engine import simulate

    x = inputs(train, b1)
    leaves = {k: v.float().detach().clone().requires_grad_() for k, v in x.items()}
    description, tissue, repetitions = described(train, leaves)
    signal = simulate(description, tissue, states=32, repetitions=repetitions, dtype=torch.float32, path="real",
                      checkpoint_stride=stride)
    g = torch.Generator().manual_seed(6)
    w = torch.complex(torch.randn(signal.shape, generator=g), torch.randn(signal.shape, generator=g))
    first = torch.autograd.grad((w.conj() * signal).real.sum(), list(leaves.values()), retain_graph=True)
    power = (signal.real.square() + signal.imag.square()).sum()
    gradient = torch.autograd.grad(power, list(leaves.values()), create_graph=True)
    directions = [torch.randn(d.shape, generator=g) for d in gradient]
    hvp = torch.autograd.grad(sum((d * v).sum() for d, v in zip(gradient, directions)), list(leaves.values()))
    return {**{("first", k): v for k, v in zip(leaves, first)}, **{("second", k): v for k, v in zip(leaves, hvp)}}


def assert_close(got: dict, want: dict) -> None:
    for key, value in want.items():
        tolerance = SECOND if key[0] == "second" else FIRST
        assert float((got[key] - value).abs().max() / value.abs().max()) < tolerance, key


@pytest.mark.parametrize("mapping", ("auto", "lanes4"))
@pytest.mark.parametrize(("train", "b1", "stride"), CASES)
def test_the_plain_group_kernel_matches_the_host(routed, monkeypatch, mapping, train, b1, stride):
    if mapping != "auto":
        monkeypatch.setenv("BLOCHSIM_CUDA_MAPPING", mapping)
    want = results(train, b1, stride)
    routed(True)
    got = results(train, b1, stride)
    routed(False)
    assert_close(got, want)


@pytest.mark.skipif(not FULL, reason="FULL=1")
@pytest.mark.parametrize("case", ("epg_real_grad", "epg_real_hvp"))
def test_the_benchmark_cases_match_the_host(routed, case):
    import api_cases

    call = api_cases.case_fn(case, 3, torch.device("cpu"))
    order = "second" if case.endswith("hvp") else "first"
    want = call()
    routed(True)
    got = call()
    routed(False)
    assert_close({(order, "flips"): got}, {(order, "flips"): want})
