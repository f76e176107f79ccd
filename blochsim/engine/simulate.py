"""Simulate a `SequenceDescription` with the kernels: compile, pack, bind, and call the autograd Functions."""

from __future__ import annotations

import torch

from .. import _native as nat
from . import kernels as K
from .functions import EpgJacobian, EpgSimulate
from .program import Program, compile_program
from .tissue import PackedTissue, pack_tissue

__all__ = ["simulate", "jacobian", "bind"]

_PATHS = ("auto", "real", "complex")


def bind(program: Program, packed: PackedTissue, dtype: torch.dtype, checkpoint_stride: int = 4):
    """The kernel call of a program and packed tissue: (Static, inputs)."""
    static = K.Static(
        action=torch.from_numpy(program.action),
        record=torch.from_numpy(program.record),
        num_repetitions=program.num_repetitions,
        num_samples=program.num_samples,
        num_states=program.num_states,
        path=program.path,
        crusher_dk_rad_per_m=program.crusher_dk_rad_per_m,
        voxel_size_m=program.voxel_size_m,
        checkpoint_stride=checkpoint_stride,
        num_voxels=packed.num_voxels,
        dtype=dtype,
    )
    values = (program.dt_s, program.dt_wrap_s, program.flip_rad, program.phase_rad)
    inputs = tuple(v.to(dtype) for v in values) + packed.values
    return static, inputs


def _prepare(description, tissue, *, states, repetitions, record, dtype, path, checkpoint_stride, active=()):
    if path not in _PATHS:
        raise ValueError(f"path must be one of {_PATHS}, got {path!r}")
    if dtype not in (torch.float32, torch.float64):
        raise ValueError(f"dtype must be torch.float32 or torch.float64, got {dtype}")
    packed = pack_tissue(tissue, dtype=dtype, active=active)
    program = compile_program(
        description,
        repetitions=repetitions,
        record=record,
        states=states,
        complex_states=packed.phase_physics or path == "complex",
        checkpoint_stride=checkpoint_stride,
    )
    if path == "real" and program.path != nat.PATH_REAL:
        raise ValueError(
            "path='real' needs every pulse on one phase axis (modulo half turns), no differentiated RF phase, "
            "and no B0, B1phase or v; this sequence or tissue needs the complex path"
        )
    static, inputs = bind(program, packed, dtype, checkpoint_stride)
    return packed, program, static, inputs


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
) -> torch.Tensor:
    """Signal of every voxel, complex, shape (*voxel_shape, samples). Differentiable in both modes."""
    packed, program, static, inputs = _prepare(
        description, tissue, states=states, repetitions=repetitions, record=record, dtype=dtype, path=path,
        checkpoint_stride=checkpoint_stride,
    )
    signal = EpgSimulate.apply(static, *inputs)
    return signal.reshape(packed.voxel_shape + (program.num_samples,))


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
) -> tuple[torch.Tensor, torch.Tensor]:
    """(signal (*voxel, samples), J (*voxel, P, samples)): forward mode along the named tissue fields.

    Differentiable once more (reverse mode) with respect to the sequence values and the tissue.
    """
    fields = tuple(fields)
    for name in fields:
        if name not in nat.TISSUE_PARAMS:
            raise ValueError(f"jacobian field {name!r} is not a kernel tissue field; accepted: {nat.TISSUE_PARAMS}")
    packed, program, static, inputs = _prepare(
        description, tissue, states=states, repetitions=repetitions, record=record, dtype=dtype, path=path,
        checkpoint_stride=checkpoint_stride, active=fields,
    )
    columns = [nat.TISSUE_PARAMS.index(name) for name in fields]
    signal, jac = EpgJacobian.apply(static, columns, *inputs)
    S = program.num_samples
    return signal.reshape(packed.voxel_shape + (S,)), jac.permute(1, 0, 2).reshape(
        packed.voxel_shape + (len(fields), S)
    )
