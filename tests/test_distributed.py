"""`blochsim.distributed`: voxels split over the ranks of a torch.distributed group.

Several processes on this machine through gloo, as torchrun starts them (`_distributed_workers.py` holds the
ranks' checks: gathered and sharded results equal to the whole call, jacobians, protocol gradients summed
over the ranks, an exact Hessian-vector product of a loss coupling the ranks' voxels, NumPy, closed forms,
trains, a rank with no voxel, inputs that differ, a rank that hangs; a rank that dies), the example
launched by torchrun, and the pieces in this process: voxel ranges, broadcast slices, the voxel axis,
checksums, `shard_of`, and a group of one.
"""

from __future__ import annotations

import datetime
import pathlib
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.distributed as dist
from conftest import rank_environment

import blochsim
from blochsim import _collectives, _distributed, _sharding
from blochsim.simulators import MRFSimulator

HERE = pathlib.Path(__file__).resolve().parent
ROOT = pathlib.Path(blochsim.__file__).resolve().parents[1]  # where the blochsim under test is imported from
WORKERS = HERE / "_distributed_workers.py"
EXAMPLE = HERE.parent / "examples" / "distributed_dictionary.py"  # the checkout's (not installed with blochsim)

pytestmark = pytest.mark.skipif(not (dist.is_available() and dist.is_gloo_available()),
                                reason="torch.distributed with gloo is not available")


def _ranks(case: str, world: int = 2, **extra) -> list:
    """Run `_distributed_workers.py case` on `world` gloo ranks; [(return code, output)] in rank order."""
    env = rank_environment(world, **extra)
    procs = [subprocess.Popen([sys.executable, str(WORKERS), case], env={**env, "RANK": str(r)},
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in range(world)]
    out = []
    for p in procs:
        try:
            text, _ = p.communicate(timeout=180)
        except subprocess.TimeoutExpired:
            p.kill()
            text, _ = p.communicate()
            text += "\n(killed after 180 s)"
        out.append((p.returncode, text))
    return out


def test_two_ranks_agree_with_one_process(tmp_path):
    """Gathered and sharded results, jacobians, gradients, HVP, layouts and refused inputs on 2 gloo ranks;
    last, rank 1 stops calling and rank 0 raises after timeout_s (one launch for both: starting processes
    is most of the time)."""
    ranks = _ranks("battery", BLOCHSIM_TEST_DONE=str(tmp_path / "done"))
    for rank, (code, text) in enumerate(ranks):
        assert code == 0 and f"rank {rank}: battery passed" in text, text
    assert "raised after" in ranks[0][1]


def test_a_rank_that_dies_fails_the_others_at_once():
    (code0, text0), (code1, _) = _ranks("dead")
    assert code1 == 3
    assert code0 == 0 and "rank 0: dead passed" in text0, text0


def test_torchrun_example_writes_the_whole_dictionary(tmp_path):
    """examples/distributed_dictionary.py launched as users do, by torchrun on 2 processes."""
    out = tmp_path / "dictionary.npy"
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes", "1",
               "--nproc-per-node", "2", str(EXAMPLE), "--tissues", "301", "--repetitions", "40", "--out", str(out)]
    done = subprocess.run(command, env=rank_environment(), capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
    signals = np.load(out)
    parameters = np.load(tmp_path / "dictionary-parameters.npy")
    example = _load_example()
    t1, t2 = example.tissues(301, seed=0)
    reference = MRFSimulator(flip=example.flips_deg(40), TR=example.TR_MS).simulate(T1=t1, T2=t2)
    assert signals.shape == (301, 40) and np.array_equal(signals, reference.numpy())
    assert np.array_equal(parameters, np.stack([t1.numpy(), t2.numpy()], 1))


def _load_example():
    import importlib.util

    spec = importlib.util.spec_from_file_location("distributed_dictionary", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# -- in this process -------------------------------------------------------------------------------------------
def test_without_a_process_group_the_block_is_refused():
    if dist.is_initialized():
        pytest.skip("a process group is initialised in this process")
    with pytest.raises(RuntimeError, match="init_process_group"):
        blochsim.distributed()


@pytest.mark.parametrize("kwargs, match", [({"gather": 1}, "gather"), ({"timeout_s": 0}, "timeout_s"),
                                           ({"timeout_s": float("inf")}, "timeout_s")])
def test_bad_arguments_are_named(kwargs, match):
    with pytest.raises(ValueError, match=match):
        blochsim.distributed(**kwargs)


def test_launched_outside_torchrun_is_one_process(monkeypatch):
    if dist.is_initialized():
        pytest.skip("a process group is initialised in this process")
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    with _distributed.launched() as (rank, world):
        assert (rank, world) == (0, 1) and not dist.is_initialized()


def test_shard_of_refuses_other_values():
    with pytest.raises(ValueError, match="shard_of"):
        blochsim.shard_of(torch.zeros(3))


def test_even_ranges_cover_the_voxels():
    for total in (0, 1, 2, 7, 15, 1000):
        for parts in (1, 2, 3, 8):
            ranges = _sharding.even_ranges(total, parts)
            assert ranges[0][0] == 0 and ranges[-1][1] == total
            assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:], strict=False))
            sizes = [b - a for a, b in ranges]
            assert max(sizes) - min(sizes) <= 1


