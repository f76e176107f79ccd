"""Pulses played per voxel: static shims, slice profiles and dynamic pTx.

Beside the pool tables the kernels read three tables of pulses (csrc/include/blochsim/pulses.hpp), each event
naming its row of them (-1: none):

* **field** `[V|1, F, 2]`, (magnitude, phase rad): the transmit field of a static shim (an RF event's
  `shim_id` > 0), `sum_c w_c B1_c e^{i B1phase_c}` over the channels. It replaces B1 and B1phase for the
  event: the flip scales by the magnitude and the phase gains the phase. Built here with torch from the
  channel maps (`PackedTissue.transmit`) and the shims' weights, so autograd carries the kernels' cotangent
  of the table to both (shim design by gradient descent).
* **profile** `[1, P, Dp, bins, 8]`: a PROFILED definition's Cayley-Klein pair at phase 0 per slice position,
  with its derivative along the effective flip, at `bins` knots over `[0, theta_max]`
  (`ExactSliceProfile`), read by cubic Hermite interpolation at `flip * B1`. Constants of the definitions:
  made once per definition and profile, in float64, from `sequence.spinor.definition_spinor` (the
  derivatives by autograd).
* **spinor** `[V|1, Rs, 4]`: a DYNAMIC (multi-channel) definition's pair in each voxel, composed from the
  voxel's channel fields at the event's flip (`definition_spinor`); differentiable through the maps and the
  flip by autograd.

**Slice positions as voxels.** A slice-resolved call (`across_slice`) of V voxels runs as V * P kernel
voxels, tissue-major with the positions innermost: every tissue buffer is repeated per position
(`across_positions`), the kernel plays voxel u at position u % P (plus the chunk's offset, which the kernel
layer passes), and the samples are averaged over the positions. One launch, no loop over positions.

Every per-voxel pulse needs the complex path (the profiles' and shims' phases vary per voxel).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import torch

from .. import _native as nat
from ..sequence.columns import COLUMNS_KEY
from ..sequence.events import EventType, RfMode
from ..sequence.spinor import ExactSliceProfile, definition_spinor, profile_knots
from .tissue import PackedTissue

__all__ = ["PulsePlan", "transmit_channels", "plan_pulses", "pulse_tables", "across_positions", "average_positions"]


def transmit_channels(shim_definitions, rf_definitions) -> int | None:
    """The channels B1 and B1phase carry (a leading axis) for a description with these definitions: those of
    its shims (ids > 0) and multi-channel (dynamic pTx) definitions; None when it has neither. ValueError when
    they disagree."""
    counts = {}
    for shim_id, shim in (shim_definitions or {}).items():
        if int(shim_id) != 0:
            counts.setdefault(shim.channel_count, f"shim {shim_id}")
    for definition_id, definition in (rf_definitions or {}).items():
        if getattr(definition, "channel_count", 1) > 1:
            counts.setdefault(definition.channel_count, f"RF definition {definition_id}")
    if len(counts) > 1:
        raise ValueError("the shims and dynamic pTx definitions drive different channel counts: "
                         + ", ".join(f"{count} ({owner})" for count, owner in counts.items()))
    return next(iter(counts), None)


@dataclass(frozen=True, eq=False)
class PulsePlan:
    """A program's per-voxel pulses: per played event its rows (int32 `[E]`, -1: none; None: no event has
    one), and what each row plays."""

    field_row: np.ndarray | None
    profile_row: np.ndarray | None
    spinor_row: np.ndarray | None
    shims: tuple  # the ShimDefinition of each field row
    profiles: tuple  # the RfDefinition of each profile row
    dynamic: tuple  # (RfDefinition, played event index) of each spinor row
    profile: ExactSliceProfile | None  # the slice positions, or None (the centre only)
    raster_s: float

    @property
    def positions(self) -> int:
        return 1 if self.profile is None else int(self.profile.positions().numel())


def _shim_ids(description, count: int) -> np.ndarray:
    """The shim id of each of the `count` events (0 but for RF events that name one); a builder's description
    plays shim 0 (and its events, made on first use, are not made here)."""
    if getattr(description, COLUMNS_KEY, None) is not None:
        return np.zeros(count, dtype=np.int64)
    return np.fromiter((e.params[5] if e.type is EventType.RF else 0 for e in description.events), dtype=np.int64,
                       count=len(description.events))


def plan_pulses(description, kept: np.ndarray, action: np.ndarray, definition_ids: np.ndarray,
                slice_profile: ExactSliceProfile | None) -> PulsePlan | None:
    """The per-voxel pulses of the played events (`kept` of the description's events; their `action` bits and
    definition ids), or None when every pulse is a hard rotation of flip and phase.

    Raises ValueError for a shim id the description does not define, a pulse without a shim beside shims or
    dynamic definitions (B1 then carries channels, and an unshimmed pulse has no field), and a dynamic
    definition played with a shim."""
    definitions = description.rf_definitions
    channels = transmit_channels(description.shim_definitions, definitions)
    if channels is None and slice_profile is None:
        shims = _shim_ids(description, len(kept))
        bad = np.flatnonzero(shims != 0)
        if bad.size:
            i = int(bad[0])
            raise ValueError(f"events[{i}] plays shim_id={int(shims[i])}, which shim_definitions does not hold "
                             f"(ids: {sorted(description.shim_definitions)})")
        return None
    played = np.flatnonzero(kept)
    rotating = (action & nat.ROTATE) != 0
    shims = _shim_ids(description, len(kept))[played] if played.size else np.zeros(0, dtype=np.int64)
    E = len(action)
    field_row = np.full(E, -1, dtype=np.int32)
    profile_row = np.full(E, -1, dtype=np.int32)
    spinor_row = np.full(E, -1, dtype=np.int32)
    field_ids, profile_ids, dynamic = [], [], []
    for j in np.flatnonzero(rotating[:played.size]).tolist():
        index, shim_id = int(played[j]), int(shims[j])
        definition = definitions[int(definition_ids[j])]
        mode = definition.rf_mode()
        if mode == RfMode.DYNAMIC:
            if shim_id != 0:
                raise ValueError(f"events[{index}] plays a dynamic pTx definition ({definition.channel_count} "
                                 f"channels) with shim_id={shim_id}: a dynamic pulse carries its own channel "
                                 "weights and cannot take a static shim")
            spinor_row[j] = len(dynamic)
            dynamic.append((definition, j))
            continue
        if shim_id != 0:
            if shim_id not in description.shim_definitions:
                raise ValueError(f"events[{index}] plays shim_id={shim_id}, which shim_definitions does not hold "
                                 f"(ids: {sorted(description.shim_definitions)})")
            if shim_id not in field_ids:
                field_ids.append(shim_id)
            field_row[j] = field_ids.index(shim_id)
        elif channels is not None:
            raise ValueError(f"events[{index}] is a pulse without a shim (shim_id=0) while B1 carries a channel axis "
                             "(the description defines shims or dynamic pTx pulses): give it a shim id of "
                             "shim_definitions")
        if slice_profile is not None and mode == RfMode.PROFILED:
            if definition.id not in profile_ids:
                profile_ids.append(definition.id)
            profile_row[j] = profile_ids.index(definition.id)
    if not (field_ids or profile_ids or dynamic):
        return None  # every pulse a hard rotation: a slice-resolved call is its centre, no positions to play
    positioned = slice_profile if profile_ids or dynamic else None  # a shim's rotation is the same everywhere
    return PulsePlan(
        field_row if field_ids else None, profile_row if profile_ids else None, spinor_row if dynamic else None,
        tuple(description.shim_definitions[s] for s in field_ids), tuple(definitions[d] for d in profile_ids),
        tuple(dynamic), positioned, float(description.rf_raster_time_s))


# ---- the tables ---------------------------------------------------------------------------------------------
_PROFILES: dict = {}  # (id(definition), profile key, raster) -> (definition, table): the definition kept alive


def _profile_knots(definition, profile: ExactSliceProfile, raster_s: float) -> torch.Tensor:
    """[P, bins, 8] float64: (a, b, da/dtheta, db/dtheta) as (re, im) pairs at each knot and position."""
    key = (id(definition), profile.key(), raster_s)
    hit = _PROFILES.get(key)
    if hit is not None and hit[0] is definition:
        return hit[1]
    theta = torch.linspace(0.0, profile.theta_max, profile.bins, dtype=torch.float64)
    a, b, da, db = profile_knots(definition, theta, profile.positions(), rf_raster_time_s=raster_s)
    table = torch.stack([a.real, a.imag, b.real, b.imag, da.real, da.imag, db.real, db.imag], -1)
    if len(_PROFILES) > 64:  # a few definitions per session: bounded, not grown without end
        _PROFILES.clear()
    _PROFILES[key] = (definition, table)
    return table


def _field_table(plan: PulsePlan, transmit: torch.Tensor) -> torch.Tensor:
    """[V|1, F, 2] (magnitude, phase) of each shim's field, from the channel fields (C, V|1), complex."""
    weights = torch.stack([shim.weights().to(device=transmit.device, dtype=transmit.dtype) for shim in plan.shims])
    field = weights @ transmit  # (F, V)
    magnitude = field.abs()
    # angle() has no derivative at 0: a voxel without field turns by nothing, whatever its phase.
    phase = torch.angle(torch.where(magnitude > 0, field, torch.ones_like(field)))
    return torch.stack([magnitude, phase], -1).transpose(0, 1)


