"""blochsim: a differentiable MRI signal simulator for PyTorch (extended phase graphs)."""

from . import model, sequence, simulators
from ._errors import CudaBuildMismatch
from ._version import __version__
from .model import Simulator
from .sequence import (
    Delay,
    Dephase,
    Excitation,
    FSEReadout,
    Inversion,
    Operator,
    Readout,
    Refocusing,
    SampledPulse,
    Saturation,
    SequenceDescription,
    ShimDefinition,
    SPGRReadout,
    Spoil,
    SSFPEchoReadout,
    SSFPFidReadout,
    bSSFPReadout,
    rf_definition,
)
from .simulators import mrf_sim

__all__ = [
    "__version__",
    "sequence",
    "simulators",
    "model",
    "Simulator",
    "CudaBuildMismatch",
    "Operator",
    "Excitation",
    "Refocusing",
    "Inversion",
    "Saturation",
    "SampledPulse",
    "Readout",
    "Delay",
    "Dephase",
    "Spoil",
    "bSSFPReadout",
    "SSFPFidReadout",
    "SSFPEchoReadout",
    "SPGRReadout",
    "FSEReadout",
    "SequenceDescription",
    "ShimDefinition",
    "rf_definition",
    "mrf_sim",
]
