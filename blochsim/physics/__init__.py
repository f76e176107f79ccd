"""Physics shared by the engine and the oracle, neither of which imports the other.

`lineshape`: the semisolid (MT) absorption lineshapes G(Δf) that both the engine's pool tables and the
float64 oracle (`blochsim._reference`) read. `constants`: the proton gyromagnetic ratio. `fat_spectra`:
the published multi-peak fat models. Everything here imports only numpy and torch: no engine, no
description layer, no scipy.
"""

from .constants import GAMMA_BAR_HZ_PER_T, GAMMA_RAD_PER_S_PER_T
from .fat_spectra import FAT_SPECTRA, WATER_PPM, FatSpectrum
from .lineshape import LINESHAPES, SUPER_LORENTZIAN_CUTOFF_HZ, absorption_lineshape

__all__ = ["GAMMA_BAR_HZ_PER_T", "GAMMA_RAD_PER_S_PER_T", "FAT_SPECTRA", "FatSpectrum", "WATER_PPM", "LINESHAPES",
           "SUPER_LORENTZIAN_CUTOFF_HZ", "absorption_lineshape"]
