"""Execution placement on the host: policies, voxel chunking, the out-of-memory retry, progress, host scratch.

Every pass (forward, JVP, VJP, VJP-JVP) runs here under a budget of a few kilobytes, so that a call of 37
voxels is cut into chunks of a few voxels, and is compared with the same call run whole. Each voxel's
arithmetic does not depend on which chunk it is in, so signals, Jacobians and tissue gradients are bitwise
equal. Protocol (event) gradients are sums over voxels: the host library sums its 16-voxel blocks in
float64 and rounds the total to float32 once per call, so a chunked call rounds once per chunk and adds the
rounded sums in float64 (engine.chunks). That is the exact difference, and `_protocol_bound` states it.
"""

from __future__ import annotations

import math
import os
import sys
import types
import warnings

import numpy as np
import pytest
import torch

import blochsim
from blochsim import _execution, engine
from blochsim.engine import chunks
from blochsim.engine import kernels as K
from blochsim.sequence import TissueProperties, mrf_description
from blochsim.simulators import MRFSimulator

V = 37  # voxels: odd, so the last chunk is short
REPS = 30
STATES = 8
TINY = 2500  # bytes: chunks of a few voxels for every pass below
POOLED = dict(pool_b_fraction=0.15, pool_b_exchange_hz=10.0, t1_pool_b_ms=500.0, t2_pool_b_ms=20.0,
              bound_fraction=0.1, bound_exchange_hz=4.3, t1_bound_ms=1000.0)
KINDS = ("real", "complex", "pooled")


def _tissue(kind: str, *, voxels: int = V) -> TissueProperties:
    g = torch.Generator().manual_seed(1)
    t1 = torch.rand(voxels, generator=g) * 2000 + 300
    t2 = torch.rand(voxels, generator=g) * 100 + 20
    extra = {}
    if kind == "complex":
        extra = dict(b0_hz=torch.rand(voxels, generator=g) * 20 - 10)
    elif kind == "pooled":
        extra = POOLED
    return TissueProperties(t1_ms=t1, t2_ms=t2, **extra)


def _flips(requires_grad: bool = False) -> torch.Tensor:
    flips = torch.deg2rad(torch.linspace(5, 60, REPS, dtype=torch.float64))
    return flips.requires_grad_() if requires_grad else flips


@pytest.fixture
def calls(monkeypatch):
    """The kernel calls of a test: (entry, first voxel, voxels) each, the first voxel read from where the
    chunk's T1 pointer lies in the whole call's T1 buffer."""
    seen = []
    real = K._call

    def recording(st, entry, args):
        seen.append((entry, args.tissue.data[0], st.num_voxels))
        real(st, entry, args)

    monkeypatch.setattr(K, "_call", recording)
    return seen


def _protocol_bound(chunk_grads: list) -> float:
    """|chunked - whole| for a protocol gradient: each chunk's sum is rounded to float32 (at most 2^-24 of its
    size), and the float64 total is rounded once more, as the whole call's is (one float32 ulp, 2^-23 of it)."""
    total = sum(g.double().abs() for g in chunk_grads)
    return total * 2.0**-24 + sum(chunk_grads).double().abs() * 2.0**-23


def _flip_shares(monkeypatch, run) -> list:
    """The kernels' flip gradients (one per event) each kernel call of `run()` returns (the VJP's, the VJP-JVP's
    tangent), as float64: the shares autograd adds into a second-order result."""
    shares, vjp, vjp_jvp = [], K.vjp, K.vjp_jvp

    def first(*args, **kwargs):
        out = vjp(*args, **kwargs)
        shares.append(out[2])
        return out

    def second(*args, **kwargs):
        out = vjp_jvp(*args, **kwargs)
        shares.append(out[1][2])
        return out

    with monkeypatch.context() as m:
        m.setattr(K, "vjp", first)
        m.setattr(K, "vjp_jvp", second)
        run()
    return [x.double() for x in shares if x is not None]


def _event_flips(monkeypatch, tissue: TissueProperties) -> torch.Tensor:
    """|d kernel flip / d flip|, [events, REPS]: how the kernels' per-event flips come from `_flips()`."""
    flips, seen, forward = _flips(requires_grad=True), [], K.forward

    def recording(st, inputs):
        seen.append(inputs[2])
        return forward(st, inputs)

    with monkeypatch.context() as m:
        m.setattr(K, "forward", recording)
        engine.simulate(mrf_description(flips, 0.01), tissue, states=STATES)
    events = seen[0]
    rows = [torch.autograd.grad(events[e], flips, retain_graph=True, allow_unused=True)[0]
            for e in range(events.numel())]
    return torch.stack([torch.zeros_like(flips) if r is None else r for r in rows]).abs()


