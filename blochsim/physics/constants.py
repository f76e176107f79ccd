"""Physical constants shared by the layers above (simulators, engine, oracle)."""

from __future__ import annotations

import math

__all__ = ["GAMMA_BAR_HZ_PER_T", "GAMMA_RAD_PER_S_PER_T"]

#: Proton gyromagnetic ratio / 2 pi (CODATA 2018, 42.577478518 MHz/T), rounded as in the project spec.
GAMMA_BAR_HZ_PER_T = 42.577478e6

#: Proton gyromagnetic ratio in rad/s/T.
GAMMA_RAD_PER_S_PER_T = 2.0 * math.pi * GAMMA_BAR_HZ_PER_T
