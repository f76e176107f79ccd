"""Signal curves: one line per voxel against the sample index (or a given time axis)."""

from __future__ import annotations

from typing import Any

from ._figure import as_numpy, new_axis, part_of

__all__ = ["signals"]


def signals(signal: Any, *, labels: Any = None, x: Any = None, xlabel: str = "sample", part: str = "abs",
            max_curves: int = 12, axis: Any = None, title: str | None = None) -> Any:
    """Draw signals of shape `(*voxels, samples)` (or `(samples,)`), one line per voxel; returns the axis.

    `part`: what of a complex signal to draw ("abs", "real", "imag" or "phase"). `labels`: one legend entry
    per voxel, in the flattened voxel order. `x`: the sample positions (`(samples,)`, e.g. time in ms; label
    it with `xlabel`). At most `max_curves` voxels are drawn, evenly spread through the flattened voxels.
    Raises ValueError for a signal without samples, labels of another count or an x of another length.
    """
    values = as_numpy(signal, "signal")
    if values.ndim == 0 or values.shape[-1] == 0:
        raise ValueError(f"signal must have a sample axis (shape (*voxels, samples)), got shape {values.shape}")
    rows = values.reshape(-1, values.shape[-1])
    drawn, ylabel = part_of(rows, part, "signals")
    if labels is not None:
        labels = [str(label) for label in labels]
        if len(labels) != rows.shape[0]:
            raise ValueError(f"labels has {len(labels)} entries, but signal has {rows.shape[0]} voxels")
    positions = None if x is None else as_numpy(x, "x").reshape(-1)
    if positions is not None and positions.shape[0] != rows.shape[1]:
        raise ValueError(f"x has {positions.shape[0]} positions, but signal has {rows.shape[1]} samples")
    if max_curves < 1:
        raise ValueError(f"max_curves must be >= 1, got {max_curves}")
    count = min(max_curves, rows.shape[0])
    picks = sorted({round(i * (rows.shape[0] - 1) / max(count - 1, 1)) for i in range(count)})
    axis = new_axis(axis, "blochsim.plot.signals")
    for i in picks:
        label = None if labels is None else labels[i]
        if positions is None:
            axis.plot(drawn[i], label=label)
        else:
            axis.plot(positions, drawn[i], label=label)
    axis.set_xlabel(xlabel)
    axis.set_ylabel(ylabel)
    if labels is not None:
        axis.legend(fontsize="small")
    if title:
        axis.set_title(title)
    return axis
