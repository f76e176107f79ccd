"""`hvp`: the Hessian-vector product of a scalar cost of a simulation with respect to protocol tensors."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import torch

__all__ = ["hvp"]


def hvp(cost: Callable, params, v, *, return_gradient: bool = False):
    """`H v`, H the Hessian of `cost` with respect to `params`, by reverse over reverse mode.

    The gradient is taken with its graph kept; differentiating `<gradient, v>` once more runs, through each
    simulation in the cost, the engine's second-order kernel (the backward of the VJP is the VJP of a JVP
    along `v`): exact to rounding, no finite differences, at the cost of about one gradient plus one
    second-order pass.

    Args:
        cost: a callable returning a real tensor of one element: `cost(params)` for a tensor, `cost(*params)`
            for a sequence of tensors, `cost(**params)` for a mapping (the convention of `SequenceDesign`).
        params: the point, a float tensor, a sequence of them or a mapping of names to them (flips, phases,
            timings, tissue maps...). They are not modified and their `.grad` is not touched.
        v: the direction, in the structure, shapes and units of `params`.
        return_gradient: also return the cost and its gradient (computed on the way, for free).

    Returns:
        `H v` in the structure of `params` (zeros for a parameter the cost does not reach), or
        `(cost, gradient, H v)` with `return_gradient=True`.

    What can be differentiated twice: a cost of signals (`simulate`) of any simulator, and any cost of
    closed forms (their derivatives are ordinary autograd). A cost of a Jacobian of an event train
    (`Simulator.jacobian`, e.g. a CRLB) already uses the second derivative for its gradient; its Hessian
    would be a third derivative, which blochsim does not have: that raises RuntimeError.

    Raises:
        ValueError: `v` does not match `params`, a parameter is not a float tensor, or the cost is not a
            single real number.
        RuntimeError: the Hessian needs a third derivative of an event train.
    """
    names, points, rebuild = _flatten(params, "params")
    _, directions, _ = _flatten(v, "v")
    if len(directions) != len(points):
        raise ValueError(f"v has {len(directions)} tensors but params has {len(points)}; give one direction per "
                         "parameter, in the same structure")
    leaves, tangents = [], []
    for name, x, d in zip(names, points, directions, strict=True):
        if not isinstance(x, torch.Tensor) or not x.is_floating_point():
            raise ValueError(f"params[{name!r}] must be a float tensor, got "
                             f"{x.dtype if isinstance(x, torch.Tensor) else type(x).__name__}")
        d = torch.as_tensor(d, dtype=x.dtype, device=x.device)
        if d.shape != x.shape:
            raise ValueError(f"v[{name!r}] has shape {tuple(d.shape)} but params[{name!r}] has {tuple(x.shape)}")
        leaves.append(x.detach().clone().requires_grad_())
        tangents.append(d)
    with torch.enable_grad():
        arguments = rebuild(leaves)
        value = cost(*arguments) if isinstance(arguments, tuple) else cost(**arguments)
        value = _check_cost(value)
        grads = torch.autograd.grad(value, leaves, create_graph=True, allow_unused=True)
        reached = [(g, d) for g, d in zip(grads, tangents, strict=True) if g is not None and g.requires_grad]
        if reached:
            inner = sum((g * d).sum() for g, d in reached)
            try:
                second = torch.autograd.grad(inner, leaves, allow_unused=True)
            except RuntimeError as err:
                if "third" not in str(err):
                    raise
                raise RuntimeError(
                    "hvp: the cost's Hessian is a third derivative of an event train's simulation (its gradient "
                    "already differentiates a Jacobian or a gradient of the signal); blochsim gives first and "
                    "second derivatives only. hvp takes costs of signals, and any cost of closed forms") from err
        else:  # the gradient does not depend on the parameters: the cost is linear in them
            second = [None] * len(leaves)
    product = [torch.zeros_like(x) if h is None else h.detach() for x, h in zip(leaves, second, strict=True)]
    product = _unflatten(rebuild(product))
    if not return_gradient:
        return product
    gradient = _unflatten(rebuild([torch.zeros_like(x) if g is None else g.detach()
                                   for x, g in zip(leaves, grads, strict=True)]))
    return value.detach(), gradient, product


def _check_cost(value) -> torch.Tensor:
    if not isinstance(value, torch.Tensor) or value.numel() != 1:
        shape = tuple(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__
        raise ValueError(f"cost must return a tensor of one element, got {shape}")
    if value.is_complex():
        raise ValueError("cost must be real, got a complex tensor; take its real part or its magnitude")
    return value.reshape(())


class _Single(tuple):
    """A one-tensor params: `cost(x)` and a tensor back."""


def _flatten(params, what: str):
    """(names, tensors, rebuild): rebuild(list) gives the call arguments (a tuple for positional calls, a
    dict for keywords)."""
    if isinstance(params, torch.Tensor):
        return ["0"], [params], lambda xs: _Single(xs)
    if isinstance(params, Mapping):
        keys = list(params.keys())
        return [str(k) for k in keys], [params[k] for k in keys], lambda xs: dict(zip(keys, xs, strict=True))
    if isinstance(params, Sequence) and not isinstance(params, str):
        return [str(i) for i in range(len(params))], list(params), lambda xs: tuple(xs)
    raise ValueError(f"{what} must be a tensor, a sequence of tensors or a mapping of names to tensors, got "
                     f"{type(params).__name__}")


def _unflatten(arguments):
    if isinstance(arguments, _Single):
        return arguments[0]
    return arguments if isinstance(arguments, dict) else tuple(arguments)
