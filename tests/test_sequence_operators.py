"""Operators, composition and the registry (API.md sections 3.1-3.2)."""

import math

import numpy as np
import pytest
import torch

import blochsim.sequence.operators as operators_module
from blochsim.sequence import (
    AdcRole,
    Delay,
    Dephase,
    EventAction,
    EventType,
    Excitation,
    FSEReadout,
    Inversion,
    Operator,
    Readout,
    Refocusing,
    RfUse,
    SampledPulse,
    Saturation,
    SequenceEvent,
    SPGRReadout,
    Spoil,
    SSFPEchoReadout,
    SSFPFidReadout,
    bSSFPReadout,
    compose,
    module,
    operator,
    operator_names,
    register_operator,
)

SHIPPED = (
    "excitation", "refocusing", "inversion", "saturation", "sampled-pulse", "readout", "delay", "dephase", "spoil",
    "bssfp-readout", "ssfp-fid-readout", "ssfp-echo-readout", "spgr-readout", "fse-readout",
)
CRUSHED = EventAction.CRUSH_BEFORE | EventAction.CRUSH_AFTER


def events_of(op, start_s=0.0):
    return compose(op, start_s=start_s)[0]


def kinds(events):
    return [(e.type, e.action) for e in events]


# -- composition ------------------------------------------------------------------------------
def test_matmul_adds_durations_and_shifts_the_second_operator():
    op = Excitation(0.5, duration_s=1e-3) @ Delay(4e-3) @ Readout()
    assert op.duration_s == pytest.approx(5e-3, abs=1e-15)  # float64 sum of two decimals
    events = op.emit(2e-3)
    assert [e.timestamp_us for e in events] == pytest.approx([2000.0, 3000.0, 7000.0], abs=1e-9)
    assert [e.type for e in events] == [EventType.RF, EventType.WAIT, EventType.ADC]


def test_long_chains_do_not_nest():
    op = Delay(1e-3)
    for _ in range(3000):  # deeper than Python's default recursion limit if each @ nested a call
        op = op @ Delay(1e-3)
    events, end_s = compose(op)
    assert len(events) == 3001
    assert end_s == pytest.approx(3.001, rel=1e-12)


def test_compose_back_to_back_and_offset_pairs():
    events, end_s = compose(Excitation(0.1), Delay(2e-3), (10e-3, Readout()), Delay(1e-3), Readout(), start_s=1e-3)
    times = [(e.type, e.timestamp_us) for e in events]
    assert times == [
        (EventType.RF, pytest.approx(1000.0)),
        (EventType.WAIT, pytest.approx(1000.0)),
        (EventType.ADC, pytest.approx(11000.0)),  # the pair sits at start_s + offset_s
        (EventType.WAIT, pytest.approx(11000.0)),  # the parts after a pair follow it
        (EventType.ADC, pytest.approx(12000.0)),
    ]
    assert end_s == pytest.approx(12e-3)


def test_compose_sorts_stably_and_ends_at_the_latest_part():
    events, end_s = compose((5e-3, Readout(1.0)), (0.0, Excitation(0.2) @ Delay(8e-3)), (5e-3, Readout(2.0)))
    assert [e.type for e in events] == [EventType.RF, EventType.WAIT, EventType.ADC, EventType.ADC]
    assert [e.adc_phase_rad for e in events[2:]] == [1.0, 2.0]  # equal times keep their play order
    assert end_s == pytest.approx(8e-3)
    assert compose() == ((), 0.0)


def test_module_places_parts_relative_to_its_start_and_keeps_its_duration():
    block = module(Excitation(0.3), (2e-3, Readout()), duration_s=5e-3)
    assert block.duration_s == 5e-3
    events, end_s = compose(Delay(1e-3), block, Readout())
    assert [e.timestamp_us for e in events] == pytest.approx([0.0, 1000.0, 3000.0, 6000.0])
    assert end_s == pytest.approx(6e-3)


def test_compose_rejects_what_is_not_an_operator():
    with pytest.raises(TypeError, match=r"parts\[1\]"):
        compose(Delay(1.0), 3.0)
    with pytest.raises(ValueError, match="offset_s"):
        compose((-1.0, Delay(1.0)))
    with pytest.raises(TypeError, match="emitted"):
        compose(Operator(lambda start_s: ("not an event",)))


