"""RF shapes, RF definitions and shims (API.md section 6.3)."""

import cmath
import math

import numpy as np
import pytest
import torch

from blochsim.sequence import (
    RfDefinition,
    RfMode,
    RfShape,
    ShimDefinition,
    decompress_shape,
    ideal_rf_definition,
    rf_definition,
)

# Normalized envelopes are stored as float32 shapes (API.md 6.3): each sample carries a relative
# round-off of at most 2**-24 ~ 6e-8, so integrals of same-sign envelopes are good to ~1e-7.
FLOAT32_RTOL = 1e-6
HALF_TURN_S = 1 / (2 * math.pi)


# -- shapes -----------------------------------------------------------------------------------
# The example of the Pulseq specification: a trapezoid-like shape, its derivative, and the
# run-length code in which a value written twice is followed by the count of further repeats.
PULSEQ_DECODED = [0.0, 0.1, 0.25, 0.5, 1, 1, 1, 1, 1, 1, 1, 1, 0.75, 0.5, 0.25, 0.0, 0.0]
PULSEQ_PACKED = [0.0, 0.1, 0.15, 0.25, 0.5, 0.0, 0.0, 5, -0.25, -0.25, 2, 0.0]


def test_decompress_pulseq_example():
    decoded = decompress_shape(PULSEQ_PACKED, 17)
    assert decoded.dtype == np.float32
    np.testing.assert_allclose(decoded, PULSEQ_DECODED, atol=1e-7)  # float32 storage of a float64 cumsum
    np.testing.assert_allclose(RfShape(17, PULSEQ_PACKED).decompress(scale=2.0), 2 * np.array(PULSEQ_DECODED),
                               atol=2e-7)


def test_decoded_shapes_pass_through():
    np.testing.assert_array_equal(decompress_shape([0.0, 0.0, 3.0], 3), np.array([0, 0, 3], np.float32))


@pytest.mark.parametrize(
    ("packed", "n", "message"),
    [
        ([1.0, 1.0], 5, "truncated"),  # a repeat without its count
        ([1.0, 1.0, 0.5], 5, "invalid repeat count"),
        ([1.0, 1.0, -1.0], 5, "invalid repeat count"),
        ([1.0, 1.0, 9.0, 2.0], 5, "more than"),
        ([1.0, 2.0, 3.0, 4.0], 6, "truncated"),
    ],
)
def test_decompress_rejects_bad_encodings(packed, n, message):
    with pytest.raises(ValueError, match=message):
        decompress_shape(packed, n)


# -- rf_definition ----------------------------------------------------------------------------
def test_rf_definition_normalizes_to_a_half_turn_integral_and_keeps_the_phase():
    envelope = np.hanning(64) * np.exp(0.3j)
    definition = rf_definition(envelope, dwell_s=1e-5, bandwidth_hz=2000.0, definition_id=4)
    area = definition.integral()
    assert abs(area) == pytest.approx(HALF_TURN_S, rel=FLOAT32_RTOL)
    assert cmath.phase(area) == pytest.approx(0.3, abs=1e-6)  # phase stored in float32 cycles
    assert definition.id == 4 and definition.rf_mode() == RfMode.PROFILED
    assert definition.num_bands == 1 and definition.band_bandwidth_hz == 2000.0
    flip, phase = definition.flip_angle(0.5)
    assert flip == pytest.approx(0.5, rel=FLOAT32_RTOL) and phase == pytest.approx(0.3, abs=1e-6)


def test_dwell_other_than_the_raster_places_samples_with_a_time_shape():
    definition = rf_definition(np.ones(10), dwell_s=4e-6)
    assert definition.time is not None
    np.testing.assert_allclose(definition.sample_durations(), np.full(10, 4e-6), rtol=1e-6)
    assert rf_definition(np.ones(10), dwell_s=1e-6).time is None


def test_rectangular_pulse_saturation():
    # A rectangle of length T: int |w|^2 dt / |int w dt|^2 = 1/T, so S = -pi/T.
    length_s = 2e-3
    definition = rf_definition(np.ones(200), dwell_s=length_s / 200)
    assert definition.saturation() == pytest.approx(-math.pi / length_s, rel=FLOAT32_RTOL)
    assert definition.rf_mode() == RfMode.INSTANT  # constant, no bandwidth
    assert definition.total_b1sq_power == pytest.approx(length_s * (HALF_TURN_S / length_s) ** 2, rel=1e-12)


def test_multichannel_definition_is_dynamic_and_normalizes_the_sum():
    envelopes = np.stack([np.ones(20), 1j * np.ones(20)])
    definition = rf_definition(envelopes, dwell_s=1e-6)
    assert definition.channel_count == 2 and definition.rf_mode() == RfMode.DYNAMIC
    assert definition.complex_envelope().shape == (2, 20) and definition.combined_envelope().shape == (20,)
    assert abs(definition.integral()) == pytest.approx(HALF_TURN_S, rel=FLOAT32_RTOL)
    assert cmath.phase(definition.integral()) == pytest.approx(math.pi / 4, abs=1e-6)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"waveform": []}, "waveform"),
        ({"waveform": np.ones((1, 2, 3))}, "waveform"),
        ({"dwell_s": 0.0}, "dwell_s"),
        ({"dwell_s": -1e-6}, "dwell_s"),
        ({"rf_raster_time_s": 0.0}, "rf_raster_time_s"),
        ({"band_frequency_offsets_hz": []}, "1 to 8 bands"),
        ({"band_frequency_offsets_hz": np.zeros(9)}, "1 to 8 bands"),
        ({"waveform": [1.0, -1.0]}, "zero area"),
        ({"waveform": [1.0]}, "zero area"),  # a single sample spans no time
    ],
)
def test_rf_definition_validation(kwargs, message):
    arguments = {"waveform": np.ones(4), "dwell_s": 1e-6, **kwargs}
    with pytest.raises(ValueError, match=message):
        rf_definition(arguments.pop("waveform"), **arguments)


