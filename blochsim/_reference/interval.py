"""The oracle's intervals: relaxation, exchange, off-resonance, and the gradient lobes' diffusion, flow and washout
over each span (the rules are in `epg`'s module docstring)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..sequence.events import USER_ACTIONS, EventAction, EventType
from .state import _add_to_order0, _State
from .tissue import (
    COMPLEX,
    REAL,
    _exchange_matrix,
    _Pools,
)


@dataclass(frozen=True)
class _Interval:
    """The evolution over one interval Δt, precomputed once per event position.

    z_propagator (*V, P, P) and z0_recovery (*V, P): Z(k) -> z_propagator·Z(k), plus z0_recovery on
    Z(0). f_propagator (*V, Pw, Pw): F+(k) -> f_propagator·F+(k), F-(k) -> conj(f_propagator)·F-(k).
    The *_factor tensors (*V, 1, K) (or None) multiply the states afterwards (diffusion, flow and
    washout folded together, in that order; they commute, all being per-state factors), and
    washout_recovery (*V, P) (or None) is then added to Z(0).
    """

    z_propagator: torch.Tensor
    z0_recovery: torch.Tensor
    f_propagator: torch.Tensor
    fplus_factor: torch.Tensor | None
    fminus_factor: torch.Tensor | None
    z_factor: torch.Tensor | None
    washout_recovery: torch.Tensor | None

    def apply(self, state: _State) -> _State:
        z = self.z_propagator.to(COMPLEX) @ state.z
        z = _add_to_order0(z, self.z0_recovery)
        fplus = self.f_propagator @ state.fplus
        fminus = self.f_propagator.conj() @ state.fminus
        if self.fplus_factor is not None:
            fplus = fplus * self.fplus_factor
            fminus = fminus * self.fminus_factor
            z = z * self.z_factor
        if self.washout_recovery is not None:
            z = _add_to_order0(z, self.washout_recovery)
        return _State(fplus, fminus, z)



def _expm(x: torch.Tensor) -> torch.Tensor:
    """exp of a batch of square matrices (..., n, n): scaling and squaring of a degree-18 Taylor sum.

    Why not torch.linalg.matrix_exp: it picks its polynomial degree from a backward-error bound
    relative to ||x||, which for short intervals (||x|| ~ 1e-2 and below) leaves up to ~3e-14 error
    in exp(x) and up to ~5e-9 relative error in the small recovery entries (1 - E1): too coarse for
    an oracle that double-precision kernels are held to at 1e-12. Scaling until ||x/2^s||_1 <= 1/4
    and summing 18 terms leaves a truncation error of 0.25^19/19! ~ 5e-29, so only rounding remains
    (Moler & Van Loan 2003, "Nineteen dubious ways...", method 3). s is one integer for the whole
    batch (from the largest column sum), read from detached values: autograd differentiates the
    polynomial and the squarings.
    """
    norm = float(x.detach().abs().sum(-2).amax()) if x.numel() else 0.0
    if not math.isfinite(norm):
        raise ValueError("an interval generator holds a non-finite rate (check B0, shifts and exchange rates)")
    squarings = max(0, math.ceil(math.log2(norm / 0.25))) if norm > 0.25 else 0
    x = x / 2**squarings
    term = torch.eye(x.shape[-1], dtype=x.dtype).expand_as(x)
    total = term
    for j in range(1, 19):
        term = term @ x / j
        total = total + term
    for _ in range(squarings):
        total = total @ total
    return total


@dataclass(frozen=True)
class _Span:
    """Where an interval lies in its span (Gradient lobes in the module docstring).

    behind: the shifts of the bound that opens the span (none for the one from t = 0); lobes: those and
    the CRUSH_BEFORE of the bound that closes it. elapsed_s, length_s: float64 tensors, the span's
    time before the interval and its whole length; None when the interval is the whole span. from_start:
    the span opens at t = 0 (first repetition only; on later ones it opens in the repetition before).
    """

    behind: int
    lobes: int
    elapsed_s: torch.Tensor | None = None
    length_s: torch.Tensor | None = None
    from_start: bool = False


def _plain(event) -> bool:
    """A WAIT without an action: it only marks time."""
    return event.type == EventType.WAIT and not int(event.action) & int(USER_ACTIONS)


def _shifts_after(event) -> int:
    bits = int(event.action)
    return bool(bits & EventAction.CRUSH_AFTER) + bool(
        bits & EventAction.SHIFT_AFTER and not bits & EventAction.SPOIL_AFTER)


def _spans(events, dts: list, later_dts: list, *, first: bool) -> list[_Span]:
    """The _Span of each event's interval on the first repetition (`first`) or on a later one. `dts`: the
    intervals of that repetition; `later_dts`: those of a later one, for the parts of a span that lie in the
    repetition after it (or, on a later repetition, in the one before)."""
    n = len(events)
    plain = [_plain(e) for e in events]
    if all(plain):  # nothing shifts: no lobes, and every interval washes out alone
        return [_Span(0, 0)] * n

    def dt_at(u: int) -> torch.Tensor:  # the interval before event u, counted from this repetition's first
        return dts[u] if 0 <= u < n else later_dts[u % n]

    spans = []
    for i in range(n):
        opens = i - 1  # the bound before event i's interval; -1 on the first repetition: t = 0
        while (opens >= 0 or not first) and plain[opens % n]:
            opens -= 1
        closes = i
        while plain[closes % n]:
            closes += 1
        from_start = first and opens < 0
        behind = 0 if from_start else _shifts_after(events[opens % n])
        lobes = behind + bool(int(events[closes % n].action) & EventAction.CRUSH_BEFORE)
        if opens == i - 1 and closes == i:
            spans.append(_Span(behind, lobes, from_start=from_start))
            continue
        pieces = [dt_at(u) for u in range(opens + 1, closes + 1)]
        zero = torch.zeros((), dtype=REAL)
        spans.append(_Span(behind, lobes, sum(pieces[: i - opens - 1], zero), sum(pieces, zero), from_start))
    return spans


def _interval(dt_s: torch.Tensor, span: _Span, pools: _Pools, values: dict, geometry: dict,
              states: int) -> _Interval:
    count, water = pools.count, pools.water
    exchange = _exchange_matrix(pools.fraction, pools.exchange_hz)

    # Longitudinal, augmented with the constant recovery term on order 0:
    #   d/dt [Z0; 1] = [[A, R1·Zeq], [0, 0]] · [Z0; 1].
    a = exchange - torch.diag_embed(pools.r1_per_s)
    recovery = pools.r1_per_s * pools.fraction
    augmented = torch.cat(
        [torch.cat([a, recovery[..., None]], -1), torch.zeros((*pools.voxel_shape, 1, count + 1), dtype=REAL)], -2
    )
    propagator = _expm(augmented * dt_s)
    z_propagator = propagator[..., :count, :count]
    z0_recovery = propagator[..., :count, count]

    # Transverse, water-like pools only.
    omega = 2.0 * math.pi * (values["b0_hz"][..., None] + pools.shift_hz)  # rad/s, (*V, Pw)
    # Exchange among the water-like pools only: free water loses no transverse magnetization to the
    # semisolid pool (EPG-X, Malik 2018), so X_w is built from them alone, not sliced from X.
    exchange_w = _exchange_matrix(pools.fraction[..., :water], pools.exchange_hz[..., :water])
    c = exchange_w.to(COMPLEX) - torch.diag_embed(pools.r2_per_s + 1j * omega)
    f_propagator = _expm(c * dt_s)

    fplus_factor = fminus_factor = z_factor = washout_recovery = None
    order = torch.arange(states, dtype=REAL)
    whole = span.length_s is None or float(span.length_s.detach()) == 0.0
    if geometry["crusher"]:
        dk = geometry["dk_rad_per_m"]
        b = (values["diffusion_um2_per_ms"] * 1e-9 * dk**2 * dt_s)[..., None, None]
        phase = (dk * values["velocity_m_per_s"] * dt_s)[..., None, None]  # rad per unit order
        # The dephasing over the interval, from stored order n: n + start to n + start + winding.
        if whole:
            start, winding = float(-span.behind), float(span.lobes)
        else:
            start = span.lobes * span.elapsed_s / span.length_s - span.behind
            winding = span.lobes * dt_s / span.length_s

        def weighed(n):  # Weigel's diffusion weight and the mean order of signed order n
            m = n + start
            return m**2 + m * winding + winding**2 / 3.0, m + winding / 2.0

        # F+(k) has signed order n = k; F-(k) = conj(F_{-k}) takes the conjugate of order -k's factor.
        c_plus, f_plus = weighed(order)
        c_minus, f_minus = weighed(-order)
        fplus_factor = torch.exp(-c_plus * b) * torch.exp(-1j * f_plus * phase)
        fminus_factor = torch.exp(-c_minus * b) * torch.exp(1j * f_minus * phase)
        z_factor = torch.exp(-(order**2) * b) * torch.exp(-1j * order * phase)
    if geometry["washout"]:
        speed = torch.abs(values["velocity_m_per_s"]) / geometry["voxel_size_m"]  # voxels per s
        if whole:
            w = 1.0 - torch.clamp(speed * dt_s, max=1.0)
        else:  # the span's washout, W(s + Δt) / W(s)
            left = 1.0 - torch.clamp(speed * span.elapsed_s, max=1.0)
            after = 1.0 - torch.clamp(speed * (span.elapsed_s + dt_s), max=1.0)
            w = torch.where(left > 0, after / torch.where(left > 0, left, 1.0), 0.0)
        w3 = w[..., None, None].to(COMPLEX)
        fplus_factor = w3 if fplus_factor is None else fplus_factor * w3
        fminus_factor = w3 if fminus_factor is None else fminus_factor * w3
        z_factor = w3 if z_factor is None else z_factor * w3
        washout_recovery = (1.0 - w)[..., None] * pools.fraction
    if fplus_factor is not None:
        shape = (*pools.voxel_shape, 1, states)
        fplus_factor, fminus_factor, z_factor = (
            torch.broadcast_to(x, shape) for x in (fplus_factor, fminus_factor, z_factor)
        )
    return _Interval(z_propagator, z0_recovery, f_propagator, fplus_factor, fminus_factor, z_factor, washout_recovery)


