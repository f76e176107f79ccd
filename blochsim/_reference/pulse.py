"""The oracle's RF events (rotation, inversion, semisolid saturation) and its sample.

A rotating pulse is the hard rotation of Weigel 2015 (eq. 15) by its effective flip about its phase, unless
it is played per voxel as a Cayley-Klein pair (`blochsim.sequence.spinor`, whose module docstring gives the
convention and the 3x3 form): a PROFILED definition in a slice-resolved playing (composed sample by sample at
the voxel's effective flip and slice position, no table), and every DYNAMIC (multi-channel) definition
(composed from the channels' fields in the voxel). A static shim (shim_id > 0) sets the voxel's transmit
field to the shim's weighted sum of the channel fields: the flip scales by its magnitude and the phase gains
its argument.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..physics.lineshape import absorption_lineshape
from ..sequence.events import RfMode, RfUse
from ..sequence.spinor import definition_spinor, spinor_rotation
from .state import _State
from .tissue import (
    COMPLEX,
    MIN_RELAXATION_MS,
    REAL,
    _f64,
    _Pools,
)


@dataclass(frozen=True)
class _Pulse:
    """One RF event as a function of the state: an inversion factor, or a rotation and saturation.

    inversion (*V) or None; rotation: 3x3 nested tuple of (*V) complex entries, acting on (F+, F-, Z);
    saturation (*V) real factor on the semisolid Z, or None.
    """

    inversion: torch.Tensor | None
    rotation: tuple | None
    saturation: torch.Tensor | None

    def apply(self, state: _State, water: int) -> _State:
        z_water, z_semisolid = state.z[..., :water, :], state.z[..., water:, :]
        if self.inversion is not None:
            z_water = z_water * (-self.inversion[..., None, None])
            return _State(state.fplus, state.fminus, torch.cat([z_water, z_semisolid], -2))
        (t00, t01, t02), (t10, t11, t12), (t20, t21, t22) = (
            tuple(entry[..., None, None] for entry in row) for row in self.rotation
        )
        fp, fm = state.fplus, state.fminus
        fplus = t00 * fp + t01 * fm + t02 * z_water
        fminus = t10 * fp + t11 * fm + t12 * z_water
        z_water = t20 * fp + t21 * fm + t22 * z_water
        if self.saturation is not None:
            z_semisolid = z_semisolid * self.saturation[..., None, None]
        return _State(fplus, fminus, torch.cat([z_water, z_semisolid], -2))


def _rotation(alpha: torch.Tensor, phi: torch.Tensor) -> tuple:
    """Weigel 2015 eq. 15, the rotation by alpha about (cos phi, sin phi, 0) on (F+, F-, Z)."""
    c2 = torch.cos(alpha / 2) ** 2
    s2 = torch.sin(alpha / 2) ** 2
    sin_a, cos_a = torch.sin(alpha), torch.cos(alpha)
    e = torch.exp(1j * phi)  # complex128
    ec = e.conj()
    return (
        (c2.to(COMPLEX), e**2 * s2, -1j * e * sin_a),
        (ec**2 * s2, c2.to(COMPLEX), 1j * ec * sin_a),
        (-0.5j * ec * sin_a, 0.5j * e * sin_a, cos_a.to(COMPLEX)),
    )


@dataclass(frozen=True)
class _Transmit:
    """How a playing transmits: the channel fields (C, *V) complex or None (B1, B1phase act as one channel),
    and the slice positions (P,) in slice thicknesses or None (the slice centre only)."""

    channels: torch.Tensor | None = None
    positions: torch.Tensor | None = None


def _shim_field(index: int, event, description, transmit: _Transmit) -> torch.Tensor:
    """The transmit field (*V) complex of RF event `index`: its shim's weights times the channel fields."""
    shim_id = int(event.rf_shim_id)
    shim = description.shim_definitions.get(shim_id)
    if shim is None:
        raise ValueError(f"events[{index}] plays shim_id={shim_id}, which shim_definitions does not hold "
                         f"(ids: {sorted(description.shim_definitions)})")
    weights = shim.weights().to(COMPLEX)
    if weights.numel() != transmit.channels.shape[0]:
        raise ValueError(f"shim {shim_id} weighs {weights.numel()} channels, B1 carries "
                         f"{transmit.channels.shape[0]}")
    return torch.tensordot(weights, transmit.channels, dims=1)


