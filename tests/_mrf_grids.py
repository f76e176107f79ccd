"""The usual MRF dictionary grid for estimator tests: T1 x T2 on log grids (ms), T2 <= T1."""

import math

import torch


def t1_t2_grid(n1: int, n2: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(T1, T2) flat, ms: T1 200-3000 ms over n1 log steps, T2 10-300 ms over n2, pairs with T2 <= T1 kept."""
    t1 = torch.logspace(math.log10(200), math.log10(3000), n1)
    t2 = torch.logspace(1, math.log10(300), n2)
    T1, T2 = torch.meshgrid(t1, t2, indexing="ij")
    keep = T2 <= T1
    return T1[keep], T2[keep]
