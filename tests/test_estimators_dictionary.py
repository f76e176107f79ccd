"""DictionaryMatcher: exact atoms on noiseless signals (plain, grouped, compressed, by known property),
amplitudes, array libraries, chunking, and errors."""

import math

import numpy as np
import pytest
import torch
from _mrf_grids import t1_t2_grid

import blochsim
from blochsim.estimators import DictionaryMatcher, MatchResult
from blochsim.simulators import MRFSimulator

#: A short MRF train (40 TRs): enough contrast to tell the grid's atoms apart, fast on 2 cores.
FLIP_DEG = torch.cat([torch.linspace(5, 60, 20), torch.linspace(60, 5, 20)])


def mrf():
    return MRFSimulator(flip=FLIP_DEG, TR=10.0)


def grid(n1=40, n2=30):
    """T1 x T2 on log grids (ms), T2 <= T1: the usual MRF dictionary."""
    return t1_t2_grid(n1, n2)


@pytest.fixture(scope="module")
def plain():
    t1, t2 = grid()
    return DictionaryMatcher(mrf()).fit(T1=t1, T2=t2)


def noiseless(matcher, count=300, seed=0):
    """Atoms of `matcher` times random complex amplitudes: (signals, atom indices, amplitudes)."""
    g = torch.Generator().manual_seed(seed)
    index = torch.randint(0, matcher.dictionary.shape[0], (count,), generator=g)
    amplitude = (0.5 + 2 * torch.rand(count, generator=g)) * torch.exp(2j * math.pi * torch.rand(count, generator=g))
    return matcher.dictionary[index] * amplitude[:, None].to(torch.complex64), index, amplitude


def test_noiseless_signals_give_their_exact_atom(plain):
    signals, index, amplitude = noiseless(plain)
    result = plain.match(signals)
    assert isinstance(result, MatchResult)
    assert torch.equal(result.indices[:, 0], index)
    # float32 atoms and signals: |<d,s>| / (|d||s|) of an atom with itself is 1 to float32 round-off over
    # 40 contrasts (~40 * 6e-8 relative).
    assert torch.allclose(result.scores[:, 0], torch.ones(len(index)), atol=1e-5)
    # The amplitude <d,s>/|d|^2 of a signal that is exactly a * d is a; float32 round-off as above.
    assert torch.allclose(result.scales[:, 0], amplitude.to(torch.complex64), rtol=1e-5, atol=1e-6)
    maps = plain.map(signals)
    t1, t2 = grid()
    assert torch.equal(maps["T1"], t1[index]) and torch.equal(maps["T2"], t2[index])
    assert torch.allclose(maps["M0"], amplitude.abs().float(), rtol=1e-5)


def test_top_k_sorted_and_parameters(plain):
    matcher = DictionaryMatcher(dictionary=plain.dictionary, parameters={"T1": grid()[0], "T2": grid()[1]},
                                top_k=4)
    signals, index, _ = noiseless(plain, count=50)
    result = matcher.match(signals.reshape(5, 10, -1))
    assert result.indices.shape == (5, 10, 4) and result.parameters.shape == (5, 10, 4, 2)
    assert torch.equal(result.indices[..., 0].reshape(-1), index)
    assert bool((result.scores[..., :-1] >= result.scores[..., 1:]).all())  # best first
    assert torch.equal(result.parameters[..., 0, 0].reshape(-1), grid()[0][index])


@pytest.mark.parametrize("groups", [1, 12, 60])
def test_grouped_matching_finds_the_exact_atom(plain, groups):
    t1, t2 = grid()
    grouped = DictionaryMatcher(mrf(), groups=groups).fit(T1=t1, T2=t2, seed=1)
    signals, index, _ = noiseless(plain, seed=2)
    assert torch.equal(grouped.match(signals).indices[:, 0], index)
    g = grouped.grouping
    assert int(g.atoms.sum()) == len(t1) and len(g.members) == g.representative.numel() <= groups
    assert g.compression is None
    members = torch.sort(torch.cat(g.members)).values
    assert torch.equal(members, torch.arange(len(t1)))  # every atom in exactly one group


