"""`blochsim match` and `blochsim fit`: an estimator over a saved signal volume to parameter maps (and a PNG).

`match` reads a dictionary written by `blochsim dictionary` (or any .npz/.h5 with `signals` (atoms, samples),
`parameters` (atoms, P) and `names` (P,)) and runs `blochsim.estimators.DictionaryMatcher`; `fit` runs
`blochsim.estimators.NonlinearLeastSquares` on a shipped simulator. Both write one map per unknown plus `M0`
(the proton density, the magnitude of the fitted complex amplitude), shaped like the volume's voxel axes.
"""

from __future__ import annotations

import time
from pathlib import Path

import click
import numpy as np

from ._common import plotting, progress_option, reports_errors
from ._files import as_numpy, check_output, load_array, load_arrays, save_arrays
from ._simulators import split_values
from ._values import parse_assignments
from .simulate import gather_request, request_options

__all__ = ["match", "fit"]


def _volume(path: str) -> np.ndarray:
    """The signal volume `(..., contrasts)` of a file (`file.npz:key` names one of several arrays)."""
    volume = load_array(path, name="VOLUME")
    if volume.ndim < 1 or volume.shape[-1] == 0:
        raise ValueError(f"VOLUME {path}: expected an array (..., contrasts), got shape {volume.shape}")
    if not (np.issubdtype(volume.dtype, np.floating) or np.issubdtype(volume.dtype, np.complexfloating)):
        raise ValueError(f"VOLUME {path}: expected real or complex floats, got {volume.dtype}")
    return volume


def _policy(device: str | None, progress: bool | None):
    """The execution policy of a map: where (None: where the volume is, the host) and whether to show a bar."""
    from .. import execution

    return execution(device or "auto", progress=progress)


def _write_maps(output: Path, maps: dict, metadata: dict, png: str | None) -> None:
    arrays = {name: as_numpy(value) for name, value in maps.items()}
    save_arrays(output, arrays, metadata=metadata)
    shapes = ", ".join(f"{name} {tuple(a.shape)}" for name, a in arrays.items())
    click.echo(f"maps: {shapes} -> {output}")
    if png:
        plot = plotting()

        figure = plot.maps({name: a for name, a in arrays.items() if np.iscomplexobj(a) or a.dtype.kind == "f"})
        click.echo(f"figure: {plot.save(figure, png)}")


_MAP_OUTPUTS = (".npz", ".h5", ".hdf5")


@click.command(short_help="Match a signal volume to a dictionary: parameter maps.", epilog="""\b
Examples:
  blochsim dictionary mrf -p flip=5:60:500 -p TR=10 --grid T1=200:3000:60:log --grid T2=10:300:40:log -o dict.npz
  blochsim match volume.npy dict.npz -o maps.npz --png maps.png
  blochsim match scan.h5:signals dict.h5 -o maps.h5 --groups 64
\b
VOLUME: .npy, .npz or .h5 of shape (..., samples), its samples those of the dictionary's atoms.
""")
@click.argument("volume", metavar="VOLUME")
@click.argument("dictionary_path", metavar="DICTIONARY")
@click.option("-o", "--output", type=click.Path(dir_okay=False), required=True,
              help="The maps: .npz or .h5, one array per unknown plus M0 (and score).")
@click.option("--png", "png", type=click.Path(dir_okay=False), default=None, help="Also draw the maps (PNG, ...).")
@click.option("--groups", type=click.IntRange(min=1), default=None,
              help="Grouped matching: cluster the atoms into this many groups and score only the groups that can "
                   "hold the best atom (faster on large dictionaries; same result).")
