"""Frequency-modulated balanced SSFP: `fmSSFPSimulator` and `fmssfp_sim`."""

from __future__ import annotations

import math

from ..model import BALANCED, Simulator, SpinPhysics
from ._function_form import function_form
from ._layout import check_order, count, ms_default, number, per_shot, rad, seconds
from ._trains import SampledPulses, layout_default

__all__ = ["fmSSFPSimulator", "fmssfp_sim"]


def sweep_phases(nshots: int, sweeps: int) -> list[float]:
    """RF phases (rad, wrapped to [0, 2 pi)) of `sweeps + 1` sweeps of `nshots` pulses.

    Pulse j (from 0, over all sweeps) is pulse n = j mod nshots of its sweep, and the phase advances by
    `pi + 2 pi n / nshots` from pulse j - 1 to pulse j; the first pulse has phase 0.
    """
    phases, phase = [], 0.0
    for j in range((sweeps + 1) * nshots):
        if j:
            phase = math.fmod(phase + math.pi + 2.0 * math.pi * (j % nshots) / nshots, 2.0 * math.pi)
        phases.append(phase)
    return phases


class fmSSFPSimulator(SampledPulses, Simulator):
    """Frequency-modulated SSFP (Foxall 2002): a balanced train whose RF frequency sweeps.

    Protocol: `flip` (deg, a scalar or one per shot of a sweep), `TR` (ms), `nshots` (pulses per sweep),
    `sweeps=1`, `TE=None` (ms from the pulse centre; TR/2), `pulse_duration=0` (ms; 0 is
    instantaneous, else a Hamming-windowed sinc played sample by sample), `bandwidth_time=4.0`,
    `dwell=0.01` (ms). Within a sweep the RF phase advances by `pi + 2 pi n / nshots` from pulse n - 1 to
    pulse n, continuously across sweeps; each sample is demodulated by its pulse's phase. `sweeps`
    sweeps play from equilibrium before the recorded one, in a single playing. Balanced (nothing winds):
    one EPG order suffices.

    Tissue: T1, T2 (ms), M0, B1, B0 (Hz), and every public tissue name. Returns `(..., nshots)` complex64:
    the phase of the signal carries the off-resonance, so it is complex by construction.
    """

    model = SpinPhysics(properties={"T1": "t1_ms", "T2": "t2_ms", "M0": "m0", "B1": "b1", "B0": "b0_hz"},
                        operators=BALANCED)
    states = 1
    structural = ("nshots", "sweeps", "pulse_duration", "bandwidth_time", "dwell")

    def plays_sampled(self, args: dict) -> bool:
        return number("pulse_duration", args.get("pulse_duration", layout_default(self, "pulse_duration"))) > 0

    def layout(self, *, flip, TR, nshots, sweeps=1, TE=None, pulse_duration=0.0, bandwidth_time=4.0, dwell=0.01):
        n, before = count("nshots", nshots), count("sweeps", sweeps, minimum=0)
        duration_ms, dwell_ms = number("pulse_duration", pulse_duration), number("dwell", dwell)
        if duration_ms < 0:
            raise ValueError(f"pulse_duration must be >= 0 ms (0: instantaneous), got {duration_ms}")
        bandwidth_time = number("bandwidth_time", bandwidth_time)
        pulse_s, tr_s = duration_ms * 1e-3, seconds(TR)
        te_s = seconds(ms_default(TE, TR / 2))
        check_order("TE", pulse_s / 2, te_s, f"TE = {_ms(te_s)} ms (from the pulse centre) must be at least half the "
                    f"pulse, {_ms(pulse_s / 2)} ms")
        check_order("TE", te_s + pulse_s / 2, tr_s, f"TE = {_ms(te_s)} ms must leave the sample before the next "
                    f"pulse: TE + pulse_duration/2 <= TR = {_ms(tr_s)} ms")
        flips = per_shot("flip", rad(flip), n, unit=" (deg)")
        ops = []
        for j, phase in enumerate(sweep_phases(n, before)):
            a = flips[j % n]
            if duration_ms == 0:
                pulse = self.operators.excitation(a, phase)
            else:
                pulse = self.excitation_pulse(a, phase, duration_ms=duration_ms, bandwidth_time=bandwidth_time,
                                              dwell_ms=dwell_ms)
            rest_s = tr_s - te_s - pulse_s / 2
            if j < before * n:  # a sweep played before the recorded one: no sample
                ops.append(pulse @ self.operators.delay(tr_s - pulse_s))
            else:
                ops.append(pulse @ self.operators.delay(te_s - pulse_s / 2)
                           @ self.operators.readout(phase, duration_s=rest_s))
        return ops


def _ms(t_s) -> str:
    value = float(t_s.detach()) if hasattr(t_s, "detach") else float(t_s)
    return f"{value * 1e3:g}"


fmssfp_sim = function_form(
    fmSSFPSimulator,
    "fmssfp_sim",
    ("flip", "TR", "nshots", "T1", "T2"),
    (("diff", None), ("sweeps", 1), ("TE", None), ("pulse_duration", 0.0), ("bandwidth_time", 4.0),
     ("dwell", 0.01), ("B1", 1.0), ("B0", 0.0), ("M0", 1.0), ("device", None)),
)
