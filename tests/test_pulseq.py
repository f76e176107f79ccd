"""Pulseq files as descriptions: `read_pulseq_description`, `SequenceDescription.from_pulseq`, `Simulator.from_pulseq`.

The files are pypulseq's own example sequences (tests/data/pulseq, written by make_seq_files.py with
pypulseq 1.4.2 and 1.5): GRE, TSE, EPI, MPRAGE and a bSSFP. Three kinds of check:

* the reading against pypulseq's (the frozen `<name>.json`; re-made live when pypulseq is installed):
  block durations, pulse centres and uses, and where each readout comes closest to k = 0;
* the 1.4 file of each example against its 1.5 file: the same events;
* each simulation against an independent reference: the textbook closed form (Ernst for the spoiled GRE,
  T2 decay of a CPMG train, free precession for the EPI lines, Freeman-Hill for the bSSFP), or the
  float64 oracle on a description built by hand from the script's parameters (MPRAGE).

Malformed and hostile files are tests/test_pulseq_errors.py's.
"""

from __future__ import annotations

import io
import math
import time
import warnings

import numpy as np
import pytest
import torch
from _pulseq_files import FILES, TINY, TINY_EVENTS_US, long_gre, path, view
from conftest import rel_max_err, simulator_oracle

from blochsim import Simulator
from blochsim.model import BALANCED, REFOCUSED, SPOILED, SpinPhysics
from blochsim.sequence import (
    AdcRole,
    RfUse,
    SequenceDescription,
    SequenceEvent,
    ideal_rf_definition,
    read_pulseq_description,
)
from blochsim.sequence._pulseq import ECHO_ATOL_PER_M, ECHO_RTOL

F64 = {"dtype": torch.float64}  # the engine in float64: the closed forms are then met to the file's own precision
USES = {"excitation": RfUse.EXCITATION, "refocusing": RfUse.REFOCUSING, "inversion": RfUse.INVERSION,
        "saturation": RfUse.SATURATION, "preparation": RfUse.PREPARATION, "other": RfUse.OTHER,
        "undefined": RfUse.UNKNOWN}
#: Times from the file are whole us (block rasters, delays) and rf/adc centres to 9 digits: events are placed to
#: well within a nanosecond.
TIME_ATOL_US = 1e-3


def read(name: str, **settings) -> SequenceDescription:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # MPRAGE's labels: test_unread_extensions_are_named checks the warning
        return read_pulseq_description(path(name), **settings)


def events_of(description: SequenceDescription, kind: int) -> list:
    return [e for e in description.events if e.type == kind]


def window(name: str) -> tuple[int, int]:
    """(first block, TRSize) of the repetition read by default: the earliest that holds a readout."""
    seen = view(name)
    size = int(seen["definitions"]["TRSize"])
    first = min(r["block"] for r in seen["readouts"]) // size * size
    return first, size


# -- the reading against pypulseq's ---------------------------------------------------------------------
@pytest.mark.parametrize("name", FILES)
def test_pulses_and_durations_follow_pypulseq(name):
    """Each pulse plays at the centre pypulseq gives it (1.4: the middle of the peak plateau, as pypulseq
    works it out; 1.5: the file's), the repetition lasts its blocks, and the 1.5 uses are as written."""
    description, seen = read(name), view(name)
    first, size = window(name)
    start_s = sum(seen["durations_s"][:first])
    assert description.tr_duration_us == pytest.approx(sum(seen["durations_s"][first:first + size]) * 1e6,
                                                       abs=TIME_ATOL_US)
    expected = [p for p in seen["pulses"] if first <= p["block"] < first + size]
    pulses = events_of(description, 1)
    assert len(pulses) == len(expected) > 0
    for event, pulse in zip(pulses, expected, strict=True):
        assert event.timestamp_us == pytest.approx((pulse["centre_s"] - start_s) * 1e6, abs=TIME_ATOL_US)
        assert event.rf_phase_rad == pytest.approx(pulse["phase_rad"], abs=1e-12)
        if name.endswith("v15"):
            assert event.rf_use == USES[pulse["use"]]


