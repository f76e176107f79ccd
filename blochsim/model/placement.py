"""Where a call's protocol values live: host copies for walking a layout, the protocol vector on the run
device, tissue numbers copied to a card once, and the version checks that keep them current."""

from __future__ import annotations

import weakref

import torch

from .._arrays import (
    differentiated,
    transformed,
)


def on_host(args: dict) -> dict:
    """A protocol with its tensors on the CPU, for `layout()` and the compiler, which build their event
    tables on the host: a protocol tensor on a GPU is copied over once per walk, and autograd carries its
    gradient back to it. The kernels then run where the tissue is."""
    if all(not isinstance(v, torch.Tensor) or v.is_cpu for v in args.values()):
        return args
    return {name: value.cpu() if isinstance(value, torch.Tensor) else value for name, value in args.items()}


def _protocol_vector(leaves: list, device) -> torch.Tensor:
    """The protocol tensors flattened into one float64 vector `p`, whose affine map gives a resolved call's
    values. On the CPU when every tensor is there; otherwise on `device`, where the work runs, so that a
    protocol already on the GPU with the tissue is mapped there, with no copy and no wait for the card."""
    if not leaves:
        return torch.zeros(0, dtype=torch.float64)
    if not all(x.is_cpu for x in leaves):
        device = device if device is not None else next(x.device for x in leaves if not x.is_cpu)
        leaves = [x.to(device) for x in leaves]
    return leaves[0].reshape(-1) if len(leaves) == 1 else torch.cat([x.reshape(-1) for x in leaves])


def _on_device(value, device: torch.device) -> torch.Tensor:
    """A tissue value on `device` (off the CPU). A number, or a 0-d CPU tensor carrying no derivative, is
    copied there once and the copy reused while it is unmodified: the engine keeps its tissue packing and
    pool tables for device tensors by identity and version (a device value cannot be read without waiting
    for the card), so a fresh copy of each pool property on every call rebuilt them every call (~4 ms a
    call for pooled tissue on an H200, where the CPU matched its 0-d tensors by value)."""
    if isinstance(value, torch.Tensor):
        if value.dim() != 0 or not value.is_cpu or not value.is_floating_point() or differentiated(value):
            return value.to(device)
        number, dtype = value.item(), value.dtype
    else:
        number, dtype = float(value), torch.get_default_dtype()  # the dtype torch.tensor(float) gives
    if transformed():  # a batched or dual value under a transform: nothing is shared
        return value.to(device) if isinstance(value, torch.Tensor) else torch.tensor(number, device=device)
    key = (number.hex(), dtype, device)  # hex: -0.0 and 0.0, and each NaN payload, stay apart
    kept = _DEVICE_SCALARS.get(key)
    if kept is not None and kept[0]._version == kept[1] and not kept[0].requires_grad:
        return kept[0]
    moved = value.to(device) if isinstance(value, torch.Tensor) else torch.tensor(number, dtype=dtype, device=device)
    if len(_DEVICE_SCALARS) >= _DEVICE_SCALARS_MAX:  # a sweep over many values: start over, nothing grows
        _DEVICE_SCALARS.clear()
    _DEVICE_SCALARS[key] = (moved, moved._version)
    return moved


#: Numbers copied to a device by `_on_device`: (hex value, dtype, device) -> (tensor, its version when made).
_DEVICE_SCALARS: dict = {}
_DEVICE_SCALARS_MAX = 256


def _versions(leaves: list) -> tuple:
    """(weak reference, version counter) of each protocol tensor."""
    return tuple((weakref.ref(x), x._version) for x in leaves)


def _unchanged(seen: tuple, leaves: list) -> bool:
    """Whether `leaves` are the very tensors of `seen`, none changed in place since."""
    return len(seen) == len(leaves) and all(
        ref() is x and x._version == version for (ref, version), x in zip(seen, leaves, strict=True))


