"""The host's real plain path, which runs a block's voxels side by side in SIMD lanes (csrc/cpu/epg_lanes.inc:
forward, JVP, VJP and the second-order adjoint; one instruction per operation for 4, 8 or 16 voxels), against
the float64 oracle.

The derivative tests of test_engine_derivatives.py play their trains with the crusher geometry, where diffusion
puts the real path on the per-voxel kernels; here there is no geometry, so the lanes run. Checked: the signal,
forward mode along a random direction in every input at once, and the VJP of every input the real path carries
(flips, the repetition time and with it the wrap interval, T1, T2, B1, M0, inversion efficiency), and the
second order over all of them: a Hessian-vector product by double backward (the second-order adjoint seeded
with a cotangent tangent, its sweep writing the signal's tangent) and the gradient of a cost of the (T1, T2)
Jacobian (the Jacobian's backward: one second-order sweep per column, no signal written), on
- conftest.carried_train: two shifts carried into a pulse and into a sample, a shift ahead of an inversion,
  spoilers carried into the next pass as E2 = 0 and samples taken after them (each branch of
  event_loop.hpp step_adjoint_plain);
- the MRF train (an inversion; one repetition time, so each voxel's exponentials are formed once) and SPGR
  played three times (the wrap interval; spoilers), with B1 per voxel and B1 shared by every voxel (the
  rotations then formed once per call);
- 21 voxels, so the last 16-voxel block leaves lanes empty at every width.
The instruction set is picked once per process, the widest the processor has; test_each_instruction_set runs
the same checks in a subprocess for each narrower one (BLOCHSIM_HOST_ISA).

Tolerances are those of test_engine_forward.py (the signal: 1e-5 float32, 1e-12 float64) and
test_engine_derivatives.py (first derivatives: 1e-4 and 1e-10, second 1e-3 and 1e-9, relative to each input's
largest entry), whose docstrings give their reasons; the lanes do each voxel's arithmetic in the same order as
a voxel alone.
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import DTYPES, F64, STATES, carried_train, ramp, rel_max_err
from torch.autograd import forward_ad as fwAD

from blochsim import _native
from blochsim._reference import play
from blochsim.engine import jacobian, simulate
from blochsim.sequence import TissueProperties, mrf_description, spgr_description

# torch.autograd.forward_ad.make_dual loads torch's forward-mode decompositions, which script with torch.jit
# (deprecated in recent torch): a warning of torch's, not ours.
pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")

SIGNAL = {torch.float32: 1e-5, torch.float64: 1e-12}  # test_engine_forward.py's TOL
FIRST = {torch.float32: 1e-4, torch.float64: 1e-10}  # test_engine_derivatives.py's FIRST
SECOND = {torch.float32: 1e-3, torch.float64: 1e-9}  # and its SECOND
VOXELS = 21

#: Each train: (builder of its description from the event inputs, repetitions, whether it takes event inputs).
TRAINS = {
    "carried": (lambda x: carried_train(blocks=3), 2, False),
    "mrf": (lambda x: mrf_description(x["flips"], x["tr_s"], inversion_time_s=0.02), 1, True),
    "spgr": (lambda x: spgr_description(x["flips"], x["tr_s"], 0.004), 3, True),
}


def inputs(train: str, b1: str) -> dict:
    """Float64 values of every input the real path differentiates: 21 voxels, B1 per voxel or one shared."""
    j = torch.arange(VOXELS, dtype=F64)
    x = {"t1_ms": 250.0 + 90.0 * j, "t2_ms": 20.0 + 9.0 * j, "m0": 0.8 + 0.02 * j,
         "inversion_efficiency": 0.8 + 0.01 * j,
         "b1": 0.85 + 0.015 * j if b1 == "per_voxel" else torch.tensor(0.93, dtype=F64)}
    if train == "spgr":  # no inversion: nothing depends on its efficiency
        del x["inversion_efficiency"]
    if TRAINS[train][2]:
        x["flips"] = ramp(12, 10, 60)
        x["tr_s"] = torch.tensor(0.011, dtype=F64)
    return x


def described(train: str, x: dict) -> tuple:
    """(description, tissue, repetitions) of the train on x."""
    build, repetitions, _ = TRAINS[train]
    tissue = TissueProperties(**{k: v for k, v in x.items() if k not in ("flips", "tr_s")})
    return build(x), tissue, repetitions


def run(train: str, x: dict, dtype=None) -> torch.Tensor:
    """The signal of the train on x: the oracle (dtype None) or the engine on the real path."""
    description, tissue, repetitions = described(train, x)
    if dtype is None:
        return play(description, tissue, states=STATES, repetitions=repetitions).signal
    return simulate(description, tissue, states=STATES, repetitions=repetitions, dtype=dtype, path="real")


def direction(x: dict) -> dict:
    """A random direction in every input, each a tenth of its input's mean size (test_engine_derivatives.py)."""
    g = torch.Generator().manual_seed(5)
    return {k: 0.1 * float(v.abs().mean()) * torch.randn(v.shape, dtype=F64, generator=g) for k, v in x.items()}