@pytest.mark.parametrize("name", [f for f in FILES if f.endswith("v15")])
def test_readouts_follow_pypulseq_kspace(name):
    """Each readout sits where the axes it sweeps cross k = 0: within half a dwell of the sample pypulseq's
    k-space puts closest (pypulseq picks a sample, we interpolate between samples); `is_echo` marks the
    positions some repetition of which reaches the scan's least |k| (pypulseq's |k| off the swept axes).

    1.5 files only: pypulseq 1.5 reads a 1.4 file's pulses as of undefined use and resets k at every one,
    refocusing pulses included; test_v14_reads_as_v15 holds the 1.4 files to these."""
    description, seen = read(name), view(name)
    first, size = window(name)
    start_s = sum(seen["durations_s"][:first])
    readouts = events_of(description, 2)
    expected = [r for r in seen["readouts"] if first <= r["block"] < first + size]
    assert len(readouts) == len(expected) > 0
    for event, readout in zip(readouts, expected, strict=True):
        at_us = (readout["closest_s"] - start_s) * 1e6
        assert abs(event.timestamp_us - at_us) <= readout["dwell_s"] * 1e6 / 2 + TIME_ATOL_US
        assert event.adc_phase_rad == pytest.approx(readout["phase_rad"], abs=1e-12)
    k = np.array([r["k_unswept_per_m"] for r in seen["readouts"]])
    peak = max(r["k_per_m"] for r in seen["readouts"])
    central = {r["block"] % size for r, kk in zip(seen["readouts"], k, strict=True)
               if kk <= k.min() + ECHO_RTOL * peak + ECHO_ATOL_PER_M}
    assert [e.is_echo for e in readouts] == [r["block"] % size in central for r in expected]
    echoes = sum(e.is_echo for e in readouts)
    roles = {e.adc_role for e in readouts}
    if len(readouts) > 1 and echoes == 1:
        assert roles == {AdcRole.ECHO_CENTER, AdcRole.NON_CENTER}
    else:
        assert roles == {AdcRole.SINGLE}


@pytest.mark.parametrize("example", ["gre", "tse", "epi", "bssfp", "mprage"])
def test_v14_reads_as_v15(example):
    """The 1.4 and the 1.5 file of one example give the same description (a 1.4 pulse's use comes from the
    rule for 1.4 files; where the 1.5 file leaves it undefined, both go to the excitation slot)."""
    old, new = read(f"{example}_v14"), read(f"{example}_v15")
    assert old.tr_duration_us == pytest.approx(new.tr_duration_us, abs=TIME_ATOL_US)
    assert len(old.events) == len(new.events)
    for a, b in zip(old.events, new.events, strict=True):
        assert a.type == b.type
        assert a.timestamp_us == pytest.approx(b.timestamp_us, abs=TIME_ATOL_US)
        if a.type == 1:
            assert a.rf_amplitude_hz == pytest.approx(b.rf_amplitude_hz, rel=1e-9)
            assert (a.rf_phase_rad, a.rf_definition_id) == (b.rf_phase_rad, b.rf_definition_id)
            assert a.rf_use == b.rf_use or (a.rf_use, b.rf_use) == (RfUse.EXCITATION, RfUse.UNKNOWN)
            assert a.slice_select_gradient_hz_per_m == pytest.approx(b.slice_select_gradient_hz_per_m, rel=1e-9)
        if a.type == 2:
            assert (a.adc_role, a.is_echo) == (b.adc_role, b.is_echo)
            assert a.adc_phase_rad == pytest.approx(b.adc_phase_rad, abs=1e-12)
    for i, definition in new.rf_definitions.items():
        # the shapes are written to 9 significant digits in both files
        np.testing.assert_allclose(old.rf_definitions[i].combined_envelope(), definition.combined_envelope(),
                                   rtol=1e-6, atol=1e-6 * np.abs(definition.combined_envelope()).max())
        assert old.rf_definitions[i].bandwidth_hz == pytest.approx(definition.bandwidth_hz, rel=1e-6)


