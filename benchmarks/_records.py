"""Where a benchmark run is written: records are append-only.

Every run gets a new file named by task, machine, UTC date and commit (`<task>-<machine>-<date>-<commit>.json`,
`-dirty` when the working tree differs from the commit). A name that exists already gets `-2`, `-3`, ...:
an earlier record is never overwritten, so a number quoted from a file stays true.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path


def machine_name(device=None, threads: int | None = None) -> str:
    """The machine part of a record's name: the card's name for a CUDA run, else the CPU model, its core count
    and (when given) the threads the run used."""
    if device is not None and str(device).startswith("cuda"):
        import torch

        return torch.cuda.get_device_name(device)
    model = "cpu"
    if Path("/proc/cpuinfo").exists():
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    name = f"{model}-{os.cpu_count()}cpu"
    return name if threads is None else f"{name}-{threads}threads"


def commit_tag(root: Path | None = None) -> str:
    """The short commit of the checkout, `-dirty` when tracked files differ from it; 'nogit' outside git.

    `BLOCHSIM_RECORD_COMMIT` overrides it: a copy of the tree run on another machine may carry a stale `.git`.
    """
    if os.environ.get("BLOCHSIM_RECORD_COMMIT"):
        return os.environ["BLOCHSIM_RECORD_COMMIT"]
    root = root or Path(__file__).resolve().parent.parent
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True,
                                text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "nogit"
    return f"{commit}-dirty" if dirty else commit


def record_path(out: Path, task: str, machine: str, date: str) -> Path:
    """A new file under `out` for this run (see the module docstring); `date` is an ISO date or timestamp."""
    machine = re.sub(r"[^A-Za-z0-9._-]+", "_", machine).strip("_") or "machine"
    stem = f"{task}-{machine}-{date[:10]}-{commit_tag()}"
    path = out / f"{stem}.json"
    count = 2
    while path.exists():
        path = out / f"{stem}-{count}.json"
        count += 1
    return path


def write_record(out: Path, task: str, machine: str, record: dict) -> Path:
    """Write `record` (which holds a "date") to a new file under `out` and return its path."""
    out.mkdir(parents=True, exist_ok=True)
    path = record_path(out, task, machine, record["date"])
    record = {**record, "commit": commit_tag()}
    with open(path, "x") as stream:  # "x": fail rather than overwrite, whatever raced us
        stream.write(json.dumps(record, indent=2) + "\n")
    return path
