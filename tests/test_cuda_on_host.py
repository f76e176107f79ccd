"""The CUDA library's kernels, run on the host without a card, against the host library.

tests/cuda_on_host/library.cpp is the CUDA library's C ABI (blochsim/cuda_abi.inc: the forward, JVP, VJP
and VJP-JVP passes, their launch plans and scratch sizes) over the kernels of csrc/cuda/epg_device.cuh,
compiled by g++ against a stand-in CUDA runtime (tests/cuda_on_host/cuda_runtime.h: each CUDA thread a host
thread, a warp's shuffles and ballots meetings of its 32 lanes, __syncthreads a meeting of its block). The
engine's kernel calls are routed to it as `engine.kernels` routes a card's (its scratch asked of its
bs_epg_scratch_bytes, filled with 0xff bytes: NaN, as a card's is uninitialised), so every mapping the launch
rules choose or BLOCHSIM_CUDA_MAPPING forces (a thread, a warp, groups of 4 or 8 lanes per voxel, and through
BLOCHSIM_CUDA_ADJOINT_LANES the plain adjoint's groups of 16 or 32; registers
or scratch; pool tables; the events decoded once per launch, folded, joined across chunks; shots; staged
samples) runs its own source through the public API, in CI, where the GPU suite (tests/test_cuda.py) needs a
card. What only a card can say is nvcc's code (its fused multiply-adds, its scheduling) and the speed.

Both sides run float32 (engine.simulate's default). Tolerance: the kernels are the host's arithmetic here
(g++ for x86-64 without FMA), but their sums run in another order (warp sums, atomics over voxels, groups'
totals) and the host library vectorises its own (FMA where the ISA has it): the GPU suite's budget, 1e-5 of
the largest entry for values, 1e-4 for first and 1e-3 for second derivatives, each result at its own scale.

The library is built once per session (about 90 s on two cores, its five objects in parallel);
BLOCHSIM_CUDA_ON_HOST_LIBRARY names one built before (`python3 tests/test_cuda_on_host.py build DIR`).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
from conftest import carried_train, column_rel_err, folding_train, rel_max_err, shot_train

from blochsim import engine
from blochsim.engine import kernels
from blochsim.sequence import TissueProperties, mrf_description

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SOURCE = HERE / "cuda_on_host" / "library.cpp"
#: The objects of the library: PASS 0 forward, 1 JVP, 2 VJP, 3 VJP-JVP, 4 the ABI (library.cpp).
PASSES = range(5)


def build(directory: Path, compiler: str = "g++") -> Path:
    """Compile and link the emulated CUDA library into `directory`; returns its path."""
    directory.mkdir(parents=True, exist_ok=True)
    flags = ["-std=c++20", "-O1", "-fPIC", "-pthread", f"-I{SOURCE.parent}", f"-I{ROOT / 'csrc'}",
             f"-I{ROOT / 'csrc' / 'include'}", f"-I{ROOT / 'csrc' / 'cuda'}",
             *os.environ.get("BLOCHSIM_CUDA_ON_HOST_CXXFLAGS", "").split()]

    def compile_pass(index: int) -> Path:
        obj = directory / f"pass{index}.o"
        done = subprocess.run([compiler, *flags, f"-DCUDA_ON_HOST_PASS={index}", "-c", str(SOURCE), "-o", str(obj)],
                              capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"{compiler} failed on pass {index}:\n{done.stderr[-3000:]}")
        return obj

    with ThreadPoolExecutor(max_workers=max(1, min(len(PASSES), os.cpu_count() or 1))) as pool:
        objects = list(pool.map(compile_pass, PASSES))
    library = directory / "libblochsim_cuda_on_host.so"
    linked = subprocess.run([compiler, "-shared", "-pthread", *map(str, objects), "-o", str(library)],
                            capture_output=True, text=True)
    if linked.returncode != 0:
        raise RuntimeError(linked.stderr[-3000:])
    return library


@pytest.fixture(scope="session")
def card_library(tmp_path_factory):
    path = os.environ.get("BLOCHSIM_CUDA_ON_HOST_LIBRARY")
    if not path:
        compiler = shutil.which("g++")
        if compiler is None:
            pytest.skip("no g++ to build the CUDA library for the host")
        path = build(tmp_path_factory.mktemp("cuda_on_host"), compiler)
    lib = ctypes.CDLL(str(path))
    lib.bs_last_error.restype = ctypes.c_char_p
    lib.bs_epg_scratch_bytes.restype = ctypes.c_int64
    lib.bs_epg_resident_voxels.restype = ctypes.c_int64
    lib.cuda_on_host_kernels_started.restype = ctypes.c_char_p
    return lib


#: The blocks of any kernel the emulated card keeps resident (library.cpp HostGridLauncher kResidentBlocks).
RESIDENT_BLOCKS = 16


def voxels_a_block_of(card_library, entry: str, args) -> int:
    """The voxels a block of the kernel the card's launch plan picks for this call (which mapping runs)."""
    resident = card_library.bs_epg_resident_voxels(kernels._PASSES[entry], ctypes.byref(args))
    assert resident > 0, card_library.bs_last_error().decode()
    return int(resident) // RESIDENT_BLOCKS


