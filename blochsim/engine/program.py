"""Compile a `SequenceDescription` into a kernel program (DESIGN.md section 2).

A program is the *structure* (per-event action bits and sample slots, the path, the order count) plus
*values* (interval lengths, flips, phases) as torch tensors built from the description's own numbers,
so autograd carries gradients from the kernels back to whatever tensors the description was made of.

Event semantics are those of API.md section 3.3 and `blochsim._reference`. WAIT events with no action
only mark time, so they are dropped; their time goes into the next event's interval.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.autograd.forward_ad as fwAD

from .. import _native as nat
from ..sequence.events import AdcRole, EventAction, EventType, RfUse

__all__ = ["Program", "compile_program", "default_states", "shifts_per_repetition"]

_WINDING = int(EventAction.CRUSH_BEFORE | EventAction.CRUSH_AFTER | EventAction.SHIFT_AFTER)
_RECORD_MODES = ("all", "acquired", "echo")


@dataclass
class Program:
    """A compiled program. `action`/`record` are int32 numpy arrays; the values are float64 tensors."""

    action: np.ndarray  # [E] bs_action bits
    record: np.ndarray  # [E] sample slot or -1
    dt_s: torch.Tensor  # [E]
    dt_wrap_s: torch.Tensor  # [1]
    flip_rad: torch.Tensor  # [E] signed flips (real path: half turns folded in)
    phase_rad: torch.Tensor  # [E] RF phase, or ADC demodulation phase (real path: relative to the axis)
    num_repetitions: int
    num_samples: int
    num_states: int
    path: int
    crusher_dk_rad_per_m: float
    voxel_size_m: float
    sample_events: list  # description index of each recorded sample
    sat_per_rad2: np.ndarray  # [E] saturation constant S of each rotating pulse's definition (0 elsewhere)
    rf_hz: np.ndarray  # [E] frequency offset of each rotating pulse, Hz
    axis_phase_rad: float = 0.0  # the common pulse axis on the real path


def shifts_per_repetition(description) -> int:
    """Windings of one repetition: events with CRUSH_BEFORE, CRUSH_AFTER or SHIFT_AFTER count once per bit."""
    n = 0
    for e in description.events:
        bits = int(e.action)
        n += bool(bits & EventAction.CRUSH_BEFORE) + bool(bits & EventAction.CRUSH_AFTER)
        n += bool(bits & EventAction.SHIFT_AFTER) and not bits & EventAction.SPOIL_AFTER
    return n


def default_states(description, repetitions: int) -> int:
    """API.md 2.1: max(8, min(64, 1 + repetitions x windings per repetition))."""
    return max(8, min(64, 1 + repetitions * shifts_per_repetition(description)))


def _keep_sample(event, record: str) -> bool:
    if record == "all":
        return True
    if record == "acquired":
        return event.adc_role != AdcRole.NON_ACQUIRED
    return bool(event.is_echo)


def _as_f64(values: list) -> torch.Tensor:
    """Stack numbers and 0-d tensors into one float64 tensor, keeping autograd links."""
    if not any(isinstance(v, torch.Tensor) for v in values):
        return torch.tensor(values, dtype=torch.float64)
    return torch.stack([torch.as_tensor(v, dtype=torch.float64).reshape(()) for v in values])


def differentiated(x) -> bool:
    """A tensor carrying a derivative: reverse mode (requires_grad) or a forward-mode tangent."""
    return isinstance(x, torch.Tensor) and (x.requires_grad or fwAD.unpack_dual(x).tangent is not None)


def compile_program(
    description,
    *,
    repetitions: int = 1,
    record: str = "all",
    states: int | None = None,
    complex_states: bool = False,
    checkpoint_stride: int = 4,
) -> Program:
    """Compile `description` for the kernels.

    `complex_states=True` forces the complex path (the caller sets it when tissue asks for phase physics:
    B0, B1phase or v). Otherwise the real path is taken when every rotating pulse shares one phase axis
    modulo half turns and no RF phase is differentiated.
    """
    if record not in _RECORD_MODES:
        raise ValueError(f"record must be one of {_RECORD_MODES}, got {record!r}")
    if not isinstance(repetitions, int) or isinstance(repetitions, bool) or repetitions < 1:
        raise ValueError(f"repetitions must be an integer >= 1, got {repetitions!r}")
    if states is None:
        states = default_states(description, repetitions)
    if not isinstance(states, int) or isinstance(states, bool) or states < 1:
        raise ValueError(f"states must be an integer >= 1 (EPG orders), got {states!r}")
    if not isinstance(checkpoint_stride, int) or checkpoint_stride < 1:
        raise ValueError(f"checkpoint_stride must be an integer >= 1, got {checkpoint_stride!r}")

    raster = description.rf_raster_time_s
    kept, times, actions, records, flips, phases, samples = [], [], [], [], [], [], []
    sats, freqs = [], []
    rotate_phases = []  # (phase value, differentiable?) of every rotating pulse
    for index, event in enumerate(description.events):
        bits = int(event.action) & _WINDING | int(event.action) & int(EventAction.SPOIL_AFTER)
        slot, flip, phase, sat, freq = -1, 0.0, 0.0, 0.0, 0.0
        if event.type == EventType.RF:
            if event.rf_use == RfUse.INVERSION:
                bits |= nat.INVERSION
            else:
                bits |= nat.ROTATE
                definition = description.rf_definitions[event.rf_definition_id]
                flip, extra = definition.signed_flip(event.rf_amplitude_hz, rf_raster_time_s=raster)
                phase = event.rf_phase_rad + extra if not _is_zero(extra) else event.rf_phase_rad
                rotate_phases.append(phase)
                sat = definition.saturation(rf_raster_time_s=raster)
                freq = event.rf_frequency_hz
        elif event.type == EventType.ADC:
            phase = event.adc_phase_rad
            if _keep_sample(event, record):
                slot = len(samples)
                samples.append(index)
                bits |= nat.RECORD
        elif bits == 0:
            continue  # a WAIT without action only marks time
        kept.append(index)
        times.append(event.timestamp_us)
        actions.append(bits)
        records.append(slot)
        flips.append(flip)
        phases.append(phase)
        sats.append(float(sat))
        freqs.append(freq)
    if not kept:  # nothing happens: keep one inert event so the program is well formed
        times, actions, records, flips, phases, sats, freqs = [0.0], [0], [-1], [0.0], [0.0], [0.0], [0.0]

    t_us = _as_f64(times)
    dt_s = torch.diff(t_us, prepend=t_us.new_zeros(1)) * 1e-6
    tr_us = torch.as_tensor(description.tr_duration_us, dtype=torch.float64).reshape(1)
    dt_wrap_s = (tr_us - t_us[-1:] + t_us[:1]) * 1e-6
    action = np.asarray(actions, dtype=np.int32)
    differentiable_dt = differentiated(dt_s)
    nonzero = (dt_s.detach() != 0).numpy()
    nonzero[0] |= bool(dt_wrap_s.detach()[0] != 0) and repetitions > 1
    action[nonzero | differentiable_dt] |= nat.INTERVAL

    flip_rad = _as_f64(flips)
    phase_rad = _as_f64(phases)
    path, axis = nat.PATH_COMPLEX, 0.0
    if not complex_states:
        axis_ok, axis, signs = _common_axis(rotate_phases)
        if axis_ok:
            path = nat.PATH_REAL
            rotating = (action & nat.ROTATE) != 0
            sign = torch.ones(len(actions), dtype=torch.float64)
            sign[torch.from_numpy(rotating)] = torch.tensor(signs, dtype=torch.float64)
            flip_rad = flip_rad * sign
            # ADC phases become relative to the axis; RF phases are not read on the real path.
            phase_rad = torch.where(torch.from_numpy((action & nat.RECORD) != 0), phase_rad - axis, phase_rad)

    geometry_dk = 0.0
    voxel = 0.0 if description.voxel_size_m is None else float(description.voxel_size_m)
    if description.crusher_dephasing_rad and description.voxel_size_m is not None:
        geometry_dk = float(description.crusher_dephasing_rad) / voxel
    return Program(
        action=action,
        record=np.asarray(records, dtype=np.int32),
        dt_s=dt_s,
        dt_wrap_s=dt_wrap_s,
        flip_rad=flip_rad,
        phase_rad=phase_rad,
        num_repetitions=repetitions,
        num_samples=len(samples),
        num_states=states,
        path=path,
        crusher_dk_rad_per_m=geometry_dk,
        voxel_size_m=voxel,
        sample_events=samples,
        sat_per_rad2=np.asarray(sats, dtype=np.float64),
        rf_hz=np.asarray([_float_values(f) for f in freqs], dtype=np.float64),
        axis_phase_rad=axis,
    )


def _float_values(x) -> float:
    if isinstance(x, torch.Tensor):
        if x.numel() != 1:
            raise NotImplementedError("RF frequency offsets with a train axis are not supported by the engine yet")
        return float(x.detach())
    return float(x)


def _is_zero(x) -> bool:
    return not isinstance(x, torch.Tensor) and float(x) == 0.0


def _common_axis(phases: list) -> tuple[bool, float, list]:
    """Whether all pulse phases lie on one axis modulo half turns; the axis and each pulse's sign."""
    if any(differentiated(p) for p in phases):
        return False, 0.0, []
    values = [float(p) for p in phases]
    if not values:
        return True, 0.0, []
    axis = values[0]
    signs = []
    for v in values:
        turns = (v - axis) / math.pi
        n = round(turns)
        if abs(turns - n) > 1e-9:
            return False, 0.0, []
        signs.append(-1.0 if n % 2 else 1.0)
    return True, axis, signs
