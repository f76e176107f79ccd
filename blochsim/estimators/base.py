"""`Estimator`, the base of every estimator, and `MatchResult`, what dictionary matching returns.

An estimator turns measured signals into tissue maps. It is trained (`fit`) on signals simulated by its
acquisition, a `Simulator` with every property bound except the unknowns and the separately measured
("known") ones, or on signals and parameters given directly; then `map` reads a volume.

A new method implements two hooks, on torch tensors with one voxel per row:

* `_fit_arrays(signals, parameters, known, *, noise_std)`: `signals` `(N, contrasts)` (complex or real; the
  subspace coefficients when the estimator works in a subspace), `parameters` `(N, P)` float32 (float64 for
  a LookupTable grid) in the order of `unknown` (None when the training carries none), `known` `(N, K)`
  float32 in the order of `known` (None without known properties). `noise_std` is what `fit` was given: the
  hook adds training noise if its method wants it (from `self._generator`, seeded by `fit`'s `seed`), and
  refuses it if it means nothing there.
* `_estimate_arrays(signals, known)`: `signals` `(V, contrasts)` on the volume's device, `known` `(V, K)` or
  None. Returns `{name: (V,)}` or a `(V, P)` tensor (columns in the order of `unknown`). It runs inside the
  call's execution policy (`blochsim._execution.active()` is the one to place work under).
* optionally `_uncertainty_arrays(signals, known)`, the same shapes as `_estimate_arrays`: the standard
  deviation of each map. Without it, uncertainty requests raise NotImplementedError.
"""

from __future__ import annotations

import contextlib
import math
import numbers
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from .. import _distributed, _execution
from .._arrays import library_of, to_library, to_tensor

__all__ = ["Estimator", "MatchResult"]

#: Training samples drawn when no value array says how many.
DEFAULT_SAMPLES = 10000


@dataclass(frozen=True)
class MatchResult:
    """The best `top_k` atoms of each voxel, best first.

    `parameters` `(..., k, P)`: the unknowns of each atom, in the order of the matcher's `unknown` (None when
    the atoms carry no parameters). `indices` `(..., k)` int64: the atoms' rows in the dictionary. `scores`
    `(..., k)`: the normalised correlation `|<d,s>| / (|d| |s|)` in [0, 1], with `<d,s> = sum(conj(d) s)`.
    `scales` `(..., k)`: the complex least-squares amplitude `<d,s> / |d|^2` (proton density times receive
    phase). `densities` `(..., k)`: `|scales|`, the proton density. Leading axes are the volume's voxel axes.
    """

    parameters: Any
    indices: Any
    scores: Any
    scales: Any
    densities: Any


def _names_of(mapping) -> tuple:
    return tuple(mapping) if mapping is not None else ()


