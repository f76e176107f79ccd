"""A readout that is not acquired is not an echo (API.md 6.2): `record="echo"` keeps the acquired echoes only.

`is_echo` of an ADC event follows its role unless given: NON_ACQUIRED readouts are not echoes, the others
are; `is_echo=True` with role NON_ACQUIRED is a ValueError, never coerced. The prepared trains (MPRAGE,
MP2RAGE) play many NON_ACQUIRED shots around the acquired ones, so their descriptions must give the same
samples under `record="echo"` and `record="acquired"`: the contrasts of their closed forms.
"""

from __future__ import annotations

import math

import pytest
import torch

from blochsim import engine
from blochsim.model import Simulator
from blochsim.sequence import (
    AdcRole,
    EventType,
    Readout,
    SequenceEvent,
    SPGRReadout,
    SSFPEchoReadout,
    SSFPFidReadout,
    TissueProperties,
    bSSFPReadout,
    mprage_description,
)
from blochsim.sequence.columns import columns_of, walk
from blochsim.simulators._formulas import mp2rage
from blochsim.simulators.mp2rage import MP2RAGESimulator
from blochsim.simulators.mprage import MPRAGESimulator

F64 = torch.float64
DEG = math.pi / 180
T1 = torch.tensor([800.0, 1400.0, 2000.0])


def rel(actual, expected) -> float:
    actual, expected = (torch.as_tensor(x).detach().to(torch.complex128) for x in (actual, expected))
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    return float((actual - expected).abs().max() / expected.abs().max())


def test_adc_is_echo_follows_the_role_and_a_contradiction_raises():
    for role in AdcRole:
        assert SequenceEvent.adc(0.0, role).is_echo is (role != AdcRole.NON_ACQUIRED)
    assert SequenceEvent.adc(0.0, AdcRole.SINGLE, is_echo=False).is_echo is False
    assert SequenceEvent.adc(0.0, AdcRole.NON_ACQUIRED, is_echo=False).is_echo is False
    with pytest.raises(ValueError, match="is_echo=True contradicts role NON_ACQUIRED"):
        SequenceEvent.adc(0.0, AdcRole.NON_ACQUIRED, is_echo=True)
    with pytest.raises(ValueError, match="is_echo=True contradicts role NON_ACQUIRED"):
        SequenceEvent(EventType.ADC, 0.0, (AdcRole.NON_ACQUIRED, 0.0, True))
    with pytest.raises(ValueError, match="is_echo=True contradicts role NON_ACQUIRED"):
        SequenceEvent(EventType.ADC, 0.0, (0, 0.0, 1))  # the role and flag as plain numbers


@pytest.mark.parametrize("readout", [Readout, bSSFPReadout, SSFPFidReadout, SSFPEchoReadout, SPGRReadout])
def test_readout_operators_follow_the_role(readout):
    def echo_flags(op):
        return [e.is_echo for e in op.emit(0.0) if e.type == EventType.ADC]

    assert echo_flags(readout(role=AdcRole.NON_ACQUIRED)) == [False]
    assert echo_flags(readout(role=AdcRole.NON_CENTER)) == [True]
    assert echo_flags(readout(role=AdcRole.SINGLE, is_echo=False)) == [False]
    with pytest.raises(ValueError, match="is_echo=True contradicts role NON_ACQUIRED"):
        readout(role=AdcRole.NON_ACQUIRED, is_echo=True)


def test_builder_marks_only_the_acquired_shot_as_echo():
    description = mprage_description(3, 4, 0.15, 8e-3, 0.5)
    roles = [e.adc_role for e in description.adc_events]
    assert [e.is_echo for e in description.adc_events] == [r != AdcRole.NON_ACQUIRED for r in roles]
    assert sum(e.is_echo for e in description.adc_events) == 1
    laid_out = columns_of(description)  # the builder's columns, beside its events
    assert laid_out.is_echo.tolist() == walk(description.events).is_echo.tolist()
    tissue = TissueProperties(t1_ms=torch.tensor([700.0, 1400.0]), t2_ms=60.0)
    echo = engine.simulate(description, tissue, states=1, record="echo")
    acquired = engine.simulate(description, tissue, states=1, record="acquired")
    assert echo.shape == (2, 1) and torch.equal(echo, acquired)


