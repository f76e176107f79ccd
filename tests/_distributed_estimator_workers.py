"""Ranks of tests/test_distributed_estimators.py: `python _distributed_estimator_workers.py CASE`.

Each process joins a gloo group from the environment torchrun would set (RANK, WORLD_SIZE, MASTER_ADDR,
MASTER_PORT), runs CASE, and exits 0 when every check held; a failed check prints its traceback and exits 1.
Every reference is the same fit or map made on this rank outside the `distributed()` block.
"""

from __future__ import annotations

import datetime
import math
import os
import sys
import traceback

import torch
import torch.distributed as dist

import blochsim
from blochsim.estimators import PERK, DictionaryMatcher, LookupTable, NonlinearLeastSquares
from blochsim.simulators import MRFSimulator

ACQUISITION = MRFSimulator(flip=torch.linspace(5.0, 60.0, 40), TR=10.0)

#: PERK's fit sums float32 features into float64 sums in other groups on two ranks (each rank its own range,
#: then one all-reduce), and the solve amplifies that order by the covariance's conditioning (regularization
#: 1e-5): maps agree to 1e-4 relative, as streamed and kept fits do in tests/test_perk.py (measured here: see
#: the report printed by `perk_fit`).
PERK_SUM_ORDER = 1e-4


def tissues(n: int, seed: int) -> tuple:
    g = torch.Generator().manual_seed(seed)
    t1 = torch.exp(torch.empty(n).uniform_(math.log(200), math.log(3000), generator=g))
    t2 = torch.exp(torch.empty(n).uniform_(math.log(10), math.log(300), generator=g))
    return t1, torch.minimum(t2, 0.9 * t1)


def rel(a, b) -> float:
    a, b = torch.as_tensor(a), torch.as_tensor(b)
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))


def volume(shape=(5, 7), seed=4, b1=None):
    t1, t2 = tissues(math.prod(shape), seed)
    extra = {} if b1 is None else {"B1": b1.reshape(-1)}
    return ACQUISITION.simulate(T1=t1, T2=t2, **extra).reshape(*shape, -1)


def same_maps(got: dict, want: dict, exact: bool = True, rtol: float = 0.0) -> None:
    assert got.keys() == want.keys(), (got.keys(), want.keys())
    for name in want:
        g, w = torch.as_tensor(got[name]), torch.as_tensor(want[name])
        assert g.shape == w.shape, (name, g.shape, w.shape)
        if exact:
            assert torch.equal(g, w), (name, rel(g, w))
        else:
            assert torch.allclose(g, w, rtol=rtol, atol=0.0, equal_nan=True), (name, rel(g, w))


def own_rows(rank: int, world: int, whole: dict) -> dict:
    """This rank's voxels of maps `whole` (voxel axes flattened): what gather=False returns."""
    out = {}
    for name, value in whole.items():
        flat = torch.as_tensor(value).reshape(-1)
        n = flat.shape[0]
        out[name] = flat[rank * n // world:(rank + 1) * n // world]
    return out


def same_on_every_rank(x: torch.Tensor) -> bool:
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, x.detach().cpu())
    return all(torch.equal(e, everyone[0]) for e in everyone)


