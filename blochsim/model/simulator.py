"""The `Simulator` base class: argument routing, the public calls, descriptions and `from_description`.

The structure cache and affine value resolution (`structure.StructureCache`), engine dispatch
(`execution.EngineDispatch`) and the Jacobians (`jacobians.Jacobians`) are mixins in their own modules;
the package docstring says how calls are resolved.
"""

from __future__ import annotations

import copy
import dataclasses
import inspect
from collections.abc import Mapping
from types import MappingProxyType

import torch

from .._arrays import (
    as_number,
    first_library,
    library_of,
    to_library,
    to_tensor,
)
from .._errors import check_device, missing_property, unknown_name
from .._sharding import route as _route
from ..engine.program import check_shims
from ..engine.vmap import loop_under_vmap
from ..sequence.description import SequenceDescription
from ..sequence.operators import (
    compose,
)
from .arguments import _check_protocol, _check_setting, _short
from .execution import EngineDispatch
from .jacobians import Jacobians
from .placement import on_host
from .reemit import _reemit
from .structure import StructureCache, _Cache
from .vocabulary import (
    _CONSTRUCTOR_ONLY,
    CLASS,
    DTYPES,
    PUBLIC_FIELDS,
    RUN_SETTINGS,
    SLOTS,
    UNITS,
    EventOperators,
    SpinPhysics,
)

__all__ = ["Simulator"]


def _keyword_names(function, skip: int) -> tuple[tuple, tuple, bool]:
    """(names, required names, takes **kwargs) of `function`'s parameters after the first `skip`."""
    params = list(inspect.signature(function).parameters.values())[skip:]
    names = tuple(p.name for p in params if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD))
    required = tuple(p.name for p in params
                     if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty)
    return names, required, any(p.kind == p.VAR_KEYWORD for p in params)


