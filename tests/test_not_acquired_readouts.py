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
from _closed_forms import mp2rage_signal_equation, mprage_steady_centre_mz
from conftest import rel_max_err

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
from blochsim.simulators.mp2rage import MP2RAGESimulator
from blochsim.simulators.mprage import MPRAGESimulator

DEG = math.pi / 180
T1 = torch.tensor([800.0, 1400.0, 2000.0])


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
    closed = 1.2 * mp2rage_signal_equation((700.0, 2500.0), (4.0, 5.0), 7.0, 5000.0, 60, 100, T1, 0.96)
    for record in ("echo", "acquired"):
        for train in (Simulator.from_description(description, model=MP2RAGESimulator.model, record=record,
                                                 states=1),
                      MP2RAGESimulator.from_description(description, record=record)):
            # 8 playings from equilibrium: each TRmp2rage contracts the start by at most eff e^{-5000/2000} < 0.08,
            # 0.08^8 < 1e-8; float32 kernels over 8 x 321 events: 1e-5 of the largest sample.
            got = train.simulate(T1=T1, inv_efficiency=0.96, M0=1.2, repetitions=8)
            assert got.shape == (3, 2)
            assert rel_max_err(got * 1j, closed) < 1e-5, record  # from_description: the raw -i sin(a) Mz


def test_mprage_train_gives_the_centre_shot_under_both_records():
    sim = MPRAGESimulator(TI=900.0, flip=8.0, TRspgr=9.0, nshots=(40, 60))
    description = sim.describe()
    mz = mprage_steady_centre_mz(T1, 8.0, 9.0, 900.0 - 40 * 9.0, 40, 60, 0.9)
    closed = 1.1 * math.sin(8.0 * DEG) * mz
    for record in ("echo", "acquired"):
        train = Simulator.from_description(description, model=MPRAGESimulator.model, record=record, states=1)
        # 12 playings of 1440 ms from equilibrium: each contracts the start by at most eff e^{-1440/2000}
        # cos(8 deg)^100 < 0.2, 0.2^12 < 1e-8; float32 kernels over 12 x 102 events: 1e-5 of the largest.
        got = train.simulate(T1=T1, inv_efficiency=0.9, M0=1.1, repetitions=12)
        assert got.shape == (3, 1)
        assert rel_max_err(got[:, 0] * 1j, closed) < 1e-5, record  # from_description: the raw -i sin(a) Mz
    # The simulator itself, with its post-rotation (+i): record="echo" is its class default "acquired".
    default = sim.simulate(T1=T1, inv_efficiency=0.9, M0=1.1, repetitions=12)
    echo = sim.simulate(T1=T1, inv_efficiency=0.9, M0=1.1, repetitions=12, record="echo")
    assert echo.shape == (3,) and torch.equal(echo, default) and rel_max_err(echo, closed) < 1e-5
