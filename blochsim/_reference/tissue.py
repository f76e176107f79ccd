"""The oracle's tissue: properties as float64 tensors, validated, and the pools with their exchange matrix."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from .._arrays import broadcast_shapes
from ..sequence.tissue import POOL_LETTERS, TissueProperties

REAL = torch.float64
COMPLEX = torch.complex128

#: Relaxation times (ms) are clamped to at least this, so T = 0 decays to 0 instead of dividing by 0.
MIN_RELAXATION_MS = 1e-6



def _f64(value: Any) -> torch.Tensor:
    """A float64 tensor of `value`, keeping a tensor's autograd graph."""
    if isinstance(value, torch.Tensor):
        return value.to(REAL)
    return torch.tensor(float(value), dtype=REAL)


def _is_given(value: Any) -> bool:
    """A pool is present when its fraction is a tensor (any value) or a nonzero number."""
    return isinstance(value, torch.Tensor) or float(value) != 0.0


# ---------------------------------------------------------------------------------------------
# Tissue -> per-voxel pool tables
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Pools:
    """Per-voxel pool tables, each broadcast to voxel_shape on the leading axes.

    fraction, r1_per_s, exchange_hz: (*V, P); r2_per_s, shift_hz: (*V, Pw) (water-like pools).
    exchange_hz[..., 0] is unused (free water is the hub of the exchange).
    """

    voxel_shape: torch.Size
    water: int  # Pw, the number of water-like pools
    semisolid: bool
    fraction: torch.Tensor
    r1_per_s: torch.Tensor
    exchange_hz: torch.Tensor
    r2_per_s: torch.Tensor
    shift_hz: torch.Tensor

    @property
    def count(self) -> int:
        return self.fraction.shape[-1]


def _relaxation_fields() -> list[str]:
    names = ["t1_ms", "t2_ms", "t1_bound_ms", "t2_bound_ms"]
    for letter in POOL_LETTERS:
        names += [f"t1_pool_{letter}_ms", f"t2_pool_{letter}_ms"]
    return names


def _fraction_fields() -> list[str]:
    return ["bound_fraction"] + [f"pool_{letter}_fraction" for letter in POOL_LETTERS]


def _validate_tissue(values: dict, voxel_shape: torch.Size) -> None:
    for name in _relaxation_fields():
        t = values[name].detach()
        if bool(torch.isnan(t).any()):
            raise ValueError(f"{name} holds NaN; relaxation times must be numbers >= 0 ms (inf = no relaxation)")
        if bool((t < 0).any()):
            raise ValueError(
                f"{name} holds a negative value ({float(t.min())} ms); relaxation times must be >= 0 ms"
            )
    total = torch.zeros(voxel_shape, dtype=REAL)
    for name in _fraction_fields():
        f = values[name].detach()
        if not bool((f >= 0).all()):  # also catches NaN
            bad = f[~(f >= 0)].reshape(-1)[0]
            raise ValueError(f"{name} must be >= 0 in every voxel (a fraction of M0), got {float(bad)}")
        total = total + f
    # 1e-12 of slack so that fractions meant to sum to 1 are not rejected for float rounding.
    if bool((total > 1.0 + 1e-12).any()):
        worst = int(torch.argmax(total))
        index = tuple(int(i) for i in torch.unravel_index(torch.tensor(worst), voxel_shape)) if voxel_shape else ()
        raise ValueError(
            f"pool fractions (bound_fraction + pool_b..e_fraction) must sum to <= 1 in every voxel; "
            f"voxel {index} sums to {float(total.reshape(-1)[worst])}"
        )
    t2_prime = values["t2_prime_ms"].detach()
    if not bool((t2_prime >= 0).all()):  # also catches NaN
        raise ValueError("t2_prime_ms must be >= 0 ms in every voxel (inf = no T2'), it holds NaN or a negative value")


def _pools(tissue: TissueProperties) -> tuple[_Pools, dict]:
    """Pool tables and the float64 field values (broadcast to the voxel shape) of `tissue`."""
    raw = dict(tissue.items())
    tensors = [v for v in raw.values() if isinstance(v, torch.Tensor)]
    voxel_shape = broadcast_shapes(*(t.shape for t in tensors)) if tensors else torch.Size([])
    values = {name: torch.broadcast_to(_f64(v), voxel_shape) for name, v in raw.items()}
    _validate_tissue(values, voxel_shape)

    def rate(name: str) -> torch.Tensor:  # ms -> 1/s, clamped; inf -> 0
        return 1e3 / torch.clamp(values[name], min=MIN_RELAXATION_MS)

    letters = [x for x in POOL_LETTERS if _is_given(raw[f"pool_{x}_fraction"])]
    semisolid = _is_given(raw["bound_fraction"])
    other_fractions = [values[f"pool_{x}_fraction"] for x in letters]
    if semisolid:
        other_fractions.append(values["bound_fraction"])
    f_free = 1.0 - sum(other_fractions, torch.zeros(voxel_shape, dtype=REAL))

    fraction = [f_free] + other_fractions
    r1 = [rate("t1_ms")] + [rate(f"t1_pool_{x}_ms") for x in letters]
    exchange = [torch.zeros(voxel_shape, dtype=REAL)] + [values[f"pool_{x}_exchange_hz"] for x in letters]
    r2 = [rate("t2_ms")] + [rate(f"t2_pool_{x}_ms") for x in letters]
    shift = [torch.zeros(voxel_shape, dtype=REAL)] + [values[f"pool_{x}_shift_hz"] for x in letters]
    if semisolid:
        r1.append(rate("t1_bound_ms"))
        exchange.append(values["bound_exchange_hz"])
    pools = _Pools(
        voxel_shape=voxel_shape,
        water=1 + len(letters),
        semisolid=semisolid,
        fraction=torch.stack(fraction, -1),
        r1_per_s=torch.stack(r1, -1),
        exchange_hz=torch.stack(exchange, -1),
        r2_per_s=torch.stack(r2, -1),
        shift_hz=torch.stack(shift, -1),
    )
    return pools, values


def _exchange_matrix(fraction: torch.Tensor, exchange_hz: torch.Tensor) -> torch.Tensor:
    """Bloch-McConnell exchange generator (*V, P, P) in 1/s, every pool exchanging with pool 0.

    Pool 0 (free water) loses k_p·f_p to pool p and gains k_p·f_free from it, so the columns sum
    to zero (total magnetization conserved) and (f_free, f_p, ...) is in the null space.
    """
    count = fraction.shape[-1]
    zero = torch.zeros_like(fraction[..., 0])
    to_pool = [exchange_hz[..., p] * fraction[..., p] for p in range(count)]  # free -> p
    to_free = [exchange_hz[..., p] * fraction[..., 0] for p in range(count)]  # p -> free
    rows = [[zero] * count for _ in range(count)]
    rows[0][0] = -sum(to_pool[1:], zero)
    for p in range(1, count):
        rows[0][p] = to_free[p]
        rows[p][0] = to_pool[p]
        rows[p][p] = -to_free[p]
    return torch.stack([torch.stack(row, -1) for row in rows], -2)


# ---------------------------------------------------------------------------------------------
# The state and the operators on it
# ---------------------------------------------------------------------------------------------


