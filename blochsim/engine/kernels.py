"""Calls into the kernel library: build the C ABI structs from tensors, allocate outputs with torch.

`Static` holds a compiled program's structure in the kernel's dtype; the differentiable inputs travel
as a flat tuple `inputs = (dt_s, dt_wrap_s, flip_rad, phase_rad, *tissue)` with tissue in the order of
`blochsim._native.TISSUE_PARAMS` (None where a property is at its identity).
"""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass

import torch

from .. import _native as nat

__all__ = ["Static", "num_threads", "forward", "jvp", "vjp", "vjp_jvp", "NUM_EVENT_INPUTS"]

NUM_EVENT_INPUTS = 4  # dt_s, dt_wrap_s, flip_rad, phase_rad
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

    @property
    def num_events(self) -> int:
        return int(self.action.numel())


def num_threads() -> int:
    """Host threads: BLOCHSIM_NUM_THREADS, else torch.get_num_threads()."""
    env = os.environ.get("BLOCHSIM_NUM_THREADS")
    return int(env) if env else torch.get_num_threads()


def _ptr(t):
    return None if t is None else t.data_ptr()


def _dtype_code(dtype) -> int:
    return nat.FLOAT32 if dtype == torch.float32 else nat.FLOAT64


def _complex(dtype):
    return torch.complex64 if dtype == torch.float32 else torch.complex128


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
    )


def _tissue(st: Static, inputs) -> nat.Tissue:
    tissue = inputs[NUM_EVENT_INPUTS:]
    t = nat.Tissue()
    t.num_voxels = st.num_voxels
    for j, x in enumerate(tissue):
        t.data[j] = _ptr(x)
        t.stride[j] = 0 if x is None or x.numel() == 1 else 1
    return t


def _tangents(st: Static, tangents, width: int) -> nat.Tangents:
    """tangents: like inputs, each None or a tensor [P, *input.shape]."""
    t = nat.Tangents()
    t.count = width
    ev = tangents[:NUM_EVENT_INPUTS]
    t.dt_s, t.dt_wrap_s, t.flip_rad, t.phase_rad = (_ptr(x) for x in ev)
    for j, x in enumerate(tangents[NUM_EVENT_INPUTS:]):
        t.tissue[j] = _ptr(x)
        if x is not None:
            t.tissue_stride_p[j] = x.shape[1]
            t.tissue_stride_v[j] = 0 if x.shape[1] == 1 else 1
    return t


def _grads(st: Static, wanted, width: int = 0):
    """Allocate gradient outputs for the inputs flagged in `wanted` ([width, ...] ahead when width > 0)."""
    E, V = st.num_events, st.num_voxels
    shapes = [(E,), (1,), (E,), (E,)] + [(V,)] * nat.NUM_TISSUE
    lead = (width,) if width else ()
    out = [torch.zeros(lead + s, dtype=st.dtype) if w else None for w, s in zip(wanted, shapes, strict=True)]
    g = nat.Grads(*(_ptr(x) for x in out[:NUM_EVENT_INPUTS]))
    for j, x in enumerate(out[NUM_EVENT_INPUTS:]):
        g.tissue[j] = _ptr(x)
    return g, out


def _fold(inputs, grads):
    """Per-voxel tissue gradients of single-value (broadcast) inputs are summed."""
    folded = []
    for x, g in zip(inputs, grads, strict=True):
        if g is not None and x is not None and x.numel() == 1 and g.shape[-1] != 1:
            g = g.sum(-1, keepdim=True)
        folded.append(g)
    return folded


def _call(entry: str, args) -> None:
    lib = nat.cpu_library()
    status = getattr(lib, entry)(ctypes.byref(args))
    nat.check_status(lib, status, entry)


def forward(st: Static, inputs) -> torch.Tensor:
    """signal [V, S], complex."""
    signal = torch.empty((st.num_voxels, st.num_samples), dtype=_complex(st.dtype))
    args = nat.ForwardArgs(_dtype_code(st.dtype), num_threads(), None, _program(st, inputs), _tissue(st, inputs),
                           _ptr(signal))
    _call("bs_epg_forward", args)
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
    signal = torch.empty((st.num_voxels, st.num_samples), dtype=_complex(st.dtype))
    signal_tangent = torch.empty((width, st.num_voxels, st.num_samples), dtype=_complex(st.dtype))
    args = nat.JvpArgs(_dtype_code(st.dtype), num_threads(), None, _program(st, inputs), _tissue(st, inputs),
                       _tangents(st, padded, width), _ptr(signal), _ptr(signal_tangent))
    _call("bs_epg_jvp", args)
    return signal, signal_tangent[:P]


def vjp(st: Static, inputs, cotangent: torch.Tensor, wanted) -> list:
    """Gradients of Re<cotangent, signal> for the inputs flagged in `wanted` (others None)."""
    cotangent = cotangent.to(_complex(st.dtype)).contiguous()
    grads, out = _grads(st, wanted)
    args = nat.VjpArgs(_dtype_code(st.dtype), num_threads(), None, _program(st, inputs), _tissue(st, inputs),
                       _ptr(cotangent), grads)
    _call("bs_epg_vjp", args)
    return _fold(inputs, out)


def vjp_jvp(st: Static, inputs, tangents, cotangent, cotangent_tangent, wanted):
    """The VJP and its derivative along one tangent direction ([1, *shape] per input, or None).

    Returns (grads, grads_tangent, signal_tangent [V, S]).
    """
    cotangent = cotangent.to(_complex(st.dtype)).contiguous()
    if cotangent_tangent is not None:
        cotangent_tangent = cotangent_tangent.to(_complex(st.dtype)).contiguous()
    tangents = [None if t is None else t.contiguous() for t in tangents]
    grads, out = _grads(st, wanted)
    grads_t, out_t = _grads(st, wanted)
    signal = torch.empty((st.num_voxels, st.num_samples), dtype=_complex(st.dtype))
    signal_t = torch.empty((st.num_voxels, st.num_samples), dtype=_complex(st.dtype))
    args = nat.VjpJvpArgs(_dtype_code(st.dtype), num_threads(), None, _program(st, inputs), _tissue(st, inputs),
                          _tangents(st, tangents, 1), _ptr(cotangent), _ptr(cotangent_tangent), grads, grads_t,
                          _ptr(signal), _ptr(signal_t))
    _call("bs_epg_vjp_jvp", args)
    return _fold(inputs, out), _fold(inputs, out_t), signal_t
