"""Spoiled gradient echo with shaped pulses: `FLASHSimulator` and `flash_sim`."""

from __future__ import annotations

from ..model import Simulator, SpinPhysics
from ..sequence.operators import Dephase, Spoil
from ._function_form import function_form
from ._layout import DEG, check_order, count, number, per_shot, rad, seconds
from ._trains import SampledPulses, layout_default

__all__ = ["FLASHSimulator", "flash_sim"]


class FLASHSimulator(SampledPulses, Simulator):
    """FLASH (Haase et al. 1986): a spoiled gradient-echo train of shaped pulses.

    Protocol: `flip` (deg, a scalar or one per shot), `TR` (ms), `TE` (ms, from the pulse centre; at least
    half the pulse, and the sample must come before the next pulse), `nshots`, `pulse_duration=1.0` (ms;
    0 plays an instantaneous pulse), `bandwidth_time=4.0` (sinc zero crossings across the pulse),
    `inversion=None | "ideal" | "adiabatic"`, `inversion_duration=10` (ms), `inversion_phase=0` (deg),
    `spoiler=0` (ms), `dwell=0.01` (ms), `rf_spoiling=None` (deg).

    Each pulse is a Hamming-windowed sinc played sample by sample (`SampledPulse`, one hard pulse per
    `dwell`, free evolution between them), so B0 and relaxation act during it. Spoiling is ideal (the
    transverse magnetization is zeroed after each sample, `states=1` unless given), or with
    `rf_spoiling` quadratic: pulse n (from 0) has phase `rf_spoiling n (n + 1) / 2` and its sample is
    demodulated by it, with one EPG order wound per TR (`states` then follows the default order count). An inversion,
    if any, comes first: ideal (`Z -> -inv_efficiency Z`, in the middle of `inversion_duration`) or
    adiabatic (a hyperbolic secant, 14 uT peak, beta = 800 1/s, mu = 4.9, over `inversion_duration`);
    then `spoiler` ms closed by a spoiler gradient, then the train, whose first pulse starts there.
    When the pulses are shaped (`pulse_duration > 0`), definition 0 is a rectangle one dwell long, so
    a semisolid pool is saturated at the continuous-wave rate of the waveform (`_waveforms`).

    Tissue: T1, T2 (ms), M0, B1, B0 (Hz), inv_efficiency, and every public tissue name. Returns
    `(..., nshots)` complex64, the engine's own value: `-i sin(a) Mz` on resonance.
    """

    model = SpinPhysics(properties={"T1": "t1_ms", "T2": "t2_ms", "M0": "m0", "B1": "b1", "B0": "b0_hz",
                                    "inv_efficiency": "inversion_efficiency"})
    states = None
    structural = ("nshots", "pulse_duration", "bandwidth_time", "inversion", "inversion_duration", "dwell")

    def plays_sampled(self, args: dict) -> bool:
        return number("pulse_duration", args.get("pulse_duration", layout_default(self, "pulse_duration"))) > 0

    def evaluate(self, properties, **sequence):
        if "states" not in sequence and sequence.get("rf_spoiling") is None:
            sequence["states"] = 1  # ideal spoiling keeps every state in order 0
        return super().evaluate(properties, **sequence)

    def layout(self, *, flip, TR, TE, nshots, pulse_duration=1.0, bandwidth_time=4.0, inversion=None,
               inversion_duration=10.0, inversion_phase=0.0, spoiler=0.0, dwell=0.01, rf_spoiling=None):
        n = count("nshots", nshots)
        duration_ms, dwell_ms = number("pulse_duration", pulse_duration), number("dwell", dwell)
        if duration_ms < 0:
            raise ValueError(f"pulse_duration must be >= 0 ms (0: instantaneous), got {duration_ms}")
        half_s = duration_ms * 1e-3 / 2
        te_s, tr_s = seconds(TE), seconds(TR)
        check_order("TE", half_s, te_s, f"TE = {_ms(te_s)} ms (from the pulse centre) must be at least half the "
                    f"pulse, {_ms(half_s)} ms")
        check_order("TE", te_s + half_s, tr_s, f"TE = {_ms(te_s)} ms must leave the sample before the next pulse: "
                    f"TE + pulse_duration/2 <= TR = {_ms(tr_s)} ms")
        flips = per_shot("flip", rad(flip), n, unit=" (deg)")
        ops = self.inversion_block(inversion, duration_ms=number("inversion_duration", inversion_duration),
                                   phase_deg=inversion_phase, spoiler_ms=spoiler, dwell_ms=dwell_ms)
        bandwidth_time = number("bandwidth_time", bandwidth_time)
        for k, a in enumerate(flips):
            phase = 0.0 if rf_spoiling is None else rf_spoiling * (DEG * k * (k + 1) / 2)
            pulse = self.excitation_pulse(a, phase, duration_ms=duration_ms, bandwidth_time=bandwidth_time,
                                          dwell_ms=dwell_ms)
            spoil = Spoil() if rf_spoiling is None else Dephase()
            ops.append(pulse @ self.operators.delay(te_s - half_s) @ self.operators.readout(phase) @ spoil
                       @ self.operators.delay(tr_s - te_s - half_s))
        return ops


def _ms(t_s) -> str:
    value = float(t_s.detach()) if hasattr(t_s, "detach") else float(t_s)
    return f"{value * 1e3:g}"


flash_sim = function_form(
    FLASHSimulator,
    "flash_sim",
    ("flip", "TR", "TE", "nshots", "T1", "T2"),
    (("diff", None), ("pulse_duration", 1.0), ("bandwidth_time", 4.0), ("inversion", None),
     ("inversion_duration", 10.0), ("inversion_phase", 0.0), ("spoiler", 0.0), ("dwell", 0.01),
     ("rf_spoiling", None), ("B1", 1.0), ("B0", 0.0), ("inv_efficiency", 1.0), ("M0", 1.0), ("device", None)),
)
