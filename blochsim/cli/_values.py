"""Values from the command line and config files: numbers, lists, ranges, array files, words."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click
import numpy as np

from ._files import load_array

__all__ = ["parse_range", "parse_value", "parse_assignments", "read_config"]


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
