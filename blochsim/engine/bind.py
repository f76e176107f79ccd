"""Binding a compiled program and a packed tissue to one kernel call, and running it: the engine's one path.

`engine.simulate`, `engine.jacobian`, `EpgEngine` and `Simulator` all end here: they pack their tissue
with `engine.tissue.pack_tissue`, compile (or resolve) a `Program`, and call `run`, which

* narrows the event values to the kernel dtype on the tissue's device, phases wrapped modulo 2 pi in
  float64 first (an RF-spoiled train reaches thousands of rad, which float32 holds to 1e-4 rad only);
* builds the pool tables (`engine.pools`) when the tissue has pools, and the tables of pulses played per
  voxel (`engine.pulses`: static shims, slice profiles, dynamic pTx); a slice-resolved call runs its slice
  positions as extra voxels (`engine.pulses.across_positions`) and averages the samples over them;
* calls the kernels' autograd Functions: the forward, or the forward-mode Jacobian along named tissue
  fields (each kernel input's tangent from `tissue_tangents`);
* applies T2' to the samples (`engine.t2_prime`).

What is kept between calls follows one policy (`_arrays.LastResult`): the last result, while the
tensors it was made from are alive and unmodified and nothing carries a derivative. The tissue packing,
the pool tables and their device copies are kept that way; a constant program keeps its own values per
device and dtype.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping

import torch

from .. import _native as nat
from .._arrays import LastResult, reverse_jvps
from ..sequence.tissue import IDENTITY
from . import kernels as K
from .functions import run_forward, run_jacobian
from .pools import interval_rows, pool_tables
from .program import Program
from .pulses import across_positions, pulse_tables
from .t2_prime import apply_t2_prime, t2_prime_active
from .tissue import PackedTissue

__all__ = ["run", "kernel_inputs", "event_inputs", "tissue_tangents"]


def event_inputs(program: Program, values: tuple | None, dtype: torch.dtype, device: torch.device, *,
                 wrapped: bool = False) -> tuple:
    """(dt_s, dt_wrap_s, flip_rad, phase_rad) in `dtype` on `device`, the phases wrapped modulo 2 pi in float64
    before narrowing.

    `values` None takes the program's own, kept on the program per device and dtype while none carries a
    derivative (a constant program moves to the device once). `wrapped`: `values` are already narrowed
    with their phases wrapped (`AffineValues(..., wrap_last=True)`).
    """
    own = (program.dt_s, program.dt_wrap_s, program.flip_rad, program.phase_rad)
    if values is None or all(a is b for a, b in zip(values, own, strict=True)):
        key = (device, dtype)
        hit = program.bound.get(key)
        if hit is None or not all(a is b for a, b in zip(hit[0], own, strict=True)):
            hit = (own, _narrowed(own, dtype, device))
            if program.constant:
                program.bound[key] = hit
        return hit[1]
    if wrapped:  # a list, not a generator: this runs on every resolved call
        return tuple([v if v.dtype == dtype and v.device == device else v.to(device=device, dtype=dtype)
                      for v in values])
    return _narrowed(values, dtype, device)


def _narrowed(values: tuple, dtype: torch.dtype, device: torch.device) -> tuple:
    dt, dt_wrap, flip, phase = values
    return tuple(v.to(device=device, dtype=dtype) for v in (dt, dt_wrap, flip, torch.remainder(phase, 2 * math.pi)))


# -- pool tables ------------------------------------------------------------------------------------
def _lengths(program: Program, values: tuple | None) -> tuple:
    """(dt_s, dt_wrap_s) the intervals are built from: the given values', else the program's own."""
    return (program.dt_s, program.dt_wrap_s) if values is None else values[:2]


_LAST_POOL_INPUTS = LastResult()
_LAST_TABLE_TANGENTS = LastResult()


def _pool_settings(program: Program, packed: PackedTissue, lineshape: str) -> tuple:
    """What the pool tables are formed from beside the interval lengths and the tissue: their cache's key."""
    return (program.action.tobytes(), program.num_repetitions, program.sat_per_rad2.tobytes(),
            program.rf_hz.tobytes(), packed.pools, tuple(packed.voxel_shape), packed.dtype, packed.device, lineshape)


