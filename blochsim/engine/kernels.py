"""Calls into the kernel library: build the C ABI structs from tensors, allocate outputs with torch.

`Static` holds a compiled program's structure; the differentiable inputs travel as one flat tuple
`inputs = (dt_s, dt_wrap_s, flip_rad, phase_rad, *tissue, *tables)`: tissue in the order of
`blochsim._native.TISSUE_PARAMS` (None where a property is at its identity), then the pool tables
(L, r, T, zeq, sat; None for pool model 0). Tissue inputs are [V] or [1]; tables [V or 1, ...], T complex.
"""

from __future__ import annotations

import ctypes
import dataclasses
import os
from dataclasses import dataclass

import torch

from .. import _execution
from .. import _native as nat
from . import chunks
from .program import plain, slots_at

__all__ = ["Static", "num_threads", "forward", "jvp", "vjp", "vjp_jvp", "NUM_EVENT_INPUTS", "TABLE_START"]

NUM_EVENT_INPUTS = 4  # dt_s, dt_wrap_s, flip_rad, phase_rad
TABLE_START = NUM_EVENT_INPUTS + nat.NUM_TISSUE
NUM_INPUTS = TABLE_START + len(nat.TABLES)
_JVP_WIDTHS = (1, 2, 4, 8)


@dataclass
class Static:
    """The non-differentiable part of a call: structure, sizes, dtype."""

    action: torch.Tensor  # [E] int32
    record: torch.Tensor  # [E] int32
    num_repetitions: int
    num_samples: int
    num_states: int
    path: int
    crusher_dk_rad_per_m: float
    voxel_size_m: float
    checkpoint_stride: int
    num_voxels: int
    dtype: torch.dtype
    num_transverse_pools: int = 1
    num_longitudinal_pools: int = 1
    interval: torch.Tensor | None = None  # [E] int32 table rows (tabulated layouts)
    wrap_interval: int = 0
    num_intervals: int = 0
    device: torch.device = torch.device("cpu")
    # Per-voxel pulses (engine.pulses; csrc/include/blochsim/pulses.hpp): [E] int32 rows of the field, profile
    # and spinor tables (None: no event has one), the tables' row counts, the slice positions and profile knots.
    field_row: torch.Tensor | None = None
    profile_row: torch.Tensor | None = None
    spinor_row: torch.Tensor | None = None
    num_field_rows: int = 0
    num_spinor_rows: int = 0
    num_profile_rows: int = 0
    num_positions: int = 1
    voxel_offset: int = 0  # the first voxel of a chunk within the call (its slice positions run on from there)
    profile_bins: int = 0
    profile_theta_max: float = 0.0
    # The adjoints' replay slots a stretch at checkpoint_stride, one per pass (program.replay_slots; 0: one per
    # event, where the host action array is not at hand).
    checkpoint_slots: int = 0

    @property
    def num_events(self) -> int:
        return int(self.action.numel())

    @property
    def tabulated(self) -> bool:
        return self.interval is not None


def num_threads() -> int:
    """Host threads: BLOCHSIM_NUM_THREADS, else torch.get_num_threads()."""
    env = os.environ.get("BLOCHSIM_NUM_THREADS")
    return int(env) if env else torch.get_num_threads()


_functorch_wrapped = torch._C._functorch.is_functorch_wrapped_tensor


def _ptr(t):
    if t is None:
        return None
    return (plain(t) if _functorch_wrapped(t) else t).data_ptr()


def _dtype_code(dtype) -> int:
    return nat.FLOAT32 if dtype == torch.float32 else nat.FLOAT64


def _complex(dtype):
    return torch.complex64 if dtype == torch.float32 else torch.complex128


def _real_view(t):
    """A table as the kernel reads it: real, contiguous (complex T as interleaved pairs)."""
    if t is None:
        return None
    if t.is_complex():
        t = torch.view_as_real(t.resolve_conj())
    return t.contiguous()


