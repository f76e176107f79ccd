"""Command line: `blochsim demo` simulates an MRF dictionary on built-in defaults and prints a summary."""

from __future__ import annotations

import argparse
import math
import sys
import time

import torch


def _demo(args: argparse.Namespace) -> int:
    from . import engine
    from .engine import kernels
    from .sequence import TissueProperties, mrf_description

    n, reps = args.tissues, args.repetitions
    half = reps // 2
    flips_deg = torch.cat([torch.linspace(5, 60, half), torch.linspace(60, 2, reps - half)])
    t1 = torch.logspace(math.log10(200), math.log10(3000), round(math.sqrt(n)))
    t2 = torch.logspace(math.log10(10), math.log10(300), max(1, n // t1.numel()))
    tissue = TissueProperties(t1_ms=t1[:, None], t2_ms=t2[None, :])

    start = time.perf_counter()
    description = mrf_description(torch.deg2rad(flips_deg), args.tr_ms * 1e-3)
    built = time.perf_counter()
    atoms = engine.simulate(description, tissue, states=args.states)
    done = time.perf_counter()

    # Match a noisy atom back to the dictionary: the fingerprint identifies its tissue.
    flat = atoms.reshape(-1, atoms.shape[-1])
    norms = flat / flat.norm(dim=-1, keepdim=True)
    truth = flat.shape[0] // 3
    noisy = flat[truth] + 0.01 * flat[truth].abs().max() * torch.randn(flat.shape[-1], dtype=flat.dtype)
    best = int((norms.conj() @ noisy).abs().argmax())
    i, j = divmod(best, t2.numel())
    ti, tj = divmod(truth, t2.numel())

    print(f"blochsim MRF dictionary: {flat.shape[0]} tissues x {flat.shape[-1]} samples ({atoms.dtype}), "
          f"{args.states} EPG orders, {kernels.num_threads()} threads")
    print(f"  sequence: inversion + {reps} x (excitation, sample, shift, {args.tr_ms:g} ms), flips 5 -> 60 -> 2 deg")
    print(f"  description built in {1e3 * (built - start):.1f} ms, simulated in {1e3 * (done - built):.1f} ms")
    print(f"  match of a noisy atom: T1 {t1[i]:.0f} ms / T2 {t2[j]:.1f} ms (truth {t1[ti]:.0f} / {t2[tj]:.1f})")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="blochsim", description="Differentiable MRI signal simulation.")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="simulate an MRF dictionary on built-in defaults")
    demo.add_argument("--tissues", type=int, default=10000, help="dictionary size (default 10000)")
    demo.add_argument("--repetitions", type=int, default=500, help="TRs in the train (default 500)")
    demo.add_argument("--tr-ms", type=float, default=10.0, help="repetition time in ms (default 10)")
    demo.add_argument("--states", type=int, default=32, help="EPG orders (default 32)")
    args = parser.parse_args(argv)
    if args.command == "demo":
        return _demo(args)
    return 2


if __name__ == "__main__":
    sys.exit(main())
