"""PERK's kernels through ctypes (`csrc/perk.h`): the regression on random features, its VJP, and the streaming
fit's sums, on the host library or the CUDA one; `Regression`, the autograd Function over them.

Every function takes a `RandomFeatures` and tensors of one real dtype on one device, allocates what the
kernel writes (torch), and calls the library of that device. Float32 runs everywhere, float64 on the host
only (a float64 call on a CUDA device runs in float32 there). A CUDA library built without PERK kernels
(the CUDA 12 package, whose launcher carries the EPG kernels only) runs the same arithmetic as torch
operations on the device, `chunk` rows at a time (perk_reference.py).
"""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass

import torch

from .. import _native as nat
from . import perk_reference as reference

__all__ = ["RandomFeatures", "MAX_OUTPUTS", "regression", "regression_vjp", "accumulate", "Regression", "has_kernels"]

#: BS_PERK_MAX_OUTPUTS: heads one kernel call evaluates; more are split over calls.
MAX_OUTPUTS = 16
#: Rows per torch step where a CUDA library lacks the PERK kernels: features of at most this many rows exist.
FALLBACK_CHUNK = 8192

_p = ctypes.c_void_p
_i64 = ctypes.c_int64
_i32 = ctypes.c_int32


class _Features(ctypes.Structure):
    _fields_ = [("num_inputs", _i64), ("num_features", _i64), ("frequency", _p), ("frequency_t", _p),
                ("phase", _p)]


class _MapArgs(ctypes.Structure):
    _fields_ = [("dtype", _i32), ("num_threads", _i32), ("stream", _p), ("features", _Features),
                ("num_voxels", _i64), ("num_outputs", _i64), ("input", _p), ("head", _p), ("offset", _p),
                ("output", _p), ("scratch", _p), ("scratch_bytes", _i64)]


class _VjpArgs(ctypes.Structure):
    _fields_ = [("dtype", _i32), ("num_threads", _i32), ("stream", _p), ("features", _Features),
                ("num_voxels", _i64), ("num_outputs", _i64), ("input", _p), ("head", _p), ("cotangent", _p),
                ("input_grad", _p), ("scratch", _p), ("scratch_bytes", _i64)]


class _AccumulateArgs(ctypes.Structure):
    _fields_ = [("dtype", _i32), ("num_threads", _i32), ("stream", _p), ("features", _Features),
                ("num_samples", _i64), ("num_targets", _i64), ("input", _p), ("target", _p),
                ("feature_sum", _p), ("feature_gram", _p), ("feature_target", _p), ("scratch", _p),
                ("scratch_bytes", _i64)]


_ENTRIES = {"bs_perk_map": _MapArgs, "bs_perk_vjp": _VjpArgs, "bs_perk_accumulate": _AccumulateArgs}
_PASS = {"bs_perk_map": 0, "bs_perk_vjp": 1, "bs_perk_accumulate": 2}
_prepared: dict = {}


def _library(device: torch.device):
    """The kernel library of `device` with the PERK entry points typed, or None for a CUDA library without them."""
    lib = nat.cuda_library() if device.type == "cuda" else nat.cpu_library()
    key = id(lib)
    if key not in _prepared:
        if not hasattr(lib, "bs_perk_map"):
            if device.type != "cuda":
                raise nat.NativeLibraryError(
                    "the blochsim kernel library has no PERK kernels (bs_perk_map): it predates them; rebuild or "
                    "reinstall blochsim so the library and the package come from one source")
            _prepared[key] = None
        else:
            nat.type_entry_points(lib, _ENTRIES, "bs_perk_scratch_bytes")
            _prepared[key] = lib
    return _prepared[key]


def has_kernels(device) -> bool:
    """Whether the library of `device` carries the PERK kernels (else torch runs the same arithmetic)."""
    return _library(torch.device(device)) is not None


def _threads() -> int:
    env = os.environ.get("BLOCHSIM_NUM_THREADS")
    return int(env) if env else torch.get_num_threads()


