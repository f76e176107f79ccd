"""The kernels as torch.autograd.Functions.

| Function       | kernel                | gives                                                     |
| -------------- | --------------------- | --------------------------------------------------------- |
| `EpgSimulate`  | forward; JVP (jvp)    | the signal; `torch.func.jvp` and forward-mode AD           |
| `EpgVjp`       | VJP (checkpointed)    | `backward()` of the signal                                 |
| `EpgJacobian`  | JVP with P tangents   | the signal and its Jacobian along P tissue properties      |
| (backwards)    | VJP-JVP               | the backward of a gradient (HVP) or of a Jacobian          |
| `EpgSimulate`  | VJP-JVP               | its backward on dual tensors (forward over reverse)        |

A third derivative raises RuntimeError: the second-order results come out of `_NoThirdOrder`.
Each Function keeps the execution policy active when it ran (`blochsim._execution`), and its backward runs
under it: a `backward()` outside the `execution(...)` block of its forward is placed and chunked alike.
Each Function has a separate `setup_context` (which torch.func needs) and a `vmap` rule, a loop over the
batch (`engine.vmap`; `_NoThirdOrder` only clones, so torch.func generates its rule).
"""

from __future__ import annotations

import threading

import torch
import torch.autograd.forward_ad as fwAD

from .. import _execution
from .._arrays import transformed
from .._tracing import planning
from . import kernels as K
from . import ops
from .vmap import holds_batch, vmap_rule

__all__ = ["EpgSimulate", "EpgVjp", "EpgJacobian", "THIRD_ORDER_MESSAGE", "run_forward", "run_jacobian"]

THIRD_ORDER_MESSAGE = ops.THIRD_ORDER_MESSAGE


class _NoThirdOrder(torch.autograd.Function):
    """Identity on second-order results, wired to the inputs they depend on; its backward refuses."""

    generate_vmap_rule = True  # clones only

    @staticmethod
    def forward(n, *args):
        return tuple(a.clone() for a in args[:n])

    @staticmethod
    def setup_context(ctx, inputs, output):
        pass

    @staticmethod
    def backward(ctx, *grads):
        raise RuntimeError(THIRD_ORDER_MESSAGE)


def _second_order(results: list, depends_on: list) -> list:
    """Route the present results through _NoThirdOrder when a graph is being recorded."""
    present = [r for r in results if r is not None]
    if not present or not torch.is_grad_enabled():
        return results
    deps = [d for d in depends_on if isinstance(d, torch.Tensor) and d.requires_grad]
    if not deps:
        return results
    routed = iter(_NoThirdOrder.apply(len(present), *present, *deps))
    return [None if r is None else next(routed) for r in results]


def _as_tangent(t, like):
    """A tangent for one input, shaped [1, *like.shape], or None."""
    if t is None or like is None:
        return None
    return t.detach().to(like.dtype).reshape((1,) + tuple(like.shape))


_unwrap_if_dead = getattr(torch._C._functorch, "unwrap_if_dead", lambda t: t)


def _apply(function: type[torch.autograd.Function], *args):
    """`function.apply(*args)`. `Function.apply` binds the forward's signature with `inspect` on every call
    (for default arguments, which these forwards do not have): ~50 Python calls, tens of microseconds a
    kernel call. Outside torch.func transforms it then calls the C implementation, as this does directly,
    after the same unwrapping of tensors left over from a finished transform."""
    if torch._C._are_functorch_transforms_active():
        return function.apply(*args)
    return super(torch.autograd.Function, function).apply(
        *[_unwrap_if_dead(a) if isinstance(a, torch.Tensor) else a for a in args])


def _unpack_duals(inputs) -> tuple[list, list]:
    """(primals, tangents) of the inputs (forward-mode duals or plain tensors; `_as_tangent`: None where an
    input carries none)."""
    primals, tangents = [], []
    for x in inputs:
        primal, tangent = (None, None) if x is None else fwAD.unpack_dual(x)
        primals.append(primal)
        tangents.append(_as_tangent(tangent, primal))
    return primals, tangents


def _dual_backward(ctx, grad_signal, inputs, wanted):
    """EpgSimulate's backward on dual tensors (forward over reverse, as `blochsim.hvp` runs it; no graph
    recorded): the VJP and its tangent from one second-order pass, where EpgVjp would run the VJP and then
    the same second-order pass for its tangent. None when nothing carries a tangent, or under torch.func
    (its tensors are wrapped; EpgVjp handles them)."""
    if torch._C._functorch.peek_interpreter_stack() is not None:
        return None
    primals, tangents = _unpack_duals(inputs)
    cotangent, cotangent_tangent = fwAD.unpack_dual(grad_signal)
    if cotangent_tangent is None and all(t is None for t in tangents):
        return None
    with _execution.applied(ctx.policy):
        grads, grads_tangent, _ = K.vjp_jvp(ctx.static, primals, tangents, cotangent, cotangent_tangent, wanted,
                                            signal_tangent=False)
    out = []
    for g, h, x, w in zip(grads, grads_tangent, primals, wanted, strict=True):
        if not w:
            out.append(None)
        else:
            g = g.reshape(x.shape)
            out.append(g if h is None else fwAD.make_dual(g, h.reshape(x.shape)))
    return (None, *out)


