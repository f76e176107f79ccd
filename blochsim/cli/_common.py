"""What the subcommands share: errors, values from flags and files, simulators by name, arrays in and out.

Errors follow one convention: a bad flag (unknown option, a value of the wrong type or out of range, an unknown
simulator name) is a usage error (click's, exit status 2, with the usage line); bad data (a value the simulator
refuses, a file that cannot be read, shapes that do not agree) is a `DataError`: one line on stderr, exit
status 1, no traceback. `reports_errors` turns the errors users cause into `DataError`s.
"""

from __future__ import annotations

import functools
import inspect
import json
import math
import os
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import click
import numpy as np

__all__ = ["DataError", "reports_errors", "progress_option", "parse_value", "parse_range", "parse_assignments",
           "note_text_values", "read_config", "SimulatorName", "shipped_simulators", "simulator_class",
           "signature_line", "split_values", "load_array", "load_arrays", "check_output", "write_atomically",
           "to_json", "save_arrays", "as_numpy", "plotting", "ARRAY_SUFFIXES"]

#: Output formats by suffix (HDF5 needs h5py).
ARRAY_SUFFIXES = (".npy", ".npz", ".h5", ".hdf5")


class DataError(click.ClickException):
    """Bad data: one line on stderr, `blochsim COMMAND: error: ...`, exit status 1."""

    exit_code = 1

    def __init__(self, message: str, command_path: str | None = None) -> None:
        super().__init__(message)
        ctx = click.get_current_context(silent=True)
        self.command_path = command_path or (ctx.command_path if ctx is not None else "blochsim")

    def show(self, file: Any = None) -> None:
        click.echo(f"{self.command_path}: error: {self.format_message()}", err=True, file=file)


#: Exceptions that bad input raises in blochsim and in the libraries it reads files with. Anything else is a
#: bug in blochsim, and keeps its traceback.
_USER_ERRORS = (ValueError, TypeError, KeyError, OSError, ImportError, RuntimeError, json.JSONDecodeError)


def reports_errors(command: Callable) -> Callable:
    """Run `command`, turning the errors of bad data into one-line `DataError`s (exit status 1).

    With `blochsim --debug`, they keep their traceback instead.
    """

    @functools.wraps(command)
    def wrapper(*args, **kwargs):
        try:
            return command(*args, **kwargs)
        except _USER_ERRORS as exc:
            ctx = click.get_current_context(silent=True)
            state = (ctx.find_root().obj or {}) if ctx is not None else {}
            if state.get("debug"):
                raise
            message = str(exc.args[0] if isinstance(exc, KeyError) and exc.args else exc)
            message = message.strip().replace("\n", " ") or type(exc).__name__
            words = state.get("text_values") or {}
            if isinstance(exc, TypeError) and words:
                # A value that is not a number was passed on as text; say so, the simulator cannot.
                shown = ", ".join(f"{name}={text!r}" for name, text in words.items())
                message += (f" (read as text: {shown}; a number is 10, 1,2,3, START:STOP:COUNT[:log], [..] or "
                            f"@file.npy)")
            raise DataError(message) from exc

    return wrapper


def progress_option(command: Callable) -> Callable:
    """`--progress/--no-progress`: a bar on long work (default: only when stderr is a terminal)."""
    return click.option("--progress/--no-progress", default=None,
                        help="Show a progress bar (default: when stderr is a terminal and the work takes more "
                             "than ~2 s; needs tqdm).")(command)


# -- values --------------------------------------------------------------------------------------------------
def _number(text: str) -> int | float | None:
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return float(text)
    except ValueError:
        return None


def parse_range(text: str, name: str) -> np.ndarray | None:
    """`START:STOP:COUNT` (evenly spaced, both ends included) or `START:STOP:COUNT:log` (geometric), or None
    when `text` is not of that form. Raises ValueError for a count < 1 or a log range through 0."""
    parts = text.split(":")
    if len(parts) not in (3, 4) or (len(parts) == 4 and parts[3] != "log"):
        return None
    start, stop, count = (_number(p) for p in parts[:3])
    if start is None or stop is None or not isinstance(count, int):
        return None
    if count < 1:
        raise ValueError(f"{name}={text}: the count must be >= 1, got {count}")
    if len(parts) == 4:
        if start <= 0 or stop <= 0:
            raise ValueError(f"{name}={text}: a log range needs START and STOP > 0")
        return np.geomspace(start, stop, count)
    return np.linspace(start, stop, count)


