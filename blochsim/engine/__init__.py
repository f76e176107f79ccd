"""The engine: compile descriptions to kernel programs, pack tissue, and run the kernels under autograd."""

from .program import Program, TrainAxisError, compile_program, default_states, shifts_per_repetition, split_trains
from .simulate import jacobian, simulate

__all__ = ["Program", "TrainAxisError", "compile_program", "default_states", "jacobian", "shifts_per_repetition",
           "simulate", "split_trains"]
