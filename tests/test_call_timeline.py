"""benchmarks/call_timeline.py reads a recorded trace into the timeline the records quote: the second call of the
H200's 2k real gradient (benchmarks/results/profile/torch-profiler-epg_real_grad-2000-H200-2026-12-05-0b7da90.*),
whose adjoint kernel started 3.64 ms into a 6.45 ms call and ran 2.79 ms."""

from __future__ import annotations

import json
import lzma
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from call_timeline import timeline  # noqa: E402

PROFILE = ROOT / "benchmarks/results/profile"


def test_timeline_of_a_recorded_gradient_call():
    trace = json.loads(lzma.open(PROFILE / "torch-profiler-epg_real_grad-2000-H200-2026-12-05-0b7da90.json.xz").read())
    rows = timeline(trace)
    assert rows[0] == "wall 6.446 ms"
    adjoint = [r for r in rows if "vjp_kernel" in r]
    assert len(adjoint) == 1 and adjoint[0].split()[1] == "3.639" and "+  2.785" in adjoint[0]
    # The printed record holds the same rows.
    printed = (PROFILE / "torch-profiler-timelines-H200-2026-12-05-0b7da90.txt").read_text()
    assert all(r in printed for r in rows[1:])
