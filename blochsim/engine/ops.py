"""The kernel passes as PyTorch custom operators in the `blochsim::` namespace.

| op                          | kernel pass | returns                                                        |
| --------------------------- | ----------- | -------------------------------------------------------------- |
| `blochsim::epg_forward`     | forward     | signal [V, S], complex                                         |
| `blochsim::epg_jvp`         | JVP         | (signal [V, S], signal_tangent [P, V, S])                      |
| `blochsim::epg_vjp`         | VJP         | the gradients of the `wanted` inputs given (a list)            |
| `blochsim::epg_vjp_jvp`     | VJP-JVP     | (gradients, their tangents, signal_tangent [V, S] or [0])      |

Each op takes the structure of one kernel call, then the kernel inputs by name:

    action [E] int32, record [E] int32, interval [E] int32 or None   (the tensors of `kernels.Static`)
    sizes = [num_repetitions, num_samples, num_states, path, ...]    (its int fields, in order)
    scalars = [crusher_dk_rad_per_m, voxel_size_m]                   (its float fields)
    dt_s [E], dt_wrap_s [1], flip_rad [E], phase_rad [E]             (the kernel dtype, on the call's device)
    t1_ms ... velocity_m_per_s                                       ([V] or [1], None at the identity)
    table_L, table_r, table_T, table_zeq, table_sat                  ([V or 1, ...], None for no pools)

in the order of `engine.kernels` (`_native.TISSUE_PARAMS`, `_native.TABLES`); a JVP or VJP-JVP then takes one
tangent per input (`<name>_tangent`, [P, *input.shape] or None). The schemas are generated from the fields of
`kernels.Static` (`STATIC_TENSORS`, `SIZES`, `SCALARS`) and from `INPUT_NAMES`, so a new structure field
needs no change here, and a new kernel input is one name added to `INPUT_NAMES`. The pool tables are built by
torch operations (`engine.pools`) and enter the kernels as these inputs; there is no separate table kernel.

The ops run the same code as the eager engine (`engine.kernels`: the C ABI through ctypes, on torch's current
CUDA stream, chunked by the active execution policy), so one wheel serves every torch: nothing is compiled
against torch's C++ ABI. Each op has

* a fake implementation (shapes and dtypes only), so torch.compile, torch.export and FakeTensor trace it;
* autograd: the forward's backward is the VJP op; the VJP op's backward is the VJP-JVP op (second order:
  a Hessian-vector product, the gradient of a cost of a Jacobian); the JVP op's backward is VJP-JVP ops, one
  per tangent; the VJP-JVP op's backward raises (no third-order pass exists);
* a vmap rule: a batch of tissue (or of tangents, for `jacfwd`) is folded into the voxel (or tangent) axis of
  one call; other batches run as a loop of calls.

The eager engine keeps calling `engine.kernels` through the autograd Functions of `engine.functions`, which
add forward-mode AD (`torch.func.jvp`, which custom ops cannot register) and cost less per call than an op's
Python autograd wrapper. The traced path (`blochsim._tracing`: torch.compile, torch.export) calls the ops.
Both wirings use the passes below, so the derivatives are the same arithmetic.
"""

from __future__ import annotations

import dataclasses

import torch

from .. import _execution
from .. import _native as nat
from . import kernels as K

__all__ = ["INPUT_NAMES", "STATIC_TENSORS", "SIZES", "SCALARS", "THIRD_ORDER_MESSAGE", "static_args", "static_of",
           "forward", "jvp", "vjp", "vjp_jvp"]

THIRD_ORDER_MESSAGE = (
    "blochsim gives first and second derivatives only: no third-order pass exists "
    "(differentiate a gradient or a Jacobian once, not twice)"
)

#: The kernel inputs, in the order of `engine.kernels` (event values, tissue, pool tables).
INPUT_NAMES = ("dt_s", "dt_wrap_s", "flip_rad", "phase_rad", *nat.TISSUE_PARAMS,
               *(f"table_{name}" for name in nat.TABLES))
NUM_INPUTS = len(INPUT_NAMES)
assert NUM_INPUTS == K.NUM_INPUTS, "engine.ops.INPUT_NAMES must name every kernel input of engine.kernels"

