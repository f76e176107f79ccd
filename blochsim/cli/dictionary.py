"""`blochsim dictionary`: a simulator's signals over a grid or a random set of tissues, in chunks, resumable.

The work is cut into chunks of tissues. Each finished chunk is written to `OUT.parts/chunk-NNNNNN.npy`
(to a temporary file first, then moved into place in one step) and only then listed in
`OUT.parts/manifest.json` (rewritten the same way), so whenever a run is killed the manifest lists only
complete chunks. A run that finds the folder resumes: it checks that the manifest was written for the same
request (simulator, protocol, tissues, settings, chunk size, blochsim version), skips the chunks it lists, and
computes the rest. Every chunk is computed from its own tissues alone, so a resumed dictionary equals an
uninterrupted one exactly. At the end the chunks are assembled into OUT (.npz or .h5, written atomically too)
and the folder is removed.

Several processes: launched by torchrun (`torchrun --nproc-per-node N -m blochsim dictionary ...`), rank 0
opens the folder while the others wait; then rank r of W computes every W-th chunk not done (the r-th, the
(r+W)-th, ... of them). Only rank 0 writes the manifest; rank r > 0 lists its chunks in its own
`OUT.parts/done-rank-R.json` (written the same way), which rank 0 merges into the manifest when a run opens
the folder and when every rank has finished. So a killed run of any number of processes resumes in a run of
any number, and its file equals a one-process run's. Rank 0 then assembles OUT. On several nodes OUT must be
on a file system every node sees.

OUT holds `signals` (atoms, samples), `parameters` (atoms, P) float64, `names` (P,) and `metadata` (JSON: the
request). A protocol that makes several trains gives atoms of the trains' samples one after the other.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import time
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
import numpy as np

from .._distributed import distributed, launched
from .._progress import progress_bar
from .._version import __version__
from ._common import plotting, progress_option, reports_errors
from ._files import as_numpy, check_output, to_json, write_atomically
from ._simulators import split_values
from ._values import parse_value
from .simulate import gather_request, request_options

__all__ = ["dictionary", "tissue_set", "MANIFEST", "FORMAT"]

MANIFEST = "manifest.json"
#: Rank r > 0's list of the chunks it wrote, under torchrun (rank 0 lists its own in the manifest).
PROGRESS = "done-rank-{rank}.json"
#: The manifest's format tag: a folder of another format is not resumed.
FORMAT = "blochsim dictionary parts 1"


# -- the tissue set --------------------------------------------------------------------------------------------
def _grid_values(name: str, spec: Any) -> np.ndarray:
    """The values of one grid axis: a number, a list or array, or a flag-syntax string."""
    values = parse_value(spec, name) if isinstance(spec, str) else spec
    values = np.asarray(values, dtype=float).reshape(-1)
    if values.size == 0:
        raise ValueError(f"grid {name}: no values")
    if not np.all(np.isfinite(values)):
        raise ValueError(f"grid {name}: values must be finite, got {values[~np.isfinite(values)][0]}")
    return values


def _random_range(name: str, spec: Any) -> tuple[float, float, bool]:
    """(low, high, log-uniform?) of `LOW:HIGH[:log]` or `[low, high]` / `[low, high, "log"]`."""
    parts = spec.split(":") if isinstance(spec, str) else list(np.asarray(spec, dtype=object).reshape(-1))
    log = len(parts) == 3 and str(parts[2]) == "log"
    try:
        if len(parts) not in (2, 3) or (len(parts) == 3 and not log):
            raise ValueError
        low, high = float(parts[0]), float(parts[1])
    except (TypeError, ValueError):
        raise ValueError(f"range {name}: expected LOW:HIGH or LOW:HIGH:log, got {spec!r}") from None
    if not (np.isfinite(low) and np.isfinite(high) and low < high):
        raise ValueError(f"range {name}: need finite LOW < HIGH, got {low:g}:{high:g}")
    if log and low <= 0:
        raise ValueError(f"range {name}: a log range needs LOW > 0, got {low:g}")
    return low, high, log


def tissue_set(grid: dict, ranges: dict, count: int | None, seed: int) -> tuple[list, np.ndarray, dict]:
    """(names, parameters (atoms, P) float64, description) of a grid or a random set.

    A grid is the Cartesian product of its axes, the first name varying slowest. A random set draws `count`
    tissues, each property uniform (or log-uniform) in its range, from NumPy's PCG64 seeded by `seed`.
    Raises ValueError for neither or both, or a random set without a count.
    """
    if grid and (ranges or count is not None):
        raise ValueError("give either a grid (--grid) or a random set (--random N with --range), not both")
    if grid:
        axes = [_grid_values(name, spec) for name, spec in grid.items()]
        mesh = np.meshgrid(*axes, indexing="ij")
        parameters = np.stack([m.reshape(-1) for m in mesh], axis=-1)
        return list(grid), parameters, {"grid": {n: a for n, a in zip(grid, axes, strict=True)}}
    if ranges:
        if count is None:
            raise ValueError("a random set needs its size: --random N")
        bounds = {name: _random_range(name, spec) for name, spec in ranges.items()}
        rng = np.random.default_rng(seed)
        columns = []
        for low, high, log in bounds.values():
            draw = rng.uniform(np.log(low), np.log(high), count) if log else rng.uniform(low, high, count)
            columns.append(np.exp(draw) if log else draw)
        return list(ranges), np.stack(columns, axis=-1), {
            "random": {"count": count, "seed": seed, "ranges": {n: list(b) for n, b in bounds.items()}}}
    raise ValueError("say which tissues: a grid (--grid T1=200:3000:40:log ...) or a random set "
                     "(--random 10000 --range T1=200:3000:log ...)")


# -- chunks on disk --------------------------------------------------------------------------------------------
def _differences(old: dict, new: dict) -> list:
    return sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))


class Parts:
    """The folder `OUT.parts` of a run: `manifest.json` and the chunk files it lists as complete.

    Opening it resumes an earlier run of the same request (`identity`), refuses one of another request
    (ValueError naming what differs), or starts a new one; `restart` discards what is there first. A listed
    chunk whose file is missing or damaged is dropped from the done set (computed again), and temporary files
    of a killed write are removed. The ranks' progress files are merged into the manifest (`merge`).

    Under torchrun rank 0 opens the folder this way; the other ranks take the manifest it shares (`joined`)
    and list what they write in their own progress files.
    """

    def __init__(self, path: Path, identity: dict, atoms: int, chunk_size: int, *, restart: bool):
        self.path, self.atoms, self.chunk_size = path, atoms, chunk_size
        self.chunks = -(-atoms // chunk_size)
        self.rank = 0
        if restart and path.exists():
            shutil.rmtree(path)
        manifest = self._read() if path.exists() else None
        if manifest is not None and (manifest.get("format") != FORMAT or manifest.get("request") != identity):
            changed = (_differences(manifest.get("request") or {}, identity) if manifest.get("format") == FORMAT
                       else ["format"])
            raise ValueError(f"{path} holds chunks of another request (it differs in: {', '.join(changed)}); "
                             f"run the same command to resume it, or pass --restart to discard it")
        if manifest is None:
            path.mkdir(exist_ok=True)
            manifest = {"format": FORMAT, "request": identity, "atoms": atoms, "chunks": self.chunks, "done": [],
                        "samples": None, "dtype": None}
            self._write(manifest)
        self.manifest = manifest
        self.done = {i for i in manifest["done"] if self._whole(i)}
        self.merge()
        for stray in path.glob(".*.tmp*"):  # temporary files of a run killed while writing
            stray.unlink(missing_ok=True)

    @classmethod
    def joined(cls, path: Path, manifest: dict, atoms: int, chunk_size: int, rank: int) -> Parts:
        """Rank `rank`'s view of the folder rank 0 opened, from the manifest rank 0 shares (nothing is read)."""
        parts = cls.__new__(cls)
        parts.path, parts.atoms, parts.chunk_size, parts.rank = path, atoms, chunk_size, rank
        parts.chunks = -(-atoms // chunk_size)
        parts.manifest, parts.done, parts.mine = manifest, set(manifest["done"]), set()
        return parts

    def merge(self) -> None:
        """Rank 0: add the whole chunks the ranks' progress files list to the manifest, then remove the files
        (a run killed in between merges them again, to the same set)."""
        files = sorted(self.path.glob(PROGRESS.format(rank="*")))
        listed = set()
        for file in files:
            try:
                progress = json.loads(file.read_text())
            except (OSError, json.JSONDecodeError):
                continue  # written whole or not at all: unreadable means not this format, and lists nothing
            if self.manifest["samples"] is None:
                self.manifest["samples"], self.manifest["dtype"] = progress["samples"], progress["dtype"]
            listed.update(progress["done"])
        self.done |= {i for i in listed - self.done if 0 <= i < self.chunks and self._whole(i)}
        if sorted(self.done) != self.manifest["done"]:
            self.manifest["done"] = sorted(self.done)
            self._write(self.manifest)
        for file in files:
            file.unlink(missing_ok=True)

    def rows(self, index: int) -> int:
        """Tissues in chunk `index` (the last one may be short)."""
        return min(self.chunk_size, self.atoms - index * self.chunk_size)

    def file(self, index: int) -> Path:
        return self.path / f"chunk-{index:06d}.npy"

    @property
    def files(self) -> list:
        return [self.file(i) for i in range(self.chunks)]

    def record(self, index: int, block: np.ndarray) -> None:
        """Write chunk `index` (moved into place whole), then list it in the manifest (rank 0) or in this
        rank's progress file (written the same way)."""
        if self.manifest["samples"] is None:
            self.manifest["samples"], self.manifest["dtype"] = int(block.shape[1]), str(block.dtype)
        write_atomically(self.file(index), lambda tmp: np.save(tmp, block))
        self.done.add(index)
        if self.rank == 0:
            self.manifest["done"] = sorted(self.done)
            self._write(self.manifest)
            return
        self.mine.add(index)
        text = json.dumps({"samples": self.manifest["samples"], "dtype": self.manifest["dtype"],
                           "done": sorted(self.mine)})
        write_atomically(self.path / PROGRESS.format(rank=self.rank), lambda tmp: tmp.write_text(text))

    def _read(self) -> dict | None:
        try:
            return json.loads((self.path / MANIFEST).read_text())
        except (OSError, json.JSONDecodeError):
            return None  # no manifest yet (killed before the first one was written): nothing to resume

    def _write(self, manifest: dict) -> None:
        text = json.dumps(manifest, indent=1)
        write_atomically(self.path / MANIFEST, lambda tmp: tmp.write_text(text))

    def _whole(self, index: int) -> bool:
        """Whether a listed chunk file is there, whole, with the shape and dtype the manifest says."""
        try:
            block = np.load(self.file(index), mmap_mode="r", allow_pickle=False)
        except (OSError, ValueError):
            return False
        return block.shape == (self.rows(index), self.manifest["samples"]) and str(block.dtype) == \
            self.manifest["dtype"]


def _atoms(signal: Any, n: int) -> np.ndarray:
    """A chunk's signals as (n, samples): a closed form's (n,) as one sample, trains' (T, n, S) as (n, T*S)."""
    values = as_numpy(signal)
    if values.ndim == 1 and values.shape[0] == n:
        return values[:, None]
    if values.ndim == 2 and values.shape[0] == n:
        return values
    if values.ndim == 3 and values.shape[1] == n:
        return np.moveaxis(values, 0, 1).reshape(n, -1)
    raise ValueError(f"the simulator returned shape {values.shape} for {n} tissues: a dictionary needs "
                     f"(tissues, samples), (tissues,) or (trains, tissues, samples)")


# -- the output ------------------------------------------------------------------------------------------------
def _write_npz(tmp: Path, small: dict, chunks: list, shape: tuple, dtype: np.dtype) -> None:
    """An .npz of `small` arrays plus `signals`, streamed from the chunk files (never whole in memory)."""
    with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_STORED, allowZip64=True) as archive:
        for key, value in small.items():
            with archive.open(f"{key}.npy", "w", force_zip64=True) as f:
                np.lib.format.write_array(f, np.asarray(value), allow_pickle=False)
        with archive.open("signals.npy", "w", force_zip64=True) as f:
            header = {"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": False, "shape": shape}
            np.lib.format.write_array_header_1_0(f, header)
            for path in chunks:
                f.write(np.ascontiguousarray(np.load(path, allow_pickle=False)).tobytes())


