"""Diffusion weighting: mono-exponential (isotropic D) or diffusion-tensor signal decay. Real."""

from __future__ import annotations

import torch

from ..diffusion_tensor import DIAGONAL, INDEX, TENSOR
from ._common import as_tensors, check_nonnegative

__all__ = ["diffusion"]

#: b (s/mm^2) times D (um^2/ms) -> the dimensionless b D: 1 um^2/ms = 1e-3 mm^2/s.
_B_TIMES_D = 1e-3


def diffusion(
    b, directions=None, *, D=None, M0=1.0, Dxx=None, Dyy=None, Dzz=None, Dxy=None, Dxz=None, Dyz=None
) -> torch.Tensor:
    """Diffusion-weighted signal, real: S = M0 e^{-b D}, or S = M0 e^{-b g^T D g} with the tensor.

    `b` in s/mm^2, `D` and the components `Dxx Dyy Dzz Dxy Dxz Dyz` (`diffusion_tensor.TENSOR`) in
    um^2/ms, so the exponent is b D 1e-3. Give either `D` or the tensor (components left out are 0, the
    tensor needs at least one); the tensor needs `directions`, of shape `(*b.shape, 3)` (or broadcasting
    to it), one gradient direction per b-value. Each direction is normalised to unit length (b carries
    the weighting); a zero direction is allowed only where b = 0. With `D`, `directions` is ignored
    (isotropic). g^T D g = gx^2 Dxx + gy^2 Dyy + gz^2 Dzz + 2 (gx gy Dxy + gx gz Dxz + gy gz Dyz).
    Elementwise in b and the tissue (the components of `directions` are split off its last axis).
    """
    tensor = dict(Dxx=Dxx, Dyy=Dyy, Dzz=Dzz, Dxy=Dxy, Dxz=Dxz, Dyz=Dyz)
    given = [name for name in TENSOR if tensor[name] is not None]
    if D is not None and given:
        raise ValueError(f"diffusion: give either D or the tensor components, not both (got D and {given})")
    if D is None and not given:
        raise ValueError(f"diffusion needs D (um^2/ms) or the tensor components {TENSOR}")
    if given and directions is None:
        raise ValueError("diffusion: the tensor components need `directions`, one unit vector per b-value")
    v = as_tensors(dict(b=b, D=D, M0=M0, directions=directions if given else None, **tensor))
    check_nonnegative("a b-value >= 0 s/mm^2", b=v["b"])
    bval = v["b"]
    if not given:
        return v["M0"] * torch.exp(-bval * v["D"] * _B_TIMES_D)
    g = v["directions"]
    if g.dim() == 0 or g.shape[-1] != 3:
        raise ValueError(f"directions must have a last axis of 3 (x, y, z), got shape {tuple(g.shape)}")
    norm = torch.linalg.vector_norm(g, dim=-1)
    weighted = (bval != 0) & (norm == 0)
    if bool(weighted.any()):
        raise ValueError("directions: a zero direction needs b = 0 (it has no axis to weight along)")
    g = g / torch.where(norm > 0, norm, torch.ones_like(norm)).unsqueeze(-1)
    component = {"x": g[..., 0], "y": g[..., 1], "z": g[..., 2]}
    apparent = torch.zeros((), dtype=bval.dtype, device=bval.device)
    for name in given:
        row, col = INDEX[name]
        weight = component["xyz"[row]] * component["xyz"[col]]
        apparent = apparent + (1 if name in DIAGONAL else 2) * weight * v[name]
    return v["M0"] * torch.exp(-bval * apparent * _B_TIMES_D)
