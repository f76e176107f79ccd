"""`ModelOperator`: tissue maps to predicted images (or subspace coefficients), with its forward-mode Jacobian
and its adjoint, for model-based reconstruction."""

from __future__ import annotations

from collections.abc import Mapping

import torch

from .._arrays import is_array, to_tensor
from .._free_variables import FreeVariable
from ..subspace import Subspace

__all__ = ["ModelOperator"]

AMPLITUDE_CHANNELS = ("amplitude.real", "amplitude.imag")


class _Channel(FreeVariable):
    """One unknown's map between the free variable x and the property value (`blochsim._free_variables`, shared
    with least squares)."""

    def free(self, value):
        """The inverse of `value`; ValueError for a value not strictly inside the bounds."""
        outside = self.outside(value)
        if bool(outside.any()):
            at = tuple(int(i) for i in torch.nonzero(outside)[0]) if outside.dim() else ()
            raise ValueError(f"initial {self.name} = {float(value[at])} at index {at} is not strictly inside its "
                             f"bounds ({_text(self.low, at)}, {_text(self.high, at)})")
        return self.inverse(value)

    def on(self, x) -> _Channel:
        """The channel with its bound maps on x's device and in x's dtype."""
        def move(bound):
            return bound.to(device=x.device, dtype=x.dtype) if isinstance(bound, torch.Tensor) else bound
        return _Channel(self.name, move(self.low), move(self.high), self.step)

    def indexed(self, keep) -> _Channel:
        def pick(bound):
            return bound[keep] if isinstance(bound, torch.Tensor) and bound.dim() > 0 else bound
        return _Channel(self.name, pick(self.low), pick(self.high), self.step)


def _text(bound, at) -> str:
    if bound is None:
        return "none"
    return f"{float(bound[at] if isinstance(bound, torch.Tensor) and bound.dim() else bound):g}"


