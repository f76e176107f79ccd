"""Ranks of the multi-process tests (tests/test_distributed.py): `python _distributed_workers.py CASE`.

Each process joins a gloo group from the environment torchrun would set (RANK, WORLD_SIZE, MASTER_ADDR,
MASTER_PORT), runs CASE, and exits 0 when every check held; a failed check prints its traceback and exits 1.
Every reference below is the same call made on this rank outside the `distributed()` block, whole.
"""

from __future__ import annotations

import datetime
import os
import sys
import time
import traceback

import numpy as np
import torch
import torch.distributed as dist

import blochsim
from blochsim.simulators import FSESimulator, MRFSimulator, SPGRSimulator

#: A shard is the same float32 voxel recursion as the whole call (the host kernels give a voxel the same
#: numbers alone or in a block), so values agree exactly; gradients summed over the ranks differ from the
#: whole call's sum by the float32 order of a sum over voxels: 1e-5 of the largest entry covers it.
SUM_ORDER = 1e-5


def rel(a, b) -> float:
    a, b = torch.as_tensor(a), torch.as_tensor(b)
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))


def flips(n=24, seed=0, grad=False):
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(n, generator=g, dtype=torch.float64) * 40 + 5).requires_grad_(grad)


def grid():
    t1 = torch.linspace(300.0, 2000.0, 5).reshape(5, 1)  # 5 x 3 = 15 voxels: 7 and 8 on two ranks
    t2 = torch.linspace(30.0, 120.0, 3)
    return t1, t2


def case_battery(rank: int, world: int) -> None:
    sim = MRFSimulator(TR=10.0)
    t1, t2 = grid()
    flip = flips()
    whole = sim.simulate(flip=flip, T1=t1, T2=t2)
    with blochsim.distributed():
        gathered = sim.simulate(flip=flip, T1=t1, T2=t2)
    assert gathered.shape == whole.shape and torch.equal(gathered, whole), rel(gathered, whole)
    assert tuple(blochsim.shard_of(gathered)) == (0, 15, 15)

    # gather=False: this rank's voxels, flattened.
    with blochsim.distributed(gather=False):
        mine = sim.simulate(flip=flip, T1=t1, T2=t2)
    shard = blochsim.shard_of(mine)
    start, stop = rank * 15 // world, (rank + 1) * 15 // world
    assert tuple(shard) == (start, stop, 15), shard
    assert torch.equal(mine, whole.reshape(15, -1)[shard.slice])

    # The function form and the jacobian (one name, several names).
    with blochsim.distributed():
        signal, jac = blochsim.mrf_sim(flip, 10.0, t1, t2, diff=("T1", "T2"))
        _, one = sim.jacobian("T2", flip=flip, T1=t1, T2=t2)
    ref_signal, ref_jac = blochsim.mrf_sim(flip, 10.0, t1, t2, diff=("T1", "T2"))
    assert torch.equal(signal, ref_signal) and torch.equal(jac, ref_jac), rel(jac, ref_jac)
    assert torch.equal(one, sim.jacobian("T2", flip=flip, T1=t1, T2=t2)[1])

    check_gradients(rank, world, sim)
    check_second_order(sim)
    check_layouts(rank, world)
    check_errors(rank, sim)
    check_hang(rank)  # last: it leaves the group unusable


def check_gradients(rank: int, world: int, sim) -> None:
    """Protocol and shared tissue gradients summed over the ranks; a per-voxel map's stay with its owner."""
    t1 = torch.linspace(300.0, 2000.0, 15).requires_grad_()
    t2 = torch.tensor(60.0, requires_grad=True)  # one value every voxel shares
    weights = torch.linspace(0.5, 2.0, 24)

    def loss(signal):
        return (signal.abs() ** 2 * weights).sum()

    flip = flips(grad=True)
    reference = torch.autograd.grad(loss(sim.simulate(flip=flip, T1=t1, T2=t2)), (flip, t1, t2))
    with blochsim.distributed():
        signal = sim.simulate(flip=flip, T1=t1, T2=t2)
    got = torch.autograd.grad(loss(signal), (flip, t1, t2))
    assert rel(got[0], reference[0]) < SUM_ORDER, rel(got[0], reference[0])
    assert rel(got[2], reference[2]) < SUM_ORDER, rel(got[2], reference[2])
    assert torch.equal(got[1], reference[1])  # the per-voxel map's gradient, gathered whole

    # gather=False: the gradient of the sum of the ranks' losses; the map's stays with its rows.
    with blochsim.distributed(gather=False):
        mine = sim.simulate(flip=flip, T1=t1, T2=t2)
    got = torch.autograd.grad(loss(mine), (flip, t1))
    assert rel(got[0], reference[0]) < SUM_ORDER, rel(got[0], reference[0])
    start, stop = rank * 15 // world, (rank + 1) * 15 // world
    own = torch.zeros(15, dtype=torch.bool)
    own[start:stop] = True
    assert torch.equal(got[1][own], reference[1][own]) and not got[1][~own].any()

    # ModelOperator (blochsim.recon) through the split simulator: its prediction, J d and J^H v.
    op = blochsim.ModelOperator(MRFSimulator(flip=flips().float(), TR=10.0), "T1", "T2",
                                bounds={"T1": (100.0, 3000.0), "T2": (10.0, 300.0)})
    g = torch.Generator().manual_seed(1)
    x = torch.randn(13, op.channels, generator=g)
    v = torch.randn(13, 24, generator=g, dtype=torch.complex64)
    d = torch.randn(13, op.channels, generator=g)
    reference = (op.A(x), op.A_jvp(x, d), op.A_vjp(x, v))
    with blochsim.distributed():
        got = (op.A(x), op.A_jvp(x, d), op.A_vjp(x, v))
    for a, b in zip(got, reference, strict=True):
        assert torch.equal(a, b), rel(a, b)


