"""Chemical exchange saturation transfer: the Lorentzian Z-spectrum model and the CEST event train.

Section 1, `LorentzianSimulator` and `lorentzian_sim`: the multi-pool Lorentzian fit model (closed form).
Section 2, `CESTSimulator` and `cest_sim`: the pulsed saturation event train (API.md 5.1), below.
"""

from __future__ import annotations

from ..model import SpinPhysics
from ._closed_form import ClosedForm
from ._formulas import lorentzian

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
    """Function form of `LorentzianSimulator` (API.md 5.3): the signal, or (signal, J) when `diff` names
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
