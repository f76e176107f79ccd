"""Balanced SSFP closed forms: `bSSFPSimulator` (steady state) and `IRbSSFPSimulator` (IR-TrueFISP)."""

from __future__ import annotations

from ..model import SpinPhysics
from ._closed_form import ClosedForm
from ._formulas import bssfp, irbssfp
from ._function_form import function_form

__all__ = ["bSSFPSimulator", "IRbSSFPSimulator", "bssfp_sim", "irbssfp_sim"]


class bSSFPSimulator(ClosedForm):
    """Balanced SSFP steady state with phase cycling and off-resonance, read at TE. Closed form, complex.

    Pulse n has RF phase n * phase_inc and each sample is demodulated by its pulse's phase. With the
    phase accrued per TR psi = 2 pi (B0 - chemshift) TR + phase_inc, E1 = e^{-TR/T1}, E2 = e^{-TR/T2}:

        S = M0 i (1 - E2 e^{i psi}) (1 - E1) sin a / D  e^{-TE/T2} e^{i 2 pi (chemshift - B0) TE},
        D = (1 - E1 cos a)(1 - E2 cos psi) - E2 (E1 - cos a)(E2 - cos psi),

    which is +i |M| on resonance with phase_inc = 180: 0.1332i at T1/T2 = 1000/100 ms,
    flip 60, TR 10, TE 5. The steady state uses E2 of TR, only the echo uses TE (the incumbent used TE: 0.2111).

    Protocol: `flip` (deg), `TR` (ms), `TE=None` (ms, TR/2), `phase_inc=180` (deg). Tissue: `T1`, `T2` (ms,
    required), `M0` (may be complex), `B0`, `chemshift` (Hz). Shape `(*voxel_shape, *samples)`, samples
    being the broadcast of the protocol arrays. complex64, or complex128 for float64 inputs.
    """

    model = SpinPhysics(properties={"T1": None, "T2": None, "M0": None, "B0": None, "chemshift": None})

    def evaluate(self, properties, *, flip, TR, TE=None, phase_inc=180.0, device=None):
        x = self.arrange(properties, dict(flip=flip, TR=TR, TE=TE, phase_inc=phase_inc), required=("T1", "T2"),
                         device=device)
        p = x.protocol
        return x.finish(bssfp(p["flip"], p["TR"], p["TE"], phase_inc=p["phase_inc"], **x.tissue))


class IRbSSFPSimulator(ClosedForm):
    """Inversion-recovery TrueFISP (Schmitt et al., MRM 2004;51:661). Closed form, real.

    An inversion, an alpha/2 preparation and a balanced train of flip a = B1 flip; the signal at TI after
    the inversion approaches its steady state single-exponentially:

        S(TI) = M0 [S_ss - (S_ss + eff sin(a/2)) e^{-TI/T1*}],   1/T1* = cos^2(a/2)/T1 + sin^2(a/2)/T2,
        S_ss  = sin a / ((T1/T2 + 1) - cos a (T1/T2 - 1)).

    Protocol: `flip` (deg), `TI` (ms). Tissue: `T1`, `T2` (ms, required), `M0`, `B1`, `inv_efficiency`.
    Shape `(*voxel_shape, *samples)`. float32, or float64 for float64 inputs.
    """

    model = SpinPhysics(properties={"T1": None, "T2": None, "M0": None, "B1": None, "inv_efficiency": None})

    def evaluate(self, properties, *, flip, TI, device=None):
        x = self.arrange(properties, dict(flip=flip, TI=TI), required=("T1", "T2"), device=device)
        return x.finish(irbssfp(x.protocol["flip"], x.protocol["TI"], **x.tissue))


bssfp_sim = function_form(
    bSSFPSimulator,
    "bssfp_sim",
    ("flip", "TE", "TR", "T1", "T2"),
    (("diff", None), ("phase_inc", 180.0), ("B0", 0.0), ("chemshift", 0.0), ("M0", 1.0), ("device", None)),
)

irbssfp_sim = function_form(
    IRbSSFPSimulator,
    "irbssfp_sim",
    ("flip", "TI", "T1", "T2"),
    (("diff", None), ("B1", 1.0), ("inv_efficiency", 1.0), ("M0", 1.0), ("device", None)),
)
