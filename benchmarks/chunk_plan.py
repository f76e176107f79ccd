"""The launches the chunker plans for a case's adjoints on a card, from the CUDA library's answers, without one.

On a card the engine cuts an adjoint's voxels into launches whose scratch fits a cap (engine/kernels.py
`_Placed._plan`, engine/chunks.py `Runner.chunk`; the cap is _execution.default_scratch_bytes), at the
checkpoint stride with the least scratch, and the launch rules (csrc/include/blochsim/launch_rules.hpp) read
each launch's voxels, not the call's. A rule's crossing above the launches the cap allows never acts (the 29th
session's fixed-pool crossing at 5,000 voxels, docs/design.md). This runs a case on the host at a few tissues
and asks a CUDA library (the card's, or the emulated one tests/test_cuda_on_host.py builds:
BLOCHSIM_CUDA_ON_HOST_LIBRARY) for each adjoint pass's scratch, and plans the pass at the case's size with
the engine's own planner (kernels._Placed._plan: the stride it gives or the least-scratch one; chunks.Runner
.chunk: the launches under the cap): the strides, the bytes a voxel at each, the cap and the launches; with
--wave, whole waves of a kernel keeping that many voxels resident (else the library's resident voxels are not
asked: the emulated library's are not a card's). The call's own arrays are taken as the cotangent's bytes
(the signal's size, most of them): a lower bound of the engine's.

Run: python benchmarks/chunk_plan.py pooled_grad 20000 [--library PATH] [--wave 4224]
"""

from __future__ import annotations

import argparse
import ctypes
import dataclasses
import os
import types

import torch
from api_cases import case_fn

from blochsim import _execution
from blochsim.engine import chunks, kernels
from blochsim.engine.program import slots_at

_PROBE_TISSUES = 8  # the case runs on the host at this many tissues: its calls' structure, not its sizes
_CARD = torch.device("cuda")  # the device the plan is made for (a torch.device needs no card)


def plan(case: str, n: int, library: ctypes.CDLL, wave: int = 0, free_bytes: int = 80 * 2**30) -> list[dict]:
    """Per adjoint pass of `case` at n tissues: the strides, bytes a voxel, cap and launches (see above), by
    the engine's own planner (kernels._Placed._plan, chunks.Runner.chunk) on a card of `free_bytes` free."""
    library.bs_epg_scratch_bytes.restype = ctypes.c_int64
    rows, host_call, free_call = [], kernels._call, _execution.cuda_free_bytes

    def call(st, entry, args):
        if entry in kernels._ADJOINTS and not any(row["pass"] == entry for row in rows):
            probe = type(args).from_buffer_copy(args)  # the call's own args stay as they are
            slots = slots_at(st.action, st.num_repetitions)
            voxels = n * st.num_voxels // _PROBE_TISSUES  # a pass of several voxel copies (a Jacobian's columns)

            def scratch(c: int, stride: int) -> int:
                probe.tissue.num_voxels = c
                probe.program.checkpoint_stride = stride
                probe.program.checkpoint_slots = slots(stride)
                return int(library.bs_epg_scratch_bytes(kernels._PASSES[entry], ctypes.byref(probe)))

            per_voxel = st.num_samples * 8  # the cotangent: complex64 samples
            cap = _execution.default_scratch_bytes(entry, per_voxel * voxels, pool_tables=st.interval is not None)
            given = st.checkpoint_stride
            placed = types.SimpleNamespace(runner=chunks.Runner(_CARD, voxels, entry, cap), stride=given)
            resident = (lambda c, stride: wave) if wave else None
            launch = kernels._Placed._plan(placed, dataclasses.replace(st, num_voxels=voxels), entry, per_voxel,
                                           scratch, resident)
            rows.append({"pass": entry, "voxels": voxels, "given_stride": given, "stride": placed.stride,
                         "kib_a_voxel_given": scratch(voxels, given) / voxels / 1024,
                         "kib_a_voxel": scratch(voxels, placed.stride) / voxels / 1024, "cap_mib": cap / 2**20,
                         "launch_voxels": launch, "launches": -(-voxels // launch)})
        return host_call(st, entry, args)

    kernels._call = call
    _execution.cuda_free_bytes = lambda device: free_bytes  # what the planner asks of the driver
    try:
        case_fn(case, _PROBE_TISSUES, torch.device("cpu"))()
    finally:
        kernels._call, _execution.cuda_free_bytes = host_call, free_call
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
              f"{row['stride']}, {row['kib_a_voxel_given']:.1f} -> {row['kib_a_voxel']:.1f} KiB a voxel, "
              f"cap {row['cap_mib']:.0f} MiB: launches of {row['launch_voxels']} voxels, {row['launches']} of them")


if __name__ == "__main__":
    main()
