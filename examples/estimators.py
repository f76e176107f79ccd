"""Tissue maps from a simulated scan, with each of blochsim's estimators.

A 2-D phantom (three tissues and a lesion in a disc, a smooth transmit field B1) is scanned twice: a
double-angle pair (60 and 120 degrees) for B1, and an MR fingerprinting train for T1 and T2. Gaussian noise
is added to the real and imaginary parts. Then:

1. `LookupTable` reads B1 from the double-angle ratio;
2. `DictionaryMatcher` matches the fingerprints against atoms simulated at every B1 of a grid, each voxel
   among the atoms at its measured B1 (and again after compressing the atoms to rank 10);
3. `NonlinearLeastSquares` fits T1, T2 and the amplitude per voxel from the dictionary's start, with standard
   errors;
4. `PERK` (when this blochsim has it) regresses T1 and T2 on the signal and the measured B1.

Each prints its median relative error over the disc and its time. Run:

    python examples/estimators.py [--size 64] [--reps 200] [--noise 0.005] [--device cpu|cuda] [--grid 80]
"""

from __future__ import annotations

import argparse
import math
import time

import torch

import blochsim
from blochsim.estimators import DictionaryMatcher, LookupTable, NonlinearLeastSquares
from blochsim.simulators import DoubleAngleSimulator, MRFSimulator

#: (T1 ms, T2 ms, M0) of the phantom's regions: white matter, grey matter, a fluid-like region, a lesion.
TISSUES = {"white matter": (800.0, 60.0, 0.7), "grey matter": (1300.0, 90.0, 0.8),
           "fluid": (2500.0, 250.0, 1.0), "lesion": (1700.0, 140.0, 0.9)}


def phantom(size: int) -> dict:
    """Maps of shape (size, size): T1, T2, M0 (0 outside the disc), B1, and the disc's mask."""
    y, x = torch.meshgrid(torch.linspace(-1, 1, size), torch.linspace(-1, 1, size), indexing="ij")
    r = torch.sqrt(x**2 + y**2)
    region = torch.full((size, size), -1)
    region[r < 0.9] = 0  # white matter
    region[(r < 0.9) & (x < -0.1)] = 1  # grey matter
    region[(x - 0.35) ** 2 + (y + 0.3) ** 2 < 0.05] = 2  # fluid
    region[(x + 0.4) ** 2 + (y - 0.35) ** 2 < 0.02] = 3  # lesion
    table = torch.tensor(list(TISSUES.values()))
    maps = {name: torch.where(region >= 0, table[region.clamp_min(0), i], 0.0) for i, name in
            enumerate(("T1", "T2", "M0"))}
    maps["B1"] = 1.0 + 0.15 * x - 0.08 * y**2  # a smooth transmit field, 0.77-1.15
    maps["mask"] = region >= 0
    return maps


def noisy(signal: torch.Tensor, sd: float, generator: torch.Generator) -> torch.Tensor:
    noise = torch.randn(signal.shape + (2,), generator=generator, device=signal.device)
    return signal + sd * torch.view_as_complex(noise) if signal.is_complex() else signal + sd * noise[..., 0]


def median_error(estimate, truth) -> float:
    """Median relative error (%) over the disc's voxels."""
    return 100 * float(((torch.as_tensor(estimate).cpu().float() - truth) / truth).abs().median())


def timed(fn):
    """(fn(), seconds it took)."""
    t0 = time.perf_counter()
    out = fn()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return out, time.perf_counter() - t0