def parse_value(text: str, name: str, *, base: Path | None = None) -> Any:
    """A value from its text on the command line.

    Accepted: a number (`10`, `2.5e-3`, `inf`); a comma-separated list (`10,20,30`); a JSON list or
    literal (`[[10, 20], [30, 40]]`, `true`, `null`); a range `START:STOP:COUNT` (linspace) or
    `START:STOP:COUNT:log` (geomspace); `@file.npy` (an array file; `@file.npz:key` or `@file.h5:key` for one
    array of it; relative to `base` when given); anything else is a string (`inversion=ideal`).
    """
    text = text.strip()
    if text.startswith("@"):
        path = text[1:]
        return load_array(path if base is None or Path(path).is_absolute() else str(base / path), name=name)
    number = _number(text)
    if number is not None:
        return number
    if text[:1] in "[{" or text in ("true", "false", "null"):
        try:
            value = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{name}={text}: not valid JSON ({exc.msg} at character {exc.pos})") from None
        return np.asarray(value, dtype=float) if isinstance(value, list) else value
    spaced = parse_range(text, name)
    if spaced is not None:
        return spaced
    if "," in text:
        numbers = [_number(p) for p in text.split(",") if p.strip()]
        if all(n is not None for n in numbers):
            return np.asarray(numbers, dtype=float)
        raise ValueError(f"{name}={text}: a comma-separated list must hold numbers only")
    return text


def note_text_values(values: Mapping) -> None:
    """Remember which values were read as text (words such as `inversion=ideal`), so that an error they cause
    can say how they were read (`reports_errors`)."""
    ctx = click.get_current_context(silent=True)
    if ctx is not None:
        root = ctx.find_root()
        root.obj = root.obj if isinstance(root.obj, dict) else {}
        root.obj.setdefault("text_values", {}).update({k: v for k, v in values.items() if isinstance(v, str)})


def parse_assignments(pairs: tuple, option: str) -> dict:
    """{name: value} from `NAME=VALUE` flags (`parse_value`). Raises click.BadParameter (a usage error) for
    a flag without `=` or with an empty name, and ValueError for a value that cannot be read."""
    values = {}
    for pair in pairs:
        name, sep, text = pair.partition("=")
        name = name.strip()
        if not sep or not name:
            raise click.BadParameter(f"expected NAME=VALUE, got {pair!r}", param_hint=f"'{option}'")
        values[name] = parse_value(text, name)
    return values


def _from_file_value(value: Any, name: str, base: Path) -> Any:
    """A config file's value: strings may be `@file` arrays or ranges, lists become float arrays."""
    if isinstance(value, str):
        return parse_value(value, name, base=base)
    if isinstance(value, list):
        try:
            return np.asarray(value, dtype=float)
        except (TypeError, ValueError):
            raise ValueError(f"{name} in the config file: a list must hold numbers (or lists of them)") from None
    return value


def read_config(path: str | None, sections: tuple) -> dict:
    """The tables of a TOML or JSON config file, by section: {section: {name: value}} (plus top-level keys).

    The file holds top-level `simulator = "mrf"` and tables such as `[protocol]`, `[tissue]`, `[settings]`;
    `sections` lists the keys the calling subcommand reads, and any other key is an error naming them.
    Values are numbers, strings, lists (arrays), or strings in the flag syntax (`"@flips.npy"`,
    `"200:3000:40:log"`), with files relative to the config file.
    """
    if path is None:
        return {}
    file = Path(path)
    text = file.read_text()
    if file.suffix.lower() == ".json":
        data = json.loads(text)
    elif file.suffix.lower() == ".toml":
        try:
            import tomllib
        except ImportError:  # Python 3.10
            try:
                import tomli as tomllib
            except ImportError:
                raise ImportError(f"reading {path} needs Python 3.11 or the tomli package (pip install tomli); "
                                  "or write the config as JSON") from None
        data = tomllib.loads(text)
    else:
        raise ValueError(f"config file {path}: the suffix must be .toml or .json, got {file.suffix!r}")
    if not isinstance(data, dict):
        raise ValueError(f"config file {path} must hold a table (a JSON object), got {type(data).__name__}")
    unknown = [key for key in data if key not in sections]
    if unknown:
        raise ValueError(f"config file {path}: unknown key {unknown[0]!r}; this subcommand reads "
                         f"{', '.join(map(repr, sections))}")
    base = file.resolve().parent
    out = {}
    for key, value in data.items():
        if isinstance(value, dict):
            out[key] = {name: _from_file_value(v, name, base) for name, v in value.items()}
        else:
            out[key] = value
    return out


