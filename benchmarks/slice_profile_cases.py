"""Slice-resolved MRF (issue 25 item 3): V tissues at P slice positions against V * P voxels with ideal pulses.

The train is the benchmark MRF train (blochsim._benchmark_cases: flips ramping 5 -> 60 -> 2 degrees, one
sample and one shift per 10 ms repetition, an inversion first, 32 orders, float32) with every excitation a
slice-selective Hann-windowed sinc (time-bandwidth product 4, 2 ms). Cases, through `blochsim.engine.simulate`:

  slice          V tissues, `across_slice=P`: the kernels run V * P voxels in one launch, each position's pulse
                 read from the profile tables (complex path), and average the samples over the positions.
  ideal_complex  V * P tissues, ideal (hard) pulses, the complex path forced: the same kernel work without
                 the profiles, so slice / ideal_complex is what playing positions as voxels costs.
  ideal_real     V * P tissues, ideal pulses, the path the engine picks (real: one phase axis, no phase
                 physics). A profiled pulse turns each position about its own axis, so a slice-resolved train
                 cannot take the real path: slice / ideal_real includes that.

The issue's target: slice at V = 10,000, P = 64 at most 1.2 x ideal at 640,000 voxels. Each case is timed in
this process: one call first (for slice, it builds the profile tables: its time is reported apart), then
--repeats calls, the cases alternated over --rounds (order reversed every other round) so drift falls on all
alike; median and least wall time per case (on a shared machine the least is the steadier). The load averages
at start and end are recorded. With --library given more than once, each round runs each build in a process of
its own (BLOCHSIM_CPU_LIBRARY or BLOCHSIM_CUDA_LIBRARY set to it), the builds' order reversed every other round,
so a before/after comparison meets the same load; the record holds each build's cases and ratios.

  python benchmarks/slice_profile_cases.py --device cpu --tissues 1000 --positions 64 --flips 100
  python benchmarks/slice_profile_cases.py --device cuda            # the issue's size: 10k x 64, 500 flips
  python benchmarks/slice_profile_cases.py --device cpu --library old/libblochsim_cpu.so \
      --library new/libblochsim_cpu.so                               # builds compared, alternated per round

Writes a new benchmarks/results/slice_profile-<machine>-<date>-<commit>.json (_records.py) and prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _records import machine_name, write_record  # noqa: E402

STATES = 32
TR_S = 0.01


def sinc_pulse():
    from blochsim.sequence import rf_definition

    samples, lobes, dwell_s = 200, 2, 1e-5  # 2 ms, time-bandwidth product 4
    t = np.linspace(-lobes, lobes, samples)
    envelope = np.sinc(t) * np.hanning(samples + 2)[1:-1]
    return rf_definition(envelope, dwell_s=dwell_s, bandwidth_hz=2 * lobes / (samples * dwell_s))


def description(flips: int, shaped: bool):
    from blochsim._benchmark_cases import flips_deg
    from blochsim.sequence import mrf_description

    d = mrf_description(torch.deg2rad(torch.as_tensor(flips_deg(flips), dtype=torch.float64)), TR_S)
    if not shaped:
        return d
    import dataclasses

    return dataclasses.replace(d, rf_definitions={**d.rf_definitions, 0: sinc_pulse()})


def tissue(count: int, device: str):
    from blochsim._benchmark_cases import relaxation_maps
    from blochsim.sequence import TissueProperties

    t1, t2 = relaxation_maps(count, device)
    return TissueProperties(t1_ms=t1, t2_ms=t2)


def cases(args) -> dict:
    from blochsim.engine import simulate

    v, p = args.tissues, args.positions
    shaped, ideal = description(args.flips, True), description(args.flips, False)
    few, many = tissue(v, args.device), tissue(v * p, args.device)
    return {
        "slice": lambda: simulate(shaped, few, states=STATES, across_slice=p),
        "ideal_complex": lambda: simulate(ideal, many, states=STATES, path="complex"),
        "ideal_real": lambda: simulate(ideal, many, states=STATES),
    }


def timed(fn, device: str) -> float:
    from blochsim._benchmark_cases import sync

    sync(device)
    start = time.perf_counter()
    out = fn()
    sync(device)
    elapsed = time.perf_counter() - start
    del out
    return elapsed


def run_cases(args, rounds: int, reverse_first: bool = False) -> dict:
    """In this process: one first call per case, then `rounds` rounds of --repeats calls per case (order reversed
    every other round). {"first": {case: s}, "times": {case: [s]}, "peak_bytes": {case: bytes or None}}."""
    from blochsim._benchmark_cases import peak_bytes

    fns = cases(args)
    first = {name: timed(fn, args.device) for name, fn in fns.items()}  # warm-up; slice builds its tables
    times = {name: [] for name in fns}
    order = list(fns)[::-1] if reverse_first else list(fns)
    for r in range(rounds):
        for name in order if r % 2 == 0 else order[::-1]:
            times[name] += [timed(fns[name], args.device) for _ in range(args.repeats)]
    peaks = {name: peak_bytes(fn, args.device) for name, fn in fns.items()}
    return {"first": first, "times": times, "peak_bytes": peaks}


def run_libraries(args) -> dict[str, dict]:
    """run_cases per library, each round a process per library (the library order reversed every other round),
    so builds compared meet the same load on a shared machine. {library: run_cases' dict, rounds merged}."""
    variable = "BLOCHSIM_CUDA_LIBRARY" if args.device.startswith("cuda") else "BLOCHSIM_CPU_LIBRARY"
    argv = ["--device", args.device, "--tissues", str(args.tissues), "--positions", str(args.positions),
            "--flips", str(args.flips), "--repeats", str(args.repeats)]
    runs: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for library in args.library if r % 2 == 0 else args.library[::-1]:
                out = Path(tmp) / "round.json"
                subprocess.run([sys.executable, __file__, *argv, "--rounds", "1", "--round-json", str(out)]
                               + (["--reverse-first"] if r % 2 else []),
                               env={**os.environ, variable: str(library)}, check=True)
                got = json.loads(out.read_text())
                mine = runs.setdefault(str(library), {**got, "times": {name: [] for name in got["times"]}})
                for name, ts in got["times"].items():
                    mine["times"][name] += ts
    return runs


def summarise(run: dict) -> dict:
    summary = {name: {"first_s": run["first"][name], "median_s": statistics.median(ts), "least_s": min(ts),
                      "all_s": ts, "peak_bytes": run["peak_bytes"][name]}
               for name, ts in run["times"].items()}
    return {"cases": summary,
            "ratios_of_medians": {f"slice/{name}": summary["slice"]["median_s"] / summary[name]["median_s"]
                                  for name in ("ideal_complex", "ideal_real")},
            "ratios_of_least": {f"slice/{name}": summary["slice"]["least_s"] / summary[name]["least_s"]
                                for name in ("ideal_complex", "ideal_real")}}


def print_summary(result: dict) -> None:
    for name, s in result["cases"].items():
        print(f"  {name:14s} first {s['first_s']:8.3f} s  median {s['median_s']:8.3f} s  least {s['least_s']:8.3f} s")
    for kind in ("ratios_of_medians", "ratios_of_least"):
        print(f"  {kind}: " + ", ".join(f"{name} {value:.3f}" for name, value in result[kind].items()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--tissues", type=int, default=10000)
    parser.add_argument("--positions", type=int, default=64)
    parser.add_argument("--flips", type=int, default=500)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--library", type=Path, action="append", default=[],
                        help="a build of the library to time (the host's, or the CUDA one with --device cuda); "
                             "given more than once, each round runs each in a process of its own, alternated")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results")
    parser.add_argument("--no-record", action="store_true", help="print only (a trial run)")
    parser.add_argument("--round-json", type=Path, help=argparse.SUPPRESS)  # a --library round's process
    parser.add_argument("--reverse-first", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.round_json:
        args.round_json.write_text(json.dumps(run_cases(args, args.rounds, args.reverse_first)))
        return
    import blochsim
    from blochsim.engine.kernels import num_threads

    load_start = os.getloadavg()
    if args.library:
        results = {library: summarise(run) for library, run in run_libraries(args).items()}
    else:
        results = {"": summarise(run_cases(args, args.rounds))}
    load_end = os.getloadavg()
    device_name = torch.cuda.get_device_name(args.device) if args.device.startswith("cuda") else platform.processor()
    record = {
        "task": "slice_profile",
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": platform.node(),
        "device": args.device,
        "device_name": device_name,
        "threads": num_threads(),
        "blochsim": blochsim.__version__,
        "torch": torch.__version__,
        "load_average": {"start": load_start, "end": load_end},
        "settings": {"tissues": args.tissues, "positions": args.positions, "voxels": args.tissues * args.positions,
                     "flips": args.flips, "states": STATES, "dtype": "float32", "repeats": args.repeats,
                     "rounds": args.rounds},
    }
    if args.library:
        record["libraries"] = results  # each build's cases and ratios, by its path
    else:
        record.update(results[""])
    print(f"{args.tissues} tissues x {args.positions} positions = {args.tissues * args.positions} voxels, "
          f"{args.flips} flips, {STATES} orders, {args.device} ({device_name}), {num_threads()} threads, load "
          f"{load_start[0]:.1f} -> {load_end[0]:.1f}")
    for library, result in results.items():
        if library:
            print(library)
        print_summary(result)
    if not args.no_record:
        print("recorded", write_record(args.out, "slice_profile", machine_name(args.device), record))


if __name__ == "__main__":
    main()
