"""The arithmetic of dictionary matching: atoms in real form, blocked scoring, running top-k, grouped search.

Scores are found as squared magnitudes of inner products `|<d^,s>|^2` (`d^` the unit-norm atom) from real
matrix products: a complex atom `d = a + ib` is stored as the row `[a, b]`, and a query `s = x + iy` enters
twice, as `[x, y]` (giving Re<d,s>) and `[y, -x]` (giving Im<d,s>), so one product of the stacked queries with
the atom rows gives both parts and no atom is stored twice. Atoms whose imaginary parts lie below float32
resolution are stored real (half the arithmetic; see `REAL_ATOM_TOLERANCE`). The choice of the best atoms is
made in float32; their inner products are then recomputed in float64 from the stored rows.

Grouped search (`build_grouping`, `grouped_top`): atoms are clustered by phase-invariant spherical k-means;
each group keeps a centre `c` with the angular radius `theta` of its members, a representative (the member
nearest the centre: an actual atom) and a truncated orthonormal basis `B` of its members. Two bounds hold for
every unit member `d^` of a group and a voxel `s`:

* the cone: with `phi = arccos(|<c,s>|/|s|)`, `|<d^,s>|/|s| <= cos(max(0, phi - theta))`, because
  `arccos |<x,y>|` is a metric between unit vectors taken up to phase (Fubini-Study);
* the span: `|<d^,s>|/|s| <= |B^H s|/|s| + eps`, `eps` the largest distance of a member from the span.

A group is scored exactly only when the smaller bound reaches `(1 - prune)` times the k-th best
representative score, an achievable score, so pruning does not lose the best atoms (`prune` is extra slack).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["AtomBank", "Grouping", "build_grouping", "exhaustive_top", "grouped_top", "finish",
           "REAL_ATOM_TOLERANCE", "BYTES_PER_SCORE", "BLOCK_SCORES", "BLOCK_QUERIES",
           "MAX_BLOCK_SCORES"]

#: Atoms whose imaginary part is at most this fraction of their norm are matched as real. MRF atoms carry
#: ~1e-8 (the x i of a real on-resonance signal, in float32); dropping it moves no score by more than this,
#: below the float32 round-off of the scores themselves (~1e-7 x sqrt(contrasts)).
REAL_ATOM_TOLERANCE = 1e-6

#: Bytes per score entry of a block: the product (Re and Im rows, 8 bytes) and the squared magnitude (4),
#: rounded up for the top-k's temporaries.
BYTES_PER_SCORE = 16

#: Scores of one exhaustive block, and the voxels it is shaped around, per device type. On the host a block
#: whose products stay in a core's cache (256 voxels x 2048 atoms: 4 MiB of float32 Re/Im rows) ran 3-4x faster
#: than 4096 x 8192 (measured, 1 thread, rank-10 real atoms: 1.9 s against 7.4 s for 2k x 100k); on a card
#: larger blocks fill the device (at these small ranks the work is memory-bound either way).
BLOCK_SCORES = {"cpu": 2**19, "cuda": 2**28}
BLOCK_QUERIES = {"cpu": 256, "cuda": 4096}
#: Scores of one grouped block (bounds, then the kept groups): its per-group work is small, so blocks are
#: as large as the budget allows up to this, to keep the per-group loop's calls few.
MAX_BLOCK_SCORES = 2**28

#: Truncated in-group bases keep at most this many vectors, and stop earlier once every member lies within
#: `GROUP_RESIDUAL` of the span (the bound then costs at most that much slack).
MAX_GROUP_RANK = 8
GROUP_RESIDUAL = 1e-3

#: Added to each group's angular radius (rad): the bounds are formed from float32 scores, whose round-off
#: (~1e-6) moves an angle near 0 by up to sqrt(2e-6) = 1.4e-3 rad.
ANGLE_MARGIN_RAD = 2e-3


@dataclass(frozen=True)
class Grouping:
    """The clusters of a grouped dictionary.

    `members`: per group, the atom indices (int64) in it. `representative` `(G,)`: the index of each group's
    representative atom (the member nearest its centre). `atoms` `(G,)`: the number of atoms per group.
    `condition` `(G,)`: the ratio of the largest to the smallest retained singular value of each group's unit
    members (the conditioning of its truncated basis). `compression`: the rank of the subspace the atoms were
    compressed to first, or None. `radius_rad` `(G,)`: the largest angle `arccos|<c,d^>|` of a member from its
    centre. `residual` `(G,)`: the largest distance of a unit member from its group's basis. `known_set` `(G,)`:
    the known-value set each group belongs to (0 without known properties). `centres` `(G, C)` and `bases`
    `(G, C, R)` (zero-padded to the largest rank R) are the unit centres and in-group bases.
    """

    members: tuple
    representative: torch.Tensor
    atoms: torch.Tensor
    condition: torch.Tensor
    compression: int | None
    radius_rad: torch.Tensor
    residual: torch.Tensor
    known_set: torch.Tensor
    centres: torch.Tensor
    bases: torch.Tensor


class AtomBank:
    """Unit-norm atoms of one dictionary (or one known-property set) on one device, in real form.

    `rows` `(a, C)` (real atoms) or `(a, 2C)` (complex: `[Re, Im]`), float32; `norms` `(a,)` float64: the
    atoms' norms; `indices` `(a,)`: their rows in the whole dictionary. With `groups` (a `Grouping` restricted
    to this bank, atoms sorted by group), `offsets` `(G+1,)` delimit each group's rows.
    """

    def __init__(self, atoms: torch.Tensor, norms: torch.Tensor, indices: torch.Tensor):
        unit = atoms / norms.to(atoms.real.dtype if atoms.is_complex() else atoms.dtype)[:, None]
        self.complex = atoms.is_complex() and bool(
            (unit.imag.norm(dim=-1) > REAL_ATOM_TOLERANCE).any()) if atoms.numel() else False
        if self.complex:
            self.rows = torch.cat([unit.real, unit.imag], dim=-1).to(torch.float32).contiguous()
        else:
            self.rows = (unit.real if unit.is_complex() else unit).to(torch.float32).contiguous()
        self.contrasts = atoms.shape[-1]
        self.norms, self.indices = norms, indices
        self.groups = None  # set by `with_groups`

    @property
    def count(self) -> int:
        return self.rows.shape[0]

    def with_groups(self, members: list, representative: torch.Tensor, centres: torch.Tensor,
                    radius_rad: torch.Tensor, bases: torch.Tensor, residual: torch.Tensor) -> AtomBank:
        """Sort the atoms by group (`members`: per group, local row indices; `representative`: local indices)
        and keep what the bounds need: probe rows `[centres; representatives; basis vectors]` in real form."""
        order = torch.cat(members)
        position = torch.empty_like(order)
        position[order] = torch.arange(order.numel(), device=order.device)
        self.rows, self.norms, self.indices = self.rows[order], self.norms[order], self.indices[order]
        self.offsets = torch.tensor([0] + [m.numel() for m in members]).cumsum(0).tolist()
        G, R = bases.shape[0], bases.shape[2]
        vectors = torch.cat([centres, bases.transpose(1, 2).reshape(G * R, -1)])
        if self.complex:
            vectors = vectors.to(torch.complex64)
            probe = torch.cat([vectors.real, vectors.imag], dim=-1)
        else:
            probe = vectors.real if vectors.is_complex() else vectors
        probe = probe.to(torch.float32)
        self.probe_rows = torch.cat([probe[:G], self.rows[position[representative]], probe[G:]]).contiguous()
        self.groups = (G, R, radius_rad.to(torch.float32), residual.to(torch.float32))
        return self

    def query(self, signals: torch.Tensor) -> tuple:
        """(stacked query rows, parts): parts = 2 when the product's rows give Re then Im, else 1."""
        if self.complex:
            s = signals if signals.is_complex() else signals.to(torch.complex64)
            x, y = s.real.to(torch.float32), s.imag.to(torch.float32)
            return torch.cat([torch.cat([x, y], -1), torch.cat([y, -x], -1)]), 2
        if signals.is_complex():
            return torch.cat([signals.real, signals.imag]).to(torch.float32), 2
        return signals.to(torch.float32), 1

    def unit_atoms(self, rows: torch.Tensor) -> torch.Tensor:
        """Unit atoms (complex128 or float64) from stored rows."""
        if self.complex:
            c = self.contrasts
            return torch.complex(rows[..., :c].double(), rows[..., c:].double())
        return rows.double()