# -- results do not depend on chunking -------------------------------------------------------------
@pytest.mark.parametrize("kind", KINDS)
def test_forward_and_jacobian_chunked_bitwise(kind, calls):
    description = mrf_description(_flips(), 0.01)
    tissue = _tissue(kind)
    signal = engine.simulate(description, tissue, states=STATES)
    sig_j, jac = engine.jacobian(description, tissue, ("t1_ms", "t2_ms"), states=STATES)
    whole_calls = len(calls)
    with blochsim.execution(budget_bytes=TINY):
        chunked = engine.simulate(description, tissue, states=STATES)
        chunked_j, chunked_jac = engine.jacobian(description, tissue, ("t1_ms", "t2_ms"), states=STATES)
    assert len(calls) - whole_calls > 6, "the budget should cut both calls into several chunks"
    assert torch.equal(chunked, signal)
    assert torch.equal(chunked_j, sig_j)
    assert torch.equal(chunked_jac, jac)


def _first_order(tissue: TissueProperties) -> tuple:
    """(flip gradient, T1 gradient) of sum |signal|^2: the VJP."""
    flips = _flips(requires_grad=True)
    t1 = tissue.t1_ms.clone().requires_grad_()
    signal = engine.simulate(mrf_description(flips, 0.01), _with(tissue, t1_ms=t1), states=STATES)
    return torch.autograd.grad((signal.abs() ** 2).sum(), (flips, t1))


def _hvp(tissue: TissueProperties) -> tuple:
    """A Hessian-vector product by double backward: the VJP-JVP through EpgVjp's backward."""
    flips = _flips(requires_grad=True)
    t1 = tissue.t1_ms.clone().requires_grad_()
    signal = engine.simulate(mrf_description(flips, 0.01), _with(tissue, t1_ms=t1), states=STATES)
    g_flip, g_t1 = torch.autograd.grad((signal.abs() ** 2).sum(), (flips, t1), create_graph=True)
    cost = (g_flip * torch.linspace(-1, 1, REPS, dtype=g_flip.dtype)).sum() + g_t1.sum()
    return torch.autograd.grad(cost, (flips, t1))


def _jacobian_cost(tissue: TissueProperties) -> tuple:
    """The gradient of a cost of the (T1, T2) Jacobian: the VJP-JVP through EpgJacobian's backward."""
    flips = _flips(requires_grad=True)
    t1 = tissue.t1_ms.clone().requires_grad_()
    _, jac = engine.jacobian(mrf_description(flips, 0.01), _with(tissue, t1_ms=t1), ("t1_ms", "t2_ms"),
                             states=STATES)
    return torch.autograd.grad((jac.abs() ** 2).sum(), (flips, t1))


def _with(tissue: TissueProperties, **fields) -> TissueProperties:
    return TissueProperties(**{**dict(tissue.items()), **fields})


def _voxels(tissue: TissueProperties, lo: int, n: int) -> TissueProperties:
    """The tissue of voxels [lo, lo + n) (per-voxel fields sliced, shared ones kept)."""
    return _with(tissue, **{k: v[lo:lo + n] for k, v in tissue.items() if isinstance(v, torch.Tensor)
                            and v.numel() == tissue.t1_ms.numel()})


def _whole_and_chunked(derivative, tissue, entry, calls, monkeypatch) -> tuple:
    """derivative(tissue) whole, then with every pass given 1000 bytes a voxel and 20,000 bytes (chunks of 16
    voxels), and the (first T1 address, voxels) of each chunked call of `entry`."""
    whole = derivative(tissue)
    start = len(calls)
    monkeypatch.setattr(K, "_per_voxel_bytes", lambda V, arrays: 1000)
    with blochsim.execution(budget_bytes=20_000):
        chunked = derivative(tissue)
    return whole, chunked, [(first, n) for e, first, n in calls[start:] if e == entry]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(("derivative", "entry"), [(_first_order, "bs_epg_vjp"), (_hvp, "bs_epg_vjp_jvp"),
                                                   (_jacobian_cost, "bs_epg_vjp_jvp")])
