"""matplotlib on demand: the import with the extra's name in its error, new axes and figures, saving."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["pyplot", "new_axis", "new_figure", "save", "as_numpy"]


def pyplot(what: str) -> Any:
    """matplotlib.pyplot, or ImportError saying that `what` needs the `plot` extra."""
    try:
        import matplotlib.pyplot as plt
    except ImportError:
        raise ImportError(f"{what} needs matplotlib: pip install matplotlib (or \"blochsim[plot]\")") from None
    return plt


def new_axis(axis: Any, what: str) -> Any:
    """`axis`, or the axis of a new figure when it is None."""
    plt = pyplot(what)
    return plt.figure().add_subplot() if axis is None else axis


def new_figure(figure: Any, what: str, *, size_in: tuple | None = None) -> Any:
    """`figure` cleared, or a new one (`size_in`: width, height in inches) when it is None."""
    plt = pyplot(what)
    if figure is None:
        return plt.figure(figsize=size_in)
    figure.clear()
    return figure


def save(figure: Any, path: str | Path, *, dpi: int = 120) -> Path:
    """Write `figure` (a Figure, or an axis of one) to `path` (format from its suffix) and close it; returns
    the path. Raises ValueError for a path without a suffix matplotlib can write."""
    pyplot("blochsim.plot.save")
    fig = figure.get_figure() if hasattr(figure, "get_figure") and not hasattr(figure, "savefig") else figure
    path = Path(path)
    formats = fig.canvas.get_supported_filetypes()
    suffix = path.suffix.lstrip(".").lower()
    if suffix not in formats:
        raise ValueError(f"cannot write a figure to {str(path)!r}: its suffix must be one of "
                         f"{', '.join('.' + s for s in sorted(formats))}")
    fig.savefig(path, dpi=dpi, bbox_inches="tight")
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path


def as_numpy(values: Any, name: str) -> np.ndarray:
    """A NumPy array of `values` (a torch tensor on any device, an array, a list or a number)."""
    if hasattr(values, "detach"):
        values = values.detach().cpu().numpy()
    try:
        return np.asarray(values)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{name} must be an array or a tensor, got {type(values).__name__}: {exc}") from None


def part_of(values: np.ndarray, part: str, name: str) -> tuple[np.ndarray, str]:
    """(the `part` of complex or real `values`, its axis label): "abs", "real", "imag" or "phase" (rad)."""
    parts = {"abs": (np.abs, "|signal|"), "real": (np.real, "Re signal"), "imag": (np.imag, "Im signal"),
             "phase": (np.angle, "phase (rad)")}
    if part not in parts:
        raise ValueError(f"{name}: part must be one of {', '.join(map(repr, parts))}, got {part!r}")
    fn, label = parts[part]
    return fn(values), label
