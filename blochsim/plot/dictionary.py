"""A dictionary at a glance: its atoms as an image, and the tissue parameters it covers."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ._figure import as_numpy, new_figure, part_of

__all__ = ["dictionary"]


def _label(name: str) -> str:
    from ..model import UNITS

    unit = UNITS.get(name)
    return f"{name} ({unit})" if unit else name


def _log_axis(axis: Any, set_scale: Any) -> None:
    """A log axis (for values spanning a decade or more) labelled at 1, 2 and 5 of each decade in plain
    numbers; the minor ticks stay unlabelled (their labels collide)."""
    from matplotlib.ticker import LogLocator, NullFormatter, ScalarFormatter

    set_scale("log")
    axis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
    axis.set_major_formatter(ScalarFormatter())
    axis.set_minor_formatter(NullFormatter())


def dictionary(signals: Any, parameters: Any = None, names: Sequence[str] | None = None, *, part: str = "abs",
               normalize: bool = True, max_atoms: int = 2000, title: str | None = None, figure: Any = None) -> Any:
    """Draw a dictionary of `signals` `(atoms, samples)`; returns the figure.

    Left: the atoms as an image (one row per atom, `part` of complex values: "abs", "real", "imag" or
    "phase"), each scaled to its largest magnitude when `normalize`; rows are sorted by the first
    parameter when `parameters` is given. Right (with `parameters` of shape `(atoms, P)` named by `names`):
    the first two parameters of every atom, on log axes where they are all positive, i.e. the grid or
    random set the dictionary covers. At most `max_atoms` atoms are drawn, evenly spread. `title` replaces
    the left panel's ("N atoms x S samples"). Raises ValueError for shapes that do not agree.
    """
    atoms = as_numpy(signals, "signals")
    if atoms.ndim != 2 or atoms.shape[0] == 0 or atoms.shape[1] == 0:
        raise ValueError(f"signals must have shape (atoms, samples) with both > 0, got {atoms.shape}")
    params = None
    if parameters is not None:
        params = as_numpy(parameters, "parameters")
        params = params[:, None] if params.ndim == 1 else params
        if params.ndim != 2 or params.shape[0] != atoms.shape[0] or params.shape[1] == 0:
            raise ValueError(f"parameters must have one row per atom, shape ({atoms.shape[0]}, P), got shape "
                             f"{params.shape}")
        names = list(names) if names is not None else [f"parameter {j}" for j in range(params.shape[1])]
        if len(names) != params.shape[1]:
            raise ValueError(f"names has {len(names)} entries, but parameters has {params.shape[1]} columns")
    if max_atoms < 1:
        raise ValueError(f"max_atoms must be >= 1, got {max_atoms}")
    keep = np.unique(np.linspace(0, atoms.shape[0] - 1, min(max_atoms, atoms.shape[0])).round().astype(int))
    order = keep if params is None else keep[np.argsort(params[keep, 0], kind="stable")]
    image, label = part_of(atoms[order], part, "dictionary")
    if normalize:
        scale = np.abs(atoms[order]).max(axis=1, keepdims=True)
        image = image / np.where(scale > 0, scale, 1.0)
    fig = new_figure(figure, "blochsim.plot.dictionary", size_in=(10, 4) if params is not None else (6, 4))
    left = fig.add_subplot(1, 2 if params is not None else 1, 1)
    shown = left.imshow(image, aspect="auto", interpolation="nearest", cmap="magma")
    fig.colorbar(shown, ax=left, label=label + (" / max" if normalize else ""))
    left.set_xlabel("sample")
    left.set_ylabel("atom" + (f" (sorted by {names[0]})" if params is not None else ""))
    left.set_title(title or f"{atoms.shape[0]} atoms x {atoms.shape[1]} samples")
    if params is not None:
        right = fig.add_subplot(1, 2, 2)
        x = params[keep, 0]
        y = params[keep, 1] if params.shape[1] > 1 else np.zeros_like(x)
        right.scatter(x, y, s=4)
        right.set_xlabel(_label(names[0]))
        right.set_ylabel(_label(names[1]) if params.shape[1] > 1 else "")
        if np.all(x > 0) and x.max() >= 10 * x.min():
            _log_axis(right.xaxis, right.set_xscale)
        if params.shape[1] > 1 and np.all(y > 0) and y.max() >= 10 * y.min():
            _log_axis(right.yaxis, right.set_yscale)
        right.set_title("tissues covered")
    fig.tight_layout()
    return fig
