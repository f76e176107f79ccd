"""`LookupTable`: one unknown read off a simulated 1-D signal curve by linear interpolation."""

from __future__ import annotations

import torch

from .base import Estimator

__all__ = ["LookupTable"]


class LookupTable(Estimator):
    """One unknown read from a monotonic signal curve (a B1 map from a double-angle ratio, T1 from MP2RAGE).

    `LookupTable(acquisition=None, *, combine=None, monotonic=True)`. `fit(T1=(low, high))` (or values, or
    `signals=`/`parameters=`) tabulates the curve; exactly one unknown, and no known properties. `combine`
    reduces a signal `(..., contrasts)` to one real number per voxel `(...)`, for example the MP2RAGE uniform
    image `lambda s: s[..., 0] * s[..., 1] / (s[..., 0]**2 + s[..., 1]**2)`; without it the acquisition must
    give one real contrast. `monotonic=True` keeps the longest strictly monotonic stretch of the curve (in
    the unknown's order) and discards the rest; `monotonic=False` requires the whole curve to be strictly
    monotonic (ValueError otherwise).

    Reading is linear interpolation between table points; a value outside `span` (the table's signal range)
    reads as the nearer endpoint's unknown. `points` is the number of table points kept. It runs where the
    signals are, in one pass (not streamed), and states no uncertainty (NotImplementedError).
    """

    def __init__(self, acquisition=None, *, combine=None, monotonic=True):
        super().__init__(acquisition)
        if combine is not None and not callable(combine):
            raise ValueError(f"LookupTable: combine must be a callable (..., contrasts) -> (...), got {combine!r}")
        self.combine = combine
        self.monotonic = bool(monotonic)

    @property
    def points(self) -> int | None:
        """The number of table points, or None before `fit`."""
        return int(self.table_signal.numel()) if self._trained else None

    @property
    def span(self) -> tuple | None:
        """The table's signal range `(low, high)`, or None before `fit`."""
        if not self._trained:
            return None
        return float(self.table_signal[0]), float(self.table_signal[-1])

    def fit(self, unknown=None, *, known=None, rank=None, subspace=None, **options):
        if known:
            raise ValueError(f"LookupTable reads one unknown from one curve; known properties {tuple(known)} "
                             "need a DictionaryMatcher (known=) or PERK")
        if rank is not None or subspace is not None:
            raise ValueError("LookupTable reads a 1-D curve: rank= and subspace= do not apply (use combine= to "
                             "reduce the contrasts)")
        return super().fit(unknown, **options)

    def _training_values(self, unknown: dict, known: dict, samples, generator) -> tuple:
        """A range becomes an even float64 grid of `samples` points (default 10000), not random draws: a closed
        form then tabulates in float64, and neighbouring points never coincide."""
        grid = {}
        for name, spec in unknown.items():
            if isinstance(spec, tuple) and len(spec) == 2 and all(isinstance(v, (int, float)) for v in spec):
                low, high = float(spec[0]), float(spec[1])
                if not low < high:
                    raise ValueError(f"LookupTable.fit: the range of {name!r} needs low < high, got {spec!r}")
                grid[name] = torch.linspace(low, high, samples or 10000, dtype=torch.float64)
            else:
                grid.update(super()._training_values({name: spec}, {}, samples, generator)[0])
        return grid, {}

    def _curve(self, signals: torch.Tensor, what: str) -> torch.Tensor:
        """One real value per row of `signals` `(n, contrasts)`."""
        if self.combine is not None:
            values = self.combine(signals)
            if not isinstance(values, torch.Tensor) or values.shape != signals.shape[:-1]:
                got = tuple(values.shape) if isinstance(values, torch.Tensor) else type(values).__name__
                raise ValueError(f"LookupTable: combine must map {what} of shape {tuple(signals.shape)} to "
                                 f"{tuple(signals.shape[:-1])} (a torch tensor), got {got}")
        elif signals.shape[-1] == 1:
            values = signals[:, 0]
        else:
            raise ValueError(f"LookupTable: {what} have {signals.shape[-1]} contrasts; give combine= to reduce them "
                             "to one value per voxel")
        if values.is_complex():
            raise ValueError(f"LookupTable reads a real curve, and the {what} are complex; give combine= (e.g. "
                             "lambda s: s[..., 0].real or .abs())")
        return values

    def _fit_arrays(self, signals, parameters, known, *, noise_std) -> None:
        if noise_std:
            raise ValueError("LookupTable tabulates the noiseless curve; noise_std is for PERK and "
                             "NonlinearLeastSquares")
        if parameters is None or parameters.shape[1] != 1:
            count = 0 if parameters is None else parameters.shape[1]
            raise ValueError(f"LookupTable reads exactly one unknown, got {count}; use a DictionaryMatcher, PERK "
                             "or NonlinearLeastSquares for more")
        unknown, order = parameters[:, 0].double().sort()
        curve = self._curve(signals[order], "training signals").double()
        distinct = torch.cat([torch.ones(1, dtype=torch.bool), unknown[1:] > unknown[:-1]])  # repeated values
        unknown, curve = unknown[distinct], curve[distinct]
        start, stop = _monotonic_stretch(curve)
        if not self.monotonic and (start, stop) != (0, curve.numel()):
            raise ValueError(f"LookupTable(monotonic=False): the curve is not strictly monotonic over the "
                             f"{self._unknown[0] if self._unknown else 'unknown'} range (it turns at table point "
                             f"{stop if start == 0 else start} of {curve.numel()}); narrow the range or use "
                             "monotonic=True to keep the longest monotonic stretch")
        if stop - start < 2:
            raise ValueError("LookupTable: the curve has no monotonic stretch of two points or more")
        curve, unknown = curve[start:stop], unknown[start:stop]
        if curve[-1] < curve[0]:
            curve, unknown = curve.flip(0), unknown.flip(0)
        self.register_buffer("table_signal", curve.contiguous(), persistent=True)
        self.register_buffer("table_unknown", unknown.contiguous(), persistent=True)

    def _estimate_arrays(self, signals, known):
        values = self._curve(signals, "signals").double()
        xs = self.table_signal.to(values.device)
        ys = self.table_unknown.to(values.device)
        values = values.clamp(xs[0], xs[-1])  # outside the span: the nearer endpoint (documented)
        right = torch.searchsorted(xs, values.contiguous()).clamp(1, xs.numel() - 1)
        left = right - 1
        weight = (values - xs[left]) / (xs[right] - xs[left])
        out = ys[left] + weight * (ys[right] - ys[left])
        name = self._unknown[0] if self._unknown else None
        return {name: out.to(torch.float32)} if name is not None and self._named else out[:, None].to(torch.float32)

    def _uncertainty_arrays(self, signals, known):
        raise NotImplementedError("LookupTable states no uncertainty; PERK and NonlinearLeastSquares do")


def _monotonic_stretch(curve: torch.Tensor) -> tuple:
    """(start, stop) of the longest strictly monotonic run of `curve`."""
    if curve.numel() < 2:
        return 0, curve.numel()
    sign = torch.sign(curve[1:] - curve[:-1]).tolist()
    best, run_start, best_span = (0, 1), 0, 1
    for i in range(1, len(sign) + 1):
        # The run of steps [run_start, i) shares one nonzero sign; it covers points run_start..i.
        if i == len(sign) or sign[i] == 0 or sign[i] != sign[run_start]:
            if sign[run_start] != 0 and i - run_start + 1 > best_span:
                best, best_span = (run_start, i + 1), i - run_start + 1
            run_start = i
    return best
