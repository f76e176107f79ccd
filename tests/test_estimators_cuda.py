"""Estimators on a card, through the public API, with the volumes created on the card (skipped without a card
and a CUDA build): results stay on the card and agree with the host; execution= moves the work; CuPy in,
CuPy out; a large grouped dictionary under a byte budget.

Tolerances. Matching decides in float32 on both devices, from the same float32 atoms: the chosen atoms are
the same unless two atoms tie to float32 round-off (none do on these grids: neighbours differ by 1e-4 in
score); amplitudes are recomputed in float64 from the same float32 rows, so they agree to 1e-6. The card's
kernels differ from the host's by up to 1e-5 of the largest signal entry (tests/test_cuda.py), which moves a
least-squares estimate by far less than 0.05 of its standard error at the SNR used here.
"""

from __future__ import annotations

import math

import pytest
import torch
from _mrf_grids import t1_t2_grid

import blochsim
from blochsim.estimators import DictionaryMatcher, LookupTable, NonlinearLeastSquares
from blochsim.simulators import DoubleAngleSimulator, MRFSimulator

pytestmark = pytest.mark.cuda  # skipped without a card and a CUDA build (conftest)

CARD = torch.device("cuda")
FLIP_DEG = torch.cat([torch.linspace(5, 60, 50), torch.linspace(60, 5, 50)])


def mrf():
    return MRFSimulator(flip=FLIP_DEG, TR=10.0)


def grid(n1=60, n2=50):
    return t1_t2_grid(n1, n2)


@pytest.fixture(scope="module")
def matcher():
    t1, t2 = grid()
    return DictionaryMatcher(mrf()).fit(T1=t1, T2=t2)


def card_signals(matcher, count=5000, seed=0):
    """Atoms times complex amplitudes, plus a little noise, made on the card."""
    g = torch.Generator(device=CARD).manual_seed(seed)
    atoms = matcher.dictionary.to(CARD)
    index = torch.randint(0, atoms.shape[0], (count,), generator=g, device=CARD)
    amplitude = torch.polar(0.5 + torch.rand(count, generator=g, device=CARD),
                            2 * math.pi * torch.rand(count, generator=g, device=CARD))
    noise = torch.randn((count, atoms.shape[1]), generator=g, device=CARD, dtype=torch.complex64)
    return atoms[index] * amplitude[:, None].to(torch.complex64) + 1e-3 * noise, index


def test_matching_on_the_card_agrees_with_the_host(matcher):
    signals, index = card_signals(matcher)
    result = matcher.match(signals)
    assert result.indices.device.type == "cuda" and result.scales.device.type == "cuda"
    host = matcher.match(signals.cpu())
    assert torch.equal(result.indices.cpu(), host.indices)
    assert torch.allclose(result.scales.cpu(), host.scales, rtol=1e-6, atol=1e-7)
    maps = matcher.map(signals)
    assert all(v.device.type == "cuda" for v in maps.values())


def test_execution_moves_the_work_and_results_come_home(matcher):
    signals, _ = card_signals(matcher, count=1000)
    on_card = matcher.match(signals)
    on_host = matcher.match(signals, execution="cpu")  # computed on the host, returned to the card
    assert on_host.indices.device.type == "cuda"
    assert torch.equal(on_host.indices, on_card.indices)
    with blochsim.offload(budget_bytes=8 * 2**20):  # host volume streamed through the card
        streamed = matcher.match(signals.cpu())
    assert streamed.indices.device.type == "cpu" and torch.equal(streamed.indices, on_card.indices.cpu())


