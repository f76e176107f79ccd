"""`DictionaryMatcher`: each voxel takes the parameters of the simulated atom its signal correlates best with."""

from __future__ import annotations

import torch

from .. import _distributed, _execution
from .._arrays import library_of, to_library, to_tensor
from .._progress import progress_bar
from . import _matching as mt
from ._placement import budget_bytes, run_device, stage
from .base import Estimator, MatchResult, _check_finite, _is_pair, _values, _voxel_shard

__all__ = ["DictionaryMatcher"]


def _positive_or_none(name: str, value):
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise ValueError(f"DictionaryMatcher: {name} must be a positive integer or None, got {value!r}")
    return value


class DictionaryMatcher(Estimator):
    """Dictionary matching (Ma 2013): the atom with the largest normalised correlation, and its amplitude.

    `DictionaryMatcher(acquisition=None, *, dictionary=None, parameters=None, query_chunk_size=None,
    dictionary_chunk_size=None, top_k=1, groups=None, prune=5e-3)`.

    The score of atom `d` for signal `s` is `|<d,s>| / (|d| |s|)` with `<d,s> = sum(conj(d) s)`; the complex
    least-squares amplitude is `<d,s> / |d|^2` (proton density times receive phase) and the density is its
    magnitude. `map` returns the unknowns of the best atom plus `M0`, its density (the atom indices instead,
    `(...)` int64, when the atoms carry no parameters). `match(signals)` returns a `MatchResult` of the best
    `top_k` atoms, best first. Inside `blochsim.distributed()` both split the voxels over the ranks (see
    `Estimator`), and `fit` simulates each rank's range of the atoms and gathers them on every rank.

    The dictionary is simulated by `fit` (`fit(T1=t1_values, T2=t2_values)`: equal-length arrays, one atom
    per entry, or ranges drawn uniformly) or given: `dictionary` `(atoms, contrasts)` with `parameters`
    (`{name: (atoms,)}` or `(atoms, P)`). `fit(rank=r)` compresses atoms and voxels to the leading `r`
    singular vectors of the dictionary (a `Subspace`) and matches there.

    Known properties (a separately measured B1 map, say): `fit(..., known={"B1": values})` simulates every
    atom at every combination of the given known values, and `map(volume, known={"B1": b1_map})` matches each
    voxel only against the atoms at the nearest known values. A voxel further than half a grid step beyond the
    ends of the known values raises ValueError.

    Grouped matching (`groups=G`): the atoms (of each known set) are clustered into G groups, each with a
    centre and angular radius, a representative atom and a truncated in-group basis; a voxel scores the
    representatives and two bounds per group first (the cone around the centre, and the norm of its projection
    on the basis plus the basis' residual), and scores exactly only inside groups whose bound reaches
    `(1 - prune)` times the best representative score (the k-th best with `top_k`). Neither bound is below the
    score of a member, so pruning does not lose the best atom; `prune` is extra slack. `grouping` describes the
    groups.

    Memory: voxels and atoms are scored in blocks whose size follows a byte budget (the execution policy's
    `budget_bytes`; else the device's free memory on a GPU; else at most 512 MiB on the host);
    `query_chunk_size` and `dictionary_chunk_size` cap the voxels and atoms of a block. Work runs where the
    volume is (or where the execution policy says), and the dictionary is copied there once.
    """

    def __init__(self, acquisition=None, *, dictionary=None, parameters=None, query_chunk_size=None,
                 dictionary_chunk_size=None, top_k=1, groups=None, prune=5e-3):
        super().__init__(acquisition)
        self.query_chunk_size = _positive_or_none("query_chunk_size", query_chunk_size)
        self.dictionary_chunk_size = _positive_or_none("dictionary_chunk_size", dictionary_chunk_size)
        if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
            raise ValueError(f"DictionaryMatcher: top_k must be a positive integer, got {top_k!r}")
        self.top_k = top_k
        self.groups = _positive_or_none("groups", groups)
        prune = float(prune)
        if not 0.0 <= prune < 1.0:
            raise ValueError(f"DictionaryMatcher: prune must be in [0, 1), got {prune!r}")
        self.prune = prune
        self._grouping = None
        self._banks: dict = {}  # device -> one AtomBank per known set
        self._known_grid: list = []  # per known property: its sorted distinct values
        self._set_of_combination = None  # linear index over the known grid -> known set (-1: no atoms there)
        if dictionary is not None:
            self.fit(signals=dictionary, parameters=parameters)
        elif parameters is not None:
            raise ValueError("DictionaryMatcher: parameters= describes the atoms of dictionary=; give both")

    # -- members ----------------------------------------------------------------------------------
    @property
    def fitted(self) -> bool:
        """Whether a dictionary is held."""
        return self._trained

    @property
    def grouping(self) -> mt.Grouping | None:
        """The groups of grouped matching (`groups=G`), or None."""
        return self._grouping

    @property
    def dictionary(self) -> torch.Tensor | None:
        """The atoms `(atoms, contrasts)` (subspace coefficients after `fit(rank=...)`), or None."""
        return self.atoms if self._trained else None

    # -- training ---------------------------------------------------------------------------------
    def _training_values(self, unknown: dict, known: dict, samples, generator) -> tuple:
        """Unknowns as the base draws them, crossed with every combination of the known values."""
        if "M0" in unknown:
            raise ValueError("DictionaryMatcher.fit: M0 is read from the best atom's amplitude; leave it out of "
                             "the unknowns (the atoms are simulated at M0 = 1)")
        values, _ = super()._training_values(unknown, {}, samples, generator)
        if not known:
            return values, {}
        grids = []
        for name, spec in known.items():
            if _is_pair(spec):
                raise ValueError(f"DictionaryMatcher.fit: known {name!r} must be the values to simulate the "
                                 f"dictionary at (a list or array, e.g. known={{{name!r}: [0.8, 0.9, 1.0, 1.1]}}), "
                                 f"got the range {spec!r}")
            grids.append(torch.unique(_values(spec, f"known {name!r}")))
        combos = torch.cartesian_prod(*grids).reshape(-1, len(grids))
        count = next(iter(values.values())).shape[0]
        values = {n: v.repeat(combos.shape[0]) for n, v in values.items()}
        return values, {n: combos[:, j].repeat_interleave(count) for j, n in enumerate(known)}

    def _fit_arrays(self, signals, parameters, known, *, noise_std) -> None:
        if noise_std:
            raise ValueError("DictionaryMatcher.fit: noise_std adds noise to training signals, which a dictionary "
                             "of exact atoms does not want; PERK trains on noise, NonlinearLeastSquares uses it "
                             "for its standard errors")
        signals = signals.detach()
        norms = signals.norm(dim=-1).double()
        _check_finite(signals, "dictionary", (signals.shape[0],))
        zero = (norms == 0).nonzero()
        if zero.numel():
            raise ValueError(f"dictionary holds {zero.numel()} atom(s) of zero norm, the first at index "
                             f"{int(zero[0, 0])}; a zero atom correlates with nothing: drop it")
        if parameters is not None and parameters.shape[0] != signals.shape[0]:
            raise ValueError(f"DictionaryMatcher: parameters has {parameters.shape[0]} rows, the dictionary "
                             f"{signals.shape[0]} atoms")
        self.register_buffer("atoms", signals, persistent=True)
        self.register_buffer("atom_norms", norms, persistent=True)
        self.register_buffer("atom_parameters", parameters, persistent=True)
        self.register_buffer("atom_known", known, persistent=True)
        sets = self._known_sets(known)
        for s in range(int(sets.max()) + 1):
            size = int((sets == s).sum())
            if size < self.top_k:
                raise ValueError(f"DictionaryMatcher: top_k={self.top_k} but known set {s} holds {size} atom(s)")
        self.register_buffer("atom_set", sets, persistent=True)
        self._banks = {}
        self._grouping = self._group(sets) if self.groups else None

    def _known_sets(self, known) -> torch.Tensor:
        """Per atom, the index of its known-value combination among those present (0 without known)."""
        count = self.atoms.shape[0]
        if known is None:
            self._known_grid, self._set_of_combination = [], None
            return torch.zeros(count, dtype=torch.int64)
        self._known_grid = [torch.unique(known[:, j]) for j in range(known.shape[1])]
        linear = torch.zeros(count, dtype=torch.int64)
        for j, grid in enumerate(self._known_grid):
            linear = linear * grid.numel() + torch.searchsorted(grid, known[:, j].contiguous())
        present, sets = torch.unique(linear, return_inverse=True)
        table = torch.full((int(torch.tensor([g.numel() for g in self._known_grid]).prod()),), -1, dtype=torch.int64)
        table[present] = torch.arange(present.numel())
        self._set_of_combination = table
        return sets

    def _group(self, sets: torch.Tensor) -> mt.Grouping:
        """Cluster every known set's atoms (on the atoms' device)."""
        generator = self._generator if self._generator is not None else torch.Generator().manual_seed(0)
        members, parts = [], []
        for s in range(int(sets.max()) + 1):
            index = (sets == s).nonzero()[:, 0].to(self.atoms.device)  # the clusters' labels live there
            bank = mt.AtomBank(self.atoms[index], self.atom_norms[index], index)
            unit = bank.unit_atoms(bank.rows).to(torch.complex64 if bank.complex else torch.float32)
            found = mt.build_grouping(unit, self.groups, generator)
            labels = found["labels"]
            order = labels.argsort(stable=True)
            members += list(index[order].split(torch.bincount(labels, minlength=found["centres"].shape[0]).tolist()))
            found["representative"] = index[found["representative"]]
            found["known_set"] = torch.full((found["centres"].shape[0],), s, dtype=torch.int64)
            parts.append(found)
        R = max(f["bases"].shape[2] for f in parts)
        dtype = torch.complex64 if any(f["bases"].is_complex() for f in parts) else torch.float32

        def joined(key, pad=False):
            if pad:
                return torch.cat([torch.nn.functional.pad(f[key].to(dtype), (0, R - f[key].shape[2])) for f in parts])
            return torch.cat([f[key].to(dtype) if key == "centres" else f[key] for f in parts])

        return mt.Grouping(members=tuple(members), representative=joined("representative"),
                           atoms=torch.tensor([m.numel() for m in members]), condition=joined("condition"),
                           compression=self.rank if self._subspace is not None else None,
                           radius_rad=joined("radius_rad"), residual=joined("residual"),
                           known_set=joined("known_set"), centres=joined("centres"), bases=joined("bases", True))

    def _banks_on(self, device: torch.device) -> list:
        """One AtomBank per known set on `device` (built once per device)."""
        if device not in self._banks:
            banks, grouping = [], self._grouping
            sets = self.atom_set
            for s in range(int(sets.max()) + 1):
                index = (sets == s).nonzero()[:, 0]
                bank = mt.AtomBank(stage(self.atoms[index], device), self.atom_norms[index].to(device),
                                   index.to(device))
                if grouping is not None:
                    mine = (grouping.known_set == s).nonzero()[:, 0]
                    local = torch.empty(self.atoms.shape[0], dtype=torch.int64)  # on the host, like `mine`
                    local[index.cpu()] = torch.arange(index.numel())
                    bank.with_groups([local[grouping.members[g].cpu()].to(device) for g in mine.tolist()],
                                     local[grouping.representative[mine].cpu()].to(device),
                                     grouping.centres[mine].to(device), grouping.radius_rad[mine].to(device),
                                     grouping.bases[mine].to(device), grouping.residual[mine].to(device))
                banks.append(bank)
            self._banks[device] = banks
        return self._banks[device]

    # -- matching ---------------------------------------------------------------------------------
    def _route(self, known: torch.Tensor | None, count: int) -> torch.Tensor:
        """Per voxel, the known set it is matched in (ValueError for a value off the known grid)."""
        if not self._known_grid:
            return torch.zeros(count, dtype=torch.int64)
        known = known.detach().cpu()
        linear = torch.zeros(count, dtype=torch.int64)
        for j, (name, grid) in enumerate(zip(self._known, self._known_grid, strict=True)):
            v = known[:, j].to(grid.dtype)
            nearest = (v[:, None] - grid[None, :]).abs().argmin(dim=1) if grid.numel() < 64 else _nearest(v, grid)
            step = float((grid[1:] - grid[:-1]).min()) if grid.numel() > 1 else 0.0
            slack = 0.5 * step + 1e-6 * float(grid.abs().max())
            off = (v < grid[0] - slack) | (v > grid[-1] + slack)
            if bool(off.any()):
                first = int(off.nonzero()[0, 0])
                raise ValueError(f"known[{name!r}] has {int(off.sum())} voxel(s) outside the dictionary's values "
                                 f"{float(grid[0]):g}..{float(grid[-1]):g} (by more than half a step), the first "
                                 f"the voxel at flat index {first} with {float(v[first]):g}; simulate the "
                                 "dictionary over a wider range of known values")
            linear = linear * grid.numel() + nearest
        sets = self._set_of_combination[linear]
        missing = (sets < 0).nonzero()
        if missing.numel():
            raise ValueError(f"known maps: the voxel at flat index {int(missing[0, 0])} falls on a combination of "
                             "known values the dictionary holds no atoms for")
        return sets

    def _match(self, signals: torch.Tensor, known: torch.Tensor | None) -> tuple:
        """(indices, inner products <d^,s>, atom norms, signal norms) of the best top_k atoms, on `signals`' device."""
        home, count, k = signals.device, signals.shape[0], self.top_k
        device = run_device(home)
        banks = self._banks_on(device)
        sets = self._route(known, count)
        wide = torch.complex128 if (signals.is_complex() or any(b.complex for b in banks)) else torch.float64
        indices = torch.empty((count, k), dtype=torch.int64, device=home)
        products = torch.empty((count, k), dtype=wide, device=home)
        atom_norms = torch.empty((count, k), dtype=torch.float64, device=home)
        signal_norms = torch.empty(count, dtype=torch.float64, device=home)
        budget = budget_bytes(device)
        with progress_bar(count, desc="blochsim dictionary match", unit="voxel", unit_scale=True,
                          enabled=_execution.active().progress) as bar:
            for s, bank in enumerate(banks):
                voxels = (sets == s).nonzero()[:, 0] if len(banks) > 1 else None
                total = count if voxels is None else voxels.numel()
                width = bank.count if bank.groups is None else max(  # the probes, or the largest group
                    bank.probe_rows.shape[0], max(b - a for a, b in zip(bank.offsets[:-1], bank.offsets[1:],
                                                                          strict=True)))
                per_block, atoms_per_block = _block(bank, width, total, budget, self.query_chunk_size,
                                                    self.dictionary_chunk_size, device)
                for start in range(0, total, per_block):
                    rows = slice(start, min(total, start + per_block))
                    where = rows if voxels is None else voxels[rows].to(home)
                    part = stage(signals[where], device)
                    if bank.groups is None:
                        local = mt.exhaustive_top(bank, part, k, atoms_per_block)
                    else:
                        local = mt.grouped_top(bank, part, k, self.prune, atoms_per_block)
                    found = mt.finish(bank, part, local)
                    for target, value in zip((indices, products, atom_norms, signal_norms), found, strict=True):
                        target[where] = value.to(home, target.dtype)
                    bar.update(rows.stop - rows.start)
        return indices, products, atom_norms, signal_norms

    def _estimate_arrays(self, signals, known):
        indices, products, atom_norms, _ = self._match(signals, known)
        best = indices[:, 0]
        density = (products[:, 0].abs() / atom_norms[:, 0]).to(torch.float32)
        if self.atom_parameters is None:
            return best
        table = self.atom_parameters.to(signals.device)[best]
        if not self._named:
            return torch.cat([table, density[:, None]], dim=1)
        maps = {n: table[:, j] for j, n in enumerate(self._unknown)}
        maps["M0"] = density
        return maps

    def match(self, signals, known=None, *, execution=None) -> MatchResult:
        """The best `top_k` atoms of each voxel of `signals` `(..., contrasts)`, as a `MatchResult` in the
        signals' array library (fields `(..., top_k)`; `parameters` `(..., top_k, P)`)."""
        if not self._trained:
            raise RuntimeError("DictionaryMatcher.match needs a dictionary: call fit(...) (with an acquisition and "
                               "ranges or values of the unknowns) or build it with dictionary=")
        library = library_of(signals)
        s = to_tensor(signals, name="signals")
        if s.dim() < 1 or s.shape[-1] != self._contrasts:
            raise ValueError(f"DictionaryMatcher.match: signals must be (..., {self._contrasts}) (the dictionary's "
                             f"contrasts), got shape {tuple(s.shape)}")
        voxel_shape = tuple(s.shape[:-1])
        flat = s.reshape(-1, s.shape[-1])
        _check_finite(flat, "signals", voxel_shape)
        known_values = self._known_columns(known, voxel_shape, flat.device)
        policy = _execution.as_policy(execution)

        def per_voxel(signals, known=None):
            with _execution.applied(policy):
                if self._subspace is not None:
                    signals = self._project(self._subspace, signals, "signals")
                return self._match(signals, known)

        voxels = {"signals": flat} if known_values is None else {"signals": flat, "known": known_values}
        found = _distributed.map_voxels(per_voxel, voxels, where="DictionaryMatcher.match")
        shard, voxel_shape = _voxel_shard(flat.shape[0], voxel_shape)  # inside distributed(): maybe a rank's own
        indices, products, atom_norms, signal_norms = found
        narrow = torch.complex64 if products.is_complex() else torch.float32
        scores = (products.abs() / signal_norms.clamp_min(1e-300)[:, None]).to(torch.float32)
        scales = (products / atom_norms).to(narrow)
        parameters = None
        if self.atom_parameters is not None:
            parameters = self.atom_parameters.to(flat.device)[indices].reshape(*voxel_shape, self.top_k, -1)

        def out(x):
            return to_library(x.reshape(*voxel_shape, *x.shape[1:]) if x.dim() else x, library)

        result = MatchResult(parameters=None if parameters is None else to_library(parameters, library),
                             indices=out(indices), scores=out(scores), scales=out(scales),
                             densities=out(scales.abs()))
        return result if shard is None else _distributed.mark(result, shard)

    def _uncertainty_arrays(self, signals, known):
        raise NotImplementedError("DictionaryMatcher states no uncertainty (a dictionary gives the best atom, not "
                                  "its spread); PERK and NonlinearLeastSquares do")


