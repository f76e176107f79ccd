"""Fast spin echo and hyperecho trains: `FSESimulator`, `HyperechoSimulator` and their function forms
`fse_sim`, `hyperecho_sim`."""

from __future__ import annotations

import torch

from ..model import REFOCUSED, Simulator, SpinPhysics
from ..sequence.operators import Spoil
from ._function_form import function_form
from ._layout import check_order, rad, seconds
from ._trains import TrainLoop, train_rows

__all__ = ["FSESimulator", "HyperechoSimulator", "fse_sim", "hyperecho_sim"]

_TISSUE = {"T1": "t1_ms", "T2": "t2_ms", "M0": "m0", "B1": "b1"}


def _echo_values(name: str, value, echoes: int | None) -> list:
    """One value per echo: a scalar repeats; the last axis of a 1-D or (trains, ETL) array gives the echoes
    (a 2-D array reaches `layout` only through `describe()`: its columns are `(trains,)` event values)."""
    if not isinstance(value, torch.Tensor) or value.dim() == 0:
        return [value] * (echoes or 1)
    if value.dim() > 2 or (echoes is not None and value.shape[-1] != echoes):
        expected = "a scalar or one value per echo (last axis)" if echoes is not None else "1-D or (trains, ETL)"
        raise ValueError(f"{name} must be {expected}" + (f", {echoes} echoes" if echoes else "") +
                         f"; got shape {tuple(value.shape)}")
    return list(value.unbind(-1))


_TRAIN_DIMS = {"flip": 2, "phases": 2, "TR": 1}  # the dimensions of a value with a leading train axis


def _split_trains(protocol: dict) -> list[dict] | None:
    """Per-train values of an FSE-like protocol: rows of 2-D `flip`/`phases`, entries of an array `TR`."""
    for name, dims in _TRAIN_DIMS.items():
        value = protocol.get(name)
        if isinstance(value, torch.Tensor) and value.dim() > dims:
            raise ValueError(f"{name} has shape {tuple(value.shape)}: give " +
                             ("one TR per train, (trains,)" if name == "TR" else "(ETL,) or (trains, ETL)"))
    return train_rows(protocol, _TRAIN_DIMS)


class FSESimulator(TrainLoop, Simulator):
    """Fast (turbo) spin echo, a CPMG train.

    Protocol: `flip` (deg, one refocusing flip per echo, so ETL = `len(flip)`), `ESP` (ms), `phases=0`
    (deg, one per echo or a scalar), `exc_flip=90`, `exc_phase=90` (deg), `TR=1e6` (ms). An excitation,
    then refocusing pulses (crushed, the REFOCUSED preset) `ESP` apart, the first `ESP/2` after it, with
    an echo midway between pulses, demodulated by its refocusing pulse's phase. After the last echo the
    transverse magnetization is spoiled and the longitudinal recovers until `TR`. Two playings, the
    second recorded: it starts from the longitudinal state left after `TR` recovery.

    Trains: a `(trains, ETL)` flip (or phases), or an array `TR`, gives one train per row or entry,
    stacked first: `(trains, *voxel_shape, ETL)`. Each train is its own engine run (`TrainLoop`): trains
    of one shape share a resolved structure, so repeated calls skip the layout. Tissue: T1, T2 (ms), M0,
    B1, and every public tissue name.

    Returns `(..., ETL)` complex64: real and positive for a CPMG train (the default `exc_phase=90`); with
    ideal 180s, echo n is `M0 exp(-n ESP / T2)`. `TR` shorter than `ETL * ESP` is a ValueError.
    """

    model = SpinPhysics(properties=_TISSUE, operators=REFOCUSED)
    states = 10
    repetitions = 2

    train_dims = _TRAIN_DIMS

    def trains(self, protocol: dict, tissue: dict) -> list[dict] | None:
        return _split_trains(protocol)

    def layout(self, *, flip, ESP, phases=0.0, exc_flip=90.0, exc_phase=90.0, TR=1e6):
        flips = _echo_values("flip", rad(flip), None)
        rf_phases = _echo_values("phases", rad(phases), len(flips))
        half_s = seconds(ESP) / 2
        ops = [self.operators.excitation(rad(exc_flip), rad(exc_phase))]
        for a, p in zip(flips, rf_phases, strict=True):
            ops.append(self.operators.delay(half_s) @ self.operators.refocusing(a, p) @ self.operators.delay(half_s)
                       @ self.operators.readout(p))
        ops.append(Spoil())
        return ops

    def repetition_s(self, played_s, *, TR=1e6, **protocol):
        tr_s = _repetition_s(TR)
        check_order("TR", played_s, tr_s, f"TR = {_ms(tr_s)} ms ends before the last echo at {_ms(played_s)} ms; "
                    "give TR >= ETL * ESP")
        return tr_s