def test_pypulseq_reading_is_frozen_as_pypulseq_reads_today():
    """The frozen readings are pypulseq's: re-made from the files by the installed pypulseq (1.5)."""
    pp = pytest.importorskip("pypulseq")
    if not pp.__version__.startswith("1.5"):
        pytest.skip(f"the readings were made with pypulseq 1.5, this is {pp.__version__}")
    from data.pulseq.make_seq_files import pypulseq_view

    for name in ("tse_v15", "gre_v14"):
        live, frozen = pypulseq_view(path(name)), view(name)
        np.testing.assert_allclose(live["durations_s"], frozen["durations_s"], rtol=1e-12)
        assert [p["use"] for p in live["pulses"]] == [p["use"] for p in frozen["pulses"]]
        np.testing.assert_allclose([r["closest_s"] for r in live["readouts"]],
                                   [r["closest_s"] for r in frozen["readouts"]], rtol=1e-12)


# -- what the events are made of ------------------------------------------------------------------------
def test_hand_written_file_reads_exactly():
    """The tiny file's events are known (see _pulseq_files.TINY): pulse centre, flip, phases, readout at the k = 0
    crossing between samples, WAITs at block starts, definitions shared across phases."""
    description = read_pulseq_description(TINY.encode(), tr_index=1)
    rf, adc = events_of(description, 1), events_of(description, 2)
    assert description.tr_duration_us == TINY_EVENTS_US["tr"]
    assert rf[0].timestamp_us == pytest.approx(TINY_EVENTS_US["rf"][1] - 2000, abs=1e-9)
    assert rf[0].rf_amplitude_hz == pytest.approx(TINY_EVENTS_US["flip_rad"], rel=1e-12)
    assert (rf[0].rf_phase_rad, rf[0].rf_use, rf[0].rf_definition_id) == (1.5, RfUse.EXCITATION, 0)
    assert adc[0].timestamp_us == pytest.approx(TINY_EVENTS_US["adc"][1] - 2000, abs=1e-9)
    assert (adc[0].adc_phase_rad, adc[0].adc_role, adc[0].is_echo) == (1.5, AdcRole.SINGLE, True)
    assert [e.timestamp_us for e in description.events if e.type == 0] == [100.0, 1000.0]
    assert description.rf_definitions[0].rf_mode().name == "INSTANT"
    assert description.rf_definitions[0].flip_angle(rf[0].rf_amplitude_hz)[0] == pytest.approx(math.pi / 20)


def test_sources_path_bytes_stream_and_class_method_agree():
    expected = read_pulseq_description(TINY.encode())
    for source in (TINY, io.StringIO(TINY), io.BytesIO(TINY.encode()), bytearray(TINY.encode())):
        if isinstance(source, str):
            continue  # a str is a path
        got = read_pulseq_description(source)
        assert [(e.type, e.timestamp_us, e.params) for e in got.events] == \
               [(e.type, e.timestamp_us, e.params) for e in expected.events]
    by_path, by_class = read("gre_v15"), SequenceDescription.from_pulseq(str(path("gre_v15")))
    assert [(e.type, e.timestamp_us, e.params) for e in by_path.events] == \
           [(e.type, e.timestamp_us, e.params) for e in by_class.events]
    with pytest.raises(FileNotFoundError, match="no Pulseq file"):
        read_pulseq_description(path("gre_v15").with_name("missing.seq"))
    with pytest.raises(TypeError, match="path to a .seq file"):
        read_pulseq_description(3.5)


def test_pypulseq_sequence_in_memory():
    pp = pytest.importorskip("pypulseq")
    seq = pp.Sequence()
    seq.read(str(path("gre_v15")))
    from_memory = read_pulseq_description(seq)
    from_file = read("gre_v15")
    assert [(e.type, round(e.timestamp_us, 3)) for e in from_memory.events] == \
           [(e.type, round(e.timestamp_us, 3)) for e in from_file.events]


