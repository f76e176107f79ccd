"""Array libraries at the public edge: NumPy, CuPy or torch in, the same library out.

Inputs are imported as torch tensors through DLPack or `torch.from_numpy` (no copy where the dtype
allows). Results go back to the library of the first array-valued argument of the call, in keyword
order; if the call has none, to that of the first array among the fixed (constructor, then `bind`)
values; otherwise they stay torch. Lists, tuples and Python numbers are not array-valued.
"""

from __future__ import annotations

import numbers
import weakref

import numpy as np
import torch
import torch.autograd.forward_ad as fwAD

__all__ = ["library_of", "first_library", "to_tensor", "to_library", "is_array", "as_number", "broadcast_shapes",
           "differentiated", "transformed", "reverse_jvps", "LastResult"]


def library_of(value) -> str | None:
    """'torch', 'numpy' or 'cupy' for an array of that library, else None."""
    if isinstance(value, torch.Tensor):
        return "torch"
    if isinstance(value, np.ndarray):
        return "numpy"
    module = type(value).__module__
    if module.startswith("cupy") and hasattr(value, "__dlpack__"):
        return "cupy"
    return None


def is_array(value) -> bool:
    return library_of(value) is not None


def first_library(*mappings) -> str | None:
    """The library of the first array-valued entry over `mappings` in order (insertion order each)."""
    for mapping in mappings:
        for value in mapping.values():
            lib = library_of(value)
            if lib is not None:
                return lib
    return None


def to_tensor(value, *, dtype: torch.dtype | None = None, name: str = "value") -> torch.Tensor:
    """`value` (number, list, tuple, NumPy, CuPy or torch array) as a torch tensor.

    `dtype` None keeps a float or complex dtype and makes anything else float32 (bool and integer arrays
    included). A torch tensor keeps its autograd graph.
    """
    lib = library_of(value)
    if lib == "torch":
        t = value
    elif lib == "numpy":
        t = torch.from_numpy(value) if value.dtype.kind in "fciub" and value.dtype.isnative else torch.as_tensor(
            np.asarray(value, dtype=np.float64))
    elif lib == "cupy":
        t = torch.from_dlpack(value)
    else:
        if isinstance(value, (list, tuple)) and any(isinstance(v, torch.Tensor) for v in value):
            parts = [to_tensor(v, name=name) for v in value]
            common = parts[0].dtype
            for p in parts[1:]:
                common = torch.promote_types(common, p.dtype)
            t = torch.stack([p.to(common) for p in parts])
        else:
            try:
                t = torch.as_tensor(np.asarray(value))
            except (TypeError, ValueError):
                raise TypeError(f"{name} must be a number or an array of numbers, got {value!r}") from None
            if t.dtype == torch.float64 and not _has_array(value):
                t = t.to(torch.float32)  # Python numbers count as float32
    if dtype is not None:
        return t if t.dtype == dtype else t.to(dtype)
    if not (t.is_floating_point() or t.is_complex()):
        t = t.to(torch.float32)
    return t


def _has_array(value) -> bool:
    """Whether a nested list holds a NumPy array or NumPy float64 scalar (which keeps float64)."""
    if isinstance(value, (np.ndarray, np.floating)):
        return value.dtype == np.float64
    if isinstance(value, (list, tuple)):
        return any(_has_array(v) for v in value)
    return False


def to_library(result, library: str | None):
    """A torch result (tensor, or tuple of tensors) in `library` (None or 'torch': unchanged)."""
    if isinstance(result, tuple):
        return tuple(to_library(r, library) for r in result)
    if library in (None, "torch") or not isinstance(result, torch.Tensor):
        return result
    if library == "numpy":
        return result.detach().resolve_conj().cpu().numpy()
    import cupy  # a CuPy input means CuPy is installed

    return cupy.from_dlpack(result.detach().resolve_conj())


def as_number(value):
    """A Python number for a Python or NumPy scalar (or 0-d NumPy/CuPy array), else `value` unchanged."""
    if isinstance(value, (bool, int, float, complex, torch.Tensor)):  # a tensor: without the ABC check below
        return value
    if isinstance(value, numbers.Number):  # NumPy scalars
        return value.item()
    lib = library_of(value)
    if lib in ("numpy", "cupy") and value.ndim == 0:
        return value.item()
    return value


def broadcast_shapes(*shapes) -> tuple:
    """NumPy broadcasting of shapes (torch.broadcast_shapes imports sympy on first use: ~0.4 s)."""
    ndim = max((len(s) for s in shapes), default=0)
    out = [1] * ndim
    for shape in shapes:
        for i, n in enumerate(shape, start=ndim - len(shape)):
            if n != 1:
                if out[i] not in (1, n):
                    raise ValueError(f"shapes {[tuple(s) for s in shapes]} do not broadcast")
                out[i] = n
    return tuple(out)


