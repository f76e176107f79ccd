"""Where a first pooled call's time goes on a GPU: the pool tables (torch ops) against the rest.

In a fresh process, after one epg_real 2k call (our library loaded): the first call of pooled, pooled5 and
pooledb at 2,000 tissues, with the time spent building pool tables, then pooled at 3,000 (tables rebuilt,
kernels loaded). `--per-op`: every torch op of pooled 2k's first table build timed with a synchronisation
around it, summed per op (CUDA loads each kernel lazily at its first launch).
Run: python benchmarks/first_call.py [--per-op]   (CUDA_MODULE_LOADING=EAGER to compare eager loading)
Results: benchmarks/results/first_call-*.txt.
"""

from __future__ import annotations

import argparse
import collections
import sys
import time
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, str(Path(__file__).parent))
import kernel_cases as kc  # noqa: E402

import blochsim.engine.pools as pools  # noqa: E402

_build_tables = pools._pool_tables


class _PerOp(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ms = collections.defaultdict(float)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = func(*args, **(kwargs or {}))
        torch.cuda.synchronize()
        self.ms[str(func)] += 1e3 * (time.perf_counter() - t0)
        return out


def first_call(name: str, n: int) -> tuple[float, float]:
    """The first call and a later one (kernel_cases.measure: the call after one warm call), ms."""
    first, later, _ = kc.measure(kc.case_fn(name, n, "cuda"), "cuda", repeats=1)
    return 1e3 * first, 1e3 * later


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--per-op", action="store_true")
    args = parser.parse_args()
    first, later = first_call("epg_real", 2000)
    print(f"epg_real 2k first / later ms {first:.1f} / {later:.2f}")
    if args.per_op:
        mode = _PerOp()

        def traced(*a, **k):
            with mode:
                return _build_tables(*a, **k)

        pools._pool_tables = traced
        total, _ = first_call("pooled", 2000)
        print(f"pooled 2k first call {total:.1f} ms (with a sync around every table op)")
        for op, ms in sorted(mode.ms.items(), key=lambda x: -x[1])[:16]:
            print(f"{ms:7.1f} ms  {op}")
        return
    spent = []

    def timed(*a, **k):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = _build_tables(*a, **k)
        torch.cuda.synchronize()
        spent.append(1e3 * (time.perf_counter() - t0))
        return out

    pools._pool_tables = timed
    for name, n in (("pooled", 2000), ("pooled5", 2000), ("pooledb", 2000), ("pooled", 3000)):
        spent.clear()
        first, later = first_call(name, n)
        print(f"{name} {n} first {first:.1f} ms (tables {spent[0] if spent else 0:.1f} ms), later {later:.2f} ms")


if __name__ == "__main__":
    main()
