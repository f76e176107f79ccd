"""blochsim: a differentiable MRI signal simulator for PyTorch (extended phase graphs)."""

from ._version import __version__
from . import sequence

__all__ = ["__version__", "sequence"]