def forward_mode(train: str, x: dict, dtype) -> torch.Tensor:
    with fwAD.dual_level():
        duals = {k: fwAD.make_dual(v, t) for (k, v), t in zip(x.items(), direction(x).values(), strict=True)}
        return fwAD.unpack_dual(run(train, duals, dtype)).tangent


def reverse_mode(train: str, x: dict, dtype) -> dict:
    """Gradients of Re<w, signal> for a fixed random cotangent w."""
    leaves = {k: v.detach().clone().requires_grad_() for k, v in x.items()}
    signal = run(train, leaves, dtype)
    g = torch.Generator().manual_seed(6)
    w = torch.complex(torch.randn(signal.shape, dtype=F64, generator=g),
                      torch.randn(signal.shape, dtype=F64, generator=g)).to(signal.dtype)
    got = torch.autograd.grad((w.conj() * signal).real.sum(), list(leaves.values()))
    return dict(zip(leaves, got, strict=True))


def hessian_vector_product(train: str, x: dict, dtype) -> dict:
    """H v for L = sum |signal - target|^2 (a fixed random target), v = direction(x) in every input, by double
    backward."""
    leaves = {k: v.detach().clone().requires_grad_() for k, v in x.items()}
    signal = run(train, leaves, dtype)
    g = torch.Generator().manual_seed(7)
    target = 0.1 * torch.complex(torch.randn(signal.shape, dtype=F64, generator=g),
                                 torch.randn(signal.shape, dtype=F64, generator=g))
    loss = (signal - target.to(signal.dtype)).abs().pow(2).sum()
    first = torch.autograd.grad(loss, list(leaves.values()), create_graph=True)
    v = direction(x)
    inner = sum((d * v[k].to(d.dtype)).sum() for d, k in zip(first, leaves, strict=True))
    return dict(zip(leaves, torch.autograd.grad(inner, list(leaves.values())), strict=True))


def jacobian_cost_gradient(train: str, x: dict, dtype) -> dict:
    """Gradients of sum |J|^2 + sum |signal|^2, J the signal's Jacobian along (T1, T2): the engine's jacobian
    (its backward seeds the first column's second-order sweep with the signal's cotangent as a cotangent
    tangent), or forward mode through the oracle (each voxel's signal depends on its own T1 alone, so a
    tangent of ones gives a column)."""
    leaves = {k: v.detach().clone().requires_grad_() for k, v in x.items()}
    if dtype is None:
        columns = []
        for name in ("t1_ms", "t2_ms"):
            with fwAD.dual_level():
                duals = {**leaves, name: fwAD.make_dual(leaves[name], torch.ones_like(leaves[name]))}
                columns.append(fwAD.unpack_dual(run(train, duals)).tangent)
        signal, J = run(train, leaves), torch.stack(columns, -2)
    else:
        description, tissue, repetitions = described(train, leaves)
        signal, J = jacobian(description, tissue, ("t1_ms", "t2_ms"), states=STATES, repetitions=repetitions,
                             dtype=dtype, path="real")
    got = torch.autograd.grad(J.abs().pow(2).sum() + signal.abs().pow(2).sum(), list(leaves.values()))
    return dict(zip(leaves, got, strict=True))