def _static_fields(kind: str) -> tuple:
    """The fields of `kernels.Static` an op carries, by the kind of their annotation: "Tensor" (its own
    argument), "int" (the `sizes` list), "float" (the `scalars` list). dtype and device come from the inputs."""
    out = []
    for f in dataclasses.fields(K.Static):
        annotation = str(f.type)
        if kind == "Tensor" and "Tensor" in annotation or kind in ("int", "float") and annotation == kind:
            out.append(f.name)
    return tuple(out)


#: The structure tensors of `kernels.Static` (each its own op argument, None where absent), in field order.
STATIC_TENSORS = _static_fields("Tensor")
#: The integer settings an op carries in its `sizes` list, in `kernels.Static`'s field order.
SIZES = _static_fields("int")
#: The float settings an op carries in its `scalars` list.
SCALARS = _static_fields("float")
_VOXELS = SIZES.index("num_voxels")
_SAMPLES = SIZES.index("num_samples")
NUM_STATIC = len(STATIC_TENSORS) + 2  # the tensors, sizes, scalars

_NAMESPACE = "blochsim"
_LIB = torch.library.Library(_NAMESPACE, "DEF")  # this module owns the namespace


def _schema_inputs(suffix: str = "") -> str:
    return ", ".join(f"Tensor{'' if i < K.NUM_EVENT_INPUTS and not suffix else '?'} {name}{suffix}"
                     for i, name in enumerate(INPUT_NAMES))


_STATIC_SCHEMA = ", ".join(f"Tensor? {name}" for name in STATIC_TENSORS) + ", int[] sizes, float[] scalars"
_SCHEMAS = {
    "epg_forward": f"({_STATIC_SCHEMA}, {_schema_inputs()}) -> Tensor",
    "epg_jvp": f"({_STATIC_SCHEMA}, {_schema_inputs()}, {_schema_inputs('_tangent')}) -> (Tensor, Tensor)",
    "epg_vjp": f"({_STATIC_SCHEMA}, bool[] wanted, Tensor cotangent, {_schema_inputs()}) -> Tensor[]",
    "epg_vjp_jvp": (f"({_STATIC_SCHEMA}, bool[] wanted, bool with_signal_tangent, Tensor cotangent, "
                    f"Tensor? cotangent_tangent, {_schema_inputs()}, {_schema_inputs('_tangent')}) "
                    "-> (Tensor[], Tensor[], Tensor)"),
}
for _name, _schema in _SCHEMAS.items():
    _LIB.define(_name + _schema)


# -- structure <-> op arguments ---------------------------------------------------------------------
def static_args(st: K.Static) -> tuple:
    """The structure arguments of an op call: the structure tensors, sizes, scalars."""
    return (*(getattr(st, name) for name in STATIC_TENSORS), [int(getattr(st, name)) for name in SIZES],
            [float(getattr(st, name)) for name in SCALARS])


def static_of(*args) -> K.Static:
    """The `kernels.Static` of an op call's structure arguments and its first kernel input (dt_s, whose dtype
    and device are the call's)."""
    *tensors, sizes, scalars, like = args
    return K.Static(dtype=like.dtype, device=like.device, **dict(zip(STATIC_TENSORS, tensors, strict=True)),
                    **dict(zip(SIZES, sizes, strict=True)), **dict(zip(SCALARS, scalars, strict=True)))


def _present(inputs, wanted) -> list:
    """Which inputs have a gradient output: wanted and given."""
    return [bool(w) and x is not None for x, w in zip(inputs, wanted, strict=True)]


def _complex(dtype: torch.dtype) -> torch.dtype:
    return K._complex(dtype)


# -- implementations (CPU and CUDA: the same code, which picks the library by device) -----------------
# Every op's arguments start with the NUM_STATIC structure arguments (`static_args`).
def _forward_impl(*args):
    inputs = args[NUM_STATIC:]
    return K.forward(static_of(*args[:NUM_STATIC], inputs[0]), tuple(inputs))


def _jvp_impl(*args):
    inputs, tangents = args[NUM_STATIC:NUM_STATIC + NUM_INPUTS], args[NUM_STATIC + NUM_INPUTS:]
    return K.jvp(static_of(*args[:NUM_STATIC], inputs[0]), tuple(inputs), list(tangents))


