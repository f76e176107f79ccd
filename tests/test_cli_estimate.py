"""`blochsim match` and `blochsim fit`: maps from a saved signal volume, written with a figure.

`fit` needs blochsim.estimators.NonlinearLeastSquares; its tests skip while that is not there."""

from __future__ import annotations

import json

import numpy as np
import pytest

from blochsim.cli import main
from blochsim.simulators import MRFSimulator

MRF = ["mrf", "-p", "flip=5:60:40", "-p", "TR=10", "--states", "8"]
T1_GRID, T2_GRID = np.geomspace(200, 3000, 12), np.geomspace(10, 300, 10)


def run(capsys, *argv) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def dictionary(capsys, tmp_path):
    path = tmp_path / "dict.npz"
    code, _, err = run(capsys, "dictionary", *MRF, "--grid", "T1=200:3000:12:log", "--grid", "T2=10:300:10:log",
                       "-o", path)
    assert code == 0, err
    return path


def test_match_recovers_on_grid_tissues(capsys, tmp_path, dictionary):
    # A 3 x 4 volume of grid tissues, each times a complex amplitude: the best atom is the tissue itself (score
    # 1 up to float32 round-off), M0 the amplitude's magnitude.
    rng = np.random.default_rng(0)
    i, j = rng.integers(0, 12, (3, 4)), rng.integers(0, 10, (3, 4))
    t1, t2 = T1_GRID[i], T2_GRID[j]
    amplitude = rng.uniform(0.5, 2.0, (3, 4)) * np.exp(1j * rng.uniform(-np.pi, np.pi, (3, 4)))
    volume = MRFSimulator(states=8).simulate(flip=np.linspace(5, 60, 40), TR=10, T1=t1, T2=t2) * amplitude[..., None]
    np.save(tmp_path / "volume.npy", volume.astype(np.complex64))
    out, png = tmp_path / "maps.npz", tmp_path / "maps.png"
    code, text, err = run(capsys, "match", tmp_path / "volume.npy", dictionary, "-o", out, "--png", png)
    assert code == 0, err
    assert "matched 12 voxels against 120 atoms" in text
    with np.load(out) as maps:
        # The atom's own parameters: the matcher holds them in float32 (round-off at most 6e-8 of the value).
        np.testing.assert_allclose(maps["T1"], t1, rtol=1e-7)
        np.testing.assert_allclose(maps["T2"], t2, rtol=1e-7)
        # float32 atoms and volume: the amplitude to ~1e-6 of itself, the score to 1 within float32 round-off.
        np.testing.assert_allclose(maps["M0"], np.abs(amplitude), rtol=1e-5)
        np.testing.assert_allclose(maps["score"], 1.0, atol=1e-5)
        assert json.loads(str(maps["metadata"]))["estimator"] == "DictionaryMatcher"
    if pytest.importorskip("matplotlib"):
        from test_cli import assert_png

        assert_png(png)


def test_match_hdf5_in_and_out_and_grouped(capsys, tmp_path, dictionary):
    h5py = pytest.importorskip("h5py")
    volume = MRFSimulator(states=8).simulate(flip=np.linspace(5, 60, 40), TR=10, T1=T1_GRID[[2, 7]],
                                             T2=T2_GRID[[1, 8]])
    with h5py.File(tmp_path / "scan.h5", "w") as f:
        f["signals"] = volume
        f["noise"] = np.zeros(3)
    out = tmp_path / "maps.h5"
    code, _, err = run(capsys, "match", f"{tmp_path / 'scan.h5'}:signals", dictionary, "-o", out, "--groups", 4)
    assert code == 0, err
    with h5py.File(out) as f:
        np.testing.assert_allclose(f["T1"][()], T1_GRID[[2, 7]], rtol=1e-7)  # float32 parameters, as above
    # Two arrays and no key: the volume is ambiguous.
    code, _, err = run(capsys, "match", tmp_path / "scan.h5", dictionary, "-o", out)
    assert code == 0  # 'signals' is the preferred name
    with h5py.File(tmp_path / "two.h5", "w") as f:
        f["a"], f["b"] = volume, volume
    code, _, err = run(capsys, "match", tmp_path / "two.h5", dictionary, "-o", out)
    assert code == 1 and "holds several arrays (a, b): name one as" in err


def test_match_bad_data(capsys, tmp_path, dictionary):
    np.save(tmp_path / "short.npy", np.ones((4, 39), np.complex64))
    code, _, err = run(capsys, "match", tmp_path / "short.npy", dictionary, "-o", tmp_path / "m.npz")
    assert code == 1 and "has 39 samples per voxel, the dictionary's atoms 40" in err
    np.savez(tmp_path / "bare.npz", signals=np.ones((3, 40)))
    code, _, err = run(capsys, "match", tmp_path / "short.npy", tmp_path / "bare.npz", "-o", tmp_path / "m.npz")
    assert code == 1 and "holds no parameters, names" in err
    code, _, err = run(capsys, "match", tmp_path / "missing.npy", dictionary, "-o", tmp_path / "m.npz")
    assert code == 1 and "no such file" in err
    code, _, err = run(capsys, "match", tmp_path / "short.npy", dictionary, "-o", tmp_path / "m.npy")
    assert code == 2 and "the suffix must be one of .npz, .h5, .hdf5" in err


