"""Water-fat multi-echo gradient echo: `MultiGradientEchoSimulator`, `IRMultiGradientEchoSimulator`.

`FAT_SPECTRA` (public) holds the published multi-peak fat models by name; see `blochsim.physics.fat_spectra`.
"""

from __future__ import annotations

from ..model import SpinPhysics
from ..physics.fat_spectra import FAT_SPECTRA
from ._closed_form import ClosedForm
from ._formulas import irmultigradientecho, multigradientecho
from ._function_form import function_form

__all__ = ["FAT_SPECTRA", "MultiGradientEchoSimulator", "IRMultiGradientEchoSimulator", "multigradientecho_sim",
           "irmultigradientecho_sim"]


class MultiGradientEchoSimulator(ClosedForm):
    """Multi-echo gradient echo with water and multi-peak fat. Closed form, complex.

        S(TE) = M0 [(1 - ff) e^{-TE/T2star}
                    + ff e^{i fat_phase} e^{-TE/fat_T2star} sum_k a_k e^{i 2 pi f_k TE}] e^{-i 2 pi B0 TE},

    ff = fat_fraction, f_k = ppm_k 1e-6 gamma_bar field_strength (Hz, negative below water), a_k the peak
    amplitudes of `FAT_SPECTRA[fat_spectrum]` normalised to sum to 1. Without `T2star` there is no decay;
    `fat_T2star` defaults to `T2star`.

    Protocol: `TE` (ms), `field_strength=3.0` (T), `fat_spectrum="hamilton2011"` (a `FAT_SPECTRA` name or a
    `(ppm, amplitude)` pair). Tissue (none required): `T2star`, `fat_T2star` (ms), `M0` (a complex scale),
    `B0` (Hz), `fat_fraction`, `fat_phase` (deg). Shape `(*voxel_shape, *samples)`, the samples being the
    broadcast of `TE` and `field_strength`. complex64, or complex128 for float64 inputs.
    """

    model = SpinPhysics(properties={"T2star": None, "fat_T2star": None, "M0": None, "B0": None,
                                    "fat_fraction": None, "fat_phase": None})
    structural = ("fat_spectrum",)

    def evaluate(self, properties, *, TE, field_strength=3.0, fat_spectrum="hamilton2011", device=None):
        x = self.arrange(properties, dict(TE=TE, field_strength=field_strength), device=device)
        p = x.protocol
        return x.finish(multigradientecho(p["TE"], field_strength=p["field_strength"], fat_spectrum=fat_spectrum,
                                          **x.tissue))


class IRMultiGradientEchoSimulator(ClosedForm):
    """Inversion-recovery multi-echo gradient echo with water and multi-peak fat. Closed form, complex.

    Each species recovers from an inversion (full recovery before it) and then decays as in
    `MultiGradientEchoSimulator`: the water amplitude is (1 - ff)(1 - (1 + eff) e^{-TI/T1}), the fat
    amplitude ff (1 - (1 + fat_eff) e^{-TI/fat_T1}). `fat_T1` defaults to `T1`, `fat_inv_efficiency` to
    `inv_efficiency`, `fat_T2star` to `T2star`.

    Protocol: `TI`, `TE` (ms; a flattened (TI, TE) grid is two arrays of equal length), `field_strength=3.0`
    (T), `fat_spectrum="hamilton2011"`. Tissue: `T1` (ms, required), `fat_T1`, `T2star`, `fat_T2star` (ms),
    `M0`, `B0` (Hz), `inv_efficiency`, `fat_inv_efficiency`, `fat_fraction`, `fat_phase` (deg). Shape
    `(*voxel_shape, *samples)`. complex64, or complex128 for float64 inputs.
    """

    model = SpinPhysics(properties={name: None for name in (
        "T1", "fat_T1", "T2star", "fat_T2star", "M0", "B0", "inv_efficiency", "fat_inv_efficiency", "fat_fraction",
        "fat_phase")})
    structural = ("fat_spectrum",)

    def evaluate(self, properties, *, TI, TE, field_strength=3.0, fat_spectrum="hamilton2011", device=None):
        x = self.arrange(properties, dict(TI=TI, TE=TE, field_strength=field_strength), required=("T1",),
                         device=device)
        p = x.protocol
        return x.finish(irmultigradientecho(p["TI"], p["TE"], field_strength=p["field_strength"],
                                            fat_spectrum=fat_spectrum, **x.tissue))


multigradientecho_sim = function_form(
    MultiGradientEchoSimulator,
    "multigradientecho_sim",
    ("TE",),
    (("diff", None), ("field_strength", 3.0), ("fat_spectrum", "hamilton2011"), ("T2star", None),
     ("fat_T2star", None), ("fat_fraction", 0.0), ("fat_phase", 0.0), ("B0", 0.0), ("M0", 1.0), ("device", None)),
)

irmultigradientecho_sim = function_form(
    IRMultiGradientEchoSimulator,
    "irmultigradientecho_sim",
    ("TI", "TE", "T1"),
    (("diff", None), ("field_strength", 3.0), ("fat_spectrum", "hamilton2011"), ("T2star", None), ("fat_T1", None),
     ("fat_T2star", None), ("inv_efficiency", 1.0), ("fat_inv_efficiency", None), ("fat_fraction", 0.0),
     ("fat_phase", 0.0), ("B0", 0.0), ("M0", 1.0), ("device", None)),
)
