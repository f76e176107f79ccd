"""Tissue packing: named properties -> flat per-voxel buffers for the kernels (DESIGN.md section 3).

A property left at its identity value is not sent (null pointer: its physics is off). A property given
as a tensor is sent as one value broadcast to every voxel (stride 0) when it holds one element, else
expanded to the voxel shape and flattened; the expansion is a torch op, so autograd sums gradients back
over broadcast axes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .. import _native as nat
from .._arrays import LastResult, broadcast_shapes
from ..sequence.tissue import IDENTITY, TissueProperties
from .program import differentiated

__all__ = ["PackedTissue", "pack_tissue", "check_tissue", "TIME_FIELDS"]

#: Relaxation times: NaN or negative is an error; 0 (clamped: no signal) and inf (no relaxation) are allowed.
TIME_FIELDS = ("t1_ms", "t2_ms", "t1_bound_ms", "t2_bound_ms", "t2_prime_ms") + tuple(
    f"t{n}_pool_{p}_ms" for p in "bcde" for n in (1, 2)
)
_FRACTIONS = ("bound_fraction", "pool_b_fraction", "pool_c_fraction", "pool_d_fraction", "pool_e_fraction")


@dataclass
class PackedTissue:
    voxel_shape: tuple
    num_voxels: int
    values: tuple  # NUM_TISSUE entries: a [V] or [1] tensor of the kernel dtype, or None (identity)
    phase_physics: bool  # B0, B1phase or v present: the complex path is needed


def _is_identity(value, identity) -> bool:
    if isinstance(value, torch.Tensor):
        if differentiated(value):
            return False  # a differentiated property is active even at its identity value
        return bool((value == identity).all()) if value.numel() else True
    return float(value) == identity


def _first_bad(mask: torch.Tensor) -> tuple[int, tuple]:
    count = int(mask.sum())
    index = tuple(int(i) for i in mask.nonzero()[0]) if count else ()
    return count, index


def check_tissue(tissue: TissueProperties) -> None:
    """Raise ValueError for NaN or negative times, and for pool fractions < 0 or summing past 1."""
    for name in TIME_FIELDS:
        value = getattr(tissue, name)
        t = torch.as_tensor(value).detach()
        bad = torch.isnan(t) | (t < 0)
        if bool(bad.any()):
            count, index = _first_bad(bad.reshape(t.shape) if t.dim() else bad.reshape(1))
            raise ValueError(
                f"{name} must be >= 0 ms and not NaN (0 gives no signal, inf no relaxation); "
                f"{count} voxel(s) are bad, the first at index {index}: {t.reshape(-1)[bad.reshape(-1)][0].item()}"
            )
    total, given = None, []
    for name in _FRACTIONS:
        f = torch.as_tensor(getattr(tissue, name), dtype=torch.float64).detach()
        if bool((f < 0).any()) or bool(torch.isnan(f).any()):
            raise ValueError(f"{name} must be a fraction >= 0, got values down to {f.min().item()}")
        total = f if total is None else total + f
        if bool((f != 0).any()):
            given.append(name)
    if bool((total > 1 + 1e-6).any()):
        flat = total.reshape(-1)
        worst = int(flat.argmax())
        raise ValueError(
            f"the semisolid and exchanging pool fractions ({' + '.join(given)}) share the voxel with free water, "
            f"so they must sum to <= 1; the worst voxel (flat index {worst}) sums to {flat[worst].item():.6g}"
        )


def pack_tissue(
    tissue: TissueProperties, *, dtype: torch.dtype = torch.float32, device=None, active=()
) -> PackedTissue:
    """Pack the free-water properties of `tissue` for the kernels (pool model 0).

    Fields named in `active` are sent even at their identity value (a Jacobian needs them). T2'
    (`t2_prime_ms`) acts on the samples, not the states: it is not packed (`engine.unrefocused`). The
    last packing is kept while its tensors are the same and unmodified (`LastResult`): its checks sync.
    """
    settings = (dtype, device, tuple(active))
    owner = tissue if isinstance(tissue, TissueProperties) else None
    kept = _LAST_PACKING.kept_for(owner, settings) if owner is not None else None
    if kept is None:
        kept, key = _LAST_PACKING.lookup(settings, tissue.items())
        if kept is None:
            kept = _pack_tissue(tissue, dtype, device, active)
        _LAST_PACKING.keep(key, kept, owner=owner)
    return kept


_LAST_PACKING = LastResult()


def _pack_tissue(tissue: TissueProperties, dtype, device, active) -> PackedTissue:
    check_tissue(tissue)
    raw = {}
    for name in nat.TISSUE_PARAMS:
        value = getattr(tissue, name)
        if name in ("t1_ms", "t2_ms") or name in active or not _is_identity(value, IDENTITY[name]):
            raw[name] = value
    shapes = [v.shape for _, v in tissue.items() if isinstance(v, torch.Tensor)]
    try:
        voxel_shape = broadcast_shapes(*shapes)
    except ValueError:
        given = ", ".join(f"{k} {tuple(v.shape)}" for k, v in tissue.items() if isinstance(v, torch.Tensor))
        raise ValueError(f"tissue properties do not broadcast against each other: {given}") from None
    num_voxels = math.prod(voxel_shape)
    values = []
    for name in nat.TISSUE_PARAMS:
        if name not in raw:
            values.append(None)
            continue
        value = raw[name]
        if isinstance(value, torch.Tensor):
            t = value.to(device=device, dtype=dtype)
        else:
            t = torch.tensor(value, dtype=dtype, device=device)
        if t.numel() == 1:
            values.append(t.reshape(1))
        else:
            values.append(t.expand(voxel_shape).reshape(-1).contiguous())
    phase = any(name in raw for name in ("b0_hz", "b1_phase_rad", "velocity_m_per_s"))
    phase = phase or any(
        not _is_identity(getattr(tissue, f"pool_{x}_shift_hz"), 0.0) for x in "bcde"
    )
    return PackedTissue(voxel_shape, num_voxels, tuple(values), phase)
