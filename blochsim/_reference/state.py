"""The oracle's EPG state (F+, F-, Z per pool and order), its equilibrium, shift and spoiler."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .tissue import (
    COMPLEX,
    REAL,
    _Pools,
)


@dataclass(frozen=True)
class _State:
    """fplus, fminus: (*V, Pw, K) water-like pools; z: (*V, P, K) all pools. complex128."""

    fplus: torch.Tensor
    fminus: torch.Tensor
    z: torch.Tensor


def _equilibrium(pools: _Pools, states: int) -> _State:
    shape = (*pools.voxel_shape, pools.water, states)
    first_order = torch.zeros(states, dtype=REAL)
    first_order[0] = 1.0  # a constant, not a tensor that needs grad
    z = pools.fraction[..., None] * first_order
    zero = torch.zeros(shape, dtype=COMPLEX)
    return _State(zero, zero, z.to(COMPLEX))


def _shift(state: _State) -> _State:
    """One unit of dephasing: F+(k) -> F+(k+1), F-(k) -> F-(k-1), new F+(0) = conj(new F-(0))."""
    fminus = torch.cat([state.fminus[..., 1:], torch.zeros_like(state.fminus[..., :1])], -1)
    fplus = torch.cat([fminus[..., :1].conj(), state.fplus[..., :-1]], -1)
    return _State(fplus, fminus, state.z)


def _spoil(state: _State) -> _State:
    return _State(torch.zeros_like(state.fplus), torch.zeros_like(state.fminus), state.z)



def _add_to_order0(z: torch.Tensor, per_pool: torch.Tensor) -> torch.Tensor:
    """z (*V, P, K) with per_pool (*V, P) added to order 0, without writing into z."""
    first_order = torch.zeros(z.shape[-1], dtype=REAL)
    first_order[0] = 1.0
    return z + (per_pool[..., None] * first_order).to(COMPLEX)


