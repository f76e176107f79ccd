"""`NonlinearLeastSquares`: voxel-parallel Levenberg-Marquardt on the simulator, with standard errors."""

from __future__ import annotations

from collections.abc import Mapping

import torch

from .. import _execution
from .._arrays import library_of, to_library, to_tensor
from .._free_variables import FreeVariable
from .._progress import progress_bar
from ._placement import budget_bytes, run_device, stage
from .base import Estimator, _own_voxels, _voxel_report
from .dictionary import DictionaryMatcher

__all__ = ["NonlinearLeastSquares"]

#: Each start drawn from the start dictionary is moved at least this fraction of its bound's width inside
#: it: a draw may land on the bound itself, where the free variable is infinite.
_START_INSIDE = 1e-6

#: The longest step of one iteration in any free variable (see `_levenberg_marquardt`): 1 moves a sigmoid-
#: bounded unknown from the middle of its range to 73 % of it, so a few steps still cross the range.
MAX_FREE_STEP = 1.0

#: A bounded free variable this far out (sigmoid(20) = 1 - 2e-9) puts its unknown on the bound to float32:
#: the voxel's minimum lies beyond it, and it stops there (not converged) instead of creeping on.
SATURATED_FREE = 20.0

#: Simulated values are taken to be good to this many epsilons of their dtype (float32 round-off accumulated
#: over a train's events); the cost is then resolved to `_linearised`'s resolution, and a voxel whose
#: predicted decrease is below it stops (measured: 4 of 10k MRF voxels otherwise damp out at 1-3.5e-6 of
#: their cost, where trial costs differ by round-off only).
RESOLUTION_EPS = 4.0


class _Free(FreeVariable):
    """One unknown's free variable `x` and its value (the mapping `blochsim._free_variables` describes, shared
    with `ModelOperator`)."""

    def free(self, value, what: str):
        """The inverse of `value`; ValueError naming `what` and the first voxel on or outside a bound."""
        outside = self.outside(value)
        if bool(outside.any()):
            first = int(outside.nonzero()[0, 0])
            raise ValueError(f"{what}: the start of {self.name} is on or outside its bounds ({self.low}, "
                             f"{self.high}) in {int(outside.sum())} voxel(s), the first at flat index {first} with "
                             f"{float(value[first]):g}; start strictly inside")
        return self.inverse(value)

    def inside(self, value):
        """`value` moved at least `_START_INSIDE` of the width inside a two-sided bound (for drawn starts)."""
        if not self.two_sided:
            return value
        margin = _START_INSIDE * (self.high - self.low)
        return value.clamp(self.low + margin, self.high - margin)


