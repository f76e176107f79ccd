"""The physics of the closed-form simulators as plain, differentiable torch functions.

The `Simulator` classes wrap these; the functions know nothing of names, defaults of the class, array
libraries or devices beyond torch. Each is a torch expression without in-place updates, so autograd
(first and second order, forward and reverse) goes straight through.

Units
------------------
Times in ms (`TR`, `TE`, `TI`, `T1`, `T2`, `T2star`, `ATT`, `tau`, ...), flips and `fat_phase` and
`phase_inc` in degrees, frequencies (`B0`, `chemshift`) in Hz, `D` and the tensor components in um^2/ms,
`b` in s/mm^2, `CBF` in ml/100 g/min, `field_strength` in T.

Arguments
---------
The protocol arguments are positional, in the order of the class protocol (optional ones that sit among
them, such as `bssfp`'s `TE`, `inversion_recovery`'s `TR`, `spin_echo`'s `TI` and `diffusion`'s
`directions`, included); tissue properties and the remaining options (`phase_inc`, `labelling`,
`short_TR`, `fat_spectrum`, ...) are keyword-only. Every numeric argument may be a Python number, a list,
a NumPy array or a torch tensor.

Dtypes
-------------------
A function computes in the promoted real dtype of its floating tensor and array inputs: float64 when any is
float64 (or complex128), else float32. Python numbers and lists are weak, as in torch: they take that
dtype, and when nothing else is given they give torch's default dtype (float32). The result is complex (complex64
or complex128) for `spgr`, `bssfp`, `multigradientecho` and `irmultigradientecho`, which also accept a
complex `M0`; it is real for every other function, and a complex input there is a TypeError. The device
is that of the first tensor argument.

Shapes
-------------------
The functions broadcast by NumPy rules and never move axes themselves. The caller puts the sample axis
last on the protocol arrays and gives each tissue tensor a trailing singleton axis: `T1` of voxel shape
`(4, 5)` is passed as shape `(4, 5, 1)`, `TE` of shape `(n,)` as it is, and the result has shape
`(4, 5, n)`. A scalar protocol with tissue of shape `V` (no trailing axis needed) gives shape `V`.
Functions whose samples are not elementwise in a protocol array say so in their docstring:

* `hsfp`: the last axis of `flip` (and of `TR` if it varies) is the pass, recursed over in order.
* `molli`: the samples are built from `readouts`; every input must be a scalar or have a trailing
  singleton axis, and the result has `sum(readouts)` samples on a new last axis.
* `mp2rage`: the last axis of `TI` (length 2) is the sample axis; `flip` is a scalar or has length 2 there.
* `multigradientecho`, `irmultigradientecho`: the fat peaks are summed on an internal axis.
* `diffusion`: `directions` has shape `(*b.shape, 3)` (or broadcasts to it).
* `lorentzian`: `amplitudes`, `widths`, `shifts` are sequences with one broadcastable value per pool.

Validation
----------
A negative or NaN time (relaxation time or protocol time) is a ValueError naming the argument, the number
of bad entries and the first index. `0` and `inf` are allowed: relaxation times are clamped
to >= 1e-6 ms as in the engine, and `inf` means no relaxation.

References: Freeman R, Hill HDW, J Magn Reson 1971;4:366 and Hargreaves BA et al., MRM 2001;46:149
(bSSFP); Schmitt P et al., MRM 2004;51:661 (IR-TrueFISP); Assländer J et al., Commun Phys 2019;2:73
(hybrid-state free precession); Look DC, Locker DR, Rev Sci Instrum 1970;41:250 and Deichmann R, Haase A,
J Magn Reson 1992;96:608 (Look-Locker); Messroghli DR et al., MRM 2004;52:141 (MOLLI); Marques JP et al.,
NeuroImage 2010;49:1271 (MP2RAGE); Buxton RB et al., MRM 1998;40:383 (ASL kinetic model).
"""

from .gradient_echo import irmultigradientecho, multigradientecho, spgr
from .look_locker import looklocker, molli
from .perfusion import asl
from .prepared import mp2rage
from .relaxometry import double_angle, inversion_recovery, multiecho, spin_echo
from .steady_state import bssfp, hsfp, irbssfp
from .weighting import diffusion
from .z_spectrum import lorentzian

__all__ = [
    "asl",
    "bssfp",
    "diffusion",
    "double_angle",
    "hsfp",
    "inversion_recovery",
    "irbssfp",
    "irmultigradientecho",
    "looklocker",
    "lorentzian",
    "molli",
    "mp2rage",
    "multiecho",
    "multigradientecho",
    "spgr",
    "spin_echo",
]
