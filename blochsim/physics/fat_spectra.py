"""Published multi-peak fat spectra: chemical shifts (ppm, relative to water) and relative amplitudes.

`FAT_SPECTRA[name]` is a `FatSpectrum(ppm, amplitude, reference)`. The shifts are relative to the water
peak, taken at 4.70 ppm: negative means a lower resonance frequency than water, which is where all the
aliphatic fat peaks lie (the olefinic peak at 5.3 ppm is the one above water). A peak's frequency offset
in Hz is `ppm * 1e-6 * constants.GAMMA_BAR_HZ_PER_T * field_strength`, e.g. -3.40 ppm at 3 T is -434.3 Hz. The
amplitudes are the published relative areas; they sum to 1 within the rounding of the publication
(`multigradientecho` normalises them to sum to exactly 1, so that `fat_fraction` is the fat share of the
signal at TE = 0).

"hamilton2011"
    Hamilton G, Yokoo T, Bydder M, Cruite I, Schroeder ME, Sirlin CB, Middleton MS. In vivo
    characterization of the liver fat 1H MR spectrum. NMR Biomed 2011;24:784-790. The six-peak liver
    fat model (peaks at 0.90, 1.30, 2.10, 2.76, 4.31 and 5.30 ppm), with the values as distributed in the
    ISMRM Fat-Water Toolbox (Hu HH et al., MRM 2012;68:378-388):
    ppm rel. water  -3.80  -3.40  -2.60  -1.94  -0.39  +0.60
    amplitude       0.087  0.693  0.128  0.004  0.039  0.048

"middleton2009"
    Middleton MS, Hamilton G, Bydder M, Sirlin CB. How much fat is under the water peak in liver fat MR
    spectroscopy? Proc. ISMRM 17 (2009), p. 4331. A six-peak triglyceride spectrum (peaks at 0.90, 1.30,
    2.10, 2.75, 4.20 and 5.30 ppm). The printed abstract was not available when this table was written:
    the amplitudes are the commonly tabulated six-peak values of that group, which equal the nine-peak
    adipose spectrum of Ren J et al. (J Lipid Res 2008;49:2055-2062: 0.088, 0.642 + 0.058, 0.062 + 0.058,
    0.006, 0.039, 0.037 + 0.010) with neighbouring peaks merged. Check them against the abstract before
    relying on them for quantification:
    ppm rel. water  -3.80  -3.40  -2.60  -1.95  -0.50  +0.60
    amplitude       0.088  0.700  0.120  0.006  0.039  0.047
"""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["FAT_SPECTRA", "FatSpectrum", "WATER_PPM"]

#: The water resonance the tables are referenced to (ppm, tetramethylsilane scale).
WATER_PPM = 4.70


class FatSpectrum(NamedTuple):
    """One fat model: peak shifts in ppm relative to water, their relative amplitudes, the source."""

    ppm: tuple[float, ...]
    amplitude: tuple[float, ...]
    reference: str


FAT_SPECTRA: dict[str, FatSpectrum] = {
    "hamilton2011": FatSpectrum(
        ppm=(-3.80, -3.40, -2.60, -1.94, -0.39, 0.60),
        amplitude=(0.087, 0.693, 0.128, 0.004, 0.039, 0.048),
        reference="Hamilton G et al., NMR Biomed 2011;24:784-790 (liver fat, six peaks)",
    ),
    "middleton2009": FatSpectrum(
        ppm=(-3.80, -3.40, -2.60, -1.95, -0.50, 0.60),
        amplitude=(0.088, 0.700, 0.120, 0.006, 0.039, 0.047),
        reference="Middleton MS et al., Proc. ISMRM 2009;17:4331 (six peaks; see the module docstring)",
    ),
}