def run_forward(static, inputs) -> torch.Tensor:
    """`EpgSimulate.apply(static, *inputs)`, or the kernel directly when nothing can carry a derivative. While
    a compiled plan is recorded (`blochsim._tracing`), the custom op, which the recording keeps."""
    if planning():
        return ops.forward(static, inputs)
    if transformed() or (torch.is_grad_enabled() and any([x is not None and x.requires_grad for x in inputs])):
        tangents = _dual_tangents(inputs) if fwAD._current_level >= 0 else None
        if tangents is None:
            return _apply(EpgSimulate, static, *inputs)
        _pending.tangents = tangents
        try:
            return _apply(EpgSimulate, static, *inputs)
        finally:
            _pending.tangents = _pending.signal_tangent = None
    return K.forward(static, inputs)


# The tangents of a forward on dual tensors, from run_forward to EpgSimulate.forward, and the signal's
# tangent from there to its jvp (per thread: a call's three steps run on the caller's thread).
_pending = threading.local()


def _dual_tangents(inputs) -> list | None:
    """The inputs' forward-mode tangents (`_as_tangent`) when no torch.func transform is active (its batched
    tangents go through `jvp`) and some input carries one; else None. EpgSimulate's forward then runs the JVP
    kernel, which gives the signal and its tangent in one pass: run as a forward followed by `jvp`, the
    signal was computed twice (forward over reverse, `blochsim.hvp`: about 2% of a 10k-tissue HVP)."""
    if torch._C._functorch.peek_interpreter_stack() is not None:
        return None
    tangents = _unpack_duals(inputs)[1]
    return None if all(t is None for t in tangents) else tangents


def run_jacobian(static, inputs, tangents) -> tuple:
    """(signal [V, S], J [P, V, S]): `EpgJacobian.apply`, or the custom op while a plan is recorded."""
    if planning():
        return ops.jvp(static, inputs, tangents)
    return _apply(EpgJacobian, static, len(inputs), *inputs, *tangents)


class EpgSimulate(torch.autograd.Function):
    """signal = EpgSimulate.apply(static, dt_s, dt_wrap_s, flip_rad, phase_rad, *tissue)."""

    @staticmethod
    def forward(static, *inputs):
        tangents = getattr(_pending, "tangents", None)
        if tangents is None:
            return K.forward(static, inputs)
        _pending.tangents = None
        signal, signal_tangent = K.jvp(static, inputs, tangents)
        _pending.signal_tangent = (signal, signal_tangent[0])
        return signal

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.static = inputs[0]
        ctx.policy = _execution.active()
        ctx.save_for_backward(*inputs[1:])
        ctx.save_for_forward(*inputs[1:])
        held = getattr(_pending, "signal_tangent", None)
        ctx.signal_tangent = held[1] if held is not None and held[0] is output else None
        _pending.signal_tangent = None

    @staticmethod
    def backward(ctx, grad_signal):
        inputs = ctx.saved_tensors
        wanted = list(ctx.needs_input_grad[1:])
        if fwAD._current_level >= 0 and not torch.is_grad_enabled():
            fused = _dual_backward(ctx, grad_signal, inputs, wanted)
            if fused is not None:
                return fused
        with _execution.applied(ctx.policy):
            grads = _apply(EpgVjp, ctx.static, wanted, grad_signal, *inputs)
        grads = iter(grads)
        return (None, *[next(grads) if w else None for w in wanted])

    @staticmethod
    def jvp(ctx, _static_tangent, *tangents):
        if getattr(ctx, "signal_tangent", None) is not None:  # the forward ran the JVP kernel (_dual_tangents)
            signal_tangent, ctx.signal_tangent = ctx.signal_tangent, None
            return signal_tangent
        inputs = ctx.saved_tensors
        tangents = [_as_tangent(t, x) for t, x in zip(tangents, inputs, strict=True)]
        if all(t is None for t in tangents):
            return torch.zeros((ctx.static.num_voxels, ctx.static.num_samples), dtype=K._complex(ctx.static.dtype),
                               device=ctx.static.device)
        if any(t is not None and holds_batch(t) for t in tangents):
            # A batch of tangents (torch.func.jacfwd): EpgJacobian's vmap rule loops over it.
            return EpgJacobian.apply(ctx.static, len(inputs), *inputs, *tangents)[1][0]
        _, signal_tangent = K.jvp(ctx.static, inputs, tangents)
        return signal_tangent[0]

    @staticmethod
    def vmap(info, in_dims, *args):
        return vmap_rule(EpgSimulate, info, in_dims, *args)


