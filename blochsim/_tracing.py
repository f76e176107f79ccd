"""Simulations inside torch.compile and torch.export: the structure read once, the values traced.

The engine reads a sequence's structure from values on the host (which events play, how many samples, which
tissue physics is on; `.tolist()`, NumPy, caches keyed by tensor identity) and calls the kernels through
ctypes. TorchDynamo cannot trace that. So the public entry points (`engine.simulate`, `engine.jacobian`,
`EpgEngine.simulate`, `Simulator.simulate` and `.jacobian`: `engine.vmap.loop_under_vmap`) and the
description builders (`mrf_description`, ...: `deferred_under_compile`) take another route while Dynamo
traces them:

* a builder returns a `Deferred` record of its call (nothing is built yet);
* an entry point flattens its arguments (Deferred records, dataclasses such as `TissueProperties`, lists,
  dicts) into constants and tensors, and `_plan` runs, once per structure, at trace time: it plays the
  eager call (builders included) on the real values of the tensors under `make_fx`, with every floating
  tensor marked as requiring grad, so the engine takes its value-independent branches (a differentiated
  value never decides structure) and calls the kernels as the `blochsim::` custom ops (`engine.ops`,
  `planning()` is True). The recorded graph holds torch operations from the tensors to the kernel inputs,
  the kernel ops, and what follows them (T2', the sample selection); host reads became constants.
* operations on constants alone (the structure: event rows, interval lengths, distinct intervals) are computed
  once and kept as constants; the graph is moved to the device its results live on (the host copies the eager
  engine makes to compile a program become device operations) and called on the traced tensors. Dynamo hands
  it to AOTAutograd whole (`torch._dynamo.nonstrict_trace`; inlined under torch.export), which differentiates
  it through the ops' registered autograd.

So a compiled function runs torch operations and kernel launches only: no host syncs, nothing that a
CUDA graph (`mode="reduce-overhead"`) cannot capture. What this costs: the structure is that of the first
call (Dynamo's guards on shapes, dtypes, devices and the constants of the call recompile for another);
values are not checked at run time (a NaN flip gives NaN samples, not a ValueError); a `Deferred` offers
nothing but being simulated; tensors held by objects made outside the compiled function (a Simulator's
bound maps, a prebuilt description) are constants of the graph, like any tensor a compiled function
closes over. torch.export works in strict mode (`strict=True`), which traces with Dynamo.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import functools
import itertools
import operator

import torch

try:  # torch >= 2.5; before it, a plan is not made inside a torch.func transform being traced
    from torch._functorch.pyfunctorch import temporarily_clear_interpreter_stack
except ImportError:  # pragma: no cover
    temporarily_clear_interpreter_stack = contextlib.nullcontext

__all__ = ["Deferred", "deferred_under_compile", "planning", "traced_call", "tracing"]

#: Plays of an eager call being recorded for a plan (a module global: Dynamo reads and guards it).
_PLANNING_DEPTH = 0


def planning() -> bool:
    """Whether the eager engine is being recorded for a compiled plan: kernels must be called as custom ops."""
    return _PLANNING_DEPTH > 0


def tracing() -> bool:
    """Whether a call should take the traced route: under torch.compile or torch.export, outside a plan."""
    return torch.compiler.is_compiling() and _PLANNING_DEPTH == 0


class Deferred:
    """A builder's call recorded while Dynamo traces (`deferred_under_compile`); the call is made when a
    simulation that takes it is planned."""

    def __init__(self, function, args: tuple, kwargs: dict):
        self.function, self.args, self.kwargs = function, args, kwargs

    def __getattr__(self, name: str):
        raise AttributeError(
            f"under torch.compile, {self.function.__qualname__}(...) is built when a simulation uses it; its "
            f"attribute {name!r} is not available inside the compiled function (build the description outside "
            "it to read it, or pass it to engine.simulate, EpgEngine.simulate or Simulator.from_description)")


def deferred_under_compile(function):
    """Decorator of a description builder: while Dynamo traces, return a `Deferred` record of the call."""

    @functools.wraps(function)
    def builder(*args, **kwargs):
        if tracing():
            return Deferred(function, args, kwargs)
        return function(*args, **kwargs)

    return builder


# -- flattening (traced by Dynamo) ------------------------------------------------------------------
def _flatten(value, tensors: list, objects: list):
    """A hashable spec of `value` with its tensors appended to `tensors` and opaque objects to `objects`."""
    if isinstance(value, torch.Tensor):
        tensors.append(value)
        return ("T", len(tensors) - 1)
    if isinstance(value, Deferred):
        return ("D", value.function, _flatten(value.args, tensors, objects), _flatten(value.kwargs, tensors, objects))
    if isinstance(value, (tuple, list)):
        return ("L" if isinstance(value, list) else "U", tuple(_flatten(v, tensors, objects) for v in value))
    if isinstance(value, dict):
        return ("M", tuple((k, _flatten(v, tensors, objects)) for k, v in value.items()))
    if value is None or isinstance(value, (bool, int, float, complex, str, torch.dtype, torch.device)):
        return ("V", value)
    if getattr(type(value), "__dataclass_fields__", None) is not None and not isinstance(value, type):
        # A record of values (TissueProperties): its tensors are traced. Other dataclasses (a description
        # made outside, with its events) are objects: what they hold is a constant of the plan.
        names = [f.name for f in dataclasses.fields(value) if f.init]
        if all(_is_value(getattr(value, name)) for name in names):
            return ("C", type(value), tuple((name, _flatten(getattr(value, name), tensors, objects))
                                            for name in names))
    objects.append(value)
    return ("O", len(objects) - 1)


def _is_value(value) -> bool:
    """A tensor, a number, a string, None, or a tuple or list of those."""
    if isinstance(value, (tuple, list)):
        return all(_is_value(v) for v in value)
    return value is None or isinstance(value, (torch.Tensor, bool, int, float, complex, str, torch.dtype,
                                               torch.device))


def _unflatten(spec, tensors, objects):
    kind = spec[0]
    if kind == "T":
        return tensors[spec[1]]
    if kind == "V":
        return spec[1]
    if kind == "O":
        return objects[spec[1]]
    if kind == "D":
        return spec[1](*_unflatten(spec[2], tensors, objects), **_unflatten(spec[3], tensors, objects))
    if kind in ("L", "U"):
        items = [_unflatten(s, tensors, objects) for s in spec[1]]
        return items if kind == "L" else tuple(items)
    if kind == "M":
        return {k: _unflatten(s, tensors, objects) for k, s in spec[1]}
    return spec[1](**{name: _unflatten(s, tensors, objects) for name, s in spec[2]})  # "C"


def traced_call(function, args: tuple, kwargs: dict):
    """`function(*args, **kwargs)` under Dynamo: planned once per structure (`_plan`), then the plan's graph."""
    tensors, objects = [], []
    spec = _flatten((args, kwargs), tensors, objects)
    # Shapes as Python ints: the plan holds one structure, so Dynamo specializes on them (operator.index
    # makes a dynamic size static, with a guard; int() would leave it symbolic).
    meta = tuple((tuple(operator.index(n) for n in t.shape), t.dtype, t.device, t.requires_grad) for t in tensors)
    # Only a traced call imports the Dynamo-wrapped entry points (torch.compile/export have loaded Dynamo by
    # then; Dynamo performs this import while tracing): `import blochsim` stays free of torch._dynamo and sympy.
    from . import _tracing_dynamo as wrapped

    # The objects go to the plan by identity: Dynamo turns id() of an object from outside into a constant with
    # an identity guard on every torch this supports, but takes the object itself as an argument of an
    # assume_constant_result function only from torch 2.13 (before it: "UserDefinedObjectVariable is not a
    # constant").
    name, out_spec = wrapped.plan(function, spec, meta, tuple(id(o) for o in objects), *tensors)
    plan = getattr(_PLANS, name)
    # torch.export cannot take a nonstrict_trace call (torch 2.13: a TreeSpec weak reference): Dynamo inlines it.
    outputs = _run(plan, *tensors) if _exporting() else wrapped.run_plan(plan, *tensors)
    return _unflatten(out_spec, outputs, ())


