"""The fixed pools' first-order adjoint on the card: the launch rule against forced groups of 8 lanes a voxel.

The real float adjoint with its pool counts compiled (csrc/include/blochsim/launch_rules.hpp with_fixed_pools)
runs a warp a voxel, groups of 8 lanes (BLOCHSIM_CUDA_ADJOINT_LANES=8), or a thread; the rule picks one per
launch by its voxels (adjoint_lanes, kPoolGroupVoxels). For each compiled layout (semisolid only (1, 2); two
exchanging pools (2, 2); two and a semisolid (2, 3), the benchmarks' `pooled`; four without shifts and a
semisolid (4, 5)) and tissue count, the gradient of sum |signal|^2 along the flips through MRFSimulator
(100 TRs, 32 orders, tissue and flips on the card as api_cases.py makes them), by the rule and forced,
alternated over `--rounds`: median ms and peak MiB of each.

Run: python benchmarks/fixed_pool_adjoint.py [--n 2000 5000 20000 50000] [--rounds 2]
Writes a new benchmarks/results/mapping/fixed_pool_adjoint-<card>-<date>-<commit>.json (_records.py).
"""

from __future__ import annotations

import argparse
import os
from datetime import datetime, timezone
from pathlib import Path

import torch
from _records import machine_name, write_record
from kernel_cases import flips_deg, measure, relaxation_maps

from blochsim._benchmark_cases import POOL_B, SEMISOLID
from blochsim.model import PUBLIC_FIELDS
from blochsim.simulators import MRFSimulator

_PUBLIC = {field: name for name, field in PUBLIC_FIELDS.items()}
#: Pool C and D of the benchmarks' five-pool family without their shifts (a shift makes the states complex,
#: which the fixed pools' real adjoint does not take).
_POOLS_C_D = dict(pool_c_fraction=0.05, pool_c_exchange_hz=20.0, t1_pool_c_ms=800.0, t2_pool_c_ms=40.0,
                  pool_d_fraction=0.03, pool_d_exchange_hz=30.0, t1_pool_d_ms=900.0, t2_pool_d_ms=60.0)
#: (free pools, layers) -> the pool properties (engine field names), one value for every tissue.
LAYOUTS = {(1, 2): SEMISOLID, (2, 2): POOL_B, (2, 3): {**POOL_B, **SEMISOLID},
           (4, 5): {**POOL_B, **_POOLS_C_D, **SEMISOLID}}
_SETTING = "BLOCHSIM_CUDA_ADJOINT_LANES"


def gradient_call(layout: tuple, n: int):
    """The flip gradient of sum |signal|^2 for n tissues of `layout`, as a user writes it."""
    t1, t2 = relaxation_maps(n, "cuda")
    tissue = {"T1": t1, "T2": t2, **{_PUBLIC[field]: value for field, value in LAYOUTS[layout].items()}}
    flips = flips_deg(100)
    sim = MRFSimulator(flip=flips, TR=10.0, states=32)

    def grad():
        f = flips.to("cuda", copy=True).requires_grad_()
        (sim.simulate(flip=f, **tissue).abs() ** 2).sum().backward()
        return f.grad

    return grad


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, nargs="*", default=[2000, 5000, 20000, 50000])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "mapping")
    args = parser.parse_args()
    record = {"task": "fixed_pool_adjoint", "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
              "device": torch.cuda.get_device_name(), "torch": torch.__version__, "results": []}
    print(f"{'layout':<8}{'n':>8}  rule ms (peak MiB) / groups of 8, per round")
    for layout in LAYOUTS:
        for n in args.n:
            cells = []
            for round_ in range(args.rounds):
                for mapping in ("rule", "lanes8"):
                    if mapping == "rule":
                        os.environ.pop(_SETTING, None)
                    else:
                        os.environ[_SETTING] = "8"
                    _, median, peak = measure(gradient_call(layout, n), "cuda", args.repeats)
                    os.environ.pop(_SETTING, None)
                    record["results"].append({"layout": list(layout), "n": n, "mapping": mapping, "round": round_,
                                              "median_ms": 1e3 * median, "peak_mib": peak / 2**20})
                    cells.append(f"{1e3 * median:.2f} ({peak / 2**20:.0f})")
            print(f"{str(layout):<8}{n:>8}  " + "  ".join(cells), flush=True)
    print("wrote", write_record(args.out, "fixed_pool_adjoint", machine_name("cuda"), record))


if __name__ == "__main__":
    main()