def _write_h5(tmp: Path, small: dict, chunks: list, shape: tuple, dtype: np.dtype) -> None:
    import h5py

    with h5py.File(tmp, "w") as f:
        for key, value in small.items():
            if key == "metadata":
                f.attrs["metadata"] = str(value)
            elif key == "names":
                f.create_dataset(key, data=np.asarray(value, dtype=object), dtype=h5py.string_dtype())
            else:
                f.create_dataset(key, data=value)
        signals = f.create_dataset("signals", shape=shape, dtype=dtype)
        start = 0
        for path in chunks:
            block = np.load(path, allow_pickle=False)
            signals[start:start + block.shape[0]] = block
            start += block.shape[0]


@click.command(short_help="Simulate a dictionary over a grid or random tissues (resumable).", epilog="""\b
Examples:
  blochsim dictionary mrf -p flip=5:60:500 -p TR=10 -p TI=20 --states 32 \\
      --grid T1=200:3000:60:log --grid T2=10:300:40:log -o mrf_dictionary.npz
  blochsim dictionary mrf -c mrf.toml --random 100000 --range T1=200:3000:log --range T2=10:300:log \\
      --range B1=0.7:1.3 --seed 1 --chunk-size 8192 -o mrf_random.h5 --plot dictionary.png
\b
Stopped part-way (Ctrl-C, a killed job)? Run the same command again: it resumes at the first chunk not done.
Several processes (one GPU each with --device cuda): torchrun --nproc-per-node 4 -m blochsim dictionary ...
A config file may hold [grid] (NAME = "START:STOP:COUNT[:log]" or a list), [random] (count, seed, and
NAME = "LOW:HIGH[:log]") and [dictionary] (chunk_size), beside simulator, [protocol], [tissue], [settings].
""")
@request_options
@click.option("--grid", "grid_flags", multiple=True, metavar="NAME=VALUES",
              help="A grid axis: START:STOP:COUNT[:log], a list 800,1000,1200, or @values.npy. Repeatable; the "
                   "dictionary is every combination.")
