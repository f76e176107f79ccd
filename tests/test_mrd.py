"""Sequence descriptions in an MRD stream: `read_mrd_description` and `mrd_description_text`.

The round trip is written by the MRD project's own serializer (`ismrmrd.serialization.ProtocolSerializer`,
ismrmrd >= 1.15: config file, config text, XML header, a text message, the description, acquisitions),
read back here, and simulated: the descriptions read give the signals of the descriptions written (the
stream holds the params in float32). Framing faults are built byte by byte.
"""

from __future__ import annotations

import base64
import io
import json
import math
import struct
import warnings

import numpy as np
import pytest
import torch
from _pulseq_files import path
from conftest import rel_max_err

import blochsim
from blochsim import Simulator
from blochsim.model import REFOCUSED, SPOILED, SpinPhysics
from blochsim.sequence import (
    Delay,
    Excitation,
    Readout,
    SequenceDescription,
    mrf_description,
    read_mrd_description,
    read_pulseq_description,
    rf_definition,
)
from blochsim.sequence.mrd import DESCRIPTION_KEY, MAX_MESSAGE_BYTES, mrd_description_text
from blochsim.simulators import MRFSimulator

F64 = {"dtype": torch.float64}
#: The stream carries amplitudes and phases in float32: ~6e-8 relative each, ~1e-6 over a train of echoes.
FLOAT32_PARAMS = 1e-5


def shaped_spgr() -> SequenceDescription:
    """Three spoiled 20 degree excitations with a Hann-windowed sinc of 400 samples (definition 1), each phase
    cycled and read 4 ms later."""
    t = np.linspace(-2, 2, 400)
    pulse = rf_definition(np.sinc(t) * np.hanning(400) * np.exp(0.3j), dwell_s=4e-6, definition_id=1)
    parts = []
    for k in range(3):
        phase = 0.5 * k * k
        parts += [Excitation(math.radians(20), phase, definition_id=1, duration_s=4e-3), Readout(phase),
                  Delay(6e-3)]
    return SequenceDescription.from_operators(*parts, rf_definitions={1: pulse})


def stream_of(descriptions, *, before=(), after=2) -> io.BytesIO:
    """An ISMRMRD stream written by ismrmrd's serializer: config file, config text, XML header, `before` text
    messages, the description text, `after` acquisitions, close."""
    ismrmrd = pytest.importorskip("ismrmrd", minversion="1.15")
    from ismrmrd.serialization import ConfigFile, ConfigText, ProtocolSerializer
    from ismrmrd.xsd import experimentalConditionsType, ismrmrdHeader

    buffer = io.BytesIO()
    serializer = ProtocolSerializer(buffer)
    serializer.serialize(ConfigFile("default.xml"))
    serializer.serialize(ConfigText("<configuration/>"))
    serializer.serialize(ismrmrdHeader(experimentalConditions=experimentalConditionsType(
        H1resonanceFrequency_Hz=127_740_000)))
    for text in before:
        serializer.serialize(text)
    serializer.serialize(mrd_description_text(descriptions))
    for k in range(after):
        acquisition = ismrmrd.Acquisition.from_array(np.full((2, 8), k, dtype=np.complex64))
        serializer.serialize(acquisition)
    serializer.close()
    buffer.seek(0)
    return buffer


