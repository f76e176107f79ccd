"""The public vocabulary of simulators: tissue names and units, run settings, handler slots, `EventOperators`
and its presets, and `SpinPhysics` (which names a model plays)."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import torch

from .._errors import nearest
from ..sequence.operators import (
    Delay,
    Excitation,
    FSEReadout,
    Inversion,
    Readout,
    Refocusing,
    Saturation,
    SPGRReadout,
    SSFPFidReadout,
    bSSFPReadout,
)
from ..sequence.rf import ideal_rf_definition
from ..sequence.tissue import TissueProperties

#: Public property name -> `TissueProperties` field.
PUBLIC_FIELDS = {
    "T1": "t1_ms",
    "T2": "t2_ms",
    "M0": "m0",
    "B1": "b1",
    "B1phase": "b1_phase_rad",
    "B0": "b0_hz",
    "inv_efficiency": "inversion_efficiency",
    "T2prime": "t2_prime_ms",
    "D": "diffusion_um2_per_ms",
    "v": "velocity_m_per_s",
    "bound_fraction": "bound_fraction",
    "bound_exchange": "bound_exchange_hz",
    "bound_T1": "t1_bound_ms",
    "bound_T2": "t2_bound_ms",
}
for _p in "BCDE":
    _x = _p.lower()
    PUBLIC_FIELDS.update({f"pool{_p}_fraction": f"pool_{_x}_fraction", f"pool{_p}_exchange": f"pool_{_x}_exchange_hz",
                          f"pool{_p}_T1": f"t1_pool_{_x}_ms", f"pool{_p}_T2": f"t2_pool_{_x}_ms",
                          f"pool{_p}_shift": f"pool_{_x}_shift_hz"})
del _p, _x

_UNITS = {"ms": ("T1", "T2", "T2prime", "bound_T1", "T2star", "fat_T1", "fat_T2star", "T1_blood", "ATT", "TR",
                 "TE", "TI", "ESP", "TM", "TRspgr", "TRmp2rage"),
          "Hz": ("B0", "bound_exchange", "chemshift"), "deg": ("flip", "phases", "exc_flip", "exc_phase"),
          "rad": ("B1phase",), "um^2/ms": ("D",), "m/s": ("v",)}
UNITS = {name: unit for unit, names in _UNITS.items() for name in names}

#: Run settings, accepted under these names by the constructor, `bind` and every call.
#: `dtype` is the event trains' precision (`DTYPES`).
RUN_SETTINGS = ("states", "repetitions", "record", "device", "execution", "pulse", "shims", "across_slice", "dtype")
#: The `dtype` run setting: what an event train computes in and returns. Default (not given): float32 kernels,
#: complex64 results.
DTYPES = {torch.float32: torch.float32, torch.complex64: torch.float32,
          torch.float64: torch.float64, torch.complex128: torch.float64}
_CONSTRUCTOR_ONLY = ("model", "resolve", "crusher_dephasing_rad", "voxel_size_m")
SLOTS = ("excitation", "refocusing", "inversion", "saturation", "preparation", "other", "readout", "delay")
RECORD_MODES = ("all", "acquired", "echo")
_CACHE_SIZE = 32


class _ClassDefault:
    """The `<class>` default of a constructor argument: the class attribute applies."""

    def __repr__(self) -> str:
        return "<class>"


CLASS = _ClassDefault()


# -- handler slots and the physics model ------------------------------------------------------------
@dataclass(frozen=True)
class EventOperators:
    """The handler of each event kind: any callable returning an `Operator`."""

    excitation: Any = Excitation
    refocusing: Any = Refocusing
    inversion: Any = Inversion
    saturation: Any = Saturation
    preparation: Any = Excitation
    other: Any = Excitation
    readout: Any = Readout
    delay: Any = Delay


BALANCED = EventOperators(readout=bSSFPReadout, refocusing=functools.partial(Refocusing, crushed=False))
UNBALANCED = EventOperators(readout=SSFPFidReadout)
SPOILED = EventOperators(readout=SPGRReadout)
REFOCUSED = EventOperators(readout=FSEReadout)

_TISSUE_FIELDS = tuple(f.name for f in dataclasses.fields(TissueProperties))


@dataclass(frozen=True, eq=False)
class SpinPhysics:
    """Declared properties, event handlers, pinned tissue values and RF definitions (frozen).

    `properties` maps `{public name: TissueProperties field | None}`; None means the value reaches
    `evaluate` but not the tissue. `fixed` pins tissue fields (`{"t2_ms": 100.0}`); a value the caller
    gives for the same property takes precedence. `definitions` maps RF definition ids to
    `RfDefinition`s; id 0 is the one every shipped operator plays.
    """

    properties: Mapping = field(default_factory=dict)
    operators: EventOperators = field(default_factory=EventOperators)
    fixed: Mapping = field(default_factory=dict)
    definitions: Mapping = field(default_factory=lambda: {0: ideal_rf_definition()})

    def __post_init__(self) -> None:
        for name in ("properties", "fixed", "definitions"):
            object.__setattr__(self, name, MappingProxyType(dict(getattr(self, name))))
        if not isinstance(self.operators, EventOperators):
            raise TypeError(f"operators must be an EventOperators, got {self.operators!r}")
        self.fields  # noqa: B018 - validates the name map
        for key in self.fixed:
            if key not in _TISSUE_FIELDS:
                raise ValueError(f"fixed pins {key!r}, which is not a TissueProperties field"
                                 f"{nearest(key, _TISSUE_FIELDS)}")

    @property
    def fields(self) -> dict:
        """`{public name: tissue field}` of the declared properties that reach the tissue (validated)."""
        out = {}
        for name, target in self.properties.items():
            if target is None:
                continue
            if target not in _TISSUE_FIELDS:
                raise ValueError(f"property {name!r} points at {target!r}, which is not a TissueProperties "
                                 f"field{nearest(target, _TISSUE_FIELDS)}")
            out[name] = target
        return out

    def field_of(self, name: str) -> str | None:
        """The tissue field of public property `name`: the declared one, else PUBLIC_FIELDS's."""
        if name in self.properties:
            return self.properties[name]
        return PUBLIC_FIELDS.get(name)

    def tissue(self, values: Mapping) -> TissueProperties:
        """A `TissueProperties` from `{public name: value}` over the pinned `fixed` fields."""
        fields = dict(self.fixed)
        for name, value in values.items():
            target = self.field_of(name)
            if target is not None:
                fields[target] = value
        for required, public in (("t1_ms", "T1"), ("t2_ms", "T2")):
            if required not in fields:
                raise TypeError(f"the tissue needs {public!r} ({required})")
        return TissueProperties(**fields)


# -- structure cache --------------------------------------------------------------------------------