@click.option("--random", "count", type=click.IntRange(min=1), default=None, metavar="N",
              help="A random set of N tissues (with --range).")
@click.option("--range", "range_flags", multiple=True, metavar="NAME=LOW:HIGH[:log]",
              help="A property's range in the random set (log: log-uniform). Repeatable.")
@click.option("--seed", type=int, default=None, help="Seed of the random set (default 0).")
@click.option("--chunk-size", type=click.IntRange(min=1), default=None,
              help="Tissues per chunk (default 4096): the unit of work saved to disk and resumed.")
@click.option("-o", "--output", type=click.Path(dir_okay=False), required=True,
              help="The dictionary file: .npz or .h5 (HDF5, needs h5py).")
@click.option("--restart", is_flag=True, help="Discard the chunks of an earlier run (OUT.parts) and start over.")
@click.option("--overwrite", is_flag=True, help="Replace OUT if it exists.")
@click.option("--keep-chunks", is_flag=True, help="Keep OUT.parts after assembling OUT.")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False), default=None,
              help="Also write a figure of the dictionary (PNG, ...).")
@progress_option
@reports_errors
def dictionary(simulator, config, protocol_flags, tissue_flags, states, repetitions, device, grid_flags, count,
               range_flags, seed, chunk_size, output, restart, overwrite, keep_chunks, plot_path, progress) -> None:
    """Simulate SIMULATOR over a grid or a random set of tissues into a dictionary file, chunk by chunk.

    Fixed tissue properties (-t) must be single values; the varying ones come from --grid or --range.
    """
    out = check_output(output, allowed=(".npz", ".h5", ".hdf5"))
    if plot_path:
        plotting()  # before the work: a missing matplotlib is said at once
    request = gather_request(simulator, config, protocol_flags, tissue_flags, states, repetitions, device,
                             sections=("grid", "random", "dictionary"))
    names, parameters, described, chunk_size = _tissues(request["config"], grid_flags, range_flags, count, seed,
                                                         chunk_size)
    sim = request["class"]()
    _check_fixed(sim, request, names)
    identity = {"blochsim": __version__, "simulator": request["name"], "protocol": request["protocol"],
                "tissue": request["tissue"], "settings": request["settings"], "names": names, "set": described,
                "chunk_size": chunk_size,
                "parameters_sha256": hashlib.sha256(np.ascontiguousarray(parameters).tobytes()).hexdigest()}
    identity = json.loads(to_json(identity))  # the form it has in the manifest, to compare like with like
    folder = out.with_name(out.name + ".parts")
    with launched() as (rank, world):  # (0, 1) without torchrun
        ranks = _Ranks(rank, world)
        parts = None

        def open_parts() -> dict | None:
            nonlocal parts
            if rank > 0:
                return None
            if out.exists() and not overwrite:
                raise FileExistsError(f"{out} exists: pass --overwrite to replace it")
            parts = Parts(folder, identity, parameters.shape[0], chunk_size, restart=restart)
            return parts.manifest

        manifest = ranks.agree("opening the chunk folder", open_parts)  # rank 0's, shared with every rank
        if rank > 0:
            parts = Parts.joined(folder, manifest, parameters.shape[0], chunk_size, rank)
        resumed = len(parts.done)
        if resumed and rank == 0:
            click.echo(f"resuming {parts.path}: {resumed} of {parts.chunks} chunks already done", err=True)

        started = time.perf_counter()
        fixed = {**request["protocol"], **request["tissue"], **request["settings"]}
        ranks.agree("computing its chunks", lambda: _compute(sim, fixed, names, parameters, parts, progress, ranks))
        if rank > 0:
            return
        parts.merge()
        _check_complete(parts)
        metadata = {key: identity[key] for key in ("blochsim", "simulator", "protocol", "tissue", "settings", "set")}
        shape = _assemble(out, parts, parameters, names, metadata)
    figure_atoms = _sample_atoms(parts.files, chunk_size, parts.atoms) if plot_path else None
    if not keep_chunks:
        shutil.rmtree(parts.path)
    processes = "" if world == 1 else f" by {world} processes"
    click.echo(f"{type(sim).__name__} dictionary: {shape[0]} atoms x {shape[1]} samples ({parts.manifest['dtype']}), "
               f"{', '.join(names)}; {parts.chunks - resumed} of {parts.chunks} chunks computed{processes} in "
               f"{time.perf_counter() - started:.1f} s -> {out}")
    if plot_path:
        plot = plotting()
        drawn = "" if shape[0] <= _PLOTTED_ATOMS else f" ({_PLOTTED_ATOMS} drawn)"
        figure = plot.dictionary(figure_atoms, parameters[_sample_rows(shape[0])], names,
                                 title=f"{shape[0]} atoms x {shape[1]} samples{drawn}")
        click.echo(f"figure: {plot.save(figure, plot_path)}")