def test_round_trip_through_ismrmrd_stream_and_simulate():
    """MRF (ideal pulses, inversion), a shaped-pulse SPGR and a Pulseq TSE (sinc pulses with slice bandwidths)
    written in one stream and read back: the same events, definitions and signals; the stream is left at the
    first acquisition."""
    pytest.importorskip("ismrmrd", minversion="1.15")
    from ismrmrd.serialization import ProtocolDeserializer

    mrf = mrf_description(torch.deg2rad(torch.linspace(10, 60, 25)).tolist(), 0.012, inversion_time_s=0.04)
    spgr = shaped_spgr()
    tse = read_pulseq_description(path("tse_v15"), subsequence_index=2)
    stream = stream_of([mrf, spgr, tse], before=["a log line", json.dumps({"other": 1})])
    header, read = read_mrd_description(stream)
    assert "127740000" in header and "ismrmrdHeader" in header
    assert [d.subsequence_index for d in read] == [0, 0, 2]
    acquisition = next(iter(ProtocolDeserializer(stream).deserialize()))
    assert type(acquisition).__name__ == "Acquisition" and acquisition.data[0, 0] == 0

    for written, back in zip((mrf, spgr, tse), read, strict=True):
        assert [e.type for e in back.events] == [e.type for e in written.events]
        np.testing.assert_allclose([e.timestamp_us for e in back.events], [e.timestamp_us for e in written.events],
                                   rtol=0, atol=1e-9)  # float64 in the stream
        assert back.tr_duration_us == written.tr_duration_us
        assert sorted(back.rf_definitions) == sorted(written.rf_definitions)
        for key, definition in written.rf_definitions.items():
            assert back.rf_definitions[key].bandwidth_hz == definition.bandwidth_hz
            assert back.rf_definitions[key].saturation() == pytest.approx(definition.saturation(), rel=1e-6)
        for a, b in zip(written.events, back.events, strict=True):
            if a.type == 1:  # the same rotation: amplitude x definition area
                flip_a = a.rf_amplitude_hz * 2 * math.pi * abs(written.rf_definitions[a.rf_definition_id].integral())
                flip_b = b.rf_amplitude_hz * 2 * math.pi * abs(back.rf_definitions[b.rf_definition_id].integral())
                assert flip_b == pytest.approx(flip_a, rel=1e-6)  # float32 amplitude
            if a.type == 2:
                assert (b.adc_role, b.is_echo) == (a.adc_role, a.is_echo)

    tissue = {"T1": [800.0, 1200.0], "T2": [60.0, 90.0]}
    for written, back, physics in ((mrf, read[0], MRFSimulator.model), (spgr, read[1], SpinPhysics(operators=SPOILED)),
                                   (tse, read[2], SpinPhysics(operators=REFOCUSED))):
        expected = Simulator.from_description(written, model=physics).simulate(**tissue, states=16, **F64)
        got = Simulator.from_description(back, model=physics).simulate(**tissue, states=16, **F64)
        assert rel_max_err(got, expected) < FLOAT32_PARAMS


def test_top_level_export():
    assert blochsim.read_mrd_description is read_mrd_description
    assert blochsim.sequence.read_mrd_description is read_mrd_description


# -- framing built by hand (no ismrmrd needed) --------------------------------------------------------------
def message(kind: int, payload: bytes | str = b"") -> bytes:
    if isinstance(payload, str):
        payload = payload.encode()
    if kind == 1:
        return struct.pack("<H", 1) + payload.ljust(1024, b"\0")
    if kind in (2, 3, 5):
        return struct.pack("<HI", kind, len(payload)) + payload
    return struct.pack("<H", kind) + payload


DESCRIPTION = mrd_description_text(mrf_description([0.2, 0.4, 0.6], 0.01))
EVENTS = len(base64.b64decode(json.loads(DESCRIPTION)[DESCRIPTION_KEY][0]["type"])) // 4


class Trickle(io.RawIOBase):
    """A stream that hands out at most 3 bytes a read, as a socket may."""

    def __init__(self, data: bytes) -> None:
        self.data, self.at = data, 0

    def read(self, n: int = -1) -> bytes:
        chunk = self.data[self.at:self.at + min(n, 3)]
        self.at += len(chunk)
        return chunk


def test_hand_framed_stream_reads_and_stops_at_the_first_acquisition():
    data = message(1, "default.xml") + message(3, "<xml/>\0padding") + message(5, DESCRIPTION) + message(1008, b"rest")
    stream = io.BytesIO(data)
    header, descriptions = read_mrd_description(stream)
    assert header == "<xml/>"  # cut at the first NUL
    assert len(descriptions) == 1 and len(descriptions[0].adc_events) == 3
    assert stream.read() == struct.pack("<H", 1008) + b"rest"
    header, descriptions = read_mrd_description(Trickle(message(5, DESCRIPTION)))
    assert header is None and len(descriptions) == 1


def _payload(**change) -> str:
    entry = json.loads(DESCRIPTION)[DESCRIPTION_KEY][0]
    entry.update(change)
    return json.dumps({DESCRIPTION_KEY: [entry]})


