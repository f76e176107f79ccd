"""benchmarks/sass_regions.py's reading of ncu's SASS source page (no card or CUDA tools needed): executed
counts, samples and stall reasons per instruction offset, and a statement's largest stall reasons."""

from __future__ import annotations

import collections
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
import sass_regions  # noqa: E402

PAGE = "\n".join([
    '"Kernel Name","void bs::vjp_warp_kernel<float, float, (int)4, (int)35, (int)8, float>(...)",',
    '"Address","Source","Warp Stall Sampling (All Samples)","Instructions Executed","stall_long_sb","stall_wait",'
    '"stall_long_sb (Not Issued)"',
    '"0x7f0000000100","LDG.E R2, [R4.64]","1,200","4,224","1,000","200","900"',
    '"0x7f0000000110","FFMA R2, R2, R3, R2","30","4,224","0","30","0"',
    ""])


def test_executed_counts_read_offsets_samples_and_stall_reasons(tmp_path):
    """Offsets count from the page's first address; numbers with thousands separators are read; a stall column
    of the not-issued samples is not a reason of its own."""
    page = tmp_path / "source.csv"
    page.write_text(PAGE)
    counts = sass_regions.executed_counts(page)
    assert set(counts) == {0x0, 0x10}
    executed, samples, reasons = counts[0x0]
    assert (executed, samples) == (4224.0, 1200.0)
    assert reasons == {"long_sb": 1000.0, "wait": 200.0}
    assert counts[0x10][2] == {"long_sb": 0.0, "wait": 30.0}


def test_top_stalls_gives_each_reason_its_share_of_the_statement():
    c = collections.Counter({"executed": 10, "stall long_sb": 300, "stall wait": 100, "stall math": 0})
    assert sass_regions.top_stalls(c) == "long_sb 75, wait 25"
    assert sass_regions.top_stalls(collections.Counter({"executed": 3})) == ""