def _tissues(file: dict, grid_flags: tuple, range_flags: tuple, count: int | None, seed: int | None,
             chunk_size: int | None) -> tuple:
    """(names, parameters, description, chunk size) from the flags over the config file's [grid], [random] and
    [dictionary] tables."""
    grid = {**file.get("grid", {}), **_pairs(grid_flags, "--grid")}
    random_file = dict(file.get("random", {}))
    file_count, file_seed = random_file.pop("count", None), random_file.pop("seed", 0)
    count = count if count is not None else file_count
    seed = seed if seed is not None else int(file_seed)
    ranges = {**random_file, **_pairs(range_flags, "--range")}
    chunk_size = chunk_size or int(file.get("dictionary", {}).get("chunk_size", 4096))
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    return (*tissue_set(grid, ranges, count, seed), chunk_size)


def _check_fixed(sim: Any, request: dict, names: list) -> None:
    """The varying names are tissue properties; the fixed ones (-t) are single values, not also varying."""
    fixed = request["tissue"]
    split_values(sim, request["protocol"], {**fixed, **dict.fromkeys(names, 0.0)})
    for name, value in fixed.items():
        if np.ndim(value) != 0:
            raise ValueError(f"-t {name}: a dictionary's fixed tissue properties are single values, got shape "
                             f"{np.shape(value)}; give a varying property with --grid or --range")
    both = [n for n in names if n in fixed]
    if both:
        raise ValueError(f"{both[0]} is given both as a fixed value (-t) and as a varying one (--grid/--range)")


