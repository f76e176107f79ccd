"""A stand-in for `blochsim.sequence.rf.RfDefinition`, for tests of the reference engine.

It has the methods the engine reads: `signed_flip(amplitude, rf_raster_time_s=...)` -> (alpha, extra_phase),
`saturation(rf_raster_time_s=...)` -> S (1/s per rad^2) and `rf_mode()` (INSTANT: one channel, a hard
rotation). The default is the ideal hard pulse:
alpha = amplitude, extra_phase = 0, S = -2*pi^2. Other values stand in for a shaped pulse:
alpha = flip_per_amplitude * amplitude about the event phase + extra_phase_rad, with S given.
"""

import math

from blochsim.sequence.events import RfMode


class StubRfDefinition:
    def __init__(self, definition_id: int = 0, saturation_per_rad2: float = -2.0 * math.pi**2,
                 flip_per_amplitude: float = 1.0, extra_phase_rad: float = 0.0):
        self.id = definition_id
        self._saturation = saturation_per_rad2
        self._scale = flip_per_amplitude
        self._phase = extra_phase_rad

    def signed_flip(self, amplitude, *, rf_raster_time_s: float = 1e-6):
        if self._scale == 1.0:
            return amplitude, self._phase
        return amplitude * self._scale, self._phase

    def saturation(self, *, rf_raster_time_s: float = 1e-6) -> float:
        return self._saturation

    def rf_mode(self) -> RfMode:
        return RfMode.INSTANT


def ideal_rf_definition(definition_id: int = 0) -> StubRfDefinition:
    return StubRfDefinition(definition_id)
