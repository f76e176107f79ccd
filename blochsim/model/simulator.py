"""The `Simulator` base class: argument routing, the structure cache and affine value resolution, engine
dispatch and Jacobians (the package docstring says how calls are resolved).
"""

from __future__ import annotations

import contextvars
import copy
import dataclasses
import inspect
from collections import OrderedDict
from collections.abc import Mapping
from types import MappingProxyType

import torch
import torch.autograd.forward_ad as fwAD

from .. import _native as nat
from .._arrays import (
    as_number,
    first_library,
    library_of,
    reverse_jvps,
    to_library,
    to_tensor,
)
from .._errors import check_device, missing_property, nearest, unknown_name
from .._execution import active, applied, as_policy
from ..engine.bind import AffineValues, compile_fast, pack_fields, run, values_of, windings
from ..engine.bind import needs_complex as _needs_complex
from ..engine.program import TrainAxisError, check_shims
from ..engine.steady import simulate_steady
from ..engine.vmap import loop_under_vmap
from ..sequence.description import SequenceDescription
from ..sequence.operators import (
    compose,
)
from .arguments import _check_protocol, _check_setting, _float_kind, _hashable, _short
from .placement import (
    _on_device,
    _protocol_vector,
    _unchanged,
    _versions,
    on_host,
)
from .reemit import _reemit
from .vocabulary import (
    _CACHE_SIZE,
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

class _Entry:
    """One structure: its program, and the values as an affine map of the protocol once resolved."""

    __slots__ = ("program", "windings", "p_ref", "values_ref", "affine", "verified", "state", "keep", "seen")

    def __init__(self, program, windings, p, values, keep):
        self.program, self.windings, self.keep = program, windings, keep
        self.p_ref, self.values_ref = p.detach().clone(), tuple(v.detach() for v in values)
        self.affine, self.verified, self.state = None, False, "seen"
        self.seen = ()  # `_versions` of the protocol tensors p_ref was read from


class _Cache:
    def __init__(self) -> None:
        self.entries: OrderedDict = OrderedDict()

    def get(self, key):
        entry = self.entries.get(key)
        if entry is not None:
            self.entries.move_to_end(key)
        return entry

    def put(self, key, entry) -> None:
        self.entries[key] = entry
        if len(self.entries) > _CACHE_SIZE:
            self.entries.popitem(last=False)


_JACOBIAN: contextvars.ContextVar = contextvars.ContextVar("blochsim_jacobian", default=None)


class _JacobianRequest:
    """A running `jacobian()`: the fields to differentiate, and the engine's (signal, J) once computed."""

    def __init__(self, owner, fields):
        self.owner, self.fields, self.result, self.column = owner, fields, None, None

    def output(self):
        signal, jac = self.result
        if self.column is None:
            return signal
        return fwAD.make_dual(signal, jac[..., self.column, :])


def _structure(program) -> tuple:
    """What must agree for two programs to share values: everything but the INTERVAL bits and the values.

    The RF frequencies and saturation constants (read by the semisolid lineshape, not part of the affine
    values) are structure: a protocol that moves them is walked every call, never served stale ones.
    """
    return (bytes((program.action & ~nat.INTERVAL).astype("int32")), bytes(program.record),
            program.rf_hz.tobytes() + program.sat_per_rad2.tobytes(), program.path, program.num_samples,
            program.num_states, program.num_repetitions, program.crusher_dk_rad_per_m, program.voxel_size_m)


def _keyword_names(function, skip: int) -> tuple[tuple, tuple, bool]:
    """(names, required names, takes **kwargs) of `function`'s parameters after the first `skip`."""
    params = list(inspect.signature(function).parameters.values())[skip:]
    names = tuple(p.name for p in params if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD))
    required = tuple(p.name for p in params
                     if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty)
    return names, required, any(p.kind == p.VAR_KEYWORD for p in params)


