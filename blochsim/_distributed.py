"""Many processes: `distributed()` splits each call's voxels across the ranks of a torch.distributed group.

Inside `with blochsim.distributed(group=None, gather=True):`, with torch.distributed initialised (gloo for host
tensors, NCCL for CUDA tensors; torchrun sets the environment `torch.distributed.init_process_group()` reads),
`Simulator.simulate` and `Simulator.jacobian`, and so every function form, run one contiguous range of the
call's voxels on each rank of `group` (default: the whole world), each under the rank's own execution policy.
The voxels are those of the broadcast shape of the tissue arrays, counted in C order; rank r of W takes
voxels [r*V//W, (r+1)*V//W).

* `gather=True` all-gathers: every rank returns the whole result, as a call outside the block would.
* `gather=False`: a rank returns its own range, the voxel axes flattened to one, and `shard_of(result)` gives
  `Shard(start, stop, total)`.

Gradients. Reverse mode sums the gradients of the protocol (and of every tissue value shared by several
voxels) over the ranks, so every rank sees the whole design gradient. With `gather=True` every rank is
expected to compute the same loss from the gathered result (the usual data-parallel pattern): the gradient
is that of the one loss, not of W copies of it, and a per-voxel tissue map gets its whole gradient on every
rank (its rows all-gathered), as the call outside the block would give it (`ModelOperator.A_vjp` then
works unchanged). With `gather=False` it is the gradient of the sum of the ranks' losses, and a per-voxel
tissue map gets its gradient on the rank that owns the voxel (zero elsewhere).
Every rank must call `backward()` (the sum is a collective). The collectives come in pairs that are each
other's derivative (all-gather and slice, all-reduce and identity), so second order (an HVP through
`torch.autograd.grad(..., create_graph=True)`) is exact, for losses that couple voxels of different ranks too.

Checks. Inputs must be identical on every rank: each call first all-gathers a checksum of its arguments
(their structure, and per array two integer sums of its bits; the device and execution settings, which may
differ, are left out) and raises ValueError naming the first argument that differs. A rank that dies makes
the others fail at their next collective with a RuntimeError saying so (gloo: at once, when its sockets
close); a rank that hangs, after `timeout_s` (default: the process group's own timeout, set by
`init_process_group(timeout=...)`).

The same machinery is open to other per-voxel work (`Estimator.map`, `ModelOperator`, estimator fits):
`map_voxels`, and a block's `voxel_range`, `gather_rows`, `sum_gradients`, `all_reduce`, `check_same`,
`mark`. `launched()` initialises a process group from torchrun's environment for a script or the CLI.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import datetime
import math
import os
import weakref
from collections.abc import Callable, Mapping
from typing import NamedTuple

import torch

from . import _sharding
from ._collectives import Collectives, _Slice

__all__ = ["distributed", "shard_of", "Shard", "DistributedBlock", "current", "suspended", "map_voxels",
           "launched"]

#: Run settings that may differ between ranks (each rank places its own work) and are left out of the checksum.
_LOCAL_SETTINGS = ("device", "execution")


class Shard(NamedTuple):
    """The voxels a result holds: [start, stop) of `total`, counted in C order over the call's voxel shape."""

    start: int
    stop: int
    total: int

    @property
    def slice(self) -> slice:
        return slice(self.start, self.stop)


# id(result) -> (weak reference to it, Shard). Keyed by id, not by the object: NumPy arrays do not hash.
_SHARDS: dict = {}


def _leaves(result):
    """The values of `result` that carry a shard: itself, or those in its tuples, lists, dicts and dataclasses."""
    if isinstance(result, (tuple, list)):
        for item in result:
            yield from _leaves(item)
    elif isinstance(result, Mapping):
        for item in result.values():
            yield from _leaves(item)
    elif dataclasses.is_dataclass(result) and not isinstance(result, type):
        for field in dataclasses.fields(result):
            yield from _leaves(getattr(result, field.name))
    elif result is not None:
        yield result


def mark(result, shard: Shard):
    """Record that `result` (a tensor, an array, or a tuple, dict or dataclass of them) holds `shard`; returns
    it."""
    for item in _leaves(result):
        key = id(item)
        try:
            ref = weakref.ref(item, lambda _, key=key: _SHARDS.pop(key, None))
        except TypeError:  # a value without weak references (a number): nothing to look up later
            continue
        _SHARDS[key] = (ref, shard)
    return result


