"""Kernel cases of issue 6 on the MRF train, through the engine's public entry points.

The train: an inversion, then per repetition excitation + sample + one-order shift + 10 ms; flips ramping
5 -> 60 -> 2 degrees; 32 orders; float32; T1 log-uniform in 200-3000 ms, T2 log-uniform in 10-300 ms capped
at 0.9 T1. `epg_*`: 500 repetitions (`complex`: quadratic RF phases, 117 degree increment); `pooled*`: 100
repetitions with exchanging and semisolid pools. `_grad`: gradient of sum |signal|^2 w.r.t. the flips;
`_hvp`: the (T1, T2) Jacobian with the flips requiring grad, then the gradient of sum |J|^2 w.r.t. the flips.

Per case: median wall time per call after a warm-up, synchronised; the first call; peak torch allocation.
Run: python benchmarks/kernel_cases.py --device cuda [--cases epg_real pooled ...] [--quick]
Writes a new benchmarks/results/kernel_cases-<device name>-<date>-<commit>.json (_records.py) and prints a
table against the incumbent.
"""

from __future__ import annotations

import argparse
import math
import platform
import statistics
import time
from datetime import datetime, timezone
from pathlib import Path

import torch
from _records import write_record

from blochsim import engine
from blochsim.sequence import TissueProperties, mrf_description

STATES = 32
POOL_B = dict(pool_b_fraction=0.15, pool_b_exchange_hz=10.0, t1_pool_b_ms=500.0, t2_pool_b_ms=20.0)
SEMISOLID = dict(bound_fraction=0.1, bound_exchange_hz=4.3, t1_bound_ms=1000.0)
POOL_C = dict(pool_c_fraction=0.05, pool_c_exchange_hz=20.0, t1_pool_c_ms=800.0, t2_pool_c_ms=40.0,
              pool_c_shift_hz=50.0)
POOL_D = dict(pool_d_fraction=0.03, pool_d_exchange_hz=30.0, t1_pool_d_ms=900.0, t2_pool_d_ms=60.0,
              pool_d_shift_hz=-80.0)
POOLS = {"": {}, "pooled": {**POOL_B, **SEMISOLID}, "pooledb": POOL_B,
         "pooled5": {**POOL_B, **POOL_C, **POOL_D, **SEMISOLID}}

#: The incumbent blochsim 0.0.14 (CUDA 13 build) on the same H200, median ms per call (issue 6).
INCUMBENT_MS = {
    ("epg_real", 2000): 3.04, ("epg_real", 100000): 8.79, ("epg_real", 1000000): 56.1,
    ("epg_complex", 2000): 4.74, ("epg_complex", 100000): 14.5,
    ("epg_real_grad", 2000): 23.3, ("epg_real_grad", 100000): 899.0, ("epg_complex_grad", 20000): 563.0,
    ("epg_real_hvp", 2000): 121.0, ("epg_real_hvp", 20000): 967.0, ("epg_complex_hvp", 5000): 989.0,
    ("pooled", 2000): 4.37, ("pooled", 50000): 7.67, ("pooled_grad", 20000): 225.0, ("pooled_hvp", 5000): 1600.0,
    ("pooledb_hvp", 20000): 1603.0, ("pooled5", 500): 10.1, ("pooled5", 5000): 13.1, ("pooled5_grad", 2000): 47.0,
}