def _pool_inputs(program: Program, lengths: tuple, tissue: Mapping, packed: PackedTissue, lineshape: str) -> tuple:
    """The pool tables on the packing's device in its dtype and their kernel settings. `lengths` are the
    (dt_s, dt_wrap_s) the intervals are built from. Kept while the intervals, the program's actions and
    the tissue tensors are the same and unmodified: a repeated call does no table work and no host-to-device
    copy."""
    dt_s, dt_wrap_s = lengths
    model, dtype, device = packed.pools, packed.dtype, packed.device
    kept, key = _LAST_POOL_INPUTS.lookup(_pool_settings(program, packed, lineshape),
                                         [("dt_s", dt_s), ("dt_wrap_s", dt_wrap_s), *tissue.items()])
    if kept is not None:
        return kept
    interval_events = (program.action & nat.INTERVAL) != 0
    rows_of = interval_rows(dt_s, dt_wrap_s, interval_events, program.num_repetitions)
    distinct, rows, wrap = rows_of
    L, r, T, zeq, sat = pool_tables(tissue, model, packed.voxel_shape, distinct, program.sat_per_rad2,
                                    program.rf_hz, lineshape)
    complex_dtype = torch.complex64 if dtype == torch.float32 else torch.complex128
    tables = tuple(None if t is None else t.to(device=device, dtype=complex_dtype if t.is_complex() else dtype)
                   for t in (L, r, T, zeq, sat))
    extra = dict(num_transverse_pools=model.num_transverse, num_longitudinal_pools=model.num_longitudinal,
                 interval=rows.to(device), wrap_interval=wrap, num_intervals=int(distinct.numel()))
    _LAST_POOL_INPUTS.keep(key, (tables, extra))
    return tables, extra


# -- the kernel call --------------------------------------------------------------------------------
def kernel_inputs(program: Program, packed: PackedTissue, tissue: Mapping, *, values: tuple | None = None,
                  wrapped: bool = False, lineshape: str = "super-lorentzian", checkpoint_stride: int = 4) -> tuple:
    """The kernel call of `program` on the packed tissue: (Static, inputs), as `run` makes it."""
    dtype, device = packed.dtype, packed.device
    event = event_inputs(program, values, dtype, device, wrapped=wrapped)
    tables, extra = (None,) * len(nat.POOL_TABLES), {}
    if packed.pools.pooled:
        tables, extra = _pool_inputs(program, _lengths(program, values), tissue, packed, lineshape)
    if program.pulses is None:
        tables = tables + (None,) * (len(nat.TABLES) - len(nat.POOL_TABLES))
    else:
        flip_rad = program.flip_rad if values is None else values[2]
        pulses, settings = pulse_tables(program.pulses, flip_rad, packed)
        field_row, profile_row, spinor_row = program.rows_on(device)
        tables = tables + pulses
        extra = dict(extra, **settings, field_row=field_row, profile_row=profile_row, spinor_row=spinor_row)
    action, record = program.structure_on(device)
    static = K.Static(
        action=action, record=record, num_repetitions=program.num_repetitions, num_samples=program.num_samples,
        num_states=program.num_states, path=program.path, crusher_dk_rad_per_m=program.crusher_dk_rad_per_m,
        voxel_size_m=program.voxel_size_m, checkpoint_stride=checkpoint_stride, num_voxels=packed.num_voxels,
        dtype=dtype, device=device, **extra,
    )
    return static, event + packed.values + tables


def run(program: Program, packed: PackedTissue, tissue: Mapping, *, values: tuple | None = None,
        wrapped: bool = False, jacobian=(), lineshape: str = "super-lorentzian", checkpoint_stride: int = 4):
    """Run `program` on the packed tissue: (signal [*voxel, S], J [*voxel, P, S] or None), T2' applied.

    `packed` is `pack_tissue(tissue, active=jacobian)`, in the kernel dtype; `tissue` the mapping it was
    packed from (engine field -> value: the pool tables and T2' read it). `values` (dt_s, dt_wrap_s,
    flip_rad, phase_rad) replace the program's own (a resolved call's, `wrapped` as in `event_inputs`).
    `jacobian` names the P tissue fields to differentiate along (forward mode). A slice-resolved program
    (`program.pulses.positions` > 1) runs every voxel at each slice position and averages the samples.
    """
    positions = 1 if program.pulses is None else program.pulses.positions
    if positions > 1:
        packed, tissue = across_positions(packed, tissue, positions)
    static, inputs = kernel_inputs(program, packed, tissue, values=values, wrapped=wrapped, lineshape=lineshape,
                                   checkpoint_stride=checkpoint_stride)
    S, voxel_shape = program.num_samples, packed.voxel_shape
    t2_prime_ms = tissue.get("t2_prime_ms")
    timed = program
    if values is not None and t2_prime_active(t2_prime_ms, jacobian):
        # T2' reads each sample's unrefocused time from the durations the kernels ran (a resolved call's).
        timed = dataclasses.replace(program, dt_s=values[0], dt_wrap_s=values[1])
    if not jacobian:
        signal = run_forward(static, inputs).reshape(voxel_shape + (S,))
        signal, _ = apply_t2_prime(timed, t2_prime_ms, signal)
        return (signal if positions == 1 else signal.mean(-2)), None
    tangents = tissue_tangents(program, _lengths(program, values), tissue, packed, inputs, jacobian, lineshape)
    signal, jac = run_jacobian(static, inputs, tangents)
    signal = signal.reshape(voxel_shape + (S,))
    jac = jac.permute(1, 0, 2).reshape(voxel_shape + (len(jacobian), S))  # [P, V, S] -> (*voxel, P, S)
    signal, jac = apply_t2_prime(timed, t2_prime_ms, signal, jac, jacobian)
    return (signal, jac) if positions == 1 else (signal.mean(-2), jac.mean(-3))