@pytest.fixture
def card(card_library, monkeypatch):
    """`with card():` runs the engine's kernel calls on the emulated card, else on the host library; the block
    fails where none of its calls reached the card (a result then held to itself). `card.voxels_a_block`
    gathers, per pass, the voxels a block of the kernels its launches started (bs_epg_resident_voxels, asked
    before each call): which mapping ran, since a forced one that fell back to another would match the host
    as well; `card.kernels` the names of the kernels each pass started (where two take the same shape)."""
    host_call, on, calls, voxels_a_block, started = kernels._call, [False], [0], {}, {}

    def call(st, entry, args):
        if not (on[0] and entry in kernels._PASSES):
            return host_call(st, entry, args)
        calls[0] += 1
        voxels_a_block.setdefault(entry, set()).add(voxels_a_block_of(card_library, entry, args))
        need = card_library.bs_epg_scratch_bytes(kernels._PASSES[entry], ctypes.byref(args))
        assert need >= 0, card_library.bs_last_error().decode()
        scratch = torch.full((max(int(need), 1),), 0xFF, dtype=torch.uint8)
        args.scratch, args.scratch_bytes = scratch.data_ptr(), int(need)
        card_library.cuda_on_host_kernels_started()  # (forget any started outside this call)
        status = getattr(card_library, entry)(ctypes.byref(args))
        assert status == 0, card_library.bs_last_error().decode()
        started.setdefault(entry, set()).update(card_library.cuda_on_host_kernels_started().decode().split(","))

    monkeypatch.setattr(kernels, "_call", call)

    @contextlib.contextmanager
    def running():
        on[0], before = True, calls[0]
        try:
            yield
        finally:
            on[0] = False
        assert calls[0] > before, "no kernel call reached the emulated card"

    running.voxels_a_block = voxels_a_block
    running.kernels = started
    return running


@pytest.fixture(params=("auto", "warp", "thread", "lanes4", "lanes8"))
def mapping(request, monkeypatch):
    if request.param != "auto":
        monkeypatch.setenv("BLOCHSIM_CUDA_MAPPING", request.param)
    return request.param


def on_both(card, run):
    """run() on the host library, then on the emulated card."""
    host = run()
    with card():
        return host, run()


# ---- the cases of the GPU suite (tests/test_cuda.py), at fewer voxels ------------------------------------------
from test_cuda import (  # noqa: E402  (the GPU suite's trains, tissues and cases)
    CASES,
    GENERAL_FOLD_CASES,
    POOLS,
    assert_derivatives_close,
    decoded_events_gradients,
    force_group,
    general_fold_gradients,
    tissue,
    train,
)

#: Voxels per case: padding groups for groups of lanes and a part of a warp for a thread per voxel (the
#: register kernel's cases take a whole warp and a part of one: WARP_AND_PART).
VOXELS, WARP_AND_PART = 9, 37
#: The derivatives' cases: fewer voxels and events (the adjoints' warp sums are a meeting of 32 host threads
#: each; a case of the suite at 37 voxels and 40 events takes a minute); FULL=1 runs every case of the GPU suite.
#: poolb+mt at 10 orders takes the real fixed-pool second order (launch_rules.hpp fixed_pool_warp), mt the complex.
FULL = os.environ.get("FULL") == "1"
DERIVATIVE_VOXELS, DERIVATIVE_EVENTS = VOXELS, 16
DERIVATIVE_CASES = CASES if FULL else [("free", False, 32), ("free", True, 10), ("poolb+mt", False, 40),
                                       ("poolb+mt", False, 10), ("mt", True, 10)]


@pytest.mark.parametrize("pools,quadratic,states", CASES)
def test_forward_matches_host(pools, quadratic, states, mapping, card):
    flips, phases = train(quadratic=quadratic)
    d = mrf_description(flips, 0.01, phases_rad=phases)
    host, emulated = on_both(card, lambda: engine.simulate(d, tissue("cpu", pools, n=VOXELS, b0=quadratic),
                                                           states=states))
    assert rel_max_err(emulated, host) < 1e-5


@pytest.mark.parametrize("pools,quadratic,states", DERIVATIVE_CASES)
def test_first_and_second_derivatives_match_host(pools, quadratic, states, mapping, card):
    """Gradients of sum |signal|^2 along the flips and T1 (VJP), the (T1, T2) Jacobian (JVP) and the
    gradient of its sum of squares (VJP-JVP, the double backward)."""
    def run():
        flips, phases = train(n=DERIVATIVE_EVENTS, quadratic=quadratic)
        flips = flips.to(torch.float64).requires_grad_()
        d = mrf_description(flips, 0.01, phases_rad=phases)
        t = tissue("cpu", pools, n=DERIVATIVE_VOXELS, b0=quadratic)
        t1 = t.t1_ms.clone().requires_grad_()
        # M0's gradient reads each sample's F+(0) (an MRF sample is an event of its own: no pass, its own state)
        m0 = torch.linspace(0.8, 1.2, DERIVATIVE_VOXELS).requires_grad_()
        t = TissueProperties(**{**dict(t.items()), "t1_ms": t1, "m0": m0})
        signal = engine.simulate(d, t, states=states)
        g_flip, g_t1, g_m0 = torch.autograd.grad((signal.abs() ** 2).sum(), [flips, t1, m0])
        _, J = engine.jacobian(d, t, ("t1_ms", "t2_ms"), states=states)
        h_flip, h_t1, h_m0 = torch.autograd.grad((J.abs() ** 2).sum(), [flips, t1, m0])
        return signal, g_flip, g_t1, J, h_flip, h_t1, g_m0, h_m0

    host, emulated = on_both(card, run)
    if mapping == "lanes8" and pools == "free" and quadratic:  # the complex Jacobian in groups of 8 (jvp_groups)
        assert card.voxels_a_block["bs_epg_jvp"] == {VOXELS_A_BLOCK["lanes8"]}, card.voxels_a_block
    assert rel_max_err(emulated[0], host[0]) < 1e-5
    assert rel_max_err(emulated[1], host[1]) < 1e-4 and rel_max_err(emulated[2], host[2]) < 1e-4
    assert column_rel_err(emulated[3], host[3]) < 1e-4  # per column: dS/dT1 is several times below dS/dT2
    assert rel_max_err(emulated[4], host[4]) < 1e-3 and rel_max_err(emulated[5], host[5]) < 1e-3
    assert rel_max_err(emulated[6], host[6]) < 1e-4 and rel_max_err(emulated[7], host[7]) < 1e-3


