"""Two GPUs: one process spreading a call over both (execution/offload/distribute/"auto"), and two processes
through NCCL (skipped without two cards and a CUDA build).

Tolerances. Each device runs its voxels through the same float32 kernels as one device would, in a launch of
fewer voxels: per voxel the arithmetic repeats, so values and per-voxel derivatives agree to 1e-6 of the
largest entry (tests/test_cuda_execution.py's bound for chunks). Protocol gradients are float32 sums over
voxels by atomics, per device and then added in another order: 1e-5. The second-order product sums twice:
1e-4.
"""

from __future__ import annotations

import pytest
import torch
from conftest import rank_environment, rel_max_err
from test_distributed import _ranks
from test_distributed_devices import PhaseCycled

import blochsim
from blochsim import _multi_device
from blochsim.simulators import MRFSimulator

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")]

CARDS = (torch.device("cuda", 0), torch.device("cuda", 1))
VALUES, SUMS, SECOND = 1e-6, 1e-5, 1e-4


def _flip(grad=False):
    return torch.linspace(5.0, 60.0, 200, dtype=torch.float64).requires_grad_(grad)


def _t1(n, device="cpu"):
    return torch.linspace(300.0, 2000.0, n, device=device)


def _used(fn):
    """fn() and which cards allocated memory while it ran."""
    for card in CARDS:
        torch.cuda.synchronize(card)
        torch.cuda.reset_peak_memory_stats(card)
    before = [torch.cuda.max_memory_allocated(card) for card in CARDS]
    out = fn()
    for card in CARDS:
        torch.cuda.synchronize(card)
    return out, [torch.cuda.max_memory_allocated(c) > b for c, b in zip(CARDS, before, strict=True)]


@pytest.mark.parametrize("home", ["cpu", "cuda:0", "cuda:1"])
def test_listed_devices_equal_one_device(home):
    sim = MRFSimulator(flip=_flip(), TR=10.0)
    t1 = _t1(20_000, home)
    one = sim.simulate(T1=t1, T2=60.0, execution="cuda:0")
    got, used = _used(lambda: sim.simulate(T1=t1, T2=60.0, execution=list(CARDS)))
    assert got.device == torch.device(home) and used == [True, True]
    assert rel_max_err(got, one) < VALUES
    signal, jac = sim.jacobian(("T1", "T2"), T1=t1, T2=60.0, execution=list(CARDS))
    ref_signal, ref_jac = sim.jacobian(("T1", "T2"), T1=t1, T2=60.0, execution="cuda:0")
    assert rel_max_err(jac, ref_jac) < VALUES and rel_max_err(signal, ref_signal) < VALUES


def test_auto_spreads_large_calls_without_history():
    sim = MRFSimulator(flip=_flip(), TR=10.0)
    t1 = _t1(_multi_device.AUTO_SPREAD_VOXELS, "cuda:0")
    one = sim.simulate(T1=t1, T2=60.0, execution="cuda:0")
    got, used = _used(lambda: sim.simulate(T1=t1, T2=60.0))
    assert used == [True, True] and got.device == CARDS[0] and rel_max_err(got, one) < VALUES
    _, used = _used(lambda: sim.simulate(T1=t1[:1000], T2=60.0))
    assert used == [True, False]  # small work stays


def test_gradients_and_second_order_across_devices():
    sim = MRFSimulator(TR=10.0)
    direction = torch.linspace(-1.0, 1.0, 200, dtype=torch.float64)

    def derivatives(execution):
        flip = _flip(grad=True)
        t1 = _t1(4000).requires_grad_()  # host tissue: staged through pinned memory, gradient back on the host
        signal = sim.simulate(flip=flip, T1=t1, T2=60.0, execution=execution)
        energy = (signal.abs() ** 2).sum(-1)
        loss = (energy / energy.sum()).pow(2).sum()
        grad_flip, grad_t1 = torch.autograd.grad(loss, (flip, t1), create_graph=True)
        (hvp,) = torch.autograd.grad(grad_flip @ direction, flip)
        return grad_flip.detach(), grad_t1.detach(), hvp

    got, one = derivatives(list(CARDS)), derivatives("cuda:0")
    assert got[1].device.type == "cpu"
    assert rel_max_err(got[0], one[0]) < SUMS and rel_max_err(got[1], one[1]) < VALUES
    assert rel_max_err(got[2], one[2]) < SECOND


def test_offload_streams_host_tensors_through_both():
    sim = MRFSimulator(flip=_flip(), TR=10.0)
    t1 = _t1(20_000)
    one = sim.simulate(T1=t1, T2=60.0, execution=blochsim.offload("cuda:0", budget_bytes=2**20))
    got, used = _used(lambda: sim.simulate(T1=t1, T2=60.0, execution=blochsim.offload(CARDS, budget_bytes=2**20)))
    assert used == [True, True] and got.device.type == "cpu" and rel_max_err(got, one) < VALUES


def test_distribute_shards_trains_or_voxels():
    increment = torch.tensor([0.0, 45.0, 90.0, 135.0], dtype=torch.float64)
    t2 = torch.linspace(40.0, 100.0, 10, device="cuda:0")  # few voxels: trains over the devices
    sim = PhaseCycled(flip=30.0)
    one = sim.simulate(increment=increment, T1=1000.0, T2=t2, B0=5.0)
    got, used = _used(lambda: sim.simulate(increment=increment, T1=1000.0, T2=t2, B0=5.0,
                                           execution=blochsim.distribute(CARDS)))
    assert used == [True, True] and got.shape == (4, 10, 3) and rel_max_err(got, one) < VALUES
    t2 = torch.linspace(40.0, 100.0, 4 * _multi_device.MIN_VOXELS_PER_DEVICE, device="cuda:0")
    with blochsim.distribute(CARDS):
        got, used = _used(lambda: sim.simulate(increment=increment, T1=1000.0, T2=t2, B0=5.0))
    assert used == [True, True]
    assert rel_max_err(got, sim.simulate(increment=increment, T1=1000.0, T2=t2, B0=5.0)) < VALUES


def test_two_processes_through_nccl():
    for rank, (code, text) in enumerate(_ranks("cuda")):
        assert code == 0 and f"rank {rank}: cuda passed" in text, text


def test_torchrun_dictionary_one_card_per_process(capsys, tmp_path):
    """`torchrun --nproc-per-node 2 -m blochsim dictionary ... --device cuda`: each process computes its chunks
    on its own card (LOCAL_RANK); the file equals a one-process run on one card to VALUES."""
    import subprocess
    import sys

    from test_distributed_cli import ROOT, SMALL, _load, _one_process

    argv = [*SMALL, "--device", "cuda"]
    out = tmp_path / "cards.npz"
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes", "1",
               "--nproc-per-node", "2", "-m", "blochsim", *argv, "-o", str(out)]
    done = subprocess.run(command, env=rank_environment(), cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "5 of 5 chunks computed by 2 processes" in done.stdout, done.stdout
    got, want = _load(out), _one_process(capsys, argv, tmp_path / "one.npz")
    assert rel_max_err(torch.as_tensor(got["signals"]), torch.as_tensor(want["signals"])) < VALUES
    assert (got["parameters"] == want["parameters"]).all()
