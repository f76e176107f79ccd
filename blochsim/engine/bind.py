"""Rebinding values to a compiled structure: the fast path of calls that change only values.

A compiled `Program` is a structure (action bits, sample slots, path, orders) plus four value arrays
(interval lengths, wrap interval, flips, phases). A simulator's layout is a function of its protocol
tensors; the event structure depends only on structural arguments, and the values are, for every
shipped layout, affine in the protocol (flips enter through `deg2rad`, durations through sums and
differences of timestamps). `AffineValues` records that map once, `values = A p + b` with a sparse `A`
found by autograd through one walk of the layout, and later calls evaluate it with three torch ops
instead of walking the layout and compiling again; gradients still reach the protocol tensors through `p`.

`compile_fast` is `engine.compile_program` (one compiler; the name stays for the simulators).
`pack_fields` packs free-water tissue (pool model 0) with at most one host sync, and `run` calls the
kernels' autograd Functions directly; tissue with pools or T2prime goes through the engine's own
`engine.simulate.bind`. `unroll` lays playings of a program end to end, for the steady-state
extrapolation of `blochsim.engine.steady`.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np
import torch

from .. import _native as nat
from .._arrays import LastResult, differentiated
from ..sequence.tissue import IDENTITY, TissueProperties
from . import kernels as K
from .functions import EpgJacobian, run_forward
from .program import _count_windings
from .program import compile_program as compile_fast
from .simulate import _tangents as engine_tangents
from .simulate import bind as engine_bind
from .tissue import broadcast_shapes, check_tissue
from .unrefocused import apply_t2_prime

__all__ = ["AffineValues", "Packed", "pack_fields", "run", "unroll", "batched_vjp", "values_of", "compile_fast",
           "windings"]

#: Dense Jacobian blocks are extracted in row chunks of at most this many entries.
_CHUNK_ENTRIES = 1 << 22
_KERNEL_FIELDS = frozenset(nat.TISSUE_PARAMS)
_TIME_FIELDS = ("t1_ms", "t2_ms")
_PHASE_FIELDS = ("b0_hz", "b1_phase_rad", "velocity_m_per_s")
_POOL_SHIFTS = tuple(f"pool_{x}_shift_hz" for x in "bcde")


def windings(program) -> int:
    """Shifts per repetition of a compiled program (as `engine.shifts_per_repetition` counts them)."""
    return _count_windings(program.action)


def values_of(program) -> tuple:
    """The four value arrays of a program, float64: (dt_s [E], dt_wrap_s [1], flip_rad [E], phase_rad [E])."""
    return program.dt_s, program.dt_wrap_s, program.flip_rad, program.phase_rad


# -- affine value maps ------------------------------------------------------------------------------
def batched_vjp(output: torch.Tensor, leaves: list, cotangents: torch.Tensor) -> tuple:
    """Vector-Jacobian products of `output` for a batch of cotangents [B, *output.shape], per leaf [B, ...].

    Uses the engine-level batched backward directly: the public `torch.autograd.grad(..., grad_outputs=...)`
    imports sympy on its first call (about 0.4 s).
    """
    try:
        from torch import _vmap_internals
        from torch.autograd.graph import _engine_run_backward
    except ImportError:  # pragma: no cover - older torch
        return torch.autograd.grad(output, leaves, cotangents, retain_graph=True, allow_unused=True,
                                   is_grads_batched=True)

    def vjp(u):
        return _engine_run_backward((output,), (u,), True, False, tuple(leaves), True, accumulate_grad=False)

    return _vmap_internals._vmap(vjp, 0, 0, allow_none_pass_through=True)(cotangents)


def _sparse_jacobian(block: torch.Tensor, leaves: list, max_entries: int):
    """(rows, cols, coef) of the Jacobian of `block` [R] with respect to the flattened `leaves` [P].

    Most rows of a layout depend on one protocol entry (a flip, a TR) or none. Three Jacobian-vector
    products, along ones, along the entry labels 1..P and along a random direction, find each such row's
    column (labels / ones) and coefficient (ones) and check them (random). The rows that fail the check
    depend on several entries; their rows of the Jacobian are extracted exactly, by batched reverse mode.
    Forward products come from the double-backward trick: J v = d/du <J^T u, v>.
    """
    R = block.numel()
    P = sum(x.numel() for x in leaves)
    u = torch.zeros(R, dtype=block.dtype, requires_grad=True)
    with torch.enable_grad():
        vjps = torch.autograd.grad((block * u).sum(), leaves, create_graph=True, allow_unused=True)
    pairs = [(g.reshape(-1), x) for g, x in zip(vjps, leaves, strict=True) if g is not None and g.requires_grad]
    if not pairs:
        return torch.zeros(0, dtype=torch.long), torch.zeros(0, dtype=torch.long), torch.zeros(0, dtype=block.dtype)

    offsets, start = {}, 0
    for x in leaves:
        offsets[id(x)] = start
        start += x.numel()

    def jvp(v: torch.Tensor) -> torch.Tensor:
        parts = [(g * v[offsets[id(x)]:offsets[id(x)] + x.numel()]).sum() for g, x in pairs]
        (out,) = torch.autograd.grad(torch.stack(parts).sum(), u, retain_graph=True, allow_unused=True)
        return torch.zeros(R, dtype=block.dtype) if out is None else out.detach()

    generator = torch.Generator().manual_seed(0)
    ones = jvp(torch.ones(P, dtype=torch.float64))
    labels = jvp(torch.arange(1, P + 1, dtype=torch.float64))
    w = torch.rand(P, dtype=torch.float64, generator=generator) + 0.5
    probe = jvp(w)
    dependent = (ones != 0) | (labels != 0) | (probe != 0)
    column = labels / torch.where(ones != 0, ones, torch.ones_like(ones))
    whole = torch.round(column)
    single = (ones != 0) & ((column - whole).abs() <= 1e-6) & (whole >= 1) & (whole <= P)
    col = (whole.clamp(1, P) - 1).long()
    single &= (ones * w[col] - probe).abs() <= 1e-9 * (probe.abs() + (ones * w[col]).abs()) + 1e-300
    rows = single.nonzero().reshape(-1)
    out_rows, out_cols, out_coef = [rows], [col[rows]], [ones[rows]]
    several = (dependent & ~single).nonzero().reshape(-1)
    if several.numel():
        if several.numel() * P > max_entries:
            return None
        chunk = max(1, min(several.numel(), _CHUNK_ENTRIES // max(P, R)))
        for first in range(0, several.numel(), chunk):
            which = several[first:first + chunk]
            seed = torch.zeros((which.numel(), R), dtype=block.dtype)
            seed[torch.arange(which.numel()), which] = 1.0
            grads = batched_vjp(block, leaves, seed)
            dense = torch.cat([torch.zeros((which.numel(), x.numel()), dtype=block.dtype) if g is None
                               else g.reshape(which.numel(), -1) for g, x in zip(grads, leaves, strict=True)], 1)
            r, c = dense.nonzero(as_tuple=True)
            out_rows.append(which[r])
            out_cols.append(c)
            out_coef.append(dense[r, c])
    return torch.cat(out_rows), torch.cat(out_cols), torch.cat(out_coef)


class AffineValues:
    """Program values as an affine function of the flattened protocol `p` (float64): `A p + b`.

    `A` is kept sparse as (rows, cols, coef) into the concatenation of the value blocks; `sizes` are the
    block lengths. Calling it returns the blocks as float64 tensors, differentiable with respect to `p`,
    on the device of `p` (the map is fitted on the host and moved to another device once).
    """

    __slots__ = ("rows", "cols", "coef", "offset", "sizes", "wrapped", "scale", "moved", "placed")

    def __init__(self, rows, cols, coef, offset, sizes):
        self.rows, self.cols, self.coef, self.offset, self.sizes = rows, cols, coef, offset, tuple(sizes)
        self.wrapped = None  # the offset with its constant last block wrapped, False if that block varies
        self.placed = {}  # device -> (the `wrapped` it was made with, the map's tensors on that device)
        # Each protocol entry in order, times one factor (flips in degrees): one index_add, not three ops.
        uniform = coef.numel() > 0 and bool((coef == coef[0]).all())
        in_order = torch.equal(cols, torch.arange(cols.numel(), dtype=cols.dtype))
        self.scale = float(coef[0]) if uniform and in_order else None
        # Per block, whether any protocol entry moves it: the others come back detached, as the constants they
        # are (durations when only flips are tensors), so that nothing downstream differentiates them (pool
        # tables would be built per event with a graph instead of once per distinct interval).
        starts = np.cumsum((0,) + self.sizes[:-1]).tolist()
        self.moved = tuple(bool(((rows >= lo) & (rows < lo + n)).any())
                           for lo, n in zip(starts, self.sizes, strict=True))

    @classmethod
    def fit(cls, blocks: tuple, leaves: list, p: torch.Tensor, *, max_entries: int = 1 << 26):
        """The map whose Jacobian is that of `blocks` with respect to `leaves` at `p`, through `blocks` at `p`.

        `leaves` are the float64 leaf tensors `p` was flattened from. Returns None when the rows that
        depend on several protocol entries are too many to extract (rows x entries above `max_entries`).
        """
        flat = [b.reshape(-1) for b in blocks]
        sizes = [b.numel() for b in flat]
        rows, cols, coefs = [], [], []
        start = 0
        for block in flat:
            if block.requires_grad and leaves:
                found = _sparse_jacobian(block, leaves, max_entries)
                if found is None:
                    return None
                rows.append(found[0] + start)
                cols.append(found[1])
                coefs.append(found[2])
            start += block.numel()
        index = torch.zeros(0, dtype=torch.long)
        rows = torch.cat(rows) if rows else index
        cols = torch.cat(cols) if cols else index
        coef = torch.cat(coefs) if coefs else torch.zeros(0, dtype=torch.float64)
        values = torch.cat([b.detach() for b in flat])
        affine = cls(rows, cols, coef, values, sizes)
        affine.offset = values - affine._linear(p.detach())
        return affine

    def _linear(self, p: torch.Tensor) -> torch.Tensor:
        out = torch.zeros(sum(self.sizes), dtype=torch.float64, device=p.device)
        if self.rows.numel() == 0:
            return out
        return out.index_add(0, self.rows, self.coef * p.index_select(0, self.cols))

    def __call__(self, p: torch.Tensor, dtype: torch.dtype = torch.float64, *, wrap_last: bool = False) -> tuple:
        """The value blocks at `p`, computed in float64 and narrowed to `dtype` once.

        `wrap_last` reduces the last block (the phases) modulo 2 pi before narrowing; a constant last
        block is wrapped once, here, instead of on every call.
        """
        if wrap_last and self.wrapped is None:
            flat = self.offset
            last = flat.numel() - self.sizes[-1]
            constant = self.rows.numel() == 0 or bool((self.rows < last).all())
            self.wrapped = torch.cat([flat[:last], torch.remainder(flat[last:], 2 * math.pi)]) if constant else False
        rows, cols, coef, flat, wrapped = self._on(p.device)
        if wrap_last and self.wrapped is not False:
            flat = wrapped
        if self.scale is not None and p.numel() == cols.numel():
            flat = flat.index_add(0, rows, p, alpha=self.scale)
        elif rows.numel():
            flat = flat.index_add(0, rows, coef * p.index_select(0, cols))
            if wrap_last and self.wrapped is False:
                last = flat.numel() - self.sizes[-1]
                flat = torch.cat([flat[:last], torch.remainder(flat[last:], 2 * math.pi)])
        blocks = (flat if dtype == torch.float64 else flat.to(dtype)).split_with_sizes(self.sizes)
        return tuple(b if moved else b.detach() for b, moved in zip(blocks, self.moved, strict=True))

    def _on(self, device: torch.device) -> tuple:
        """(rows, cols, coef, offset, wrapped) on `device`, moved once per device: a protocol on a GPU is
        mapped there with no copy from the host per call."""
        own = (self.rows, self.cols, self.coef, self.offset, self.wrapped)
        if device.type == "cpu":
            return own
        hit = self.placed.get(device)
        if hit is None or hit[0] is not self.wrapped:
            hit = self.placed[device] = (self.wrapped, tuple(t.to(device) if isinstance(t, torch.Tensor) else t
                                                             for t in own))
        return hit[1]

    def matches(self, p: torch.Tensor, blocks: tuple) -> bool:
        """Whether `A p + b` reproduces `blocks` (values walked at `p`) to float32 rounding.

        The kernels run in float32, so a prediction within a few float32 ulps of the walked values is
        exact for them; the absolute term covers values that cancel to zero.
        """
        actual = torch.cat([b.detach().reshape(-1) for b in blocks])
        if actual.numel() != self.offset.numel():
            return False
        predicted = torch.cat(self(p.detach().to(actual.device)))  # the walked values are on the host
        scale = float(actual.abs().max()) if actual.numel() else 0.0
        return bool(((predicted - actual).abs() <= 1e-6 * actual.abs() + 1e-9 * scale + 1e-15).all())


# -- tissue -----------------------------------------------------------------------------------------
@dataclass
class Packed:
    voxel_shape: tuple
    num_voxels: int
    values: tuple  # nat.NUM_TISSUE entries: [V] or [1] tensors, or None (identity: physics off)
    phase_physics: bool  # B0, B1phase or v: the complex path is needed


def _tensor_identity_differs(value: torch.Tensor, identity: float) -> torch.Tensor:
    return (value.detach() != identity).any()


def broadcast_error(shapes: dict) -> ValueError:
    """ValueError naming every property with its shape and the first pair that does not broadcast."""
    names = list(shapes)
    pair = None
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            try:
                broadcast_shapes(shapes[a], shapes[b])
            except ValueError:
                pair = (a, b)
                break
        if pair:
            break
    given = ", ".join(f"{k} {tuple(v)}" for k, v in shapes.items())
    conflict = f"; {pair[0]} {tuple(shapes[pair[0]])} and {pair[1]} {tuple(shapes[pair[1]])} conflict" if pair else ""
    return ValueError(f"tissue properties must broadcast against each other (NumPy rules): {given}{conflict}")


def pack_fields(fields: dict, *, dtype: torch.dtype = torch.float32, active=(), names=None,
                device: torch.device | None = None) -> Packed | None:
    """Pack free-water tissue `{engine field: number or tensor}` for the kernels, or None if it has pools.

    Only the fields given are read; `t1_ms` and `t2_ms` must be among them. Fields named in `active` are
    sent even at their identity value. A property outside its range (`engine.tissue.check_tissue`: NaN,
    a negative time, ...) raises ValueError naming it (`names` maps fields to public names for the
    messages). One host sync for the free-water path. Buffers are made on `device` (default: where the
    tensors are, else the CPU).

    The last packing is kept while its tensors are alive and unmodified (same objects, same version
    counters) and nothing is differentiated: a loop that changes only the sequence (design, dictionary
    sweeps over flips) packs and checks its tissue once.
    """
    kept, key = _LAST_PACKING.lookup((dtype, tuple(active), device), fields.items())
    if kept is not None:
        return None if kept is _POOLED else kept
    packed = _pack_fields(fields, dtype, active, names or {}, device)
    # "Has pools" is kept too: its range checks and identity tests sync with a GPU on every call otherwise.
    _LAST_PACKING.keep(key, _POOLED if packed is None else packed)
    return packed


_LAST_PACKING = LastResult()
#: What `_LAST_PACKING` keeps for tissue with pools (checked, and left to the engine's binding).
_POOLED = object()


def _pack_fields(fields: dict, dtype, active, names: dict, device) -> Packed | None:
    if device is None:  # where the tensors are: one off the CPU decides
        device = next((v.device for v in fields.values() if isinstance(v, torch.Tensor) and v.device.type != "cpu"),
                      torch.device("cpu"))
    shapes, checks, kinds = {}, [], []
    for field, value in fields.items():
        if field in _KERNEL_FIELDS and isinstance(value, torch.Tensor):
            shapes[names.get(field, field)] = value.shape
            if field not in _TIME_FIELDS and field not in active and not value.requires_grad:
                checks.append(_tensor_identity_differs(value, IDENTITY[field]))
                kinds.append(field)
    # Every given property is validated here, under the caller's names, pools included (the engine's binding
    # would name engine fields); the one host sync also reads which maps sit at their identity value.
    flags = dict(zip(kinds, check_tissue(fields, names, checks), strict=True))
    for field, value in fields.items():
        if field in _KERNEL_FIELDS:
            continue
        if field in active:  # a Jacobian along a pool property or T2' takes the engine's binding
            return None
        identity = IDENTITY[field]
        if isinstance(value, torch.Tensor):
            if differentiated(value) or bool(_tensor_identity_differs(value, identity)):
                return None
        elif float(value) != identity:
            return None
    try:
        voxel_shape = broadcast_shapes(*shapes.values())
    except ValueError:
        raise broadcast_error(shapes) from None
    num_voxels = math.prod(voxel_shape)
    values = []
    for field in nat.TISSUE_PARAMS:
        value = fields.get(field)
        if value is None:
            values.append(None)
        elif isinstance(value, torch.Tensor):
            if field not in _TIME_FIELDS and field not in active and not value.requires_grad \
                    and not flags.get(field, True):
                values.append(None)  # a map at its identity value: the physics stays off
                continue
            t = value if value.dtype == dtype and value.device == device else value.to(device=device, dtype=dtype)
            values.append(t.reshape(1) if t.numel() == 1 else t.expand(voxel_shape).reshape(-1).contiguous())
        elif field in _TIME_FIELDS or field in active or float(value) != IDENTITY[field]:
            values.append(torch.full((1,), float(value), dtype=dtype, device=device))
        else:
            values.append(None)
    phase = any(values[nat.TISSUE_PARAMS.index(f)] is not None for f in _PHASE_FIELDS)
    return Packed(voxel_shape, num_voxels, tuple(values), phase)


def needs_complex(fields: dict) -> bool:
    """Whether tissue asks for phase physics (B0, B1phase, v, pool shifts): the complex path. The answer is
    kept while the tensors it read are the same and unmodified (a GPU value is read with a sync)."""
    parts = [(f, fields[f]) for f in _PHASE_FIELDS + _POOL_SHIFTS if fields.get(f) is not None]
    kept, key = _LAST_PHASE.lookup((), parts)
    if kept is None:
        kept = _needs_complex(fields)
        _LAST_PHASE.keep(key, kept)
    return kept


_LAST_PHASE = LastResult()


def _needs_complex(fields: dict) -> bool:
    for field in _PHASE_FIELDS + _POOL_SHIFTS:
        value = fields.get(field)
        if value is None:
            continue
        if isinstance(value, torch.Tensor):
            if value.requires_grad or bool(_tensor_identity_differs(value, 0.0)):
                return True
        elif float(value) != 0.0:
            return True
    return False


# -- kernel calls -----------------------------------------------------------------------------------
def _static(program, num_voxels: int, dtype: torch.dtype, device: torch.device,
            checkpoint_stride: int = 4) -> K.Static:
    action, record = program.structure_on(device)
    return K.Static(
        action=action,
        record=record,
        num_repetitions=program.num_repetitions,
        num_samples=program.num_samples,
        num_states=program.num_states,
        path=program.path,
        crusher_dk_rad_per_m=program.crusher_dk_rad_per_m,
        voxel_size_m=program.voxel_size_m,
        checkpoint_stride=checkpoint_stride,
        num_voxels=num_voxels,
        dtype=dtype,
        device=device,
    )


def run(program, values: tuple, packed: Packed | None, fields: dict, *, dtype: torch.dtype = torch.float32,
        jacobian=(), lineshape: str = "super-lorentzian", wrapped: bool = False):
    """Run `program` with `values` (dt_s, dt_wrap_s, flip_rad, phase_rad) on tissue `fields`.

    `packed` is `pack_fields(fields, dtype=dtype, active=jacobian)`: free-water tissue takes the direct
    path; None (pools) goes through `engine.simulate.bind`, which builds the pool tables. Returns
    (signal [*voxel, S], J [*voxel, P, S] or None); `jacobian` names the P tissue fields to differentiate
    along (forward mode). `wrapped` says the values are already in `dtype` with their phases wrapped
    (`AffineValues(..., wrap_last=True)`).
    """
    S = program.num_samples
    dt, dt_wrap, flip, phase = values
    if not wrapped:
        # Phases are wrapped in float64 before narrowing, as engine.simulate.bind does: an RF-spoiled train
        # reaches thousands of rad, which float32 holds to 1e-4 rad only.
        phase = torch.remainder(phase, 2 * math.pi)
    if packed is not None:
        device = next((v.device for v in packed.values if v is not None), torch.device("cpu"))
        event = tuple(v if v.dtype == dtype and v.device == device else v.to(device=device, dtype=dtype)
                      for v in (dt, dt_wrap, flip, phase))
        static = _static(program, packed.num_voxels, dtype, device)
        inputs = event + packed.values + (None,) * len(nat.TABLES)
        voxel_shape = packed.voxel_shape
        if not jacobian:
            return run_forward(static, inputs).reshape(voxel_shape + (S,)), None
        tangents = [None] * len(inputs)
        for p, field in enumerate(jacobian):
            j = K.NUM_EVENT_INPUTS + nat.TISSUE_PARAMS.index(field)
            if tangents[j] is None:
                tangents[j] = torch.zeros((len(jacobian), inputs[j].numel()), dtype=dtype, device=device)
            tangents[j][p] = 1.0
        signal, jac = EpgJacobian.apply(static, len(inputs), *inputs, *tangents)
        return signal.reshape(voxel_shape + (S,)), _jacobian_shape(jac, voxel_shape, len(jacobian), S)

    # Pools or T2prime: the engine's binding builds the pool tables (and raises what it does not support);
    # T2' then scales the samples.
    program = dataclasses.replace(program, dt_s=dt, dt_wrap_s=dt_wrap, flip_rad=flip, phase_rad=phase)
    tissue = TissueProperties(**fields)
    static, inputs, voxel_shape = engine_bind(program, tissue, dtype, lineshape=lineshape, active=jacobian)
    if not jacobian:
        signal = run_forward(static, inputs).reshape(voxel_shape + (S,))
        return apply_t2_prime(program, fields.get("t2_prime_ms"), signal)
    tangents = engine_tangents(program, tissue, dtype, inputs, jacobian, lineshape=lineshape)
    signal, jac = EpgJacobian.apply(static, len(inputs), *inputs, *tangents)
    signal, jac = signal.reshape(voxel_shape + (S,)), _jacobian_shape(jac, voxel_shape, len(jacobian), S)
    return apply_t2_prime(program, fields.get("t2_prime_ms"), signal, jac, jacobian)


def _jacobian_shape(jac: torch.Tensor, voxel_shape: tuple, P: int, S: int) -> torch.Tensor:
    """[P, V, S] -> (*voxel, P, S)."""
    return jac.permute(1, 0, 2).reshape(voxel_shape + (P, S))


# -- playings end to end ----------------------------------------------------------------------------
def unroll(program, values: tuple, playings: int, *, stride: int = 1):
    """`playings x stride` playings of a program laid end to end, every `stride`-th recorded: (program, values).

    Sample slot `k * S + s` is sample s of playing `(k + 1) * stride` (counting from 1). The first event of
    every later playing waits the wrap interval, as in a program of that many repetitions. Every per-event
    array of the program (including ones added after this was written) is tiled.
    """
    n = playings * stride
    dt, dt_wrap, flip, phase = values
    E, S = len(program.action), program.num_samples
    later = torch.cat([dt_wrap.reshape(1), dt[1:]])
    changes = {"num_repetitions": 1, "num_samples": playings * S}
    for f in dataclasses.fields(program):
        value = getattr(program, f.name)
        if f.name == "record":
            tiled = np.tile(value, n)
            playing = np.repeat(np.arange(n), E)
            kept = (tiled >= 0) & ((playing + 1) % stride == 0)
            changes[f.name] = np.where(kept, tiled + ((playing + 1) // stride - 1) * S, -1).astype(np.int32)
        elif f.name == "action":
            tiled = np.tile(value, n) & ~nat.RECORD  # set again below where a slot is kept
            if n > 1 and (bool(dt_wrap.detach()[0] != 0) or dt_wrap.requires_grad):
                tiled[E::E] |= nat.INTERVAL
            changes[f.name] = tiled.astype(np.int32)
        elif f.name == "sample_events":
            changes[f.name] = list(value) * playings
        elif isinstance(value, np.ndarray) and value.shape[:1] == (E,):
            changes[f.name] = np.tile(value, (n,) + (1,) * (value.ndim - 1))
    unrolled = dataclasses.replace(program, **changes)
    unrolled.action[unrolled.record >= 0] |= nat.RECORD
    values = (torch.cat([dt] + [later] * (n - 1)), dt_wrap, flip.repeat(n), phase.repeat(n))
    return unrolled, values
