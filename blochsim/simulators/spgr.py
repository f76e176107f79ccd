"""Spoiled gradient echo in its steady state: `SPGRSimulator` and `spgr_sim`."""

from __future__ import annotations

from ..model import SpinPhysics
from ._closed_form import ClosedForm
from ._formulas import spgr
from ._function_form import function_form

__all__ = ["SPGRSimulator", "spgr_sim"]


class SPGRSimulator(ClosedForm):
    """Spoiled gradient-echo (FLASH) steady state, the Ernst signal with a phase. Closed form, complex.

        S = M0 (1 - E1) sin a / (1 - E1 cos a) e^{-TE/T2star} e^{i 2 pi (chemshift - B0) TE},

    E1 = e^{-TR/T1}, a = flip. Real and positive on resonance; `chemshift` has the opposite
    sign to `B0`. Without `T2star` there is no decay.

    Protocol: `flip` (deg), `TR` (ms), `TE` (ms). Tissue: `T1` (ms, required), `T2star` (ms), `M0` (may be
    complex), `B0` and `chemshift` (Hz). Shapes: `(*voxel_shape, *samples)`, the samples being the broadcast
    of the protocol arrays (none for a scalar protocol). complex64, or complex128 for float64 inputs.
    """

    model = SpinPhysics(properties={"T1": None, "T2star": None, "M0": None, "B0": None, "chemshift": None})

    def evaluate(self, properties, *, flip, TR, TE, device=None):
        x = self.arrange(properties, dict(flip=flip, TR=TR, TE=TE), required=("T1",), device=device)
        p = x.protocol
        return x.finish(spgr(p["flip"], p["TR"], p["TE"], **x.tissue))


spgr_sim = function_form(
    SPGRSimulator,
    "spgr_sim",
    ("flip", "TE", "TR", "T1", "T2star"),
    (("diff", None), ("B0", 0.0), ("chemshift", 0.0), ("M0", 1.0), ("device", None)),
)
