"""Mixins of the shipped event trains: a loop over trains, and the RF definition of sampled pulses.

`TrainLoop`
    The engine takes event values with a train axis itself (one program per train, walked and compiled
    on every call), but a description has one timeline. A simulator splits its protocol into one call
    per train when the trains differ in timing (FSE's array `TR`, MRF's 2-D `TR`), when one structure
    per train can be resolved once and reused (FSE's `(trains, ETL)` flips: later calls skip the layout),
    or when the trains join along the samples (CEST, one simulation per offset). It says how in
    `trains(protocol, tissue)`, and the mixin runs the engine once per train and joins the results:
    stacked first (`train_axis = 0`) or concatenated along the samples (`train_axis = -1`).
    The mixin wraps the public `simulate` and `jacobian` (one `Simulator` call per train; each engine run
    serves one forward-mode pass), so `evaluate` stays the plain engine run. Calls whose protocol holds
    no value of `train_dims` dimensions pass through at the cost of a look at those values.
    `train_rows` splits the protocol values that carry a leading train axis.

`SampledPulses`
    Pulses played sample by sample need definition 0 to be a rectangle one dwell long, for the
    semisolid saturation to follow the waveform (`_waveforms.sampled_definition`). The mixin puts that
    definition into every description the simulator composes (engine runs and `describe()` alike)
    unless a `pulse=` is given, and only when `plays_sampled(args)` says the layout plays such pulses.
"""

from __future__ import annotations

import inspect

import numpy as np
import torch

from .._arrays import first_library, to_library, to_tensor
from ..sequence.events import trusted_event
from ..sequence.operators import Delay, Operator, SampledPulse, Spoil
from ._layout import number, rad, seconds
from ._waveforms import hyperbolic_secant, sampled_definition, sinc_pulse

__all__ = ["TrainLoop", "SampledPulses", "layout_default", "train_count", "train_rows"]


def layout_default(simulator, name: str):
    """The default of `layout`'s keyword `name` (the value a protocol left unset takes)."""
    return inspect.signature(type(simulator).layout).parameters[name].default


def train_count(values: dict, dims: dict) -> int | None:
    """The number of trains of `values`: the leading axis of each tensor `values[name]` of `dims[name]`
    dimensions, or None when there is none. A value with one row is shared. Raises ValueError naming
    each count when they disagree."""
    counts = {name: value.shape[0] for name, value in values.items()
              if isinstance(value, torch.Tensor) and value.dim() == dims.get(name)}
    if not counts:
        return None
    trains = max(counts.values())
    if any(c not in (1, trains) for c in counts.values()):
        raise ValueError(f"the train axes disagree: {', '.join(f'{k} has {v}' for k, v in counts.items())} trains; "
                         "give the same number of trains (or one) for each")
    return trains


def train_rows(protocol: dict, dims: dict) -> list[dict] | None:
    """Per-train protocol overrides: row k of each value that `train_count` counts (row 0 of a value with
    one row), or None when no value has a train axis."""
    trains = train_count(protocol, dims)
    if trains is None:
        return None
    axes = {name: value for name, value in protocol.items()
            if isinstance(value, torch.Tensor) and value.dim() == dims.get(name)}
    return [{name: value[k if value.shape[0] > 1 else 0] for name, value in axes.items()} for k in range(trains)]


def _ndim(value) -> int:
    """The number of dimensions of a protocol value as given (number, list, or any array)."""
    if isinstance(value, (int, float)):
        return 0
    ndim = getattr(value, "ndim", None)
    return np.ndim(value) if ndim is None else ndim


