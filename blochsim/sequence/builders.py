"""Ready-made descriptions of common trains (API.md section 6.4). Angles in rad, times in s.

Per-shot arguments are a scalar (repeated) or one value per shot; a tensor stays
differentiable (its entries land in the event params, its durations in the
timestamps). Each builder also takes `crusher_dephasing_rad` and `voxel_size_m`,
passed to the `SequenceDescription`. RF and ADC phases match shot by shot, so each
sample is demodulated by its own pulse's phase.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from .description import SequenceDescription
from .events import AdcRole, as_float
from .operators import Delay, Excitation, FSEReadout, Inversion, Refocusing, SPGRReadout, SSFPFidReadout, _time_s

__all__ = ["fse_description", "mrf_description", "mpnrage_description", "mprage_description", "spgr_description"]


def _shots(name: str, value: Any, count: int | None = None) -> list:
    """Split `value` along its last axis into per-shot values (floats or tensors).

    A scalar gives `count` copies (one if `count` is None); an array of last axis
    `count` gives its entries (or columns, for a leading train axis).
    """
    if not isinstance(value, torch.Tensor):
        array = np.asarray(value, dtype=np.float64)
        value = float(array) if array.ndim == 0 else torch.as_tensor(array)
    if not isinstance(value, torch.Tensor) or value.dim() == 0:
        return [value] * (1 if count is None else count)
    if value.dim() > 2 or (count is not None and value.shape[-1] != count):
        expected = "a scalar" + (f" or {count} values (last axis)" if count is not None else " or a 1-D/2-D array")
        raise ValueError(f"{name} must be {expected}, got shape {tuple(value.shape)}")
    return list(value.unbind(-1))




def _describe(ops: list, crusher_dephasing_rad: float, voxel_size_m: float | None) -> SequenceDescription:
    return SequenceDescription.from_operators(*ops, crusher_dephasing_rad=crusher_dephasing_rad,
                                              voxel_size_m=voxel_size_m)


def fse_description(flip_rad, echo_spacing_s, *, phases_rad=0, excitation_flip_rad=math.pi / 2,
                    excitation_phase_rad=math.pi / 2, repetition_time_s=None, crusher_dephasing_rad=0.0,
                    voxel_size_m=None) -> SequenceDescription:
    """A CPMG echo train: an excitation at 0, refocusing pulse j at `(j + 1/2) * echo_spacing_s`, echo j at
    `(j + 1) * echo_spacing_s`, demodulated by its refocusing phase.

    `flip_rad` is `(ETL,)`, or `(trains, ETL)` for one train per row (each event then
    holds a `(trains,)` tensor). The repetition ends at the last echo, or at
    `repetition_time_s` (which must not come before it).
    """
    flips = _shots("flip_rad", flip_rad)
    phases = _shots("phases_rad", phases_rad, len(flips))
    half_s = _time_s("echo_spacing_s", echo_spacing_s) / 2
    ops = [Excitation(excitation_flip_rad, excitation_phase_rad)]
    for flip, phase in zip(flips, phases, strict=True):
        ops.append(Delay(half_s) @ Refocusing(flip, phase) @ Delay(half_s) @ FSEReadout(phase))
    if repetition_time_s is not None:
        rest_s = _time_s("repetition_time_s", repetition_time_s) - 2 * half_s * len(flips)
        if as_float(rest_s) < 0:
            raise ValueError(f"repetition_time_s = {as_float(repetition_time_s)} s ends before the last echo at "
                             f"{2 * as_float(half_s) * len(flips)} s; give at least ETL * echo_spacing_s")
        ops.append(Delay(rest_s))
    return _describe(ops, crusher_dephasing_rad, voxel_size_m)


def mrf_description(flip_rad, repetition_time_s, *, inversion_time_s=0, phases_rad=0, inversion=True,
                    crusher_dephasing_rad=0.0, voxel_size_m=None) -> SequenceDescription:
    """MR fingerprinting (FISP): an ideal inversion and a `Delay(inversion_time_s)`, then per TR
    `Excitation(flip, phase) @ SSFPFidReadout(phase, duration_s=TR)`.

    `repetition_time_s` and `phases_rad` are scalars or one per flip. [ours]
    `inversion=False` drops the inversion and its delay.
    """
    flips = _shots("flip_rad", flip_rad)
    trs = _shots("repetition_time_s", repetition_time_s, len(flips))
    phases = _shots("phases_rad", phases_rad, len(flips))
    ops = [Inversion(), Delay(inversion_time_s)] if inversion else []
    ops += [Excitation(a, p) @ SSFPFidReadout(p, duration_s=tr) for a, tr, p in zip(flips, trs, phases, strict=True)]
    return _describe(ops, crusher_dephasing_rad, voxel_size_m)


def _spoiled_shots(flips, trs, phases, roles):
    shots = zip(flips, trs, phases, roles, strict=True)
    return [Excitation(a, p) @ SPGRReadout(p, duration_s=tr, role=r) for a, tr, p, r in shots]


def mpnrage_description(nshots, flip_rad, repetition_time_s, *, inversion_time_s=0, phases_rad=0,
                        crusher_dephasing_rad=0.0, voxel_size_m=None) -> SequenceDescription:
    """MPnRAGE: an inversion, `Delay(inversion_time_s)`, then `nshots` spoiled shots
    `Excitation @ SPGRReadout(duration_s=TR)`, each sampled at its pulse."""
    if isinstance(nshots, bool) or int(nshots) != nshots or int(nshots) <= 0:
        raise ValueError(f"nshots must be an integer > 0, got {nshots!r}")
    n = int(nshots)
    flips = _shots("flip_rad", flip_rad, n)
    ops = [Inversion(), Delay(inversion_time_s)] + _spoiled_shots(
        flips, _shots("repetition_time_s", repetition_time_s, n), _shots("phases_rad", phases_rad, n),
        [AdcRole.SINGLE] * n)
    return _describe(ops, crusher_dephasing_rad, voxel_size_m)


def mprage_description(nshots_before, nshots_after, flip_rad, repetition_time_s, inversion_time_s, *,
                       phases_rad=0, crusher_dephasing_rad=0.0, voxel_size_m=None) -> SequenceDescription:
    """MPRAGE: an inversion, then `nshots_before + nshots_after` spoiled shots one `repetition_time_s` apart.

    The centre shot, the first of the `nshots_after`, is the only acquired one (role
    SINGLE; the others NON_ACQUIRED) and plays `inversion_time_s` after the inversion,
    so the first shot plays at `inversion_time_s - nshots_before * repetition_time_s`,
    which must not be negative.
    """
    before, after = int(nshots_before), int(nshots_after)
    if before != nshots_before or after != nshots_after or before < 0 or after < 1:
        raise ValueError(f"nshots_before must be an integer >= 0 and nshots_after >= 1 (it holds the centre shot), "
                         f"got {nshots_before!r} and {nshots_after!r}")
    n = before + after
    tr_s = _time_s("repetition_time_s", repetition_time_s)
    lead_s = _time_s("inversion_time_s", inversion_time_s) - before * tr_s
    if as_float(lead_s) < 0:
        raise ValueError(f"inversion_time_s = {as_float(inversion_time_s)} s comes before the first excitation: "
                         f"{before} shots of {as_float(tr_s)} s precede the centre shot; give at least "
                         f"{before * as_float(tr_s)} s")
    roles = [AdcRole.NON_ACQUIRED] * before + [AdcRole.SINGLE] + [AdcRole.NON_ACQUIRED] * (after - 1)
    ops = [Inversion(), Delay(lead_s)] + _spoiled_shots(
        _shots("flip_rad", flip_rad, n), [tr_s] * n, _shots("phases_rad", phases_rad, n), roles)
    return _describe(ops, crusher_dephasing_rad, voxel_size_m)


def spgr_description(flip_rad, repetition_time_s, echo_time_s, *, phases_rad=0, crusher_dephasing_rad=0.0,
                     voxel_size_m=None) -> SequenceDescription:
    """Spoiled gradient echo: per shot `Excitation`, `Delay(TE)`, `SPGRReadout(duration_s=TR - TE)`.

    A scalar `flip_rad` gives one shot; an array gives one shot per entry (with
    `phases_rad` scalar or per shot, e.g. RF spoiling). `echo_time_s` must not exceed
    `repetition_time_s`.
    """
    flips = _shots("flip_rad", flip_rad)
    phases = _shots("phases_rad", phases_rad, len(flips))
    te_s, tr_s = _time_s("echo_time_s", echo_time_s), _time_s("repetition_time_s", repetition_time_s)
    if as_float(te_s) > as_float(tr_s):
        raise ValueError(f"echo_time_s = {as_float(te_s)} s exceeds repetition_time_s = {as_float(tr_s)} s")
    ops = [Excitation(a, p) @ Delay(te_s) @ SPGRReadout(p, duration_s=tr_s - te_s)
           for a, p in zip(flips, phases, strict=True)]
    return _describe(ops, crusher_dephasing_rad, voxel_size_m)
