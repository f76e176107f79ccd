"""Pulseq files for the tests: the shipped examples (tests/data/pulseq), pypulseq's reading of each, a tiny
file written by hand whose events are known exactly, and the 100k-block GRE of benchmarks/pulseq_read.py.
"""

from __future__ import annotations

import hashlib
import json
import math
import warnings
from pathlib import Path

DATA = Path(__file__).resolve().parent / "data" / "pulseq"
#: The example sequences, each written by pypulseq 1.4.2 (format 1.4) and 1.5 (format 1.5).
EXAMPLES = ("gre", "tse", "epi", "bssfp", "mprage")
FILES = tuple(f"{name}_{version}" for name in EXAMPLES for version in ("v14", "v15"))


def path(name: str) -> Path:
    return DATA / f"{name}.seq"


def view(name: str) -> dict:
    """pypulseq 1.5's reading of `name` (make_seq_files.py, pypulseq_view)."""
    return json.loads((DATA / f"{name}.json").read_text())


#: A Pulseq 1.5 file written by hand: two repetitions (TRSize 4) of a 100 us hard pulse (250 Hz: a flip of
#: 2 pi 250 Hz x 100 us = pi/20 rad), a read prephaser of area -2.5 /m, a readout trapezoid (10 kHz/m, 100 us
#: ramps, 400 us flat top, area 5 /m) with 8 samples of 50 us from 100 us into its block, and a spoiler. k
#: crosses 0 in the middle of the flat top, 300 us into the readout block, 4 dwells after the readout's
#: start: the readouts are at 400 + 300 = 700 us and 2700 us. The second pulse and readout have phase 1.5 rad.
TINY = """# Pulseq sequence file, written by hand for the tests
[VERSION]
major 1
minor 5
revision 0

[DEFINITIONS]
BlockDurationRaster 1e-05
GradientRasterTime 1e-05
RadiofrequencyRasterTime 1e-06
TRSize 4

# NUM DUR RF  GX  GY  GZ  ADC  EXT
[BLOCKS]
1 10 1 0 0 0 0 0
2 30 0 1 0 0 0 0
3 60 0 2 0 0 1 0
4 100 0 0 0 3 0 0
5 10 2 0 0 0 0 0
6 30 0 1 0 0 0 0
7 60 0 2 0 0 2 0
8 100 0 0 0 3 0 0

# id ampl. mag_id phase_id time_shape_id center delay freqPPM phasePPM freq phase use
[RF]
1 250 1 2 0 50 0 0 0 0 0 e
2 250 1 2 0 50 0 0 0 0 1.5 e

# id amplitude rise flat fall delay
[TRAP]
1 -12500 100 100 100 0
2 10000 100 400 100 0
3 50000 100 800 100 0

# id num dwell delay freqPPM phasePPM freq phase phase_id
[ADC]
1 8 50000 100 0 0 0 0 0
2 8 50000 100 0 0 0 1.5 0

[SHAPES]

shape_id 1
num_samples 100
1
0
0
97

shape_id 2
num_samples 100
0
0
98

"""
TINY_EVENTS_US = {"rf": (50.0, 2050.0), "adc": (700.0, 2700.0), "tr": 2000.0, "flip_rad": math.pi / 20}


def read_quietly(text):
    """`read_pulseq_description` of a text or bytes, warnings (unread extensions) silenced."""
    from blochsim.sequence import read_pulseq_description

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return read_pulseq_description(text.encode() if isinstance(text, str) else text)


def signed(text: str) -> bytes:
    """`text` with an md5 [SIGNATURE] as pypulseq writes one."""
    body = text.encode()
    return body + f"\n[SIGNATURE]\nType md5\nHash {hashlib.md5(body).hexdigest()}\n".encode()


def _section(text: str, name: str) -> tuple[str, str, str]:
    """(text before a section's rows, its rows, text after) for a section of a pypulseq-written file."""
    start = text.index(f"[{name}]\n") + len(name) + 3
    end = text.index("\n\n", start)
    return text[:start], text[start:end], text[end:]


def long_gre(blocks: int = 100_000) -> bytes:
    """The GRE example (gre_v15.seq, pypulseq's write_gre.py) played for `blocks` / 5 repetitions of its 5
    blocks, signed: every repetition gets its own RF and ADC rows (the RF-spoiling phase, 117 degree
    increments, as write_gre.py makes them) and its own phase encode and rewinder (256 lines cycled), so
    the event tables grow with the blocks as in a real long scan."""
    text = path("gre_v15").read_text()
    text = text[:text.index("\n[SIGNATURE]")]
    head, rows, _ = _section(text, "BLOCKS")
    window = [r.split() for r in rows.split("\n")[:5]]
    _, rf_rows, _ = _section(text, "RF")
    _, adc_rows, _ = _section(text, "ADC")
    _, trap_rows, _ = _section(text, "TRAP")
    rf_proto, adc_proto = rf_rows.split("\n")[0].split(), adc_rows.split("\n")[0].split()
    traps = [r.split() for r in trap_rows.split("\n")]
    pe_proto = next(t for t in traps if t[0] == window[1][4])  # the first phase encode's trapezoid
    next_trap = max(int(t[0]) for t in traps) + 1
    block_lines, rf_lines, adc_lines, trap_lines = [], [], [], [" ".join(t) for t in traps]
    pe_ids = []
    for line in range(256):  # phase encodes and their rewinders
        for sign in (1, -1):
            amplitude = float(pe_proto[1]) * sign * (line - 128) / 128
            trap_lines.append(" ".join([str(next_trap), f"{amplitude:g}"] + pe_proto[2:]))
            pe_ids.append(next_trap)
            next_trap += 1
    phase_deg = increment_deg = 0.0
    for r in range(blocks // 5):
        phase = math.radians(phase_deg)
        rf_lines.append(" ".join([str(r + 1)] + rf_proto[1:10] + [f"{phase:g}", rf_proto[11]]))
        adc_lines.append(" ".join([str(r + 1)] + adc_proto[1:7] + [f"{phase:g}", adc_proto[8]]))
        increment_deg = (increment_deg + 117) % 360
        phase_deg = (phase_deg + increment_deg) % 360
        for k, row in enumerate(window):
            row = list(row)
            row[0] = str(5 * r + k + 1)
            if k == 0:
                row[2] = str(r + 1)
            elif k == 1:
                row[4] = str(pe_ids[2 * (r % 256)])
            elif k == 3:
                row[6] = str(r + 1)
            elif k == 4:
                row[4] = str(pe_ids[2 * (r % 256) + 1])
            block_lines.append(" ".join(row))
    text = head + "\n".join(block_lines) + text[text.index("\n\n", len(head)):]
    for name, lines in (("RF", rf_lines), ("ADC", adc_lines), ("TRAP", trap_lines)):
        before, _, after = _section(text, name)
        text = before + "\n".join(lines) + after
    return signed(text)