def test_grouped_and_known_on_the_card():
    t1, t2 = grid(40, 30)
    b1_values = [0.8, 0.9, 1.0, 1.1, 1.2]
    matcher = DictionaryMatcher(mrf(), groups=16).fit(T1=t1, T2=t2, known={"B1": b1_values}, seed=0)
    g = torch.Generator(device=CARD).manual_seed(1)
    pick = torch.randint(0, len(t1), (2000,), generator=g, device=CARD)
    b1 = torch.tensor(b1_values, device=CARD)[torch.randint(0, 5, (2000,), generator=g, device=CARD)]
    signals = mrf().simulate(T1=t1.to(CARD)[pick], T2=t2.to(CARD)[pick], B1=b1)
    maps = matcher.map(signals, known={"B1": b1})
    assert maps["T1"].device.type == "cuda"
    assert torch.equal(maps["T1"], t1.to(CARD)[pick]) and torch.equal(maps["T2"], t2.to(CARD)[pick])


def test_a_large_grouped_dictionary_under_a_budget():
    """200k random atoms of rank 12 and 100k voxels on the card, cut into blocks by a 256 MiB budget: the
    grouped and exhaustive searches find the same atoms, and each voxel its own."""
    g = torch.Generator(device=CARD).manual_seed(2)
    atoms = torch.randn((200_000, 12), generator=g, device=CARD, dtype=torch.complex64)
    exhaustive = DictionaryMatcher(dictionary=atoms)
    grouped = DictionaryMatcher(dictionary=atoms, groups=256)
    index = torch.randint(0, atoms.shape[0], (100_000,), generator=g, device=CARD)
    signals = 3 * atoms[index]
    with blochsim.execution(budget_bytes=256 * 2**20):
        found = exhaustive.match(signals)
        assert torch.equal(found.indices[:, 0], index)
        assert torch.equal(grouped.match(signals).indices[:, 0], index)


def test_least_squares_on_the_card_agrees_with_the_host():
    g = torch.Generator(device=CARD).manual_seed(3)
    n, sigma = 4000, 0.002
    t1 = torch.exp(torch.empty(n, device=CARD).uniform_(math.log(300), math.log(2500), generator=g))
    t2 = torch.exp(torch.empty(n, device=CARD).uniform_(math.log(20), math.log(200), generator=g))
    clean = mrf().simulate(T1=t1, T2=t2)
    signals = clean + sigma * torch.randn(clean.shape, generator=g, device=CARD, dtype=torch.complex64)
    nlls = NonlinearLeastSquares(mrf()).fit(T1=(200.0, 3000.0), T2=(10.0, 300.0), noise_std=sigma, seed=0)
    maps, errors = nlls.map(signals, uncertainty=True)
    assert maps["T1"].device.type == "cuda" and nlls.report["converged"].device.type == "cuda"
    host = nlls.map(signals.cpu())
    both = nlls.report["converged"].cpu()
    for name in ("T1", "T2"):
        apart = ((maps[name].cpu() - host[name]).abs() / errors[name].cpu())[both]
        assert float(apart.max()) < 0.05, (name, float(apart.max()))
        z = (maps[name] - (t1 if name == "T1" else t2)).abs() / errors[name]
        assert float(z.max()) < 5.0  # every voxel within 5 SE of its truth (4000 voxels: p = 2e-3)


def test_lookup_table_on_the_card():
    acquisition = DoubleAngleSimulator(flip=[60.0, 120.0])
    table = LookupTable(acquisition, combine=lambda s: s[..., 1] / s[..., 0]).fit(B1=(0.5, 1.45))
    b1 = torch.linspace(0.6, 1.4, 9, device=CARD)
    maps = table.map(acquisition.simulate(B1=b1))
    assert maps["B1"].device.type == "cuda"
    assert torch.allclose(maps["B1"], b1, atol=1e-5)  # as tests/test_estimators_lookup.py (float32 ratio)


def test_cupy_in_cupy_out(matcher):
    cupy = pytest.importorskip("cupy")
    signals, index = card_signals(matcher, count=100)
    maps = matcher.map(cupy.from_dlpack(signals))
    assert isinstance(maps["T1"], cupy.ndarray)
    result = matcher.match(cupy.from_dlpack(signals))
    assert isinstance(result.indices, cupy.ndarray)
    assert torch.equal(torch.from_dlpack(result.indices)[:, 0], index)