# -- the ideal pulse --------------------------------------------------------------------------
def test_ideal_definition():
    ideal = ideal_rf_definition(definition_id=2)
    assert ideal.id == 2 and ideal.bandwidth_hz == 0.0
    assert ideal.integral() == HALF_TURN_S  # exact, at any raster
    assert ideal.integral(rf_raster_time_s=1e-5) == HALF_TURN_S
    assert ideal.saturation() == -2 * math.pi**2  # exact: -pi * (x / x) / x with x = 1/(2*pi)
    assert ideal.rf_mode() == RfMode.INSTANT
    assert ideal.flip_angle(0.7) == (pytest.approx(0.7, rel=1e-15), 0.0)
    assert ideal.signed_flip(-0.7) == (-0.7, 0.0)


def test_single_sample_without_a_span_has_no_integral():
    definition = RfDefinition(0, 0.0, 1, (0.0,), 0.0, 0.0, RfShape(1, [1.0]))
    assert definition.integral() == 0 and definition.saturation() == 0.0
    assert definition.flip_angle(1.0) == (0.0, 0.0)


def test_flip_angle_and_signed_flip_are_differentiable():
    definition = rf_definition(np.ones(8) * np.exp(0.5j), dwell_s=1e-6)
    amplitude = torch.tensor([0.4, -0.2], requires_grad=True)
    flip, phase = definition.flip_angle(amplitude)
    scale = 2 * math.pi * abs(definition.integral())  # ~1: the definition is normalized
    torch.testing.assert_close(flip, torch.tensor([0.4, 0.2]) * scale)
    torch.testing.assert_close(phase, torch.tensor([0.5, 0.5 - math.pi]), atol=1e-6, rtol=0)
    (grad,) = torch.autograd.grad(flip.sum(), amplitude)
    torch.testing.assert_close(grad, torch.tensor([1.0, -1.0]) * scale)
    alpha, extra = definition.signed_flip(amplitude)
    torch.testing.assert_close(alpha, amplitude.detach() * scale)
    assert extra == pytest.approx(0.5, abs=1e-6)
    (grad,) = torch.autograd.grad(alpha.sum(), amplitude)
    torch.testing.assert_close(grad, torch.full((2,), scale))


# -- RfDefinition fields ----------------------------------------------------------------------
def test_time_shape_sample_durations_and_gradient():
    definition = RfDefinition(1, 1000.0, 1, (0.0,), 1000.0, 0.0, RfShape(4, [1, 2, 2, 1]),
                              time=RfShape(4, [1, 2, 4, 8]), gradient=RfShape(4, [1, 1, 0.5, 0.5]))
    # Each sample spans the distance between its neighbours' midpoints; the ends mirror their neighbour.
    np.testing.assert_allclose(definition.sample_durations(rf_raster_time_s=1e-6), [1e-6, 1.5e-6, 3e-6, 4e-6])
    np.testing.assert_allclose(definition.gradient_waveform(), [1, 1, 0.5, 0.5])
    constant = RfDefinition(1, 0.0, 1, (0.0,), 0.0, 0.0, RfShape(2, [1, 2]), gradient=RfShape(2, [3, 3]))
    assert constant.gradient_waveform() is None
    np.testing.assert_allclose(constant.sample_durations(rf_raster_time_s=2e-6), [2e-6, 2e-6])


def test_mismatched_channel_lengths_raise():
    definition = RfDefinition(0, 0.0, 1, (0.0,), 0.0, 0.0, (RfShape(2, [1, 1]), RfShape(3, [1, 1, 1])))
    with pytest.raises(ValueError, match="must match"):
        definition.channel_envelopes()
    with pytest.raises(ValueError, match="num_bands"):
        RfDefinition(0, 0.0, 9, (0.0,) * 9, 0.0, 0.0, RfShape(1, [1.0]))


def test_phase_shapes_are_in_cycles():
    definition = RfDefinition(0, 0.0, 1, (0.0,), 0.0, 0.0, RfShape(2, [1, 2]), phase=RfShape(2, [0.25, 0.5]))
    np.testing.assert_allclose(definition.complex_envelope(), [1j, -2], atol=1e-15)


# -- shims ------------------------------------------------------------------------------------
def test_shim_weights():
    shim = ShimDefinition(1, [1.0, 0.5], [0.0, math.pi / 2])
    assert shim.channel_count == 2
    torch.testing.assert_close(shim.weights(), torch.tensor([1.0, 0.5j], dtype=torch.complex128))
    magnitudes = torch.tensor([1.0, 2.0], requires_grad=True)
    weights = ShimDefinition(2, magnitudes, [0.0, 0.0]).weights()
    (grad,) = torch.autograd.grad(weights.real.sum(), magnitudes)
    torch.testing.assert_close(grad, torch.ones(2))


@pytest.mark.parametrize(
    ("magnitudes", "phases", "message"),
    [([1.0], [0.0, 1.0], "must match"), ([-1.0], [0.0], "magnitudes"), ([], [], "magnitudes"),
     ([1.0], [math.nan], "phases_rad")],
)
def test_shim_validation(magnitudes, phases, message):
    with pytest.raises(ValueError, match=message):
        ShimDefinition(1, magnitudes, phases)