CASES = [(train, b1) for train in TRAINS for b1 in ("per_voxel", "shared")]


def results(train: str, b1: str, dtype) -> dict:
    """The signal, its forward-mode tangent, the gradients and the second-order results: the engine's at
    dtype, the oracle's at None."""
    x = inputs(train, b1)
    out = {"signal": run(train, x, dtype).detach(), "forward mode": forward_mode(train, x, dtype)}
    out.update({f"gradient of {k}": g for k, g in reverse_mode(train, x, dtype).items()})
    out.update({f"second order: H v of {k}": h for k, h in hessian_vector_product(train, x, dtype).items()})
    out.update({f"second order: Jacobian cost gradient of {k}": g
                for k, g in jacobian_cost_gradient(train, x, dtype).items()})
    return out


@functools.cache
def oracle(train: str, b1: str) -> dict:
    return results(train, b1, None)


def check(got: dict, train: str, b1: str, dtype) -> None:
    want = oracle(train, b1)
    assert got.keys() == want.keys()
    for what in got:
        err = rel_max_err(got[what], want[what])
        tol = SIGNAL if what == "signal" else SECOND if what.startswith("second order") else FIRST
        assert err < tol[dtype], f"{what}: relative error {err:.3g}"


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(("train", "b1"), CASES)
def test_lanes_match_oracle(train, b1, dtype):
    check(results(train, b1, dtype), train, b1, dtype)


def _narrower_sets() -> list[str]:
    flags = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    sets = ["sse2"]
    if " avx2" in flags and " fma" in flags and " avx512f" in flags:
        sets.append("avx2")
    return sets


def _processor_sets() -> list[str]:
    """The lane sets this processor runs, as bs_host_lane_sets names them."""
    flags = Path("/proc/cpuinfo").read_text().split() if Path("/proc/cpuinfo").exists() else []
    sets = []
    if "avx2" in flags and "fma" in flags:
        sets.append("AVX2")
        if {"avx512f", "avx512vl", "avx512dq"} <= set(flags):
            sets.append("AVX-512")
    return sets


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/cpuinfo")
def test_the_widest_set_built_for_this_processor_runs():
    """The lane path runs the widest set both built into the library and run by this processor (a source build
    holds only its processor's widest, csrc/cpu/CMakeLists.txt BLOCHSIM_HOST_LANES); the per-voxel path only
    where there is none."""
    if os.environ.get("BLOCHSIM_HOST_ISA"):
        pytest.skip("BLOCHSIM_HOST_ISA narrows the choice in this process")
    built, running = _native.host_lanes()
    if "portable 4 lanes" in built:
        assert running == "portable 4 lanes"
        return
    usable = [s for s in _processor_sets() if s in built]
    assert running == (usable[-1] if usable else None), (built, running, _processor_sets())


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/cpuinfo")
@pytest.mark.parametrize("isa", _narrower_sets())
def test_each_instruction_set(isa, tmp_path):
    """The checks above, float32 and float64, on the engine's results from a process that runs the lanes at a
    narrower instruction set than this processor's widest (sse2: the x86-64 baseline every processor has,
    which under GCC on x86-64 runs the per-voxel path; avx2: 8 float lanes)."""
    if isa == "avx2" and "AVX2" not in _native.host_lanes()[0]:
        pytest.skip("this library holds no AVX2 lanes: a source build compiles its processor's widest set only "
                    "(the README's test command builds every set)")
    code = ("import sys, torch; sys.path.insert(0, 'tests'); import test_engine_lanes as t\n"
            "from blochsim import _native\n"
            "torch.save({'running': _native.host_lanes()[1], **{(train, b1, str(dtype)): t.results(train, b1, dtype)\n"
            "            for train, b1 in t.CASES for dtype in (torch.float32, torch.float64)}}, sys.argv[1])\n")
    env = {**os.environ, "BLOCHSIM_HOST_ISA": isa}
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path / "results.pt")], cwd=Path(__file__).parent.parent,
                          env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    got = torch.load(tmp_path / "results.pt")
    # The set asked for is the one that ran (under GCC on x86-64 sse2 is the per-voxel path).
    assert got["running"] == {"avx2": "AVX2", "sse2": None}[isa] or "portable 4 lanes" in _native.host_lanes()[0]
    for train, b1 in CASES:
        for dtype in DTYPES:
            check(got[train, b1, str(dtype)], train, b1, dtype)


