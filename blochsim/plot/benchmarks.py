"""Benchmark ratios: each case's time over a reference time (the incumbent's, or another build's)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from ._figure import new_axis

__all__ = ["benchmark_ratios"]


def _rows(results: Any) -> list:
    """The result rows of a record: a path to a benchmark JSON record, a record dict, or a list of rows."""
    if isinstance(results, (str, Path)):
        path = Path(results)
        try:
            results = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise ValueError(f"cannot read benchmark record {str(path)!r}: {exc}") from None
    if isinstance(results, dict):
        if "results" not in results:
            raise ValueError("a benchmark record must hold a 'results' list of rows")
        results = results["results"]
    return list(results)


def _ratio(row: dict) -> float | None:
    for key in ("ratio", "time_ratio"):
        if row.get(key) is not None:
            return float(row[key])
    if row.get("median_ms") is not None and row.get("incumbent_ms"):
        return float(row["median_ms"]) / float(row["incumbent_ms"])
    return None


def benchmark_ratios(results: Any, *, axis: Any = None, reference: str = "the incumbent",
                     title: str | None = None) -> Any:
    """Draw each benchmark case's time as a fraction of its reference's, one bar per case; returns the axis.

    `results`: a benchmark record (a path to one of benchmarks/results/*.json, or its dict) or a list of rows,
    each with `case`, `n` and a `ratio` (or `time_ratio`, or `median_ms` and `incumbent_ms`). Rows without a
    ratio are left out of the figure (they have no reference time). A line marks 1 (level with the
    reference); bars below it are faster. Raises ValueError when no row has a ratio.
    """
    rows = [(f"{row['case']} {row['n']:,}", _ratio(row)) for row in _rows(results)]
    rows = [(name, ratio) for name, ratio in rows if ratio is not None]
    if not rows:
        raise ValueError("no benchmark row has a reference time to take a ratio to (rows need 'ratio', "
                         "'time_ratio', or 'median_ms' with 'incumbent_ms')")
    axis = new_axis(axis, "blochsim.plot.benchmark_ratios")
    names = [name for name, _ in rows]
    ratios = np.array([ratio for _, ratio in rows])
    positions = np.arange(len(rows))
    axis.barh(positions, ratios, color=["tab:green" if r <= 1 else "tab:red" for r in ratios])
    axis.axvline(1.0, color="k", lw=1)
    axis.set_yticks(positions, names)
    axis.invert_yaxis()
    axis.set_xlabel(f"time / time of {reference}")
    for y, r in zip(positions, ratios, strict=True):
        axis.annotate(f"{r:.2f}", (r, y), xytext=(3, 0), textcoords="offset points", va="center", fontsize="small")
    if title:
        axis.set_title(title)
    axis.figure.tight_layout()
    return axis
