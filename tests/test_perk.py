"""`PERK` (blochsim.estimators): accuracy with its defaults, the stated SD on noisy data, gradients through `map`,
streaming, normalisation, known properties and the errors users get.

The MRF train is the benchmarks' (blochsim._benchmark_cases.flips_deg: flips 5 -> 60 -> 2 degrees) at 100
repetitions, TR 10 ms; tissues are log-uniform in T1 200-3000 ms and T2 10-300 ms with T2 <= 0.9 T1.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import blochsim
from blochsim._benchmark_cases import flips_deg
from blochsim.estimators import PERK
from blochsim.estimators import perk_reference as reference
from blochsim.simulators import MRFSimulator

ACQUISITION = MRFSimulator(flip=flips_deg(100), TR=10.0)


def tissues(n: int, seed: int) -> tuple:
    """n (T1, T2) pairs in ms, log-uniform, T2 <= 0.9 T1 (rejection, so both stay log-uniform within the cap)."""
    g = torch.Generator().manual_seed(seed)
    t1 = torch.exp(torch.empty(3 * n).uniform_(math.log(200), math.log(3000), generator=g))
    t2 = torch.exp(torch.empty(3 * n).uniform_(math.log(10), math.log(300), generator=g))
    keep = t2 <= 0.9 * t1
    return t1[keep][:n], t2[keep][:n]


def noisy(signals: torch.Tensor, sd: float, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    real, imag = torch.randn((2,) + tuple(signals.shape), generator=g)
    return signals + sd * torch.complex(real, imag)


def median_relative_error(estimate, truth) -> float:
    return float(((estimate.double() - truth.double()).abs() / truth.double()).median())


@pytest.fixture(scope="module")
def small_model():
    """A quick model (300 features, 3,000 noiseless samples) for the tests that need any trained PERK."""
    t1, t2 = tissues(3000, 1)
    return PERK(ACQUISITION, n_features=300, feature_seed=3).fit(T1=t1, T2=t2, seed=0)


def test_mrf_defaults_recover_held_out_tissues():
    """Issue 23's accuracy case: 20,000 noiseless samples, n_features=1000, every other setting default; held-out
    tissues within a median relative error of 5 % for T1 and for T2 (measured 1.0 % and 1.1 %)."""
    t1, t2 = tissues(20000, 1)
    perk = PERK(ACQUISITION, n_features=1000).fit(T1=t1, T2=t2, seed=0)
    h1, h2 = tissues(2000, 2)
    maps = perk.map(ACQUISITION.simulate(T1=h1, T2=h2))
    assert median_relative_error(maps["T1"], h1) <= 0.05
    assert median_relative_error(maps["T2"], h2) <= 0.05
    # The training M0 is 1, and the norm carries it back.
    assert float((maps["M0"] - 1).abs().median()) < 0.01


def test_stated_sd_covers_the_error_on_noisy_data():
    """Trained with noise of SD 0.005 (signals are ~0.1 per sample), mapped on fresh tissues with fresh noise of
    that SD: the error is within 1 SD for about 68 % and within 2 SD for about 95 % of the voxels (a Gaussian's
    rates). Bounds: 4,000 voxels give a binomial SE of 0.007; the SD is itself a regression of |residual| (a
    smoothed estimate) and log-space errors are not exactly Gaussian: measured 0.64-0.69 (1 SD) and 0.91-0.97
    (2 SD) over noise 0.002-0.01 and 300-1000 features."""
    t1, t2 = tissues(10000, 1)
    perk = PERK(ACQUISITION, n_features=300).fit(T1=t1, T2=t2, noise_std=0.005, seed=0)
    h1, h2 = tissues(4000, 2)
    maps, sds = perk.map(noisy(ACQUISITION.simulate(T1=h1, T2=h2), 0.005, 7), uncertainty=True)
    for name, truth in (("T1", h1), ("T2", h2), ("M0", torch.ones_like(h1))):
        error = (maps[name] - truth).abs()
        assert 0.60 <= float((error <= sds[name]).float().mean()) <= 0.76, name
        assert 0.90 <= float((error <= 2 * sds[name]).float().mean()) <= 0.99, name
    only = perk.uncertainty_of(noisy(ACQUISITION.simulate(T1=h1, T2=h2), 0.005, 7))
    assert torch.equal(only["T1"], sds["T1"])


def _reference_maps(perk: PERK, volume: torch.Tensor) -> dict:
    """The maps of `volume` (complex128) through the float64 torch reference, from the model's buffers."""
    x = torch.view_as_real(volume).flatten(-2)
    norm = torch.linalg.vector_norm(volume, dim=-1)
    y = reference.regression(x / norm[:, None], perk.frequency, perk.phase, perk.head, perk.offset)
    return {"T1": torch.exp(y[:, 0]), "T2": torch.exp(y[:, 1]), "M0": norm * y[:, 2]}


