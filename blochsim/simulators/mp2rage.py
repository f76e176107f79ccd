"""MP2RAGE: `MP2RAGESimulator` (its closed form) and `mp2rage_sim`.

This class has both a closed-form `evaluate` and an event-train `layout`. The `Simulator`
base class treats a class that defines `layout` as an event train, so `simulate` and `jacobian` are the
closed form's, and the event train (section 2 below: `layout`, `repetition_s`, `describe`) is attached
after the class is made. `describe()` gives one TRmp2rage as a `SequenceDescription`, and
`MP2RAGESimulator.from_description(d)` plays it with the engine under the class settings (states=1,
record="acquired", T2 pinned at 100 ms, SPOILED handlers); its steady state (`repetitions="auto"`) times
+i is the closed form.
"""

from __future__ import annotations

import torch

from ..model import SPOILED, SpinPhysics, on_host
from ..sequence.events import AdcRole
from ._closed_form import ClosedForm
from ._formulas import mp2rage
from ._formulas.prepared import split_shots
from ._function_form import function_form
from ._layout import check_order, per_shot, rad, seconds

__all__ = ["MP2RAGESimulator", "mp2rage_sim"]


class MP2RAGESimulator(ClosedForm):
    """MP2RAGE (Marques et al., NeuroImage 2010;49:1271): the two gradient-echo samples (GRE1, GRE2) of
    repeated inversion blocks in their steady state. Closed form, real (not the uniform image).

    Every TRmp2rage: an inversion (Mz -> -eff Mz), then two blocks of `nshots` ideally spoiled shots spaced
    TRspgr, with flips flip[0] and flip[1]; only Mz carries from shot to shot. Block k's sampled shot (the
    first of `after`) is at TI[k] after the inversion. With E1 = e^{-TRspgr/T1} and q_k = E1 cos a_k, a
    block of m shots maps Mz -> q^m Mz + (1 - E1)(1 - q^m)/(1 - q), and free recovery for T maps
    Mz -> e^{-T/T1} Mz + 1 - e^{-T/T1}; the fixed point of one TRmp2rage gives the steady state, and
    GRE_k = M0 sin a_k Mz_k with Mz_k just before the sampled pulse (negative while inverted).

    Protocol: `TI` (ms, 2 values), `flip` (deg, a scalar or 2), `TRspgr`, `TRmp2rage` (ms), `nshots` (a total
    split evenly around the sampled shot, or `(before, after)` with the sampled shot the first of `after`),
    `phases=0` (deg, used by the event train only). Tissue: `T1` (ms, required), `M0`, `inv_efficiency`.
    Shape `(*voxel_shape, 2)`. ValueError when a TI precedes the first excitation of its block, when the
    blocks overlap, or when block 2 does not end within TRmp2rage. float32, or float64 for float64 inputs.
    """

    model = SpinPhysics(properties={"T1": "t1_ms", "M0": "m0", "inv_efficiency": "inversion_efficiency"},
                        operators=SPOILED, fixed={"t2_ms": 100.0})
    states = 1
    record = "acquired"
    structural = ("nshots",)

    def evaluate(self, properties, *, TI, flip, TRspgr, TRmp2rage, nshots, phases=0.0, device=None):
        x = self.arrange(properties, dict(TI=TI, flip=flip, TRspgr=TRspgr, TRmp2rage=TRmp2rage),
                         required=("T1",), sample_shape=(1,), device=device)
        p = x.protocol
        return x.finish(mp2rage(p["TI"], p["flip"], p["TRspgr"], p["TRmp2rage"], nshots, **x.tissue), (2,))


mp2rage_sim = function_form(
    MP2RAGESimulator,
    "mp2rage_sim",
    ("TI", "flip", "TRspgr", "TRmp2rage", "nshots", "T1"),
    (("diff", None), ("inv_efficiency", 1.0), ("M0", 1.0), ("device", None)),
)


# == 2. The event train ===================================================================
def _per_block(name: str, value) -> list:
    """Two per-block values: a scalar repeats, two values (last axis) give one each."""
    if isinstance(value, torch.Tensor) and value.dim() > 0:
        value = value.to(torch.float64)  # a closed form converts lists to float32; times need float64
        if value.numel() == 2:
            return list(value.reshape(2).unbind())
        if value.numel() == 1:
            return [value.reshape(())] * 2
        raise ValueError(f"{name} must be a scalar or hold one value per block (2), got shape {tuple(value.shape)}")
    if name == "TI":
        raise ValueError(f"TI must hold two inversion times (ms), one per block, got {value!r}")
    return [value] * 2


def _layout(self, *, TI, flip, TRspgr, TRmp2rage, nshots, phases=0.0):
    """One TRmp2rage: an ideal inversion at 0, then two blocks of `before + after` spoiled shots `TRspgr`
    apart (the `excitation` slot, then the SPOILED `readout`), flips `flip[k]`; block k's sampled shot, the
    first of `after`, plays at `TI[k]` and is the only acquired one of its block (the others: NON_ACQUIRED).
    `phases` (deg) is a scalar or one per shot of a block. The repetition lasts `TRmp2rage`."""
    before, after = split_shots(nshots)
    shots = before + after
    tr_s = seconds(_per_block("TRspgr", TRspgr)[0])
    times_s = [seconds(t) for t in _per_block("TI", TI)]
    flips = [rad(a) for a in _per_block("flip", flip)]
    phases = per_shot("phases", rad(phases.to(torch.float64) if isinstance(phases, torch.Tensor) else phases),
                      shots, unit=" (deg)")
    roles = [AdcRole.NON_ACQUIRED] * before + [AdcRole.SINGLE] + [AdcRole.NON_ACQUIRED] * (after - 1)
    ops, free_s = [self.operators.inversion()], 0.0
    for k in range(2):
        start_s = times_s[k] - before * tr_s
        check_order("TI", free_s, start_s, f"TI[{k}] = {_ms(times_s[k])} ms leaves no room for block {k + 1}: its "
                    f"first pulse ({before} shots before the sampled one) would come at {_ms(start_s)} ms, before "
                    f"{_ms(free_s)} ms (the inversion, or the end of block 1)")
        block = [self.operators.excitation(flips[k], p) @ self.operators.readout(p, duration_s=tr_s, role=role)
                 for p, role in zip(phases, roles, strict=True)]
        ops.append((start_s, block[0]))
        ops.extend(block[1:])
        free_s = start_s + shots * tr_s
    return ops


def _repetition_s(self, played_s, *, TRmp2rage, **protocol):
    tr_s = seconds(_per_block("TRmp2rage", TRmp2rage)[0])
    check_order("TRmp2rage", played_s, tr_s, f"block 2 must end within TRmp2rage = {_ms(tr_s)} ms; it ends at "
                f"{_ms(played_s)} ms (TRmp2rage >= TI[1] + after * TRspgr)")
    return tr_s


def _describe(self, **protocol):
    """One TRmp2rage as a `SequenceDescription` (arguments not given come from the fixed protocol)."""
    if self._stored is not None:
        return super(MP2RAGESimulator, self).describe(**protocol)
    args = self.played(**protocol)
    self._check_required(args)
    return self._compose(on_host(args), {})


def _ms(t_s) -> str:
    value = float(t_s.detach()) if isinstance(t_s, torch.Tensor) else float(t_s)
    return f"{value * 1e3:g}"


# Attached after the class is made: defined in the class body, `layout` would make the base class treat
# MP2RAGESimulator as an event train, and `simulate` must stay the closed form.
MP2RAGESimulator.layout = _layout
MP2RAGESimulator.repetition_s = _repetition_s
MP2RAGESimulator.describe = _describe
