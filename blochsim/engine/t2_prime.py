"""The unrefocused time of each sample, and T2' on the samples.

A Lorentzian spread of off-resonance of half width 1/T2' multiplies a coherence pathway that has
precessed for a net time τ by `exp(-|τ|/T2')`. The EPG states do not carry τ, but a sequence that winds
steadily fixes it for each sample: when every pulse-to-pulse stretch of duration D winds w orders with
D = w·T_w (one time T_w per winding), a pathway's net precession time is T_w times its net order, so
every pathway that reaches F+(0) at a sample has precessed for the same signed time

    τ = (time since the last pulse) - T_w · (windings since that pulse).

FISP sampled at TE after its pulse has τ = TE; a CPMG echo has τ = 0; a PSIF echo τ = -TR. The rules:

* Pulses are the rotating RF events. An inversion only flips Z and leaves the transverse states as they
  are, so it neither ends nor starts a stretch.
* A stretch with a spoil in it carries no transverse magnetization past the spoil: it sets nothing.
* T_w = (sum of D) / (sum of w) over the other complete stretches, each of which must match w·T_w to
  1e-6 of its duration plus 1 ns (rounding of timestamps); else ValueError, since pathways through
  stretches of different rates (bSSFP: D > 0 with w = 0; variable TR) have precessed for different
  times and no single τ exists.
* The stretch after the last pulse is open: it only holds samples, which read T_w. A sample with
  windings since its pulse and no T_w (no complete stretch winds) raises ValueError.
* With repetitions > 1 the stretch that wraps from the last pulse of a playing to the first pulse of
  the next counts like any other. A sample with no pulse before it, or a spoil since its pulse, has no
  transverse magnetization: τ = 0.

τ depends only on the sequence and is differentiable with respect to its durations; T2' is per voxel.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from .. import _native as nat
from .._arrays import differentiated
from .program import Program

__all__ = ["unrefocused_time_s", "t2_prime_active", "apply_t2_prime"]

#: A stretch is steady when |D - w·T_w| <= _REL·max(D, w·T_w) + _ABS_S: timestamps are float64 us, exact far
#: below a ns, but a duration given as a float32 tensor is rounded to ~6e-8 of itself.
_REL, _ABS_S = 1e-6, 1e-9
#: T2' (ms) is clamped to at least this, as the relaxation times are: 0 gives zero signal, not NaN.
_MIN_MS = 1e-6
_KEY = "unrefocused"


def _structure(program: Program) -> tuple:
    """Index arrays of the stretches and samples of `program`, kept on it (they depend on its actions only).

    The stream is the program once, or twice when it repeats (the second copy holds the recorded samples
    and every stretch, including the one that wraps). Returns (copies, first, last, windings) of the
    unspoiled complete stretches and (sample, pulse, windings) per sample slot, where pulse is the
    sample itself when τ is 0.
    """
    hit = program.bound.get(_KEY)
    if hit is not None and hit[0] is program.action and hit[1] == program.num_repetitions:
        return hit[2]
    copies = 2 if program.num_repetitions > 1 else 1
    a = np.tile(program.action.astype(np.int64), copies)
    spoil = (a & nat.SPOIL_AFTER) != 0
    before = ((a & nat.CRUSH_BEFORE) != 0).astype(np.int64)
    after = ((a & nat.CRUSH_AFTER) != 0) + (((a & nat.SHIFT_AFTER) != 0) & ~spoil)
    centre = np.cumsum(before + after) - after  # windings up to the pulse or sample of each event
    spoils = np.cumsum(spoil) - spoil  # spoils strictly before each event
    pulses = np.flatnonzero(a & nat.ROTATE)
    first, last = pulses[:-1], pulses[1:]
    live = spoils[last] == spoils[first]
    first, last = first[live], last[live]
    sampled = np.flatnonzero(program.action & nat.RECORD)
    sampled = sampled[np.argsort(program.record[sampled])] + (copies - 1) * len(program.action)
    pulse = sampled.copy()
    k = np.searchsorted(pulses, sampled) - 1
    carried = k >= 0
    pulse[carried] = pulses[k[carried]]
    pulse = np.where(spoils[sampled] == spoils[pulse], pulse, sampled)
    structure = (copies, first, last, centre[last] - centre[first], sampled, pulse, centre[sampled] - centre[pulse])
    program.bound[_KEY] = (program.action, program.num_repetitions, structure)
    return structure


def unrefocused_time_s(program: Program) -> torch.Tensor:
    """τ of every recorded sample, float64 [S] in s, on the device of `program.dt_s` (see module doc).

    Differentiable with respect to the program's durations. Raises ValueError where the sequence does
    not wind steadily (τ is then undefined).
    """
    copies, first, last, winds, sampled, pulse, sample_winds = _structure(program)
    t = torch.cumsum(program.dt_s.to(torch.float64), 0)
    if copies == 2:
        playing_s = program.dt_wrap_s.to(torch.float64).reshape(1) + t[-1:] - t[:1]
        t = torch.cat([t, t + playing_s])
    since = t[torch.from_numpy(sampled)] - t[torch.from_numpy(pulse)]
    span = t[torch.from_numpy(last)] - t[torch.from_numpy(first)]
    host = np.asarray(span.detach().tolist(), dtype=np.float64)  # tolist: also under torch.func
    total = int(winds.sum())
    if total == 0:
        if host.size and float(host.max()) > _ABS_S:
            i = int(host.argmax())
            raise _unsteady(t.detach(), first[i], last[i], host[i], 0, None)
        if sample_winds.any():
            raise ValueError(
                "T2prime (t2_prime_ms): a sample lies a winding after its pulse, but no pulse-to-pulse stretch "
                "winds, so no time per winding defines its unrefocused time; give T2prime=inf (off) here")
        return since
    per_winding = span.sum() / total
    period = float(per_winding.detach().tolist())
    bad = np.abs(host - winds * period) > _REL * np.maximum(host, winds * period) + _ABS_S
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise _unsteady(t.detach(), first[i], last[i], host[i], int(winds[i]), period)
    return since - per_winding * torch.from_numpy(sample_winds).to(since)


def _unsteady(t: torch.Tensor, first: int, last: int, span_s: float, winds: int, period_s) -> ValueError:
    where = (f"the pulse-to-pulse stretch from {t[first].tolist() * 1e3:.6g} ms to {t[last].tolist() * 1e3:.6g} ms "
             f"of the played stream lasts {span_s * 1e3:.6g} ms")
    why = (" without a winding (a balanced stretch, as in bSSFP)" if winds == 0 else
           f" and winds {winds} order(s), while the sequence winds one order per {period_s * 1e3:.6g} ms on "
           "average (variable TR)")
    return ValueError(
        f"T2prime (t2_prime_ms) needs the unrefocused time of each sample, which exists only for a sequence "
        f"that winds steadily (every pulse-to-pulse stretch winds in proportion to its duration, so every "
        f"pathway to a sample has precessed for the same time); here {where}{why}. "
        "Give T2prime=inf (off) for this sequence")


def t2_prime_active(value, fields=()) -> bool:
    """Whether T2' acts: a finite value, a derivative carried, or a Jacobian along it.

    `value` None or inf (a number) costs nothing; a tensor costs one reduction."""
    if value is None:
        return "t2_prime_ms" in fields
    if "t2_prime_ms" in fields or differentiated(value):
        return True
    if isinstance(value, torch.Tensor):
        return bool(torch.isfinite(value.detach()).any())
    return not math.isinf(float(value))


def apply_t2_prime(program: Program, t2_prime_ms, signal: torch.Tensor, jac: torch.Tensor | None = None,
                   fields=()) -> tuple:
    """`signal` (*voxel, S) and `jac` (*voxel, P, S) or None with T2' applied: (signal, jac).

    The samples and every Jacobian column are scaled by f = exp(-|τ|/T2'); the column of `t2_prime_ms`
    in `fields` (which the kernels leave at zero: they never see T2') becomes signal·f·|τ|/T2'^2.
    Unchanged, at no cost, when T2' does not act (`t2_prime_active`).
    """
    if not t2_prime_active(t2_prime_ms, fields):
        return signal, jac
    value = math.inf if t2_prime_ms is None else t2_prime_ms
    t2p = torch.as_tensor(value, dtype=torch.float64, device=signal.device).clamp_min(_MIN_MS)
    tau_ms = unrefocused_time_s(program).to(signal.device).abs() * 1e3
    rate = tau_ms / t2p[..., None]
    factor = torch.exp(-rate).to(signal.real.dtype)
    signal = signal * factor
    if jac is None:
        return signal, None
    jac = jac * factor.unsqueeze(-2)
    if "t2_prime_ms" in fields:
        columns = list(jac.unbind(-2))
        k = list(fields).index("t2_prime_ms")
        columns[k] = columns[k] + signal * (rate / t2p[..., None]).to(signal.real.dtype)
        jac = torch.stack(columns, -2)
    return signal, jac