def _nearest(values: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
    """Index of the nearest entry of the sorted `grid` for each value."""
    right = torch.searchsorted(grid, values.contiguous()).clamp(1, grid.numel() - 1)
    left = right - 1
    return torch.where((values - grid[left]).abs() <= (grid[right] - values).abs(), left, right)


def _block(bank, width: int, voxels: int, budget: int, query_cap, atom_cap, device: torch.device) -> tuple:
    """(voxels per block, atoms per block) for a bank whose blocks score `width` columns per voxel (its atoms;
    with groups, the larger of its probes and its largest group)."""
    entries = max(budget // mt.BYTES_PER_SCORE, 1)
    kind = "cuda" if device.type == "cuda" else "cpu"
    if bank.groups is None:
        entries = min(entries, mt.BLOCK_SCORES[kind])
        atoms = max(1, min(bank.count, atom_cap or bank.count, entries // mt.BLOCK_QUERIES[kind]))
        columns = atoms
    else:
        entries = min(entries, mt.MAX_BLOCK_SCORES)
        atoms = max(1, min(width, atom_cap or width))
        columns = width
    if columns > entries:
        raise ValueError(f"DictionaryMatcher: the byte budget ({budget} bytes) holds no block of one voxel against "
                         f"{columns} atoms; give a larger budget_bytes (execution(budget_bytes=...)) or a smaller "
                         "dictionary_chunk_size")
    return max(1, min(voxels, query_cap or voxels, entries // columns)), atoms
