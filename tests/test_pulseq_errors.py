"""Malformed, truncated and hostile Pulseq files: a clear ValueError that names the section and line, never a
crash, a hang or a description read in part.

The cases edit the hand-written file of _pulseq_files.TINY (or a shipped example) one fault at a time; the
property-based tests of tests/test_pulseq_fuzz.py mutate it at random and cut it anywhere.
"""

from __future__ import annotations

import re
import time

import pytest
from _pulseq_files import TINY, path, signed
from _pulseq_files import read_quietly as read

from blochsim.sequence import read_pulseq_description
from blochsim.sequence._pulseq_file import MAX_SHAPE_SAMPLES


def edit(old: str, new: str, text: str = TINY) -> str:
    assert text.count(old) == 1, old
    return text.replace(old, new)


def line_of(text: str, row: str) -> int:
    """The 1-based line of `row` in `text` (which must hold it once)."""
    assert text.count(row) == 1, row
    return text[:text.index(row)].count("\n") + 1


UNEVEN = edit("2 250 1 2 0 50", "2 250 1 2 3 50", edit("1 250 1 2 0 50", "1 250 1 2 3 50")) + \
    "shape_id 3\nnum_samples 100\n0\n1\n1\n96\n2\n"  # sample times 0, 1, ..., 98, then 100: one step of 2

