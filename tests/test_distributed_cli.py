"""`blochsim dictionary` on several processes: `torchrun --nproc-per-node N -m blochsim dictionary ...`.

Two gloo ranks on this machine: launched by torchrun as users do, the file equals the one-process run's bit
for bit; a two-rank run killed (SIGKILL) part-way resumes on two ranks to the same file; a rank 0 that
refuses the request makes the other rank fail too, naming it. The ranks of the last two are started as
torchrun starts them (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT in the environment), so the test holds
their process ids.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch.distributed as dist
from conftest import rank_environment

import blochsim
from blochsim.cli import main

ROOT = Path(blochsim.__file__).resolve().parents[1]  # where the blochsim under test is imported from

pytestmark = pytest.mark.skipif(not (dist.is_available() and dist.is_gloo_available()),
                                reason="torch.distributed with gloo is not available")

#: A small MRF dictionary: a 6 x 5 grid in chunks of 7 (5 chunks, the last short).
SMALL = ["dictionary", "mrf", "-p", "flip=5:60:30", "-p", "TR=10", "--states", "8",
         "--grid", "T1=200:3000:6:log", "--grid", "T2=10:300:5:log", "--chunk-size", "7"]
#: Enough work that a kill lands mid-run: complex path (RF phases), 64 orders, one thread per rank: 48 chunks
#: of ~30 ms on an idle core, 24 per rank, against a poll every 10 ms.
LARGE = ["dictionary", "mrf", "-p", "flip=5:60:200", "-p", "TR=10", "-p", "phases=0:3000:200", "--states", "64",
         "--random", "4800", "--range", "T1=200:3000:log", "--range", "T2=10:300:log", "--chunk-size", "100"]


def _start_ranks(argv: list, world: int = 2) -> list:
    """`python -m blochsim ARGV` on `world` ranks, in the environment torchrun gives them."""
    env = rank_environment(world)
    return [subprocess.Popen([sys.executable, "-m", "blochsim", *map(str, argv)], cwd=ROOT,
                             env={**env, "RANK": str(r), "LOCAL_RANK": str(r)}, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True) for r in range(world)]


def _finish(procs: list, timeout_s: float = 180) -> list:
    """[(return code, output)] of each rank, in rank order."""
    out = []
    for p in procs:
        try:
            text, _ = p.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            p.kill()
            text, _ = p.communicate()
            text += f"\n(killed after {timeout_s} s)"
        out.append((p.returncode, text))
    return out


def _one_process(capsys, argv: list, out: Path) -> dict:
    assert main([*map(str, argv), "-o", str(out)]) == 0, capsys.readouterr().err
    return _load(out)


def _load(path: Path) -> dict:
    with np.load(path, allow_pickle=False) as data:
        return {k: data[k] for k in data.keys()}


def _assert_same(got: dict, want: dict) -> None:
    assert got.keys() == want.keys()
    for key, value in want.items():
        np.testing.assert_array_equal(got[key], value, err_msg=key)  # chunks are computed alone: bit for bit


def test_torchrun_dictionary_equals_one_process(capsys, tmp_path):
    out = tmp_path / "ranks.npz"
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes", "1",
               "--nproc-per-node", "2", "-m", "blochsim", *SMALL, "-o", str(out)]
    done = subprocess.run(command, env=rank_environment(), cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "5 of 5 chunks computed by 2 processes" in done.stdout, done.stdout
    assert not (tmp_path / "ranks.npz.parts").exists()
    _assert_same(_load(out), _one_process(capsys, SMALL, tmp_path / "one.npz"))


def test_killed_ranks_resume_to_the_same_file(capsys, tmp_path):
    """Both ranks SIGKILLed once each has listed a chunk (rank 0 in the manifest, rank 1 in its progress file);
    two ranks started again resume from the merged lists and finish the file of an uninterrupted run."""
    out = tmp_path / "killed.npz"
    parts = tmp_path / "killed.npz.parts"
    manifest, progress = parts / "manifest.json", parts / "done-rank-1.json"
    procs = _start_ranks([*LARGE, "-o", out])
    deadline = time.monotonic() + 240
    try:
        while time.monotonic() < deadline and all(p.poll() is None for p in procs):
            try:
                if json.loads(manifest.read_text())["done"] and json.loads(progress.read_text())["done"]:
                    break
            except (OSError, ValueError, KeyError):  # not written yet
                pass
            time.sleep(0.01)
        running = all(p.poll() is None for p in procs)
        for p in procs:
            p.send_signal(signal.SIGKILL)
    finally:
        ended = _finish(procs, timeout_s=60)
    assert running, f"a rank ended before the kill: {ended}"
    listed = set(json.loads(manifest.read_text())["done"]) | set(json.loads(progress.read_text())["done"])
    assert 2 <= len(listed) < 48 and not out.exists()

    (code0, text0), (code1, text1) = _finish(_start_ranks([*LARGE, "-o", out]))
    assert code0 == 0 and code1 == 0, text0 + text1
    assert f"{len(listed)} of 48 chunks already done" in text0, text0
    assert f"{48 - len(listed)} of 48 chunks computed by 2 processes" in text0, text0
    assert not parts.exists()
    _assert_same(_load(out), _one_process(capsys, LARGE, tmp_path / "one.npz"))


def test_a_rank_that_refuses_fails_every_rank(tmp_path):
    out = tmp_path / "there.npz"
    out.write_bytes(b"")  # rank 0 refuses to replace it without --overwrite
    (code0, text0), (code1, text1) = _finish(_start_ranks([*SMALL, "-o", out]))
    assert code0 == 1 and f"{out} exists: pass --overwrite" in text0, text0
    assert code1 == 1 and "rank 0 of 2 failed opening the chunk folder: FileExistsError" in text1, text1
    assert "Traceback" not in text0 + text1


def test_one_process_resumes_what_several_ranks_left(capsys, tmp_path):
    """A run of any number of processes resumes another's: a one-process run merges the progress file a rank
    > 0 left (its chunks are not computed again), and drops a listed chunk whose file is gone."""
    reference = _one_process(capsys, SMALL, tmp_path / "reference.npz")
    out = tmp_path / "left.npz"
    assert main([*SMALL, "-o", str(out), "--keep-chunks"]) == 0
    out.unlink()
    parts = tmp_path / "left.npz.parts"
    manifest = json.loads((parts / "manifest.json").read_text())
    manifest["done"] = [0, 2]  # rank 0's chunks ...
    (parts / "manifest.json").write_text(json.dumps(manifest))
    progress = {"samples": manifest["samples"], "dtype": manifest["dtype"], "done": [1, 3]}  # ... rank 1's
    (parts / "done-rank-1.json").write_text(json.dumps(progress))
    (parts / "chunk-000003.npy").unlink()  # listed by rank 1, but its file is gone: computed again
    (parts / "chunk-000004.npy").unlink()
    code = main([*SMALL, "-o", str(out)])
    _, err = capsys.readouterr()
    assert code == 0 and "3 of 5 chunks already done" in err, err
    assert not parts.exists()
    _assert_same(_load(out), reference)
