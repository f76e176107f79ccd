"""Textbook relaxometry signals: inversion recovery, multi-echo T2 decay, spin echo, double angle. All real."""

from __future__ import annotations

import torch

from ._common import as_tensors, check_ordered, check_times, rate

__all__ = ["double_angle", "inversion_recovery", "multiecho", "spin_echo"]


def inversion_recovery(TI, TR=None, *, T1, M0=1.0, inv_efficiency=1.0, offset=0.0) -> torch.Tensor:
    """Inversion recovery read by a saturating (90 degree) readout at TI, real.

    With TR:    S = M0 (1 - (1 + eff (1 - e^{-(TR - TI)/T1})) e^{-TI/T1}) + offset
                (the readout saturates, so Mz recovers for TR - TI before the next inversion; TR >= TI);
    without TR: S = M0 (1 - (1 + eff) e^{-TI/T1}) + offset (full recovery before each inversion).
    Elementwise.
    """
    v = as_tensors(dict(TI=TI, TR=TR, T1=T1, M0=M0, inv_efficiency=inv_efficiency, offset=offset))
    check_times(TI=v["TI"], TR=v["TR"], T1=v["T1"])
    ti, r1, eff = v["TI"], rate(v["T1"]), v["inv_efficiency"]
    if v["TR"] is not None:
        gap = v["TR"] - ti
        check_ordered("TR", gap, "each TR must be >= its TI (the readout at TI comes before the next inversion)")
        eff = eff * (1 - torch.exp(-gap * r1))
    return v["M0"] * (1 - (1 + eff) * torch.exp(-ti * r1)) + v["offset"]


def multiecho(TE, *, T2, M0=1.0, offset=0.0) -> torch.Tensor:
    """Multi-echo T2 decay, real: S = M0 e^{-TE/T2} + offset. Elementwise."""
    v = as_tensors(dict(TE=TE, T2=T2, M0=M0, offset=offset))
    check_times(TE=v["TE"], T2=v["T2"])
    return v["M0"] * torch.exp(-v["TE"] * rate(v["T2"])) + v["offset"]


def spin_echo(TE, TR, TI=None, *, T1, T2, M0=1.0, inv_efficiency=1.0) -> torch.Tensor:
    """Spin echo (90-180) repeated every TR, real.

    S = M0 (1 - 2 e^{-(TR - TE/2)/T1} + e^{-TR/T1}) e^{-TE/T2}: the 180 at TE/2 inverts the Mz that has
    recovered since the 90, and the readout at TE saturates (TR >= TE/2). With TI the result is further
    multiplied by the inversion factor (1 - (1 + eff) e^{-TI/T1}). Elementwise.
    """
    v = as_tensors(dict(TE=TE, TR=TR, TI=TI, T1=T1, T2=T2, M0=M0, inv_efficiency=inv_efficiency))
    check_times(TE=v["TE"], TR=v["TR"], TI=v["TI"], T1=v["T1"], T2=v["T2"])
    te, tr, r1 = v["TE"], v["TR"], rate(v["T1"])
    check_ordered("TR", tr - te / 2, "each TR must be >= TE/2 (the refocusing pulse comes within the TR)")
    longitudinal = 1 - 2 * torch.exp(-(tr - te / 2) * r1) + torch.exp(-tr * r1)
    if v["TI"] is not None:
        longitudinal = longitudinal * (1 - (1 + v["inv_efficiency"]) * torch.exp(-v["TI"] * r1))
    return v["M0"] * longitudinal * torch.exp(-te * rate(v["T2"]))


def double_angle(flip, *, B1, M0=1.0) -> torch.Tensor:
    """Double-angle B1 mapping signal, real: S = M0 sin(B1 flip) (flip in degrees). Elementwise."""
    v = as_tensors(dict(flip=flip, B1=B1, M0=M0))
    return v["M0"] * torch.sin(v["B1"] * torch.deg2rad(v["flip"]))
