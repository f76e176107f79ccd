"""Repeated Simulator calls with unchanged tissue on a GPU do their tissue work once (issue: pooled API calls
cost ~4.6 ms more than engine.simulate on an H200, the pool tables rebuilt on every call).

Checked on the stand-in card of tests/_fake_card.py: the API copies each tissue number to the device; a
fresh copy on every call defeated the engine's caches, which match device tensors by identity and version
(a device value is not read on the host without a wait). Counted here: pool table builds, free-water
packings and host reads of card values per call, and that an in-place change of the tissue still rebuilds.
"""

from __future__ import annotations

import sys

import pytest
import torch
from _fake_card import card, fake_card

import blochsim.engine.pools as PO
import blochsim.engine.tissue as T
from blochsim.simulators import MRFSimulator

#: A short train: what is counted is the tissue work per call, not the physics.
FLIPS_DEG = [10.0, 20.0, 30.0, 40.0, 30.0, 20.0]
#: Exchanging pool B and a semisolid pool, as Python numbers (benchmarks/kernel_cases.POOLS["pooled"]).
POOLED = dict(poolB_fraction=0.15, poolB_exchange=10.0, poolB_T1=500.0, poolB_T2=20.0, poolB_shift=30.0,
              bound_fraction=0.1, bound_exchange=4.3, bound_T1=1000.0)


@pytest.fixture
def counted(monkeypatch):
    """Counts of pool table builds and tissue packings."""
    counts = {"tables": 0, "packings": 0}
    build, pack = PO._pool_tables, T._pack

    def tables(*args, **kwargs):
        counts["tables"] += 1
        return build(*args, **kwargs)

    def packing(*args, **kwargs):
        counts["packings"] += 1
        return pack(*args, **kwargs)

    monkeypatch.setattr(PO, "_pool_tables", tables)
    monkeypatch.setattr(T, "_pack", packing)
    return counts


def _maps(on_card: bool):
    t1, t2 = torch.tensor([800.0, 1200.0, 1500.0]), torch.tensor([60.0, 80.0, 100.0])
    return (card(t1), card(t2)) if on_card else (t1, t2)


def _warm_counts(counted, sim, values, calls=3):
    """Counts over `calls` calls after two warm-up calls. The first call's tables come from the compiled
    program's float64 interval lengths, later calls' from the resolved values (float32-rounded lengths), so
    a second build at the second call is expected, on the host as on a card."""
    sim.simulate(**values)
    sim.simulate(**values)
    before = dict(counted)
    for _ in range(calls):
        signal = sim.simulate(**values)
    return {k: counted[k] - before[k] for k in counted}, signal


@pytest.mark.parametrize("on_card", [False, True], ids=["host", "card"])
def test_pool_tables_are_built_once_for_unchanged_pooled_tissue(counted, on_card):
    sim = MRFSimulator(flip=FLIPS_DEG, TR=10.0, states=8)
    with fake_card() as syncs:
        t1, t2 = _maps(on_card)
        values = dict(T1=t1, T2=t2, **POOLED)
        counts, _ = _warm_counts(counted, sim, values)
        assert counts == {"tables": 0, "packings": 0}, counts
        syncs.clear()
        sim.simulate(**values)
        assert syncs == [], f"an unchanged tissue read card values on the host: {syncs}"

        # In place: the kept tables must not be served. The same values in new tensors give the reference.
        counted["tables"] = 0
        t1[0] = 600.0
        changed = sim.simulate(**values)
        assert counted["tables"] == 1
        fresh = sim.simulate(**{**values, "T1": t1.clone(), "T2": t2.clone()})
        assert torch.equal(changed, fresh)  # the same float32 kernels on the same inputs: bit for bit

        # A pool property given as another number rebuilds too.
        counted["tables"] = 0
        sim.simulate(**{**values, "poolB_fraction": 0.2})
        assert counted["tables"] == 1


def test_free_water_tissue_with_numbers_is_packed_once_on_the_card(counted):
    """The non-pooled path: a number beside the maps (B1) was copied to the card afresh on every call, so
    the packing and its range checks (a host read of the card) ran on every call."""
    sim = MRFSimulator(flip=FLIPS_DEG, TR=10.0, states=8)
    with fake_card() as syncs:
        t1, t2 = _maps(True)
        values = dict(T1=t1, T2=t2, B1=0.9)
        counts, _ = _warm_counts(counted, sim, values)
        assert counts == {"tables": 0, "packings": 0}, counts
        syncs.clear()
        sim.simulate(**values)
        assert syncs == [], f"an unchanged tissue read card values on the host: {syncs}"
        counted["packings"] = 0
        t2.mul_(1.0)  # a new version, the same values: packed again (versions, not values, are compared)
        sim.simulate(**values)
        assert counted["packings"] == 1


def test_a_number_copied_to_the_card_is_not_reused_once_modified():
    """The copies the API keeps of tissue numbers are matched by value and by their version counter."""
    model = sys.modules["blochsim.model"]
    with fake_card():
        first = model._on_device(0.15, torch.device("cuda", 0))
        assert model._on_device(0.15, torch.device("cuda", 0)) is first
        assert model._on_device(-0.0, torch.device("cuda", 0)) is not model._on_device(0.0, torch.device("cuda", 0))
        first.add_(1.0)
        again = model._on_device(0.15, torch.device("cuda", 0))
        assert again is not first and again.item() == pytest.approx(0.15)  # float32 of 0.15
        leaf = torch.tensor(0.15, requires_grad=True)
        assert model._on_device(leaf, torch.device("cuda", 0)) is not again  # carries a gradient: its own copy