class TrainLoop:
    """Mixin (before `Simulator` in the bases): one engine run per train, joined (see the module doc)."""

    train_axis = 0
    #: Protocol name -> the least number of dimensions with which its value may hold several trains. A call
    #: with no such value is passed on untouched: `trains` and the protocol conversion it needs are skipped.
    train_dims: dict = {}

    def trains(self, protocol: dict, tissue: dict) -> list[dict] | None:
        """Per-train protocol overrides of a converted protocol, or None for a single train.

        `tissue` holds the tissue values by public name (those given; fixed ones included).
        """
        return None

    def simulate(self, **values):
        parts = self._parts(values)
        if parts is None:
            return super().simulate(**values)
        library = first_library(values) or first_library(self._protocol, self._bound)
        return to_library(self._join([to_tensor(super(TrainLoop, self).simulate(**{**values, **part}))
                                      for part in parts]), library)

    def jacobian(self, diff, **values):
        parts = self._parts(values)
        if parts is None:
            return super().jacobian(diff, **values)
        # The caller's library, decided before the per-train values replace the arrays.
        library = first_library(values) or first_library(self._protocol, self._bound)
        signals, jacobians = [], []
        for part in parts:
            signal, jac = super().jacobian(diff, **{**values, **part})
            signals.append(to_tensor(signal))
            jacobians.append(to_tensor(jac))
        return to_library((self._join(signals), self._join(jacobians)), library)

    def _parts(self, values: dict) -> list[dict] | None:
        for name, dims in self.train_dims.items():
            value = values.get(name)
            if value is None:  # not given, or given as None: the fixed value applies
                value = self._protocol.get(name)
            if value is not None and _ndim(value) >= dims:
                return self.trains(self.played(**values), {**self._bound, **values})
        return None

    def _join(self, results: list) -> torch.Tensor:
        if self.train_axis == 0:
            return torch.stack(results, 0)
        return torch.cat(results, -1)


def _scaled(pulse: Operator, scale: torch.Tensor) -> Operator:
    """`pulse` with every RF amplitude times `scale`: a `(trains,)` scale gives `(trains,)` event values, the
    train axis (a waveform holds one train)."""

    def emit(start_s):
        return tuple(trusted_event(e.type, e.timestamp_us, (*e.params[:2], e.params[2] * scale, *e.params[3:]),
                                   e.action) for e in pulse.emit(start_s))

    return Operator(emit, pulse.duration_s, name=pulse.name)


class SampledPulses:
    """Mixin (before `Simulator` in the bases): definition 0 is one dwell-long rectangle (module doc)."""

    def plays_sampled(self, args: dict) -> bool:
        """Whether the layout of `args` plays pulses sample by sample."""
        return True

    def _compose(self, args: dict, settings: dict):
        if settings.get("pulse") is None and self.plays_sampled(args):
            dwell = number("dwell", args.get("dwell", layout_default(self, "dwell")))
            settings = {**settings, "pulse": sampled_definition(dwell)}
        return super()._compose(args, settings)

    def excitation_pulse(self, flip_rad, phase_rad, *, duration_ms: float, bandwidth_time: float, dwell_ms: float):
        """An excitation of `duration_ms`: the `excitation` slot's instantaneous pulse when it is 0, else a
        windowed sinc played sample by sample (`_waveforms.sinc_pulse`). It occupies `duration_ms`."""
        if duration_ms == 0:
            return self.operators.excitation(flip_rad, phase_rad)
        if isinstance(flip_rad, torch.Tensor) and flip_rad.dim() == 1:  # one flip per train (`per_shot`)
            unit = self.excitation_pulse(1.0, phase_rad, duration_ms=duration_ms, bandwidth_time=bandwidth_time,
                                         dwell_ms=dwell_ms)
            return _scaled(unit, flip_rad)
        waveform = sinc_pulse(flip_rad, duration_ms=duration_ms, bandwidth_time=bandwidth_time, dwell_ms=dwell_ms)
        return SampledPulse(waveform, dwell_ms * 1e-3, phase_rad=phase_rad)

    def inversion_block(self, inversion, *, duration_ms: float, phase_deg, spoiler_ms, dwell_ms: float) -> list:
        """The optional inversion of FLASH and TrueFISP, then `spoiler_ms` closed by a spoiler gradient.

        `None`: nothing. `"ideal"`: the `inversion` slot (Z -> -inv_efficiency Z) in the middle of
        `duration_ms`, so that both kinds take the same time. `"adiabatic"`: the hyperbolic secant
        (`_waveforms.hyperbolic_secant`) played sample by sample at phase `phase_deg`.
        """
        if inversion is None:
            return []
        if inversion == "ideal":
            half_s = duration_ms * 1e-3 / 2
            ops = [self.operators.delay(half_s) @ self.operators.inversion() @ self.operators.delay(half_s)]
        elif inversion == "adiabatic":
            ops = [SampledPulse(hyperbolic_secant(duration_ms, dwell_ms), dwell_ms * 1e-3, phase_rad=rad(phase_deg))]
        else:
            raise ValueError(f"inversion must be None, 'ideal' or 'adiabatic', got {inversion!r}")
        return ops + [Delay(seconds(spoiler_ms)) @ Spoil()]
