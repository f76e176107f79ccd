"""Calls into the kernel library: build the C ABI structs from tensors, allocate outputs with torch.

`Static` holds a compiled program's structure; the differentiable inputs travel as one flat tuple
`inputs = (dt_s, dt_wrap_s, flip_rad, phase_rad, *tissue, *tables)`: tissue in the order of
`blochsim._native.TISSUE_PARAMS` (None where a property is at its identity), then the pool tables
(L, r, T, zeq, sat; None for pool model 0). Tissue inputs are [V] or [1]; tables [V or 1, ...], T complex.
"""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass

import torch

from .. import _native as nat
from .program import plain

__all__ = ["Static", "num_threads", "forward", "jvp", "vjp", "vjp_jvp", "NUM_EVENT_INPUTS", "TABLE_START"]

NUM_EVENT_INPUTS = 4  # dt_s, dt_wrap_s, flip_rad, phase_rad
TABLE_START = NUM_EVENT_INPUTS + nat.NUM_TISSUE
NUM_INPUTS = TABLE_START + len(nat.TABLES)
_JVP_WIDTHS = (1, 2, 4, 8)


@dataclass
class Static:
    """The non-differentiable part of a call: structure, sizes, dtype."""

    action: torch.Tensor  # [E] int32
    record: torch.Tensor  # [E] int32
    num_repetitions: int
    num_samples: int
    num_states: int
    path: int
    crusher_dk_rad_per_m: float
    voxel_size_m: float
    checkpoint_stride: int
    num_voxels: int
    dtype: torch.dtype
    num_transverse_pools: int = 1
    num_longitudinal_pools: int = 1
    interval: torch.Tensor | None = None  # [E] int32 table rows (tabulated layouts)
    wrap_interval: int = 0
    num_intervals: int = 0
    device: torch.device = torch.device("cpu")

    @property
    def num_events(self) -> int:
        return int(self.action.numel())

    @property
    def tabulated(self) -> bool:
        return self.interval is not None


def num_threads() -> int:
    """Host threads: BLOCHSIM_NUM_THREADS, else torch.get_num_threads()."""
    env = os.environ.get("BLOCHSIM_NUM_THREADS")
    return int(env) if env else torch.get_num_threads()


def _ptr(t):
    return None if t is None else plain(t).data_ptr()


def _dtype_code(dtype) -> int:
    return nat.FLOAT32 if dtype == torch.float32 else nat.FLOAT64


def _complex(dtype):
    return torch.complex64 if dtype == torch.float32 else torch.complex128


def _real_view(t):
    """A table as the kernel reads it: real, contiguous (complex T as interleaved pairs)."""
    if t is None:
        return None
    if t.is_complex():
        t = torch.view_as_real(t.resolve_conj())
    return t.contiguous()


def _program(st: Static, inputs) -> nat.Program:
    dt, dt_wrap, flip, phase = inputs[:NUM_EVENT_INPUTS]
    return nat.Program(
        st.num_events,
        st.num_repetitions,
        st.num_samples,
        st.num_states,
        st.path,
        st.checkpoint_stride,
        _ptr(st.action),
        _ptr(st.record),
        _ptr(dt),
        _ptr(dt_wrap),
        _ptr(flip),
        _ptr(phase),
        st.crusher_dk_rad_per_m,
        st.voxel_size_m,
        st.num_transverse_pools,
        st.num_longitudinal_pools,
        int(st.tabulated),
        0,
        st.num_intervals,
        _ptr(st.interval),
        st.wrap_interval,
    )


def _tissue(st: Static, inputs) -> nat.Tissue:
    t = nat.Tissue()
    t.num_voxels = st.num_voxels
    for j, x in enumerate(inputs[NUM_EVENT_INPUTS:TABLE_START]):
        t.data[j] = _ptr(x)
        t.stride[j] = 0 if x is None or x.numel() == 1 else 1
    return t


def _tables(tables, keep: list, *, lead: int = 0) -> nat.Tables:
    """Struct of the tables (or their tangents with `lead` = 1 leading axis); views are kept alive in `keep`."""
    out = nat.Tables()
    for i, t in enumerate(tables):
        view = _real_view(t)
        keep.append(view)
        setattr(out, nat.TABLES[i], _ptr(view))
        if view is not None:
            voxels = view.shape[lead]
            per_voxel = view[(0,) * (lead + 1)].numel() if view.numel() else 0
            out.stride_v[i] = 0 if voxels == 1 else per_voxel
            out.stride_p[i] = view[0].numel() if lead else 0
    return out


