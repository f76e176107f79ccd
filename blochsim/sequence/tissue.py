"""`TissueProperties`: the engine's tissue fields.

Every field but `t1_ms` and `t2_ms` has an identity value (the default): a field
left at it switches no physics on. Values are Python numbers or tensors that
broadcast against each other into the voxel shape.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any

__all__ = ["TissueProperties", "POOL_LETTERS", "IDENTITY"]

POOL_LETTERS = ("b", "c", "d", "e")


@dataclass(frozen=True)
class TissueProperties:
    """Tissue of a batch of voxels, in engine units (ms, Hz, rad, um^2/ms, m/s)."""

    t1_ms: Any
    t2_ms: Any
    m0: Any = 1.0
    b1: Any = 1.0
    b1_phase_rad: Any = 0.0
    b0_hz: Any = 0.0
    inversion_efficiency: Any = 1.0
    t2_prime_ms: Any = math.inf
    diffusion_um2_per_ms: Any = 0.0
    velocity_m_per_s: Any = 0.0
    bound_fraction: Any = 0.0
    bound_exchange_hz: Any = 0.0
    t1_bound_ms: Any = 1000.0
    t2_bound_ms: Any = 0.012
    pool_b_fraction: Any = 0.0
    pool_b_exchange_hz: Any = 0.0
    t1_pool_b_ms: Any = 1000.0
    t2_pool_b_ms: Any = 100.0
    pool_b_shift_hz: Any = 0.0
    pool_c_fraction: Any = 0.0
    pool_c_exchange_hz: Any = 0.0
    t1_pool_c_ms: Any = 1000.0
    t2_pool_c_ms: Any = 100.0
    pool_c_shift_hz: Any = 0.0
    pool_d_fraction: Any = 0.0
    pool_d_exchange_hz: Any = 0.0
    t1_pool_d_ms: Any = 1000.0
    t2_pool_d_ms: Any = 100.0
    pool_d_shift_hz: Any = 0.0
    pool_e_fraction: Any = 0.0
    pool_e_exchange_hz: Any = 0.0
    t1_pool_e_ms: Any = 1000.0
    t2_pool_e_ms: Any = 100.0
    pool_e_shift_hz: Any = 0.0

    def items(self):
        """(field name, value) pairs in declaration order."""
        return [(name, getattr(self, name)) for name in _NAMES]


#: Field names in declaration order (`dataclasses.fields` walks the class on every call: a call of the
#: engine asks three times).
_NAMES = tuple(f.name for f in fields(TissueProperties))
#: Identity (default) value of every field that has one.
IDENTITY = {f.name: f.default for f in fields(TissueProperties) if f.name not in ("t1_ms", "t2_ms")}