BAD_STREAMS = {
    "acquisition first": (message(1008, b"x" * 20), r"message 0 \(acquisition\) comes before the sequence description"),
    "close first": (message(4), r"message 0 \(close\) closes the stream before any sequence description"),
    "no description": (message(5, "hello"), r"the stream ended after 1 messages without a sequence description"),
    "cut id": (b"\x05", r"the stream ends inside the id of message 0: 1 of 2 bytes"),
    "cut length": (struct.pack("<H", 5) + b"\x10\x00", r"ends inside the length of message 0 \(text\)"),
    "cut text": (struct.pack("<HI", 5, 100) + b"{}", r"ends inside message 0 \(text\): 2 of 100 bytes"),
    "cut config file": (struct.pack("<H", 1) + b"x" * 100, r"ends inside message 0 \(config file\): 100 of 1024"),
    "4 GB text": (struct.pack("<HI", 5, 0xFFFFFFFF), rf"declares 4294967295 bytes; this reader takes at most "
                                                      rf"{MAX_MESSAGE_BYTES}"),
    "not UTF-8": (message(5, b"\xff\xfe"), r"message 0 \(text\) is not UTF-8"),
    "not JSON": (message(5, '{"pulserver_sequence_description": [}'), r"names 'pulserver_sequence_description' but "
                                                                        r"is not JSON"),
    "empty list": (message(5, json.dumps({DESCRIPTION_KEY: []})), r"must be a non-empty list"),
    "bad base64": (message(5, _payload(type="!!!")), r"\[0\]\.type is not base64"),
    "short params": (message(5, _payload(params=base64.b64encode(b"\0" * 8).decode())),
                     rf"type holds {EVENTS} events, timestamp_us {EVENTS}, params 2 values"),
    "NaN time": (message(5, _payload(timestamp_us=base64.b64encode(np.full(EVENTS, np.nan).tobytes()).decode())),
                 r"\[0\]\.timestamp_us\[0\] is nan: values must be finite"),
    "unknown type": (message(5, _payload(type=base64.b64encode(np.full(EVENTS, 9, "<i4").tobytes()).decode())),
                     r"event 0: type is 9; it must be 0 \(WAIT\), 1 \(RF\) or 2 \(ADC\)"),
    "no definitions": (message(5, _payload(rf_definitions=[])), r"events\[0\] plays RF definition 0, which "
                                                                 r"rf_definitions does not hold"),
    "missing field": (message(5, json.dumps({DESCRIPTION_KEY: [{"type": ""}]})), r"has no 'timestamp_us'"),
}


@pytest.mark.parametrize("name", list(BAD_STREAMS))
def test_bad_streams_raise_value_error(name):
    data, expected = BAD_STREAMS[name]
    with pytest.raises(ValueError, match=expected):
        read_mrd_description(io.BytesIO(data))


def test_text_mode_stream_is_refused():
    with pytest.raises(TypeError, match="binary mode"):
        read_mrd_description(io.StringIO("x"))
    with pytest.raises(TypeError, match="read"):
        read_mrd_description(b"bytes")


def test_writer_refuses_what_the_format_cannot_hold():
    trains = SequenceDescription.from_operators(Excitation(torch.tensor([0.1, 0.2])), Readout())
    with pytest.raises(ValueError, match="one value per event"):
        mrd_description_text(trains)
    with pytest.raises(TypeError, match=r"descriptions\[0\] must be a SequenceDescription"):
        mrd_description_text(["x"])


def test_every_pulseq_example_goes_through():
    """Each Pulseq example's description written and read (hand framing): the same rotations and times."""
    for name in ("gre_v15", "epi_v14", "bssfp_v15", "mprage_v15"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            written = read_pulseq_description(path(name))
        _, (back,) = read_mrd_description(io.BytesIO(message(5, mrd_description_text(written))))
        for a, b in zip(written.events, back.events, strict=True):
            assert b.timestamp_us == a.timestamp_us
            if a.type == 1:
                ia = abs(written.rf_definitions[a.rf_definition_id].integral(rf_raster_time_s=written.rf_raster_time_s))
                ib = abs(back.rf_definitions[b.rf_definition_id].integral(rf_raster_time_s=back.rf_raster_time_s))
                assert b.rf_amplitude_hz * ib == pytest.approx(a.rf_amplitude_hz * ia, rel=1e-6)  # float32 params