class _Ranks:
    """The processes of one run: this one alone, or the W ranks torchrun started (`launched()`)."""

    def __init__(self, rank: int, world: int):
        self.rank, self.world = rank, world
        # Not entered: the command splits its work by chunks itself; the block gives the collectives.
        self.block = distributed() if world > 1 else None

    def share(self, todo: list) -> list:
        """This rank's chunks of the chunks `todo`: every W-th, from its rank on (balanced to one chunk)."""
        return todo[self.rank::self.world]

    def agree(self, step: str, work: Callable[[], Any]) -> Any:
        """Run `work()` on every rank and wait for all of them; returns rank 0's value (which must pickle).

        If it raised on any rank, every rank raises: that rank its own error, the others a RuntimeError naming
        the rank and its error. Ctrl-C is not waited for: torchrun passes it to every rank.
        """
        try:
            value, failure = work(), None
        except Exception as error:
            value, failure = None, error
        if self.world == 1:
            if failure is not None:
                raise failure
            return value
        said = None if failure is None else f"{type(failure).__name__}: {failure}"
        everyone = self.block.gather_objects((said, value), what=f"wait for every rank ({step})")
        if failure is not None:
            raise failure
        for rank, (message, _) in enumerate(everyone):
            if message is not None:
                raise RuntimeError(f"rank {rank} of {self.world} failed {step}: {message}")
        return everyone[0][1]