def _tangents(st: Static, tangents, width: int, keep: list) -> tuple[nat.Tangents, nat.Tables]:
    """tangents: like inputs, each None or a tensor [P, *input.shape]."""
    t = nat.Tangents()
    t.count = width
    t.dt_s, t.dt_wrap_s, t.flip_rad, t.phase_rad = (_ptr(x) for x in tangents[:NUM_EVENT_INPUTS])
    for j, x in enumerate(tangents[NUM_EVENT_INPUTS:TABLE_START]):
        t.tissue[j] = _ptr(x)
        if x is not None:
            t.tissue_stride_p[j] = x.shape[1]
            t.tissue_stride_v[j] = 0 if x.shape[1] == 1 else 1
    return t, _tables(tangents[TABLE_START:], keep, lead=1)


def _grads(st: Static, inputs, wanted, width: int = 0):
    """Allocate gradient outputs for the inputs flagged in `wanted` (per voxel for tissue and tables)."""
    E, V = st.num_events, st.num_voxels
    lead = (width,) if width else ()
    out = []
    for i, (x, w) in enumerate(zip(inputs, wanted, strict=True)):
        if not w or x is None:
            out.append(None)
        elif i < NUM_EVENT_INPUTS:
            out.append(torch.zeros(lead + (1 if i == 1 else E,), dtype=st.dtype, device=st.device))
        elif i < TABLE_START:
            out.append(torch.zeros(lead + (V,), dtype=st.dtype, device=st.device))
        else:  # a table: per voxel, real view
            shape = _real_view(x).shape[1:]
            out.append(torch.zeros(lead + (V,) + tuple(shape), dtype=st.dtype, device=st.device))
    g = nat.Grads(*(_ptr(x) for x in out[:NUM_EVENT_INPUTS]))
    for j, x in enumerate(out[NUM_EVENT_INPUTS:TABLE_START]):
        g.tissue[j] = _ptr(x)
    tg = nat.TableGrads(*(_ptr(x) for x in out[TABLE_START:]))
    return g, tg, out


def _fold(inputs, grads):
    """Per-voxel gradients of inputs shared by every voxel are summed; complex tables come back complex."""
    folded = []
    for i, (x, g) in enumerate(zip(inputs, grads, strict=True)):
        if g is not None and i >= NUM_EVENT_INPUTS:
            if i >= TABLE_START and x.is_complex():
                g = torch.view_as_complex(g)
            if x.shape[0] == 1 and g.shape[0] != 1:
                g = g.sum(0, keepdim=True)
        folded.append(g)
    return folded


_PASSES = {"bs_epg_forward": 0, "bs_epg_jvp": 1, "bs_epg_vjp": 2, "bs_epg_vjp_jvp": 3}


def _call(st: Static, entry: str, args) -> None:
    """Run an entry point on the library of the data's device: CUDA tensors go to the CUDA build, on
    torch's current stream, with scratch allocated by torch; nothing comes back to the host. No voxels (an
    empty property array, as NumPy broadcasts it) leave the outputs as allocated: empty, and zero gradients
    of the values every voxel shares."""
    if st.num_voxels == 0:
        return
    if st.device.type == "cuda":
        lib = nat.cuda_library()
        args.stream = torch.cuda.current_stream(st.device).cuda_stream
        pass_index = _PASSES[entry]
        need = lib.bs_epg_scratch_bytes(pass_index, ctypes.byref(args))
        if need < 0:
            nat.check_status(lib, 1, entry)
        scratch = torch.empty(max(int(need), 1), dtype=torch.uint8, device=st.device)
        args.scratch, args.scratch_bytes = scratch.data_ptr(), int(need)
        status = getattr(lib, entry)(ctypes.byref(args))
        nat.check_status(lib, status, entry)
        return
    lib = nat.cpu_library()
    status = getattr(lib, entry)(ctypes.byref(args))
    nat.check_status(lib, status, entry)