def _program(st: Static, inputs) -> nat.Program:
    dt, dt_wrap, flip, phase = inputs[:NUM_EVENT_INPUTS]
    return nat.Program(
        st.num_events,
        st.num_repetitions,
        st.num_samples,
        st.num_states,
        st.path,
        st.checkpoint_stride,
        _ptr(st.action),
        _ptr(st.record),
        _ptr(dt),
        _ptr(dt_wrap),
        _ptr(flip),
        _ptr(phase),
        st.crusher_dk_rad_per_m,
        st.voxel_size_m,
        st.num_transverse_pools,
        st.num_longitudinal_pools,
        int(st.tabulated),
        st.checkpoint_slots,
        st.num_intervals,
        None if st.interval is None else _ptr(st.interval),  # absent in most calls: no call for NULL
        st.wrap_interval,
        None if st.field_row is None else _ptr(st.field_row),
        None if st.profile_row is None else _ptr(st.profile_row),
        None if st.spinor_row is None else _ptr(st.spinor_row),
        st.num_field_rows,
        st.num_spinor_rows,
        st.num_profile_rows,
        st.num_positions,
        st.voxel_offset,
        st.profile_bins,
        st.profile_theta_max,
    )


def _tissue(st: Static, inputs) -> nat.Tissue:
    t = nat.Tissue()
    t.num_voxels = st.num_voxels
    for j, x in enumerate(inputs[NUM_EVENT_INPUTS:TABLE_START]):
        if x is not None:  # an absent property stays NULL with stride 0, as the struct starts
            t.data[j] = _ptr(x)
            t.stride[j] = 0 if x.numel() == 1 else 1
    return t


def _tables(tables, keep: list, *, lead: int = 0) -> nat.Tables:
    """Struct of the tables (or their tangents with `lead` = 1 leading axis); views are kept alive in `keep`."""
    out = nat.Tables()
    for i, t in enumerate(tables):
        if t is None:  # NULL with strides 0, as the struct starts
            continue
        view = _real_view(t)
        keep.append(view)
        setattr(out, nat.TABLES[i], _ptr(view))
        if view is not None:
            voxels = view.shape[lead]
            per_voxel = view[(0,) * (lead + 1)].numel() if view.numel() else 0
            out.stride_v[i] = 0 if voxels == 1 else per_voxel
            out.stride_p[i] = view[0].numel() if lead else 0
    return out


def _tangents(st: Static, tangents, width: int, keep: list) -> tuple[nat.Tangents, nat.Tables]:
    """tangents: like inputs, each None or a tensor [P, *input.shape]."""
    t = nat.Tangents()
    t.count = width
    t.dt_s, t.dt_wrap_s, t.flip_rad, t.phase_rad = (_ptr(x) for x in tangents[:NUM_EVENT_INPUTS])
    for j, x in enumerate(tangents[NUM_EVENT_INPUTS:TABLE_START]):
        t.tissue[j] = _ptr(x)
        if x is not None:
            t.tissue_stride_p[j] = x.shape[1]
            t.tissue_stride_v[j] = 0 if x.shape[1] == 1 else 1
    return t, _tables(tangents[TABLE_START:], keep, lead=1)


def _grad_outputs(st: Static, inputs, wanted) -> list:
    """Per-voxel gradient outputs, zeroed on the inputs' device, for the tissue and table inputs flagged in
    `wanted` ([V] per tissue input, [V, *table] per table as the kernel reads it); None elsewhere. The
    event inputs' gradients are summed over voxels: each chunk writes its own (`Chunk.summed`)."""
    V = st.num_voxels
    out = [None] * NUM_EVENT_INPUTS
    for x, w in zip(inputs[NUM_EVENT_INPUTS:], wanted[NUM_EVENT_INPUTS:], strict=True):
        if not w or x is None:
            out.append(None)
        elif len(out) < TABLE_START:
            out.append(torch.zeros((V,), dtype=st.dtype, device=st.device))
        else:  # a table: per voxel, real view
            out.append(torch.zeros((V,) + tuple(_real_view(x).shape[1:]), dtype=st.dtype, device=st.device))
    return out