def _reshaped(grads, inputs, present) -> list:
    return [g.reshape(x.shape) for g, x, p in zip(grads, inputs, present, strict=True) if p]


def _vjp_impl(*args):
    wanted, cotangent, inputs = args[NUM_STATIC], args[NUM_STATIC + 1], args[NUM_STATIC + 2:]
    present = _present(inputs, wanted)
    grads = K.vjp(static_of(*args[:NUM_STATIC], inputs[0]), tuple(inputs), cotangent, present)
    return _reshaped(grads, inputs, present)


def _vjp_jvp_impl(*args):
    wanted, with_signal_tangent, cotangent, cotangent_tangent = args[NUM_STATIC:NUM_STATIC + 4]
    inputs, tangents = args[NUM_STATIC + 4:NUM_STATIC + 4 + NUM_INPUTS], args[NUM_STATIC + 4 + NUM_INPUTS:]
    st = static_of(*args[:NUM_STATIC], inputs[0])
    present = _present(inputs, wanted)
    grads, grads_t, signal_t = K.vjp_jvp(st, tuple(inputs), list(tangents), cotangent, cotangent_tangent, present,
                                         signal_tangent=with_signal_tangent)
    if signal_t is None:
        signal_t = torch.empty((0,), dtype=_complex(st.dtype), device=st.device)
    return _reshaped(grads, inputs, present), _reshaped(grads_t, inputs, present), signal_t


# -- fake implementations ---------------------------------------------------------------------------
def _signal_like(sizes, like: torch.Tensor) -> torch.Tensor:
    return like.new_empty((sizes[_VOXELS], sizes[_SAMPLES]), dtype=_complex(like.dtype))


def _sizes(args) -> list:
    return args[NUM_STATIC - 2]


def _forward_fake(*args):
    return _signal_like(_sizes(args), args[NUM_STATIC])


def _jvp_fake(*args):
    tangents = args[NUM_STATIC + NUM_INPUTS:]
    count = max((t.shape[0] for t in tangents if t is not None), default=1)
    signal = _signal_like(_sizes(args), args[NUM_STATIC])
    return signal, signal.new_empty((count,) + tuple(signal.shape))


def _grads_fake(inputs, wanted) -> list:
    return [x.new_empty(x.shape) for x, p in zip(inputs, _present(inputs, wanted), strict=True) if p]


def _vjp_fake(*args):
    return _grads_fake(args[NUM_STATIC + 2:], args[NUM_STATIC])


def _vjp_jvp_fake(*args):
    wanted, with_signal_tangent = args[NUM_STATIC], args[NUM_STATIC + 1]
    inputs = args[NUM_STATIC + 4:NUM_STATIC + 4 + NUM_INPUTS]
    signal_t = _signal_like(_sizes(args), inputs[0]) if with_signal_tangent else \
        inputs[0].new_empty((0,), dtype=_complex(inputs[0].dtype))
    return _grads_fake(inputs, wanted), _grads_fake(inputs, wanted), signal_t


for _name, _impl, _fake in (("epg_forward", _forward_impl, _forward_fake), ("epg_jvp", _jvp_impl, _jvp_fake),
                            ("epg_vjp", _vjp_impl, _vjp_fake), ("epg_vjp_jvp", _vjp_jvp_impl, _vjp_jvp_fake)):
    _LIB.impl(_name, _impl, "CPU")
    _LIB.impl(_name, _impl, "CUDA")
    torch.library.register_fake(f"{_NAMESPACE}::{_name}", _fake, lib=_LIB)

_OPS = torch.ops.blochsim


# -- calls from engine structures -------------------------------------------------------------------
def forward(st: K.Static, inputs) -> torch.Tensor:
    """`blochsim::epg_forward` of a `kernels.Static` and its inputs."""
    return _OPS.epg_forward(*static_args(st), *inputs)


def jvp(st: K.Static, inputs, tangents) -> tuple:
    """`blochsim::epg_jvp`: (signal, signal_tangent [P, V, S])."""
    return _OPS.epg_jvp(*static_args(st), *inputs, *tangents)


def vjp(st: K.Static, inputs, cotangent, wanted) -> list:
    """`blochsim::epg_vjp`, its results placed per input (None where not wanted or not given)."""
    return _placed(inputs, wanted, _OPS.epg_vjp(*static_args(st), list(wanted), cotangent, *inputs))


