"""Execution placement on a card: chunked against whole, peak memory under a budget, offload of host tensors,
the out-of-memory retry (skipped without a card and a CUDA build).

Tolerances. Chunks here keep the launch mapping of the whole call (2,000 voxels and chunks of 256: a warp
per voxel for the adjoints and JVPs, the same value-forward mapping; launch_rules.hpp), so per-voxel
results repeat the same float32 arithmetic: 1e-6 of the largest entry covers them. Event (protocol)
gradients are float32 sums over voxels by atomics in the whole call and per chunk, in another order:
each addition rounds at 6e-8 of the running sum, a random walk of ~3e-6 over 2,000 voxels: 1e-5. Host
against card: 1e-5 for values, 1e-4 for first derivatives (tests/test_cuda.py's budget).
"""

from __future__ import annotations

import math
import warnings

import pytest
import torch
from conftest import rel_max_err

import blochsim
from blochsim import _execution, engine
from blochsim.engine import chunks
from blochsim.engine import kernels as K
from blochsim.engine.program import replay_slots
from blochsim.sequence import TissueProperties, mrf_description
from blochsim.simulators import MRFSimulator

pytestmark = pytest.mark.cuda  # skipped without a card and a CUDA build (conftest)

CARD = torch.device("cuda")
STATES = 32
POOLED = dict(pool_b_fraction=0.15, pool_b_exchange_hz=10.0, t1_pool_b_ms=500.0, t2_pool_b_ms=20.0,
              bound_fraction=0.1, bound_exchange_hz=4.3, t1_bound_ms=1000.0)


def _tissue(kind: str, n: int, device) -> TissueProperties:
    g = torch.Generator().manual_seed(0)
    t1 = torch.exp(torch.empty(n).uniform_(math.log(200), math.log(3000), generator=g))
    t2 = torch.minimum(torch.exp(torch.empty(n).uniform_(math.log(10), math.log(300), generator=g)), 0.9 * t1)
    extra = {"complex": dict(b0_hz=(torch.rand(n, generator=g) * 20 - 10).to(device)), "pooled": POOLED}
    return TissueProperties(t1_ms=t1.to(device), t2_ms=t2.to(device), **extra.get(kind, {}))


def _flips(reps: int, device=CARD) -> torch.Tensor:
    return torch.deg2rad(torch.linspace(5, 60, reps, dtype=torch.float64)).to(device)


def _all_passes(kind: str, n: int, device=CARD, reps: int = 100):
    """Signal, Jacobian, and (flip, T1) gradients of a gradient and of an HVP, on `device`."""
    tissue = _tissue(kind, n, device)
    flips = _flips(reps, device).requires_grad_()
    t1 = tissue.t1_ms.clone().requires_grad_()
    tissue = TissueProperties(**{**dict(tissue.items()), "t1_ms": t1})
    description = mrf_description(flips, 0.01)
    signal = engine.simulate(description, tissue, states=STATES)
    g_flip, g_t1 = torch.autograd.grad((signal.abs() ** 2).sum(), (flips, t1), create_graph=True)
    h_flip, h_t1 = torch.autograd.grad((g_flip * torch.linspace(-1, 1, reps, dtype=g_flip.dtype,
                                                                device=device)).sum() + g_t1.sum(), (flips, t1))
    _, jac = engine.jacobian(description, tissue, ("t1_ms", "t2_ms"), states=STATES)
    return [signal.detach(), jac.detach(), g_flip.detach(), g_t1.detach(), h_flip, h_t1]


