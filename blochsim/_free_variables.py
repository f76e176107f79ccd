"""Bounds by reparametrisation: an unknown's value as a smooth function of an unbounded free variable x.

Two-sided bounds `low + (high - low) sigmoid(x)`; a lower bound only `low + step softplus(x)`; an upper bound
only `high - step softplus(-x)`; none `step x`. Least squares (`estimators.nlls`) and `ModelOperator` iterate
on x; each adds its own checks and messages around this one mapping.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["FreeVariable"]


class FreeVariable:
    """The map between one unknown's free variable and its value. `low`/`high`: numbers, tensors (per-voxel
    bounds) or None; `step`: the value's change per unit of x where a side is unbounded."""

    def __init__(self, name: str, low, high, step: float):
        self.name, self.low, self.high, self.step = name, low, high, step

    @property
    def two_sided(self) -> bool:
        return self.low is not None and self.high is not None

    def value(self, x):
        if self.two_sided:
            return self.low + (self.high - self.low) * torch.sigmoid(x)
        if self.low is not None:
            return self.low + self.step * F.softplus(x)
        if self.high is not None:
            return self.high - self.step * F.softplus(-x)
        return self.step * x

    def slope(self, x):
        """d value / dx."""
        if self.two_sided:
            p = torch.sigmoid(x)
            return (self.high - self.low) * p * (1 - p)
        if self.low is not None:
            return self.step * torch.sigmoid(x)
        if self.high is not None:
            return self.step * torch.sigmoid(-x)
        return torch.full_like(x, self.step)

    def outside(self, value) -> torch.Tensor:
        """Where `value` is on or outside a bound (NaN included): no free variable gives it."""
        out = torch.zeros_like(value, dtype=torch.bool)
        if self.low is not None:
            out |= ~(value > self.low)
        if self.high is not None:
            out |= ~(value < self.high)
        return out

    def inverse(self, value):
        """The free variable of a value strictly inside the bounds (callers check `outside` first)."""
        if self.two_sided:
            return torch.logit((value - self.low) / (self.high - self.low))
        if self.low is not None:
            return _softplus_inverse((value - self.low) / self.step)
        if self.high is not None:
            return -_softplus_inverse((self.high - value) / self.step)
        return value / self.step


def _softplus_inverse(y):
    # log(exp(y) - 1), written to stay finite for large y.
    return y + torch.log(-torch.expm1(-y))
