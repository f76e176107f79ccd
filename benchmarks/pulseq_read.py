"""Time `read_pulseq_description` on a 100k-block Pulseq file (issue 25: under 1 s on the 2-core machine).

The file is the shipped GRE example (tests/data/pulseq/gre_v15.seq, pypulseq's write_gre.py) played for
20,000 repetitions of its 5 blocks: every repetition gets its own RF and ADC rows (the RF-spoiling
phase, 117 degree increments, as write_gre.py makes them) and its own phase-encoding gradients (256
lines cycled), so the event tables grow with the blocks as in a real long scan; the file is signed
(md5), so the signature check is timed too. `tests/test_pulseq_speed.py` builds the same file.

Reported: the median and least of `--rounds` reads (each a fresh parse of the bytes already in memory
and from the file on disk), and pypulseq's `Sequence.read` of the same file once when pypulseq is
installed (`--pypulseq`). Writes a new benchmarks/results/pulseq_read-<machine>-<date>-<commit>.json.

    python benchmarks/pulseq_read.py [--blocks 100000] [--rounds 7] [--pypulseq]
"""

from __future__ import annotations

import argparse
import hashlib
import math
import os
import platform
import statistics
import sys
import tempfile
import time
import warnings
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GRE = ROOT / "tests" / "data" / "pulseq" / "gre_v15.seq"


def section(text: str, name: str) -> tuple[str, str, str]:
    """(text before the section's rows, its rows, text after), for a section of a pypulseq-written file."""
    start = text.index(f"[{name}]\n") + len(name) + 3
    end = text.index("\n\n", start)
    return text[:start], text[start:end], text[end:]


def long_gre(blocks: int) -> bytes:
    """The GRE example tiled to `blocks` blocks (a multiple of its 5 blocks per repetition), signed."""
    text = GRE.read_text()
    text = text[:text.index("\n[SIGNATURE]")]
    repetitions = blocks // 5
    head, rows, _ = section(text, "BLOCKS")
    window = [r.split() for r in rows.split("\n")[:5]]
    _, rf_rows, _ = section(text, "RF")
    _, adc_rows, _ = section(text, "ADC")
    _, trap_rows, _ = section(text, "TRAP")
    rf_proto, adc_proto = rf_rows.split("\n")[0].split(), adc_rows.split("\n")[0].split()
    traps = [r.split() for r in trap_rows.split("\n")]
    pe_proto = next(t for t in traps if t[0] == window[1][4])  # the first phase encode's trapezoid
    next_trap = max(int(t[0]) for t in traps) + 1
    block_lines, rf_lines, adc_lines, trap_lines = [], [], [], [" ".join(t) for t in traps]
    phase_deg = increment_deg = 0.0
    pe_ids = []
    for line in range(256):  # phase encodes and their rewinders, scaled as write_gre.py scales them
        for sign in (1, -1):
            amplitude = float(pe_proto[1]) * sign * (line - 128) / 128
            trap_lines.append(" ".join([str(next_trap), f"{amplitude:g}"] + pe_proto[2:]))
            pe_ids.append(next_trap)
            next_trap += 1
    for r in range(repetitions):
        phase = math.radians(phase_deg)
        rf_lines.append(" ".join([str(r + 1)] + rf_proto[1:10] + [f"{phase:g}", rf_proto[11]]))
        adc_lines.append(" ".join([str(r + 1)] + adc_proto[1:7] + [f"{phase:g}", adc_proto[8]]))
        increment_deg = (increment_deg + 117) % 360
        phase_deg = (phase_deg + increment_deg) % 360
        pe, rewind = pe_ids[2 * (r % 256)], pe_ids[2 * (r % 256) + 1]
        for k, row in enumerate(window):
            row = list(row)
            row[0] = str(5 * r + k + 1)
            if k == 0:
                row[2] = str(r + 1)
            if k == 1:
                row[4] = str(pe)
            if k == 3:
                row[6] = str(r + 1)
            if k == 4:
                row[4] = str(rewind)
            block_lines.append(" ".join(row))
    text = head + "\n".join(block_lines) + text[text.index("\n\n", len(head)):]
    for name, lines in (("RF", rf_lines), ("ADC", adc_lines), ("TRAP", trap_lines)):
        before, _, after = section(text, name)
        text = before + "\n".join(lines) + after
    body = text.encode()
    signature = hashlib.md5(body).hexdigest()
    return body + f"\n[SIGNATURE]\nType md5\nHash {signature}\n".encode()


def machine_name() -> str:
    model = "cpu"
    if Path("/proc/cpuinfo").exists():
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return f"{model}-{os.cpu_count()}cpu"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--pypulseq", action="store_true", help="also time pypulseq's reader once")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    from blochsim.sequence import read_pulseq_description

    data = long_gre(args.blocks)
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "gre_long.seq"
        path.write_bytes(data)
        memory, disk = [], []
        for _ in range(args.rounds):
            for source, times in ((data, memory), (path, disk)):
                start = time.perf_counter()
                description = read_pulseq_description(source)
                times.append(time.perf_counter() - start)
        record = {"task": "pulseq_read", "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                  "machine": machine_name(), "platform": platform.platform(), "python": platform.python_version(),
                  "blocks": args.blocks, "bytes": len(data), "rounds": args.rounds,
                  "events": len(description.events),
                  "read_bytes_s": {"median": statistics.median(memory), "least": min(memory)},
                  "read_path_s": {"median": statistics.median(disk), "least": min(disk)}}
        if args.pypulseq:
            import pypulseq as pp

            start = time.perf_counter()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                pp.Sequence().read(str(path))
            record["pypulseq_read_s"] = time.perf_counter() - start
            record["pypulseq"] = pp.__version__
    from _records import write_record

    print({k: v for k, v in record.items() if k not in ("platform",)})
    print(write_record(args.out, "pulseq_read", record["machine"], record))


if __name__ == "__main__":
    main()