@pytest.mark.parametrize(("pools", "forced"), (("mt", False), ("poolb", False), ("poolb+mt", False),
                                               ("poolb+mt", True)))
@pytest.mark.parametrize("states", (10, 32))
def test_pool_second_order_groups_match_host(pools, forced, states, card, monkeypatch):
    """test_first_and_second_derivatives_match_host with the second order's fixed-pool adjoint in groups of 16
    lanes (two voxels a warp, a padding group in the last block): by rule for pools (1, 2) and (2, 2), forced
    for (2, 3) (BLOCHSIM_CUDA_ADJOINT_LANES=16), whose rule keeps the warp (launch_rules.hpp adjoint_lanes)."""
    if forced:
        monkeypatch.setenv("BLOCHSIM_CUDA_ADJOINT_LANES", "16")
    test_first_and_second_derivatives_match_host(pools, False, states, "auto", card)
    mapping = "warp" if pools == "poolb+mt" and not forced else "plain16"
    assert card.voxels_a_block["bs_epg_vjp_jvp"] == {VOXELS_A_BLOCK[mapping]}, card.voxels_a_block
    # no tangent reaches the events (the Jacobian's along T1 and T2) and B1 is uniform: the decoded values'
    # kernel (launch_plan.hpp start_adjoint_lanes)
    second_order = card.kernels["bs_epg_vjp_jvp"]
    assert "vjp_values_kernel" in second_order and "vjp_warp_kernel" not in second_order, second_order
    # and the Jacobian's warp on the launch's decoded values (launch_rules.hpp jvp_values: the real path)
    jvp = card.kernels["bs_epg_jvp"]
    assert "forward_values_kernel" in jvp and "forward_warp_kernel" not in jvp, jvp


@pytest.mark.parametrize("b1", ("map", "one value"))
def test_general_adjoint_decoded_events_match_host(b1, mapping, card):
    """test_cuda.decoded_events_gradients on the emulated card (the general adjoint's first order reading its
    events as the launch decoded them: the rotation from them only with B1 one value, the demodulation, the
    wrapped interval's length the problem's), against the host, each gradient at its own scale."""
    (host, host_grads), (emulated, emulated_grads) = on_both(
        card, lambda: decoded_events_gradients("cpu", b1, DERIVATIVE_VOXELS, DERIVATIVE_EVENTS))
    assert rel_max_err(emulated, host) < 1e-5
    assert_derivatives_close(emulated_grads, host_grads)


@pytest.mark.parametrize("b1", ("map", "one value", "along B1"))
@pytest.mark.parametrize("quadratic", (False, True))
def test_jvp_on_decoded_values_matches_host(b1, quadratic, card, monkeypatch):
    """The Jacobian in groups of 8 (launch_rules.hpp jvp_groups) over 150 events played twice (the MRF folds,
    a repetition's seam), against the host per column. Along T1 and T2 with B1 one value no tangent reaches
    the events: the launch decodes them once and the groups turn their dual states by real rotations
    (forward_values_kernel, launch_rules.hpp jvp_values); with a B1 map, or along B1, each voxel forms its own
    (forward_warp_kernel)."""
    monkeypatch.setenv("BLOCHSIM_CUDA_MAPPING", "lanes8")
    flips, phases = train(n=150, quadratic=quadratic)
    d = mrf_description(flips, 0.01, phases_rad=phases)
    along = ("t1_ms", "b1") if b1 == "along B1" else ("t1_ms", "t2_ms")

    def run():
        t = tissue("cpu", n=VOXELS, b0=quadratic)
        extra = {"b1": torch.linspace(0.7, 1.2, VOXELS) if b1 == "map" else torch.tensor(0.85)}
        if quadratic:
            extra["b1_phase_rad"] = torch.linspace(-0.3, 0.4, VOXELS) if b1 == "map" else torch.tensor(0.2)
        t = TissueProperties(**{**dict(t.items()), **extra})
        return engine.jacobian(d, t, along, states=32, repetitions=2)

    host, emulated = on_both(card, run)
    assert rel_max_err(emulated[0], host[0]) < 1e-5
    assert column_rel_err(emulated[1], host[1]) < 1e-4  # per column: dS/dT1 is several times below dS/dT2
    started = card.kernels["bs_epg_jvp"]
    values = b1 == "one value"
    assert ("forward_values_kernel" in started) == values and ("forward_warp_kernel" in started) != values, started
    if values:
        assert card.voxels_a_block["bs_epg_jvp"] == {VOXELS_A_BLOCK["lanes8"]}, card.voxels_a_block


