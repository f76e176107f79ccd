"""Every measured time in README.md names its record under benchmarks/results/ and equals it.

A paragraph that quotes a time (a number followed by "ms" or "s") must cite at least one results file, and
each quoted time must match a value in the cited files at the precision printed (files hold seconds or
milliseconds; both scales are tried). Numbers inside code blocks are examples, not measurements.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TIME = re.compile(r"(?<![\w.])(\d+(?:\.\d+)?) (ms|s)\b")
CITED = re.compile(r"benchmarks/results/([\w.\-/]+\.json)")


def _paragraphs(text: str) -> list[str]:
    prose = re.sub(r"```.*?```", "", text, flags=re.S)
    return [p for p in re.split(r"\n\s*\n", prose) if p.strip()]


def _numbers(node) -> list[float]:
    if isinstance(node, dict):
        return [x for v in node.values() for x in _numbers(v)]
    if isinstance(node, list):
        return [x for v in node for x in _numbers(v)]
    return [float(node)] if isinstance(node, (int, float)) and not isinstance(node, bool) else []


def _matches(quoted: str, unit: str, values: list[float]) -> bool:
    decimals = len(quoted.split(".")[1]) if "." in quoted else 0
    half_step = 0.5 * 10.0**-decimals * (1 + 1e-9)
    target = float(quoted)
    scales = (1.0, 1e3) if unit == "ms" else (1.0, 1e-3)  # a file's value in its own unit, or the other one
    return any(abs(v * s - target) <= half_step for v in values for s in scales)


def test_readme_times_name_their_record_and_equal_it():
    problems = []
    for paragraph in _paragraphs((ROOT / "README.md").read_text()):
        times = TIME.findall(paragraph)
        if not times:
            continue
        files = CITED.findall(paragraph)
        if not files:
            problems.append(f"no results file cited for {times} in: {paragraph[:80]!r}")
            continue
        values = []
        for name in files:
            path = ROOT / "benchmarks" / "results" / name
            if not path.exists():
                problems.append(f"cited record {name} does not exist")
                continue
            values += _numbers(json.loads(path.read_text()))
        problems += [f"{q} {u} is not in {files}" for q, u in times if not _matches(q, u, values)]
    assert not problems, "\n".join(problems)