def test_tr_index_and_trref_pick_the_repetition():
    """TSE's first repetition is a dummy (no readout): the default reads the second; tr_index and TRRef say
    otherwise."""
    first, size = window("tse_v15")
    assert first == size  # the dummy repetition comes first
    assert len(events_of(read("tse_v15"), 2)) == 4
    assert len(events_of(read("tse_v15", tr_index=0), 2)) == 0
    text = TINY.replace("TRSize 4\n", "TRSize 4\nTRRef 1\n")
    assert events_of(read_pulseq_description(text.encode()), 1)[0].rf_phase_rad == 1.5
    assert events_of(read_pulseq_description(text.encode(), tr_index=0), 1)[0].rf_phase_rad == 0.0


def test_shared_definitions_and_slice_bandwidth():
    """Rows that differ in phase share a definition; the excitation's bandwidth is its small-tip FWHM, its
    gradient the example's slice-select gradient (bandwidth / thickness), and a refocusing pulse under the
    same gradient gets the same bandwidth (positions are in units of the excitation's slice)."""
    tse = read("tse_v15")
    pulses = events_of(tse, 1)
    assert [p.rf_definition_id for p in pulses] == [0, 1, 1, 1, 1]
    excitation = tse.rf_definitions[0]
    # write_tse.py: 2.5 ms sinc, time-bandwidth 4, 5 mm slice; the apodized sinc's FWHM is within 2 % of TBW/T
    assert excitation.bandwidth_hz == pytest.approx(4 / 2.5e-3, rel=0.02)
    gradient = pulses[0].slice_select_gradient_hz_per_m
    assert gradient == pytest.approx(4 / 2.5e-3 / 5e-3, rel=1e-5)  # the file's amplitude, 6 digits
    assert tse.rf_definitions[1].bandwidth_hz == pytest.approx(excitation.bandwidth_hz, rel=1e-9)
    mprage = read("mprage_v15")
    assert all(p.slice_select_gradient_hz_per_m == 0 for p in events_of(mprage, 1))  # hard pulses, no gradient
    assert [d.bandwidth_hz for d in mprage.rf_definitions.values()] == [0.0, 0.0]


def test_unread_extensions_are_named():
    with pytest.warns(UserWarning, match="LABELSET, LABELINC"):
        read_pulseq_description(path("mprage_v15"))


def test_hundred_thousand_blocks_read_fast():
    """A 100k-block GRE (benchmarks/pulseq_read.py records ~0.5 s here): held to 3 s, which a reader that goes
    line by line in Python (pypulseq's takes tens of seconds) or grows quadratically would miss, while a busy
    CI machine does not."""
    data = long_gre(100_000)
    start = time.perf_counter()
    description = read_pulseq_description(data)
    assert time.perf_counter() - start < 3.0
    assert len(description.events) == 5


# -- simulations against independent references ----------------------------------------------------------
@pytest.mark.parametrize("version", ["v14", "v15"])
def test_gre_steady_state_is_ernst(version):
    """write_gre.py (10 degrees, TR 12 ms, RF spoiled) with perfect spoiling, in the steady state: the Ernst signal
    times exp(-TE/T2), as the raw engine value -i sin(a) Mz at the readout (RF and ADC phase cancel)."""
    name = f"gre_{version}"
    seen = view(name)
    t1_s, t2_s = 1.0, 0.08
    sim = Simulator.from_pulseq(path(name), model=SpinPhysics(operators=SPOILED))
    signal = sim.simulate(T1=t1_s * 1e3, T2=t2_s * 1e3, repetitions=1000, **F64)
    tr_s, flip = 12e-3, math.radians(10)
    echo_s = seen["readouts"][0]["centre_s"] - seen["pulses"][0]["centre_s"]  # the readout is symmetric about k=0
    e1 = math.exp(-tr_s / t1_s)
    expected = -1j * math.sin(flip) * (1 - e1) / (1 - e1 * math.cos(flip)) * math.exp(-echo_s / t2_s)
    # 1000 TRs leave exp(-12) of the start; the file's amplitude (6 digits) moves the flip by ~1e-6
    assert rel_max_err(signal, [expected]) < 1e-5


