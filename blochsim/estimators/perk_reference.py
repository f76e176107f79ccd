"""PERK's regression in plain PyTorch: the reference the kernels are held to, and the path of a CUDA build
without PERK kernels.

Short and obviously right (in float64 it is the oracle of tests/test_perk_kernels.py). With W `[F, D]`
(`frequency`), b `[F]` (`phase`), an input row x `[D]`, heads H `[T, F]` and offsets c `[T]`:

    z(x) = cos(W x + b)                      features                [F]
    y(x) = c + H z(x)                        regression              [T]
    d<g, y>/dx = -W^T (sin(W x + b) * H^T g)  its VJP for a cotangent g [T]

(the kernels' contract, `csrc/perk.h`). The chunked forms process `chunk` rows at a time, so no more than
`chunk x F` features exist at once.
"""

from __future__ import annotations

import torch

__all__ = ["features", "regression", "regression_vjp", "accumulate"]


def features(x: torch.Tensor, frequency: torch.Tensor, phase: torch.Tensor) -> torch.Tensor:
    """cos(x W^T + b): `x` `(N, D)` -> `(N, F)`."""
    return torch.cos(x @ frequency.T + phase)


def regression(x, frequency, phase, head, offset, *, chunk: int | None = None) -> torch.Tensor:
    """c + cos(x W^T + b) H^T: `x` `(N, D)`, `head` `(T, F)`, `offset` `(T,)` -> `(N, T)`."""
    if chunk is None or x.shape[0] <= chunk:
        return offset + features(x, frequency, phase) @ head.T
    return torch.cat([regression(x[i:i + chunk], frequency, phase, head, offset) for i in range(0, x.shape[0], chunk)])


def regression_vjp(x, frequency, phase, head, cotangent, *, chunk: int | None = None) -> torch.Tensor:
    """The gradient of `sum(cotangent * regression(x))` with respect to `x` `(N, D)`."""
    if chunk is not None and x.shape[0] > chunk:
        return torch.cat([regression_vjp(x[i:i + chunk], frequency, phase, head, cotangent[i:i + chunk])
                          for i in range(0, x.shape[0], chunk)])
    slope = -torch.sin(x @ frequency.T + phase)
    return (slope * (cotangent @ head)) @ frequency


def accumulate(x, frequency, phase, target, *, chunk: int | None = None) -> tuple:
    """(sum_k z_k, sum_k z_k z_k^T, sum_k z_k y_k^T) in float64 over the rows of `x` `(N, D)` and `target`
    `(N, T)` (or None: the third is None)."""
    F = frequency.shape[0]
    total = x.new_zeros((F,), dtype=torch.float64)
    gram = x.new_zeros((F, F), dtype=torch.float64)
    cross = None if target is None else x.new_zeros((F, target.shape[1]), dtype=torch.float64)
    step = chunk or max(x.shape[0], 1)
    for i in range(0, x.shape[0], step):
        z = features(x[i:i + step], frequency, phase).to(torch.float64)
        total += z.sum(0)
        gram += z.T @ z
        if target is not None:
            cross += z.T @ target[i:i + step].to(torch.float64)
    return total, gram, cross
