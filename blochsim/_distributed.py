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
import enum
import hashlib
import math
import os
import struct
import time
import weakref
from collections.abc import Callable, Mapping
from typing import NamedTuple

import torch

from . import _sharding

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


def mark(result, shard: Shard):
    """Record that `result` (a tensor, an array, a tuple or a dataclass of them) holds `shard`; returns it."""
    items = result if isinstance(result, (tuple, list)) else (result,)
    for item in items:
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
    For the tuple a jacobian returns, that of its parts. Raises ValueError for anything else.
    """
    item = result[0] if isinstance(result, (tuple, list)) and result else result
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


class DistributedBlock:
    """The active `distributed()` block: the group, this rank's place in it, and the collectives blochsim uses."""

    def __init__(self, group, gather, timeout_s):
        if not isinstance(gather, bool):
            raise ValueError(f"gather must be True (every rank gets the whole result) or False (each rank its own "
                             f"voxels), got {gather!r}")
        if timeout_s is not None and (isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float))
                                      or not timeout_s > 0 or math.isinf(timeout_s)):
            raise ValueError(f"timeout_s must be a positive number of seconds or None (the process group's own "
                             f"timeout), got {timeout_s!r}")
        import torch.distributed as dist

        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError("blochsim.distributed() needs torch.distributed initialised: call "
                               "torch.distributed.init_process_group() first (launched by torchrun, it reads the "
                               "rank and world size from the environment; backend 'gloo' for host tensors, "
                               "'nccl' for CUDA ones)")
        self.group, self.gather = group, gather
        self.rank, self.world = dist.get_rank(group), dist.get_world_size(group)
        if self.rank < 0:
            raise RuntimeError(f"blochsim.distributed(group={group!r}): this process (global rank "
                               f"{dist.get_rank()}) is not a member of the group")
        self.backend = str(dist.get_backend(group))
        self.timeout_s = None if timeout_s is None else float(timeout_s)
        self._served = _served_devices(self.backend)

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

    # -- voxel ranges ----------------------------------------------------------------------------
    def voxel_range(self, total: int) -> tuple[int, int]:
        """This rank's voxels [start, stop) of `total`."""
        return self.rank * total // self.world, (self.rank + 1) * total // self.world

    def counts(self, total: int) -> list[int]:
        """Voxels of each rank, in rank order."""
        return [stop - start for start, stop in _sharding.even_ranges(total, self.world)]

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
        with suspended():
            out = fn(**{n: t[start:stop] for n, t in tensors.items()}, **shared)
        if not self.gather:
            return mark(out, Shard(start, stop, total))
        what = f"gather of {where}'s results"
        full = _map_rows(out, stop - start, lambda x: self.gather_rows(x, total, what=what))
        return mark(full, Shard(0, total, total))

    def gather_rows(self, rows: torch.Tensor, total: int, *, what: str = "gather") -> torch.Tensor:
        """Every rank's rows (this rank's are `rows`, its `voxel_range(total)`), in rank order: shape
        (total, *rows.shape[1:]). Differentiable (backward: this rank's rows of the gradient, which every rank
        is expected to hold the same of), to any order."""
        return _Gather.apply(rows, self, total, what)

    def sum_gradients(self, *tensors: torch.Tensor) -> tuple:
        """The tensors unchanged, with their gradients summed over the ranks in backward (one all-reduce)."""
        return _SumGradients.apply(self, *tensors)

    def all_reduce(self, *tensors: torch.Tensor, what: str = "sum") -> tuple:
        """The sums over the ranks of each tensor (shape and dtype kept; one all-reduce in float64 for all).
        Differentiable: each rank's gradient is the (common) gradient of the sum."""
        return _AllReduce.apply(self, what, *tensors)

    def gather_objects(self, value, *, what: str) -> list:
        """Every rank's `value` (any picklable object), in rank order: a collective every rank must call, so
        it is also a barrier (the command line's steps wait on it)."""
        import torch.distributed as dist

        everyone = [None] * self.world
        self._run(what, lambda: dist.all_gather_object(everyone, value, group=self.group))
        return everyone

    def check_same(self, where: str, named: Mapping) -> None:
        """Raise ValueError on every rank unless `named` (name -> value) is identical on every rank.

        One all-gather of a 128-bit digest; on a mismatch a second one of per-name digests names the first
        argument that differs and the first rank that differs from rank 0."""
        self.start_check(where, named)()

    def start_check(self, where: str, named: Mapping) -> Callable[[], None]:
        """`check_same` in two steps: this starts the all-gather of the digest and returns the function that
        waits for it and raises. Work done in between overlaps the wait for the other ranks to arrive."""
        parts = _digests(named)
        total = hashlib.blake2b(b"".join(n.encode() + b"\0" + d for n, d in parts.items()), digest_size=16)
        mine = torch.tensor(struct.unpack("<2q", total.digest()), dtype=torch.int64)
        arrived = self._all_gather_flat(mine, what=f"input check of {where}", wait=False)
        return lambda: self._compare(where, parts, arrived())

    def _compare(self, where: str, parts: dict, everyone: torch.Tensor) -> None:
        if bool((everyone == everyone[0]).all()):
            return
        import torch.distributed as dist

        lists = [None] * self.world
        self._run("comparison of the inputs", lambda: dist.all_gather_object(lists, parts, group=self.group))
        for rank in range(1, self.world):
            if lists[rank] == lists[0]:
                continue
            names = list(dict.fromkeys([*lists[0], *lists[rank]]))
            name = next(n for n in names if lists[0].get(n) != lists[rank].get(n))
            what = "is missing on one of them" if name not in lists[0] or name not in lists[rank] else "differs"
            raise ValueError(
                f"{where} inside blochsim.distributed(): the inputs differ between ranks: {name!r} {what} "
                f"(rank {rank} against rank 0). Every rank must pass identical inputs (same values, seeds, "
                f"files); each takes its own voxels from them. To give ranks different work, call outside the "
                f"block on each rank's own voxels")
        raise ValueError(f"{where} inside blochsim.distributed(): the inputs differ between ranks")

    # -- collectives ---------------------------------------------------------------------------------
    def _carrier(self, device: torch.device) -> torch.device:
        """The device a tensor on `device` is sent from: its own if the backend serves it, else one it does."""
        if device.type in self._served:
            return device
        if "cuda" in self._served:
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")

    def _run(self, what: str, start: Callable) -> None:
        """Start a collective and wait for it (at most `timeout_s`), turning a failure into a clear error."""
        self._start(what, start)()

    def _start(self, what: str, start: Callable) -> Callable[[], None]:
        """Start a collective; returns the function that waits for it (at most `timeout_s` from then)."""
        began = time.monotonic()
        try:
            work = start()
        except Exception as error:
            raise self._failed(what, began, error) from error

        def wait() -> None:
            try:
                if work is not None:
                    if self.timeout_s is None:
                        work.wait()
                    else:
                        work.wait(datetime.timedelta(seconds=self.timeout_s))
            except Exception as error:  # DistBackendError, RuntimeError ("timed out", "connection reset"), ...
                raise self._failed(what, began, error) from error

        return wait

    def _failed(self, what: str, began: float, error: Exception) -> RuntimeError:
        waited = time.monotonic() - began
        limit = f"timeout_s={self.timeout_s:g}" if self.timeout_s is not None else "the process group's timeout"
        return RuntimeError(
            f"blochsim.distributed: rank {self.rank} of {self.world} could not complete the {what}, started "
            f"{waited:.1f} s before ({limit}): another rank has died, hangs, or runs different code. The process "
            f"group cannot be used after this; restart every rank. ({type(error).__name__}: {error})")

    def _all_gather_flat(self, x: torch.Tensor, *, what: str, wait: bool = True):
        """(world, *x.shape): every rank's x, for x of one shape on every rank; with `wait=False`, the
        function that waits for the collective and returns it."""
        import torch.distributed as dist

        carrier = self._carrier(x.device)
        sent = x.reshape((1,) + tuple(x.shape) if x.dim() == 0 else x.shape).contiguous().to(carrier)
        # The ranks' parts concatenated along the first axis (the form every backend takes).
        out = torch.empty((self.world * sent.shape[0],) + tuple(sent.shape[1:]), dtype=sent.dtype, device=carrier)
        gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        done = self._start(what, lambda: gather(out, sent, group=self.group, async_op=True))

        def result() -> torch.Tensor:
            done()
            return out.reshape((self.world,) + tuple(x.shape)).to(x.device)

        return result() if wait else result

    def _gather_rows(self, rows: torch.Tensor, total: int, what: str) -> torch.Tensor:
        counts = self.counts(total)
        if rows.shape[0] != counts[self.rank]:
            raise ValueError(f"{what}: rank {self.rank} holds {rows.shape[0]} rows, its range of {total} has "
                             f"{counts[self.rank]}")
        real = torch.view_as_real(rows.resolve_conj()) if rows.is_complex() else rows
        most = max(counts)
        if real.shape[0] < most:  # the collective takes equal parts: pad to the largest
            real = torch.cat([real, real.new_zeros((most - real.shape[0],) + tuple(real.shape[1:]))])
        everyone = self._all_gather_flat(real, what=what)  # (world, most, ...)
        if all(c == most for c in counts):
            full = everyone.reshape((total,) + tuple(real.shape[1:]))
        else:
            full = torch.cat([everyone[r, :c] for r, c in enumerate(counts)])
        return torch.view_as_complex(full) if rows.is_complex() else full

    def _all_reduce_flat(self, tensors, what: str) -> list:
        """The sums over the ranks of `tensors` (None: zeros), in their dtypes, by one float64 all-reduce."""
        import torch.distributed as dist

        if not tensors:
            return []
        device = next((t.device for t in tensors if t is not None), torch.device("cpu"))
        flat = torch.cat([torch.view_as_real(t.resolve_conj()).reshape(-1).to(device, torch.float64)
                          if t.is_complex() else t.reshape(-1).to(device, torch.float64) for t in tensors])
        carrier = self._carrier(device)
        sent = flat.to(carrier)
        self._run(what, lambda: dist.all_reduce(sent, op=dist.ReduceOp.SUM, group=self.group, async_op=True))
        sent = sent.to(device)
        out, at = [], 0
        for t in tensors:
            size = t.numel() * (2 if t.is_complex() else 1)
            piece = sent[at:at + size]
            at += size
            if t.is_complex():
                piece = torch.view_as_complex(piece.reshape(t.shape + (2,)).to(t.real.dtype))
            out.append(piece.reshape(t.shape).to(device=t.device, dtype=t.dtype))
        return out


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


