"""The incumbent's home of the model names (kept for compatibility): the same objects as `blochsim.model`."""

from .model import BALANCED, REFOCUSED, SPOILED, UNBALANCED, EventOperators, Simulator, SpinPhysics

__all__ = ["Simulator", "SpinPhysics", "EventOperators", "BALANCED", "UNBALANCED", "SPOILED", "REFOCUSED"]