def test_map_and_its_gradient_against_the_reference(small_model):
    """Values and the gradient of sum(map^2) w.r.t. the volume, float64 volume (the host's float64 kernels)
    against the torch reference's autograd: the same arithmetic in another order (1e-10 relative)."""
    h1, h2 = tissues(50, 5)
    volume = noisy(ACQUISITION.simulate(T1=h1, T2=h2), 0.003, 1).to(torch.complex128)
    ours = volume.clone().requires_grad_()
    theirs = volume.clone().requires_grad_()
    maps, expected = small_model.map(ours), _reference_maps(small_model, theirs)
    for name in ("T1", "T2", "M0"):
        assert maps[name].dtype == torch.float64
        assert float(((maps[name] - expected[name]).abs() / expected[name].abs()).max().detach()) < 1e-10, name
    sum(m.pow(2).sum() for m in maps.values()).backward()
    sum(m.pow(2).sum() for m in expected.values()).backward()
    assert float((ours.grad - theirs.grad).abs().max() / theirs.grad.abs().max()) < 1e-10


def test_float32_map_against_the_reference(small_model):
    """A complex64 volume maps in float32: within float32 round-off over F = 300 features of the float64 result
    (1e-4 relative on T1 and T2, whose logs are ~5-8 and are exponentiated; measured ~1e-5)."""
    h1, h2 = tissues(200, 5)
    volume = ACQUISITION.simulate(T1=h1, T2=h2)
    maps = small_model.map(volume)
    expected = _reference_maps(small_model, volume.to(torch.complex128))
    for name in ("T1", "T2", "M0"):
        assert maps[name].dtype == torch.float32
        assert float(((maps[name].double() - expected[name]) / expected[name]).abs().max()) < 1e-4, name


def test_gradcheck_through_map():
    t1, t2 = tissues(400, 1)
    perk = PERK(ACQUISITION, n_features=40, feature_seed=0).fit(T1=t1, T2=t2, seed=0)
    h1, h2 = tissues(2, 5)
    volume = ACQUISITION.simulate(T1=h1, T2=h2).to(torch.complex128).requires_grad_()

    def maps(v):
        m = perk.map(v)
        return m["T1"], m["T2"], m["M0"]

    assert torch.autograd.gradcheck(maps, (volume,))


def test_scale_and_library_of_the_volume(small_model):
    """The maps do not depend on the volume's scale (M0 follows it); a NumPy volume gives the same numbers."""
    h1, h2 = tissues(100, 4)
    volume = ACQUISITION.simulate(T1=h1, T2=h2)
    base = small_model.map(volume)
    scaled = small_model.map(2.5 * volume)
    assert torch.allclose(scaled["T1"], base["T1"], rtol=1e-5)  # float32 rounding of the scaled signal
    assert torch.allclose(scaled["M0"], 2.5 * base["M0"], rtol=1e-5)
    from_numpy = small_model.map(volume.numpy())
    assert np.allclose(np.asarray(from_numpy["T2"]), base["T2"].numpy(), rtol=0, atol=0)
    shaped = small_model.map(volume.reshape(10, 10, -1))
    assert shaped["T1"].shape == (10, 10)


def test_chunked_map_equals_one_call(small_model):
    """chunk_size voxels per kernel call: every voxel is computed alone, so chunks change no bit."""
    h1, h2 = tissues(30, 4)
    volume = ACQUISITION.simulate(T1=h1, T2=h2)
    whole, whole_sd = small_model.map(volume, uncertainty=True)
    small_model.chunk_size = 7
    try:
        parts, parts_sd = small_model.map(volume, uncertainty=True)
    finally:
        small_model.chunk_size = 65536
    for name in whole:
        assert torch.equal(whole[name], parts[name]) and torch.equal(whole_sd[name], parts_sd[name]), name


