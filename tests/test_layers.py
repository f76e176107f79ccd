"""The package's layers import only downward, and no modules import each other at import time.

Every module of `blochsim` belongs to one layer (`LAYERS`, by module name); `ALLOWED` says which layers a
layer may import. Every import counts, at module level or inside a function (a lazy import is still a
dependency), read from the source with `ast`, with one exception: the imports inside a package's
module-level `__getattr__` (PEP 562), which re-export a name the public API places in that package
(`blochsim.sequence.EpgEngine` lives in `blochsim.engine`, a layer above), and the few lazy upward
calls of `LAZY_UPWARD`, each with its reason. Import cycles are checked on the module-level imports, the
ones that run when a module loads.

Why the layers (docs/design.md, "Layout"): the description layer (`sequence`) builds sequences without
the engine; `physics` holds what the engine and the oracle share, so that neither imports the other
and the oracle stays an independent check of the kernels; `model` builds the `Simulator` on the
engine; `simulators` on the model; estimators, design, reconstruction, readers and the command line
on the public API. scipy is not imported below the top layers: the engine runs on numpy and torch.
"""

from __future__ import annotations

import ast
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "blochsim"

#: layer -> the module names in it (a name and everything under it). The root package `blochsim`
#: (its __init__) is the public face and re-exports every layer but the oracle.
LAYERS = {
    "foundation": ("blochsim._version", "blochsim._errors", "blochsim._arrays", "blochsim._native",
                   "blochsim._execution", "blochsim._progress", "blochsim._sharding", "blochsim._distributed",
                   "blochsim._collectives", "blochsim._multi_device", "blochsim._tracing", "blochsim._free_variables",
                   "blochsim._tracing_dynamo"),
    "physics": ("blochsim.physics",),
    "sequence": ("blochsim.sequence",),
    "engine": ("blochsim.engine",),
    "oracle": ("blochsim._reference",),
    "model": ("blochsim.model", "blochsim._model"),
    "simulators": ("blochsim.simulators",),
    "top": ("blochsim.estimators", "blochsim.optim", "blochsim.recon", "blochsim.io", "blochsim.cli",
            "blochsim.plot", "blochsim.hvp", "blochsim.subspace", "blochsim.__main__", "blochsim._benchmark_cases"),
    "api": (),  # `blochsim` itself, matched exactly
}

_BELOW_MODEL = {"foundation", "physics", "sequence", "engine"}
_PRODUCTION = {"foundation", "physics", "sequence", "engine", "model", "simulators", "top", "api"}

#: layer -> the layers it may import (itself included).
ALLOWED = {
    "foundation": {"foundation"},
    "physics": {"foundation", "physics"},
    "sequence": {"foundation", "physics", "sequence"},
    "engine": {"foundation", "physics", "sequence", "engine"},  # never the oracle
    "oracle": {"foundation", "physics", "sequence", "oracle"},  # never the engine
    "model": _BELOW_MODEL | {"model"},
    "simulators": _BELOW_MODEL | {"model", "simulators"},
    "top": _PRODUCTION,  # the oracle is for tests only
    "api": _PRODUCTION,
}

#: (module, imported module or package) -> why a function of that module may import upward. Only inside a
#: function: the upward layer loads when that function is called, never when the module loads.
LAZY_UPWARD = {
    ("blochsim.sequence.description", "blochsim.plot"):
        "SequenceDescription.plot() is public; it draws through the plot layer (and matplotlib) when called",
}

#: Third-party packages the layers below `top` may not import.
NOT_BELOW_TOP = ("scipy",)


def layer_of(module: str) -> str | None:
    if module == "blochsim":
        return "api"
    for layer, names in LAYERS.items():
        if any(module == name or module.startswith(name + ".") for name in names):
            return layer
    return None


