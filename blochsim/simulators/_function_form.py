"""Function forms `xxx_sim` of the simulators, made from a class and a signature spec.

`xxx_sim(<required protocol>, <required tissue>, diff=None, <optional ...>, device=None, **values)`
returns the signal, or `(signal, J)` when `diff` is a name or a tuple of names, with the shapes of
`Simulator.jacobian`. `**values` forwards any further property, protocol argument or run setting;
arguments passed as None are dropped. One instance of the class serves every call, so calls that
change only values reuse its resolved structure.
"""

from __future__ import annotations

import inspect

__all__ = ["function_form"]


def function_form(cls, name: str, required: tuple, optional: tuple, *, renames: dict | None = None):
    """Make `name(*required, **optional, **values)` calling `cls().simulate` or `cls().jacobian`.

    `optional` is a sequence of `(argument, default)` in positional order and must hold `("diff", None)`;
    `renames` maps argument names to the simulator's (e.g. `{"nreps": "repetitions"}`). An optional
    argument left at its default is not forwarded: the defaults are the class's own, and an
    identity property that is not sent keeps its physics off at no cost. It is forwarded when `diff`
    names it.
    """
    renames = dict(renames or {})
    order = tuple(required) + tuple(arg for arg, _ in optional)
    defaults = dict(optional)
    if "diff" not in defaults:
        raise ValueError(f"{name}: the signature spec must contain ('diff', None)")
    parameters = [inspect.Parameter(arg, inspect.Parameter.POSITIONAL_OR_KEYWORD) for arg in required]
    parameters += [inspect.Parameter(arg, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=default)
                   for arg, default in optional]
    parameters.append(inspect.Parameter("values", inspect.Parameter.VAR_KEYWORD))
    instance = []

    def form(*args, **kwargs):
        if len(args) > len(order):
            raise TypeError(f"{name}() takes at most {len(order)} positional arguments ({', '.join(order)}), "
                            f"got {len(args)}")
        given = dict(zip(order, args, strict=False))
        for key, value in kwargs.items():
            if key in given:
                raise TypeError(f"{name}() got multiple values for argument {key!r}")
            given[key] = value
        missing = [arg for arg in required if arg not in given]
        if missing:
            raise TypeError(f"{name}() missing required argument(s): {', '.join(map(repr, missing))}")
        diff = given.pop("diff", None)
        differentiated = {diff} if isinstance(diff, str) else set(diff or ())
        values = {}
        for key in differentiated:  # a default counts as given when it is differentiated
            if key in defaults and key not in given and defaults[key] is not None:
                given[key] = defaults[key]
        for key, value in given.items():
            if value is None or (key in defaults and value is defaults[key] and key not in differentiated):
                continue
            values[renames.get(key, key)] = value
        if not instance:
            instance.append(cls())
        simulator = instance[0]
        return simulator.simulate(**values) if diff is None else simulator.jacobian(diff, **values)

    form.__name__ = form.__qualname__ = name
    form.__signature__ = inspect.Signature(parameters)
    form.__doc__ = (f"Function form of `{cls.__name__}`: returns the signal, or (signal, J) when "
                    f"`diff` names properties.\n\n{inspect.getdoc(cls) or ''}")
    form.__module__ = cls.__module__
    return form