def flips_deg(n: int) -> torch.Tensor:
    return torch.cat([torch.linspace(5, 60, n // 2), torch.linspace(60, 2, n - n // 2)])


def relaxation_maps(n: int, device) -> tuple:
    """(T1, T2) in ms of n tissues: T1 log-uniform 200-3000, T2 log-uniform 10-300 capped at 0.9 T1 (seed 0)."""
    g = torch.Generator().manual_seed(0)
    t1 = torch.exp(torch.empty(n).uniform_(math.log(200), math.log(3000), generator=g))
    t2 = torch.minimum(torch.exp(torch.empty(n).uniform_(math.log(10), math.log(300), generator=g)), 0.9 * t1)
    return t1.to(device), t2.to(device)


def tissue(n: int, device, pools: str) -> TissueProperties:
    t1, t2 = relaxation_maps(n, device)
    return TissueProperties(t1_ms=t1, t2_ms=t2, **POOLS[pools])


def case_train(name: str) -> tuple:
    """(quadratic RF phases?, repetitions, pool family, derivative kind) of a case name."""
    family, _, kind = name.partition("_")
    if family == "epg":
        return kind.startswith("complex"), 500, "", kind.partition("_")[2]
    return False, 100, family, kind


def case_fn(name: str, n: int, device):
    quadratic, reps, pools, kind = case_train(name)
    tis = tissue(n, device, pools)
    phases = [math.radians(117) * k * (k + 1) / 2 for k in range(reps)] if quadratic else 0
    base = torch.deg2rad(flips_deg(reps))

    def describe(flips):
        return mrf_description(flips, 0.010, phases_rad=phases)

    if kind == "":
        train = describe(base)
        return lambda: engine.simulate(train, tis, states=STATES)
    if kind == "grad":
        def grad():
            flips = base.clone().requires_grad_()
            signal = engine.simulate(describe(flips), tis, states=STATES)
            return torch.autograd.grad((signal.abs() ** 2).sum(), flips)[0]
        return grad
    if kind == "hvp":
        def hvp():
            flips = base.clone().requires_grad_()
            _, J = engine.jacobian(describe(flips), tis, ("t1_ms", "t2_ms"), states=STATES)
            return torch.autograd.grad((J.abs() ** 2).sum(), flips)[0]
        return hvp
    raise ValueError(name)


def sync(device):
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def measure(fn, device, repeats: int):
    sync(device)
    if torch.device(device).type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    fn()
    sync(device)
    first = time.perf_counter() - t0
    fn()
    times = []
    for _ in range(repeats):
        sync(device)
        t0 = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - t0)
    peak = torch.cuda.max_memory_allocated() if torch.device(device).type == "cuda" else None
    return first, statistics.median(times), peak


def fp32_floor_ms(n: int, device) -> tuple[float, float]:
    """The FP32 floor of epg_real at n tissues: flops per order update x updates / measured FP32 rate.

    Per repetition and order the real path runs one pass (epg.hpp `relax_rotate`: the interval, the shift
    and the pulse composed): t = F + G, w = a Z - b t, f' = E2 F + w, g' = E2 G + w, z' = c Z - d t, that is
    1 add, 2 multiplies and 4 FMAs: 11 FLOP, with FMAs counted as 2 (12 with the relaxation and the
    rotation apart, 18 before the rotation took 7 operations instead of 9; 2026-12-03). Updates: n x 500 x 32.
    """
    flop = 11.0 * n * 500 * STATES
    a = torch.randn(8192, 8192, device=device)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.mm(a, a)
    sync(device)
    t0 = time.perf_counter()
    for _ in range(5):
        torch.mm(a, a)
    sync(device)
    rate = 5 * 2 * 8192**3 / (time.perf_counter() - t0)
    return 1e3 * flop / rate, rate / 1e12


DEFAULT_CASES = [(name, n) for (name, n) in INCUMBENT_MS]


def select_cases(known: list, names: list | None, counts: list | None, quick: bool) -> list:
    """(case, tissues) pairs to run: `known` filtered by `names`, or every named case at `counts`; with
    `quick`, only each case's smallest size."""
    cases = [c for c in known if not names or c[0] in names]
    if counts:
        cases = [(name, n) for name in (names or sorted({name for name, _ in known})) for n in counts]
    if quick:
        smallest = {}
        for name, n in cases:
            smallest[name] = min(n, smallest.get(name, n))
        cases = sorted(smallest.items())
    return cases


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--cases", nargs="*", help="case names (default: all)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="only the smallest size of each case")
    parser.add_argument("--n", type=int, nargs="*", help="tissue counts to run every named case at")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args()
    cases = select_cases(DEFAULT_CASES, args.cases, args.n, args.quick)
    device = torch.device(args.device)
    card = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu"
    record = {"task": "kernel_cases", "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
              "device": card, "torch": torch.__version__, "results": []}
    print(f"{'case':<18}{'n':>9}{'first ms':>10}{'median ms':>11}{'peak MiB':>10}{'incumbent':>11}{'ratio':>7}")
    for name, n in cases:
        fn = case_fn(name, n, device)
        first, median, peak = measure(fn, device, args.repeats)
        inc = INCUMBENT_MS.get((name, n))
        row = {"case": name, "n": n, "first_ms": 1e3 * first, "median_ms": 1e3 * median,
               "peak_mib": None if peak is None else peak / 2**20, "incumbent_ms": inc}
        record["results"].append(row)
        ratio = f"{1e3 * median / inc:7.2f}" if inc else ""
        peak_s = f"{peak / 2**20:10.1f}" if peak is not None else f"{'-':>10}"
        print(f"{name:<18}{n:>9}{1e3 * first:>10.1f}{1e3 * median:>11.2f}{peak_s}{inc or '':>11}{ratio}", flush=True)
    if device.type == "cuda" and any(name == "epg_real" and n == 1000000 for name, n in cases):
        floor, tflops = fp32_floor_ms(1000000, device)
        record["fp32_floor_ms_epg_real_1e6"] = floor
        record["fp32_rate_tflops"] = tflops
        print(f"FP32 floor of epg_real at 1e6 tissues: {floor:.2f} ms (measured SGEMM rate {tflops:.1f} TFLOP/s)")
    tag = card if device.type == "cuda" else f"{card}-{torch.get_num_threads()}threads"
    print(f"wrote {write_record(args.out, 'kernel_cases', tag, record)}")


if __name__ == "__main__":
    main()