class Estimator(torch.nn.Module):
    """Base class of the estimators: fit on simulated (or given) training signals, then map volumes.

    `Estimator(acquisition=None)`: `acquisition` is a `Simulator` with every property bound except the
    unknowns and the known (separately measured) ones; it simulates the training signals.

    `fit(unknown=None, *, known=None, noise_std=0.0, rank=None, subspace=None, seed=None, samples=None,
    chunk=4096, signals=None, parameters=None, **ranges)` records the unknowns and trains. Unknowns come as
    `unknown={name: (low, high) | values}` or as keywords (`T1=(200, 3000)`): a pair is drawn uniformly, a 1-D
    array is used as given, and their order is the order of the maps. `known` properties are given the same
    way; their measured maps are passed again to `map`. `samples` defaults to the length of the value arrays,
    else 10000; training signals are simulated `chunk` voxels at a time (under the active execution policy).
    `noise_std` is the SD of Gaussian noise on the real and imaginary parts, in signal units (a relaxed voxel
    is 1). `rank=r` fits a `Subspace` to the training signals and the estimator works in its coefficients;
    `subspace=` uses a given one. `signals` `(N, contrasts)` and `parameters` (`{name: (N,)}` or `(N, P)`)
    replace simulation; with a bare `(N, P)` array, `map` returns a tensor of columns `(..., P)`.

    `map(volume, known=None, *, uncertainty=False, execution=None)` (also `forward`): `volume` `(..., contrasts)`
    in NumPy, CuPy or torch; leading axes are voxels. Returns `{name: (...)}` (or `(..., P)` without names) in
    the volume's array library, on its device; with `uncertainty=True`, `(maps, standard deviations)`.
    `known={name: map}` gives each known property per voxel (shape `volume.shape[:-1]`, or a scalar).
    `execution`: a placement policy for this call (`blochsim.execution(...)`, "cpu", a CUDA device).

    Inside `blochsim.distributed()` (every rank calling with the same inputs), `map` runs each rank's
    contiguous range of the voxels and all-gathers the maps (`gather=False`: each rank gets its own voxels,
    flattened to one axis, and `blochsim.shard_of` says which). `fit` simulates each rank's range of the
    training samples and trains every rank on all of them (all-gathered), or, for an estimator that sums over
    samples (PERK), trains each rank on its own range and sums over the ranks. Without a `seed` the ranks
    take rank 0's.
    """

    #: Under `distributed()`, each rank trains on its own range of the training samples and `_fit_arrays` sums
    #: over the ranks (`_training_share` gives the block and the range), instead of all ranks training on all.
    _trains_on_shares = False

    def __init__(self, acquisition=None):
        super().__init__()
        self.acquisition = acquisition
        self.noise_std = 0.0
        self.rank = None
        self.seed = None
        self._unknown: tuple = ()
        self._known: tuple = ()
        self._subspace = None
        self._trained = False
        self._contrasts: int | None = None  # signal length the estimator was trained on (before projection)
        self._named = True  # False: trained on a bare parameter array, maps are columns
        self._generator: torch.Generator | None = None  # seeded from fit's `seed`, for the hooks
        self._training_share: TrainingShare | None = None  # inside fit under distributed()

    # -- read-only members ------------------------------------------------------------------------
    @property
    def unknown(self) -> tuple:
        """The unknowns' names, in the order of the maps."""
        return self._unknown

    @property
    def known(self) -> tuple:
        """The known properties' names, in the order `map` expects their maps."""
        return self._known

    @property
    def subspace(self):
        """The `Subspace` the estimator works in, or None."""
        return self._subspace

    @property
    def trained(self) -> bool:
        """Whether `fit` has run (or the estimator was given its training another way)."""
        return self._trained

    @property
    def fitted(self) -> bool:
        return self._trained

    # -- training ---------------------------------------------------------------------------------
    def fit(self, unknown=None, *, known=None, noise_std=0.0, rank=None, subspace=None, seed=None, samples=None,
            chunk=4096, signals=None, parameters=None, **ranges) -> Estimator:
        """Train on simulated (or given) signals; see the class docstring. Returns self."""
        kind = type(self).__name__
        unknown = self._merge_unknown(unknown, ranges)
        known = dict(known) if known is not None else {}
        if not isinstance(known, Mapping):
            raise ValueError(f"{kind}.fit: known must be a mapping {{name: (low, high) | values}}, got {known!r}")
        both = [n for n in unknown if n in known]
        if both:
            raise ValueError(f"{kind}.fit: {both[0]!r} is given both as unknown and as known; a property is one or "
                             "the other")
        if rank is not None and subspace is not None:
            raise ValueError(f"{kind}.fit: give rank= (fit a subspace to the training signals) or subspace= (use "
                             "this one), not both")
        if rank is not None and (isinstance(rank, bool) or not isinstance(rank, int) or rank < 1):
            raise ValueError(f"{kind}.fit: rank must be a positive integer, got {rank!r}")
        noise_std = float(noise_std)
        if not math.isfinite(noise_std) or noise_std < 0:
            raise ValueError(f"{kind}.fit: noise_std must be >= 0 (signal units), got {noise_std!r}")
        if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1:
            raise ValueError(f"{kind}.fit: chunk must be a positive integer (voxels per simulation), got {chunk!r}")
        if samples is not None and (isinstance(samples, bool) or not isinstance(samples, int) or samples < 1):
            raise ValueError(f"{kind}.fit: samples must be a positive integer, got {samples!r}")

        self.seed = seed
        block = _distributed.current()
        drawn = seed if seed is not None else int(torch.seed() % 2**63)
        if block is not None and seed is None:  # every rank draws the training set rank 0 draws
            drawn = block.gather_objects(drawn, what=f"{kind}.fit's seed")[0]
        generator = torch.Generator().manual_seed(drawn)
        try:
            with _distributed.suspended() if block is not None else contextlib.nullcontext():
                self._fit_body(block, unknown, known, rank, subspace, noise_std, samples, chunk, signals,
                               parameters, generator)
        finally:
            self._training_share = None
        self._trained = True
        return self

    def _fit_body(self, block, unknown, known, rank, subspace, noise_std, samples, chunk, signals, parameters,
                  generator) -> None:
        """The body of `fit` (inside a `distributed()` block: with the block suspended, `block` given)."""
        kind = type(self).__name__
        if signals is not None:
            signals, parameters, names, known_values, known_names = self._given_training(
                signals, parameters, unknown, known)
            if block is not None:
                signals, parameters, known_values = self._share_given(block, signals, parameters, known_values)
        else:
            if self.acquisition is None:
                raise RuntimeError(f"{kind}.fit needs training signals: give signals= (and parameters=), or build "
                                   f"the estimator with an acquisition, {kind}(acquisition=MRFSimulator(...))")
            if parameters is not None:
                raise ValueError(f"{kind}.fit: parameters= goes with signals=; without signals, give the unknowns "
                                 "as ranges or value arrays (T1=(200, 3000))")
            if not unknown:
                raise ValueError(f"{kind}.fit: name at least one unknown, e.g. fit(T1=(200, 3000), T2=(10, 300)) "
                                 "or fit(unknown={'T1': values})")
            values, known_draws = self._training_values(unknown, known, samples, generator)
            if block is None:
                signals = self._simulate(values, known_draws, chunk)
            else:
                values, known_draws, signals = self._simulate_on_ranks(block, values, known_draws, chunk)
            names, known_names = tuple(values), tuple(known_draws)
            parameters = torch.stack([values[n] for n in names], dim=-1)
            known_values = torch.stack([known_draws[n] for n in known_names], dim=-1) if known_names else None

        self._contrasts = signals.shape[-1]
        self.rank = rank
        if rank is not None and self._training_share is not None:
            raise ValueError(f"{kind}.fit inside blochsim.distributed() trains each rank on its own samples, so it "
                             "cannot fit a subspace to all of them (rank=); fit one first (blochsim.Subspace.fit) "
                             "and give subspace=")
        if rank is not None:
            from ..subspace import Subspace

            subspace = Subspace.fit(signals, rank)
        if subspace is not None:
            signals = self._project(subspace, signals, "signals")
        self._subspace = subspace
        self.noise_std = noise_std
        self._unknown, self._known = names, known_names
        self._generator = generator  # the hooks' random numbers (training noise), seeded from `seed`
        self._fit_arrays(signals, parameters, known_values, noise_std=noise_std)

    def _simulate_on_ranks(self, block, values: dict, known: dict, chunk: int) -> tuple:
        """(values, known, signals) to train on under `distributed()`: each rank simulates its range of the
        samples; the ranks' signals are all-gathered, or, with `_trains_on_shares`, each keeps its range."""
        kind = type(self).__name__
        total = self._share(block, {**values, **known})
        start, stop = self._training_share.start, self._training_share.stop
        mine = {n: v[start:stop] for n, v in values.items()}, {n: v[start:stop] for n, v in known.items()}
        signals = self._simulate(*mine, chunk)
        if self._trains_on_shares:
            return *mine, signals
        self._training_share = None  # every rank trains on every sample (the same on every rank)
        return values, known, block.gather_rows(signals, total, what=f"gather of {kind}.fit's training signals")

    def _share_given(self, block, signals, parameters, known) -> tuple:
        """Given training under `distributed()`: every rank's, or with `_trains_on_shares` its range's rows."""
        self._share(block, {"signals": signals, "parameters": parameters, "known": known})
        if not self._trains_on_shares:
            self._training_share = None
            return signals, parameters, known
        rows = slice(self._training_share.start, self._training_share.stop)
        return signals[rows], None if parameters is None else parameters[rows], None if known is None else known[rows]

    def _share(self, block, training: dict) -> int:
        """Check the training set is identical on every rank, note this rank's range of it
        (`_training_share`); returns the sample count."""
        kind = type(self).__name__
        block.check_same(f"{kind}.fit", training)
        total = next(v for v in training.values() if v is not None).shape[0]
        if total < block.world:
            raise ValueError(f"{kind}.fit inside blochsim.distributed(): {total} training samples for {block.world} "
                             "ranks; give at least one sample per rank")
        self._training_share = TrainingShare(block, *block.voxel_range(total), total)
        return total

    def _merge_unknown(self, unknown, ranges) -> dict:
        kind = type(self).__name__
        if unknown is None:
            merged = {}
        elif isinstance(unknown, Mapping):
            merged = dict(unknown)
        elif isinstance(unknown, (list, tuple)) and all(isinstance(n, str) for n in unknown):
            merged = {n: None for n in unknown}  # names only: columns of a given parameter array
        else:
            raise ValueError(f"{kind}.fit: unknown must be a mapping {{name: (low, high) | values}} or a list of "
                             f"names, got {unknown!r}")
        for name, value in ranges.items():
            if name in merged:
                raise ValueError(f"{kind}.fit: {name!r} is given twice, in unknown= and as a keyword")
            merged[name] = value
        return merged

    def _given_training(self, signals, parameters, unknown: dict, known: dict):
        """(signals, parameters, names, known values, known names) from fit(signals=..., parameters=...)."""
        kind = type(self).__name__
        signals = to_tensor(signals, name="signals")
        if signals.dim() != 2:
            raise ValueError(f"{kind}.fit: signals must be (samples, contrasts), got shape {tuple(signals.shape)}")
        count = signals.shape[0]
        names: tuple = tuple(unknown)
        self._named = True
        if parameters is None:
            table = None
            if names:
                raise ValueError(f"{kind}.fit: with signals=, give the unknowns' values as parameters= "
                                 f"({{name: (samples,)}} or (samples, P)); got names {names} without values")
        elif isinstance(parameters, Mapping):
            if names and tuple(parameters) != names:
                raise ValueError(f"{kind}.fit: parameters names {tuple(parameters)} differ from the unknowns "
                                 f"{names}")
            names = tuple(parameters)
            columns = [self._column(parameters[n], f"parameters[{n!r}]", count) for n in names]
            table = torch.stack(columns, dim=-1)
        else:
            table = to_tensor(parameters, name="parameters").to(torch.float32)
            if table.dim() == 1:
                table = table[:, None]
            if table.dim() != 2 or table.shape[0] != count:
                raise ValueError(f"{kind}.fit: parameters must be (samples, P) with samples = {count} (the rows of "
                                 f"signals), got shape {tuple(table.shape)}")
            if names and len(names) != table.shape[1]:
                raise ValueError(f"{kind}.fit: {len(names)} unknown names {names} for {table.shape[1]} parameter "
                                 "columns")
            self._named = bool(names)
        known_names = tuple(known)
        known_values = None
        if known_names:
            known_values = torch.stack([self._column(known[n], f"known[{n!r}]", count) for n in known_names], -1)
        return signals, table, names, known_values, known_names

    @staticmethod
    def _column(value, name: str, count: int) -> torch.Tensor:
        t = to_tensor(value, name=name)
        if t.dim() != 1 or t.shape[0] != count:
            raise ValueError(f"{name} must be a 1-D array of {count} values (one per training signal), got shape "
                             f"{tuple(t.shape)}")
        return t.detach().to(torch.float32).cpu()

    def _training_values(self, unknown: dict, known: dict, samples, generator) -> tuple:
        """({unknown: (N,)}, {known: (N,)}) training values: pairs drawn uniformly, arrays as given."""
        lengths = {}
        for group, specs in (("unknown", unknown), ("known", known)):
            for name, spec in specs.items():
                if spec is None or not _is_pair(spec):
                    lengths[name] = _values(spec, f"{group} {name!r}").shape[0]
        distinct = set(lengths.values())
        if len(distinct) > 1:
            raise ValueError(f"{type(self).__name__}.fit: the value arrays have different lengths {lengths}; give "
                             "arrays of one length (one entry per training signal), or ranges (low, high)")
        count = samples if samples is not None else (distinct.pop() if distinct else DEFAULT_SAMPLES)
        if lengths and count != next(iter(lengths.values())):
            raise ValueError(f"{type(self).__name__}.fit: samples={samples} but the value arrays hold "
                             f"{next(iter(lengths.values()))} values each")

        def draw(specs: dict, group: str) -> dict:
            out = {}
            for name, spec in specs.items():
                if _is_pair(spec):
                    if len(spec) != 2 or not all(isinstance(v, numbers.Real) for v in spec):
                        raise ValueError(f"{type(self).__name__}.fit: the range of {group} {name!r} must be a pair "
                                         f"(low, high) (a tuple; give other values as a list or array), got {spec!r}")
                    low, high = (float(v) for v in spec)
                    if not (math.isfinite(low) and math.isfinite(high) and low <= high):
                        raise ValueError(f"{type(self).__name__}.fit: the range of {group} {name!r} must be a pair "
                                         f"(low, high) of finite numbers with low <= high, got {spec!r}")
                    out[name] = low + (high - low) * torch.rand(count, generator=generator)
                else:
                    out[name] = _values(spec, f"{group} {name!r}")
            return out

        return draw(unknown, "unknown"), draw(known, "known")

    def _simulate(self, values: dict, known: dict, chunk: int) -> torch.Tensor:
        """Training signals `(N, contrasts)` from the acquisition, `chunk` voxels at a time."""
        every = {**values, **known}
        count = next(iter(every.values())).shape[0]
        parts = []
        for start in range(0, count, chunk):
            piece = {n: v[start:start + chunk] for n, v in every.items()}
            parts.append(_as_rows(self.acquisition.simulate(**piece), min(chunk, count - start), "the acquisition"))
        return torch.cat(parts) if len(parts) > 1 else parts[0]

    def _project(self, subspace, signals: torch.Tensor, name: str) -> torch.Tensor:
        contrasts = getattr(subspace, "contrasts", None)
        if contrasts is not None and signals.shape[-1] != contrasts:
            raise ValueError(f"{type(self).__name__}: {name} have {signals.shape[-1]} contrasts, the subspace "
                             f"{contrasts}")
        return subspace.project(signals)

    # -- hooks ------------------------------------------------------------------------------------
    def _fit_arrays(self, signals, parameters, known, *, noise_std) -> None:
        raise NotImplementedError(f"{type(self).__name__} does not implement _fit_arrays")

    def _estimate_arrays(self, signals, known):
        raise NotImplementedError(f"{type(self).__name__} does not implement _estimate_arrays")

    def _uncertainty_arrays(self, signals, known):
        raise NotImplementedError(
            f"{type(self).__name__} states no uncertainty; PERK and NonlinearLeastSquares do "
            "(map(..., uncertainty=True) or uncertainty_of)")

    # -- mapping ----------------------------------------------------------------------------------
    def map(self, volume, known=None, *, uncertainty=False, execution=None):
        """Maps of the unknowns from `volume` `(..., contrasts)`; see the class docstring."""
        return self._read(volume, known, uncertainty=uncertainty, execution=execution, project=True)

    def forward(self, volume, known=None, *, uncertainty=False, execution=None):
        return self.map(volume, known, uncertainty=uncertainty, execution=execution)

    def uncertainty_of(self, volume, known=None, *, execution=None):
        """The standard deviation of each map at `volume`, shaped like `map`'s maps."""
        return self._read(volume, known, uncertainty="only", execution=execution, project=True)

    def from_coefficients(self, coefficients, known=None, *, execution=None):
        """`map` of subspace coefficients `(..., rank)`: skips the projection onto `subspace`."""
        if self._subspace is None and self._trained:
            raise ValueError(f"{type(self).__name__}.from_coefficients: this estimator works in no subspace; "
                             "call map on the signals")
        return self._read(coefficients, known, uncertainty=False, execution=execution, project=False)

    def _read(self, volume, known, *, uncertainty, execution, project: bool):
        kind = type(self).__name__
        if not self._trained:
            raise RuntimeError(f"{kind} is not trained: call fit(...) first (with ranges of the unknowns and an "
                               "acquisition, or with signals= and parameters=)")
        policy = _execution.as_policy(execution)
        library = library_of(volume)
        if library is None and known:
            library = next((library_of(v) for v in known.values() if library_of(v)), None)
        signals = to_tensor(volume, name="volume")
        if signals.dim() < 1:
            raise ValueError(f"{kind}.map: volume must be (..., contrasts), got a scalar")
        voxel_shape = tuple(signals.shape[:-1])
        signals = signals.reshape(-1, signals.shape[-1])
        expected = self._contrasts if project else (self._subspace.rank if self._subspace is not None else None)
        if expected is not None and signals.shape[-1] != expected:
            what = "contrasts" if project else "subspace coefficients"
            hint = " (subspace coefficients go to from_coefficients)" if (
                project and self._subspace is not None and signals.shape[-1] == self._subspace.rank) else ""
            raise ValueError(f"{kind}.map: volume has {signals.shape[-1]} {what} along its last axis, the "
                             f"estimator was trained on {expected}{hint}")
        _check_finite(signals, "volume", voxel_shape)
        known_values = self._known_columns(known, voxel_shape, signals.device)

        def per_voxel(signals, known=None):
            with _execution.applied(policy):
                if project and self._subspace is not None:
                    signals = self._project(self._subspace, signals, "volume")
                if uncertainty == "only":
                    return self._uncertainty_arrays(signals, known)
                maps = self._estimate_arrays(signals, known)
                return (maps, self._uncertainty_arrays(signals, known)) if uncertainty else maps

        voxels = {"signals": signals} if known_values is None else {"signals": signals, "known": known_values}
        out = _distributed.map_voxels(per_voxel, voxels, where=f"{kind}.map")
        shard, shape = _voxel_shard(signals.shape[0], voxel_shape)
        if uncertainty and uncertainty != "only":
            out = tuple(self._shaped(part, shape, library, signals.device) for part in out)
        else:
            out = self._shaped(out, shape, library, signals.device)
        return out if shard is None else _distributed.mark(out, shard)

    def _known_columns(self, known, voxel_shape: tuple, device) -> torch.Tensor | None:
        kind = type(self).__name__
        known = dict(known) if known is not None else {}
        extra = [n for n in known if n not in self._known]
        if extra:
            raise ValueError(f"{kind}.map: known map {extra[0]!r} was not known at fit; it takes "
                             f"{list(self._known) or 'no known maps'}")
        missing = [n for n in self._known if n not in known]
        if missing:
            raise ValueError(f"{kind}.map needs the measured map of {missing[0]!r} (known at fit): "
                             f"map(volume, known={{{missing[0]!r}: ...}})")
        if not self._known:
            return None
        count = math.prod(voxel_shape)
        columns = []
        for name in self._known:
            value = to_tensor(known[name], name=f"known[{name!r}]").detach()
            if value.numel() == 1:
                value = value.reshape(1).expand(count)
            elif value.numel() != count:
                raise ValueError(f"{kind}.map: known[{name!r}] has shape {tuple(value.shape)} ({value.numel()} "
                                 f"voxels), the volume {voxel_shape} ({count} voxels)")
            value = value.reshape(count).to(device=device, dtype=torch.float32)
            _check_finite(value[:, None], f"known[{name!r}]", voxel_shape)
            columns.append(value)
        return torch.stack(columns, dim=-1)

    def _shaped(self, result, voxel_shape: tuple, library, device):
        """The hook's `{name: (V,)}` or `(V, P)` as maps of `voxel_shape` in `library`, on `device`."""
        if isinstance(result, Mapping):
            out = {n: v.reshape(voxel_shape).to(device) for n, v in result.items()}
        elif result.dim() == 1:  # one value per voxel (atom indices, say)
            return to_library(result.reshape(voxel_shape).to(device), library)
        elif self._named and self._unknown and result.shape[-1] == len(self._unknown):
            out = {n: result[:, i].reshape(voxel_shape).to(device) for i, n in enumerate(self._unknown)}
        else:
            return to_library(result.reshape(*voxel_shape, result.shape[-1]).to(device), library)
        return {n: to_library(v, library) for n, v in out.items()}