def vjp_jvp(st: K.Static, inputs, tangents, cotangent, cotangent_tangent, wanted, *, signal_tangent: bool = True):
    """`blochsim::epg_vjp_jvp`: (grads, grads_tangent, signal_tangent or None), placed per input."""
    grads, grads_t, signal_t = _OPS.epg_vjp_jvp(*static_args(st), list(wanted), signal_tangent, cotangent,
                                                cotangent_tangent, *inputs, *tangents)
    return _placed(inputs, wanted, grads), _placed(inputs, wanted, grads_t), signal_t if signal_tangent else None


def _placed(inputs, wanted, grads) -> list:
    it = iter(grads)
    return [next(it) if p else None for p in _present(inputs, wanted)]


# -- autograd ---------------------------------------------------------------------------------------
def _tangent(u, x):
    """A cotangent of a gradient output as a VJP-JVP direction [1, *x.shape] (None stays None)."""
    if u is None or x is None:
        return None
    return u.detach().to(x.dtype).reshape((1,) + tuple(x.shape))


_TENSORS = len(STATIC_TENSORS)


def _save(ctx, args: tuple, first_input: int) -> None:
    ctx.sizes, ctx.scalars = list(args[_TENSORS]), list(args[_TENSORS + 1])
    ctx.policy = _execution.active()
    ctx.save_for_backward(*args[:_TENSORS], *args[first_input:])


def _saved(ctx) -> tuple:
    """(structure arguments, the saved tensors after them)."""
    saved = ctx.saved_tensors
    return (*saved[:_TENSORS], ctx.sizes, ctx.scalars), saved[_TENSORS:]


def _forward_setup(ctx, inputs, output):
    _save(ctx, inputs, NUM_STATIC)


def _forward_backward(ctx, grad_signal):
    static, inputs = _saved(ctx)
    wanted = list(ctx.needs_input_grad[NUM_STATIC:NUM_STATIC + NUM_INPUTS])
    with _execution.applied(ctx.policy):
        grads = _placed(inputs, wanted, _OPS.epg_vjp(*static, wanted, grad_signal, *inputs))
    return (None,) * NUM_STATIC + tuple(grads)


def _vjp_setup(ctx, inputs, output):
    ctx.wanted = list(inputs[NUM_STATIC])
    _save(ctx, inputs, NUM_STATIC + 1)  # the cotangent, then the inputs


def _vjp_backward(ctx, grad_grads):
    static, saved = _saved(ctx)
    cotangent, inputs = saved[0], saved[1:]
    it = iter(grad_grads)
    tangents = [_tangent(next(it), x) if p else None for x, p in zip(inputs, _present(inputs, ctx.wanted),
                                                                          strict=True)]
    first = NUM_STATIC + 2
    wanted = list(ctx.needs_input_grad[first:first + NUM_INPUTS])
    want_cotangent = bool(ctx.needs_input_grad[NUM_STATIC + 1])
    if all(t is None for t in tangents) or not (any(wanted) or want_cotangent):
        return (None,) * first + (None,) * NUM_INPUTS
    with _execution.applied(ctx.policy):
        _, second, signal_t = _OPS.epg_vjp_jvp(*static, wanted, want_cotangent, cotangent, None, *inputs, *tangents)
    return (None,) * (NUM_STATIC + 1) + (signal_t if want_cotangent else None,) + tuple(_placed(inputs, wanted,
                                                                                               second))


def _jvp_setup(ctx, inputs, output):
    _save(ctx, inputs, NUM_STATIC)


