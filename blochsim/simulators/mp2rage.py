"""MP2RAGE: `MP2RAGESimulator` (its closed form) and `mp2rage_sim` (API.md 5.1, 5.3).

API.md 5.1 gives this class both a closed-form `evaluate` and an event-train `layout`. The `Simulator`
base class treats a class with a `layout` as an event train, so only the closed form is implemented
here; the class settings of the event train (states=1, record="acquired", T2 pinned at 100 ms, SPOILED
handlers) are already declared for it.
"""

from __future__ import annotations

from ..model import SPOILED, SpinPhysics
from ._closed_form import ClosedForm
from ._formulas import mp2rage
from ._function_form import function_form

__all__ = ["MP2RAGESimulator", "mp2rage_sim"]


class MP2RAGESimulator(ClosedForm):
    """MP2RAGE (Marques et al., NeuroImage 2010;49:1271): the two gradient-echo samples (GRE1, GRE2) of
    repeated inversion blocks in their steady state. Closed form, real (not the uniform image).

    Every TRmp2rage: an inversion (Mz -> -eff Mz), then two blocks of `nshots` ideally spoiled shots spaced
    TRspgr, with flips flip[0] and flip[1]; only Mz carries from shot to shot. Block k's sampled shot (the
    first of `after`) is at TI[k] after the inversion. With E1 = e^{-TRspgr/T1} and q_k = E1 cos a_k, a
    block of m shots maps Mz -> q^m Mz + (1 - E1)(1 - q^m)/(1 - q), and free recovery for T maps
    Mz -> e^{-T/T1} Mz + 1 - e^{-T/T1}; the fixed point of one TRmp2rage gives the steady state, and
    GRE_k = M0 sin a_k Mz_k with Mz_k just before the sampled pulse (negative while inverted).

    Protocol: `TI` (ms, 2 values), `flip` (deg, a scalar or 2), `TRspgr`, `TRmp2rage` (ms), `nshots` (a total
    split evenly around the sampled shot, or `(before, after)` with the sampled shot the first of `after`),
    `phases=0` (deg, used by the event train only). Tissue: `T1` (ms, required), `M0`, `inv_efficiency`.
    Shape `(*voxel_shape, 2)`. ValueError when a TI precedes the first excitation of its block, when the
    blocks overlap, or when block 2 does not end within TRmp2rage. float32, or float64 for float64 inputs.
    """

    model = SpinPhysics(properties={"T1": "t1_ms", "M0": "m0", "inv_efficiency": "inversion_efficiency"},
                        operators=SPOILED, fixed={"t2_ms": 100.0})
    states = 1
    record = "acquired"
    structural = ("nshots",)

    def evaluate(self, properties, *, TI, flip, TRspgr, TRmp2rage, nshots, phases=0.0, device=None):
        x = self.arrange(properties, dict(TI=TI, flip=flip, TRspgr=TRspgr, TRmp2rage=TRmp2rage),
                         required=("T1",), sample_shape=(1,), device=device)
        p = x.protocol
        return x.finish(mp2rage(p["TI"], p["flip"], p["TRspgr"], p["TRmp2rage"], nshots, **x.tissue), (2,))


mp2rage_sim = function_form(
    MP2RAGESimulator,
    "mp2rage_sim",
    ("TI", "flip", "TRspgr", "TRmp2rage", "nshots", "T1"),
    (("diff", None), ("inv_efficiency", 1.0), ("M0", 1.0), ("device", None)),
)