def test_lanes_are_deterministic(monkeypatch):
    """The lanes keep the host's promises (test_engine_properties.py): the signal, the Jacobian, the flip
    gradient (a sum over voxels: blocks of 16 in lanes, then the blocks in order) and a Hessian-vector product
    (flips and T1) are the same bit for bit on 1 and 2 threads, and a voxel's results are the same in lane 5 of
    a block as alone (the other lanes then padding)."""
    x = {**inputs("mrf", "per_voxel"), "t1_ms": 250.0 + 90.0 * torch.arange(48, dtype=F64)}
    x.update({k: x[k][0] + 0 * x["t1_ms"] for k in ("t2_ms", "m0", "b1", "inversion_efficiency")})

    def power(signal: torch.Tensor) -> torch.Tensor:
        # |signal|^2 from real squares: its cotangents (2 Re, 2 Im) are exact at any size. Through abs(), torch
        # rounds the cotangent of a lone voxel and of a block differently (its vector loops and their tails:
        # at sse2 the Hessian-vector product's T1 entry then moved by an ulp), which no kernel promise covers.
        return (signal.real.square() + signal.imag.square()).sum()

    def everything(y: dict) -> list:
        leaves = {k: v.float().detach().clone().requires_grad_() for k, v in y.items()}
        signal = run("mrf", leaves, torch.float32)
        flips = torch.autograd.grad(power(signal), leaves["flips"], retain_graph=True)[0]
        t1 = torch.autograd.grad(signal.real.sum(), leaves["t1_ms"])[0]
        description = TRAINS["mrf"][0](y)
        tissue = TissueProperties(**{k: v.float() for k, v in y.items() if k not in ("flips", "tr_s")})
        _, J = jacobian(description, tissue, ("t1_ms", "t2_ms"), states=STATES, path="real")
        signal = run("mrf", leaves, torch.float32)
        first = torch.autograd.grad(power(signal), [leaves["flips"], leaves["t1_ms"]], create_graph=True)
        hv_flips, hv_t1 = torch.autograd.grad(first[0].sum() + first[1].sum(), [leaves["flips"], leaves["t1_ms"]])
        return [signal.detach(), flips, t1, J, hv_flips, hv_t1]

    monkeypatch.setenv("BLOCHSIM_NUM_THREADS", "1")
    one = everything(x)
    monkeypatch.setenv("BLOCHSIM_NUM_THREADS", "2")
    two = everything(x)
    assert all(torch.equal(a, b) for a, b in zip(one, two, strict=True))
    alone = everything({k: v[37:38] if v.dim() and k not in ("flips",) else v for k, v in x.items()})
    assert torch.equal(alone[0], two[0][37:38]) and torch.equal(alone[2], two[2][37:38])
    assert torch.equal(alone[3], two[3][37:38]) and torch.equal(alone[5], two[5][37:38])


def test_unknown_instruction_set_is_refused():
    """BLOCHSIM_HOST_ISA names a set or the call fails, naming the variable and what it takes."""
    code = ("import torch\nfrom blochsim.engine import simulate\n"
            "from blochsim.sequence import TissueProperties, mrf_description\n"
            "simulate(mrf_description(torch.ones(3), 0.01), TissueProperties(t1_ms=900.0, t2_ms=80.0), states=4,"
            " path='real')\n")
    env = {**os.environ, "BLOCHSIM_HOST_ISA": "avx9"}
    done = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).parent.parent, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode != 0
    assert "BLOCHSIM_HOST_ISA must be sse2, avx2 or avx512, got 'avx9'" in done.stderr
