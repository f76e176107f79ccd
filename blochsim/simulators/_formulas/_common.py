"""Shared plumbing of the closed forms: dtype promotion, validation, safe special functions.

Nothing here is physics. Every helper is a torch expression (or a check on detached values), so
autograd sees straight through it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch

__all__ = [
    "MIN_TIME_MS",
    "as_tensors",
    "check_nonnegative",
    "check_ordered",
    "check_times",
    "clamp_time",
    "complex_dtype",
    "expm1_over_x",
    "ms_to_s",
    "phase_factor",
    "rate",
]

#: Relaxation times are clamped to >= this (ms), as in the engine: T = 0 gives a finite value.
MIN_TIME_MS = 1e-6

_TWO_PI = 2.0 * math.pi


def _real_dtype_of(dtype: torch.dtype) -> torch.dtype:
    return {torch.complex64: torch.float32, torch.complex128: torch.float64, torch.complex32: torch.float16}.get(
        dtype, dtype
    )


def complex_dtype(real: torch.dtype) -> torch.dtype:
    """complex64 for float32, complex128 for float64."""
    return torch.complex128 if real == torch.float64 else torch.complex64


def as_tensors(values: Mapping[str, Any], *, complex_ok: tuple[str, ...] = ()) -> dict[str, torch.Tensor | None]:
    """Convert named inputs to tensors of one real dtype (complex where allowed) on one device.

    The dtype is the promotion of the floating tensors and arrays given (float32 at least, float64 when any
    is float64 or complex128). Python numbers and lists are weak, as in torch: they take that dtype
    without lowering it, and alone give torch's default dtype (float32). The device is that of the first
    tensor given. `None` stays `None`. A complex value is a TypeError unless its name is in `complex_ok`
    (it then becomes complex64/128).
    """
    strong: dict[str, torch.Tensor] = {}
    device = None
    real = None
    for name, value in values.items():
        if value is None or not hasattr(value, "dtype"):
            continue  # Python numbers and sequences are weak
        t = value if isinstance(value, torch.Tensor) else torch.as_tensor(value)
        if isinstance(value, torch.Tensor) and device is None:
            device = value.device
        if t.is_floating_point() or t.is_complex():
            r = _real_dtype_of(t.dtype)
            real = r if real is None else torch.promote_types(real, r)
        strong[name] = t
    if real is None:
        real = torch.get_default_dtype()
    elif real in (torch.float16, torch.bfloat16):
        real = torch.float32
    cplx = complex_dtype(real)
    converted: dict[str, torch.Tensor | None] = {}
    for name, value in values.items():
        if value is None:
            converted[name] = None
            continue
        t = strong.get(name)
        if t is None:
            is_complex = any(isinstance(x, complex) for x in _flat(value))
            t = torch.as_tensor(value, dtype=cplx if is_complex else real, device=device)
        if t.is_complex() and name not in complex_ok:
            raise TypeError(
                f"{name} must be real, got a complex value; only {', '.join(complex_ok) or 'no argument'} may be "
                "complex here"
            )
        converted[name] = t.to(device=device, dtype=cplx if t.is_complex() else real)
    return converted


def _flat(value: Any):
    if isinstance(value, (list, tuple)):
        for item in value:
            yield from _flat(item)
    else:
        yield value


def check_nonnegative(what: str = "a time >= 0 ms", **values: torch.Tensor | None) -> None:
    """ValueError for a negative or NaN entry; 0 and inf are allowed. The message names the argument,
    the number of bad entries, the first index and its value. One host sync per argument."""
    for name, t in values.items():
        if t is None:
            continue
        d = t.detach()
        bad = torch.isnan(d) | (d < 0)
        if bool(bad.any()):
            count = int(bad.sum())
            index = tuple(int(i) for i in bad.nonzero()[0]) if d.dim() else ()
            value = d.reshape(-1)[bad.reshape(-1)][0].item()
            raise ValueError(
                f"{name} must be {what} and not NaN (0 and inf are allowed); {count} of {d.numel()} "
                f"value(s) are bad, the first at index {index}: {value}"
            )


def check_times(**times: torch.Tensor | None) -> None:
    """`check_nonnegative` for times in ms (relaxation times, TR, TE, TI, ...)."""
    check_nonnegative("a time >= 0 ms", **times)


def check_ordered(name: str, gap: torch.Tensor, requirement: str) -> None:
    """ValueError when a derived interval `gap` (ms) is negative somewhere: `requirement` says what must hold."""
    d = gap.detach()
    bad = torch.isnan(d) | (d < 0)
    if bool(bad.any()):
        index = tuple(int(i) for i in bad.nonzero()[0]) if d.dim() else ()
        value = d.reshape(-1)[bad.reshape(-1)][0].item()
        raise ValueError(f"{name}: {requirement}; it fails by {-value:.6g} ms at index {index}")


def clamp_time(t: torch.Tensor) -> torch.Tensor:
    """A relaxation time clamped to >= MIN_TIME_MS (the engine's rule), so T = 0 gives no NaN."""
    return t.clamp_min(MIN_TIME_MS)


def rate(t_ms: torch.Tensor) -> torch.Tensor:
    """1/T in 1/ms of a clamped relaxation time; inf gives 0 (no relaxation)."""
    return 1.0 / clamp_time(t_ms)


def ms_to_s(t_ms: torch.Tensor) -> torch.Tensor:
    return t_ms * 1e-3


def expm1_over_x(x: torch.Tensor) -> torch.Tensor:
    """(e^x - 1)/x, equal to 1 at x = 0, with finite values and gradients everywhere.

    Below |x| = 1e-4 the Taylor sum 1 + x/2 + x^2/6 is used; its truncation error x^3/24 < 5e-14.
    """
    small = x.abs() < 1e-4
    safe = torch.where(small, torch.ones_like(x), x)
    return torch.where(small, 1.0 + x / 2.0 + x * x / 6.0, torch.expm1(safe) / safe)


def phase_factor(cycles: torch.Tensor) -> torch.Tensor:
    """e^{i 2 pi cycles} as a complex tensor of the matching precision."""
    return torch.polar(torch.ones_like(cycles), _TWO_PI * cycles)
