"""The shipped simulators (API.md section 5) and their function forms."""

from . import mrf
from .mrf import MRFSimulator, mrf_sim

__all__ = ["MRFSimulator", "mrf", "mrf_sim"]
