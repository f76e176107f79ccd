"""`SequenceDescription.from_operators`, `plot`, and the builders (API.md section 6.4)."""

import math

import numpy as np
import pytest
import torch

from blochsim.sequence import (
    AdcRole,
    Delay,
    EventAction,
    EventType,
    Excitation,
    Readout,
    RfMode,
    RfUse,
    SequenceDescription,
    SSFPFidReadout,
    fse_description,
    mpnrage_description,
    mprage_description,
    mrf_description,
    rf_definition,
    spgr_description,
)
from blochsim.sequence.events import as_float


def types(description):
    return [e.type for e in description.events]


def times_us(description):
    return [as_float(e.timestamp_us) for e in description.events]


# -- from_operators ---------------------------------------------------------------------------
def test_from_operators_timestamps_and_repetition_length():
    description = SequenceDescription.from_operators(
        Excitation(0.5) @ SSFPFidReadout(duration_s=5e-3), Excitation(0.5) @ SSFPFidReadout(duration_s=5e-3),
        crusher_dephasing_rad=2 * math.pi, voxel_size_m=1e-3, subsequence_index=2,
    )
    assert times_us(description) == pytest.approx([0, 0, 0, 0, 5000, 5000, 5000, 5000])
    assert description.tr_duration_us == pytest.approx(10000.0)
    assert description.subsequence_index == 2 and description.voxel_size_m == 1e-3
    assert list(description.rf_definitions) == [0]
    assert description.rf_definitions[0].rf_mode() == RfMode.INSTANT  # the ideal pulse by default
    assert len(description.adc_events) == 2


def test_from_operators_start_offset_and_pairs():
    description = SequenceDescription.from_operators(Excitation(0.1), (3e-3, Readout()), start_s=1e-3)
    assert times_us(description) == pytest.approx([1000.0, 4000.0])
    assert description.tr_duration_us == pytest.approx(4000.0)


def test_from_operators_keeps_given_definitions_beside_the_ideal_pulse():
    shaped = rf_definition(np.hanning(32), dwell_s=1e-5, definition_id=1)
    description = SequenceDescription.from_operators(Excitation(0.2, definition_id=1), Excitation(0.1),
                                                     rf_definitions={1: shaped})
    assert description.rf_definitions[1] is shaped and 0 in description.rf_definitions
    with pytest.raises(ValueError, match="RF definition 2"):
        SequenceDescription.from_operators(Excitation(0.2, definition_id=2))


def test_tensor_durations_give_tensor_timestamps_that_validate():
    tr_s = torch.tensor(4e-3, dtype=torch.float64, requires_grad=True)
    description = SequenceDescription.from_operators(
        Excitation(0.3) @ SSFPFidReadout(duration_s=tr_s), Excitation(0.3) @ SSFPFidReadout(duration_s=tr_s))
    assert isinstance(description.tr_duration_us, torch.Tensor)
    assert as_float(description.tr_duration_us) == pytest.approx(8000.0)
    (grad,) = torch.autograd.grad(description.tr_duration_us, tr_s)
    assert grad.item() == 2e6  # two TRs, in us per s
    # Time order is checked on tensor timestamps too.
    late = description.events[4]
    with pytest.raises(ValueError, match="time order"):
        SequenceDescription(0, 1e5, (late,) + description.events[:4], description.rf_definitions)


# -- plot -------------------------------------------------------------------------------------
def test_plot():
    pytest.importorskip("matplotlib")
    import matplotlib

    matplotlib.use("Agg")
    description = mrf_description([0.1, 0.2, 0.3], 5e-3)
    axis = description.plot(upto_s=8e-3)
    assert axis.get_xlabel() == "time (ms)"