CASES = {  # name: (file text, what the message must say)
    "version 2": (edit("major 1", "major 2"), r"\[VERSION\] says 2\.5\.0; this reader takes Pulseq 1\.4 and 1\.5"),
    "version 1.3": (edit("minor 5", "minor 3"), r"says 1\.3\.0"),
    "no version": (edit("[VERSION]\nmajor 1\nminor 5\nrevision 0\n", ""), r"no \[VERSION\] section"),
    "half a version": (edit("revision 0\n", ""), r"\[VERSION\] \(line 2\) does not give revision"),
    "no blocks": (TINY[:TINY.index("# NUM DUR")] + TINY[TINY.index("# id ampl."):], r"no \[BLOCKS\] section"),
    "no RF section": (TINY[:TINY.index("# id ampl.")] + TINY[TINY.index("# id amplitude rise"):],
                      r"\[BLOCKS\] line 15: block 1 plays RF event 1, but the file has no \[RF\] section"),
    "no shapes": (TINY[:TINY.index("[SHAPES]")], r"uses shape 1, but the file has no \[SHAPES\] section"),
    "NaN shape sample": (edit("0\n0\n98\n", "0\nnan\n98\n"), r"\[SHAPES\] line 52: shape_id 2 has 'nan' where"),
    "NaN amplitude": (edit("2 250 1 2 0 50 0 0 0 0 1.5 e", "2 nan 1 2 0 50 0 0 0 0 1.5 e"),
                      r"\[RF\] line 27: amplitude_hz is nan; it must be a finite number"),
    "a word for a number": (edit("3 50000 100 800 100 0", "3 50000 100 eight 100 0"),
                            r"\[TRAP\] line 33: flat_us is 'eight', not a number"),
    "1 GB shape": (edit("num_samples 100\n1\n", "num_samples 134217728\n1\n"),
                   rf"\[SHAPES\] line 43: shape_id 1 declares 134217728 samples; this reader takes at most "
                   rf"{MAX_SHAPE_SAMPLES}"),
    "absurd block number": (edit("4 100 0 0 0 3 0 0", "4000000000000 100 0 0 0 3 0 0"),
                            r"\[BLOCKS\] line 18: block 4000000000000 comes where block 4 belongs"),
    "absurd TRSize": (edit("TRSize 4", "TRSize 1000000000000"), r"TRSize 1000000000000 does not divide the 8 blocks"),
    "block count off": (edit("8 100 0 0 0 3 0 0\n", ""), r"TRSize 4 does not divide the 7 blocks"),
    "no TRSize": (edit("TRSize 4\n", ""), r"\[DEFINITIONS\] has no TRSize"),
    "no block raster": (edit("BlockDurationRaster 1e-05\n", ""), r"no BlockDurationRaster"),
    "negative raster": (edit("RadiofrequencyRasterTime 1e-06", "RadiofrequencyRasterTime -1e-06"),
                        r"\[DEFINITIONS\] line 10: RadiofrequencyRasterTime must be a positive number"),
    "short row": (edit("3 60 0 2 0 0 1 0", "3 60 0 2 0 0 1"), r"\[BLOCKS\] line 17: expected 8 columns"),
    "fractional id": (edit("3 60 0 2 0 0 1 0", "3 60 0 2.5 0 0 1 0"), r"\[BLOCKS\] line 17: gx is '2\.5'; it must be "
                                                                     r"a whole number"),
    "missing event": (edit("7 60 0 2 0 0 2 0", "7 60 0 2 0 0 9 0"),
                      r"\[BLOCKS\] line 21: block 7 plays ADC event 9, but \[ADC\] does not define it"),
    "duplicate id": (edit("2 8 50000 100 0 0 0 1.5 0", "1 8 50000 100 0 0 0 1.5 0"),
                     r"\[ADC\] defines id 1 twice: line 37 and line 38"),
    "unknown section": (edit("[TRAP]", "[TRAPS]"), r"line 30: unknown section \[TRAPS\]"),
    "duplicate section": (TINY + "[VERSION]\nmajor 1\nminor 5\nrevision 0\n", r"\[VERSION\] appears twice"),
    "broken header": (edit("[ADC]", "[ADC"), r"line 36: '\[ADC' is not a section header"),
    "delays of 1.3": (TINY + "[DELAYS]\n1 100\n", r"\[DELAYS\] \(line 55\) belongs to Pulseq 1\.3 and older"),
    "cut mid-line": (TINY[:-30], r"ends mid-line \(line \d+, '[^']*'\) with no line break"),
    "cut before the shapes": (TINY[:TINY.index("[SHAPES]")], r"the file has no \[SHAPES\] section"),
    "cut inside a shape": (TINY[:TINY.index("97\n")], r"shape_id 1 \(line 42\): it is truncated: the repeated value"),
    "count past the end": (edit("0\n0\n98\n", "0\n0\n99\n"), r"it decodes to more than num_samples = 100"),
    "repeat without count": (edit("0\n0\n98\n", "0\n0\n"), r"it is truncated: the repeated value 0\.0 at entry 0"),
    "RF and ADC in a block": (edit("3 60 0 2 0 0 1 0", "3 60 1 2 0 0 1 0"),
                              r"\[BLOCKS\] line 17: block 3 plays an RF pulse and a readout"),
    "readout past its block": (edit("3 60 0 2 0 0 1 0", "3 40 0 2 0 0 1 0"),
                               r"\[BLOCKS\] line 17: block 3 lasts 400 us, but its readout \(line 37\) runs to 500 us"),
    "pulse past its block": (edit("1 10 1 0 0 0 0 0", "1 5 1 0 0 0 0 0"), r"block 1 lasts 50 us, but its RF pulse"),
    "uneven time shape": (UNEVEN, r"\[RF\] line 26 \(RF event 1\): its time shape spaces the samples unevenly"),
    "no readout": (edit("1 8 50000 100 0 0 0 0 0\n", "").replace(" 0 2 0 0 1 0\n", " 0 2 0 0 0 0\n")
                   .replace(" 0 2 0 0 2 0\n", " 0 2 0 0 0 0\n").replace("2 8 50000 100 0 0 0 1.5 0\n", ""),
                   r"no repetition holds a readout: give tr_index="),
    "different pulses": (edit("2 250 1 2 0 50 0 0 0 0 1.5 e", "2 500 1 2 0 50 0 0 0 0 1.5 e"),
                         r"repetition 0 and repetition 1 differ at block 1 and block 5 \(lines 15 and 19\); "
                         r"give tr_index="),
    "zero-area excitation": (edit("1\n0\n0\n97\n", "0\n0\n98\n"), r"\[RF\] line 26 \(RF event 1\): the pulse has no "
                                                                 r"area"),
    "ppm without B0": (edit("1 250 1 2 0 50 0 0 0 0 0 e", "1 250 1 2 0 50 0 3.5 0 0 0 e"),
                       r"\[RF\] line 26: an offset in ppm needs the field strength; the file gives no B0"),
    "bad use letter": (edit("2 250 1 2 0 50 0 0 0 0 1.5 e", "2 250 1 2 0 50 0 0 0 0 1.5 x"),
                       r"\[RF\] line 27: the last column is the pulse's use, one of the letters"),
    "text before the version": ("hello\n" + TINY, r"line 1 \('hello'\) comes before any section"),
    "empty file": ("\n\n", r"the file is empty"),
    "overflowing flip": (edit("1\n0\n0\n97\n", "100000\n0\n0\n97\n").replace("250 1 2 0 50", "1e308 1 2 0 50"),
                         r"\[RF\] line 26: the flip_rad worked out from this row is inf"),
    "overflowing shape": (edit("1\n0\n0\n97\n", "1e300\n0\n0\n97\n"), r"the pulse's samples overflow a float64"),
}