def report(label: str, seconds: float, **errors) -> None:
    text = ", ".join(f"{name} {value:5.2f} %" for name, value in errors.items())
    print(f"{label:<42} {seconds:7.2f} s   median error: {text}")


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", type=int, default=64, help="phantom side (voxels)")
    parser.add_argument("--reps", type=int, default=200, help="repetitions of the MRF train")
    parser.add_argument("--noise", type=float, default=0.005, help="noise SD (a relaxed voxel is 1)")
    parser.add_argument("--device", default="cpu", help="where the volumes live: cpu or cuda")
    parser.add_argument("--grid", type=int, default=80, help="T1 values of the dictionary (T2: 3/4 as many)")
    parser.add_argument("--perk-samples", type=int, default=20000, help="PERK's training samples")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    g = torch.Generator(device=device).manual_seed(args.seed)

    truth = phantom(args.size)
    mask = truth["mask"]
    disc = {name: truth[name][mask] for name in ("T1", "T2", "M0", "B1")}  # the voxels inside: (V,)
    tissue = {name: value.to(device) for name, value in disc.items()}

    # The scans. Flips ramp 5 -> 60 -> 2 degrees, TR 10 ms, after an inversion.
    half = args.reps // 2
    flips = torch.cat([torch.linspace(5, 60, half), torch.linspace(60, 2, args.reps - half)])
    mrf = MRFSimulator(flip=flips, TR=10.0)
    double_angle = DoubleAngleSimulator(flip=[60.0, 120.0])
    fingerprints = noisy(mrf.simulate(**tissue), args.noise, g)  # (V, reps) complex64
    pair = noisy(double_angle.simulate(B1=tissue["B1"], M0=tissue["M0"]), args.noise, g)  # (V, 2) real
    print(f"phantom {args.size}x{args.size}: {mask.sum()} voxels in the disc, MRF train of {args.reps} TRs, "
          f"noise SD {args.noise}, on {device}")
    results = {}

    # 1. B1 from the double-angle ratio: sin(2a)/sin(a) = 2 cos(a), read off a table.
    table = LookupTable(double_angle, combine=lambda s: s[..., 1] / s[..., 0]).fit(B1=(0.5, 1.45))
    b1, seconds = timed(lambda: table.map(pair)["B1"])
    report("LookupTable (B1, double angle)", seconds, B1=median_error(b1, disc["B1"]))
    results["LookupTable"] = {"B1": b1}

    # 2. Dictionary matching, grouped by the measured B1.
    t1 = torch.logspace(math.log10(200), math.log10(3000), args.grid)
    t2 = torch.logspace(1, math.log10(300), args.grid * 3 // 4)
    T1, T2 = (a.reshape(-1) for a in torch.meshgrid(t1, t2, indexing="ij"))
    keep = T2 <= T1
    b1_grid = torch.arange(0.75, 1.2001, 0.05).tolist()  # a measured B1 snaps to the nearest of these

    def match(rank):
        matcher = DictionaryMatcher(mrf).fit(T1=T1[keep], T2=T2[keep], known={"B1": b1_grid}, rank=rank)
        return matcher, matcher.map(fingerprints, known={"B1": b1})

    for rank in (None, 10):
        label = "DictionaryMatcher" + (f" (rank {rank})" if rank else "")
        (matcher, maps), seconds = timed(lambda rank=rank: match(rank))
        report(f"{label}, {matcher.dictionary.shape[0]} atoms", seconds, T1=median_error(maps["T1"], disc["T1"]),
               T2=median_error(maps["T2"], disc["T2"]), M0=median_error(maps["M0"], disc["M0"]))
        results[label] = maps

    # 3. Nonlinear least squares with the measured B1, started from a small dictionary.
    nlls = NonlinearLeastSquares(mrf).fit(T1=(200.0, 3000.0), T2=(10.0, 300.0), known={"B1": (0.7, 1.3)},
                                          noise_std=args.noise, seed=args.seed)
    (maps, errors), seconds = timed(lambda: nlls.map(fingerprints, known={"B1": b1}, uncertainty=True))
    report("NonlinearLeastSquares", seconds, T1=median_error(maps["T1"], disc["T1"]),
           T2=median_error(maps["T2"], disc["T2"]), M0=median_error(maps["M0"], disc["M0"]))
    print(f"{'':<42} {'':>9}   median standard error: T1 {float(errors['T1'].median()):.1f} ms, "
          f"T2 {float(errors['T2'].median()):.2f} ms; converged {float(nlls.report['converged'].float().mean()):.3f}")
    results["NonlinearLeastSquares"] = maps

    # 4. PERK: kernel regression on the signal and the measured B1, trained on noisy simulations.
    if hasattr(blochsim.estimators, "PERK"):
        perk = blochsim.estimators.PERK(mrf)
        _, fit_s = timed(lambda: perk.fit(T1=(200.0, 3000.0), T2=(10.0, 300.0), known={"B1": (0.7, 1.3)},
                                          noise_std=args.noise, seed=args.seed, samples=args.perk_samples))
        maps, seconds = timed(lambda: perk.map(fingerprints, known={"B1": b1}))
        report(f"PERK ({args.perk_samples} training samples)", fit_s + seconds, T1=median_error(maps["T1"], disc["T1"]),
               T2=median_error(maps["T2"], disc["T2"]))
        results["PERK"] = maps
    return results


if __name__ == "__main__":
    main()
