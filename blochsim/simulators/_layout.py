"""Helpers the event-train layouts share: unit conversion, per-shot values, counts and timing checks.

Protocol values reach `layout()` in public units (ms, degrees) as Python numbers or float64 tensors
; these helpers convert them without breaking autograd and split per-shot arrays into one
value per shot. Nothing here is physics.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from ..sequence.events import as_float

__all__ = ["DEG", "TRAIN_VALUES", "rad", "seconds", "count", "per_shot", "number", "check_order", "ms_default"]

DEG = math.pi / 180.0


def rad(value: Any) -> Any:
    """Degrees to rad: a number stays a number, a tensor stays a (differentiable) tensor."""
    return value * DEG


def seconds(value: Any) -> Any:
    """ms to s, as `rad` does."""
    return value * 1e-3


def number(name: str, value: Any) -> float:
    """A structural protocol value (a number, or a one-element array) as a Python float."""
    try:
        if isinstance(value, torch.Tensor):
            if value.numel() != 1:
                raise ValueError
            return float(value.detach())
        return float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a single number, got {value!r}") from None


def count(name: str, value: Any, *, minimum: int = 1) -> int:
    """A structural integer count, at least `minimum` (ValueError otherwise)."""
    try:
        ok = not isinstance(value, bool) and int(value) == value and int(value) >= minimum
    except (TypeError, ValueError):
        ok = False
    if not ok:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


#: Per-shot protocol values that may carry a leading train axis: they become RF event values, which
#: take one entry per train. Durations set the timeline that the trains share.
TRAIN_VALUES = ("flip", "phases")


def per_shot(name: str, value: Any, shots: int, *, unit: str = "") -> list:
    """`value` as one entry per shot: a scalar repeats, a 1-D array of `shots` entries gives its entries.

    A value named in `TRAIN_VALUES` may also be `(trains, shots)` or `(trains, 1)`: each shot's entry is
    then a `(trains,)` tensor, its column (the one column repeats), and the engine runs one program per
    train. Anything else is a ValueError naming `name`, its shape and the accepted forms.
    """
    if isinstance(value, torch.Tensor) and value.dim() > 0:
        if value.dim() == 1 and value.numel() == shots:
            return list(value.unbind())
        if value.numel() == 1:
            return [value.reshape(())] * shots
        if name in TRAIN_VALUES and value.dim() == 2 and value.shape[1] in (1, shots):
            return list(value.unbind(1)) if value.shape[1] == shots else [value[:, 0]] * shots
        accepted = (f"a scalar{unit}, one value per shot ({shots}), or one row per train (trains, {shots}) or "
                    "(trains, 1)") if name in TRAIN_VALUES else f"a scalar{unit} or one value per shot ({shots})"
        raise ValueError(f"{name} must be {accepted}; got shape {tuple(value.shape)}")
    return [value] * shots


def check_order(name: str, earlier: Any, later: Any, message: str) -> None:
    """ValueError `message` (which names `name`) when `later` comes before `earlier` (s, numbers or tensors).

    A slack of 1e-12 s absorbs the rounding of ms-to-s conversions of equal times.
    """
    if as_float(later) < as_float(earlier) - 1e-12:
        raise ValueError(message)


def ms_default(value: Any, default: Any) -> Any:
    """`value`, or `default` when `value` is None (protocol arguments whose default derives from another)."""
    return default if value is None else value
