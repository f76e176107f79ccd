"""The benchmark cases: the MRF trains and tissues every speed record of blochsim is measured on.

One definition, shared by the scripts in benchmarks/ (kernel_cases.py, api_cases.py, cpu_mrf_cases.py) and
by `blochsim bench`, so a table printed on a user's machine measures what the recorded tables measured.

The train: an inversion, then per repetition excitation + sample + one-order shift + 10 ms; flips ramping
5 -> 60 -> 2 degrees; 32 orders; float32; T1 log-uniform in 200-3000 ms, T2 log-uniform in 10-300 ms capped
at 0.9 T1. `epg_*`: 500 repetitions (`complex`: quadratic RF phases, 117 degree increment); `pooled*`: 100
repetitions with exchanging and semisolid pools. `_grad`: gradient of sum |signal|^2 w.r.t. the flips;
`_jac`: the (T1, T2) Jacobian (forward mode); `_hvp`: the (T1, T2) Jacobian with the flips requiring grad,
then the gradient of sum |J|^2 w.r.t. the flips.
"""

from __future__ import annotations

import math
import statistics
import sys
import time

import torch

from . import engine
from .sequence import TissueProperties, mrf_description

__all__ = ["STATES", "POOLS", "INCUMBENT_MS", "CPU_INCUMBENT_MS", "DEFAULT_CASES", "flips_deg", "relaxation_maps",
           "tissue", "case_train", "is_case", "case_fn", "sync", "measure", "python_calls", "select_cases"]

#: EPG orders of every case.
STATES = 32
POOL_B = dict(pool_b_fraction=0.15, pool_b_exchange_hz=10.0, t1_pool_b_ms=500.0, t2_pool_b_ms=20.0)
SEMISOLID = dict(bound_fraction=0.1, bound_exchange_hz=4.3, t1_bound_ms=1000.0)
POOL_C = dict(pool_c_fraction=0.05, pool_c_exchange_hz=20.0, t1_pool_c_ms=800.0, t2_pool_c_ms=40.0,
              pool_c_shift_hz=50.0)
POOL_D = dict(pool_d_fraction=0.03, pool_d_exchange_hz=30.0, t1_pool_d_ms=900.0, t2_pool_d_ms=60.0,
              pool_d_shift_hz=-80.0)
#: Pool family of a case name -> the pool properties of its tissue (engine field names).
POOLS = {"": {}, "pooled": {**POOL_B, **SEMISOLID}, "pooledb": POOL_B,
         "pooled5": {**POOL_B, **POOL_C, **POOL_D, **SEMISOLID}}

#: The incumbent blochsim 0.0.14 (CUDA 13 build) on an H200, median ms per call (issue 6).
INCUMBENT_MS = {
    ("epg_real", 2000): 3.04, ("epg_real", 100000): 8.79, ("epg_real", 1000000): 56.1,
    ("epg_complex", 2000): 4.74, ("epg_complex", 100000): 14.5,
    ("epg_real_grad", 2000): 23.3, ("epg_real_grad", 100000): 899.0, ("epg_complex_grad", 20000): 563.0,
    ("epg_real_hvp", 2000): 121.0, ("epg_real_hvp", 20000): 967.0, ("epg_complex_hvp", 5000): 989.0,
    ("pooled", 2000): 4.37, ("pooled", 50000): 7.67, ("pooled_grad", 20000): 225.0, ("pooled_hvp", 5000): 1600.0,
    ("pooledb_hvp", 20000): 1603.0, ("pooled5", 500): 10.1, ("pooled5", 5000): 13.1, ("pooled5_grad", 2000): 47.0,
}

#: The incumbent's best median on the 2-core CPU machine class (2 threads, float32), ms per call (issue 20).
CPU_INCUMBENT_MS = {
    ("epg_real", 10000): 300.0,
    ("epg_real_jac", 10000): 1452.0,
    ("epg_real_grad", 10000): 1236.0,
    ("epg_complex", 10000): 2219.0,
    ("epg_complex_jac", 2000): 3275.0,
    ("pooled", 2000): 400.0,
    ("pooled5", 500): 412.0,
}

#: The GPU cases (those with an H200 time of the incumbent).
DEFAULT_CASES = list(INCUMBENT_MS)