class ModelOperator(torch.nn.Module):
    """The signal model as a reconstruction operator: `x (..., channels)` to complex `(..., contrasts)`.

    Leading axes of `x` are voxels. Its channels are the unknowns in order, then `amplitude.real` and
    `amplitude.imag` when `amplitude` is on; the prediction is `amplitude * acquisition.simulate(**unknowns)`,
    projected onto `subspace` when one is given (`(..., rank)` coefficients).

    Each unknown is a free variable mapped into its bounds: `low + (high - low) sigmoid(x)` when two-sided,
    `low + step softplus(x)` with a lower bound only, `high - step softplus(-x)` with an upper bound only,
    `step x` with none; `step` (property units per unit of x) comes from `scale` (default 1) and is the bound
    width for a two-sided bound. The amplitude channels are in signal units.

    Args:
        acquisition: a `Simulator` with its protocol and every known property bound (maps of the voxels'
            shape are restricted by `select`); `dtype=torch.float64` bound on an event train computes in
            float64.
        *unknown: the property names the maps hold, e.g. "T1", "T2".
        bounds: `{name: (low | None, high | None)}` in property units; numbers or maps of the voxels' shape.
        scale: `{name: step}` in property units, for unknowns without a two-sided bound.
        amplitude: add the complex amplitude (proton density x receive phase) as two channels.
        subspace: a `Subspace`: predict its coefficients instead of the contrasts.
        execution: an execution policy (or target) for every simulation (`blochsim.execution`).

    Members: `A`/`forward` the prediction; `A_jvp(x, d)` = `J d` (one forward-mode pass); `A_vjp(x, v)` =
    `Re(J^H v)`, real `(..., channels)` (one reverse pass), the adjoint of `A_jvp` under the real inner
    product `<a, b> = Re sum conj(a) b`; `jacobian(x)` `(..., channels, contrasts)`.
    Solvers are not part of blochsim.
    """

    def __init__(self, acquisition, *unknown: str, bounds: Mapping | None = None, scale: Mapping | None = None,
                 amplitude: bool = True, subspace: Subspace | None = None, execution=None):
        super().__init__()
        accepts = set(getattr(acquisition, "accepts", ()))
        if not hasattr(acquisition, "simulate") or not hasattr(acquisition, "jacobian"):
            raise TypeError(f"acquisition must be a Simulator, got {type(acquisition).__name__}")
        if not unknown and not amplitude:
            raise ValueError("ModelOperator needs at least one unknown property or amplitude=True")
        for name in unknown:
            if not isinstance(name, str) or name not in accepts:
                raise ValueError(f"unknown {name!r} is not a property {type(acquisition).__name__} accepts: "
                                 f"{sorted(accepts)}")
        if len(set(unknown)) != len(unknown):
            raise ValueError(f"unknown names repeat: {unknown}")
        bounds, scale = dict(bounds or {}), dict(scale or {})
        for what, given in (("bounds", bounds), ("scale", scale)):
            for name in given:
                if name not in unknown:
                    raise ValueError(f"{what} names {name!r}, which is not an unknown {unknown}")
        if subspace is not None and not isinstance(subspace, Subspace):
            raise TypeError(f"subspace must be a Subspace, got {type(subspace).__name__}")
        self.acquisition = acquisition
        self.unknown = tuple(unknown)
        self.amplitude = bool(amplitude)
        self.subspace = subspace
        self.execution = execution
        self._channels = [self._channel(name, bounds.get(name), scale.get(name)) for name in unknown]

    @staticmethod
    def _channel(name: str, bound, step) -> _Channel:
        low = high = None
        if bound is not None:
            if not isinstance(bound, (tuple, list)) or len(bound) != 2:
                raise ValueError(f"bounds[{name!r}] must be a pair (low | None, high | None), got {bound!r}")
            low, high = (None if b is None else float(b) if isinstance(b, (int, float))
                         else to_tensor(b, name=f"bounds[{name!r}]") for b in bound)
            if low is not None and high is not None and bool(torch.any(torch.as_tensor(low) >= torch.as_tensor(high))):
                raise ValueError(f"bounds[{name!r}]: low must be below high everywhere, got {bound!r}")
        if step is not None and low is not None and high is not None:
            raise ValueError(f"scale[{name!r}]: a two-sided bound sets the step (its width); give scale only for "
                             "unknowns without one")
        step = 1.0 if step is None else step
        if not (isinstance(step, (int, float)) and step > 0):
            raise ValueError(f"scale[{name!r}] must be a positive number (property units per unit step), got {step!r}")
        return _Channel(name, low, high, float(step))

    # -- channels ----------------------------------------------------------------------------------------
    @property
    def names(self) -> tuple:
        return self.unknown + (AMPLITUDE_CHANNELS if self.amplitude else ())

    @property
    def channels(self) -> int:
        return len(self.names)

    def _check(self, x, what: str = "x") -> torch.Tensor:
        x = to_tensor(x, name=what)
        if x.is_complex() or not x.is_floating_point():
            raise ValueError(f"{what} must be real, got dtype {x.dtype}")
        if x.dim() == 0 or x.shape[-1] != self.channels:
            raise ValueError(f"{what} must end in {self.channels} channels {self.names}, got shape {tuple(x.shape)}")
        return x

    def split(self, x) -> dict:
        """`{name: value in property units, "amplitude": complex}` of `x (..., channels)`."""
        x = self._check(x)
        out = {ch.name: ch.on(x).value(x[..., i]) for i, ch in enumerate(self._channels)}
        if self.amplitude:
            n = len(self._channels)
            out["amplitude"] = torch.complex(x[..., n], x[..., n + 1])
        return out

    def initial(self, shape=(), **values) -> torch.Tensor:
        """`x` of voxel shape `shape` from values in property units (the inverse of `split`).

        An unknown left out starts mid-bound (ValueError without a two-sided bound); the amplitude, when left
        out, is 1. A value must lie strictly inside its bounds. Values broadcast to `shape`; x takes their
        float dtype (float32 otherwise) and device.
        """
        extra = set(values) - set(self.unknown) - ({"amplitude"} if self.amplitude else set())
        if extra:
            raise ValueError(f"initial got {sorted(extra)}; it takes the unknowns {self.unknown}"
                             + (" and amplitude" if self.amplitude else ""))
        given = {k: to_tensor(v, name=k) for k, v in values.items()}
        dtype = torch.float64 if any(v.dtype in (torch.float64, torch.complex128) for v in given.values()) \
            else torch.float32
        device = next((v.device for v in given.values()), torch.device("cpu"))
        shape = tuple(shape)
        columns = []
        for ch in self._channels:
            if ch.name in given:
                value = given[ch.name].to(dtype=dtype, device=device).expand(shape)
                columns.append(ch.on(value).free(value))
            elif ch.two_sided:
                columns.append(torch.zeros(shape, dtype=dtype, device=device))
            else:
                raise ValueError(f"initial needs a value of {ch.name!r}: it has no two-sided bound to start "
                                 "mid-way in")
        if self.amplitude:
            a = given.get("amplitude", torch.ones((), dtype=dtype, device=device))
            a = a.to(device).expand(shape)
            real, imag = (a.real, a.imag) if a.is_complex() else (a, torch.zeros_like(a))
            columns += [real.to(dtype), imag.to(dtype)]
        return torch.stack([c.expand(shape) for c in columns], -1)

    def select(self, keep) -> ModelOperator:
        """The operator restricted to a subset of voxels: every bound map of the acquisition and of `bounds`
        (tensors with axes) is indexed by `keep` (a boolean mask or indices over the voxel axes)."""
        arrays = {name: to_tensor(value, name=name) for name, value in self.acquisition.bound.items()
                  if is_array(value)}  # torch, NumPy or CuPy maps
        maps = {name: value[keep] for name, value in arrays.items() if value.dim() > 0}
        other = ModelOperator.__new__(ModelOperator)
        torch.nn.Module.__init__(other)
        other.acquisition = self.acquisition.bind(**maps) if maps else self.acquisition
        other.unknown, other.amplitude, other.subspace = self.unknown, self.amplitude, self.subspace
        other.execution = self.execution
        other._channels = [ch.indexed(keep) for ch in self._channels]
        return other

    # -- the operator ------------------------------------------------------------------------------------
    def _settings(self) -> dict:
        return {} if self.execution is None else {"execution": self.execution}

    def _out(self, signal: torch.Tensor) -> torch.Tensor:
        return signal if self.subspace is None else self.subspace.project(signal)

    def _signal(self, values: dict) -> torch.Tensor:
        return self.acquisition.simulate(**{n: values[n] for n in self.unknown}, **self._settings())

    def forward(self, x) -> torch.Tensor:
        """The prediction, complex `(..., contrasts)` (`(..., rank)` with a subspace)."""
        values = self.split(x)
        signal = self._signal(values)
        if self.amplitude:
            signal = values["amplitude"][..., None] * signal
        return self._out(signal)

    def A(self, x) -> torch.Tensor:
        return self(x)

    def _columns(self, x) -> tuple[torch.Tensor, torch.Tensor]:
        """(signal (..., S), dsignal/dx (..., channels, S)) before projection, by one forward-mode pass."""
        x = self._check(x)
        values = self.split(x)
        if self.unknown:
            signal, J = self.acquisition.jacobian(self.unknown, **{n: values[n] for n in self.unknown},
                                                  **self._settings())
            slopes = torch.stack([ch.on(x).slope(x[..., i]) for i, ch in enumerate(self._channels)], -1)
            J = J * slopes[..., None].to(J.real.dtype)
        else:
            signal = self._signal(values)
            J = signal.new_zeros(signal.shape[:-1] + (0, signal.shape[-1]))
        if self.amplitude:
            if not signal.is_complex():  # a real closed form: the amplitude makes the prediction complex
                signal = signal.to(torch.promote_types(signal.dtype, torch.complex64))
                J = J.to(signal.dtype)
            a = values["amplitude"][..., None, None].to(signal.dtype)
            J = torch.cat([a * J, signal[..., None, :], 1j * signal[..., None, :]], -2)
            signal = values["amplitude"][..., None].to(signal.dtype) * signal
        return signal, J

    def jacobian(self, x) -> torch.Tensor:
        """`d A / d x`, complex `(..., channels, contrasts)` (`(..., channels, rank)` with a subspace)."""
        return self._out(self._columns(x)[1])

    def A_jvp(self, x, d) -> torch.Tensor:
        """`J d`: the change of the prediction along `d (..., channels)`, complex `(..., contrasts)`."""
        d = self._check(d, "d")
        _, J = self._columns(x)
        return self._out((d[..., None].to(J.dtype) * J).sum(-2))

    def A_vjp(self, x, v) -> torch.Tensor:
        """`Re(J^H v)`: real `(..., channels)`, the adjoint of `A_jvp` under `<a, b> = Re sum conj(a) b`."""
        x = self._check(x).detach().requires_grad_()
        v = to_tensor(v, name="v")
        with torch.enable_grad():
            y = self(x)
            if v.shape != y.shape:
                raise ValueError(f"v must have the prediction's shape {tuple(y.shape)}, got {tuple(v.shape)}")
            inner = (y.conj() * v.to(device=y.device, dtype=y.dtype)).real.sum()
            (grad,) = torch.autograd.grad(inner, x)
        return grad

    def physics(self, **options):
        """A `deepinv.physics.Physics` over `(batch, channels, *xyz) -> (batch, contrasts, *xyz)`; `options` go
        to its constructor. Needs deepinv (`pip install deepinv`)."""
        from ._deepinv import model_physics

        return model_physics(self, **options)