class NonlinearLeastSquares(Estimator):
    """Voxel-parallel Levenberg-Marquardt fit of the acquisition's signal to each voxel.

    `NonlinearLeastSquares(acquisition=None, *, bounds=None, scale=None, amplitude=True, max_iterations=100,
    tolerance=1e-6, damping=1e-3, damping_up=10.0, damping_down=0.1, start="match", start_samples=2000,
    chunk_size=65536)`.

    The residual of a voxel `y` is `[Re; Im](a s(theta) - y)`. With `amplitude=True` the complex amplitude `a`
    (proton density times receive phase) is eliminated in closed form, `a = <s,y>/<s,s>`, and the step uses
    the projected (Kaufman) Jacobian `P (a ds/dx)`, `P` the projection off `s` and `i s`. Unknowns are fitted
    in free variables that keep them inside their bounds (`low + (high - low) sigmoid(x)` when two-sided,
    `low + step softplus(x)`, `high - step softplus(-x)`, `step x` unbounded, `step` from `scale` in property
    units, default 1). The Jacobian is one forward-mode pass of the simulator per block (`Simulator.jacobian`).

    Each voxel keeps its own damping `lambda` and solves `(J^T J + lambda diag(J^T J)) dx = -J^T r`: a step
    that lowers its cost is accepted and `lambda *= damping_down`, otherwise `lambda *= damping_up`; no step
    moves a free variable by more than 1. A voxel stops once the cost change its undamped (Gauss-Newton) step
    predicts, relative to its cost, or that step itself falls below `tolerance` (judged undamped: a damped
    step is small whenever the damping is large), or below the cost's resolution given the simulation's
    round-off. A voxel whose minimum lies beyond a bound stops on it with `converged` False, as does one
    still running after `max_iterations`. Voxels run in blocks of at most `chunk_size` (fewer if the execution
    policy's byte budget asks), where the volume is or where the policy says.

    `fit(**ranges, known=..., noise_std=..., seed=...)` records the unknowns, their ranges become bounds
    (unless `bounds={name: (low | None, high | None)}` says otherwise), and prepares the start: `"match"`
    matches each voxel against a dictionary of `start_samples` draws from the ranges (known properties drawn
    from theirs); `"center"` starts mid-bound; `{name: value or map}` starts there.

    `map(volume, known=None, *, uncertainty=False, execution=None, initial=None)` returns the maps, plus
    `M0 = |a|` with `amplitude`; `initial={name: value or map}` overrides the start for this call (a start on
    or outside a bound raises ValueError). After `map`, `report` holds per-voxel `iterations`, `converged` and
    `cost` (`|r|^2`). Standard errors (`uncertainty=True`, `uncertainty_of`) are
    `sqrt(sigma^2 diag((J^T J)^-1))` at the solution in natural units, the amplitude's two real parts among
    the parameters (so the unknowns' errors account for fitting it); `sigma` is `fit`'s `noise_std` when it was
    given, else estimated as `RSS / (2 contrasts - P)` with P the unknowns plus the amplitude's 2.
    """

    def __init__(self, acquisition=None, *, bounds=None, scale=None, amplitude=True, max_iterations=100,
                 tolerance=1e-6, damping=1e-3, damping_up=10.0, damping_down=0.1, start="match",
                 start_samples=2000, chunk_size=65536):
        super().__init__(acquisition)
        for name, value in (("max_iterations", max_iterations), ("start_samples", start_samples),
                            ("chunk_size", chunk_size)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"NonlinearLeastSquares: {name} must be a positive integer, got {value!r}")
        for name, value in (("tolerance", tolerance), ("damping", damping)):
            if not (isinstance(value, (int, float)) and value > 0):
                raise ValueError(f"NonlinearLeastSquares: {name} must be a positive number, got {value!r}")
        if not (isinstance(damping_up, (int, float)) and damping_up > 1):
            raise ValueError(f"NonlinearLeastSquares: damping_up must be > 1, got {damping_up!r}")
        if not (isinstance(damping_down, (int, float)) and 0 < damping_down < 1):
            raise ValueError(f"NonlinearLeastSquares: damping_down must be in (0, 1), got {damping_down!r}")
        if not (start in ("match", "center") or isinstance(start, Mapping)):
            raise ValueError(f"NonlinearLeastSquares: start must be 'match', 'center' or {{name: value}}, got "
                             f"{start!r}")
        self.bounds = dict(bounds) if bounds is not None else None
        self.scale = dict(scale) if scale is not None else {}
        self.amplitude = bool(amplitude)
        self.max_iterations, self.tolerance = max_iterations, float(tolerance)
        self.damping, self.damping_up, self.damping_down = float(damping), float(damping_up), float(damping_down)
        self.start, self.start_samples, self.chunk_size = start, start_samples, chunk_size
        self.report: dict | None = None
        self._free: list = []
        self._start_matcher = None
        self._initial = None  # map()'s `initial` during that call
        self._solution = None  # (signals, known, theta, amplitude, cost) of the last solve, for uncertainty

    # -- fit ------------------------------------------------------------------------------------------
    def fit(self, unknown=None, *, known=None, noise_std=0.0, seed=None, samples=None, chunk=4096,
            rank=None, subspace=None, **ranges):
        """Record the unknowns and their bounds, and prepare the start; see the class docstring."""
        unknown = self._merge_unknown(unknown, ranges)
        if not unknown:
            raise ValueError("NonlinearLeastSquares.fit: name at least one unknown with its range, e.g. "
                             "fit(T1=(200, 3000), T2=(10, 300))")
        bounds = dict(self.bounds or {})
        for name in bounds:
            if name not in unknown:
                raise ValueError(f"NonlinearLeastSquares: bounds names {name!r}, which is not an unknown "
                                 f"{tuple(unknown)}")
        for name in self.scale:
            if name not in unknown:
                raise ValueError(f"NonlinearLeastSquares: scale names {name!r}, which is not an unknown "
                                 f"{tuple(unknown)}")
        free = []
        for name, spec in unknown.items():
            bound = bounds.get(name, spec if isinstance(spec, tuple) else None)
            if bound is None:
                raise ValueError(f"NonlinearLeastSquares.fit: {name!r} needs bounds: give its range "
                                 f"({name}=(low, high)) or bounds={{{name!r}: (low | None, high | None)}}")
            free.append(self._bound(name, bound))
        if self.start == "match":
            samples = samples if samples is not None else self.start_samples
        elif samples is None:
            samples = 1  # one voxel: the contrast count the volumes must have
        self._free = free
        super().fit(unknown, known=known, noise_std=noise_std, rank=rank, subspace=subspace, seed=seed,
                    samples=samples, chunk=chunk)
        if isinstance(self.start, Mapping):
            extra = [n for n in self.start if n not in self._unknown]
            if extra:
                raise ValueError(f"NonlinearLeastSquares: start names {extra[0]!r}, which is not an unknown "
                                 f"{self._unknown}")
        return self

    def _bound(self, name: str, bound) -> _Free:
        if not isinstance(bound, (tuple, list)) or len(bound) != 2:
            raise ValueError(f"NonlinearLeastSquares: the bounds of {name!r} must be a pair (low | None, "
                             f"high | None), got {bound!r}")
        low, high = (None if b is None else float(b) for b in bound)
        if low is not None and high is not None and not low < high:
            raise ValueError(f"NonlinearLeastSquares: the bounds of {name!r} need low < high, got {bound!r}")
        step = self.scale.get(name, 1.0)
        if not (isinstance(step, (int, float)) and step > 0):
            raise ValueError(f"NonlinearLeastSquares: scale[{name!r}] must be a positive number (property units "
                             f"per unit step), got {step!r}")
        return _Free(name, low, high, float(step))

    def _fit_arrays(self, signals, parameters, known, *, noise_std) -> None:
        if self.start == "match":
            self._start_matcher = DictionaryMatcher(dictionary=signals, parameters=parameters)
        if self.start == "center":
            for f in self._free:
                if not f.two_sided:
                    raise ValueError(f"NonlinearLeastSquares: start='center' needs two-sided bounds; {f.name!r} "
                                     f"has ({f.low}, {f.high})")

    # -- map ------------------------------------------------------------------------------------------
    def map(self, volume, known=None, *, uncertainty=False, execution=None, initial=None):
        """Maps (and standard errors) of `volume` `(..., contrasts)`; see the class docstring."""
        self._initial = _own_voxels(initial, volume)  # inside distributed(): this rank's voxels' starts
        try:
            out = super().map(volume, known, uncertainty=uncertainty, execution=execution)
        finally:
            self._initial = None
        self._shape_report(volume)
        return out

    def uncertainty_of(self, volume, known=None, *, execution=None):
        out = super().uncertainty_of(volume, known, execution=execution)
        self._shape_report(volume)
        return out

    def _shape_report(self, volume) -> None:
        if self.report is not None:
            shape = tuple(to_tensor(volume, name="volume").shape[:-1])
            library = library_of(volume)
            report, shape = _voxel_report(self.report, shape)  # inside distributed(): gathered, or the rank's own
            self.report = {k: to_library(v.reshape(shape), library) for k, v in report.items()}

    def _starts(self, signals: torch.Tensor, known) -> torch.Tensor:
        """Free variables `(V, P)` float64 to start from."""
        count, device = signals.shape[0], signals.device
        start = self._initial if self._initial is not None else self.start
        if isinstance(start, Mapping):
            extra = [n for n in start if n not in self._unknown]
            if extra:
                raise ValueError(f"NonlinearLeastSquares: initial names {extra[0]!r}, not an unknown "
                                 f"{self._unknown}")
            columns = []
            for f in self._free:
                if f.name in start:
                    value = to_tensor(start[f.name], name=f"initial[{f.name!r}]").detach().to(device, torch.float64)
                    if value.numel() not in (1, count):
                        raise ValueError(f"initial[{f.name!r}] has {value.numel()} values, the volume {count} "
                                         "voxels")
                    columns.append(f.free(value.reshape(-1).expand(count), f"initial[{f.name!r}]"))
                elif f.two_sided:
                    columns.append(torch.zeros(count, dtype=torch.float64, device=device))
                else:
                    raise ValueError(f"initial needs {f.name!r}: it has no two-sided bound to start mid-way in")
            return torch.stack(columns, -1)
        if start == "center":
            return torch.zeros((count, len(self._free)), dtype=torch.float64, device=device)
        matched = self._start_matcher._estimate_arrays(signals, None)  # (V, P + 1): the unknowns, then M0
        return torch.stack([f.free(f.inside(matched[:, j].to(device, torch.float64)), "the matched start")
                            for j, f in enumerate(self._free)], -1)

    def _estimate_arrays(self, signals, known):
        theta, amplitude, cost = self._solve(signals, known)
        maps = {f.name: theta[:, j].to(torch.float32) for j, f in enumerate(self._free)}
        if self.amplitude:
            maps["M0"] = amplitude.abs().to(torch.float32)
        self._solution = (signals, known, theta, amplitude, cost)
        return maps

    def _uncertainty_arrays(self, signals, known):
        last = self._solution
        if last is not None and last[0] is signals and last[1] is known:
            _, _, theta, amplitude, cost = last
        else:
            theta, amplitude, cost = self._solve(signals, known)
        self._solution = None
        return self._standard_errors(signals, known, theta, amplitude, cost)

    # -- the solver -------------------------------------------------------------------------------------
    def _model(self, theta: torch.Tensor, known, jacobian: bool):
        """Signal `(n, C)` (and natural-unit Jacobian `(n, P, C)`) at `theta` `(n, P)` float64, as complex128,
        projected onto the subspace when there is one."""
        values = {f.name: theta[:, j].to(torch.float32) for j, f in enumerate(self._free)}
        if known is not None:
            values.update({n: known[:, j] for j, n in enumerate(self._known)})
        if jacobian:
            signal, J = self.acquisition.jacobian(self._unknown, **values)
            if J.dim() == 4:  # (trains, voxels, P, samples): the trains join the contrasts
                J = J.permute(1, 2, 0, 3)
        else:
            signal, J = self.acquisition.simulate(**values), None
        signal = _rows(signal, theta.shape[0])
        # The relative resolution of the simulated values (see _linearised): a few float32 epsilons from a
        # float32 simulation, accumulated over its events.
        self._resolution = RESOLUTION_EPS * torch.finfo(signal.real.dtype).eps
        signal = signal.to(torch.complex128)
        if J is not None:
            J = J.reshape(theta.shape[0], len(self._free), -1).to(torch.complex128)
        if self._subspace is not None:
            signal = self._subspace.project(signal)
            J = self._subspace.project(J) if J is not None else None
        return signal, J

    def _normal(self, signal: torch.Tensor, J: torch.Tensor, slopes: torch.Tensor, y: torch.Tensor,
                yy: torch.Tensor) -> tuple:
        """(amplitude `(n,)`, cost `(n,)`, `A = Re(G^H G)` `(n, P, P)`, `g = Re(G^H r)` `(n, P)`, cost resolution)
        from the signal `s`, its natural-unit Jacobian `J` `(n, P, C)`, the free variables' slopes and the data.

        Everything comes from the inner products of `[J; s]` with `[J; s; y]`, one product per voxel, so no
        `(n, P, C)` array but `J` itself is made: with `u_p = J_p`, `w = s`, the Kaufman Jacobian is
        `G_p = a slope_p P u_p` (`P` the projection off `w`), and `Re(G_p^H G_q) = |a|^2 slope_p slope_q
        Re(u_p^H u_q - (u_p^H w)(w^H u_q)/|w|^2)`, `Re(G_p^H r) = -slope_p Re(conj(a) (u_p^H y - (u_p^H w)
        (w^H y)/|w|^2))` (as `P r = -P y`), `a = w^H y/|w|^2` and the cost `|y|^2 - |w^H y|^2/|w|^2`, all in
        float64. Without `amplitude`: `a = 1`, `A = slope slope Re(u^H u)`, `g = slope Re(u^H w - u^H y)`, cost
        `|w|^2 - 2 Re(w^H y) + |y|^2`.

        The resolution is how far the cost may be off from the simulation's round-off alone: a relative change
        `eps` in each simulated value moves it by about `2 eps |a| |r| |s| / sqrt(C)` for independent round-off
        spread over the C samples.
        """
        n, P, C = J.shape
        uu = torch.bmm(J.conj(), J.transpose(1, 2))  # (n, P, P): u_p^H u_q
        uw, uy = torch.bmm(J.conj(), torch.stack([signal, y], -1)).unbind(-1)  # (n, P) each
        ww = torch.view_as_real(signal).square().sum((-1, -2)).clamp_min(1e-300)
        wy = (signal.conj() * y).sum(-1)
        outer = slopes[:, :, None] * slopes[:, None, :]
        if self.amplitude:
            a = wy / ww
            cost = (yy - wy.abs().square() / ww).clamp_min(0.0)
            projected = uu - uw[:, :, None] * uw.conj()[:, None, :] / ww[:, None, None]
            A = a.abs().square()[:, None, None] * outer * projected.real
            g = -slopes * (a.conj()[:, None] * (uy - uw * (wy / ww)[:, None])).real
        else:
            a = torch.ones(n, dtype=wy.dtype, device=wy.device)
            cost = (ww - 2 * wy.real + yy).clamp_min(0.0)
            A = outer * uu.real
            g = slopes * (uw - uy).real
        resolution = 2 * self._resolution * a.abs() * cost.sqrt() * (ww / C).sqrt()
        return a, cost, A, g, resolution

    def _solve(self, signals: torch.Tensor, known) -> tuple:
        """(theta `(V, P)` float64, amplitude `(V,)`, cost `(V,)`) on `signals`' device; fills `report`."""
        home, count = signals.device, signals.shape[0]
        device = run_device(home)
        P, C = len(self._free), signals.shape[-1]
        per_voxel = (3 * P + 6) * C * 16  # Jacobians, signals, residuals in complex128, with room
        block = max(1, min(self.chunk_size, count, budget_bytes(device) // per_voxel or 1))
        theta = torch.empty((count, P), dtype=torch.float64, device=home)
        amplitude = torch.empty(count, dtype=torch.complex128, device=home)
        cost = torch.empty(count, dtype=torch.float64, device=home)
        iterations = torch.zeros(count, dtype=torch.int64, device=home)
        converged = torch.zeros(count, dtype=torch.bool, device=home)
        with progress_bar(count, desc="blochsim least squares", unit="voxel", unit_scale=True,
                          enabled=_execution.active().progress) as bar:
            for start in range(0, count, block):
                rows = slice(start, min(count, start + block))
                y = stage(signals[rows], device).to(torch.complex128)
                k = stage(known[rows], device) if known is not None else None
                x0 = self._starts(y, k)
                out = self._levenberg_marquardt(y, k, x0, bar)
                for target, value in zip((theta, amplitude, cost, iterations, converged), out, strict=True):
                    target[rows] = value.to(home)
        self.report = {"iterations": iterations, "converged": converged, "cost": cost}
        return theta, amplitude, cost

    def _values(self, x: torch.Tensor) -> torch.Tensor:
        return torch.stack([f.value(x[:, j]) for j, f in enumerate(self._free)], -1)

    def _slopes(self, x: torch.Tensor) -> torch.Tensor:
        return torch.stack([f.slope(x[:, j]) for j, f in enumerate(self._free)], -1)

    def _levenberg_marquardt(self, y, known, x, bar) -> tuple:
        """Per-voxel damped Gauss-Newton from free variables `x` `(n, P)`; returns (theta, a, cost, iterations,
        converged). The state of the voxels still running is kept compact (finished voxels leave it)."""
        n, P = x.shape
        device = y.device
        theta_out = torch.empty((n, P), dtype=torch.float64, device=device)
        a_out = torch.empty(n, dtype=torch.complex128, device=device)
        cost_out = torch.empty(n, dtype=torch.float64, device=device)
        iterations = torch.zeros(n, dtype=torch.int64, device=device)
        converged = torch.zeros(n, dtype=torch.bool, device=device)
        index = torch.arange(n, device=device)
        lam = torch.full((n,), self.damping, dtype=torch.float64, device=device)
        yy = torch.view_as_real(y).square().sum((-1, -2)) if y.is_complex() else y.square().sum(-1)
        a, cost, A, g, resolution = self._linearised(x, y, known, yy)
        bounded = torch.tensor([f.low is not None or f.high is not None for f in self._free], device=device)
        for step_count in range(self.max_iterations + 1):
            diag = torch.diagonal(A, dim1=1, dim2=2)
            floor = 1e-12 * diag.amax(-1, keepdim=True).clamp_min(1e-300)  # a parameter the data do not see
            scaling = torch.diag_embed(diag.clamp_min(floor))
            # Convergence is judged on the undamped (Gauss-Newton) step, not the damped one: a large damping
            # makes any step small, and a voxel creeping along a curved valley makes small accepted gains far
            # from its minimum. The decrease it predicts, g^T A^-1 g / 2, is what the cost can still lose.
            newton = torch.linalg.solve(A + 1e-9 * scaling, g)
            predicted = 0.5 * (g * newton).sum(-1)
            # Below the cost's resolution the acceptance test compares round-off: that is converged too.
            done = (predicted <= self.tolerance * cost + resolution) | (
                newton.abs().amax(-1) <= self.tolerance * (1 + x.abs().amax(-1)))
            # Stopped, not converged: a voxel with no usable step (its free variables saturated, or its damping
            # past any use: 1e16 gives steps below float64 resolution of a Gauss-Newton step), and one pressed
            # against a bound (a bounded free variable past SATURATED_FREE, where its value equals the bound to
            # float32 and each step only creeps on).
            stuck = ~torch.isfinite(predicted) | (lam > 1e16) | ((x.abs() >= SATURATED_FREE) & bounded).any(-1)
            done = (done & ~stuck) | stuck
            if step_count == self.max_iterations:
                stuck = torch.ones_like(done)  # out of iterations: stop, not converged
                done = stuck | done
            if bool(done.any()):
                finished = index[done]
                theta_out[finished], a_out[finished], cost_out[finished] = self._values(x[done]), a[done], cost[done]
                converged[finished] = ~stuck[done]
                bar.update(finished.numel())
                go = ~done
                index, x, y, yy, a, cost, lam, A, g, scaling, resolution = (
                    t[go] for t in (index, x, y, yy, a, cost, lam, A, g, scaling, resolution))
                known = known[go] if known is not None else None
            if index.numel() == 0:
                break
            step = -torch.linalg.solve(A + lam[:, None, None] * scaling, g[..., None])[..., 0]
            # At most MAX_FREE_STEP per iteration in any free variable: a longer step of a sigmoid-bounded unknown
            # lands deep in its bound, where the slope vanishes and the voxel cannot come back.
            step = step * (MAX_FREE_STEP / step.abs().amax(-1, keepdim=True).clamp_min(MAX_FREE_STEP))
            trial = x + step
            a_t, cost_t, A_t, g_t, resolution_t = self._linearised(trial, y, known, yy)
            better = cost_t < cost
            iterations[index] += 1
            keep, keep2 = better[:, None], better[:, None, None]
            x, a, cost = torch.where(keep, trial, x), torch.where(better, a_t, a), torch.where(better, cost_t, cost)
            A, g = torch.where(keep2, A_t, A), torch.where(keep, g_t, g)
            resolution = torch.where(better, resolution_t, resolution)
            lam = torch.where(better, lam * self.damping_down, lam * self.damping_up)
        return theta_out, a_out, cost_out, iterations, converged

    def _linearised(self, x, y, known, yy) -> tuple:
        """(amplitude, cost, A, g, cost resolution) at free variables `x` (see `_normal`)."""
        signal, J = self._model(self._values(x), known, jacobian=True)
        return self._normal(signal, J, self._slopes(x), y, yy)

    def _standard_errors(self, signals, known, theta, amplitude, cost) -> dict:
        """sqrt(sigma^2 diag(F^-1)) of the unknowns (and of M0 = |a|) at the solution, in natural units."""
        home, count = signals.device, signals.shape[0]
        device = run_device(home)
        P, C = len(self._free), signals.shape[-1]
        block = max(1, min(self.chunk_size, count, budget_bytes(device) // ((P + 4) * C * 16) or 1))
        out = torch.empty((count, P + (1 if self.amplitude else 0)), dtype=torch.float64, device=home)
        for start in range(0, count, block):
            rows = slice(start, min(count, start + block))
            k = stage(known[rows], device) if known is not None else None
            t, a = stage(theta[rows], device), stage(amplitude[rows], device)
            signal, J = self._model(t, k, jacobian=True)
            columns = [a[:, None, None] * J]
            if self.amplitude:  # the amplitude's real and imaginary parts are parameters too
                columns += [signal[:, None, :], 1j * signal[:, None, :]]
            full = torch.cat(columns, 1)
            real = torch.view_as_real(full).reshape(full.shape[0], full.shape[1], -1)
            fisher = torch.bmm(real, real.transpose(1, 2))  # Re(J^H J)
            if self.noise_std > 0:
                variance = torch.full((full.shape[0],), self.noise_std ** 2, dtype=torch.float64, device=device)
            else:
                dof = 2 * C - full.shape[1]
                if dof <= 0:
                    raise ValueError(f"NonlinearLeastSquares: {C} contrasts leave no degrees of freedom to estimate "
                                     f"the noise from {full.shape[1]} parameters; give fit(noise_std=...)")
                variance = stage(cost[rows], device) / dof
            covariance = torch.linalg.pinv(fisher, hermitian=True) * variance[:, None, None]
            se = torch.diagonal(covariance, dim1=1, dim2=2)[:, :P].clamp_min(0).sqrt()
            if self.amplitude:
                u = torch.stack([a.real, a.imag], -1) / a.abs().clamp_min(1e-300)[:, None]
                block_aa = covariance[:, P:, P:]
                se_m0 = torch.einsum("ni,nij,nj->n", u, block_aa, u).clamp_min(0).sqrt()
                se = torch.cat([se, se_m0[:, None]], 1)
            out[rows] = se.to(home)
        names = [f.name for f in self._free] + (["M0"] if self.amplitude else [])
        return {n: out[:, j].to(torch.float32) for j, n in enumerate(names)}


def _rows(signal, count: int) -> torch.Tensor:
    """The acquisition's output as `(count, contrasts)`; a train axis (first) joins the contrasts."""
    signal = to_tensor(signal, name="signal")
    if signal.dim() == 1:
        return signal[:, None] if signal.shape[0] == count else signal[None]
    if signal.dim() == 3:
        return signal.movedim(0, 1).reshape(count, -1)
    return signal.reshape(count, -1)
