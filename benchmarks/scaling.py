"""Scaling over devices and processes (issue 26): an MRF dictionary forward and a flip gradient on 1 and 2
GPUs, in one process and under torchrun; and the CPU cost of gloo ranks against one process.

The work is the public API's: `MRFSimulator(flip=<500 flips 5 -> 60 -> 2 deg>, TR=10, states=32)` over T1/T2
log-uniform (blochsim._benchmark_cases), float32. "forward" is `simulate` (a dictionary); "gradient" the
gradient of sum |signal|^2 with respect to the 500 flips (a design step). Each configuration runs in fresh
processes (one call to warm up, then the median of --repeats), configurations alternated round by round
(--rounds, order reversed every other round) so a machine's drift falls on all of them alike.

  --case cpu   one process with every core (threads = cores) against torchrun --nproc-per-node 2 with one
               thread per rank, at --tissues (default 100000): distributed(gather=False) (each rank keeps its
               rows, as a dictionary written in parts) and gather=True (every rank gets the whole result)
               for the forward; gather=False (the sum of the ranks' losses) for the gradient. The overhead is
               ranks / one process - 1; the target is <= 10 %. Each rank also times its own tissues alone,
               outside the block ("local"): ranks / local - 1 is what the split itself costs (checksums,
               collectives, waiting for the other rank), apart from how one process uses its threads.
  --case gpu   1 GPU; 2 GPUs in one process (execution(['cuda:0', 'cuda:1']), tissue on cuda:0, results back
               there); torchrun with 2 ranks on one GPU each (distributed(gather=False), NCCL). Forward at
               --tissues (default 4000000), gradient at --grad-tissues (default 1000000). Throughput on 2 GPUs
               over 1; the target is >= 1.85 for both.

Run with the blochsim to measure importable (PYTHONPATH=. for the checkout). Writes a new
benchmarks/results/scaling-<machine>-<date>-<commit>.json (_records.py) and prints a table.
Workers: `scaling.py --worker one|ranks ...` (ranks under torchrun) print one line "RESULT <json>".
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import torch

REPETITIONS = 500
STATES = 32


# -- workers ---------------------------------------------------------------------------------------------
def _work(n: int, device: str, *, grad: bool, execution=None, rows=None):
    """One call of the case as a function of nothing (the tissues made once, on `device`; `rows`: only
    tissues [start, stop) of the n)."""
    import blochsim
    from blochsim._benchmark_cases import flips_deg, relaxation_maps
    from blochsim.simulators import MRFSimulator

    t1, t2 = relaxation_maps(n, device)
    if rows is not None:
        t1, t2 = t1[rows[0]:rows[1]].clone(), t2[rows[0]:rows[1]].clone()
    base = flips_deg(REPETITIONS)
    settings = {"states": STATES} if execution is None else {"states": STATES, "execution": execution}
    sim = MRFSimulator(TR=10.0)
    block = blochsim.distributed(gather=_GATHER) if _GATHER is not None else None

    def forward():
        if block is None:
            return sim.simulate(flip=base, T1=t1, T2=t2, **settings)
        with block:
            return sim.simulate(flip=base, T1=t1, T2=t2, **settings)

    def gradient():
        flips = base.clone().requires_grad_()
        if block is None:
            signal = sim.simulate(flip=flips, T1=t1, T2=t2, **settings)
        else:
            with block:
                signal = sim.simulate(flip=flips, T1=t1, T2=t2, **settings)
        return torch.autograd.grad((signal.abs() ** 2).sum(), flips)[0]

    return gradient if grad else forward


_GATHER = None  # a worker under torchrun sets it: the distributed() block's gather


def _timed(fn, repeats: int, cuda: bool, barrier=None) -> float:
    def sync():
        if cuda:
            for i in range(torch.cuda.device_count()):
                torch.cuda.synchronize(i)
        if barrier is not None:
            barrier()

    fn()  # first call: structure, caches, pinned buffers
    times = []
    for _ in range(repeats):
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def worker(args) -> None:
    global _GATHER
    cuda = args.device.startswith("cuda")
    result = {}
    if args.worker == "ranks":
        import torch.distributed as dist

        local = int(os.environ.get("LOCAL_RANK", "0"))
        device = f"cuda:{local}" if cuda else "cpu"
        if cuda:
            torch.cuda.set_device(local)
        dist.init_process_group("cpu:gloo,cuda:nccl" if cuda else "gloo")
        rank, world = dist.get_rank(), dist.get_world_size()
        _GATHER = None
        for kind in args.kinds:  # this rank's own tissues outside any block: what the split costs beside them
            n = args.grad_tissues if kind == "gradient" else args.tissues
            rows = (rank * n // world, (rank + 1) * n // world)
            result[f"{kind}/local"] = _timed(_work(n, device, grad=kind == "gradient", rows=rows), args.repeats,
                                             cuda, dist.barrier)
        for gather in args.gathers:
            _GATHER = gather == "gather"
            for kind in args.kinds:
                if kind == "gradient" and gather == "gather":
                    continue  # the design gradient is measured as the sum of the ranks' losses
                n = args.grad_tissues if kind == "gradient" else args.tissues
                fn = _work(n, device, grad=kind == "gradient")
                result[f"{kind}/{gather}"] = _timed(fn, args.repeats, cuda, dist.barrier)
        if dist.get_rank() == 0:
            print("RESULT " + json.dumps(result), flush=True)
        dist.destroy_process_group()
        return
    execution = list(args.devices) if args.devices else None
    device = args.device
    for kind in args.kinds:
        n = args.grad_tissues if kind == "gradient" else args.tissues
        result[kind] = _timed(_work(n, device, grad=kind == "gradient", execution=execution), args.repeats, cuda)
    print("RESULT " + json.dumps(result), flush=True)


# -- the orchestration -----------------------------------------------------------------------------------
def _run(command: list, env: dict) -> dict:
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    for line in done.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    raise RuntimeError(f"{' '.join(command)} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")


def _configurations(args) -> dict:
    """name -> (command, environment) of each configuration of the case."""
    me = [sys.executable, str(Path(__file__).resolve())]
    common = ["--tissues", str(args.tissues), "--grad-tissues", str(args.grad_tissues), "--repeats", str(args.repeats)]
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes", "1", "--nproc-per-node", "2"]
    env = dict(os.environ)
    if args.case == "cpu":
        cores = os.cpu_count() or 1
        one = {**env, "OMP_NUM_THREADS": str(cores), "BLOCHSIM_NUM_THREADS": str(cores)}
        ranks = {**env, "OMP_NUM_THREADS": "1", "BLOCHSIM_NUM_THREADS": "1"}
        return {
            "one process": (me + ["--worker", "one", "--device", "cpu"] + common, one),
            "2 gloo ranks": (torchrun + [me[1], "--worker", "ranks", "--device", "cpu", "--gathers", "shard",
                                         "gather"] + common, ranks),
        }
    return {
        "1 GPU": (me + ["--worker", "one", "--device", "cuda:0"] + common, env),
        "2 GPUs, one process": (me + ["--worker", "one", "--device", "cuda:0", "--devices", "cuda:0", "cuda:1"]
                                + common, env),
        "2 GPUs, torchrun": (torchrun + [me[1], "--worker", "ranks", "--device", "cuda", "--gathers", "shard"]
                             + common, env),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", choices=("cpu", "gpu"), default="cpu")
    parser.add_argument("--tissues", type=int, default=None)
    parser.add_argument("--grad-tissues", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--kinds", nargs="+", default=["forward", "gradient"])
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    parser.add_argument("--note", default="", help="recorded beside the numbers (e.g. what else ran)")
    # worker flags
    parser.add_argument("--worker", choices=("one", "ranks"), default=None)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--devices", nargs="+", default=None)
    parser.add_argument("--gathers", nargs="+", default=["shard"])
    args = parser.parse_args()
    gpu = args.case == "gpu"
    args.tissues = args.tissues or (4_000_000 if gpu else 100_000)
    args.grad_tissues = args.grad_tissues or (1_000_000 if gpu else args.tissues)
    if args.worker is not None:
        worker(args)
        return

    from _records import write_record

    configurations = _configurations(args)
    names = list(configurations)
    rounds = []
    for r in range(args.rounds):
        order = names if r % 2 == 0 else names[::-1]
        measured = {}
        for name in order:
            command, env = configurations[name]
            measured[name] = _run(command, env)
            print(f"round {r + 1} {name}: " + ", ".join(f"{k} {v:.3f} s" for k, v in measured[name].items()),
                  flush=True)
        rounds.append(measured)

    def median(name, key):
        return statistics.median(m[name][key] for m in rounds)

    summary = {}
    if gpu:
        base = names[0]
        for kind in args.kinds:
            one = median(base, kind)
            summary[kind] = {"1 GPU s": one,
                             "2 GPUs one process s": median(names[1], kind),
                             "2 GPUs torchrun s": median(names[2], f"{kind}/shard"),
                             "speedup one process": statistics.median(m[base][kind] / m[names[1]][kind]
                                                                      for m in rounds),
                             "speedup torchrun": statistics.median(m[base][kind] / m[names[2]][f"{kind}/shard"]
                                                                   for m in rounds)}
    else:
        for kind in args.kinds:
            gathers = ("shard", "gather") if kind == "forward" else ("shard",)
            summary[kind] = {"one process s": median(names[0], kind)}
            summary[kind]["ranks' own tissues alone s"] = median(names[1], f"{kind}/local")
            for gather in gathers:
                key = f"{kind}/{gather}"
                summary[kind][f"ranks {gather} s"] = median(names[1], key)
                summary[kind][f"overhead {gather}"] = statistics.median(m[names[1]][key] / m[names[0]][kind] - 1
                                                                        for m in rounds)
                summary[kind][f"split cost {gather}"] = statistics.median(
                    m[names[1]][key] / m[names[1]][f"{kind}/local"] - 1 for m in rounds)
    machine = torch.cuda.get_device_name(0) if gpu else (platform.processor() or platform.machine())
    record = {
        "task": "scaling",
        "case": args.case,
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": platform.node(),
        "processor": machine,
        "cpus": os.cpu_count(),
        "gpus": torch.cuda.device_count() if gpu else 0,
        "torch": torch.__version__,
        "tissues": args.tissues,
        "grad_tissues": args.grad_tissues,
        "repetitions": REPETITIONS,
        "states": STATES,
        "repeats": args.repeats,
        "rounds": rounds,
        "summary": summary,
        "note": args.note,
    }
    for kind, values in summary.items():
        print(f"{kind}: " + ", ".join(f"{k} {v:.3f}" for k, v in values.items()))
    print(f"wrote {write_record(args.out, 'scaling', machine if gpu else platform.node(), record)}")


if __name__ == "__main__":
    main()