# -- Simulator --------------------------------------------------------------------------------------
class Simulator(StructureCache, EngineDispatch, Jacobians):
    """Base class of every simulator: subclass it and implement `layout` or `evaluate`.

    `layout(self, *, <protocol>) -> list[Operator | (offset_s, Operator)]` returns one repetition built
    from `self.operators.<slot>(...)`; protocol values arrive as torch tensors (arrays, float64) or Python
    numbers (scalars). `evaluate(self, properties, **sequence)` returns the signal of a closed form from
    the given properties (by public name, float tensors) and the protocol and run settings as keywords;
    the default `evaluate` of an event train runs the engine, and a subclass may post-process
    `super().evaluate(...)`.

    Class attributes (a call may override the run settings): `model`, `states`, `repetitions`, `record`,
    `execution`, `across_slice`, `crusher_dephasing_rad`, `voxel_size_m`, the handler slots,
    `structural` (protocol names passed to `layout` as given and keyed by value, e.g. `("nshots",)`;
    Python ints, floats and strings always are) and `post_rotation_rad`: the engine's samples are
    multiplied by `exp(i post_rotation_rad)` (MRF: pi/2, the +i of the incumbent's convention), applied as an offset of
    the ADC demodulation phases so it costs nothing per sample; `from_description` instances skip it.
    """

    model = SpinPhysics()
    states = None
    repetitions = 1
    record = "all"
    execution = None
    across_slice = None
    crusher_dephasing_rad = 0.0
    voxel_size_m = None
    structural: tuple = ()
    post_rotation_rad = 0.0

    _event_train = False
    _own_evaluate = False  # a subclass's evaluate post-processes the engine's (Jacobians takes it per column)
    _protocol_names: tuple = ()
    _evaluate_settings: tuple | None = None  # run settings a closed form's evaluate takes (None: all)
    _variables: tuple = ()
    _required: tuple = ()
    _open_protocol = False
    _vmap_attributes = ("_protocol", "_bound")  # fixed values that a vmap batch may hold (engine.vmap)

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        slots = {name: cls.__dict__[name] for name in SLOTS if name in cls.__dict__}
        for name in slots:
            delattr(cls, name)
        if slots and "model" not in cls.__dict__:
            cls.model = dataclasses.replace(cls.model, operators=dataclasses.replace(cls.model.operators, **slots))
        cls._event_train = cls.layout is not Simulator.layout
        cls._own_evaluate = cls.evaluate is not Simulator.evaluate
        if cls._event_train:
            cls._variables, cls._required, cls._open_protocol = _keyword_names(cls.layout, 1)
        elif cls.evaluate is not Simulator.evaluate:
            names, required, open_ = _keyword_names(cls.evaluate, 2)
            cls._variables = ()
            cls._protocol_names = tuple(n for n in names if n not in RUN_SETTINGS)
            cls._required = tuple(n for n in required if n not in RUN_SETTINGS)
            cls._open_protocol = open_ and not cls._protocol_names
            cls._evaluate_settings = None if open_ else tuple(n for n in names if n in RUN_SETTINGS)

    # -- construction -----------------------------------------------------------------------------
    def __init__(self, *, model=None, states=None, repetitions=None, record=CLASS, execution=CLASS, pulse=None,
                 shims=None, across_slice=CLASS, resolve=True, crusher_dephasing_rad=CLASS, voxel_size_m=CLASS,
                 **protocol) -> None:
        cls = type(self)
        if cls is Simulator:
            raise TypeError("Simulator() cannot be instantiated: subclass it and implement layout() (an event "
                            "train) or evaluate() (a closed form)")
        if not cls._event_train and cls.evaluate is Simulator.evaluate:
            raise TypeError(f"{cls.__name__} implements neither layout() nor evaluate(): implement one of them")
        if model is not None and not isinstance(model, SpinPhysics):
            raise TypeError(f"model must be a SpinPhysics, got {model!r}")
        self._setup(model or cls.model, resolve=bool(resolve),
                    crusher=cls.crusher_dephasing_rad if crusher_dephasing_rad is CLASS else crusher_dephasing_rad,
                    voxel=cls.voxel_size_m if voxel_size_m is CLASS else voxel_size_m)
        given = {"states": states, "repetitions": repetitions, "pulse": pulse, "shims": shims}
        for name, value in (("record", record), ("execution", execution), ("across_slice", across_slice)):
            if value is not CLASS:
                given[name] = value
        self._absorb({**{k: v for k, v in given.items() if v is not None}, **protocol}, "()")

    def _setup(self, model, *, resolve, crusher, voxel, stored=None) -> None:
        self._model = model
        self._resolve = resolve
        self._crusher_dephasing_rad = float(crusher)
        self._voxel_size_m = None if voxel is None else float(voxel)
        self._settings, self._protocol, self._bound = {}, {}, {}
        self._stored = stored
        self._cache = _Cache()
        self._fixed_library = None
        self._routes = self._route_table()
        self._field_map = {name: model.field_of(name) for name, kind in self._routes.items() if kind == "t"}
        self._names = {f: name for name, f in self._field_map.items() if f is not None}

    def _route_table(self) -> dict:
        """name -> 'p' (protocol), 't' (tissue) or 's' (run setting)."""
        routes = {name: "s" for name in RUN_SETTINGS}
        if self._stored is None:
            names = self._variables if self._event_train else self._protocol_names
            routes.update({name: "p" for name in names})
        tissue = list(self._model.properties)
        if self._event_train or self._stored is not None:
            tissue += list(PUBLIC_FIELDS)
        routes.update({name: "t" for name in tissue if name not in routes})
        return routes

    def _absorb(self, values: dict, where: str) -> None:
        """Fix `values` (protocol, tissue, run settings) on this instance."""
        for name, value in values.items():
            if value is None:
                continue
            kind = self._kind(name, where)
            if kind == "p":
                self._protocol[name] = value
            elif kind == "t":
                self._bound[name] = value
            else:
                self._settings[name] = _check_setting(name, value)
        self._fixed_library = first_library(self._protocol, self._bound)

    def _kind(self, name: str, where: str) -> str:
        kind = self._routes.get(name)
        if kind is not None:
            return kind
        simulator = type(self).__name__
        if self._open_protocol and name not in PUBLIC_FIELDS and name not in ("nstates",) + _CONSTRUCTOR_ONLY:
            return "p"
        if name == "nstates":
            raise TypeError(f"{simulator}{where} got 'nstates': the number of EPG orders is spelled 'states' "
                            f"here (states=...); 'nstates' is the engine's name")
        if name in _CONSTRUCTOR_ONLY:
            raise TypeError(f"{simulator}{where}: {name!r} is accepted by the constructor only")
        if name in PUBLIC_FIELDS and not self._event_train:
            modeled = ", ".join(self._model.properties) or "none"
            raise TypeError(f"{simulator} is a closed form and does not model {name!r}; it models: {modeled}")
        accepted = list(self._routes)
        own = [n for n, k in self._routes.items() if k == "p" or n in self._model.properties]
        listing = ", ".join(own) + (", every public tissue property" if self._event_train else "") + \
            f"; run settings: {', '.join(RUN_SETTINGS)}"
        raise unknown_name(name, simulator, accepted, where=where, listing=listing)

    # -- read-only views --------------------------------------------------------------------------
    @property
    def operators(self) -> EventOperators:
        return self._model.operators

    @property
    def variables(self) -> tuple:
        """The `layout` keyword names (`()` for closed forms)."""
        return self._variables if self._stored is None else ()

    @property
    def exposes(self) -> tuple:
        """The declared property names."""
        return tuple(self._model.properties)

    @property
    def accepts(self) -> tuple:
        """`exposes`, plus every public tissue name (PUBLIC_FIELDS) for event trains."""
        return tuple(name for name, kind in self._routes.items() if kind == "t")

    @property
    def protocol(self) -> Mapping:
        return MappingProxyType(dict(self._protocol))

    @property
    def bound(self) -> Mapping:
        return MappingProxyType(dict(self._bound))

    @property
    def rf_raster_time_s(self) -> float:
        return self._stored.rf_raster_time_s if self._stored is not None else 1e-6

    def __repr__(self) -> str:
        fixed = ", ".join(f"{k}={_short(v)}" for k, v in {**self._protocol, **self._bound, **self._settings}.items())
        return f"{type(self).__name__}({fixed})"

    # -- copies -----------------------------------------------------------------------------------
    def _copy(self) -> Simulator:
        new = copy.copy(self)
        new._settings, new._protocol, new._bound = dict(self._settings), dict(self._protocol), dict(self._bound)
        return new

    def bind(self, **values) -> Simulator:
        """A copy with more fixed values: protocol, tissue and run settings (pulse, states, device, ...)."""
        new = self._copy()
        new._absorb(values, ".bind()")
        return new

    def to(self, device) -> Simulator:
        """A copy whose fixed protocol and tissue tensors live on `device` (also its default device)."""
        check_device(device)
        new = self._copy()
        for fixed in (new._protocol, new._bound):
            for name, value in fixed.items():
                if isinstance(value, torch.Tensor):
                    fixed[name] = value.to(device)
        new._settings["device"] = device
        return new

    # -- the protocol -----------------------------------------------------------------------------
    def layout(self, **protocol) -> list:
        raise NotImplementedError(f"{type(self).__name__} is not an event train: it has no layout()")

    def repetition_s(self, played_s, **protocol):
        """Duration of one repetition in s: `played_s` (the layout's end) unless a subclass says otherwise."""
        return played_s

    def played(self, **sequence) -> dict:
        """The effective protocol: the fixed protocol with `sequence` over it, arrays as torch tensors."""
        protocol, _, _, _ = self._gather(sequence, ".played()")
        return self._convert_protocol(protocol)

    def describe(self, **protocol) -> SequenceDescription:
        """The composed `SequenceDescription`; arguments not given come from the fixed protocol.

        For `from_description` instances, the stored (re-emitted) description.
        """
        if self._stored is not None:
            if protocol:
                raise TypeError(f"{type(self).__name__} was built from a description and takes no protocol; "
                                f"got {sorted(protocol)}")
            return self._stored
        if not self._event_train:
            raise TypeError(f"{type(self).__name__} is a closed form: it has no event train to describe")
        merged, _, settings, _ = self._gather(protocol, ".describe()")
        args = self._convert_protocol(merged)
        self._check_required(args)
        return self._compose(on_host(args), settings)

    def _compose(self, args: dict, settings: dict) -> SequenceDescription:
        _check_protocol(args, self.structural, finite=True)  # those on a GPU too, now on the host
        events, end_s = compose(*self.layout(**args))
        tr_s = self.repetition_s(end_s, **args)
        definitions = dict(self._model.definitions)
        pulse = settings.get("pulse")
        if pulse is not None:
            definitions[0] = pulse
        return SequenceDescription(0, tr_s * 1e6, events, definitions, dict(settings.get("shims") or {}),
                                   self._crusher_dephasing_rad, self._voxel_size_m)

    def _check_required(self, args: dict) -> None:
        for name in self._required:
            if name not in args:
                raise missing_property(name, type(self).__name__, UNITS.get(name))

    # -- calls ------------------------------------------------------------------------------------
    def _gather(self, values: dict, where: str):
        """(protocol, tissue, settings, output library) of a call over the fixed values."""
        protocol, tissue, settings = dict(self._protocol), dict(self._bound), dict(self._settings)
        library = None
        routes = self._routes
        for name, value in values.items():
            if value is None:
                continue
            kind = routes.get(name) or self._kind(name, where)
            if library is None:
                library = library_of(value)
            if kind == "p":
                protocol[name] = value
            elif kind == "t":
                tissue[name] = value
            else:
                settings[name] = _check_setting(name, value)
        return protocol, tissue, settings, library or self._fixed_library

    def _convert_protocol(self, protocol: dict) -> dict:
        """Arrays as torch tensors (float64 for event trains), NumPy scalars as Python numbers."""
        event_train = self._event_train
        out = {}
        for name, value in protocol.items():
            value = as_number(value)
            if name in self.structural:
                out[name] = value
            elif isinstance(value, torch.Tensor):
                out[name] = value.to(torch.float64) if event_train and value.dtype != torch.float64 else value
            elif isinstance(value, (list, tuple)) or library_of(value) is not None:
                out[name] = to_tensor(value, dtype=torch.float64 if event_train else None, name=name)
            else:
                out[name] = value
        _check_protocol(out, self.structural, finite=event_train, host_only=True)
        return out

    @staticmethod
    def _convert_tissue(tissue: dict, settings: Mapping | None = None) -> dict:
        """Tissue values as float tensors: Python numbers float32, float64 under `dtype=` float64."""
        number = DTYPES.get(settings.get("dtype"), torch.float32) if settings else torch.float32
        out = {}
        for name, value in tissue.items():
            value = as_number(value)
            if isinstance(value, torch.Tensor):
                out[name] = value if value.is_floating_point() or value.is_complex() else value.to(number)
            elif isinstance(value, (bool, int, float)):
                out[name] = torch.tensor(float(value), dtype=number)
            else:
                out[name] = to_tensor(value, name=name)
        return out

    def _sequence(self, protocol: dict, settings: dict) -> dict:
        if not self._event_train and self._evaluate_settings is not None:
            if "dtype" in settings and "dtype" not in self._evaluate_settings:
                raise TypeError(f"{type(self).__name__} is a closed form: it computes in the promoted dtype of its "
                                f"inputs (float64 arrays give float64), so it takes no dtype= "
                                f"(got {settings['dtype']}); dtype is a setting of event trains")
            settings = {k: v for k, v in settings.items() if k in self._evaluate_settings}
        return {**self._convert_protocol(protocol), **settings}

    @loop_under_vmap
    def simulate(self, **values):
        """The signal: tissue properties, protocol and run settings by name.

        Event trains return complex64 of shape `(*voxel_shape, samples)`, computed by the float32 kernels;
        `dtype=torch.float64` (or `torch.complex128`) runs the float64 kernels and returns complex128.
        Differentiable in reverse mode with respect to every torch tensor given (flips, phases, timings,
        tissue maps).
        """
        protocol, tissue, settings, library = self._gather(values, ".simulate()")
        # Split over the ranks of a distributed() block or over several devices (None: run here, whole).
        split = _route(self, Simulator.simulate, None, protocol, tissue, settings, library,
                       engine=self._event_train or self._stored is not None)
        if split is not None:
            return split
        properties = self._convert_tissue(tissue, settings)
        if self._stored is not None:
            out = self._engine(properties, {}, settings)
        else:
            out = self.evaluate(properties, **self._sequence(protocol, settings))
        return to_library(out, library)

    def evaluate(self, properties: Mapping, **sequence):
        """The default of an event train: run the engine on the layout."""
        if not self._event_train:
            raise NotImplementedError(f"{type(self).__name__} must implement evaluate() (a closed form) or "
                                      "layout() (an event train)")
        settings = {name: sequence.pop(name) for name in RUN_SETTINGS if name in sequence}
        return self._engine(properties, sequence, settings)

    @loop_under_vmap
    def jacobian(self, diff, **values):
        """(signal, J) by forward mode, all voxels at once.

        `diff` a name gives J of shape `(*voxel, samples)`; a sequence of names, even of one, gives
        `(*voxel, P, samples)`. Raises ValueError for a name the call did not give, for a protocol
        argument, and for a non-float property.
        """
        single = isinstance(diff, str)
        names = (diff,) if single else tuple(diff)
        if not names:
            raise ValueError("jacobian needs at least one property name, e.g. jacobian(('T1', 'T2'), ...)")
        protocol, tissue, settings, library = self._gather(values, ".jacobian()")
        for name in names:
            self._check_differentiable(name, protocol, tissue)
        split = _route(self, Simulator.jacobian, diff, protocol, tissue, settings, library,
                       engine=self._event_train or self._stored is not None)
        if split is not None:
            return split
        properties = self._convert_tissue(tissue, settings)
        if self._event_train or self._stored is not None:
            signal, jac = self._engine_jacobian(names, properties, protocol, settings)
            axis = -2
        else:
            signal, jac, axis = self._closed_form_jacobian(names, properties, self._sequence(protocol, settings))
        if single:
            jac = jac.select(axis, 0)
        return to_library((signal, jac), library)

    # -- from a description -----------------------------------------------------------------------
    @classmethod
    def from_description(cls, description: SequenceDescription, model: SpinPhysics | None = None, **settings):
        """A simulator of a stored stream re-emitted through the class's handlers.

        Each RF event goes, at its own timestamp, to the slot its `RfUse` names, with whichever of
        `flip_rad, phase_rad, definition_id, frequency_hz, offset_hz, shim_id` the handler accepts; ADC
        events go to `readout(phase_rad, role=, is_echo=)`; WAIT events are dropped. The class's own
        post-processing of `evaluate` is never applied. `settings` are run settings and tissue values.
        """
        if cls is Simulator and model is None:
            raise ValueError("Simulator.from_description needs model=SpinPhysics(...) (the handlers that supply "
                             "crushers and spoiling); or call it on the concrete class, e.g. "
                             "MRFSimulator.from_description(d)")
        if not isinstance(description, SequenceDescription):
            raise TypeError(f"description must be a SequenceDescription, got {type(description).__name__}")
        model = model or cls.model
        check_shims(description)  # a shim the description does not define, named by its own event index
        stored = _reemit(description, model.operators)
        self = cls.__new__(cls)
        self._setup(model, resolve=True, crusher=description.crusher_dephasing_rad, voxel=description.voxel_size_m,
                    stored=stored)
        self._absorb(settings, ".from_description()")
        return self

    @classmethod
    def from_pulseq(cls, source, *, tr_index: int | None = None, model: SpinPhysics | None = None, **settings):
        """A simulator of one repetition of a Pulseq 1.4/1.5 file: `read_pulseq_description`, then
        `from_description`. `source` is a `.seq` path, its bytes, a stream or a pypulseq `Sequence`;
        `tr_index` picks the repetition (see `read_pulseq_description`). `subsequence_index`,
        `crusher_dephasing_rad` and `voxel_size_m` go to the reader; the other `settings` (run settings,
        tissue values) to `from_description`.
        """
        from ..sequence import read_pulseq_description

        reader = {name: settings.pop(name) for name in ("subsequence_index", "crusher_dephasing_rad", "voxel_size_m")
                  if name in settings}
        return cls.from_description(read_pulseq_description(source, tr_index=tr_index, **reader), model, **settings)


