"""Design an MRF flip schedule for precise T1 and T2: minimise the summed relative Cramer-Rao bound.

The acquisition is `MRFSimulator` (an inversion, then FISP repetitions of TR = 10 ms). The flips, one per
repetition, are held between 0 and 70 degrees (`Bounded`) and moved by Adam on the cost

    mean over tissues of  sqrt(CRLB(T1)) / T1 + sqrt(CRLB(T2)) / T2,

the relative standard deviations an unbiased estimate could reach at a noise of sigma = 1% of M0 per real
and imaginary part, with M0 unknown too (a nuisance). The bound comes from the forward-mode Jacobian; its
gradient w.r.t. the flips runs the engine's second-order kernels (no finite differences).

    python examples/design_mrf.py                        # CPU: 12 tissues, 200 repetitions, ~1 s per step
    python examples/design_mrf.py --large --device cuda  # 10k tissues, 500 repetitions (e.g. an H200)

It prints the bound before and after and the time per iteration, and saves a plot of the schedule
(`--plot`, needs matplotlib: pip install "blochsim[plot]"; skipped without it).
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time

import torch

from blochsim.optim import Bounded, SequenceDesign, crlb
from blochsim.simulators import MRFSimulator

TR_MS = 10.0
NOISE_VARIANCE = 1e-4  # sigma = 1% of M0, per real and imaginary part
#: The incumbent's times per call on the H200 (benchmarks/kernel_cases.py, 500 repetitions, 32 orders): the
#: (T1, T2) Jacobian then the flip gradient of a cost of it ("epg_real_hvp"), and the flip gradient of the
#: signal ("epg_real_grad"); the loop here needs the first per iteration.
INCUMBENT_HVP_MS = {2000: 121.0, 20000: 967.0}


def tissue_grid(count_t1: int, count_t2: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """T1 log-spaced 300-2000 ms against T2 log-spaced 30-200 ms, flattened: (count_t1 * count_t2,) each."""
    t1 = torch.logspace(math.log10(300.0), math.log10(2000.0), count_t1, device=device)
    t2 = torch.logspace(math.log10(30.0), math.log10(200.0), count_t2, device=device)
    return t1[:, None].expand(-1, count_t2).reshape(-1), t2[None, :].expand(count_t1, -1).reshape(-1)


def initial_flips(repetitions: int, device) -> torch.Tensor:
    """A common MRF start: two half-sine lobes of 10-60 degrees."""
    k = torch.arange(repetitions, device=device, dtype=torch.float32)
    return 10.0 + 50.0 * torch.sin(2 * math.pi * k / repetitions).abs()


def relative_bound(acquisition, t1, t2, states: int):
    """The cost's function: flips (deg) -> mean of sqrt(CRLB)/value over T1 and T2, M0 unknown."""

    def cost(flip):
        signal, J = acquisition.jacobian(("T1", "T2"), flip=flip, T1=t1, T2=t2, states=states)
        # M0's column is the signal itself at M0 = 1 (the signal is linear in M0): no kernel column needed.
        J = torch.cat([J, signal[..., None, :]], -2)
        bound = crlb(J, noise_variance=NOISE_VARIANCE, of=(0, 1))
        return (bound[..., 0].sqrt() / t1 + bound[..., 1].sqrt() / t2).mean()

    return cost


def save_plot(path, before, after, repetitions: int) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print('no matplotlib: plot skipped (pip install "blochsim[plot]")')
        return False
    fig, ax = plt.subplots(figsize=(8, 3))
    ax.plot(range(1, repetitions + 1), before.cpu(), label="initial", color="0.6")
    ax.plot(range(1, repetitions + 1), after.cpu(), label="optimised")
    ax.set(xlabel="repetition", ylabel="flip (deg)", ylim=(0, 70), title="MRF flip schedule")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    print(f"schedule plotted to {path}")
    return True


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--large", action="store_true", help="10k tissues (100 x 100), 500 repetitions")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--repetitions", type=int, default=None, help="default 200 (500 with --large)")
    parser.add_argument("--grid", type=int, nargs=2, default=None, metavar=("T1S", "T2S"),
                        help="tissues per axis (default 4 3; 100 100 with --large)")
    parser.add_argument("--iterations", type=int, default=30)
    parser.add_argument("--learning-rate", type=float, default=0.05)
    parser.add_argument("--states", type=int, default=16, help="EPG orders")
    parser.add_argument("--plot", default="design_mrf.png", help="where to save the schedule ('' for none)")
    args = parser.parse_args(argv)
    repetitions = args.repetitions or (500 if args.large else 200)
    grid = args.grid or ((100, 100) if args.large else (4, 3))
    device = torch.device(args.device)
    t1, t2 = tissue_grid(*grid, device)
    cost = relative_bound(MRFSimulator(TR=TR_MS), t1, t2, args.states)
    start = initial_flips(repetitions, device)
    design = SequenceDesign(cost, flip=Bounded(start, 0.0, 70.0)).to(device)
    with torch.no_grad():
        before = float(design())
    print(f"{t1.numel()} tissues, {repetitions} repetitions, {args.states} orders, on {device}")
    print(f"summed relative bound before: {before:.4f}")
    result = design.minimize(iterations=args.iterations, learning_rate=args.learning_rate)
    with torch.no_grad():
        after = float(design())
    per_iteration_ms = 1e3 * statistics.median(result.seconds_per_iteration.tolist())
    print(f"summed relative bound after {result.steps} iterations: {after:.4f} ({after / before:.3f} of before)")
    print(f"time per iteration: {per_iteration_ms:.1f} ms (median; first {1e3 * result.seconds_per_iteration[0]:.1f})")
    n = t1.numel()
    if repetitions == 500 and device.type == "cuda" and 2000 <= n <= 20000:
        (n0, ms0), (n1, ms1) = sorted(INCUMBENT_HVP_MS.items())
        incumbent_ms = ms0 + (ms1 - ms0) * (n - n0) / (n1 - n0)
        print(f"the incumbent's Jacobian-cost gradient at {n} tissues (kernel_cases epg_real_hvp, interpolated): "
              f"{incumbent_ms:.0f} ms per iteration; this loop: {per_iteration_ms / incumbent_ms:.2f} of it")
    plotted = bool(args.plot) and save_plot(args.plot, start, result.parameters["flip"], repetitions)
    return {"before": before, "after": after, "per_iteration_ms": per_iteration_ms, "result": result,
            "plotted": plotted}


if __name__ == "__main__":
    started = time.perf_counter()
    main(sys.argv[1:])
    print(f"total {time.perf_counter() - started:.1f} s")
