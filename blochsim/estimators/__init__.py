"""Estimators: tissue maps from measured signals.

`DictionaryMatcher` (matching against simulated atoms), `LookupTable` (one unknown read from a 1-D curve),
`PERK` (kernel ridge regression on random Fourier features; Nataraj 2018) and `NonlinearLeastSquares`
(voxel-parallel Levenberg-Marquardt with the simulator's forward-mode Jacobian), all built on `Estimator`.
"""

import importlib.util

from .base import Estimator, MatchResult
from .dictionary import DictionaryMatcher
from .lookup import LookupTable
from .nlls import NonlinearLeastSquares

__all__ = ["Estimator", "MatchResult", "DictionaryMatcher", "LookupTable", "NonlinearLeastSquares"]

# PERK lives in its own module, written separately; the package imports without it.
if importlib.util.find_spec(f"{__name__}.perk") is not None:
    from . import _perk_ops  # noqa: F401  (registers PERK's kernel passes as blochsim:: custom ops)
    from .perk import PERK  # noqa: F401

    __all__.append("PERK")
