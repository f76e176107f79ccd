"""The CPU MRF cases of issue 20 item 12 (and the CPU ratio of issue 29) on the host, against the incumbent.

The train and tissues are kernel_cases.py's (an inversion, then 500 x (pulse, sample, one-order shift, 10 ms),
flips 5 -> 60 -> 2 degrees, 32 orders, float32; T1 log-uniform 200-3000 ms, T2 10-300 ms capped at 0.9 T1).
Cases, with the incumbent's best median on this machine class (2 threads, float32; ms per call):

    epg_real 10k          forward, real path                                  300
    epg_real_jac 10k      (T1, T2) Jacobian (engine.jacobian), real path    1,452
    epg_real_grad 10k     gradient of sum |signal|^2 w.r.t. the flips       1,236
    epg_complex 10k       forward, quadratic RF phases (complex path)       2,219
    epg_complex_jac 2k    (T1, T2) Jacobian, complex path                   3,275
    pooled 2k             3 pools (free, B, semisolid), 100 repetitions       400
    pooled5 500           5 pools, 100 repetitions                            412

and `loss 10k`, torch alone: the gradient case's loss, (x.abs() ** 2).sum() and its backward, on a complex64
[10k, 500] tensor, so the record shows how much of the gradient is torch's and how much the kernels'. Then
`hvp 2k` and `hvp 10k`: blochsim.hvp of the gradient case's cost along a fixed random direction in the flips
(forward over reverse: forward and JVP, torch's loss on dual tensors, one second-order pass; issue 24: at most
4 gradients), and `hvp_rr`, the same product by reverse over reverse (hvp's fallback and its method before:
forward, VJP, the second-order pass and one more VJP), beside `epg_real_grad` at the same tissue counts.

Every case runs in a worker process per variant (`--library`, repeatable: a kernel build each, or the library
blochsim finds when none is given), all kept warm; each round times one call of every case on every variant,
the cases and the variants alternated (the order reversed every other round), so a load that comes and goes
on the shared machine falls on all of them alike. Reported per case and variant: the median and the least of
the rounds, the ratio of the median to the incumbent's, and with two variants or more, the median over rounds
of each round's ratio to the first variant, in wall time and in CPU time (the worker's threads together:
what a build costs even while the shared machine keeps it waiting for a core). The gradient's ratio to the
forward (issue 29: at most 4x on the CPU) is taken round by round too, for every gradient case whose forward
runs at the same size (`--cases epg_complex:2000 epg_complex_grad:2000`), and so is the HVP's ratio to the
gradient.

Run (on the 2-core machine, quiet):
    PYTHONPATH=. python benchmarks/cpu_mrf_cases.py --threads 2 [--library build/a/libblochsim_cpu.so ...]
Writes a new benchmarks/results/cpu_mrf_cases-<machine>-<date>-<commit>.json (_records.py).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

from blochsim._benchmark_cases import CPU_INCUMBENT_MS

#: (case, tissues): the incumbent's best median on the 2-core machine class, ms per call (issue 20 item 12);
#: the cases are defined in the package (blochsim._benchmark_cases), shared with `blochsim bench`.
INCUMBENT_MS = CPU_INCUMBENT_MS
CASES = [*INCUMBENT_MS, ("loss", 10000), ("epg_real_grad", 2000), ("hvp", 2000), ("hvp", 10000), ("hvp_rr", 2000),
         ("hvp_rr", 10000)]
#: Issue 20 item 12's bound on the real cases: at most this fraction of the incumbent's time.
TARGET = 0.5


def case_fn(name: str, n: int, dtype: str = "float32"):
    """One call of a case, as a function of nothing (blochsim._benchmark_cases.case_fn, plus torch's loss)."""
    import torch

    from blochsim._benchmark_cases import case_fn as package_case

    if name == "loss":
        x = torch.randn(n, 500, dtype=torch.complex64, generator=torch.Generator().manual_seed(0))

        def loss():
            y = x.clone().requires_grad_()
            return torch.autograd.grad((y.abs() ** 2).sum(), y)[0]
        return loss
    if name in ("hvp", "hvp_rr"):
        from blochsim import engine, hvp
        from blochsim._benchmark_cases import STATES, flips_deg, tissue
        from blochsim.hvp import reverse_over_reverse
        from blochsim.sequence import mrf_description

        tissues, base = tissue(n, "cpu", ""), torch.deg2rad(flips_deg(500))
        direction = torch.randn(500, generator=torch.Generator().manual_seed(0))

        def cost(flips):
            signal = engine.simulate(mrf_description(flips, 0.010), tissues, states=STATES, dtype=getattr(torch, dtype))
            return (signal.abs() ** 2).sum()
        product = hvp if name == "hvp" else reverse_over_reverse
        return lambda: product(cost, base, direction)
    return package_case(name, n, "cpu", getattr(torch, dtype))


def worker(threads: int, dtype: str = "float32") -> None:
    """Serve timing requests on stdin, one JSON line each ({"case", "n"}), answering {"ms"} on stdout."""
    import torch

    torch.set_num_threads(threads)
    from blochsim import _native

    fns = {}
    print(json.dumps({"ready": True, "library": str(getattr(_native.cpu_library(), "_name", "")),
                      "torch": torch.__version__}), flush=True)
    for line in sys.stdin:
        ask = json.loads(line)
        key = (ask["case"], ask["n"])
        if key not in fns:
            fns[key] = case_fn(*key, dtype)
        t0, c0 = time.perf_counter(), time.process_time()
        fns[key]()
        print(json.dumps({"ms": 1e3 * (time.perf_counter() - t0), "cpu_ms": 1e3 * (time.process_time() - c0)}),
              flush=True)


class Variant:
    """A worker process running the cases on one kernel library (None: the one blochsim finds)."""

    def __init__(self, library: str | None, threads: int, dtype: str = "float32", setting: str | None = None):
        env = {**os.environ, "BLOCHSIM_NUM_THREADS": str(threads)}
        if library:
            env["BLOCHSIM_CPU_LIBRARY"] = str(Path(library).resolve())
        self.name = library or "default"
        if setting:  # NAME=VALUE in the worker's environment (--with-env)
            key, _, value = setting.partition("=")
            env[key] = value
            self.name += f" {setting}"
        command = [sys.executable, __file__, "--worker", "--threads", str(threads), "--dtype", dtype]
        self.proc = subprocess.Popen(command, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.info = self._read()

    def _read(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the worker for {self.name} stopped (its error is above)")
        return json.loads(line)

    def time(self, case: str, n: int) -> tuple[float, float]:
        """(wall ms, CPU ms of the worker's threads together) of one call."""
        self.proc.stdin.write(json.dumps({"case": case, "n": n}) + "\n")
        self.proc.stdin.flush()
        answer = self._read()
        return answer["ms"], answer["cpu_ms"]

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait()


def cpu_flags() -> list[str]:
    if not Path("/proc/cpuinfo").exists():
        return []
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("flags"):
            return [f for f in ("sse2", "avx2", "fma", "avx512f") if f in line.split()]
    return []


def digest(path: str) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:12] if path and Path(path).exists() else ""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--device", default="cpu", choices=["cpu"], help="the host only")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--library", action="append", help="a kernel build to time (repeat to alternate builds)")
    parser.add_argument("--with-env", action="append", metavar="NAME=VALUE",
                        help="one more variant: the first library with NAME=VALUE in its worker's environment "
                             "(repeatable), e.g. THP_MEM_ALLOC_ENABLE=1 (torch's host tensors on huge pages)")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--dtype", default="float32", choices=["float32", "float64"],
                        help="the cases' precision (the incumbent's times are float32's)")
    parser.add_argument("--cases", nargs="*",
                        help="case names (default: all), or name:tissues for any case of blochsim._benchmark_cases")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args()
    if args.worker:
        worker(args.threads, args.dtype)
        return
    from _records import machine_name, write_record

    cases = [c for c in CASES if not args.cases or c[0] in args.cases] + [
        (name, int(n)) for name, _, n in (c.partition(":") for c in args.cases or []) if n]
    variants = [Variant(lib, args.threads, args.dtype) for lib in (args.library or [None])]
    variants += [Variant((args.library or [None])[0], args.threads, args.dtype, setting)
                 for setting in args.with_env or []]
    record = {"task": "cpu_mrf_cases", "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
              "machine": machine_name(threads=args.threads), "platform": platform.platform(), "cpu_flags": cpu_flags(),
              "BLOCHSIM_HOST_ISA": os.environ.get("BLOCHSIM_HOST_ISA"), "threads": args.threads, "dtype": args.dtype,
              "rounds": args.rounds, "torch": variants[0].info["torch"], "target_fraction": TARGET,
              "variants": [{"name": v.name, "library": v.info["library"], "sha256": digest(v.info["library"])}
                           for v in variants], "results": [],
              # the machine is shared: the 1-minute load average as the run starts and ends
              "load_average_1min": {"start": os.getloadavg()[0]}}
    times = {(c, v.name): [] for c in cases for v in variants}
    cpu_times = {(c, v.name): [] for c in cases for v in variants}  # immune to waiting for a core, not to caches
    first = {}
    for c in cases:  # the first call of each case (a warm-up), then one more, untimed
        for v in variants:
            first[c, v.name] = v.time(*c)[0]
            v.time(*c)
    for r in range(args.rounds):
        order = [(c, v) for c in cases for v in variants]
        for c, v in order if r % 2 == 0 else order[::-1]:
            wall_ms, cpu_ms = v.time(*c)
            times[c, v.name].append(wall_ms)
            cpu_times[c, v.name].append(cpu_ms)
        print(f"round {r + 1}/{args.rounds} done", flush=True)
    for v in variants:
        v.close()
    record["load_average_1min"]["end"] = os.getloadavg()[0]

    def per_round(a, b):
        return statistics.median(x / y for x, y in zip(a, b, strict=True))

    print(f"{'case':<17}{'n':>7}{'variant':>10}{'median ms':>11}{'least':>9}{'incumbent':>11}{'ratio':>7}"
          f"{'vs first':>10}")
    for c in cases:
        inc = INCUMBENT_MS.get(c)
        for i, v in enumerate(variants):
            t = times[c, v.name]
            row = {"case": c[0], "n": c[1], "variant": v.name, "first_ms": first[c, v.name],
                   "median_ms": statistics.median(t), "least_ms": min(t), "times_ms": t, "incumbent_ms": inc,
                   "ratio": statistics.median(t) / inc if inc else None,
                   "ratio_to_first_variant": per_round(t, times[c, variants[0].name]) if i else None,
                   "cpu_median_ms": statistics.median(cpu_times[c, v.name]), "cpu_times_ms": cpu_times[c, v.name],
                   "cpu_ratio_to_first_variant":
                       per_round(cpu_times[c, v.name], cpu_times[c, variants[0].name]) if i else None}
            record["results"].append(row)
            vs = f"{row['ratio_to_first_variant']:10.3f}" if i else f"{'':>10}"
            ratio = f"{row['ratio']:7.3f}" if inc else f"{'':>7}"
            print(f"{c[0]:<17}{c[1]:>7}{i:>10}{row['median_ms']:>11.1f}{row['least_ms']:>9.1f}{inc or '':>11}"
                  f"{ratio}{vs}")
    if len(variants) > 1:  # CPU time: what a build costs when the shared machine keeps it waiting for a core
        print(f"{'case':<17}{'n':>7}{'variant':>10}{'CPU ms':>11}{'vs first':>10}")
        for row in record["results"]:
            if row["cpu_ratio_to_first_variant"] is not None:
                print(f"{row['case']:<17}{row['n']:>7}{row['variant']:>10}{row['cpu_median_ms']:>11.1f}"
                      f"{row['cpu_ratio_to_first_variant']:>10.3f}")
    # Each gradient case over its forward at the same size, round by round (issue 29: at most 4x on the CPU).
    # The real 10k case keeps its entry's keys; every other pair is keyed "<forward> <tissues>" beside it.
    record["gradient_over_forward"] = {}
    for grad in [c for c in cases if c[0].endswith("_grad")]:
        fwd, loss = (grad[0].removesuffix("_grad"), grad[1]), ("loss", grad[1])
        if fwd not in cases:
            continue
        for v in variants:
            ratio = per_round(times[grad, v.name], times[fwd, v.name])
            entry = {"gradient_over_forward": ratio}
            if fwd == ("epg_real", 10000) and loss in cases:  # without torch's loss and its backward
                entry["kernels_over_forward"] = statistics.median(
                    (g - ls) / f for g, ls, f in zip(times[grad, v.name], times[loss, v.name], times[fwd, v.name],
                                                     strict=True))
            ratios = record["gradient_over_forward"].setdefault(v.name, {})
            if fwd == ("epg_real", 10000):
                ratios.update(entry)
            else:
                ratios[f"{fwd[0]} {fwd[1]}"] = ratio
            print(f"{fwd[0]} {fwd[1]}: gradient / forward, variant {v.name}: {ratio:.2f}" +
                  (f" (without torch's loss: {entry['kernels_over_forward']:.2f})" if len(entry) > 1 else ""))
    record["hvp_over_gradient"] = {}
    for method in ("hvp", "hvp_rr"):
        for n in (2000, 10000):
            product, grad_n = (method, n), ("epg_real_grad", n)
            if product in cases and grad_n in cases:
                for v in variants:
                    ratio = per_round(times[product, v.name], times[grad_n, v.name])
                    key = str(n) if method == "hvp" else f"{n} reverse over reverse"
                    record["hvp_over_gradient"].setdefault(v.name, {})[key] = ratio
                    print(f"{method} / gradient at {n}, variant {v.name}: {ratio:.2f}")
    path = write_record(args.out, "cpu_mrf_cases", record["machine"], record)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