# -- tangents of the kernel inputs along tissue fields ----------------------------------------------
def tissue_tangents(program: Program, lengths: tuple, tissue: Mapping, packed: PackedTissue, inputs: tuple,
                    fields, lineshape: str) -> list:
    """Per kernel input, its tangents [P, *shape] along the P tissue `fields` (None where all are zero).

    A field the kernels read directly (T1, T2, B0, ...) has a one-hot tangent on its own buffer. A pool
    property reaches the kernels through the pool tables, whose tangents are `_table_tangents`. T2' moves
    no kernel input: it acts on the samples (`apply_t2_prime` takes its column).
    """
    direct = {name: K.NUM_EVENT_INPUTS + i for i, name in enumerate(nat.TISSUE_PARAMS)}
    # The tables' tangents keep their graph only where what they are formed from (the tissue, the interval
    # lengths) requires grad: a Jacobian differentiated along the flips alone (an HVP) has constant ones.
    differentiable = torch.is_grad_enabled() and any(
        isinstance(x, torch.Tensor) and x.requires_grad for x in (*tissue.values(), *lengths))
    through_tables = [name for name in dict.fromkeys(fields) if name != "t2_prime_ms"
                      and (direct.get(name) is None or inputs[K.TABLE_START] is not None)]
    tables = (_table_tangents(program, lengths, tissue, packed, through_tables, differentiable, lineshape)
              if through_tables else {})
    columns = []
    for name in fields:
        column = [None] * len(inputs)
        if name == "t2_prime_ms":
            columns.append(column)
            continue
        index = direct.get(name)
        if index is not None:
            column[index] = torch.ones_like(inputs[index])
        if name in tables:  # the pool tables' (the pulses' tables take no tangent along a tissue field)
            column[K.TABLE_START:K.TABLE_START + len(tables[name])] = tables[name]
        columns.append(column)
    tangents = []
    for i, x in enumerate(inputs):
        parts = [c[i] for c in columns]
        if x is None or all(t is None for t in parts):
            tangents.append(None)
        else:
            tangents.append(torch.stack([torch.zeros_like(x) if t is None else t.to(x.dtype) for t in parts]))
    return tangents


def _table_tangents(program, lengths, tissue: Mapping, packed: PackedTissue, names, differentiable: bool,
                    lineshape: str) -> dict:
    """Per tissue field of `names`, the pool tables' tangents along it (None where a table does not move):
    one table construction with every such field a leaf, then two reverse passes (`reverse_jvps`: forward-mode
    AD would import torch._dynamo on its first use, about 5 s). `differentiable`: the tangents keep their
    graph (a Jacobian inside a derivative along something the tables are formed from); constant ones are
    kept while the intervals and the tissue tensors are the same and unmodified (as `_pool_inputs` keeps the
    tables): a design loop's Jacobians along new flips form them once."""
    key = None
    if not differentiable:
        kept, key = _LAST_TABLE_TANGENTS.lookup((*_pool_settings(program, packed, lineshape), tuple(names)),
                                                [("dt_s", lengths[0]), ("dt_wrap_s", lengths[1]), *tissue.items()])
        if kept is not None:
            return kept
    leaves = {}
    for name in names:
        value = tissue.get(name, IDENTITY.get(name))
        base = value if isinstance(value, torch.Tensor) else torch.tensor(float(value), dtype=torch.float64)
        leaves[name] = base.view_as(base) if base.requires_grad else base.detach().requires_grad_()
    with torch.enable_grad():
        moved, _ = _pool_inputs(program, lengths, {**tissue, **leaves}, packed, lineshape)
        per_leaf = reverse_jvps(list(moved), list(leaves.values()), differentiable)
    tangents = dict(zip(leaves, per_leaf, strict=True))
    if key is not None:
        _LAST_TABLE_TANGENTS.keep(key, tangents)
    return tangents
