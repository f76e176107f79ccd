"""Textbook relaxometry closed forms: inversion recovery, multi-echo T2, spin echo, double angle. All real."""

from __future__ import annotations

from ..model import SpinPhysics
from ._closed_form import ClosedForm
from ._formulas import double_angle, inversion_recovery, multiecho, spin_echo
from ._function_form import function_form

__all__ = ["InversionRecoverySimulator", "MultiEchoSimulator", "SpinEchoSimulator", "DoubleAngleSimulator",
           "inversionrecovery_sim", "multiecho_sim", "spinecho_sim", "doubleangle_sim"]


class InversionRecoverySimulator(ClosedForm):
    """Inversion recovery read by a saturating readout at TI. Closed form, real.

        S = M0 (1 - (1 + eff (1 - e^{-(TR - TI)/T1})) e^{-TI/T1}) + offset,

    and without `TR` (full recovery before each inversion) S = M0 (1 - (1 + eff) e^{-TI/T1}) + offset.

    Protocol: `TI` (ms), `TR=None` (ms, >= TI). Tissue: `T1` (ms, required), `M0`, `inv_efficiency`,
    `offset` (units of the signal). Shape `(*voxel_shape, *samples)`. float32, or float64 for float64 inputs.
    """

    model = SpinPhysics(properties={"T1": None, "M0": None, "inv_efficiency": None, "offset": None})

    def evaluate(self, properties, *, TI, TR=None, device=None):
        x = self.arrange(properties, dict(TI=TI, TR=TR), required=("T1",), device=device)
        return x.finish(inversion_recovery(x.protocol["TI"], x.protocol["TR"], **x.tissue))


class MultiEchoSimulator(ClosedForm):
    """Multi-echo T2 decay: S = M0 e^{-TE/T2} + offset. Closed form, real.

    Protocol: `TE` (ms). Tissue: `T2` (ms, required), `M0`, `offset`. Shape `(*voxel_shape, *TE.shape)`.
    float32, or float64 for float64 inputs.
    """

    model = SpinPhysics(properties={"T2": None, "M0": None, "offset": None})

    def evaluate(self, properties, *, TE, device=None):
        x = self.arrange(properties, dict(TE=TE), required=("T2",), device=device)
        return x.finish(multiecho(x.protocol["TE"], **x.tissue))


class SpinEchoSimulator(ClosedForm):
    """Spin echo (90-180) repeated every TR. Closed form, real.

        S = M0 (1 - 2 e^{-(TR - TE/2)/T1} + e^{-TR/T1}) e^{-TE/T2},

    times (1 - (1 + eff) e^{-TI/T1}) when `TI` is given.

    Protocol: `TE`, `TR` (ms, TR >= TE/2), `TI=None` (ms). Tissue: `T1`, `T2` (ms, required), `M0`,
    `inv_efficiency`. Shape `(*voxel_shape, *samples)`. float32, or float64 for float64 inputs.
    """

    model = SpinPhysics(properties={"T1": None, "T2": None, "M0": None, "inv_efficiency": None})

    def evaluate(self, properties, *, TE, TR, TI=None, device=None):
        x = self.arrange(properties, dict(TE=TE, TR=TR, TI=TI), required=("T1", "T2"), device=device)
        p = x.protocol
        return x.finish(spin_echo(p["TE"], p["TR"], p["TI"], **x.tissue))


class DoubleAngleSimulator(ClosedForm):
    """Double-angle B1 mapping: S = M0 sin(B1 flip). Closed form, real.

    Protocol: `flip` (deg; the pair (a, 2a) gives the two images). Tissue: `B1` (required), `M0`. Shape
    `(*voxel_shape, *flip.shape)`. float32, or float64 for float64 inputs.
    """

    model = SpinPhysics(properties={"B1": None, "M0": None})

    def evaluate(self, properties, *, flip, device=None):
        x = self.arrange(properties, dict(flip=flip), required=("B1",), device=device)
        return x.finish(double_angle(x.protocol["flip"], **x.tissue))


inversionrecovery_sim = function_form(
    InversionRecoverySimulator,
    "inversionrecovery_sim",
    ("TI", "T1"),
    (("diff", None), ("TR", None), ("inv_efficiency", 1.0), ("offset", 0.0), ("M0", 1.0), ("device", None)),
)

multiecho_sim = function_form(
    MultiEchoSimulator,
    "multiecho_sim",
    ("TE", "T2"),
    (("diff", None), ("offset", 0.0), ("M0", 1.0), ("device", None)),
)

spinecho_sim = function_form(
    SpinEchoSimulator,
    "spinecho_sim",
    ("TE", "TR", "T1", "T2"),
    (("diff", None), ("TI", None), ("inv_efficiency", 1.0), ("M0", 1.0), ("device", None)),
)

doubleangle_sim = function_form(
    DoubleAngleSimulator,
    "doubleangle_sim",
    ("flip", "B1"),
    (("diff", None), ("M0", 1.0), ("device", None)),
)
