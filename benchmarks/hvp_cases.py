"""Hessian-vector products against gradients on the MRF cases (issue 24): `blochsim.hvp` of a cost of the
signal w.r.t. the flips, and the flip gradient of the same cost, alternated round by round.

The train and tissues are the kernel cases' (`blochsim._benchmark_cases`: an inversion, 500 FISP repetitions,
32 orders, float32; `epg_complex` with quadratic RF phases). The cost is the `_grad` cases' sum |signal|^2;
the direction a fixed random vector. Per round: one gradient (forward + VJP), one HVP (`blochsim.hvp`,
forward over reverse: the forward and its JVP, torch's loss on dual tensors, one second-order pass), and the
same product by reverse over reverse (`hvp`'s fallback, its method before: forward, VJP with its graph, the
second-order pass and a VJP for the cost's curvature), in that order, alternated; each one's ratio to the
round's gradient is taken per round and its median reported (target for `hvp`: at most 4). On the host the
1-minute load average at the start and end of the run goes in the record (the machine may be shared).

Run: python benchmarks/hvp_cases.py --device cuda [--cases epg_real epg_complex] [--n 2000 20000] [--rounds 7]
Writes a new benchmarks/results/hvp_cases-<machine>-<date>-<commit>.json (_records.py).
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

from blochsim import engine, hvp
from blochsim._benchmark_cases import STATES, case_train, flips_deg, peak_bytes, sync, tissue
from blochsim.hvp import reverse_over_reverse
from blochsim.sequence import mrf_description

DEFAULT_CASES = [("epg_real", 2000), ("epg_real", 20000), ("epg_complex", 5000)]


def case_calls(name: str, n: int, device):
    """(gradient(), hvp(), the same product by reverse over reverse) of sum |signal|^2 w.r.t. the flips (rad)
    of the case's train."""
    quadratic, reps, pools, _ = case_train(name)
    tis = tissue(n, device, pools)
    phases = [math.radians(117) * k * (k + 1) / 2 for k in range(reps)] if quadratic else 0
    base = torch.deg2rad(flips_deg(reps)).to(device)
    direction = torch.randn(reps, generator=torch.Generator().manual_seed(0)).to(device)

    def cost(flips):
        signal = engine.simulate(mrf_description(flips, 0.010, phases_rad=phases), tis, states=STATES)
        return (signal.abs() ** 2).sum()

    def gradient():
        flips = base.clone().requires_grad_()
        return torch.autograd.grad(cost(flips), flips)[0]

    def product():
        return hvp(cost, base, direction)

    def product_reverse():
        return reverse_over_reverse(cost, base, direction)

    return gradient, product, product_reverse


def timed(fn, device, cpu: dict | None = None) -> float:
    """Wall seconds of one call; `cpu[fn]` gets its CPU seconds (the process's threads together) appended."""
    sync(device)
    started, started_cpu = time.perf_counter(), time.process_time()
    fn()
    sync(device)
    if cpu is not None:
        cpu.setdefault(fn, []).append(time.process_time() - started_cpu)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--cases", nargs="*", help="epg_real, epg_complex (default: both)")
    parser.add_argument("--n", type=int, nargs="*", help="tissue counts to run every named case at")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args()
    names = args.cases or sorted({name for name, _ in DEFAULT_CASES})
    cases = [(name, n) for name in names for n in args.n] if args.n else \
        [c for c in DEFAULT_CASES if c[0] in names]
    device = torch.device(args.device)
    machine = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu"
    record = {"task": "hvp_cases", "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
              "device": machine, "torch": torch.__version__, "threads": torch.get_num_threads(),
              "rounds": args.rounds, "results": []}
    if device.type != "cuda":
        record["load_average_1min"] = {"start": os.getloadavg()[0]}
    print(f"{'case':<14}{'n':>8}{'gradient ms':>13}{'hvp ms':>10}{'hvp/grad':>10}{'rev-rev ms':>12}{'rev/grad':>10}"
          "  (medians of per-round ratios)")
    for name, n in cases:
        gradient, product, product_reverse = case_calls(name, n, device)
        first_grad, first_hvp = timed(gradient, device), timed(product, device)
        timed(product_reverse, device)
        grads, hvps, reverses, ratios, reverse_ratios, cpu = [], [], [], [], [], {}
        for r in range(args.rounds):
            order = [gradient, product, product_reverse]
            t = {fn: timed(fn, device, cpu) for fn in (order if r % 2 == 0 else order[::-1])}
            g, h, rr = t[gradient], t[product], t[product_reverse]
            grads.append(g)
            hvps.append(h)
            reverses.append(rr)
            ratios.append(h / g)
            reverse_ratios.append(rr / g)
        row = {"case": name, "n": n, "gradient_ms": 1e3 * statistics.median(grads),
               "hvp_ms": 1e3 * statistics.median(hvps), "hvp_over_gradient": statistics.median(ratios),
               "reverse_over_reverse_ms": 1e3 * statistics.median(reverses),
               "reverse_over_reverse_over_gradient": statistics.median(reverse_ratios),
               "hvp_over_reverse_over_reverse": statistics.median(h / rr for h, rr in zip(hvps, reverses, strict=True)),
               "first_gradient_ms": 1e3 * first_grad, "first_hvp_ms": 1e3 * first_hvp,
               "gradient_peak_bytes": peak_bytes(gradient, device), "hvp_peak_bytes": peak_bytes(product, device),
               "reverse_over_reverse_peak_bytes": peak_bytes(product_reverse, device)}
        if device.type != "cuda":  # CPU time: immune to waiting for a core on a shared machine, not to caches
            row["cpu_hvp_over_gradient"] = statistics.median(
                h / g for h, g in zip(cpu[product], cpu[gradient], strict=True))
            row["cpu_reverse_over_reverse_over_gradient"] = statistics.median(
                h / g for h, g in zip(cpu[product_reverse], cpu[gradient], strict=True))
        record["results"].append(row)
        print(f"{name:<14}{n:>8}{row['gradient_ms']:>13.1f}{row['hvp_ms']:>10.1f}{row['hvp_over_gradient']:>10.2f}"
              f"{row['reverse_over_reverse_ms']:>12.1f}{row['reverse_over_reverse_over_gradient']:>10.2f}", flush=True)
        if "cpu_hvp_over_gradient" in row:
            print(f"{'':<22}CPU time: hvp/grad {row['cpu_hvp_over_gradient']:.2f}, reverse over reverse/grad "
                  f"{row['cpu_reverse_over_reverse_over_gradient']:.2f}", flush=True)
    if device.type != "cuda":
        record["load_average_1min"]["end"] = os.getloadavg()[0]
    tag = machine if device.type == "cuda" else f"{machine}-{torch.get_num_threads()}threads"
    print(f"wrote {write_record(args.out, 'hvp_cases', tag, record)}")


if __name__ == "__main__":
    main()
