"""`Subspace` and `simulate_subspace`: the basis against numpy's SVD, truncation by rank and by energy, the
projection conventions, and the chunked simulation against a whole one."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import rel_max_err

import blochsim
from blochsim import Subspace
from blochsim.sequence import EpgEngine, TissueProperties, mrf_description, simulate_subspace

F64 = torch.float64


def dictionary(n1=30, n2=20, reps=60):
    flips = torch.deg2rad(torch.cat([torch.linspace(5, 60, reps // 2), torch.linspace(60, 5, reps - reps // 2)]))
    description = mrf_description(flips.to(F64), 0.01, inversion_time_s=0.02)
    tissue = TissueProperties(t1_ms=torch.linspace(200.0, 2500.0, n1)[:, None], t2_ms=torch.linspace(15.0, 250.0, n2))
    return description, tissue


def test_fit_matches_numpy_svd():
    """The basis spans numpy's leading right singular vectors (float64 SVD of the same matrix); each column
    equals numpy's up to a unit phase. Bound 1e-9: the Gram matrix's eigenvectors carry ~1e-16 x
    (sigma_max / sigma_r)^2 / gap of error, ~1e-11 at the ranks used."""
    g = torch.Generator().manual_seed(0)
    atoms = torch.randn(400, 5, dtype=torch.complex128, generator=g) @ torch.randn(5, 40, dtype=torch.complex128,
                                                                                   generator=g)
    atoms = atoms * torch.logspace(0, -2, 40, dtype=F64)  # a decaying spectrum
    sub = Subspace.fit(atoms, rank=4)
    _, s, vh = np.linalg.svd(atoms.numpy(), full_matrices=False)
    v = torch.from_numpy(vh.conj().T[:, :4])
    phases = (v.conj() * sub.basis).sum(0)
    assert rel_max_err(phases.abs(), torch.ones(4, dtype=F64)) < 1e-9
    assert rel_max_err(sub.basis, v * phases) < 1e-9
    assert rel_max_err(sub.singular_values[:5], torch.from_numpy(s[:5])) < 1e-9
    assert sub.rank == 4 and sub.contrasts == 40 and sub.modes.shape == (4, 40)
    assert abs(sub.retained - float((s[:4] ** 2).sum() / (s**2).sum())) < 1e-12
    torch.testing.assert_close(sub.dictionary, atoms @ sub.basis)


def test_rank_energy_and_span():
    atoms = torch.randn(200, 3, dtype=F64) @ torch.randn(3, 25, dtype=F64)  # span 3
    assert Subspace.fit(atoms, energy=1.0).rank == 3
    assert Subspace.fit(atoms, energy=0.5).retained >= 0.5
    for bad in (0, 4):
        with pytest.raises(ValueError, match=r"rank must be an integer in \[1, 3\]"):
            Subspace.fit(atoms, rank=bad)
    with pytest.raises(ValueError, match="exactly one"):
        Subspace.fit(atoms, rank=2, energy=0.9)
    with pytest.raises(ValueError, match="energy"):
        Subspace.fit(atoms, energy=1.5)


def test_project_expand_dtypes_and_shapes():
    description, tissue = dictionary()
    signal = EpgEngine().simulate(description, tissue, nstates=10).signal  # complex64 (30, 20, 60)
    sub = Subspace.fit(signal, rank=6)
    assert sub.basis.dtype == torch.complex64
    coefficients = sub.project(signal)
    assert coefficients.shape == (30, 20, 6) and coefficients.dtype == torch.complex64
    wide = sub.project(signal.to(torch.complex128))
    assert wide.dtype == torch.complex128  # the wider of the two
    back = sub.expand(coefficients)
    assert back.shape == signal.shape
    # What the projection drops is the energy the spectrum says it drops: ||s - s V V^H||^2 = (1 - retained)
    # ||s||^2. Bound 1e-6 of ||s||^2: float32 signals and products (~1e-7 per entry).
    residual = float((back - signal).abs().pow(2).sum() / signal.abs().pow(2).sum())
    assert abs(residual - (1 - sub.retained)) < 1e-6
    assert sub.retained > 0.999  # MRF dictionaries are compressible (McGivney 2014)
    with pytest.raises(ValueError, match="60 contrasts"):
        sub.project(signal[..., :5])


def test_simulate_subspace_in_chunks_equals_whole():
    """Chunks of 7 atoms (two passes through the engine) against one pass: the same Gram matrix summed in
    another order (float64, ~1e-15) and the same float32 signals; coefficients agree to float32 rounding
    (1e-5 of the largest)."""
    description, tissue = dictionary()
    whole = simulate_subspace(description, tissue, rank=5, nstates=10)
    chunked = simulate_subspace(description, tissue, rank=5, nstates=10, chunk_size=7)
    assert chunked.dictionary.shape == (30, 20, 5)
    assert rel_max_err(chunked.dictionary, whole.dictionary) < 1e-5
    signal = EpgEngine().simulate(description, tissue, nstates=10)
    assert rel_max_err(whole.dictionary, signal.signal @ whole.basis) < 1e-6  # the same float32 product
    assert torch.equal(whole.simulation.time_us, signal.time_us)
    assert whole.simulation.signal is whole.dictionary
    assert blochsim.sequence.simulate_subspace is simulate_subspace
    assert simulate_subspace(description, tissue, energy=0.999, nstates=10).retained >= 0.999


def test_simulate_subspace_errors():
    description, tissue = dictionary()
    with pytest.raises(TypeError, match="TissueProperties"):
        simulate_subspace(description, {"t1_ms": 1000.0}, rank=2)
    with pytest.raises(ValueError, match="chunk_size"):
        simulate_subspace(description, tissue, rank=2, chunk_size=0)
    with pytest.raises(ValueError, match="rank"):
        simulate_subspace(description, tissue, rank=100)


def test_frozen_and_validated():
    sub = Subspace(torch.eye(4)[:, :2], torch.tensor([2.0, 1.0, 0.5]))
    with pytest.raises(AttributeError):
        sub.basis = torch.eye(4)
    assert abs(sub.retained - 5 / 5.25) < 1e-12
    with pytest.raises(ValueError, match="singular_values"):
        Subspace(torch.eye(4)[:, :2], torch.tensor([1.0]))
    with pytest.raises(ValueError, match="contrasts, rank"):
        Subspace(torch.ones(4), torch.ones(1))
