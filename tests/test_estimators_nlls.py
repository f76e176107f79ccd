"""NonlinearLeastSquares: convergence from three starts on a noisy 10k-voxel MRF volume, standard errors
against the Monte-Carlo spread, known maps, array libraries and errors."""

import math

import numpy as np
import pytest
import torch

from blochsim.estimators import NonlinearLeastSquares
from blochsim.simulators import MRFSimulator, MultiEchoSimulator

#: A short MRF train (40 TRs) keeps 10k voxels at a few seconds on 2 cores.
FLIP_DEG = torch.cat([torch.linspace(5, 60, 20), torch.linspace(60, 5, 20)])
CONTRASTS = 40
#: Noise SD on the real and imaginary parts: signals are 0.05-0.5 here, so a per-sample SNR of 25-250, where
#: the fit is close to linear in the noise (the Monte-Carlo spread is then what the Fisher information says).
SIGMA = 0.002
RANGES = {"T1": (200.0, 3000.0), "T2": (10.0, 300.0)}


def mrf():
    return MRFSimulator(flip=FLIP_DEG, TR=10.0)


def noisy(signal, generator):
    real, imag = (torch.randn(signal.shape, generator=generator) for _ in range(2))
    return signal + SIGMA * torch.complex(real, imag)


@pytest.fixture(scope="module")
def volume():
    """10k voxels: T1 log-uniform 300-2500 ms, T2 log-uniform 20-200 ms, M0 0.5-1.5, noise SIGMA."""
    g = torch.Generator().manual_seed(0)
    n = 10000
    truth = {"T1": torch.exp(torch.empty(n).uniform_(math.log(300), math.log(2500), generator=g)),
             "T2": torch.exp(torch.empty(n).uniform_(math.log(20), math.log(200), generator=g)),
             "M0": 0.5 + torch.rand(n, generator=g)}
    return truth, noisy(mrf().simulate(**truth), g)


STARTS = {"match": "match", "center": "center", "given": {"T1": 800.0, "T2": 60.0}}


@pytest.fixture(scope="module")
def fits(volume):
    """The volume fitted from each start: {start: (maps, standard errors, report)}."""
    _, signals = volume
    out = {}
    for key, start in STARTS.items():
        nlls = NonlinearLeastSquares(mrf(), start=start).fit(**RANGES, noise_std=SIGMA, seed=0)
        maps, errors = nlls.map(signals, uncertainty=True)
        out[key] = maps, errors, nlls.report
    return out


@pytest.mark.parametrize("start", list(STARTS))
def test_converges_to_the_truth_from_three_starts(volume, fits, start):
    truth, _ = volume
    maps, errors, report = fits[start]
    # A voxel whose noise puts its minimum beyond a bound stops on the bound, not converged (2 of 10k here, at
    # T1 = 3000 ms, where 40 TRs see T1 weakly); every other voxel converges.
    stopped = ~report["converged"]
    assert int(stopped.sum()) <= 10
    on_bound = (maps["T1"][stopped] - 3000).abs() < 0.3  # 1e-4 of the T1 range
    on_bound |= (maps["T1"][stopped] - 200).abs() < 0.3
    on_bound |= (maps["T2"][stopped] - 300).abs() < 0.03
    on_bound |= (maps["T2"][stopped] - 10).abs() < 0.03
    assert bool(on_bound.all())
    for name in ("T1", "T2", "M0"):
        z = (maps[name] - truth[name]).abs() / errors[name]
        # Every voxel within 5 standard errors of its truth: with Gaussian estimates, 10k voxels exceed 5 SE
        # with probability 6e-3 in all; a voxel caught in another minimum is tens to hundreds of SE away
        # (measured before the step was capped in the free variables: 265 SE from 'center').
        assert float(z.max()) < 5.0, (name, float(z.max()))


def test_three_starts_reach_the_same_minimum(fits):
    first, errors, report = fits["match"]
    for key in ("center", "given"):
        # Voxels stopped on a bound (not converged) may stop at different points of it.
        both = report["converged"] & fits[key][2]["converged"]
        for name in ("T1", "T2"):
            # The same minimum, to the solver's tolerance: it stops when an accepted step changes the cost by less
            # than 1e-6 of it, about 80 sigma^2 here, which leaves the estimate within sqrt(2 * 8e-5) = 0.013
            # standard errors of the minimum, or at the cost's round-off resolution; measured at most 0.054 SE
            # apart, and 0.1 SE bounds the distance between two stopping points.
            apart = ((fits[key][0][name] - first[name]).abs() / errors[name])[both]
            assert float(apart.max()) < 0.1, (key, name, float(apart.max()))


