"""Arrays in and out: .npy, .npz and HDF5 files (h5py optional), written atomically, with JSON metadata."""

from __future__ import annotations

import json
import math
import os
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import click
import numpy as np

__all__ = ["ARRAY_SUFFIXES", "load_array", "load_arrays", "check_output", "write_atomically", "to_json",
           "save_arrays", "as_numpy"]

#: Output formats by suffix (HDF5 needs h5py).
ARRAY_SUFFIXES = (".npy", ".npz", ".h5", ".hdf5")


def _split_key(path: str) -> tuple[str, str | None]:
    """(file, key) of `file.npz:key` / `file.h5:key`; key None without one."""
    for suffix in (".npz", ".h5", ".hdf5"):
        marker = suffix + ":"
        if marker in path:
            head, _, key = path.rpartition(marker)
            return head + suffix, key
    return path, None


def _only(keys: list, path: str, preferred: tuple) -> str:
    for key in preferred:
        if key in keys:
            return key
    if len(keys) == 1:
        return keys[0]
    raise ValueError(f"{path} holds several arrays ({', '.join(keys)}): name one as {path}:KEY")


def load_array(path: str, *, name: str = "array", preferred: tuple = ("signals", "signal")) -> np.ndarray:
    """The array in `path`: a .npy file, one array of a .npz or HDF5 file (`file.npz:key`; without a key, the
    first of `preferred` it holds, or its only array). Raises ValueError or OSError saying what is wrong."""
    file, key = _split_key(path)
    suffix = Path(file).suffix.lower()
    if not Path(file).exists():
        raise FileNotFoundError(f"{name}: no such file {file!r}")
    if suffix == ".npy":
        if key is not None:
            raise ValueError(f"{name}: a .npy file holds one array, so {path!r} cannot name a key")
        return np.load(file, allow_pickle=False)
    if suffix == ".npz":
        with np.load(file, allow_pickle=False) as data:
            key = key if key is not None else _only(list(data.keys()), file, preferred)
            if key not in data:
                raise ValueError(f"{name}: {file} holds no array {key!r} (it holds {', '.join(data.keys())})")
            return data[key]
    if suffix in (".h5", ".hdf5"):
        h5py = _h5py(file)
        with h5py.File(file, "r") as data:
            keys = [k for k in data.keys() if isinstance(data[k], h5py.Dataset)]
            key = key if key is not None else _only(keys, file, preferred)
            if key not in keys:
                raise ValueError(f"{name}: {file} holds no dataset {key!r} (it holds {', '.join(keys)})")
            return data[key][()]
    raise ValueError(f"{name}: cannot read {file!r}: the suffix must be one of {', '.join(ARRAY_SUFFIXES)}")


def load_arrays(path: str) -> dict:
    """Every array of a .npz or HDF5 file (or {"signals": array} of a .npy file), by name."""
    suffix = Path(path).suffix.lower()
    if not Path(path).exists():
        raise FileNotFoundError(f"no such file {path!r}")
    if suffix == ".npz":
        with np.load(path, allow_pickle=False) as data:
            return {k: data[k] for k in data.keys()}
    if suffix in (".h5", ".hdf5"):
        h5py = _h5py(path)
        with h5py.File(path, "r") as data:
            out = {k: data[k][()] for k in data.keys() if isinstance(data[k], h5py.Dataset)}
            out.update({k: np.asarray(v) for k, v in data.attrs.items()})
            return out
    if suffix == ".npy":
        return {"signals": np.load(path, allow_pickle=False)}
    raise ValueError(f"cannot read {path!r}: the suffix must be one of {', '.join(ARRAY_SUFFIXES)}")


def _h5py(path: str) -> Any:
    try:
        import h5py
    except ImportError:
        raise ImportError(f"{path}: HDF5 files need h5py (pip install h5py), or use .npy/.npz") from None
    return h5py


def check_output(path: str, *, allowed: tuple = ARRAY_SUFFIXES, option: str = "'-o' / '--output'") -> Path:
    """`path` as a Path, after checking that its suffix is one of `allowed` and its folder exists (a usage
    error otherwise), and that h5py is there for an HDF5 file."""
    out = Path(path)
    if out.suffix.lower() not in allowed:
        raise click.BadParameter(f"{path!r}: the suffix must be one of {', '.join(allowed)}", param_hint=option)
    if not out.parent.exists():
        raise click.BadParameter(f"{path!r}: the folder {str(out.parent)!r} does not exist", param_hint=option)
    if out.suffix.lower() in (".h5", ".hdf5"):
        _h5py(path)
    return out


def write_atomically(path: Path, write: Callable[[Path], None]) -> Path:
    """Call `write(temporary path)` beside `path`, then move it onto `path` in one step, so that `path` is
    either absent, the old file, or complete (a run killed while writing leaves only a temporary file)."""
    path = Path(path)
    handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp" + path.suffix, dir=path.parent)
    os.close(handle)
    try:
        write(Path(temporary))
        with open(temporary, "rb") as f:
            os.fsync(f.fileno())
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return path


def _json_safe(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, Mapping):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    if hasattr(value, "item") and getattr(value, "ndim", 1) == 0:
        return value.item()
    return value


def to_json(value: Any) -> str:
    """Canonical JSON of a request (arrays as lists, keys sorted): equal requests give equal text."""
    return json.dumps(_json_safe(value), sort_keys=True, separators=(",", ":"))


def save_arrays(path: Path, arrays: Mapping[str, np.ndarray], *, metadata: Mapping | None = None) -> Path:
    """Write named arrays to `path` atomically: .npy (exactly one array), .npz, or HDF5 (datasets, with the
    `metadata` as JSON in the file's attributes; in .npz it is the array `metadata`, a JSON string)."""
    suffix = path.suffix.lower()
    if suffix == ".npy":
        if len(arrays) != 1:
            raise ValueError(f"{path}: a .npy file holds one array, but there are {len(arrays)} "
                             f"({', '.join(arrays)}): write .npz or .h5")
        (only,) = arrays.values()
        return write_atomically(path, lambda tmp: np.save(tmp, only))
    if suffix == ".npz":
        extra = {"metadata": np.asarray(to_json(metadata))} if metadata else {}

        def write_npz(tmp: Path) -> None:
            with open(tmp, "wb") as f:
                np.savez(f, **arrays, **extra)
        return write_atomically(path, write_npz)
    h5py = _h5py(str(path))

    def write_h5(tmp: Path) -> None:
        with h5py.File(tmp, "w") as f:
            for key, value in arrays.items():
                f.create_dataset(key, data=value)
            if metadata:
                f.attrs["metadata"] = to_json(metadata)
    return write_atomically(path, write_h5)


def as_numpy(value: Any) -> np.ndarray:
    """A NumPy array of a result (a torch tensor on any device, or an array)."""
    if hasattr(value, "detach"):
        value = value.detach().cpu().numpy()
    return np.asarray(value)
