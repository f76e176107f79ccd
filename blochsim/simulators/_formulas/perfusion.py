"""Arterial spin labelling: the Buxton general kinetic model (Buxton et al., MRM 1998;40:383). Real."""

from __future__ import annotations

import torch

from ._common import as_tensors, check_nonnegative, check_times, expm1_over_x, rate

__all__ = ["DEFAULT_EFFICIENCY", "asl"]

#: Labelling efficiency alpha when `efficiency` is None.
DEFAULT_EFFICIENCY = {"continuous": 0.85, "pulsed": 0.98}

#: CBF in ml/100 g/min -> f in ml/g/ms.
_CBF_TO_PER_MS = 1.0 / (100.0 * 60.0 * 1000.0)


def asl(
    t,
    tau,
    *,
    CBF,
    ATT,
    T1,
    M0=1.0,
    T1_blood=1650.0,
    partition=0.9,
    labelling="continuous",
    efficiency=None,
) -> torch.Tensor:
    """The label-control difference Delta M(t) of the Buxton general kinetic model, real.

    t is the time (ms) since the start of labelling (pCASL: t = tau + post-labelling delay), tau the
    labelling (bolus) duration, ATT the arterial transit time Delta t, all in ms. With f = CBF / 6e6
    (ml/g/ms), lambda = `partition` (ml/g), the blood equilibrium M0b = M0/lambda and the apparent tissue
    rate R1app = 1/T1 + f/lambda (1/ms),

        Delta M(t) = 2 M0b f integral_{Delta t}^{Delta t + u} c(s) e^{-(t - s) R1app} ds,
        u = min(max(t - Delta t, 0), tau)    (the part of the bolus delivered by t),

    with the arterial input c(s) = alpha e^{-Delta t/T1_blood} (continuous labelling: the label decays
    during transit only) or c(s) = alpha e^{-s/T1_blood} (pulsed: the label decays from t = 0). In closed
    form, with k = 1/T1_blood - R1app and phi(x) = (e^x - 1)/x,

        continuous: Delta M = 2 alpha M0b f e^{-Delta t/T1_blood} e^{-(t - Delta t - u) R1app} u phi(-u R1app),
        pulsed:     Delta M = 2 alpha M0b f e^{-Delta t/T1_blood} e^{-(t - Delta t) R1app} u phi(-u k),

    which are Buxton's three-phase formulas (0 before the bolus arrives, u = t - Delta t while it
    arrives, u = tau after). alpha = `efficiency`, default 0.85 (continuous) or 0.98 (pulsed).
    Elementwise in every argument.
    """
    if labelling not in DEFAULT_EFFICIENCY:
        raise ValueError(f"labelling must be one of {sorted(DEFAULT_EFFICIENCY)}, got {labelling!r}")
    if efficiency is None:
        efficiency = DEFAULT_EFFICIENCY[labelling]
    v = as_tensors(
        dict(
            t=t,
            tau=tau,
            CBF=CBF,
            ATT=ATT,
            T1=T1,
            M0=M0,
            T1_blood=T1_blood,
            partition=partition,
            efficiency=efficiency,
        )
    )
    check_times(t=v["t"], tau=v["tau"], ATT=v["ATT"], T1=v["T1"], T1_blood=v["T1_blood"])
    check_nonnegative("a flow >= 0 ml/100 g/min", CBF=v["CBF"])
    t, transit, partition = v["t"], v["ATT"], v["partition"]
    f = v["CBF"] * _CBF_TO_PER_MS
    r1_app = rate(v["T1"]) + f / partition
    r1_blood = rate(v["T1_blood"])
    delivered = torch.minimum(torch.relu(t - transit), v["tau"])
    scale = 2 * v["efficiency"] * (v["M0"] / partition) * f * torch.exp(-transit * r1_blood)
    if labelling == "continuous":
        kinetics = torch.exp(-(t - transit - delivered) * r1_app) * delivered * expm1_over_x(-delivered * r1_app)
    else:
        k = r1_blood - r1_app
        kinetics = torch.exp(-(t - transit) * r1_app) * delivered * expm1_over_x(-delivered * k)
    return scale * kinetics
