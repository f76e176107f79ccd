"""The Python layer's cost over the kernels (the structure cache: docs/design.md), on `MRFSimulator` with 500 flips.

Three numbers, each against the kernel call alone (`EpgSimulate.apply` on prepared buffers; the bare
`kernels.forward` is reported too):

* first call: the first call of a 500-flip structure, which walks the layout and compiles it (the
  process has made one call of another structure first, so one-time imports and torch warm-up are
  not counted; the very first call of the process is reported separately). Target: < 50 ms over the run.
* resolving call: the second call of the structure, which fits the affine value map (reported only).
* value-only call: later calls with new flip values, same shapes. Target: < 200 us over the run.

Also the compile alone (`engine.compile_program`) and the layout walk.

Small calls (issue 30 item 4): a design loop's warm call, `MRFSimulator(states=32).simulate` of fresh flips
(a new leaf tensor requiring grad each call) alone and with `backward()` of sum |signal|^2, as
benchmarks/compile_cases.py's eager row: its median wall time and its Python function calls (sys.setprofile
"call" events), beside the kernel passes alone (forward, and forward + flip VJP). `--baseline NAME` imports a
second copy of the package under another name (e.g. a checkout of an older commit copied to `blochsim_old`,
its `blochsim::` op namespace renamed) and alternates the same calls on it, round by round, in this process.

Run: python benchmarks/python_overhead.py [--voxels 1] [--repeats 300] [--baseline blochsim_old]
Writes a new benchmarks/results/python_overhead-<host><cpus>cpu-<voxels>vox-<date>-<commit>.json and prints a table.
"""

from __future__ import annotations

import argparse
import importlib
import os
import platform
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import torch
from _records import write_record

from blochsim._benchmark_cases import python_calls
from blochsim.engine import bind, compile_program, kernels
from blochsim.engine.functions import EpgSimulate
from blochsim.engine.tissue import pack_tissue
from blochsim.simulators import MRFSimulator

FLIPS = 500


def flips(n: int, shift: float = 0.0) -> torch.Tensor:
    half = n // 2
    return torch.cat([torch.linspace(5, 60, half), torch.linspace(60, 2, n - half)]) + shift


def cpu_model() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def small_call_cases(package: str, T1, T2, repeats: int) -> dict:
    """name -> fn(i) of the small-call rows, on `package` (blochsim or a renamed copy of it)."""
    simulators = importlib.import_module(f"{package}.simulators")
    engine = importlib.import_module(f"{package}.engine")
    sim = simulators.MRFSimulator(flip=flips(FLIPS), TR=10.0, states=32)
    shifted = [flips(FLIPS, 1e-3 * (i % 50)) for i in range(repeats)]  # new values each call, as a design loop

    def call(i):
        return sim.simulate(flip=shifted[i].clone().requires_grad_(), T1=T1, T2=T2)

    def call_and_gradient(i):
        torch.view_as_real(call(i)).square().sum().backward()

    for i in range(3):  # walk, resolve, resolved (and verified: the values differ)
        call_and_gradient(i)
    (entry,) = sim._cache.entries.values()
    values = entry.affine(flips(FLIPS).double(), torch.float64)
    fields = {"t1_ms": T1, "t2_ms": T2}
    static, inputs = engine.bind.kernel_inputs(entry.program, engine.tissue.pack_tissue(fields), fields,
                                               values=values)
    wanted = [i == 2 for i in range(len(inputs))]  # the flips

    def kernel_pair(i):
        signal = engine.kernels.forward(static, inputs)
        engine.kernels.vjp(static, inputs, 2 * signal, wanted)

    return {"simulate": call, "simulate_backward": call_and_gradient,
            "kernel_forward": lambda i: engine.kernels.forward(static, inputs), "kernel_forward_vjp": kernel_pair}


def small_calls(packages: list, T1, T2, repeats: int) -> dict:
    """{package: {row: {"median_us", "python_calls"}}}, the packages' calls alternated round by round."""
    cases = {package: small_call_cases(package, T1, T2, repeats) for package in packages}
    times = {package: {name: [] for name in rows} for package, rows in cases.items()}
    for i in range(repeats):
        for package, rows in cases.items():
            for name, fn in rows.items():
                start = time.perf_counter()
                fn(i)
                times[package][name].append(time.perf_counter() - start)
    return {package: {name: {"median_us": statistics.median(times[package][name]) * 1e6,
                             "python_calls": python_calls(lambda fn=fn: fn(0))}
                      for name, fn in rows.items()} for package, rows in cases.items()}


