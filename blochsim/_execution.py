"""Execution placement: where the kernels run and how much memory one kernel call may take.

A policy is made by `execution(...)` or `offload(...)` and applies while it is active: as a context manager
(`with execution("cuda", budget_bytes=2**30): ...`; blocks nest, and leaving one reinstates the policy that
was active before it), or as the `execution=` run setting of a simulator or of one call. Outside any block
the policy is `execution("auto")`.

The kernel layer (`blochsim.engine.kernels`) reads the active policy on every call and runs each pass
(forward, JVP, VJP, VJP-JVP) in voxel chunks small enough for the budget (`blochsim.engine.chunks`).
The autograd Functions keep the policy of the call that made them, so `backward()` run later, outside
the block, is placed and chunked alike.

This module imports neither the engine nor the sequence layer: both import it.
"""

from __future__ import annotations

import contextvars
from dataclasses import dataclass

import torch

from ._errors import check_device

__all__ = ["ExecutionPolicy", "execution", "offload", "distribute", "active", "applied", "as_policy",
           "DEFAULT_SCRATCH_BYTES", "SECOND_ORDER_SCRATCH_BYTES", "SECOND_ORDER_WAVE_SCRATCH_BYTES",
           "default_scratch_bytes", "cuda_free_bytes"]

#: Without `budget_bytes`, the device scratch of one kernel call (the adjoint's checkpoints) is held to this
#: many bytes (or up to a third more where that fills one wave of its kernel: engine.chunks), chunking the
#: voxels above it: the peak allocation of a gradient then stays near that of its
#: inputs, outputs and torch's own backward of the loss. Measured on the H200 (2026-12-04, api_cases.py
#: --scratch-mib 64 / 96 / 128 / 192): with 128 MiB for first-order passes and 96 MiB for the second-order
#: pass every gradient and HVP case peaks under the incumbent's allocation (pooledb_hvp 20k: 367 MiB at 96,
#: 406 at 128, against 383) and runs in at most 0.5 of its time (pooled5_grad 2k: 0.38 at 128, 0.52 at 96).
DEFAULT_SCRATCH_BYTES = 128 * 2**20
SECOND_ORDER_SCRATCH_BYTES = 96 * 2**20
#: The second-order pass without pool tables may hold a wave of its launch: the real plain groups of 8 keep
#: 4,224 voxels resident (204 registers, two blocks of 128 a multiprocessor, 132 multiprocessors), at about
#: 60 KB of store a voxel (32 orders, dual states, a slot per pass of a stretch). At 96 MiB a Jacobian's two
#: directions at 2k tissues (4,000 voxel copies in one call) ran as two half-wave launches. H100, api_cases,
#: alternated (benchmarks/results/mapping/api_cases-NVIDIA_H100_80GB_HBM3-2026-12-05-s14g-*), ms and peak
#: MiB at 256 / at 96: real HVP 2k 5.97-6.19 (190) / 8.88-9.56 (116), 5k 15.5-15.7 (285) / 21.7-21.9 (173),
#: 20k 43.6-43.8 (631) / 51.0-51.5 (611); complex HVP 2k 27.3-27.5 (280) / 37.2-37.3 (130), 5k 64.0-64.8
#: (337) / 83.8-84.6 (187; the incumbent's peak 410), 20k 259-260 (622) / 364-365 (611); real HVP 200k
#: 393 / 394 (6,109 both). Pool tables keep 96 MiB (pooledb_hvp 20k peaked at 406 MiB with 128, the
#: incumbent's 383).
SECOND_ORDER_WAVE_SCRATCH_BYTES = 256 * 2**20


def default_scratch_bytes(entry: str, held_bytes: int = 0, *, pool_tables: bool = False) -> int:
    """The scratch cap of one kernel call of `entry` (a `bs_epg_*` entry point) when no budget is given.

    An adjoint may hold more than the fixed cap where its call's own per-voxel arrays (`held_bytes`: the
    cotangent, the size of the signal, is most of them) are larger: the caller holds that much already, and
    with a loss formed from the signal (sum |s|^2) the gradient's peak is reached while the loss and its
    backward run, three arrays of the signal's size, above what the adjoint then adds. A first-order adjoint
    (VJP) without pool tables may hold twice its arrays; with them, and the second order (VJP-JVP, whose own
    arrays are the signal's tangent and the cotangent's beside the cotangent), once. Larger launches fill the
    card: on the H200 (api_cases, 2026-12-05, alternated) the 100k real MRF gradient took 20.0-20.5 ms at
    twice against 25.8-26.2 at once (by the byte model launches of about 33,300 voxels, the register
    adjoint's 33,800 resident threads, against 20,000), the complex one 141.6-141.9 against 168.9-169.5,
    each at the same peak (1,338 MiB: the loss's backward sets it). The pooled gradient's adjoint changes
    mapping with its launch's size (a warp per voxel up to 6,000, launch_rules.hpp), and at 100k its larger
    launches ran slower (98.0 against 76.3-77.1 ms): the pool tables keep once (measured before the fixed
    pools' first order took groups of 8 at every launch size, 2026-12-07: not measured since). A loss that
    forms nothing of its own (signal.real.sum()) sees its gradient's peak grow by up to twice the cotangent's
    size."""
    if entry == "bs_epg_vjp":
        return max(DEFAULT_SCRATCH_BYTES, (1 if pool_tables else 2) * int(held_bytes))
    if entry == "bs_epg_vjp_jvp":
        return max(SECOND_ORDER_SCRATCH_BYTES if pool_tables else SECOND_ORDER_WAVE_SCRATCH_BYTES, int(held_bytes))
    return DEFAULT_SCRATCH_BYTES


