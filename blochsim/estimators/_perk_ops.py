"""PERK's kernel passes (`estimators.perk_kernels`) as custom ops in the `blochsim::` namespace.

| op                          | kernel pass          | returns                                                   |
| --------------------------- | -------------------- | --------------------------------------------------------- |
| `blochsim::perk_map`        | `bs_perk_map`        | offset + cos(x W^T + b) head^T, `(V, T)` in x's dtype     |
| `blochsim::perk_vjp`        | `bs_perk_vjp`        | the gradient of sum(cotangent * map) in x, `(V, D)`       |
| `blochsim::perk_accumulate` | `bs_perk_accumulate` | nothing: adds the fit's sums into the accumulators given  |

The arguments are those of `perk_kernels.regression`, `regression_vjp` and `accumulate`, with the random
features as their two tensors (`frequency` W `[F, D]`, `phase` b `[F]`). Each op has a fake implementation,
autograd (the map's backward is the VJP op, in `x` only: the kernels give no other derivative, and asking for
one raises; the VJP op's backward raises: PERK's kernels give first derivatives only) and a vmap rule (a
batch of input rows is more rows of one call). Like the EPG ops (`engine.ops`), they call the ctypes kernels.
"""

from __future__ import annotations

import torch

from . import perk_kernels as kernels

__all__ = ["FIRST_ORDER_MESSAGE"]

FIRST_ORDER_MESSAGE = "PERK's kernels give the first derivative of the map in its input rows only"

_LIB = torch.library.Library("blochsim", "FRAGMENT")
_LIB.define("perk_map(Tensor x, Tensor frequency, Tensor phase, Tensor head, Tensor offset) -> Tensor")
_LIB.define("perk_vjp(Tensor x, Tensor frequency, Tensor phase, Tensor head, Tensor cotangent) -> Tensor")
_LIB.define("perk_accumulate(Tensor x, Tensor frequency, Tensor phase, Tensor? target, Tensor(a!)? feature_sum, "
            "Tensor(b!)? feature_gram, Tensor(c!)? feature_target) -> ()")


def _map(x, frequency, phase, head, offset):
    return kernels.regression(x, kernels.RandomFeatures.of(frequency, phase), head, offset).to(x.dtype)


def _vjp(x, frequency, phase, head, cotangent):
    return kernels.regression_vjp(x, kernels.RandomFeatures.of(frequency, phase), head, cotangent).to(x.dtype)


def _accumulate(x, frequency, phase, target, feature_sum, feature_gram, feature_target):
    kernels.accumulate(x, kernels.RandomFeatures.of(frequency, phase), target, feature_sum=feature_sum,
                       feature_gram=feature_gram, feature_target=feature_target)


for _name, _impl in (("perk_map", _map), ("perk_vjp", _vjp), ("perk_accumulate", _accumulate)):
    _LIB.impl(_name, _impl, "CPU")
    _LIB.impl(_name, _impl, "CUDA")


@torch.library.register_fake("blochsim::perk_map", lib=_LIB)
def _map_fake(x, frequency, phase, head, offset):
    return x.new_empty((x.shape[0], head.shape[0]))


@torch.library.register_fake("blochsim::perk_vjp", lib=_LIB)
def _vjp_fake(x, frequency, phase, head, cotangent):
    return x.new_empty(x.shape)


@torch.library.register_fake("blochsim::perk_accumulate", lib=_LIB)
def _accumulate_fake(x, frequency, phase, target, feature_sum, feature_gram, feature_target):
    return None


def _map_setup(ctx, inputs, output):
    ctx.save_for_backward(*inputs[:4])


def _map_backward(ctx, grad):
    if any(ctx.needs_input_grad[1:]):
        raise RuntimeError(f"{FIRST_ORDER_MESSAGE}, not in the features, the heads or the offsets")
    x, frequency, phase, head = ctx.saved_tensors
    return torch.ops.blochsim.perk_vjp(x, frequency, phase, head, grad), None, None, None, None


def _vjp_backward(ctx, grad):
    raise RuntimeError(f"{FIRST_ORDER_MESSAGE}: no second-order pass exists")


torch.library.register_autograd("blochsim::perk_map", _map_backward, setup_context=_map_setup, lib=_LIB)
torch.library.register_autograd("blochsim::perk_vjp", _vjp_backward, setup_context=lambda ctx, inputs, output: None,
                                lib=_LIB)


def _rows(op, batched_last: int):
    """vmap: the input rows (and, for the VJP, the cotangent rows) batched alone are more rows of one call."""
    def rule(info, in_dims, *args):
        row_dims = (in_dims[0],) + ((in_dims[4],) if batched_last else ())
        if any(d is None for d in row_dims) or any(d is not None for d in in_dims[1:4 + (not batched_last)]):
            out = [op(*[a.select(d, b) if d is not None else a for a, d in zip(args, in_dims, strict=True)])
                   for b in range(info.batch_size)]
            return torch.stack(out), 0
        x = args[0].movedim(in_dims[0], 0)
        B, V = x.shape[:2]
        rest = list(args[1:])
        if batched_last:
            rest[3] = rest[3].movedim(in_dims[4], 0).reshape((B * V,) + tuple(rest[3].shape[2:]))
        out = op(x.reshape((B * V,) + tuple(x.shape[2:])), *rest)
        return out.reshape((B, V) + tuple(out.shape[1:])), 0
    return rule


torch.library.register_vmap("blochsim::perk_map", _rows(torch.ops.blochsim.perk_map, False), lib=_LIB)
torch.library.register_vmap("blochsim::perk_vjp", _rows(torch.ops.blochsim.perk_vjp, True), lib=_LIB)
