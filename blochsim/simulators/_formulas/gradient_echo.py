"""Gradient-echo closed forms: spoiled steady state (SPGR) and water-fat multi-echo (MGRE, IR-MGRE).

Phase convention: off-resonance `B0 > 0` turns the signal by `e^{-i 2 pi B0 TE}`, as the
engine does. A chemical shift `chemshift` and the fat peaks enter with the opposite sign, `e^{+i 2 pi f
TE}` (the incumbent's closed-form convention): a fat peak of offset `f` (Hz, negative for the aliphatic
peaks, which resonate below water) behaves like `chemshift = f` in `spgr`, i.e. like `B0 = -f`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from ...physics.constants import GAMMA_BAR_HZ_PER_T
from ...physics.fat_spectra import FAT_SPECTRA, FatSpectrum
from ._common import as_tensors, check_times, ms_to_s, phase_factor, rate

__all__ = ["irmultigradientecho", "multigradientecho", "spgr"]


def spgr(flip, TR, TE, *, T1, T2star=None, M0=1.0, B0=0.0, chemshift=0.0) -> torch.Tensor:
    """Spoiled gradient-echo steady state (Ernst), complex.

    S = M0 (1 - E1) sin a / (1 - E1 cos a) e^{-TE/T2star} e^{i 2 pi (chemshift - B0) TE},
    E1 = e^{-TR/T1}, a = flip. Without `T2star` there is no decay. The value is real and positive on
    resonance. Elementwise in every argument (see the package docstring for shapes).
    """
    v = as_tensors(
        dict(flip=flip, TR=TR, TE=TE, T1=T1, T2star=T2star, M0=M0, B0=B0, chemshift=chemshift), complex_ok=("M0",)
    )
    check_times(TR=v["TR"], TE=v["TE"], T1=v["T1"], T2star=v["T2star"])
    a = torch.deg2rad(v["flip"])
    e1 = torch.exp(-v["TR"] * rate(v["T1"]))
    magnitude = (1 - e1) * torch.sin(a) / (1 - e1 * torch.cos(a))
    if v["T2star"] is not None:
        magnitude = magnitude * torch.exp(-v["TE"] * rate(v["T2star"]))
    return v["M0"] * magnitude * phase_factor((v["chemshift"] - v["B0"]) * ms_to_s(v["TE"]))


def _fat_peaks(fat_spectrum: Any) -> FatSpectrum:
    if isinstance(fat_spectrum, str):
        try:
            return FAT_SPECTRA[fat_spectrum]
        except KeyError:
            raise ValueError(
                f"fat_spectrum={fat_spectrum!r} is not a known fat model; use one of {sorted(FAT_SPECTRA)} or a "
                "(ppm, amplitude) pair of sequences"
            ) from None
    if isinstance(fat_spectrum, FatSpectrum):
        return fat_spectrum
    if isinstance(fat_spectrum, Sequence) and len(fat_spectrum) == 2:
        ppm, amplitude = (tuple(float(x) for x in part) for part in fat_spectrum)
        if len(ppm) != len(amplitude) or not ppm:
            raise ValueError(f"fat_spectrum: {len(ppm)} shifts and {len(amplitude)} amplitudes; give one per peak")
        return FatSpectrum(ppm, amplitude, "user")
    raise ValueError(f"fat_spectrum must be a name in {sorted(FAT_SPECTRA)} or a (ppm, amplitude) pair")


def _water_fat(v: dict, water: torch.Tensor, fat: torch.Tensor, fat_spectrum: Any) -> torch.Tensor:
    """M0 [water e^{-TE/T2*} + fat e^{i fat_phase} e^{-TE/fat_T2*} sum_k a_k e^{i 2 pi f_k TE}] e^{-i 2 pi B0 TE}.

    `water` and `fat` are the real amplitudes of the two species (units of M0) before decay.
    """
    te = v["TE"]
    spectrum = _fat_peaks(fat_spectrum)
    ppm = torch.tensor(spectrum.ppm, dtype=te.dtype, device=te.device)
    amplitude = torch.tensor(spectrum.amplitude, dtype=te.dtype, device=te.device)
    amplitude = amplitude / amplitude.sum()  # fat_fraction is the fat share of the signal at TE = 0
    f_hz = ppm * 1e-6 * GAMMA_BAR_HZ_PER_T * v["field_strength"].unsqueeze(-1)  # peak axis last
    peaks = (amplitude * phase_factor(f_hz * ms_to_s(te).unsqueeze(-1))).sum(-1)

    t2star = v["T2star"]
    fat_t2star = v["fat_T2star"] if v["fat_T2star"] is not None else t2star
    if t2star is not None:
        water = water * torch.exp(-te * rate(t2star))
    if fat_t2star is not None:
        fat = fat * torch.exp(-te * rate(fat_t2star))
    fat_signal = fat * phase_factor(v["fat_phase"] / 360.0) * peaks
    return v["M0"] * (water + fat_signal) * phase_factor(-v["B0"] * ms_to_s(te))


def multigradientecho(
    TE,
    *,
    T2star=None,
    fat_T2star=None,
    M0=1.0,
    B0=0.0,
    fat_fraction=0.0,
    fat_phase=0.0,
    field_strength=3.0,
    fat_spectrum="hamilton2011",
) -> torch.Tensor:
    """Multi-echo gradient echo with water and multi-peak fat, complex.

    S(TE) = M0 [(1 - ff) e^{-TE/T2star}
                + ff e^{i fat_phase} e^{-TE/fat_T2star} sum_k a_k e^{i 2 pi f_k TE}] e^{-i 2 pi B0 TE},

    ff = fat_fraction, f_k = ppm_k * 1e-6 * 42.577478 MHz/T * field_strength (Hz, negative below water),
    a_k the peak amplitudes of `fat_spectrum` normalised to sum to 1 (`FAT_SPECTRA` name, or a
    `(ppm, amplitude)` pair). Without `T2star` the water does not decay; `fat_T2star` defaults to
    `T2star` (one R2* for both species, the usual fat-water model). `M0` may be complex (a receive
    phase). Elementwise in TE; the peaks are summed on an internal axis.
    """
    v = as_tensors(
        dict(
            TE=TE,
            T2star=T2star,
            fat_T2star=fat_T2star,
            M0=M0,
            B0=B0,
            fat_fraction=fat_fraction,
            fat_phase=fat_phase,
            field_strength=field_strength,
        ),
        complex_ok=("M0",),
    )
    check_times(TE=v["TE"], T2star=v["T2star"], fat_T2star=v["fat_T2star"])
    ff = v["fat_fraction"]
    return _water_fat(v, 1 - ff, ff, fat_spectrum)


def irmultigradientecho(
    TI,
    TE,
    *,
    T1,
    fat_T1=None,
    T2star=None,
    fat_T2star=None,
    M0=1.0,
    B0=0.0,
    fat_fraction=0.0,
    fat_phase=0.0,
    inv_efficiency=1.0,
    fat_inv_efficiency=None,
    field_strength=3.0,
    fat_spectrum="hamilton2011",
) -> torch.Tensor:
    """Inversion-recovery multi-echo gradient echo with water and multi-peak fat, complex.

    Each species first recovers from an inversion with full recovery before it, then decays as in
    `multigradientecho`: the water amplitude is (1 - ff)(1 - (1 + eff) e^{-TI/T1}) and the fat amplitude
    ff (1 - (1 + fat_eff) e^{-TI/fat_T1}). `fat_T1` defaults to `T1`, `fat_inv_efficiency` to
    `inv_efficiency`, `fat_T2star` to `T2star`. `TI` and `TE` are elementwise (a flattened (TI, TE) grid
    is given as two arrays of equal length).
    """
    v = as_tensors(
        dict(
            TI=TI,
            TE=TE,
            T1=T1,
            fat_T1=fat_T1,
            T2star=T2star,
            fat_T2star=fat_T2star,
            M0=M0,
            B0=B0,
            fat_fraction=fat_fraction,
            fat_phase=fat_phase,
            inv_efficiency=inv_efficiency,
            fat_inv_efficiency=fat_inv_efficiency,
            field_strength=field_strength,
        ),
        complex_ok=("M0",),
    )
    check_times(TI=v["TI"], TE=v["TE"], T1=v["T1"], fat_T1=v["fat_T1"], T2star=v["T2star"], fat_T2star=v["fat_T2star"])
    ti, ff = v["TI"], v["fat_fraction"]
    fat_t1 = v["fat_T1"] if v["fat_T1"] is not None else v["T1"]
    eff = v["inv_efficiency"]
    fat_eff = v["fat_inv_efficiency"] if v["fat_inv_efficiency"] is not None else eff
    water = (1 - ff) * (1 - (1 + eff) * torch.exp(-ti * rate(v["T1"])))
    fat = ff * (1 - (1 + fat_eff) * torch.exp(-ti * rate(fat_t1)))
    return _water_fat(v, water, fat, fat_spectrum)
