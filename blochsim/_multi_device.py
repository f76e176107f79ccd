"""Several CUDA devices in one process: a simulator call's voxels spread over them.

A call spreads when its execution policy names two devices or more (`execution([...])`, `offload([...])`,
`distribute([...])`), or, under `execution("auto")` with two visible CUDA devices or more, when its tissue is
on a CUDA device, it has at least `AUTO_SPREAD_VOXELS` voxels and no autograd history (a call that carries
history stays on its tensors' device unless the policy names devices), and this process has the node's
cards to itself (not when torchrun starts several processes on the node, one card each: `_shares_node`).
Then (`_sharding`):

* each device takes one contiguous range of the voxels, the device the tissue is on first;
* the range's tissue is staged on its device (host tensors through pinned memory, copied asynchronously),
  except under `offload`, where it stays on the host and the device's part streams it chunk by chunk;
* each part runs under a one-device copy of the policy (its budget, stream setting and `lanes` chunks in
  flight, each lane on its own stream), on that device's current stream. Parts are started one after the
  other from this thread: a part on a device whose inputs are there returns once its kernels are queued,
  so the devices work at the same time. Under `offload` a part waits on its own host copies, so each part
  runs in a thread of its own;
* results return to the inputs' device (the tissue tensors', as on one device), put together along the
  voxel axis.

Autograd flows through the staging copies and the concatenation, so protocol and tissue gradients, and
second order, are those of one device; each part's backward runs on its own device (torch's autograd works
a device's nodes in that device's thread). Results equal the one-device run up to the float32 order of the
protocol gradients' sum over voxels.

`distribute(devices)` spreads voxels when there are at least `MIN_VOXELS_PER_DEVICE` per device; with fewer
it shards the trains of a call that has at least 2 (`train_placement`, entered by the engine's train loop),
as the incumbent does.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import os
import threading

import torch

from . import _sharding
from ._errors import check_device
from ._execution import active, applied, as_policy

__all__ = ["route", "devices_for", "spread", "stage", "train_placement", "AUTO_SPREAD_VOXELS",
           "MIN_VOXELS_PER_DEVICE"]

#: Under execution("auto"), a call on a CUDA device spreads over every visible device from this many voxels.
#: Not measured yet (no host with two GPUs has run benchmarks/scaling.py): below it a call of a few ms would
#: pay more for the second device's copies than it saves.
AUTO_SPREAD_VOXELS = 1 << 17

#: distribute(devices) spreads voxels from this many per device, and shards trains below it.
MIN_VOXELS_PER_DEVICE = 1024


#: The visible CUDA devices, once fixed: always 0 for a torch built without CUDA; otherwise counted again on
#: every call until CUDA is initialised (CUDA_VISIBLE_DEVICES may still change before that), then kept, as
#: torch keeps its own count. Every simulator call asks (`one_device`): counting costs ~10 Python calls.
_VISIBLE_CUDA: int | None = None if torch.backends.cuda.is_built() else 0


def _visible_cuda() -> int:
    global _VISIBLE_CUDA
    if _VISIBLE_CUDA is not None:
        return _VISIBLE_CUDA
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if torch.cuda.is_initialized():
        _VISIBLE_CUDA = count
    return count


def _shares_node() -> bool:
    """Whether other processes of this job run on this node (torchrun's LOCAL_WORLD_SIZE > 1; without it,
    torch.distributed initialised with several ranks): each then keeps to its own card, so "auto" must not
    spread over the others'."""
    local = os.environ.get("LOCAL_WORLD_SIZE")
    if local is not None:
        return local.strip().isdigit() and int(local) > 1
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def _policy_of(simulator, settings: dict):
    value = settings["execution"] if "execution" in settings else getattr(type(simulator), "execution", None)
    return as_policy(value) or active()


def devices_named(simulator, settings) -> bool:
    """Whether the call's policy names several devices (`execution([...])`, `offload([...])`)."""
    target = _policy_of(simulator, settings).target
    return isinstance(target, tuple) and len(target) >= 2