def _jvp_backward(ctx, grad_signal, grad_jac):
    """As `engine.functions.EpgJacobian.backward`: the inputs' gradient of <grad_signal, signal> +
    sum_p <grad_jac[p], J[p]> (second order through each column), and each tangent's (the first-order VJP
    seeded with its column's cotangent)."""
    static, saved = _saved(ctx)
    inputs, tangents = saved[:NUM_INPUTS], saved[NUM_INPUTS:]
    want_in = list(ctx.needs_input_grad[NUM_STATIC:NUM_STATIC + NUM_INPUTS])
    want_tan = list(ctx.needs_input_grad[NUM_STATIC + NUM_INPUTS:])
    total = [None] * NUM_INPUTS
    columns = [[] for _ in range(NUM_INPUTS)]  # per tangent input, its gradient column by column
    with _execution.applied(ctx.policy):
        if grad_jac is None:
            if grad_signal is not None and any(want_in):
                total = _placed(inputs, want_in, _OPS.epg_vjp(*static, want_in, grad_signal, *inputs))
        else:
            wanted = [a or b for a, b in zip(want_in, want_tan, strict=True)]
            for p in range(grad_jac.shape[0]):
                direction = [None if t is None else t[p:p + 1] for t in tangents]
                seed = grad_signal if p == 0 else None  # the signal's cotangent enters once
                first, second, _ = _OPS.epg_vjp_jvp(*static, wanted, False, grad_jac[p], seed, *inputs, *direction)
                first, second = _placed(inputs, wanted, first), _placed(inputs, wanted, second)
                for i in range(NUM_INPUTS):
                    if want_in[i] and second[i] is not None:
                        total[i] = second[i] if total[i] is None else total[i] + second[i]
                    if want_tan[i] and tangents[i] is not None:
                        columns[i].append(torch.zeros_like(tangents[i][0]) if first[i] is None else
                                          first[i].reshape(tangents[i].shape[1:]))
    grad_tangents = [torch.stack(c) if c else None for c in columns]
    return (None,) * NUM_STATIC + tuple(total) + tuple(grad_tangents)


def _vjp_jvp_setup(ctx, inputs, output):
    pass


def _vjp_jvp_backward(ctx, *grads):
    raise RuntimeError(THIRD_ORDER_MESSAGE)


for _name, _backward, _setup in (("epg_forward", _forward_backward, _forward_setup),
                                 ("epg_jvp", _jvp_backward, _jvp_setup),
                                 ("epg_vjp", _vjp_backward, _vjp_setup),
                                 ("epg_vjp_jvp", _vjp_jvp_backward, _vjp_jvp_setup)):
    torch.library.register_autograd(f"{_NAMESPACE}::{_name}", _backward, setup_context=_setup, lib=_LIB)


# -- vmap -------------------------------------------------------------------------------------------
def _entry(arg, dim, b: int):
    return arg.select(dim, b) if isinstance(arg, torch.Tensor) and dim is not None else arg


def _stack(outputs: list):
    """Per-entry outputs stacked first: (stacked, out_dims), for tensors, lists and tuples of them."""
    first = outputs[0]
    if isinstance(first, torch.Tensor):
        return torch.stack(outputs), 0
    parts = [_stack(list(items)) for items in zip(*outputs, strict=True)]
    return type(first)(p[0] for p in parts), type(first)(p[1] for p in parts)


def _loop(op):
    def rule(info, in_dims, *args):
        return _stack([op(*[_entry(a, d, b) for a, d in zip(args, in_dims, strict=True)])
                       for b in range(info.batch_size)])
    return rule


def _voxel_axis(x, dim, batch: int, voxels: int, lead: int = 0):
    """A tissue or table input (voxel axis `lead`: [..., V or 1, ...]) batched at `dim` (or not), as one input of
    batch x voxels voxels: [B * V (or 1), ...]."""
    if x is None:
        return None
    if dim is None:
        if x.shape[lead] == 1:
            return x
        x = x.unsqueeze(lead).expand(x.shape[:lead] + (batch,) + x.shape[lead:])
    else:
        x = x.movedim(dim, lead)
    shape = tuple(x.shape)
    x = x.expand(shape[:lead + 1] + (voxels,) + shape[lead + 2:])
    return x.reshape(shape[:lead] + (batch * voxels,) + shape[lead + 2:])


def _unbatched(dims) -> bool:
    """Whether none of these in_dims is batched (a list argument's in_dim is a list of Nones)."""
    return all(d is None or isinstance(d, (list, tuple)) and _unbatched(d) for d in dims)


_POSITIONS = SIZES.index("num_positions") if "num_positions" in SIZES else None


def _folds_voxels(in_dims, args) -> bool:
    """A batch of tissue only: the structure and the event values are the same for every entry, and no slice
    profile numbers the voxels by position (then a batch entry's voxels would take other positions)."""
    across_slice = _POSITIONS is not None and _sizes(args)[_POSITIONS] != 1
    return _unbatched(in_dims[:NUM_STATIC + K.NUM_EVENT_INPUTS]) and not across_slice


