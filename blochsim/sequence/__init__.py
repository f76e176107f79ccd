"""The sequence description layer: events, operators, RF definitions, descriptions."""

from .._execution import distribute, execution, offload
from ._pulseq import read_pulseq_description
from .builders import fse_description, mpnrage_description, mprage_description, mrf_description, spgr_description
from .description import SequenceDescription
from .events import AdcRole, EventAction, EventType, RfMode, RfUse, SequenceEvent
from .mrd import read_mrd_description
from .operators import (
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
    SPGRReadout,
    Spoil,
    SSFPEchoReadout,
    SSFPFidReadout,
    bSSFPReadout,
    compose,
    module,
    operator,
    operator_names,
    register_operator,
)
from .rf import RfDefinition, RfShape, ShimDefinition, decompress_shape, ideal_rf_definition, rf_definition
from .spinor import ExactSliceProfile, compose_spinor, exact_slice_profile
from .tissue import TissueProperties

__all__ = [
    # operators
    "Operator",
    "compose",
    "module",
    "register_operator",
    "operator",
    "operator_names",
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
    # events (6.1-6.2)
    "EventType",
    "EventAction",
    "RfUse",
    "AdcRole",
    "RfMode",
    "SequenceEvent",
    # RF and shims (6.3)
    "RfShape",
    "decompress_shape",
    "RfDefinition",
    "rf_definition",
    "ideal_rf_definition",
    "ShimDefinition",
    # pulses, slice profiles, spinors (6.5)
    "ExactSliceProfile",
    "exact_slice_profile",
    "compose_spinor",
    # descriptions (6.4)
    "SequenceDescription",
    "fse_description",
    "mrf_description",
    "mpnrage_description",
    "mprage_description",
    "spgr_description",
    "TissueProperties",
    # outside formats (6.7)
    "read_pulseq_description",
    "read_mrd_description",
    # the engine (6.4)
    "EpgEngine",
    "SimulationResult",
    "PackedDescription",
    "pack_description",
    "simulate_subspace",
    # placement (9)
    "execution",
    "offload",
    "distribute",
]

_ENGINE_NAMES = ("EpgEngine", "SimulationResult", "PackedDescription", "pack_description")


def __getattr__(name: str):
    # The engine names live in blochsim.engine, a layer above this one (it imports these modules); the
    # public API names them here too, so they load on first use.
    if name in _ENGINE_NAMES:
        from ..engine import epg_engine

        return getattr(epg_engine, name)
    if name == "simulate_subspace":  # a Subspace of a simulated dictionary (blochsim.subspace, above this layer)
        from ..subspace import simulate_subspace

        return simulate_subspace
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
