"""A fresh `pip install .` of this commit, as the README's first set-up command runs it (issue 27: under 90 s
on 2 cores).

Each trial clones the checkout's HEAD into a new folder, makes a new virtual environment (with the system's
site-packages, so torch is there as on a machine that followed the README's first step), and times
`pip install .` in it: wall seconds and the CPU seconds of pip and everything it ran (the compilers
included), with the 1-minute load average before and after (the build's own jobs raise the second). The
machine's other work shows in both: on a shared VM run it when nothing else does, and read several trials.

Run: python benchmarks/fresh_install.py [--trials 3]
Writes a new benchmarks/results/fresh_install-<machine>-<date>-<commit>.json (_records.py).
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

from _records import machine_name, write_record

ROOT = Path(__file__).resolve().parent.parent


def children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def trial(work: Path) -> dict:
    """One fresh clone, venv and `pip install .`; its wall and CPU seconds."""
    clone, venv = work / "clone", work / "venv"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True)
    load_before = os.getloadavg()[0]
    cpu_before, started = children_cpu_s(), time.perf_counter()
    done = subprocess.run([str(venv / "bin" / "pip"), "install", "-q", "."], cwd=clone, capture_output=True,
                          text=True)
    wall, cpu = time.perf_counter() - started, children_cpu_s() - cpu_before
    if done.returncode != 0:
        raise SystemExit(f"pip install . failed:\n{done.stderr[-3000:]}")
    return {"wall_s": wall, "cpu_s": cpu, "load_before": load_before, "load_after": os.getloadavg()[0]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args()
    trials = []
    for i in range(args.trials):
        work = Path(tempfile.mkdtemp(prefix="blochsim-fresh-install-"))
        try:
            trials.append(trial(work))
        finally:
            shutil.rmtree(work, ignore_errors=True)
        t = trials[-1]
        print(f"trial {i + 1}: {t['wall_s']:.1f} s wall, {t['cpu_s']:.1f} s CPU, load {t['load_before']:.2f} -> "
              f"{t['load_after']:.2f}", flush=True)
    record = {"task": "fresh_install", "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
              "cores": os.cpu_count(), "trials": trials,
              "median_wall_s": statistics.median(t["wall_s"] for t in trials),
              "median_cpu_s": statistics.median(t["cpu_s"] for t in trials)}
    print(f"median {record['median_wall_s']:.1f} s wall, {record['median_cpu_s']:.1f} s CPU")
    print(f"wrote {write_record(args.out, 'fresh_install', machine_name(), record)}")


if __name__ == "__main__":
    main()