def shard_of(result) -> Shard:
    """The voxels a result of a call inside `distributed()` holds: `Shard(start, stop, total)`.

    With `gather=False` a rank's result holds voxels [start, stop) of `total`, its voxel axes flattened to one;
    with `gather=True`, (0, total, total). A call without voxel arrays runs whole on every rank: (0, 1, 1).
    For the tuple a jacobian returns, the dict of maps `Estimator.map` returns or a `MatchResult`, that of their
    parts. Raises ValueError for anything else.
    """
    item = next(_leaves(result), None)
    entry = _SHARDS.get(id(item))
    if entry is None or entry[0]() is not item:
        raise ValueError(f"shard_of: this {type(result).__name__} was not returned by a blochsim call inside "
                         "blochsim.distributed(...); only those results carry their voxel range")
    return entry[1]


# -- the block --------------------------------------------------------------------------------------------
# (block, the link below it) while a block is active; (None, link) while one is suspended; None outside.
_ACTIVE: contextvars.ContextVar = contextvars.ContextVar("blochsim_distributed", default=None)


def current() -> DistributedBlock | None:
    """The innermost active `distributed()` block, or None (outside every block, or within a rank's own part)."""
    link = _ACTIVE.get()
    return None if link is None else link[0]


@contextlib.contextmanager
def suspended():
    """Run a rank's own part: calls inside do not split again."""
    token = _ACTIVE.set((None, _ACTIVE.get()))
    try:
        yield
    finally:
        _ACTIVE.reset(token)


def distributed(group=None, *, gather: bool = True, timeout_s: float | None = None) -> DistributedBlock:
    """A block (context manager) whose simulator calls split their voxels across the ranks of `group`.

    `group`: a torch.distributed process group (None: the default, whole world). `gather`: True all-gathers
    every result on every rank; False returns each rank its own voxels (`shard_of`). `timeout_s`: how long a
    collective waits for the other ranks before raising RuntimeError (None: the process group's timeout).
    Raises RuntimeError when torch.distributed is not initialised or this process is not in `group`, and
    ValueError for a bad `gather` or `timeout_s`. See the module docstring for gradients and checks.
    """
    return DistributedBlock(group, gather, timeout_s)