@click.option("--device", default=None, help="Where to match: cpu, cuda, cuda:1 (default: the host).")
@progress_option
@reports_errors
def match(volume, dictionary_path, output, png, groups, device, progress) -> None:
    """Match each voxel of VOLUME to the DICTIONARY atom it correlates best with; write the maps.

    The score of an atom d for a signal s is |<d,s>| / (|d| |s|); a voxel takes the parameters of its best
    atom, M0 the magnitude of the least-squares amplitude <d,s>/|d|^2, and score that atom's score.
    """
    from ..estimators import DictionaryMatcher

    out = check_output(output, allowed=_MAP_OUTPUTS)
    if png:
        plotting()  # before the work: a missing matplotlib is said at once
    signals = _volume(volume)
    held = load_arrays(dictionary_path)
    missing = [key for key in ("signals", "parameters", "names") if key not in held]
    if missing:
        raise ValueError(f"DICTIONARY {dictionary_path} holds no {', '.join(missing)}: a dictionary has signals "
                         f"(atoms, samples), parameters (atoms, P) and names (P,), as `blochsim dictionary` writes")
    atoms, parameters = held["signals"], np.asarray(held["parameters"], dtype=np.float64)
    names = [n.decode() if isinstance(n, bytes) else str(n) for n in np.asarray(held["names"]).reshape(-1)]
    if parameters.ndim != 2 or parameters.shape != (atoms.shape[0], len(names)):
        raise ValueError(f"DICTIONARY {dictionary_path}: parameters has shape {parameters.shape}, but there are "
                         f"{atoms.shape[0]} atoms and {len(names)} names")
    if signals.shape[-1] != atoms.shape[-1]:
        raise ValueError(f"VOLUME {volume} has {signals.shape[-1]} samples per voxel, the dictionary's atoms "
                         f"{atoms.shape[-1]}: they must come from the same sequence")
    started = time.perf_counter()
    matcher = DictionaryMatcher(dictionary=atoms, parameters={n: parameters[:, j] for j, n in enumerate(names)},
                                groups=groups)
    found = matcher.match(signals, execution=_policy(device, progress))
    maps = {name: as_numpy(found.parameters)[..., 0, j] for j, name in enumerate(names)}
    maps["M0"] = as_numpy(found.densities)[..., 0]
    maps["score"] = as_numpy(found.scores)[..., 0]
    voxels = int(np.prod(signals.shape[:-1]))
    click.echo(f"matched {voxels} voxels against {atoms.shape[0]} atoms in {time.perf_counter() - started:.1f} s")
    _write_maps(out, maps, {"estimator": "DictionaryMatcher", "volume": str(volume),
                            "dictionary": str(dictionary_path), "groups": groups}, png)


def _range(name: str, text) -> tuple:
    """(low, high) of `LOW:HIGH` or a pair from a config file."""
    parts = text.split(":") if isinstance(text, str) else list(np.asarray(text).reshape(-1))
    try:
        if len(parts) != 2:
            raise ValueError
        low, high = float(parts[0]), float(parts[1])
    except (TypeError, ValueError):
        raise ValueError(f"range {name}: expected LOW:HIGH, got {text!r}") from None
    if not low < high:
        raise ValueError(f"range {name}: need LOW < HIGH, got {low:g}:{high:g}")
    return low, high


@click.command(short_help="Fit a simulator to a signal volume by least squares: maps.", epilog="""\b
Examples:
  blochsim fit volume.npy mrf -p flip=@flips.npy -p TR=10 --range T1=100:4000 --range T2=5:500 \\
      -o maps.npz --png maps.png
  blochsim fit echoes.npy multiecho -p TE=10:100:10 --range T2=5:300 --uncertainty --noise-std 0.01 -o t2.h5
  blochsim fit volume.npy -c mrf.toml --known B1=@b1_map.npy --range T1=100:4000 --range T2=5:500 -o maps.npz
\b
VOLUME: .npy, .npz or .h5 of shape (..., samples), its samples those the simulator returns for the protocol.
A config file may hold [ranges] (NAME = "LOW:HIGH") beside simulator, [protocol], [tissue], [settings].
""")
@click.argument("volume", metavar="VOLUME")
@request_options
@click.option("--range", "range_flags", multiple=True, metavar="NAME=LOW:HIGH", required=False,
              help="An unknown and its bounds (property units: T1 in ms, ...). Repeatable; at least one.")
@click.option("--known", "known_flags", multiple=True, metavar="NAME=MAP",
              help="A separately measured property (B1=@b1_map.npy: one value per voxel, or one for all).")
@click.option("--noise-std", type=click.FloatRange(min=0), default=None,
              help="The noise SD of the real and imaginary parts (signal units): the standard errors use it "
                   "instead of the residual's estimate.")
@click.option("--uncertainty", is_flag=True, help="Also write each unknown's standard error (NAME_sd).")
@click.option("--max-iterations", type=click.IntRange(min=1), default=100, show_default=True,
              help="Levenberg-Marquardt iterations per voxel at most.")
@click.option("--tolerance", type=click.FloatRange(min=0, min_open=True), default=1e-6, show_default=True,
              help="A voxel stops when its relative cost change or its step falls below this.")
@click.option("--start", type=click.Choice(["match", "center"]), default="match", show_default=True,
              help="match: start from the best of a small dictionary; center: mid-range.")
@click.option("--start-samples", type=click.IntRange(min=1), default=2000, show_default=True,
              help="Atoms of the start dictionary (drawn from the ranges).")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the start dictionary's draws.")
