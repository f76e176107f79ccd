"""What bounds each derivative case on the card: its kernels' DRAM bytes and issued instructions against the
card's peaks, from ncu's counters of one call after two warm-ups, beside the forward of the same train and
tissues counted the same way.

A case's call (api_cases.case_fn: the public API, tensors made on the card) runs in a child process under
`ncu --profile-from-start off`; the child starts the profiler around the third call only. Per case and
kernel: GPU time, DRAM bytes read and written, warp instructions issued, achieved occupancy and registers.
Two floors follow from the counts: the bytes at the card's DRAM peak (`--bandwidth`, bytes per second: an
H100 SXM's 3.35e12 by default) and the instructions at one a scheduler and cycle (the multiprocessors'
schedulers at the clock ncu saw). A kernel near its byte floor is held by the bytes its scheme moves; one
far above both by its chain's latency at the occupancy its registers allow.

ncu replays each kernel once per counter pass, so the GPU times here are its own (each kernel alone, caches
flushed); the wall times of the same calls are in api_cases.py's records.

Run (on a card, ncu on PATH): python benchmarks/adjoint_bounds.py [case:n ...] [--out DIR]
Writes a new record, benchmarks/results/profile/adjoint_bounds-<card>-<date>-<commit>.json (_records.py).
Default cases: issue 29's derivative cases outside their bounds in the last record.
"""

from __future__ import annotations

import argparse
import csv
import io
import os
import re
import shutil
import subprocess
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path

HERE = Path(__file__).resolve().parent
DEFAULT_CASES = ["epg_real_grad:100000", "epg_complex_grad:20000", "pooled_grad:20000", "epg_real_hvp:20000",
                 "epg_complex_hvp:5000", "pooled_hvp:5000", "pooledb_hvp:20000"]
METRICS = {
    "gpu__time_duration.sum": "ns",
    "dram__bytes_read.sum": "read",
    "dram__bytes_write.sum": "written",
    "smsp__inst_executed.sum": "instructions",
    "sm__warps_active.avg.pct_of_peak_sustained_active": "occupancy_pct",
    "launch__registers_per_thread": "registers",
    "sm__cycles_elapsed.avg.per_second": "sm_hz",
    "launch__sm_count": "sms",
}
SCHEDULERS_PER_SM = 4
#: With --stalls, what each warp waited on (ncu's warp-state counters: cycles stalled per instruction issued,
#: by reason), kept per kernel as stall_<reason>.
_STALL_PREFIX, _STALL_SUFFIX = "smsp__average_warps_issue_stalled_", "_per_issue_active.ratio"
STALLS = f"regex:{re.escape(_STALL_PREFIX)}.*{re.escape(_STALL_SUFFIX)}"
_STALL_KEY = "stall_"


def child(case: str, n: int) -> None:
    """Two warm-up calls, then the profiled one."""
    import torch
    from api_cases import case_fn

    fn = case_fn(case, n, torch.device("cuda"))
    for _ in range(2):
        fn()
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    fn()
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()


def profile(case: str, n: int, ncu: str, stalls: bool = False) -> list[dict]:
    """Per kernel of the case's third call: its counters (METRICS' names; with `stalls`, STALLS' too)."""
    metrics = [*METRICS, STALLS] if stalls else list(METRICS)
    with tempfile.TemporaryDirectory() as scratch:
        log = Path(scratch) / "ncu.csv"
        subprocess.run([ncu, "--profile-from-start", "off", "--metrics", ",".join(metrics), "--csv",
                        "--print-units", "base", "--log-file", str(log), sys.executable, __file__, "--child",
                        f"{case}:{n}"], check=True, env={**os.environ, "PYTHONPATH": os.pathsep.join(
                            [str(HERE), str(HERE.parent), os.environ.get("PYTHONPATH", "")])})
        return kernel_counters(log.read_text())


def kernel_counters(text: str) -> list[dict]:
    """ncu's --csv log (one row a kernel and metric) as one dict a kernel, METRICS' short names."""
    rows = [line for line in text.splitlines() if line.startswith('"')]  # (ncu's own notes start with ==)
    kernels: dict[str, dict] = {}
    for row in csv.DictReader(io.StringIO("\n".join(rows))):
        k = kernels.setdefault(row["ID"], {"kernel": row["Kernel Name"].split("(")[0].replace("void ", "")})
        metric = row["Metric Name"]
        if metric.startswith(_STALL_PREFIX) and metric.endswith(_STALL_SUFFIX):
            name = _STALL_KEY + metric[len(_STALL_PREFIX):-len(_STALL_SUFFIX)]
        else:
            name = METRICS[metric]
        try:
            k[name] = float(row["Metric Value"].replace(",", ""))
        except ValueError:  # (n/a: a counter this launch lacks)
            k[name] = 0.0
    return list(kernels.values())


