"""The three-pulse stimulated echo: `StimulatedEchoSimulator` and `stimulatedecho_sim`."""

from __future__ import annotations

import torch

from ..model import REFOCUSED, Simulator, SpinPhysics
from ..sequence.operators import Spoil
from ._function_form import function_form
from ._layout import check_order, per_shot, rad, seconds

__all__ = ["StimulatedEchoSimulator", "stimulatedecho_sim"]


def _three_flips(flip) -> list:
    """The three flips (`per_shot` over the pulses): a `(trains, 3)` or `(trains, 1)` flip gives `(trains,)`
    event values, one program per train."""
    try:
        return per_shot("flip", flip, 3)
    except ValueError:
        raise ValueError(f"flip must be a scalar (deg, the same for the three pulses) or 3 flips, or one row per "
                         f"train, (trains, 3) or (trains, 1); got shape {tuple(flip.shape)}") from None


class StimulatedEchoSimulator(Simulator):
    """A spin echo and a stimulated echo from three pulses.

    Protocol: `flip` (deg, a scalar or three), `TE` (ms), `TM` (ms, the mixing time, >= TE/2). Pulses about
    x at 0, `TE/2` and `TE/2 + TM`, the second and third crushed (the REFOCUSED preset). The spin echo is
    sampled at `TE`, the transverse magnetization is then spoiled, and the stimulated echo is sampled
    `TE/2` after the third pulse. Tissue: T1, T2 (ms), M0, B1, B0, and every public tissue name.

    Returns two samples `(..., 2)`, complex64, SE then STE; a `(trains, 3)` or `(trains, 1)` flip gives
    `(trains, *voxel_shape, 2)`, one train per row. For hard pulses `a_k = B1 flip_k`,
    both independent of B0 (Hahn 1950):

        SE  = i M0 sin(a1) sin^2(a2 / 2) exp(-TE / T2)
        STE = i M0 sin(a1) sin(a2) sin(a3) exp(-TE / T2) exp(-TM / T1) / 2

    `TM < TE/2` (the third pulse before the spin echo) is a ValueError.
    """

    model = SpinPhysics(properties={"T1": "t1_ms", "T2": "t2_ms", "M0": "m0", "B1": "b1", "B0": "b0_hz"},
                        operators=REFOCUSED)
    states = 4

    def layout(self, *, flip, TE, TM):
        a1, a2, a3 = (rad(a) for a in _three_flips(flip))
        half_s, mixing_s = seconds(TE) / 2, seconds(TM)
        check_order("TM", half_s, mixing_s, f"TM = {_ms(mixing_s)} ms must be >= TE/2 = {_ms(half_s)} ms: the third "
                    "pulse comes TM after the second, after the spin echo at TE")
        return [
            self.operators.excitation(a1),
            (half_s, self.operators.refocusing(a2)),
            (2 * half_s, self.operators.readout() @ Spoil()),
            (half_s + mixing_s, self.operators.refocusing(a3)),
            (2 * half_s + mixing_s, self.operators.readout()),
        ]


def _ms(t_s) -> str:
    value = float(t_s.detach()) if isinstance(t_s, torch.Tensor) else float(t_s)
    return f"{value * 1e3:g}"


stimulatedecho_sim = function_form(
    StimulatedEchoSimulator,
    "stimulatedecho_sim",
    ("flip", "TE", "TM", "T1", "T2"),
    (("diff", None), ("B1", 1.0), ("B0", 0.0), ("M0", 1.0), ("device", None)),
)
