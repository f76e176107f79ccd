"""`blochsim demo`: simulate an MRF dictionary on built-in defaults, match a noisy atom, print the timing."""

from __future__ import annotations

import math
import time

import click

from ._common import plotting, reports_errors

__all__ = ["demo"]


@click.command(short_help="Simulate an MRF dictionary on defaults and print its timing.", epilog="""\b
Examples:
  blochsim demo                                  # 10,000 tissues x 500 repetitions, 32 orders
  blochsim demo --tissues 400 --repetitions 200 --plot demo.png
""")
@click.option("--tissues", type=click.IntRange(min=1), default=10000, show_default=True,
              help="Dictionary size (a T1 x T2 grid of about this many tissues).")
@click.option("--repetitions", type=click.IntRange(min=1), default=500, show_default=True,
              help="TRs in the train.")
@click.option("--tr-ms", type=click.FloatRange(min=0, min_open=True), default=10.0, show_default=True,
              help="Repetition time (ms).")
@click.option("--states", type=click.IntRange(min=1), default=32, show_default=True, help="EPG orders.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the noise added to the matched atom.")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False, writable=True), default=None,
              help="Write a figure (PNG, ...) of a few tissues' signals and the timing.")
@reports_errors
def demo(tissues: int, repetitions: int, tr_ms: float, states: int, seed: int, plot_path: str | None) -> None:
    """Simulate an MRF dictionary on built-in defaults and print a summary.

    The train: an inversion, then REPETITIONS x (excitation, sample, one-order shift, TR), flips ramping
    5 -> 60 -> 2 degrees. The tissues: a T1 x T2 grid (T1 200-3000 ms, T2 10-300 ms, log-spaced). A noisy
    copy of one atom is matched back to the dictionary, which finds its tissue.
    """
    import torch

    from .. import engine
    from ..engine import kernels
    from ..sequence import TissueProperties, mrf_description

    if plot_path:
        plotting()  # before the work: a missing matplotlib is said at once
    half = repetitions // 2
    flips_deg = torch.cat([torch.linspace(5, 60, half), torch.linspace(60, 2, repetitions - half)])
    t1 = torch.logspace(math.log10(200), math.log10(3000), max(1, round(math.sqrt(tissues))))
    t2 = torch.logspace(math.log10(10), math.log10(300), max(1, tissues // t1.numel()))
    tissue = TissueProperties(t1_ms=t1[:, None], t2_ms=t2[None, :])

    start = time.perf_counter()
    description = mrf_description(torch.deg2rad(flips_deg), tr_ms * 1e-3)
    built = time.perf_counter()
    atoms = engine.simulate(description, tissue, states=states)
    done = time.perf_counter()

    # Match a noisy atom back to the dictionary: the fingerprint identifies its tissue.
    flat = atoms.reshape(-1, atoms.shape[-1])
    norms = flat / flat.norm(dim=-1, keepdim=True).clamp_min(torch.finfo(flat.real.dtype).tiny)
    truth = flat.shape[0] // 3
    noise = torch.randn(flat.shape[-1], dtype=flat.dtype, generator=torch.Generator().manual_seed(seed))
    noisy = flat[truth] + 0.01 * flat[truth].abs().max() * noise
    best = int((norms.conj() @ noisy).abs().argmax())
    i, j = divmod(best, t2.numel())
    ti, tj = divmod(truth, t2.numel())

    build_ms, simulate_ms = 1e3 * (built - start), 1e3 * (done - built)
    click.echo(f"blochsim MRF dictionary: {flat.shape[0]} tissues x {flat.shape[-1]} samples ({atoms.dtype}), "
               f"{states} EPG orders, {kernels.num_threads()} threads")
    click.echo(f"  sequence: inversion + {repetitions} x (excitation, sample, shift, {tr_ms:g} ms), "
               f"flips 5 -> 60 -> 2 deg")
    click.echo(f"  description built in {build_ms:.1f} ms, simulated in {simulate_ms:.1f} ms")
    click.echo(f"  match of a noisy atom: T1 {t1[i]:.0f} ms / T2 {t2[j]:.1f} ms (truth {t1[ti]:.0f} / {t2[tj]:.1f})")
    if plot_path:
        path = _figure(plot_path, atoms, t1, t2, tr_ms, build_ms, simulate_ms, states)
        click.echo(f"  figure: {path}")


def _figure(path: str, atoms, t1, t2, tr_ms: float, build_ms: float, simulate_ms: float, states: int):
    """Signals of four tissues spread over the grid, beside a bar of where the time went."""
    import torch

    plot = plotting()
    from ..plot._figure import pyplot

    plt = pyplot("blochsim demo --plot")
    figure, (left, right) = plt.subplots(1, 2, figsize=(11, 4), gridspec_kw={"width_ratios": [3, 1]})
    n1, n2 = t1.numel(), t2.numel()
    picks = sorted({(a, b) for a, b in ((0, 0), (n1 // 3, n2 // 2), (2 * n1 // 3, n2 // 3), (n1 - 1, n2 - 1))})
    rows = atoms[[a for a, _ in picks], [b for _, b in picks]]
    labels = [f"T1 {t1[a]:.0f} ms, T2 {t2[b]:.0f} ms" for a, b in picks]
    plot.signals(rows, labels=labels, x=torch.arange(1, atoms.shape[-1] + 1), xlabel=f"repetition (TR {tr_ms:g} ms)",
                 axis=left,
                 title=f"MRF signals ({atoms.shape[-1]} repetitions, {states} EPG orders)")
    right.bar(["describe", "simulate"], [build_ms, simulate_ms], color=["tab:gray", "tab:blue"])
    right.set_ylabel("ms")
    count = atoms.numel() // atoms.shape[-1]
    right.set_title(f"{count} tissues: {simulate_ms / count * 1e3:.1f} us each")
    for k, value in enumerate((build_ms, simulate_ms)):
        right.annotate(f"{value:.1f}", (k, value), ha="center", va="bottom", fontsize="small")
    return plot.save(figure, path)

