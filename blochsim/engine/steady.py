"""Steady state (`repetitions="auto"`) by extrapolating the playings with Wynn's epsilon.

Let S_j be the samples of playing j. Each playing is an affine map of the EPG state, so S_j - S* is a
sum of modes lambda^j over the eigenvalues of that map, and the Shanks transform of order k (Wynn's
epsilon column 2k) removes k modes exactly.

* A train that never winds keeps every pool in order 0: the state has 3 real dimensions per water-like
  pool (F+(0) and Z(0); F-(0) is its conjugate) and 1 for the semisolid pool, so `2 * modes + 1` terms
  give the fixed point of the affine map exactly, up to rounding. This is the direct solve of the fixed
  point, written through the kernels (which start from equilibrium and expose only samples).
* A winding train has 3 x orders modes per pool; the table is extrapolated from 9, then 17, 33 and 65
  terms until two successive even columns agree to 1e-7 of the largest sample.

The terms are every `stride`-th playing, with `stride` chosen so that the slowest relaxation decays by
about e^-1/2 between terms: a mode with lambda near 1 (a short playing against a long T1) would make the
table ill-conditioned (the error grows like rounding / (1 - lambda)^k), while lambda^stride is a mode of
the strided sequence just as well. Playings run in float64 and the limit is narrowed to the caller's
dtype. Everything is torch arithmetic on the kernels' outputs, so the limit is differentiable like a
simulation: reverse mode, and the Jacobian carried through the table by forward-mode arithmetic.

The CUDA build runs float32 only, where the table cannot work: its terms carry float32 round-off
(~1e-7 of M0) that the extrapolation amplifies by ~1/(1 - lambda)^k. There the train is simply played
until the transient has died out (`play_to_steady_state`): every mode decays at least as fast as the
slowest relaxation time allows (rotations, shifts, spoiling and truncation do not grow a state, and
relaxation shrinks it by e^-t/T over a time t), so after `SETTLE_TIME_CONSTANTS` of the slowest relaxation
time the transient is at most e^-20 = 2e-9 of its start (a few M0 at most) and its derivative along a
relaxation time 20 e^-20 = 4e-8: the result is that of explicit repetitions, float32 round-off and all,
and its derivatives are the kernels' own.
"""

from __future__ import annotations

import dataclasses
import math

import torch

from .. import _native as nat
from .._arrays import differentiated
from .bind import run
from .program import unroll

__all__ = ["wynn", "steady_state", "stride_for", "simulate_steady", "play_to_steady_state", "WINDING_PLAYINGS",
           "SETTLE_TIME_CONSTANTS"]

#: Playings tried for winding trains, in order, until the extrapolation settles.
WINDING_PLAYINGS = (9, 17, 33, 65)

#: float32 steady state (`play_to_steady_state`): the train plays for this many of the slowest relaxation time,
#: after which the transient is at most e^-20 = 2e-9 of its start and its derivative along a relaxation time
#: 20 e^-20 = 4e-8 of it: both far under float32 round-off.
SETTLE_TIME_CONSTANTS = 20

#: Differences below this fraction of a sample's scale count as converged (float64 kernels round at
#: ~1e-13 of the scale over a few thousand events; above 1e-11 a difference carries >= 2 digits).
_CONVERGED = 1e-11
#: Odd entries that agree to this relative precision are equal up to rounding: the step is singular.
_SINGULAR = 1e-12


def _inverse(d, dd, small):
    """1/d and its tangent, with 1 in place of the negligible d (the caller masks those entries)."""
    inv = 1.0 / torch.where(small, torch.ones_like(d), d)
    return inv, None if dd is None else -dd * inv * inv


