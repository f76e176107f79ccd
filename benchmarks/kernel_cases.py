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
import platform
import time
from datetime import datetime, timezone
from pathlib import Path

import torch
from _records import write_record

# The cases themselves (train, tissues, the incumbent's times, the timing loop) live in the package, shared
# with `blochsim bench`; they are re-exported here for api_cases.py and cpu_mrf_cases.py.
from blochsim._benchmark_cases import (  # noqa: F401
    DEFAULT_CASES,
    INCUMBENT_MS,
    POOLS,
    STATES,
    case_fn,
    case_train,
    flips_deg,
    measure,
    relaxation_maps,
    select_cases,
    sync,
    tissue,
)
from blochsim.sequence import mrf_description  # noqa: F401  (cpu_mrf_cases.py reads it from here)


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
