"""Several devices in one process: a call's voxels spread over them (`blochsim._multi_device`).

Without GPUs the devices are host stand-ins: `devices_for` is made to answer a list of "cpu" devices, so the
splitting, the staging, the voxel axis, the gathering and autograd through them run as they would over
CUDA devices (tests/test_distributed_cuda.py runs them on two GPUs). Then the choice of devices itself
(`devices_for`: which policies spread, the inputs' device first, autograd history under "auto") and the train
placement of `distribute`, on CUDA device names that are never touched.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

import blochsim
from blochsim import _multi_device
from blochsim._execution import ExecutionPolicy, active
from blochsim.model import BALANCED, Simulator, SpinPhysics
from blochsim.simulators import FSESimulator, MPRAGESimulator, MRFSimulator, SPGRSimulator

CPU = torch.device("cpu")
#: Each part is the same per-voxel float32 recursion as the whole call (the host kernels give a voxel the
#: same numbers alone or in a block), so values agree exactly; a gradient summed over voxels is summed in
#: another order over three parts: 1e-5 of its largest entry covers float32 round-off of that sum.
SUM_ORDER = 1e-5


def rel(a, b) -> float:
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))


@pytest.fixture
def three_stand_ins(monkeypatch):
    """Every call with two voxels or more spreads over three host devices."""
    monkeypatch.setattr(_multi_device, "_visible_cuda", lambda: 3)
    monkeypatch.setattr(_multi_device, "devices_for",
                        lambda policy, home, total, values=(): (CPU,) * 3 if total >= 2 else None)
    calls = []
    spread = _multi_device.spread
    monkeypatch.setattr(_multi_device, "spread", lambda *a, **k: calls.append(k["devices"]) or spread(*a, **k))
    return calls


class PhaseCycled(Simulator):
    """A balanced train whose RF phase advances by `increment` (deg; one per train) each TR."""

    model = SpinPhysics(operators=BALANCED)

    def layout(self, *, flip, increment, TR=5.0, n=3):
        a, step = torch.deg2rad(torch.as_tensor(flip, dtype=torch.float64)), torch.deg2rad(increment)
        return [self.operators.excitation(a, k * step) @ self.operators.readout(k * step, duration_s=TR * 1e-3)
                for k in range(n)]


def whole(fn):
    """fn() run on one device (the stand-ins switched off)."""
    with blochsim.execution("cpu"):
        return fn()


def test_values_and_jacobians_equal_one_device(three_stand_ins):
    sim = MRFSimulator(flip=torch.linspace(5.0, 60.0, 30), TR=10.0)
    t1, t2 = torch.linspace(300.0, 2000.0, 7).reshape(7, 1), torch.linspace(30.0, 120.0, 3)  # (7, 3): 21 voxels
    got = sim.simulate(T1=t1, T2=t2)
    signal, jac = sim.jacobian(("T1", "T2"), T1=t1, T2=t2)
    assert len(three_stand_ins) == 2
    assert got.shape == (7, 3, 30) and torch.equal(got, whole(lambda: sim.simulate(T1=t1, T2=t2)))
    ref_signal, ref_jac = whole(lambda: sim.jacobian(("T1", "T2"), T1=t1, T2=t2))
    assert torch.equal(signal, ref_signal) and torch.equal(jac, ref_jac)


def test_layouts(three_stand_ins):
    # NumPy in and out, a closed form, trains first (3 trains over parts of 3 voxels: the probe decides), and
    # a simulator without a sample axis.
    flip = np.linspace(5.0, 60.0, 30)
    t1 = np.linspace(300.0, 2000.0, 8)
    got = blochsim.mrf_sim(flip, 10.0, t1, 80.0)
    assert isinstance(got, np.ndarray) and np.array_equal(got, whole(lambda: blochsim.mrf_sim(flip, 10.0, t1, 80.0)))

    spgr = SPGRSimulator(flip=torch.tensor([5.0, 10.0, 15.0]), TR=10.0, TE=5.0)
    t1 = torch.linspace(300.0, 2000.0, 9)
    assert torch.equal(spgr.simulate(T1=t1, T2star=30.0), whole(lambda: spgr.simulate(T1=t1, T2star=30.0)))

    fse = FSESimulator(flip=torch.tensor([[150.0, 160.0, 170.0], [120.0, 130.0, 140.0], [90.0, 100.0, 110.0]]),
                       ESP=10.0)
    t2 = torch.linspace(40.0, 100.0, 9)
    got = fse.simulate(T1=1000.0, T2=t2)
    assert got.shape == (3, 9, 3) and torch.equal(got, whole(lambda: fse.simulate(T1=1000.0, T2=t2)))

    # Trains of the engine itself (a per-train RF phase increment): 3 trains x 3 voxels x 3 samples per part,
    # the layout only the one-voxel probe tells apart.
    increment = torch.tensor([0.0, 90.0, 180.0], dtype=torch.float64, requires_grad=True)
    t2 = torch.linspace(40.0, 100.0, 9)
    got = PhaseCycled(flip=30.0).simulate(increment=increment, T1=1000.0, T2=t2, B0=5.0)
    want = whole(lambda: PhaseCycled(flip=30.0).simulate(increment=increment, T1=1000.0, T2=t2, B0=5.0))
    assert got.shape == (3, 9, 3) and torch.equal(got, want)
    (grad,) = torch.autograd.grad(got.real.sum(), increment)
    assert rel(grad, torch.autograd.grad(want.real.sum(), increment)[0]) < SUM_ORDER

    mprage = MPRAGESimulator(TI=900.0, flip=8.0, TRspgr=8.0, nshots=40)
    t1 = torch.linspace(300.0, 2000.0, 5)
    assert torch.equal(mprage.simulate(T1=t1), whole(lambda: mprage.simulate(T1=t1)))
    # FSE's trains are a loop of its own over the base call (simulators/_trains.py): one spread per train
    assert len(three_stand_ins) == 1 + 1 + 3 + 1 + 1


def test_gradients_and_second_order_equal_one_device(three_stand_ins):
    sim = MRFSimulator(TR=10.0)
    direction = torch.linspace(-1.0, 1.0, 24, dtype=torch.float64)

    def derivatives():
        flip = torch.linspace(5.0, 60.0, 24, dtype=torch.float64).requires_grad_()
        t1 = torch.linspace(300.0, 2000.0, 10).requires_grad_()
        t2 = torch.tensor(60.0, requires_grad=True)  # shared by every voxel: its gradient sums the parts'
        signal = sim.simulate(flip=flip, T1=t1, T2=t2)
        energy = (signal.abs() ** 2).sum(-1)
        loss = (energy / energy.sum()).pow(2).sum()  # couples the voxels of different parts
        grads = torch.autograd.grad(loss, (flip, t1, t2), create_graph=True)
        (hvp,) = torch.autograd.grad(grads[0] @ direction, flip)
        return [g.detach() for g in grads] + [hvp]

    got = derivatives()
    reference = whole(derivatives)
    assert len(three_stand_ins) == 1
    for name, g, r in zip(("flip", "T1", "T2", "HVP"), got, reference, strict=True):
        # the HVP's second-order sums over voxels also run per part: the same float32 order bound, 10x for
        # the coupled loss's cancellations
        assert rel(g, r) < (1e-4 if name == "HVP" else SUM_ORDER), (name, rel(g, r))


def test_offload_parts_run_in_threads(three_stand_ins):
    """Under offload each device's part waits on its own host copies, so parts run in threads of their own."""
    sim = MRFSimulator(flip=torch.linspace(5.0, 60.0, 20), TR=10.0)
    t1 = torch.linspace(300.0, 2000.0, 12)
    policy = dataclasses.replace(ExecutionPolicy(), offload=True)
    tissue = {"T1": t1, "T2": 60.0}
    got = _multi_device.spread(sim, blochsim.Simulator.simulate, None, {}, tissue, {}, None, engine=True,
                               devices=(CPU,) * 3, policy=policy, arrays={"T1": t1}, shape=(12,), home=CPU)
    assert torch.equal(got, whole(lambda: sim.simulate(T1=t1, T2=60.0)))

    def failing(entry):
        raise KeyError(entry)

    with pytest.raises(KeyError):
        _multi_device._in_threads(failing, [1, 2])


