"""The public API with its tensors on a GPU, checked on a machine without one (issue 21 item 1).

A stand-in card (tests/_fake_card.py) plays the GPU: tensors that say they live on cuda:0, with torch's
rule that an operation takes its tensors from one device (a CPU scalar aside), and the host build's
float32 kernels serving work on the card, refusing float64 as the CUDA build does. The matrix of
tests/test_cuda_api.py runs here through it (tests/_placement.py), so a protocol or tissue tensor that
meets a tensor of the other device, a value read through NumPy from the card, or a float64 kernel call
on the card fails here before it reaches a GPU. What it cannot see: the GPU's own arithmetic (the real
matrix runs on the card), and the device of the gradients autograd makes (checked on the GPU only).
"""

from __future__ import annotations

import _every_simulator as every
import _placement as P
import pytest
import torch
from _fake_card import card, fake_card

#: A short train: the placement, not the physics, is under test here (the full train runs on the GPU).
FLIPS = 6


#: The reverse passes through pooled tissue cost a second or more on the CPU (the pool tables' graph): those run
#: with everything on the card only; the GPU runs them in every placement.
CASES = [case for case in P.cases()
         if not (case[2] == "pooled" and case[1] in ("gradient", "second_order") and case[3] != "card-card")]


@pytest.mark.parametrize("entry,kind,path,placement", CASES)
def test_matrix_on_a_stand_in_card(entry, kind, path, placement):
    with fake_card():
        P.check(entry, kind, path, placement, card, grads_on_device=False, flips=FLIPS)


@pytest.mark.parametrize("placement", P.FINDING_PLACEMENTS)
@pytest.mark.parametrize("name", P.STEADY_CASES)
def test_steady_state_on_a_stand_in_card(name, placement):
    """repetitions="auto" on the card runs the float32 kernels only (it asked for float64: issue 28 item 1),
    played out to its limit; held to the host's float64 extrapolation. The 5,000 explicit repetitions run on
    the GPU (seconds of host time here)."""
    with fake_card():
        P.steady(name, placement, card, explicit=False, grads_on_device=False)


@pytest.mark.parametrize("placement", P.FINDING_PLACEMENTS)
def test_epg_engine_steady_state_on_a_stand_in_card(placement):
    with fake_card():
        P.epg_engine_steady(placement, card)


def test_steady_state_on_the_card_refuses_an_infinite_relaxation_time():
    """The card plays the train for 20 of the longest relaxation time: an infinite one is refused by name,
    with the way out (the host extrapolates), rather than played for ever or cut short unsaid."""
    from blochsim.simulators import MRFSimulator

    sim = MRFSimulator(flip=P.FLIPS_DEG[:12], TR=P.TR_MS)
    with fake_card():
        t1, t2 = card(torch.tensor([800.0, 1200.0])), card(torch.tensor([60.0, float("inf")]))
        with pytest.raises(ValueError, match="infinite relaxation time.*device='cpu'"):
            sim.simulate(T1=t1, T2=t2, repetitions="auto")
        assert sim.simulate(T1=t1, T2=t2, repetitions="auto", device="cpu").shape == (2, 12)


# CEST's real part is taken by forward mode per Jacobian column, which scripts one of torch's decompositions.
@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")
@pytest.mark.parametrize("placement", P.FINDING_PLACEMENTS)
def test_cest_with_pool_b_on_a_stand_in_card(placement):
    with fake_card():
        P.cest_pool_b(placement, card)


@pytest.mark.parametrize("placement", every.PLACEMENTS)
@pytest.mark.parametrize("name", every.shipped())
def test_every_simulator_on_a_stand_in_card(name, placement):
    """Every shipped simulator (tests/_every_simulator.py), the tissue on the card and every protocol list too:
    the result on the card, equal to the host's (the stand-in computes on the host)."""
    with fake_card():
        every.check(name, placement, card)


def test_every_shipped_simulator_has_a_case():
    assert every.missing_cases() == []


@pytest.mark.parametrize("placement", P.FINDING_PLACEMENTS)
def test_flash_sampled_pulses_on_a_stand_in_card(placement):
    with fake_card():
        P.flash_sampled(placement, card)


def test_a_resolved_call_reads_nothing_from_the_card():
    """With the protocol and the tissue on the card, the third call of a structure (resolved: its values
    an affine map of the protocol) maps the protocol on the card and calls the kernels with no host read of
    a card value; the first (the layout, walked on the host) copies the protocol over once."""
    from _fake_card import SYNCS

    from blochsim.simulators import MRFSimulator

    sim = MRFSimulator(states=P.STATES)
    with fake_card():
        flips = card(torch.tensor(P.FLIPS_DEG), requires_grad=True)
        t1, t2 = card(torch.linspace(300.0, 2000.0, 50)), card(torch.linspace(30.0, 150.0, 50))
        reads = []
        for _ in range(3):  # walk, resolve, resolved
            SYNCS.clear()
            sim.simulate(flip=flips, TR=P.TR_MS, T1=t1, T2=t2)
            reads.append(list(SYNCS))
    assert reads[2] == [], reads
    assert reads[0].count("to_host") == 1, reads  # the flips, for the layout on the host
