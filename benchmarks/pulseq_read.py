"""Time `read_pulseq_description` on a 100k-block Pulseq file (issue 25: under 1 s on the 2-core machine).

The file is the shipped GRE example (tests/data/pulseq/gre_v15.seq, pypulseq's write_gre.py) played for
20,000 repetitions of its 5 blocks: every repetition gets its own RF and ADC rows (the RF-spoiling
phase, 117 degree increments, as write_gre.py makes them) and its own phase-encoding gradients (256
lines cycled), so the event tables grow with the blocks as in a real long scan; the file is signed
(md5), so the signature check is timed too. The file is built by tests/_pulseq_files.py (long_gre), which
tests/test_pulseq.py reads too.

Reported: the median and least of `--rounds` reads (each a fresh parse of the bytes already in memory
and from the file on disk), and pypulseq's `Sequence.read` of the same file once when pypulseq is
installed (`--pypulseq`). Writes a new benchmarks/results/pulseq_read-<machine>-<date>-<commit>.json.

    python benchmarks/pulseq_read.py [--blocks 100000] [--rounds 7] [--pypulseq]
"""

from __future__ import annotations

import argparse
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--pypulseq", action="store_true", help="also time pypulseq's reader once")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args()
    sys.path[:0] = [str(ROOT), str(ROOT / "tests")]
    from _pulseq_files import long_gre
    from _records import machine_name, write_record

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
                  "load_average_1min": os.getloadavg()[0], "blocks": args.blocks, "bytes": len(data),
                  "rounds": args.rounds,
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
    print({k: v for k, v in record.items() if k not in ("platform",)})
    print(write_record(args.out, "pulseq_read", record["machine"], record))


if __name__ == "__main__":
    main()
