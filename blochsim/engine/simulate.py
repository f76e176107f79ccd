"""Simulate a `SequenceDescription` with the kernels: pack the tissue, compile, and run (`engine.bind.run`)."""

from __future__ import annotations

import dataclasses

import torch

from .. import _native as nat
from .bind import run
from .program import TrainAxisError, compile_program
from .pulses import transmit_channels
from .tissue import pack_tissue
from .vmap import loop_under_vmap

__all__ = ["simulate", "jacobian", "prepare"]

_PATHS = ("auto", "real", "complex")


def prepare(description, tissue, *, states, repetitions, record, dtype, path, checkpoint_stride, active=(),
            across_slice=None):
    """Pack and compile: (program, packed tissue). The packing checks the tissue and says whether it needs
    the complex path. B1 and B1phase carry a channel axis when the description defines shims or dynamic
    pTx pulses (`engine.pulses.transmit_channels`)."""
    if path not in _PATHS:
        raise ValueError(f"path must be one of {_PATHS}, got {path!r}")
    if dtype not in (torch.float32, torch.float64):
        raise ValueError(f"dtype must be torch.float32 or torch.float64, got {dtype}")
    channels = transmit_channels(description.shim_definitions, description.rf_definitions)
    packed = pack_tissue(tissue, dtype=dtype, active=active, channels=channels)
    program = compile_program(
        description,
        repetitions=repetitions,
        record=record,
        states=states,
        complex_states=packed.phase_physics or path == "complex",
        checkpoint_stride=checkpoint_stride,
        slice_profile=across_slice,
    )
    if path == "real" and program.path != nat.PATH_REAL:
        raise ValueError(
            "path='real' needs every pulse on one phase axis (modulo half turns), no differentiated RF phase, "
            "and no B0, B1phase, v or pool shifts; this sequence or tissue needs the complex path"
        )
    return program, packed


@loop_under_vmap
def simulate(
    description,
    tissue,
    *,
    states: int | None = None,
    repetitions: int = 1,
    record: str = "all",
    dtype: torch.dtype = torch.float32,
    path: str = "auto",
    checkpoint_stride: int = 4,
    lineshape: str = "super-lorentzian",
    across_slice=None,
) -> torch.Tensor:
    """Signal of every voxel, complex, shape (*voxel_shape, samples). Differentiable in both modes.

    `across_slice` (an int of positions or an `ExactSliceProfile`) plays PROFILED definitions at each slice
    position, every voxel once per position in one launch, and averages the samples over the positions.

    A finite T2' scales each sample by exp(-|τ|/T2') after the kernels (`engine.t2_prime`).
    Event values with a train axis of T (`program.split_trains`) give (T, *voxel_shape, samples): one
    program per train, stacked first. Under `torch.func.vmap` the batch runs as a loop
    (`engine.vmap`)."""
    try:
        program, packed = prepare(description, tissue, states=states, repetitions=repetitions, record=record,
                                  dtype=dtype, path=path, checkpoint_stride=checkpoint_stride,
                                  across_slice=across_slice)
    except TrainAxisError as trains:
        return torch.stack([simulate(part, tissue, states=states, repetitions=repetitions, record=record,
                                     dtype=dtype, path=path, checkpoint_stride=checkpoint_stride,
                                     lineshape=lineshape, across_slice=across_slice) for part in trains.parts])
    return run(program, packed, dict(tissue.items()), lineshape=lineshape, checkpoint_stride=checkpoint_stride)[0]


@loop_under_vmap
def jacobian(
    description,
    tissue,
    fields,
    *,
    states: int | None = None,
    repetitions: int = 1,
    record: str = "all",
    dtype: torch.dtype = torch.float32,
    path: str = "auto",
    checkpoint_stride: int = 4,
    lineshape: str = "super-lorentzian",
    across_slice=None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(signal (*voxel, samples), J (*voxel, P, samples)): forward mode along the named tissue fields.

    Every kernel input's tangent along a field (tissue buffers, pool tables) comes from forward-mode
    autograd through the packing; all P columns then run in one JVP launch. Differentiable once more
    (reverse mode) with respect to the sequence values and the tissue. A train axis of T comes first:
    (T, *voxel, samples) and (T, *voxel, P, samples), as in `simulate`.
    """
    fields = tuple(fields)
    names = {f.name for f in dataclasses.fields(tissue)}
    for name in fields:
        if name not in names:
            raise ValueError(f"jacobian field {name!r} is not a tissue field; accepted: {sorted(names)}")
    try:
        program, packed = prepare(description, tissue, states=states, repetitions=repetitions, record=record,
                                  dtype=dtype, path=path, checkpoint_stride=checkpoint_stride, active=fields,
                                  across_slice=across_slice)
    except TrainAxisError as trains:
        runs = [jacobian(part, tissue, fields, states=states, repetitions=repetitions, record=record, dtype=dtype,
                         path=path, checkpoint_stride=checkpoint_stride, lineshape=lineshape,
                         across_slice=across_slice) for part in trains.parts]
        return torch.stack([signal for signal, _ in runs]), torch.stack([jac for _, jac in runs])
    return run(program, packed, dict(tissue.items()), jacobian=fields, lineshape=lineshape,
               checkpoint_stride=checkpoint_stride)
