"""The shipped simulators and their function forms."""

from . import (
    asl,
    bssfp,
    cest,
    diffusion,
    flash,
    fmssfp,
    fse,
    gradient_echo,
    hsfp,
    looklocker,
    mp2rage,
    mpnrage,
    mprage,
    mrf,
    relaxometry,
    spgr,
    stimulated_echo,
    truefisp,
)
from .asl import ASLSimulator, asl_sim
from .bssfp import IRbSSFPSimulator, bssfp_sim, bSSFPSimulator, irbssfp_sim
from .cest import CESTSimulator, LorentzianSimulator, cest_sim, lorentzian_sim
from .diffusion import DiffusionSimulator, diffusion_sim
from .flash import FLASHSimulator, flash_sim
from .fmssfp import fmssfp_sim, fmSSFPSimulator
from .fse import FSESimulator, HyperechoSimulator, fse_sim, hyperecho_sim
from .gradient_echo import (
    IRMultiGradientEchoSimulator,
    MultiGradientEchoSimulator,
    irmultigradientecho_sim,
    multigradientecho_sim,
)
from .hsfp import HSFPSimulator, hsfp_sim
from .looklocker import LookLockerSimulator, MOLLISimulator, looklocker_sim, molli_sim
from .mp2rage import MP2RAGESimulator, mp2rage_sim
from .mpnrage import MPnRAGESimulator, mpnrage_sim
from .mprage import MPRAGESimulator, mprage_sim
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
from .stimulated_echo import StimulatedEchoSimulator, stimulatedecho_sim
from .truefisp import TrueFISPSimulator, truefisp_sim

spin_echo = relaxometry  # the documented spin_echo submodule name

#: The function forms, exported at top level too (blochsim.spgr_sim, ...).
FUNCTION_FORMS = (
    "cest_sim",
    "flash_sim",
    "fmssfp_sim",
    "fse_sim",
    "hyperecho_sim",
    "mpnrage_sim",
    "mprage_sim",
    "stimulatedecho_sim",
    "truefisp_sim",
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
    "CESTSimulator",
    "FLASHSimulator",
    "fmSSFPSimulator",
    "FSESimulator",
    "HyperechoSimulator",
    "MPnRAGESimulator",
    "MPRAGESimulator",
    "StimulatedEchoSimulator",
    "TrueFISPSimulator",
    "cest_sim",
    "flash_sim",
    "fmssfp_sim",
    "fse_sim",
    "hyperecho_sim",
    "mpnrage_sim",
    "mprage_sim",
    "stimulatedecho_sim",
    "truefisp_sim",
    "flash",
    "fmssfp",
    "fse",
    "mpnrage",
    "mprage",
    "stimulated_echo",
    "truefisp",
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
