"""The MRF dictionary task on the CPU (issue 3): forward, (T1, T2) Jacobian, flip gradient, complex path.

The train: an inversion, then 500 repetitions of excitation, sample, one-order shift and 10 ms; flips
ramping 5 -> 60 -> 2 degrees; 32 orders; float32; T1 log-uniform in 200-3000 ms and T2 log-uniform in
10-300 ms. The complex case adds quadratic RF phase increments of 117 degrees.

Run: python benchmarks/mrf_dictionary.py [--tissues 1000 10000] [--repeats 3]
Writes a new benchmarks/results/mrf_dictionary-<host>-<date>-<commit>.json (_records.py) and prints a table.
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import statistics
import time
from datetime import datetime, timezone
from pathlib import Path

import torch
from _records import write_record

from blochsim import engine
from blochsim.engine import kernels
from blochsim.sequence import TissueProperties, mrf_description

REPETITIONS = 500
STATES = 32


def flip_ramp_deg(n: int = REPETITIONS) -> torch.Tensor:
    half = n // 2
    return torch.cat([torch.linspace(5, 60, half), torch.linspace(60, 2, n - half)])


def tissues(n: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    t1 = torch.exp(torch.empty(n).uniform_(math.log(200), math.log(3000), generator=g))
    t2 = torch.exp(torch.empty(n).uniform_(math.log(10), math.log(300), generator=g))
    return t1, t2


def describe(flips_deg: torch.Tensor, quadratic: bool):
    n = flips_deg.numel()
    phases = [math.radians(117) * k * (k + 1) / 2 for k in range(n)] if quadratic else 0
    return mrf_description(torch.deg2rad(flips_deg), 0.010, phases_rad=phases)


def timed(fn, repeats: int):
    t0 = time.perf_counter()
    fn()
    first = time.perf_counter() - t0
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return first, statistics.median(times)


def cases(n: int):
    t1, t2 = tissues(n)
    tissue = TissueProperties(t1_ms=t1, t2_ms=t2)

    # A dictionary is simulated on a fixed train: its description is built once. The flip gradient
    # rebuilds the description from the flip tensor on every call, as a design loop does.
    trains = {q: describe(flip_ramp_deg(), q) for q in (False, True)}

    def forward(quadratic=False):
        return engine.simulate(trains[quadratic], tissue, states=STATES)

    def jac(quadratic=False):
        return engine.jacobian(trains[quadratic], tissue, ("t1_ms", "t2_ms"), states=STATES)

    def grad():
        flips = flip_ramp_deg().requires_grad_()
        signal = engine.simulate(describe(flips, False), tissue, states=STATES)
        (signal.abs() ** 2).sum().backward()
        return flips.grad

    return {
        "forward": forward,
        "jacobian_t1_t2": jac,
        "grad_flips": grad,
        "complex_forward": lambda: forward(True),
        "complex_jacobian_t1_t2": lambda: jac(True),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tissues", type=int, nargs="+", default=[1000, 10000])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args()
    record = {
        "task": "mrf_dictionary",
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": platform.node(),
        "processor": platform.processor() or platform.machine(),
        "cpus": os.cpu_count(),
        "threads": kernels.num_threads(),
        "torch": torch.__version__,
        "results": [],
    }
    print(f"{'case':<26}{'tissues':>8}{'first s':>10}{'median s':>10}")
    for n in args.tissues:
        for name, fn in cases(n).items():
            first, median = timed(fn, args.repeats)
            record["results"].append({"case": name, "tissues": n, "first_s": first, "median_s": median})
            print(f"{name:<26}{n:>8}{first:>10.3f}{median:>10.3f}", flush=True)
    print(f"wrote {write_record(args.out, 'mrf_dictionary', platform.node(), record)}")


if __name__ == "__main__":
    main()
