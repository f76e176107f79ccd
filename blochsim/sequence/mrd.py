"""Sequence descriptions in an MRD (ISMRMRD) stream: `read_mrd_description`, and `mrd_description_text` for
the payload a sequence server sends.

**Framing** (the ISMRMRD streaming protocol, as the MRD project's `ismrmrd.serialization` writes it).
Every message starts with a uint16 LE id. 1 (config file) is followed by 1024 bytes; 2 (config text), 3
(XML header) and 5 (text) by a uint32 LE length and that many bytes of UTF-8, cut at the first NUL; 4
closes the stream. Acquisitions (1008), images and waveforms follow the description.

**Payload.** The description is the text message whose JSON object begins with the key
`"pulserver_sequence_description"`. Its value is a list with one object per file the sequence chain plays:
`subsequence_index`, `tr_duration_us`, `rf_raster_time_s`; `type` (base64 of LE int32, one per event),
`timestamp_us` (base64 LE float64) and `params` (base64 LE float32, 7 per event in `SequenceEvent.rf`'s
order: definition_id, use, amplitude_hz, phase_rad, frequency_hz, shim_id, slice_select_gradient_hz_per_m;
an ADC's role, phase_rad and is_echo lead its 7; a WAIT's are 0); and `rf_definitions`, a list of
`{id, bandwidth_hz, num_bands, band_frequency_offsets_hz, band_bandwidth_hz, magnitude, phase, time}`
whose shapes are `{num_uncompressed, samples}` (samples base64 LE float32, Pulseq-compressed or not) or
null, `time` in RF rasters. Envelopes are peak-normalized and played at `amplitude_hz` (Hz), so the
flip of an event is `2 pi amplitude_hz |int w dt|`; `total_b1sq_power` is not carried and is worked out
from the envelope. Event actions (crushers, spoilers) are not carried either: `Simulator.from_description`
supplies them from its handlers.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import struct
from typing import Any

import numpy as np
import torch

from .description import SequenceDescription
from .events import AdcRole, EventType, RfUse, SequenceEvent
from .rf import RfDefinition, RfShape

__all__ = ["read_mrd_description", "mrd_description_text", "DESCRIPTION_KEY"]

#: The key that marks the text message holding the descriptions.
DESCRIPTION_KEY = "pulserver_sequence_description"
#: Message ids of the ISMRMRD stream read here.
CONFIG_FILE, CONFIG_TEXT, HEADER, CLOSE, TEXT = 1, 2, 3, 4, 5
_NAMES = {CONFIG_FILE: "config file", CONFIG_TEXT: "config text", HEADER: "XML header", CLOSE: "close", TEXT: "text",
          1008: "acquisition", 1022: "image", 1026: "waveform", 1030: "ndarray"}
#: The longest text message read (bytes): a declared length past it is refused before anything is read.
MAX_MESSAGE_BYTES = 1 << 28
_PARAMS_PER_EVENT = 7


def read_mrd_description(stream: Any) -> tuple[str | None, list[SequenceDescription]]:
    """`(xml_header or None, [SequenceDescription, ...])` from an ISMRMRD stream (see the module doc).

    `stream` is any object with `read(n)` returning bytes: an open file, `io.BytesIO`,
    `socket.makefile("rb")`. Messages are read up to and including the description, so the stream is
    left at the first acquisition. Config files, config texts and other text messages before it are
    passed over; the last XML header before it is returned. Raises `ValueError` for any other message
    before the description, for the stream's end (or a close) before it, and for a description that
    does not decode (naming the field and the event or definition).
    """
    if not callable(getattr(stream, "read", None)):
        raise TypeError(f"stream must have read(n) (a binary file, io.BytesIO, socket.makefile('rb')), got "
                        f"{type(stream).__name__}")
    header = None
    count = 0
    while True:
        raw = _read_exactly(stream, 2, f"the id of message {count}")
        if raw is None:
            raise ValueError(f"the stream ended after {count} messages without a sequence description (a text "
                             f"message whose JSON begins with {DESCRIPTION_KEY!r})")
        (message,) = struct.unpack("<H", raw)
        where = f"message {count} ({_NAMES.get(message, f'id {message}')})"
        if message == CONFIG_FILE:
            _require(_read_exactly(stream, 1024, where), 1024, where)
        elif message in (CONFIG_TEXT, HEADER, TEXT):
            text = _read_text(stream, where)
            if message == HEADER:
                header = text
            elif message == TEXT:
                descriptions = _description_of(text, where)
                if descriptions is not None:
                    return header, descriptions
        elif message == CLOSE:
            raise ValueError(f"{where} closes the stream before any sequence description")
        else:
            raise ValueError(f"{where} comes before the sequence description; before it a stream may hold config "
                             "files (1), config texts (2), XML headers (3) and other text messages (5)")
        count += 1


def _read_exactly(stream: Any, size: int, what: str) -> bytes | None:
    """`size` bytes, reading again where `read` returns fewer (sockets); None at the end before the first byte."""
    chunks, got = [], 0
    while got < size:
        chunk = stream.read(min(size - got, 1 << 20))
        if not chunk:
            if got == 0:
                return None
            raise ValueError(f"the stream ends inside {what}: {got} of {size} bytes")
        if not isinstance(chunk, (bytes, bytearray, memoryview)):
            raise TypeError(f"stream.read returned {type(chunk).__name__}: open the stream in binary mode")
        chunks.append(bytes(chunk))
        got += len(chunk)
    return b"".join(chunks)


def _require(data: bytes | None, size: int, what: str) -> bytes:
    if data is None:
        raise ValueError(f"the stream ends inside {what}: 0 of {size} bytes")
    return data


def _read_text(stream: Any, where: str) -> str:
    (length,) = struct.unpack("<I", _require(_read_exactly(stream, 4, f"the length of {where}"), 4, where))
    if length > MAX_MESSAGE_BYTES:
        raise ValueError(f"{where} declares {length} bytes; this reader takes at most {MAX_MESSAGE_BYTES}")
    data = _require(_read_exactly(stream, length, where), length, where) if length else b""
    data = data.split(b"\0", 1)[0]
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise ValueError(f"{where} is not UTF-8 (byte {error.start})") from None


def _description_of(text: str, where: str) -> list[SequenceDescription] | None:
    """The descriptions of a text message, or None when it is another text."""
    if DESCRIPTION_KEY not in text[:200]:
        return None
    try:
        payload = json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(f"{where} names {DESCRIPTION_KEY!r} but is not JSON: {error}") from None
    if not isinstance(payload, dict) or next(iter(payload), None) != DESCRIPTION_KEY:
        return None
    files = payload[DESCRIPTION_KEY]
    if not isinstance(files, list) or not files:
        raise ValueError(f"{where}: {DESCRIPTION_KEY} must be a non-empty list (one object per file played)")
    return [_description(entry, f"{DESCRIPTION_KEY}[{i}]") for i, entry in enumerate(files)]


def _field(entry: dict, name: str, where: str) -> Any:
    if not isinstance(entry, dict) or name not in entry:
        raise ValueError(f"{where} has no {name!r}")
    return entry[name]


def _number(entry: dict, name: str, where: str, *, whole: bool = False, minimum: float | None = None) -> float:
    value = _field(entry, name, where)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or \
            (whole and value != round(value)) or (minimum is not None and value < minimum):
        kind = "a whole number" if whole else "a finite number"
        raise ValueError(f"{where}.{name} must be {kind}{f' >= {minimum}' if minimum is not None else ''}, "
                         f"got {value!r}")
    return int(value) if whole else float(value)


def _array(entry: dict, name: str, where: str, dtype: str) -> np.ndarray:
    text = _field(entry, name, where)
    if not isinstance(text, str):
        raise ValueError(f"{where}.{name} must be base64 text, got {type(text).__name__}")
    try:
        data = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise ValueError(f"{where}.{name} is not base64") from None
    size = np.dtype(dtype).itemsize
    if len(data) % size:
        raise ValueError(f"{where}.{name} holds {len(data)} bytes, not a whole number of {size}-byte values")
    values = np.frombuffer(data, dtype=dtype)
    if values.dtype.kind == "f" and not np.isfinite(values).all():
        first = int(np.flatnonzero(~np.isfinite(values))[0])
        raise ValueError(f"{where}.{name}[{first}] is {values[first]}: values must be finite")
    return values


def _description(entry: dict, where: str) -> SequenceDescription:
    kinds = _array(entry, "type", where, "<i4")
    times = _array(entry, "timestamp_us", where, "<f8")
    params = _array(entry, "params", where, "<f4").astype(np.float64)
    n = kinds.size
    if times.size != n or params.size != _PARAMS_PER_EVENT * n:
        raise ValueError(f"{where}: type holds {n} events, timestamp_us {times.size}, params {params.size} values "
                         f"({_PARAMS_PER_EVENT} per event make {_PARAMS_PER_EVENT * n})")
    params = params.reshape(n, _PARAMS_PER_EVENT)
    events = [_event(int(kinds[i]), float(times[i]), params[i], f"{where} event {i}") for i in range(n)]
    definitions = {}
    listed = _field(entry, "rf_definitions", where)
    if not isinstance(listed, list):
        raise ValueError(f"{where}.rf_definitions must be a list")
    raster = _number(entry, "rf_raster_time_s", where, minimum=0.0)
    for k, item in enumerate(listed):
        definition = _definition(item, f"{where}.rf_definitions[{k}]", raster)
        if definition.id in definitions:
            raise ValueError(f"{where}.rf_definitions[{k}]: id {definition.id} is given twice")
        definitions[definition.id] = definition
    try:
        return SequenceDescription(_number(entry, "subsequence_index", where, whole=True, minimum=0),
                                   _number(entry, "tr_duration_us", where, minimum=0.0), events, definitions, {},
                                   rf_raster_time_s=raster)
    except ValueError as error:
        raise ValueError(f"{where}: {error}") from None


def _whole(value: float, name: str, where: str, top: int) -> int:
    if value != round(value) or not 0 <= value <= top:
        raise ValueError(f"{where}: {name} is {value}; it must be a whole number from 0 to {top}")
    return int(value)


def _event(kind: int, time_us: float, p: np.ndarray, where: str) -> SequenceEvent:
    try:
        if kind == EventType.WAIT:
            return SequenceEvent.wait(time_us)
        if kind == EventType.RF:
            return SequenceEvent.rf(time_us, _whole(p[0], "definition_id", where, 2**24), RfUse(
                _whole(p[1], "use", where, 6)), float(p[2]), float(p[3]), float(p[4]),
                _whole(p[5], "shim_id", where, 2**24), float(p[6]))
        if kind == EventType.ADC:
            return SequenceEvent.adc(time_us, AdcRole(_whole(p[0], "role", where, 3)), float(p[1]),
                                     is_echo=bool(_whole(p[2], "is_echo", where, 1)))
    except ValueError as error:
        raise ValueError(f"{where}: {error}") from None
    raise ValueError(f"{where}: type is {kind}; it must be 0 (WAIT), 1 (RF) or 2 (ADC)")


def _shape(item: dict, name: str, where: str, *, optional: bool) -> RfShape | None:
    value = _field(item, name, where)
    if value is None:
        if optional:
            return None
        raise ValueError(f"{where}.{name} is required")
    at = f"{where}.{name}"
    count = _number(value, "num_uncompressed", at, whole=True, minimum=1)
    samples = _array(value, "samples", at, "<f4")
    if samples.size == 0 or samples.size > count:
        raise ValueError(f"{at} holds {samples.size} samples for num_uncompressed {count}")
    shape = RfShape(count, samples)
    try:
        shape.decompress()
    except ValueError as error:
        raise ValueError(f"{at}: {error}") from None
    return shape


def _definition(item: dict, where: str, raster_s: float) -> RfDefinition:
    bands = _number(item, "num_bands", where, whole=True, minimum=1)
    offsets = _field(item, "band_frequency_offsets_hz", where)
    magnitude = _shape(item, "magnitude", where, optional=False)
    phase, time = _shape(item, "phase", where, optional=True), _shape(item, "time", where, optional=True)
    try:
        definition = RfDefinition(_number(item, "id", where, whole=True, minimum=0),
                                  _number(item, "bandwidth_hz", where, minimum=0.0), bands, offsets,
                                  _number(item, "band_bandwidth_hz", where, minimum=0.0), 0.0, magnitude, phase, time)
        envelope = definition.combined_envelope()
        power = float(np.sum(np.abs(envelope) ** 2 * definition.sample_durations(rf_raster_time_s=raster_s)))
    except ValueError as error:
        raise ValueError(f"{where}: {error}") from None
    return RfDefinition(definition.id, definition.bandwidth_hz, bands, definition.band_frequency_offsets_hz,
                        definition.band_bandwidth_hz, power, magnitude, phase, time)


# -- writing ------------------------------------------------------------------------------------------
def mrd_description_text(descriptions: Any) -> str:
    """The JSON text message that carries `descriptions` (one `SequenceDescription` or a list) in an MRD stream.

    Each definition goes out peak-normalized and each RF amplitude is scaled to match, so an event turns
    by the same flip (`2 pi amplitude_hz |int w dt|`) as before. The ideal pulse (one sample lasting
    1/(2 pi) s) goes out as two equal samples of half that each, the same rotation and the same
    saturation. Event actions are not carried (the module doc says why). Raises `ValueError` for what the
    format cannot hold: a value per train, a multi-channel (pTx) definition, a varying slice-select
    gradient, a static shim other than 0.
    """
    if isinstance(descriptions, SequenceDescription):
        descriptions = [descriptions]
    files = []
    for i, description in enumerate(descriptions):
        if not isinstance(description, SequenceDescription):
            raise TypeError(f"descriptions[{i}] must be a SequenceDescription, got {type(description).__name__}")
        files.append(_encode(description, f"descriptions[{i}]"))
    return json.dumps({DESCRIPTION_KEY: files})


def _scalar(value: Any, name: str, where: str) -> float:
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise ValueError(f"{where}: {name} holds {value.numel()} values (one per train); an MRD stream carries "
                             "one value per event")
        value = value.detach().item()
    return float(value)


def _b64(values: np.ndarray) -> str:
    return base64.b64encode(np.ascontiguousarray(values).tobytes()).decode("ascii")


def _encode(description: SequenceDescription, where: str) -> dict:
    raster = float(description.rf_raster_time_s)
    scales, definitions = {}, []
    for key, definition in sorted(description.rf_definitions.items()):
        encoded, scale = _encode_definition(definition, f"{where}.rf_definitions[{key}]", raster)
        definitions.append(encoded)
        scales[key] = scale
    kinds, times, params = [], [], []
    for k, event in enumerate(description.events):
        at = f"{where}.events[{k}]"
        row = [0.0] * _PARAMS_PER_EVENT
        if event.type == EventType.RF:
            if event.rf_shim_id != 0:
                raise ValueError(f"{at}: plays static shim {event.rf_shim_id}; an MRD description carries no shims")
            row = [event.rf_definition_id, int(event.rf_use),
                   _scalar(event.rf_amplitude_hz, "rf_amplitude_hz", at) * scales[event.rf_definition_id],
                   _scalar(event.rf_phase_rad, "rf_phase_rad", at),
                   _scalar(event.rf_frequency_hz, "rf_frequency_hz", at), 0,
                   _scalar(event.slice_select_gradient_hz_per_m, "slice_select_gradient_hz_per_m", at)]
        elif event.type == EventType.ADC:
            row[:3] = [int(event.adc_role), _scalar(event.adc_phase_rad, "adc_phase_rad", at), float(event.is_echo)]
        kinds.append(int(event.type))
        times.append(_scalar(event.timestamp_us, "timestamp_us", at))
        params.append(row)
    return {"subsequence_index": int(description.subsequence_index),
            "tr_duration_us": _scalar(description.tr_duration_us, "tr_duration_us", where),
            "rf_raster_time_s": raster,
            "type": _b64(np.array(kinds, dtype="<i4")),
            "timestamp_us": _b64(np.array(times, dtype="<f8")),
            "params": _b64(np.array(params, dtype="<f4").reshape(-1)),
            "rf_definitions": definitions}


def _encode_definition(definition: RfDefinition, where: str, raster_s: float) -> tuple[dict, float]:
    """(the definition's JSON, the factor its events' amplitudes take: the envelope's peak)."""
    if definition.channel_count != 1:
        raise ValueError(f"{where}: has {definition.channel_count} channels; an MRD description carries one")
    if definition.gradient_waveform() is not None:
        raise ValueError(f"{where}: its slice-select gradient varies over the pulse; an MRD description carries a "
                         "constant one")
    envelope = definition.combined_envelope()
    peak = float(np.abs(envelope).max())
    if peak == 0:
        raise ValueError(f"{where}: the envelope is zero everywhere")
    magnitude, phase = np.abs(envelope) / peak, np.angle(envelope) / (2 * np.pi)
    n = envelope.size
    time = None if definition.time is None else definition.time.decompress().astype(np.float64)
    if definition.sample_duration_s is not None:  # every sample spans sample_duration_s, whatever the raster
        span = definition.sample_duration_s / raster_s
        if n == 1:  # two equal samples of half the span each: the same area, power and rotation
            magnitude, phase, n = np.repeat(magnitude, 2), np.repeat(phase, 2), 2
            time = np.array([0.25, 0.75]) * span
        else:
            time = (np.arange(n) + 0.5) * span

    def shape(samples):
        return None if samples is None else {"num_uncompressed": int(len(samples)),
                                             "samples": _b64(np.asarray(samples, dtype="<f4"))}

    encoded = {"id": int(definition.id), "bandwidth_hz": definition.bandwidth_hz, "num_bands": definition.num_bands,
               "band_frequency_offsets_hz": list(definition.band_frequency_offsets_hz),
               "band_bandwidth_hz": definition.band_bandwidth_hz, "magnitude": shape(magnitude),
               "phase": shape(phase if np.any(phase) else None), "time": shape(time)}
    return encoded, peak