def forward(st: Static, inputs) -> torch.Tensor:
    """signal [V, S], complex."""
    keep = []
    signal = torch.empty((st.num_voxels, st.num_samples), dtype=_complex(st.dtype), device=st.device)
    args = nat.ForwardArgs(_dtype_code(st.dtype), num_threads(), None, _program(st, inputs), _tissue(st, inputs),
                           _tables(inputs[TABLE_START:], keep), _ptr(signal))
    _call(st, "bs_epg_forward", args)
    return signal


def jvp(st: Static, inputs, tangents) -> tuple[torch.Tensor, torch.Tensor]:
    """signal [V, S] and its derivatives [P, V, S] along P tangents ([P, *shape] per input, or None)."""
    P = max((t.shape[0] for t in tangents if t is not None), default=1)
    width = next(w for w in _JVP_WIDTHS + (P,) if w >= P)
    if width > 8:  # more tangents than a kernel carries: run them in groups of 8
        parts = [jvp(st, inputs, [None if t is None else t[i : i + 8] for t in tangents]) for i in range(0, P, 8)]
        return parts[0][0], torch.cat([p[1] for p in parts])
    padded = []
    for t in tangents:
        if t is not None and t.shape[0] < width:
            t = torch.cat([t, t.new_zeros((width - t.shape[0],) + t.shape[1:])])
        padded.append(None if t is None else t.contiguous())
    keep = []
    signal = torch.empty((st.num_voxels, st.num_samples), dtype=_complex(st.dtype), device=st.device)
    signal_tangent = torch.empty((width, st.num_voxels, st.num_samples), dtype=_complex(st.dtype), device=st.device)
    tangent_struct, tables_tangent = _tangents(st, padded, width, keep)
    args = nat.JvpArgs(_dtype_code(st.dtype), num_threads(), None, _program(st, inputs), _tissue(st, inputs),
                       _tables(inputs[TABLE_START:], keep), tangent_struct, tables_tangent, _ptr(signal),
                       _ptr(signal_tangent))
    _call(st, "bs_epg_jvp", args)
    return signal, signal_tangent[:P]


def vjp(st: Static, inputs, cotangent: torch.Tensor, wanted) -> list:
    """Gradients of Re<cotangent, signal> for the inputs flagged in `wanted` (others None)."""
    keep = []
    cotangent = cotangent.to(_complex(st.dtype)).contiguous()
    grads, table_grads, out = _grads(st, inputs, wanted)
    args = nat.VjpArgs(_dtype_code(st.dtype), num_threads(), None, _program(st, inputs), _tissue(st, inputs),
                       _tables(inputs[TABLE_START:], keep), _ptr(cotangent), grads, table_grads)
    _call(st, "bs_epg_vjp", args)
    return _fold(inputs, out)


def vjp_jvp(st: Static, inputs, tangents, cotangent, cotangent_tangent, wanted):
    """The VJP and its derivative along one tangent direction ([1, *shape] per input, or None).

    Returns (grads, grads_tangent, signal_tangent [V, S]).
    """
    keep = []
    cotangent = cotangent.to(_complex(st.dtype)).contiguous()
    if cotangent_tangent is not None:
        cotangent_tangent = cotangent_tangent.to(_complex(st.dtype)).contiguous()
    tangents = [None if t is None else t.contiguous() for t in tangents]
    grads, table_grads, out = _grads(st, inputs, wanted)
    grads_t, table_grads_t, out_t = _grads(st, inputs, wanted)
    signal = torch.empty((st.num_voxels, st.num_samples), dtype=_complex(st.dtype), device=st.device)
    signal_t = torch.empty((st.num_voxels, st.num_samples), dtype=_complex(st.dtype), device=st.device)
    tangent_struct, tables_tangent = _tangents(st, tangents, 1, keep)
    args = nat.VjpJvpArgs(_dtype_code(st.dtype), num_threads(), None, _program(st, inputs), _tissue(st, inputs),
                          _tables(inputs[TABLE_START:], keep), tangent_struct, tables_tangent, _ptr(cotangent),
                          _ptr(cotangent_tangent), grads, grads_t, table_grads, table_grads_t, _ptr(signal),
                          _ptr(signal_t))
    _call(st, "bs_epg_vjp_jvp", args)
    return _fold(inputs, out), _fold(inputs, out_t), signal_t