# -- the 14 operators -------------------------------------------------------------------------
def test_excitation_event():
    (event,) = events_of(Excitation(0.5, 0.25, duration_s=2e-3, definition_id=3, frequency_hz=100.0, shim_id=2,
                                    action=EventAction.SPOIL_AFTER), start_s=1e-3)
    assert event.type == EventType.RF and event.timestamp_us == pytest.approx(1000.0)
    assert event.params == (3, RfUse.EXCITATION, 0.5, 0.25, 100.0, 2, 0.0)
    assert event.action == EventAction.SPOIL_AFTER
    assert Excitation(0.5, duration_s=2e-3).duration_s == 2e-3


def test_refocusing_crushed_and_uncrushed():
    (crushed,) = events_of(Refocusing(math.pi, 0.1))
    assert crushed.rf_use == RfUse.REFOCUSING and crushed.action == CRUSHED
    assert crushed.rf_amplitude_hz == math.pi and crushed.rf_phase_rad == 0.1
    (plain,) = events_of(Refocusing(math.pi, crushed=False))
    assert plain.action == EventAction.NONE


def test_inversion_and_saturation_events():
    (inversion,) = events_of(Inversion(duration_s=1e-2))
    assert inversion.rf_use == RfUse.INVERSION and inversion.rf_amplitude_hz == math.pi
    assert Inversion(duration_s=1e-2).duration_s == 1e-2
    (saturation,) = events_of(Saturation(2, 9.0, offset_hz=1500.0, phase_rad=0.5, duration_s=0.1, shim_id=1))
    assert saturation.params == (2, RfUse.EXCITATION, 9.0, 0.5, 1500.0, 1, 0.0)


def test_readout_and_delay_events():
    (adc,) = events_of(Readout(0.3, role=AdcRole.NON_CENTER, is_echo=False, action=EventAction.CRUSH_AFTER))
    assert adc.type == EventType.ADC and adc.params == (AdcRole.NON_CENTER, 0.3, False)
    assert adc.action == EventAction.CRUSH_AFTER
    delay = Delay(3e-3, action=EventAction.SHIFT_AFTER)
    assert delay.duration_s == 3e-3
    assert kinds(events_of(delay)) == [(EventType.WAIT, EventAction.SHIFT_AFTER)]
    assert Dephase().duration_s == 0 and kinds(events_of(Dephase())) == [(EventType.WAIT, EventAction.CRUSH_AFTER)]
    assert Spoil().duration_s == 0 and kinds(events_of(Spoil())) == [(EventType.WAIT, EventAction.SPOIL_AFTER)]


@pytest.mark.parametrize(
    ("factory", "expected"),
    [
        (bSSFPReadout, [(EventType.ADC, EventAction.NONE), (EventType.WAIT, EventAction.NONE)]),
        (SSFPFidReadout, [(EventType.ADC, EventAction.NONE), (EventType.WAIT, EventAction.CRUSH_AFTER),
                          (EventType.WAIT, EventAction.NONE)]),
        (SSFPEchoReadout, [(EventType.WAIT, EventAction.CRUSH_AFTER), (EventType.ADC, EventAction.NONE),
                           (EventType.WAIT, EventAction.NONE)]),
        (SPGRReadout, [(EventType.ADC, EventAction.NONE), (EventType.WAIT, EventAction.SPOIL_AFTER),
                       (EventType.WAIT, EventAction.NONE)]),
        (FSEReadout, [(EventType.ADC, EventAction.NONE), (EventType.WAIT, EventAction.NONE)]),
    ],
)
def test_readout_modules(factory, expected):
    op = factory(0.7, duration_s=5e-3)
    events = events_of(op)
    assert op.duration_s == 5e-3
    assert kinds(events) == expected
    assert all(e.timestamp_us == 0.0 for e in events)  # every event sits at the module start
    (adc,) = [e for e in events if e.type == EventType.ADC]
    assert adc.adc_phase_rad == 0.7
    assert adc.adc_role == (AdcRole.ECHO_CENTER if factory is FSEReadout else AdcRole.SINGLE)


def test_zero_length_delay_keeps_the_structure():
    # The structure depends on structural arguments only: a value of 0 still emits its WAIT.
    assert len(events_of(SPGRReadout(duration_s=0.0))) == len(events_of(SPGRReadout(duration_s=1.0))) == 3