@dataclass(frozen=True)
class TrainingShare:
    """Inside `fit` under `distributed()`: the block, and this rank's samples [start, stop) of `total`."""

    block: Any
    start: int
    stop: int
    total: int


def _voxel_shard(count: int, voxel_shape: tuple) -> tuple:
    """(Shard, shape) of the maps of `count` voxels inside the active `distributed()` block: the whole
    `voxel_shape`, or with gather=False this rank's voxels flattened to one axis; (None, voxel_shape) outside."""
    block = _distributed.current()
    if block is None:
        return None, voxel_shape
    if block.gather:
        return _distributed.Shard(0, count, count), voxel_shape
    start, stop = block.voxel_range(count)
    return _distributed.Shard(start, stop, count), (stop - start,)


def _own_voxels(values, volume):
    """Per-voxel inputs beside the volume (`{name: array}`, each of the volume's voxel count or one value), cut to
    this rank's voxels inside a `distributed()` block (as they are outside one)."""
    block = _distributed.current()
    if block is None or not isinstance(values, Mapping):
        return values
    count = math.prod(tuple(to_tensor(volume, name="volume").shape[:-1]))
    start, stop = block.voxel_range(count)
    out = {}
    for name, value in values.items():
        t = to_tensor(value, name=name)
        out[name] = t.reshape(-1)[start:stop] if t.numel() == count and count > 1 else value
    return out


