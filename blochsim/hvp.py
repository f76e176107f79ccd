"""`hvp`: the Hessian-vector product of a scalar cost of a simulation with respect to protocol tensors."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import torch
import torch.autograd.forward_ad as fwAD

__all__ = ["hvp"]


def hvp(cost: Callable, params, v, *, return_gradient: bool = False):
    """`H v`, H the Hessian of `cost` with respect to `params`, by forward over reverse mode.

    The gradient is taken on dual tensors carrying `v` (`torch.autograd.forward_ad`): the tangent of the
    gradient is `H v`. Each simulation in the cost runs its forward-mode derivative (JVP) on the way in and,
    on the way back, the engine's second-order kernel once, which gives its VJP and the VJP's tangent
    together (the cost's curvature enters as the tangent of the signal's cotangent): exact to rounding, no
    finite differences, about one JVP and one second-order pass besides the cost's own torch operations
    (reverse over reverse needs a VJP more, and a VJP for the gradient). Where forward mode cannot run through
    the cost (an operation without a forward-mode formula, a nested forward-mode level), the cost is
    evaluated again and differentiated twice in reverse mode, which gives the same product. The first call in
    a process pays torch's forward-mode start-up (with torch 2.13 its first dual operation imports
    torch._dynamo: about 1.5 s on a 2-core host).

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
    return _hvp(cost, params, v, return_gradient, forward_mode=True)


def reverse_over_reverse(cost: Callable, params, v, *, return_gradient: bool = False):
    """`hvp` by reverse over reverse mode only (its fallback; the benchmarks time it beside `hvp`)."""
    return _hvp(cost, params, v, return_gradient, forward_mode=False)


def _hvp(cost: Callable, params, v, return_gradient: bool, forward_mode: bool):
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
    if not forward_mode or fwAD._current_level >= 0:  # forward-mode levels do not nest: the caller's is open
        value, grads, second = _reverse_over_reverse(cost, leaves, tangents, rebuild)
    else:
        try:
            value, grads, second = _forward_over_reverse(cost, leaves, tangents, rebuild)
        except (RuntimeError, NotImplementedError):
            # Forward mode does not run through this cost (or the cost failed): reverse over reverse gives
            # the same product, or the error that says why there is none.
            leaves = [x.detach().clone().requires_grad_() for x in leaves]
            value, grads, second = _reverse_over_reverse(cost, leaves, tangents, rebuild)
    product = _unflatten(rebuild([torch.zeros_like(x) if h is None else h.detach()
                                  for x, h in zip(leaves, second, strict=True)]))
    if not return_gradient:
        return product
    gradient = _unflatten(rebuild([torch.zeros_like(x) if g is None else g.detach()
                                   for x, g in zip(leaves, grads, strict=True)]))
    return value.detach(), gradient, product


def _call(cost: Callable, arguments):
    return _check_cost(cost(*arguments) if isinstance(arguments, tuple) else cost(**arguments))


def _forward_over_reverse(cost: Callable, leaves: list, tangents: list, rebuild) -> tuple:
    """(cost, gradient, H v): the reverse pass run on dual tensors; `H v` is the gradient's tangent."""
    with torch.enable_grad(), fwAD.dual_level():
        value = _call(cost, rebuild([fwAD.make_dual(x, d) for x, d in zip(leaves, tangents, strict=True)]))
        grads = torch.autograd.grad(value, leaves, allow_unused=True)
        value = fwAD.unpack_dual(value).primal
        duals = [(None, None) if g is None else fwAD.unpack_dual(g) for g in grads]
    return value, [g for g, _ in duals], [h for _, h in duals]


def _reverse_over_reverse(cost: Callable, leaves: list, tangents: list, rebuild) -> tuple:
    """(cost, gradient, H v): the gradient with its graph, then the gradient of `<gradient, v>` (through each
    simulation: the backward of its VJP, the second-order kernel, then a VJP for the cost's curvature)."""
    with torch.enable_grad():
        value = _call(cost, rebuild(leaves))
        grads = torch.autograd.grad(value, leaves, create_graph=True, allow_unused=True)
        reached = [(g, d) for g, d in zip(grads, tangents, strict=True) if g is not None and g.requires_grad]
        if not reached:  # the gradient does not depend on the parameters: the cost is linear in them
            return value, grads, [None] * len(leaves)
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
    return value, grads, second


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