def _forward_vmap(info, in_dims, *args):
    if not _folds_voxels(in_dims, args):
        return _loop(_OPS.epg_forward)(info, in_dims, *args)
    B, sizes = info.batch_size, list(_sizes(args))
    V = sizes[_VOXELS]
    inputs = [_voxel_axis(x, d, B, V) if i >= K.NUM_EVENT_INPUTS else x
              for i, (x, d) in enumerate(zip(args[NUM_STATIC:], in_dims[NUM_STATIC:], strict=True))]
    sizes[_VOXELS] = B * V
    signal = _OPS.epg_forward(*args[:_TENSORS], sizes, args[_TENSORS + 1], *inputs)
    return signal.reshape(B, V, -1), 0


def _jvp_vmap(info, in_dims, *args):
    """`jacfwd`: a batch of tangents only becomes more tangent columns of one call; a batch of tissue and
    tangents, more voxels (a tangent [P, V or 1] batched becomes [P, B * V])."""
    B, sizes = info.batch_size, list(_sizes(args))
    input_dims, tangent_dims = in_dims[NUM_STATIC:NUM_STATIC + NUM_INPUTS], in_dims[NUM_STATIC + NUM_INPUTS:]
    inputs, tangents = args[NUM_STATIC:NUM_STATIC + NUM_INPUTS], args[NUM_STATIC + NUM_INPUTS:]
    if _unbatched(in_dims[:NUM_STATIC]) and _unbatched(input_dims):
        counts = [t.shape[0 if d != 0 else 1] for t, d in zip(tangents, tangent_dims, strict=True) if t is not None]
        P = max(counts, default=1)

        def columns(t, d):
            if t is None:
                return None
            t = t.unsqueeze(0).expand((B,) + tuple(t.shape)) if d is None else t.movedim(d, 0)
            if t.shape[1] != P:  # a direction held by fewer columns (the kernel's zero padding)
                t = torch.cat([t, t.new_zeros((B, P - t.shape[1]) + tuple(t.shape[2:]))], 1)
            return t.reshape((B * P,) + tuple(t.shape[2:]))

        signal, signal_t = _OPS.epg_jvp(*args[:NUM_STATIC], *inputs,
                                        *[columns(t, d) for t, d in zip(tangents, tangent_dims, strict=True)])
        return (signal, signal_t.reshape((B, P) + tuple(signal_t.shape[1:]))), (None, 0)
    if not _folds_voxels(in_dims, args) or any(d is not None for d in tangent_dims[:K.NUM_EVENT_INPUTS]):
        return _loop(_OPS.epg_jvp)(info, in_dims, *args)
    V = sizes[_VOXELS]
    folded = [_voxel_axis(x, d, B, V) if i >= K.NUM_EVENT_INPUTS else x
              for i, (x, d) in enumerate(zip(inputs, input_dims, strict=True))]
    # A tangent [P, V or 1, ...] has its voxel axis after its column axis.
    folded_t = [t if t is None or i < K.NUM_EVENT_INPUTS else
                _voxel_axis(t if d is None else t.movedim(d, 1), None if d is None else 1, B, V, lead=1)
                for i, (t, d) in enumerate(zip(tangents, tangent_dims, strict=True))]
    sizes[_VOXELS] = B * V
    signal, signal_t = _OPS.epg_jvp(*args[:_TENSORS], sizes, args[_TENSORS + 1], *folded, *folded_t)
    P = signal_t.shape[0]
    return (signal.reshape(B, V, -1), signal_t.reshape(P, B, V, -1)), (0, 1)


torch.library.register_vmap(f"{_NAMESPACE}::epg_forward", _forward_vmap, lib=_LIB)
torch.library.register_vmap(f"{_NAMESPACE}::epg_jvp", _jvp_vmap, lib=_LIB)
torch.library.register_vmap(f"{_NAMESPACE}::epg_vjp", _loop(_OPS.epg_vjp), lib=_LIB)
torch.library.register_vmap(f"{_NAMESPACE}::epg_vjp_jvp", _loop(_OPS.epg_vjp_jvp), lib=_LIB)
