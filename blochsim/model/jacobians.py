"""The Jacobians of a `Simulator`: the engine's forward mode for event trains, two reverse passes through
`evaluate` for closed forms.

`Jacobians` is a mixin of `Simulator`: it reads the instance's `_field_map`, `_variables`,
`_protocol_names`, `_stored` and `accepts`, and calls its `evaluate`, `_engine` and `_sequence`.
"""

from __future__ import annotations

import torch
import torch.autograd.forward_ad as fwAD

from .._arrays import reverse_jvps
from .._errors import nearest
from .arguments import _float_kind
from .execution import _JACOBIAN, _JacobianRequest

__all__ = ["Jacobians"]


class Jacobians:
    """`Simulator.jacobian`'s checks and its two ways of taking the columns."""

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
            if not type(self)._own_evaluate:
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
