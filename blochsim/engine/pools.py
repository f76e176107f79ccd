"""Pool tables: the interval operators of coupled pools, per voxel and distinct interval.

For tissue with a semisolid pool or exchanging pools B..E, the engine forms in float64, for every voxel and
every distinct interval length dt,
  L = exp(A dt)   longitudinal, A = -diag(R1) + X (all pools),
  r = (I - L) Zeq recovery of Z(0) toward the equilibrium fractions,
  T = exp(C dt)   transverse, C = -diag(R2) - i 2 pi diag(B0 + shift) + X_w (the exchange generator of the
                  water-like pools alone: free water loses no transverse magnetization to the semisolid),
and per RF event the semisolid saturation rate sat = S * G(f_rf - B0) (Malik 2018, EPG-X). X is the
Bloch-McConnell exchange generator with free water as the hub: rate free -> p is k_p f_p, rate p -> free
is k_p f_free. The kernels multiply by the tables and return cotangents on them; autograd carries those
to every pool property, to T1, T2, B0 and to the interval lengths.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np
import torch

from .._arrays import LastResult, broadcast_shapes
from ..physics.lineshape import LINESHAPES, absorption_lineshape
from ..sequence.tissue import IDENTITY
from .tissue import PoolModel, tissue_device

__all__ = ["pool_tables", "interval_rows", "expm", "LINESHAPES"]


def _f64(value, device) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        return value.to(device=device, dtype=torch.float64)
    return torch.tensor(float(value), dtype=torch.float64, device=device)


def _rate(t_ms: torch.Tensor) -> torch.Tensor:
    """1/T in 1/s; T clamped to >= 1e-6 ms (T = 0 relaxes at once, not NaN), T = inf gives 0."""
    return 1000.0 / t_ms.clamp_min(1e-6)


def interval_rows(dt_s: torch.Tensor, dt_wrap_s: torch.Tensor, interval_events, repetitions: int):
    """Distinct intervals: (lengths [D], row of each event [E] int32, wrap row).

    When the lengths are differentiated every interval gets its own row, so that a gradient reaches the
    very tensor it came from; otherwise equal lengths share a row.
    """
    E = dt_s.numel()
    candidates = torch.cat([dt_s, dt_wrap_s.to(dt_s.device)])
    device = candidates.device  # the host, or the device the values were mapped on (model.placement._protocol_vector)
    if candidates.requires_grad:
        rows = torch.arange(E + 1, dtype=torch.int32, device=device)
        return candidates, rows[:E].contiguous(), E
    # Timestamps accumulate in float64, so equal intervals can differ in their last bits: group lengths
    # to the nanosecond (far below any scanner's raster) and use each group's first member.
    ticks = torch.round(candidates.detach() * 1e9).to(torch.int64)
    keys, inverse = torch.unique(ticks, return_inverse=True)
    first = torch.full((keys.numel(),), E + 1, dtype=torch.int64, device=device).scatter_reduce(
        0, inverse, torch.arange(E + 1, device=device), reduce="amin")
    values = candidates.detach()[first]
    inverse = inverse.to(torch.int32)
    return values, inverse[:E].contiguous(), int(inverse[E])


def pool_tables(tissue: Mapping, model: PoolModel, voxel_shape: tuple, lengths_s: torch.Tensor, sat_per_rad2,
                rf_hz, lineshape: str):
    """Tables (L, r, T, zeq, sat) in float64, each with a leading voxel axis (V, or 1 when uniform).

    `tissue` maps engine fields to the values given (the others take their identity value); `model`
    says which pools it has (`PackedTissue.pools`). `sat_per_rad2` [E] is the saturation constant S of
    each RF event's definition (0 elsewhere) and `rf_hz` [E] its frequency offset; sat is None without a
    semisolid pool.
    """
    if lineshape not in LINESHAPES:
        raise ValueError(f"lineshape must be one of {LINESHAPES}, got {lineshape!r}")
    lengths = lengths_s if lengths_s.requires_grad else tuple(lengths_s.tolist())  # a fresh tensor each call
    settings = (model.letters, model.semisolid, tuple(voxel_shape), lineshape, sat_per_rad2.tobytes(),
                rf_hz.tobytes())
    kept, key = _LAST_TABLES.lookup(settings, [("lengths_s", lengths), *tissue.items()])
    if kept is None:
        kept = _pool_tables(tissue, model, voxel_shape, lengths_s, sat_per_rad2, rf_hz, lineshape)
        _LAST_TABLES.keep(key, kept)
    return kept


#: The last tables, kept while the tissue tensors and interval lengths are the same and unmodified: a loop
#: over the sequence (design, repeated runs) builds them once.
_LAST_TABLES = LastResult()


def _pool_tables(tissue: Mapping, model: PoolModel, voxel_shape: tuple, lengths_s: torch.Tensor, sat_per_rad2,
                 rf_hz, lineshape: str):
    fields = {}
    device = tissue_device(tissue)
    f64 = dict(dtype=torch.float64, device=device)

    def get(name):
        if name not in fields:
            fields[name] = _f64(tissue.get(name, IDENTITY.get(name)), device)
        return fields[name]

    f_pools = [get(f"pool_{x}_fraction") for x in model.letters]
    k_pools = [get(f"pool_{x}_exchange_hz") for x in model.letters]
    r1 = [_rate(get("t1_ms"))] + [_rate(get(f"t1_pool_{x}_ms")) for x in model.letters]
    r2 = [_rate(get("t2_ms"))] + [_rate(get(f"t2_pool_{x}_ms")) for x in model.letters]
    shift = [torch.zeros((), **f64)] + [get(f"pool_{x}_shift_hz") for x in model.letters]
    if model.semisolid:
        f_pools.append(get("bound_fraction"))
        k_pools.append(get("bound_exchange_hz"))
        r1.append(_rate(get("t1_bound_ms")))
    f_free = 1.0 - sum(f_pools) if f_pools else torch.ones((), **f64)
    b0 = get("b0_hz")
    nl, nt = model.num_longitudinal, model.num_transverse
    shape = broadcast_shapes(*[t.shape for t in fields.values()]) if fields else ()
    full = lambda t: torch.as_tensor(t, **f64).expand(shape)  # noqa: E731

    # Longitudinal generator A (*V, nl, nl) and transverse C = C_re + i C_im (*V, nt, nt); C_im is diagonal.
    # Negations as multiplies by -1 and no divisions: on a GPU each distinct kernel costs its lazy loading
    # (10-20 ms on the H200) at the first call that builds tables.
    A = torch.diag_embed(torch.stack([full(r) * -1.0 for r in r1], -1))
    C_re = torch.diag_embed(torch.stack([full(r2[p]) * -1.0 for p in range(nt)], -1))
    C_im = torch.diag_embed(torch.stack([-2 * math.pi * full(b0 + shift[p]) for p in range(nt)], -1))
    X = torch.zeros(shape + (nl, nl), **f64)
    X_w = torch.zeros(shape + (nt, nt), **f64)  # the water-like pools alone: nothing leaks to the semisolid
    for p in range(1, nl):
        kf = full(k_pools[p - 1] * f_pools[p - 1])[..., None, None]  # free -> p
        kb = full(k_pools[p - 1] * f_free)[..., None, None]  # p -> free
        for M, n in ((X, nl),) + (((X_w, nt),) if p < nt else ()):
            E, Eb = np.zeros((n, n)), np.zeros((n, n))  # made on the host, one copy each
            E[0, 0], E[p, 0] = -1.0, 1.0
            Eb[p, p], Eb[0, p] = -1.0, 1.0
            M += kf * torch.as_tensor(E, **f64) + kb * torch.as_tensor(Eb, **f64)
    A = A + X
    # C as the real 2nt x 2nt matrix [[C_re, -C_im], [C_im, C_re]], whose exponential is [[T_re, -T_im],
    # [T_im, T_re]]: the float64 kernels of L, no complex ones.
    C_re = C_re + X_w
    C = torch.cat([torch.cat([C_re, C_im * -1.0], -1), torch.cat([C_im, C_re], -1)], -2)
    zeq = torch.stack([full(f_free)] + [full(f) for f in f_pools], -1)

    V = math.prod(voxel_shape)
    uniform = math.prod(shape) == 1

    def voxels(t, tail):  # (*shape, *tail) -> (V or 1, *tail)
        if uniform:
            return t.reshape((1,) + tail)
        return t.expand(tuple(voxel_shape) + tail).reshape((V,) + tail)

    A, C, zeq = voxels(A, (nl, nl)), voxels(C, (2 * nt, 2 * nt)), voxels(zeq, (nl,))
    dt = lengths_s.to(**f64)[None, :, None, None]
    L = expm(A[:, None] * dt)
    T_block = expm(C[:, None] * dt)
    T = torch.complex(T_block[..., :nt, :nt], T_block[..., nt:, :nt])
    r = zeq[:, None, :] - (L * zeq[:, None, None, :]).sum(-1)  # (I - L) zeq; no `@`: cuBLAS's first use ~0.1 s

    sat = None
    if model.semisolid:
        t2b, b0 = get("t2_bound_ms"), get("b0_hz")
        if t2b.numel() == 1 and b0.numel() == 1:  # one saturation row serves every voxel
            t2b, b0v = t2b.reshape(1), b0.reshape(1)
        else:
            t2b, b0v = voxels(full(t2b), ()), voxels(full(b0), ())
        # S G at every event, S = 0 where an event does not saturate: there G is taken at the first saturating
        # event's offset (no further lineshape evaluation) and multiplied by 0. One multiply, no zeroed table
        # and index_copy (two more kernels to load).
        rows = np.flatnonzero(sat_per_rad2)  # host arrays: no device sync
        rf_all = np.where(sat_per_rad2 != 0, rf_hz, rf_hz[rows[0]] if len(rows) else 0.0)
        offsets = torch.as_tensor(rf_all, **f64)[None, :] - b0v[:, None]
        g = _lineshape(lineshape, offsets, t2b[:, None].expand_as(offsets))
        sat = torch.as_tensor(sat_per_rad2, **f64) * g
    return L, r, T, zeq, sat


def expm(a: torch.Tensor, terms: int = 12, *, matmul: bool | None = None) -> torch.Tensor:
    """exp(a) of a batch of small matrices (..., n, n): scaling and squaring of a Taylor series.

    The scaling s (shared by the batch) brings every norm under 1/2, where 12 Taylor terms leave a
    truncation of 0.5^13 / 13! ~ 2e-14 relative. The products run entry by entry over the batch (a
    matrix is n x n lists of batch vectors): torch's batched matmul and matrix_exp cost microseconds per
    3x3 matrix on the CPU, this a few milliseconds for thousands of voxels. On a GPU, where each op is a
    launch, the same series runs as batched matmuls (about 30 launches; `matmul` forces either). Differentiable.
    """
    n = a.shape[-1]
    norm = float(a.detach().abs().sum(-1).amax()) if a.numel() else 0.0
    s = max(0, math.ceil(math.log2(norm / 0.5))) if norm > 0.5 else 0
    if matmul if matmul is not None else a.device.type != "cpu":
        def mm(p, q):  # broadcast multiply and sum: no cuBLAS (its first use costs ~1 s), n <= 8
            return (p[..., :, :, None] * q[..., None, :, :]).sum(-2)

        # The broadcast holds n^3 numbers a matrix (8 GB for the 8 x 8 transverse blocks of a million 5-pool
        # voxels over 2 intervals): the batch runs in parts of at most _EXPM_PART_BYTES of it, with the
        # scaling of the whole batch (the same numbers as in one part).
        flat = a.reshape((-1, n, n))
        part = max(1, _EXPM_PART_BYTES // (n**3 * a.element_size()))
        if flat.shape[0] > part:
            return torch.cat([_expm_series(x, terms, s, mm) for x in flat.split(part)]).reshape(a.shape)
        return _expm_series(a, terms, s, mm)
    # Entry by entry, as Y = exp(x) - I: Horner Y <- x/k + (x/k) Y, then squaring (I + Y)^2 = I + (2Y + Y^2).
    # No Python number meets a tensor inside the loops: under forward-mode AD (pool-table tangents) each
    # tensor-and-constant op runs through torch's Python reference decompositions, ~200 calls per op.
    x = (a / (2.0**s)).movedim((-2, -1), (0, 1)).contiguous()  # x[i, j]: one contiguous batch per entry

    def entries(m):
        return [[m[i, j] for j in range(n)] for i in range(n)]

    def product(p, q):
        out = []
        for i in range(n):
            row = []
            for j in range(n):
                total = p[i][0] * q[0][j]
                for k in range(1, n):
                    total = total + p[i][k] * q[k][j]
                row.append(total)
            out.append(row)
        return out

    ks = torch.arange(1, terms + 1, dtype=x.real.dtype, device=x.device).reshape((terms,) + (1,) * x.dim())
    over_k = x.unsqueeze(0) / ks  # [k - 1] is x / k: one op for every term
    y = entries(over_k[terms - 1])
    for k in range(terms - 1, 0, -1):
        xk = entries(over_k[k - 1])
        xy = product(xk, y)
        y = [[xk[i][j] + xy[i][j] for j in range(n)] for i in range(n)]
    for _ in range(s):
        yy = product(y, y)
        y = [[y[i][j] + y[i][j] + yy[i][j] for j in range(n)] for i in range(n)]
    return torch.stack([torch.stack(row, -1) for row in y], -2) + torch.eye(n, dtype=a.dtype, device=a.device)


#: Bytes of the broadcast product of one part of a batch in `expm` on a GPU.
_EXPM_PART_BYTES = 256 * 2**20


def _expm_series(a: torch.Tensor, terms: int, s: int, mm) -> torch.Tensor:
    """exp(a) as (Taylor series of a / 2^s)^(2^s), products by `mm`."""
    x = a * 0.5**s  # multiplies, not divisions: one kernel fewer to load on a GPU
    eye = torch.eye(a.shape[-1], dtype=a.dtype, device=a.device)
    result = eye + x * (1.0 / terms)
    for k in range(terms - 1, 0, -1):
        result = eye + mm(x, result) * (1.0 / k)
    for _ in range(s):
        result = mm(result, result)
    return result


def _lineshape(name: str, offsets: torch.Tensor, t2b_ms: torch.Tensor) -> torch.Tensor:
    """G at every (offset, T2b) pair. The super-Lorentzian is integrated numerically (no autograd), so it is
    evaluated once per distinct pair."""
    if name != "super-lorentzian":
        return absorption_lineshape(name, offsets, t2b_ms)
    pairs = torch.stack([offsets.detach().reshape(-1), t2b_ms.detach().reshape(-1)], -1).cpu()
    unique, inverse = torch.unique(pairs, dim=0, return_inverse=True)
    values = absorption_lineshape(name, unique[:, 0], unique[:, 1])
    return values[inverse].reshape(offsets.shape).to(offsets.device)