@pytest.mark.parametrize("quadratic", (False, True))
def test_jvp_groups_past_the_warp_are_given_their_scratch(quadratic, card):
    """The rules' own mapping past 3,000 voxels (no mapping forced): the Jacobian along T1 and T2 in groups of 8
    on the launch's decoded entries, whose scratch the JVP's query (bs_epg_scratch_bytes) must count, though
    the widest dual it sizes for (8 tangents) runs a warp there and reads no entries."""
    n = 3100
    flips, phases = train(n=4, quadratic=quadratic)
    d = mrf_description(flips, 0.01, phases_rad=phases)
    host, emulated = on_both(card, lambda: engine.jacobian(d, tissue("cpu", n=n, b0=quadratic), ("t1_ms", "t2_ms"),
                                                           states=8))
    assert rel_max_err(emulated[0], host[0]) < 1e-5
    assert column_rel_err(emulated[1], host[1]) < 1e-4
    assert "forward_values_kernel" in card.kernels["bs_epg_jvp"], card.kernels


@pytest.mark.parametrize("along", (("t1_ms", "t2_ms"), ("t1_ms", "b1")))
@pytest.mark.parametrize("quadratic", (False, True))
def test_jvp_below_3000_voxels_takes_groups_on_decoded_entries(quadratic, along, card):
    """The rules' own mapping at 40 voxels (no mapping forced; launch_rules.hpp forward_lanes): a Jacobian
    whose events carry no tangent (along T1 and T2) takes the groups of 8 on the launch's decoded entries, as
    past 3,000 voxels; along B1 (a tangent on every pulse) the warp, each voxel forming its own rotations."""
    flips, phases = train(n=30, quadratic=quadratic)
    d = mrf_description(flips, 0.01, phases_rad=phases)

    def run():
        t = TissueProperties(**{**dict(tissue("cpu", n=40, b0=quadratic).items()), "b1": torch.tensor(0.9)})
        return engine.jacobian(d, t, along, states=32)

    host, emulated = on_both(card, run)
    assert rel_max_err(emulated[0], host[0]) < 1e-5
    assert column_rel_err(emulated[1], host[1]) < 1e-4
    values = along == ("t1_ms", "t2_ms")
    started = card.kernels["bs_epg_jvp"]
    assert ("forward_values_kernel" in started) == values and ("forward_warp_kernel" in started) != values, started
    assert card.voxels_a_block["bs_epg_jvp"] == {VOXELS_A_BLOCK["lanes8" if values else "warp"]}, card.voxels_a_block


#: The voxels a block of each mapping holds (launch_plan.hpp thread_shape, lanes_shape): a thread per voxel in
#: blocks of 32 threads below 33,792 voxels, groups and warps in blocks of 128 threads ("plainN": N lanes).
VOXELS_A_BLOCK = {"thread": 32, "warp": 4, "lanes4": 32, "lanes8": 16, "plain8": 16, "plain16": 8, "plain32": 4}


def test_resident_voxels_are_asked_without_a_launch(card_library, mapping, monkeypatch):
    """bs_epg_resident_voxels answers, for each pass, the voxels its kernel keeps resident (the emulated card
    keeps 16 blocks of any kernel: HostGridLauncher kResidentBlocks) and starts nothing: the signal it is
    given keeps its bytes. The forward's answer follows the forced mapping's voxels a block."""
    card_library.bs_epg_resident_voxels.restype = ctypes.c_int64
    host_call, answers = kernels._call, {}

    def call(st, entry, args):
        if entry in kernels._PASSES:
            asked = type(args).from_buffer_copy(args)
            if entry == "bs_epg_forward":
                sentinel = torch.full((st.num_voxels * 64,), 7.0)
                asked.signal = sentinel.data_ptr()
            answers[entry] = card_library.bs_epg_resident_voxels(kernels._PASSES[entry], ctypes.byref(asked))
            assert answers[entry] > 0, card_library.bs_last_error().decode()
            if entry == "bs_epg_forward":
                assert bool((sentinel == 7.0).all()), "the query wrote the signal"
        return host_call(st, entry, args)

    monkeypatch.setattr(kernels, "_call", call)
    flips, phases = train(n=DERIVATIVE_EVENTS)
    flips = flips.requires_grad_()  # float32: the query takes the CUDA library's arguments
    d = mrf_description(flips, 0.01, phases_rad=phases)
    t = tissue("cpu", "free", n=DERIVATIVE_VOXELS)
    _, J = engine.jacobian(d, t, ("t1_ms", "t2_ms"), states=32)
    torch.autograd.grad((J.abs() ** 2).sum(), flips)
    signal = engine.simulate(d, t, states=32)
    torch.autograd.grad((signal.abs() ** 2).sum(), flips)
    assert set(answers) == set(kernels._PASSES)
    assert all(v in {RESIDENT_BLOCKS * n for n in VOXELS_A_BLOCK.values()} for v in answers.values()), answers
    if mapping != "auto":
        assert answers["bs_epg_forward"] == RESIDENT_BLOCKS * VOXELS_A_BLOCK[mapping]
    assert card_library.bs_epg_resident_voxels(9, None) == -1
    assert b"pass must be" in card_library.bs_last_error()