def _exporting() -> bool:
    is_exporting = getattr(torch.compiler, "is_exporting", None)
    return is_exporting is not None and is_exporting()


def _run(plan: torch.fx.GraphModule, *tensors):
    """A plan's graph on the traced tensors."""
    return plan(*tensors)




# -- plans (run at trace time, on real values) ------------------------------------------------------
class _Plans:
    """The recorded graphs, one attribute each (Dynamo guards the one attribute a compiled function reads)."""


_PLANS = _Plans()
_KEYS: dict = {}  # (function, spec, meta, object ids) -> (attribute name, output spec, objects kept alive)
_COUNTER = itertools.count()


def _plan(function, spec, meta, object_ids: tuple, *tensors):
    """The name of the plan of this call under `_PLANS` and its output spec (made on the first call).

    `object_ids` are the identities of the call's objects: the plan runs at trace time, while the traced frame
    holds them, and a made plan keeps them (so no other object takes one of these identities while it lives).
    """
    objects = tuple(_object_at(i) for i in object_ids)
    if any(type(t).__name__ == "FakeTensor" or t.device.type == "meta" for t in tensors):
        raise RuntimeError(
            "blochsim under torch.export: export with strict=True (torch.export.export(module, args, strict=True)); "
            "the simulation's structure is read from the example values, which non-strict export does not show")
    key = (function, spec, meta, object_ids)
    hit = _KEYS.get(key)
    if hit is None:
        # Outside any torch.func transform being traced (torch.func.grad of a function that simulates): the
        # recording is of plain tensors; the transform applies to the plan's graph where Dynamo inlines it.
        with temporarily_clear_interpreter_stack():
            graph, out_spec = _record(function, spec, objects, tensors)
        name = f"plan_{next(_COUNTER)}"
        setattr(_PLANS, name, graph)
        hit = _KEYS[key] = (name, out_spec, objects)
    return hit[0], hit[1]


