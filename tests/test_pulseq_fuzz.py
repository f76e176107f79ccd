"""Property-based tests of the Pulseq reader (hypothesis, derandomized, fixed example counts: a few seconds):
random damage to a file, cuts anywhere, byte flips of a real file, and the shape decoding against Pulseq's
encoding. Whatever the input, a description or a ValueError; nothing else, and no hang.
"""

from __future__ import annotations

import numpy as np
import pytest
from _pulseq_files import TINY, path
from _pulseq_files import read_quietly as read

from blochsim.sequence._pulseq_file import decode_shape
from blochsim.sequence.rf import decompress_shape

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


# -- shape decoding -----------------------------------------------------------------------------------------
def _encode(samples: np.ndarray) -> list:
    """Pulseq's compression: the derivative, runs of a value written twice and followed by the extra count."""
    derivative = np.diff(np.concatenate([[0.0], samples]))
    packed, i = [], 0
    while i < derivative.size:
        j = i
        while j + 1 < derivative.size and derivative[j + 1] == derivative[i]:
            j += 1
        run = j - i + 1
        packed += [derivative[i]] if run == 1 else [derivative[i], derivative[i], run - 2]
        i = j + 1
    return packed


@settings(max_examples=200, deadline=None, derandomize=True, database=None)
@given(st.lists(st.integers(-3, 3), min_size=1, max_size=60))
def test_decode_shape_inverts_the_encoding(steps):
    """Integer-valued shapes (exact in float64) encoded as Pulseq does decode to themselves, as rf.decompress_shape
    decodes them."""
    samples = np.cumsum(np.array(steps, dtype=np.float64))
    packed = _encode(samples)
    if len(packed) >= samples.size:  # stored uncompressed, as pypulseq does when compression does not pay
        packed = list(samples)
    np.testing.assert_array_equal(decode_shape(np.array(packed), samples.size), samples)
    np.testing.assert_array_equal(decompress_shape(packed, samples.size), samples.astype(np.float32))


# -- property-based: random damage ---------------------------------------------------------------------------
TOKENS = ["nan", "inf", "-inf", "-1", "0", "1e308", "-1e308", "1e300", "1e200", "1e-320", "99999999999999999999", "x",
          "#", "[RF]", "[SHAPES]", "shape_id", "num_samples", "e", "1.5", "-0", "", "extension", "TRSize", "0x10",
          "1_0"]


@st.composite
def damaged(draw) -> str:
    lines = TINY.split("\n")
    for _ in range(draw(st.integers(1, 3))):
        i = draw(st.integers(0, len(lines) - 1))
        how = draw(st.sampled_from(["token", "delete", "duplicate", "insert", "swap"]))
        if how == "token" and lines[i].split():
            parts = lines[i].split()
            j = draw(st.integers(0, len(parts) - 1))
            parts[j] = draw(st.one_of(st.sampled_from(TOKENS), st.integers(-10**20, 10**20).map(str),
                                      st.floats(allow_nan=True).map(repr), st.text(max_size=4)))
            lines[i] = " ".join(parts)
        elif how == "delete":
            del lines[i]
        elif how == "duplicate":
            lines.insert(i, lines[i])
        elif how == "insert":
            lines.insert(i, draw(st.one_of(st.sampled_from(TOKENS), st.text(max_size=12))))
        else:
            k = draw(st.integers(0, len(lines) - 1))
            lines[i], lines[k] = lines[k], lines[i]
        if not lines:
            lines = [""]
    return "\n".join(lines)


@settings(max_examples=300, deadline=2000, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(damaged())
def test_damaged_files_read_or_raise_value_error(text):
    """Whatever the damage, the reader returns a description or raises ValueError; nothing else escapes, and
    each read takes well under the 2 s deadline (no hang)."""
    try:
        read(text)
    except ValueError:
        pass


FULL = [(e.type, e.timestamp_us, e.params) for e in read(TINY).events]


@settings(max_examples=150, deadline=2000, derandomize=True, database=None)
@given(st.integers(0, len(TINY) - 1))
def test_cut_files_raise_or_read_whole(cut):
    """A file cut anywhere is refused (ValueError), or reads exactly as the whole file (a cut in trailing
    blank lines only): never a description read in part."""
    try:
        description = read(TINY[:cut])
    except ValueError:
        return
    assert [(e.type, e.timestamp_us, e.params) for e in description.events] == FULL


@settings(max_examples=40, deadline=5000, derandomize=True, database=None)
@given(st.integers(0, 10**9), st.sampled_from([b"\x00", b"\xff", b"9", b"-", b"\n", b" ", b"[", b"#", b"."]))
def test_damaged_bytes_of_a_real_file(seed, byte):
    """One byte of a pypulseq file changed (signature removed, so the change is read, not caught by the md5):
    a description or a ValueError."""
    data = path("epi_v15").read_bytes()
    data = data[:data.index(b"\n[SIGNATURE]")] + b"\n"
    at = seed % len(data)
    try:
        read(data[:at] + byte + data[at + 1:])
    except ValueError:
        pass