def _squared(query: torch.Tensor, parts: int, rows: torch.Tensor) -> torch.Tensor:
    """|<d^,s>|^2 `(q, a)` of the queries against atom rows."""
    out = query @ rows.T
    if parts == 1:
        return out.square_()
    q = out.shape[0] // 2
    re, im = out[:q], out[q:]
    return re.square_().addcmul_(im, im)


def _merge(best: tuple, scores: torch.Tensor, offset: int, k: int) -> tuple:
    """Running top-k: (values, local indices) of the best k after also seeing `scores` (columns from `offset`)."""
    values, indices = best
    if k == 1:
        v, i = scores.max(dim=1, keepdim=True)
        i += offset
        better = v > values
        return torch.where(better, v, values), torch.where(better, i, indices)
    v, i = scores.topk(min(k, scores.shape[1]), dim=1)
    i += offset
    v, i = torch.cat([values, v], 1), torch.cat([indices, i], 1)
    top, where = v.topk(k, dim=1)
    return top, i.gather(1, where)


def _empty_best(q: int, k: int, device) -> tuple:
    return (torch.full((q, k), -1.0, device=device), torch.zeros((q, k), dtype=torch.int64, device=device))


def exhaustive_top(bank: AtomBank, signals: torch.Tensor, k: int, atoms_per_block: int) -> torch.Tensor:
    """Local indices `(q, k)` of the best k atoms of each voxel, scoring every atom."""
    query, parts = bank.query(signals)
    best = _empty_best(signals.shape[0], k, signals.device)
    for start in range(0, bank.count, atoms_per_block):
        scores = _squared(query, parts, bank.rows[start:start + atoms_per_block])
        best = _merge(best, scores, start, k)
    return best[1]


