"""MPnRAGE: an inversion and a spoiled train sampled at every shot; `MPnRAGESimulator` and `mpnrage_sim`
."""

from __future__ import annotations

import math

from ..model import SPOILED, Simulator, SpinPhysics
from ._function_form import function_form
from ._layout import count, per_shot, rad, seconds

__all__ = ["MPnRAGESimulator", "mpnrage_sim"]


class MPnRAGESimulator(Simulator):
    """Magnetization-prepared rapid gradient echoes, every shot sampled (Kecskemeti 2016).

    Protocol: `nshots` (> 0), `flip` (deg), `TR` (ms), `TI=0` (ms, inversion to the first pulse),
    `phases=0` (deg); `flip`, `TR` and `phases` are each a scalar or one value per shot. An ideal
    inversion, `TI`, then per shot `excitation(flip, phase) @ readout(phase, TR)` with the SPOILED
    readout (sample at the pulse, ideal spoiling, free recovery for TR). One EPG order suffices
    (`states=1`), and T2 is pinned at 100 ms: it has no effect on an FID sampled at its pulse.
    Tissue: T1 (ms), M0, B1, inv_efficiency, and every public tissue name.

    Returns `(..., nshots)` complex64 (complex128 with `dtype=torch.float64`), the engine value times +i:
    on resonance its value is real, `+sin(a) Mz` before each pulse, negative while Mz is
    inverted. `nshots <= 0`, or a `flip` that is neither a scalar nor one per shot,
    is a ValueError.
    """

    model = SpinPhysics(properties={"T1": "t1_ms", "M0": "m0", "B1": "b1", "inv_efficiency": "inversion_efficiency"},
                        operators=SPOILED, fixed={"t2_ms": 100.0})
    states = 1
    structural = ("nshots",)
    post_rotation_rad = math.pi / 2  # x +i, as a demodulation phase offset (free per sample)

    def layout(self, *, nshots, flip, TR, TI=0.0, phases=0.0):
        n = count("nshots", nshots)
        flips = per_shot("flip", rad(flip), n, unit=" (deg)")
        trs = per_shot("TR", seconds(TR), n, unit=" (ms)")
        rf_phases = per_shot("phases", rad(phases), n, unit=" (deg)")
        ops = [self.operators.inversion(), self.operators.delay(seconds(TI))]
        for a, tr, p in zip(flips, trs, rf_phases, strict=True):
            ops.append(self.operators.excitation(a, p) @ self.operators.readout(p, duration_s=tr))
        return ops


mpnrage_sim = function_form(
    MPnRAGESimulator,
    "mpnrage_sim",
    ("nshots", "flip", "TR", "T1"),
    (("diff", None), ("B1", 1.0), ("inv_efficiency", 1.0), ("M0", 1.0), ("TI", 0.0), ("phases", 0.0),
     ("device", None)),
)