def _spinor_table(plan: PulsePlan, flip_rad: torch.Tensor, transmit: torch.Tensor, positions: torch.Tensor):
    """[V|1, Rs, 4] of each dynamic row's pair (a, b) at phase 0 in each voxel."""
    rows = []
    for definition, e in plan.dynamic:
        a, b = definition_spinor(definition, flip_rad[e].to(torch.float64), positions, channel_field=transmit,
                                 rf_raster_time_s=plan.raster_s)
        rows.append(torch.stack([a.real, a.imag, b.real, b.imag], -1))
    return torch.stack(rows, -2)


def _check_theta(plan: PulsePlan, flip_rad: torch.Tensor, b1: torch.Tensor | None, field: torch.Tensor | None):
    """ValueError at the first profiled event whose effective flip |flip * B1| passes the profile's theta_max."""
    events = np.flatnonzero(plan.profile_row >= 0)
    flips = flip_rad.detach().abs().index_select(0, torch.from_numpy(events).to(flip_rad.device))
    scale = torch.ones_like(flips)
    if b1 is not None:
        # The flips may be host copies while the maps live on a card: the reductions come to the flips.
        scale = scale * b1.detach().abs().max().to(flips.device)
    if field is not None and plan.field_row is not None:
        rows = torch.from_numpy(plan.field_row[events]).long().to(flips.device)
        peak = field.detach()[..., 0].abs().amax(0).to(flips.device)  # per row, over voxels
        scale = torch.where(rows >= 0, peak.to(flips.dtype)[rows.clamp(min=0)], scale)
    theta = (flips * scale).tolist()
    limit = plan.profile.theta_max
    for e, value in zip(events.tolist(), theta, strict=True):
        if value > limit * (1 + 1e-12):
            raise ValueError(f"a profiled pulse (program event {e}) plays an effective flip |flip * B1| of {value} "
                             f"rad, above the slice profile's theta_max = {limit} rad: give "
                             f"ExactSliceProfile(theta_max=...) at least that")


