"""Lorentzian Z-spectrum model (multi-pool CEST fitting). Real."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ._common import as_tensors

__all__ = ["lorentzian"]


def lorentzian(offsets, *, amplitudes, widths, shifts, M0=1.0) -> torch.Tensor:
    """A sum of Lorentzian dips, real: S = M0 (1 - sum_k A_k (W_k/2)^2 / ((W_k/2)^2 + (offset - shift_k)^2)).

    `amplitudes`, `widths` (full width at half maximum) and `shifts` are sequences with one value per
    pool (each a number or a broadcastable tensor), in the units of `offsets` (ppm or Hz, the caller's
    choice). Elementwise in `offsets` and the pool values.
    """
    pools = []
    for name, values in (("amplitudes", amplitudes), ("widths", widths), ("shifts", shifts)):
        if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
            raise ValueError(f"{name} must be a sequence with one value per pool, got {type(values).__name__}")
        pools.append(values)
    if not len(pools[0]) == len(pools[1]) == len(pools[2]):
        raise ValueError(
            f"amplitudes, widths and shifts need one value per pool; got {len(pools[0])}, {len(pools[1])} and "
            f"{len(pools[2])} values"
        )
    named = {"offsets": offsets, "M0": M0}
    for k in range(len(pools[0])):
        named.update({f"amplitudes[{k}]": pools[0][k], f"widths[{k}]": pools[1][k], f"shifts[{k}]": pools[2][k]})
    v = as_tensors(named)
    saturation = torch.zeros_like(v["offsets"])
    for k in range(len(pools[0])):
        half_width_sq = (v[f"widths[{k}]"] / 2) ** 2
        detuning = v["offsets"] - v[f"shifts[{k}]"]
        saturation = saturation + v[f"amplitudes[{k}]"] * half_width_sq / (half_width_sq + detuning**2)
    return v["M0"] * (1 - saturation)