def test_grouped_top_k_equals_exhaustive(plain):
    """The bound never drops a group that holds one of the k best atoms (noisy signals: close competitors)."""
    t1, t2 = grid()
    grouped = DictionaryMatcher(mrf(), groups=20, top_k=3, prune=0.0).fit(T1=t1, T2=t2, seed=3)
    exhaustive = DictionaryMatcher(dictionary=plain.dictionary, top_k=3)
    signals, _, _ = noiseless(plain, seed=4)
    g = torch.Generator().manual_seed(5)
    signals = signals + 0.01 * torch.randn(signals.shape, generator=g, dtype=torch.complex64)
    found, expected = grouped.match(signals), exhaustive.match(signals)
    assert torch.equal(found.indices[:, 0], expected.indices[:, 0])
    # The 2nd and 3rd atoms may swap: their scores tie to float32 round-off (0.9994 vs 0.9994), and the grouped
    # search merges them in another order. The sets are the same.
    assert torch.equal(found.indices.sort(1).values, expected.indices.sort(1).values)


def test_compressed_dictionary_finds_the_exact_atom(plain):
    pytest.importorskip("blochsim.subspace")
    t1, t2 = grid()
    compressed = DictionaryMatcher(mrf()).fit(T1=t1, T2=t2, rank=8)
    assert compressed.dictionary.shape[-1] == 8 and compressed.subspace.rank == 8
    signals, index, amplitude = noiseless(plain, seed=6)
    maps = compressed.map(signals)
    assert torch.equal(maps["T1"], t1[index]) and torch.equal(maps["T2"], t2[index])
    # Rank 8 keeps all but ~1e-6 of this dictionary's energy: the density is the amplitude to that order.
    assert torch.allclose(maps["M0"], amplitude.abs().float(), rtol=1e-3)
    grouped = DictionaryMatcher(mrf(), groups=10).fit(T1=t1, T2=t2, rank=8, seed=0)
    assert grouped.grouping.compression == 8
    assert torch.equal(grouped.map(signals)["T1"], t1[index])


def test_known_property_selects_its_atoms():
    """Atoms simulated at every B1 of a grid; each voxel is matched among the atoms at its measured B1."""
    t1, t2 = grid(20, 15)
    b1_values = [0.8, 0.9, 1.0, 1.1, 1.2]
    matcher = DictionaryMatcher(mrf()).fit(T1=t1, T2=t2, known={"B1": b1_values})
    assert matcher.dictionary.shape[0] == len(t1) * len(b1_values) and matcher.known == ("B1",)
    g = torch.Generator().manual_seed(7)
    pick = torch.randint(0, len(t1), (200,), generator=g)
    b1 = torch.tensor(b1_values)[torch.randint(0, 5, (200,), generator=g)]
    signals = mrf().simulate(T1=t1[pick], T2=t2[pick], B1=b1)
    # The measured B1 is off the grid by less than half a step: it selects the set simulated at the grid value.
    measured = b1 + 0.04 * (2 * torch.rand(200, generator=g) - 1)
    maps = matcher.map(signals, known={"B1": measured})
    assert torch.equal(maps["T1"], t1[pick]) and torch.equal(maps["T2"], t2[pick])
    grouped = DictionaryMatcher(mrf(), groups=6).fit(T1=t1, T2=t2, known={"B1": b1_values}, seed=0)
    assert torch.equal(grouped.map(signals, known={"B1": measured})["T1"], t1[pick])
    with pytest.raises(ValueError, match=r"known\['B1'\].*outside.*flat index 3"):
        bad = measured.clone()
        bad[3] = 1.5
        matcher.map(signals, known={"B1": bad})
    with pytest.raises(ValueError, match="needs the measured map of 'B1'"):
        matcher.map(signals)


def test_numpy_in_numpy_out(plain):
    signals, index, _ = noiseless(plain, count=20)
    maps = plain.map(signals.numpy().reshape(4, 5, -1))
    assert all(isinstance(v, np.ndarray) and v.shape == (4, 5) for v in maps.values())
    result = plain.match(signals.numpy())
    assert isinstance(result.indices, np.ndarray) and isinstance(result.parameters, np.ndarray)
    assert np.array_equal(result.indices[:, 0], index.numpy())
    maps = plain.map(signals)  # torch in, torch out
    assert all(isinstance(v, torch.Tensor) for v in maps.values())


