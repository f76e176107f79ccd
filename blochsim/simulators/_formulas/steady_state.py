"""Balanced and hybrid-state closed forms: bSSFP steady state, IR-TrueFISP, hybrid-state free precession."""

from __future__ import annotations

import math

import torch

from ._common import as_tensors, check_times, ms_to_s, phase_factor, rate

__all__ = ["bssfp", "hsfp", "irbssfp"]


def bssfp(flip, TR, TE=None, *, T1, T2, M0=1.0, B0=0.0, chemshift=0.0, phase_inc=180.0) -> torch.Tensor:
    """Balanced SSFP steady state read at TE, with phase cycling, complex.

    Pulse n has RF phase n * phase_inc and the sample is demodulated by its pulse's phase. In the frame of
    the current pulse, the transverse magnetization turns per TR by the angle

        psi = 2 pi (B0 - chemshift) TR + phase_inc        (rad; TR in s)

    (off-resonance in the package's phase convention, plus the frame step to the next pulse's phase), so phase
    cycling is a shift of the off-resonance profile. Solving the fixed point of "rotate by flip about x, then relax
    and precess for TR" (Freeman-Hill 1971; Hargreaves 2001) gives, right after the pulse,

        F+ = -i (1 - E1) sin a (1 - E2 e^{i psi}) / D,
        D  = (1 - E1 cos a)(1 - E2 cos psi) - E2 (E1 - cos a)(E2 - cos psi),

    E1 = e^{-TR/T1}, E2 = e^{-TR/T2}. The echo at TE adds e^{-TE/T2} and the phase e^{i 2 pi (chemshift -
    B0) TE}. The steady state uses E2 of TR and only the echo uses TE (the EPG/Bloch limit). The
    engine records F+ at TE for this train; this function returns minus that, M0 (-F+) e^{-TE/T2} ...,
    so that the value on resonance with phase_inc = 180 is +i |M|: 0.1332i at T1/T2 =
    1000/100 ms, flip 60, TR 10, TE 5. `TE` defaults to TR/2. Elementwise in every argument.
    """
    v = as_tensors(
        dict(flip=flip, TR=TR, TE=TE, T1=T1, T2=T2, M0=M0, B0=B0, chemshift=chemshift, phase_inc=phase_inc),
        complex_ok=("M0",),
    )
    check_times(TR=v["TR"], TE=v["TE"], T1=v["T1"], T2=v["T2"])
    tr = v["TR"]
    te = tr / 2 if v["TE"] is None else v["TE"]
    a = torch.deg2rad(v["flip"])
    r2 = rate(v["T2"])
    e1 = torch.exp(-tr * rate(v["T1"]))
    e2 = torch.exp(-tr * r2)
    offset_hz = v["B0"] - v["chemshift"]
    psi = 2 * math.pi * offset_hz * ms_to_s(tr) + torch.deg2rad(v["phase_inc"])
    cos_a, cos_psi = torch.cos(a), torch.cos(psi)
    denominator = (1 - e1 * cos_a) * (1 - e2 * cos_psi) - e2 * (e1 - cos_a) * (e2 - cos_psi)
    scale = (1 - e1) * torch.sin(a) / denominator
    # -F+ = i (1 - E2 e^{i psi}) scale = (E2 sin psi + i (1 - E2 cos psi)) scale
    after_pulse = torch.complex(e2 * torch.sin(psi) * scale, (1 - e2 * cos_psi) * scale)
    echo = torch.exp(-te * r2) * phase_factor(-offset_hz * ms_to_s(te))
    return v["M0"] * after_pulse * echo