def one_device(policy) -> bool:
    """Whether every call under `policy` runs on one device, whatever its size: the policy names at most one
    device, or it is "cpu", or "auto" with fewer than two visible CUDA devices."""
    target = policy.target
    if target == "auto":
        return _visible_cuda() < 2
    return target == "cpu" or len(target) < 2


def route(simulator, base, diff, protocol, tissue, settings, library, *, engine):
    """The call spread over several devices (`_sharding.route`), or None when it runs on one."""
    policy = _policy_of(simulator, settings)
    if one_device(policy):
        return None
    arrays = {name: _sharding.as_tensor(value) for name, value in tissue.items()}
    arrays = {name: t for name, t in arrays.items() if t is not None}
    shape = _sharding.voxel_shape(arrays.values())
    if shape is None:
        return None
    home = _home(arrays.values(), settings)
    devices = devices_for(policy, home, _sharding.count_of(shape), (*protocol.values(), *arrays.values()))
    if devices is None:
        return None
    return spread(simulator, base, diff, protocol, tissue, settings, library, engine=engine, devices=devices,
                  policy=policy, arrays=arrays, shape=shape, home=home)


def _home(tensors, settings: dict) -> torch.device:
    """Where results return: the tissue tensors' device (any off the host decides), else `device=`, else the
    host; as `Simulator` places a call."""
    home = None
    for t in tensors:
        if home is None or t.device.type != "cpu":
            home = t.device
    if home is None and settings.get("device") is not None:
        home = torch.device(settings["device"])
    return home or torch.device("cpu")


def devices_for(policy, home: torch.device, total: int, values=()) -> tuple | None:
    """The devices a call of `total` voxels on `home` spreads over under `policy` (None: it does not), the
    device of `home` first. `values`: the call's values, whose autograd history keeps an "auto" call home."""
    target = policy.target
    if target == "cpu":
        return None
    if target == "auto":
        count = _visible_cuda()
        if count < 2 or home.type != "cuda" or total < AUTO_SPREAD_VOXELS or _shares_node():
            return None
        if torch.is_grad_enabled() and any(isinstance(v, torch.Tensor) and v.requires_grad for v in values):
            return None
        devices = [torch.device("cuda", i) for i in range(count)]
    else:
        if len(target) < 2:
            return None
        if policy.trains and total < MIN_VOXELS_PER_DEVICE * len(target):
            return None  # distribute(): few voxels, so the train loop shards trains (train_placement)
        devices = [d if d.type != "cuda" or d.index is not None else torch.device("cuda", torch.cuda.current_device())
                   for d in target]
    devices = list(dict.fromkeys(devices))
    if home in devices:
        devices.remove(home)
        devices.insert(0, home)
    devices = devices[:max(total, 1)]
    if len(devices) < 2:
        return None
    for device in devices:
        if device.type == "cuda":
            check_device(device)
    return tuple(devices)