@pytest.mark.parametrize("name", list(CASES))
def test_bad_file_names_section_and_line(name):
    text, message = CASES[name]
    with pytest.raises(ValueError, match=message):
        read(text)


def test_line_numbers_are_the_files():
    """The lines the messages quote are those of the text (checked once here, against the rows themselves)."""
    assert line_of(TINY, "3 60 0 2 0 0 1 0") == 17
    assert line_of(TINY, "2 250 1 2 0 50 0 0 0 0 1.5 e") == 27
    assert line_of(TINY, "3 50000 100 800 100 0") == 33
    assert line_of(TINY, "[TRAP]") == 30
    assert line_of(TINY, "[ADC]") == 36


def test_not_text():
    data = TINY.encode().replace(b"[RF]", b"[R\xff]")
    with pytest.raises(ValueError, match=r"line 25 is not text \(byte \d+ is not UTF-8\)"):
        read(data)


def test_signature_must_match():
    good = signed(TINY)
    read(good)
    tampered = good.replace(b"1 250 1 2 0 50", b"1 350 1 2 0 50")
    with pytest.raises(ValueError, match=r"\[SIGNATURE\] line \d+: the file's md5 is [0-9a-f]{32}, its signature says"):
        read(tampered)
    cut = good[:good.rindex(b"Hash")]
    with pytest.raises(ValueError, match=r"\[SIGNATURE\] \(line \d+\) has no Hash line"):
        read(cut)


def test_signed_example_changed_by_one_digit_is_refused():
    data = path("gre_v15").read_bytes()
    at = data.index(b"[SHAPES]") + 200
    while not data[at:at + 1].isdigit():
        at += 1
    digit = data[at:at + 1]
    changed = data[:at] + (b"1" if digit != b"1" else b"2") + data[at + 1:]
    with pytest.raises(ValueError, match="md5"):
        read(changed)


def test_huge_declarations_fail_fast():
    """A 1 GB shape and an absurd repeat count are refused before anything is allocated."""
    start = time.perf_counter()
    for text in (CASES["1 GB shape"][0], edit("0\n0\n98\n", "0\n0\n1e15\n")):
        with pytest.raises(ValueError):
            read(text)
    assert time.perf_counter() - start < 1.0  # a refusal, not an allocation of gigabytes


def test_tr_index_is_checked():
    for bad in (2, -1, 1.0, True, "0"):
        with pytest.raises(ValueError, match=r"tr_index must be an int from 0 to 1 \(the file holds 2 repetitions"):
            read_pulseq_description(TINY.encode(), tr_index=bad)
    with pytest.raises(ValueError, match=r"TRRef 2 is past the last repetition"):
        read(edit("TRSize 4", "TRSize 4\nTRRef 2"))


def test_unknown_extension_is_named_in_a_warning():
    text = edit("[SHAPES]", "extension TRIGGERS 1\n1 2 0 0 100\n\nextension SOFTDELAY 2\n1 0 0 1 TE\n\n[SHAPES]")
    with pytest.warns(UserWarning, match="extensions are not read: TRIGGERS, SOFTDELAY"):
        read_pulseq_description(text.encode())


def test_messages_name_a_line_that_exists():
    """Every message from the damage above that names a line names one inside the file."""
    for name, (text, _) in CASES.items():
        try:
            read(text)
        except ValueError as error:
            for number in re.findall(r"line (\d+)", str(error)):
                assert 1 <= int(number) <= text.count("\n") + 1, (name, str(error))