def test_derivatives_chunked(kind, derivative, entry, calls, monkeypatch):
    """Gradients, HVPs and Jacobian costs, chunked against whole: tissue parts bitwise; protocol parts exactly
    the float64 sum of each chunk's own float32 result (the same voxels run as a whole call: the chunks are
    cut at the host's 16-voxel blocks, so each sums the blocks the whole call sums), within `_protocol_bound`
    of the whole call's. Every pass is given 1000 bytes a voxel and 20,000 bytes: chunks of 16 voxels."""
    if derivative is _jacobian_cost:  # its two columns as two runs of the pass, which the spans below read
        monkeypatch.setattr(K, "directions_in_one_call", lambda *args: False)
    tissue = _tissue(kind, voxels=83)
    (w_flip, w_t1), (c_flip, c_t1), spans = _whole_and_chunked(derivative, tissue, entry, calls, monkeypatch)
    assert len(spans) > 4 and all(n == 16 for _, n in spans[:5])
    assert torch.equal(c_t1, w_t1)
    base, ranges, starts = spans[0][0], [], set()
    for first, n in spans:  # one run of the pass over the voxels covers them once; the Jacobian's runs P = 2
        lo = (first - base) // 4  # float32 T1 entries
        if lo in starts:
            break
        starts.add(lo)
        ranges.append((lo, n))
    assert sum(n for _, n in ranges) == 83
    parts = [derivative(_voxels(tissue, lo, n))[0].float() for lo, n in ranges]
    if kind != "pooled" and derivative is _first_order:
        assert torch.equal(c_flip.float(), sum(p.double() for p in parts).float())
        assert ((c_flip - w_flip).abs() <= _protocol_bound(parts)).all()
    elif derivative is _first_order:
        # Two shares, each rounded per chunk, meet here: with MT the flips reach the saturation table too,
        # whose per-voxel gradient the chunked call folds whole while each part folded its own voxels. Each
        # share is bounded as above at the size of the parts it makes up, and a share may be up to that size
        # again with the other sign: a factor 4.
        assert ((c_flip - w_flip).abs() <= 4 * _protocol_bound(parts)).all()
    else:
        # An HVP adds the VJP-JVP's share to the VJP's (through the cotangent, which depends on the flips), a
        # Jacobian cost its two columns' VJP-JVPs: each share is rounded per chunk (`_protocol_bound` at the
        # share's own size, which may be far above the result's: on the lanes, 55 and -69 meet in a flip
        # entry of -1.3), and autograd's float32 sum of the shares rounds once more (2^-24 of their size),
        # differently for the chunked and the whole call.
        # Autograd adds the shares per event, in float32, and carries the sum to the flips (`_event_flips`),
        # rounding again: 2^-23 of the shares' size for both.
        shares = [_flip_shares(monkeypatch, lambda lo=lo, n=n: derivative(_voxels(tissue, lo, n)))
                  for lo, n in ranges]
        per_event = sum(_protocol_bound(list(chunks)) for chunks in zip(*shares, strict=True))
        per_event = per_event + 2.0**-23 * sum(sum(chunks).abs() for chunks in zip(*shares, strict=True))
        bound = per_event @ _event_flips(monkeypatch, tissue).double()
        assert ((c_flip - w_flip).abs() <= bound).all()


@pytest.mark.parametrize("kind", KINDS)
def test_a_jacobian_cost_in_one_call_chunked(kind, calls, monkeypatch):
    """A Jacobian cost's two columns as one call over two copies of the voxels (kernels.vjp_jvp_directions),
    chunked in 16-voxel chunks that cut across the copies, against the same call whole: the T1 gradient bitwise
    (each voxel's copies are summed in the same order), the flip gradient within float32 rounding of the
    chunks' sums (1e-5 of its largest entry)."""
    (w_flip, w_t1), (c_flip, c_t1), spans = _whole_and_chunked(_jacobian_cost, _tissue(kind, voxels=83),
                                                                "bs_epg_vjp_jvp", calls, monkeypatch)
    spans = [n for _, n in spans]
    assert sum(spans) == 2 * 83 and len(spans) > 6  # (pool tables run a direction a call: 83 twice)
    assert torch.equal(c_t1, w_t1)
    assert float((c_flip - w_flip).abs().max() / w_flip.abs().max()) < 1e-5


def test_simulator_execution_setting_per_call_and_per_simulator(calls):
    flips = torch.linspace(5, 60, REPS)
    t1 = torch.rand(V, generator=torch.Generator().manual_seed(4)) * 2000 + 300
    whole = MRFSimulator(flip=flips, TR=10.0, states=STATES).simulate(T1=t1, T2=60.0)
    assert len(calls) == 1
    per_call = MRFSimulator(flip=flips, TR=10.0, states=STATES).simulate(
        T1=t1, T2=60.0, execution=blochsim.execution(budget_bytes=TINY))
    per_sim = MRFSimulator(flip=flips, TR=10.0, states=STATES,
                           execution=blochsim.execution(budget_bytes=TINY)).simulate(T1=t1, T2=60.0)
    assert len(calls) > 7
    assert torch.equal(per_call, whole) and torch.equal(per_sim, whole)
    # A call's setting wins over the block around it: execution="auto" here runs whole.
    count = len(calls)
    with blochsim.execution(budget_bytes=TINY):
        MRFSimulator(flip=flips, TR=10.0, states=STATES).simulate(T1=t1, T2=60.0, execution="auto")
    assert len(calls) == count + 1


def test_backward_keeps_the_policy_of_its_forward(calls):
    flips = _flips(requires_grad=True)
    with blochsim.execution(budget_bytes=TINY):
        signal = engine.simulate(mrf_description(flips, 0.01), _tissue("real"), states=STATES)
    start = len(calls)
    (signal.abs() ** 2).sum().backward()  # outside the block
    assert sum(entry == "bs_epg_vjp" for entry, _, _ in calls[start:]) > 3


def test_cpu_target_and_empty_calls():
    description = mrf_description(_flips(), 0.01)
    with blochsim.execution("cpu", budget_bytes=TINY):
        assert torch.equal(engine.simulate(description, _tissue("real"), states=STATES),
                           engine.simulate(description, _tissue("real"), states=STATES, path="auto"))
    empty = TissueProperties(t1_ms=torch.zeros(0) + 1000.0, t2_ms=torch.zeros(0) + 50.0)
    with blochsim.execution(budget_bytes=TINY):
        assert engine.simulate(description, empty, states=STATES).shape == (0, REPS)


