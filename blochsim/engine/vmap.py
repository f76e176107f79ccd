"""`torch.func.vmap` over the engine: the batch runs as a loop of ordinary calls.

The engine reads structure from values (`.tolist()`, Python branches on counts and phases) and gives
raw pointers to the kernels; a vmap batch allows neither. So a public entry point (`loop_under_vmap`)
called while vmap is the innermost torch.func transform takes entry b of every tensor batched at that
level, calls itself once per entry one level down (where those tensors are ordinary, or carry only the
transforms outside the vmap), and stacks the results, batched again at that level. Transforms outside
the vmap (grad, jacrev, an outer vmap) differentiate or batch the loop like any other ops.

The autograd Functions loop the same way (`vmap_rule`), for kernels that torch.func itself runs under a
vmap: `jacrev` vmaps the VJP over the rows of the Jacobian, `jacfwd` the JVP over its columns. A vmap
outside another transform whose batch reaches an entry point (`vmap(grad(f))`) cannot be sliced there,
below the inner transform: the entry point raises NotImplementedError naming the orders that work.
"""

from __future__ import annotations

import copy
import dataclasses
import functools

import torch
from torch._C import _functorch
from torch._functorch.pyfunctorch import retrieve_current_functorch_interpreter

from .._tracing import traced_call, tracing

__all__ = ["loop_under_vmap", "vmap_rule", "holds_batch"]


def _map_tensors(value, fn):
    """`value` with each tensor `t` replaced by `fn(t)`.

    Lists, tuples, dicts and dataclass instances (TissueProperties, SequenceDescription, events) are
    rebuilt only where something changed, so `value` itself comes back when `fn` changes nothing. A
    rebuilt dataclass keeps its fields only: memos kept on the instance (compiled programs) belong to the
    old values. An object whose class names `_vmap_attributes` (a Simulator's fixed values) is copied
    with those attributes mapped.
    """
    if isinstance(value, torch.Tensor):
        return fn(value)
    if type(value) in (list, tuple):
        items = [_map_tensors(v, fn) for v in value]
        return value if all(a is b for a, b in zip(items, value, strict=True)) else type(value)(items)
    if type(value) is dict:
        items = {k: _map_tensors(v, fn) for k, v in value.items()}
        return value if all(items[k] is v for k, v in value.items()) else items
    attributes = getattr(type(value), "_vmap_attributes", None)
    dataclass = dataclasses.is_dataclass(value) and not isinstance(value, type)
    if not attributes and not dataclass:
        return value
    names = attributes or [f.name for f in dataclasses.fields(value)]
    changed = {}
    for name in names:
        old = getattr(value, name)
        new = _map_tensors(old, fn)
        if new is not old:
            changed[name] = new
    if not changed:
        return value
    out = copy.copy(value)
    if dataclass and not attributes:
        for key in [k for k in getattr(out, "__dict__", {}) if k not in names]:
            del out.__dict__[key]
    for name, new in changed.items():
        object.__setattr__(out, name, new)
    return out


def _entry(t: torch.Tensor, level: int, index: int) -> torch.Tensor:
    """Entry `index` of `t` if it is batched at `level`, else `t`."""
    inner, dim = _functorch._unwrap_batched(t, level)
    return t if dim is None else inner.select(dim, index)


def holds_batch(t: torch.Tensor) -> bool:
    """Whether a vmap batch is inside `t`, under any other torch.func wrappers."""
    while _functorch.is_functorch_wrapped_tensor(t):
        if _functorch.is_batchedtensor(t):
            return True
        t = _functorch.get_unwrapped(t)
    return False


def _stack(results: list, level: int):
    """The per-entry results stacked along a new leading axis, batched at `level` (tensors, tuples,
    dataclasses of tensors; None stays None)."""
    first = results[0]
    if isinstance(first, torch.Tensor):
        return _functorch._add_batch_dim(torch.stack(results), 0, level)
    if type(first) in (list, tuple):
        return type(first)(_stack(list(parts), level) for parts in zip(*results, strict=True))
    if dataclasses.is_dataclass(first) and not isinstance(first, type):
        out = copy.copy(first)
        for f in dataclasses.fields(first):
            object.__setattr__(out, f.name, _stack([getattr(r, f.name) for r in results], level))
        return out
    if first is None:
        return None
    raise TypeError(f"torch.func.vmap over blochsim: a result of type {type(first).__name__} cannot be batched; "
                    "vmap needs tensor results (torch inputs give torch results)")


_UNDER_ANOTHER = (
    "{name}: a torch.func.vmap outside another transform (as in vmap(grad(f))) batches these arguments; "
    "blochsim reads structure from values and can slice a batch only where vmap is the innermost transform. "
    "Put the vmap inside (grad(vmap(f)), or torch.func.jacrev for one gradient per entry), or give a batch of "
    "tissue maps as a voxel axis"
)


def loop_under_vmap(function):
    """Decorator of a public entry point: under vmap (innermost), one call per batch entry (module doc).

    While torch.compile or torch.export traces, the call is planned (`blochsim._tracing`). Outside torch.func
    transforms the call goes straight through (one C call looks at the transform
    stack). Under another transform whose arguments hold a vmap batch from further out, NotImplementedError.
    """

    @functools.wraps(function)
    def looped(*args, **kwargs):
        if tracing():  # torch.compile / torch.export: planned once, then traced operations (blochsim._tracing)
            return traced_call(function, args, kwargs)
        if _functorch.peek_interpreter_stack() is None:
            return function(*args, **kwargs)
        interpreter = retrieve_current_functorch_interpreter()
        if interpreter.key() != _functorch.TransformType.Vmap:
            tensors = []
            _map_tensors((args, kwargs), lambda t: tensors.append(t) or t)
            if any(holds_batch(t) for t in tensors):
                raise NotImplementedError(_UNDER_ANOTHER.format(name=function.__qualname__))
            return function(*args, **kwargs)
        level = interpreter.level()
        with interpreter.lower():
            calls = [_map_tensors((args, kwargs), functools.partial(_entry, level=level, index=0))]
            if calls[0][0] is args and calls[0][1] is kwargs:  # nothing batched here: one call serves every entry
                return looped(*args, **kwargs)
            calls += [_map_tensors((args, kwargs), functools.partial(_entry, level=level, index=b))
                      for b in range(1, interpreter.batch_size())]
            results = [looped(*call_args, **call_kwargs) for call_args, call_kwargs in calls]
        return _stack(results, level)

    return looped


def vmap_rule(function: type[torch.autograd.Function], info, in_dims: tuple, *args):
    """The `vmap` staticmethod of an autograd Function: `function.apply` per batch entry, stacked first.

    Returns (outputs, out_dims) as torch.func expects; a tuple of outputs gives a tuple of dims.
    """
    def entry(b: int) -> list:
        return [a.select(d, b) if isinstance(a, torch.Tensor) and isinstance(d, int) else a
                for a, d in zip(args, in_dims, strict=True)]

    results = [function.apply(*entry(b)) for b in range(info.batch_size)]
    if isinstance(results[0], tuple):
        return tuple(torch.stack(parts) for parts in zip(*results, strict=True)), (0,) * len(results[0])
    return torch.stack(results), 0
