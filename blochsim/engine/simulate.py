"""Simulate a `SequenceDescription` with the kernels: compile, pack, bind, and call the autograd Functions."""

from __future__ import annotations

import dataclasses
import math

import torch

from .. import _native as nat
from .._arrays import LastResult, reverse_jvps
from ..sequence.tissue import TissueProperties
from . import kernels as K
from .functions import EpgJacobian, run_forward
from .pools import interval_rows, pool_model, pool_tables
from .program import Program, TrainAxisError, compile_program
from .tissue import pack_tissue
from .unrefocused import apply_t2_prime
from .vmap import loop_under_vmap

__all__ = ["simulate", "jacobian", "bind", "prepare"]

_PATHS = ("auto", "real", "complex")


def bind(program: Program, tissue, dtype: torch.dtype, *, checkpoint_stride: int = 4, lineshape="super-lorentzian",
         active=(), packed=None, device=None):
    """The kernel call of a program and a tissue: (Static, inputs, voxel_shape). `device`: the tissue's
    (`_device_of`), where the caller has it."""
    device = _device_of(tissue) if device is None else device
    if packed is None:
        packed = pack_tissue(tissue, dtype=dtype, active=active, device=device)
    model = pool_model(tissue)
    action, record, values = _program_values(program, device, dtype)
    extra = {}
    tables = (None,) * len(nat.TABLES)
    if model.pooled:
        tables, extra = _pool_inputs(program, tissue, model, packed.voxel_shape, dtype, device, lineshape)
    static = K.Static(
        action=action,
        record=record,
        num_repetitions=program.num_repetitions,
        num_samples=program.num_samples,
        num_states=program.num_states,
        path=program.path,
        crusher_dk_rad_per_m=program.crusher_dk_rad_per_m,
        voxel_size_m=program.voxel_size_m,
        checkpoint_stride=checkpoint_stride,
        num_voxels=packed.num_voxels,
        dtype=dtype,
        device=device,
        **extra,
    )
    return static, values + packed.values + tables, packed.voxel_shape


_LAST_POOL_INPUTS = LastResult()


def _pool_inputs(program: Program, tissue, model, voxel_shape, dtype, device, lineshape) -> tuple:
    """The pool tables on `device` in `dtype` and their kernel settings. Kept while the program's intervals
    (a kept program's own tensors), its actions and the tissue tensors are the same and unmodified: a
    repeated call does no table work and no host-to-device copy."""
    settings = (program.action.tobytes(), program.num_repetitions, program.sat_per_rad2.tobytes(),
                program.rf_hz.tobytes(), model.letters, model.semisolid, tuple(voxel_shape), dtype, device, lineshape)
    kept, key = _LAST_POOL_INPUTS.lookup(
        settings, [("dt_s", program.dt_s), ("dt_wrap_s", program.dt_wrap_s), *tissue.items()])
    if kept is not None:
        return kept
    interval_events = (program.action & nat.INTERVAL) != 0
    lengths, rows, wrap = interval_rows(program.dt_s, program.dt_wrap_s, interval_events, program.num_repetitions)
    L, r, T, zeq, sat = pool_tables(tissue, model, voxel_shape, lengths, program.sat_per_rad2, program.rf_hz,
                                    lineshape)
    complex_dtype = torch.complex64 if dtype == torch.float32 else torch.complex128
    tables = tuple(None if t is None else t.to(device=device, dtype=complex_dtype if t.is_complex() else dtype)
                   for t in (L, r, T, zeq, sat))
    extra = dict(num_transverse_pools=model.num_transverse, num_longitudinal_pools=model.num_longitudinal,
                 interval=rows.to(device), wrap_interval=wrap, num_intervals=int(lengths.numel()))
    _LAST_POOL_INPUTS.keep(key, (tables, extra))
    return tables, extra


def _program_values(program: Program, device, dtype):
    """(action, record, (dt, dt_wrap, flip, phase)) on `device` in `dtype`; the values are kept on the program
    per device and dtype while none carries a derivative (a constant program moves to the device once)."""
    key, sources = (device, dtype), (program.dt_s, program.dt_wrap_s, program.flip_rad, program.phase_rad)
    hit = program.bound.get(key)
    if hit is None or not all(a is b for a, b in zip(hit[0], sources, strict=True)):
        # Phases are wrapped in float64 before narrowing: a long RF-spoiled train reaches thousands of rad.
        phase = torch.remainder(program.phase_rad, 2 * math.pi)
        hit = (sources, tuple(v.to(device=device, dtype=dtype)
                              for v in (program.dt_s, program.dt_wrap_s, program.flip_rad, phase)))
        if program.constant:
            program.bound[key] = hit
    return (*program.structure_on(device), hit[1])


def _device_of(tissue) -> torch.device:
    """Work runs where the tissue tensors are (the first tensor field decides; CPU if none)."""
    first = getattr(tissue, "t1_ms", None)  # the first field of TissueProperties: no walk over the 45
    if isinstance(first, torch.Tensor) and isinstance(tissue, TissueProperties):
        return first.device
    for _, value in tissue.items():
        if isinstance(value, torch.Tensor):
            return value.device
    return torch.device("cpu")


