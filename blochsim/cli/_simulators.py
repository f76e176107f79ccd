"""The shipped simulators by name, their signatures, and which names are tissue properties."""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

import click

__all__ = ["shipped_simulators", "simulator_class", "SimulatorName", "signature_line", "split_values"]


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
