"""What the subcommands share: errors, common options, figures.

Errors follow one convention: a bad flag (unknown option, a value of the wrong type or out of range, an unknown
simulator name) is a usage error (click's, exit status 2, with the usage line); bad data (a value the simulator
refuses, a file that cannot be read, shapes that do not agree) is a `DataError`: one line on stderr, exit
status 1, no traceback. `reports_errors` turns the errors users cause into `DataError`s.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Mapping
from typing import Any

import click

__all__ = ["DataError", "reports_errors", "progress_option", "note_text_values", "plotting"]


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


def note_text_values(values: Mapping) -> None:
    """Remember which values were read as text (words such as `inversion=ideal`), so that an error they cause
    can say how they were read (`reports_errors`)."""
    ctx = click.get_current_context(silent=True)
    if ctx is not None:
        root = ctx.find_root()
        root.obj = root.obj if isinstance(root.obj, dict) else {}
        root.obj.setdefault("text_values", {}).update({k: v for k, v in values.items() if isinstance(v, str)})


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