def pulse_tables(plan: PulsePlan, flip_rad: torch.Tensor, packed: PackedTissue) -> tuple:
    """(field, spinor, profile) tables for the kernels, in the packing's dtype and device (None where the plan
    has no such rows), and the `kernels.Static` settings they need. `flip_rad` [E] are the event flips the
    kernels play (float64, differentiable), `packed` the tissue as the kernels see it (slice-resolved:
    `across_positions`)."""
    dtype, device = packed.dtype, packed.device
    transmit = packed.transmit  # on the packing's device: the tables are made there (per voxel: V of them)
    field = spinor = profile = None
    if plan.field_row is not None:
        field = _field_table(plan, transmit)
    if plan.spinor_row is not None:
        P = plan.positions
        positions = torch.zeros((), dtype=torch.float64) if plan.profile is None else \
            plan.profile.positions().repeat(packed.num_voxels // P)
        spinor = _spinor_table(plan, flip_rad.to(transmit.device), transmit, positions.to(transmit.device))
    if plan.profile_row is not None:
        b1 = packed.values[nat.TISSUE_PARAMS.index("b1")]
        _check_theta(plan, flip_rad, b1, field)
        profile = torch.stack([_profile_knots(d, plan.profile, plan.raster_s) for d in plan.profiles], 1)[None]
    tables = tuple(None if t is None else t.to(device=device, dtype=dtype).contiguous()
                   for t in (field, spinor, profile))
    settings = dict(
        num_field_rows=len(plan.shims), num_spinor_rows=len(plan.dynamic), num_profile_rows=len(plan.profiles),
        num_positions=plan.positions, profile_bins=0 if plan.profile is None else plan.profile.bins,
        profile_theta_max=0.0 if plan.profile is None else plan.profile.theta_max)
    return tables, settings


# ---- slice positions as voxels ------------------------------------------------------------------------------
def across_positions(packed: PackedTissue, tissue: dict, count: int) -> tuple[PackedTissue, dict]:
    """The packing and the tissue mapping with every voxel repeated `count` times (positions innermost): the
    kernels' V * P voxels, whose voxel shape gains a trailing axis of `count`. Buffers shared by every voxel
    stay shared; autograd sums each voxel's gradients over its positions."""
    values = tuple(x if x is None or x.numel() == 1 else x.repeat_interleave(count) for x in packed.values)
    transmit = packed.transmit
    if transmit is not None and transmit.shape[1] > 1:
        transmit = transmit.repeat_interleave(count, dim=1)
    expanded = dataclasses.replace(packed, voxel_shape=tuple(packed.voxel_shape) + (count,),
                                   num_voxels=packed.num_voxels * count, values=values, transmit=transmit)
    fields = {name: value.unsqueeze(-1) if isinstance(value, torch.Tensor) and value.dim() else value
              for name, value in tissue.items()}
    return expanded, fields


def average_positions(result: torch.Tensor | None, axis: int) -> torch.Tensor | None:
    """The mean over the positions axis `axis` (from the end) of a slice-resolved result."""
    return None if result is None else result.mean(axis)