def grouped_top(bank: AtomBank, signals: torch.Tensor, k: int, prune: float, atoms_per_block: int) -> torch.Tensor:
    """Local indices `(q, k)` of the best k atoms of each voxel, scoring inside the groups the bounds keep."""
    G, R, radius, residual = bank.groups
    q = signals.shape[0]
    query, parts = bank.query(signals)
    probe = _squared(query, parts, bank.probe_rows)  # (q, G centres + G representatives + G*R basis vectors)
    s_norm2 = torch.linalg.vector_norm(signals, dim=-1, keepdim=True).to(torch.float32).square().clamp_min(
        torch.finfo(torch.float32).tiny)
    centre = (probe[:, :G] / s_norm2).sqrt().clamp(max=1.0)
    cone = torch.cos((torch.acos(centre) - radius - ANGLE_MARGIN_RAD).clamp_min(0.0))
    span = (probe[:, 2 * G:].reshape(q, G, R).sum(-1) / s_norm2).sqrt() + residual
    bound = torch.minimum(cone, span)
    representative = (probe[:, G:2 * G] / s_norm2).sqrt()
    # The k-th best representative score is achievable, so no group whose bound is below it holds a top-k atom.
    kth = representative.topk(k, dim=1).values[:, -1:] if G >= k else torch.zeros((q, 1), device=signals.device)
    keep = bound >= (1.0 - prune) * kth
    best = _empty_best(q, k, signals.device)
    for g in range(G):
        voxels = keep[:, g].nonzero()[:, 0]
        if voxels.numel() == 0:
            continue
        sub_query, parts = bank.query(signals[voxels])
        sub_best = (best[0][voxels], best[1][voxels])
        lo, hi = bank.offsets[g], bank.offsets[g + 1]
        for start in range(lo, hi, atoms_per_block):
            scores = _squared(sub_query, parts, bank.rows[start:min(hi, start + atoms_per_block)])
            sub_best = _merge(sub_best, scores, start, k)
        best[0][voxels], best[1][voxels] = sub_best
    return best[1]


def finish(bank: AtomBank, signals: torch.Tensor, local: torch.Tensor) -> tuple:
    """(global indices, inner products <d^,s> in float64, norms |d|, |s|) of the chosen atoms `local` `(q, k)`."""
    atoms = bank.unit_atoms(bank.rows[local])  # (q, k, C)
    s = signals.to(torch.complex128 if (atoms.is_complex() or signals.is_complex()) else torch.float64)
    if atoms.is_complex():
        products = torch.einsum("qkc,qc->qk", atoms.conj(), s)
    else:
        products = torch.einsum("qkc,qc->qk", atoms.to(s.dtype), s)
    return bank.indices[local], products, bank.norms[local], s.norm(dim=-1)