def test_plot_without_matplotlib_says_so(monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_matplotlib(name, *args, **kwargs):
        if name.startswith("matplotlib"):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    with pytest.raises(ImportError, match="pip install matplotlib"):
        mrf_description([0.1], 5e-3).plot()


# -- builders ---------------------------------------------------------------------------------
def test_mrf_description():
    flips = torch.tensor([0.1, 0.2, 0.3, 0.4], requires_grad=True)
    description = mrf_description(flips, 10e-3, inversion_time_s=20e-3, phases_rad=[0.0, 1.0, 0.0, 1.0])
    # inversion + delay, then per TR: RF, ADC, dephase, delay
    assert len(description.events) == 2 + 4 * 4
    assert description.events[0].rf_use == RfUse.INVERSION
    rf = [e for e in description.events if e.type == EventType.RF and e.rf_use == RfUse.EXCITATION]
    assert [e.timestamp_us for e in rf] == pytest.approx([20000, 30000, 40000, 50000])
    assert [e.adc_phase_rad for e in description.adc_events] == [0.0, 1.0, 0.0, 1.0]  # demodulated by the pulse
    assert description.tr_duration_us == pytest.approx(60000.0)
    (grad,) = torch.autograd.grad(rf[2].rf_amplitude_hz, flips)
    torch.testing.assert_close(grad, torch.tensor([0.0, 0.0, 1.0, 0.0]))
    assert len(mrf_description([0.1, 0.2], [5e-3, 6e-3], inversion=False).events) == 2 * 4
    with pytest.raises(ValueError, match="repetition_time_s"):
        mrf_description([0.1, 0.2], [5e-3, 6e-3, 7e-3])


def test_fse_description():
    description = fse_description([math.pi] * 3, 10e-3, repetition_time_s=100e-3)
    # excitation, then per echo: delay, refocusing, delay, ADC + its zero delay; then the TR fill
    assert len(description.events) == 1 + 3 * 5 + 1
    excitation = description.events[0]
    assert excitation.rf_amplitude_hz == math.pi / 2 and excitation.rf_phase_rad == math.pi / 2
    refocusing = [e for e in description.events if e.type == EventType.RF][1:]
    assert [e.timestamp_us for e in refocusing] == pytest.approx([5000, 15000, 25000])
    assert all(e.action == EventAction.CRUSH_BEFORE | EventAction.CRUSH_AFTER for e in refocusing)
    assert [e.timestamp_us for e in description.adc_events] == pytest.approx([10000, 20000, 30000])
    assert all(e.adc_role == AdcRole.ECHO_CENTER for e in description.adc_events)
    assert description.tr_duration_us == pytest.approx(100000.0)
    assert fse_description([math.pi] * 3, 10e-3).tr_duration_us == pytest.approx(30000.0)  # ends at the last echo
    with pytest.raises(ValueError, match="repetition_time_s"):
        fse_description([math.pi] * 3, 10e-3, repetition_time_s=20e-3)


def test_fse_description_with_a_train_axis():
    flips = torch.tensor([[3.0, 2.0], [1.0, 0.5]])  # (trains, ETL)
    description = fse_description(flips, 10e-3, phases_rad=[0.0, 0.1])
    refocusing = [e for e in description.events if e.type == EventType.RF][1:]
    assert len(refocusing) == 2
    torch.testing.assert_close(refocusing[1].rf_amplitude_hz, torch.tensor([2.0, 0.5]))
    assert refocusing[1].rf_phase_rad == pytest.approx(0.1)


def test_spgr_description():
    description = spgr_description([0.2, 0.2, 0.2], 10e-3, 4e-3, phases_rad=[0.0, 0.5, 1.5])
    # per shot: RF, delay(TE), ADC, spoil, delay(TR - TE)
    assert len(description.events) == 3 * 5
    assert [e.timestamp_us for e in description.adc_events] == pytest.approx([4000, 14000, 24000])
    assert [e.adc_phase_rad for e in description.adc_events] == [0.0, 0.5, 1.5]
    assert description.tr_duration_us == pytest.approx(30000.0)
    assert len(spgr_description(0.2, 10e-3, 4e-3).adc_events) == 1
    with pytest.raises(ValueError, match="echo_time_s"):
        spgr_description(0.2, 10e-3, 11e-3)


def test_mpnrage_description():
    description = mpnrage_description(5, 0.1, 6e-3, inversion_time_s=10e-3)
    assert len(description.events) == 2 + 5 * 4  # inversion, delay; per shot RF, ADC, spoil, delay
    assert [e.timestamp_us for e in description.adc_events] == pytest.approx([10000, 16000, 22000, 28000, 34000])
    assert description.tr_duration_us == pytest.approx(40000.0)
    with pytest.raises(ValueError, match="nshots"):
        mpnrage_description(0, 0.1, 6e-3)
    with pytest.raises(ValueError, match="flip_rad"):
        mpnrage_description(3, [0.1, 0.2], 6e-3)


def test_mprage_description():
    description = mprage_description(3, 4, 0.15, 8e-3, 500e-3, crusher_dephasing_rad=2 * math.pi)
    assert len(description.events) == 2 + 7 * 4
    roles = [e.adc_role for e in description.adc_events]
    assert roles == [AdcRole.NON_ACQUIRED] * 3 + [AdcRole.SINGLE] + [AdcRole.NON_ACQUIRED] * 3
    centre = description.adc_events[3]
    assert centre.timestamp_us == pytest.approx(500000.0)  # inversion_time_s after the inversion
    assert description.crusher_dephasing_rad == 2 * math.pi
    with pytest.raises(ValueError, match="inversion_time_s"):
        mprage_description(3, 4, 0.15, 8e-3, 20e-3)


def test_builders_take_delays_as_tensors():
    te_s = torch.tensor(3e-3, dtype=torch.float64, requires_grad=True)
    description = spgr_description([0.2, 0.2], 10e-3, te_s)
    (grad,) = torch.autograd.grad(description.adc_events[1].timestamp_us, te_s)
    assert grad.item() == 1e6  # the second echo moves with TE; TR is fixed
    assert as_float(description.tr_duration_us) == pytest.approx(20000.0)
    assert len([e for e in description.events if e.type == EventType.WAIT]) == 6
    assert Delay(te_s).duration_s is te_s