def test_standard_errors_agree_with_the_monte_carlo_spread():
    """Noise draws of two tissues: the SD of the estimates against the stated standard errors, with the noise
    SD given to fit (4000 draws each), then estimated from the residuals (1000 draws of one)."""
    g = torch.Generator().manual_seed(1)
    tissues = {"T1": torch.tensor([1000.0, 600.0]), "T2": torch.tensor([80.0, 40.0])}
    clean = mrf().simulate(**tissues)
    for noise_std, draws, count in ((SIGMA, 4000, 2), (0.0, 1000, 1)):
        signals = noisy(clean[:count].repeat_interleave(draws, 0), g)
        nlls = NonlinearLeastSquares(mrf()).fit(**RANGES, noise_std=noise_std, seed=0)
        maps, errors = nlls.map(signals, uncertainty=True)
        for name in ("T1", "T2", "M0"):
            for t in range(count):
                rows = slice(t * draws, (t + 1) * draws)
                spread = float(maps[name][rows].std())
                stated = float(errors[name][rows].mean())
                # Within 15 % (the bound): the sample SD of 1000-4000 draws is itself uncertain by
                # 1-2 %, and the linearisation at this SNR is good to a few %; measured within 1.5 %.
                assert abs(stated / spread - 1) < 0.15, (noise_std, name, t, stated, spread)


def test_known_map_and_numpy_round_trip():
    """B1 known per voxel; NumPy in gives NumPy maps, errors and report."""
    g = torch.Generator().manual_seed(2)
    n = 200
    truth = {"T1": 400 + 1500 * torch.rand(n, generator=g), "T2": 30 + 100 * torch.rand(n, generator=g)}
    b1 = 0.8 + 0.4 * torch.rand(n, generator=g)
    signals = noisy(mrf().simulate(**truth, B1=b1), g)
    nlls = NonlinearLeastSquares(mrf()).fit(**RANGES, known={"B1": (0.7, 1.3)}, noise_std=SIGMA, seed=0)
    maps, errors = nlls.map(signals.numpy().reshape(10, 20, -1), known={"B1": b1.numpy().reshape(10, 20)},
                            uncertainty=True)
    assert all(isinstance(v, np.ndarray) and v.shape == (10, 20) for v in (*maps.values(), *errors.values()))
    assert all(isinstance(v, np.ndarray) and v.shape == (10, 20) for v in nlls.report.values())
    z = np.abs(maps["T1"].reshape(-1) - truth["T1"].numpy()) / errors["T1"].reshape(-1)
    assert z.max() < 5.0  # every voxel within 5 SE (200 voxels: exceeded with probability 1e-4)
    with pytest.raises(ValueError, match="needs the measured map of 'B1'"):
        nlls.map(signals)


def test_closed_form_without_amplitude():
    """A real 10-echo decay with M0 fixed: amplitude=False fits T2 alone, the residual a plain difference."""
    te = torch.arange(1, 11) * 10.0
    model = MultiEchoSimulator(TE=te)
    g = torch.Generator().manual_seed(3)
    t2 = 20 + 150 * torch.rand(500, generator=g)
    signals = model.simulate(T2=t2) + 0.005 * torch.randn(500, 10, generator=g)
    nlls = NonlinearLeastSquares(model, amplitude=False, start="center").fit(T2=(5.0, 400.0), noise_std=0.005)
    maps, errors = nlls.map(signals, uncertainty=True)
    assert set(maps) == {"T2"}
    z = (maps["T2"] - t2).abs() / errors["T2"]
    assert float(z.max()) < 5.0  # every voxel within 5 SE (500 voxels: exceeded with probability 3e-4)


def test_initial_per_call_and_errors():
    nlls = NonlinearLeastSquares(mrf()).fit(**RANGES, seed=0)
    signals = mrf().simulate(T1=torch.tensor([900.0, 1200.0]), T2=torch.tensor([70.0, 90.0]))
    maps = nlls.map(signals, initial={"T1": torch.tensor([1000.0, 1000.0]), "T2": 100.0})
    # Noiseless: the fit reaches the truth to float32 simulation round-off (cost ~1e-14 of |y|^2).
    assert torch.allclose(maps["T1"], torch.tensor([900.0, 1200.0]), rtol=1e-3)
    with pytest.raises(ValueError, match=r"start of T1 is on or outside its bounds .* flat index 1"):
        nlls.map(signals, initial={"T1": torch.tensor([1000.0, 3000.0])})
    with pytest.raises(ValueError, match="'T2' needs bounds"):
        NonlinearLeastSquares(mrf()).fit(T1=(200.0, 3000.0), T2=[50.0, 60.0])
    with pytest.raises(ValueError, match="start='center' needs two-sided bounds"):
        NonlinearLeastSquares(mrf(), start="center", bounds={"T2": (0.0, None)}).fit(**RANGES)
    with pytest.raises(ValueError, match="damping_up must be > 1"):
        NonlinearLeastSquares(mrf(), damping_up=0.5)
    with pytest.raises(RuntimeError, match="not trained"):
        NonlinearLeastSquares(mrf()).map(signals)
    with pytest.raises(ValueError, match="bounds names 'B1'"):
        NonlinearLeastSquares(mrf(), bounds={"B1": (0.5, 1.5)}).fit(**RANGES)