def test_zero_voxel_reads_nan_and_leaves_other_gradients_finite(small_model):
    h1, h2 = tissues(3, 4)
    volume = ACQUISITION.simulate(T1=h1, T2=h2)
    volume[1] = 0
    volume.requires_grad_()
    maps = small_model.map(volume)
    assert all(bool(torch.isnan(m[1])) and bool(torch.isfinite(m[[0, 2]]).all()) for m in maps.values())
    maps["T1"][[0, 2]].sum().backward()
    assert bool(torch.isfinite(torch.view_as_real(volume.grad)).all())


def test_stream_fits_the_same_model():
    """stream=True simulates each chunk when a pass needs it and keeps none; on noiseless training with the same
    seed, it sums the same rows in other groups: the maps agree to float round-off (1e-4 relative; measured
    ~1e-6)."""
    t1, t2 = tissues(5000, 1)
    kept = PERK(ACQUISITION, n_features=200, feature_seed=2).fit(T1=t1, T2=t2, seed=0, chunk=2500)
    streamed = PERK(ACQUISITION, n_features=200, feature_seed=2, stream=True).fit(T1=t1, T2=t2, seed=0, chunk=2500)
    h1, h2 = tissues(300, 3)
    volume = ACQUISITION.simulate(T1=h1, T2=h2)
    a, sa = kept.map(volume, uncertainty=True)
    b, sb = streamed.map(volume, uncertainty=True)
    for name in a:
        assert torch.allclose(a[name], b[name], rtol=1e-4), name
        assert torch.allclose(sa[name], sb[name], rtol=1e-3, atol=1e-6), name  # SDs are small differences


def test_subspace_and_stream():
    """rank=8 works in the subspace's 8 complex coefficients (16 input columns); stream=True with that subspace
    projects each simulated chunk and gives the same maps (noiseless, same seed: 1e-4 relative, float sums in
    other groups)."""
    t1, t2 = tissues(2000, 1)
    kept = PERK(ACQUISITION, n_features=100, feature_seed=0).fit(T1=t1, T2=t2, seed=0, rank=8)
    assert kept.length_scales.shape == (16,)
    streamed = PERK(ACQUISITION, n_features=100, feature_seed=0, stream=True).fit(
        T1=t1, T2=t2, seed=0, subspace=kept.subspace, chunk=1200)
    h1, h2 = tissues(100, 3)
    volume = ACQUISITION.simulate(T1=h1, T2=h2)
    a, b = kept.map(volume), streamed.map(volume)
    for name in a:
        assert torch.allclose(a[name], b[name], rtol=1e-4), name
    assert median_relative_error(a["T1"], h1) < 0.05


def test_known_property_column():
    """B1 known (measured separately) enters as a column with its own length scale."""
    n = 6000
    t1, t2 = tissues(n, 1)
    b1 = 0.7 + 0.6 * torch.rand(n, generator=torch.Generator().manual_seed(9))
    perk = PERK(ACQUISITION, n_features=500).fit(T1=t1, T2=t2, known={"B1": b1}, seed=0)
    assert perk.length_scales.shape == (2 * 100 + 1,)
    h1, h2 = tissues(500, 2)
    hb1 = 0.75 + 0.5 * torch.rand(500, generator=torch.Generator().manual_seed(8))
    maps = perk.map(ACQUISITION.simulate(T1=h1, T2=h2, B1=hb1), known={"B1": hb1})
    # Smaller training set and features than the defaults case, and a third dimension: 8 % is loose.
    assert median_relative_error(maps["T1"], h1) < 0.08
    assert median_relative_error(maps["T2"], h2) < 0.08


