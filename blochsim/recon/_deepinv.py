"""`ModelOperator.physics()`: the operator as a deepinv `Physics` (deepinv is optional)."""

from __future__ import annotations

import torch

__all__ = ["model_physics"]


def model_physics(model, **options):
    """A `deepinv.physics.Physics` whose `A` maps `(batch, channels, *xyz)` to `(batch, contrasts, *xyz)`
    through `model` (channel axis moved last and back), with `A_vjp` from `model.A_vjp`."""
    try:
        from deepinv.physics import Physics
    except ImportError:
        raise ImportError("ModelOperator.physics() needs deepinv: pip install deepinv") from None

    class ModelPhysics(Physics):
        """blochsim's `ModelOperator` as a deepinv forward model, channels first."""

        def __init__(self, **kw):
            super().__init__(A=lambda x, **_: torch.movedim(model(torch.movedim(x, 1, -1)), -1, 1), **kw)
            self.model = model

        def A_vjp(self, x, v):
            return torch.movedim(model.A_vjp(torch.movedim(x, 1, -1), torch.movedim(v, 1, -1)), -1, 1)

    return ModelPhysics(**options)