def wynn(seq: torch.Tensor, tangents: torch.Tensor | None = None):
    """Wynn's epsilon table of `seq` [n, ...]: (limit [...], limit tangents [P, ...] or None, error [...]).

    eps_{-1} = 0, eps_0^(j) = seq[j], eps_{k+1}^(j) = eps_{k-1}^(j+1) + 1 / (eps_k^(j+1) - eps_k^(j)); the
    even columns are the Shanks transforms and the limit is the last entry of the last even column.
    `tangents` [P, n, ...] are the derivatives of the terms along P directions, carried through by
    forward-mode arithmetic. `error` is the difference between the last two even columns. Infinite odd
    entries (converged differences) are tracked by masks, so no division by ~0 reaches autograd.
    """
    scale = seq.detach().abs().amax(0).clamp_min(1e-300)
    even, deven = seq, tangents
    # eps_{-1}: one entry more than eps_0, as every odd column has one more than the even after it
    odd = seq.new_zeros((seq.shape[0] + 1,) + seq.shape[1:])
    dodd = None if tangents is None else tangents.new_zeros((tangents.shape[0], seq.shape[0] + 1) + seq.shape[1:])
    odd_inf = torch.zeros(odd.shape, dtype=torch.bool, device=seq.device)
    limit, dlimit = seq[-1], None if tangents is None else tangents[:, -1]
    error = torch.full_like(scale, float("inf"))
    while even.shape[0] >= 3:
        d = even[1:] - even[:-1]
        dd = None if deven is None else deven[:, 1:] - deven[:, :-1]
        small = d.abs() <= _CONVERGED * scale
        inv, dinv = _inverse(d, dd, small)
        odd, dodd = odd[1:-1] + inv, None if dd is None else dodd[:, 1:-1] + dinv
        odd_inf = small | odd_inf[1:-1]
        d2 = odd[1:] - odd[:-1]
        dd2 = None if dodd is None else dodd[:, 1:] - dodd[:, :-1]
        singular = odd_inf[1:] | odd_inf[:-1] | (d2.abs() <= _SINGULAR * torch.maximum(odd[1:].abs(), odd[:-1].abs()))
        inv2, dinv2 = _inverse(d2, dd2, singular)
        new = even[1:-1] + torch.where(singular, torch.zeros_like(inv2), inv2)
        dnew = None if dd2 is None else deven[:, 1:-1] + torch.where(singular, torch.zeros_like(dinv2), dinv2)
        error = (new[-1] - even[-1]).detach().abs()
        limit, dlimit = new[-1], None if dnew is None else dnew[:, -1]
        even, deven = new, dnew
    return limit, dlimit, error


def stride_for(playing_s: float, slowest_ms: float, *, most: int = 256) -> int:
    """Playings between two terms: about half the slowest relaxation time, at least 1 and at most `most`."""
    if not playing_s > 0:
        return 1
    if not math.isfinite(slowest_ms):
        return most
    return max(1, min(most, math.ceil(0.5 * slowest_ms * 1e-3 / playing_s)))


def steady_state(play, *, modes: int | None):
    """The steady-state samples from `play(n)` -> (terms [n, ...] complex, tangents [P, n, ...] or None).

    `modes` is the number of state dimensions of a train that never winds (exact with 2 * modes + 1
    terms), or None for a winding train (extrapolated until it settles, see the module docstring).
    Returns (limit, limit tangents or None).
    """
    counts = (2 * modes + 1,) if modes is not None else WINDING_PLAYINGS
    for n in counts:
        seq, tangents = play(n)
        limit, dlimit, error = wynn(seq, tangents)
        top = float(seq.detach().abs().max()) if seq.numel() else 0.0
        if modes is not None or not seq.numel() or float(error.max()) <= 1e-7 * max(top, 1e-30):
            break
    return limit, dlimit