def _grad_structs(st: Static, piece: chunks.Chunk, inputs, wanted, full: list, first: int):
    """(Grads, TableGrads, per-chunk outputs) of a chunk: the event gradients in summed buffers (totals
    `first` to `first + 3`), per-voxel gradients in the chunk's part of `full`."""
    E = st.num_events
    out = []
    for i, (x, w) in enumerate(zip(inputs, wanted, strict=True)):
        if not w or x is None:
            out.append(None)
        elif i < NUM_EVENT_INPUTS:
            out.append(piece.summed(first + i, (1 if i == 1 else E,), st.dtype))
        else:
            out.append(piece.out(full[i]))
    g = nat.Grads(*[_ptr(x) for x in out[:NUM_EVENT_INPUTS]])
    for j, x in enumerate(out[NUM_EVENT_INPUTS:TABLE_START]):
        if x is not None:
            g.tissue[j] = _ptr(x)
    return g, nat.TableGrads(*[_ptr(x) for x in out[TABLE_START:]])


def _collect(runner: chunks.Runner, st: Static, inputs, wanted, full: list, first: int) -> list:
    """Gradients of every input (None where not wanted): the event ones summed over chunks, the rest per voxel."""
    grads = []
    for i, (x, w) in enumerate(zip(inputs, wanted, strict=True)):
        if not w or x is None:
            grads.append(None)
        elif i < NUM_EVENT_INPUTS:
            total = runner.summed_total(first + i, st.dtype)
            grads.append(total if total is not None else
                         torch.zeros((1 if i == 1 else st.num_events,), dtype=st.dtype, device=st.device))
        else:
            grads.append(full[i])
    return grads


def _fold(inputs, grads):
    """Per-voxel gradients of inputs shared by every voxel are summed; complex tables come back complex."""
    folded = []
    for i, (x, g) in enumerate(zip(inputs, grads, strict=True)):
        if g is not None and i >= NUM_EVENT_INPUTS:
            if i >= TABLE_START and x.is_complex():
                g = torch.view_as_complex(g)
            if x.shape[0] == 1 and g.shape[0] != 1:
                g = g.sum(0, keepdim=True)
        folded.append(g)
    return folded


_PASSES = {"bs_epg_forward": 0, "bs_epg_jvp": 1, "bs_epg_vjp": 2, "bs_epg_vjp_jvp": 3}
_ADJOINTS = ("bs_epg_vjp", "bs_epg_vjp_jvp")
#: How far over its scratch cap an adjoint's chunk may go to fill one wave of its kernel (chunks.Runner
#: _one_wave): the second order by a third, the first order to twice the cap.
_FILL_WAVE = {"bs_epg_vjp": 2.0, "bs_epg_vjp_jvp": 4 / 3}


def _call(st: Static, entry: str, args) -> None:
    """Run an entry point on the library of the chunk's device: CUDA tensors go to the CUDA build, on
    torch's current stream, with scratch allocated by torch (and released when the call returns); nothing
    comes back to the host. No voxels (an empty property array, as NumPy broadcasts it) leave the outputs as
    allocated: empty, and zero gradients of the values every voxel shares."""
    if st.num_voxels == 0:
        return
    if st.device.type == "cuda":
        lib = nat.cuda_library()
        # The handle of torch's current stream on the device, as torch.cuda.current_stream(device).cuda_stream
        # gives it, without making a Stream object (~7 Python calls a kernel call).
        index = st.device.index if st.device.index is not None else torch.cuda.current_device()
        args.stream = torch._C._cuda_getCurrentRawStream(index)
        pass_index = _PASSES[entry]
        need = lib.bs_epg_scratch_bytes(pass_index, ctypes.byref(args))
        if need < 0:
            nat.check_status(lib, 1, entry)
        scratch = torch.empty(max(int(need), 1), dtype=torch.uint8, device=st.device)
        args.scratch, args.scratch_bytes = scratch.data_ptr(), int(need)
        status = getattr(lib, entry)(ctypes.byref(args))
        nat.check_status(lib, status, entry)
        return
    lib = nat.cpu_library()
    status = getattr(lib, entry)(ctypes.byref(args))
    nat.check_status(lib, status, entry)


# -- chunked passes ---------------------------------------------------------------------------------
def _per_voxel_bytes(V: int, arrays) -> int:
    """Bytes per voxel of the arrays a pass reads and writes: (tensor or shape and dtype, voxel axis) pairs;
    arrays shared by every voxel (a voxel axis of 1) do not grow with a chunk and are left out."""
    total = 0
    for x, dim in arrays:
        if x is None or V <= 1 or x.shape[dim] != V:
            continue
        total += x.numel() // V * x.element_size()
    return total


