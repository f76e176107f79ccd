"""The engine: compile descriptions to kernel programs, pack tissue, and run the kernels under autograd."""

from .epg_engine import EpgEngine, PackedDescription, SimulationResult, pack_description
from .program import Program, TrainAxisError, compile_program, default_states, shifts_per_repetition, split_trains
from .simulate import jacobian, simulate

__all__ = ["EpgEngine", "PackedDescription", "Program", "SimulationResult", "TrainAxisError", "compile_program",
           "default_states", "jacobian", "pack_description", "shifts_per_repetition", "simulate", "split_trains"]
