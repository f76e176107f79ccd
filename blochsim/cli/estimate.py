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

from ._common import (
    as_numpy,
    check_output,
    load_array,
    load_arrays,
    parse_assignments,
    progress_option,
    reports_errors,
    save_arrays,
    split_values,
)
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
        from .. import plot

        figure = plot.maps({name: a for name, a in arrays.items() if np.iscomplexobj(a) or a.dtype.kind == "f"})
        click.echo(f"figure: {plot.save(figure, png)}")


_MAP_OUTPUTS = (".npz", ".h5", ".hdf5")


@click.command(epilog="""\b
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


@click.command()
def fit() -> None:
    """Fit a simulator to a signal volume (in progress)."""


# Kept for `fit` (next): the request helpers it shares with `simulate`.
_FIT_HELPERS = (gather_request, request_options, parse_assignments, split_values)