def build_grouping(atoms: torch.Tensor, groups: int, generator: torch.Generator, iterations: int = 20) -> dict:
    """Cluster unit `atoms` `(a, C)` into at most `groups` groups.

    Returns {labels `(a,)`, representative `(G,)` (local indices), centres `(G, C)`, radius_rad `(G,)`, bases
    `(G, C, R)`, residual `(G,)`, condition `(G,)`}. Phase-invariant spherical k-means: similarity `|<c,d>|`,
    centres the phase-aligned mean of their members, started from distinct random atoms and run on a sample
    of at most 64 atoms per group; then every atom is assigned once. Empty groups are dropped.
    """
    a = atoms.shape[0]
    G = min(groups, a)
    device = atoms.device
    sample = torch.randperm(a, generator=generator)[: min(a, 64 * G)].to(device)
    x = atoms[sample]
    centres = x[torch.randperm(x.shape[0], generator=generator)[:G].to(device)]
    for _ in range(iterations):
        labels, similarity = _assign(x, centres)
        centres = _centres(x, labels, similarity, centres)
    labels, similarity = _assign(atoms, centres)
    centres = _centres(atoms, labels, similarity, centres)  # the centres of the final members
    labels, similarity = _assign(atoms, centres)
    used = torch.unique(labels)
    remap = torch.full((G,), -1, dtype=torch.int64, device=device)
    remap[used] = torch.arange(used.numel(), device=device)
    labels, centres, G = remap[labels], centres[used], used.numel()
    # Each member's angle from its own centre (float64: the radius bounds every member, round-off included).
    own = (atoms.to(torch.complex128 if atoms.is_complex() else torch.float64)
           * centres[labels].to(torch.complex128 if atoms.is_complex() else torch.float64).conj()).sum(-1).abs()
    angle = torch.acos(own.clamp(max=1.0))
    representative = torch.empty(G, dtype=torch.int64, device=device)
    radius = torch.zeros(G, dtype=torch.float64, device=device).scatter_reduce_(0, labels, angle, "amax")
    bases, residual, condition = [], torch.empty(G, dtype=torch.float64), torch.empty(G, dtype=torch.float64)
    order = labels.argsort(stable=True)
    start = 0
    for g, n in enumerate(torch.bincount(labels, minlength=G).tolist()):
        members = order[start:start + n]
        start += n
        representative[g] = members[angle[members].argmin()]
        basis, residual[g], condition[g] = _truncated_basis(atoms[members])
        bases.append(basis)
    R = max(b.shape[1] for b in bases)
    padded = torch.zeros((G, atoms.shape[1], R), dtype=atoms.dtype, device=device)
    for g, b in enumerate(bases):
        padded[g, :, : b.shape[1]] = b
    return {"labels": labels, "representative": representative, "centres": centres, "radius_rad": radius,
            "bases": padded, "residual": residual.to(device), "condition": condition}


def _centres(x: torch.Tensor, labels: torch.Tensor, similarity: torch.Tensor, centres: torch.Tensor) -> torch.Tensor:
    """Unit phase-aligned means of each centre's members (a centre without members stays)."""
    aligned = x * _phase(similarity)[:, None]
    summed = torch.zeros_like(centres).index_add_(0, labels, aligned)
    norms = summed.norm(dim=-1)
    return torch.where(norms[:, None] > 0, summed / norms.clamp_min(1e-30)[:, None], centres)


def _assign(x: torch.Tensor, centres: torch.Tensor, block: int = 8192) -> tuple:
    """(label, <centre, x> of that centre) of each row of `x`, in blocks of rows."""
    labels, values = [], []
    for start in range(0, x.shape[0], block):
        part = x[start:start + block]
        products = part @ centres.mH if x.is_complex() else part @ centres.T  # (b, G): <c, d> = sum conj(c) d
        strength = torch.view_as_real(products).square().sum(-1) if x.is_complex() else products.abs()
        best = strength.argmax(dim=1)
        labels.append(best)
        values.append(products.gather(1, best[:, None])[:, 0])
    return torch.cat(labels), torch.cat(values)


def _phase(similarity: torch.Tensor) -> torch.Tensor:
    """The factor that turns each member onto its centre's phase (sign for real atoms)."""
    if similarity.is_complex():
        magnitude = similarity.abs().clamp_min(1e-30)
        return (similarity / magnitude).conj()
    return torch.where(similarity < 0, -1.0, 1.0).to(similarity.dtype)


def _truncated_basis(members: torch.Tensor) -> tuple:
    """(basis `(C, r)`, largest member residual outside it, condition) of unit `members` `(m, C)`.

    With `members = U S V^H`, member j's coefficient on basis vector k is `U[j, k] S[k]`, so the energy the
    first r vectors capture is a cumulative sum, for every r at once; a unit member's residual is what is left.
    """
    m = members.double() if not members.is_complex() else members.to(torch.complex128)
    u, sigma, vh = torch.linalg.svd(m, full_matrices=False)
    energy = (u.abs().square() * sigma.square()).cumsum(dim=1)  # (m, n): captured by the first r vectors
    residual = (1.0 - energy.amin(dim=0)).clamp_min(0.0).sqrt()[:MAX_GROUP_RANK]  # worst member, per r
    within = (residual <= GROUP_RESIDUAL).nonzero()
    r = int(within[0, 0]) + 1 if within.numel() else residual.numel()
    basis = vh[:r].mH.to(members.dtype)
    smallest = float(sigma[r - 1]) if float(sigma[r - 1]) > 0 else float("nan")
    return basis, float(residual[r - 1]), float(sigma[0]) / smallest
