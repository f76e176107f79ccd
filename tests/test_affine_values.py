"""The resolved protocol map (`engine.affine.AffineValues`): values of a structure at new protocol values."""

from __future__ import annotations

import math

import torch

from blochsim.engine.affine import AffineValues


def test_moved_phases_are_wrapped_before_narrowing_on_the_one_factor_path():
    """Phases moved by the protocol, each entry once, in order, by one factor (degrees to radians): the map's
    one-factor path must reduce them modulo 2 pi before narrowing to float32, as its general path does. Large
    phases (quadratic RF spoiling reaches 1e5 rad) keep only about 0.01 rad in float32 unwrapped."""
    sizes = (3, 4)  # a block of flips (constant here), then the phases
    rows, cols = torch.arange(3, 7), torch.arange(4)
    affine = AffineValues(rows, cols, torch.full((4,), math.pi / 180, dtype=torch.float64),
                          torch.zeros(7, dtype=torch.float64), sizes)
    assert affine.scale is not None  # the one-factor path is the one under test
    phases_deg = torch.tensor([1e7, 2e7 + 1.0, 3.3e6, 45.0], dtype=torch.float64)
    flips, phases = affine(phases_deg, torch.float32, wrap_last=True)
    expected = torch.remainder(phases_deg * (math.pi / 180), 2 * math.pi)
    # float32 rounding of a value below 2 pi: at most 2.4e-7; the unwrapped values were off by up to 5e-3.
    assert float((phases.double() - expected).abs().max()) < 1e-6
    assert flips.abs().max() == 0
