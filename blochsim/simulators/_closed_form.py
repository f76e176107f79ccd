"""Shared plumbing of the closed-form simulators: names, placement and the sample-axis rule.

A closed form subclasses `ClosedForm`, declares its tissue names in `model`, and implements
`evaluate(self, properties, *, <protocol>, device=None)` by calling `arrange` (which checks and lays out
the inputs), one function of `_formulas`, and `finish` (which returns the result to the tissue's device).

Shapes: the tissue properties broadcast against each other into `voxel_shape`; the protocol
arrays broadcast against each other into the sample shape, which is appended after the voxel shape, so
the result has shape `(*voxel_shape, *sample_shape)` and a scalar protocol gives no sample axis. `arrange`
achieves this by giving every tissue tensor as many trailing singleton axes as the sample shape has, which
is the layout the `_formulas` functions expect. Dtypes follow the formulas: the promoted dtype of the
inputs (float32 for Python numbers, float64 as soon as one input is float64).

Placement: work runs on `device=` when given, else where the tissue tensors are (the first
one off the CPU decides); the result returns to the tissue tensors' device.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

import torch

from .._arrays import broadcast_shapes
from .._errors import missing_property
from ..engine.tissue import FIELD_RANGES, Accepted, broadcast_error, check_values
from ..model import PUBLIC_FIELDS, UNITS, Simulator

__all__ = ["ClosedForm", "Arranged"]

#: The accepted range of every closed-form tissue name: the event trains' names as the engine
#: takes them, and the closed-form names. Checked before the tissue is laid out, so that a bad index is the
#: caller's. `range_of` adds the Lorentzian pool names.
RANGES = {
    **{public: FIELD_RANGES[field] for public, field in PUBLIC_FIELDS.items()},
    "T2star": Accepted.time("inf: no T2* decay"),
    "chemshift": Accepted.finite("Hz"),
    "fat_fraction": Accepted(0.0, False, "a fraction in [0, 1] (the fat share of the signal)", high=1.0),
    "fat_phase": Accepted.finite("deg"),
    "fat_T1": Accepted.time("inf: no T1 recovery"),
    "fat_T2star": Accepted.time("inf: no T2* decay"),
    "fat_inv_efficiency": Accepted.finite("fraction"),
    "CBF": Accepted(0.0, False, "a finite flow >= 0 ml/100 g/min"),
    "ATT": Accepted(0.0, True, "a time >= 0 ms, not NaN (inf: the label never arrives)"),
    "T1_blood": Accepted.time("inf: no T1 recovery"),
    "partition": Accepted(0.0, False, "a finite partition coefficient > 0 ml/g (it divides the flow)", low_open=True),
    "offset": Accepted.finite("signal units"),
    **{name: Accepted(0.0, False, "a finite diffusivity >= 0 um^2/ms (a diagonal entry of the tensor)")
       for name in ("Dxx", "Dyy", "Dzz")},
    **{name: Accepted.finite("um^2/ms") for name in ("Dxy", "Dxz", "Dyz")},
}
_POOL = re.compile(r"pool\d+_(amplitude|width|shift)")
_LORENTZIAN = Accepted.finite("the units of offsets; amplitude: a fraction")


def range_of(name: str) -> Accepted | None:
    """The accepted range of the closed-form tissue name `name`, or None for a name blochsim does not define."""
    return RANGES.get(name) or (_LORENTZIAN if _POOL.fullmatch(name) else None)

#: Units of the closed-form tissue names that `model.UNITS` does not list (for "needs 'CBF' (...)").
_UNITS = {"CBF": "ml/100 g/min", "partition": "ml/g", "B1": "fraction of nominal flip", "M0": "a.u.",
          **{name: "um^2/ms" for name in ("Dxx", "Dyy", "Dzz", "Dxy", "Dxz", "Dyz")}}


class Arranged:
    """The inputs of one closed-form call, laid out for a `_formulas` function.

    `tissue`: the properties given, each with `len(sample_shape)` trailing singleton axes, on `device`.
    `protocol`: the protocol values, tensors moved to `device` (numbers, strings, bools unchanged).
    `voxel_shape`, `sample_shape`: tuples. `home`: the device the result returns to.
    """

    __slots__ = ("tissue", "protocol", "voxel_shape", "sample_shape", "device", "home")

    def __init__(self, tissue, protocol, voxel_shape, sample_shape, device, home):
        self.tissue, self.protocol = tissue, protocol
        self.voxel_shape, self.sample_shape = voxel_shape, sample_shape
        self.device, self.home = device, home

    def finish(self, signal: torch.Tensor, sample_shape: tuple | None = None) -> torch.Tensor:
        """`signal` broadcast to `(*voxel_shape, *sample_shape)` and returned to the home device.

        `sample_shape` defaults to the one the protocol arrays gave (MOLLI and MP2RAGE build their own).
        The broadcast is a no-op unless a given property did not enter the formula.
        """
        samples = self.sample_shape if sample_shape is None else tuple(sample_shape)
        target = broadcast_shapes(signal.shape, (*self.voxel_shape, *samples))
        if tuple(signal.shape) != tuple(target):
            signal = signal.expand(target)
        return signal if signal.device == self.home else signal.to(self.home)


class ClosedForm(Simulator):
    """Base of the shipped closed forms: a `Simulator` whose subclasses implement `evaluate`.

    It adds to the base class the check of the required protocol with the documented message (the
    base class checks it for event trains only) and the helper `arrange`.
    """

    def _sequence(self, protocol: dict, settings: dict) -> dict:
        self._check_required(protocol)  # "SPGRSimulator needs 'TE' (ms): give it in the call, ..."
        return super()._sequence(protocol, settings)

    def arrange(self, properties: Mapping, protocol: Mapping, *, required: Iterable[str] = (),
                sample_names: Iterable[str] | None = None, sample_shape: tuple | None = None,
                device=None) -> Arranged:
        """Check and lay out one call's inputs (see the module docstring).

        `required`: tissue names that must be given (TypeError naming the three places to give them).
        `sample_names`: the protocol names whose array shapes make the sample shape (default: every
        tensor in `protocol`); `sample_shape` gives it outright instead. `device`: the run setting.
        """
        simulator = type(self).__name__
        for name in required:
            if name not in properties:
                raise missing_property(name, simulator, UNITS.get(name, _UNITS.get(name)))
        check_values(properties, {name: range_of(name) for name in properties})
        shapes = {name: tuple(value.shape) for name, value in properties.items()}
        try:
            voxel_shape = tuple(broadcast_shapes(*shapes.values())) if shapes else ()
        except ValueError:
            raise broadcast_error(shapes) from None

        home = None
        for value in properties.values():
            if home is None or value.device.type != "cpu":
                home = value.device
        if home is None:
            home = next((v.device for v in protocol.values() if isinstance(v, torch.Tensor)), torch.device("cpu"))
        work = torch.device(device) if device is not None else home

        if sample_shape is None:
            names = protocol if sample_names is None else tuple(sample_names)
            arrays = {name: tuple(protocol[name].shape) for name in names
                      if isinstance(protocol.get(name), torch.Tensor)}
            try:
                sample_shape = tuple(broadcast_shapes(*arrays.values())) if arrays else ()
            except ValueError:
                given = ", ".join(f"{name} {shape}" for name, shape in arrays.items())
                raise ValueError(f"{simulator}: the protocol arrays must broadcast against each other (NumPy "
                                 f"rules), their broadcast is the sample axis; got {given}") from None
        trailing = (1,) * len(sample_shape)
        tissue = {name: value.to(work).reshape(tuple(value.shape) + trailing) for name, value in properties.items()}
        moved = {name: value.to(work) if isinstance(value, torch.Tensor) else value
                 for name, value in protocol.items()}
        return Arranged(tissue, moved, voxel_shape, tuple(sample_shape), work, home)
