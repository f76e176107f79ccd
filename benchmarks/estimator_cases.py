"""Estimator cases: dictionary matching at scale and voxel-parallel least squares.

Dictionary cases (`dict_*`): atoms simulated on the MRF train of the kernel cases (500 repetitions, flips
5 -> 60 -> 2 degrees, TR 10 ms, 32 orders), T1 log-uniform 200-3000 ms and T2 10-300 ms (T2 <= 0.9 T1);
voxels from other tissues of the same ranges (seed 1), M0 0.5-1.5 with a random receive phase, and noise of SD
0.005 on the real and imaginary parts. Each case reports the fit (simulation, compression, grouping) and the
median `map` time, the median relative T1 and T2 errors against the voxels' truth, and the fraction of voxels
whose atom equals the exhaustive full-contrast match (`agree`, when that reference was run: with noise, atoms
that nearly tie may swap under compression).

* CPU (`--device cpu`): 100k atoms x `--voxels` (default 10k): exhaustive over all 500 contrasts, exhaustive
  at rank 10, grouped (256 groups, prune 0) at rank 10.
* CUDA (`--device cuda`): 1M atoms x 1M voxels at rank 10, exhaustive and grouped (1024 groups); and 1M atoms
  x 100k voxels over all contrasts.

Least squares (`nlls_*`): 10k voxels of the MRF train above (T1 and T2 free, amplitude eliminated, started
from a 2000-atom match), and 20k voxels of a 10-echo decay (TE 10..100 ms, T2 alone, M0 fixed) against
scipy.optimize.least_squares voxel by voxel (timed on the first 500 voxels and scaled to 20k; the spec's
target is at least 20x).

Run: python benchmarks/estimator_cases.py --device cpu [--voxels 10000] [--repeats 3] [--cases ...]
Writes a new benchmarks/results/estimator_cases-<machine>-<date>-<commit>.json (_records.py).
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
from _records import machine_name, write_record

from blochsim._benchmark_cases import flips_deg, relaxation_maps
from blochsim.estimators import DictionaryMatcher, NonlinearLeastSquares
from blochsim.simulators import MRFSimulator, MultiEchoSimulator

REPETITIONS = 500
STATES = 32
NOISE_SD = 0.005

#: case -> (device type, atoms, voxels (None: --voxels), rank, groups); the full-contrast exhaustive case of a
#: device comes first and is the reference of `agree`.
DICTIONARY_CASES = {
    "dict_cpu_full": ("cpu", 100_000, None, None, None),
    "dict_cpu_rank10": ("cpu", 100_000, None, 10, None),
    "dict_cpu_rank10_grouped": ("cpu", 100_000, None, 10, 256),
    "dict_cuda_full_100k_voxels": ("cuda", 1_000_000, 100_000, None, None),
    "dict_cuda_rank10": ("cuda", 1_000_000, 1_000_000, 10, None),
    "dict_cuda_rank10_grouped": ("cuda", 1_000_000, 1_000_000, 10, 1024),
}
NLLS_CASES = ("nlls_mrf_10k", "nlls_multiecho_20k")


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn, device: torch.device) -> tuple:
    sync(device)
    t0 = time.perf_counter()
    out = fn()
    sync(device)
    return out, time.perf_counter() - t0


def mrf() -> MRFSimulator:
    return MRFSimulator(flip=flips_deg(REPETITIONS), TR=10.0, states=STATES)


def simulated(t1: torch.Tensor, t2: torch.Tensor, device: torch.device) -> torch.Tensor:
    """MRF signals of the tissues, simulated on `device` 100k at a time (the host stays within a few GB)."""
    parts = [mrf().simulate(T1=t1[start:start + 100_000].to(device), T2=t2[start:start + 100_000].to(device))
             for start in range(0, t1.shape[0], 100_000)]
    return torch.cat(parts)


def volume(count: int, device: torch.device, seed: int = 1) -> tuple:
    """(MRF signals of `count` tissues (not the atoms' own), scaled, turned and noisy, on `device`; their T1;
    their T2)."""
    g = torch.Generator().manual_seed(seed)
    t1 = torch.exp(torch.empty(count).uniform_(math.log(200), math.log(3000), generator=g))
    t2 = torch.minimum(torch.exp(torch.empty(count).uniform_(math.log(10), math.log(300), generator=g)), 0.9 * t1)
    amplitude = torch.polar(0.5 + torch.rand(count, generator=g), 2 * math.pi * torch.rand(count, generator=g))
    signal = simulated(t1, t2, device) * amplitude.to(device, torch.complex64)[:, None]
    noise = torch.view_as_complex(torch.randn(signal.shape + (2,), generator=g).to(device))
    return signal + NOISE_SD * noise, t1, t2


def median_errors(t1_found, t2_found, t1, t2) -> dict:
    """Median relative errors (%) of T1 and T2 against the truth."""
    return {"t1_median_error_pct": 100 * float(((t1_found.cpu() - t1) / t1).abs().median()),
            "t2_median_error_pct": 100 * float(((t2_found.cpu() - t2) / t2).abs().median())}


def dictionary_case(name: str, device: torch.device, voxels_default: int, repeats: int, reference: dict) -> dict:
    _, atoms, voxels, rank, groups = DICTIONARY_CASES[name]
    voxels = voxels or voxels_default
    t1, t2 = relaxation_maps(atoms, "cpu")
    signals, truth_t1, truth_t2 = volume(voxels, device)

    def fit():  # atoms simulated on the device and given: compression and grouping run there too
        return DictionaryMatcher(groups=groups, prune=0.0).fit(signals=simulated(t1, t2, device),
                                                               parameters={"T1": t1, "T2": t2}, rank=rank, seed=0)

    matcher, fit_s = timed(fit, device)
    result, first_s = timed(lambda: matcher.match(signals), device)
    times = [timed(lambda: matcher.match(signals), device)[1] for _ in range(repeats)]
    row = {"case": name, "atoms": atoms, "voxels": voxels, "contrasts": REPETITIONS, "rank": rank,
           "groups": groups, "fit_s": fit_s, "map_first_s": first_s, "map_median_s": statistics.median(times),
           "map_times_s": times}
    best = result.indices[:, 0].cpu()
    row.update(median_errors(t1[best], t2[best], truth_t1, truth_t2))
    if rank is None and groups is None:
        reference[(device.type, voxels)] = best
    elif (device.type, voxels) in reference:
        row["agree"] = float((best == reference[(device.type, voxels)]).float().mean())
    if device.type == "cuda":
        row["peak_allocated_bytes"] = torch.cuda.max_memory_allocated(device)
    return row


def nlls_mrf(device: torch.device, repeats: int) -> dict:
    signals, truth_t1, truth_t2 = volume(10_000, device, seed=2)
    nlls = NonlinearLeastSquares(mrf()).fit(T1=(200.0, 3000.0), T2=(10.0, 300.0), noise_std=NOISE_SD, seed=0)
    maps, first_s = timed(lambda: nlls.map(signals), device)
    times = [timed(lambda: nlls.map(signals), device)[1] for _ in range(repeats)]
    report = nlls.report
    return {"case": "nlls_mrf_10k", "voxels": 10_000, "contrasts": REPETITIONS, "map_first_s": first_s,
            "map_median_s": statistics.median(times), "map_times_s": times,
            "mean_iterations": float(report["iterations"].float().mean()),
            "converged": float(report["converged"].float().mean()),
            **median_errors(maps["T1"], maps["T2"], truth_t1, truth_t2)}


def nlls_multiecho(device: torch.device, repeats: int) -> dict:
    import numpy as np
    from scipy.optimize import least_squares

    te = torch.arange(1, 11) * 10.0
    model = MultiEchoSimulator(TE=te)
    g = torch.Generator().manual_seed(3)
    count, sd = 20_000, 0.01
    t2 = 20 + 180 * torch.rand(count, generator=g)
    signals = (model.simulate(T2=t2) + sd * torch.randn(count, 10, generator=g)).to(device)
    nlls = NonlinearLeastSquares(model, amplitude=False, start="center").fit(T2=(5.0, 400.0), noise_std=sd)
    _, first_s = timed(lambda: nlls.map(signals), device)
    times = [timed(lambda: nlls.map(signals), device)[1] for _ in range(repeats)]
    # scipy, voxel by voxel, on the same model in numpy (M0 fixed at 1), from the same start (mid-range).
    y = signals.cpu().double().numpy()
    te_np = te.double().numpy()
    sample = 500
    t0 = time.perf_counter()
    for i in range(sample):
        least_squares(lambda p, yi=y[i]: np.exp(-te_np / p[0]) - yi, x0=[202.5], bounds=([5.0], [400.0]))
    scipy_s = (time.perf_counter() - t0) * count / sample
    ours = statistics.median(times)
    return {"case": "nlls_multiecho_20k", "voxels": count, "contrasts": 10, "map_first_s": first_s,
            "map_median_s": ours, "map_times_s": times, "scipy_per_voxel_s_scaled": scipy_s,
            "scipy_sampled_voxels": sample, "speedup_vs_scipy": scipy_s / ours}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--voxels", type=int, default=10_000, help="voxels of the CPU dictionary cases")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--cases", nargs="*", help="case names (default: every case of the device)")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    names = args.cases or [n for n, c in DICTIONARY_CASES.items() if c[0] == device.type] + list(NLLS_CASES)
    unknown = [n for n in names if n not in DICTIONARY_CASES and n not in NLLS_CASES]
    if unknown:
        raise SystemExit(f"unknown case {unknown[0]!r}; cases: {list(DICTIONARY_CASES) + list(NLLS_CASES)}")
    record = {"task": "estimator_cases", "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
              "machine": machine_name(device, torch.get_num_threads()), "platform": platform.platform(),
              "torch": torch.__version__, "threads": torch.get_num_threads(), "device": str(device),
              "load_average_before": os.getloadavg(), "repetitions": REPETITIONS, "states": STATES,
              "noise_sd": NOISE_SD, "results": []}
    reference: dict = {}
    for name in names:
        if name in DICTIONARY_CASES:
            row = dictionary_case(name, device, args.voxels, args.repeats, reference)
        elif name == "nlls_mrf_10k":
            row = nlls_mrf(device, args.repeats)
        else:
            row = nlls_multiecho(device, args.repeats)
        record["results"].append(row)
        extra = {k: row[k] for k in ("fit_s", "agree", "t1_median_error_pct", "t2_median_error_pct", "converged",
                                     "speedup_vs_scipy") if k in row}
        print(f"{name:<28} map {row['map_median_s']:8.3f} s  " + "  ".join(f"{k} {v:.3g}" for k, v in extra.items()),
              flush=True)
    record["load_average_after"] = os.getloadavg()
    path = write_record(args.out, "estimator_cases", record["machine"], record)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
