"""MP2RAGE: the closed-form steady state of repeated inversion blocks with two GRE readouts (Marques 2010)."""

from __future__ import annotations

import numbers

import torch

from ._common import as_tensors, check_ordered, check_times, rate

__all__ = ["mp2rage", "split_shots"]


def split_shots(nshots) -> tuple[int, int]:
    """(before, after) from a total (split evenly, the odd shot after: 176 -> (88, 88), 5 -> (2, 3)) or a
    pair. The sampled shot is the first of `after`, so `after` >= 1."""
    values = (nshots,) if isinstance(nshots, numbers.Integral) else tuple(nshots)
    ok = len(values) in (1, 2) and all(not isinstance(n, bool) and int(n) == n for n in values)
    if ok and len(values) == 1:
        values = (int(values[0]) // 2, int(values[0]) - int(values[0]) // 2)
    if not ok or int(values[0]) < 0 or int(values[1]) < 1:
        raise ValueError(
            f"nshots must be a total >= 1 or a pair (before, after) of integers with before >= 0 and after >= 1 "
            f"(the sampled shot is the first of `after`); got {nshots!r}"
        )
    return int(values[0]), int(values[1])


def _block(values: torch.Tensor, index: int) -> torch.Tensor:
    """Entry `index` of the length-2 last axis (a length-1 axis is shared by both blocks)."""
    return values[..., index if values.shape[-1] == 2 else 0]


def _gre_train(q: torch.Tensor, e1: torch.Tensor, shots: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The affine map Mz -> slope Mz + intercept of `shots` pulses, each followed by TR of recovery:
    slope q^n, intercept (1 - E1)(1 + q + ... + q^{n-1}), q = E1 cos a."""
    slope = q**shots
    return slope, (1 - e1) * (1 - slope) / (1 - q)


def _free(duration: torch.Tensor, r1: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Free recovery for `duration` ms: Mz -> E Mz + (1 - E)."""
    e = torch.exp(-duration * r1)
    return e, 1 - e


def _then(first: tuple, second: tuple) -> tuple:
    """The affine map `second` after `first`."""
    return second[0] * first[0], second[0] * first[1] + second[1]


def mp2rage(TI, flip, TRspgr, TRmp2rage, nshots, *, T1, M0=1.0, inv_efficiency=1.0, B1=1.0) -> torch.Tensor:
    """The two MP2RAGE gradient-echo samples (GRE1, GRE2) in their steady state, real (not the uniform image).

    Every TRmp2rage: an inversion at t = 0 (Mz -> -eff Mz), then two GRE blocks of n = before + after
    shots each, spaced TRspgr, with flips a_k = B1 flip_k, ideally spoiled so that only Mz carries from
    shot to shot. Block k's sampled shot (the first of `after`, the k-space centre) is at TI_k, so its
    first pulse is at TI_k - before TRspgr and it ends (one TRspgr after its last pulse) at
    TI_k + after TRspgr. Between the blocks Mz recovers freely:

        TA = TI_1 - before TRspgr,   TB = TI_2 - TI_1 - n TRspgr,   TC = TRmp2rage - TI_2 - after TRspgr,

    each required >= 0 (ValueError otherwise: a TI before its block's first excitation, overlapping
    blocks, or block 2 not ending within TRmp2rage). Every stage is an affine map of Mz (units of M0):
    a block of m shots is Mz -> q^m Mz + (1 - E1)(1 - q^m)/(1 - q), q = E1 cos a_k, E1 = e^{-TRspgr/T1};
    free recovery for T is Mz -> e^{-T/T1} Mz + 1 - e^{-T/T1}. Composing them over one TRmp2rage gives
    Mz -> A Mz + B, whose fixed point B/(1 - A) is the Mz before the inversion in the steady state
    (Marques et al. 2010, appendix, with n/2 generalised to before/after). The samples are
    GRE_k = M0 sin a_k Mz_k, Mz_k the value just before block k's sampled pulse, negative while Mz is
    inverted. No T2* decay (a common factor of both samples).

    Shapes: the last axis of `TI` (length 2) is the sample axis; `flip` is a scalar or has 1 or 2 entries
    there; `TRspgr`, `TRmp2rage` and tissue are scalars or have a trailing singleton axis. The result has
    the broadcast shape with the last axis of length 2.
    """
    before, after = split_shots(nshots)
    shots = before + after
    v = as_tensors(
        dict(TI=TI, flip=flip, TRspgr=TRspgr, TRmp2rage=TRmp2rage, T1=T1, M0=M0, inv_efficiency=inv_efficiency, B1=B1)
    )
    if v["TI"].dim() == 0 or v["TI"].shape[-1] != 2:
        raise ValueError(f"TI must hold two inversion times on its last axis, got shape {tuple(v['TI'].shape)}")
    for name in ("flip", "TRspgr", "TRmp2rage", "T1", "M0", "inv_efficiency", "B1"):
        t = v[name]
        allowed = (1, 2) if name == "flip" else (1,)
        if t.dim() and t.shape[-1] not in allowed:
            raise ValueError(
                f"mp2rage: {name} must be a scalar or have a last axis of length {' or '.join(map(str, allowed))} "
                f"(the last axis holds the two blocks), got shape {tuple(t.shape)}"
            )
    check_times(TI=v["TI"], TRspgr=v["TRspgr"], TRmp2rage=v["TRmp2rage"], T1=v["T1"])
    v = {name: t.reshape(1) if t.dim() == 0 else t for name, t in v.items()}  # every value has a block axis

    ti1, ti2 = _block(v["TI"], 0), _block(v["TI"], 1)
    tr = _block(v["TRspgr"], 0)
    gap_a = ti1 - before * tr
    gap_b = ti2 - ti1 - shots * tr
    gap_c = _block(v["TRmp2rage"], 0) - ti2 - after * tr
    check_ordered(
        "TI",
        gap_a,
        f"TI[0] must leave room for the {before} shot(s) before the sampled one (TI[0] >= "
        "before * TRspgr): block 1 cannot start before its inversion",
    )
    check_ordered(
        "TI",
        gap_b,
        f"TI[1] - TI[0] must be >= nshots * TRspgr = {shots} * TRspgr: block 2 would start before block 1 ends",
    )
    check_ordered("TRmp2rage", gap_c, "block 2 must end within TRmp2rage (TRmp2rage >= TI[1] + after * TRspgr)")

    r1 = _block(rate(v["T1"]), 0)
    e1 = torch.exp(-tr * r1)
    angle = [_block(v["B1"], 0) * torch.deg2rad(_block(v["flip"], k)) for k in (0, 1)]
    q = [e1 * torch.cos(a) for a in angle]
    eff = _block(v["inv_efficiency"], 0)

    inversion = (-eff, torch.zeros_like(eff))
    to_block1 = _then(inversion, _free(gap_a, r1))  # Mz before the inversion -> before block 1's first pulse
    to_block2 = _then(_then(to_block1, _gre_train(q[0], e1, shots)), _free(gap_b, r1))
    cycle = _then(_then(to_block2, _gre_train(q[1], e1, shots)), _free(gap_c, r1))
    steady = cycle[1] / (1 - cycle[0])  # Mz just before the inversion

    samples = []
    for k, to_block in enumerate((to_block1, to_block2)):
        slope, intercept = _then(to_block, _gre_train(q[k], e1, before))  # -> before the sampled pulse
        samples.append(torch.sin(angle[k]) * (slope * steady + intercept))
    return v["M0"] * torch.stack(torch.broadcast_tensors(*samples), -1)