def _run(lib, device: torch.device, entry: str, args) -> None:
    """Call `entry` with `args`: on a CUDA device on torch's current stream, with scratch from torch."""
    if device.type != "cuda":
        nat.check_status(lib, getattr(lib, entry)(ctypes.byref(args)), entry)
        return
    with torch.cuda.device(device):  # the kernels size their feature splits by the current device
        args.stream = torch.cuda.current_stream(device).cuda_stream
        need = lib.bs_perk_scratch_bytes(_PASS[entry], ctypes.byref(args))
        if need < 0:
            nat.check_status(lib, 1, entry)
        keep = None
        if entry != "bs_perk_accumulate" and need > 0:  # the fit's scratch (its features) comes from the caller
            keep = torch.empty(int(need), dtype=torch.uint8, device=device)
            args.scratch, args.scratch_bytes = keep.data_ptr(), int(need)
        nat.check_status(lib, getattr(lib, entry)(ctypes.byref(args)), entry)
        del keep  # freed to torch's caching allocator, which keeps it for this stream's queued work


@dataclass(frozen=True)
class RandomFeatures:
    """z(x) = cos(W x + b): `frequency` W `[F, D]` (1/length scale folded in per column), `frequency_t` its
    transpose `[D, F]` (contiguous), `phase` b `[F]` (rad); one dtype and device."""

    frequency: torch.Tensor
    frequency_t: torch.Tensor
    phase: torch.Tensor

    @staticmethod
    def of(frequency: torch.Tensor, phase: torch.Tensor) -> RandomFeatures:
        return RandomFeatures(frequency.contiguous(), frequency.T.contiguous(), phase.contiguous())

    @property
    def num_features(self) -> int:
        return self.frequency.shape[0]

    @property
    def num_inputs(self) -> int:
        return self.frequency.shape[1]

    def to(self, device, dtype) -> RandomFeatures:
        if self.frequency.device == torch.device(device) and self.frequency.dtype == dtype:
            return self
        return RandomFeatures(*(t.to(device=device, dtype=dtype) for t in
                                (self.frequency, self.frequency_t, self.phase)))

    def struct(self) -> _Features:
        return _Features(self.num_inputs, self.num_features, self.frequency.data_ptr(),
                         self.frequency_t.data_ptr(), self.phase.data_ptr())


def _dtype_code(dtype: torch.dtype) -> int:
    if dtype == torch.float32:
        return nat.FLOAT32
    if dtype == torch.float64:
        return nat.FLOAT64
    raise TypeError(f"PERK kernels take float32 or float64, got {dtype}")


def _placed(x: torch.Tensor, rf: RandomFeatures, *tensors):
    """(dtype the call runs in, features, tensors) on x's device: float64 on CUDA runs as float32."""
    dtype = x.dtype
    if x.device.type == "cuda":
        dtype = torch.float32
    rf = rf.to(x.device, dtype)
    return dtype, rf, [None if t is None else t.to(device=x.device, dtype=dtype).contiguous() for t in tensors]


def _check_columns(x: torch.Tensor, rf: RandomFeatures) -> None:
    if x.dim() != 2 or x.shape[1] != rf.num_inputs:
        raise ValueError(f"PERK input rows must be (N, {rf.num_inputs}) (the feature columns), got shape "
                         f"{tuple(x.shape)}")


def regression(x: torch.Tensor, rf: RandomFeatures, head: torch.Tensor, offset: torch.Tensor) -> torch.Tensor:
    """offset + cos(x W^T + b) head^T: `x` `(V, D)`, `head` `(T, F)`, `offset` `(T,)` -> `(V, T)` in the dtype
    the call runs in (see `_placed`). No autograd: `Regression` adds it."""
    _check_columns(x, rf)
    dtype, rf, (x, head, offset) = _placed(x, rf, x.detach(), head, offset)
    V, T = x.shape[0], head.shape[0]
    lib = _library(x.device)
    if lib is None:
        return reference.regression(x, rf.frequency, rf.phase, head, offset, chunk=FALLBACK_CHUNK)
    out = torch.empty((V, T), dtype=dtype, device=x.device)
    for t0 in range(0, T, MAX_OUTPUTS):
        t1 = min(T, t0 + MAX_OUTPUTS)
        h, c = head[t0:t1].contiguous(), offset[t0:t1].contiguous()
        part = out if (t0, t1) == (0, T) else torch.empty((V, t1 - t0), dtype=dtype, device=x.device)
        args = _MapArgs(_dtype_code(dtype), _threads(), None, rf.struct(), V, t1 - t0, x.data_ptr(), h.data_ptr(),
                        c.data_ptr(), part.data_ptr())
        if V:
            _run(lib, x.device, "bs_perk_map", args)
        if part is not out:
            out[:, t0:t1] = part
    return out


