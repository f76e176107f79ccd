"""Voxel ranges of one simulator call: what `distributed()` (ranks of a process group) and the multi-device
policies (CUDA devices of one process) share.

Every voxel of a call is independent of the others, so a call over the voxels of `voxel_shape` (the broadcast
shape of its tissue arrays) runs as calls over contiguous ranges of those voxels, counted in C order. A range's
tissue is its slice of every tissue array, flattened to one voxel axis (`take`); protocol and run settings are
the call's own. The results of the ranges are put back together along the voxel axis (`voxel_axis` finds it).

`route` is the hook of `Simulator.simulate` and `Simulator.jacobian`, called once their arguments are sorted
into protocol, tissue and run settings: it returns None when the call runs as usual (no `distributed()` block
and one device), else the call's result. The parts call those base methods themselves, not the simulator's
own: a subclass that post-processes around `super().simulate()` (MPRAGE takes one sample) does so once, on
the whole result.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from . import _arrays

__all__ = ["route", "as_tensor", "voxel_shape", "take", "voxel_axis", "call", "even_ranges", "in_library"]


def route(simulator, base, diff, protocol: dict, tissue: dict, settings: dict, library, *, engine: bool):
    """The result of `base(simulator, ...)` split over ranks or devices, or None to run it as usual.

    `base` is `Simulator.simulate` or `Simulator.jacobian` (then `diff` holds the names): the parts call it on
    `simulator`, each with its own voxels. `protocol`, `tissue`, `settings` are the
    call's values over the simulator's fixed ones; `library` the output's array library; `engine` whether the
    output is laid out as an event train's, `(*trains, *voxel, ...)`, rather than a closed form's `(*voxel, ...)`.
    """
    from . import _distributed, _multi_device  # they import this module

    split = _distributed.current()
    if split is None and _multi_device.one_device(_multi_device._policy_of(simulator, settings)):
        # Outside distributed() and with one device, the usual case: decided in a few Python calls (this runs on
        # every simulate and jacobian). A channel count that the shims and pulses disagree on is the engine's
        # ValueError, raised before any work as on every other call.
        return None
    # B1 and B1phase lead with a channel axis under shims or dynamic pTx pulses: a split would cut it as voxels.
    channels = engine and simulator._channels(settings) is not None
    if channels and (split is not None or _multi_device.devices_named(simulator, settings)):
        raise NotImplementedError("a call whose B1 and B1phase carry a channel axis (shims or dynamic pTx pulses) "
                                  "runs on one device: leave out distributed() and execution([...several devices])")
    if split is not None:
        return split.run_call(simulator, base, diff, protocol, tissue, settings, library, engine=engine)
    if channels:
        return None  # "auto" spreads large calls where it can; this one runs where its tissue is
    return _multi_device.route(simulator, base, diff, protocol, tissue, settings, library, engine=engine)


def as_tensor(value) -> torch.Tensor | None:
    """A tissue value as a torch tensor without copying (NumPy and CuPy arrays, lists), None for a number or
    anything else that is not an array."""
    if isinstance(value, torch.Tensor):
        return value
    library = _arrays.library_of(value)
    if library == "numpy":
        return torch.from_numpy(np.ascontiguousarray(value))
    if library == "cupy":
        return torch.from_dlpack(value)
    if isinstance(value, (list, tuple)):
        array = np.asarray(value)
        if array.dtype.kind in "biufc":
            return torch.from_numpy(array)
    return None


def voxel_shape(tensors) -> tuple | None:
    """The broadcast shape of the tissue arrays of one dimension or more, or None when there are none or
    their shapes do not broadcast (the simulator, run as usual, then says why)."""
    shapes = [tuple(t.shape) for t in tensors if t.dim() > 0]
    if not shapes:
        return None
    try:
        return tuple(torch.broadcast_shapes(*shapes))
    except RuntimeError:
        return None


def take(x: torch.Tensor, shape: tuple, start: int, stop: int) -> torch.Tensor:
    """Voxels [start, stop) of `x` broadcast to `shape`, counted in C order: shape (stop - start,).

    A 0-d tensor is returned as it is (it broadcasts). Autograd flows back to `x`: a map of the full shape
    gets gradients on its own voxels only; a broadcast one (numel 1, or size 1 along some axes) sums them.
    """
    if x.dim() == 0:
        return x
    count = stop - start
    if tuple(x.shape) == shape:
        return x.reshape(-1)[start:stop]
    if x.numel() == 1:
        return x.reshape(1).expand(count)
    # Broadcast along some axes: index the voxels' own entries (a copy of the range, not of the full shape).
    padded = (1,) * (len(shape) - x.dim()) + tuple(x.shape)
    index = torch.arange(start, stop, device=x.device)
    offset = torch.zeros_like(index)
    stride = 1
    for size, own in zip(reversed(shape), reversed(padded), strict=True):
        coordinate = index % size
        index = index // size
        if own != 1:
            offset += coordinate * stride
        stride *= own
    return x.reshape(-1)[offset]


def even_ranges(total: int, parts: int) -> list[tuple[int, int]]:
    """`parts` contiguous ranges covering [0, total): part i is [i*total//parts, (i+1)*total//parts), the
    sizes differing by at most one."""
    return [(i * total // parts, (i + 1) * total // parts) for i in range(parts)]


def voxel_axis(out: torch.Tensor, count: int, *, engine: bool, probe) -> int:
    """The axis of `out` (a call's result over `count` voxels on one axis) that runs over the voxels.

    A closed form puts the voxels first. An event train puts them after its train axis, if the call has one
    (at least 2 trains, first); what a simulator adds after the voxels (samples, parameters) is its own. Only
    when the first two axes both have `count` entries is that ambiguous: `probe()` then gives the result over
    one voxel, whose shape tells.
    """
    if not engine or out.dim() == 0:
        return 0
    if out.shape[0] != count:
        return 1
    # Trains (at least 2) would put the `count` voxels second: not so when the second axis differs, or when
    # one voxel or none leaves a first axis too short for trains.
    if out.dim() < 2 or out.shape[1] != count or count <= 1:
        return 0
    return 0 if probe().shape[0] == 1 else 1


def call(simulator, base, diff, protocol: dict, tissue: dict, settings: dict):
    """`base(simulator, ...)` (`Simulator.simulate`, or `Simulator.jacobian` of `diff`) with these values over
    the simulator's fixed ones. Tissue goes first, so the first array of the call (which sets the output's
    library) is one of its tensors: torch."""
    values = {**tissue, **protocol, **settings}
    if base.__name__ == "jacobian":
        return base(simulator, diff, **values)
    return base(simulator, **values)


def in_library(result, library):
    """A torch result (a tensor or a tuple of them) in the caller's array library."""
    return _arrays.to_library(result, library)


def count_of(shape: tuple) -> int:
    return math.prod(shape)