def test_sampled_pulse_events():
    dwell_s, offset_hz = 1e-3, 50.0
    waveform = np.array([1.0, -2.0, 3j])
    op = SampledPulse(waveform, dwell_s, phase_rad=0.25, offset_hz=offset_hz)
    assert op.duration_s == pytest.approx(3e-3)
    events = events_of(op, start_s=1e-3)
    assert [e.timestamp_us for e in events] == pytest.approx([1500.0, 2500.0, 3500.0])  # sample midpoints
    t_s = (np.arange(3) + 0.5) * dwell_s  # from the module start
    expected_phase = 0.25 + np.angle(waveform) - 2 * np.pi * offset_hz * t_s
    for event, w, phase in zip(events, waveform, expected_phase, strict=True):
        assert event.rf_use == RfUse.EXCITATION
        assert event.rf_amplitude_hz == pytest.approx(abs(w) * dwell_s, rel=1e-15)
        assert event.rf_phase_rad == pytest.approx(phase, rel=1e-15)
        assert event.rf_frequency_hz == offset_hz
        assert isinstance(event.rf_phase_rad, float)  # numbers in, numbers out


def test_sampled_pulse_train_axis():
    op = SampledPulse([1.0, 1.0], 1e-3, phase_rad=[0.0, 1.0, 2.0], offset_hz=[0.0, 10.0, 20.0])
    events = events_of(op)
    for k, event in enumerate(events):
        t_s = (k + 0.5) * 1e-3
        expected = torch.tensor([0.0, 1.0, 2.0], dtype=torch.float64) - 2 * math.pi * torch.tensor(
            [0.0, 10.0, 20.0], dtype=torch.float64) * t_s
        assert event.rf_phase_rad.shape == (3,)  # one phase per train
        # float64 both sides, same operations up to order: a few ulps of rounding
        torch.testing.assert_close(event.rf_phase_rad, expected, rtol=1e-14, atol=1e-14)
        torch.testing.assert_close(event.rf_frequency_hz, torch.tensor([0.0, 10.0, 20.0], dtype=torch.float64))
    single = events_of(SampledPulse([1.0], 1e-3, phase_rad=[0.5]))[0]
    assert single.rf_phase_rad == 0.5  # a one-entry array adds no train axis


def test_sampled_pulse_validation():
    with pytest.raises(ValueError, match="waveform_rad_per_s"):
        SampledPulse([], 1e-3)
    with pytest.raises(ValueError, match="waveform_rad_per_s"):
        SampledPulse(np.ones((2, 2)), 1e-3)
    with pytest.raises(ValueError, match="dwell_s"):
        SampledPulse([1.0], 0.0)
    with pytest.raises(ValueError, match="definition_id"):
        SampledPulse([1.0], 1e-3, offset_hz=[0.0, 100.0], definition_id=1)
    with pytest.raises(ValueError, match="train counts"):
        SampledPulse([1.0], 1e-3, phase_rad=[0.0, 1.0], offset_hz=[0.0, 1.0, 2.0])
    SampledPulse([1.0], 1e-3, offset_hz=100.0, definition_id=1)  # one offset is fine with a shaped definition


# -- validation -------------------------------------------------------------------------------
@pytest.mark.parametrize("bad", [-1e-3, math.nan, math.inf])
def test_durations_must_be_finite_and_nonnegative(bad):
    with pytest.raises(ValueError, match="duration_s"):
        Delay(bad)
    with pytest.raises(ValueError, match="duration_s"):
        Excitation(0.1, duration_s=bad)
    with pytest.raises(ValueError, match="duration_s"):
        SPGRReadout(duration_s=bad)


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_angles_must_be_finite(bad):
    with pytest.raises(ValueError, match="flip_rad"):
        Excitation(bad)
    with pytest.raises(ValueError, match="phase_rad"):
        Refocusing(1.0, bad)
    with pytest.raises(ValueError, match="phase_rad"):
        Readout(bad)
    with pytest.raises(ValueError, match="flip_rad"):
        Excitation(torch.tensor([0.1, bad]))
    with pytest.raises(ValueError, match="offset_hz"):
        Saturation(1, 1.0, offset_hz=bad)


