"""`PERK`: parameter estimation via regression with kernels (Nataraj et al., IEEE TMI 2018)."""

from __future__ import annotations

import math

import torch

from .. import _execution
from .._progress import progress_bar
from . import perk_kernels as kernels
from .base import Estimator

__all__ = ["PERK"]

#: Training rows the default length scale looks at (all pairs among them: ~500,000 distances).
LENGTH_SCALE_ROWS = 1000
#: Bytes of one accumulation step's features (samples x n_features x 4): the streaming fit's working memory.
ACCUMULATE_BYTES = 64 * 2**20
_COMPLEX_MODES = ("cartesian", "magnitude")


class PERK(Estimator):
    """Kernel ridge regression from signals to tissue parameters on random Fourier features (Nataraj 2018).

    `PERK(acquisition=None, *, n_features=1000, length_scale=None, regularization=1e-5, chunk_size=65536,
    feature_seed=None, complex_mode="cartesian", normalize=True, stream=False, uncertainty=True,
    log_targets=None)`; trained with `fit` and read with `map` (`Estimator`).

    **Method.** A voxel's signal `s` `(contrasts,)` becomes an input row `x`: its real and imaginary parts
    interleaved (`complex_mode="cartesian"`, `2 * contrasts` columns) or its magnitude (`"magnitude"`),
    divided by `|s|` (the 2-norm over contrasts) when `normalize`, with the known properties appended as
    columns. Its `F = n_features` features are `z(x) = sqrt(2/F) cos(W x + b)`, `W[f, j] ~ N(0, 1) / l_j`,
    `b[f] ~ U[0, 2 pi)`, drawn on the host from `feature_seed` (so every device uses the same ones):
    `z(x) . z(x')` approximates the Gaussian kernel `exp(-sum_j (x_j - x'_j)^2 / (2 l_j^2))`. The fit
    accumulates, chunk by chunk (memory O(F^2) whatever the sample count), the feature mean `z_bar`, the
    target mean `y_bar`, the centred covariance `C` and the cross-covariance `c_zy`, and solves
    `A = (C + regularization I)^-1 c_zy` (Cholesky, float64); a voxel's prediction is
    `y_bar + (z(x) - z_bar) A`. The targets are the unknowns (see `log_targets`) and, when `normalize`,
    `1 / |s|`, from which `map` returns `M0 = |s| * prediction`.

    **Defaults, and why** (a model trained on 20,000 noiseless samples of a 100-repetition MRF train, T1
    200-3000 ms and T2 10-300 ms log-uniform, reads held-out tissues with a median error near 1 % for each):

    * `normalize=True`: the scale of a measured signal (proton density, receive gain) is never the training
      scale, and the unit-norm row carries all the signal's shape, which is what the parameters set; `M0`
      then comes from the norm, and the map does not depend on the volume's scaling.
    * `log_targets=None` regresses `log(value)` for every unknown whose training values are all positive
      (relaxation times, B1, M0) and the value itself for the others (B0, phases). Relaxation times span
      one or two decades: in log space the squared error weighs 20 ms at T2 = 30 ms as it weighs 200 ms at
      T2 = 300 ms (the relative error a map is judged by), and `exp` keeps the estimate positive. `True`,
      `False` or a list of names choose explicitly.
    * `length_scale=None` is the median distance between training inputs (over the signal columns, one value
      for all of them; for each known column, the median absolute difference of its values), measured on up
      to 1,000 training rows. Neighbouring training signals then look alike to the kernel and distant ones
      unrelated, whatever the signals' amplitude, length or noise. A per-column scale (standard deviation x
      sqrt(columns)) makes the kernel nearly linear over the data and divides by zero for a column that never
      varies (the imaginary parts of an MRF signal); on the MRF case above 0.25, 0.5, 1 and 2 times the median
      distance gave 0.3, 0.6, 1.1 and 2.4 % noiseless T1 errors, and with noise (SD 0.02) 1 times was the
      best: the median itself serves both. A given `length_scale` is a positive scalar or one value per
      input column.
    * `regularization=1e-5`, relative to the feature covariance, whose trace is about 1 (each `z_f` has
      variance at most 1/F): it cuts the directions the training signals do not span, without noticeable
      bias on noiseless training (1e-7 gives 0.3 % instead of 1.1 % above, at the price of larger weights).

    **Uncertainty** (`uncertainty=True`). A second pass over the training set, with fresh noise draws (so the
    residuals are those of signals the fit has not seen), regresses `|y - prediction|` on the same features;
    the stated SD is that prediction, clamped at 0, times sqrt(pi/2) (the mean absolute value of a Gaussian
    is sqrt(2/pi) times its SD). It covers the noise and the pull of the prior at the training noise level
    (`noise_std`); for a log target the SD in natural units is the value times the SD of its logarithm.

    **Gradients.** `map` is differentiable with respect to the volume (a torch tensor that requires grad):
    the regression runs as one autograd Function whose backward is the kernels' own VJP; neither direction
    holds the features of more than a tile of voxels.

    Other arguments: `chunk_size` voxels per kernel call in `map` and samples per accumulation step in `fit`
    (the latter at most what keeps one step's features in 64 MiB); `stream=True` simulates the training
    signals chunk by chunk (`fit`'s `chunk`) without keeping them, twice with `uncertainty` (it refuses `rank`,
    which needs every signal at once, but takes `subspace`). Voxels whose signal is zero read as NaN when
    `normalize` (their shape is undefined). `fitted` says whether the model is trained; `length_scales`
    gives the scales used, one per input column.

    **Several processes.** Inside `blochsim.distributed()`, `fit` simulates and accumulates each rank's
    contiguous range of the training samples and all-reduces the sums (float64) before each solve, so every
    rank holds the same model: without training noise the one-process model up to the order of summation.
    The length scales come from the first training rows and the features from rank 0's seed, as in one
    process; training noise is drawn by each rank from its own stream (the same distribution, other draws).
    `map` splits the voxels (`Estimator`).
    """

    _trains_on_shares = True  # under distributed(), each rank accumulates its own samples (see _train)

    def __init__(self, acquisition=None, *, n_features=1000, length_scale=None, regularization=1e-5,
                 chunk_size=65536, feature_seed=None, complex_mode="cartesian", normalize=True, stream=False,
                 uncertainty=True, log_targets=None):
        super().__init__(acquisition)
        if isinstance(n_features, bool) or not isinstance(n_features, int) or n_features < 1:
            raise ValueError(f"PERK: n_features must be a positive integer, got {n_features!r}")
        if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
            raise ValueError(f"PERK: chunk_size must be a positive integer (voxels per kernel call), got "
                             f"{chunk_size!r}")
        regularization = float(regularization)
        if not (math.isfinite(regularization) and regularization >= 0):
            raise ValueError(f"PERK: regularization must be a finite number >= 0, got {regularization!r}")
        if complex_mode not in _COMPLEX_MODES:
            raise ValueError(f"PERK: complex_mode must be 'cartesian' (real and imaginary parts) or 'magnitude', "
                             f"got {complex_mode!r}")
        if not (log_targets is None or isinstance(log_targets, bool) or
                (isinstance(log_targets, (list, tuple)) and all(isinstance(n, str) for n in log_targets))):
            raise ValueError(f"PERK: log_targets must be None (positive unknowns), True, False or a list of "
                             f"unknown names, got {log_targets!r}")
        self.n_features = n_features
        self.length_scale = length_scale
        self.regularization = regularization
        self.chunk_size = chunk_size
        self.feature_seed = feature_seed
        self.complex_mode = complex_mode
        self.normalize = bool(normalize)
        self.stream = bool(stream)
        self.uncertainty = bool(uncertainty)
        self.log_targets = log_targets
        self._log: tuple = ()
        self._complex_input = True
        self._cache: dict = {}
        if length_scale is not None:
            self._given_scales(len_hint=None)  # checks positivity now; the column count at fit

    # -- members ------------------------------------------------------------------------------------
    @property
    def length_scales(self) -> torch.Tensor | None:
        """The length scale of each input column (float64), once fitted."""
        return getattr(self, "frequency_scale", None)

    # -- training -----------------------------------------------------------------------------------
    def fit(self, unknown=None, **kwargs):
        """Train (see `Estimator.fit`); `stream=True` refuses `rank`. Returns self."""
        if self.stream and kwargs.get("rank") is not None:
            raise ValueError("PERK(stream=True) simulates training signals without keeping them, so it cannot fit a "
                             "subspace to them (rank=); give subspace= instead, or stream=False")
        if self.normalize and ("M0" in (unknown or {}) or "M0" in kwargs):
            raise ValueError("PERK(normalize=True) reads M0 from the signal's norm (map returns it); drop M0 from "
                             "the unknowns, or build PERK(normalize=False) to regress it")
        return super().fit(unknown, **kwargs)

    def _simulate(self, values: dict, known: dict, chunk: int):
        if not self.stream:
            return super()._simulate(values, known, chunk)
        return _StreamedSignals(self, values, known, chunk)

    def _project(self, subspace, signals, name: str):
        if isinstance(signals, _StreamedSignals):
            return signals.projected(subspace)
        return super()._project(subspace, signals, name)

    @torch.no_grad()
    def _fit_arrays(self, signals, parameters, known, *, noise_std) -> None:
        if parameters is None:
            raise ValueError("PERK regresses parameters on signals: give the unknowns' values with the training "
                             "signals (fit(signals=..., parameters=...)) or their ranges (fit(T1=(200, 3000), ...))")
        if not torch.isfinite(parameters).all():
            raise ValueError("PERK.fit: the training parameters hold NaN or inf")
        share = self._training_share
        if share is not None:
            # The log choice looks at every sample's sign (the AND over the ranks); a rank other than 0 draws
            # its training noise from a stream of its own (rank 0 keeps the one-process stream).
            positive = (parameters > 0).all(0).to(torch.float64)
            (everywhere,) = share.block.all_reduce(positive, what="PERK.fit's parameter signs")
            parameters_sign = everywhere == share.block.world
            if share.block.rank > 0:
                self._generator = torch.Generator().manual_seed(
                    (self._generator.initial_seed() + 0x9E3779B97F4A7C15 * share.block.rank) % 2**63)
        else:
            parameters_sign = None
        self._log = self._log_columns(parameters, parameters_sign)
        self._cache = {}
        self._complex_input = None
        with progress_bar(parameters.shape[0] * (2 if self.uncertainty else 1), desc="blochsim PERK fit",
                          unit="sample", unit_scale=True, enabled=_execution.active().progress) as bar:
            self._train(signals, parameters, known, noise_std, bar)

    def _train(self, signals, parameters, known, noise_std, bar) -> None:
        """The two passes of `_fit_arrays` (see the class docstring), `bar` counting samples; under
        `distributed()` over this rank's samples, the sums all-reduced before each solve."""
        F = self.n_features
        share = self._training_share
        count, sums = 0, None
        for piece, par, kn in self._pieces(signals, parameters, known):  # placed by the policy (_pieces)
            if self._complex_input is None:
                self._complex_input = piece.is_complex()
            x, norm = self._inputs(self._noisy(piece, noise_std), kn)
            if sums is None:
                first = self._step() if not isinstance(signals, _StreamedSignals) else min(self._step(),
                                                                                           signals.chunk)
                self._draw_features(x if share is None else _first_rows(x, share, first), known, share)
                rf = self._features(x.device, x.dtype)
                sums = {"z": x.new_zeros(F, dtype=torch.float64), "zz": x.new_zeros((F, F), dtype=torch.float64)}
            y = self._targets(par, norm)
            if "zy" not in sums:
                sums["zy"] = x.new_zeros((F, y.shape[1]), dtype=torch.float64)
                sums["y"] = x.new_zeros(y.shape[1], dtype=torch.float64)
            kernels.accumulate(x, rf, y.to(x.dtype), feature_sum=sums["z"], feature_gram=sums["zz"],
                               feature_target=sums["zy"])
            sums["y"] += y.sum(0, dtype=torch.float64)
            count += x.shape[0]
            bar.update(x.shape[0])
        if share is not None:
            count, sums = _summed(share.block, count, sums, "PERK.fit's feature sums")
        factor, head, offset = self._solve(sums, count, None)
        self._set("head", head)
        self._set("offset", offset)
        if not self.uncertainty:
            return
        # Second pass: the residuals' magnitudes, on fresh noise, regressed on the same features.
        rsums = {"z": torch.zeros_like(sums["z"]), "zy": torch.zeros_like(sums["zy"]),
                 "y": torch.zeros_like(sums["y"])}
        rcount = 0
        for piece, par, kn in self._pieces(signals, parameters, known):
            x, norm = self._inputs(self._noisy(piece, noise_std), kn)
            rf = self._features(x.device, x.dtype)
            y = self._targets(par, norm)
            pred = kernels.regression(x, rf, self.head, self.offset)
            residual = (y.to(pred.dtype) - pred).abs()
            kernels.accumulate(x, rf, residual, feature_sum=rsums["z"], feature_target=rsums["zy"])
            rsums["y"] += residual.sum(0, dtype=torch.float64)
            rcount += x.shape[0]
            bar.update(x.shape[0])
        if share is not None:
            rcount, rsums = _summed(share.block, rcount, rsums, "PERK.fit's residual sums")
        _, head, offset = self._solve(rsums, rcount, factor)  # the first pass's covariance (its Cholesky factor)
        self._set("uncertainty_head", head)
        self._set("uncertainty_offset", offset)

    def _pieces(self, signals, parameters, known):
        """(signals, parameters, known) pieces of at most one accumulation step each, on the device the active
        execution policy gives the signals (`with blochsim.execution("cuda"): perk.fit(...)` trains on a card)."""
        step = self._step()
        policy = _execution.active()

        def placed(piece, rows):
            device = policy.device_for(piece.device)
            return (piece.to(device), parameters[rows].to(device),
                    None if known is None else known[rows].to(device))

        if isinstance(signals, _StreamedSignals):
            for start, piece in signals.pieces():
                for i in range(0, piece.shape[0], step):
                    yield placed(piece[i:i + step], slice(start + i, start + min(i + step, piece.shape[0])))
            return
        for i in range(0, signals.shape[0], step):
            yield placed(signals[i:i + step], slice(i, i + step))

    def _step(self) -> int:
        """Samples per accumulation step: at most `chunk_size`, and what keeps a step's features in 64 MiB."""
        return min(self.chunk_size, max(1, ACCUMULATE_BYTES // (4 * self.n_features)))

    def _noisy(self, signals: torch.Tensor, noise_std: float) -> torch.Tensor:
        """The training signals with Gaussian noise of SD `noise_std` on the real and imaginary parts."""
        if not noise_std:
            return signals
        real = signals.real if signals.is_complex() else signals
        noise = torch.randn((2,) + tuple(signals.shape), generator=self._generator, dtype=real.dtype)
        noise = noise.to(signals.device) * noise_std
        if signals.is_complex():
            return signals + torch.complex(noise[0], noise[1])
        return signals + noise[0]

    def _log_columns(self, parameters: torch.Tensor, positive_columns: torch.Tensor | None = None) -> tuple:
        """Which targets are regressed in log: `positive_columns` (P,) bool says which columns are positive in
        every sample (default: in `parameters`)."""
        names = self.unknown or tuple(f"column {i}" for i in range(parameters.shape[1]))
        if positive_columns is None:
            positive_columns = (parameters > 0).all(0)
        positive = [bool(p) for p in positive_columns]
        choice = self.log_targets
        if choice is None:
            return tuple(positive)
        if isinstance(choice, bool):
            chosen = [choice] * len(names)
        else:
            unknown = [n for n in choice if n not in names]
            if unknown:
                raise ValueError(f"PERK: log_targets names {unknown[0]!r}, which is not an unknown ({list(names)})")
            chosen = [n in choice for n in names]
        bad = [n for n, c, p in zip(names, chosen, positive, strict=True) if c and not p]
        if bad:
            raise ValueError(f"PERK: log_targets asks for log({bad[0]}), but its training values are not all > 0")
        return tuple(chosen)

    def _draw_features(self, x: torch.Tensor, known, share=None) -> None:
        """Length scales (given, or from the first training piece) and the random features W, b (under
        `distributed()`, `share`: from rank 0's seed)."""
        columns = x.shape[1]
        if self.length_scale is not None:
            scales = self._given_scales(len_hint=columns)
        else:
            scales = _median_scales(x, 0 if known is None else known.shape[1])
        seed = self.feature_seed
        if seed is None:
            seed = int(torch.randint(0, 2**62, (1,), generator=self._generator))
            if share is not None:
                seed = share.block.gather_objects(seed, what="PERK.fit's feature seed")[0]
        g = torch.Generator().manual_seed(seed)
        frequency = torch.randn((self.n_features, columns), generator=g, dtype=torch.float64) / scales.cpu()
        phase = torch.rand(self.n_features, generator=g, dtype=torch.float64) * (2 * math.pi)
        self._set("frequency_scale", scales.cpu())
        self._set("frequency", frequency)
        self._set("phase", phase)

    def _given_scales(self, len_hint: int | None) -> torch.Tensor:
        value = torch.as_tensor(self.length_scale, dtype=torch.float64).detach().cpu()
        if value.dim() > 1 or not torch.isfinite(value).all() or (value <= 0).any():
            raise ValueError(f"PERK: length_scale must be a positive number or a 1-D array of positive numbers (one "
                             f"per input column), got {self.length_scale!r}")
        if len_hint is None:
            return value
        if value.dim() == 1 and value.numel() != len_hint:
            raise ValueError(f"PERK: length_scale has {value.numel()} values, the inputs have {len_hint} columns "
                             f"({self._column_text()})")
        return value.expand(len_hint).clone() if value.dim() == 0 else value

    def _column_text(self) -> str:
        signal = ("2 x contrasts: real and imaginary parts" if self.complex_mode == "cartesian"
                  else "contrasts: magnitudes")
        return signal + (f", then {len(self.known)} known" if self.known else "")

    def _solve(self, sums: dict, count: int, factor):
        """(Cholesky factor, head [T, F], offset [T]) of the ridge regression on the sums (float64)."""
        F = self.n_features
        scale = 2.0 / F
        mean_z = sums["z"] / count
        mean_y = sums["y"] / count
        if factor is None:
            cov = scale * (sums["zz"] / count - torch.outer(mean_z, mean_z))
            cov.diagonal().add_(self.regularization)
            factor, info = torch.linalg.cholesky_ex(cov)
            if int(info) != 0:
                raise ValueError(f"PERK.fit: the feature covariance is singular at regularization="
                                 f"{self.regularization} (fewer distinct training signals than features?); give "
                                 "regularization > 0, more samples or fewer n_features")
        cross = math.sqrt(scale) * (sums["zy"] / count - torch.outer(mean_z, mean_y))
        weights = torch.cholesky_solve(cross, factor)  # [F, T]
        head = math.sqrt(scale) * weights.T
        offset = mean_y - head @ mean_z
        return factor, head.contiguous().cpu(), offset.cpu()

    def _set(self, name: str, value: torch.Tensor) -> None:
        """A trained tensor, kept as a buffer (state_dict and `to` carry it)."""
        if name in self._buffers:
            self._buffers[name] = value
        else:
            self.register_buffer(name, value)

    # -- inputs and targets -------------------------------------------------------------------------
    def _inputs(self, signals: torch.Tensor, known) -> tuple:
        """(x `(N, columns)` real, |s| `(N,)`) of signals `(N, contrasts)` and known `(N, K)`."""
        parts = torch.view_as_real(signals).flatten(-2) if signals.is_complex() else signals
        norm = torch.linalg.vector_norm(parts, dim=-1)  # of the real view: torch's complex norm is ~40x slower
        cols = signals.abs() if self.complex_mode == "magnitude" else parts
        if self.normalize:  # a zero signal divides by 1 (and reads NaN: _read_chunk)
            cols = cols / norm.masked_fill(norm == 0, 1)[:, None]
        if known is not None:
            cols = torch.cat([cols, known.to(device=cols.device, dtype=cols.dtype)], dim=1)
        return cols.contiguous(), norm

    def _targets(self, parameters: torch.Tensor, norm: torch.Tensor) -> torch.Tensor:
        """Regression targets `(N, T)`: the unknowns (log where `_log`), then 1/|s| when normalizing."""
        columns = [torch.log(parameters[:, i]) if log else parameters[:, i] for i, log in enumerate(self._log)]
        if self.normalize:
            if not bool((norm > 0).all()):
                raise ValueError("PERK.fit: a training signal is zero everywhere, so it has no shape to normalize; "
                                 "drop it, or build PERK(normalize=False)")
            columns.append(1.0 / norm.to(parameters.dtype))
        return torch.stack(columns, dim=1).to(torch.float64)

    def _features(self, device, dtype) -> kernels.RandomFeatures:
        key = (torch.device(device), dtype, self.frequency.data_ptr(), self.frequency._version)
        if key not in self._cache:
            self._cache[key] = kernels.RandomFeatures.of(self.frequency.to(device=device, dtype=dtype),
                                                         self.phase.to(device=device, dtype=dtype))
        return self._cache[key]

    def _heads(self, device, dtype, *, uncertainty: bool):
        key = ("heads", torch.device(device), dtype, uncertainty, self.head.data_ptr(), self.head._version)
        if key not in self._cache:
            if uncertainty:
                if getattr(self, "uncertainty_head", None) is None:
                    raise RuntimeError("this PERK was built with uncertainty=False, so it states no SD; build "
                                       "PERK(uncertainty=True) and fit it again")
                head = torch.cat([self.head, self.uncertainty_head])
                offset = torch.cat([self.offset, self.uncertainty_offset])
            else:
                head, offset = self.head, self.offset
            self._cache[key] = (head.to(device=device, dtype=dtype).contiguous(),
                                offset.to(device=device, dtype=dtype).contiguous())
        return self._cache[key]

    # -- mapping ------------------------------------------------------------------------------------
    def _estimate_arrays(self, signals, known):
        return self._read_maps(signals, known, uncertainty=False)[0]

    def _uncertainty_arrays(self, signals, known):
        return self._read_maps(signals, known, uncertainty=True)[1]

    def _read_maps(self, signals: torch.Tensor, known, *, uncertainty: bool):
        """(maps, SDs or None) of signals `(V, contrasts)` on the policy's device, chunk_size voxels a call."""
        if self._complex_input and not signals.is_complex():
            signals = torch.complex(signals, torch.zeros_like(signals))
        elif not self._complex_input and signals.is_complex():
            raise ValueError("PERK.map: the volume is complex but PERK was trained on real signals; map real "
                             "signals (or train on complex ones)")
        device = _execution.active().device_for(signals.device)
        real = signals.real.dtype if signals.is_complex() else signals.dtype
        dtype = torch.float64 if real == torch.float64 and device.type == "cpu" else torch.float32
        if real != dtype:
            signals = signals.to(torch.complex64 if signals.is_complex() else dtype)
        signals = signals.to(device)
        known = None if known is None else known.to(device)
        parts = [self._read_chunk(signals[i:i + self.chunk_size],
                                  None if known is None else known[i:i + self.chunk_size], dtype, uncertainty)
                 for i in range(0, max(signals.shape[0], 1), self.chunk_size)]
        if len(parts) == 1:
            maps, sds = parts[0][0], parts[0][1] if uncertainty else None
        else:
            maps = {n: torch.cat([p[0][n] for p in parts]) for n in parts[0][0]}
            sds = None if not uncertainty else {n: torch.cat([p[1][n] for p in parts]) for n in parts[0][1]}
        if not self._named:
            columns = list(self.unknown) or [n for n in maps if n != "M0"]
            maps = torch.stack([maps[n] for n in columns], dim=-1)
            sds = None if sds is None else torch.stack([sds[n] for n in columns], dim=-1)
        return maps, sds

    def _read_chunk(self, signals, known, dtype, uncertainty):
        x, norm = self._inputs(signals, known)
        x = x.to(dtype)
        rf = self._features(x.device, dtype)
        head, offset = self._heads(x.device, dtype, uncertainty=uncertainty)
        y = kernels.Regression.apply(x, rf, head, offset)
        T = self.head.shape[0]
        names = list(self.unknown) or [f"column {i}" for i in range(len(self._log))]
        maps, sds = {}, {}
        empty = (norm == 0) if self.normalize else None
        for i, (name, log) in enumerate(zip(names, self._log, strict=True)):
            value = torch.exp(y[:, i]) if log else y[:, i]
            maps[name] = value
            if uncertainty:
                sd = y[:, T + i].clamp_min(0) * math.sqrt(math.pi / 2)
                sds[name] = value * sd if log else sd
        if self.normalize:
            maps["M0"] = norm.to(dtype) * y[:, len(self._log)]
            if uncertainty:
                sds["M0"] = norm.to(dtype) * y[:, T + len(self._log)].clamp_min(0) * math.sqrt(math.pi / 2)
            maps = {n: v.masked_fill(empty, math.nan) for n, v in maps.items()}
            sds = {n: v.masked_fill(empty, math.nan) for n, v in sds.items()}
        return maps, sds


def _first_rows(x: torch.Tensor, share, first: int) -> torch.Tensor:
    """Under `distributed()`: the rows the one-process fit measures the length scales on (the first
    `min(first, samples, LENGTH_SCALE_ROWS)` training rows, `first` the rows of its first piece), gathered on
    every rank from the first pieces `x` of the ranks that hold them."""
    wanted = min(first, share.total, LENGTH_SCALE_ROWS)
    mine = x[:max(0, min(share.stop, wanted) - share.start)].cpu()
    return torch.cat(share.block.gather_objects(mine, what="PERK.fit's length-scale rows"))


def _summed(block, count: int, sums: dict, what: str) -> tuple:
    """(count, sums) added over the ranks (one float64 all-reduce)."""
    names = sorted(sums)
    total, *values = block.all_reduce(torch.tensor(float(count), dtype=torch.float64),
                                      *(sums[n] for n in names), what=what)
    return int(total), dict(zip(names, values, strict=True))


def _median_scales(x: torch.Tensor, known_columns: int) -> torch.Tensor:
    """The default length scales (float64, on the host) of input rows `x`: the median distance between rows over
    the signal columns (one value for all), and the median absolute difference of each known column."""
    rows = x[:LENGTH_SCALE_ROWS].cpu().to(torch.float64)  # on the host, beside the features' draws
    signal_columns = x.shape[1] - known_columns
    pairs = torch.triu_indices(rows.shape[0], rows.shape[0], offset=1)
    scales = torch.empty(x.shape[1], dtype=torch.float64)
    distance = torch.cdist(rows[:, :signal_columns], rows[:, :signal_columns])[pairs[0], pairs[1]]
    scales[:signal_columns] = _positive_median(distance)
    for j in range(signal_columns, x.shape[1]):
        scales[j] = _positive_median((rows[pairs[0], j] - rows[pairs[1], j]).abs())
    return scales


def _positive_median(values: torch.Tensor) -> float:
    """The median of `values`, or of their nonzero part when more than half are 0 (repeated training values), or
    1 when all are: a column that never varies adds the same phase to every feature, whatever its scale."""
    if values.numel() == 0:
        return 1.0
    median = float(values.median())
    if median > 0:
        return median
    nonzero = values[values > 0]
    return float(nonzero.median()) if nonzero.numel() else 1.0


class _StreamedSignals:
    """The training signals of `PERK(stream=True)`: simulated `chunk` voxels at a time whenever a pass asks,
    never all kept. `shape` is `(samples, contrasts)` (the first chunk is simulated once to learn it)."""

    def __init__(self, estimator: PERK, values: dict, known: dict, chunk: int):
        self.estimator, self.values, self.known, self.chunk = estimator, values, known, chunk
        self.count = next(iter({**values, **known}.values())).shape[0]
        self.subspace = None
        self._first = None

    def _simulate(self, start: int) -> torch.Tensor:
        stop = min(start + self.chunk, self.count)
        piece = Estimator._simulate(self.estimator, {n: v[start:stop] for n, v in self.values.items()},
                                    {n: v[start:stop] for n, v in self.known.items()}, self.chunk)
        return piece if self.subspace is None else Estimator._project(self.estimator, self.subspace, piece,
                                                                      "signals")

    @property
    def shape(self) -> tuple:
        if self._first is None:
            self._first = self._simulate(0)
        return (self.count, self._first.shape[-1])

    def projected(self, subspace) -> _StreamedSignals:
        out = _StreamedSignals(self.estimator, self.values, self.known, self.chunk)
        out.subspace = subspace
        return out

    def pieces(self):
        for start in range(0, self.count, self.chunk):
            yield start, self._simulate(start)