def _voxel_report(report: dict, voxel_shape: tuple) -> tuple:
    """(report, shape) of per-voxel arrays a map left on the estimator (this rank's voxels inside a
    `distributed()` block): all-gathered into `voxel_shape` (gather=True), or this rank's own, flat."""
    block = _distributed.current()
    if block is None:
        return report, voxel_shape
    count = math.prod(voxel_shape)
    if not block.gather:
        start, stop = block.voxel_range(count)
        return report, (stop - start,)
    return {name: block.gather_rows(value, count, what=f"gather of the map's {name}")
            for name, value in report.items()}, voxel_shape


def _is_pair(spec) -> bool:
    """A tuple is a range (low, high); lists and arrays are values."""
    return isinstance(spec, tuple)


def _values(spec, name: str) -> torch.Tensor:
    """A 1-D float32 tensor of given training values (a list or any array), or ValueError."""
    if spec is None:
        raise ValueError(f"{name}: give a range (low, high) or an array of values")
    if isinstance(spec, numbers.Number):
        raise ValueError(f"{name} must be a range (low, high) or a 1-D array of values, got {spec!r}")
    t = to_tensor(spec, name=name)
    if t.dim() != 1 or t.numel() == 0:
        raise ValueError(f"{name} must be a range (low, high) or a non-empty 1-D array of values, got shape "
                         f"{tuple(t.shape)}")
    t = t.detach().to(torch.float32).cpu()
    _check_finite(t[:, None], name, (t.shape[0],))
    return t


