"""MPRAGE: an inversion and a spoiled train whose centre shot is acquired; `MPRAGESimulator` and
`mprage_sim`."""

from __future__ import annotations

import math

from ..model import SPOILED, Simulator, SpinPhysics
from ..sequence.events import AdcRole
from ._formulas.prepared import split_shots
from ._function_form import function_form
from ._layout import check_order, per_shot, rad, seconds

__all__ = ["MPRAGESimulator", "mprage_sim"]


class MPRAGESimulator(Simulator):
    """Magnetization-prepared rapid gradient echo (Mugler & Brookeman 1990).

    Protocol: `TI` (ms, from the inversion to the centre shot), `flip` (deg, a scalar or one per shot),
    `TRspgr` (ms), `nshots` (a total, split evenly around the sampled shot with the odd one after, or a
    pair `(before, after)` whose `after` holds the sampled shot first), `phases=0` (deg, a scalar or one
    per shot). An ideal inversion, then `before + after` spoiled shots `TRspgr` apart (the SPOILED
    readout), the first `TI - before * TRspgr` after the inversion. Only the centre shot is acquired
    (`record="acquired"`); the others are played with role NON_ACQUIRED. `states=1`, T2 pinned at 100 ms.
    Tissue: T1 (ms), M0, inv_efficiency, and every public tissue name.

    Returns `voxel_shape` (no sample axis) complex64 (complex128 with `dtype=torch.float64`), the engine
    value times +i: on resonance its value is real, `+sin(a) Mz` before the centre pulse,
    negative when Mz is still inverted there. `jacobian` gives `(*voxel)` for one
    name and `(*voxel, P)` for a sequence. A `TI` earlier than the first excitation is a ValueError.
    """

    model = SpinPhysics(properties={"T1": "t1_ms", "M0": "m0", "inv_efficiency": "inversion_efficiency"},
                        operators=SPOILED, fixed={"t2_ms": 100.0})
    states = 1
    record = "acquired"
    structural = ("nshots",)
    post_rotation_rad = math.pi / 2  # x +i, as a demodulation phase offset (free per sample)

    def layout(self, *, TI, flip, TRspgr, nshots, phases=0.0):
        before, after = split_shots(nshots)
        n = before + after
        tr_s = seconds(TRspgr)
        lead_s = seconds(TI) - before * tr_s
        check_order("TI", 0.0, lead_s, f"TI = {_ms(seconds(TI))} ms comes before the first excitation: {before} shots "
                    f"of TRspgr = {_ms(tr_s)} ms precede the centre shot; give TI >= {_ms(before * tr_s)} ms")
        flips = per_shot("flip", rad(flip), n, unit=" (deg)")
        rf_phases = per_shot("phases", rad(phases), n, unit=" (deg)")
        roles = [AdcRole.NON_ACQUIRED] * before + [AdcRole.SINGLE] + [AdcRole.NON_ACQUIRED] * (after - 1)
        ops = [self.operators.inversion(), self.operators.delay(lead_s)]
        for a, p, role in zip(flips, rf_phases, roles, strict=True):
            ops.append(self.operators.excitation(a, p) @ self.operators.readout(p, duration_s=tr_s, role=role))
        return ops

    def simulate(self, **values):
        return super().simulate(**values)[..., 0]

    def jacobian(self, diff, **values):
        signal, jac = super().jacobian(diff, **values)
        return signal[..., 0], jac[..., 0]


def _ms(t_s) -> str:
    value = float(t_s.detach()) if hasattr(t_s, "detach") else float(t_s)
    return f"{value * 1e3:g}"


mprage_sim = function_form(
    MPRAGESimulator,
    "mprage_sim",
    ("TI", "flip", "TRspgr", "nshots", "T1"),
    (("diff", None), ("inv_efficiency", 1.0), ("M0", 1.0), ("phases", 0.0), ("device", None)),
)
