"""The collectives of a `distributed()` block: gathers, sums and input checks over a process group's ranks.

`Collectives` holds a group, this rank's place in it and the timeout, and runs blochsim's collectives through
torch.distributed: all-gathers of voxel rows (padded to equal parts), one float64 all-reduce of several
tensors, object gathers, and the input check (a 128-bit digest of each call's arguments, all-gathered). Each
collective waits at most `timeout_s` and turns a failure into one RuntimeError saying that another rank has
died, hangs or runs different code. The differentiable ones come in pairs that are each other's derivative
(all-gather and slice, all-reduce and identity), so second order through them is exact.
`blochsim._distributed.DistributedBlock` builds on it (the block, the routing of a call, `map_voxels`).
"""

from __future__ import annotations

import dataclasses
import datetime
import enum
import hashlib
import struct
import time
from collections.abc import Callable, Mapping

import torch

from . import _sharding

__all__ = ["Collectives"]


class Collectives:
    """This rank's place in a process group (`rank`, `world`, `backend`) and the collectives blochsim runs in it.

    `group`: a torch.distributed process group (None: the default, whole world). `timeout_s`: how long a
    collective waits for the other ranks (None: the process group's timeout), validated by the caller.
    """

    def __init__(self, group, timeout_s: float | None):
        import torch.distributed as dist

        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError("blochsim.distributed() needs torch.distributed initialised: call "
                               "torch.distributed.init_process_group() first (launched by torchrun, it reads the "
                               "rank and world size from the environment; backend 'gloo' for host tensors, "
                               "'nccl' for CUDA ones)")
        self.group = group
        self.rank, self.world = dist.get_rank(group), dist.get_world_size(group)
        if self.rank < 0:
            raise RuntimeError(f"blochsim.distributed(group={group!r}): this process (global rank "
                               f"{dist.get_rank()}) is not a member of the group")
        self.backend = str(dist.get_backend(group))
        self.timeout_s = None if timeout_s is None else float(timeout_s)
        self._served = _served_devices(self.backend)

    # -- voxel ranges ----------------------------------------------------------------------------
    def voxel_range(self, total: int) -> tuple[int, int]:
        """This rank's voxels [start, stop) of `total`."""
        return self.rank * total // self.world, (self.rank + 1) * total // self.world

    def counts(self, total: int) -> list[int]:
        """Voxels of each rank, in rank order."""
        return [stop - start for start, stop in _sharding.even_ranges(total, self.world)]

    # -- what blochsim's layers call -------------------------------------------------------------
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

    # -- transport -----------------------------------------------------------------------------------
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
        if rows.dtype == torch.bool:  # sent as bytes (not every backend carries bool)
            return self._gather_rows(rows.to(torch.uint8), total, what).bool()
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
