"""The float64 pure-PyTorch reference EPG engine: the oracle every fast kernel is held to.

`play` returns the samples and the final states; `simulate_reference` the samples only.
The event semantics are documented in `blochsim._reference.epg`, the semisolid lineshapes
in `blochsim._reference.lineshape`.
"""

from .epg import ReferenceResult, play, simulate_reference
from .lineshape import LINESHAPES, absorption_lineshape, gaussian, lorentzian, super_lorentzian

__all__ = [
    "LINESHAPES",
    "ReferenceResult",
    "absorption_lineshape",
    "gaussian",
    "lorentzian",
    "play",
    "simulate_reference",
    "super_lorentzian",
]