def _served_devices(backend: str) -> set:
    """Device types a backend string ('gloo', 'nccl', 'cpu:gloo,cuda:nccl', ...) communicates from."""
    served = set()
    for entry in backend.lower().split(","):
        if ":" in entry:
            served.add(entry.split(":")[0].strip())
        elif entry.strip() == "nccl":
            served.add("cuda")
        elif entry.strip() in ("gloo", "mpi"):
            served.add("cpu")
        else:  # ucc and others serve both
            served.update(("cpu", "cuda"))
    return served


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
    tensors are summed over the ranks. `where` names the caller in errors ("PERK.map").
    """
    block = current()
    if block is None:
        return fn(**voxels, **(shared or {}))
    return block.map_voxels(fn, voxels, shared, where=where)


# -- autograd: each collective's derivative is its pair -------------------------------------------------
class _Gather(torch.autograd.Function):
    """Forward: every rank's rows. Backward: this rank's rows of the (replicated) gradient."""

    @staticmethod
    def forward(ctx, rows, block, total, what):
        ctx.block, ctx.total, ctx.what = block, total, what
        return block._gather_rows(rows.contiguous(), total, what)

    @staticmethod
    def backward(ctx, grad):
        return _Slice.apply(grad, ctx.block, ctx.total, ctx.what), None, None, None


class _Slice(torch.autograd.Function):
    """Forward: this rank's rows. Backward: every rank's rows of the gradient (each holds its own)."""

    @staticmethod
    def forward(ctx, full, block, total, what):
        ctx.block, ctx.total, ctx.what = block, total, what
        start, stop = block.voxel_range(total)
        return full[start:stop].clone()

    @staticmethod
    def backward(ctx, grad):
        return _Gather.apply(grad, ctx.block, ctx.total, ctx.what), None, None, None


class _SumGradients(torch.autograd.Function):
    """Forward: the tensors as they are. Backward: their gradients summed over the ranks."""

    @staticmethod
    def forward(ctx, block, *tensors):
        ctx.block = block
        return tuple(t.view_as(t) for t in tensors)

    @staticmethod
    def backward(ctx, *grads):
        return (None, *_AllReduce.apply(ctx.block, "sum of the gradients", *grads))


class _AllReduce(torch.autograd.Function):
    """Forward: the sums over the ranks. Backward: the (replicated) gradients as they are."""

    @staticmethod
    def forward(ctx, block, what, *tensors):
        ctx.block = block
        return tuple(block._all_reduce_flat(list(tensors), what))

    @staticmethod
    def backward(ctx, *grads):
        return (None, None, *_SumGradients.apply(ctx.block, *grads))


# -- checksums -----------------------------------------------------------------------------------------
def _digests(named: Mapping) -> dict:
    """name -> 16-byte digest of the value: its structure as text, and two integer sums of each array's bits
    (computed where the array lives; one host copy per device)."""
    texts, owners, tensors = {}, {}, []
    for name, value in named.items():
        start = len(tensors)
        texts[name] = _describe(value, tensors)
        owners[name] = (start, len(tensors))
    sums = _bit_sums(tensors)
    out = {}
    for name, text in texts.items():
        first, last = owners[name]
        h = hashlib.blake2b(text.encode(), digest_size=16)
        for a, b in sums[first:last]:
            h.update(struct.pack("<2q", a, b))
        out[str(name)] = h.digest()
    return out


def _describe(value, tensors: list) -> str:
    """Text of `value`'s structure; each array in it is appended to `tensors` and written as its shape and dtype."""
    t = _sharding.as_tensor(value) if not isinstance(value, (list, tuple)) else None
    if t is not None:
        tensors.append(t)
        return f"#{tuple(t.shape)}:{t.dtype}"
    if value is None or isinstance(value, (bool, int, float, complex, str, bytes, torch.dtype, enum.Enum)):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return type(value).__name__ + "(" + ",".join(_describe(v, tensors) for v in value) + ")"
    if isinstance(value, Mapping):
        items = sorted(value.items(), key=lambda kv: repr(kv[0]))
        return "{" + ",".join(f"{k!r}:{_describe(v, tensors)}" for k, v in items) + "}"
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return type(value).__qualname__ + "(" + ",".join(
            f"{f.name}={_describe(getattr(value, f.name), tensors)}" for f in dataclasses.fields(value)) + ")"
    text = repr(value)
    return type(value).__qualname__ if " at 0x" in text else text  # an address differs between processes