def test_unknown_action_bits_and_bad_ids():
    with pytest.raises(ValueError, match="action"):
        Delay(1.0, action=4)  # INVERSION is set by packing, not by users
    with pytest.raises(ValueError, match="action"):
        Excitation(0.1, action=256)
    with pytest.raises(ValueError, match="definition_id"):
        Excitation(0.1, definition_id=-1)
    with pytest.raises(ValueError, match="shim_id"):
        Excitation(0.1, shim_id=1.5)


# -- differentiability ------------------------------------------------------------------------
def test_flip_phase_and_duration_stay_differentiable():
    flip = torch.tensor(0.3, requires_grad=True)
    phase = torch.tensor(0.2, requires_grad=True)
    tr_s = torch.tensor(0.01, dtype=torch.float64, requires_grad=True)
    events, end_s = compose(Excitation(flip, phase) @ SSFPFidReadout(phase, duration_s=tr_s), Excitation(2 * flip))
    assert events[0].rf_amplitude_hz is flip  # the tensor object itself is kept
    (d_flip,) = torch.autograd.grad(events[-1].rf_amplitude_hz, flip)
    assert d_flip.item() == 2.0
    (d_phase,) = torch.autograd.grad(events[1].adc_phase_rad * 3, phase)
    assert d_phase.item() == 3.0
    # The durations reach the later timestamps (us) and the end (s), in float64.
    assert events[-1].timestamp_us.dtype == torch.float64
    (d_time,) = torch.autograd.grad(events[-1].timestamp_us, tr_s)
    assert d_time.item() == 1e6
    (d_end,) = torch.autograd.grad(end_s, tr_s)
    assert d_end.item() == 1.0
    assert isinstance(events[0].timestamp_us, float)  # before any tensor duration: a float


def test_sampled_pulse_is_differentiable():
    waveform = torch.tensor([1.0, -2.0], requires_grad=True)
    phase = torch.tensor(0.1, requires_grad=True)
    events = events_of(SampledPulse(waveform, 1e-3, phase_rad=phase))
    (d_w,) = torch.autograd.grad(events[1].rf_amplitude_hz, waveform)
    torch.testing.assert_close(d_w, torch.tensor([0.0, -1e-3]))  # d|w|/dw = sign(w), times dwell
    (d_phase,) = torch.autograd.grad(events[0].rf_phase_rad, phase)
    assert d_phase.item() == 1.0


# -- registry ---------------------------------------------------------------------------------
@pytest.fixture
def registry(monkeypatch):
    """A private copy of the registry, so a test's registrations do not leak."""
    monkeypatch.setattr(operators_module, "_REGISTRY", dict(operators_module._REGISTRY))


def test_shipped_names_in_order():
    assert operator_names()[:14] == SHIPPED
    assert operator("excitation") is Excitation
    assert operator("SSFP_Fid_Readout") is SSFPFidReadout  # case-insensitive, _ reads as -
    assert operator("bSSFP-readout") is bSSFPReadout


def test_register_lookup_and_duplicates(registry):
    def echo_pair(**kwargs):
        return Readout() @ Readout()

    register_operator("My_Echo_Pair", echo_pair)
    assert operator("my-echo-pair") is echo_pair
    assert operator_names()[-1] == "my-echo-pair"
    with pytest.raises(ValueError, match="already registered"):
        register_operator("MY-ECHO_PAIR", echo_pair)
    with pytest.raises(ValueError, match="already registered"):
        register_operator("Spoil", echo_pair)
    with pytest.raises(TypeError, match="callable"):
        register_operator("not-callable", 3)


def test_unknown_name_suggests_the_nearest():
    with pytest.raises(ValueError, match="did you mean 'excitation'"):
        operator("excitaton")


def test_events_are_sequence_events():
    for name in ("dephase", "spoil"):
        assert all(isinstance(e, SequenceEvent) for e in events_of(operator(name)()))


def test_a_rewrapped_chain_keeps_its_own_duration():
    chain = Delay(1e-3) @ Readout()
    stretched = Operator(chain.emit, 5e-3)
    events, end_s = compose(stretched @ Readout())
    assert [e.timestamp_us for e in events] == pytest.approx([0.0, 1000.0, 5000.0])
    assert end_s == pytest.approx(5e-3)
