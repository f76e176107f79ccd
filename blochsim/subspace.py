"""`Subspace`: a low-rank temporal basis of a dictionary (SVD), and `simulate_subspace`, which builds one from
a simulation without holding the dictionary's full time series.

Conventions: signals are rows, `(..., contrasts)`; the basis is `(contrasts, rank)` with orthonormal columns;
coefficients are `c = s @ basis` and the projection back is `c @ basis^H` (McGivney et al. 2014, "SVD
compression for magnetic resonance fingerprinting in the time domain", IEEE TMI 33:2311).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ._arrays import to_tensor

__all__ = ["Subspace", "simulate_subspace"]

#: Rows of the dictionary whose Gram matrix is formed at once (x contrasts complex128 elements: 64 MiB).
_GRAM_ELEMENTS = 1 << 22
#: Voxels simulated at once by `simulate_subspace` (16384 x 1000 samples of complex64: 128 MiB).
DEFAULT_CHUNK_VOXELS = 16384


@dataclass(frozen=True, eq=False)
class Subspace:
    """A temporal basis: `basis (contrasts, rank)` with orthonormal columns, and the spectrum it came from.

    Args:
        basis: `(contrasts, rank)`, real or complex.
        singular_values: the dictionary's singular values in descending order, at least `rank` of them (the
            first `rank` belong to the basis; more, up to the whole spectrum, make `retained` exact).
        dictionary: the dictionary in the basis, coefficients `(..., rank)` (set by `fit` and
            `simulate_subspace`), or None.
        simulation: the `SimulationResult` of the run that made the dictionary (`simulate_subspace`): its
            labels (time_us, event_index, repetition, echo, echo_index) name the contrasts, and its `signal`
            holds the same coefficients as `dictionary`. None otherwise.

    `project(s) = s @ basis` and `expand(c) = c @ basis^H` compute in the wider of the two dtypes, on the
    argument's device. `modes` is the transpose `(rank, contrasts)`, the layout mri-nufft and BART
    (`pics -B`) take.
    """

    basis: torch.Tensor
    singular_values: torch.Tensor
    dictionary: torch.Tensor | None = None
    simulation: object | None = None

    def __post_init__(self):
        basis = to_tensor(self.basis, name="basis")
        values = to_tensor(self.singular_values, name="singular_values")
        if basis.dim() != 2:
            raise ValueError(f"basis must be (contrasts, rank), got shape {tuple(basis.shape)}")
        if values.dim() != 1 or values.numel() < basis.shape[1]:
            raise ValueError(f"singular_values must be 1-D with at least rank = {basis.shape[1]} entries, got "
                             f"shape {tuple(values.shape)}")
        if values.is_complex() or bool((values < 0).any()):
            raise ValueError("singular_values must be real and non-negative")
        object.__setattr__(self, "basis", basis)
        object.__setattr__(self, "singular_values", values)

    @property
    def rank(self) -> int:
        return int(self.basis.shape[1])

    @property
    def contrasts(self) -> int:
        return int(self.basis.shape[0])

    @property
    def retained(self) -> float:
        """The fraction of the dictionary's energy (sum of squared singular values) the basis keeps."""
        energy = self.singular_values.to(torch.float64) ** 2
        total = float(energy.sum())
        return float(energy[: self.rank].sum()) / total if total > 0 else 1.0

    @property
    def modes(self) -> torch.Tensor:
        """The basis transposed, `(rank, contrasts)`."""
        return self.basis.mT

    def project(self, signals) -> torch.Tensor:
        """Coefficients `(..., rank)` of signals `(..., contrasts)`: `signals @ basis`."""
        s = to_tensor(signals, name="signals")
        self._check_last(s, self.contrasts, "signals", "contrasts")
        dtype = torch.promote_types(s.dtype, self.basis.dtype)
        return s.to(dtype) @ self.basis.to(device=s.device, dtype=dtype)

    def expand(self, coefficients) -> torch.Tensor:
        """Signals `(..., contrasts)` of coefficients `(..., rank)`: `coefficients @ basis^H`."""
        c = to_tensor(coefficients, name="coefficients")
        self._check_last(c, self.rank, "coefficients", "rank")
        dtype = torch.promote_types(c.dtype, self.basis.dtype)
        return c.to(dtype) @ self.basis.to(device=c.device, dtype=dtype).mH

    def to(self, device) -> Subspace:
        """A copy with its tensors on `device`."""
        moved = [None if t is None else t.to(device) for t in (self.basis, self.singular_values, self.dictionary)]
        return Subspace(*moved, simulation=self.simulation)

    @staticmethod
    def _check_last(x: torch.Tensor, size: int, name: str, what: str) -> None:
        if x.dim() == 0 or x.shape[-1] != size:
            raise ValueError(f"{name} must end in an axis of {size} {what}, got shape {tuple(x.shape)}")

    @classmethod
    def fit(cls, signals, rank: int | None = None, *, energy: float | None = None) -> Subspace:
        """The leading right singular vectors of a dictionary `(..., contrasts)`, leading axes flattened into
        atoms, no mean removed.

        Give `rank` (1 <= rank <= the dictionary's span) or `energy` (the fraction of the squared singular
        values to keep, in (0, 1]: the smallest rank that keeps at least that much). The Gram matrix is
        accumulated in float64 over blocks of atoms, so the dictionary is never copied whole; the basis
        comes back in the signals' dtype (complex for complex signals) on their device.
        """
        s = to_tensor(signals, name="signals")
        if s.dim() < 1 or s.shape[-1] < 1:
            raise ValueError(f"signals must be (..., contrasts), got shape {tuple(s.shape)}")
        gram = _Gram(s.shape[-1], s.device, complex_=s.is_complex())
        gram.add(s.reshape(-1, s.shape[-1]))
        basis, values = gram.basis(rank, energy, eps=torch.finfo(s.real.dtype).eps)
        basis = basis.to(s.dtype)
        return cls(basis, values, dictionary=s @ basis)