def cuda_free_bytes(device: torch.device) -> int:
    """Bytes free for new allocations on a CUDA device: the driver's free memory and what torch's cache holds
    that no tensor uses. The allocator's statistics are read once, as its nested dict:
    `torch.cuda.memory_reserved` and `memory_allocated` each flatten every statistic first, 0.3 ms of the
    host's time a pair on the H200's host, twice in a gradient call that then took 5.3 ms (cProfile,
    2026-12-05)."""
    free, _ = torch.cuda.mem_get_info(device)
    stats = torch.cuda.memory_stats_as_nested_dict(device)

    def current(name: str) -> int:
        return int(stats.get(name, {}).get("all", {}).get("current", 0))

    return free + current("reserved_bytes") - current("allocated_bytes")

_RESERVE_BYTES = 512 * 2**20


@dataclass(frozen=True)
class ExecutionPolicy:
    """Where work runs and in what chunks; made by `execution()` or `offload()`, used as a context manager or
    as an `execution=` setting.

    `target` is "auto" (where the tissue tensors are; large work on CUDA tensors spreads over every visible
    CUDA device), "cpu", or a tuple of CUDA devices (a simulator call spreads its voxels over them, one
    contiguous range each). `budget_bytes`: bytes one chunk of one kernel call may touch (None:
    the device's free memory less `reserve_bytes`, with the scratch held to `DEFAULT_SCRATCH_BYTES`; on
    the CPU, no limit). `lanes`: chunks in flight per CUDA device. `offload`: every per-voxel workload
    streams through `target`, host tensors staged through pinned memory. `progress`: a tqdm bar over
    long chunked work (None: when the work is estimated past a few seconds and stderr is a terminal).
    `trains`: made by `distribute`: a call with few voxels shards its trains over `target`.
    """

    target: str | tuple = "auto"
    stream: bool | None = None
    budget_bytes: int | None = None
    lanes: int = 1
    reserve_bytes: int = _RESERVE_BYTES
    offload: bool = False
    progress: bool | None = None
    trains: bool = False

    def __enter__(self) -> ExecutionPolicy:
        _ACTIVE.set((self, _ACTIVE.get()))
        return self

    def __exit__(self, *exc) -> None:
        current, previous = _ACTIVE.get()
        if current is not self:
            raise RuntimeError("execution blocks must be left in the order they were entered (innermost first)")
        _ACTIVE.set(previous)

    def device_for(self, home: torch.device) -> torch.device:
        """The device a call whose tensors are on `home` runs on. A CUDA device that cannot be served raises
        the error of `blochsim._errors.check_device` (no CUDA in torch, no GPU, no blochsim CUDA package)."""
        if self.target == "auto":
            return home
        if self.target == "cpu":
            return torch.device("cpu")
        for device in self.target:  # one of the listed devices holds the data: stay there
            if home.type == "cuda" and device.index in (None, home.index):
                return home
        device = self.target[0]
        check_device(device)
        if device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        return device


_AUTO = ExecutionPolicy()
# (policy, the link below it) while a block is active; None outside every block.
_ACTIVE: contextvars.ContextVar = contextvars.ContextVar("blochsim_execution", default=None)


def active() -> ExecutionPolicy:
    """The policy in force: the innermost active block's, else execution("auto")."""
    link = _ACTIVE.get()
    return _AUTO if link is None else link[0]


class applied:
    """Context manager that makes `policy` active (None: leaves the active one), for one call or one backward."""

    __slots__ = ("policy", "pushed")

    def __init__(self, policy: ExecutionPolicy | None):
        self.policy = policy
        self.pushed = False

    def __enter__(self):
        if self.policy is not None and self.policy is not active():
            _ACTIVE.set((self.policy, _ACTIVE.get()))
            self.pushed = True
        return self.policy

    def __exit__(self, *exc) -> None:
        if self.pushed:
            _ACTIVE.set(_ACTIVE.get()[1])


def _positive(name: str, value, *, allow_none: bool = False, allow_zero: bool = False):
    if value is None and allow_none:
        return None
    smallest = 0 if allow_zero else 1
    if isinstance(value, bool) or not isinstance(value, int) or value < smallest:
        what = "an integer >= 0" if allow_zero else "a positive integer"
        raise ValueError(f"{name} must be {what}{' or None' if allow_none else ''}, got {value!r}")
    return value


def _flag(name: str, value):
    if value is not None and not isinstance(value, bool):
        raise ValueError(f"{name} must be None, True or False, got {value!r}")
    return value


