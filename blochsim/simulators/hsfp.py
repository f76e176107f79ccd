"""Hybrid-state free precession: `HSFPSimulator` and `hsfp_sim`."""

from __future__ import annotations

import torch

from ..model import SpinPhysics
from ._closed_form import ClosedForm
from ._formulas import hsfp
from ._function_form import function_form

__all__ = ["HSFPSimulator", "hsfp_sim"]


class HSFPSimulator(ClosedForm):
    """Hybrid-state free precession in its periodic steady state (Assländer et al. 2019). Closed form, real.

    The magnetization stays on the spin-locked axis of the current flip a_n with length r, which relaxes
    during TR n as dr/dt = -(sin^2 a_n / T2 + cos^2 a_n / T1) r + cos a_n / T1 (solved exactly per TR).
    The flips make one pass; passes repeat, each starting from `beta` times the end of the previous one
    (beta = -1: an ideal inversion between passes), and the periodic steady state is returned:
    S_n = M0 r_n sin a_n at the end of TR n.

    Protocol: `flip` (deg, an array: its last axis is the pass), `TR` (ms, a scalar or one per TR),
    `beta=-1.0` (a scalar). Tissue: `T1`, `T2` (ms, required), `M0`. Shape `(*voxel_shape, *flip.shape)`.
    float32, or float64 for float64 inputs.
    """

    model = SpinPhysics(properties={"T1": None, "T2": None, "M0": None})

    def evaluate(self, properties, *, flip, TR, beta=-1.0, device=None):
        if isinstance(beta, torch.Tensor) and beta.dim():
            raise ValueError(f"HSFPSimulator: beta must be a scalar (the factor between passes), got shape "
                             f"{tuple(beta.shape)}")
        x = self.arrange(properties, dict(flip=flip, TR=TR, beta=beta), required=("T1", "T2"),
                         sample_names=("flip", "TR"), device=device)
        p = x.protocol
        return x.finish(hsfp(p["flip"], p["TR"], beta=p["beta"], **x.tissue))


hsfp_sim = function_form(
    HSFPSimulator,
    "hsfp_sim",
    ("flip", "TR", "T1", "T2"),
    (("diff", None), ("beta", -1.0), ("M0", 1.0), ("device", None)),
)
