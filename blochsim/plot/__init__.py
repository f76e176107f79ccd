"""Figures of signals, dictionaries, parameter maps, sequences and benchmark ratios (matplotlib).

matplotlib is an optional extra (`pip install "blochsim[plot]"`); importing this package works without it,
and each function raises ImportError naming the extra when it is called. Functions that draw one panel take
an `axis=` (a new figure's axis when None) and return the axis; those that draw several take a `figure=` and
return the figure. `save(figure_or_axis, path)` writes a PNG (or any format matplotlib knows by suffix).
"""

from ._figure import save
from .benchmarks import benchmark_ratios
from .dictionary import dictionary
from .maps import maps
from .sequence import sequence
from .signals import signals

__all__ = ["signals", "dictionary", "maps", "sequence", "benchmark_ratios", "save"]