def _object_at(identity: int):
    """The live object whose id() is `identity` (CPython's id is its address)."""
    return ctypes.cast(identity, ctypes.py_object).value


def _record(function, spec, objects, tensors):
    """The plan's graph and output spec: make_fx of the eager call, every floating tensor requiring grad.

    The call is played on the real values and on values scaled by `1 - _NUDGE`, by turns, until two plays in a
    row record the same graph: the first calls fill the engine's structure caches (a Simulator walks its
    layout, then resolves it as an affine map of the protocol, then checks the map at a second point), and a
    value read on the host to decide structure would be a constant that differs between the two points, so
    the plays would never agree.
    """
    placeholders = [_plain(t).detach().requires_grad_(t.is_floating_point() or t.is_complex()) for t in tensors]
    points = (placeholders, _nudged(placeholders))
    previous = None
    for play in range(_MAX_PLAYS):
        graph, out_spec, results = _trace(function, spec, objects, points[play % 2])
        if previous is not None and _same(previous, graph):
            break
        previous = graph
    else:
        culprits = [i for i in range(len(tensors)) if not _same(
            _trace(function, spec, objects, placeholders)[0],
            _trace(function, spec, objects, _nudged(placeholders, {i}))[0])]
        paths = _paths(spec)
        raise RuntimeError(
            f"{function.__qualname__} under torch.compile: the structure of this call depends on the values of "
            f"{', '.join(paths[i] for i in culprits) or 'its tensors'}, which the compiled function would keep "
            "from its first call; give those as Python numbers (constants of the compiled function), or make this "
            "call outside it")
    if len(out_spec) != 1 or _has_objects(out_spec[0]):
        raise TypeError(f"under torch.compile, {function.__qualname__} must return tensors, tuples or dataclasses "
                        "of tensors")
    _fold_constants(graph)
    cuda = [r.device for r in results if isinstance(r, torch.Tensor) and r.device.type == "cuda"]
    if cuda:
        _move_to(graph, cuda[0])
    graph.recompile()
    if hasattr(graph, "real_recompile"):  # a lazy graph module compiles its code on first call, which Dynamo skips
        graph.real_recompile()
    return graph, out_spec[0]


#: Plays that may record before two in a row agree: a Simulator walks its layout (1), resolves it as an affine
#: map (2) and then runs the map (3); a description built afresh agrees from the second play.
_MAX_PLAYS = 5

#: The relative change of every floating value at the second point (`_record`): far above float32
#: round-off, so a value that decides structure reads differently, and small enough to stay inside every
#: accepted range that the recorded values are in (fractions summing to 1 shrink; times stay positive).
_NUDGE = 2.0**-10


def _nudged(placeholders, which=None) -> list:
    return [p.detach().mul(1 - _NUDGE).requires_grad_() if p.requires_grad and (which is None or i in which) else p
            for i, p in enumerate(placeholders)]


