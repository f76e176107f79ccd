"""Mixins of the shipped event trains: a loop over trains, and the RF definition of sampled pulses.

`TrainLoop`
    The engine takes one train per run (a protocol value with a leading train axis raises
    NotImplementedError there). A simulator whose protocol may hold several trains (FSE with a
    `(trains, ETL)` flip or an array `TR`; CEST with one simulation per offset) says how to split it in
    `trains(protocol, tissue)`, and the mixin runs the engine once per train and joins the results: stacked
    first (`train_axis = 0`, API.md 1.4) or concatenated along the samples (`train_axis = -1`).
    `simulate` and reverse mode go through `evaluate`; `jacobian` loops over `Simulator.jacobian`, so
    each engine run serves one forward-mode pass. Per-train post-processing goes in `evaluate_train`.

`SampledPulses`
    Pulses played sample by sample need definition 0 to be a rectangle one dwell long, for the
    semisolid saturation to follow the waveform (`_waveforms.sampled_definition`). The mixin puts that
    definition into every description the simulator composes (engine runs and `describe()` alike)
    unless a `pulse=` is given, and only when `plays_sampled(args)` says the layout plays such pulses.
"""

from __future__ import annotations

import inspect

import torch

from .._arrays import first_library, to_library, to_tensor
from ..model import RUN_SETTINGS
from ..sequence.operators import Delay, SampledPulse, Spoil
from ._layout import number, rad, seconds
from ._waveforms import hyperbolic_secant, sampled_definition, sinc_pulse

__all__ = ["TrainLoop", "SampledPulses", "layout_default"]


def layout_default(simulator, name: str):
    """The default of `layout`'s keyword `name` (the value a protocol left unset takes)."""
    return inspect.signature(type(simulator).layout).parameters[name].default


class TrainLoop:
    """Mixin (before `Simulator` in the bases): one engine run per train, joined (see the module doc)."""

    train_axis = 0

    def trains(self, protocol: dict, tissue: dict) -> list[dict] | None:
        """Per-train protocol overrides of a converted protocol, or None for a single train.

        `tissue` holds the tissue values by public name (those given; fixed ones included).
        """
        return None

    def evaluate_train(self, properties, **sequence):
        """The result of one train; subclasses post-process `super().evaluate_train(...)` here."""
        return super().evaluate(properties, **sequence)

    def evaluate(self, properties, **sequence):
        protocol = {name: value for name, value in sequence.items() if name not in RUN_SETTINGS}
        parts = self.trains(protocol, properties)
        if parts is None:
            return self.evaluate_train(properties, **sequence)
        return self._join([self.evaluate_train(properties, **{**sequence, **part}) for part in parts])

    def jacobian(self, diff, **values):
        parts = self.trains(self.played(**values), {**self.bound, **values})
        if parts is None:
            return super().jacobian(diff, **values)
        # The caller's library (API.md 1.3), decided before the per-train values replace the arrays.
        library = first_library(values) or first_library(self.protocol, self.bound)
        signals, jacobians = [], []
        for part in parts:
            signal, jac = super().jacobian(diff, **{**values, **part})
            signals.append(to_tensor(signal))
            jacobians.append(to_tensor(jac))
        return to_library((self._join(signals), self._join(jacobians)), library)

    def _join(self, results: list) -> torch.Tensor:
        if self.train_axis == 0:
            return torch.stack(results, 0)
        return torch.cat(results, -1)


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
