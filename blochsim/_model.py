"""The incumbent's home of the model names (API.md 1.1 [compat]): the same objects as `blochsim.model`."""

from .model import BALANCED, REFOCUSED, SPOILED, UNBALANCED, EventOperators, Simulator, SpinPhysics

__all__ = ["Simulator", "SpinPhysics", "EventOperators", "BALANCED", "UNBALANCED", "SPOILED", "REFOCUSED"]