def _compute(sim: Any, fixed: dict, names: list, parameters: np.ndarray, parts: Parts, progress: bool | None,
             ranks: _Ranks) -> None:
    """Simulate and record this rank's chunks of those not done, with a bar over the atoms (on rank 0, over its
    own chunks under torchrun); Ctrl-C says how to resume."""
    mine = ranks.share([i for i in range(parts.chunks) if i not in parts.done])
    alone = ranks.world == 1
    bar = progress_bar(parts.atoms if alone else sum(parts.rows(i) for i in mine),
                       desc="dictionary" if alone else f"dictionary (rank 0 of {ranks.world})", unit="atom",
                       enabled=progress if ranks.rank == 0 else False, unit_scale=True,
                       initial=sum(parts.rows(i) for i in parts.done) if alone else 0)
    try:
        with bar:
            for index in mine:
                lo = index * parts.chunk_size
                hi = lo + parts.rows(index)
                varying = {name: parameters[lo:hi, j] for j, name in enumerate(names)}
                parts.record(index, _atoms(sim.simulate(**fixed, **varying), hi - lo))
                bar.update(hi - lo)
    except KeyboardInterrupt:
        if alone:
            click.echo(f"stopped after {len(parts.done)} of {parts.chunks} chunks (kept in {parts.path}): run the "
                       f"same command again to resume", err=True)
        elif ranks.rank == 0:
            click.echo(f"stopped (the chunks written are kept in {parts.path}): run the same command again, with "
                       f"any number of processes, to resume", err=True)
        raise


def _check_complete(parts: Parts) -> None:
    """Rank 0, after every rank finished: every chunk is listed (a rank's chunks written to a disk rank 0 does
    not see would be missing)."""
    missing = sorted(set(range(parts.chunks)) - parts.done)
    if missing:
        raise RuntimeError(f"{len(missing)} of {parts.chunks} chunks (first: {missing[0]}) are not in {parts.path} "
                           f"although every rank finished: under torchrun on several nodes, OUT must be on a file "
                           f"system every node sees")


def _assemble(out: Path, parts: Parts, parameters: np.ndarray, names: list, metadata: dict) -> tuple:
    """Write OUT (atomically) from the chunk files; returns the shape of its signals."""
    shape, dtype = (parts.atoms, parts.manifest["samples"]), np.dtype(parts.manifest["dtype"])
    small = {"parameters": parameters, "names": np.asarray(names), "metadata": np.asarray(to_json(metadata))}
    writer = _write_npz if out.suffix.lower() == ".npz" else _write_h5
    write_atomically(out, lambda tmp: writer(tmp, small, parts.files, shape, dtype))
    return shape


def _pairs(flags: tuple, option: str) -> dict:
    """{name: text} of NAME=TEXT flags (the text is read by the grid or range parser)."""
    values = {}
    for pair in flags:
        name, sep, text = pair.partition("=")
        if not sep or not name.strip():
            raise click.BadParameter(f"expected NAME=VALUES, got {pair!r}", param_hint=f"'{option}'")
        values[name.strip()] = text.strip()
    return values


#: The dictionary figure draws at most this many atoms.
_PLOTTED_ATOMS = 2000


def _sample_rows(atoms: int) -> np.ndarray:
    return np.unique(np.linspace(0, atoms - 1, min(_PLOTTED_ATOMS, atoms)).round().astype(int))


def _sample_atoms(files: list, chunk_size: int, atoms: int) -> np.ndarray:
    """The atoms `_sample_rows` picks, read from the chunk files without loading them whole."""
    picked, opened = [], {}
    for row in _sample_rows(atoms):
        index, offset = divmod(int(row), chunk_size)
        if index not in opened:
            opened[index] = np.load(files[index], mmap_mode="r", allow_pickle=False)
        picked.append(opened[index][offset])
    return np.stack(picked)
