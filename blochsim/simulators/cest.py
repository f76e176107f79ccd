"""Chemical exchange saturation transfer: the Lorentzian Z-spectrum model and the CEST event train.

Section 1, `LorentzianSimulator` and `lorentzian_sim`: the multi-pool Lorentzian fit model (closed form).
Section 2, `CESTSimulator` and `cest_sim`: the pulsed saturation event train, below.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from ..model import PUBLIC_FIELDS, Simulator, SpinPhysics
from ..physics.constants import GAMMA_BAR_HZ_PER_T, GAMMA_RAD_PER_S_PER_T
from ..sequence.operators import SampledPulse, Spoil
from ._closed_form import ClosedForm
from ._formulas import lorentzian
from ._function_form import function_form
from ._layout import count, number, seconds
from ._trains import SampledPulses, TrainLoop
from ._waveforms import sample_count

__all__ = ["LorentzianSimulator", "lorentzian_sim"]


# == 1. The Lorentzian Z-spectrum (closed form) =====================================================
def _pool_names(pools: int) -> tuple[str, ...]:
    return tuple(f"pool{k}_{part}" for k in range(1, pools + 1) for part in ("amplitude", "width", "shift"))


class LorentzianSimulator(ClosedForm):
    """A sum of Lorentzian dips, the multi-pool Z-spectrum fit model. Closed form, real.

        S(offset) = M0 (1 - sum_k A_k (W_k/2)^2 / ((W_k/2)^2 + (offset - shift_k)^2)),

    k = 1 .. `pools`, with the amplitude A_k, the full width at half maximum W_k and the shift of pool k
    given as the tissue properties `pool{k}_amplitude`, `pool{k}_width`, `pool{k}_shift`, all three required
    for every pool, in the units of `offsets` (ppm or Hz, the caller's choice).

    `LorentzianSimulator(pools=1, **values)`: `pools` fixes the declared names; `values` are fixed protocol,
    tissue and run settings as for any simulator. Protocol: `offsets`. Tissue: `M0` and the pool names.
    Shape `(*voxel_shape, *offsets.shape)`. float32, or float64 for float64 inputs.
    """

    def __init__(self, pools=1, **values):
        if isinstance(pools, bool) or not isinstance(pools, int) or pools < 1:
            raise ValueError(f"LorentzianSimulator: pools must be an integer >= 1 (the number of Lorentzian "
                             f"dips), got {pools!r}")
        self.pools = pools
        model = SpinPhysics(properties={"M0": None, **{name: None for name in _pool_names(pools)}})
        super().__init__(model=model, **values)

    def evaluate(self, properties, *, offsets, device=None):
        x = self.arrange(properties, dict(offsets=offsets), required=_pool_names(self.pools), device=device)
        k = range(1, self.pools + 1)
        tissue = x.tissue
        return x.finish(lorentzian(x.protocol["offsets"], amplitudes=[tissue[f"pool{i}_amplitude"] for i in k],
                                   widths=[tissue[f"pool{i}_width"] for i in k],
                                   shifts=[tissue[f"pool{i}_shift"] for i in k], M0=tissue.get("M0", 1.0)))


_LORENTZIAN: dict[int, LorentzianSimulator] = {}


def lorentzian_sim(offsets, pools=1, diff=None, M0=1.0, device=None, **values):
    """Function form of `LorentzianSimulator`: the signal, or (signal, J) when `diff` names
    properties, with the shapes of `Simulator.jacobian`.

    The pool properties `pool{k}_amplitude`, `pool{k}_width`, `pool{k}_shift` (k = 1 .. `pools`) come through
    `**values`, which also forwards any protocol argument or run setting; arguments passed as None are
    dropped.
    """
    simulator = _LORENTZIAN.get(pools)
    if simulator is None:
        simulator = _LORENTZIAN.setdefault(pools, LorentzianSimulator(pools))
    given = {"offsets": offsets, "M0": M0, "device": device, **values}
    given = {name: value for name, value in given.items() if value is not None}
    return simulator.simulate(**given) if diff is None else simulator.jacobian(diff, **given)


# == 2. The CEST event train =========================================================================
__all__ += ["CESTSimulator", "cest_sim"]

_POOLS = tuple(f"pool{x}_{part}" for x in "BCDE" for part in ("fraction", "exchange", "T1", "T2", "shift"))


class CESTSimulator(TrainLoop, SampledPulses, Simulator):
    """A Z-spectrum from pulsed saturation, in the manner of pulseq-cest (Herz et al., MRM
    2021;86:1845): one simulation per offset, each from equilibrium.

    Protocol: `offsets` (ppm), `field_strength=3.0` (T), `B1sat=1.0` (uT), `npulses=1`,
    `pulse_duration=100` (ms), `interpulse_delay=0` (ms), `recovery=6.5` (ms), `dwell=0.01` (ms).
    For each offset: `npulses` rectangular pulses of amplitude `B1sat` at `offsets` ppm of
    `field_strength`, `interpulse_delay` apart, each played sample by sample (`SampledPulse`, one hard
    pulse per `dwell`) and phase continuous across pulses (pulse j starts at the phase pulse j - 1 ended
    with, as pulseq-cest plays them: the delays do not advance it); then the transverse magnetization is
    spoiled, `recovery` ms pass, and a 90-degree pulse reads Mz. A semisolid pool is saturated at the
    continuous-wave rate `pi w1^2 G(offset - B0)` (definition 0 is one dwell-long rectangle, `_waveforms`).
    The sampled pulse repeats its spectrum every 1/dwell Hz, so an offset at or beyond 1/(2 dwell) Hz is
    a ValueError (it would saturate as an alias closer to water); the default 10 us reaches 391 ppm at 3 T.
    The sampling is a splitting of the continuous motion, second order in the dwell.

    Tissue: T1, T2 (ms), M0, B1 (scales every pulse: the saturation, and the read by sin(90 B1)), B0 (Hz),
    the exchanging pools `poolB_* .. poolE_*` (`_shift` in Hz: 2 ppm at 3 T is 255.5 Hz; `_exchange` in
    Hz with the engine's convention), and every public tissue name (`bound_*` for a semisolid pool).

    Returns real float32 `(..., len(offsets))` (a scalar offset gives one sample): Mz of the water-like
    pools at the read, in units of M0, so about 1 far off resonance without a semisolid pool. The offsets
    are read as numbers: no gradient flows to them (B1sat, the delays and the tissue are differentiable).
    Cost: without `bound_fraction`, the offsets of a call share one layout (resolved once, then about
    10 ms per offset at the defaults); with it, each offset's layout is built (about 0.5 s at the
    defaults, cached for later calls with the same offsets, up to 32 of them).
    """

    model = SpinPhysics(properties={**{name: PUBLIC_FIELDS[name] for name in ("T1", "T2", "M0", "B1", "B0")},
                                    **{name: PUBLIC_FIELDS[name] for name in _POOLS}})
    states = 1
    structural = ("npulses", "pulse_duration", "dwell")
    post_rotation_rad = math.pi / 2  # the read's -i Mz times +i
    train_axis = -1  # one simulation per offset, concatenated along the samples
    train_dims = {"offsets": 0}  # a 0-d tensor too: offsets reach the layout as numbers

    def trains(self, protocol: dict, tissue: dict) -> list[dict] | None:
        offsets = protocol.get("offsets")
        if offsets is None or isinstance(offsets, (int, float)):
            return None
        values = torch.as_tensor(offsets).detach().to(torch.float64).reshape(-1)
        if values.numel() == 0:
            raise ValueError("offsets is empty: give at least one saturation offset (ppm)")
        if tissue.get("bound_fraction") is not None:
            # Python numbers: each offset is its own structure, kept with its own RF frequencies, which the
            # semisolid lineshape reads (frequencies are structure: one shared structure is walked every call).
            return [{"offsets": float(v)} for v in values.tolist()]
        # Detached 0-d tensors: every offset shares one structure, whose values (the phases) are resolved
        # once as an affine map of the offset (blochsim.model, "Structure resolution"): later offsets cost no layout.
        return [{"offsets": v} for v in values.unbind()]

    def evaluate(self, properties, **sequence):
        return super().evaluate(properties, **sequence).real

    def layout(self, *, offsets, field_strength=3.0, B1sat=1.0, npulses=1, pulse_duration=100.0,
               interpulse_delay=0.0, recovery=6.5, dwell=0.01):
        pulses = count("npulses", npulses)
        dwell_ms = number("dwell", dwell)
        n = sample_count("pulse_duration", number("pulse_duration", pulse_duration), dwell_ms)
        offset_hz = offsets * (1e-6 * GAMMA_BAR_HZ_PER_T) * field_strength
        nyquist_hz = 0.5 / (dwell_ms * 1e-3)
        farthest_hz = float(torch.as_tensor(offset_hz).detach().abs().max())
        if farthest_hz >= nyquist_hz:
            ppm = farthest_hz / (1e-6 * GAMMA_BAR_HZ_PER_T * float(field_strength))
            raise ValueError(f"offsets reach {farthest_hz:.6g} Hz ({ppm:.4g} ppm at {float(field_strength):g} T), "
                             f"beyond the {nyquist_hz:.6g} Hz that pulses sampled every dwell = {dwell_ms:g} ms "
                             f"resolve: the saturation would alias closer to water; give dwell < "
                             f"{0.5e3 / farthest_hz:.4g} ms")
        w1 = GAMMA_RAD_PER_S_PER_T * 1e-6 * B1sat  # rad/s
        # NumPy for a number (the events then hold plain floats, cheaper to build), a tensor for a tensor.
        waveform = w1 * (torch.ones(n, dtype=torch.float64) if isinstance(w1, torch.Tensor) else np.ones(n))
        pulse_s = n * dwell_ms * 1e-3
        ops = []
        for j in range(pulses):
            phase = -2.0 * math.pi * offset_hz * (j * pulse_s)  # where pulse j - 1 ended
            if isinstance(phase, float):
                phase = math.remainder(phase, 2.0 * math.pi)
            ops.append(SampledPulse(waveform, dwell_ms * 1e-3, phase_rad=phase, offset_hz=offset_hz))
            if j < pulses - 1:
                ops.append(self.operators.delay(seconds(interpulse_delay)))
        ops.append(Spoil() @ self.operators.delay(seconds(recovery)))
        ops.append(self.operators.excitation(math.pi / 2) @ self.operators.readout())
        return ops


cest_sim = function_form(
    CESTSimulator,
    "cest_sim",
    ("offsets", "T1", "T2"),
    (("diff", None), ("field_strength", 3.0), ("B1sat", 1.0), ("npulses", 1), ("pulse_duration", 100.0),
     ("interpulse_delay", 0.0), ("recovery", 6.5), ("dwell", 0.01), ("B1", 1.0), ("B0", 0.0), ("M0", 1.0),
     ("device", None)),
)
