"""`blochsim dictionary`: grid and random sets, the output files, and resuming an interrupted run.

The resume contract (issue 27): a run stopped part-way (Ctrl-C, or killed outright) restarts at the first chunk
its manifest does not list, and the finished file equals an uninterrupted run's bit for bit. Tested with an
interruption injected in this process, with a `python -m blochsim` process killed by SIGKILL mid-run, with a
chunk file damaged on disk, and against a changed request (refused, unless --restart).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from blochsim.cli import dictionary as dictionary_module
from blochsim.cli import main
from blochsim.simulators import MRFSimulator

ROOT = Path(__file__).resolve().parents[1]

#: A small MRF dictionary: 30 repetitions, 8 orders, a 6 x 5 grid in chunks of 7 (5 chunks, the last short).
MRF = ["mrf", "-p", "flip=5:60:30", "-p", "TR=10", "--states", "8"]
GRID = ["--grid", "T1=200:3000:6:log", "--grid", "T2=10:300:5:log", "--chunk-size", "7"]


def run(capsys, *argv) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def load(path: Path) -> dict:
    with np.load(path, allow_pickle=False) as data:
        return {k: data[k] for k in data.keys()}


def test_grid_dictionary_holds_the_simulators_signals(capsys, tmp_path):
    out = tmp_path / "dict.npz"
    code, text, err = run(capsys, "dictionary", *MRF, *GRID, "-o", out)
    assert code == 0, err
    assert "30 atoms x 30 samples (complex64)" in text and "5 of 5 chunks computed" in text
    data = load(out)
    t1, t2 = np.geomspace(200, 3000, 6), np.geomspace(10, 300, 5)
    # The first name varies slowest.
    np.testing.assert_array_equal(data["parameters"], np.stack(np.meshgrid(t1, t2, indexing="ij"), -1).reshape(-1, 2))
    assert list(data["names"]) == ["T1", "T2"]
    expected = MRFSimulator(states=8).simulate(flip=np.linspace(5, 60, 30), TR=10, T1=data["parameters"][:, 0],
                                               T2=data["parameters"][:, 1])
    # Chunks of 7 against one call of all 30: each voxel is computed alone, so chunking changes no bit.
    np.testing.assert_array_equal(data["signals"], expected)
    metadata = json.loads(str(data["metadata"]))
    assert metadata["simulator"] == "mrf" and metadata["settings"] == {"states": 8}
    assert not (tmp_path / "dict.npz.parts").exists()


def test_random_set_is_seeded_and_in_range(capsys, tmp_path):
    args = ["dictionary", *MRF, "--random", 50, "--range", "T1=200:3000:log", "--range", "T2=10:300",
            "--range", "B1=0.8:1.2", "-t", "M0=2", "--chunk-size", 16]
    assert run(capsys, *args, "--seed", 3, "-o", tmp_path / "a.npz")[0] == 0
    assert run(capsys, *args, "--seed", 3, "-o", tmp_path / "b.npz")[0] == 0
    assert run(capsys, *args, "--seed", 4, "-o", tmp_path / "c.npz")[0] == 0
    a, b, c = load(tmp_path / "a.npz"), load(tmp_path / "b.npz"), load(tmp_path / "c.npz")
    np.testing.assert_array_equal(a["parameters"], b["parameters"])
    np.testing.assert_array_equal(a["signals"], b["signals"])
    assert not np.array_equal(a["parameters"], c["parameters"])
    low, high = np.array([200, 10, 0.8]), np.array([3000, 300, 1.2])
    assert a["parameters"].shape == (50, 3) and np.all((a["parameters"] >= low) & (a["parameters"] <= high))
    expected = MRFSimulator(states=8).simulate(flip=np.linspace(5, 60, 30), TR=10, M0=2.0,
                                               **dict(zip(["T1", "T2", "B1"], a["parameters"].T, strict=True)))
    np.testing.assert_array_equal(a["signals"], expected)


def test_hdf5_output_and_config_file(capsys, tmp_path):
    h5py = pytest.importorskip("h5py")
    (tmp_path / "d.toml").write_text('simulator = "mrf"\n[protocol]\nflip = "5:60:30"\nTR = 10\n[settings]\n'
                                     'states = 8\n[grid]\nT1 = "200:3000:6:log"\nT2 = [10, 50, 100, 200, 300]\n'
                                     '[dictionary]\nchunk_size = 4\n')
    out = tmp_path / "d.h5"
    code, text, err = run(capsys, "dictionary", "-c", tmp_path / "d.toml", "-o", out)
    assert code == 0, err and "8 of 8 chunks" in text
    with h5py.File(out) as f:
        assert f["signals"].shape == (30, 30) and list(f["names"].asstr()[()]) == ["T1", "T2"]
        expected = MRFSimulator(states=8).simulate(flip=np.linspace(5, 60, 30), TR=10, T1=f["parameters"][:, 0],
                                                   T2=f["parameters"][:, 1])
        np.testing.assert_array_equal(f["signals"][()], expected)


def test_closed_form_dictionary_has_one_column_per_sample(capsys, tmp_path):
    out = tmp_path / "ir.npz"
    code, _, err = run(capsys, "dictionary", "inversionrecovery", "-p", "TI=100", "--grid", "T1=100:2000:9",
                       "-o", out)
    assert code == 0, err
    data = load(out)
    assert data["signals"].shape == (9, 1)  # a scalar TI: one sample per atom


def test_interrupted_run_resumes_to_the_same_file(capsys, tmp_path, monkeypatch):
    reference = tmp_path / "reference.npz"
    assert run(capsys, "dictionary", *MRF, *GRID, "-o", reference)[0] == 0

    out = tmp_path / "dict.npz"
    calls = []
    simulate_chunk = dictionary_module._atoms

    def interrupted(signal, n):
        calls.append(n)
        if len(calls) == 3:  # Ctrl-C while the third chunk is being computed
            raise KeyboardInterrupt
        return simulate_chunk(signal, n)

    monkeypatch.setattr(dictionary_module, "_atoms", interrupted)
    code, _, err = run(capsys, "dictionary", *MRF, *GRID, "-o", out)
    assert code == 130
    assert "stopped after 2 of 5 chunks" in err and "run the same command again to resume" in err
    manifest = json.loads((tmp_path / "dict.npz.parts" / "manifest.json").read_text())
    assert manifest["done"] == [0, 1] and not out.exists()

    monkeypatch.setattr(dictionary_module, "_atoms", simulate_chunk)
    calls.clear()
    code, text, err = run(capsys, "dictionary", *MRF, *GRID, "-o", out)
    assert code == 0, err
    assert "resuming" in err and "2 of 5 chunks already done" in err and "3 of 5 chunks computed" in text
    for key, value in load(reference).items():
        np.testing.assert_array_equal(load(out)[key], value, err_msg=key)


def test_damaged_chunk_and_stray_temporary_file_are_redone(capsys, tmp_path):
    reference = tmp_path / "reference.npz"
    assert run(capsys, "dictionary", *MRF, *GRID, "-o", reference)[0] == 0
    out = tmp_path / "dict.npz"
    assert run(capsys, "dictionary", *MRF, *GRID, "-o", out, "--keep-chunks")[0] == 0
    parts = tmp_path / "dict.npz.parts"
    out.unlink()
    # A chunk cut short on disk (the manifest still lists it), and a temporary file of a killed write.
    chunk = parts / "chunk-000001.npy"
    chunk.write_bytes(chunk.read_bytes()[:100])
    (parts / ".chunk-000002.npy.x1y2.tmp.npy").write_bytes(b"half")
    code, text, err = run(capsys, "dictionary", *MRF, *GRID, "-o", out)
    assert code == 0, err
    assert "4 of 5 chunks already done" in err and "1 of 5 chunks computed" in text
    np.testing.assert_array_equal(load(out)["signals"], load(reference)["signals"])
    assert not parts.exists()


def test_another_request_is_refused_until_restart(capsys, tmp_path, monkeypatch):
    out = tmp_path / "dict.npz"
    monkeypatch.setattr(dictionary_module, "_atoms", _interrupt_at(2))
    assert run(capsys, "dictionary", *MRF, *GRID, "-o", out)[0] == 130
    monkeypatch.undo()
    changed = ["mrf", "-p", "flip=5:60:30", "-p", "TR=12", "--states", "8"]
    code, _, err = run(capsys, "dictionary", *changed, *GRID, "-o", out)
    assert code == 1 and "holds chunks of another request (it differs in: protocol)" in err and "--restart" in err
    code, _, err = run(capsys, "dictionary", *MRF, *GRID[:-1], "9", "-o", out)
    assert code == 1 and "differs in: chunk_size" in err
    code, text, err = run(capsys, "dictionary", *changed, *GRID, "-o", out, "--restart")
    assert code == 0 and "5 of 5 chunks computed" in text
    code, _, err = run(capsys, "dictionary", *changed, *GRID, "-o", out)
    assert code == 1 and "exists: pass --overwrite" in err


def _interrupt_at(call: int):
    calls = []
    real = dictionary_module._atoms

    def atoms(signal, n):
        calls.append(n)
        if len(calls) == call:
            raise KeyboardInterrupt
        return real(signal, n)
    return atoms


def test_killed_process_resumes_to_the_same_file(capsys, tmp_path):
    """A `python -m blochsim dictionary` process killed (SIGKILL) once its manifest lists a chunk; the rerun
    completes it, equal bit for bit to an uninterrupted run in this process."""
    # Enough work that the kill lands mid-run: complex path (RF phases), 64 orders, one thread in the child:
    # 48 chunks of ~30 ms here (1.4 s) against a poll every 10 ms.
    args = ["dictionary", "mrf", "-p", "flip=5:60:200", "-p", "TR=10", "-p", "phases=0:3000:200", "--states", 64,
            "--random", 4800, "--range", "T1=200:3000:log", "--range", "T2=10:300:log", "--chunk-size", 100]
    out = tmp_path / "killed.npz"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "BLOCHSIM_NUM_THREADS": "1"}
    child = subprocess.Popen([sys.executable, "-m", "blochsim", *map(str, args), "-o", str(out)], env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT)
    manifest = tmp_path / "killed.npz.parts" / "manifest.json"
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline and child.poll() is None:
            try:
                if json.loads(manifest.read_text())["done"]:
                    break
            except (OSError, ValueError):  # not written yet
                pass
            time.sleep(0.01)
        assert child.poll() is None, f"the run ended before it could be killed: {child.communicate()[1][-500:]}"
        child.send_signal(signal.SIGKILL)
    finally:
        child.wait(timeout=60)
        child.stdout.close()
        child.stderr.close()
    assert child.returncode == -signal.SIGKILL
    done = json.loads(manifest.read_text())["done"]
    assert 1 <= len(done) < 48 and not out.exists()

    code, text, err = run(capsys, *args, "-o", out)
    assert code == 0, err
    assert f"{len(done)} of 48 chunks already done" in err
    reference = tmp_path / "reference.npz"
    assert run(capsys, *args, "-o", reference)[0] == 0
    for key, value in load(reference).items():
        np.testing.assert_array_equal(load(out)[key], value, err_msg=key)


@pytest.mark.parametrize("argv, code, message", [
    (["--grid", "T1=100:200:3", "--random", "5", "--range", "T2=10:20"], 1, "not both"),
    (["--range", "T1=100:200"], 1, "needs its size: --random N"),
    ([], 1, "say which tissues"),
    (["--random", "5", "--range", "T1=200:100"], 1, "need finite LOW < HIGH"),
    (["--random", "5", "--range", "T1=0:100:log"], 1, "a log range needs LOW > 0"),
    (["--random", "5", "--range", "T1=0:100:lin"], 1, "expected LOW:HIGH or LOW:HIGH:log"),
    (["--grid", "T1=100:200:3", "-t", "T2=10,20"], 1, "fixed tissue properties are single values"),
    (["--grid", "T1=100:200:3", "-t", "T1=10"], 1, "both as a fixed value"),
    (["--grid", "T9=100:200:3"], 1, "'T9' is not a tissue property"),
    (["--grid", "T1"], 2, "expected NAME=VALUES"),
    (["--random", "0", "--range", "T1=1:2"], 2, "--random"),
    (["--chunk-size", "0", "--grid", "T1=1:2:2"], 2, "--chunk-size"),
])
def test_bad_requests(capsys, tmp_path, argv, code, message):
    got, _, err = run(capsys, "dictionary", *MRF, "-t", "T2=50", *argv, "-o", tmp_path / "d.npz")
    assert got == code and message in err, err
    assert "Traceback" not in err


def test_npy_output_is_refused(capsys, tmp_path):
    code, _, err = run(capsys, "dictionary", *MRF, *GRID, "-o", tmp_path / "d.npy")
    assert code == 2 and "the suffix must be one of .npz, .h5, .hdf5" in err


def test_progress_bar_when_asked(capsys, tmp_path):
    pytest.importorskip("tqdm")
    code, _, err = run(capsys, "dictionary", *MRF, *GRID, "-o", tmp_path / "d.npz", "--progress")
    assert code == 0 and "dictionary" in err and "atom" in err
    code, _, err = run(capsys, "dictionary", *MRF, *GRID, "-o", tmp_path / "e.npz", "--no-progress")
    assert code == 0 and err == ""


def test_figure(capsys, tmp_path):
    pytest.importorskip("matplotlib")
    from test_cli import assert_png

    figure = tmp_path / "d.png"
    code, text, err = run(capsys, "dictionary", *MRF, *GRID, "-o", tmp_path / "d.npz", "--plot", figure)
    assert code == 0, err
    assert_png(figure)
