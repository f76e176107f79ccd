"""`SequenceDesign`: minimise a differentiable cost of the protocol with torch optimisers, under bounds."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from .._arrays import to_tensor
from .._progress import progress_bar
from .bounded import Bounded

__all__ = ["SequenceDesign", "SequenceOptimization"]


@dataclass(frozen=True)
class SequenceOptimization:
    """What `SequenceDesign.minimize` returns.

    parameters: the final values by name (detached, inside their limits).
    loss: float64 `(steps,)`, the cost before each update (at `history[name][k]` for step k).
    history: per name, the values before each update, `(steps, *shape)`, on the host.
    seconds_per_iteration: float64 `(steps,)`, the wall time of each step (cost, gradient and update).
    stopped_early: True when the callback stopped the loop.
    """

    parameters: dict
    loss: torch.Tensor
    history: dict = field(default_factory=dict)
    seconds_per_iteration: torch.Tensor = field(default_factory=lambda: torch.zeros(0, dtype=torch.float64))
    stopped_early: bool = False

    @property
    def steps(self) -> int:
        return int(self.loss.numel())


class SequenceDesign(torch.nn.Module):
    """A protocol to optimise: named parameters (bounded or free) and a cost of them.

    Args:
        cost: `cost(**values) -> tensor` of one element, differentiable in the values, e.g. the summed
            relative CRLB of a set of tissues (`crlb` of a `Simulator.jacobian`), or any differentiable
            function of signals and Jacobians.
        **parameters: the protocol values to optimise, by the names `cost` takes: `Bounded(initial, lower,
            upper)` for a value held between limits, or an array (number, list, NumPy or torch) for a free
            one. Other arguments of the cost are bound inside it (e.g. with a closure).

    The module's parameters are the free variables: `u` with `x = lower + (upper - lower) sigmoid(u)` for
    a bounded value, the value itself otherwise; `.to(device)` moves them. `values()` gives the values
    (differentiable in the free variables), `forward()` the cost.

    Raises:
        ValueError: no parameters, or a parameter that is neither `Bounded` nor a real array.
    """

    def __init__(self, cost: Callable, **parameters):
        super().__init__()
        if not callable(cost):
            raise TypeError(f"cost must be callable as cost(**values), got {type(cost).__name__}")
        if not parameters:
            raise ValueError("SequenceDesign needs at least one parameter to optimise, e.g. "
                             "SequenceDesign(cost, flip=Bounded(initial, 0.0, 70.0))")
        self.cost = cost
        self.free = torch.nn.ParameterDict()
        self._bounded = []
        for name, value in parameters.items():
            if isinstance(value, Bounded):
                self.free[name] = torch.nn.Parameter(value.free().clone())
                self.register_buffer(f"_lower_{name}", value.lower.clone())
                self.register_buffer(f"_upper_{name}", value.upper.clone())
                self._bounded.append(name)
            else:
                x = to_tensor(value, name=name)
                if not x.is_floating_point():
                    raise ValueError(f"parameter {name!r} must be Bounded(...) or a real array, got dtype {x.dtype}")
                self.free[name] = torch.nn.Parameter(x.detach().clone())

    @property
    def names(self) -> tuple:
        return tuple(self.free.keys())

    def values(self) -> dict:
        """The current values by name, inside their limits; differentiable in the free variables."""
        out = {}
        for name, u in self.free.items():
            if name in self._bounded:
                lower, upper = getattr(self, f"_lower_{name}"), getattr(self, f"_upper_{name}")
                out[name] = lower + (upper - lower) * torch.sigmoid(u)
            else:
                out[name] = u
        return out

    def forward(self) -> torch.Tensor:
        """The cost at the current values, a 0-d tensor. ValueError when the cost is not a single number."""
        loss = self.cost(**self.values())
        if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
            shape = tuple(loss.shape) if isinstance(loss, torch.Tensor) else type(loss).__name__
            raise ValueError(f"cost must return a tensor of one element, got {shape}; sum or average it over the "
                             "tissues (e.g. crlb(J).sum())")
        if loss.is_complex():
            raise ValueError("cost must be real, got a complex tensor; take its real part or its magnitude")
        return loss.reshape(())

    def minimize(self, *, iterations: int = 200, learning_rate: float = 0.05, optimizer_factory=None,
                 callback=None, progress: bool | None = None) -> SequenceOptimization:
        """Run `iterations` steps of an optimiser on the free variables; the module keeps the result.

        Args:
            iterations: steps (>= 1).
            learning_rate: the default optimiser's (Adam) step size, in free-variable units (a bounded
                value's free variable is its logit: 0.05 moves a value at mid-range by ~1% of its width).
            optimizer_factory: `factory(parameters) -> torch.optim.Optimizer` in place of Adam; LBFGS works
                (each step evaluates the cost through a closure).
            callback: `callback(step, parameters, loss)` after each step, with the values the cost was
                evaluated at and that cost; returning True stops.
            progress: a progress bar (tqdm, when installed): True always, False never, None when stderr is
                a terminal and the loop runs past a couple of seconds.

        Returns:
            `SequenceOptimization`. Raises FloatingPointError when the cost or a gradient is not finite
            (the step is named; the module keeps the values of the step before).
        """
        if isinstance(iterations, bool) or not isinstance(iterations, int) or iterations < 1:
            raise ValueError(f"iterations must be an integer >= 1, got {iterations!r}")
        if not (isinstance(learning_rate, (int, float)) and math.isfinite(learning_rate) and learning_rate > 0):
            raise ValueError(f"learning_rate must be a positive number, got {learning_rate!r}")
        params = list(self.free.values())
        optimizer = (torch.optim.Adam(params, lr=learning_rate) if optimizer_factory is None
                     else optimizer_factory(params))
        losses, seconds, history = [], [], {name: [] for name in self.names}
        stopped = False
        with progress_bar(iterations, desc="blochsim design", unit="step", enabled=progress) as bar:
            for step in range(iterations):
                started = time.perf_counter()
                first = self._step(optimizer, params)
                loss = first["loss"]
                if not bool(torch.isfinite(loss)) or not all(p.grad is None or bool(torch.isfinite(p.grad).all())
                                                             for p in params):
                    with torch.no_grad():
                        for p, kept in zip(params, first["free"], strict=True):
                            p.copy_(kept)
                    raise FloatingPointError(f"the cost or its gradient is not finite at step {step} (cost "
                                             f"{float(loss)}); the design keeps the values of that step")
                seconds.append(time.perf_counter() - started)
                losses.append(float(loss))
                for name, value in first["values"].items():
                    history[name].append(value.cpu())
                bar.update(1)
                bar.set_postfix_str(f"cost {float(loss):.4g}", refresh=False)
                if callback is not None and callback(step, first["values"], loss):
                    stopped = True
                    break
        with torch.no_grad():
            final = {k: v.detach().clone() for k, v in self.values().items()}
        return SequenceOptimization(
            parameters=final,
            loss=torch.tensor(losses, dtype=torch.float64),
            history={name: torch.stack(values) for name, values in history.items()},
            seconds_per_iteration=torch.tensor(seconds, dtype=torch.float64),
            stopped_early=stopped,
        )

    def _step(self, optimizer, params: list) -> dict:
        """One optimiser step through a closure (LBFGS calls it several times). Returns the first evaluation:
        its cost, the values it was at, and the free variables before the update."""
        first = {}

        def closure():
            optimizer.zero_grad()
            loss = self.forward()
            loss.backward()
            if not first:
                first["loss"] = loss.detach()
                first["values"] = {k: v.detach().clone() for k, v in self.values().items()}
                first["free"] = [p.detach().clone() for p in params]
            return loss

        optimizer.step(closure)
        return first
