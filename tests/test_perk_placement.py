"""PERK with volumes (and training tissues) on a stand-in card (tests/_fake_card.py): every tensor of the work
meets the card's tensors without a host/card mismatch, maps stay on the card, and the numbers equal the host's.

The stand-in card is CPU memory: its PERK calls run the host library on it (float32, as the CUDA library would),
so this checks placement, not the device kernels (tests/test_perk_kernels.py and test_perk.py hold those to the
reference on a real card).
"""

import math

import pytest
import torch
from _fake_card import card, fake_card

from blochsim.estimators import PERK
from blochsim.estimators import perk_kernels as kernels
from blochsim.simulators import MRFSimulator

FLIP_DEG = torch.cat([torch.linspace(5, 60, 10), torch.linspace(60, 5, 10)])


def mrf():
    return MRFSimulator(flip=FLIP_DEG, TR=10.0)


def tissues(n, seed):
    g = torch.Generator().manual_seed(seed)
    t1 = torch.exp(torch.empty(n).uniform_(math.log(200), math.log(3000), generator=g))
    t2 = torch.minimum(torch.exp(torch.empty(n).uniform_(math.log(10), math.log(300), generator=g)), 0.9 * t1)
    return t1, t2


def plain(x):
    return x.as_subclass(torch.Tensor)


@pytest.fixture
def host_kernels_on_the_card(monkeypatch):
    """The stand-in card's PERK calls go to the host library (which ignores the stream) on the same memory."""
    host = kernels._library(torch.device("cpu"))
    monkeypatch.setattr(kernels, "_library", lambda device: host)
    monkeypatch.setattr(kernels, "_run", lambda lib, device, entry, args: kernels.nat.check_status(
        lib, getattr(lib, entry)(kernels.ctypes.byref(args)), entry))


def test_map_on_a_stand_in_card(host_kernels_on_the_card):
    t1, t2 = tissues(1500, 1)
    perk = PERK(mrf(), n_features=100, feature_seed=0).fit(T1=t1, T2=t2, seed=0)
    h1, h2 = tissues(40, 2)
    signals = mrf().simulate(T1=h1, T2=h2)
    host, host_sd = perk.map(signals, uncertainty=True)
    with fake_card():
        maps, sds = perk.map(card(signals), uncertainty=True)
    for name in host:
        assert maps[name].device.type == "cuda" and sds[name].device.type == "cuda"
        assert torch.equal(plain(maps[name]), host[name]), name
        assert torch.equal(plain(sds[name]), host_sd[name]), name


def test_fit_on_a_stand_in_card(host_kernels_on_the_card):
    """Training signals on the card: the fit accumulates and solves there, and gives the host's model (the same
    float32 sums in the same order; the float64 solve on another device of the same arithmetic)."""
    t1, t2 = tissues(1500, 1)
    signals = mrf().simulate(T1=t1, T2=t2)
    values = {"T1": t1, "T2": t2}
    host = PERK(n_features=100, feature_seed=0).fit(signals=signals, parameters=values, seed=0)
    with fake_card():
        on_card = PERK(n_features=100, feature_seed=0).fit(signals=card(signals), parameters=values, seed=0)
    for name in ("head", "offset", "uncertainty_head", "frequency"):
        assert torch.equal(plain(getattr(on_card, name)), getattr(host, name)), name
