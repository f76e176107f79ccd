"""The kernel cases of benchmarks/kernel_cases.py through the public Simulator API, as users write them.

Each case builds `MRFSimulator(flip=..., TR=10.0, states=32)` once, with the tissue maps on the device; a
`_grad` case creates its flips on the device with requires_grad and calls `backward()` on sum |signal|^2;
an `_hvp` case takes `sim.jacobian(("T1", "T2"), flip=f, ...)` and calls `backward()` on sum |J|^2 (a `_jac`
case, named with --cases, the Jacobian alone: the HVP's first half). The
trains and tissue are those of kernel_cases.py (500 TRs for `epg_*`, quadratic RF phases for `complex`;
100 TRs with exchanging and semisolid pools for `pooled*`). Per case: the first call, the median of
`--repeats` calls after one more, and the peak torch allocation over all of them
(torch.cuda.max_memory_allocated after a reset, with the tissue already on the card), beside the
incumbent's H200 time (kernel_cases.INCUMBENT_MS) and peak (INCUMBENT_MIB, issue 21) and the ratios.

Every derivative case (`_grad`, `_hvp`) is timed beside the forward of the same train and tissues at the same
count, run just before it (added where the list lacks it): its row carries that forward's median and the
ratio of the two (`forward_ms`, `over_forward`; issue 29's bounds, 5 for a gradient and 12 for an HVP, are on
that ratio), read from one run.

Three big cases run after them (`--big`, on by default on CUDA): a 1M-voxel real gradient, a 200k-voxel real
HVP and a 1M-voxel 5-pool forward; each must peak under 16 GB (BIG_LIMIT_BYTES).

Run: python benchmarks/api_cases.py --device cuda [--cases epg_real_grad ...] [--quick] [--n 100 ...]
     [--budget-mib 512] [--scratch-mib 256] [--no-big]
On the host: python benchmarks/api_cases.py --device cpu --quick --n 100
Writes a new benchmarks/results/api_cases-<device>-<date>-<commit>.json (_records.py).
"""

from __future__ import annotations

import argparse
import contextlib
import platform
from datetime import datetime, timezone
from pathlib import Path

import torch
from _records import write_record
from kernel_cases import INCUMBENT_MS, POOLS, STATES, case_train, flips_deg, measure, relaxation_maps, select_cases

import blochsim
from blochsim import _execution
from blochsim.engine import chunks, kernels
from blochsim.model import PUBLIC_FIELDS
from blochsim.simulators import MRFSimulator

#: The incumbent's peak torch allocation on the H200 (MiB), issue 21.
INCUMBENT_MIB = {
    ("epg_real_grad", 100000): 1338, ("epg_complex_grad", 20000): 486, ("epg_real_hvp", 20000): 870,
    ("epg_complex_hvp", 5000): 410, ("pooled_grad", 20000): 304, ("pooled_hvp", 5000): 289,
    ("pooledb_hvp", 20000): 383, ("pooled5_grad", 2000): 319,
}

#: The three big cases and the peak each must stay under.
BIG_CASES = [("epg_real_grad", 1_000_000), ("epg_real_hvp", 200_000), ("pooled5", 1_000_000)]
BIG_LIMIT_BYTES = 16 * 10**9

_FIELD_NAMES = {field: name for name, field in PUBLIC_FIELDS.items()}


def tissue(n: int, device, pools: str) -> dict:
    """kernel_cases.tissue by public name: T1, T2 maps on `device` and the pool properties as numbers."""
    t1, t2 = relaxation_maps(n, device)
    values = {"T1": t1, "T2": t2}
    values.update({_FIELD_NAMES[field]: value for field, value in POOLS[pools].items()})
    return values


def case_fn(name: str, n: int, device):
    """The call of one case, as a user writes it."""
    quadratic, reps, pools, kind = case_train(name)
    values = tissue(n, device, pools)
    flips = flips_deg(reps)
    phases = torch.tensor([117.0 * k * (k + 1) / 2 for k in range(reps)]) if quadratic else 0.0
    sim = MRFSimulator(flip=flips, TR=10.0, phases=phases, states=STATES)

    if kind == "":
        return lambda: sim.simulate(**values)
    if kind == "grad":
        def grad():
            f = flips.to(device, copy=True).requires_grad_()
            (sim.simulate(flip=f, **values).abs() ** 2).sum().backward()
            return f.grad
        return grad
    def jacobian():  # the flips requiring grad, created on the device, and the (T1, T2) Jacobian
        f = flips.to(device, copy=True).requires_grad_()
        return f, sim.jacobian(("T1", "T2"), flip=f, **values)[1]

    if kind == "jac":
        return lambda: jacobian()[1]  # the _hvp case's first half
    if kind == "hvp":
        def hvp():
            f, jac = jacobian()
            (jac.abs() ** 2).sum().backward()
            return f.grad
        return hvp
    raise ValueError(name)


def forward_of(name: str) -> str | None:
    """The value forward of a derivative case (epg_real_grad -> epg_real); None for a forward."""
    family, _, kind = name.rpartition("_")
    return family if kind in ("grad", "jac", "hvp") else None


def with_forwards(cases: list) -> list:
    """The cases with each derivative's forward at its count run just before it, where the list lacks one
    earlier (a big case's forward is big too), and each (case, count) once."""
    out, seen = [], set()
    for name, n, *tag in cases:
        for case in (forward_of(name), name):
            if case and (case, n) not in seen:
                out.append((case, n, *tag))
                seen.add((case, n))
    return out


