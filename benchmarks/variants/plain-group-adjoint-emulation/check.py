"""A host emulation of the plain group adjoint (EMULATION: libgroup_emulation.so, its group path, or
libkernel_emulation.so, the kernel's own source; run.sh builds both) against the host library, both reached
through the public API (the engine's adjoint calls routed to the emulation):

1. first order: every input's gradient of Re<w, signal>;
2. second order: a Hessian-vector product by double backward of sum |signal|^2 (every input, along a fixed
   random direction in all of them), and the flip gradient of a Jacobian's cost, sum |dS/d(T1, T2)|^2 (one
   second-order pass per tangent, its sweep writing the signal and its tangent);

on tests/test_engine_lanes.py's trains (carried shifts, MRF with an inversion, SPGR over repetitions) x B1 per
voxel or shared x checkpoint strides 1, 3, 4, 7, 16 x groups of 4 and 8 lanes, 32 orders, float32; then the
flip gradient of benchmarks/api_cases.py's epg_real_grad and epg_real_hvp (MRFSimulator, 500 flips) on a few
tissues.

Each result is held to the host's within 1e-5 of its own largest entry (first order) or 1e-4 (second
order): the two sum the same terms in another order (per lane, then over the group), float32's rounding, the
second order through one more chain of products; a lane's recovery counted on every lane, or a sample read
on every lane, moves them by 1e-3 to 1 (run.sh's mutations)."""
import ctypes
import os
import sys

import torch

TREE = os.environ["TREE"]
sys.path[:0] = [os.path.join(TREE, "tests"), os.path.join(TREE, "benchmarks")]
import api_cases  # noqa: E402
from test_engine_lanes import TRAINS, described, inputs  # noqa: E402

import blochsim.engine.kernels as K  # noqa: E402
from blochsim.engine import jacobian, simulate  # noqa: E402

FIRST, SECOND = 1e-5, 1e-4
emulation = ctypes.CDLL(os.environ["EMULATION"])
emulation.emul_last_error.restype = ctypes.c_char_p
ENTRIES = {"bs_epg_vjp": emulation.emul_vjp_lanes, "bs_epg_vjp_jvp": emulation.emul_vjp_jvp_lanes}
host_call, LANES = K._call, [0]


def routed(st, entry, args):
    """The engine's kernel call, its adjoints taken by the emulation while LANES[0] is set."""
    if entry in ENTRIES and LANES[0]:
        if ENTRIES[entry](ctypes.byref(args), LANES[0]):
            raise RuntimeError(emulation.emul_last_error().decode())
        return
    host_call(st, entry, args)


K._call = routed


def power(signal: torch.Tensor) -> torch.Tensor:
    return (signal.real.square() + signal.imag.square()).sum()


def first_order(train: str, x: dict, stride: int) -> dict:
    leaves = {k: v.float().detach().clone().requires_grad_() for k, v in x.items()}
    description, tissue, repetitions = described(train, leaves)
    signal = simulate(description, tissue, states=32, repetitions=repetitions, dtype=torch.float32, path="real",
                      checkpoint_stride=stride)
    g = torch.Generator().manual_seed(6)
    w = torch.complex(torch.randn(signal.shape, generator=g), torch.randn(signal.shape, generator=g))
    return dict(zip(leaves, torch.autograd.grad((w.conj() * signal).real.sum(), list(leaves.values()))))


def second_order(train: str, x: dict, stride: int) -> dict:
    leaves = {k: v.float().detach().clone().requires_grad_() for k, v in x.items()}
    description, tissue, repetitions = described(train, leaves)
    signal = simulate(description, tissue, states=32, repetitions=repetitions, dtype=torch.float32, path="real",
                      checkpoint_stride=stride)
    first = torch.autograd.grad(power(signal), list(leaves.values()), create_graph=True)
    g = torch.Generator().manual_seed(8)
    directions = [torch.randn(f.shape, generator=g) for f in first]
    hv = torch.autograd.grad(sum((f * d).sum() for f, d in zip(first, directions)), list(leaves.values()))
    out = {f"hvp/{k}": h for k, h in zip(leaves, hv)}
    _, J = jacobian(described(train, leaves)[0], tissue, ("t1_ms", "t2_ms"), states=32, repetitions=repetitions,
                    dtype=torch.float32, path="real", checkpoint_stride=stride)
    events = [v for k, v in leaves.items() if k in ("flips", "tr_s")]
    if events:
        out.update({f"jacobian cost/{k}": h for k, h in zip(("flips", "tr_s"), torch.autograd.grad(power(J), events))})
    return out


def error(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got - want).abs().max() / want.abs().max()) if want.abs().max() > 0 else float(got.abs().max())


def compare(label: str, compute, tolerance: float) -> None:
    global worst
    LANES[0] = 0
    want = compute()
    for lanes in (4, 8):
        LANES[0] = lanes
        got = compute()
        LANES[0] = 0
        errors = {k: error(got[k], want[k]) for k in want}
        worst[tolerance] = max(worst[tolerance], *errors.values())
        bad = {k: f"{e:.1e}" for k, e in errors.items() if not e < tolerance}
        failures.extend([(label, lanes, bad)] if bad else [])
        print(f"{label} lanes {lanes}: {max(errors.values()):.1e}" + (f"  over {tolerance}: {bad}" if bad else ""),
              flush=True)


quick = os.environ.get("QUICK") == "1"
failures, worst = [], {FIRST: 0.0, SECOND: 0.0}
for train in (("carried", "mrf") if quick else TRAINS):
    for b1 in ("per_voxel", "shared"):
        x = inputs(train, b1)
        for stride in ((4,) if quick else (1, 3, 4, 7, 16)):
            label = f"{train:8s} {b1:9s} stride {stride:2d}"
            compare(f"{label} first ", lambda: first_order(train, x, stride), FIRST)
            compare(f"{label} second", lambda: second_order(train, x, stride), SECOND)
for case, tolerance in (("epg_real_grad", FIRST), ("epg_real_hvp", SECOND)):
    call = api_cases.case_fn(case, 3, torch.device("cpu"))
    compare(f"{case} 3 tissues", lambda: {"flips": call()}, tolerance)
print(f"largest errors: first order {worst[FIRST]:.1e}, second {worst[SECOND]:.1e}; "
      f"{'FAILED: ' + str(failures) if failures else 'every result within its tolerance'}")
sys.exit(1 if failures else 0)
