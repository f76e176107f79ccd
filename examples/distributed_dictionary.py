"""An MRF dictionary computed by several processes, each on its own share of the tissues.

One node, two processes (CPUs through gloo, or one GPU each through NCCL):

    torchrun --standalone --nproc-per-node 2 examples/distributed_dictionary.py --tissues 1000000 --out dict.npy

Several nodes (run the same line on every node; HOST is one of them):

    torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint HOST:29400 --rdzv-id mrf \\
        examples/distributed_dictionary.py --tissues 10000000 --out /shared/dict.npy

Without torchrun it runs in this one process. Every rank builds the same tissues (same seed): inside
`blochsim.distributed(gather=False)` each simulates only its contiguous range of them, `blochsim.shard_of`
says which, and each writes its rows into one .npy file that rank 0 created (on a file system every node
sees). `--out X.npy` writes the signals (tissues, repetitions) complex64, and `X-parameters.npy` the
(T1, T2) of each row in ms. With CUDA each process uses device LOCAL_RANK and its tissues are made there.
"""

from __future__ import annotations

import argparse
import datetime
import math
import os
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

import blochsim
from blochsim.simulators import MRFSimulator

TR_MS = 10.0


def flips_deg(repetitions: int) -> torch.Tensor:
    """A flip ramp 5 -> 60 -> 2 degrees, as in benchmarks/mrf_dictionary.py."""
    half = repetitions // 2
    return torch.cat([torch.linspace(5, 60, half), torch.linspace(60, 2, repetitions - half)])


def tissues(count: int, seed: int, device="cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """T1 log-uniform in 200-3000 ms and T2 in 10-300 ms: the same on every rank for the same seed."""
    g = torch.Generator().manual_seed(seed)
    t1 = torch.exp(torch.empty(count).uniform_(math.log(200), math.log(3000), generator=g))
    t2 = torch.exp(torch.empty(count).uniform_(math.log(10), math.log(300), generator=g))
    return t1.to(device), t2.to(device)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tissues", type=int, default=100_000)
    parser.add_argument("--repetitions", type=int, default=500)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()

    launched = "WORLD_SIZE" in os.environ  # set by torchrun
    device = torch.device("cpu")
    if launched:
        if torch.cuda.is_available():
            device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
            torch.cuda.set_device(device)
        # host tensors through gloo, CUDA tensors through NCCL; a rank that fails stops the others within 10 min
        dist.init_process_group("cpu:gloo,cuda:nccl" if device.type == "cuda" else "gloo",
                                timeout=datetime.timedelta(minutes=10))
    rank = dist.get_rank() if launched else 0

    t1, t2 = tissues(args.tissues, args.seed, device)
    sim = MRFSimulator(flip=flips_deg(args.repetitions), TR=TR_MS)
    began = time.perf_counter()
    if launched:
        with blochsim.distributed(gather=False):
            signals = sim.simulate(T1=t1, T2=t2)  # this rank's rows only
        start, stop, total = blochsim.shard_of(signals)
    else:
        signals = sim.simulate(T1=t1, T2=t2)
        start, stop, total = 0, args.tissues, args.tissues
    seconds = time.perf_counter() - began

    shape = (total, args.repetitions)
    parameters = args.out.with_name(args.out.stem + "-parameters.npy")
    if rank == 0:
        np.lib.format.open_memmap(args.out, mode="w+", dtype=np.complex64, shape=shape).flush()
        np.save(parameters, torch.stack([t1, t2], 1).cpu().numpy())
    if launched:
        dist.barrier()  # the file exists before anyone writes into it
    rows = np.lib.format.open_memmap(args.out, mode="r+")
    rows[start:stop] = signals.cpu().numpy()
    rows.flush()
    del rows
    if launched:
        dist.barrier()  # every rank's rows are written
        dist.destroy_process_group()
    print(f"rank {rank}: tissues [{start}, {stop}) of {total} in {seconds:.2f} s -> {args.out}")


if __name__ == "__main__":
    main()
