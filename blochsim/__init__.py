"""blochsim: a differentiable MRI signal simulator for PyTorch (extended phase graphs)."""

from . import sequence
from ._version import __version__

__all__ = ["__version__", "sequence"]
