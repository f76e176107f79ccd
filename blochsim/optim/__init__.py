"""Sequence design: bounded protocol parameters, the Cramer-Rao bound, and a minimiser of costs over tissues.

`crlb` turns a forward-mode Jacobian into the variance bound of each property; a cost of it (or of any
signal and Jacobian) is minimised over the protocol by `SequenceDesign`, whose gradients run through the
engine's second-order kernels (a Jacobian inside a cost, then `backward()`). `hvp` gives Hessian-vector
products of a cost of the signal.
"""

from ..hvp import hvp
from .bounded import Bounded
from .crlb import crlb, fisher_information
from .design import SequenceDesign, SequenceOptimization

__all__ = ["Bounded", "SequenceDesign", "SequenceOptimization", "crlb", "fisher_information", "hvp"]
