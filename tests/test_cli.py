"""The command line (`blochsim ...`, blochsim.cli) on small problems: each subcommand, its files, its errors.

Exit status: 0 done, 1 bad data (one line `blochsim CMD: error: ...`, no traceback), 2 a bad flag (click's usage
message). Most tests call `blochsim.cli.main` in this process (an exception escaping it would fail the test, so
"no traceback" is what they check); a few run `python -m blochsim` to check the module entry point itself.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from blochsim.cli import main
from blochsim.simulators import MRFSimulator, SPGRSimulator

ROOT = Path(__file__).resolve().parents[1]


def run(capsys, *argv) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def run_module(*argv, timeout=120) -> subprocess.CompletedProcess:
    """`python -m blochsim ARGV` from the checkout (the kernels of BLOCHSIM_CPU_LIBRARY, as this process)."""
    env = {**os.environ, "MPLBACKEND": "Agg", "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "blochsim", *map(str, argv)], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=ROOT)


# -- entry points, version, help ---------------------------------------------------------------------------------
def test_module_entry_point_bad_flag_without_traceback():
    # issue 27: `demo --tissues 0` ended in ZeroDivisionError, `demo --states 0` in a traceback.
    bad = run_module("demo", "--tissues", "0")
    assert bad.returncode == 2
    assert "Usage: blochsim demo" in bad.stderr and "--tissues" in bad.stderr
    assert "Traceback" not in bad.stderr


def test_version(capsys):
    from blochsim import __version__

    for flag in ("--version", "-V"):
        code, out, _ = run(capsys, flag)
        assert code == 0 and out.strip() == f"blochsim {__version__}"


@pytest.mark.parametrize("flag", ["--tissues", "--states", "--repetitions", "--tr-ms"])
def test_demo_refuses_non_positive_sizes_as_usage_errors(capsys, flag):
    code, _, err = run(capsys, "demo", flag, "0")
    assert code == 2
    assert "Usage: blochsim demo" in err and flag in err


def test_every_subcommand_has_help_with_examples(capsys):
    for command in ("demo", "simulate", "dictionary", "match", "fit", "bench", "info"):
        code, out, _ = run(capsys, command, "--help")
        assert code == 0, command
        assert f"Usage: blochsim {command}" in out and "Example" in out, command
    code, out, _ = run(capsys, "--help")
    assert code == 0 and all(c in out for c in ("demo", "simulate", "dictionary", "match", "fit", "bench", "info"))


def test_unknown_command_and_option_are_usage_errors(capsys):
    assert run(capsys, "simulat")[0] == 2
    code, _, err = run(capsys, "demo", "--tisues", "3")
    assert code == 2 and "No such option" in err


# -- demo ------------------------------------------------------------------------------------------------------
def test_demo_prints_summary_and_draws_figure(capsys, tmp_path):
    pytest.importorskip("matplotlib")
    figure = tmp_path / "demo.png"
    code, out, err = run(capsys, "demo", "--tissues", 16, "--repetitions", 40, "--states", 8, "--plot", figure)
    assert code == 0, err
    assert "16 tissues x 40 samples" in out and "simulated in" in out
    # The matched tissue is the truth: the noise (1 % of the atom's peak) is far below the atoms' differences.
    found = re.search(r"T1 (\S+) ms / T2 (\S+) ms \(truth (\S+) / (\S+)\)", out)
    assert found and found.group(1, 2) == found.group(3, 4)
    assert_png(figure)


def test_demo_with_one_tissue_runs(capsys):
    code, out, _ = run(capsys, "demo", "--tissues", 1, "--repetitions", 1, "--states", 1)
    assert code == 0 and "1 tissues x 1 samples" in out


# -- simulate ---------------------------------------------------------------------------------------------------
def test_simulate_writes_what_the_api_returns(capsys, tmp_path):
    out = tmp_path / "signal.npy"
    code, text, err = run(capsys, "simulate", "mrf", "-p", "flip=5:60:30", "-p", "TR=10", "-t", "T1=800,1200",
                          "-t", "T2=80", "--states", 8, "-o", out)
    assert code == 0, err
    assert "MRFSimulator: signal complex64 (2, 30)" in text
    expected = MRFSimulator(states=8).simulate(flip=np.linspace(5, 60, 30), TR=10, T1=np.array([800.0, 1200.0]),
                                               T2=80)
    np.testing.assert_array_equal(np.load(out), expected)  # the same call: bit for bit


def test_simulate_config_file_jacobian_and_formats(capsys, tmp_path):
    h5py = pytest.importorskip("h5py")
    np.save(tmp_path / "flips.npy", np.linspace(2, 30, 12))
    (tmp_path / "spgr.toml").write_text('simulator = "spgr"\n[protocol]\nflip = "@flips.npy"\nTR = 10\nTE = 4\n'
                                        '[tissue]\nT1 = [800, 1200]\nT2star = 40\n')
    # Flags override the file: TE=5 wins over the file's 4.
    npz = tmp_path / "spgr.npz"
    code, _, err = run(capsys, "simulate", "-c", tmp_path / "spgr.toml", "-p", "TE=5", "--jacobian", "T1", "-o", npz)
    assert code == 0, err
    signal, jac = SPGRSimulator().jacobian(("T1",), flip=np.linspace(2, 30, 12), TR=10, TE=5,
                                           T1=np.array([800.0, 1200.0]), T2star=40)
    with np.load(npz) as data:
        np.testing.assert_array_equal(data["signal"], signal)
        np.testing.assert_array_equal(data["jacobian"], jac)
        assert json.loads(str(data["metadata"]))["protocol"]["TE"] == 5
    h5 = tmp_path / "spgr.h5"
    assert run(capsys, "simulate", "-c", tmp_path / "spgr.toml", "-o", h5)[0] == 0
    with h5py.File(h5) as f:
        assert f["signal"].shape == (2, 12) and "spgr" in json.loads(f.attrs["metadata"])["simulator"].lower()
    # A JSON config with the same keys.
    (tmp_path / "spgr.json").write_text(json.dumps({"simulator": "SPGRSimulator", "protocol": {
        "flip": [10, 20], "TR": 10, "TE": 4}, "tissue": {"T1": 1000, "T2star": 40}}))
    assert run(capsys, "simulate", "-c", tmp_path / "spgr.json", "-o", tmp_path / "j.npy")[0] == 0
    assert np.load(tmp_path / "j.npy").shape == (2,)


def test_simulate_draws_signals_and_sequence(capsys, tmp_path):
    pytest.importorskip("matplotlib")
    signal_png, sequence_png = tmp_path / "signal.png", tmp_path / "sequence.png"
    code, out, err = run(capsys, "simulate", "fse", "-p", "flip=180,150,120,150", "-p", "ESP=10", "-t",
                         "T1=800,1200", "-t", "T2=80", "-o", tmp_path / "fse.npy", "--plot", signal_png, "--sequence",
                         sequence_png)
    assert code == 0, err
    assert_png(signal_png)
    assert_png(sequence_png)
    # A closed form has no event train to draw: one line, before the work.
    code, _, err = run(capsys, "simulate", "spgr", "-p", "flip=10", "-p", "TR=10", "-p", "TE=4", "-t", "T1=900",
                       "-t", "T2star=30", "-o", tmp_path / "s.npy", "--sequence", sequence_png)
    assert code == 1 and "closed form: it has no event train for --sequence to draw" in err
    assert not (tmp_path / "s.npy").exists()


def test_simulate_list_names_every_shipped_simulator(capsys):
    from blochsim import simulators

    code, out, _ = run(capsys, "simulate", "--list")
    assert code == 0
    for name in simulators.__all__:
        if name.endswith("Simulator"):
            assert f"  {name[:-9].lower()} " in out, name


@pytest.mark.parametrize("argv, message", [
    (["-t", "T1=800", "-t", "T3=80"], "'T3' is not a tissue property of MRFSimulator (did you mean 'T2'?)"),
    (["-t", "T1=800"], "needs 'T2'"),
    (["-t", "T1=800,900,1000", "-t", "T2=80,90"], "broadcast"),
    (["-t", "T1=-800", "-t", "T2=80"], "T1 must be a time >= 0 ms"),
    (["-p", "T1=800", "-t", "T2=80"], "T1 is a tissue property of MRFSimulator: give it with -t/--tissue"),
    (["-t", "T1=@missing.npy", "-t", "T2=80"], "no such file"),
    (["-t", "T1=[1, 2", "-t", "T2=80"], "not valid JSON"),
    (["-p", "phases=abc", "-t", "T1=800", "-t", "T2=80"], "(read as text: phases='abc'; a number is"),
])
def test_simulate_bad_data_is_one_line_and_exit_1(capsys, tmp_path, argv, message):
    code, out, err = run(capsys, "simulate", "mrf", "-p", "flip=10,20", "-p", "TR=10", *argv, "-o",
                         tmp_path / "x.npy")
    assert code == 1
    assert err.startswith("blochsim simulate: error: ") and message in err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert not (tmp_path / "x.npy").exists()


@pytest.mark.parametrize("argv, message", [
    (["mrff", "-o", "x.npy"], "no shipped simulator is called 'mrff' (did you mean 'mrf'?)"),
    (["mrf", "-o", "x.txt"], "the suffix must be one of .npy, .npz, .h5, .hdf5"),
    (["mrf", "-p", "flip", "-o", "x.npy"], "expected NAME=VALUE"),
    (["mrf", "--states", "0", "-o", "x.npy"], "--states"),
    (["mrf", "--repetitions", "often", "-o", "x.npy"], "not a count >= 1 or 'auto'"),
    (["mrf"], "-o/--output"),
    (["-p", "flip=1", "-o", "x.npy"], "name a SIMULATOR"),
])
def test_simulate_bad_flags_are_usage_errors(capsys, tmp_path, monkeypatch, argv, message):
    monkeypatch.chdir(tmp_path)
    code, _, err = run(capsys, "simulate", *argv)
    assert code == 2
    assert "Usage: blochsim simulate" in err and message in err


def test_simulate_config_file_errors(capsys, tmp_path):
    (tmp_path / "bad.toml").write_text('simulator = "mrf"\n[protocl]\nflip = 10\n')
    code, _, err = run(capsys, "simulate", "-c", tmp_path / "bad.toml", "-o", tmp_path / "x.npy")
    assert code == 1 and "unknown key 'protocl'" in err
    (tmp_path / "bad.yaml").write_text("simulator: mrf\n")
    code, _, err = run(capsys, "simulate", "-c", tmp_path / "bad.yaml", "-o", tmp_path / "x.npy")
    assert code == 1 and "must be .toml or .json" in err


def test_simulate_npy_cannot_hold_the_jacobian(capsys, tmp_path):
    code, _, err = run(capsys, "simulate", "spgr", "-p", "flip=10", "-p", "TR=10", "-p", "TE=4", "-t", "T1=900",
                       "-t", "T2star=30", "--jacobian", "T1", "-o", tmp_path / "s.npy")
    assert code == 1 and "write .npz or .h5" in err


def test_debug_flag_keeps_the_traceback(tmp_path):
    with pytest.raises(TypeError, match="needs 'T2'"):
        main(["--debug", "simulate", "mrf", "-p", "flip=10", "-p", "TR=10", "-t", "T1=800", "-o",
              str(tmp_path / "x.npy")])


def test_value_syntax():
    from blochsim.cli._values import parse_value

    assert parse_value("10", "x") == 10 and isinstance(parse_value("10", "x"), int)
    assert parse_value("2.5e-3", "x") == 2.5e-3
    assert parse_value("inf", "x") == float("inf")
    np.testing.assert_array_equal(parse_value("1,2,3", "x"), [1.0, 2.0, 3.0])
    np.testing.assert_array_equal(parse_value("[[1, 2], [3, 4]]", "x"), [[1.0, 2.0], [3.0, 4.0]])
    np.testing.assert_allclose(parse_value("5:60:12", "x"), np.linspace(5, 60, 12))
    np.testing.assert_allclose(parse_value("10:1000:3:log", "x"), [10.0, 100.0, 1000.0])
    assert parse_value("ideal", "x") == "ideal" and parse_value("true", "x") is True
    with pytest.raises(ValueError, match="count must be >= 1"):
        parse_value("1:2:0", "x")
    with pytest.raises(ValueError, match="log range needs START and STOP > 0"):
        parse_value("0:2:3:log", "x")
    with pytest.raises(ValueError, match="numbers only"):
        parse_value("1,b", "x")


# -- info, bench --------------------------------------------------------------------------------------------------
def test_info(capsys):
    from blochsim import __version__

    code, out, _ = run(capsys, "info")
    assert code == 0
    assert out.startswith(f"blochsim {__version__}")
    for field in ("host kernels: ", "threads: ", "CUDA packages: ", "CUDA devices", "optional: "):
        assert field in out
    assert "NOT LOADED" not in out.split("host kernels: ")[1].splitlines()[0]


def test_bench_table_record_and_figure(capsys, tmp_path):
    pytest.importorskip("matplotlib")
    record = tmp_path / "bench.json"
    code, out, err = run(capsys, "bench", "--cases", "epg_real,pooled_grad", "--n", 40, "--repeats", 1,
                         "--json", record)
    assert code == 0, err
    rows = [line.split() for line in out.splitlines() if line.startswith(("epg_real", "pooled_grad"))]
    assert [(r[0], r[1]) for r in rows] == [("epg_real", "40"), ("pooled_grad", "40")]
    data = json.loads(record.read_text())
    assert [r["case"] for r in data["results"]] == ["epg_real", "pooled_grad"]
    assert all(r["median_ms"] > 0 and r["ratio"] is None for r in data["results"])  # 40 tissues: no reference
    # A figure of ratios needs cases at a reference size: refused here, with the reason.
    code, _, err = run(capsys, "bench", "--cases", "epg_real", "--n", 40, "--repeats", 1, "--plot",
                       tmp_path / "r.png")
    assert code == 1 and "no case ran at a reference size" in err


def test_bench_figure_of_ratios(capsys, tmp_path):
    pytest.importorskip("matplotlib")
    figure = tmp_path / "ratios.png"
    # epg_real at its recorded size (10,000 tissues) has a reference time, so a ratio to draw.
    code, out, err = run(capsys, "bench", "--cases", "epg_real", "--repeats", 1, "--plot", figure)
    assert code == 0, err
    assert out.splitlines()[2].split()[:2] == ["epg_real", "10000"] and "300.0" in out.splitlines()[2]
    assert_png(figure)


def test_figures_without_matplotlib_fail_before_the_work(capsys, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises ImportError
    out = tmp_path / "s.npy"
    code, _, err = run(capsys, "simulate", "spgr", "-p", "flip=10", "-p", "TR=10", "-p", "TE=4", "-t", "T1=900",
                       "-t", "T2star=30", "-o", out, "--plot", tmp_path / "s.png")
    assert code == 1 and 'figures need matplotlib: pip install "blochsim[plot]"' in err
    assert not out.exists()


def test_bench_bad_case_is_a_usage_error(capsys):
    code, _, err = run(capsys, "bench", "--cases", "epg_rael")
    assert code == 2 and "unknown case 'epg_rael'" in err
    code, _, err = run(capsys, "bench", "--device", "gpu0")
    assert code == 2 and "'gpu0' is not a device" in err


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without a GPU")
@pytest.mark.parametrize("argv", [["bench", "--cases", "epg_real", "--n", "10"],
                                  ["simulate", "mrf", "-p", "flip=10", "-p", "TR=10", "-t", "T1=800", "-t", "T2=80",
                                   "-o", "x.npy"]])
def test_cuda_device_without_a_gpu_is_one_line(capsys, tmp_path, monkeypatch, argv):
    monkeypatch.chdir(tmp_path)
    code, _, err = run(capsys, *argv, "--device", "cuda")
    assert code == 1 and err.count("\n") == 1 and "CUDA" in err


# -- helpers -------------------------------------------------------------------------------------------------------
def assert_png(path: Path) -> None:
    """A PNG that matplotlib reads back, of a real size, that is not one flat colour."""
    import matplotlib.image

    assert path.exists() and path.stat().st_size > 5000
    image = matplotlib.image.imread(path)
    assert image.shape[0] > 100 and image.shape[1] > 100
    assert float(image[..., :3].std()) > 0.01


# -- the progress helper (blochsim._progress) ---------------------------------------------------------------------
def test_progress_bar_switches(capsys, monkeypatch):
    from blochsim import _progress

    # Not a terminal (pytest captures stderr): no bar by default, one when forced (tqdm in the test extra).
    assert isinstance(_progress.progress_bar(10), _progress.NoBar)
    pytest.importorskip("tqdm")
    with _progress.progress_bar(10, desc="work", unit="item", enabled=True) as bar:
        bar.update(10)
    assert "work" in capsys.readouterr().err
    with _progress.progress_bar(10, enabled=False, initial=4) as bar:
        bar.update(3)
    assert bar.n == 7 and capsys.readouterr().err == ""
    with pytest.raises(ValueError, match="enabled must be True, False or None"):
        _progress.progress_bar(10, enabled="yes")
    # Without tqdm: no bar, whatever `enabled` says.
    monkeypatch.setitem(sys.modules, "tqdm.auto", None)
    assert isinstance(_progress.progress_bar(10, enabled=True), _progress.NoBar)
