"""One call through the public API on a card, as a timeline: when the host works and when the card does.

Run: python benchmarks/call_timeline.py epg_real_grad:2000 [case:n ...] [--trace DIR]
Each case is api_cases.py's call (case_fn: the user's own tensors, made on the card). After five warm-up
calls, three synchronised calls run under torch.profiler; the second is printed: the GPU's work (kernels,
copies, memsets) with its start and length in ms from the call's start, the host's ops over 0.15 ms and
the runtime calls over 0.05 ms. A gap in the GPU's work while a host op runs is host time the call exposes.
--trace DIR writes each case's Chrome trace there. benchmarks/results/profile/torch-profiler-timelines-*
hold the printed timelines of recorded runs.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).parent))
from api_cases import case_fn  # noqa: E402


def timeline(trace: dict, call: int = 1) -> list[str]:
    """The rows of call number `call` (calls end at each cudaDeviceSynchronize) of a Chrome trace."""
    events = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
    syncs = sorted((e for e in events if e["name"] == "cudaDeviceSynchronize"), key=lambda e: e["ts"])
    starts = [min(e["ts"] for e in events)] + [s["ts"] + s["dur"] for s in syncs[:-1]]
    start, stop = starts[call], syncs[call]["ts"] + syncs[call]["dur"]
    rows = []
    for e in events:
        if not start <= e["ts"] < stop:
            continue
        cat = e.get("cat")
        kind = ("gpu" if cat in ("kernel", "gpu_memcpy", "gpu_memset") else
                "host" if cat == "cpu_op" and e["dur"] > 150 else
                "rt" if cat == "cuda_runtime" and e["dur"] > 50 else None)
        if kind:
            at, length = (e["ts"] - start) / 1e3, e["dur"] / 1e3
            rows.append((e["ts"], f"  {kind:<4} {at:8.3f} +{length:7.3f}  {e['name'][:100]}"))
    return [f"wall {(stop - start) / 1e3:.3f} ms"] + [text for _, text in sorted(rows)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("cases", nargs="+", metavar="case:n", help="api_cases.py case names and tissue counts")
    parser.add_argument("--trace", type=Path, help="write each case's Chrome trace to this directory")
    args = parser.parse_args()
    trace_dir = args.trace
    device = torch.device("cuda")
    for spec in args.cases:
        name, n = spec.split(":")
        fn = case_fn(name, int(n), device)
        for _ in range(5):
            fn()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        print(f"== {name} {n}: one call unprofiled {1e3 * (time.perf_counter() - t0):.3f} ms")
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(3):
                fn()
                torch.cuda.synchronize()
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "trace.json"
            prof.export_chrome_trace(str(path))
            trace = json.loads(path.read_text())
        if trace_dir:
            trace_dir.mkdir(parents=True, exist_ok=True)
            (trace_dir / f"trace-{name}-{n}.json").write_text(json.dumps(trace))
        print("\n".join(timeline(trace)))


if __name__ == "__main__":
    main()