def spread(simulator, base, diff, protocol, tissue, settings, library, *, engine, devices, policy, arrays, shape,
           home):
    """The call run as one part per device of `devices` (ranges of the voxels in order), put together on `home`.

    `devices` may hold host devices too ("cpu" parts run under execution("cpu")): the tests run the
    splitting and gathering that way on machines without GPUs.
    """
    total = _sharding.count_of(shape)
    part_settings = {k: v for k, v in settings.items() if k != "device"}
    staged = not policy.offload
    parts = []
    for device, (start, stop) in zip(devices, _sharding.even_ranges(total, len(devices)), strict=True):
        own = dataclasses.replace(policy, target=(device,), trains=False) if device.type == "cuda" else \
            dataclasses.replace(policy, target="cpu", trains=False, offload=False)
        part = {}
        for name, value in tissue.items():
            if name in arrays:
                value = _sharding.take(arrays[name], shape, start, stop)
                value = stage(value, device) if staged else value
            part[name] = value
        parts.append((device, start, stop, part, {**part_settings, "execution": own}))

    def run(entry):
        _, _, _, part, own_settings = entry
        return _sharding.call(simulator, base, diff, protocol, part, own_settings)

    if staged:
        outputs = [run(entry) for entry in parts]
    else:
        outputs = _in_threads(run, parts)
    first = parts[0]

    def probe():
        device, start, _, part, own_settings = first
        one = {name: (stage(_sharding.take(arrays[name], shape, start, start + 1), device) if staged else
                      _sharding.take(arrays[name], shape, start, start + 1)) if name in arrays else value
               for name, value in tissue.items()}
        with torch.no_grad():
            out = _sharding.call(simulator, base, diff, protocol, one, own_settings)
        return out[0] if isinstance(out, tuple) else out

    tupled = isinstance(outputs[0], tuple)
    pieces = [tuple(_sharding.as_tensor(x) for x in (out if tupled else (out,))) for out in outputs]
    axis = _sharding.voxel_axis(pieces[0][0], first[2] - first[1], engine=engine, probe=probe)
    result = []
    for k in range(len(pieces[0])):
        parts_k = [piece[k] for piece in pieces]
        if any(p.requires_grad for p in parts_k):
            whole = torch.cat([p.to(home) for p in parts_k], dim=axis)
        else:  # each part copied once, into its place (a dictionary's result is most of a card's memory)
            size = list(parts_k[0].shape)
            size[axis] = total
            whole = torch.empty(size, dtype=parts_k[0].dtype, device=home)
            at = 0
            for p in parts_k:
                whole.narrow(axis, at, p.shape[axis]).copy_(p)
                at += p.shape[axis]
        result.append(whole.reshape(whole.shape[:axis] + shape + whole.shape[axis + 1:]))
    return _sharding.in_library(tuple(result) if tupled else result[0], library)


class _Staged(torch.autograd.Function):
    """A host tensor copied to a CUDA device through pinned memory; backward copies the gradient back."""

    @staticmethod
    def forward(ctx, x, device):
        ctx.source = x.device
        return x.pin_memory().to(device, non_blocking=True)

    @staticmethod
    def backward(ctx, grad):
        return grad.to(ctx.source), None


def stage(x: torch.Tensor, device: torch.device) -> torch.Tensor:
    """`x` on `device` (differentiable); host tensors bound for a CUDA device go through pinned memory and
    are copied asynchronously."""
    if x.device == device:
        return x
    if x.device.type == "cpu" and device.type == "cuda":
        return _Staged.apply(x, device) if x.requires_grad else x.pin_memory().to(device, non_blocking=True)
    return x.to(device, non_blocking=True)


def _in_threads(fn, entries) -> list:
    """fn(entry) for every entry, each in a thread of its own with the caller's context (execution policy,
    distributed block) and grad mode; re-raises the first error in entry order."""
    results, errors = [None] * len(entries), [None] * len(entries)
    grad, inference = torch.is_grad_enabled(), torch.is_inference_mode_enabled()

    def work(i, context):
        def body():
            with torch.inference_mode(inference), torch.set_grad_enabled(grad):
                results[i] = fn(entries[i])
        try:
            context.run(body)
        except BaseException as error:  # handed to the caller's thread
            errors[i] = error

    threads = [threading.Thread(target=work, args=(i, contextvars.copy_context()), daemon=True)
               for i in range(len(entries))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for error in errors:
        if error is not None:
            raise error
    return results


@contextlib.contextmanager
def train_placement(index: int, count: int):
    """Inside the engine's loop over the `count` trains of a call: under `distribute(devices)`, train `index`
    runs on its device (contiguous blocks of trains per device); under any other policy, nothing changes."""
    policy = active()
    if not policy.trains or isinstance(policy.target, str) or len(policy.target) < 2 or count < 2:
        yield
        return
    devices = policy.target
    with applied(dataclasses.replace(policy, target=(devices[index * len(devices) // count],), trains=False)):
        yield