def prepare(description, tissue, *, states, repetitions, record, dtype, path, checkpoint_stride, lineshape,
            active=()):
    """Compile and bind: (program, static, inputs, voxel_shape)."""
    if path not in _PATHS:
        raise ValueError(f"path must be one of {_PATHS}, got {path!r}")
    if dtype not in (torch.float32, torch.float64):
        raise ValueError(f"dtype must be torch.float32 or torch.float64, got {dtype}")
    device = _device_of(tissue)
    packed = pack_tissue(tissue, dtype=dtype, active=active, device=device)  # validates; tells the path
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
            "and no B0, B1phase, v or pool shifts; this sequence or tissue needs the complex path"
        )
    static, inputs, voxel_shape = bind(program, tissue, dtype, checkpoint_stride=checkpoint_stride,
                                       lineshape=lineshape, active=active, packed=packed, device=device)
    return program, static, inputs, voxel_shape


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
) -> torch.Tensor:
    """Signal of every voxel, complex, shape (*voxel_shape, samples). Differentiable in both modes.

    A finite T2' scales each sample by exp(-|τ|/T2') after the kernels (`engine.unrefocused`).
    Event values with a train axis of T (`program.split_trains`) give (T, *voxel_shape, samples): one
    program per train, stacked first. Under `torch.func.vmap` the batch runs as a loop
    (`engine.vmap`)."""
    try:
        program, static, inputs, voxel_shape = prepare(
            description, tissue, states=states, repetitions=repetitions, record=record, dtype=dtype, path=path,
            checkpoint_stride=checkpoint_stride, lineshape=lineshape,
        )
    except TrainAxisError as trains:
        return torch.stack([simulate(part, tissue, states=states, repetitions=repetitions, record=record,
                                     dtype=dtype, path=path, checkpoint_stride=checkpoint_stride,
                                     lineshape=lineshape) for part in trains.parts])
    signal = run_forward(static, inputs).reshape(voxel_shape + (program.num_samples,))
    return apply_t2_prime(program, tissue.t2_prime_ms, signal)[0]


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
        program, static, inputs, voxel_shape = prepare(
            description, tissue, states=states, repetitions=repetitions, record=record, dtype=dtype, path=path,
            checkpoint_stride=checkpoint_stride, lineshape=lineshape, active=fields,
        )
    except TrainAxisError as trains:
        runs = [jacobian(part, tissue, fields, states=states, repetitions=repetitions, record=record, dtype=dtype,
                         path=path, checkpoint_stride=checkpoint_stride, lineshape=lineshape)
                for part in trains.parts]
        return torch.stack([signal for signal, _ in runs]), torch.stack([jac for _, jac in runs])
    tangents = _tangents(program, tissue, dtype, inputs, fields, checkpoint_stride=checkpoint_stride,
                         lineshape=lineshape)
    signal, jac = EpgJacobian.apply(static, len(inputs), *inputs, *tangents)
    S = program.num_samples
    signal, jac = signal.reshape(voxel_shape + (S,)), jac.permute(1, 0, 2).reshape(voxel_shape + (len(fields), S))
    return apply_t2_prime(program, tissue.t2_prime_ms, signal, jac, fields)


def _table_tangents(program, tissue, names, dtype, fields, differentiable, bind_kwargs) -> dict:
    """Per tissue field of `names`, the pool tables' tangents along it (None where a table does not
    move): one table construction with every such field a leaf, then two reverse passes (`reverse_jvps`:
    forward-mode AD would import torch._dynamo on its first use, about 5 s). `differentiable`: the tangents
    keep their graph (a Jacobian inside a derivative: some kernel input requires grad)."""
    leaves = {}
    for name in names:
        value = getattr(tissue, name)
        base = value if isinstance(value, torch.Tensor) else torch.tensor(float(value), dtype=torch.float64)
        leaves[name] = base.view_as(base) if base.requires_grad else base.detach().requires_grad_()
    with torch.enable_grad():
        _, moved, _ = bind(program, dataclasses.replace(tissue, **leaves), dtype, active=fields, **bind_kwargs)
        per_leaf = reverse_jvps(list(moved[K.TABLE_START:]), list(leaves.values()), differentiable)
    return dict(zip(leaves, per_leaf, strict=True))


def _tangents(program, tissue, dtype, inputs, fields, **bind_kwargs) -> list:
    """Per kernel input, its tangents [P, *shape] along the P fields (None where all are zero).

    A field the kernels read directly (T1, T2, B0, ...) has a one-hot tangent on its own buffer. A pool
    property reaches the kernels through the pool tables, whose tangents are `_table_tangents`.
    """
    direct = {name: K.NUM_EVENT_INPUTS + i for i, name in enumerate(nat.TISSUE_PARAMS)}
    differentiable = torch.is_grad_enabled() and any(x is not None and x.requires_grad for x in inputs)
    through_tables = [name for name in dict.fromkeys(fields) if name != "t2_prime_ms"
                      and (direct.get(name) is None or inputs[K.TABLE_START] is not None)]
    tables = (_table_tangents(program, tissue, through_tables, dtype, fields, differentiable, bind_kwargs)
              if through_tables else {})
    columns = []
    for name in fields:
        column = [None] * len(inputs)
        if name == "t2_prime_ms":  # acts on the samples only (`apply_t2_prime`): no kernel input moves
            columns.append(column)
            continue
        index = direct.get(name)
        if index is not None:
            column[index] = torch.ones_like(inputs[index])
        if name in tables:
            column[K.TABLE_START:] = tables[name]
        columns.append(column)
    tangents = []
    for i, x in enumerate(inputs):
        parts = [c[i] for c in columns]
        if x is None or all(t is None for t in parts):
            tangents.append(None)
        else:
            tangents.append(torch.stack([torch.zeros_like(x) if t is None else t.to(x.dtype) for t in parts]))
    return tangents
