"""Balanced SSFP with shaped pulses: `TrueFISPSimulator` and `truefisp_sim`."""

from __future__ import annotations

import math

from ..model import BALANCED, Simulator, SpinPhysics
from ._function_form import function_form
from ._layout import check_order, count, ms_default, number, per_shot, rad, seconds
from ._trains import SampledPulses, layout_default

__all__ = ["TrueFISPSimulator", "truefisp_sim"]


class TrueFISPSimulator(SampledPulses, Simulator):
    """TrueFISP (Oppelt et al. 1986): a balanced train, RF phase alternating 0/180.

    Protocol: `flip` (deg, a scalar or one per shot), `TR` (ms, pulse centre to pulse centre), `nshots`,
    `TE=None` (ms from the pulse centre; TR/2), `pulse_duration=1.0` (ms; 0 is instantaneous),
    `bandwidth_time=4.0`, `half_alpha=True`, `preparation=None` (ms; TR/2), `inversion=None | "ideal" |
    "adiabatic"`, `inversion_duration=10` (ms), `inversion_phase=0` (deg), `spoiler=0` (ms), `dwell=0.01` (ms).

    Pulses are Hamming-windowed sincs played sample by sample, as in `FLASHSimulator`, and nothing winds
    (the BALANCED preset), so one EPG order suffices. Pulse n has phase `180 n` degrees and its sample is
    demodulated by that phase. With `half_alpha`, an `flip[0]/2` pulse at phase 180 (opposite to the first
    pulse) comes `preparation` (centre to centre) before the first pulse. An inversion, if any, comes
    first, then `spoiler` ms closed by a spoiler gradient, as in FLASH. Shaped pulses play definition 0
    as a rectangle one dwell long (semisolid saturation at the waveform's rate, `_waveforms`).

    Tissue: T1, T2 (ms), M0, B1, B0 (Hz), inv_efficiency, and every public tissue name. Returns
    `(..., nshots)` complex64, the engine value demodulated by each pulse's phase.
    """

    model = SpinPhysics(properties={"T1": "t1_ms", "T2": "t2_ms", "M0": "m0", "B1": "b1", "B0": "b0_hz",
                                    "inv_efficiency": "inversion_efficiency"}, operators=BALANCED)
    states = 1
    structural = ("nshots", "pulse_duration", "bandwidth_time", "half_alpha", "inversion", "inversion_duration",
                  "dwell")

    def plays_sampled(self, args: dict) -> bool:
        return number("pulse_duration", args.get("pulse_duration", layout_default(self, "pulse_duration"))) > 0

    def layout(self, *, flip, TR, nshots, TE=None, pulse_duration=1.0, bandwidth_time=4.0, half_alpha=True,
               preparation=None, inversion=None, inversion_duration=10.0, inversion_phase=0.0, spoiler=0.0,
               dwell=0.01):
        n = count("nshots", nshots)
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

        def pulse(a, phase):
            return self.excitation_pulse(a, phase, duration_ms=duration_ms, bandwidth_time=bandwidth_time,
                                         dwell_ms=dwell_ms)

        ops = self.inversion_block(inversion, duration_ms=number("inversion_duration", inversion_duration),
                                   phase_deg=inversion_phase, spoiler_ms=spoiler, dwell_ms=dwell_ms)
        if half_alpha:
            prep_s = seconds(ms_default(preparation, TR / 2))
            check_order("preparation", pulse_s, prep_s, f"preparation = {_ms(prep_s)} ms must be at least the pulse "
                        f"duration, {_ms(pulse_s)} ms (the two pulses may not overlap)")
            ops.append(pulse(flips[0] / 2, math.pi) @ self.operators.delay(prep_s - pulse_s))
        for k, a in enumerate(flips):
            phase = math.pi * (k % 2)
            ops.append(pulse(a, phase) @ self.operators.delay(te_s - pulse_s / 2)
                       @ self.operators.readout(phase, duration_s=tr_s - te_s - pulse_s / 2))
        return ops


def _ms(t_s) -> str:
    value = float(t_s.detach()) if hasattr(t_s, "detach") else float(t_s)
    return f"{value * 1e3:g}"


truefisp_sim = function_form(
    TrueFISPSimulator,
    "truefisp_sim",
    ("flip", "TR", "nshots", "T1", "T2"),
    (("diff", None), ("TE", None), ("pulse_duration", 1.0), ("bandwidth_time", 4.0), ("half_alpha", True),
     ("preparation", None), ("inversion", None), ("inversion_duration", 10.0), ("inversion_phase", 0.0),
     ("spoiler", 0.0), ("dwell", 0.01), ("B1", 1.0), ("B0", 0.0), ("inv_efficiency", 1.0), ("M0", 1.0),
     ("device", None)),
)
