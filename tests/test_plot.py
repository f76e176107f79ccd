"""blochsim.plot: every figure is drawn (with the Agg backend), saved as a PNG that is not blank, and carries
what it says; bad input is refused by name; without matplotlib each function says what to install."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

matplotlib = pytest.importorskip("matplotlib")
matplotlib.use("Agg")

from blochsim import plot  # noqa: E402
from blochsim.sequence import mrf_description  # noqa: E402
from blochsim.simulators import MRFSimulator  # noqa: E402


def assert_png(path) -> None:
    """A PNG that matplotlib reads back, of a real size, that is not one flat colour."""
    import matplotlib.image

    assert path.exists() and path.stat().st_size > 5000
    image = matplotlib.image.imread(path)
    assert image.shape[0] > 100 and image.shape[1] > 100
    assert float(image[..., :3].std()) > 0.01


@pytest.fixture
def mrf_signals():
    t1 = np.array([300.0, 800.0, 1500.0])
    return MRFSimulator(states=8).simulate(flip=np.linspace(5, 60, 40), TR=10, T1=t1, T2=60.0), t1


def test_signals(tmp_path, mrf_signals):
    signal, t1 = mrf_signals
    axis = plot.signals(torch.from_numpy(signal), labels=[f"T1 {v:g}" for v in t1], x=np.arange(40) * 10.0,
                        xlabel="time (ms)", title="MRF")
    assert len(axis.lines) == 3 and axis.get_xlabel() == "time (ms)" and axis.get_ylabel() == "|signal|"
    np.testing.assert_allclose(axis.lines[1].get_ydata(), np.abs(signal[1]))
    assert [t.get_text() for t in axis.get_legend().get_texts()] == ["T1 300", "T1 800", "T1 1500"]
    assert_png(plot.save(axis, tmp_path / "signals.png"))
    # Many voxels: at most max_curves lines, spread from the first voxel to the last.
    many = np.tile(signal[:1], (50, 1)) * np.arange(1, 51)[:, None]
    axis = plot.signals(many, part="real", max_curves=5)
    assert len(axis.lines) == 5
    np.testing.assert_allclose(axis.lines[-1].get_ydata(), many[-1].real)


@pytest.mark.parametrize("kwargs, message", [
    (dict(labels=["a"]), "labels has 1 entries, but signal has 3 voxels"),
    (dict(x=np.arange(3)), "x has 3 positions, but signal has 40 samples"),
    (dict(part="angle"), "part must be one of"),
])
def test_signals_refuses(mrf_signals, kwargs, message):
    with pytest.raises(ValueError, match=message):
        plot.signals(mrf_signals[0], **kwargs)


def test_dictionary(tmp_path):
    t1, t2 = np.meshgrid(np.geomspace(200, 3000, 8), np.geomspace(10, 300, 6), indexing="ij")
    parameters = np.stack([t1.ravel(), t2.ravel()], -1)
    atoms = MRFSimulator(states=8).simulate(flip=np.linspace(5, 60, 40), TR=10, T1=parameters[:, 0],
                                            T2=parameters[:, 1])
    figure = plot.dictionary(atoms, parameters, ["T1", "T2"])
    left, _, right = figure.axes  # the image, its colour bar, the coverage
    image = left.images[0].get_array()
    assert image.shape == (48, 40) and np.isclose(float(image.max()), 1.0)  # each atom scaled to its peak
    assert right.get_xlabel() == "T1 (ms)" and right.get_xscale() == "log"
    assert len(right.collections[0].get_offsets()) == 48
    assert_png(plot.save(figure, tmp_path / "dictionary.png"))
    # Without parameters: the image alone.
    assert len(plot.dictionary(atoms[:5]).axes) == 2
    with pytest.raises(ValueError, match="one row per atom"):
        plot.dictionary(atoms, parameters[:3])
    with pytest.raises(ValueError, match="names has 1 entries"):
        plot.dictionary(atoms, parameters, ["T1"])


def test_maps(tmp_path):
    rng = np.random.default_rng(0)
    t1 = rng.uniform(500, 1500, (16, 16))
    t1[0, 0] = np.nan  # a voxel without a fit: skipped by the colour range
    maps = {"T1": t1, "T2": torch.full((16, 16), 80.0), "B1": rng.uniform(0.9, 1.1, (3, 16, 16)),
            "M0": np.exp(1j * rng.uniform(size=16))}
    figure = plot.maps(maps, units={"M0": "a.u."})
    panels = [a for a in figure.axes if a.get_title()]
    assert [a.get_title() for a in panels] == ["T1", "T2", "B1", "M0"]
    assert panels[2].images[0].get_array().shape == (16, 16)  # the middle slice of a volume
    assert panels[3].images[0].get_array().shape == (1, 16)  # a 1-D map as a row, by magnitude
    labels = [a.get_ylabel() for a in figure.axes if not a.get_title()]
    assert labels == ["T1 (ms)", "T2 (ms)", "B1", "M0 (a.u.)"]
    low, high = panels[0].images[0].get_clim()
    assert 500 <= low < high <= 1500
    assert_png(plot.save(figure, tmp_path / "maps.png"))
    with pytest.raises(ValueError, match="at least one map"):
        plot.maps({})
    with pytest.raises(ValueError, match="1-D, 2-D or 3-D"):
        plot.maps({"T1": np.ones((2, 2, 2, 2))})


def test_sequence_diagram(tmp_path):
    description = mrf_description(torch.deg2rad(torch.tensor([10.0, 20.0, 30.0])), 5e-3, inversion_time_s=2e-3)
    axis = description.plot()
    stems = axis.containers[0]
    np.testing.assert_allclose(stems.markerline.get_ydata(), [180.0, 10.0, 20.0, 30.0], rtol=1e-5)
    assert len(axis.lines[-1].get_xdata()) == 3  # three ADC samples
    assert_png(plot.save(axis, tmp_path / "sequence.png"))
    short = plot.sequence(description, upto_s=3e-3)
    assert len(short.containers[0].markerline.get_xdata()) == 2  # the inversion and the first pulse


def test_benchmark_ratios(tmp_path):
    rows = [{"case": "epg_real", "n": 10000, "median_ms": 30.0, "incumbent_ms": 300.0},
            {"case": "epg_real_grad", "n": 10000, "ratio": 1.3},
            {"case": "loss", "n": 10000, "median_ms": 80.0, "incumbent_ms": None}]
    axis = plot.benchmark_ratios(rows)
    widths = [p.get_width() for p in axis.patches]
    np.testing.assert_allclose(widths, [0.1, 1.3])  # the row without a reference is left out
    assert [t.get_text() for t in axis.get_yticklabels()] == ["epg_real 10,000", "epg_real_grad 10,000"]
    record = tmp_path / "record.json"
    record.write_text(json.dumps({"results": rows}))
    assert_png(plot.save(plot.benchmark_ratios(record), tmp_path / "ratios.png"))
    with pytest.raises(ValueError, match="no benchmark row has a reference time"):
        plot.benchmark_ratios(rows[2:])


def test_save_refuses_an_unknown_suffix(tmp_path, mrf_signals):
    with pytest.raises(ValueError, match="its suffix must be one of"):
        plot.save(plot.signals(mrf_signals[0]), tmp_path / "figure.xyz")


def test_without_matplotlib_says_what_to_install(monkeypatch, mrf_signals):
    import builtins

    real_import = builtins.__import__

    def no_matplotlib(name, *args, **kwargs):
        if name.startswith("matplotlib"):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    for draw in (lambda: plot.signals(mrf_signals[0]), lambda: plot.maps({"T1": np.ones((2, 2))}),
                 lambda: plot.dictionary(mrf_signals[0]), lambda: plot.benchmark_ratios([{"case": "a", "n": 1,
                                                                                           "ratio": 1.0}])):
        with pytest.raises(ImportError, match=r'blochsim\[plot\]'):
            draw()