@click.option("-o", "--output", type=click.Path(dir_okay=False), required=True,
              help="The maps: .npz or .h5, one array per unknown plus M0, iterations, converged and cost.")
@click.option("--png", "png", type=click.Path(dir_okay=False), default=None, help="Also draw the maps (PNG, ...).")
@progress_option
@reports_errors
def fit(volume, simulator, config, protocol_flags, tissue_flags, states, repetitions, device, range_flags,
        known_flags, noise_std, uncertainty, max_iterations, tolerance, start, start_samples, seed, output, png,
        progress) -> None:
    """Fit SIMULATOR to each voxel of VOLUME by nonlinear least squares; write the maps.

    Voxel-parallel Levenberg-Marquardt on the simulator's forward-mode Jacobian, with the complex amplitude
    (M0 and the receive phase) solved in closed form per voxel; the unknowns stay inside their ranges.
    """
    from ..estimators import NonlinearLeastSquares

    out = check_output(output, allowed=_MAP_OUTPUTS)
    if png:
        plotting()  # before the work: a missing matplotlib is said at once
    signals = _volume(volume)
    request = gather_request(simulator, config, protocol_flags, tissue_flags, states, repetitions, device,
                             sections=("ranges",))
    texts = {**request["config"].get("ranges", {}), **_pairs(range_flags, "--range")}
    if not texts:
        raise click.UsageError("name at least one unknown with its range, e.g. --range T1=100:4000")
    ranges = {name: _range(name, text) for name, text in texts.items()}
    known_maps = parse_assignments(known_flags, "--known")
    fixed = dict(request["tissue"])
    voxel_shape = signals.shape[:-1]
    known = {}
    for name, value in known_maps.items():
        value = np.asarray(value, dtype=np.float64)
        if value.ndim and value.shape != voxel_shape:
            raise ValueError(f"--known {name}: a map of shape {value.shape}, the volume's voxels {voxel_shape}")
        if value.ndim == 0 or float(value.min()) == float(value.max()):
            fixed[name] = float(value.reshape(-1)[0])  # one value for every voxel: a fixed property
        else:
            known[name] = value
    settings = {k: v for k, v in request["settings"].items() if k != "device"}
    acquisition = request["class"](**request["protocol"], **fixed, **settings)
    split_values(acquisition, request["protocol"], {**fixed, **dict.fromkeys([*ranges, *known], 0.0)})
    both = [n for n in ranges if n in fixed or n in known]
    if both:
        raise ValueError(f"{both[0]} is given both as an unknown (--range) and as a fixed or known value")

    started = time.perf_counter()
    estimator = NonlinearLeastSquares(acquisition, max_iterations=max_iterations, tolerance=tolerance, start=start,
                                      start_samples=start_samples)
    estimator.fit(**ranges, known={n: (float(v.min()), float(v.max())) for n, v in known.items()} or None,
                  noise_std=noise_std or 0.0, seed=seed)
    result = estimator.map(signals, known or None, uncertainty=uncertainty, execution=_policy(device, progress))
    maps, errors = result if uncertainty else (result, {})
    maps = {name: as_numpy(v) for name, v in maps.items()}
    maps.update({f"{name}_sd": as_numpy(v) for name, v in errors.items()})
    report = {key: as_numpy(v) for key, v in (estimator.report or {}).items()}
    maps.update(report)
    voxels = int(np.prod(voxel_shape))
    converged = int(np.sum(report["converged"])) if "converged" in report else voxels
    iterations = f", median {np.median(report['iterations']):g} iterations" if "iterations" in report else ""
    click.echo(f"fitted {voxels} voxels ({', '.join(ranges)}): {converged} converged{iterations}, in "
               f"{time.perf_counter() - started:.1f} s")
    metadata = {"estimator": "NonlinearLeastSquares", "volume": str(volume), "simulator": request["name"],
                "protocol": request["protocol"], "tissue": fixed, "settings": settings,
                "ranges": {n: list(r) for n, r in ranges.items()}, "known": list(known), "noise_std": noise_std}
    _write_maps(out, maps, metadata, png)


def _pairs(flags: tuple, option: str) -> dict:
    """{name: text} of NAME=TEXT flags."""
    values = {}
    for pair in flags:
        name, sep, text = pair.partition("=")
        if not sep or not name.strip():
            raise click.BadParameter(f"expected NAME=LOW:HIGH, got {pair!r}", param_hint=f"'{option}'")
        values[name.strip()] = text.strip()
    return values
