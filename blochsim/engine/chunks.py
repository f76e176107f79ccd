"""Voxel chunks of one kernel call: placement, a byte model, staging, out-of-memory retry, progress.

Every voxel of a kernel pass is independent of the others, so a pass over V voxels runs as passes over
consecutive ranges of voxels. `Runner` does that for the kernel layer (`engine.kernels`):

* where: the active execution policy (`blochsim._execution`) names the device the kernels run on; the
  inputs stay where they are (the "home" device) and the results are written there. Inputs of a chunk are
  sliced and, when home and run device differ, copied over (host tensors through pinned memory).
* how many voxels: the byte model of a chunk of c voxels is the library's scratch for c voxels
  (`bs_epg_scratch_bytes`, asked at c itself: it is linear in c only piecewise, by the launch mapping and its
  padding) plus c times the bytes of the per-voxel arrays the pass reads and writes. A chunk is the largest
  c whose model fits the budget (the policy's `budget_bytes`; on a CUDA device without one, the free memory
  less `reserve_bytes` with the scratch held to `DEFAULT_SCRATCH_BYTES`, or more for an adjoint:
  `_execution.default_scratch_bytes`). Without a budget, a call whose tensors are on its device and whose
  scratch is under the cap runs whole without reading the free memory: it allocates nothing else. An adjoint
  whose whole call is over the cap takes the checkpoint stride with the least scratch (about the square root
  of the events), and is then cut where it must be.
* out of memory: a chunk that raises torch.cuda.OutOfMemoryError is run again as chunks of half its size
  (a warning says so once per call); completed chunks are kept, and a failed chunk wrote nothing (its
  outputs are committed only after its launch).
* progress: a tqdm bar over the voxels when the first chunk's time says the call will take more than
  `PROGRESS_AFTER_S`, stderr is a terminal and tqdm is installed, or whenever the policy forces it.
"""

from __future__ import annotations

import ctypes
import math
import sys
import time
import warnings
from collections.abc import Callable

import torch

from .. import _execution
from .. import _native as nat

__all__ = ["Runner", "Chunk", "PROGRESS_AFTER_S", "WHOLE_WAVES"]

#: Chunked work estimated to take longer than this shows a progress bar (when stderr is a terminal).
PROGRESS_AFTER_S = 3.0

#: Chunks in whole waves of their kernel (Runner._whole_waves); off only to measure what that buys.
WHOLE_WAVES = True

#: Below this many bytes a CUDA call is not planned against the free memory (asking costs a driver call):
#: it runs whole, and the out-of-memory retry covers a card that is nearly full.
_SMALL_BYTES = 64 * 2**20

# Chunks are cut at whole blocks: of threads on a CUDA device (launch_rules.hpp: 128 a block), of voxels on
# the host (csrc/cpu/epg_host.hpp kVoxelsPerBlock).
_CUDA_ALIGN = 128
_HOST_BLOCK = 16


class Chunk:
    """Voxels [start, stop) of a pass: its inputs on the run device, and where its outputs go.

    A pass's launch reads its per-voxel arrays through `voxels()`, writes through `out()` and `summed()`, and
    calls the library; the runner then `commit()`s: temporaries are copied into the full results and the
    summed outputs added to the runner's totals. A launch that raises leaves nothing behind.
    """

    def __init__(self, runner: Runner, start: int, stop: int, lane: int):
        self.runner, self.start, self.stop, self.lane = runner, start, stop, lane
        self.count = stop - start
        self._copies = []  # (full result view, chunk tensor) to copy after the launch
        self._sums = []  # (index into the runner's totals, chunk tensor)

    @property
    def device(self) -> torch.device:
        return self.runner.device

    def voxels(self, x: torch.Tensor | None, dim: int = 0) -> torch.Tensor | None:
        """This chunk's part of a per-voxel array (voxel axis `dim`, of length V or 1), on the run device."""
        if x is None:
            return None
        if x.shape[dim] == self.runner.total and self.count != self.runner.total:
            x = x.narrow(dim, self.start, self.count)
            if dim:
                x = x.contiguous()
        return self.runner.stage(x)

    def out(self, full: torch.Tensor, dim: int = 0) -> torch.Tensor:
        """Where the kernel writes this chunk's part of `full` (voxel axis `dim`): the part itself when it is
        contiguous on the run device, else a temporary on the run device, copied in at commit."""
        part = full.narrow(dim, self.start, self.count) if self.count != self.runner.total else full
        if part.device == self.device and part.is_contiguous():
            return part
        temp = torch.empty(part.shape, dtype=full.dtype, device=self.device)
        self._copies.append((part, temp))
        return temp

    def summed(self, index: int, shape: tuple, dtype: torch.dtype) -> torch.Tensor:
        """A zeroed buffer on the run device for an output summed over voxels, added to the runner's total
        `index` at commit."""
        buffer = torch.zeros(shape, dtype=dtype, device=self.device)
        self._sums.append((index, buffer))
        return buffer

    def commit(self) -> None:
        for part, temp in self._copies:
            self.runner.deliver(part, temp, self.lane)
        whole = self.count == self.runner.total
        for index, buffer in self._sums:
            self.runner.add(index, buffer, self.lane, whole)