@pytest.mark.parametrize("version", ["v14", "v15"])
def test_tse_echoes_decay_with_t2(version):
    """write_tse.py's CPMG train (90 about y, 180s about x, crushed), first acquiring repetition from equilibrium:
    echo n is exp(-t_n/T2), real and positive, at t_n from the excitation (pypulseq's readout centres)."""
    name = f"tse_{version}"
    seen = view(name)
    first, size = window(name)
    sim = Simulator.from_pulseq(path(name), model=SpinPhysics(operators=REFOCUSED))
    signal = sim.simulate(T1=1000.0, T2=80.0, repetitions=1, states=16, **F64)
    excitation = next(p["centre_s"] for p in seen["pulses"] if p["block"] >= first)
    times = [r["centre_s"] - excitation for r in seen["readouts"] if first <= r["block"] < first + size]
    # the 180s are written to 6 digits: a flip off by ~1e-6 rad leaves ~3e-6 out of phase
    assert rel_max_err(signal, np.exp(-np.array(times) / 0.08)) < 1e-5


@pytest.mark.parametrize("version", ["v14", "v15"])
def test_epi_lines_precess_and_decay(version):
    """write_epi.py's single shot: a 90 degree pulse, then one readout per line, each -i exp(-t/T2)
    exp(-2 pi i B0 t) at its k_x = 0 crossing: the sample write_epi.py centres on the gradient (half a dwell
    past the readout's middle), the one pypulseq's k-space puts at k_x = 0 (one pulse: its 1.4 reading is
    right too)."""
    name = f"epi_{version}"
    seen = view(name)
    sim = Simulator.from_pulseq(path(name), model=SpinPhysics())
    signal = sim.simulate(T1=1000.0, T2=50.0, B0=20.0, repetitions=1, **F64)
    t = np.array([r["closest_s"] for r in seen["readouts"]]) - seen["pulses"][0]["centre_s"]
    expected = -1j * np.exp(-t / 0.05) * np.exp(-2j * np.pi * 20.0 * t)
    assert rel_max_err(signal, expected) < 1e-6  # the flip from a 6-digit amplitude: sin(90 deg +- 1e-6) ~ 1


@pytest.mark.parametrize("version", ["v14", "v15"])
def test_bssfp_steady_state_is_freeman_hill(version):
    """The bSSFP (40 degrees, RF phase 0, pi, ...) on resonance, in the steady state: after each pulse
    |M+| = sin(a)(1 - E1) / (1 - (E1 - E2) cos(a) - E1 E2), then exp(-TE/T2) to the readout; demodulated by
    its pulse's phase each sample is -i times that."""
    name = f"bssfp_{version}"
    seen = view(name)
    t1_s, t2_s = 0.5, 0.1
    sim = Simulator.from_pulseq(path(name), model=SpinPhysics(operators=BALANCED))
    signal = sim.simulate(T1=t1_s * 1e3, T2=t2_s * 1e3, repetitions=1500, **F64)
    tr_s = sum(seen["durations_s"][:4])
    echo_s = seen["readouts"][0]["centre_s"] - seen["pulses"][0]["centre_s"]
    e1, e2, flip = math.exp(-tr_s / t1_s), math.exp(-tr_s / t2_s), math.radians(40)
    magnitude = math.sin(flip) * (1 - e1) / (1 - (e1 - e2) * math.cos(flip) - e1 * e2) * math.exp(-echo_s / t2_s)
    # the phase pi is written as 3.14159 (6 digits): the samples turn by ~3e-6 rad; 3000 TRs leave exp(-22)
    assert rel_max_err(signal, [-1j * magnitude] * 2) < 1e-4