class DistributedBlock(Collectives):
    """The active `distributed()` block: the group, this rank's place in it, and the collectives blochsim uses
    (`Collectives`), with the routing of a simulator call (`run_call`) and of other per-voxel work."""

    def __init__(self, group, gather, timeout_s):
        if not isinstance(gather, bool):
            raise ValueError(f"gather must be True (every rank gets the whole result) or False (each rank its own "
                             f"voxels), got {gather!r}")
        if timeout_s is not None and (isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float))
                                      or not timeout_s > 0 or math.isinf(timeout_s)):
            raise ValueError(f"timeout_s must be a positive number of seconds or None (the process group's own "
                             f"timeout), got {timeout_s!r}")
        super().__init__(group, timeout_s)
        self.gather = gather

    def __repr__(self) -> str:
        return (f"distributed(rank {self.rank} of {self.world}, backend {self.backend}, gather={self.gather}, "
                f"timeout_s={self.timeout_s})")

    def __enter__(self) -> DistributedBlock:
        _ACTIVE.set((self, _ACTIVE.get()))
        return self

    def __exit__(self, *exc) -> None:
        link = _ACTIVE.get()
        if link is None or link[0] is not self:
            raise RuntimeError("distributed blocks must be left in the order they were entered (innermost first)")
        _ACTIVE.set(link[1])

    # -- a simulator call ------------------------------------------------------------------------
    def run_call(self, simulator, base, diff, protocol, tissue, settings, library, *, engine):
        """`Simulator.simulate` / `jacobian` split across the ranks (`_sharding.route`)."""
        where = f"{type(simulator).__name__}.{base.__name__}()"
        named = {"(call)": (where, diff)}
        named.update(protocol)
        named.update(tissue)
        named.update({k: v for k, v in settings.items() if k not in _LOCAL_SETTINGS})
        checked = self.start_check(where, named)  # waited for after this rank's work, which hides the wait
        arrays = {name: _sharding.as_tensor(value) for name, value in tissue.items()}
        arrays = {name: t for name, t in arrays.items() if t is not None}
        shape = _sharding.voxel_shape(arrays.values())
        total = _sharding.count_of(shape) if shape is not None else 0
        if shape is None or total == 0:  # no voxel axis to split (or nothing in it): every rank runs it whole
            with suspended(), _checked_after(checked):
                out = _sharding.call(simulator, base, diff, protocol, tissue, settings)
            whole = Shard(0, 1, 1) if shape is None else Shard(0, 0, 0)  # one voxel, or an empty voxel axis
            return mark(_sharding.in_library(out, library), whole)
        start, stop = self.voxel_range(total)
        # Values every voxel shares get gradients summed over the ranks: protocol tensors and broadcast tissue.
        shared = [(True, name) for name, value in protocol.items()
                  if isinstance(value, torch.Tensor) and value.requires_grad]
        shared += [(False, name) for name, t in arrays.items() if t.requires_grad and tuple(t.shape) != shape]
        protocol = dict(protocol)
        if shared and torch.is_grad_enabled():
            wrapped = self.sum_gradients(*(protocol[n] if p else arrays[n] for p, n in shared))
            for (is_protocol, name), value in zip(shared, wrapped, strict=True):
                (protocol if is_protocol else arrays)[name] = value

        def part(first: int, last: int) -> dict:
            return {name: _sharding.take(arrays[name], shape, first, last) if name in arrays else value
                    for name, value in tissue.items()}

        own = part(start, stop)
        if self.gather and torch.is_grad_enabled():
            # A per-voxel map's gradient is gathered back whole on every rank, as the result is.
            for name, t in arrays.items():
                if t.requires_grad and tuple(t.shape) == shape:
                    own[name] = _Slice.apply(t.reshape(-1), self, total, f"gather of {where}'s {name} gradient")
        with suspended(), _checked_after(checked):
            out = _sharding.call(simulator, base, diff, protocol, own, settings)

        def probe():
            with suspended(), torch.no_grad():
                one = _sharding.call(simulator, base, diff, protocol, part(start, start + 1), settings)
            return one[0] if isinstance(one, tuple) else one

        pieces = tuple(_sharding.as_tensor(x) for x in (out if isinstance(out, tuple) else (out,)))
        axis = _sharding.voxel_axis(pieces[0], stop - start, engine=engine, probe=probe)
        if self.gather:
            pieces = tuple(self._assemble(x, axis, shape, total, where) for x in pieces)
            shard = Shard(0, total, total)
        else:
            shard = Shard(start, stop, total)
        result = pieces if isinstance(out, tuple) else pieces[0]
        return mark(_sharding.in_library(result, library), shard)

    def _assemble(self, x: torch.Tensor, axis: int, shape: tuple, total: int, where: str) -> torch.Tensor:
        full = self.gather_rows(x.movedim(axis, 0), total, what=f"gather of {where}'s results").movedim(0, axis)
        return full.reshape(full.shape[:axis] + shape + full.shape[axis + 1:])

    # -- helpers for other per-voxel work -----------------------------------------------------------
    def map_voxels(self, fn: Callable, voxels: Mapping, shared: Mapping | None = None, *, where: str):
        """fn(**shards, **shared) on this rank's voxels; see the module function `map_voxels`."""
        shared = dict(shared or {})
        self.check_same(where, {**voxels, **shared})
        tensors = {name: _sharding.as_tensor(value) for name, value in voxels.items()}
        lengths = {name: (t.shape[0] if t is not None and t.dim() else None) for name, t in tensors.items()}
        sizes = set(lengths.values())
        if not sizes or len(sizes) != 1 or None in sizes:
            raise ValueError(f"{where}: the per-voxel inputs must be arrays sharing one leading voxel axis; got "
                             + ", ".join(f"{n}: {'no axis' if s is None else s}" for n, s in lengths.items()))
        total = sizes.pop()
        start, stop = self.voxel_range(total)
        names = [n for n, v in shared.items() if isinstance(v, torch.Tensor) and v.requires_grad]
        if names and torch.is_grad_enabled():
            shared.update(zip(names, self.sum_gradients(*(shared[n] for n in names)), strict=True))
        own = {}
        for name, t in tensors.items():
            if self.gather and torch.is_grad_enabled() and t.requires_grad:
                # The gradient of a gathered result comes back whole on every rank, as outside the block.
                own[name] = _Slice.apply(t, self, total, f"gather of {where}'s {name} gradient")
            else:
                own[name] = t[start:stop]
        with suspended():
            out = fn(**own, **shared)
        if not self.gather:
            return mark(out, Shard(start, stop, total))
        what = f"gather of {where}'s results"
        full = _map_rows(out, stop - start, lambda x: self.gather_rows(x, total, what=what))
        return mark(full, Shard(0, total, total))