class Runner:
    """Runs one pass over `total` voxels whose inputs live on `home`, in chunks, under the active policy."""

    def __init__(self, home: torch.device, total: int, label: str, scratch_cap_bytes: int | None = None):
        self.home, self.total, self.label = home, total, label
        #: the cap on one call's device scratch without a budget (None: _execution.DEFAULT_SCRATCH_BYTES)
        self.scratch_cap_bytes = scratch_cap_bytes or _execution.DEFAULT_SCRATCH_BYTES
        self.policy = _execution.active()
        self.device = self.policy.device_for(home)
        self.lanes = self.policy.lanes if self.device.type == "cuda" else 1
        self._totals: dict = {}  # index -> per lane, float64 sums of chunks
        self._whole: dict = {}  # index -> the one chunk's output, when the call ran whole
        self._pending: list = [[] for _ in range(self.lanes)]  # per lane: host copies waiting on an event
        self._streams = None

    # -- planning ---------------------------------------------------------------------------------
    @property
    def trivial(self) -> bool:
        """Nothing to plan: the whole call runs where its tensors are, on the host, without a budget."""
        return self.device == self.home and self.device.type == "cpu" and self.policy.budget_bytes is None

    def chunk(self, per_voxel_bytes: int, scratch: Callable[[int], int] | None = None,
              resident: Callable[[int], int] | None = None, fill_wave: float = 0.0) -> int:
        """Voxels per chunk: the largest c whose byte model fits the budget of a lane, in whole waves of the
        pass's kernel where it holds one or more, or, with `fill_wave` (a factor over 1), one wave where its
        scratch is within that factor of the scratch cap.

        `per_voxel_bytes`: bytes of the per-voxel arrays the pass touches, per voxel. `scratch(c)`: the
        library's scratch for c voxels (None on the host, whose scratch is per thread, not per voxel).
        `resident(c)`: the voxels the kernel of a launch of c keeps on the card at once (0: not known).
        """
        V = self.total

        def model(c: int) -> int:
            return (scratch(c) if scratch else 0) + c * per_voxel_bytes

        budget, scratch_cap = self._budget(model(V), scratch(V) if scratch else 0)
        if budget is None:
            return V
        fits = (lambda c: model(c) <= budget and (scratch is None or scratch(c) <= scratch_cap)) \
            if scratch_cap is not None else (lambda c: model(c) <= budget)
        if fits(V):
            return V
        if self.policy.stream is False:
            raise RuntimeError(
                f"execution(stream=False) runs the {self.label} of {V} voxels whole, and it needs {model(V)} bytes "
                f"against a budget of {budget}; use stream=None or True to cut it into chunks, or give a larger "
                "budget_bytes")
        lo, hi = 0, V  # fits(lo) (or lo == 0), not fits(hi)
        guess = max(1, min(V - 1, int(V * min(budget / max(model(V), 1), 1.0))))
        if fits(guess):
            lo = guess
        else:
            hi = guess
        while hi - lo > max(1, lo // 64):  # to within 1.6 % of the largest chunk that fits
            mid = (lo + hi) // 2
            if fits(mid):
                lo = mid
            else:
                hi = mid
        if lo == 0:
            raise ValueError(
                f"budget_bytes: one voxel of this {self.label} needs {model(1)} bytes (scratch "
                f"{scratch(1) if scratch else 0}), more than the budget of {budget} bytes per lane")
        # Whole blocks: of threads on a CUDA device; of the host library's voxels, whose event gradients it sums
        # in float32 per block, so aligned chunks sum the same blocks as the whole call (engine.kernels).
        align = _CUDA_ALIGN if self.device.type == "cuda" else _HOST_BLOCK
        if lo >= align:
            lo -= lo % align
        if WHOLE_WAVES and resident is not None:
            # Over the scratch cap (not a budget the caller gave) by up to fill_wave times, to fill one wave.
            def stretch_fits(c: int) -> bool:
                return scratch_cap is not None and model(c) <= budget and scratch(c) <= int(scratch_cap * fill_wave)

            wave = resident(lo)  # the voxels the kernel of a launch of lo keeps on the card
            waves = self._whole_waves(lo, align, wave, resident) or \
                (fill_wave > 1 and self._one_wave(lo, V, align, wave, resident, stretch_fits))
            if waves:
                return waves
        even = -(-V // -(-V // lo))  # the same voxels in chunks of (nearly) equal size
        return min(lo, -(-even // align) * align) if lo >= align else even

    @staticmethod
    def _whole_waves(lo: int, align: int, wave: int, resident: Callable[[int], int]) -> int:
        """The chunk of at most `lo` voxels in whole waves of its kernel (0: none, the kernel keeps more than
        `lo` resident or the library cannot tell). Every voxel of a launch steps the whole train in series,
        so a launch of 1.6 waves takes as long as two: chunks of 1,584 voxels where the kernel keeps 1,584
        resident, not 2,500. Each stays aligned, less than a block short of its waves, and is kept only
        where its own launch takes the same kernel (the mapping may change with the launch's size)."""
        if wave <= 0 or wave > lo:
            return 0
        whole = lo // wave * wave
        whole -= whole % align
        return whole if whole and resident(whole) == wave else 0

    @staticmethod
    def _one_wave(lo: int, V: int, align: int, wave: int, resident: Callable[[int], int],
                  stretch_fits: Callable[[int], bool]) -> int:
        """A chunk of one wave where the scratch cap allows `lo`, under one (0: none). A launch of 0.9 of a wave
        of the second order takes as long as a whole one, so the pooled HVP's 10,000 voxel passes at 5k in
        chunks of 896 (its second order keeps 1,056 resident) took 12 launches where 10 do. The wave, or the
        call's voxels where fewer, is taken where `stretch_fits` it (the cap stretched by the pass's factor at
        most, kernels._FILL_WAVE: the scratch, and the peak, grow by up to that share of the cap) and its
        launch takes the same kernel. H100, alternated (benchmarks/results/mapping/api_cases-*-s16s-*), ms:
        real HVP 20k 34.3-34.6 -> 30.7-30.8 (chunks of 6,784 -> 8,448), pooled HVP 5k 18.4-19.2 -> 16.2-16.9,
        20k 66.0-66.1 -> 59.1-60.0 (a third over the cap). The first order's group adjoints, whose launches
        the cap held to 0.6 of a wave, to twice the cap (mapping/api_cases-*-s20b-wave-*): complex gradient
        5k 9.56-9.57 -> 6.50-6.53 ms, 20k 27.9-28.0 -> 21.5-21.6 (peak 267 -> 314 MiB), pooled5 gradient 2k
        6.0 -> 4.8 (109 -> 143 MiB). The adjoints alone ask it (`fill_wave`): the complex JVP at 20k, a thread
        per voxel with its states in device scratch, ran whole where it ran as two launches of 10,112 and took
        18 ms longer (the HVP 277.6 against 258.8): a kernel bound by its scratch's traffic has no waves to
        fill."""
        if wave <= lo:
            return 0
        c = V if V <= wave else wave - wave % align
        return c if c > lo and stretch_fits(c) and resident(c) == wave else 0

    def scratch_over_cap(self, whole_scratch: int) -> bool:
        """Whether a whole call with `whole_scratch` bytes of device scratch is cut for it: on a card, without a
        budget, past the scratch cap."""
        on_card = self.device.type == "cuda" and self.policy.budget_bytes is None
        return on_card and whole_scratch > self.scratch_cap_bytes

    def _budget(self, whole_bytes: int, whole_scratch: int) -> tuple:
        """(bytes a lane's chunk may touch or None for no limit, cap on its scratch or None)."""
        policy = self.policy
        if policy.budget_bytes is not None:
            return policy.budget_bytes // self.lanes, None
        if self.device.type != "cuda":
            return None, None
        # Run whole, asking the driver nothing, where the call's scratch is under the cap and either it runs
        # on the device its tensors are on (run whole, it allocates nothing per voxel but its scratch: its
        # outputs are allocated and its inputs read in place) or its copies are small. The out-of-memory
        # retry covers a card that is nearly full.
        if not self.scratch_over_cap(whole_scratch) and (self.device == self.home or whole_bytes <= _SMALL_BYTES):
            return None, None
        # Memory torch holds in its cache but no tensor uses is free to the kernels' allocations too.
        free = _execution.cuda_free_bytes(self.device)
        budget = max(free - policy.reserve_bytes, 1) // self.lanes
        return budget, self.scratch_cap_bytes // self.lanes

    # -- staging ----------------------------------------------------------------------------------
    def stage(self, x: torch.Tensor) -> torch.Tensor:
        """`x` on the run device (host tensors through pinned memory, copied asynchronously)."""
        if x.device == self.device:
            return x
        if self.device.type == "cuda" and x.device.type == "cpu":
            return x.pin_memory().to(self.device, non_blocking=True)
        return x.to(self.device)

    def deliver(self, part: torch.Tensor, temp: torch.Tensor, lane: int) -> None:
        """Copy a chunk's output into its part of the full result (to the host through pinned memory,
        finished when the lane is next used or the call ends)."""
        if temp.device.type == "cuda" and part.device.type == "cpu":
            pinned = torch.empty(temp.shape, dtype=temp.dtype, pin_memory=True)
            pinned.copy_(temp, non_blocking=True)
            done = torch.cuda.Event()
            done.record(torch.cuda.current_stream(self.device))
            self._pending[lane].append((done, part, pinned))
        else:
            part.copy_(temp)

    def add(self, index: int, buffer: torch.Tensor, lane: int, whole: bool = False) -> None:
        """Add a chunk's summed output to total `index`: kept as it is when the chunk is the whole call, else
        added in float64, per lane (lanes never write one tensor at once)."""
        if whole:
            self._whole[index] = buffer
            return
        slot = self._totals.setdefault(index, [None] * self.lanes)
        if slot[lane] is None:
            slot[lane] = torch.zeros(buffer.shape, dtype=torch.float64, device=self.device)
        slot[lane].add_(buffer)

    def summed_total(self, index: int, dtype: torch.dtype) -> torch.Tensor | None:
        """Total `index` over every chunk, in `dtype`, on the home device (None if no chunk gave one)."""
        whole = self._whole.get(index)
        if whole is not None:
            return whole if whole.device == self.home and whole.dtype == dtype else whole.to(self.home, dtype)
        parts = [t for t in self._totals.get(index, ()) if t is not None]
        if not parts:
            return None
        out = parts[0]
        for t in parts[1:]:
            out = out + t
        return out.to(device=self.home, dtype=dtype)

    def _finish(self, lane: int, count: int | None = None) -> None:
        """Complete the first `count` (default: all) host copies waiting on `lane`."""
        pending = self._pending[lane]
        count = len(pending) if count is None else count
        for done, part, pinned in pending[:count]:
            done.synchronize()
            part.copy_(pinned)
        del pending[:count]

    # -- running ---------------------------------------------------------------------------------
    def run(self, chunk: int, launch: Callable[[Chunk], None]) -> None:
        """launch(c) for consecutive chunks of at most `chunk` voxels; halves the chunk on CUDA out-of-memory."""
        if self.device.type == "cuda":
            with torch.cuda.device(self.device):  # the library launches on the current device's streams
                self._run(chunk, launch)
        elif 0 < self.total <= chunk:  # one chunk on the host (every small call): no retry, copy or progress bar
            self._launch(0, self.total, 0, launch)
        else:
            self._run(chunk, launch)

    def _run(self, chunk: int, launch: Callable[[Chunk], None]) -> None:
        V = self.total
        lanes = self._lane_streams()
        start, count, warned, bar = 0, 0, False, None
        started = time.perf_counter()
        while start < V:
            stop = min(V, start + chunk)
            lane = count % self.lanes
            try:
                if lanes is not None:
                    with torch.cuda.stream(lanes[lane]):
                        self._finish(lane)  # the lane's previous chunk: its host copies are done by now
                        self._launch(start, stop, lane, launch)
                else:
                    waiting = len(self._pending[0])
                    self._launch(start, stop, lane, launch)
                    # One stream: this chunk queued behind the last one, whose host copies finish meanwhile.
                    self._finish(0, waiting)
            except torch.cuda.OutOfMemoryError:
                if stop - start == 1:
                    raise
                failed = True
            else:
                failed = False
            if failed:  # outside the handler: the failed chunk's tensors went with the traceback
                chunk = max(1, (stop - start) // 2)
                if not warned:
                    warnings.warn(f"blochsim: the device ran out of memory for a chunk of {stop - start} voxels of "
                                  f"a {self.label}; continuing in chunks of {chunk} voxels", ResourceWarning,
                                  stacklevel=2)
                    warned = True
                continue
            count += 1
            if count == 1 and stop < V:
                bar = self._bar(stop, started, lanes)
            elif bar is not None:
                bar.update(stop - start)
            start = stop
        for lane in range(self.lanes):
            if lanes is not None:
                with torch.cuda.stream(lanes[lane]):
                    self._finish(lane)
                torch.cuda.current_stream(self.device).wait_stream(lanes[lane])
            else:
                self._finish(lane)
        if bar is not None:
            bar.close()

    def _launch(self, start, stop, lane, launch) -> None:
        piece = Chunk(self, start, stop, lane)
        launch(piece)
        piece.commit()

    def _lane_streams(self):
        """One stream per lane on a CUDA device with lanes > 1, each after the caller's work so far."""
        if self.device.type != "cuda" or self.lanes == 1:
            return None
        if self._streams is None:
            caller = torch.cuda.current_stream(self.device)
            self._streams = [torch.cuda.Stream(self.device) for _ in range(self.lanes)]
            for s in self._streams:
                s.wait_stream(caller)
        return self._streams

    def _bar(self, done: int, started: float, lanes):
        """A tqdm bar after the first chunk (`done` voxels since `started`), or None."""
        setting = self.policy.progress
        if setting is False:
            return None
        if setting is None:
            if not _terminal():
                return None
            if self.device.type == "cuda":  # the first chunk's time, not its launch's
                (lanes[0] if lanes else torch.cuda.current_stream(self.device)).synchronize()
            if (time.perf_counter() - started) * self.total / done < PROGRESS_AFTER_S:
                return None
        try:
            from tqdm.auto import tqdm
        except ImportError:  # optional (pip install "blochsim[progress]"): no bar without it
            return None
        bar = tqdm(total=self.total, unit="voxel", unit_scale=True, desc=f"blochsim {self.label}", leave=False)
        bar.update(done)
        return bar


def _terminal() -> bool:
    stream = sys.stderr
    return stream is not None and hasattr(stream, "isatty") and stream.isatty()


def scratch_query(device: torch.device, entry_index: int, args,
                  slots_at: Callable[[int], int] = lambda stride: 0) -> Callable[[int, int], int] | None:
    """scratch(c, stride): the library's scratch bytes for c voxels of the pass `args` describes at a checkpoint
    stride, with the replay slots `slots_at(stride)` (CUDA only; None on the host, whose scratch is per
    thread)."""
    return _pass_query(device, "bs_epg_scratch_bytes", entry_index, args, slots_at)


def resident_query(device: torch.device, entry_index: int, args,
                   slots_at: Callable[[int], int] = lambda stride: 0) -> Callable[[int, int], int] | None:
    """resident(c, stride): the voxels the kernel of a launch of c voxels of that pass keeps on the card at once
    (0: the library cannot tell; CUDA only, None on the host)."""
    return _pass_query(device, "bs_epg_resident_voxels", entry_index, args, slots_at)


def _pass_query(device: torch.device, name: str, entry_index: int, args,
                slots_at: Callable[[int], int]) -> Callable[[int, int], int] | None:
    """query(c, stride): the CUDA library's `name`(pass, args) with c voxels at a checkpoint stride, cached."""
    if device.type != "cuda":
        return None
    lib = nat.cuda_library()
    cache = {}

    def query(c: int, stride: int) -> int:
        key = (c, stride)
        if key not in cache:
            args.tissue.num_voxels = c
            args.program.checkpoint_stride = stride
            args.program.checkpoint_slots = slots_at(stride)
            answer = getattr(lib, name)(entry_index, ctypes.byref(args))
            if answer < 0:
                nat.check_status(lib, 1, name)
            cache[key] = int(answer)
        return cache[key]

    return query


def least_scratch_stride(events: int, stride: int, scratch_at: Callable[[int], int]) -> int:
    """The checkpoint stride with the least scratch: the given one or one near the square root of the events
    (the store holds the checkpoints, events / stride, and the replayed stretch: stride states, twice that
    with tables, or, in the real plain adjoint, one per pass of the stretch, whose best stride is longer)."""
    root = math.sqrt(events)
    candidates = {stride} | {max(1, round(root * 2 ** (k / 4))) for k in range(-2, 5)}
    return min(sorted(candidates), key=lambda s: (scratch_at(s), s != stride))