class _Placed:
    """A pass placed by the active execution policy: its runner, chunk size and checkpoint stride, and the
    event inputs and structure on the run device (moved once per call, not per chunk)."""

    def __init__(self, st: Static, entry: str, label: str, inputs, arrays, query_args=None):
        self.runner = runner = chunks.Runner(st.device, st.num_voxels, label,
                                             _execution.default_scratch_bytes(entry))
        self.stride = st.checkpoint_stride
        # An adjoint's store keeps a state per pass of a replayed stretch, not per event, where the action
        # array is on the host (on a card: placed there by Program.structure_on), read without a sync.
        self.slots_at = slots_at(st.action, st.num_repetitions) if entry in _ADJOINTS else (lambda stride: 0)
        device = runner.device
        if device.type == "cuda" and st.dtype != torch.float32:
            raise ValueError(f"the execution policy runs this {label} on {device}, whose kernels take float32; "
                             f"{st.dtype} runs on the host (execution('cpu')), or give float32 inputs")
        if runner.trivial or st.num_voxels == 0:
            self.chunk = st.num_voxels
        else:
            per_voxel = _per_voxel_bytes(st.num_voxels, arrays)
            # An adjoint's scratch may grow with its own arrays' bytes (_execution.default_scratch_bytes; set
            # here, where a plan is made: the host's whole calls plan nothing).
            runner.scratch_cap_bytes = _execution.default_scratch_bytes(entry, per_voxel * st.num_voxels,
                                                                        pool_tables=st.interval is not None)
            scratch = resident = None
            if device.type == "cuda" and query_args is not None:
                args = query_args(st)
                scratch = chunks.scratch_query(device, _PASSES[entry], args, self.slots_at)  # (c, stride) -> bytes
                resident = chunks.resident_query(device, _PASSES[entry], args, self.slots_at)  # -> voxels
            self.chunk = self._plan(st, entry, per_voxel, scratch, resident)
        if device == st.device:
            self.static = st
        else:
            moved = {name: None if getattr(st, name) is None else getattr(st, name).to(device)
                     for name in ("interval", "field_row", "profile_row", "spinor_row")}
            self.static = dataclasses.replace(st, action=st.action.to(device), record=st.record.to(device),
                                              device=device, **moved)
        slots = self.slots_at(self.stride)
        if self.stride != st.checkpoint_stride or slots != st.checkpoint_slots:
            self.static = dataclasses.replace(self.static, checkpoint_stride=self.stride, checkpoint_slots=slots)
        self.placed = device == st.device  # inputs used where they are
        self.events = list(inputs[:NUM_EVENT_INPUTS]) if self.placed else \
            [None if x is None else runner.stage(x) for x in inputs[:NUM_EVENT_INPUTS]]

    def _plan(self, st, entry, per_voxel, scratch, resident=None) -> int:
        runner = self.runner
        if scratch is None:
            return runner.chunk(per_voxel)
        V = st.num_voxels

        def least() -> int:
            return chunks.least_scratch_stride(st.num_events * st.num_repetitions, self.stride, lambda s: scratch(V, s))

        # A whole call the scratch cap would cut at the given stride takes the least-scratch stride first, so
        # that a call that fits whole there asks nothing of the driver (a search at the given stride read the
        # free memory, to be thrown away).
        if entry in _ADJOINTS and runner.scratch_over_cap(scratch(V, self.stride)):
            self.stride = least()

        def at(stride: int) -> tuple:  # the library's scratch and resident voxels for c voxels at this stride
            return (lambda c: scratch(c, stride)), (resident and (lambda c: resident(c, stride)))

        fill_wave = _FILL_WAVE.get(entry, 0.0)  # (chunks.Runner._one_wave says why the adjoints alone)
        chunk = runner.chunk(per_voxel, *at(self.stride), fill_wave=fill_wave)
        if entry in _ADJOINTS and chunk < V:
            stride = least()
            if stride != self.stride:
                self.stride = stride
                chunk = runner.chunk(per_voxel, *at(stride), fill_wave=fill_wave)
        return chunk

    def chunk_static(self, piece: chunks.Chunk) -> Static:
        st = self.static
        if piece.count == st.num_voxels:
            return st
        return dataclasses.replace(st, num_voxels=piece.count, voxel_offset=st.voxel_offset + piece.start)

    def inputs(self, piece: chunks.Chunk, inputs) -> list:
        """A chunk's inputs on the run device: the event values as placed, tissue and tables sliced."""
        if self.placed and piece.count == self.static.num_voxels:
            return inputs
        return self.events + [piece.voxels(x) for x in inputs[NUM_EVENT_INPUTS:]]

    def run(self, launch) -> None:
        if self.chunk:
            self.runner.run(self.chunk, launch)