def check_second_order(sim) -> None:
    """A Hessian-vector product of a loss that couples every voxel (so ranks' voxels meet in the Hessian)."""
    t1, t2 = grid()
    direction = torch.linspace(-1.0, 1.0, 24, dtype=torch.float64)

    def hvp(split: bool):
        flip = flips(grad=True)
        if split:
            with blochsim.distributed():
                signal = sim.simulate(flip=flip, T1=t1, T2=t2)
        else:
            signal = sim.simulate(flip=flip, T1=t1, T2=t2)
        energy = (signal.abs() ** 2).sum(-1)  # per voxel
        loss = (energy / energy.sum()).pow(2).sum()  # couples all voxels
        (grad,) = torch.autograd.grad(loss, flip, create_graph=True)
        return torch.autograd.grad(grad @ direction, flip)[0]

    got, reference = hvp(True), hvp(False)
    # The second-order kernel's float32 sums over voxels, in another order on two ranks: 1e-4 of the largest.
    assert rel(got, reference) < 1e-4, rel(got, reference)


def check_layouts(rank: int, world: int) -> None:
    # NumPy in, NumPy out; a closed form; trains (T=2) over 4 voxels, whose first two axes are both 2 on each
    # rank (the voxel axis is found by a one-voxel probe); one voxel over two ranks (one rank has none);
    # scalars only (no voxel axis: every rank runs it whole).
    flip = flips().numpy()
    t1 = np.linspace(300.0, 2000.0, 9)
    with blochsim.distributed():
        got = blochsim.mrf_sim(flip, 10.0, t1, 80.0)
    assert isinstance(got, np.ndarray) and np.array_equal(got, blochsim.mrf_sim(flip, 10.0, t1, 80.0))

    spgr = SPGRSimulator(flip=torch.tensor([5.0, 10.0, 15.0, 20.0]), TR=10.0, TE=5.0)
    t1 = torch.linspace(300.0, 2000.0, 7)
    with blochsim.distributed():
        got = spgr.simulate(T1=t1, T2star=30.0)
    assert torch.equal(got, spgr.simulate(T1=t1, T2star=30.0))

    fse = FSESimulator(flip=torch.tensor([[150.0, 160.0, 170.0, 180.0], [120.0, 130.0, 140.0, 150.0]]), ESP=10.0)
    t2 = torch.tensor([40.0, 60.0, 80.0, 100.0])
    whole = fse.simulate(T1=1000.0, T2=t2)
    with blochsim.distributed():
        got = fse.simulate(T1=1000.0, T2=t2)
    assert whole.shape == (2, 4, 4) and torch.equal(got, whole), (got.shape, whole.shape)

    sim = MRFSimulator(flip=flips(), TR=10.0)
    for t1 in (torch.tensor([800.0]), 800.0):
        with blochsim.distributed(gather=False):
            got = sim.simulate(T1=t1, T2=60.0)
        whole = sim.simulate(T1=t1, T2=60.0)
        if isinstance(t1, torch.Tensor):
            start, stop = rank // world, (rank + 1) // world  # rank 0 holds no voxel, rank 1 the one
            assert tuple(blochsim.shard_of(got)) == (start, stop, 1)
            assert torch.equal(got, whole[start:stop])
        else:
            assert tuple(blochsim.shard_of(got)) == (0, 1, 1) and torch.equal(got, whole)

    # The helper for other per-voxel work (Estimator.map, ModelOperator).
    signals = torch.arange(10.0).reshape(5, 2)
    scale = torch.tensor(3.0, requires_grad=True)
    with blochsim.distributed():
        out = blochsim._distributed.map_voxels(lambda signals, scale: {"x": signals * scale, "n": 2},
                                               {"signals": signals}, {"scale": scale}, where="test.map")
    assert torch.equal(out["x"], signals * 3) and out["n"] == 2
    (g,) = torch.autograd.grad(out["x"].sum(), scale)
    assert float(g) == float(signals.sum())


