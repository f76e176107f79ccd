"""The launches the chunker plans for a case's adjoints on a card, from the CUDA library's answers, without one.

On a card the engine cuts an adjoint's voxels into launches whose scratch fits a cap (engine/kernels.py
`_Placed._plan`, engine/chunks.py `Runner.chunk`; the cap is _execution.default_scratch_bytes), at the
checkpoint stride with the least scratch, and the launch rules (csrc/include/blochsim/launch_rules.hpp) read
each launch's voxels, not the call's. A rule's crossing above the launches the cap allows never acts (the 29th
session's fixed-pool crossing at 5,000 voxels, docs/design.md). This runs a case on the host at a few tissues
and asks a CUDA library (the card's, or the emulated one tests/test_cuda_on_host.py builds:
BLOCHSIM_CUDA_ON_HOST_LIBRARY) for each adjoint pass's scratch at the case's size: the stride the call gives
and the least-scratch one, the bytes a voxel at each, the cap, the largest launch under it and the launches
that makes; with --wave, in whole waves of a kernel keeping that many voxels resident, or one wave where
the pass may stretch its cap to fill one (chunks.Runner._one_wave). The cap's held bytes are taken as the
cotangent's (the signal's size, most of the call's own arrays): a lower bound of the engine's.

Run: python benchmarks/chunk_plan.py pooled_grad 20000 [--library PATH] [--wave 4224]
"""

from __future__ import annotations

import argparse
import ctypes
import os

import torch
from api_cases import case_fn

from blochsim import _execution
from blochsim.engine import chunks, kernels
from blochsim.engine.program import slots_at

_PROBE_TISSUES = 8  # the case runs on the host at this many tissues: its calls' structure, not its sizes


def plan(case: str, n: int, library: ctypes.CDLL, wave: int = 0) -> list[dict]:
    """Per adjoint pass of `case` at n tissues: the strides, bytes a voxel, cap and launches (see above)."""
    library.bs_epg_scratch_bytes.restype = ctypes.c_int64
    rows, host_call = [], kernels._call
    tissues = n

    def call(st, entry, args):
        if entry in kernels._ADJOINTS and not any(row["pass"] == entry for row in rows):
            probe = type(args).from_buffer_copy(args)  # the call's own args stay as they are
            slots = slots_at(st.action, st.num_repetitions)
            n = tissues * st.num_voxels // _PROBE_TISSUES  # a pass of several voxel copies (a Jacobian's columns)

            def scratch(c: int, stride: int) -> int:
                probe.tissue.num_voxels = c
                probe.program.checkpoint_stride = stride
                probe.program.checkpoint_slots = slots(stride)
                return int(library.bs_epg_scratch_bytes(kernels._PASSES[entry], ctypes.byref(probe)))

            given = st.checkpoint_stride
            held = n * st.num_samples * 8  # the cotangent: complex64 samples
            cap = _execution.default_scratch_bytes(entry, held, pool_tables=st.interval is not None)
            least = given if scratch(n, given) <= cap else \
                chunks.least_scratch_stride(st.num_events * st.num_repetitions, given, lambda s: scratch(n, s))
            lo, hi = 0, n + 1  # the largest launch under the cap (scratch grows with the voxels)
            while hi - lo > 1:
                mid = (lo + hi) // 2
                lo, hi = (mid, hi) if scratch(mid, least) <= cap else (lo, mid)
            launch = n if lo >= n else (lo // wave * wave if wave and lo >= wave else lo)
            # under a wave, one wave where its scratch is within the pass's stretch of the cap (Runner._one_wave)
            stretch = kernels._FILL_WAVE.get(entry, 0.0)
            if wave and launch < min(wave, n) and stretch > 1 and scratch(min(wave, n), least) <= cap * stretch:
                launch = min(wave, n)
            rows.append({"pass": entry, "voxels": n, "given_stride": given, "least_stride": least,
                         "kib_a_voxel_given": scratch(n, given) / n / 1024,
                         "kib_a_voxel_least": scratch(n, least) / n / 1024,
                         "cap_mib": cap / 2**20, "launch_voxels": launch, "launches": -(-n // max(launch, 1))})
        return host_call(st, entry, args)

    kernels._call = call
    try:
        case_fn(case, _PROBE_TISSUES, torch.device("cpu"))()
    finally:
        kernels._call = host_call
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("case")
    parser.add_argument("n", type=int)
    parser.add_argument("--library", default=os.environ.get("BLOCHSIM_CUDA_ON_HOST_LIBRARY"),
                        help="a CUDA library answering bs_epg_scratch_bytes (default: BLOCHSIM_CUDA_ON_HOST_LIBRARY)")
    parser.add_argument("--wave", type=int, default=0, help="voxels a wave of the adjoint's kernel keeps resident")
    args = parser.parse_args()
    if not args.library:
        parser.error("--library or BLOCHSIM_CUDA_ON_HOST_LIBRARY: a CUDA library to ask")
    for row in plan(args.case, args.n, ctypes.CDLL(args.library), args.wave):
        print(f"{args.case} {args.n}: {row['pass']} of {row['voxels']} voxels, stride {row['given_stride']} -> "
              f"{row['least_stride']}, {row['kib_a_voxel_given']:.1f} -> {row['kib_a_voxel_least']:.1f} KiB a voxel, "
              f"cap {row['cap_mib']:.0f} MiB: launches of {row['launch_voxels']} voxels, {row['launches']} of them")


if __name__ == "__main__":
    main()
