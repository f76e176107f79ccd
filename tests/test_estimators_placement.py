"""Estimators with volumes on a stand-in card (tests/_fake_card.py): every tensor of the work meets the card's
tensors without a host/card mismatch, results stay on the card, and the numbers equal the host's (the stand-in
runs the host's arithmetic). The real card runs tests/test_estimators_cuda.py.

A byte budget is given (execution(budget_bytes=...)): without one, blocks on a card are sized from its free
memory, which the stand-in cannot report.
"""


import pytest
import torch
from _fake_card import card, fake_card
from _mrf_grids import t1_t2_grid

import blochsim
from blochsim.estimators import DictionaryMatcher, LookupTable, NonlinearLeastSquares
from blochsim.simulators import DoubleAngleSimulator, MRFSimulator

FLIP_DEG = torch.cat([torch.linspace(5, 60, 10), torch.linspace(60, 5, 10)])
BUDGET = blochsim.execution(budget_bytes=64 * 2**20)


def mrf():
    return MRFSimulator(flip=FLIP_DEG, TR=10.0)


def grid():
    return t1_t2_grid(20, 15)


def on_card(x) -> bool:
    return x.device.type == "cuda"


def plain(x):
    """A stand-in card tensor as the host tensor it is (outside fake_card(),  keeps the class)."""
    return x.as_subclass(torch.Tensor)


@pytest.mark.parametrize("groups", [None, 6])
def test_dictionary_matcher_on_a_stand_in_card(groups):
    t1, t2 = grid()
    matcher = DictionaryMatcher(mrf(), groups=groups).fit(T1=t1, T2=t2, known={"B1": [0.9, 1.0, 1.1]}, seed=0)
    pick = torch.arange(0, len(t1), 7)
    b1 = torch.tensor([0.9, 1.0, 1.1]).repeat(len(pick))[: len(pick)]
    signals = 2 * mrf().simulate(T1=t1[pick], T2=t2[pick], B1=b1)
    host = matcher.match(signals, known={"B1": b1})
    with fake_card(), BUDGET:
        result = matcher.match(card(signals), known={"B1": card(b1)})
        maps = matcher.map(card(signals), known={"B1": card(b1)})
    assert all(on_card(x) for x in (result.indices, result.scales, result.parameters, *maps.values()))
    assert torch.equal(plain(result.indices), host.indices)
    assert torch.equal(plain(maps["T1"]), t1[pick])


def test_dictionary_given_on_the_card():
    """A dictionary given as card tensors is clustered and matched there."""
    t1, t2 = grid()
    atoms = mrf().simulate(T1=t1, T2=t2)
    with fake_card(), BUDGET:
        matcher = DictionaryMatcher(dictionary=card(atoms), parameters={"T1": card(t1), "T2": card(t2)}, groups=5)
        maps = matcher.map(card(atoms[::5]))
    assert on_card(maps["T1"]) and torch.equal(plain(maps["T1"]), t1[::5])


def test_least_squares_on_a_stand_in_card():
    g = torch.Generator().manual_seed(0)
    t1 = 400 + 1500 * torch.rand(50, generator=g)
    t2 = 30 + 100 * torch.rand(50, generator=g)
    b1 = 0.9 + 0.2 * torch.rand(50, generator=g)
    clean = mrf().simulate(T1=t1, T2=t2, B1=b1)
    real, imag = (torch.randn(clean.shape, generator=g) for _ in range(2))
    signals = clean + 0.002 * torch.complex(real, imag)
    nlls = NonlinearLeastSquares(mrf()).fit(T1=(200.0, 3000.0), T2=(10.0, 300.0), known={"B1": (0.8, 1.2)},
                                           noise_std=0.002, seed=0)
    host, host_errors = nlls.map(signals, known={"B1": b1}, uncertainty=True)
    with fake_card(), BUDGET:
        maps, errors = nlls.map(card(signals), known={"B1": card(b1)}, uncertainty=True)
        report = nlls.report
    assert all(on_card(x) for x in (*maps.values(), *errors.values(), *report.values()))
    for name in ("T1", "T2", "M0"):
        # The same arithmetic on the same memory: equal up to the order of reductions (torch's CPU kernels
        # pick their blocking by the tensor's address alignment); 1e-4 of a standard error covers it.
        assert float(((plain(maps[name]) - host[name]).abs() / host_errors[name]).max()) < 1e-4


def test_lookup_table_on_a_stand_in_card():
    acquisition = DoubleAngleSimulator(flip=[60.0, 120.0])
    table = LookupTable(acquisition, combine=lambda s: s[..., 1] / s[..., 0]).fit(B1=(0.5, 1.45))
    b1 = torch.linspace(0.6, 1.4, 9)
    signals = acquisition.simulate(B1=b1)
    with fake_card(), BUDGET:
        maps = table.map(card(signals))
    assert on_card(maps["B1"]) and torch.allclose(plain(maps["B1"]), b1, atol=1e-5)  # float32 ratio, as on the host
