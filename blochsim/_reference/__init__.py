"""The float64 pure-PyTorch reference EPG engine: the oracle every fast kernel is held to.

`play` returns the samples and the final states; `simulate_reference` the samples only.
The event semantics are documented in `blochsim._reference.epg`. The semisolid lineshapes are
`blochsim.physics.lineshape`, shared with the engine: the oracle and the engine import neither each
other nor anything but the description layer and `blochsim.physics`.
"""

from .epg import ReferenceResult, play, simulate_reference

__all__ = [
    "ReferenceResult",
    "play",
    "simulate_reference",
]
