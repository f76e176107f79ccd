"""Checks of the protocol values and run settings a call passes, and the keys its structure cache uses."""

from __future__ import annotations

import cmath
import math
from collections.abc import Mapping

import torch

from .._arrays import (
    library_of,
)
from .._errors import check_device
from .._execution import as_policy
from ..engine.program import check_states
from ..sequence.rf import RfDefinition
from .vocabulary import (
    DTYPES,
    RECORD_MODES,
    UNITS,
)

POSITIVE_TIMES = ("TR", "TRspgr", "TRmp2rage", "ESP")


def _check_protocol(protocol: dict, structural, *, finite: bool, host_only: bool = False) -> None:
    """ValueError for a protocol value that is NaN (or infinite, when `finite`: an event train's flips and times
    become events), or a time of `POSITIVE_TIMES` <= 0, naming the argument as the caller gave it (with its
    unit) and the first bad index. `host_only` leaves tensors off the CPU to the walk of the layout (a check
    there would wait for the device). Numbers are checked in Python, a tensor with two ops and one read."""
    for name, value in protocol.items():
        if name in structural or isinstance(value, (bool, str)) or value is None:
            continue
        positive = name in POSITIVE_TIMES
        if isinstance(value, torch.Tensor):
            if (host_only and not value.is_cpu) or not (value.is_floating_point() or value.is_complex()):
                continue
            t = value.detach()
            if t.is_complex():
                positive = False
            if positive:
                ok = (t > 0) & (t < math.inf)  # False at NaN
            else:
                # One reduction and one read decide the usual case (isfinite and all are six ops): a sum is finite
                # only if every entry is, and not NaN unless an entry is NaN or infinities of both signs meet;
                # the entry-wise test below then finds the first bad entry, or none (an overflow, say).
                total = t.sum().item()
                if cmath.isfinite(total) if finite else not cmath.isnan(total):
                    continue
                ok = torch.isfinite(t) if finite else ~torch.isnan(t)
            if bool(ok.all()):
                continue
            bad = ~ok
        elif isinstance(value, (int, float)):
            x = float(value)
            if (x > 0 and x < math.inf) if positive else (math.isfinite(x) if finite else not math.isnan(x)):
                continue
            t, bad = torch.tensor(x, dtype=torch.float64), torch.tensor(True)
        else:
            continue
        unit = UNITS.get(name)
        if positive:
            accepted = f"a finite time > 0 {unit} (at 0 every pulse plays at once)"
        else:
            accepted = f"a finite number{f' ({unit})' if unit else ''}" if finite else "a number, not NaN"
        index = tuple(int(i) for i in bad.nonzero()[0]) if t.dim() else ()
        first = t.reshape(-1)[bad.reshape(-1)][0].item()
        raise ValueError(f"{name} must be {accepted}; {int(bad.sum())} of {t.numel()} value(s) are bad, the first "
                         f"at index {index}: {first}")


def _check_setting(name: str, value):
    if name == "states":
        value = check_states(value)
    elif name == "repetitions":
        if value != "auto" and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ValueError(f"repetitions must be an integer >= 1 or 'auto' (steady state), got {value!r}")
    elif name == "record":
        if value not in RECORD_MODES:
            raise ValueError(f"record must be one of {RECORD_MODES}, got {value!r}")
    elif name == "dtype":
        if not isinstance(value, torch.dtype) or value not in DTYPES:
            raise ValueError(f"dtype must be torch.float32 or torch.complex64 (float32 kernels, complex64 results: "
                             f"the default) or torch.float64 or torch.complex128 (float64 kernels, complex128 "
                             f"results), got {value!r}")
    elif name == "device":
        check_device(value)
    elif name == "execution":
        value = as_policy(value)
    elif name == "pulse":
        if not isinstance(value, RfDefinition):
            raise TypeError(f"pulse must be an RfDefinition (it replaces definition id 0), got {value!r}")
    elif name == "shims":
        if not isinstance(value, Mapping):
            raise TypeError(f"shims must be a mapping {{id: ShimDefinition}}, got {value!r}")
    return value


def _float_kind(value):
    """True for a real float (number or array), else a description of what it is."""
    if isinstance(value, bool):
        return "a bool"
    if isinstance(value, (int, float)):
        return True
    if isinstance(value, complex):
        return "complex"
    lib = library_of(value)
    if lib == "torch":
        return True if value.is_floating_point() else f"a tensor of {value.dtype}"
    if lib in ("numpy", "cupy"):
        return True if value.dtype.kind == "f" else f"an array of {value.dtype}"
    if isinstance(value, (list, tuple)):
        return True
    return f"a {type(value).__name__}"


def _hashable(value):
    """A hashable stand-in for a structural protocol value (lists and arrays by their contents)."""
    if isinstance(value, (list, tuple)):
        return tuple(_hashable(v) for v in value)
    if library_of(value) is not None:
        return ("array", tuple(value.shape), tuple(value.reshape(-1).tolist()))
    hash(value)
    return value


def _short(value) -> str:
    if library_of(value) is not None:
        return f"<{library_of(value)} {tuple(value.shape)}>"
    text = repr(value)
    return text if len(text) < 40 else text[:37] + "..."