class _Gram:
    """`sum S^H S` over blocks of rows, float64, then its leading eigenvectors."""

    def __init__(self, contrasts: int, device, *, complex_: bool):
        self.dtype = torch.complex128 if complex_ else torch.float64
        self.matrix = torch.zeros((contrasts, contrasts), dtype=self.dtype, device=device)
        self.atoms = 0

    def add(self, rows: torch.Tensor) -> None:
        step = max(1, _GRAM_ELEMENTS // rows.shape[-1])
        for start in range(0, rows.shape[0], step):
            block = rows[start:start + step].to(device=self.matrix.device, dtype=self.dtype)
            self.matrix += block.mH @ block
        self.atoms += rows.shape[0]

    def basis(self, rank, energy, *, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
        """(basis (contrasts, rank), singular values (contrasts,) descending) for `rank` or `energy`."""
        if (rank is None) == (energy is None):
            raise ValueError("give rank= or energy= (exactly one)")
        contrasts = self.matrix.shape[0]
        eigenvalues, vectors = torch.linalg.eigh(self.matrix)
        eigenvalues, vectors = eigenvalues.flip(0), vectors.flip(1)
        values = eigenvalues.clamp_min(0).sqrt()
        # Modes below this fraction of the largest are rounding: the data's own (contrasts x its precision), or
        # the float64 Gram matrix's, whose eigenvalues carry ~contrasts x 1.1e-16 of the largest.
        floor = max(contrasts * eps, math.sqrt(contrasts * torch.finfo(torch.float64).eps))
        span = int((values > floor * values[0]).sum()) if self.atoms and float(values[0]) > 0 else 0
        if energy is not None:
            if not (isinstance(energy, (int, float)) and 0 < energy <= 1):
                raise ValueError(f"energy must be a fraction in (0, 1], got {energy!r}")
            kept = torch.cumsum(values**2, 0) / (values**2).sum()
            rank = min(int((kept < energy - 1e-12).sum()) + 1, span)
        if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1 or rank > span:
            raise ValueError(f"rank must be an integer in [1, {span}] (the dictionary's span: {self.atoms} atoms of "
                             f"{contrasts} contrasts, modes above {floor:.1e} of the largest singular value), got "
                             f"{rank!r}")
        basis = vectors[:, :rank]
        # A fixed phase per column (the largest entry real and positive): the same basis on every device.
        pivot = basis.gather(0, basis.abs().argmax(0, keepdim=True))
        basis = basis * (pivot.abs() / pivot).conj() if basis.is_complex() else basis * torch.sign(pivot)
        return basis, values


def simulate_subspace(description, tissue, *, rank=None, repetitions=1, record="all", nstates=None,
                      across_slice=None, rf_raster_time_s=1e-6, device=None, energy=None,
                      chunk_size: int = DEFAULT_CHUNK_VOXELS) -> Subspace:
    """A `Subspace` of the dictionary `description` plays on `tissue`, with the dictionary in its coefficients.

    Args:
        description: a `SequenceDescription`.
        tissue: a `TissueProperties` whose maps broadcast to the dictionary's atoms (`voxel_shape`).
        rank / energy: the basis size, or the fraction of energy to keep (exactly one).
        repetitions, record, nstates, across_slice, rf_raster_time_s, device: as `EpgEngine.simulate`.
        chunk_size: atoms simulated at once; only this many full time series are held at a time.

    The kernels write every sample of a voxel (they have no projected output), so the projection happens
    per chunk: a dictionary that fits in one chunk is simulated once; a larger one twice, first to form the
    Gram matrix (float64, `contrasts x contrasts`) and then to project each chunk onto the basis, so memory
    stays at one chunk's time series plus the coefficients `(*voxel_shape, rank)`. Not differentiable.

    Returns:
        `Subspace` with `dictionary` the coefficients `(*voxel_shape, rank)` (raw engine values projected, no
        post-rotation) and `simulation` the `SimulationResult` of the run with those coefficients as its
        `signal` and the samples' labels.
    """
    from .sequence import EpgEngine, SimulationResult, TissueProperties, pack_description

    if not isinstance(tissue, TissueProperties):
        raise TypeError(f"tissue must be a TissueProperties, got {type(tissue).__name__}")
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"chunk_size must be an integer >= 1 (atoms per simulation), got {chunk_size!r}")
    settings = dict(repetitions=repetitions, record=record, nstates=nstates, across_slice=across_slice,
                    rf_raster_time_s=rf_raster_time_s, device=device)
    events = pack_description(description, repetitions=repetitions, record=record, device=device,
                              rf_raster_time_s=rf_raster_time_s, nstates=nstates)
    engine = EpgEngine()
    voxel_shape, pieces = _tissue_chunks(tissue, chunk_size)
    with torch.no_grad():
        first = engine.simulate(description, pieces[0], events=events, **settings)
        if first.signal.dim() != 2:
            raise ValueError("simulate_subspace takes a description without a train axis (one dictionary); got "
                             f"signals of shape {tuple(first.signal.shape)}")
        gram = _Gram(first.signal.shape[-1], first.signal.device, complex_=True)
        gram.add(first.signal)
        for piece in pieces[1:]:
            gram.add(engine.simulate(description, piece, events=events, **settings).signal)
        basis, values = gram.basis(rank, energy, eps=torch.finfo(first.signal.real.dtype).eps)
        basis = basis.to(first.signal.dtype)
        if len(pieces) == 1:
            coefficients = first.signal @ basis
        else:
            coefficients = torch.cat([engine.simulate(description, piece, events=events, **settings).signal @ basis
                                      for piece in pieces])
    coefficients = coefficients.reshape(voxel_shape + (basis.shape[1],))
    labels = {name: getattr(first, name) for name in ("time_us", "event_index", "repetition", "echo", "echo_index")}
    return Subspace(basis, values, dictionary=coefficients,
                    simulation=SimulationResult(signal=coefficients, **labels))


def _tissue_chunks(tissue, chunk_size: int) -> tuple[tuple, list]:
    """(voxel_shape, [TissueProperties of at most chunk_size atoms each]): every map broadcast to the voxel
    shape and flattened; numbers and 0-d tensors shared by every chunk."""
    import dataclasses

    maps = {name: value for name, value in tissue.items() if isinstance(value, torch.Tensor) and value.dim() > 0}
    voxel_shape = tuple(torch.broadcast_shapes(*(v.shape for v in maps.values()))) if maps else ()
    count = math.prod(voxel_shape)
    flat = {name: value.expand(voxel_shape).reshape(-1) for name, value in maps.items()}
    pieces = [dataclasses.replace(tissue, **{name: value[start:start + chunk_size] for name, value in flat.items()})
              for start in range(0, max(count, 1), chunk_size)]
    return voxel_shape, pieces