@pytest.mark.parametrize("kind", ["real", "complex", "pooled"])
def test_chunked_matches_whole_on_the_card(kind, monkeypatch):
    whole = _all_passes(kind, 2000)
    calls = []
    real = K._call

    def recording(st, entry, args):
        calls.append(st.num_voxels)
        real(st, entry, args)

    monkeypatch.setattr(K, "_call", recording)
    monkeypatch.setattr(chunks.Runner, "chunk", lambda self, *args, **kwargs: 256)
    chunked = _all_passes(kind, 2000)
    # 8 chunks each: the forward, the VJP, the HVP's VJP-JVP and the VJP its cotangent's derivative takes, the JVP.
    assert calls and max(calls) == 256 and len(calls) >= 5 * 8
    for name, a, b, tol in zip(("signal", "jacobian", "grad flip", "grad T1", "hvp flip", "hvp T1"), chunked, whole,
                               (1e-6, 1e-6, 1e-5, 1e-6, 1e-5, 1e-6), strict=True):
        assert rel_max_err(a, b) <= tol, name


@pytest.mark.parametrize(("mapping", "budget_mib"), (("groups", 448), ("warp", 192)))
def test_chunks_in_whole_waves_of_the_kernel(monkeypatch, mapping, budget_mib):
    """The library answers each pass's resident voxels on the card (whole blocks on every multiprocessor), and a
    pooled gradient cut by its budget takes chunks of whole waves of its adjoint kernel, less than a block of
    128 short of them (chunks.Runner._whole_waves); its gradient is the one of chunks cut without the rule
    (event gradients: float32 sums over voxels in another order, 1e-5 as above). The fixed pools' first order
    runs in groups of 8 by rule (launch_rules.hpp adjoint_lanes: 4,224 voxels a wave on an H100, so a budget
    of a few such waves) or a warp a voxel, forced (2,112 a wave)."""
    if mapping == "warp":
        monkeypatch.setenv("BLOCHSIM_CUDA_MAPPING", "warp")
    planned = []
    real_chunk = chunks.Runner.chunk

    def chunk(self, per_voxel_bytes, scratch=None, resident=None, fill_wave=False):
        c = real_chunk(self, per_voxel_bytes, scratch, resident, fill_wave)
        planned.append((self.label, c, resident(c) if resident else None))
        return c

    monkeypatch.setattr(chunks.Runner, "chunk", chunk)
    processors = torch.cuda.get_device_properties(CARD).multi_processor_count
    n = 20_000

    def gradient():
        planned.clear()
        flips = _flips(300).requires_grad_()
        with blochsim.execution(budget_bytes=budget_mib * 2**20):  # chunks of a few thousand voxels: a few waves
            signal = engine.simulate(mrf_description(flips, 0.01), _tissue("pooled", n, CARD), states=STATES)
            return torch.autograd.grad((signal.abs() ** 2).sum(), flips)[0]

    waves = gradient()
    cut = [(label, c, wave) for label, c, wave in planned if c < n]
    assert cut and all(wave is not None and wave > 0 and wave % processors == 0 for _, c, wave in cut), planned
    assert all(wave > c or -c % wave < 128 for _, c, wave in cut), planned
    assert any(c > wave - 128 for _, c, wave in cut), planned  # a wave or more, less a block: the rule cut it
    monkeypatch.setattr(chunks, "WHOLE_WAVES", False)
    assert rel_max_err(waves, gradient()) <= 1e-5