# -- simulators ----------------------------------------------------------------------------------------------
def shipped_simulators() -> dict:
    """{short name: class} of the shipped simulators: the class name without `Simulator`, lower-cased (the
    function form's name without `_sim`), e.g. "mrf", "fse", "spgr", "irbssfp"."""
    from .. import simulators

    return {name[: -len("Simulator")].lower(): getattr(simulators, name)
            for name in simulators.__all__ if name.endswith("Simulator")}


def simulator_class(name: str) -> type:
    """The shipped simulator called `name` ("mrf", "MRF", "MRFSimulator" or "mrf_sim"). Raises ValueError
    naming the nearest shipped name."""
    from .._errors import nearest

    known = shipped_simulators()
    key = name.strip().lower()
    for suffix in ("simulator", "_sim"):
        if key.endswith(suffix) and key[: -len(suffix)] in known:
            key = key[: -len(suffix)]
    if key not in known:
        raise ValueError(f"no shipped simulator is called {name!r}{nearest(key, known)}; the simulators are "
                         f"{', '.join(sorted(known))} (blochsim simulate --list shows their arguments)")
    return known[key]


class SimulatorName(click.ParamType):
    """A shipped simulator's name on the command line; an unknown one is a usage error."""

    name = "SIMULATOR"

    def convert(self, value: Any, param: Any, ctx: Any) -> Any:
        if isinstance(value, type):
            return value
        try:
            return simulator_class(value)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


def signature_line(short: str, cls: type) -> str:
    """`short`'s function form signature (`mrf_sim(flip, TR, T1, T2, diff=None, ...)`), or the class name."""
    from .. import simulators

    form = getattr(simulators, f"{short}_sim", None)
    if form is None:
        return cls.__name__
    parts = []
    for p in inspect.signature(form).parameters.values():
        if p.name in ("device", "values"):
            continue
        parts.append(p.name if p.default is p.empty else f"{p.name}={p.default!r}")
    return f"{short:<26}{', '.join(parts)}"


def split_values(simulator: Any, protocol: Mapping, tissue: Mapping) -> None:
    """Check that `tissue` holds tissue properties and `protocol` none (the simulator itself checks that
    every name is known). Raises ValueError naming the flag to use instead."""
    accepts = set(simulator.accepts)
    for name in protocol:
        if name in accepts:
            raise ValueError(f"{name} is a tissue property of {type(simulator).__name__}: give it with "
                             f"-t/--tissue {name}=..., not -p/--protocol")
    for name in tissue:
        if name not in accepts and name not in ("states", "repetitions"):
            from .._errors import nearest

            raise ValueError(f"{name!r} is not a tissue property of {type(simulator).__name__}"
                             f"{nearest(name, accepts)}; its tissue properties are {', '.join(simulator.accepts)} "
                             f"(protocol values go with -p/--protocol)")


# -- arrays in and out ---------------------------------------------------------------------------------------
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


def plotting() -> Any:
    """blochsim.plot, with matplotlib drawing off screen (Agg): the command line writes figures to files and
    never opens a window. ImportError naming the `plot` extra without matplotlib."""
    try:
        import matplotlib
    except ImportError:
        raise ImportError('figures need matplotlib: pip install "blochsim[plot]"') from None
    matplotlib.use("Agg")
    from .. import plot

    return plot