def median_us(fn, repeats: int) -> float:
    times = []
    for i in range(repeats):
        start = time.perf_counter()
        fn(i)
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--voxels", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=300)
    parser.add_argument("--baseline", help="a second copy of the package, by import name, timed alternately")
    args = parser.parse_args()
    g = torch.Generator().manual_seed(0)
    T1 = 300 + 2000 * torch.rand(args.voxels, generator=g)
    T2 = 20 + 200 * torch.rand(args.voxels, generator=g)

    start = time.perf_counter()
    MRFSimulator(flip=flips(10), TR=10.0).simulate(T1=T1, T2=T2)  # the process's first call (another structure)
    cold_ms = (time.perf_counter() - start) * 1e3

    sim = MRFSimulator(TR=10.0)
    start = time.perf_counter()
    sim.simulate(flip=flips(FLIPS), T1=T1, T2=T2)
    first_ms = (time.perf_counter() - start) * 1e3
    start = time.perf_counter()
    sim.simulate(flip=flips(FLIPS, 0.01), T1=T1, T2=T2)
    resolving_ms = (time.perf_counter() - start) * 1e3
    (entry,) = sim._cache.entries.values()
    assert entry.state == "resolved" and entry.verified
    other = MRFSimulator(TR=12.0)  # the same two calls on another structure: one-time costs are paid now
    other.simulate(flip=flips(FLIPS - 1), T1=T1, T2=T2)
    start = time.perf_counter()
    other.simulate(flip=flips(FLIPS - 1, 0.01), T1=T1, T2=T2)
    resolving_again_ms = (time.perf_counter() - start) * 1e3

    # The kernel call alone, on the buffers a value-only call prepares.
    values = entry.affine(flips(FLIPS).double(), torch.float64)
    fields = {"t1_ms": T1, "t2_ms": T2}
    static, inputs = bind.kernel_inputs(entry.program, pack_tissue(fields), fields, values=values)
    shifted = [flips(FLIPS, 1e-3 * i) for i in range(args.repeats)]
    run_us = median_us(lambda i: EpgSimulate.apply(static, *inputs), args.repeats)
    kernel_us = median_us(lambda i: kernels.forward(static, inputs), args.repeats)
    call_us = median_us(lambda i: sim.simulate(flip=shifted[i], T1=T1, T2=T2), args.repeats)
    unresolved = MRFSimulator(TR=10.0, resolve=False)
    walk_ms = median_us(lambda i: unresolved.simulate(flip=shifted[i], T1=T1, T2=T2), 5) / 1e3

    layout_ms = median_us(lambda i: sim.describe(flip=shifted[i]), 5) / 1e3
    # A fresh description each time: a constant program is kept on its description, so a repeated compile
    # of one description would time the cache (reported separately).
    fresh = [sim.describe(flip=shifted[i]) for i in range(10)]
    compile_ms = median_us(lambda i: compile_program(fresh[i], states=10), 5) / 1e3
    cached_us = median_us(lambda i: compile_program(fresh[0], states=10), 50)

    result = {
        "benchmark": "python_overhead",
        "machine": platform.node(),
        "processor": cpu_model(),
        "cpus": os.cpu_count(),
        "load_average_1min": os.getloadavg()[0],
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "threads": kernels.num_threads(),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "flips": FLIPS,
        "voxels": args.voxels,
        "first_call_of_process_ms": cold_ms,
        "first_call_ms": first_ms,
        "resolving_call_ms": resolving_ms,
        "resolving_call_of_a_second_structure_ms": resolving_again_ms,
        "sympy_imported": "sympy" in sys.modules,
        "unresolved_call_ms": walk_ms,
        "value_only_call_us": call_us,
        "run_us": run_us,
        "kernel_forward_us": kernel_us,
        "first_call_overhead_ms": first_ms - run_us / 1e3,
        "value_only_overhead_us": call_us - run_us,
        "value_only_overhead_over_bare_kernel_us": call_us - kernel_us,
        "layout_and_description_ms": layout_ms,
        "compile_program_ms": compile_ms,
        "compile_program_kept_us": cached_us,
    }
    packages = ["blochsim"] + ([args.baseline] if args.baseline else [])
    result["small_calls"] = small_calls(packages, T1, T2, args.repeats)
    if args.baseline:
        result["baseline_package"] = args.baseline
        baseline = importlib.import_module(args.baseline)
        result["baseline_source"] = str(Path(baseline.__file__).parent)
    host = f"{platform.node()}{os.cpu_count()}cpu-{args.voxels}vox"
    result["date"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
    path = write_record(Path(__file__).resolve().parent / "results", "python_overhead", host, result)
    width = max(len(k) for k in result)
    for key, value in result.items():
        if key == "small_calls":
            continue
        print(f"{key:<{width}}  {value:.3f}" if isinstance(value, float) else f"{key:<{width}}  {value}")
    for package, rows in result["small_calls"].items():
        for name, row in rows.items():
            print(f"small call {package:<14} {name:<18} {row['median_us']:9.1f} us  {row['python_calls']:4d} "
                  "Python calls")
    print(f"wrote {path}")
    print(f"targets: first call overhead < 50 ms: {result['first_call_overhead_ms'] < 50}; "
          f"value-only overhead < 200 us: {result['value_only_overhead_us'] < 200}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