def check_errors(rank: int, sim) -> None:
    t1 = torch.linspace(300.0, 2000.0, 6) + rank  # differs between the ranks
    try:
        with blochsim.distributed():
            sim.simulate(flip=flips(), T1=t1, T2=60.0)
    except ValueError as error:
        assert "'T1' differs" in str(error) and "rank 1" in str(error), str(error)
    else:
        raise AssertionError("inputs that differ between ranks were accepted")
    # Inputs that differ and make one rank's own work fail: every rank still raises the same ValueError.
    t1 = torch.linspace(300.0, 2000.0, 6) * (1 - 2 * rank)  # negative times on rank 1: its simulation refuses
    try:
        with blochsim.distributed():
            sim.simulate(flip=flips(), T1=t1, T2=60.0)
    except ValueError as error:
        assert "'T1' differs" in str(error), str(error)
    else:
        raise AssertionError("inputs that differ between ranks were accepted")
    try:
        blochsim.distributed(gather="yes")
    except ValueError as error:
        assert "gather" in str(error)
    else:
        raise AssertionError("gather='yes' was accepted")
    # The group is still usable after a refused call.
    with blochsim.distributed():
        sim.simulate(flip=flips(), T1=torch.linspace(300.0, 2000.0, 6), T2=60.0)


def case_dead(rank: int, world: int) -> None:
    """Rank 1 exits before the call: the others raise a clear RuntimeError instead of waiting."""
    if rank == 1:
        os._exit(3)
    began = time.monotonic()
    try:
        with blochsim.distributed(timeout_s=20.0):
            MRFSimulator(TR=10.0).simulate(flip=flips(), T1=torch.linspace(300.0, 2000.0, 6), T2=60.0)
    except RuntimeError as error:
        assert "another rank has died" in str(error), str(error)
        print(f"raised after {time.monotonic() - began:.2f} s: {error}")
    else:
        raise AssertionError("the call returned though rank 1 was gone")


def check_hang(rank: int) -> None:
    """Rank 1 stops calling: rank 0 raises after timeout_s, then tells rank 1 (a file) that it may leave."""
    signal = os.environ["BLOCHSIM_TEST_DONE"]
    if rank == 1:
        waited = 0.0
        while not os.path.exists(signal) and waited < 30.0:
            time.sleep(0.1)
            waited += 0.1
        return
    began = time.monotonic()
    try:
        with blochsim.distributed(timeout_s=2.0):
            MRFSimulator(TR=10.0).simulate(flip=flips(), T1=torch.linspace(300.0, 2000.0, 6), T2=60.0)
    except RuntimeError as error:
        waited = time.monotonic() - began
        assert "timeout_s=2" in str(error) and waited < 10.0, (waited, str(error))
        print(f"raised after {waited:.2f} s: {error}")
    else:
        raise AssertionError("the call returned though rank 1 never joined it")
    finally:
        open(signal, "w").close()


def case_cuda(rank: int, world: int) -> None:
    """NCCL for CUDA tensors, gloo for host ones (one GPU per rank): results, shards and the design gradient
    against this rank's whole call on its own card."""
    card = torch.device("cuda", rank)
    sim = MRFSimulator(TR=10.0)
    t1 = torch.linspace(300.0, 2000.0, 4001, device=card)
    weights = torch.linspace(0.5, 2.0, 24, device=card)
    flip = flips(grad=True)
    whole = sim.simulate(flip=flip, T1=t1, T2=60.0)
    (reference,) = torch.autograd.grad((whole.abs() ** 2 * weights).sum(), flip)
    with blochsim.distributed(timeout_s=120.0):
        gathered = sim.simulate(flip=flip, T1=t1, T2=60.0)
    # Per voxel the card repeats the same float32 arithmetic in another launch of fewer voxels: 1e-6 of the
    # largest entry (tests/test_cuda_execution.py's bound for chunks).
    assert gathered.device == card and rel(gathered, whole) < 1e-6, rel(gathered, whole)
    (got,) = torch.autograd.grad((gathered.abs() ** 2 * weights).sum(), flip)
    # the card's float32 atomics sum a flip's gradient over voxels in another order per rank: 1e-5
    assert rel(got, reference) < SUM_ORDER, rel(got, reference)
    with blochsim.distributed(gather=False):
        mine = sim.simulate(flip=flip.detach(), T1=t1.cpu(), T2=60.0, device=card)  # host tissue, gloo checks
    shard = blochsim.shard_of(mine)
    assert rel(mine, whole.detach().cpu()[shard.slice]) < 1e-6


def main() -> int:
    case = sys.argv[1]
    if case == "cuda":
        torch.cuda.set_device(int(os.environ["RANK"]))
    backend = "cpu:gloo,cuda:nccl" if case == "cuda" else "gloo"
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    try:
        globals()[f"case_{case}"](rank, world)
    except BaseException:
        traceback.print_exc()
        sys.stdout.flush()
        os._exit(1)
    print(f"rank {rank}: {case} passed")
    sys.stdout.flush()
    os._exit(0)  # no teardown: after the hang check the group is unusable


if __name__ == "__main__":
    sys.exit(main())