class EpgVjp(torch.autograd.Function):
    """grads = EpgVjp.apply(static, wanted, cotangent, *inputs): the gradients of the wanted inputs."""

    @staticmethod
    def forward(static, wanted, cotangent, *inputs):
        grads = K.vjp(static, inputs, cotangent, wanted)
        return tuple(g.reshape(x.shape) for g, x, w in zip(grads, inputs, wanted, strict=True) if w)

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.static, ctx.wanted = inputs[0], inputs[1]
        ctx.policy = _execution.active()
        ctx.save_for_backward(*inputs[2:])

    @staticmethod
    def backward(ctx, *grad_grads):
        cotangent, *inputs = ctx.saved_tensors
        # The direction: one tangent per wanted input, from the cotangents of its gradient.
        it = iter(grad_grads)
        tangents = []
        for x, w in zip(inputs, ctx.wanted, strict=True):
            u = next(it) if w else None
            tangents.append(_as_tangent(u, x))
        wanted = list(ctx.needs_input_grad[3:])
        with _execution.applied(ctx.policy):
            _, second, signal_tangent = K.vjp_jvp(ctx.static, inputs, tangents, cotangent, None, wanted,
                                                  signal_tangent=ctx.needs_input_grad[2])
        second = [None if g is None else g.reshape(x.shape) for g, x in zip(second, inputs, strict=True)]
        grad_cot = signal_tangent if ctx.needs_input_grad[2] else None
        routed = _second_order([grad_cot, *second], [cotangent, *inputs])
        return (None, None, *routed)

    @staticmethod
    def vmap(info, in_dims, *args):
        return vmap_rule(EpgVjp, info, in_dims, *args)


class EpgJacobian(torch.autograd.Function):
    """(signal [V, S], J [P, V, S]) = EpgJacobian.apply(static, n, *inputs, *tangents).

    `tangents` holds, per input, None or a tensor [P, *input.shape]: column p of J is the derivative of the
    signal along the p-th tangents. The backward reaches the inputs (second order) and the tangents (the
    first-order VJP seeded with that column's cotangent), so a tangent that itself depends on the tissue
    (a pool table's derivative) carries its part of the gradient.
    """

    @staticmethod
    def forward(static, n, *args):
        return K.jvp(static, args[:n], args[n:])

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.static, ctx.n = inputs[0], inputs[1]
        ctx.policy = _execution.active()
        ctx.save_for_backward(*inputs[2:])
        # An output the loss does not use comes back as None, not zeros: a zero cotangent of the signal
        # beside J's would cost the directions in one call a first-order VJP of its own (vjp_jvp_directions).
        ctx.set_materialize_grads(False)

    @staticmethod
    def backward(ctx, grad_signal, grad_jac):
        saved = ctx.saved_tensors
        n, st = ctx.n, ctx.static
        inputs, tangents = saved[:n], saved[n:]
        want_in = list(ctx.needs_input_grad[2 : 2 + n])
        want_tan = list(ctx.needs_input_grad[2 + n :])
        total = [None] * n
        grad_tangents = [None] * n
        if grad_jac is None and grad_signal is None:
            return (None, None, *[None] * (2 * n))
        if grad_jac is None:
            with _execution.applied(ctx.policy):
                total = K.vjp(st, inputs, grad_signal, want_in)
        else:
            P = grad_jac.shape[0]
            wanted = [a or b for a, b in zip(want_in, want_tan, strict=True)]
            if P > 1 and K.directions_in_one_call(st, inputs, tangents, want_tan):
                with _execution.applied(ctx.policy):
                    total = K.vjp_jvp_directions(st, inputs, tangents, grad_jac, grad_signal, wanted)
            else:
                for p in range(P):
                    direction = [None if t is None else t[p : p + 1] for t in tangents]
                    seed_t = grad_signal if p == 0 else None  # None: a zero cotangent tangent
                    with _execution.applied(ctx.policy):
                        first, second, _ = K.vjp_jvp(st, inputs, direction, grad_jac[p], seed_t, wanted,
                                                     signal_tangent=False)
                    for i in range(n):
                        if want_in[i] and second[i] is not None:
                            total[i] = second[i] if total[i] is None else total[i] + second[i]
                        if want_tan[i] and first[i] is not None:
                            if grad_tangents[i] is None:
                                grad_tangents[i] = torch.zeros_like(tangents[i])
                            grad_tangents[i][p] = first[i].reshape(tangents[i].shape[1:])
        total = [None if g is None or not w else g.reshape(x.shape) for g, x, w in zip(total, inputs, want_in,
                                                                                     strict=True)]
        routed = _second_order(total + grad_tangents, list(inputs) + list(tangents))
        return (None, None, *routed)

    @staticmethod
    def vmap(info, in_dims, *args):
        return vmap_rule(EpgJacobian, info, in_dims, *args)
