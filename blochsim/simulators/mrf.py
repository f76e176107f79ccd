"""MR fingerprinting: `MRFSimulator` and its function form `mrf_sim`."""

from __future__ import annotations

import math

import torch

from ..model import UNBALANCED, Simulator, SpinPhysics
from ..sequence.builders import mrf_description
from ..sequence.rf import ideal_rf_definition
from ._function_form import function_form
from ._layout import rad, seconds
from ._trains import TrainLoop, train_count, train_rows

__all__ = ["MRFSimulator", "mrf_sim"]


#: The dimensions of a protocol value with a leading train axis.
_TRAIN_DIMS = {"flip": 2, "phases": 2, "TR": 2}


def _per_tr(name: str, value, count: int | None):
    """One value per TR: a scalar repeats, a 1-D array gives its entries, a `(trains, N)` array its
    `(trains,)` columns and a `(trains, 1)` array its one column (not for `flip`, whose length is N)."""
    if not isinstance(value, torch.Tensor) or value.dim() == 0:
        return [value] * (count or 1)
    if value.dim() == 1:
        if count is not None and value.numel() != count:
            raise ValueError(f"{name} must be a scalar or hold one value per TR ({count}, the length of flip), "
                             f"got {value.numel()}")
        return list(value.unbind())
    if name == "TR" and value.dim() == 2:
        raise ValueError(f"TR of shape {tuple(value.shape)} gives each train its own timeline, laid out one train "
                         "at a time: simulate() and jacobian() take it; describe() one train at a time (a 1-D TR)")
    if value.dim() != 2 or (count is not None and value.shape[1] not in (1, count)):
        accepted = "(N,) or (trains, N)" if count is None else f"a scalar, ({count},), (trains, 1) or (trains, {count})"
        raise ValueError(f"{name} must be {accepted}, N = {count or 'the number of TRs'}; got shape "
                         f"{tuple(value.shape)}")
    if value.shape[1] == 1 and count is not None:
        return [value[:, 0]] * count
    return list(value.unbind(1))


class MRFSimulator(TrainLoop, Simulator):
    """MR fingerprinting with FISP readouts.

    An ideal inversion and a `TI` delay, then per TR `excitation(flip, phase) @ readout(phase, TR)` with
    the UNBALANCED readout (sample, one unbalanced gradient, free evolution for TR). Protocol: `flip`
    (deg, one per TR), `TR` (ms, a scalar or one per TR), `TI=0` (ms), `phases=0` (deg, a scalar or one
    per TR). Tissue: T1, T2 (ms), M0, B1, inv_efficiency, and every public tissue name.

    Trains: `flip` of shape `(trains, N)`, `phases` of shape `(trains, 1)` or `(trains, N)`
    and `TR` of shape `(trains, 1)` or `(trains, N)` give one train per row, stacked first:
    `(trains, *voxel_shape, N)`. A scalar or 1-D value is shared by every train; the 2-D values must
    have the same number of rows, or one (shared). Flips and phases per train become event values with
    a train axis, which the engine runs one program per train (walked and compiled on every call); a
    `TR` per train changes the timeline, so each train is then laid out and run on its own (`TrainLoop`).
    A single row, `(1, N)`, still gives a train axis of 1. `describe()` takes per-train flips and phases
    (events with `(trains,)` values), not a 2-D `TR`.

    Returns `(..., len(flip))` complex64 (complex128 with `dtype=torch.float64`), the last playing times +i:
    on resonance its value is real, `+sin(a) Mz` before the pulse, negative after the
    inversion. `MRFSimulator(flip=[10, 20, 30], TR=10).simulate(T1=1000, T2=80)`
    gives `[-0.1736, -0.3301, -0.4404]`. `MRFSimulator.from_description(d)` returns the raw engine value.
    """

    model = SpinPhysics(properties={"T1": "t1_ms", "T2": "t2_ms", "M0": "m0", "B1": "b1",
                                    "inv_efficiency": "inversion_efficiency"}, operators=UNBALANCED)
    states = 10
    post_rotation_rad = math.pi / 2  # x +i, as a demodulation phase offset (free per sample)
    train_dims = _TRAIN_DIMS

    def trains(self, protocol: dict, tissue: dict) -> list[dict] | None:
        tr = protocol.get("TR")
        per_train_tr = isinstance(tr, torch.Tensor) and tr.dim() == 2
        trains = train_count(protocol, _TRAIN_DIMS)
        if trains is None or (trains > 1 and not per_train_tr):
            return None  # one timeline: the engine takes the per-train flips and phases
        parts = train_rows(protocol, _TRAIN_DIMS)
        return [{name: v.reshape(()) if name != "flip" and v.numel() == 1 else v for name, v in part.items()}
                for part in parts]

    def _compose(self, args: dict, settings: dict):
        """The default train is built directly (`builders.mrf_description`, held to the operators' events by
        tests/test_builders_speed.py): 500 flips in ~2 ms instead of ~40 ms through `layout`. A subclass's
        layout, handler slots, pulse, shims or RF definitions, or a train axis, take the operators."""
        direct = (type(self).layout is MRFSimulator.layout and type(self).repetition_s is Simulator.repetition_s
                  and self.operators == UNBALANCED and settings.get("pulse") is None and not settings.get("shims")
                  and dict(self._model.definitions) == {0: ideal_rf_definition()}
                  and not any(isinstance(args.get(n), torch.Tensor) and args[n].dim() > 1 for n in _TRAIN_DIMS))
        if not direct:
            return super()._compose(args, settings)
        flip, tr, ti, phases = args["flip"], args["TR"], args.get("TI", 0.0), args.get("phases", 0.0)
        try:
            return mrf_description(
                rad(flip), seconds(tr),
                inversion_time_s=seconds(ti),
                phases_rad=rad(phases),
                crusher_dephasing_rad=self._crusher_dephasing_rad, voxel_size_m=self._voxel_size_m)
        except (TypeError, ValueError):  # the layout names the simulator's own arguments in its errors
            return super()._compose(args, settings)

    def layout(self, *, flip, TR, TI=0.0, phases=0.0):
        train_count({"flip": flip, "phases": phases}, _TRAIN_DIMS)  # names the arguments when trains disagree
        flips = _per_tr("flip", rad(flip), None)
        trs = _per_tr("TR", seconds(TR), len(flips))
        rf = _per_tr("phases", rad(phases), len(flips))
        ops = [self.operators.inversion(), self.operators.delay(seconds(TI))]
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