def test_given_signals_and_columns():
    """fit(signals=, parameters=(N, P)) without names: map returns the P columns (M0 is then not among them);
    log_targets=False regresses the values themselves."""
    t1, t2 = tissues(2000, 1)
    signals = ACQUISITION.simulate(T1=t1, T2=t2)
    perk = PERK(n_features=200, log_targets=False).fit(signals=signals, parameters=torch.stack([t1, t2], 1), seed=0)
    out = perk.map(signals[:10])
    assert isinstance(out, torch.Tensor) and out.shape == (10, 2)


@pytest.mark.parametrize("kwargs, message", [
    ({"complex_mode": "polar"}, "complex_mode must be 'cartesian'"),
    ({"regularization": -1e-3}, "regularization must be a finite number >= 0"),
    ({"n_features": 0}, "n_features must be a positive integer"),
    ({"chunk_size": 0}, "chunk_size must be a positive integer"),
    ({"length_scale": -1.0}, "length_scale must be a positive number"),
    ({"log_targets": 3}, "log_targets must be None"),
])
def test_constructor_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        PERK(ACQUISITION, **kwargs)


def test_usage_errors(small_model):
    t1, t2 = tissues(500, 1)
    with pytest.raises(RuntimeError, match="not trained"):
        PERK(ACQUISITION).map(torch.zeros(3, 100, dtype=torch.complex64))
    with pytest.raises(ValueError, match="rank="):
        PERK(ACQUISITION, stream=True).fit(T1=t1, T2=t2, rank=5)
    with pytest.raises(ValueError, match="reads M0 from the signal's norm"):
        PERK(ACQUISITION).fit(T1=t1, M0=(0.5, 1.5))
    with pytest.raises(ValueError, match="length_scale has 3 values, the inputs have 200 columns"):
        PERK(ACQUISITION, n_features=20, length_scale=[1.0, 2.0, 3.0]).fit(T1=t1, T2=t2)
    with pytest.raises(ValueError, match="log_targets names 'B1'"):
        PERK(ACQUISITION, n_features=20, log_targets=["B1"]).fit(T1=t1, T2=t2)
    no_sd = PERK(ACQUISITION, n_features=20, uncertainty=False).fit(T1=t1, T2=t2)
    with pytest.raises(RuntimeError, match="uncertainty=False"):
        no_sd.map(ACQUISITION.simulate(T1=t1[:3], T2=t2[:3]), uncertainty=True)
    with pytest.raises(ValueError, match="99 contrasts along its last axis, the estimator was trained on 100"):
        small_model.map(torch.zeros(3, 99, dtype=torch.complex64))
    with pytest.raises(ValueError, match="parameters"):
        PERK(n_features=20).fit(signals=ACQUISITION.simulate(T1=t1, T2=t2))


@pytest.mark.cuda
def test_cuda_map_and_gradient_match_the_host(small_model):
    """The same model on the card: maps and the gradient of sum(map^2) within float32 round-off of the host's
    (1e-4 relative: both float32, different summation orders)."""
    h1, h2 = tissues(3000, 6)
    volume = noisy(ACQUISITION.simulate(T1=h1, T2=h2), 0.003, 2)
    host = volume.clone().requires_grad_()
    card = volume.cuda().requires_grad_()
    a, b = small_model.map(host), small_model.map(card)
    for name in a:
        assert b[name].device.type == "cuda"
        assert float(((b[name].cpu() - a[name]) / a[name]).abs().max()) < 1e-4, name
    sum(m.pow(2).sum() for m in a.values()).backward()
    sum(m.pow(2).sum() for m in b.values()).backward()
    assert float((card.grad.cpu() - host.grad).abs().max() / host.grad.abs().max()) < 1e-4


@pytest.mark.cuda
def test_cuda_fit_matches_the_host():
    """Training on the card (under execution("cuda"): simulated and accumulated there) reads held-out tissues as
    well as on the host."""
    t1, t2 = tissues(5000, 1)
    with blochsim.execution("cuda"):
        perk = PERK(ACQUISITION, n_features=300, feature_seed=1).fit(T1=t1, T2=t2, seed=0)
    h1, h2 = tissues(500, 2)
    maps = perk.map(ACQUISITION.simulate(T1=h1.cuda(), T2=h2.cuda()))
    assert median_relative_error(maps["T1"].cpu(), h1) < 0.05
    assert median_relative_error(maps["T2"].cpu(), h2) < 0.05