def module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _resolve(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    """The absolute name `from <node.module>` refers to, inside `module`."""
    if node.level == 0:
        return node.module or ""
    base = module.split(".")
    base = base if is_package else base[:-1]
    base = base[:len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def imports_of(module: str, source: str, is_package: bool, known: set) -> list[tuple[str, int, bool, bool]]:
    """(imported module, line, at module level, inside a module-level __getattr__) of every import.

    `from x import y` counts as an import of `x.y` when `x.y` is a module (`known`), else of `x`.
    """
    tree = ast.parse(source)
    found = []

    def visit(node, top_level: bool, in_getattr: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lazy_reexport = top_level and child.name == "__getattr__"
                visit(child, False, in_getattr or lazy_reexport)
                continue
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                continue  # annotations only: nothing runs
            if isinstance(child, ast.Import):
                found.extend((alias.name, child.lineno, top_level, in_getattr) for alias in child.names)
            elif isinstance(child, ast.ImportFrom):
                target = _resolve(module, is_package, child)
                for alias in child.names:
                    sub = f"{target}.{alias.name}"
                    found.append((sub if sub in known else target, child.lineno, top_level, in_getattr))
            if not isinstance(child, (ast.Import, ast.ImportFrom)):
                visit(child, top_level and isinstance(child, (ast.If, ast.Try, ast.With)), in_getattr)

    visit(tree, True, False)
    return found


def read_package() -> dict:
    """module name -> (source, is a package)."""
    return {module_name(p): (p.read_text(), p.name == "__init__.py") for p in sorted(PACKAGE.rglob("*.py"))}


def violations(modules: dict) -> list[str]:
    """Every import that goes against `ALLOWED` or `NOT_BELOW_TOP`, and every module without a layer."""
    known = set(modules)
    problems = []
    for module, (source, is_package) in modules.items():
        layer = layer_of(module)
        if layer is None:
            problems.append(f"{module} belongs to no layer: add it to LAYERS in tests/test_layers.py")
            continue
        for target, line, top_level, in_getattr in imports_of(module, source, is_package, known):
            top = target.split(".")[0]
            if top in NOT_BELOW_TOP and layer not in ("top", "api"):
                problems.append(f"{module}:{line} imports {target}: not allowed below the top layers")
            if top != "blochsim" or in_getattr:
                continue
            if not top_level and any(module == m and (target == t or target.startswith(t + "."))
                                     for m, t in LAZY_UPWARD):
                continue
            other = layer_of(target)
            if other is not None and other not in ALLOWED[layer]:
                problems.append(f"{module}:{line} (layer {layer}) imports {target} (layer {other}); {layer} may "
                                f"import only {sorted(ALLOWED[layer])}")
    return problems


def cycles(modules: dict) -> list[list[str]]:
    """The import cycles among module-level imports (strongly connected components of two or more)."""
    known = set(modules)
    graph = {m: sorted({t for t, _, top_level, _ in imports_of(m, src, pkg, known) if top_level and t in known
                        and t != m}) for m, (src, pkg) in modules.items()}
    index, low, stack, on_stack, found, counter = {}, {}, [], set(), [], [0]

    def strongconnect(v):  # Tarjan's algorithm
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                strongconnect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in graph:
        if v not in index:
            strongconnect(v)
    return found


def test_every_import_goes_down():
    problems = violations(read_package())
    assert not problems, "\n".join(problems)


def test_no_import_cycles():
    found = cycles(read_package())
    assert not found, "import cycles (module-level imports): " + "; ".join(" <-> ".join(c) for c in found)


@pytest.mark.parametrize(("module", "source", "expected"), [
    ("blochsim.engine.bad", "from .._reference import play\n", "imports blochsim._reference"),
    ("blochsim._reference.bad", "def f():\n    from ..engine import simulate\n", "imports blochsim.engine"),
    ("blochsim.sequence.bad", "from ..engine.program import compile_program\n", "imports blochsim.engine.program"),
    ("blochsim.engine.bad", "import scipy.integrate\n", "not allowed below the top layers"),
    ("blochsim.physics.bad", "from blochsim.model import Simulator\n", "imports blochsim.model"),
    ("blochsim.newthing", "import torch\n", "belongs to no layer"),
    ("blochsim.sequence.description", "from ..plot import sequence\n", "imports blochsim.plot"),  # not lazy
])
def test_a_bad_import_is_caught(module, source, expected):
    """The checker itself: each deliberate bad import is reported (so the two tests above cannot pass by
    reading nothing)."""
    modules = read_package()
    modules[module] = (source, False)
    assert any(expected in p for p in violations(modules))


def test_a_lazy_reexport_is_allowed_and_a_cycle_is_caught():
    modules = read_package()
    source, is_package = modules["blochsim.sequence"]
    reexports = [t for t, _, _, in_getattr in imports_of("blochsim.sequence", source, is_package, set(modules))
                 if in_getattr]
    assert "blochsim.engine.epg_engine" in reexports  # EpgEngine, through the package's __getattr__
    modules["blochsim.engine.cycle_a"] = ("from . import cycle_b\n", False)
    modules["blochsim.engine.cycle_b"] = ("from . import cycle_a\n", False)
    assert ["blochsim.engine.cycle_a", "blochsim.engine.cycle_b"] in cycles(modules)