def simulate_steady(program, values: tuple, windings: int, packed, fields: dict, jacobian=(), *,
                    keep_double: bool = False):
    """The steady state of `program` (compiled for one playing) on tissue `fields`.

    `packed` is `engine.tissue.pack_tissue(fields, active=jacobian)`; `windings` the shifts per playing
    (0: the exact fixed point). A float64 packing extrapolates float64 playings (the host build); float32,
    the only precision of the CUDA build, plays the train until it has settled (`play_to_steady_state`).
    Returns (signal complex64 [*voxel, S], J complex64 [*voxel, P, S] or None); complex128 with
    `keep_double` (a caller that asked for float64 results, float64 playings).
    """
    if packed.dtype != torch.float64:
        return play_to_steady_state(program, values, packed, fields, jacobian)
    dt, dt_wrap = values[0].detach(), values[1].detach()
    playing_s = float(dt.sum() - dt[0] + dt_wrap[0])
    times = [torch.as_tensor(value).detach() for name, value in fields.items()
             if name.endswith("_ms") and name != "t2_prime_ms"]
    slowest = max((float(t.max()) for t in times if t.numel()), default=0.0)  # no voxels: nothing to wait for
    stride = stride_for(playing_s, slowest)
    modes = None
    if windings == 0:
        modes = 3 * packed.pools.num_transverse + int(packed.pools.semisolid)
    S = program.num_samples

    def play(n):
        unrolled, unrolled_values = unroll(program, values, n, stride=stride)
        signal, jac = run(unrolled, packed, fields, values=unrolled_values, jacobian=jacobian)
        voxel = signal.shape[:-1]
        seq = signal.reshape(voxel + (n, S)).movedim(-2, 0)
        if jac is None:
            return seq, None
        return seq, jac.reshape(voxel + (len(jacobian), n, S)).movedim((-3, -2), (0, 1))

    limit, dlimit = steady_state(play, modes=modes)
    out = torch.complex128 if keep_double else torch.complex64
    return limit.to(out), None if dlimit is None else dlimit.movedim(0, -2).to(out)


def _relaxation_times_ms(fields: dict, pools) -> list:
    """The relaxation times of the pools the tissue has (`pools`, tensors or numbers, ms): free water's T1 and
    T2, each exchanging pool's, and the semisolid pool's T1 (its T2 shapes the saturation line, it does not
    decay)."""
    names = ["t1_ms", "t2_ms"]
    for letter in pools.letters:
        names += [f"t1_pool_{letter}_ms", f"t2_pool_{letter}_ms"]
    if pools.semisolid:
        names.append("t1_bound_ms")
    return [fields[name] for name in names if name in fields]


def play_to_steady_state(program, values: tuple, packed, fields: dict, jacobian=()):
    """The steady state of `program` (compiled for one playing) by playing it until the transient has died
    out: `SETTLE_TIME_CONSTANTS` of the slowest relaxation time of `fields`, in whole playings, then the
    last playing's samples (see the module doc). Returns `run`'s (signal [*voxel, S], J [*voxel, P, S] or
    None), differentiable as any run.

    Raises ValueError when no number of playings settles: an infinite relaxation time, or a playing of
    zero duration. Costs one host read of the playing's duration and the longest relaxation time.
    """
    dt, dt_wrap = values[0].detach(), values[1].detach()
    times = [torch.as_tensor(t).detach() for t in _relaxation_times_ms(fields, packed.pools)]
    longest = [t.max().to(device=dt.device, dtype=torch.float64) for t in times if t.numel()]
    zero = dt.new_zeros((), dtype=torch.float64)  # no voxels: nothing to wait for
    playing_s, slowest_ms, wrap_s = torch.stack([(dt.sum() - dt[0] + dt_wrap[0]).to(torch.float64),
                                                 torch.stack(longest).max() if longest else zero,
                                                 dt_wrap[0].to(torch.float64)]).tolist()  # the one host read
    if not math.isfinite(slowest_ms):
        raise ValueError("repetitions='auto' on a CUDA device plays the train until its transient has died out, "
                         f"for {SETTLE_TIME_CONSTANTS} times the longest relaxation time; an infinite relaxation "
                         "time (T1, T2, or a pool's) never lets it: give finite relaxation times, or run the steady "
                         "state on the host (device='cpu'), which extrapolates it")
    if not playing_s > 0:
        raise ValueError(f"repetitions='auto' needs a repetition that lasts; this one lasts {playing_s} s")
    playings = max(1, math.ceil(SETTLE_TIME_CONSTANTS * slowest_ms * 1e-3 / playing_s))
    action = program.action.copy()
    if playings > 1 and (wrap_s != 0 or differentiated(values[1])):  # the wait between playings
        action[0] |= nat.INTERVAL
    played = dataclasses.replace(program, action=action, num_repetitions=playings, bound={})
    return run(played, packed, fields, values=values, jacobian=jacobian)