def test_mp2rage_train_gives_the_two_contrasts_under_both_records():
    sim = MP2RAGESimulator(TI=[700.0, 2500.0], flip=[4.0, 5.0], TRspgr=7.0, TRmp2rage=5000.0, nshots=(60, 100))
    description = sim.describe()
    closed = mp2rage(torch.tensor([700.0, 2500.0], dtype=F64), torch.tensor([4.0, 5.0], dtype=F64), 7.0, 5000.0,
                     (60, 100), T1=T1.to(F64)[:, None], M0=1.2, inv_efficiency=0.96)
    for record in ("echo", "acquired"):
        for train in (Simulator.from_description(description, model=MP2RAGESimulator.model, record=record,
                                                 states=1),
                      MP2RAGESimulator.from_description(description, record=record)):
            # 8 playings from equilibrium: each TRmp2rage contracts the start by at most eff e^{-5000/2000} < 0.08,
            # 0.08^8 < 1e-8; float32 kernels over 8 x 321 events: 1e-5 of the largest sample.
            got = train.simulate(T1=T1, inv_efficiency=0.96, M0=1.2, repetitions=8)
            assert got.shape == (3, 2)
            assert rel(got * 1j, closed) < 1e-5, record  # from_description: the raw -i sin(a) Mz


def _mprage_steady_mz(t1_ms, flip_deg, tr_ms, lead_ms, before, after, eff):
    """Mz just before the centre pulse of MPRAGE in its steady state (one repetition: an inversion, `lead_ms`
    of recovery, `before + after` ideally spoiled shots `tr_ms` apart; the next inversion follows the last
    TR). Affine maps Mz -> a Mz + b composed in float64; the steady state is the fixed point b / (1 - a)."""
    e1, el = torch.exp(-tr_ms / t1_ms), torch.exp(-lead_ms / t1_ms)
    q = e1 * math.cos(flip_deg * DEG)

    def shots(n):  # n shots: Mz -> q^n Mz + (1 - E1)(1 + q + ... + q^{n-1})
        return q**n, (1 - e1) * (1 - q**n) / (1 - q)

    def then(first, second):
        return second[0] * first[0], second[0] * first[1] + second[1]

    to_centre = then(then((-eff, torch.zeros_like(t1_ms)), (el, 1 - el)), shots(before))
    whole = then(to_centre, shots(after))
    start = whole[1] / (1 - whole[0])
    return to_centre[0] * start + to_centre[1]


def test_mprage_train_gives_the_centre_shot_under_both_records():
    sim = MPRAGESimulator(TI=900.0, flip=8.0, TRspgr=9.0, nshots=(40, 60))
    description = sim.describe()
    mz = _mprage_steady_mz(T1.to(F64), 8.0, 9.0, 900.0 - 40 * 9.0, 40, 60, 0.9)
    closed = 1.1 * math.sin(8.0 * DEG) * mz
    for record in ("echo", "acquired"):
        train = Simulator.from_description(description, model=MPRAGESimulator.model, record=record, states=1)
        # 12 playings of 1440 ms from equilibrium: each contracts the start by at most eff e^{-1440/2000}
        # cos(8 deg)^100 < 0.2, 0.2^12 < 1e-8; float32 kernels over 12 x 102 events: 1e-5 of the largest.
        got = train.simulate(T1=T1, inv_efficiency=0.9, M0=1.1, repetitions=12)
        assert got.shape == (3, 1)
        assert rel(got[:, 0] * 1j, closed) < 1e-5, record  # from_description: the raw -i sin(a) Mz
    # The simulator itself, with its post-rotation (+i): record="echo" is its class default "acquired".
    default = sim.simulate(T1=T1, inv_efficiency=0.9, M0=1.1, repetitions=12)
    echo = sim.simulate(T1=T1, inv_efficiency=0.9, M0=1.1, repetitions=12, record="echo")
    assert echo.shape == (3,) and torch.equal(echo, default) and rel(echo, closed) < 1e-5