@pytest.mark.parametrize("b0", (False, True))
def test_saturation_table_gradients_match_host(b0, mapping, card):
    """Gradients through the semisolid pool's saturation table, a row per voxel (its lineshape at each
    voxel's bound-pool T2 and, with B0, its offset): first order, and the second order's (a Jacobian along
    the bound fraction differentiated along the bound T2). A warp per voxel sums its lanes' shares of each
    event's saturation cotangent where the event forms it (DeviceEventGrad add_table); pools (2, 3) at 10
    orders take the fixed-pool kernels, real and (with B0) complex."""
    def run():
        flips, phases = train(n=DERIVATIVE_EVENTS)
        d = mrf_description(flips, 0.01, phases_rad=phases)
        t = tissue("cpu", "poolb+mt", n=DERIVATIVE_VOXELS, b0=b0)
        t2b = torch.linspace(0.008, 0.016, DERIVATIVE_VOXELS).requires_grad_()
        t = TissueProperties(**{**dict(t.items()), "t2_bound_ms": t2b})
        signal = engine.simulate(d, t, states=10, lineshape="gaussian")  # the super-Lorentzian: no autograd
        first = torch.autograd.grad((signal.abs() ** 2).sum(), t2b)[0]
        _, J = engine.jacobian(d, t, ("bound_fraction",), states=10, lineshape="gaussian")
        second = torch.autograd.grad((J.abs() ** 2).sum(), t2b)[0]
        return first, second

    host, emulated = on_both(card, run)
    assert bool(host[0].abs().amax() > 0) and bool(host[1].abs().amax() > 0)
    assert rel_max_err(emulated[0], host[0]) < 1e-4 and rel_max_err(emulated[1], host[1]) < 1e-3


@pytest.mark.parametrize("b1", ("map", "one value"))
@pytest.mark.parametrize("quadratic", (False, True))
def test_block_decoded_events_match_host(b1, quadratic, mapping, card):
    """Events decoded 64 at a time (five chunks, the last partial, across the repetitions' seam) with the
    pulse formed once where B1 (and its phase) is one value for every voxel."""
    flips, phases = train(n=150, quadratic=quadratic)
    d = mrf_description(flips, 0.01, phases_rad=phases)

    def run():
        t = tissue("cpu", n=VOXELS, b0=quadratic)
        extra = {"b1": torch.linspace(0.7, 1.2, VOXELS) if b1 == "map" else torch.tensor(0.85)}
        if quadratic:
            extra["b1_phase_rad"] = torch.linspace(-0.3, 0.4, VOXELS) if b1 == "map" else torch.tensor(0.2)
        return engine.simulate(d, TissueProperties(**{**dict(t.items()), **extra}), states=32, repetitions=2)

    host, emulated = on_both(card, run)
    assert rel_max_err(emulated, host) < 1e-5


@pytest.mark.parametrize("pools", ("free", "poolb+mt"))
@pytest.mark.parametrize("phased", (False, True))
def test_folded_events_match_host(pools, phased, mapping, card):
    """Events that only sample or only shift folded into the one before (conftest.folding_train: 320 events,
    five chunks), played twice."""
    d = folding_train(phased=phased)
    host, emulated = on_both(card, lambda: engine.simulate(d, tissue("cpu", pools, n=VOXELS), states=32,
                                                           repetitions=2))
    assert rel_max_err(emulated, host) < 1e-5


def test_carried_shifts_and_their_gradients_match_host(mapping, card):
    """conftest.carried_train (shifts and spoilers carried into the next pass, samples with shifts pending),
    played twice: the signal, and the gradients of sum |signal|^2 along T1, T2, M0, B1 and the inversion
    efficiency, each at its own scale."""
    names = ("t1_ms", "t2_ms", "m0", "b1", "inversion_efficiency")
    n = DERIVATIVE_VOXELS

    def run():
        t = tissue("cpu", n=n)
        leaves = {"t1_ms": t.t1_ms.clone().requires_grad_(), "t2_ms": t.t2_ms.clone().requires_grad_(),
                  "m0": torch.linspace(0.5, 1.5, n).requires_grad_(),
                  "b1": torch.linspace(0.8, 1.2, n).requires_grad_(),
                  "inversion_efficiency": torch.linspace(0.85, 1.0, n).requires_grad_()}
        signal = engine.simulate(carried_train(blocks=12), TissueProperties(**leaves), states=32, repetitions=2,
                                 path="real")
        return signal, torch.autograd.grad((signal.abs() ** 2).sum(), [leaves[k] for k in names])

    (host, host_grads), (emulated, emulated_grads) = on_both(card, run)
    assert rel_max_err(emulated, host) < 1e-5
    for name, got, want in zip(names, emulated_grads, host_grads, strict=True):
        assert rel_max_err(got, want) < 1e-4, name