# -- which devices -------------------------------------------------------------------------------------------
CUDA = [torch.device("cuda", i) for i in range(3)]


@pytest.fixture
def three_cards(monkeypatch):
    monkeypatch.setattr(_multi_device, "_visible_cuda", lambda: 3)
    monkeypatch.setattr(_multi_device, "check_device", lambda device: None)


def test_auto_spreads_large_work_on_a_card_without_history(three_cards):
    auto = ExecutionPolicy()
    big = _multi_device.AUTO_SPREAD_VOXELS
    assert _multi_device.devices_for(auto, CUDA[1], big) == (CUDA[1], CUDA[0], CUDA[2])  # the inputs' first
    assert _multi_device.devices_for(auto, CUDA[1], big - 1) is None  # small work stays
    assert _multi_device.devices_for(auto, CPU, big) is None  # host tensors stay on the host
    history = torch.zeros(1, requires_grad=True)
    assert _multi_device.devices_for(auto, CUDA[0], big, [history]) is None
    with torch.no_grad():
        assert _multi_device.devices_for(auto, CUDA[0], big, [history]) is not None
    assert _multi_device.devices_for(ExecutionPolicy(target="cpu"), CUDA[0], big) is None


def test_auto_keeps_to_its_card_when_torchrun_shares_the_node(three_cards, monkeypatch):
    """Several processes on a node (one card each, as torchrun --nproc-per-node starts them): "auto" would
    otherwise spread each process's large calls over the other processes' cards too."""
    auto, big = ExecutionPolicy(), _multi_device.AUTO_SPREAD_VOXELS
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "3")
    assert _multi_device.devices_for(auto, CUDA[1], big) is None
    listed = ExecutionPolicy(target=(CUDA[0], CUDA[2]))  # named cards are still the user's choice
    assert _multi_device.devices_for(listed, CUDA[0], big) == (CUDA[0], CUDA[2])
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")  # one process per node (several nodes): its cards are its own
    assert _multi_device.devices_for(auto, CUDA[1], big) == (CUDA[1], CUDA[0], CUDA[2])