# -- dictionary matching, lookup table, least squares: every rank trains on everything ------------------------
def check_matcher(rank: int, world: int) -> None:
    t1, t2 = tissues(301, 1)
    b1 = [0.9, 1.0, 1.1]
    whole = DictionaryMatcher(ACQUISITION).fit(T1=t1, T2=t2, known={"B1": b1}, seed=0)
    with blochsim.distributed():
        split = DictionaryMatcher(ACQUISITION).fit(T1=t1, T2=t2, known={"B1": b1}, seed=0)
    # Each rank simulated its range of the 903 atoms and all-gathered them: the one-process atoms, bit for bit.
    assert torch.equal(split.atoms, whole.atoms) and torch.equal(split.atom_parameters, whole.atom_parameters)
    assert torch.equal(split.atom_known, whole.atom_known)

    b1_map = torch.full((5, 7), 1.0).index_fill_(1, torch.tensor([0, 3]), 0.9)
    signals = volume(b1=b1_map)
    want = whole.map(signals, known={"B1": b1_map})
    with blochsim.distributed():
        got = whole.map(signals, known={"B1": b1_map})
    same_maps(got, want)
    assert tuple(blochsim.shard_of(got)) == (0, 35, 35)
    with blochsim.distributed(gather=False):
        mine = whole.map(signals, known={"B1": b1_map})
    same_maps(mine, own_rows(rank, world, want))
    assert tuple(blochsim.shard_of(mine)) == (rank * 35 // world, (rank + 1) * 35 // world, 35)

    # match: a MatchResult (a dataclass of arrays) gathered or split field by field.
    top = DictionaryMatcher(dictionary=whole.atoms, parameters={"T1": whole.atom_parameters[:, 0],
                                                                "T2": whole.atom_parameters[:, 1]}, top_k=3)
    want = top.match(signals.numpy())
    with blochsim.distributed():
        got = top.match(signals.numpy())
    for field in ("parameters", "indices", "scores", "scales", "densities"):
        assert (getattr(got, field) == getattr(want, field)).all(), field
    assert tuple(blochsim.shard_of(got)) == (0, 35, 35)
    with blochsim.distributed(gather=False):
        mine = top.match(signals.numpy())
    start, stop = rank * 35 // world, (rank + 1) * 35 // world
    assert (mine.indices == want.indices.reshape(35, 3)[start:stop]).all()
    assert (mine.parameters == want.parameters.reshape(35, 3, 2)[start:stop]).all()
    assert tuple(blochsim.shard_of(mine)) == (start, stop, 35)


def check_lookup_and_least_squares(rank: int, world: int) -> None:
    from blochsim.simulators import DoubleAngleSimulator

    sim = DoubleAngleSimulator(flip=[60.0, 120.0])

    def ratio(s):
        return s[..., 1] / s[..., 0]

    whole = LookupTable(sim, combine=ratio).fit(B1=(0.5, 1.45))  # a grid: 10,000 points over 2 ranks
    signals = sim.simulate(B1=torch.linspace(0.6, 1.4, 13))
    want = whole.map(signals)
    with blochsim.distributed():
        split = LookupTable(sim, combine=ratio).fit(B1=(0.5, 1.45))
        got = whole.map(signals)
    same_maps(got, want)
    same_maps(split.map(signals), want)

    nlls = NonlinearLeastSquares(ACQUISITION, start="center").fit(T1=(200.0, 3000.0), T2=(10.0, 300.0))
    signals = volume((3, 3))
    want, want_sd = nlls.map(signals, uncertainty=True)
    report = {k: torch.as_tensor(v) for k, v in nlls.report.items()}
    with blochsim.distributed():
        got, got_sd = nlls.map(signals, uncertainty=True)
    same_maps(got, want)
    same_maps(got_sd, want_sd)
    same_maps(nlls.report, report)  # the per-voxel report is gathered with the maps
    with blochsim.distributed(gather=False):
        mine = nlls.map(signals)
    same_maps(mine, own_rows(rank, world, want))
    same_maps(nlls.report, own_rows(rank, world, report))
    # Per-voxel starts are cut to each rank's voxels with the volume.
    starts = {"T1": torch.linspace(800.0, 1600.0, 9).reshape(3, 3), "T2": 60.0}
    want = nlls.map(signals, initial=starts)
    with blochsim.distributed():
        got = nlls.map(signals, initial=starts)
    same_maps(got, want)


# -- PERK: each rank accumulates its own samples ------------------------------------------------------------
def check_perk(rank: int, world: int) -> None:
    # 1201 samples: rank 0 holds 600, so the 1000 rows the length scales are measured on span both ranks.
    t1, t2 = tissues(1201, 1)
    settings = {"n_features": 200, "feature_seed": 2}
    whole = PERK(ACQUISITION, **settings).fit(T1=t1, T2=t2, seed=0)
    with blochsim.distributed():
        split = PERK(ACQUISITION, **settings).fit(T1=t1, T2=t2, seed=0)
    # The length scales come from the same first rows, the features from the same seed: exact.
    assert torch.equal(split.length_scales, whole.length_scales)
    assert torch.equal(split.frequency, whole.frequency) and torch.equal(split.phase, whole.phase)
    assert same_on_every_rank(split.head) and same_on_every_rank(split.uncertainty_head)
    signals = volume()
    want, want_sd = whole.map(signals, uncertainty=True)
    got, got_sd = split.map(signals, uncertainty=True)
    same_maps(got, want, exact=False, rtol=PERK_SUM_ORDER)
    report = max(rel(got[n], want[n]) for n in want)
    # The SDs are regressions of small residuals: 1e-3 relative (as tests/test_perk.py's streamed fit).
    same_maps(got_sd, want_sd, exact=False, rtol=1e-3)

    # Given training signals: each rank accumulates its rows of them.
    given = {"signals": ACQUISITION.simulate(T1=t1, T2=t2), "parameters": {"T1": t1, "T2": t2}}
    with blochsim.distributed():
        split = PERK(**settings).fit(**given, seed=0)
    same_maps(split.map(signals), PERK(**settings).fit(**given, seed=0).map(signals), exact=False,
              rtol=PERK_SUM_ORDER)

    # Streamed training (each rank simulates its chunks when a pass asks); the first piece is 700 rows
    # (chunk=700), 600 of rank 0 and 100 of rank 1.
    streamed = PERK(ACQUISITION, stream=True, **settings).fit(T1=t1, T2=t2, seed=0, chunk=700)
    with blochsim.distributed():
        split = PERK(ACQUISITION, stream=True, **settings).fit(T1=t1, T2=t2, seed=0, chunk=700)
    assert torch.equal(split.length_scales, streamed.length_scales)
    same_maps(split.map(signals), streamed.map(signals), exact=False, rtol=PERK_SUM_ORDER)

    # A trained model's map: each voxel is computed alone, so the split changes no bit; the volume's gradient
    # comes back whole on every rank with gather=True.
    with blochsim.distributed():
        got = whole.map(signals)
    same_maps(got, whole.map(signals))
    x = signals.clone().requires_grad_()
    whole.map(x)["T1"].sum().backward()
    y = signals.clone().requires_grad_()
    with blochsim.distributed():
        whole.map(y)["T1"].sum().backward()
    assert torch.equal(y.grad, x.grad), rel(y.grad, x.grad)

    # Without a seed every rank takes rank 0's; training noise is each rank's own draw, the model the same.
    with blochsim.distributed():
        noisy = PERK(ACQUISITION, n_features=200).fit(T1=t1, T2=t2, noise_std=0.01)
    assert same_on_every_rank(noisy.head) and same_on_every_rank(noisy.frequency)
    h1, h2 = tissues(200, 7)
    maps = noisy.map(ACQUISITION.simulate(T1=h1, T2=h2))
    error = float(((maps["T1"] - h1).abs() / h1).median())
    assert error < 0.2, error  # 200 features, noise, a random seed: a working model (measured 0.05-0.06)
    print(f"rank {rank}: PERK split fit against one process: maps within {report:.1e} relative; noisy fit T1 "
          f"median error {error:.3f}")


def check_refusals(rank: int) -> None:
    t1, t2 = tissues(400, 1)
    try:
        with blochsim.distributed():
            PERK(ACQUISITION, n_features=50).fit(T1=t1, T2=t2, seed=0, rank=4)
    except ValueError as error:
        assert "rank=" in str(error) and "subspace=" in str(error), error
    else:
        raise AssertionError("PERK.fit(rank=) inside distributed() was not refused")
    try:
        with blochsim.distributed():
            DictionaryMatcher(ACQUISITION).fit(T1=t1 + rank, T2=t2)  # differs between the ranks
    except ValueError as error:
        assert "differ between ranks" in str(error) and "'T1'" in str(error), error
    else:
        raise AssertionError("training values that differ between ranks were not refused")


def case_estimators(rank: int, world: int) -> None:
    check_matcher(rank, world)
    check_lookup_and_least_squares(rank, world)
    check_perk(rank, world)
    check_refusals(rank)


def main() -> int:
    case = sys.argv[1]
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
    rank, world = dist.get_rank(), dist.get_world_size()
    try:
        globals()[f"case_{case}"](rank, world)
    except BaseException:
        traceback.print_exc()
        sys.stdout.flush()
        os._exit(1)
    print(f"rank {rank}: {case} passed")
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