@pytest.mark.parametrize("train_name", ("shots", "staged", "changing TR"))
def test_the_register_kernel_matches_host(train_name, card, monkeypatch):
    """The real register kernel (a thread per voxel, 32 orders): shots run without asking the event what it
    is (conftest.shot_train: shots broken by spoilers, inversions and a pulse without a sample, across
    chunks), samples staged and written 8 at a time (13 a voxel: a full burst and a partial one; 37 voxels:
    a whole warp written across it and a part of one written per thread), and an interval's exponentials
    kept while its length repeats (TRs that repeat, change and come back)."""
    monkeypatch.setenv("BLOCHSIM_CUDA_MAPPING", "thread")
    if train_name == "shots":
        d = shot_train()
    elif train_name == "staged":
        d = mrf_description(train(n=13)[0], 0.01)
    else:
        trs = torch.tensor([10.0, 10, 10, 12, 12, 8, 10, 10, 15, 15, 15, 15] * 2) * 1e-3
        d = mrf_description(train(n=24)[0], trs, inversion_time_s=0.02)
    host, emulated = on_both(card, lambda: engine.simulate(d, tissue("cpu", n=WARP_AND_PART), states=32,
                                                           repetitions=2, path="real"))
    assert rel_max_err(emulated, host) < 1e-5


@pytest.mark.parametrize("n", (1, 31, 33))
def test_odd_voxel_counts(n, mapping, card):
    d = mrf_description(train(n=12)[0], 0.01)
    host, emulated = on_both(card, lambda: engine.simulate(d, tissue("cpu", n=n), states=32))
    assert emulated.shape == (n, 12)
    assert rel_max_err(emulated, host) < 1e-5


# ---- the real plain adjoint's scheme in groups (vjp_plain_lanes_kernel) and on a thread, every stride ----------
#: float32 sums of the same terms in another order (per lane, then over the group and the warp's atomics; the
#: emulation's arithmetic is the host's): first derivatives 1e-5 of each result's largest entry, second 1e-4
#: (one more chain of products).
PLAIN_CASES = ([(train, b1, stride) for train in ("carried", "mrf", "spgr") for b1 in ("per_voxel", "shared")
                for stride in (1, 3, 4, 7, 16)] if FULL else [("mrf", "per_voxel", 4), ("carried", "shared", 4)])


def plain_results(train_name: str, b1: str, stride: int) -> dict:
    """First-order gradients of Re<w, signal> and a Hessian-vector product of sum |signal|^2 along every input
    of test_engine_lanes' train (32 orders, float32, 21 voxels: padding groups in the last warp)."""
    from test_engine_lanes import described, inputs

    x = inputs(train_name, b1)
    leaves = {k: v.float().detach().clone().requires_grad_() for k, v in x.items()}
    description, tissue_, repetitions = described(train_name, leaves)
    signal = engine.simulate(description, tissue_, states=32, repetitions=repetitions, dtype=torch.float32,
                             path="real", checkpoint_stride=stride)
    g = torch.Generator().manual_seed(6)
    w = torch.complex(torch.randn(signal.shape, generator=g), torch.randn(signal.shape, generator=g))
    first = torch.autograd.grad((w.conj() * signal).real.sum(), list(leaves.values()), retain_graph=True)
    power = (signal.real.square() + signal.imag.square()).sum()
    gradient = torch.autograd.grad(power, list(leaves.values()), create_graph=True)
    directions = [torch.randn(d.shape, generator=g) for d in gradient]
    hvp = torch.autograd.grad(sum((d * v).sum() for d, v in zip(gradient, directions, strict=True)),
                              list(leaves.values()))
    return {**{("first", k): v for k, v in zip(leaves, first, strict=True)},
            **{("second", k): v for k, v in zip(leaves, hvp, strict=True)}}


def assert_plain_close(got: dict, want: dict) -> None:
    for key, value in want.items():
        tolerance = 1e-4 if key[0] == "second" else 1e-5
        assert float((got[key] - value).abs().max() / value.abs().max()) < tolerance, key


def adjoint_blocks(first: str, second: str) -> dict:
    """The voxels a block of the first- and second-order adjoints' launches under their mappings."""
    return {"bs_epg_vjp": {VOXELS_A_BLOCK[first]}, "bs_epg_vjp_jvp": {VOXELS_A_BLOCK[second]}}


#: The real plain adjoint's launches at 21 voxels (launch_rules.hpp adjoint_lanes): groups of 8 for both orders
#: unforced; a forced thread's second order in groups of 4 (its dual states do not fit a thread's registers;
#: the query cannot tell those groups from a thread: both hold 32 voxels a block).
PLAIN_ADJOINT_BLOCKS = {"auto": adjoint_blocks("lanes8", "lanes8"), "lanes4": adjoint_blocks("lanes4", "lanes4"),
                        "thread": adjoint_blocks("thread", "lanes4"), "plain16": adjoint_blocks("plain16", "plain16"),
                        "plain32": adjoint_blocks("plain32", "plain32")}


