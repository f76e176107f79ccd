"""Look-Locker and MOLLI: inversion recovery sampled by small-flip readout trains. Closed forms, real."""

from __future__ import annotations

import torch

from ..model import SpinPhysics
from ._closed_form import ClosedForm
from ._formulas import looklocker, molli
from ._formulas.look_locker import _block_sizes
from ._function_form import function_form

__all__ = ["LookLockerSimulator", "MOLLISimulator", "looklocker_sim", "molli_sim"]


class LookLockerSimulator(ClosedForm):
    """Look-Locker inversion recovery (Look & Locker 1970; Deichmann & Haase 1992). Closed form, real.

    Pulses of flip a = B1 flip every TR from the inversion on, ideally spoiled; the sample at TI is the Mz
    just before the pulse times sin a:

        S(TI) = M0 [M_ss + (M_start - M_ss) e^{-TI R1*}] sin a,   R1* = R1 - ln(cos a)/TR,
        M_ss  = (1 - E1)/(1 - E1 cos a)   (short_TR: the continuous limit R1/R1*),   E1 = e^{-TR/T1},

    M_start = -eff (from equilibrium) or -eff M_ss (`from_steady_state`: repeated without recovery).

    Protocol: `flip` (deg, |B1 flip| < 90), `TR` (ms, > 0), `TI` (ms), `short_TR=False`,
    `from_steady_state=False`. Tissue: `T1` (ms, required), `M0`, `B1`, `inv_efficiency`. Shape
    `(*voxel_shape, *samples)`, the samples being the broadcast of `flip`, `TR`, `TI`. float32, or float64
    for float64 inputs.
    """

    model = SpinPhysics(properties={"T1": None, "M0": None, "B1": None, "inv_efficiency": None})

    def evaluate(self, properties, *, flip, TR, TI, short_TR=False, from_steady_state=False, device=None):
        x = self.arrange(properties, dict(flip=flip, TR=TR, TI=TI), required=("T1",), device=device)
        p = x.protocol
        return x.finish(looklocker(p["flip"], p["TR"], p["TI"], short_TR=bool(short_TR),
                                   from_steady_state=bool(from_steady_state), **x.tissue))


class MOLLISimulator(ClosedForm):
    """Modified Look-Locker (Messroghli et al., MRM 2004;52:141): Look-Locker blocks with free recovery
    between them, concatenated. Closed form, real.

    `readouts` (ints, e.g. (5, 3, 3)) gives the samples per block. Starting from equilibrium, block b
    inverts the Mz it finds (M_start = -eff Mz) and samples pulses at 0, TR, ..., (n_b - 1) TR after the
    inversion, each as in `LookLockerSimulator`; the block ends one TR after its last pulse, then Mz
    recovers freely for `recovery` ms before the next inversion.

    Protocol: `flip` (deg), `TR` (ms, the readout spacing), `readouts` (ints), `recovery` (ms),
    `short_TR=False`. Tissue: `T1` (ms, required), `M0`, `B1`, `inv_efficiency`. Shape
    `(*voxel_shape, sum(readouts))`; a 1-D array `flip`, `TR` or `recovery` gives one train per entry,
    stacked first: `(trains, *voxel_shape, sum(readouts))`. float32, or float64 for float64 inputs.
    """

    model = SpinPhysics(properties={"T1": None, "M0": None, "B1": None, "inv_efficiency": None})
    structural = ("readouts",)

    def evaluate(self, properties, *, flip, TR, readouts, recovery, short_TR=False, device=None):
        counts = _block_sizes(readouts)
        protocol = dict(flip=flip, TR=TR, recovery=recovery)
        trains = {name: tuple(v.shape) for name, v in protocol.items() if isinstance(v, torch.Tensor) and v.dim()}
        if any(len(shape) > 1 for shape in trains.values()) or len(set(trains.values())) > 1:
            raise ValueError(f"MOLLISimulator builds its samples from readouts: flip, TR and recovery must be "
                             f"scalars or 1-D arrays of one length (one train each); got {trains}")
        x = self.arrange(properties, protocol, required=("T1",), sample_shape=(1,), device=device)
        voxel = (1,) * len(x.voxel_shape)
        p = {name: v.reshape(-1, *voxel, 1) if isinstance(v, torch.Tensor) and v.dim() else v
             for name, v in x.protocol.items()}
        signal = molli(p["flip"], p["TR"], counts, p["recovery"], short_TR=bool(short_TR), **x.tissue)
        x.voxel_shape = (*next(iter(trains.values()), ()), *x.voxel_shape)  # the train axis leads
        return x.finish(signal, (sum(counts),))


looklocker_sim = function_form(
    LookLockerSimulator,
    "looklocker_sim",
    ("flip", "TR", "TI", "T1"),
    (("diff", None), ("short_TR", False), ("from_steady_state", False), ("B1", 1.0), ("inv_efficiency", 1.0),
     ("M0", 1.0), ("device", None)),
)

molli_sim = function_form(
    MOLLISimulator,
    "molli_sim",
    ("flip", "TR", "readouts", "recovery", "T1"),
    (("diff", None), ("short_TR", False), ("B1", 1.0), ("inv_efficiency", 1.0), ("M0", 1.0), ("device", None)),
)
