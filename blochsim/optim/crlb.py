"""`crlb`: the Cramer-Rao lower bound of tissue properties from a forward-mode Jacobian."""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["crlb", "fisher_information"]

_SINGULAR_MODES = ("raise", "infinite")


def fisher_information(jacobian: torch.Tensor, *, noise_variance=1.0) -> torch.Tensor:
    """`Re(J^H J) / sigma^2` of a Jacobian `(..., P, samples)`: `(..., P, P)` in the Jacobian's real dtype.

    Complex samples count their real and imaginary parts as two measurements, each with Gaussian noise of
    variance `noise_variance` (a number, or a tensor broadcasting against the batch shape `...`).
    """
    J = _check_jacobian(jacobian)
    rows = torch.view_as_real(J).flatten(-2) if J.is_complex() else J  # (..., P, 2S): Re and Im side by side
    fisher = rows @ rows.mT
    return fisher / _variance(noise_variance, J)[..., None, None]


def crlb(jacobian, *, noise_variance=1.0, singular: str = "raise", known=(), of=None,
         names: Sequence[str] | None = None) -> torch.Tensor:
    """The Cramer-Rao lower bound on the variance of each property, per tissue.

    For unbiased estimates of P properties from samples `s` with independent Gaussian noise of variance
    `sigma^2` on every real and every imaginary part, the covariance is at least the inverse of the Fisher
    information `F = Re(J^H J) / sigma^2`, `J = ds/dtheta` (Kay 1993, Fundamentals of Statistical Signal
    Processing I, ch. 3). The bound returned is the diagonal of `F^-1`.

    Args:
        jacobian: `(..., P, samples)`, real or complex, e.g. the `J` of `Simulator.jacobian((names...), ...)`;
            leading axes are tissues (batched). Differentiable: a cost of the bound can be minimised over the
            protocol (the backward runs the second-order kernels).
        noise_variance: `sigma^2` per real measurement, a positive number or a tensor broadcasting against
            `...` (one per tissue), in squared signal units.
        singular: "raise" (a singular Fisher matrix raises torch.linalg.LinAlgError) or "infinite" (that
            tissue's bounds are inf).
        known: properties measured separately (indices into P, or names with `names=`): their columns are
            dropped before the inversion, so the others' bounds are those with these known, and their own
            bound is 0.
        of: which bounds to return, in this order (indices or names); default all P.
        names: the P property names of the Jacobian's rows, to give `known` and `of` by name.

    Returns:
        `(..., P)` (or `(..., len(of))`) in the Jacobian's real dtype, in squared property units: a
        standard deviation is its square root.

    The small P x P inversion runs in float64 on the equilibrated matrix `D^-1/2 F D^-1/2`, `D = diag F`
    (properties in ms and in Hz differ by orders of magnitude in their columns). A Fisher matrix counts as
    singular when a column of `J` is zero or the equilibrated matrix's smallest eigenvalue is below `P eps`,
    `eps` the Jacobian's precision: below that, rounding of the Jacobian decides the inverse.
    """
    if singular not in _SINGULAR_MODES:
        raise ValueError(f"singular must be one of {_SINGULAR_MODES}, got {singular!r}")
    J = _check_jacobian(jacobian)
    P = J.shape[-2]
    unknown_of = _unknown_rows(P, known, names)
    wanted = list(range(P)) if of is None else [_index(o, P, names, "of") for o in _as_list(of, "of")]
    out_dtype = J.real.dtype
    batch = J.shape[:-2]
    bound = torch.zeros(batch + (P,), dtype=torch.float64, device=J.device)
    if unknown_of:
        fisher = fisher_information(J[..., unknown_of, :], noise_variance=noise_variance).to(torch.float64)
        bound[..., unknown_of] = _inverse_diagonal(fisher, singular, torch.finfo(out_dtype).eps)
    return bound[..., wanted].to(out_dtype)


