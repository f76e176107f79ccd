"""Diffusion weighting: `DiffusionSimulator` and `diffusion_sim`.

`TENSOR` (public) is the order of the six tensor components, `("Dxx", "Dyy", "Dzz", "Dxy", "Dxz", "Dyz")`;
see `diffusion_tensor`.
"""

from __future__ import annotations

import torch

from .._arrays import broadcast_shapes
from .._errors import missing_property
from ..model import SpinPhysics
from ._closed_form import ClosedForm
from ._formulas import diffusion
from ._function_form import function_form
from .diffusion_tensor import TENSOR

__all__ = ["TENSOR", "DiffusionSimulator", "diffusion_sim"]


class DiffusionSimulator(ClosedForm):
    """Diffusion-weighted signal, mono-exponential or diffusion tensor. Closed form, real.

        S = M0 e^{-b D},   or   S = M0 e^{-b g^T D g}
        g^T D g = gx^2 Dxx + gy^2 Dyy + gz^2 Dzz + 2 (gx gy Dxy + gx gz Dxz + gy gz Dyz),

    with `b` in s/mm^2 and the diffusivities in um^2/ms (the exponent is b D 1e-3). Give either `D` or
    tensor components (`TENSOR`; those left out are 0); the tensor needs `directions`, one gradient
    direction per b-value, each normalised to unit length (a zero direction only where b = 0).

    Protocol: `b` (s/mm^2), `directions=None` (shape `(*b.shape, 3)`). Tissue: `D` or
    `Dxx Dyy Dzz Dxy Dxz Dyz` (um^2/ms), `M0`. Shape `(*voxel_shape, *b.shape)`. float32, or float64 for
    float64 inputs.
    """

    model = SpinPhysics(properties={"D": None, **{name: None for name in TENSOR}, "M0": None})

    def evaluate(self, properties, *, b, directions=None, device=None):
        if "D" not in properties and not any(name in properties for name in TENSOR):
            raise missing_property("D", type(self).__name__, f"um^2/ms; or the tensor components {', '.join(TENSOR)}")
        samples = tuple(b.shape) if isinstance(b, torch.Tensor) else ()
        if isinstance(directions, torch.Tensor) and directions.dim():
            try:
                samples = tuple(broadcast_shapes(samples, tuple(directions.shape[:-1])))
            except ValueError:
                raise ValueError(f"DiffusionSimulator: directions must have shape (*b.shape, 3) = "
                                 f"{(*samples, 3)}, got {tuple(directions.shape)}") from None
        x = self.arrange(properties, dict(b=b, directions=directions), sample_shape=samples, device=device)
        return x.finish(diffusion(x.protocol["b"], x.protocol["directions"], **x.tissue))


diffusion_sim = function_form(
    DiffusionSimulator,
    "diffusion_sim",
    ("b",),
    (("diff", None), ("directions", None), ("D", None), ("M0", 1.0), ("device", None)),
)