def _pulse(index: int, event, description, pools: _Pools, values: dict, lineshape: str,
           transmit: _Transmit) -> _Pulse:
    if event.rf_use == RfUse.INVERSION:
        return _Pulse(values["inversion_efficiency"], None, None)
    definition = description.rf_definitions[event.rf_definition_id]
    raster_s = description.rf_raster_time_s
    alpha, extra_phase = definition.signed_flip(event.rf_amplitude_hz, rf_raster_time_s=raster_s)
    alpha = _f64(alpha)
    phi = _f64(event.rf_phase_rad) + _f64(extra_phase) + values["b1_phase_rad"]
    mode = definition.rf_mode()
    shim_id = int(event.rf_shim_id)
    b1 = values["b1"]
    if mode == RfMode.DYNAMIC:
        if shim_id != 0:
            raise ValueError(f"events[{index}] plays a dynamic pTx definition ({definition.channel_count} "
                             f"channels) with shim_id={shim_id}: a dynamic pulse carries its own channel "
                             "weights and cannot take a static shim")
        if transmit.channels is None:
            raise ValueError(f"events[{index}] plays a dynamic pTx definition ({definition.channel_count} "
                             "channels): B1 (and B1phase) must carry a leading channel axis")
        if pools.semisolid:
            raise NotImplementedError(f"events[{index}]: the saturation of a semisolid pool by a dynamic pTx pulse "
                                      "is not modelled")
        positions = transmit.positions if transmit.positions is not None else torch.zeros((), dtype=REAL)
        field = transmit.channels * b1  # b1 is 1 under a channel axis; kept for its broadcast shape
        a, b = definition_spinor(definition, alpha, positions, channel_field=field, rf_raster_time_s=raster_s)
        return _Pulse(None, spinor_rotation(a, b * torch.exp(-1j * phi)), None)
    if transmit.channels is not None:
        if shim_id == 0:
            raise ValueError(f"events[{index}] is a pulse without a shim (shim_id=0) while B1 carries a channel "
                             "axis: give it a shim id of shim_definitions, or B1 without a channel axis")
        field = _shim_field(index, event, description, transmit)
        b1 = b1 * field.abs()
        phi = phi + torch.angle(field)
    elif shim_id != 0:
        raise ValueError(f"events[{index}] plays shim_id={shim_id}: a static shim needs each channel's field "
                         "(B1 and B1phase with a leading channel axis)")
    alpha_eff = alpha * b1
    saturation = None
    if pools.semisolid:
        s = _f64(definition.saturation(rf_raster_time_s=raster_s))
        offset_hz = _f64(event.rf_frequency_hz) - values["b0_hz"]
        t2b_ms = torch.clamp(values["t2_bound_ms"], min=MIN_RELAXATION_MS)
        g_s = absorption_lineshape(lineshape, offset_hz, t2b_ms)
        saturation = torch.exp(s * alpha_eff**2 * g_s).to(COMPLEX)
    if mode == RfMode.PROFILED and transmit.positions is not None:
        a, b = definition_spinor(definition, alpha_eff, transmit.positions, rf_raster_time_s=raster_s)
        return _Pulse(None, spinor_rotation(a, b * torch.exp(-1j * phi)), saturation)
    return _Pulse(None, _rotation(alpha_eff, phi), saturation)


def _sample(state: _State, m0: torch.Tensor, adc_phase: torch.Tensor) -> torch.Tensor:
    return m0 * state.fplus[..., :, 0].sum(-1) * torch.exp(-1j * adc_phase)