def flips_deg(n: int) -> torch.Tensor:
    """n flips in degrees: 5 -> 60 over the first half, 60 -> 2 over the second."""
    return torch.cat([torch.linspace(5, 60, n // 2), torch.linspace(60, 2, n - n // 2)])


def relaxation_maps(n: int, device) -> tuple:
    """(T1, T2) in ms of n tissues: T1 log-uniform 200-3000, T2 log-uniform 10-300 capped at 0.9 T1 (seed 0)."""
    g = torch.Generator().manual_seed(0)
    t1 = torch.exp(torch.empty(n).uniform_(math.log(200), math.log(3000), generator=g))
    t2 = torch.minimum(torch.exp(torch.empty(n).uniform_(math.log(10), math.log(300), generator=g)), 0.9 * t1)
    return t1.to(device), t2.to(device)


def tissue(n: int, device, pools: str) -> TissueProperties:
    """The n tissues of `relaxation_maps` with the pool properties of the family `pools` (a key of POOLS)."""
    t1, t2 = relaxation_maps(n, device)
    return TissueProperties(t1_ms=t1, t2_ms=t2, **POOLS[pools])


def case_train(name: str) -> tuple:
    """(quadratic RF phases?, repetitions, pool family, derivative kind) of a case name."""
    family, _, kind = name.partition("_")
    if family == "epg":
        return kind.startswith("complex"), 500, "", kind.partition("_")[2]
    return False, 100, family, kind


def is_case(name: str) -> bool:
    """Whether `name` is a case: epg_real, epg_complex, pooled, pooledb or pooled5, optionally followed by
    _grad, _jac or _hvp."""
    family, _, rest = name.partition("_")
    if family == "epg":
        path, _, kind = rest.partition("_")
        return path in ("real", "complex") and kind in ("", "grad", "jac", "hvp")
    return family in POOLS and family != "" and rest in ("", "grad", "jac", "hvp")


def case_fn(name: str, n: int, device, dtype: torch.dtype = torch.float32):
    """One call of the case `name` at n tissues on `device` in precision `dtype`, as a function of nothing.

    Raises ValueError for a name that is not a case (`is_case`).
    """
    if not is_case(name):
        raise ValueError(f"unknown benchmark case {name!r}: a case is epg_real, epg_complex, pooled, pooledb or "
                         f"pooled5, optionally followed by _grad, _jac or _hvp")
    quadratic, reps, pools, kind = case_train(name)
    tis = tissue(n, device, pools)
    phases = [math.radians(117) * k * (k + 1) / 2 for k in range(reps)] if quadratic else 0
    base = torch.deg2rad(flips_deg(reps))

    def describe(flips):
        return mrf_description(flips, 0.010, phases_rad=phases)

    if kind == "":
        train = describe(base)
        return lambda: engine.simulate(train, tis, states=STATES, dtype=dtype)
    if kind == "jac":
        train = describe(base)
        return lambda: engine.jacobian(train, tis, ("t1_ms", "t2_ms"), states=STATES, dtype=dtype)
    if kind == "grad":
        def grad():
            flips = base.clone().requires_grad_()
            signal = engine.simulate(describe(flips), tis, states=STATES, dtype=dtype)
            return torch.autograd.grad((signal.abs() ** 2).sum(), flips)[0]
        return grad

    def hvp():
        flips = base.clone().requires_grad_()
        _, J = engine.jacobian(describe(flips), tis, ("t1_ms", "t2_ms"), states=STATES, dtype=dtype)
        return torch.autograd.grad((J.abs() ** 2).sum(), flips)[0]
    return hvp


def sync(device) -> None:
    """Wait for the device's queued work (CUDA); nothing on the host."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def peak_bytes(fn, device) -> int | None:
    """The peak CUDA allocation of one call of `fn` (bytes; None off a card): the memory beside a case's time."""
    if torch.device(device).type != "cuda":
        return None
    sync(device)
    torch.cuda.reset_peak_memory_stats()
    fn()
    sync(device)
    return torch.cuda.max_memory_allocated()


def python_calls(fn) -> int:
    """The Python function calls made while fn() runs (in this thread)."""
    count = 0

    def profile(frame, event, arg):
        nonlocal count
        if event == "call":
            count += 1

    sys.setprofile(profile)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return count


def measure(fn, device, repeats: int, warm: int = 1):
    """(first call s, median of `repeats` calls after `warm` more s, peak CUDA allocation bytes or None)."""
    sync(device)
    if torch.device(device).type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    fn()
    sync(device)
    first = time.perf_counter() - t0
    for _ in range(warm):
        fn()
    times = []
    for _ in range(repeats):
        sync(device)
        t0 = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - t0)
    peak = torch.cuda.max_memory_allocated() if torch.device(device).type == "cuda" else None
    return first, statistics.median(times), peak


def select_cases(known: list, names: list | None, counts: list | None, quick: bool) -> list:
    """(case, tissues) pairs to run: `known` filtered by `names`, or every named case at `counts`; with
    `quick`, only each case's smallest size."""
    cases = [c for c in known if not names or c[0] in names]
    if counts:
        cases = [(name, n) for name in (names or sorted({name for name, _ in known})) for n in counts]
    if quick:
        smallest = {}
        for name, n in cases:
            smallest[name] = min(n, smallest.get(name, n))
        cases = sorted(smallest.items())
    return cases
