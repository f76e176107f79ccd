"""MR fingerprinting: `MRFSimulator` and its function form `mrf_sim` (API.md 5.1, 5.3)."""

from __future__ import annotations

import math

import torch

from ..model import UNBALANCED, Simulator, SpinPhysics
from ._function_form import function_form

__all__ = ["MRFSimulator", "mrf_sim"]


def _per_tr(name: str, value, count: int | None):
    """Split a protocol value into one value per TR: a scalar repeats, a 1-D array gives its entries."""
    if not isinstance(value, torch.Tensor) or value.dim() == 0:
        return [value] * (count or 1)
    if value.dim() > 1:
        raise NotImplementedError(f"{name} of shape {tuple(value.shape)}: a leading train axis is not supported "
                                  "by MRFSimulator yet; give one 1-D train at a time")
    if count is not None and value.numel() != count:
        raise ValueError(f"{name} must be a scalar or hold one value per TR ({count}, the length of flip), "
                         f"got {value.numel()}")
    return list(value.unbind())


class MRFSimulator(Simulator):
    """MR fingerprinting with FISP readouts (API.md 5.1).

    An ideal inversion and a `TI` delay, then per TR `excitation(flip, phase) @ readout(phase, TR)` with
    the UNBALANCED readout (sample, one unbalanced gradient, free evolution for TR). Protocol: `flip`
    (deg, one per TR), `TR` (ms, a scalar or one per TR), `TI=0` (ms), `phases=0` (deg, a scalar or one
    per TR). Tissue: T1, T2 (ms), M0, B1, inv_efficiency, and every API.md 4.1 name.

    Returns `(..., len(flip))`, the last playing times +i (API.md 1.6): real, `+sin(a) Mz` before the
    pulse, negative after the inversion. `MRFSimulator(flip=[10, 20, 30], TR=10).simulate(T1=1000, T2=80)`
    gives `[-0.1736, -0.3301, -0.4404]`. `MRFSimulator.from_description(d)` returns the raw engine value.
    """

    model = SpinPhysics(properties={"T1": "t1_ms", "T2": "t2_ms", "M0": "m0", "B1": "b1",
                                    "inv_efficiency": "inversion_efficiency"}, operators=UNBALANCED)
    states = 10
    post_rotation_rad = math.pi / 2  # x +i, as a demodulation phase offset (free per sample)

    def layout(self, *, flip, TR, TI=0.0, phases=0.0):
        flips = _per_tr("flip", torch.deg2rad(flip) if isinstance(flip, torch.Tensor) else flip * torch.pi / 180,
                        None)
        trs = _per_tr("TR", TR * 1e-3, len(flips))
        rf = _per_tr("phases", torch.deg2rad(phases) if isinstance(phases, torch.Tensor) else phases * torch.pi / 180,
                     len(flips))
        ops = [self.operators.inversion(), self.operators.delay(TI * 1e-3)]
        for a, tr, p in zip(flips, trs, rf, strict=True):
            ops.append(self.operators.excitation(a, p) @ self.operators.readout(p, duration_s=tr))
        return ops



mrf_sim = function_form(
    MRFSimulator,
    "mrf_sim",
    ("flip", "TR", "T1", "T2"),
    (("diff", None), ("B1", 1.0), ("inv_efficiency", 1.0), ("M0", 1.0), ("TI", 0.0), ("phases", 0.0),
     ("states", 10), ("nreps", 1), ("device", None)),
    renames={"nreps": "repetitions"},
)
