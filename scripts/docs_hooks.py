"""Hooks of the documentation site (mkdocs.yml): figures and tables made at build time.

* A page that shows `![...](<page>.png)` (its own name) and has python blocks gets that figure from them:
  the build runs the page's python blocks in order, in one namespace, with matplotlib's Agg backend, and
  adds the figure they leave beside the page. The figure is the output of the code the reader sees (every
  simulator page ends its example by drawing with blochsim.plot).
* A page in RECORD_FIGURES gets its figure from recorded benchmark results instead (performance.md).
* `<!-- record-table: NAME.json -->` on a line of its own becomes the table of that record in
  benchmarks/results/ (case, tissues, median, the incumbent's time, the ratio), so a page quotes the file.
* `<!-- cli-help: COMMAND -->` becomes the `--help` of `blochsim COMMAND` (`-` for `blochsim` itself).

tests/test_docs.py runs every python block of every page on its own, without mkdocs, and builds the site
when mkdocs is installed. Run as a script, this writes the figures to a folder: `python scripts/docs_hooks.py
out/`.
"""

from __future__ import annotations

import io
import json
import re
import sys
from pathlib import Path

#: A fenced python block: ```python (with or without attributes) ... ```.
PYTHON_BLOCK = re.compile(r"^```python[^\n]*\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
RECORD_TABLE = re.compile(r"^<!-- record-table: ([\w.-]+\.json) -->[ \t]*$", re.MULTILINE)
CLI_HELP = re.compile(r"^<!-- cli-help: ([\w-]+) -->[ \t]*$", re.MULTILINE)


def python_blocks(markdown: str) -> list[str]:
    """The python code blocks of a page, in order."""
    return [m.group(1) for m in PYTHON_BLOCK.finditer(markdown)]


def own_figure(src_uri: str) -> str:
    """The name of a page's own figure, beside it: `simulators/mrf.md` -> `simulators/mrf.png`."""
    return src_uri[: -len(".md")] + ".png"


def shows_own_figure(src_uri: str, markdown: str) -> bool:
    """Whether the page (`src_uri` relative to docs/) shows its own figure, `![...](<page>.png)`."""
    return f"]({Path(own_figure(src_uri)).name})" in markdown


def draws_a_figure(src_uri: str, markdown: str) -> bool:
    """Whether the page's own figure is drawn by its python blocks (not from records)."""
    return shows_own_figure(src_uri, markdown) and src_uri not in RECORD_FIGURES


def _png(figure) -> bytes:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=90, bbox_inches="tight")
    return buffer.getvalue()


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def figure_png(page: Path, name: str) -> bytes:
    """Run the page's python blocks and return the PNG of the figure they draw. Raises RuntimeError when
    they draw none."""
    plt = _pyplot()
    plt.close("all")
    code = "\n".join(python_blocks(page.read_text(encoding="utf-8")))
    exec(compile(code, str(page), "exec"), {"__name__": "__docs__"})  # noqa: S102 - the page's own example
    if not plt.get_fignums():
        raise RuntimeError(f"docs/{name} shows {own_figure(name)}, but its python blocks draw no figure")
    png = _png(plt.gcf())
    plt.close("all")
    return png


def performance_png() -> bytes:
    """The recorded benchmark ratios to the incumbent: the CPU cases (2-core VM) and the H200 kernel cases."""
    import blochsim.plot

    plt = _pyplot()
    figure, (left, right) = plt.subplots(1, 2, figsize=(11, 5))
    blochsim.plot.benchmark_ratios(record_rows(CPU_RECORD), axis=left, title="CPU, 2 threads: time / the incumbent's")
    blochsim.plot.benchmark_ratios(RESULTS / GPU_RECORD, axis=right, title="H200 kernels: time / the incumbent's")
    figure.tight_layout()
    png = _png(figure)
    plt.close("all")
    return png


#: The records performance.md quotes and draws.
CPU_RECORD = "cpu_mrf_cases-AMD_EPYC-2cpu-2threads-2026-12-04-0385ce7.json"
GPU_RECORD = "kernel_cases-NVIDIA_H200-2026-12-04-54224ec.json"
#: Pages whose own figure is drawn from records, not from their python blocks.
RECORD_FIGURES = {"performance.md": performance_png}


def record_rows(name: str) -> list[dict]:
    """The rows of the record benchmarks/results/<name>, one per case. A record that alternates several
    builds (before and after a change) lists the one measured last last: its rows are taken."""
    record = json.loads((RESULTS / name).read_text())
    rows = record["results"]
    if rows and "variant" in rows[0]:
        rows = [row for row in rows if row["variant"] == record["variants"][-1]["name"]]
    return rows


def record_table(name: str) -> str:
    """A markdown table of the record benchmarks/results/<name> (`record_rows`)."""
    rows = record_rows(name)
    lines = ["| case | tissues | median (ms) | the incumbent (ms) | ratio |", "| --- | ---: | ---: | ---: | ---: |"]
    for row in rows:
        incumbent = row.get("incumbent_ms")
        ratio = f"{row['median_ms'] / incumbent:.2f}" if incumbent else ""
        lines.append(f"| {row['case']} | {row['n']:,} | {row['median_ms']:.2f} | {incumbent or ''} | {ratio} |")
    return "\n".join(lines)


def cli_help(command: str) -> str:
    """`blochsim COMMAND --help` as printed (`-`: `blochsim --help`), in a text block."""
    from click.testing import CliRunner

    from blochsim.cli import cli

    args = ["--help"] if command == "-" else [command, "--help"]
    result = CliRunner().invoke(cli, args, prog_name="blochsim", terminal_width=110)
    if result.exit_code != 0:
        raise RuntimeError(f"blochsim {' '.join(args)} exited {result.exit_code}: {result.output}")
    return "```text\n" + result.output.rstrip() + "\n```"


def with_record_tables(markdown: str) -> str:
    """The page with every `<!-- record-table: NAME.json -->` line replaced by that record's table and every
    `<!-- cli-help: COMMAND -->` by that command's help."""
    markdown = RECORD_TABLE.sub(lambda m: record_table(m.group(1)), markdown)
    return CLI_HELP.sub(lambda m: cli_help(m.group(1)), markdown)


def on_files(files, config):
    """mkdocs event: add each page's own figure beside it, drawn by its python blocks or from records."""
    from mkdocs.structure.files import File

    for page in list(files.documentation_pages()):
        markdown = Path(page.abs_src_path).read_text(encoding="utf-8")
        if not shows_own_figure(page.src_uri, markdown):
            continue
        draw = RECORD_FIGURES.get(page.src_uri)
        png = draw() if draw else figure_png(Path(page.abs_src_path), page.src_uri)
        files.append(File.generated(config, own_figure(page.src_uri), content=png))
    return files


def on_page_markdown(markdown, page, config, files):
    """mkdocs event: record tables in place of their markers."""
    return with_record_tables(markdown)


def main(argv: list[str]) -> None:
    if len(argv) != 1:
        sys.exit("usage: python scripts/docs_hooks.py OUT_FOLDER")
    docs, out = ROOT / "docs", Path(argv[0])
    for page in sorted(docs.rglob("*.md")):
        name = page.relative_to(docs).as_posix()
        if shows_own_figure(name, page.read_text(encoding="utf-8")):
            target = out / own_figure(name)
            target.parent.mkdir(parents=True, exist_ok=True)
            draw = RECORD_FIGURES.get(name)
            target.write_bytes(draw() if draw else figure_png(page, name))
            print(target)


if __name__ == "__main__":
    main(sys.argv[1:])
