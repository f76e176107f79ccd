"""The plain group adjoint's host emulation (libgroup_emulation.so, built by run.sh) against the host
library's VJP, both reached through the public API (the engine's VJP call is routed to the emulation):

1. every input's gradient of Re<w, signal> on tests/test_engine_lanes.py's trains (carried shifts, MRF with
   an inversion, SPGR over repetitions) x B1 per voxel or shared x checkpoint strides 1, 3, 4, 7, 16 x groups
   of 4 and 8 lanes, 32 orders, float32;
2. the flip gradient of benchmarks/api_cases.py's epg_real_grad (MRFSimulator, 500 flips) on a few tissues.

Each gradient is held to the host's within 1e-5 of its own largest entry: the two sum the same terms in
another order (per lane, then over the group), float32's rounding; a lane's recovery counted on every lane,
or a sample read on every lane, moves them by 1e-3 to 1 (run.sh's mutations)."""
import ctypes
import os
import sys

import torch

TREE = os.environ["TREE"]
sys.path[:0] = [os.path.join(TREE, "tests"), os.path.join(TREE, "benchmarks")]
import api_cases  # noqa: E402
from test_engine_lanes import TRAINS, described, inputs  # noqa: E402

import blochsim.engine.kernels as K  # noqa: E402
from blochsim.engine import simulate  # noqa: E402

TOLERANCE = 1e-5
emulation = ctypes.CDLL(os.environ["EMULATION"])
emulation.emul_last_error.restype = ctypes.c_char_p
host_call, LANES = K._call, [0]


def routed(st, entry, args):
    """The engine's kernel call, its first-order VJP taken by the emulation while LANES[0] is set."""
    if entry == "bs_epg_vjp" and LANES[0]:
        if emulation.emul_vjp_lanes(ctypes.byref(args), LANES[0]):
            raise RuntimeError(emulation.emul_last_error().decode())
        return
    host_call(st, entry, args)


K._call = routed


def gradients(train: str, x: dict, stride: int, lanes: int) -> dict:
    LANES[0] = lanes
    leaves = {k: v.float().detach().clone().requires_grad_() for k, v in x.items()}
    description, tissue, repetitions = described(train, leaves)
    signal = simulate(description, tissue, states=32, repetitions=repetitions, dtype=torch.float32, path="real",
                      checkpoint_stride=stride)
    g = torch.Generator().manual_seed(6)
    w = torch.complex(torch.randn(signal.shape, generator=g), torch.randn(signal.shape, generator=g))
    out = torch.autograd.grad((w.conj() * signal).real.sum(), list(leaves.values()))
    LANES[0] = 0
    return dict(zip(leaves, out))


def error(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got - want).abs().max() / want.abs().max())


quick = os.environ.get("QUICK") == "1"
failures, worst = [], 0.0
for train in (("carried", "mrf") if quick else TRAINS):
    for b1 in ("per_voxel", "shared"):
        x = inputs(train, b1)
        for stride in ((4,) if quick else (1, 3, 4, 7, 16)):
            want = gradients(train, x, stride, 0)
            for lanes in (4, 8):
                got = gradients(train, x, stride, lanes)
                errors = {k: error(got[k], want[k]) for k in want}
                worst = max(worst, *errors.values())
                bad = {k: f"{e:.1e}" for k, e in errors.items() if not e < TOLERANCE}
                failures += [(train, b1, stride, lanes, bad)] if bad else []
                print(f"{train:8s} {b1:9s} stride {stride:2d} lanes {lanes}: {max(errors.values()):.1e}"
                      + (f"  over {TOLERANCE}: {bad}" if bad else ""), flush=True)
case = api_cases.case_fn("epg_real_grad", 3, torch.device("cpu"))
want = case()
for lanes in (8, 4):
    LANES[0] = lanes
    e = error(case(), want)
    LANES[0] = 0
    worst = max(worst, e)
    failures += [("epg_real_grad", lanes, e)] if not e < TOLERANCE else []
    print(f"epg_real_grad 3 tissues lanes {lanes}: flips {want.numel()}, {e:.1e}", flush=True)
print(f"largest error {worst:.1e}; {'FAILED: ' + str(failures) if failures else 'every gradient within'} "
      f"{TOLERANCE}")
sys.exit(1 if failures else 0)