def regression_vjp(x: torch.Tensor, rf: RandomFeatures, head: torch.Tensor, cotangent: torch.Tensor) -> torch.Tensor:
    """The gradient of `sum(cotangent * regression(x))` with respect to `x` `(V, D)`, never holding the
    features of more than a tile of voxels."""
    _check_columns(x, rf)
    dtype, rf, (x, head, cotangent) = _placed(x, rf, x.detach(), head, cotangent)
    V, T = x.shape[0], head.shape[0]
    lib = _library(x.device)
    if lib is None:
        return reference.regression_vjp(x, rf.frequency, rf.phase, head, cotangent, chunk=FALLBACK_CHUNK)
    grad = torch.empty_like(x)
    for t0 in range(0, T, MAX_OUTPUTS):
        t1 = min(T, t0 + MAX_OUTPUTS)
        h, g = head[t0:t1].contiguous(), cotangent[:, t0:t1].contiguous()
        part = grad if t0 == 0 else torch.empty_like(x)
        args = _VjpArgs(_dtype_code(dtype), _threads(), None, rf.struct(), V, t1 - t0, x.data_ptr(), h.data_ptr(),
                        g.data_ptr(), part.data_ptr())
        if V:
            _run(lib, x.device, "bs_perk_vjp", args)
        if part is not grad:
            grad += part
    return grad


def accumulate(x: torch.Tensor, rf: RandomFeatures, target: torch.Tensor | None, *, feature_sum=None,
               feature_gram=None, feature_target=None) -> None:
    """Add the chunk's sums to the float64 accumulators given (`feature_sum` `[F]`, `feature_gram` `[F, F]`,
    `feature_target` `[F, T]`, contiguous, on x's device): sum z, sum z z^T and sum z y^T over the rows of `x`
    `(n, D)` and `target` `(n, T)`."""
    _check_columns(x, rf)
    dtype, rf, (x, target) = _placed(x, rf, x.detach(), target)
    n, F = x.shape[0], rf.num_features
    T = 0 if target is None else target.shape[1]
    for acc, shape in ((feature_sum, (F,)), (feature_gram, (F, F)), (feature_target, (F, T))):
        if acc is not None and (acc.dtype != torch.float64 or tuple(acc.shape) != shape or not acc.is_contiguous()
                                or acc.device != x.device):
            raise ValueError(f"PERK accumulators must be contiguous float64 {shape} on {x.device}")
    lib = _library(x.device)
    if lib is None:
        total, gram, cross = reference.accumulate(x, rf.frequency, rf.phase, target, chunk=FALLBACK_CHUNK)
        for acc, part in ((feature_sum, total), (feature_gram, gram), (feature_target, cross)):
            if acc is not None:
                acc += part
        return
    if n == 0:
        return

    def ptr(t):
        return None if t is None else t.data_ptr()

    args = _AccumulateArgs(_dtype_code(dtype), _threads(), None, rf.struct(), n, T, x.data_ptr(), ptr(target),
                           ptr(feature_sum), ptr(feature_gram), ptr(feature_target))
    need = lib.bs_perk_scratch_bytes(_PASS["bs_perk_accumulate"], ctypes.byref(args))
    if need < 0:
        nat.check_status(lib, 1, "bs_perk_scratch_bytes")
    scratch = torch.empty(max(int(need), 1), dtype=torch.uint8, device=x.device)  # the chunk's features
    args.scratch, args.scratch_bytes = scratch.data_ptr(), int(need)
    _run(lib, x.device, "bs_perk_accumulate", args)


class Regression(torch.autograd.Function):
    """`regression(x, rf, head, offset)` differentiable in `x`, its backward the kernels' own VJP (the features
    are never held for all voxels, in either direction). Outputs in x's dtype."""

    @staticmethod
    def forward(ctx, x, rf, head, offset):
        ctx.save_for_backward(x)
        ctx.rf, ctx.head = rf, head
        return regression(x, rf, head, offset).to(x.dtype)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        if not ctx.needs_input_grad[0]:
            return None, None, None, None
        return regression_vjp(x, ctx.rf, ctx.head, grad).to(x.dtype), None, None, None