def _cuda_devices(name: str, devices) -> tuple:
    """A non-empty tuple of CUDA torch.devices, or ValueError naming `name` and the first bad entry."""
    if isinstance(devices, (str, torch.device, int)):
        devices = (devices,)
    try:
        devices = tuple(devices)
    except TypeError:
        raise ValueError(f"{name} must be a CUDA device or a list of them ('cuda', 'cuda:1', ...), "
                         f"got {devices!r}") from None
    if not devices:
        raise ValueError(f"{name} must name at least one CUDA device ('cuda', 'cuda:1', ...), got an empty list")
    out = []
    for index, device in enumerate(devices):
        try:
            device = torch.device("cuda", device) if isinstance(device, int) and not isinstance(device, bool) \
                else torch.device(device)
        except (RuntimeError, TypeError):
            device = None
        if device is None or device.type != "cuda":
            raise ValueError(f"{name} must list CUDA devices only ('cuda', 'cuda:1', ...); entry {index} is "
                             f"{devices[index]!r}")
        out.append(device)
    return tuple(dict.fromkeys(out))


def execution(target="auto", *, stream=None, budget_bytes=None, lanes=1, reserve_bytes=_RESERVE_BYTES,
              progress=None) -> ExecutionPolicy:
    """A placement policy (a context manager, or a value for `execution=`).

    `target`: "auto" runs work where the tissue tensors are (with two visible CUDA devices or more, a call on
    CUDA tensors of at least `_multi_device.AUTO_SPREAD_VOXELS` voxels and no autograd history spreads its
    voxels over all of them); "cpu" confines it to the host; a CUDA device runs it there, staging host
    tensors chunk by chunk; a list of them spreads a simulator call's voxels over the devices, one
    contiguous range each, results gathered on the inputs' device. Each pass of a kernel call is cut into
    voxel chunks sized by a per-voxel byte model (the library's scratch plus the per-voxel arrays the pass
    reads and writes) against `budget_bytes`, or, on a CUDA device without it, against its free memory less
    `reserve_bytes` with the scratch held to `DEFAULT_SCRATCH_BYTES`. `stream`: True sizes chunks from the
    budget; False runs each device's part whole and raises RuntimeError when it does not fit; None (default)
    whichever chunks are smaller. `lanes`: chunks in flight per CUDA device (each on its own stream, with its
    share of the budget); the host runs one chunk at a time on all its threads. `progress`: True shows a tqdm
    bar over every chunked call, False never, None (default) for chunked work estimated past a few seconds when
    stderr is a terminal. Results do not depend on chunking. Bad arguments raise ValueError naming them.
    """
    if isinstance(target, str) and target in ("auto", "cpu"):
        devices = target
    else:
        devices = _cuda_devices("target", target)
    return ExecutionPolicy(target=devices, stream=_flag("stream", stream),
                           budget_bytes=_positive("budget_bytes", budget_bytes, allow_none=True),
                           lanes=_positive("lanes", lanes),
                           reserve_bytes=_positive("reserve_bytes", reserve_bytes, allow_zero=True),
                           progress=_flag("progress", progress))


def offload(devices=("cuda",), *, budget_bytes=_RESERVE_BYTES, lanes=1, progress=None) -> ExecutionPolicy:
    """A policy that streams every per-voxel workload through the CUDA `devices`, whatever its size: host
    tensors are staged through pinned memory in chunks of at most `budget_bytes` per lane, with `lanes`
    chunks in flight, and results come back to the host. Several devices: each streams one contiguous range
    of a simulator call's voxels. See `execution` for `progress`."""
    return ExecutionPolicy(target=_cuda_devices("devices", devices), stream=True,
                           budget_bytes=_positive("budget_bytes", budget_bytes), lanes=_positive("lanes", lanes),
                           offload=True, progress=_flag("progress", progress))


def distribute(devices) -> ExecutionPolicy:
    """A policy that spreads work over the CUDA `devices` (one is allowed): a simulator call with at least
    `_multi_device.MIN_VOXELS_PER_DEVICE` voxels per device runs one contiguous range of them on each; a call
    with fewer that has at least 2 trains (a protocol with a train axis) runs contiguous blocks of its trains
    on each device, pool tables and per-voxel transmit included. Results return to the inputs' device."""
    devices = _cuda_devices("devices", devices)
    return ExecutionPolicy(target=devices, trains=True)


def as_policy(value, name: str = "execution") -> ExecutionPolicy | None:
    """The policy an `execution=` setting asks for: None (the active one), a policy, "auto", "cpu", or CUDA
    device(s) as for `execution(target)`. Anything else raises ValueError naming `name`."""
    if value is None or isinstance(value, ExecutionPolicy):
        return value
    if isinstance(value, str) and value in ("auto", "cpu"):
        return ExecutionPolicy(target=value)
    try:
        return ExecutionPolicy(target=_cuda_devices(name, value))
    except ValueError as error:
        raise ValueError(f"{error}; {name} also accepts None, 'auto', 'cpu', or a policy made by "
                         "blochsim.execution(...) or blochsim.offload(...)") from None
