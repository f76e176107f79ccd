"""The oracle's RF events (rotation, inversion, semisolid saturation) and its sample."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..physics.lineshape import absorption_lineshape
from ..sequence.events import RfUse
from .state import _State
from .tissue import (
    COMPLEX,
    MIN_RELAXATION_MS,
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


def _pulse(event, description, pools: _Pools, values: dict, lineshape: str) -> _Pulse:
    if int(event.rf_shim_id) != 0:
        raise NotImplementedError("the reference engine does not model static shims (shim_id must be 0)")
    if event.rf_use == RfUse.INVERSION:
        return _Pulse(values["inversion_efficiency"], None, None)
    definition = description.rf_definitions[event.rf_definition_id]
    raster_s = description.rf_raster_time_s
    alpha, extra_phase = definition.signed_flip(event.rf_amplitude_hz, rf_raster_time_s=raster_s)
    alpha_eff = _f64(alpha) * values["b1"]
    phi = _f64(event.rf_phase_rad) + _f64(extra_phase) + values["b1_phase_rad"]
    saturation = None
    if pools.semisolid:
        s = _f64(definition.saturation(rf_raster_time_s=raster_s))
        offset_hz = _f64(event.rf_frequency_hz) - values["b0_hz"]
        t2b_ms = torch.clamp(values["t2_bound_ms"], min=MIN_RELAXATION_MS)
        g_s = absorption_lineshape(lineshape, offset_hz, t2b_ms)
        saturation = torch.exp(s * alpha_eff**2 * g_s).to(COMPLEX)
    return _Pulse(None, _rotation(alpha_eff, phi), saturation)


def _sample(state: _State, m0: torch.Tensor, adc_phase: torch.Tensor) -> torch.Tensor:
    return m0 * state.fplus[..., :, 0].sum(-1) * torch.exp(-1j * adc_phase)