def _inverse_diagonal(fisher: torch.Tensor, singular: str, eps: float) -> torch.Tensor:
    """diag(F^-1) of (..., Q, Q) float64 matrices, singular ones raised or set to inf."""
    Q = fisher.shape[-1]
    scale = fisher.diagonal(dim1=-2, dim2=-1)
    with torch.no_grad():
        bad = ~(scale > 0)
        safe_scale = torch.where(bad, torch.ones_like(scale), scale)
        unit = fisher / (safe_scale[..., :, None].sqrt() * safe_scale[..., None, :].sqrt())
        unit = torch.where(bad[..., :, None] | bad[..., None, :], torch.eye(Q, dtype=unit.dtype, device=unit.device),
                           unit)
        bad = bad.any(-1) | (torch.linalg.eigvalsh(unit)[..., 0] < Q * eps) | ~torch.isfinite(unit).all((-2, -1))
    if bool(bad.any()):
        if singular == "raise":
            at = tuple(int(i) for i in torch.nonzero(bad)[0]) if bad.dim() else ()
            raise torch.linalg.LinAlgError(
                f"crlb: the Fisher information of tissue {at} is singular ({int(bad.sum())} of {bad.numel()} tissues): "
                "the samples cannot tell these properties apart (a zero or dependent Jacobian column). Drop a "
                "property, give it as known=, or pass singular='infinite' for inf bounds there")
    keep = ~bad
    d = torch.where(keep[..., None], scale, torch.ones_like(scale)).sqrt()
    unit = fisher / (d[..., :, None] * d[..., None, :])
    eye = torch.eye(Q, dtype=fisher.dtype, device=fisher.device)
    unit = torch.where(keep[..., None, None], unit, eye)
    inverse_diagonal = torch.linalg.inv(unit).diagonal(dim1=-2, dim2=-1) / d**2
    return torch.where(keep[..., None], inverse_diagonal, torch.full_like(inverse_diagonal, float("inf")))


def _check_jacobian(jacobian) -> torch.Tensor:
    if not isinstance(jacobian, torch.Tensor):
        jacobian = torch.as_tensor(jacobian)
    if jacobian.dim() < 2:
        raise ValueError(f"jacobian must have a property axis and a sample axis, (..., P, samples); got shape "
                         f"{tuple(jacobian.shape)}. A single property's Jacobian from jacobian('T1', ...) has "
                         "none: pass the name in a tuple, jacobian(('T1',), ...)")
    if not (jacobian.is_floating_point() or jacobian.is_complex()):
        raise ValueError(f"jacobian must be a real or complex float tensor, got {jacobian.dtype}")
    return jacobian


def _variance(noise_variance, J: torch.Tensor) -> torch.Tensor:
    sigma2 = torch.as_tensor(noise_variance, dtype=J.real.dtype, device=J.device)
    if not bool((sigma2 > 0).all()) or not bool(torch.isfinite(sigma2).all()):
        raise ValueError(f"noise_variance must be positive and finite, got {noise_variance!r}")
    try:
        torch.broadcast_shapes(sigma2.shape, J.shape[:-2])
    except RuntimeError:
        raise ValueError(f"noise_variance of shape {tuple(sigma2.shape)} does not broadcast against the tissues "
                         f"{tuple(J.shape[:-2])} of the Jacobian {tuple(J.shape)}") from None
    return sigma2


def _as_list(value, what: str) -> list:
    if isinstance(value, (str, int)):
        return [value]
    try:
        return list(value)
    except TypeError:
        raise TypeError(f"{what} must be an index, a name, or a sequence of them; got {value!r}") from None


def _index(item, P: int, names, what: str) -> int:
    if isinstance(item, str):
        if names is None:
            raise ValueError(f"{what} names {item!r}, but crlb got no names=: give names=(...) of the Jacobian's "
                             "rows, or indices")
        names = list(names)
        if len(names) != P:
            raise ValueError(f"names has {len(names)} entries but the Jacobian has {P} properties")
        if item not in names:
            raise ValueError(f"{what} names {item!r}, which is not one of names={tuple(names)}")
        return names.index(item)
    if isinstance(item, bool) or not isinstance(item, int) or not -P <= item < P:
        raise ValueError(f"{what} holds {item!r}: expected a property index in [0, {P}) or a name")
    return item % P


def _unknown_rows(P: int, known, names) -> list:
    known_rows = {_index(k, P, names, "known") for k in _as_list(known, "known")}
    return [p for p in range(P) if p not in known_rows]
