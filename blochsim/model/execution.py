"""Engine dispatch of a `Simulator`: tissue to engine fields, placement, the run under the execution policy,
and the jacobian() request a run answers.

`EngineDispatch` is a mixin of `Simulator`: it reads the instance's `_model`, `_field_map`, `_names` and
`_stored`, and calls its `_program` (`StructureCache`) and `_compiled`.
"""

from __future__ import annotations

import contextvars
from collections.abc import Mapping

import torch
import torch.autograd.forward_ad as fwAD

from .._errors import check_device, missing_property
from .._execution import active, applied, as_policy
from .._multi_device import train_placement
from ..engine.bind import run
from ..engine.program import TrainAxisError, values_of
from ..engine.pulses import transmit_channels
from ..engine.steady import simulate_steady
from ..engine.tissue import pack_tissue, tissue_device
from ..sequence.spinor import slice_profile_of
from .placement import _on_device
from .vocabulary import DTYPES, PUBLIC_FIELDS

__all__ = ["EngineDispatch"]

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


class EngineDispatch:
    """`Simulator._engine` and its helpers: run the kernels on a call's tissue and program."""

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

    def _check_run(self, settings: dict, policy) -> None:
        """The run settings' errors before any work; `policy` is the call's `execution=` (`as_policy`)."""
        check_device(settings.get("device"))
        if policy is not None and policy.target not in ("auto", "cpu"):
            check_device(policy.target[0])
        slice_profile_of(self._setting(settings, "across_slice"))  # checked before the work

    def _channels(self, settings: dict) -> int | None:
        """The channels B1 and B1phase carry: those of the run's shims and dynamic pTx pulses."""
        if self._stored is not None:
            return transmit_channels(self._stored.shim_definitions, self._stored.rf_definitions)
        pulse = settings.get("pulse")
        return transmit_channels(settings.get("shims"), None if pulse is None else {0: pulse})

    def _placement(self, settings: dict, fields: dict) -> tuple:
        """(device the tissue is packed on, device the results return to).

        The tissue tensors' device, unless `device=` says otherwise; results return to the tissue tensors'
        device (to `device=` if there are none). An execution policy moves no tissue here: the kernel layer
        runs each chunk where the policy says, staging its inputs there and its results back.
        """
        home = None
        for value in fields.values():  # scalars became CPU tensors
            if isinstance(value, torch.Tensor):
                home = tissue_device(fields)
                break
        target = settings.get("device")
        device = torch.device(target) if target is not None else (home or torch.device("cpu"))
        return device, home or device

    def _engine(self, properties: Mapping, protocol: dict, settings: dict):
        """Run the engine under the call's execution policy (its `execution=` setting, else the active one)."""
        policy = as_policy(self._setting(settings, "execution"))
        with applied(policy):
            return self._run_engine(properties, protocol, settings, policy)

    def _run_engine(self, properties: Mapping, protocol: dict, settings: dict, policy):
        """Run the engine: the signal, or under a jacobian() request, the request's output. `policy`: the
        call's own (`as_policy` of its execution setting), already applied."""
        request = _JACOBIAN.get()
        if request is not None and request.owner is not self:
            request = None
        if request is not None and request.result is not None:
            return request.output()
        if settings:
            self._check_run(settings, policy)
        # As _setting reads them (every run setting here has a class default), without a call each: this
        # runs on every call (docs/design.md, small calls).
        cls = type(self)
        repetitions = settings.get("repetitions", cls.repetitions)
        states = settings.get("states", cls.states)
        record = settings.get("record", cls.record)
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
        packed = pack_tissue(fields, dtype=dtype, active=jacobian, names=self._names, device=device,
                             channels=self._channels(settings))
        try:
            program, values, windings, wrapped = self._program(protocol, settings, states, repetitions, record,
                                                               packed.phase_physics, dtype, device)
        except TrainAxisError as trains:
            signal, jac = self._run_trains(trains.parts, protocol, states, repetitions, record, packed, fields,
                                           jacobian, double, settings)
        else:
            if auto:
                signal, jac = simulate_steady(program, values, windings, packed, fields, jacobian, keep_double=double)
            else:
                signal, jac = run(program, packed, fields, values=values, wrapped=wrapped, jacobian=jacobian)
        if home != device:  # results return to the tissue tensors' device
            signal, jac = signal.to(home), None if jac is None else jac.to(home)
        if request is None:
            return signal
        request.result = (signal, jac)
        return request.output()

    def _run_trains(self, parts, protocol, states, repetitions, record, packed, fields, jacobian, double=False,
                    settings=None):
        """(signal, J) of a layout whose event values carry a train axis: one program per train of
        `parts` (`engine.program.split_trains`), stacked first. Not kept in the structure cache: the layout
        is walked and each train compiled on every call."""
        args = None if self._stored is not None else protocol
        runs = []
        for index, part in enumerate(parts):
            program, windings = self._compiled(part, args, states, repetitions, record, packed.phase_physics,
                                               self._setting(settings or {}, "across_slice"))
            with train_placement(index, len(parts)):  # distribute(devices): this train's device
                if repetitions == "auto":
                    runs.append(simulate_steady(program, values_of(program), windings, packed, fields, jacobian,
                                                keep_double=double))
                else:
                    runs.append(run(program, packed, fields, jacobian=jacobian))
        return torch.stack([s for s, _ in runs]), None if not jacobian else torch.stack([j for _, j in runs])