def _chunk_tangents(placed: _Placed, piece: chunks.Chunk, tangents) -> list:
    """A chunk's tangents ([P, *input.shape] per input, or None) on the run device."""
    if placed.placed and piece.count == placed.static.num_voxels:
        return tangents
    out = [None if t is None else placed.runner.stage(t) for t in tangents[:NUM_EVENT_INPUTS]]
    return out + [piece.voxels(t, dim=1) for t in tangents[NUM_EVENT_INPUTS:]]


def forward(st: Static, inputs) -> torch.Tensor:
    """signal [V, S], complex."""
    signal = torch.empty((st.num_voxels, st.num_samples), dtype=_complex(st.dtype), device=st.device)

    def args_of(cs: Static, ins, out) -> nat.ForwardArgs:
        keep = []
        args = nat.ForwardArgs(_dtype_code(cs.dtype), num_threads(), None, _program(cs, ins), _tissue(cs, ins),
                               _tables(ins[TABLE_START:], keep), _ptr(out))
        args._keep = (keep, ins, out)  # the struct holds raw pointers: keep what they point into alive
        return args

    placed = _Placed(st, "bs_epg_forward", "forward", inputs,
                     [(x, 0) for x in inputs[NUM_EVENT_INPUTS:]] + [(signal, 0)],
                     lambda cs: args_of(cs, inputs, None))

    def launch(piece: chunks.Chunk) -> None:
        cs = placed.chunk_static(piece)
        _call(cs, "bs_epg_forward", args_of(cs, placed.inputs(piece, inputs), piece.out(signal)))

    placed.run(launch)
    return signal


def jvp(st: Static, inputs, tangents) -> tuple[torch.Tensor, torch.Tensor]:
    """signal [V, S] and its derivatives [P, V, S] along P tangents ([P, *shape] per input, or None)."""
    P = max((t.shape[0] for t in tangents if t is not None), default=1)
    width = next(w for w in _JVP_WIDTHS + (P,) if w >= P)
    if width > 8:  # more tangents than a kernel carries: run them in groups of 8
        parts = [jvp(st, inputs, [None if t is None else t[i : i + 8] for t in tangents]) for i in range(0, P, 8)]
        return parts[0][0], torch.cat([p[1] for p in parts])
    padded = []
    for t in tangents:
        if t is not None and t.shape[0] < width:
            t = torch.cat([t, t.new_zeros((width - t.shape[0],) + t.shape[1:])])
        padded.append(None if t is None else t.contiguous())
    V, S = st.num_voxels, st.num_samples
    signal = torch.empty((V, S), dtype=_complex(st.dtype), device=st.device)
    signal_tangent = torch.empty((width, V, S), dtype=_complex(st.dtype), device=st.device)

    def args_of(cs: Static, ins, tans, out, out_tangent) -> nat.JvpArgs:
        keep = []
        tangent_struct, tables_tangent = _tangents(cs, tans, width, keep)
        args = nat.JvpArgs(_dtype_code(cs.dtype), num_threads(), None, _program(cs, ins), _tissue(cs, ins),
                           _tables(ins[TABLE_START:], keep), tangent_struct, tables_tangent, _ptr(out),
                           _ptr(out_tangent))
        args._keep = (keep, ins, tans, out, out_tangent)
        return args

    arrays = [(x, 0) for x in inputs[NUM_EVENT_INPUTS:]] + [(t, 1) for t in padded[NUM_EVENT_INPUTS:]]
    arrays += [(signal, 0), (signal_tangent, 1)]
    placed = _Placed(st, "bs_epg_jvp", "forward-mode derivative", inputs, arrays,
                     lambda cs: args_of(cs, inputs, padded, None, None))

    def launch(piece: chunks.Chunk) -> None:
        cs = placed.chunk_static(piece)
        _call(cs, "bs_epg_jvp", args_of(cs, placed.inputs(piece, inputs), _chunk_tangents(placed, piece, padded),
                                        piece.out(signal), piece.out(signal_tangent, dim=1)))

    placed.run(launch)
    return signal, signal_tangent[:P]


