"""Program values as an affine map of the protocol: the fast path of calls that change only values.

A compiled `Program` is a structure (action bits, sample slots, path, orders) plus four value arrays
(interval lengths, wrap interval, flips, phases). A simulator's layout is a function of its protocol
tensors; the event structure depends only on structural arguments, and the values are, for every
shipped layout, affine in the protocol (flips enter through `deg2rad`, durations through sums and
differences of timestamps). `AffineValues` records that map once, `values = A p + b` with a sparse `A`
found by autograd through one walk of the layout, and later calls evaluate it with three torch ops
instead of walking the layout and compiling again; gradients still reach the protocol tensors through `p`.
"""

from __future__ import annotations

import math

import numpy as np
import torch

__all__ = ["AffineValues", "batched_vjp"]

#: Dense Jacobian blocks are extracted in row chunks of at most this many entries.
_CHUNK_ENTRIES = 1 << 22


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

    __slots__ = ("rows", "cols", "coef", "offset", "sizes", "wrapped", "scale", "moved", "placed", "one_block")

    def __init__(self, rows, cols, coef, offset, sizes):
        self.rows, self.cols, self.coef, self.offset, self.sizes = rows, cols, coef, offset, tuple(sizes)
        self.wrapped = None  # the offset with its constant last block wrapped, False if that block varies
        self.placed = {}  # device -> (the `wrapped` it was made with, the map's tensors on that device)
        self.one_block = {}  # (device, dtype, wrap_last) -> what `_one_block` keeps, or False where it does not apply
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
        blocks = self._one_block(p, dtype, wrap_last)
        if blocks is not None:
            return blocks
        rows, cols, coef, flat, wrapped = self._on(p.device)
        if wrap_last and self.wrapped is not False:
            flat = wrapped
        if self.scale is not None and p.numel() == cols.numel():
            flat = flat.index_add(0, rows, p, alpha=self.scale)
        elif rows.numel():
            flat = flat.index_add(0, rows, coef * p.index_select(0, cols))
        if wrap_last and self.wrapped is False:  # moved phases, on either path
            last = flat.numel() - self.sizes[-1]
            flat = torch.cat([flat[:last], torch.remainder(flat[last:], 2 * math.pi)])
        blocks = (flat if dtype == torch.float64 else flat.to(dtype)).split_with_sizes(self.sizes)
        return tuple(b if moved else b.detach() for b, moved in zip(blocks, self.moved, strict=True))

    def _one_block(self, p: torch.Tensor, dtype: torch.dtype, wrap_last: bool) -> tuple | None:
        """The blocks at `p` when the protocol moves one block only, each entry of `p` once, in order, by one
        factor (MRF's flips): that block is its offset plus `scale * p`, and the others are constants, narrowed
        once per device and dtype and kept. The values of the whole map, in two operations per call instead of
        four, and with no zero blocks and concatenation in the backward (docs/design.md, small calls). None
        where it does not apply (a moved last block under `wrap_last` takes the whole map, as before)."""
        if self.scale is None or p.numel() != self.cols.numel():
            return None
        key = (p.device, dtype, wrap_last)
        kept = self.one_block.get(key)
        if kept is None:
            kept = False
            index = self.moved.index(True) if sum(self.moved) == 1 else None
            if index is not None and not (wrap_last and index == len(self.sizes) - 1):
                rows, _, _, flat, wrapped = self._on(p.device)
                if wrap_last:  # the last block is constant here: wrapped once
                    flat = wrapped
                start = sum(self.sizes[:index])
                constants = (flat if dtype == torch.float64 else flat.to(dtype)).split_with_sizes(self.sizes)
                kept = (index, flat[start:start + self.sizes[index]], rows - start,
                        tuple(b.detach() for b in constants))
            self.one_block[key] = kept
        if kept is False:
            return None
        index, offset, rows, constants = kept
        block = offset.index_add(0, rows, p, alpha=self.scale)
        return constants[:index] + (block if dtype == torch.float64 else block.to(dtype),) + constants[index + 1:]

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
