"""Arterial spin labelling: `ASLSimulator` and `asl_sim`."""

from __future__ import annotations

from ..model import SpinPhysics
from ._closed_form import ClosedForm
from ._formulas import asl
from ._function_form import function_form

__all__ = ["ASLSimulator", "asl_sim"]


class ASLSimulator(ClosedForm):
    """The label-control difference of the Buxton general kinetic model (Buxton et al., MRM 1998;40:383).
    Closed form, real.

    With f = CBF/6e6 (ml/g/ms), lambda = `partition`, the blood equilibrium M0/lambda and the apparent
    tissue rate R1app = 1/T1 + f/lambda,

        Delta M(t) = 2 (M0/lambda) f integral_{ATT}^{ATT + u} c(s) e^{-(t - s) R1app} ds,
        u = min(max(t - ATT, 0), tau),

    with c(s) = alpha e^{-ATT/T1_blood} (continuous labelling) or alpha e^{-s/T1_blood} (pulsed): zero
    before the bolus arrives, then Buxton's arrival and wash-out phases.

    Protocol: `t` (ms since the start of labelling; pCASL: tau + post-labelling delay), `tau` (ms, bolus
    duration), `labelling="continuous"|"pulsed"`, `efficiency=None` (alpha; 0.85 continuous, 0.98 pulsed).
    Tissue: `CBF` (ml/100 g/min), `ATT` (ms), `T1` (ms), all required; `M0`, `T1_blood=1650` (ms),
    `partition=0.9` (ml/g). Shape `(*voxel_shape, *samples)`. float32, or float64 for float64 inputs.
    """

    model = SpinPhysics(properties={name: None for name in ("CBF", "ATT", "T1", "M0", "T1_blood", "partition")})

    def evaluate(self, properties, *, t, tau, labelling="continuous", efficiency=None, device=None):
        x = self.arrange(properties, dict(t=t, tau=tau, efficiency=efficiency), required=("CBF", "ATT", "T1"),
                         device=device)
        p = x.protocol
        return x.finish(asl(p["t"], p["tau"], labelling=labelling, efficiency=p["efficiency"], **x.tissue))


asl_sim = function_form(
    ASLSimulator,
    "asl_sim",
    ("t", "tau", "CBF", "ATT", "T1"),
    (("diff", None), ("labelling", "continuous"), ("efficiency", None), ("M0", 1.0), ("T1_blood", 1650.0),
     ("partition", 0.9), ("device", None)),
)