def top_stalls(kernel: dict, count: int = 5) -> str:
    """The kernel's largest stall reasons, cycles a warp waited per instruction it issued."""
    stalls = sorted(((v, k[len(_STALL_KEY):]) for k, v in kernel.items() if k.startswith(_STALL_KEY)),
                    reverse=True)[:count]
    return ", ".join(f"{name} {v:.1f}" for v, name in stalls)


def summary(kernels: list[dict], bandwidth: float) -> dict:
    """The case's totals and its two floors (ms)."""
    ms = sum(k.get("ns", 0.0) for k in kernels) / 1e6
    moved = sum(k.get("read", 0.0) + k.get("written", 0.0) for k in kernels)
    issue_ms = sum(k.get("instructions", 0.0) / (SCHEDULERS_PER_SM * k["sms"] * k["sm_hz"])
                   for k in kernels if k.get("sms") and k.get("sm_hz")) * 1e3
    return {"gpu_ms": ms, "dram_bytes": moved, "byte_floor_ms": moved / bandwidth * 1e3, "issue_floor_ms": issue_ms,
            "launches": len(kernels)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("cases", nargs="*", default=DEFAULT_CASES, help="case:n (api_cases.py's names)")
    parser.add_argument("--bandwidth", type=float, default=3.35e12, help="the card's DRAM peak, bytes/s")
    parser.add_argument("--out", type=Path, default=HERE / "results" / "profile",
                        help="the directory of the record (per-kernel counts and summaries)")
    parser.add_argument("--stalls", action="store_true",
                        help="also what the warps waited on (ncu's warp-state counters), per kernel")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        case, n = args.child.split(":")
        child(case, int(n))
        return
    ncu = shutil.which("ncu")
    if ncu is None:
        sys.exit("adjoint_bounds: ncu not on PATH")
    import torch
    from _records import machine_name, write_record
    from api_cases import forward_of

    date = datetime.now(timezone.utc).isoformat(timespec="seconds")

    results = []
    print(f"{'case':<18}{'n':>8}{'gpu ms':>9}{'MB moved':>10}{'byte floor':>11}{'issue floor':>12}"
          f"{'launches':>9}  kernels (ms, MB, occupancy %, registers)")
    for spec in args.cases:
        case, n = spec.split(":")
        for name in (forward_of(case), case):
            try:
                kernels = profile(name, int(n), ncu, args.stalls)
            except subprocess.CalledProcessError as failed:
                print(f"{name:<18}{n:>8}  ncu failed (exit {failed.returncode})", flush=True)
                continue
            s = summary(kernels, args.bandwidth)
            results.append({"case": name, "n": int(n), **s, "kernels": kernels})
            detail = "; ".join(f"{k['kernel'][:60]} {k.get('ns', 0) / 1e6:.2f} "
                               f"{(k.get('read', 0) + k.get('written', 0)) / 1e6:.0f} "
                               f"{k.get('occupancy_pct', 0):.0f} {k.get('registers', 0):.0f}"
                               for k in sorted(kernels, key=lambda k: -k.get("ns", 0))[:4])
            print(f"{name:<18}{n:>8}{s['gpu_ms']:>9.2f}{s['dram_bytes'] / 1e6:>10.0f}{s['byte_floor_ms']:>11.2f}"
                  f"{s['issue_floor_ms']:>12.2f}{s['launches']:>9}  {detail}", flush=True)
            if args.stalls:
                for k in sorted(kernels, key=lambda k: -k.get("ns", 0))[:2]:
                    print(f"    stalls of {k['kernel'][:60]}: {top_stalls(k)}", flush=True)
    card = machine_name(torch.device("cuda"))
    record = {"task": "adjoint_bounds", "date": date, "device": card, "torch": torch.__version__,
              "bandwidth": args.bandwidth, "results": results}
    print("wrote", write_record(args.out, "adjoint_bounds", card, record))


if __name__ == "__main__":
    main()
