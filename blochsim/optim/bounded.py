"""`Bounded`: a protocol value held between limits by optimising an unconstrained variable."""

from __future__ import annotations

import warnings

import torch

from .._arrays import to_tensor

__all__ = ["Bounded"]

#: An initial value on (or beyond) a limit starts this fraction of the width inside it: the sigmoid never
#: reaches its limits, and at this depth its slope is still ~1e-3 of the width per unit of the free variable,
#: so an optimiser moves the value off the limit within a few dozen steps.
INSIDE_FRACTION = 1e-3


def _first_index(mask: torch.Tensor) -> tuple:
    flat = int(torch.nonzero(mask.reshape(-1))[0, 0])
    return tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), mask.shape)) if mask.dim() else ()


class Bounded:
    """A value kept between `lower` and `upper` by reparametrisation: `x = lower + (upper - lower) sigmoid(u)`.

    The optimiser moves the unconstrained `u`; every `x` it can reach lies strictly inside the limits.

    Args:
        initial: the starting value (number or array; a float tensor keeps its dtype and device, anything else
            becomes float32).
        lower, upper: limits in the value's units, numbers or arrays broadcasting to `initial`'s shape, with
            `lower < upper` everywhere.

    An initial value on a limit or outside it starts just inside (a thousandth of the width), since the
    sigmoid never reaches its limits; values outside the limits are reported with a warning.

    Raises:
        ValueError: limits that do not broadcast to `initial`, or `lower >= upper` somewhere (the first such
            index is named), or a value that is not finite.
    """

    def __init__(self, initial, lower, upper):
        x = to_tensor(initial, name="initial")
        if not x.is_floating_point():
            raise ValueError(f"initial must be real, got dtype {x.dtype}")
        x = x.detach()
        lo = torch.as_tensor(to_tensor(lower, name="lower"), dtype=x.dtype, device=x.device)
        hi = torch.as_tensor(to_tensor(upper, name="upper"), dtype=x.dtype, device=x.device)
        for name, limit in (("lower", lo), ("upper", hi)):
            try:
                torch.broadcast_shapes(limit.shape, x.shape)
            except RuntimeError:
                raise ValueError(f"{name} of shape {tuple(limit.shape)} does not broadcast to initial of shape "
                                 f"{tuple(x.shape)}; give a number or an array of that shape") from None
            if torch.broadcast_shapes(limit.shape, x.shape) != x.shape:
                raise ValueError(f"{name} of shape {tuple(limit.shape)} would enlarge initial of shape "
                                 f"{tuple(x.shape)}; give a number or an array that broadcasts to it")
        lo, hi = lo.expand_as(x).clone(), hi.expand_as(x).clone()
        for name, value in (("initial", x), ("lower", lo), ("upper", hi)):
            bad = ~torch.isfinite(value)
            if bool(bad.any()):
                at = _first_index(bad)
                raise ValueError(f"{name} must be finite, got {float(value[at])} at index {at}")
        crossed = lo >= hi
        if bool(crossed.any()):
            at = _first_index(crossed)
            raise ValueError(f"lower must be below upper everywhere; at index {at} lower = {float(lo[at])}, "
                             f"upper = {float(hi[at])}")
        outside = (x < lo) | (x > hi)
        if bool(outside.any()):
            at = _first_index(outside)
            warnings.warn(f"Bounded: {int(outside.sum())} initial value(s) lie outside [lower, upper] (first at "
                          f"index {at}: {float(x[at])} outside [{float(lo[at])}, {float(hi[at])}]); they start "
                          "just inside the nearest limit", stacklevel=2)
        margin = INSIDE_FRACTION * (hi - lo)
        self.initial = torch.minimum(torch.maximum(x, lo + margin), hi - margin)
        self.lower, self.upper = lo, hi

    @property
    def shape(self) -> torch.Size:
        return self.initial.shape

    def free(self) -> torch.Tensor:
        """The unconstrained variable of `initial`: logit((initial - lower) / (upper - lower))."""
        return torch.logit((self.initial - self.lower) / (self.upper - self.lower))

    def value(self, free: torch.Tensor) -> torch.Tensor:
        """The bounded value of a free variable (differentiable)."""
        return self.lower + (self.upper - self.lower) * torch.sigmoid(free)

    def __repr__(self) -> str:
        return f"Bounded(shape={tuple(self.shape)}, dtype={self.initial.dtype}, device={self.initial.device})"