@pytest.mark.parametrize("plain_mapping", ("auto", "lanes4", "thread", "plain16", "plain32"))
@pytest.mark.parametrize(("train_name", "b1", "stride"), PLAIN_CASES)
def test_the_plain_adjoint_matches_host(card, monkeypatch, plain_mapping, train_name, b1, stride):
    """The real plain adjoint (vjp_voxel_plain) in groups of 8 (the launch rules' choice at 21 voxels) and of
    4, 16 and 32 lanes a voxel (a shift's neighbour order across a lane boundary, order 0's lane alone writing
    samples and f0, padding groups kept from writing), and on a thread (registers), at checkpoint strides that cut
    the trains' stretches differently; the second order runs in groups in each (a thread's registers cannot
    hold its dual states)."""
    if plain_mapping != "auto":  # ("plainN": groups of 16 or 32 lanes, 2 orders or 1 a lane)
        force_group(monkeypatch, plain_mapping)
    host, emulated = on_both(card, lambda: plain_results(train_name, b1, stride))
    assert_plain_close(emulated, host)
    launched = {entry: card.voxels_a_block[entry] for entry in ("bs_epg_vjp", "bs_epg_vjp_jvp")}
    assert launched == PLAIN_ADJOINT_BLOCKS[plain_mapping], launched


#: FULL=1 runs every train with B1 a map and one value at more strides.
GENERAL_CASES = ([(train_name, b1, stride) for train_name in ("carried", "mrf", "spgr")
                  for b1 in ("per_voxel", "shared") for stride in (1, 2, 3, 4, 7, 16)]
                 if FULL else GENERAL_FOLD_CASES)


#: The complex path's launches (launch_rules.hpp adjoint_lanes): the first order in groups of 8 unless a warp is
#: forced (BLOCHSIM_CUDA_ADJOINT_LANES leaves it be), the second in the plain layout's groups of 16 by rule.
GENERAL_ADJOINT_BLOCKS = {"auto": adjoint_blocks("lanes8", "plain16"), "warp": adjoint_blocks("warp", "warp"),
                          "plain8": adjoint_blocks("lanes8", "plain8"), "plain16": adjoint_blocks("lanes8", "plain16")}


#: The mappings each case runs in: the rule's ("auto": the second order in groups of 16, so a forced "plain16"
#: launches the same kernels and runs with FULL=1 only), the second order forced to groups of 8, and a warp a
#: voxel at one stride a train. Where a stretch starts is the walks' own code, the same template in a group
#: and a warp (adjoint_lanes over LANES), so the warp's shuffles and sums need no stride of their own; it is
#: the emulated card's slowest mapping (16-30 s a case on CI's two cores).
GENERAL_MAPPING_CASES = [(mapping, *case) for case in GENERAL_CASES
                         for mapping in ("auto", "warp", "plain8", "plain16")
                         if FULL or mapping in ("auto", "plain8") or (mapping == "warp" and case[2] == 2)]


@pytest.mark.parametrize(("general_mapping", "train_name", "b1", "stride"), GENERAL_MAPPING_CASES)
def test_general_adjoint_folds_match_host(card, monkeypatch, general_mapping, train_name, b1, stride):
    """test_cuda.general_fold_gradients on the emulated card (the complex path's adjoints in groups and a warp
    a voxel stepping the folds of their decoded events; "plainN": the second order's in groups of N lanes of
    the plain layout), against the host, each derivative at its own scale (assert_plain_close's)."""
    if general_mapping != "auto":
        force_group(monkeypatch, general_mapping)
    (host, host_grads), (emulated, emulated_grads) = on_both(
        card, lambda: general_fold_gradients("cpu", train_name, b1, stride))
    assert rel_max_err(emulated, host) < 1e-5
    assert_plain_close(emulated_grads, host_grads)
    launched = {entry: card.voxels_a_block[entry] for entry in ("bs_epg_vjp", "bs_epg_vjp_jvp")}
    assert launched == GENERAL_ADJOINT_BLOCKS[general_mapping], launched
    # the double backward's tangents reach the flips and phases: each voxel's own values (vjp_warp_kernel)
    second_order = card.kernels["bs_epg_vjp_jvp"]
    assert "vjp_warp_kernel" in second_order and "vjp_values_kernel" not in second_order, second_order


@pytest.mark.parametrize("lanes", (8, 16))
@pytest.mark.parametrize(("pools", "states"), (("poolb+mt", 10), ("poolb+mt", 32), ("poolb", 32), ("mt", 20)))
def test_the_fixed_pool_group_adjoint_matches_host(card, monkeypatch, pools, states, lanes):
    """The real float adjoint with its pool counts compiled in groups of 8 or 16 lanes
    (BLOCHSIM_CUDA_ADJOINT_LANES: vjp_warp_kernel<float, float, 4 | 2, layout, 8 | 16>, 4 or 2 orders a lane, a
    warp carrying 4 or 2 voxels of 9, the last warp's padding groups writing nothing): gradients along the flips
    and every pool parameter, the saturation table's cotangent summed over each group (add_table) where a
    semisolid pool has one, and the pool tables' own cotangents summed over the group once."""
    monkeypatch.setenv("BLOCHSIM_CUDA_ADJOINT_LANES", str(lanes))

    def run():
        flips, phases = train(n=DERIVATIVE_EVENTS)
        flips = flips.requires_grad_()
        d = mrf_description(flips, 0.01, phases_rad=phases)
        t = tissue("cpu", pools, n=DERIVATIVE_VOXELS)
        given = dict(t.items())  # the case's own properties, per voxel: the pool tables' cotangents
        names = ["t1_ms", "t2_ms", *POOLS[pools]]
        if "bound_fraction" in names:  # the bound pool's T2 acts through the saturation table alone
            given["t2_bound_ms"] = torch.linspace(0.008, 0.016, DERIVATIVE_VOXELS)
            names.append("t2_bound_ms")
        leaves = {name: torch.as_tensor(given[name]).expand(DERIVATIVE_VOXELS).clone().requires_grad_()
                  for name in names}
        t = TissueProperties(**{**dict(t.items()), **leaves})
        signal = engine.simulate(d, t, states=states, lineshape="gaussian")
        grads = torch.autograd.grad((signal.abs() ** 2).sum(), [flips, *leaves.values()], allow_unused=True)
        return dict(zip(["flips", *leaves], grads, strict=True))

    host, emulated = on_both(card, run)
    assert card.voxels_a_block["bs_epg_vjp"] == {VOXELS_A_BLOCK[f"plain{lanes}"]}, card.voxels_a_block
    assert sum(bool(g.abs().amax() > 0) for g in host.values() if g is not None) >= 5, host
    for name, want in host.items():
        got = emulated[name]
        assert (got is None) == (want is None), name
        if want is not None:  # (a pool parameter the signal does not depend on has a zero gradient on both)
            assert (rel_max_err(got, want) < 1e-4 if bool(want.abs().amax() > 0) else bool((got == 0).all())), name


