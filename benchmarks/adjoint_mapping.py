"""The CUDA adjoints under each lane mapping, with the forward beside each, in one run (issue 29).

BLOCHSIM_CUDA_MAPPING (launch_rules.hpp forced_mapping, read at every launch) forces how many lanes carry a
voxel: `thread` (one), `warp` (32: an order or two a lane), `lanes8` / `lanes4` (a group: 4 or 8 orders a lane,
the adjoints of pool model 0 up to 32 orders; the value forward too). `auto` leaves the library's choice.
The variable forces the forward passes as well, so each case is timed with its forward under the same
mapping: the gradient minus that forward is the adjoint pass's share (the gradient runs the forward, then the
checkpointed adjoint, which sweeps the forward again); the ratio issue 29 holds is the gradient over the
forward under `auto`.

Cases (benchmarks/kernel_cases.py's, blochsim._benchmark_cases): `epg_real_grad` at 2k, 20k and 100k tissues,
`epg_complex_grad` at 2k and 20k (forward: `epg_real`, `epg_complex`), and `epg_real_hvp` at 2k and 20k (the
(T1, T2) Jacobian then the gradient of sum |J|^2 through it, the second-order adjoint; its forward is the
Jacobian, `epg_real_jac`). Mappings are taken in turn for each case and size, so a drift of the card's clocks
meets them alike. About a minute on an H200.

The adjoints run in voxel chunks under the library's scratch cap (blochsim._execution DEFAULT_SCRATCH_BYTES,
128 MiB; 96 MiB second order): about 4,300 voxels a launch for the real gradient here, so each mapping's
launch size is that, not the tissue count. `--budget-mib 0 1024` also times every case under
`execution("cuda", budget_bytes=1 GiB)` (0: the library's default), to see the mappings with larger launches;
each budget is a row of its own.

Run: python benchmarks/adjoint_mapping.py [--repeats 5] [--mappings auto thread warp lanes8 lanes4] [--budget-mib 0]
Writes benchmarks/results/mapping/adjoint_mapping-<card>-<date>-<commit>.json (_records.py) and prints a table.
"""

from __future__ import annotations

import argparse
import os
import time
from contextlib import nullcontext
from datetime import datetime, timezone
from pathlib import Path

import torch
from _records import write_record

from blochsim import execution
from blochsim._benchmark_cases import case_fn, measure

MAPPINGS = ("auto", "thread", "warp", "lanes8", "lanes4")
# (derivative case, its forward case, tissue counts)
CASES = (
    ("epg_real_grad", "epg_real", (2000, 20000, 100000)),
    ("epg_complex_grad", "epg_complex", (2000, 20000)),
    ("epg_real_hvp", "epg_real_jac", (2000, 20000)),
)


def set_mapping(mapping: str) -> None:
    """Force `mapping` for the launches that follow (`auto`: the library's own choice)."""
    if mapping == "auto":
        os.environ.pop("BLOCHSIM_CUDA_MAPPING", None)
    else:
        os.environ["BLOCHSIM_CUDA_MAPPING"] = mapping


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--mappings", nargs="*", default=list(MAPPINGS), choices=MAPPINGS)
    parser.add_argument("--cases", nargs="*", help="derivative case names (default: all)")
    parser.add_argument("--budget-mib", type=int, nargs="*", default=[0],
                        help="execution budgets to time each case under, MiB (0: the library's default cap)")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "mapping")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("adjoint_mapping.py times the CUDA kernels: no CUDA device")
    device = torch.device("cuda")
    card = torch.cuda.get_device_name(device)
    record = {"task": "adjoint_mapping", "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
              "device": card, "torch": torch.__version__, "repeats": args.repeats, "mappings": args.mappings,
              "note": "median ms per call; forward_ms under the same mapping; adjoint_ms = derivative - forward; "
                      "ratio_to_auto_forward = derivative / the forward under auto", "results": []}
    started = time.perf_counter()
    header = (f"{'case':<18}{'n':>8}{'MiB':>6}{'mapping':>9}{'fwd ms':>9}{'deriv ms':>10}{'adj ms':>9}{'/fwd':>7}"
              f"{'/auto fwd':>10}{'peak MiB':>10}")
    print(header)
    for derivative, forward, counts in CASES:
        if args.cases and derivative not in args.cases:
            continue
        for n, budget_mib in ((n, b) for n in counts for b in args.budget_mib):
            fns = (case_fn(forward, n, device), case_fn(derivative, n, device))
            policy = execution("cuda", budget_bytes=budget_mib * 2**20) if budget_mib else nullcontext()
            auto_forward_ms = None
            for mapping in args.mappings:
                set_mapping(mapping)
                try:
                    with policy:
                        _, fwd, _ = measure(fns[0], device, args.repeats)
                        first, der, peak = measure(fns[1], device, args.repeats)
                finally:
                    set_mapping("auto")
                fwd_ms, der_ms = 1e3 * fwd, 1e3 * der
                if mapping == "auto":
                    auto_forward_ms = fwd_ms
                to_auto = der_ms / auto_forward_ms if auto_forward_ms else None
                row = {"case": derivative, "forward_case": forward, "n": n, "budget_mib": budget_mib or None,
                       "mapping": mapping,
                       "forward_ms": fwd_ms, "derivative_ms": der_ms, "adjoint_ms": der_ms - fwd_ms,
                       "ratio_to_forward": der_ms / fwd_ms, "ratio_to_auto_forward": to_auto,
                       "first_ms": 1e3 * first, "peak_mib": peak / 2**20}
                record["results"].append(row)
                auto_s = f"{to_auto:10.1f}" if to_auto else f"{'-':>10}"
                print(f"{derivative:<18}{n:>8}{budget_mib or '-':>6}{mapping:>9}{fwd_ms:>9.2f}{der_ms:>10.2f}"
                      f"{der_ms - fwd_ms:>9.2f}{der_ms / fwd_ms:>7.1f}{auto_s}{peak / 2**20:>10.1f}", flush=True)
    record["wall_s"] = time.perf_counter() - started
    print(f"{record['wall_s']:.0f} s; wrote {write_record(args.out, 'adjoint_mapping', card, record)}")


if __name__ == "__main__":
    main()