def vjp(st: Static, inputs, cotangent: torch.Tensor, wanted) -> list:
    """Gradients of Re<cotangent, signal> for the inputs flagged in `wanted` (others None)."""
    cotangent = cotangent.to(_complex(st.dtype)).contiguous()
    full = _grad_outputs(st, inputs, wanted)

    def args_of(cs: Static, ins, cot, grads, table_grads) -> nat.VjpArgs:
        keep = []
        args = nat.VjpArgs(_dtype_code(cs.dtype), num_threads(), None, _program(cs, ins), _tissue(cs, ins),
                           _tables(ins[TABLE_START:], keep), _ptr(cot), grads, table_grads)
        args._keep = (keep, ins, cot)
        return args

    arrays = [(x, 0) for x in inputs[NUM_EVENT_INPUTS:]] + [(cotangent, 0)] + [(g, 0) for g in full]
    placed = _Placed(st, "bs_epg_vjp", "gradient", inputs, arrays,
                     lambda cs: args_of(cs, inputs, None, nat.Grads(), nat.TableGrads()))

    def launch(piece: chunks.Chunk) -> None:
        cs = placed.chunk_static(piece)
        grads, table_grads = _grad_structs(cs, piece, inputs, wanted, full, 0)
        _call(cs, "bs_epg_vjp", args_of(cs, placed.inputs(piece, inputs), piece.voxels(cotangent), grads,
                                        table_grads))

    placed.run(launch)
    return _fold(inputs, _collect(placed.runner, st, inputs, wanted, full, 0))


def vjp_jvp(st: Static, inputs, tangents, cotangent, cotangent_tangent, wanted, *, signal_tangent: bool = True):
    """The VJP and its derivative along one tangent direction ([1, *shape] per input, or None).

    Returns (grads, grads_tangent, signal_tangent [V, S] or None when not asked for). A `cotangent_tangent`
    of None is zero.
    """
    cotangent = cotangent.to(_complex(st.dtype)).contiguous()
    if cotangent_tangent is not None:
        cotangent_tangent = cotangent_tangent.to(_complex(st.dtype)).contiguous()
    tangents = [None if t is None else t.contiguous() for t in tangents]
    V, S = st.num_voxels, st.num_samples
    full, full_t = _grad_outputs(st, inputs, wanted), _grad_outputs(st, inputs, wanted)
    signal_t = torch.empty((V, S), dtype=_complex(st.dtype), device=st.device) if signal_tangent else None

    def args_of(cs: Static, ins, tans, cot, cot_t, grads, grads_t, out, out_t) -> nat.VjpJvpArgs:
        keep = []
        tangent_struct, tables_tangent = _tangents(cs, tans, 1, keep)
        args = nat.VjpJvpArgs(_dtype_code(cs.dtype), num_threads(), None, _program(cs, ins), _tissue(cs, ins),
                              _tables(ins[TABLE_START:], keep), tangent_struct, tables_tangent, _ptr(cot),
                              _ptr(cot_t), grads[0], grads_t[0], grads[1], grads_t[1], _ptr(out), _ptr(out_t))
        args._keep = (keep, ins, tans, cot, cot_t, out, out_t)
        return args

    arrays = [(x, 0) for x in inputs[NUM_EVENT_INPUTS:]] + [(t, 1) for t in tangents[NUM_EVENT_INPUTS:]]
    arrays += [(cotangent, 0), (cotangent_tangent, 0)] + [(g, 0) for g in full + full_t]
    if signal_tangent:  # the kernel writes the signal beside its tangent
        arrays += [(signal_t, 0), (signal_t, 0)]
    empty = (nat.Grads(), nat.TableGrads())
    placed = _Placed(st, "bs_epg_vjp_jvp", "second-order derivative", inputs, arrays,
                     lambda cs: args_of(cs, inputs, tangents, None, None, empty, empty, None, None))

    def launch(piece: chunks.Chunk) -> None:
        cs = placed.chunk_static(piece)
        # Chunk totals 0-3 are the VJP's event gradients, 4-7 their tangents.
        grads = _grad_structs(cs, piece, inputs, wanted, full, 0)
        grads_t = _grad_structs(cs, piece, inputs, wanted, full_t, NUM_EVENT_INPUTS)
        out_t = piece.out(signal_t) if signal_tangent else None
        out = torch.empty_like(out_t) if signal_tangent else None
        _call(cs, "bs_epg_vjp_jvp", args_of(cs, placed.inputs(piece, inputs), _chunk_tangents(placed, piece, tangents),
                                            piece.voxels(cotangent), piece.voxels(cotangent_tangent), grads, grads_t,
                                            out, out_t))

    placed.run(launch)
    runner = placed.runner
    return (_fold(inputs, _collect(runner, st, inputs, wanted, full, 0)),
            _fold(inputs, _collect(runner, st, inputs, wanted, full_t, NUM_EVENT_INPUTS)), signal_t)