@contextlib.contextmanager
def _checked_after(checked: Callable[[], None]):
    """Run the block, then `checked()`: inputs that differ raise their ValueError even when they made this
    rank's work fail (the error of the work is then its cause); otherwise the work's own error."""
    try:
        yield
    except BaseException as error:
        try:
            checked()
        except ValueError as differ:
            raise differ from error
        raise
    checked()


def _map_rows(out, count: int, fn):
    """`out` with `fn` applied to every tensor whose leading axis has `count` rows (tuples, lists, dicts and
    dataclasses walked); other values are left as they are."""
    if isinstance(out, torch.Tensor):
        return fn(out) if out.dim() and out.shape[0] == count else out
    if isinstance(out, tuple) and hasattr(out, "_fields"):
        return type(out)(*(_map_rows(v, count, fn) for v in out))
    if isinstance(out, (tuple, list)):
        return type(out)(_map_rows(v, count, fn) for v in out)
    if isinstance(out, Mapping):
        return {k: _map_rows(v, count, fn) for k, v in out.items()}
    if dataclasses.is_dataclass(out) and not isinstance(out, type):
        return dataclasses.replace(out, **{f.name: _map_rows(getattr(out, f.name), count, fn)
                                           for f in dataclasses.fields(out) if f.init})
    return out


def map_voxels(fn: Callable, voxels: Mapping, shared: Mapping | None = None, *, where: str):
    """`fn(**voxels, **shared)`, split across the ranks inside a `distributed()` block (as is, outside).

    For per-voxel work other than a simulator call (`Estimator.map`, `ModelOperator`): `voxels` are arrays
    sharing one leading voxel axis (flatten the voxel axes first); `shared` everything else (protocol,
    parameters). Inside a block, the inputs are checked identical on every rank (ValueError naming the first
    that differs), `fn` runs on this rank's rows of `voxels`, and every tensor of its output (a tensor, or a
    tuple, list, dict or dataclass of them) whose leading axis has this rank's row count is all-gathered
    (gather=True) or left as this rank's rows (gather=False, `shard_of(output)`). Gradients of the `shared`
    tensors are summed over the ranks; a per-voxel input gets its whole gradient on every rank with
    gather=True (as outside the block), its own rows' with gather=False. `where` names the caller in errors
    ("PERK.map").
    """
    block = current()
    if block is None:
        return fn(**voxels, **(shared or {}))
    return block.map_voxels(fn, voxels, shared, where=where)


# -- launching ----------------------------------------------------------------------------------------------
@contextlib.contextmanager
def launched(backend: str | None = None, timeout_s: float | None = None):
    """Initialise torch.distributed from torchrun's environment (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT,
    LOCAL_RANK) for the length of the block, and tear it down after; yields `(rank, world_size)`.

    Outside torchrun (no WORLD_SIZE) it yields (0, 1) and initialises nothing; a group already initialised is
    used as it is and left in place. `backend` None: 'cpu:gloo,cuda:nccl' when CUDA is available (host tensors
    through gloo, CUDA tensors through NCCL), else 'gloo'; with CUDA each process takes device LOCAL_RANK.
    `timeout_s`: the group's collective timeout (None: torch's default).
    """
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        yield dist.get_rank(), dist.get_world_size()
        return
    if "WORLD_SIZE" not in os.environ:
        yield 0, 1
        return
    if not dist.is_available():
        raise RuntimeError("launched by torchrun (WORLD_SIZE is set), but this torch has no torch.distributed")
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    kwargs = {} if timeout_s is None else {"timeout": datetime.timedelta(seconds=timeout_s)}
    dist.init_process_group(backend or ("cpu:gloo,cuda:nccl" if cuda else "gloo"), **kwargs)
    try:
        yield dist.get_rank(), dist.get_world_size()
    finally:
        dist.destroy_process_group()