def test_peak_memory_under_a_budget():
    """A real gradient of 60,000 voxels over 500 TRs at 32 orders: the adjoint's scratch at checkpoint stride 4
    is about 8.4 GB. Under a budget of 128 MiB (and under the default, scratch held to the larger of 128 MiB
    and twice the bytes of the call's own arrays), the backward
    allocates at most the budget beyond what torch's own backward of the loss holds (the cotangent and its
    temporaries: three arrays of the signal's size), and gives the gradient of a whole call."""
    n, reps = 60000, 500  # a signal of 229 MiB: the default cap is then twice the call's own arrays
    tissue = _tissue("real", n, CARD)
    signal_bytes = n * reps * 8

    def gradient(policy):
        flips = _flips(reps).requires_grad_()
        with policy:
            signal = engine.simulate(mrf_description(flips, 0.01), tissue, states=STATES)
        loss = (signal.abs() ** 2).sum()
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        loss.backward()
        torch.cuda.synchronize()
        return flips.grad, torch.cuda.max_memory_allocated() - base

    reference, _ = gradient(blochsim.execution(budget_bytes=16 * 2**30))
    # The default holds an adjoint's scratch to the larger of 128 MiB and twice its own arrays' bytes (the
    # cotangent, one signal, and per-voxel tissue and gradients well under another).
    default_cap = _execution.default_scratch_bytes("bs_epg_vjp", 2 * signal_bytes)
    # (A chunk the default cap holds to most of a wave of its kernel may take the wave, its scratch up to a
    # third over the cap: chunks.Runner._one_wave.)
    for budget, policy in ((128 * 2**20, blochsim.execution(budget_bytes=128 * 2**20)),
                           (default_cap * 4 // 3, blochsim.execution())):
        grad, extra = gradient(policy)
        # 3 signal-sized arrays of torch's loss backward, plus 2 MiB of allocator rounding per array.
        assert extra <= budget + 3 * signal_bytes + 8 * 2**20, (budget, extra)
        assert rel_max_err(grad, reference) <= 1e-5


def test_chunked_real_gradient_stores_a_state_per_pass(monkeypatch):
    """The real plain adjoint's store on the card keeps a state per pass of a replayed stretch, not per event
    (checkpoint_slots, counted on the host from the action array structure_on placed there). Through
    MRFSimulator, flips and tissue made on the card, a gradient chunked by a budget launches with slots fewer
    than its stride (a third of the MRF train's events pass), as program.replay_slots counts them, and its
    flip and T1 gradients are the host's (1e-4: first derivatives, float32 against the host;
    tests/test_cuda.py's budget)."""
    n, reps = 4000, 200
    launched = []
    call = K._call

    def spy(st, entry, args):
        if entry == "bs_epg_vjp":
            launched.append((args.program.checkpoint_stride, args.program.checkpoint_slots))
        return call(st, entry, args)

    monkeypatch.setattr(K, "_call", spy)
    sim = MRFSimulator(flip=torch.rad2deg(_flips(reps, "cpu")), TR=10.0, states=STATES)

    def gradients(device, policy):
        tissue = _tissue("real", n, device)
        flips = torch.rad2deg(_flips(reps, device)).float().requires_grad_()
        t1 = tissue.t1_ms.clone().requires_grad_()
        with policy:
            signal = sim.simulate(flip=flips, T1=t1, T2=tissue.t2_ms)
            (signal.abs() ** 2).sum().backward()
        return flips.grad.cpu(), t1.grad.cpu()

    card = gradients(CARD, blochsim.execution(budget_bytes=8 * 2**20))
    assert len(launched) > 1, launched  # chunked
    stride, slots = launched[0]
    assert 0 < slots < stride, launched
    program = engine.compile_program(sim.describe(), states=STATES)
    assert slots == replay_slots(program.action, 1, stride)
    host = gradients(torch.device("cpu"), blochsim.execution("cpu"))
    for got, want in zip(card, host, strict=True):
        assert rel_max_err(got, want) <= 1e-4


@pytest.mark.parametrize("b0", (False, True), ids=("no-b0", "b0"))
def test_complex_gradients_through_the_simulator_match_the_host(b0):
    """The complex path's adjoints on the card (the rotation adjoint from nine sums over the orders, epg.hpp;
    relaxation by real factors where no B0 map turns it, relax_into; the one-order-a-lane adjoint held at
    128 registers, adjoint_lanes_blocks_per_sm), as users call them: MRFSimulator with quadratic RF phases,
    flips, phases, T1 and T2 (and B0) made on the card. The flip, phase and T1 gradients of sum |s|^2 and
    blochsim.hvp along a fixed direction in the flips equal the host's: 1e-4 for first derivatives, 1e-3 for
    the second order (tests/test_cuda.py's budgets). B0's own gradient is not compared: sum |s|^2 barely
    depends on it (~1e-9), below any relative budget."""
    n, reps = 2000, 100
    sim = MRFSimulator(flip=torch.linspace(5, 60, reps), TR=10.0, states=STATES)

    def run(device):
        tissue = _tissue("real", n, device)
        flips = torch.linspace(5, 60, reps, device=device).requires_grad_()
        k = torch.arange(reps, device=device, dtype=torch.float32)
        phases = (117.0 * k * (k + 1) / 2 % 360).requires_grad_()
        t1 = tissue.t1_ms.clone().requires_grad_()
        extra = {"B0": torch.linspace(-20, 20, n, device=device)} if b0 else {}
        signal = sim.simulate(flip=flips, phases=phases, T1=t1, T2=tissue.t2_ms, **extra)
        assert signal.device.type == device.type  # ran where the tensors were made
        grads = torch.autograd.grad((signal.abs() ** 2).sum(), [flips, phases, t1])

        def cost(f):
            s = sim.simulate(flip=f, phases=phases.detach(), T1=tissue.t1_ms, T2=tissue.t2_ms, **extra)
            return (s.abs() ** 2).sum()

        direction = torch.randn(reps, generator=torch.Generator().manual_seed(0)).to(device)
        product = blochsim.hvp(cost, flips.detach(), direction)
        return [signal.detach().cpu(), *(g.cpu() for g in grads), product.cpu()]

    card, host = run(CARD), run(torch.device("cpu"))
    assert rel_max_err(card[0], host[0]) <= 1e-5
    for got, want in zip(card[1:4], host[1:4], strict=True):
        assert rel_max_err(got, want) <= 1e-4
    assert rel_max_err(card[4], host[4]) <= 1e-3


def test_offload_host_tensors():
    """offload() and execution("cuda") run host tensors on the card in chunks; results and gradients come back
    to the host, within the host-versus-card budget of the host build's own results."""
    n, reps = 3000, 100
    tissue = _tissue("pooled", n, "cpu")

    def run(policy):
        flips = _flips(reps, "cpu").requires_grad_()
        with policy:
            signal = engine.simulate(mrf_description(flips, 0.01), tissue, states=STATES)
        (signal.abs() ** 2).sum().backward()
        return signal.detach(), flips.grad

    host = run(blochsim.execution("cpu"))
    for policy in (blochsim.offload(budget_bytes=16 * 2**20), blochsim.offload(budget_bytes=16 * 2**20, lanes=2),
                   blochsim.execution("cuda", budget_bytes=16 * 2**20)):
        signal, grad = run(policy)
        assert signal.device.type == "cpu" and grad.device.type == "cpu"
        assert rel_max_err(signal, host[0]) <= 1e-5 and rel_max_err(grad, host[1]) <= 1e-4


def test_simulator_execution_setting_on_the_card():
    flips = torch.linspace(5, 60, 50)
    t1 = torch.linspace(300, 2000, 4000)
    sim = MRFSimulator(flip=flips, TR=10.0, states=STATES)
    host = sim.simulate(T1=t1, T2=60.0)
    card = sim.simulate(T1=t1, T2=60.0, execution=blochsim.offload(budget_bytes=8 * 2**20))
    assert card.device.type == "cpu" and rel_max_err(card, host) <= 1e-5
    back = sim.simulate(T1=t1.to(CARD), T2=60.0, execution="cpu")  # card tensors, host kernels
    assert back.device.type == "cuda" and rel_max_err(back, host) <= 1e-6


def test_out_of_memory_leaves_nothing_allocated(monkeypatch):
    """An out-of-memory error after a chunk allocated 64 MiB: the retry in halves completes the call, and
    afterwards the card holds the result and nothing of the failed chunk."""
    real = K._call

    def failing(st, entry, args):
        if st.device.type == "cuda" and st.num_voxels > 512:
            torch.empty(64 * 2**20, dtype=torch.uint8, device=st.device)
            raise torch.cuda.OutOfMemoryError("CUDA out of memory (injected)")
        real(st, entry, args)

    tissue = _tissue("real", 2000, CARD)
    description = mrf_description(_flips(100, "cpu"), 0.01)
    whole = engine.simulate(description, tissue, states=STATES)
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    monkeypatch.setattr(K, "_call", failing)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        chunked = engine.simulate(description, tissue, states=STATES)
    torch.cuda.synchronize()
    assert sum(issubclass(w.category, ResourceWarning) for w in caught) == 1
    assert torch.cuda.memory_allocated() == base + chunked.numel() * chunked.element_size()
    assert rel_max_err(chunked, whole) <= 1e-6


def test_policy_decides_the_kernels_precision():
    """Host tissue under offload(): the kernels run on the card, which has float32 kernels only, so the steady
    state is played there in float32 (not extrapolated in float64) and dtype=float64 is refused."""
    sim = MRFSimulator(flip=torch.linspace(5, 60, 20), TR=10.0, states=STATES)
    t1 = torch.linspace(300, 2000, 64)
    host = sim.simulate(T1=t1, T2=60.0, repetitions="auto")
    with blochsim.offload():
        card = sim.simulate(T1=t1, T2=60.0, repetitions="auto")
        with pytest.raises(ValueError, match="float64 kernels"):
            sim.simulate(T1=t1, T2=60.0, dtype=torch.float64)
    # The played steady state against the float64 extrapolation: 1.3e-6 of the largest sample for MRF
    # (docs/design.md); 1e-5 with the card's own rounding.
    assert card.device.type == "cpu" and rel_max_err(card, host) <= 1e-5


def test_cuda_free_bytes_counts_the_cache():
    """The planner's free memory is the driver's free bytes plus torch's cached bytes no tensor uses, read from
    the allocator's nested statistics (as torch's memory_reserved and memory_allocated read them flattened).
    A tensor freed into the cache must count as free: the two forms agree before and after it."""
    held = torch.empty(64 * 2**20, dtype=torch.uint8, device=CARD)
    del held  # 64 MiB back in torch's cache, reserved but not allocated

    def flattened() -> int:
        free, _ = torch.cuda.mem_get_info(CARD)
        return free + torch.cuda.memory_reserved(CARD) - torch.cuda.memory_allocated(CARD)

    assert _execution.cuda_free_bytes(CARD) == flattened()
    assert torch.cuda.memory_reserved(CARD) - torch.cuda.memory_allocated(CARD) >= 64 * 2**20


def test_small_calls_on_their_own_card_read_no_free_memory(monkeypatch):
    """MRFSimulator through the public API, flips and maps made on the card: the 2,000-tissue gradient (its
    adjoint's store over the 128 MiB cap at stride 4, under it at the least-scratch stride) and a
    100,000-tissue forward (a 400 MB signal, its scratch small) plan without reading the card's free memory
    (engine.kernels `_Placed._plan`, engine.chunks `Runner._budget`), and the gradient is the one a budget
    plans (any checkpoint stride gives the same numbers; the flip gradient is a sum over voxels by atomics:
    1e-5, the module's budget)."""
    reps, reads = 500, []
    free = _execution.cuda_free_bytes
    monkeypatch.setattr(_execution, "cuda_free_bytes", lambda device: reads.append(device) or free(device))
    sim = MRFSimulator(TR=10.0, states=STATES)
    flips_deg = torch.linspace(5.0, 60.0, reps, device=CARD)

    def gradient(n, policy=None):
        tissue = _tissue("real", n, CARD)
        flips = flips_deg.clone().requires_grad_()
        settings = {} if policy is None else {"execution": policy}
        signal = sim.simulate(flip=flips, T1=tissue.t1_ms, T2=tissue.t2_ms, **settings)
        (signal.abs() ** 2).sum().backward()
        return flips.grad

    for _ in range(3):  # walk, resolve, resolved
        gradient(2000)
    reads.clear()
    grad = gradient(2000)
    tissue = _tissue("real", 100_000, CARD)
    signal = sim.simulate(flip=flips_deg, T1=tissue.t1_ms, T2=tissue.t2_ms)
    assert reads == [] and signal.shape == (100_000, reps)
    assert rel_max_err(grad, gradient(2000, blochsim.execution(budget_bytes=16 * 2**30))) <= 1e-5
