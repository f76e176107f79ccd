"""Estimators inside `blochsim.distributed()`: two gloo ranks on this machine (`_distributed_estimator_workers.py`).

On each rank, against the same fit or map made outside the block: `DictionaryMatcher.fit` (atoms simulated a
range per rank and all-gathered: bit for bit), `map` with known B1 and `match` (a `MatchResult`), gathered and
per rank (`shard_of`); `LookupTable`; `NonlinearLeastSquares.map` with standard errors and its per-voxel
report; `PERK.fit` (each rank accumulates its own samples, one all-reduce of the sums: maps within 1e-4,
length scales and features exact), streamed too, PERK's map and its volume gradient (exact), a seedless
noisy fit (the same model on every rank); and the refusals (PERK `rank=`, training values that differ).
"""

from __future__ import annotations

import pathlib
import subprocess
import sys

import pytest
import torch.distributed as dist
from conftest import rank_environment

import blochsim

HERE = pathlib.Path(__file__).resolve().parent
ROOT = pathlib.Path(blochsim.__file__).resolve().parents[1]  # where the blochsim under test is imported from
WORKERS = HERE / "_distributed_estimator_workers.py"

pytestmark = pytest.mark.skipif(not (dist.is_available() and dist.is_gloo_available()),
                                reason="torch.distributed with gloo is not available")


def test_estimators_on_two_ranks_agree_with_one_process():
    env = rank_environment(2)
    procs = [subprocess.Popen([sys.executable, str(WORKERS), "estimators"], env={**env, "RANK": str(r)},
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in range(2)]
    for rank, p in enumerate(procs):
        try:
            text, _ = p.communicate(timeout=300)
        except subprocess.TimeoutExpired:
            p.kill()
            text = p.communicate()[0] + "\n(killed after 300 s)"
        assert p.returncode == 0 and f"rank {rank}: estimators passed" in text, text
