"""Building blocks of model-based reconstruction: `ModelOperator` (tissue maps to predicted images, with its
Jacobian products) and `Subspace` (a low-rank temporal basis). Solvers are not part of blochsim."""

from ..subspace import Subspace, simulate_subspace
from .model_operator import ModelOperator

__all__ = ["ModelOperator", "Subspace", "simulate_subspace"]