# -- the byte model --------------------------------------------------------------------------------
def test_chunk_size_from_the_byte_model():
    def scratch(c):  # a scratch of 1000 bytes a voxel plus a fixed 4096, padded to 32 voxels
        return 1000 * (-(-c // 32) * 32) + 4096

    with blochsim.execution(budget_bytes=200_000):
        runner = chunks.Runner(torch.device("cpu"), 10_000, "test")
        c = runner.chunk(120, scratch)
    assert scratch(c) + 120 * c <= 200_000
    largest = max(n for n in range(1, 400) if scratch(n) + 120 * n <= 200_000)
    assert c >= 0.9 * (10_000 / math.ceil(10_000 / largest))  # chunks of nearly equal size, as few as fit
    with blochsim.execution(budget_bytes=1000):
        with pytest.raises(ValueError, match=r"budget_bytes: one voxel of this test needs 36216 bytes \(scratch 36096"):
            chunks.Runner(torch.device("cpu"), 10, "test").chunk(120, scratch)
    with blochsim.execution(budget_bytes=200_000, stream=False):
        with pytest.raises(RuntimeError, match="stream=False.*10000 voxels whole"):
            chunks.Runner(torch.device("cpu"), 10_000, "test").chunk(120, scratch)


def test_chunks_are_cut_in_whole_waves_of_their_kernel(monkeypatch):
    """On a card a launch of more voxels than its kernel keeps resident runs in waves, each as long as a full
    one: the chunk the byte model allows (about 2,500 voxels here) is cut to whole waves of the kernel's
    resident voxels (1,584: 1,536 aligned to blocks of 128), and left as it is where the kernel keeps more
    than it, where the library cannot tell (0), where the smaller launch takes another kernel, or with the
    rule off. The device is a name here: nothing runs."""
    per_voxel, budget = 1000, 2_500_000

    def planned(resident):
        with blochsim.execution(budget_bytes=budget):
            runner = chunks.Runner(torch.device("cpu"), 20_000, "test")
            runner.device = torch.device("cuda", 0)  # as an execution policy places the call on a card
            return runner.chunk(per_voxel, lambda c: 0, resident)

    cut = planned(None)
    assert 2_300 <= cut <= 2_500 and cut % 128 == 0
    assert planned(lambda c: 1_584) == 1_536  # one wave, less its part of a block
    assert planned(lambda c: 1_000) == 1_920  # two waves
    assert planned(lambda c: 4_000) == cut  # more resident than the chunk: one wave already
    assert planned(lambda c: 0) == cut
    assert planned(lambda c: 1_584 if c > 2_000 else 700) == cut  # another kernel at the smaller launch
    monkeypatch.setattr(chunks, "WHOLE_WAVES", False)
    assert planned(lambda c: 1_584) == cut


def test_a_chunk_under_the_scratch_cap_is_stretched_to_one_wave(monkeypatch):
    """Without a budget, a chunk the scratch cap holds to most of a wave (about 9,900 voxels of a kernel that
    keeps 12,000 resident) takes the whole wave where its scratch is within the pass's factor of the cap
    (11,904: aligned to blocks; the second order's factor 4/3), or the whole call where it is under a wave;
    not where the wave needs more than that (14,000 at 4/3; at the first order's factor of 2, 19,000 fits and
    21,000 does not), where the larger launch takes another kernel, under a budget the caller gave, nor for
    a pass that does not ask. The device is a name here."""
    monkeypatch.setattr(_execution, "cuda_free_bytes", lambda device: 80 * 2**30)
    card, cap = torch.device("cuda", 0), _execution.DEFAULT_SCRATCH_BYTES
    second, first = K._FILL_WAVE["bs_epg_vjp_jvp"], K._FILL_WAVE["bs_epg_vjp"]
    assert (second, first) == (4 / 3, 2.0)

    def planned(V, resident, budget=None, fill_wave=second):
        with blochsim.execution(budget_bytes=budget):
            runner = chunks.Runner(card, V, "test")
            return runner.chunk(64, lambda c: cap * c // 10_000, resident, fill_wave=fill_wave)

    base = planned(1_000_000, None)  # the cap's chunk: about 10,000 voxels
    assert 9_800 <= base <= 10_000 and base % 128 == 0
    assert planned(1_000_000, lambda c: 12_000) == 11_904
    assert planned(11_000, lambda c: 12_000) == 11_000  # under a wave: whole
    assert planned(1_000_000, lambda c: 14_000) == base
    assert planned(1_000_000, lambda c: 19_000, fill_wave=first) == 18_944
    assert planned(1_000_000, lambda c: 21_000, fill_wave=first) == base
    assert planned(1_000_000, lambda c: 12_000 if c < 10_000 else 20_000) == base
    budget = cap + 64 * 10_000  # the same chunk, from a budget: never stretched
    assert planned(1_000_000, lambda c: 12_000, budget=budget) <= 10_000
    with blochsim.execution():  # a pass that does not ask (the adjoints do: kernels._FILL_WAVE)
        assert chunks.Runner(card, 1_000_000, "test").chunk(64, lambda c: cap * c // 10_000, lambda c: 12_000) == base


def test_a_call_on_its_own_card_reads_free_memory_only_past_its_scratch_cap(monkeypatch):
    """Without a budget, a call whose tensors are on the card it runs on runs whole, asking the driver nothing,
    while its scratch is under the cap, however large its arrays (already allocated; a whole call allocates
    nothing else); staged from the host, only a small one does (its copies are allocated per chunk). Past the
    cap both read the free memory and are cut. The device is a name here: nothing runs."""
    reads = []
    monkeypatch.setattr(_execution, "cuda_free_bytes", lambda device: reads.append(device) or 80 * 2**30)
    card, V, per_voxel = torch.device("cuda", 0), 1_000_000, 4000  # 4 GB of arrays
    cap = _execution.DEFAULT_SCRATCH_BYTES
    small, large = (lambda c: 64 * c), (lambda c: 4 * cap * c // V)

    def planned(home, scratch):
        runner = chunks.Runner(home, V, "test")
        runner.device = card  # as an execution policy places a host call on the card
        reads.clear()
        return runner.chunk(per_voxel, scratch), len(reads)

    assert planned(card, small) == (V, 0)
    assert planned(torch.device("cpu"), small) == (V, 1)
    chunk, count = planned(card, large)
    assert count == 1 and large(chunk) <= cap < large(2 * chunk)


def test_an_adjoint_may_hold_as_much_scratch_as_its_own_arrays():
    """Without a budget a call's device scratch is held to a fixed cap (128 MiB; for the second order 256 MiB,
    a wave of its plain groups, and 96 MiB with pool tables), or for an adjoint to twice the bytes of its own
    per-voxel arrays (with pool tables and for the second order: once) where those are more (the cotangent,
    the size of the signal, is most of them): the caller holds that much already."""
    mib = 2**20
    assert _execution.default_scratch_bytes("bs_epg_vjp", 10 * mib) == 128 * mib
    assert _execution.default_scratch_bytes("bs_epg_vjp", 100 * mib) == 200 * mib
    assert _execution.default_scratch_bytes("bs_epg_vjp", 400 * mib) == 800 * mib
    assert _execution.default_scratch_bytes("bs_epg_vjp", 400 * mib, pool_tables=True) == 400 * mib
    assert _execution.default_scratch_bytes("bs_epg_vjp_jvp", 50 * mib) == 256 * mib
    assert _execution.default_scratch_bytes("bs_epg_vjp_jvp", 50 * mib, pool_tables=True) == 96 * mib
    assert _execution.default_scratch_bytes("bs_epg_vjp_jvp", 900 * mib) == 900 * mib
    for entry in ("bs_epg_forward", "bs_epg_jvp"):  # no cotangent: the fixed cap
        assert _execution.default_scratch_bytes(entry, 900 * mib) == 128 * mib


def test_a_gradient_hands_its_arrays_bytes_to_the_scratch_cap(monkeypatch):
    """The adjoint's cap is computed from the call's own arrays where a plan is made (a budget): the cotangent
    (V x samples complex64) and the per-voxel tissue and gradient arrays, those no more than twice the
    cotangent here; twice their bytes without pool tables, once with them."""
    caps = {}
    real_chunk = chunks.Runner.chunk

    def chunk(self, per_voxel_bytes, scratch=None, resident=None, fill_wave=False):
        caps[self.label] = self.scratch_cap_bytes
        return real_chunk(self, per_voxel_bytes, scratch, resident, fill_wave)

    monkeypatch.setattr(chunks.Runner, "chunk", chunk)
    monkeypatch.setattr(_execution, "DEFAULT_SCRATCH_BYTES", 1)  # the arrays' bytes then decide
    cotangent_bytes = V * REPS * 8
    for kind, times in (("real", 2), ("pooled", 1)):
        caps.clear()
        flips = _flips(requires_grad=True)
        with blochsim.execution(budget_bytes=2**30):
            signal = engine.simulate(mrf_description(flips, 0.01), _tissue(kind), states=STATES)
            (signal.abs() ** 2).sum().backward()
        assert caps["forward"] == 1
        assert times * cotangent_bytes <= caps["gradient"] <= 2 * times * cotangent_bytes, (kind, caps)


def test_least_scratch_stride_and_results_independent_of_it():
    n = 1500
    assert chunks.least_scratch_stride(n, 4, lambda s: s + -(-n // s)) == round(math.sqrt(n))
    assert chunks.least_scratch_stride(n, 4, lambda s: 2 * s + -(-n // s)) == round(math.sqrt(n / 2))
    # The replay from a checkpoint repeats the forward's arithmetic: any stride gives the same gradient.
    grads = []
    for stride in (4, 9, 1):
        flips = _flips(requires_grad=True)
        signal = engine.simulate(mrf_description(flips, 0.01), _tissue("pooled"), states=STATES,
                                 checkpoint_stride=stride)
        grads.append(torch.autograd.grad((signal.abs() ** 2).sum(), flips)[0])
    assert torch.equal(grads[0], grads[1]) and torch.equal(grads[0], grads[2])


def test_an_adjoint_over_its_scratch_cap_takes_the_least_scratch_stride_before_reading_free_memory(monkeypatch):
    """On a card without a budget, an adjoint whose whole call's scratch at the given stride is over the cap
    takes the least-scratch stride first: a call that fits whole at that stride reads no free memory (a driver
    call and the allocator's statistics), and one that does not is cut once, at the stride the search after a
    cut at the given stride took before. The library's scratch is a model here (checkpoints and replay slots
    a voxel), the device a name: nothing runs."""
    reads = []
    monkeypatch.setattr(_execution, "cuda_free_bytes", lambda device: reads.append(device) or 80 * 2**30)
    events, state_bytes = 1501, 33 * 3 * 4

    def scratch(c, stride):  # checkpoints (events / stride) and the stretch's slots (about a third of it)
        return c * state_bytes * (-(-events // stride) + max(1, stride // 3))

    st = types.SimpleNamespace(num_voxels=0, num_events=events, num_repetitions=1)
    for V, whole in ((2000, True), (100_000, False)):
        st.num_voxels = V
        stride = chunks.least_scratch_stride(events, 4, lambda s, V=V: scratch(V, s))
        assert scratch(V, 4) > _execution.DEFAULT_SCRATCH_BYTES >= scratch(2000, stride)
        reads.clear()
        plan = types.SimpleNamespace(runner=chunks.Runner(torch.device("cuda", 0), V, "gradient"), stride=4)
        chunk = K._Placed._plan(plan, st, "bs_epg_vjp", 4000, scratch)
        assert plan.stride == stride, (V, plan.stride, stride)
        assert (chunk == V) == whole and len(reads) == (0 if whole else 1), (V, chunk, reads)
        assert scratch(chunk, stride) <= _execution.DEFAULT_SCRATCH_BYTES
    # Under a budget the given stride is kept where the whole call fits it.
    with blochsim.execution(budget_bytes=2**40):
        plan = types.SimpleNamespace(runner=chunks.Runner(torch.device("cuda", 0), 2000, "gradient"), stride=4)
        st.num_voxels = 2000
        assert K._Placed._plan(plan, st, "bs_epg_vjp", 4000, scratch) == 2000 and plan.stride == 4


def test_replay_slots_count_the_passes_of_each_stretch():
    """The real plain adjoint's store keeps a state per event that touches the states (relax, rotate, invert),
    not per event: program.replay_slots counts the most in a stretch, the stretches starting at multiples of
    the stride over every repetition's events (held here to a count event by event)."""
    from blochsim import _native as nat
    from blochsim.engine.program import replay_slots

    rng = np.random.default_rng(3)
    touching = (nat.INTERVAL, nat.ROTATE, nat.INVERSION, nat.INTERVAL | nat.ROTATE)
    idle = (0, nat.RECORD, nat.CRUSH_AFTER, nat.SHIFT_AFTER | nat.RECORD)
    for _ in range(30):
        E, reps, stride = int(rng.integers(1, 12)), int(rng.integers(1, 4)), int(rng.integers(1, 15))
        action = np.array([rng.choice(touching if rng.random() < 0.4 else idle) for _ in range(E)], np.int32)
        unrolled = [int(a & (nat.INTERVAL | nat.ROTATE | nat.INVERSION) != 0) for _ in range(reps) for a in action]
        most = max(sum(unrolled[i : i + stride]) for i in range(0, len(unrolled), stride))
        assert replay_slots(action, reps, stride) == max(1, most), (action, reps, stride)
    # The MRF train: an inversion, then a pulse, a sample and a crusher per TR (a third of its events touch).
    mrf = mrf_description(_flips(), 0.01)
    program = engine.compile_program(mrf, states=STATES)
    assert replay_slots(program.action, 1, 60) <= 21


def test_too_few_replay_slots_are_refused(monkeypatch):
    """A store sized for fewer slots than a stretch writes would overwrite its checkpoints: the library refuses
    it (host arrays; on a card the counts come from the same function), naming the stretch."""
    from blochsim.engine import program

    monkeypatch.setattr(program, "replay_slots", lambda action, reps, stride: 1)
    monkeypatch.setattr(program, "_SLOTS", torch.utils.weak.WeakIdKeyDictionary())  # counted afresh
    flips = _flips(requires_grad=True)
    signal = engine.simulate(mrf_description(flips, 0.01), _tissue(""), states=STATES, checkpoint_stride=9)
    with pytest.raises(RuntimeError, match="checkpoint_slots 1 is fewer than the [0-9]+ events that touch the "
                                           "states in the stretch from event 0"):
        torch.autograd.grad((signal.abs() ** 2).sum(), flips)


# -- policies --------------------------------------------------------------------------------------
def test_policies_nest_and_restore():
    assert _execution.active().target == "auto"
    with blochsim.execution("cpu", budget_bytes=1 << 20) as outer:
        assert _execution.active() is outer
        with blochsim.sequence.offload(("cuda:0", "cuda:1"), budget_bytes=1 << 22, lanes=2) as inner:
            assert _execution.active() is inner
            assert inner.target == (torch.device("cuda", 0), torch.device("cuda", 1)) and inner.offload
            with pytest.raises(KeyError):
                with outer:  # a policy object may be entered again, nested
                    assert _execution.active() is outer
                    raise KeyError("leaves through an exception")
            assert _execution.active() is inner
        assert _execution.active() is outer
    assert _execution.active().target == "auto"
    assert blochsim.execution is blochsim.sequence.execution and blochsim.offload is blochsim.sequence.offload


@pytest.mark.parametrize(("call", "match"), [
    (lambda: blochsim.execution(target=[]), "target must name at least one CUDA device"),
    (lambda: blochsim.execution(target=["cuda:0", "cpu"]), "target must list CUDA devices only.*; entry 1 is 'cpu'"),
    (lambda: blochsim.execution(target="tpu"), "target must list CUDA devices only.*; entry 0 is 'tpu'"),
    (lambda: blochsim.execution(budget_bytes=0), "budget_bytes must be a positive integer or None, got 0"),
    (lambda: blochsim.execution(budget_bytes=-5), "budget_bytes must be a positive integer"),
    (lambda: blochsim.execution(budget_bytes=1.5e9), "budget_bytes must be a positive integer"),
    (lambda: blochsim.execution(lanes=0), "lanes must be a positive integer, got 0"),
    (lambda: blochsim.execution(reserve_bytes=-1), "reserve_bytes must be an integer >= 0"),
    (lambda: blochsim.execution(stream="yes"), "stream must be None, True or False"),
    (lambda: blochsim.execution(progress=1), "progress must be None, True or False"),
    (lambda: blochsim.offload(devices=()), "devices must name at least one CUDA device"),
    (lambda: blochsim.offload(devices=["cpu"]), "devices must list CUDA devices only.*; entry 0 is 'cpu'"),
    (lambda: blochsim.offload(budget_bytes=0), "budget_bytes must be a positive integer, got 0"),
    (lambda: blochsim.offload(lanes=-2), "lanes must be a positive integer"),
    (lambda: MRFSimulator(flip=[10.0], TR=10.0, execution=[]), "execution must name at least one CUDA device"),
    (lambda: MRFSimulator(flip=[10.0], TR=10.0).simulate(T1=1.0, T2=1.0, execution=["cpu"]),
     "execution must list CUDA devices only.*; entry 0 is 'cpu'.*'auto', 'cpu'"),
])
def test_bad_arguments(call, match):
    with pytest.raises(ValueError, match=match):
        call()


# -- CUDA out of memory ----------------------------------------------------------------------------
def test_out_of_memory_retries_smaller_chunks(monkeypatch):
    """A fake CUDA out-of-memory error for chunks past 8 voxels, from the second kernel call on: the first
    chunk's work is kept, the failing chunk runs again in halves, later chunks keep the smaller size, and one
    warning names it."""
    real = K._call
    done = []  # (first voxel, voxels) of each successful call
    attempts = []

    def failing(st, entry, args):
        attempts.append(st.num_voxels)
        if len(attempts) > 1 and st.num_voxels > 8:
            torch.empty(1 << 16)  # an allocation made before the failure is released with it
            raise torch.cuda.OutOfMemoryError("CUDA out of memory (injected)")
        real(st, entry, args)
        done.append((args.tissue.data[0], st.num_voxels))

    description = mrf_description(_flips(), 0.01)
    tissue = _tissue("real")
    whole = engine.simulate(description, tissue, states=STATES)
    monkeypatch.setattr(K, "_call", failing)
    monkeypatch.setattr(K, "_per_voxel_bytes", lambda V, arrays: 1000)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with blochsim.execution(budget_bytes=16_000):  # at 1000 bytes a voxel: chunks of 16 voxels
            chunked = engine.simulate(description, tissue, states=STATES)
    assert torch.equal(chunked, whole)
    ours = [w for w in caught if issubclass(w.category, ResourceWarning)]
    assert len(ours) == 1 and "chunk of 16 voxels" in str(ours[0].message) \
        and "chunks of 8 voxels" in str(ours[0].message)
    base = done[0][0]
    spans = [((first - base) // 4, n) for first, n in done]
    assert spans[0] == (0, 16)  # kept, not run again
    assert sorted(v for lo, n in spans for v in range(lo, lo + n)) == list(range(V))  # every voxel once
    assert attempts[1] == 16 and attempts[2] == 8


def test_out_of_memory_on_one_voxel_is_raised(monkeypatch):
    def failing(st, entry, args):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory (injected)")

    monkeypatch.setattr(K, "_call", failing)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        with pytest.raises(torch.cuda.OutOfMemoryError, match="injected"):
            engine.simulate(mrf_description(_flips(), 0.01), _tissue("real"), states=STATES)


# -- progress --------------------------------------------------------------------------------------
@pytest.fixture
def fake_tqdm(monkeypatch):
    bars = []

    class Bar:
        def __init__(self, **kwargs):
            self.kwargs, self.done, self.closed = kwargs, 0, False
            bars.append(self)

        def update(self, n):
            self.done += n

        def close(self):
            self.closed = True

    module = types.ModuleType("tqdm.auto")
    module.tqdm = Bar
    monkeypatch.setitem(sys.modules, "tqdm.auto", module)
    return bars


def _chunked_forward(**policy):
    with blochsim.execution(budget_bytes=TINY, **policy):
        engine.simulate(mrf_description(_flips(), 0.01), _tissue("real"), states=STATES)


def test_progress_switch(fake_tqdm, monkeypatch):
    _chunked_forward(progress=True)  # forced: shown however short the work and wherever stderr goes
    assert len(fake_tqdm) == 1
    bar = fake_tqdm[0]
    assert bar.kwargs["total"] == V and bar.done == V and bar.closed and "forward" in bar.kwargs["desc"]
    _chunked_forward(progress=False)
    monkeypatch.setattr(chunks, "_terminal", lambda: True)
    monkeypatch.setattr(chunks, "PROGRESS_AFTER_S", 0.0)
    _chunked_forward(progress=False)
    assert len(fake_tqdm) == 1
    _chunked_forward()  # automatic: long (the threshold is 0 here) and on a terminal
    assert len(fake_tqdm) == 2
    monkeypatch.setattr(chunks, "PROGRESS_AFTER_S", 3600.0)
    for _ in range(3):  # a loop of short calls shows nothing
        _chunked_forward()
    monkeypatch.setattr(chunks, "PROGRESS_AFTER_S", 0.0)
    monkeypatch.setattr(chunks, "_terminal", lambda: False)
    _chunked_forward()  # stderr not a terminal
    assert len(fake_tqdm) == 2


def test_progress_without_tqdm(monkeypatch):
    monkeypatch.setitem(sys.modules, "tqdm.auto", None)  # `import` raises ImportError
    _chunked_forward(progress=True)


# -- host scratch ----------------------------------------------------------------------------------
@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="resident memory read from /proc")
def test_host_scratch_released_after_a_large_call():
    """An adjoint whose per-thread scratch is past the library's kept size (8 MiB): 3,000 events with a
    checkpoint at each (stride 1) of 1024 real orders, 36 MiB. The buffers go when the call returns (the
    old thread_local kept them: 35 MiB resident after the call)."""

    def resident() -> int:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    def gradient(reps: int, states: int) -> None:
        flips = torch.full((reps,), 0.3, dtype=torch.float64, requires_grad=True)
        tissue = TissueProperties(t1_ms=torch.tensor([1000.0]), t2_ms=torch.tensor([80.0]))
        signal = engine.simulate(mrf_description(flips, 0.01), tissue, states=states, checkpoint_stride=1)
        signal.abs().sum().backward()

    gradient(20, 16)
    before = resident()
    # Twice: after the first large buffer is freed, glibc serves the next one of that size from an arena that
    # keeps its pages (15.7 MiB resident after the second call with malloc'd buffers; 0.9 mapped).
    gradient(1000, 1024)
    gradient(1000, 1024)
    # 8 MiB: well under one thread's 36 MiB, above what the Python side keeps of a call (under 1 MiB).
    assert resident() - before < 8 * 2**20


# -- what a gradient holds -------------------------------------------------------------------------
def test_resolved_durations_carry_no_graph(monkeypatch):
    """A resolved call maps the protocol to the event values (bind.AffineValues); with only the flips as
    tensors, the durations do not depend on them and come back detached. Otherwise every later call built the
    pool tables with a graph, per event instead of per distinct interval (302 instead of 2 here: 15 s for a
    40-voxel gradient on the 2-core VM instead of 40 ms, and a table the size of the train per voxel)."""
    from blochsim.engine import pools

    seen = []
    real = pools._pool_tables

    def spy(tissue, model, voxel_shape, lengths_s, *args):
        seen.append((lengths_s.requires_grad, lengths_s.numel()))
        return real(tissue, model, voxel_shape, lengths_s, *args)

    monkeypatch.setattr(pools, "_pool_tables", spy)
    flips = torch.linspace(5, 60, 20)
    sim = MRFSimulator(flip=flips, TR=10.0, states=STATES)
    t1 = torch.linspace(500, 1500, 3)
    for _ in range(3):  # walked, then fitted and resolved, then resolved
        f = flips.clone().requires_grad_()
        (sim.simulate(flip=f, T1=t1, T2=60.0, **{"bound_fraction": 0.1, "bound_exchange": 4.3}).abs() ** 2).sum() \
            .backward()
        assert f.grad is not None and f.grad.abs().sum() > 0
    assert seen and all(not grad and n == 2 for grad, n in seen), seen


def test_expm_in_parts(monkeypatch):
    """The pool tables' matrix exponential on a GPU (the broadcast products, forced here on the host) runs a
    large batch in parts of bounded size: the same numbers as in one part, and differentiable."""
    from blochsim.engine import pools

    g = torch.Generator().manual_seed(5)
    a = (torch.randn(70, 3, 6, 6, generator=g, dtype=torch.float64) * 2).requires_grad_()
    whole = pools.expm(a, matmul=True)
    monkeypatch.setattr(pools, "_EXPM_PART_BYTES", 17 * 6**3 * 8)  # parts of 17 matrices
    parts = pools.expm(a, matmul=True)
    assert torch.equal(parts, whole)
    (grad,) = torch.autograd.grad(parts.sum(), a)
    assert torch.equal(grad, torch.autograd.grad(whole.sum(), a)[0])
    assert torch.allclose(whole, torch.linalg.matrix_exp(a), rtol=1e-12, atol=1e-12)  # series truncation 2e-14
