"""The shipped simulators (API.md section 5) and their function forms."""

from . import asl, bssfp, cest, diffusion, gradient_echo, hsfp, looklocker, mp2rage, mrf, relaxometry, spgr
from .asl import ASLSimulator, asl_sim
from .bssfp import IRbSSFPSimulator, bssfp_sim, bSSFPSimulator, irbssfp_sim
from .cest import LorentzianSimulator, lorentzian_sim
from .diffusion import DiffusionSimulator, diffusion_sim
from .gradient_echo import (
    IRMultiGradientEchoSimulator,
    MultiGradientEchoSimulator,
    irmultigradientecho_sim,
    multigradientecho_sim,
)
from .hsfp import HSFPSimulator, hsfp_sim
from .looklocker import LookLockerSimulator, MOLLISimulator, looklocker_sim, molli_sim
from .mp2rage import MP2RAGESimulator, mp2rage_sim
from .mrf import MRFSimulator, mrf_sim
from .relaxometry import (
    DoubleAngleSimulator,
    InversionRecoverySimulator,
    MultiEchoSimulator,
    SpinEchoSimulator,
    doubleangle_sim,
    inversionrecovery_sim,
    multiecho_sim,
    spinecho_sim,
)
from .spgr import SPGRSimulator, spgr_sim

spin_echo = relaxometry  # API.md 1.1 names a spin_echo submodule

#: The function forms, exported at top level too (blochsim.spgr_sim, ...).
FUNCTION_FORMS = (
    "asl_sim",
    "bssfp_sim",
    "irbssfp_sim",
    "lorentzian_sim",
    "diffusion_sim",
    "multigradientecho_sim",
    "irmultigradientecho_sim",
    "hsfp_sim",
    "looklocker_sim",
    "molli_sim",
    "mp2rage_sim",
    "mrf_sim",
    "doubleangle_sim",
    "inversionrecovery_sim",
    "multiecho_sim",
    "spinecho_sim",
    "spgr_sim",
)

__all__ = [
    "ASLSimulator",
    "bSSFPSimulator",
    "IRbSSFPSimulator",
    "LorentzianSimulator",
    "DiffusionSimulator",
    "MultiGradientEchoSimulator",
    "IRMultiGradientEchoSimulator",
    "HSFPSimulator",
    "LookLockerSimulator",
    "MOLLISimulator",
    "MP2RAGESimulator",
    "MRFSimulator",
    "DoubleAngleSimulator",
    "InversionRecoverySimulator",
    "MultiEchoSimulator",
    "SpinEchoSimulator",
    "SPGRSimulator",
    "asl_sim",
    "bssfp_sim",
    "irbssfp_sim",
    "lorentzian_sim",
    "diffusion_sim",
    "multigradientecho_sim",
    "irmultigradientecho_sim",
    "hsfp_sim",
    "looklocker_sim",
    "molli_sim",
    "mp2rage_sim",
    "mrf_sim",
    "doubleangle_sim",
    "inversionrecovery_sim",
    "multiecho_sim",
    "spinecho_sim",
    "spgr_sim",
    "asl",
    "bssfp",
    "cest",
    "diffusion",
    "gradient_echo",
    "hsfp",
    "looklocker",
    "mp2rage",
    "mrf",
    "relaxometry",
    "spgr",
    "spin_echo",
]
