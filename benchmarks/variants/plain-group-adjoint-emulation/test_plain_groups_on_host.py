"""The plain group adjoint's kernel (csrc/cuda/epg_device.cuh vjp_plain_lanes_kernel) run on the host, for CI
without a card: kernel_emulation.cpp compiles the kernel's own source with g++ against cuda_on_host/ (a
stand-in CUDA runtime: every warp of the grid at once, 32 threads each, shuffles through the warp's slots),
and the engine's adjoint calls are routed to it. Held to the host library through the public API: the first
order (every input's gradient of Re<w, signal>) and the second (a double-backward Hessian-vector product),
at 4 and 8 lanes, on an MRF train with an inversion (B1 per voxel) and a train of carried shifts (B1
shared), 21 voxels (padding groups in the last warp).

Kept beside the variant (benchmarks/variants/plain-group-adjoint.patch) until it lands, then moved into tests/
with kernel_emulation.cpp and cuda_on_host/. Skips where the kernel is not in the source tree (the patch not
applied) or no C++20 compiler is found."""

from __future__ import annotations

import ctypes
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

HERE = Path(__file__).resolve().parent
ROOT = next((p for p in HERE.parents if (p / "csrc" / "cuda" / "epg_device.cuh").exists()), None)
sys.path.insert(0, str(ROOT / "tests")) if ROOT else None

#: float32 sums of the same terms in another order (per lane, then over the group and the warp's atomics):
#: first derivatives 1e-5 of each result's largest entry, second 1e-4 (one more chain of products).
FIRST, SECOND = 1e-5, 1e-4


@pytest.fixture(scope="module")
def emulation(tmp_path_factory):
    if ROOT is None or "vjp_plain_lanes_kernel" not in (ROOT / "csrc" / "cuda" / "epg_device.cuh").read_text():
        pytest.skip("the plain group kernel is not in this source tree (plain-group-adjoint.patch not applied)")
    compiler = shutil.which("g++")
    if compiler is None:
        pytest.skip("no g++")
    library = tmp_path_factory.mktemp("kernel_emulation") / "libkernel_emulation.so"
    command = [compiler, "-std=c++20", "-O1", "-fPIC", "-shared", "-pthread", f"-I{HERE / 'cuda_on_host'}",
               f"-I{ROOT / 'csrc'}", f"-I{ROOT / 'csrc' / 'include'}", f"-I{ROOT / 'csrc' / 'cuda'}",
               str(HERE / "kernel_emulation.cpp"), "-o", str(library)]
    built = subprocess.run(command, capture_output=True, text=True)
    if built.returncode != 0 and "c++20" in built.stderr:
        pytest.skip(f"{compiler} does not take C++20")
    assert built.returncode == 0, built.stderr[-2000:]
    lib = ctypes.CDLL(str(library))
    lib.emul_last_error.restype = ctypes.c_char_p
    return lib


@pytest.fixture
def routed(emulation, monkeypatch):
    """Sets the lanes the engine's adjoints run in on the emulated kernel (0: the host library)."""
    import blochsim.engine.kernels as K

    entries = {"bs_epg_vjp": emulation.emul_vjp_lanes, "bs_epg_vjp_jvp": emulation.emul_vjp_jvp_lanes}
    host_call, lanes = K._call, [0]

    def call(st, entry, args):
        if entry in entries and lanes[0]:
            if entries[entry](ctypes.byref(args), lanes[0]):
                raise RuntimeError(emulation.emul_last_error().decode())
            return
        host_call(st, entry, args)

    monkeypatch.setattr(K, "_call", call)
    return lanes


def results(train: str, b1: str) -> dict:
    """First-order gradients and a Hessian-vector product of every input of the train (32 orders, float32)."""
    from test_engine_lanes import described, inputs

    from blochsim.engine import simulate

    x = inputs(train, b1)
    leaves = {k: v.float().detach().clone().requires_grad_() for k, v in x.items()}
    description, tissue, repetitions = described(train, leaves)
    signal = simulate(description, tissue, states=32, repetitions=repetitions, dtype=torch.float32, path="real")
    g = torch.Generator().manual_seed(6)
    w = torch.complex(torch.randn(signal.shape, generator=g), torch.randn(signal.shape, generator=g))
    first = torch.autograd.grad((w.conj() * signal).real.sum(), list(leaves.values()), retain_graph=True)
    power = (signal.real.square() + signal.imag.square()).sum()
    gradient = torch.autograd.grad(power, list(leaves.values()), create_graph=True)
    directions = [torch.randn(d.shape, generator=g) for d in gradient]
    hvp = torch.autograd.grad(sum((d * v).sum() for d, v in zip(gradient, directions)), list(leaves.values()))
    return {**{("first", k): v for k, v in zip(leaves, first)}, **{("second", k): v for k, v in zip(leaves, hvp)}}


@pytest.mark.parametrize("lanes", (8, 4))
@pytest.mark.parametrize(("train", "b1"), [("mrf", "per_voxel"), ("carried", "shared")])
def test_the_plain_group_kernel_matches_the_host(routed, train, b1, lanes):
    want = results(train, b1)
    routed[0] = lanes
    got = results(train, b1)
    routed[0] = 0
    for key, value in want.items():
        tolerance = FIRST if key[0] == "first" else SECOND
        assert float((got[key] - value).abs().max() / value.abs().max()) < tolerance, key