def test_blocks_from_a_small_budget_give_the_same_match(plain):
    """A budget of a few blocks' worth cuts voxels and atoms into many blocks; the result is the same."""
    signals, index, _ = noiseless(plain, count=100)
    whole = plain.match(signals)
    with blochsim.execution("cpu", budget_bytes=16 * 64 * 100):  # 16 bytes a score: 64 voxels x 100 atoms
        cut = plain.match(signals)
    assert torch.equal(cut.indices, whole.indices) and torch.equal(cut.scales, whole.scales)
    small = DictionaryMatcher(dictionary=plain.dictionary, query_chunk_size=7, dictionary_chunk_size=33)
    assert torch.equal(small.match(signals).indices, whole.indices)


def test_real_signals_and_real_dictionary():
    """A closed form with real output: the amplitude is real and may be negative; its density is |scale|."""
    from blochsim.simulators import InversionRecoverySimulator

    ir = InversionRecoverySimulator(TI=[50.0, 150.0, 400.0, 1000.0, 3000.0])
    t1 = torch.linspace(100, 3000, 300)
    matcher = DictionaryMatcher(ir).fit(T1=t1)
    signals = -1.5 * ir.simulate(T1=t1[[10, 200]])
    result = matcher.match(signals)
    assert torch.equal(result.indices[:, 0], torch.tensor([10, 200]))
    # float32 signals over 5 contrasts: round-off ~1e-7 relative.
    assert torch.allclose(result.scales[:, 0], torch.tensor([-1.5, -1.5]), rtol=1e-5)
    assert torch.allclose(result.densities[:, 0], torch.tensor([1.5, 1.5]), rtol=1e-5)


def test_dictionary_without_parameters_maps_atom_indices(plain):
    matcher = DictionaryMatcher(dictionary=plain.dictionary.numpy())
    signals, index, _ = noiseless(plain, count=10)
    assert torch.equal(matcher.map(signals), index)


def test_errors_name_the_argument(plain):
    with pytest.raises(RuntimeError, match="needs a dictionary"):
        DictionaryMatcher(mrf()).match(torch.zeros(3, 40))
    with pytest.raises(RuntimeError, match="not trained"):
        DictionaryMatcher(mrf()).map(torch.zeros(3, 40))
    with pytest.raises(ValueError, match="39 contrasts.*trained on 40"):
        plain.map(torch.zeros(3, 39))
    with pytest.raises(ValueError, match=r"volume holds NaN or inf in 1 voxel\(s\), the first at index \(1, 0\)"):
        v = torch.zeros(2, 2, 40)
        v[1, 0, 5] = float("nan")
        plain.map(v)
    with pytest.raises(ValueError, match="zero norm, the first at index 2"):
        DictionaryMatcher(dictionary=torch.cat([plain.dictionary[:2], torch.zeros(1, 40)]))
    with pytest.raises(ValueError, match="top_k"):
        DictionaryMatcher(top_k=0)
    with pytest.raises(ValueError, match="noise_std"):
        DictionaryMatcher(mrf()).fit(T1=(200.0, 3000.0), T2=(10.0, 100.0), samples=10, noise_std=0.01)
    with pytest.raises(ValueError, match="range of unknown 'T2' must be a pair"):
        DictionaryMatcher(mrf()).fit(T1=(200.0, 3000.0), T2=(10.0, 50.0, 100.0))
    with pytest.raises(ValueError, match="'T1' is given both as unknown and as known"):
        DictionaryMatcher(mrf()).fit(T1=(200.0, 3000.0), known={"T1": [1000.0]})
    with pytest.raises(NotImplementedError, match="PERK and NonlinearLeastSquares"):
        plain.map(plain.dictionary[:2], uncertainty=True)
    with pytest.raises(ValueError, match="rank= .* or subspace="):
        DictionaryMatcher(mrf()).fit(T1=(200.0, 3000.0), rank=4, subspace=object())