def test_named_devices_spread_whatever_the_size(three_cards):
    listed = ExecutionPolicy(target=(CUDA[0], CUDA[2]))
    assert _multi_device.devices_for(listed, CPU, 2) == (CUDA[0], CUDA[2])
    assert _multi_device.devices_for(listed, CUDA[2], 2) == (CUDA[2], CUDA[0])
    assert _multi_device.devices_for(listed, CPU, 1) is None  # one voxel: one device
    assert _multi_device.devices_for(ExecutionPolicy(target=(CUDA[1],)), CPU, 10**6) is None
    history = torch.zeros(1, requires_grad=True)
    assert _multi_device.devices_for(listed, CPU, 2, [history]) == (CUDA[0], CUDA[2])  # named: history too
    offloaded = dataclasses.replace(listed, offload=True)
    assert _multi_device.devices_for(offloaded, CPU, 2) == (CUDA[0], CUDA[2])


def test_distribute_spreads_voxels_or_shards_trains(three_cards):
    policy = ExecutionPolicy(target=(CUDA[0], CUDA[1]), trains=True)
    many = 2 * _multi_device.MIN_VOXELS_PER_DEVICE
    assert _multi_device.devices_for(policy, CPU, many) == (CUDA[0], CUDA[1])
    assert _multi_device.devices_for(policy, CPU, many - 1) is None  # few voxels: the train loop shards trains
    with policy:
        placed = []
        for index in range(5):  # 5 trains over 2 devices: 0-2 on the first, 3-4 on the second
            with _multi_device.train_placement(index, 5):
                placed.append(active().target)
        assert active() is policy
    assert placed == [(CUDA[0],)] * 3 + [(CUDA[1],)] * 2
    with ExecutionPolicy(target=(CUDA[0], CUDA[1])), _multi_device.train_placement(1, 5):
        assert active().target == (CUDA[0], CUDA[1])  # execution([...]) leaves the train loop alone


def test_distribute_checks_its_devices():
    assert blochsim.distribute(["cuda:0", 1]).target == (CUDA[0], CUDA[1])
    assert blochsim.distribute("cuda:1").trains
    assert blochsim.sequence.distribute is blochsim.distribute
    for bad in ([], ["cpu"], "cpu", [object()]):
        with pytest.raises(ValueError, match="devices"):
            blochsim.distribute(bad)


def test_stage_keeps_autograd():
    x = torch.arange(4.0, requires_grad=True)
    assert _multi_device.stage(x, CPU) is x
    y = _multi_device.stage(x.double(), torch.device("meta"))
    assert y.device.type == "meta" and y.requires_grad
