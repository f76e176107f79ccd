"""Progress bars for long work: tqdm when it is installed and wanted, otherwise a bar that draws nothing.

One helper for every layer that loops over work a user waits for (the command line's dictionaries and
benchmarks, estimators over large volumes, ...)::

    with progress_bar(total=n_voxels, unit="voxel", desc="dictionary", enabled=None) as bar:
        for chunk in chunks:
            ...
            bar.update(len(chunk))

`enabled`: True always draws (when tqdm is installed), False never, None (the default) draws only when
stderr is a terminal, and then only once the work has run for `AFTER_S` seconds, so short work and logs
stay quiet. tqdm is optional (`pip install "blochsim[progress]"`): without it no bar is drawn, whatever
`enabled` says.
"""

from __future__ import annotations

import sys
from typing import Any

__all__ = ["AFTER_S", "NoBar", "progress_bar", "stderr_is_terminal"]

#: With `enabled=None`, a bar appears only after the work has run this long (s).
AFTER_S = 2.0


class NoBar:
    """A bar that draws nothing: the same calls as a tqdm bar's that the package uses."""

    n = 0

    def update(self, count: int = 1) -> None:
        self.n += count

    def set_postfix_str(self, text: str = "", refresh: bool = True) -> None:
        pass

    def close(self) -> None:
        pass

    def __enter__(self) -> NoBar:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def stderr_is_terminal() -> bool:
    """Whether stderr is an interactive terminal (bars are drawn there)."""
    stream = sys.stderr
    try:
        return stream is not None and stream.isatty()
    except (AttributeError, ValueError):  # replaced by an object without isatty, or closed
        return False


def progress_bar(total: int | None, *, desc: str = "", unit: str = "it", enabled: bool | None = None,
                 initial: int = 0, **options: Any) -> Any:
    """A tqdm bar over `total` units (starting at `initial`), or a `NoBar` when none should be drawn.

    `enabled`: True always (with tqdm installed), False never, None when stderr is a terminal and after
    `AFTER_S` seconds of work. `options` go to tqdm as they are (e.g. `unit_scale=True`). Raises ValueError
    for an `enabled` that is not True, False or None.
    """
    if enabled not in (True, False, None):
        raise ValueError(f"enabled must be True, False or None (when stderr is a terminal), got {enabled!r}")
    if enabled is False or (enabled is None and not stderr_is_terminal()):
        bar = NoBar()
        bar.n = initial
        return bar
    try:
        from tqdm.auto import tqdm
    except ImportError:  # optional: pip install "blochsim[progress]"
        bar = NoBar()
        bar.n = initial
        return bar
    settings = {"file": sys.stderr, "leave": False, "delay": AFTER_S if enabled is None else 0.0}
    settings.update(options)
    return tqdm(total=total, desc=desc, unit=unit, initial=initial, **settings)