# -- fit -----------------------------------------------------------------------------------------------------------
def _needs_nlls():
    import blochsim.estimators

    if not hasattr(blochsim.estimators, "NonlinearLeastSquares"):
        pytest.skip("NonlinearLeastSquares is not in this tree yet")


def test_fit_recovers_t2_with_standard_errors(capsys, tmp_path):
    _needs_nlls()
    from blochsim.simulators import MultiEchoSimulator

    te = np.linspace(10, 100, 10)
    t2 = np.array([[20.0, 45.0, 80.0], [120.0, 60.0, 33.0]])
    volume = MultiEchoSimulator().simulate(TE=te, T2=t2, M0=2.0)
    np.save(tmp_path / "echoes.npy", volume)
    out, png = tmp_path / "t2.npz", tmp_path / "t2.png"
    code, text, err = run(capsys, "fit", tmp_path / "echoes.npy", "multiecho", "-p", "TE=10:100:10", "--range",
                          "T2=5:300", "--uncertainty", "--noise-std", "0.01", "-o", out, "--png", png)
    assert code == 0, err
    assert "fitted 6 voxels (T2): 6 converged" in text
    with np.load(out) as maps:
        # Noiseless echoes: measured exact to the float32 maps' rounding; 1e-5 leaves room for the stopping rule
        # (a relative cost change below 1e-6) on another machine's arithmetic.
        np.testing.assert_allclose(maps["T2"], t2, rtol=1e-5)
        np.testing.assert_allclose(maps["M0"], 2.0, rtol=1e-5)
        assert maps["T2_sd"].shape == (2, 3) and np.all(maps["T2_sd"] > 0)
        assert maps["converged"].all() and maps["iterations"].shape == (2, 3)
    pytest.importorskip("matplotlib")
    from test_cli import assert_png

    assert_png(png)


def test_fit_mrf_with_a_known_b1_map(capsys, tmp_path):
    _needs_nlls()
    flips = np.linspace(5, 60, 40)
    t1, t2 = np.array([400.0, 900.0, 1600.0]), np.array([40.0, 90.0, 150.0])
    b1 = np.array([0.85, 1.0, 1.15])
    volume = MRFSimulator(states=8).simulate(flip=flips, TR=10, T1=t1, T2=t2, B1=b1)
    np.save(tmp_path / "volume.npy", volume)
    np.save(tmp_path / "b1.npy", b1)
    (tmp_path / "mrf.toml").write_text('simulator = "mrf"\n[protocol]\nflip = "5:60:40"\nTR = 10\n[settings]\n'
                                       'states = 8\n[ranges]\nT1 = "100:4000"\nT2 = [5, 500]\n')
    out = tmp_path / "maps.npz"
    code, text, err = run(capsys, "fit", tmp_path / "volume.npy", "-c", tmp_path / "mrf.toml", "--known",
                          f"B1=@{tmp_path / 'b1.npy'}", "-o", out)
    assert code == 0, err
    with np.load(out) as maps:
        # The volume and the fit's model are the same float32 simulation: measured within 2.2e-6 of the truth
        # (float32 round-off of the signals moves the minimum); 2e-5 is ten times that.
        np.testing.assert_allclose(maps["T1"], t1, rtol=2e-5)
        np.testing.assert_allclose(maps["T2"], t2, rtol=2e-5)
        assert json.loads(str(maps["metadata"]))["known"] == ["B1"]


@pytest.mark.parametrize("argv, code, message", [
    (["multiecho", "-p", "TE=10,20"], 2, "name at least one unknown"),
    (["multiecho", "-p", "TE=10,20", "--range", "T2=300:5"], 1, "need LOW < HIGH"),
    (["multiecho", "-p", "TE=10,20", "--range", "T2=5"], 1, "expected LOW:HIGH"),
    (["multiecho", "-p", "TE=10,20", "--range", "T2"], 2, "expected NAME=LOW:HIGH"),
    (["multiecho", "-p", "TE=10,20", "--range", "T2=5:300", "-t", "T2=40"], 1, "both as an unknown"),
    (["multiecho", "-p", "TE=10,20", "--range", "T9=5:300"], 1, "'T9' is not a tissue property"),
    (["multiecho", "-p", "TE=10,20", "--range", "T2=5:300", "--known", "M0=1,2,3"], 1, "a map of shape (3,)"),
    (["multiecho", "-p", "TE=10,20,30", "--range", "T2=5:300"], 1, "volume has 2 contrasts"),
])
def test_fit_bad_requests(capsys, tmp_path, argv, code, message):
    _needs_nlls()
    np.save(tmp_path / "v.npy", np.ones((2, 2)))
    got, _, err = run(capsys, "fit", tmp_path / "v.npy", *argv, "-o", tmp_path / "m.npz")
    assert got == code and message in err, err