_INT_OF = {8: torch.int64, 4: torch.int32, 2: torch.int16, 1: torch.uint8}


def _bit_sums(tensors: list) -> list:
    """Per tensor, (sum of its bits as integers, sum weighted by position mod 65521): exact, independent of the
    order of summation (integer sums wrap alike everywhere), and changed by any one differing element."""
    pairs = []
    for t in tensors:
        x = t.detach()
        if x.is_complex():
            x = torch.view_as_real(x.resolve_conj())
        x = x.reshape(-1)
        if x.dtype == torch.bool:
            bits = x.to(torch.int64)
        elif x.is_floating_point():
            bits = x.contiguous().view(_INT_OF[x.element_size()]).to(torch.int64)
        else:
            bits = x.to(torch.int64)
        weights = torch.arange(bits.numel(), device=bits.device, dtype=torch.int64).remainder_(65521).add_(1)
        pairs.append(torch.stack([bits.sum(), (bits * weights).sum()]))
    if not pairs:
        return []
    by_device: dict = {}
    for i, p in enumerate(pairs):
        by_device.setdefault(p.device, []).append(i)
    out = [None] * len(pairs)
    for indices in by_device.values():
        values = torch.stack([pairs[i] for i in indices]).cpu().tolist()
        for i, v in zip(indices, values, strict=True):
            out[i] = tuple(v)
    return out


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
