"""Look-Locker and MOLLI: inversion recovery sampled by a train of small-flip readouts. Real.

The model (Look & Locker 1970; Deichmann & Haase 1992) is exact for the discrete train: pulses of flip
a = B1 flip every TR, the first at the inversion (t = 0), ideal spoiling, and each sample the Mz just
before its pulse times sin a. Before pulse k (t = k TR)

    Mz(t) = M_ss + (M_start - M_ss) (E1 cos a)^k = M_ss + (M_start - M_ss) e^{-t R1*},
    R1*   = R1 - ln(cos a)/TR,      M_ss = (1 - E1)/(1 - E1 cos a),   E1 = e^{-TR/T1}.

Between pulses (t not a multiple of TR) the same expression interpolates smoothly. With `short_TR` the
steady state takes its short-TR limit M_ss = R1/R1* (the continuous-readout approximation used by
most Look-Locker fits), which differs from the exact value at order TR/T1. Needs 0 <= |a| < 90 degrees
(ln cos a) and TR > 0.
"""

from __future__ import annotations

import numbers

import torch

from ._common import as_tensors, check_times, rate

__all__ = ["looklocker", "molli"]


def _train(v: dict, short_TR: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(a, R1*, M_ss) of the readout train, in rad, 1/ms and units of M0."""
    tr = v["TR"]
    if bool((tr.detach() <= 0).any()):
        raise ValueError(f"TR must be > 0 ms for a Look-Locker train (R1* = R1 - ln(cos a)/TR); got {tr.min().item()}")
    a = v["B1"] * torch.deg2rad(v["flip"])
    cos_a = torch.cos(a)
    if bool((cos_a.detach() <= 0).any()):
        raise ValueError(
            "Look-Locker needs |B1 * flip| < 90 degrees (the train's decay is ln(cos a)/TR); got up to "
            f"{float(torch.rad2deg(a.detach().abs()).max()):.6g} degrees"
        )
    r1 = rate(v["T1"])
    r1_star = r1 - torch.log(cos_a) / tr
    if short_TR:
        steady = r1 / r1_star
    else:
        e1 = torch.exp(-tr * r1)
        steady = (1 - e1) / (1 - e1 * cos_a)
    return a, r1_star, steady


def looklocker(
    flip, TR, TI, *, T1, M0=1.0, B1=1.0, inv_efficiency=1.0, short_TR=False, from_steady_state=False
) -> torch.Tensor:
    """Look-Locker inversion recovery, real: S(TI) = M0 Mz(TI) sin a (see the module docstring).

    `TI` is the time (ms) from the inversion to the sampled pulse; the train runs from the inversion on,
    so the samples are exact where TI is a multiple of TR. The inversion acts on M0 (`from_steady_state`
    False: the train starts from equilibrium, M_start = -eff), or on the train's own steady state
    (`from_steady_state` True: a Look-Locker repeated without recovery, M_start = -eff M_ss).
    Elementwise in every argument.
    """
    v = as_tensors(dict(flip=flip, TR=TR, TI=TI, T1=T1, M0=M0, B1=B1, inv_efficiency=inv_efficiency))
    check_times(TR=v["TR"], TI=v["TI"], T1=v["T1"])
    a, r1_star, steady = _train(v, short_TR)
    before = steady if from_steady_state else torch.ones_like(steady)
    start = -v["inv_efficiency"] * before
    return v["M0"] * (steady + (start - steady) * torch.exp(-v["TI"] * r1_star)) * torch.sin(a)


def molli(flip, TR, readouts, recovery, *, T1, M0=1.0, B1=1.0, inv_efficiency=1.0, short_TR=False) -> torch.Tensor:
    """MOLLI: Look-Locker blocks separated by free recovery, concatenated, real.

    `readouts` (positive ints, e.g. (5, 3) for a 5(3)3 scheme) gives the number of samples per block. The
    experiment starts from equilibrium. Block b begins with an inversion of the Mz it finds
    (M_start = -eff Mz); its readouts are pulses at t = 0, TR, ..., (n_b - 1) TR after that inversion,
    each sampled as in `looklocker` (so block b's samples are `looklocker` at TI = k TR from M_start).
    TR is the readout spacing (the RR interval of a cardiac MOLLI, with `flip` the effective flip of one
    single-shot readout). A block ends one TR after its last pulse; then Mz recovers freely (T1 only)
    for `recovery` ms before the next inversion.

    Shapes: every argument is a scalar or has a trailing singleton axis (tissue as usual, `flip`, `TR`
    and `recovery` one value per train); the result has `sum(readouts)` samples on the last axis.
    """
    counts = _block_sizes(readouts)
    v = as_tensors(dict(flip=flip, TR=TR, recovery=recovery, T1=T1, M0=M0, B1=B1, inv_efficiency=inv_efficiency))
    for name, t in v.items():
        if t.dim() and t.shape[-1] != 1:
            raise ValueError(
                f"molli builds the sample axis from `readouts`: {name} must be a scalar or have a trailing "
                f"singleton axis, got shape {tuple(t.shape)}"
            )
    check_times(TR=v["TR"], recovery=v["recovery"], T1=v["T1"])
    a, r1_star, steady = _train(v, short_TR)
    tr, r1, eff = v["TR"], rate(v["T1"]), v["inv_efficiency"]
    mz = torch.ones_like(steady)  # Mz before the first inversion (equilibrium), units of M0
    blocks = []
    for b, n in enumerate(counts):
        if b:
            mz = 1 - (1 - mz) * torch.exp(-v["recovery"] * r1)
        start = -eff * mz
        k = torch.arange(n, dtype=tr.dtype, device=tr.device)
        blocks.append(steady + (start - steady) * torch.exp(-(tr * k) * r1_star))
        mz = steady + (start - steady) * torch.exp(-(tr * n) * r1_star)  # one TR after the last pulse
    # The blocks share the leading shape once `recovery` has entered (block 1 on): align block 0 to it.
    lead = blocks[-1].shape[:-1]
    return v["M0"] * torch.sin(a) * torch.cat([b.expand(*lead, b.shape[-1]) for b in blocks], -1)


def _block_sizes(readouts) -> tuple[int, ...]:
    values = (readouts,) if isinstance(readouts, numbers.Integral) else tuple(readouts)
    if not values or any(isinstance(n, bool) or int(n) != n or int(n) < 1 for n in values):
        raise ValueError(f"readouts must be positive integers, one per Look-Locker block; got {readouts!r}")
    return tuple(int(n) for n in values)