@pytest.mark.parametrize(("pools", "voxels", "forced"),
                         (("poolb+mt", 13, None), ("poolb+mt", 6000, None), ("mt", 6000, None), ("poolb", 6000, None),
                          ("poolb+mt", 6000, "warp")))
def test_the_fixed_pool_first_order_takes_groups_by_rule(card_library, monkeypatch, pools, voxels, forced):
    """The rule's choice for the real float adjoint with its pool counts compiled (launch_rules.hpp
    adjoint_lanes): groups of 16 to kPoolGroupOf16Voxels (3,000) voxels a launch and of 8 past it (where a warp
    a voxel ran to 20,000 voxels a launch and a thread past), the warp where BLOCHSIM_CUDA_MAPPING=warp forces
    it. Asked of the card's launch plan (bs_epg_resident_voxels) for the launches the engine makes, the kernels
    run on the host: emulated, 6,000 voxels take minutes (the groups' arithmetic is held by
    test_the_fixed_pool_group_adjoint_matches_host, and on the card by tests/test_cuda_api.py at 2,000 and
    6,000 tissues)."""
    if forced:
        monkeypatch.setenv("BLOCHSIM_CUDA_MAPPING", forced)
    host_call, asked = kernels._call, {}

    def call(st, entry, args):
        if entry in kernels._PASSES:
            asked.setdefault(entry, set()).add(voxels_a_block_of(card_library, entry, args))
        return host_call(st, entry, args)

    monkeypatch.setattr(kernels, "_call", call)
    flips, phases = train(n=DERIVATIVE_EVENTS)
    flips = flips.requires_grad_()
    signal = engine.simulate(mrf_description(flips, 0.01, phases_rad=phases), tissue("cpu", pools, n=voxels),
                             states=32, lineshape="gaussian")
    (signal.abs() ** 2).sum().backward()
    assert asked["bs_epg_vjp"] == {VOXELS_A_BLOCK[forced or ("plain16" if voxels <= 3000 else "plain8")]}, asked


def test_the_chunk_plan_asks_the_library(card_library):
    """benchmarks/chunk_plan.py: the launches the chunker makes of the pooled gradient at 20k tissues on an H100
    (4,224 voxels a wave of the fixed pools' groups of 8, launch_rules.hpp adjoint_lanes), from the library's
    scratch without a card: the least-scratch stride (21 events, 31 KiB a voxel where the given stride of 4
    keeps 73) puts one wave under the 128 MiB cap, five launches; the card's peak, 154.3 MiB
    (benchmarks/results/api_cases-NVIDIA_H100_80GB_HBM3-2026-12-07-3479d9a.json), is that scratch and the
    call's arrays. A change of the store or the cap that moves the launches fails here, before a card."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import chunk_plan

    (row,) = chunk_plan.plan("pooled_grad", 20000, card_library, wave=4224)
    assert row["pass"] == "bs_epg_vjp" and row["voxels"] == 20000, row
    assert (row["given_stride"], row["stride"]) == (4, 21), row
    assert row["kib_a_voxel"] < 0.5 * row["kib_a_voxel_given"], row
    assert (row["launch_voxels"], row["launches"]) == (4224, 5), row


@pytest.mark.skipif(not FULL, reason="FULL=1")
@pytest.mark.parametrize("case", ("epg_real_grad", "epg_real_hvp"))
def test_the_benchmark_cases_match_host(card, case):
    """benchmarks/api_cases.py's real gradient and HVP (500 flips), 3 tissues."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import api_cases

    call = api_cases.case_fn(case, 3, torch.device("cpu"))
    order = "second" if case.endswith("hvp") else "first"
    host, emulated = on_both(card, call)
    assert_plain_close({(order, "flips"): emulated}, {(order, "flips"): host})


if __name__ == "__main__":  # python3 tests/test_cuda_on_host.py build DIR
    if sys.argv[1:2] != ["build"] or len(sys.argv) != 3:
        sys.exit("usage: python3 tests/test_cuda_on_host.py build DIR")
    print(build(Path(sys.argv[2])))
