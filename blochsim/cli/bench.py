"""`blochsim bench`: the recorded benchmark cases on this machine, as a table (and a record, a figure)."""

from __future__ import annotations

import json
import platform
from datetime import datetime, timezone
from pathlib import Path

import click

from ._common import plotting, reports_errors
from ._files import write_atomically

__all__ = ["bench"]


def _cpu_model() -> str:
    """The processor's model name (/proc/cpuinfo), else what the platform module says."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "cpu"


def _run(selected: list, target, reference: dict, repeats: int) -> list:
    """Time each (case, tissues) on `target`, printing a table row as each finishes; returns the rows."""
    from .. import _benchmark_cases as bc

    click.echo(f"{'case':<18}{'n':>9}{'first ms':>10}{'median ms':>11}{'ref ms':>9}{'ratio':>7}")
    rows = []
    for name, n in selected:
        first, median, peak = bc.measure(bc.case_fn(name, n, target), target, repeats)
        ref = reference.get((name, n))
        rows.append({"case": name, "n": n, "first_ms": 1e3 * first, "median_ms": 1e3 * median, "reference_ms": ref,
                     "ratio": 1e3 * median / ref if ref else None,
                     "peak_mib": None if peak is None else peak / 2**20})
        ratio = f"{rows[-1]['ratio']:7.2f}" if ref else f"{'-':>7}"
        ref_text = f"{ref:9.1f}" if ref else f"{'-':>9}"
        click.echo(f"{name:<18}{n:>9}{1e3 * first:>10.1f}{1e3 * median:>11.2f}{ref_text}{ratio}")
    return rows


def _cases(text: str | None) -> list | None:
    if not text:
        return None
    from .._benchmark_cases import is_case

    names = [n.strip() for n in text.split(",") if n.strip()]
    for name in names:
        if not is_case(name):
            raise click.BadParameter(f"unknown case {name!r}: a case is epg_real, epg_complex, pooled, pooledb or "
                                     f"pooled5, optionally followed by _grad, _jac or _hvp", param_hint="'--cases'")
    return names


@click.command(short_help="Time the benchmark cases on this machine.", epilog="""\b
Examples:
  blochsim bench                                   # the CPU cases at their recorded sizes (about a minute)
  blochsim bench --quick                           # each case at a tenth of its size, no reference ratio
  blochsim bench --cases epg_real,epg_real_grad --n 2000 --n 10000 --json bench.json --plot ratios.png
  blochsim bench --device cuda                     # the GPU cases, against the incumbent's H200 times
\b
Cases: an MRF train (an inversion, then 500 x (pulse, sample, one-order shift, 10 ms), flips 5 -> 60 -> 2
degrees, 32 orders, float32) over tissues with T1 200-3000 ms and T2 10-300 ms; `complex` adds quadratic RF
phases; `pooled*` runs 100 repetitions with exchanging and semisolid pools. `_grad`: the gradient of
sum |signal|^2 with respect to the flips; `_jac`: the (T1, T2) Jacobian; `_hvp`: that Jacobian's cost
differentiated with respect to the flips.
""")
@click.option("--cases", default=None, metavar="NAMES", help="Comma-separated case names (default: every case of "
              "the device that has a reference time).")
@click.option("--n", "counts", multiple=True, type=click.IntRange(min=1), metavar="TISSUES",
              help="Run every named case at this many tissues instead of its recorded size. Repeatable.")
@click.option("--repeats", type=click.IntRange(min=1), default=3, show_default=True,
              help="Timed calls per case (after a first call and one more, untimed).")
@click.option("--quick", is_flag=True, help="Each case at a tenth of its recorded size (at least 100 tissues).")
@click.option("--device", default="cpu", show_default=True, help="cpu, or cuda[:N].")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None,
              help="Also write the results as a JSON record.")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False), default=None,
              help="Also write a figure of each case's time over its reference (PNG, ...).")
@reports_errors
def bench(cases, counts, repeats, quick, device, json_path, plot_path) -> None:
    """Time the benchmark cases on this machine and print a table.

    The reference: on the CPU, the best median of the incumbent (blochsim 0.0.14) on a 2-core machine with 2
    threads; on CUDA, its median on an H200. The ratio is this machine's median over the reference, given
    only where the case runs at the reference's size; other machines differ, so read it as a guide.
    """
    import torch

    from .. import _benchmark_cases as bc
    from ..engine.kernels import num_threads

    names = _cases(cases)
    if plot_path:
        plotting()  # before the work: a missing matplotlib is said at once
    try:
        target = torch.device(device)
    except RuntimeError:
        raise click.BadParameter(f"{device!r} is not a device (cpu, cuda, cuda:1, ...)",
                                 param_hint="'--device'") from None
    from .._errors import check_device

    check_device(target)  # a CUDA device this installation cannot serve: one line saying what to install
    gpu = target.type == "cuda"
    reference = bc.INCUMBENT_MS if gpu else bc.CPU_INCUMBENT_MS
    where = "the incumbent 0.0.14 on an H200" if gpu else "the incumbent 0.0.14 on 2 cores, 2 threads"
    selected = bc.select_cases(list(reference), names, list(counts) or None, False)
    if quick:
        selected = [(name, max(100, n // 10)) for name, n in selected]
    if gpu:
        card = torch.cuda.get_device_name(target) if torch.cuda.is_available() else "cuda"
    else:
        card = _cpu_model()
    click.echo(f"blochsim bench on {card}, {num_threads()} threads; reference: {where}")
    rows = _run(selected, target, reference, repeats)
    record = {"task": "bench", "date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "device": card,
              "threads": num_threads(), "torch": torch.__version__, "reference": where, "repeats": repeats,
              "results": rows}
    if json_path:
        text = json.dumps(record, indent=1)
        click.echo(f"record: {write_atomically(json_path, lambda tmp: tmp.write_text(text))}")
    if plot_path:
        if not any(row["ratio"] is not None for row in rows):
            raise ValueError("--plot draws each case's ratio to its reference, but no case ran at a reference "
                             "size (drop --quick and --n)")
        plot = plotting()

        axis = plot.benchmark_ratios(rows, reference=where, title=f"blochsim bench on {card}")
        click.echo(f"figure: {plot.save(axis, plot_path)}")
