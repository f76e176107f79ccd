"""Parameter maps: one panel per map, with its unit on the colour bar."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from ._figure import as_numpy, new_figure

__all__ = ["maps"]


def _unit(name: str) -> str:
    from ..model import UNITS

    return UNITS.get(name, "")


def _image(values: np.ndarray, name: str) -> np.ndarray:
    """A 2-D image of a map: itself, a 1-D map as one row, the middle slice of a 3-D one (first axis)."""
    if np.iscomplexobj(values):
        values = np.abs(values)
    values = np.squeeze(values)
    if values.ndim == 0:
        return values.reshape(1, 1)
    if values.ndim == 1:
        return values[None, :]
    if values.ndim == 2:
        return values
    if values.ndim == 3:
        return values[values.shape[0] // 2]
    raise ValueError(f"map {name!r} has shape {values.shape}: a map is 1-D, 2-D or 3-D (the middle slice of the "
                     f"first axis is drawn)")


def maps(values: Mapping[str, Any], *, units: Mapping[str, str] | None = None, cmap: str = "viridis",
         columns: int = 3, figure: Any = None) -> Any:
    """Draw parameter maps `{name: map}`, one panel each; returns the figure.

    A map is 1-D (drawn as a row), 2-D, or 3-D (its middle slice along the first axis); complex maps are
    drawn by magnitude. The colour bar carries the unit of a public property name (T1: ms, B1: a factor, ...)
    unless `units` gives one. Each panel's colour range is the 1st-99th percentile of its finite values, so
    a few bad voxels do not wash it out. Raises ValueError for no maps or a map of another rank.
    """
    if not values:
        raise ValueError("maps needs at least one map, got none")
    if columns < 1:
        raise ValueError(f"columns must be >= 1, got {columns}")
    images = {name: _image(as_numpy(value, name), name) for name, value in values.items()}
    count = len(images)
    cols = min(columns, count)
    rows = -(-count // cols)
    fig = new_figure(figure, "blochsim.plot.maps", size_in=(4 * cols, 3.4 * rows))
    for k, (name, image) in enumerate(images.items()):
        axis = fig.add_subplot(rows, cols, k + 1)
        finite = image[np.isfinite(image)]
        low, high = (np.percentile(finite, [1, 99]) if finite.size else (0.0, 1.0))
        shown = axis.imshow(image, cmap=cmap, vmin=low, vmax=high if high > low else None,
                            interpolation="nearest", aspect="equal" if image.shape[0] > 1 else "auto")
        unit = (units or {}).get(name, _unit(name))
        fig.colorbar(shown, ax=axis, label=f"{name} ({unit})" if unit else name)
        axis.set_title(name)
        axis.set_xticks([])
        axis.set_yticks([])
    fig.tight_layout()
    return fig
