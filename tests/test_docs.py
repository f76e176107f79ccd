"""The documentation site: every python block of docs/ runs, the site builds with warnings as errors, and no
shipped text sends users to a spec they do not have.

The python blocks of one page run in order in one namespace (a page reads top to bottom), in a temporary
working folder, with matplotlib's Agg backend. The build (`mkdocs build --strict`, which also draws each
simulator page's figure from its example: scripts/docs_hooks.py) skips only where mkdocs is not installed
(`pip install '.[docs]'`).
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
sys.path.insert(0, str(ROOT / "scripts"))
from docs_hooks import draws_a_figure, own_figure, python_blocks, shows_own_figure, with_record_tables  # noqa: E402

PAGES = sorted(p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md"))


def text(name: str) -> str:
    return (DOCS / name).read_text(encoding="utf-8")


PAGES_WITH_CODE = [name for name in PAGES if python_blocks(text(name))]


def test_pages_have_examples():
    # Guards the block pattern itself: a pattern that matched nothing would make every page pass.
    assert len(PAGES_WITH_CODE) >= 30, PAGES_WITH_CODE
    simulator_pages = [name for name in PAGES if name.startswith("simulators/") and name != "simulators/index.md"]
    assert len(simulator_pages) == 26 and all(draws_a_figure(name, text(name)) for name in simulator_pages)


def test_record_tables_and_cli_help_fill_in():
    # Every marker becomes its table or help text (a record that moved, or a command that went, fails here).
    pytest.importorskip("click")
    for name in PAGES:
        page = with_record_tables(text(name))
        assert "<!-- record-table" not in page and "<!-- cli-help" not in page, name


@pytest.mark.parametrize("name", PAGES_WITH_CODE)
def test_python_blocks_run(name, tmp_path, monkeypatch):
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    monkeypatch.chdir(tmp_path)
    code = "\n".join(python_blocks(text(name)))
    try:
        exec(compile(code, str(DOCS / name), "exec"), {"__name__": "__docs__"})
        if draws_a_figure(name, text(name)):
            assert plt.get_fignums(), f"docs/{name} shows {own_figure(name)} but draws no figure"
    finally:
        plt.close("all")


def test_site_builds_strict(tmp_path):
    if importlib.util.find_spec("mkdocs") is None:
        pytest.skip("mkdocs is not installed (pip install '.[docs]')")
    env = dict(os.environ, MPLBACKEND="Agg")
    run = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                         cwd=ROOT, env=env, capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr
    site = tmp_path / "site"
    for name in PAGES:
        if name == "index.md" or name.endswith("/index.md"):
            built = site / name.replace(".md", ".html")
        else:
            built = site / name[: -len(".md")] / "index.html"
        assert built.is_file(), f"{name} was not built"
        if shows_own_figure(name, text(name)):
            png = site / own_figure(name)
            assert png.stat().st_size > 5000, f"{png} is (nearly) empty"


# Shipped text: what a user reads (docstrings, comments next to the code, error messages, docs, README).
SHIPPED = ["blochsim", "csrc", "docs", "scripts", "examples", "benchmarks", "packages", "README.md", "CMakeLists.txt",
           "pyproject.toml", "mkdocs.yml"]
# The spec's file names and its markers of how a behaviour relates to the incumbent's.
SPEC_REFERENCE = re.compile(r"\b(API|DESIGN|PACKAGING|STYLE)\.md\b|§|\.\./shared/|\[(fix|compat|ours)\b")


def test_no_reference_to_specs_users_do_not_have():
    offenders = []
    for entry in SHIPPED:
        path = ROOT / entry
        files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
        for file in files:
            if file.suffix not in {".py", ".md", ".hpp", ".h", ".cpp", ".cu", ".cuh", ".inc", ".txt", ".toml",
                                   ".yml", ".sh", ".def"}:
                continue
            for number, line in enumerate(file.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
                if SPEC_REFERENCE.search(line):
                    offenders.append(f"{file.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not offenders, "shipped text cites a spec users do not have:\n" + "\n".join(offenders)