def _as_rows(signal, count: int, source: str) -> torch.Tensor:
    """A simulation result as `(count, contrasts)` rows: a train axis (first) joins the contrasts."""
    signal = to_tensor(signal, name="signal")
    if signal.dim() == 1 and signal.shape[0] == count:
        return signal[:, None]
    if signal.dim() == 2 and signal.shape[0] == count:
        return signal
    if signal.dim() == 3 and signal.shape[1] == count:  # (trains, voxels, samples)
        return signal.movedim(0, 1).reshape(count, -1)
    raise ValueError(f"{source} returned shape {tuple(signal.shape)} for {count} voxels; an estimator needs "
                     f"({count}, contrasts) or (trains, {count}, samples)")


def _check_finite(values: torch.Tensor, name: str, voxel_shape: tuple) -> None:
    """ValueError naming `name`, the count and the first voxel of `values` `(V, ...)` holding NaN or inf."""
    finite = torch.isfinite(values) if not values.is_complex() else torch.isfinite(torch.view_as_real(values))
    finite = finite.reshape(values.shape[0], -1).all(dim=-1)
    if bool(finite.all()):
        return
    bad = (~finite).nonzero()[:, 0]
    first = np.unravel_index(int(bad[0]), voxel_shape) if voxel_shape else ()
    raise ValueError(f"{name} holds NaN or inf in {bad.numel()} voxel(s), the first at index "
                     f"{tuple(int(i) for i in first)}; mask those voxels out (or set them to 0) before mapping")