def test_mprage_matches_the_oracle_on_a_description_built_by_hand():
    """write_MPRAGE.py (N = 12 x 3 x 32): an adiabatic inversion, then 12 hard 7 degree pulses RF-spoiled by 117
    degree increments, each followed by a readout. Built by hand from the script's parameters and pypulseq's
    times (no Pulseq reading involved) and played by the oracle through the same spoiled handlers, against the
    engine on the file: three repetitions of 2.5 s."""
    seen = view("mprage_v15")
    size = int(seen["definitions"]["TRSize"])
    pulses = [p for p in seen["pulses"] if p["block"] < size]
    readouts = [r for r in seen["readouts"] if r["block"] < size]
    assert pulses[0]["use"] == "inversion" and len(pulses) == 13 and len(readouts) == 12
    events = [SequenceEvent.rf(pulses[0]["centre_s"] * 1e6, 0, RfUse.INVERSION, math.pi)]
    phase_deg = increment_deg = 0.0
    for pulse, readout in zip(pulses[1:], readouts, strict=True):
        phase = math.radians(phase_deg)
        events.append(SequenceEvent.rf(pulse["centre_s"] * 1e6, 0, RfUse.EXCITATION, math.radians(7), phase))
        events.append(SequenceEvent.adc(readout["closest_s"] * 1e6, AdcRole.SINGLE, phase))
        increment_deg = (increment_deg + 117) % 360
        phase_deg = (phase_deg + increment_deg) % 360
    by_hand = SequenceDescription(0, 2.5e6, events, {0: ideal_rf_definition()})
    physics = SpinPhysics(operators=SPOILED)
    fields = {"t1_ms": 1200.0, "t2_ms": 60.0}
    reference = simulator_oracle(Simulator.from_description(by_hand, model=physics), fields, states=4, repetitions=3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the file's labels
        sim = Simulator.from_pulseq(path("mprage_v15"), model=physics)
    signal = sim.simulate(T1=1200.0, T2=60.0, repetitions=3, states=4, **F64)
    # the file writes phases and amplitudes to 6 digits (~1e-6 relative)
    assert rel_max_err(signal, reference) < 1e-5


def test_concrete_simulator_from_pulseq_with_reader_settings():
    """`FSESimulator.from_pulseq` plays the file through FSE's own handlers; the reader's settings
    (crusher geometry, subsequence index) reach the description, the rest the simulator."""
    from blochsim.simulators import FSESimulator

    sim = FSESimulator.from_pulseq(path("tse_v15"), crusher_dephasing_rad=6 * math.pi, voxel_size_m=1e-3,
                                   subsequence_index=3, states=16)
    described = sim.describe()
    assert (described.subsequence_index, described.crusher_dephasing_rad, described.voxel_size_m) == \
        (3, 6 * math.pi, 1e-3)
    by_physics = Simulator.from_pulseq(path("tse_v15"), model=FSESimulator.model, states=16)
    tissue = {"T1": 1000.0, "T2": 80.0, "repetitions": 2}  # FSESimulator's class default differs from the base's
    assert rel_max_err(sim.simulate(**tissue, **F64), by_physics.simulate(**tissue, **F64)) < 1e-12
    with pytest.raises(ValueError, match="needs model=SpinPhysics"):
        Simulator.from_pulseq(path("tse_v15"))


def test_half_raster_gradient():
    """A 1.5 arbitrary gradient of time shape -1 (samples every half raster, from `first` at 0 to `last` at
    (n + 1) halves): a constant 10 kHz/m of 119 samples spans the 600 us readout block, so after the -2.5 /m
    prephaser k crosses 0 at 250 us, 3 dwells into the readout."""
    text = TINY.replace("3 60 0 2 0 0 1 0", "3 60 0 4 0 0 1 0").replace("7 60 0 2 0 0 2 0", "7 60 0 4 0 0 2 0")
    text = text.replace("# id amplitude rise flat fall delay\n", "[GRADIENTS]\n4 10000 10000 10000 3 -1 0\n\n"
                        "# id amplitude rise flat fall delay\n")
    text += "shape_id 3\nnum_samples 119\n1\n0\n0\n116\n\n"
    description = read_pulseq_description(text.encode())
    assert [e.timestamp_us for e in events_of(description, 2)] == pytest.approx([650.0], abs=1e-9)
