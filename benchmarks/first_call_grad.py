"""Where the first epg_real_grad call of a process goes (kernel_cases.py's case, on a CUDA device).

As in kernel_cases.py, the epg_real and epg_complex cases run first; then the first gradient call runs under
torch.profiler: its wall time, the longest launch and copy calls, and the ops that took longest (with the
kernels they launched). CUDA loads a kernel at its first launch, so a first call shows where that goes.
Run: python benchmarks/first_call_grad.py [--n 2000]
"""

from __future__ import annotations

import argparse
import time

import kernel_cases as kc
import torch
from torch.profiler import ProfilerActivity, profile

_CALLS = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cudaMemcpyAsync", "cudaStreamSynchronize")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=2000, help="tissues")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("first_call_grad.py needs a CUDA device")
    for name in ("epg_real", "epg_complex"):
        fn = kc.case_fn(name, args.n, "cuda")
        fn()
        fn()
    grad = kc.case_fn("epg_real_grad", args.n, "cuda")
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        t0 = time.perf_counter()
        grad()
        torch.cuda.synchronize()
        first = time.perf_counter() - t0
    t0 = time.perf_counter()
    grad()
    torch.cuda.synchronize()
    print(f"first {1e3 * first:.1f} ms (under the profiler), second {1e3 * (time.perf_counter() - t0):.1f} ms")
    host = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CPU]
    calls = sorted((e for e in host if e.name in _CALLS), key=lambda e: -e.cpu_time_total)
    print(f"launch and copy calls: {len(calls)}, {sum(e.cpu_time_total for e in calls) / 1e3:.1f} ms")
    for e in calls[:10]:
        print(f"  {e.cpu_time_total / 1e3:7.2f} ms {e.name:20s} (under {getattr(e.cpu_parent, 'name', '?')[:60]})")
    ops = sorted((e for e in host if e.name.startswith("aten::") or "Backward" in e.name or "Epg" in e.name),
                 key=lambda e: -e.cpu_time_total)
    for e in ops[:12]:
        kernels = sorted({k.name[:50] for k in getattr(e, "kernels", [])})
        print(f"  op {e.cpu_time_total / 1e3:7.2f} ms {e.name[:50]:50s} {kernels[:2]}")


if __name__ == "__main__":
    main()