def force_stride(stride: int) -> None:
    """Every adjoint the engine plans takes `stride` (an experiment: which stride a launch rule should pick)."""
    chunks.least_scratch_stride = lambda events, given, scratch_at: stride
    plan = kernels._Placed._plan

    def planned(self, st, entry, *rest):  # rest: _plan's own arguments after the entry, passed on as given
        if entry in kernels._ADJOINTS:
            self.stride = stride
        return plan(self, st, entry, *rest)

    kernels._Placed._plan = planned


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--cases", nargs="*", help="case names (default: all)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="only the smallest size of each case")
    parser.add_argument("--n", type=int, nargs="*", help="tissue counts to run every named case at")
    parser.add_argument("--budget-mib", type=int, help="run every call under execution(budget_bytes=...)")
    parser.add_argument("--scratch-mib", type=int,
                        help="the scratch held per kernel call without a budget (default: DEFAULT_SCRATCH_BYTES)")
    parser.add_argument("--big", action=argparse.BooleanOptionalAction, default=None,
                        help="the three big cases (default: on CUDA without --quick, --cases or --n)")
    parser.add_argument("--stride", type=int,
                        help="an experiment: every adjoint launch on the card takes this checkpoint stride (events a "
                             "stretch), not the one its plan picks (4, or the least-scratch one where a call is "
                             "chunked: engine.chunks.least_scratch_stride)")
    parser.add_argument("--whole-waves", action=argparse.BooleanOptionalAction, default=True,
                        help="chunks in whole waves of their kernel (engine.chunks.WHOLE_WAVES; --no-whole-waves "
                             "to measure what that buys)")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args()
    chunks.WHOLE_WAVES = args.whole_waves
    if args.stride:
        force_stride(args.stride)
    cases = select_cases(list(INCUMBENT_MS), args.cases, args.n, args.quick)
    if args.scratch_mib:
        _execution.DEFAULT_SCRATCH_BYTES = _execution.SECOND_ORDER_SCRATCH_BYTES = args.scratch_mib * 2**20
        _execution.SECOND_ORDER_WAVE_SCRATCH_BYTES = args.scratch_mib * 2**20
    device = torch.device(args.device)
    big = args.big if args.big is not None else (device.type == "cuda" and not (args.quick or args.cases or args.n))
    if big:
        cases += [(name, n, "big") for name, n in BIG_CASES]
    cases = with_forwards(cases)
    card = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu"
    policy = blochsim.execution(budget_bytes=args.budget_mib * 2**20) if args.budget_mib else contextlib.nullcontext()
    record = {"task": "api_cases", "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
              "device": card, "torch": torch.__version__, "budget_mib": args.budget_mib,
              "scratch_mib": _execution.DEFAULT_SCRATCH_BYTES / 2**20,
              "second_order_scratch_mib": _execution.SECOND_ORDER_SCRATCH_BYTES / 2**20,
              "second_order_wave_scratch_mib": _execution.SECOND_ORDER_WAVE_SCRATCH_BYTES / 2**20,
              "stride": args.stride, "whole_waves": args.whole_waves,
              "results": []}
    print(f"{'case':<18}{'n':>9}{'first ms':>10}{'median ms':>11}{'x fwd':>7}{'inc ms':>9}{'ratio':>7}"
          f"{'peak MiB':>10}{'inc MiB':>9}{'ratio':>7}")
    medians: dict = {}  # (case, n) -> median ms, for the derivatives' ratios to their forwards
    for name, n, *tag in cases:
        with policy:
            fn = case_fn(name, n, device)
            first, median, peak = measure(fn, device, 1 if tag else args.repeats)
        inc_ms, inc_mib = INCUMBENT_MS.get((name, n)), INCUMBENT_MIB.get((name, n))
        peak_mib = None if peak is None else peak / 2**20
        row = {"case": name, "n": n, "first_ms": 1e3 * first, "median_ms": 1e3 * median, "peak_mib": peak_mib,
               "incumbent_ms": inc_ms, "incumbent_mib": inc_mib,
               "time_ratio": None if not inc_ms else 1e3 * median / inc_ms,
               "peak_ratio": None if not (inc_mib and peak_mib) else peak_mib / inc_mib}
        if tag:
            row["peak_limit_bytes"] = BIG_LIMIT_BYTES
            row["within_limit"] = None if peak is None else peak <= BIG_LIMIT_BYTES
        forward = forward_of(name)
        if forward:
            row["forward_ms"] = medians.get((forward, n))
            row["over_forward"] = row["median_ms"] / row["forward_ms"] if row["forward_ms"] else None
        medians[name, n] = row["median_ms"]
        record["results"].append(row)

        def cell(value, width, fmt):
            return f"{value:{width}{fmt}}" if value is not None else f"{'-':>{width}}"

        note = "" if not tag else ("  (big: under 16 GB)" if row.get("within_limit") else
                                   "  (big: OVER 16 GB)" if row.get("within_limit") is False else "  (big)")
        print(f"{name:<18}{n:>9}{1e3 * first:>10.1f}{1e3 * median:>11.2f}{cell(row.get('over_forward'), 7, '.1f')}"
              f"{cell(inc_ms, 9, '.1f')}"
              f"{cell(row['time_ratio'], 7, '.2f')}{cell(peak_mib, 10, '.1f')}{cell(inc_mib, 9, 'd')}"
              f"{cell(row['peak_ratio'], 7, '.2f')}{note}", flush=True)
        del fn
        if device.type == "cuda":
            torch.cuda.empty_cache()  # the next case's peak from its own allocations
    tag = card if device.type == "cuda" else f"{card}-{torch.get_num_threads()}threads"
    print(f"wrote {write_record(args.out, 'api_cases', tag, record)}")


if __name__ == "__main__":
    main()