def irbssfp(flip, TI, *, T1, T2, M0=1.0, B1=1.0, inv_efficiency=1.0) -> torch.Tensor:
    """Inversion-recovery TrueFISP (Schmitt et al. 2004), real.

    An inversion, then an alpha/2 preparation and a balanced train of flip a = B1 flip. The signal at time
    TI after the inversion approaches its steady state single-exponentially:

        S(TI)  = M0 [S_ss - (S_ss + eff sin(a/2)) e^{-TI/T1*}],
        1/T1*  = cos^2(a/2)/T1 + sin^2(a/2)/T2,
        S_ss   = sin a / ((T1/T2 + 1) - cos a (T1/T2 - 1))
               = sin a R1 / (R1 (1 + cos a) + R2 (1 - cos a)),

    the second form (rates R = 1/T) being the one computed, finite for T1 = inf. At TI = 0 the alpha/2
    pulse has tipped the inverted magnetization -eff M0 onto the steady-state axis, giving -eff M0
    sin(a/2) (Schmitt's INV = 1 + S0/S_ss at eff = 1). Negative until the zero crossing. Elementwise.
    """
    v = as_tensors(dict(flip=flip, TI=TI, T1=T1, T2=T2, M0=M0, B1=B1, inv_efficiency=inv_efficiency))
    check_times(TI=v["TI"], T1=v["T1"], T2=v["T2"])
    a = v["B1"] * torch.deg2rad(v["flip"])
    r1, r2 = rate(v["T1"]), rate(v["T2"])
    half = a / 2
    r1_star = torch.cos(half) ** 2 * r1 + torch.sin(half) ** 2 * r2
    cos_a = torch.cos(a)
    steady = torch.sin(a) * r1 / (r1 * (1 + cos_a) + r2 * (1 - cos_a))
    start = v["inv_efficiency"] * torch.sin(half)
    return v["M0"] * (steady - (steady + start) * torch.exp(-v["TI"] * r1_star))


def hsfp(flip, TR, *, T1, T2, M0=1.0, beta=-1.0) -> torch.Tensor:
    """Hybrid-state free precession (Assländer et al. 2019) in its periodic steady state, real.

    The magnetization stays on the axis set by the current flip a_n (the spin-locked axis) with length r,
    which obeys during TR n

        dr/dt = -(sin^2 a_n / T2 + cos^2 a_n / T1) r + cos a_n / T1,

    solved exactly with the flip constant over each TR: r_n = A_n r_{n-1} + B_n, A_n = e^{-TR_n R_n},
    B_n = (cos a_n / T1)(1 - A_n)/R_n. The flips along the last axis make one pass; a pass starts from
    `beta` times the end of the previous one (beta = -1: an ideal inversion between passes; 1: the pass
    repeats directly; 0: saturation). The pass is returned in its periodic steady state (infinitely many
    passes): with A = prod A_n and B the end value of a pass started from 0, the start is
    r_0 = beta B / (1 - beta A). Sample n is taken at the end of TR n: S_n = M0 r_n sin a_n.

    Shapes: the last axis of `flip` (and of `TR`, when it is an array per TR) is the pass; tissue and
    `beta` carry a trailing singleton axis (or are scalars). The result has the broadcast shape.
    """
    v = as_tensors(dict(flip=flip, TR=TR, T1=T1, T2=T2, M0=M0, beta=beta))
    check_times(TR=v["TR"], T1=v["T1"], T2=v["T2"])
    beta_t = v["beta"]
    if beta_t.dim() and beta_t.shape[-1] != 1:
        raise ValueError(f"beta must be a scalar or have a trailing singleton axis, got shape {tuple(beta_t.shape)}")
    a = torch.deg2rad(v["flip"])
    r1, r2 = rate(v["T1"]), rate(v["T2"])
    cos_a, sin_a = torch.cos(a), torch.sin(a)
    relaxation = sin_a**2 * r2 + cos_a**2 * r1
    step = torch.exp(-v["TR"] * relaxation)
    positive = relaxation > 0  # both rates 0 (T1 = T2 = inf): no relaxation, no drive
    drive = cos_a * r1 / torch.where(positive, relaxation, torch.ones_like(relaxation)) * (1 - step)
    step, drive = torch.broadcast_tensors(step, drive)
    if step.dim() == 0:
        raise ValueError("hsfp needs a flip array (one flip per TR, on the last axis); got a scalar flip")
    from_zero = []
    r = torch.zeros_like(step[..., 0])
    for n in range(step.shape[-1]):
        r = step[..., n] * r + drive[..., n]
        from_zero.append(r)
    from_zero = torch.stack(from_zero, -1)
    decay = torch.cumprod(step, -1)
    start = beta_t * from_zero[..., -1:] / (1 - beta_t * decay[..., -1:])
    return v["M0"] * (from_zero + decay * start) * sin_a
