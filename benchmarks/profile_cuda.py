"""Where a call's time goes on the GPU: wall time against the blochsim kernels' and other kernels' GPU time.

Run: python benchmarks/profile_cuda.py [case:n ...] [--table] [--first]   (default: every case of kernel_cases.py)
Per case: wall ms of one synchronised call after a warm-up; GPU ms in blochsim kernels (and their names);
GPU ms and launches of other kernels (torch ops); the rest of the wall is host (Python) time.
--table adds torch.profiler's ops by host time. --first profiles each case's first call instead (no
warm-up): CUDA loads a kernel at its first launch, so the ops' host times show whose kernels a first call
waits for (cases run in the order given: `epg_real:2000 epg_complex:2000 epg_real_grad:2000 --first --table`
is kernel_cases.py's order up to its first gradient).
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).parent))
import kernel_cases as kc  # noqa: E402


def main() -> None:
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    table, first = "--table" in sys.argv, "--first" in sys.argv
    specs = [(a.split(":")[0], int(a.split(":")[1])) for a in args] or kc.DEFAULT_CASES
    dev = torch.device("cuda")
    print(f"{'case':<18}{'n':>9}{'wall':>9}{'bs gpu':>9}{'other gpu':>10}{'launches':>9}  bs kernels")
    for name, n in specs:
        fn = kc.case_fn(name, n, dev)
        if not first:
            fn()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            t0 = time.perf_counter()
            fn()
            torch.cuda.synchronize()
            wall = time.perf_counter() - t0
        bs, other, launches, names = 0.0, 0.0, 0, {}
        for ev in prof.events():
            if ev.device_type != torch.autograd.DeviceType.CUDA:
                continue
            us = ev.device_time
            if "bs::" in ev.name:
                bs += us
                short = ev.name.split("(")[0].replace("void ", "")
                names[short] = names.get(short, 0.0) + us / 1e3
            else:
                other += us
                launches += 1
        desc = ", ".join(f"{k} {v:.2f}" for k, v in names.items())
        row = f"{name:<18}{n:>9}{1e3 * wall:>9.2f}{bs / 1e3:>9.2f}{other / 1e3:>10.2f}{launches:>9}"
        print(f"{row}  {desc}", flush=True)
        if table:
            print(prof.key_averages().table(sort_by="cpu_time_total", row_limit=12, max_name_column_width=50))


if __name__ == "__main__":
    main()