def directions_in_one_call(st: Static, inputs, tangents, want_tangent) -> bool:
    """Whether vjp_jvp_directions may run a Jacobian's P tangent directions as one call over P copies of the
    voxels: the directions are along tissue properties only (no event or table tangents), nothing is read by
    voxel index beyond the tissue arrays (no pool tables, no per-voxel pulses), and no tangent's own
    gradient is wanted (the public Jacobian's tangents carry none; a call whose do runs a direction a call)."""
    if st.tabulated or st.field_row is not None or st.profile_row is not None or st.spinor_row is not None:
        return False
    if any(x is not None for x in inputs[TABLE_START:]) or any(want_tangent):
        return False
    return all(t is None for t in tangents[:NUM_EVENT_INPUTS]) and all(t is None for t in tangents[TABLE_START:])


def vjp_jvp_directions(st: Static, inputs, tangents, cotangents: torch.Tensor, cotangent_tangent, wanted) -> list:
    """The second-order gradients of vjp_jvp summed over P directions (tangents [P, *input.shape] along tissue
    properties, cotangents [P, V, S]; `cotangent_tangent` [V, S] seeds the first direction, None is zero), as
    one second-order call over P copies of the voxels, and a first-order one for a seed (directions_in_one_call
    says when): a call of P V voxels fills waves of the card that P calls of V voxels each fill a part of (the
    2k-tissue Hessian-vector product of a (T1, T2) Jacobian: two launches of half a wave)."""
    P, V = cotangents.shape[0], st.num_voxels

    def copies(x):  # a per-voxel array [V], once per direction; a shared value stays one
        return x if x is None or x.numel() != V else x.reshape(V).repeat(P)

    tissue = inputs[NUM_EVENT_INPUTS:TABLE_START]
    inputs_p = [*inputs[:NUM_EVENT_INPUTS], *(copies(x) for x in tissue), *inputs[TABLE_START:]]
    tangents_p = [None] * len(tangents)
    for j, t in enumerate(tangents[NUM_EVENT_INPUTS:TABLE_START], start=NUM_EVENT_INPUTS):
        if t is not None:  # [P, n] with n = V or 1: direction p's tangent on its copy of the voxels
            tangents_p[j] = t.reshape(P, -1).expand(P, V).reshape(1, P * V)
    _, second, _ = vjp_jvp(dataclasses.replace(st, num_voxels=P * V), inputs_p, tangents_p,
                           cotangents.reshape(P * V, st.num_samples), None, wanted, signal_tangent=False)
    second = [g.reshape(P, V).sum(0) if g is not None and y is not x else g
              for x, y, g in zip(inputs, inputs_p, second, strict=True)]
    if cotangent_tangent is None:
        return second
    # The seed enters the VJP-JVP linearly, as the VJP of the inputs along it: one first-order call of V voxels,
    # where seeding the first copy would take a zeroed [P V, S] cotangent tangent beside the call's own arrays.
    seeded = vjp(st, inputs, cotangent_tangent, wanted)
    return [b if a is None else a if b is None else a + b for a, b in zip(second, seeded, strict=True)]