class HyperechoSimulator(TrainLoop, Simulator):
    """Hyperechoes (Hennig & Scheffler, MRM 2001;46:6): a refocusing train and its mirror image.

    Protocol: `flip` (deg, n refocusing flips), `ESP` (ms), `phases=0` (deg), `refocusing=180` (deg, the
    central pulse), `exc_flip=90`, `exc_phase=90` (deg), `TR=1e6` (ms). An excitation, then `2n + 1`
    refocusing pulses `ESP` apart: the n pulses `(flip_j, phases_j)`, a central pulse of flip
    `refocusing` at phase 0, then the n pulses mirrored, `(-flip_j, -phases_j)` for j = n..1. Every
    echo lies midway between pulses and is demodulated at phase 0; the last one is the hyperecho, which
    with a 180-degree central pulse and no relaxation recovers the full signal whatever the flips.
    Spoiled after the last echo, played twice like FSE (the second playing recorded, after `TR`).
    Trains as for FSE. Tissue: T1, T2 (ms), M0, B1, and every public tissue name.

    Returns `(..., 2n + 1)` complex64, real and positive for CPMG phases.
    """

    model = SpinPhysics(properties=_TISSUE, operators=REFOCUSED)
    states = None
    repetitions = 2

    train_dims = _TRAIN_DIMS

    def trains(self, protocol: dict, tissue: dict) -> list[dict] | None:
        return _split_trains(protocol)

    def layout(self, *, flip, ESP, phases=0.0, refocusing=180.0, exc_flip=90.0, exc_phase=90.0, TR=1e6):
        flips = _echo_values("flip", rad(flip), None)
        rf_phases = _echo_values("phases", rad(phases), len(flips))
        pulses = list(zip(flips, rf_phases, strict=True)) + [(rad(refocusing), 0.0)]
        pulses += [(-a, -p) for a, p in reversed(pulses[:-1])]
        half_s = seconds(ESP) / 2
        ops = [self.operators.excitation(rad(exc_flip), rad(exc_phase))]
        for a, p in pulses:
            ops.append(self.operators.delay(half_s) @ self.operators.refocusing(a, p) @ self.operators.delay(half_s)
                       @ self.operators.readout(0.0))
        ops.append(Spoil())
        return ops

    def repetition_s(self, played_s, *, TR=1e6, **protocol):
        tr_s = _repetition_s(TR)
        check_order("TR", played_s, tr_s, f"TR = {_ms(tr_s)} ms ends before the last echo at {_ms(played_s)} ms; "
                    "give TR >= (2 len(flip) + 1) * ESP")
        return tr_s


def _repetition_s(tr_ms):
    if isinstance(tr_ms, torch.Tensor) and tr_ms.numel() != 1:
        raise ValueError(f"TR of shape {tuple(tr_ms.shape)} gives one train per TR: describe one train at a time "
                         "(describe(TR=...) with a single TR); simulate() takes them all")
    if isinstance(tr_ms, torch.Tensor):
        tr_ms = tr_ms.reshape(())
    return seconds(tr_ms)


def _ms(t_s) -> str:
    value = float(t_s.detach()) if isinstance(t_s, torch.Tensor) else float(t_s)
    return f"{value * 1e3:g}"


fse_sim = function_form(
    FSESimulator,
    "fse_sim",
    ("flip", "ESP", "T1", "T2"),
    (("phases", 0.0), ("TR", 1e6), ("exc_flip", 90.0), ("exc_phase", 90.0), ("diff", None), ("B1", 1.0),
     ("M0", 1.0), ("states", 10), ("device", None)),
)

hyperecho_sim = function_form(
    HyperechoSimulator,
    "hyperecho_sim",
    ("flip", "ESP", "T1", "T2"),
    (("diff", None), ("phases", 0.0), ("refocusing", 180.0), ("exc_flip", 90.0), ("exc_phase", 90.0),
     ("TR", 1e6), ("B1", 1.0), ("M0", 1.0), ("device", None)),
)