def _trace(function, spec, objects, placeholders):
    from torch.fx.experimental.proxy_tensor import make_fx

    global _PLANNING_DEPTH
    out_spec, results = [], []

    def play(*values):
        args, kwargs = _unflatten(spec, values, objects)
        result = function(*args, **kwargs)
        flat = []
        out_spec.append(_flatten(result, flat, []))
        results.extend(flat)
        return flat

    _PLANNING_DEPTH += 1
    try:
        with torch.enable_grad():
            # Host reads of the values are allowed: they become constants, which `_record` checks.
            graph = make_fx(play, tracing_mode="real", _error_on_data_dependent_ops=False)(*placeholders)
    finally:
        _PLANNING_DEPTH -= 1
    graph.graph.eliminate_dead_code()  # host reads (.item()) whose values became constants
    return graph, out_spec, results


#: Operations that pass their input's values on unchanged (how a constant reaches the graph differs between a
#: first and a later call: a cached tensor is used as it is, a new one is lifted).
_PASSING = ("aten::lift_fresh_copy", "aten::detach", "aten::alias")


def _canonical(graph: torch.fx.GraphModule) -> tuple:
    """The operations of a recording in order, each with its arguments: earlier results by position, tensor
    constants by position in the returned list of constants, other values as they are."""
    index, steps, constants = {}, [], []

    def arg(a):
        if isinstance(a, torch.fx.Node):
            return index[a]
        if isinstance(a, (list, tuple)):
            return type(a)(arg(x) for x in a)
        if isinstance(a, dict):
            return tuple((k, arg(v)) for k, v in a.items())
        return a

    for node in graph.graph.nodes:
        if node.op == "placeholder":
            index[node] = ("input", len(index))
        elif node.op == "get_attr":
            value = getattr(graph, node.target)
            index[node] = ("constant", len(constants))
            constants.append(value)
        elif node.op == "call_function" and getattr(node.target, "name", lambda: "")() in _PASSING:
            index[node] = index[node.args[0]]
        elif node.op == "output":
            steps.append(("output", arg(node.args)))
        else:
            index[node] = ("step", len(steps))
            steps.append((str(node.target), arg(node.args), arg(node.kwargs)))
    return steps, constants


def _plain(t: torch.Tensor) -> torch.Tensor:
    """`t` without torch.func's wrappers (the real value of a tensor inside a transform being traced)."""
    while torch._C._functorch.is_functorch_wrapped_tensor(t):
        t = torch._C._functorch.get_unwrapped(t)
    return t


def _same(a: torch.fx.GraphModule, b: torch.fx.GraphModule) -> bool:
    """Whether two recordings compute the same thing: the same operations on the same scalars and equal
    constants."""
    steps_a, constants_a = _canonical(a)
    steps_b, constants_b = _canonical(b)
    if steps_a != steps_b or len(constants_a) != len(constants_b):
        return False
    return all(x.shape == y.shape and x.dtype == y.dtype and torch.equal(x, y) if isinstance(x, torch.Tensor)
               else x == y for x, y in zip(constants_a, constants_b, strict=True))


def _paths(spec) -> dict:
    """Tensor index -> where it sits in the call's arguments, for messages ("argument 1.t1_ms",
    "mrf_description's flip_rad")."""
    out = {}

    def walk(s, at: str) -> None:
        kind = s[0]
        if kind == "T":
            out[s[1]] = at
        elif kind == "D":
            name = s[1].__name__
            for i, a in enumerate(s[2][1]):
                walk(a, f"{name}'s argument {i}")
            for k, a in s[3][1]:
                walk(a, f"{name}'s {k}")
        elif kind in ("L", "U"):
            for i, a in enumerate(s[1]):
                walk(a, f"{at}[{i}]")
        elif kind == "M":
            for k, a in s[1]:
                walk(a, f"{at}[{k!r}]")
        elif kind == "C":
            for k, a in s[2]:
                walk(a, f"{at}.{k}")

    args, kwargs = spec[1]
    for i, a in enumerate(args[1]):
        walk(a, f"argument {i}")
    for k, a in kwargs[1]:
        walk(a, k)
    return out


def _has_objects(spec) -> bool:
    if spec[0] == "O":
        return True
    if spec[0] in ("L", "U"):
        return any(_has_objects(s) for s in spec[1])
    if spec[0] == "M":
        return any(_has_objects(s) for _, s in spec[1])
    if spec[0] == "C":
        return any(_has_objects(s) for _, s in spec[2])
    return False