@pytest.mark.parametrize("shape, full", [((), (4, 3)), ((1,), (4, 3)), ((4, 1), (4, 3)), ((3,), (4, 3)),
                                         ((1, 3), (4, 3)), ((4, 3), (4, 3)), ((2, 1, 3), (2, 4, 3))])
def test_take_matches_broadcast_then_slice(shape, full):
    x = torch.arange(float(np.prod(shape) or 1)).reshape(shape).requires_grad_()
    flat = torch.broadcast_to(x, full).reshape(-1)
    total = int(np.prod(full))
    for start, stop in ((0, total), (2, 7), (5, 5), (total - 1, total)):
        got = _sharding.take(x, full, start, stop)
        want = flat[start:stop] if x.dim() else x
        assert torch.equal(got, want)
        if x.dim() and stop > start:  # gradients land on the entries the voxels read
            (g,) = torch.autograd.grad(got.sum(), x)
            (h,) = torch.autograd.grad(want.sum(), x)
            assert torch.equal(g, h)


def test_voxel_axis_of_each_layout():
    def never():
        raise AssertionError("no probe needed")

    # closed form (voxels first, whatever follows); event trains without and with a train axis
    assert _sharding.voxel_axis(torch.zeros(5, 5), 5, engine=False, probe=never) == 0
    assert _sharding.voxel_axis(torch.zeros(5, 20), 5, engine=True, probe=never) == 0
    assert _sharding.voxel_axis(torch.zeros(5), 5, engine=True, probe=never) == 0  # MPRAGE: no sample axis
    assert _sharding.voxel_axis(torch.zeros(2, 5, 20), 5, engine=True, probe=never) == 1
    assert _sharding.voxel_axis(torch.zeros(2, 0, 20), 0, engine=True, probe=never) == 1
    assert _sharding.voxel_axis(torch.zeros(0, 20), 0, engine=True, probe=never) == 0
    assert _sharding.voxel_axis(torch.zeros(1, 1, 4), 1, engine=True, probe=never) == 0
    # (3, 3, ...): 3 trains of 3 voxels, or 3 voxels of 3 samples; the one-voxel probe tells
    assert _sharding.voxel_axis(torch.zeros(3, 3, 4), 3, engine=True, probe=lambda: torch.zeros(3, 1, 4)) == 1
    assert _sharding.voxel_axis(torch.zeros(3, 3), 3, engine=True, probe=lambda: torch.zeros(1, 3)) == 0


def test_checksums_see_any_one_element():
    base = {"T1": torch.linspace(300.0, 2000.0, 1000), "flip": [10.0, 20.0], "dtype": torch.float32}
    same = {"T1": torch.linspace(300.0, 2000.0, 1000), "flip": [10.0, 20.0], "dtype": torch.float32}
    assert _collectives._digests(base) == _collectives._digests(same)
    moved = dict(same, T1=same["T1"].clone())
    moved["T1"][517] = torch.nextafter(moved["T1"][517], torch.tensor(1e9))  # one ulp in one voxel
    swapped = dict(same, T1=same["T1"].clone())
    swapped["T1"][[3, 4]] = swapped["T1"][[4, 3]]  # the same values in another order
    for other in (moved, swapped, dict(same, flip=[10.0, 20.5]), dict(same, T1=same["T1"].double())):
        digests = _collectives._digests(other)
        assert digests["T1"] != _collectives._digests(base)["T1"] or digests["flip"] != \
            _collectives._digests(base)["flip"]
    # objects print their address: only their type counts
    assert _collectives._describe(object(), []) == "object"


@pytest.fixture
def group_of_one(tmp_path):
    if dist.is_initialized():
        pytest.skip("a process group is initialised in this process")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1,
                            timeout=datetime.timedelta(seconds=30))
    yield
    dist.destroy_process_group()


def test_a_group_of_one_returns_the_whole_call(group_of_one):
    sim = MRFSimulator(flip=torch.linspace(5.0, 60.0, 30), TR=10.0)
    t1 = torch.linspace(300.0, 2000.0, 12).reshape(4, 3)
    whole = sim.simulate(T1=t1, T2=60.0)
    with blochsim.distributed(gather=False) as block:
        shard = sim.simulate(T1=t1, T2=60.0)
        signal, jac = sim.jacobian(("T1", "T2"), T1=t1, T2=60.0)
        assert _distributed.current() is block
    assert _distributed.current() is None
    assert tuple(blochsim.shard_of(shard)) == (0, 12, 12) and torch.equal(shard, whole.reshape(12, -1))
    assert tuple(blochsim.shard_of((signal, jac))) == (0, 12, 12) and jac.shape == (12, 2, 30)
    with blochsim.distributed():
        assert torch.equal(sim.simulate(T1=t1, T2=60.0), whole)
        with _distributed.launched() as (rank, world):  # a group already there is used as it is
            assert (rank, world) == (0, 1)
        assert dist.is_initialized()
        empty = sim.simulate(T1=torch.zeros(0), T2=60.0)
        assert empty.shape == (0, 30) and tuple(blochsim.shard_of(empty)) == (0, 0, 0)