def differentiated(x) -> bool:
    """A tensor carrying a derivative: reverse mode (requires_grad) or a forward-mode tangent."""
    return isinstance(x, torch.Tensor) and (x.requires_grad or fwAD.unpack_dual(x).tangent is not None)


def transformed() -> bool:
    """Whether a forward-mode AD level or a torch.func transform is active (tensors may carry tangents or
    batch dimensions that `requires_grad` does not show)."""
    return fwAD._current_level >= 0 or torch._C._functorch.peek_interpreter_stack() is not None


class LastResult:
    """The result of the last call made with some values, kept while its tensors are alive and unmodified.

    `lookup(settings, parts)` takes the call's hashable settings and its `(name, value)` pairs and returns
    `(hit, key)`: the kept result or None, and the key to `keep` a new one under (None when nothing may be
    kept: a tensor that requires grad, forward-mode AD or a torch.func transform active, or a value that
    is neither a number, a tuple of numbers nor a tensor). A tensor is matched by identity and version
    counter (an in-place change misses), a 0-d CPU tensor (a number made a tensor afresh) by its value.

    `kept_for(owner, settings)` asks the same of an immutable owner of the values (a frozen
    `TissueProperties`) that `keep` was given: the same object, settings and tensor versions, without
    walking its fields (a fifth of an engine call's host time with the 45 tissue fields).
    """

    __slots__ = ("key", "refs", "value", "owner", "settings", "versions")

    def __init__(self):
        self.key, self.refs, self.value = None, [], None
        self.owner, self.settings, self.versions = None, None, []

    def kept_for(self, owner, settings: tuple):
        """The kept result when `owner` is the object it was kept for, unchanged, else None."""
        if self.owner is None or self.owner() is not owner or self.settings != settings or transformed():
            return None
        for ref, version in zip(self.refs, self.versions, strict=True):
            t = ref()
            if t is None or t._version != version or t.requires_grad:
                return None
        return self.value

    def lookup(self, settings: tuple, parts) -> tuple:
        if transformed():
            return None, None
        key, tensors, scalars = list(settings), [], []
        for name, value in parts:
            if isinstance(value, torch.Tensor):
                if value.requires_grad:
                    return None, None
                if value.dim() == 0 and value.device.type == "cpu":
                    key.append((name, value.item()))
                    scalars.append(value)
                else:
                    key.append((name, id(value), value._version))
                    tensors.append(value)
            elif isinstance(value, (int, float, tuple)):
                key.append((name, value))
            else:
                return None, None
        key = (tuple(key), tensors, scalars, settings)
        if self.key == key[0] and all(r() is v for r, v in zip(self.refs[: len(tensors)], tensors, strict=True)):
            return self.value, key
        return None, key

    def keep(self, key, value, owner=None) -> None:
        """Keep `value` under `key` (from `lookup`); `owner`: the immutable object its parts came from."""
        if key is not None:
            every = key[1] + key[2]  # the tensors matched by identity, then the 0-d CPU ones
            self.key, self.refs, self.value = key[0], [weakref.ref(v) for v in every], value
            self.owner = None if owner is None else weakref.ref(owner)
            self.settings, self.versions = key[3], [v._version for v in every]


def reverse_jvps(outputs, leaves, differentiable: bool) -> list:
    """Per leaf, the Jacobian-vector products of `outputs` along that leaf in the direction of ones:
    `result[j][i]` for output i and leaf j (None where output i does not depend on leaf j).

    Two reverse passes (the "double-vjp" identity: u -> J^T u is linear in u, so its own vjp with the
    direction is J v), with scalar outputs throughout; complex outputs are probed through real views. Used
    instead of forward-mode AD: in torch 2.13 a dual tensor times a Python number runs a Python reference
    whose first use imports torch._dynamo (seconds), and autograd.grad given `grad_outputs` imports sympy.
    The leaves must require grad and the outputs be computed from them with grad enabled.
    `differentiable`: the products keep their graph (something else the outputs depend on requires grad).
    """
    result = [[None] * len(outputs) for _ in leaves]
    live = [i for i, t in enumerate(outputs) if t is not None and t.requires_grad]
    if not live:
        return result
    with torch.enable_grad():
        flat = [torch.view_as_real(outputs[i]) if outputs[i].is_complex() else outputs[i] for i in live]
        probes = [torch.zeros_like(f, requires_grad=True) for f in flat]
        inner = sum((f * u).sum() for f, u in zip(flat, probes, strict=True))
        pulled = torch.autograd.grad(inner, list(leaves), create_graph=True, allow_unused=True)
        for j, p in enumerate(pulled):
            if p is None or not p.requires_grad:  # output independent of this leaf
                continue
            pushed = torch.autograd.grad(p.sum(), probes, create_graph=differentiable, retain_graph=True,
                                         allow_unused=True)
            for i, t in zip(live, pushed, strict=True):
                if t is not None and outputs[i].is_complex():
                    t = torch.view_as_complex(t.contiguous())
                result[j][i] = t
    return result