# -- Simulator --------------------------------------------------------------------------------------
class Simulator:
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
        properties = self._convert_tissue(tissue, settings)
        if self._event_train or self._stored is not None:
            signal, jac = self._engine_jacobian(names, properties, protocol, settings)
            axis = -2
        else:
            signal, jac, axis = self._closed_form_jacobian(names, properties, self._sequence(protocol, settings))
        if single:
            jac = jac.select(axis, 0)
        return to_library((signal, jac), library)

    def _check_differentiable(self, name, protocol, tissue) -> None:
        simulator = type(self).__name__
        if name in protocol or name in self._variables or name in self._protocol_names:
            raise ValueError(f"{simulator}.jacobian({name!r}): {name!r} is a protocol argument; the Jacobian is "
                             "taken along tissue properties. For a derivative along the sequence, build a cost "
                             "and call backward()")
        if name not in tissue:
            accepted = [n for n in self.accepts]
            if name not in accepted:
                raise ValueError(f"{simulator}.jacobian: {name!r} is not a property of {simulator}"
                                 f"{nearest(name, accepted)}; it accepts: {', '.join(accepted)}")
            raise ValueError(f"{simulator}.jacobian({name!r}): the call did not give {name!r}; give it "
                             f"({name}=...) to differentiate along it")
        kind = _float_kind(tissue[name])
        if kind is not True:
            raise ValueError(f"{simulator}.jacobian({name!r}): {name} is {kind}; a Jacobian needs a real float "
                             "property (give it as a float number or float array)")

    def _engine_jacobian(self, names, properties, protocol, settings):
        fields = []
        for name in names:
            target = self._field_map.get(name)
            if target is None:
                raise ValueError(f"{type(self).__name__}.jacobian({name!r}): {name} does not reach the tissue "
                                 "(the model maps it to None), so the engine has no derivative along it")
            fields.append(target)
        request = _JacobianRequest(self, tuple(fields))
        token = _JACOBIAN.set(request)
        try:
            if self._stored is not None:
                return self._engine(properties, {}, settings), request.result[1]
            sequence = self._sequence(protocol, settings)
            signal = self.evaluate(properties, **dict(sequence))
            if request.result is None:
                raise RuntimeError(f"{type(self).__name__}.evaluate() did not call super().evaluate(): its "
                                   "Jacobian cannot be taken from the engine")
            if type(self).evaluate is Simulator.evaluate:
                return signal, request.result[1]
            columns = []
            for p in range(len(fields)):  # the subclass's post-processing, by forward mode per column
                request.column = p
                with fwAD.dual_level():
                    tangent = fwAD.unpack_dual(self.evaluate(properties, **dict(sequence))).tangent
                columns.append(torch.zeros_like(signal) if tangent is None else tangent)
            return signal, torch.stack(columns, -2)
        finally:
            _JACOBIAN.reset(token)

    def _closed_form_jacobian(self, names, properties, sequence):
        """Columns by two reverse passes through `evaluate` (`reverse_jvps`; forward mode would import
        torch._dynamo on its first use: 2.5 s for a first SPGR Jacobian)."""
        shapes = [tuple(v.shape) for v in properties.values()]
        voxel_ndim = max((len(s) for s in shapes), default=0)
        sequence = dict(sequence)
        differentiable = torch.is_grad_enabled() and any(
            isinstance(v, torch.Tensor) and v.requires_grad for v in [*properties.values(), *sequence.values()])
        unique = list(dict.fromkeys(names))
        with torch.enable_grad():
            inputs = dict(properties)
            for name in unique:
                x = properties[name]
                inputs[name] = x.view_as(x) if x.requires_grad else x.detach().requires_grad_()
            signal = self.evaluate(inputs, **sequence)
            tangents = reverse_jvps([signal], [inputs[n] for n in unique], differentiable)
        by_name = {n: t[0] for n, t in zip(unique, tangents, strict=True)}
        columns = [torch.zeros_like(signal) if by_name[n] is None else by_name[n] for n in names]
        if not differentiable:
            signal, columns = signal.detach(), [c.detach() for c in columns]
        axis = -2 if signal.dim() > voxel_ndim else -1
        return signal, torch.stack(columns, axis), axis

    # -- the engine -------------------------------------------------------------------------------
    def _setting(self, settings: dict, name: str):
        if name in settings:
            return settings[name]
        return getattr(type(self), name, None) if name in ("states", "repetitions", "record", "execution",
                                                           "across_slice") else None

    def _tissue_fields(self, properties: Mapping) -> dict:
        fields = dict(self._model.fixed)
        field_map = self._field_map
        for name, value in properties.items():
            target = field_map.get(name, PUBLIC_FIELDS.get(name))
            if target is not None:
                fields[target] = value
        for required, public in (("t1_ms", "T1"), ("t2_ms", "T2")):
            if required not in fields:
                raise missing_property(public, type(self).__name__, "ms")
        return fields

    def _check_run(self, settings: dict) -> None:
        check_device(settings.get("device"))
        policy = as_policy(self._setting(settings, "execution"))
        if policy is not None and policy.target not in ("auto", "cpu"):
            check_device(policy.target[0])
        shims = settings.get("shims")
        if shims and any(int(k) != 0 for k in shims):
            raise NotImplementedError(f"shims={sorted(shims)}: static parallel-transmit shims (ids > 0) are not "
                                      "built into the engine yet; simulate without shims")
        if self._setting(settings, "across_slice") is not None:
            raise NotImplementedError(f"across_slice={self._setting(settings, 'across_slice')!r}: slice-profile "
                                      "integration is not built into the engine yet; leave across_slice=None")

    def _placement(self, settings: dict, fields: dict) -> tuple:
        """(device the tissue is packed on, device the results return to).

        The tissue tensors' device, unless `device=` says otherwise; results return to the tissue tensors'
        device (to `device=` if there are none). An execution policy moves no tissue here: the kernel layer
        runs each chunk where the policy says, staging its inputs there and its results back.
        """
        home = None
        for value in fields.values():  # any tensor off the CPU decides; scalars became CPU tensors
            if isinstance(value, torch.Tensor) and (home is None or value.device.type != "cpu"):
                home = value.device
        target = settings.get("device")
        device = torch.device(target) if target is not None else (home or torch.device("cpu"))
        return device, home or device

    def _engine(self, properties: Mapping, protocol: dict, settings: dict):
        """Run the engine under the call's execution policy (its `execution=` setting, else the active one)."""
        with applied(as_policy(self._setting(settings, "execution"))):
            return self._run_engine(properties, protocol, settings)

    def _run_engine(self, properties: Mapping, protocol: dict, settings: dict):
        """Run the engine: the signal, or under a jacobian() request, the request's output."""
        request = _JACOBIAN.get()
        if request is not None and request.owner is not self:
            request = None
        if request is not None and request.result is not None:
            return request.output()
        if settings:
            self._check_run(settings)
        repetitions = self._setting(settings, "repetitions")
        states = self._setting(settings, "states")
        record = self._setting(settings, "record")
        jacobian = request.fields if request is not None else ()
        fields = self._tissue_fields(properties)
        device, home = self._placement(settings, fields)
        if device.type != "cpu":
            fields = {k: _on_device(v, device) for k, v in fields.items()}
        auto = repetitions == "auto"
        host_kernels = active().device_for(device).type == "cpu"  # where the execution policy runs them
        double = DTYPES.get(settings.get("dtype")) == torch.float64
        if double and not host_kernels:
            raise ValueError(f"dtype={settings['dtype']} runs the float64 kernels, which only the host build has "
                             f"(the CUDA kernels take float32); run on the CPU (device='cpu') or leave dtype unset")
        # The steady state is extrapolated in float64 on the host; the CUDA build runs float32 only, and there
        # it plays the train until the transient has died out (engine.steady).
        dtype = torch.float64 if double or (auto and host_kernels) else torch.float32
        packed = pack_fields(fields, dtype=dtype, active=jacobian, names=self._names, device=device)
        complex_states = packed.phase_physics if packed is not None else _needs_complex(fields)
        try:
            program, values, windings, wrapped = self._program(protocol, settings, states, repetitions, record,
                                                               complex_states, dtype, device)
        except TrainAxisError as trains:
            signal, jac = self._run_trains(trains.parts, protocol, states, repetitions, record, complex_states,
                                           packed, fields, jacobian, dtype, double)
        else:
            if auto:
                signal, jac = simulate_steady(program, values, windings, packed, fields, jacobian, dtype=dtype,
                                              keep_double=double)
            else:
                signal, jac = run(program, values, packed, fields, dtype=dtype, jacobian=jacobian, wrapped=wrapped)
        if home != device:  # results return to the tissue tensors' device
            signal, jac = signal.to(home), None if jac is None else jac.to(home)
        if request is None:
            return signal
        request.result = (signal, jac)
        return request.output()

    def _run_trains(self, parts, protocol, states, repetitions, record, complex_states, packed, fields, jacobian,
                    dtype, double=False):
        """(signal, J) of a layout whose event values carry a train axis: one program per train of
        `parts` (`engine.program.split_trains`), stacked first. Not kept in the structure cache: the layout
        is walked and each train compiled on every call."""
        args = None if self._stored is not None else protocol
        runs = []
        for part in parts:
            program, windings = self._compiled(part, args, states, repetitions, record, complex_states)
            if repetitions == "auto":
                runs.append(simulate_steady(program, values_of(program), windings, packed, fields, jacobian,
                                            dtype=dtype, keep_double=double))
            else:
                runs.append(run(program, values_of(program), packed, fields, dtype=dtype, jacobian=jacobian))
        return torch.stack([s for s, _ in runs]), None if not jacobian else torch.stack([j for _, j in runs])

    def _program(self, protocol, settings, states, repetitions, record, complex_states, dtype=torch.float64,
                 device=None):
        """(program, values, windings, wrapped) for a call: cached and resolved where possible (docs/design.md).

        Resolved values come in `dtype` with their phases wrapped (`wrapped` True), on the device of the
        protocol vector (`_protocol_vector`: the CPU, or `device`, where the work runs, when a protocol
        tensor is elsewhere); walked values are the program's own float64 arrays, on the CPU.
        """
        if self._stored is not None:
            key = ("stored", states, repetitions, record, complex_states)
            entry = self._cache.get(key)
            if entry is None or not entry.program.current:  # a tensor of the description changed in place
                program, windings = self._walk(None, settings, states, repetitions, record, complex_states)
                values = values_of(program)
                if program.sources is None:
                    return program, values, windings, False  # a differentiable description: compile every call
                entry = _Entry(program, windings, torch.zeros(0), values, None)
                self._cache.put(key, entry)
            return entry.program, entry.values_ref, entry.windings, False

        args, key, leaves = self._layout_args(protocol)
        if not self._resolve:
            program, windings = self._walk(args, settings, states, repetitions, record, complex_states)
            return program, values_of(program), windings, False
        p = _protocol_vector(leaves, device)
        key = (tuple(key), states, repetitions, record, complex_states, id(settings.get("pulse")),
               id(settings.get("shims")), p.device)
        entry = self._cache.get(key)
        if entry is None:
            program, windings = self._walk(args, settings, states, repetitions, record, complex_states)
            values = values_of(program)
            entry = _Entry(program, windings, p, values, [settings.get("pulse"), settings.get("shims")])
            entry.seen = _versions(leaves)
            self._cache.put(key, entry)
            return program, values, windings, False
        if entry.state == "resolved":
            # The same tensors, unchanged, hold the same values: on a GPU no comparison (a wait for the card).
            same = not p.is_cpu and _unchanged(entry.seen, leaves)
            if entry.verified or same or torch.equal(p.detach(), entry.p_ref):
                return entry.program, entry.affine(p, dtype, wrap_last=True), entry.windings, True
            return self._verify(entry, p, args, settings, states, repetitions, record, complex_states) + (False,)
        if entry.state == "seen":
            resolved = self._resolve_entry(entry, p, args, leaves, settings, states, repetitions, record,
                                           complex_states, dtype)
            if resolved is not None:
                return resolved
        program, windings = self._walk(args, settings, states, repetitions, record, complex_states)
        return program, values_of(program), windings, False

    def _resolve_entry(self, entry, p, args, leaves, settings, states, repetitions, record, complex_states, dtype):
        """Second sight of a structure: fit `values = A p + b`, check it, and cache it. None if it fails."""
        if torch._C._functorch.peek_interpreter_stack() is not None:
            return None  # the fit needs autograd, which torch.func transforms forbid: resolve on a later call
        copies = [x.detach().cpu().requires_grad_() for x in leaves]  # the layout and the fit work on the host
        lookup = {id(x): c for x, c in zip(leaves, copies, strict=True)}
        probe = {name: lookup.get(id(value), value) for name, value in args.items()}
        entry.state = "walk"  # unless everything below succeeds
        try:
            with torch.enable_grad():
                program, windings = self._walk(probe, settings, states, repetitions, record, complex_states)
                blocks = values_of(program)
                affine = AffineValues.fit(blocks, copies, p.detach().cpu())
        except Exception:  # a layout that cannot be walked with tensors requiring grad (e.g. .numpy())
            return None
        if affine is None or _structure(program)[:3] != _structure(entry.program)[:3]:
            return None
        same_p = torch.equal(p.detach(), entry.p_ref)
        same_path = program.path == entry.program.path
        if not same_p and same_path and not affine.matches(entry.p_ref, entry.values_ref):
            return None
        entry.program, entry.windings, entry.affine = program, windings, affine
        entry.verified = (not same_p and same_path) or p.numel() == 0
        entry.p_ref, entry.state, entry.seen = p.detach().clone(), "resolved", _versions(leaves)
        return program, affine(p, dtype, wrap_last=True), windings, True

    def _verify(self, entry, p, args, settings, states, repetitions, record, complex_states):
        """A resolved map seen only at one protocol point: walk once at a new point and compare."""
        complex_path = complex_states or entry.program.path == nat.PATH_COMPLEX
        program, windings = self._walk(args, settings, states, repetitions, record, complex_path)
        values = values_of(program)
        if _structure(program)[:4] == _structure(entry.program)[:4] and entry.affine.matches(p, values):
            entry.verified = True
        else:
            entry.state = "walk"
        return program, values, windings

    def _rotated(self, program, args):
        """`program` with `post_rotation_rad` taken off its ADC demodulation phases (not for stored streams)."""
        rotation = self.post_rotation_rad
        if not rotation or args is None:
            return program
        recording = torch.from_numpy((program.action & nat.RECORD) != 0)
        program.phase_rad = program.phase_rad - rotation * recording.to(torch.float64)
        return program

    def _layout_args(self, protocol: dict):
        """(layout kwargs, structure key parts, protocol leaf tensors) of a converted protocol."""
        args, key, leaves = {}, [], []
        structural = self.structural
        for name, value in protocol.items():
            if isinstance(value, torch.Tensor) and name not in structural:
                key.append((name, tuple(value.shape), value.device))
                leaves.append(value)
            elif isinstance(value, (int, float, bool, str, type(None))):
                key.append((name, type(value), value))
            else:
                try:
                    key.append((name, _hashable(value)))
                except TypeError:
                    key.append((name, id(value)))
            args[name] = value
        self._check_required(args)
        return args, key, leaves

    def _walk(self, args, settings, states, repetitions, record, complex_states):
        """Lay out (or take the stored description) and compile: (program, windings per repetition)."""
        description = self._stored if args is None else self._compose(on_host(args), settings)
        return self._compiled(description, args, states, repetitions, record, complex_states)

    def _compiled(self, description, args, states, repetitions, record, complex_states):
        """`description` compiled for a call: (program, windings per repetition, for 'auto' only)."""
        if repetitions == "auto":  # one playing; the orders for many
            program = compile_fast(description, record=record, states=states or 1, complex_states=complex_states)
            if states is None:
                program.num_states = max(8, min(64, 1 + (1 << 20) * windings(program)))
            return self._rotated(program, args), windings(program)
        program = compile_fast(description, repetitions=repetitions, record=record, states=states,
                               complex_states=complex_states)
        return self._rotated(program, args), None

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
        check_shims(description)  # here, by its own event index: a handler may not take shim_id
        stored = _reemit(description, model.operators)
        self = cls.__new__(cls)
        self._setup(model, resolve=True, crusher=description.crusher_dephasing_rad, voxel=description.voxel_size_m,
                    stored=stored)
        self._absorb(settings, ".from_description()")
        return self