def _schema(node: torch.fx.Node):
    return getattr(node.target, "_schema", None) if node.op == "call_function" else None


def _is_view(node: torch.fx.Node) -> bool:
    schema = _schema(node)
    return schema is not None and bool(schema.returns) and schema.returns[0].alias_info is not None


def _written(node: torch.fx.Node) -> list:
    """The graph nodes an in-place operation writes to."""
    schema = _schema(node)
    if schema is None or not schema.is_mutable:
        return []
    out = []
    for argument, value in zip(schema.arguments, node.args, strict=False):
        if argument.alias_info is not None and argument.alias_info.is_write and isinstance(value, torch.fx.Node):
            out.append(value)
    return out


def _out_of_place(graph: torch.fx.GraphModule) -> None:
    """`x.add_(y)` on a tensor `x` used by nothing else (a buffer the engine filled) as `x.add(y)`."""
    for node in list(graph.graph.nodes):
        written = _written(node)
        schema = _schema(node)
        if len(written) != 1 or written[0] is not node.args[0] or len(written[0].users) != 1 or \
                written[0].op != "call_function" or _is_view(written[0]) or not schema.name.endswith("_"):
            continue
        packet = getattr(torch.ops.aten, schema.name.split("::")[1][:-1], None)
        functional = getattr(packet, schema.overload_name or "default", None)
        if functional is not None:
            node.target = functional


def _fold_constants(graph: torch.fx.GraphModule) -> None:
    """Compute, once, every operation whose inputs are all constants (the structure: event rows, interval
    lengths, distinct intervals) and keep its result as a constant of the graph. What remains runs on the
    traced tensors; no data-dependent shape (torch.unique of the intervals) is left for the compiler."""
    _out_of_place(graph)
    pinned = set()  # tensors written in place: not constants, nor is anything they alias
    for node in graph.graph.nodes:
        for target in _written(node):
            while _is_view(target) and isinstance(target.args[0], torch.fx.Node):
                target = target.args[0]
            pinned.add(target)
    known = {}
    for node in graph.graph.nodes:
        if node.op == "get_attr":
            known[node] = getattr(graph, node.target)
            continue
        schema = _schema(node)
        if node.op != "call_function" or node in pinned or (schema is not None and (
                schema.is_mutable or schema.name.startswith("blochsim::"))):
            continue
        if torch.Tag.nondeterministic_seeded in getattr(node.target, "tags", ()):
            continue
        inputs = [a for a in node.all_input_nodes]
        if not all(a in known for a in inputs):
            continue
        args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs), lambda a: known[a])
        known[node] = node.target(*args, **kwargs)
    count = 0
    for node in list(graph.graph.nodes):
        if node.op != "call_function" or node not in known or not isinstance(known[node], torch.Tensor):
            continue
        if all(user in known for user in node.users):
            continue
        name = f"_folded_{count}"
        count += 1
        graph.register_buffer(name, known[node])
        with graph.graph.inserting_before(node):
            constant = graph.graph.get_attr(name)
        node.replace_all_uses_with(constant)
    graph.graph.eliminate_dead_code()
    for node in graph.graph.nodes:  # each constant its own storage (a saved export groups tensors by storage)
        value = getattr(graph, node.target) if node.op == "get_attr" else None
        if isinstance(value, torch.Tensor) and value.untyped_storage().nbytes() != value.nbytes:
            setattr(graph, node.target, value.clone())


def _move_to(graph: torch.fx.GraphModule, device: torch.device) -> None:
    """Make every host tensor of the graph (constants, factories, copies) on `device` instead: the eager
    engine compiles on the host and copies to the device; the plan does the same arithmetic there."""
    host = torch.device("cpu")

    def placed(value):
        if isinstance(value, torch.device) and value == host:
            return device
        if isinstance(value, (list, tuple)):
            return type(value)(placed(v) for v in value)
        return value

    for node in graph.graph.nodes:
        if node.op == "call_function":
            node.args = placed(node.args)
            node.kwargs = {k: placed(v) for k, v in node.kwargs.items()}
        elif node.op == "get_attr":
            value = getattr(graph, node.target)
            if isinstance(value, torch.Tensor) and value.device == host:
                setattr(graph, node.target, value.to(device))
