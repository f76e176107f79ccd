"""The public API with its tensors on a device: the cases of tests/test_cuda_api.py (a GPU) and of
tests/test_device_placement.py (a stand-in card on the CPU, tests/_fake_card.py).

Each case makes one call of the public API twice: with every tensor on the CPU (the reference), and
with the protocol tensors (flips, TR, RF phases) and the tissue tensors each on the CPU or on the card
(`Placement`). A case returns what it computed: the results, and the tensors whose gradients it asked
for; `check` compares the two calls and checks where the results and gradients live (API.md 1.3: the
work runs and the results return where the tissue is; a gradient reaches a tensor on its own device).

Paths: the real path (MRF: one pulse axis, free water), the complex path (MRF with quadratic RF phases),
and pooled tissue (an exchanging pool B and a semisolid pool: the engine's pool tables).
Derivative kinds: the forward, the tissue Jacobian (forward mode), the gradient of a loss along the
protocol and the tissue (reverse mode), and second order (the gradient of a cost of the Jacobian along
the protocol: forward-over-reverse).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from conftest import column_rel_err, rel_max_err

from blochsim import engine
from blochsim.sequence import EpgEngine, TissueProperties, mrf_description
from blochsim.simulators import MRFSimulator, mrf_sim

#: float32 kernels on both sides of every comparison. A GPU rounds differently (fused multiply-adds, its
#: own sin/cos/exp), so the two agree to float32 round-off accumulated over the train: the budget of
#: tests/test_cuda.py (the kernels against the host build), values 1e-5 of the largest entry, first
#: derivatives 1e-4 (per Jacobian column, each against its own scale), second derivatives 1e-3.
VALUES, FIRST, SECOND = 1e-5, 1e-4, 1e-3
#: repetitions="auto" on a card against the host's float64 extrapolation (see `steady`).
STEADY_VALUES = 3e-5
#: the flip gradient under repetitions="auto" on a card (see `steady`).
STEADY_GRADIENT = 3e-4

STATES = 16
FLIPS_DEG = np.concatenate([np.linspace(5.0, 60.0, 12), np.linspace(60.0, 8.0, 12)])
TR_MS = 8.0
#: RF spoiling: phi_j = 117 deg j (j + 1) / 2, the complex path.
QUADRATIC_DEG = 117.0 * np.arange(len(FLIPS_DEG)) * (np.arange(len(FLIPS_DEG)) + 1) / 2
VOXELS = 12
#: An exchanging pool B (no shift: any path may take it) and a semisolid pool of per-voxel fraction.
POOLS = dict(poolB_fraction=0.08, poolB_exchange=15.0, poolB_T1=600.0, poolB_T2=30.0, bound_exchange=4.3,
             bound_T1=1000.0)
PATHS = ("real", "complex", "pooled")
KINDS = ("forward", "jacobian", "gradient", "second_order")
#: (protocol, tissue) devices: "cpu" tensors, "card" tensors, or "numpy" arrays (protocol only).
PLACEMENTS = (("cpu", "card"), ("card", "card"), ("card", "cpu"), ("numpy", "card"))


@dataclass(frozen=True)
class Placement:
    protocol: str
    tissue: str
    to_card: Callable  # a CPU tensor -> the same values on the card, a new leaf

    def put(self, where: str, t: torch.Tensor, grad: bool = False):
        """`t` placed as `where` says, a leaf requiring grad if `grad`."""
        if where == "numpy":
            return t.numpy()
        leaf = t.detach().clone() if where == "cpu" else self.to_card(t.detach())
        return leaf.requires_grad_(grad)


def _tissue_values(path: str) -> dict:
    """Public tissue names -> CPU float32 tensors of VOXELS voxels."""
    g = torch.Generator().manual_seed(7)
    t1 = torch.exp(torch.empty(VOXELS).uniform_(math.log(300.0), math.log(2500.0), generator=g))
    t2 = torch.minimum(torch.exp(torch.empty(VOXELS).uniform_(math.log(20.0), math.log(200.0), generator=g)),
                       0.8 * t1)
    values = {"T1": t1, "T2": t2}
    if path == "pooled":
        values.update({name: torch.tensor(value) for name, value in POOLS.items()})
        values["bound_fraction"] = torch.linspace(0.05, 0.15, VOXELS)
    return values


def _protocol_values(path: str, flips: int) -> dict:
    values = {"flip": torch.tensor(FLIPS_DEG[:flips]), "TR": torch.tensor(TR_MS, dtype=torch.float64)}
    if path == "complex":
        values["phases"] = torch.tensor(QUADRATIC_DEG[:flips])
    return values


_ENGINE_NAMES = {"T1": "t1_ms", "T2": "t2_ms", "poolB_fraction": "pool_b_fraction",
                 "poolB_exchange": "pool_b_exchange_hz", "poolB_T1": "t1_pool_b_ms", "poolB_T2": "t2_pool_b_ms",
                 "bound_fraction": "bound_fraction", "bound_exchange": "bound_exchange_hz",
                 "bound_T1": "t1_bound_ms"}


def _description(protocol: dict):
    """The MRF train of `protocol` (public units) as the builder lays it out: rad, s."""
    return mrf_description(_rad(protocol["flip"]), protocol["TR"] * 1e-3, inversion_time_s=0.0,
                           phases_rad=_rad(protocol.get("phases", 0.0)))


def _rad(x):
    return np.deg2rad(x) if isinstance(x, np.ndarray) else x * (math.pi / 180)


# -- the entry points: (protocol, tissue, kind) -> the result (signal, or (signal, J)) ----------------------
def _simulator(protocol, tissue, kind):
    sim = MRFSimulator(states=STATES)
    if kind in ("jacobian", "second_order"):
        return sim.jacobian(("T1", "T2"), **protocol, **tissue)
    return sim.simulate(**protocol, **tissue)


def _constructed_and_bound(protocol, tissue, kind):
    """The protocol fixed by the constructor, the tissue by bind()."""
    sim = MRFSimulator(states=STATES, **protocol).bind(**tissue)
    if kind in ("jacobian", "second_order"):
        return sim.jacobian(("T1", "T2"))
    return sim.simulate()


def _function_form(protocol, tissue, kind):
    rest = {k: v for k, v in {**protocol, **tissue}.items() if k not in ("flip", "TR", "T1", "T2")}
    diff = ("T1", "T2") if kind in ("jacobian", "second_order") else None
    return mrf_sim(protocol["flip"], protocol["TR"], tissue["T1"], tissue["T2"], diff=diff, states=STATES, **rest)


def _engine(protocol, tissue, kind):
    """engine.simulate / engine.jacobian on the builder's description."""
    d = _description(protocol)
    t = TissueProperties(**{_ENGINE_NAMES[k]: v for k, v in tissue.items()})
    if kind in ("jacobian", "second_order"):
        return engine.jacobian(d, t, ("t1_ms", "t2_ms"), states=STATES)
    return engine.simulate(d, t, states=STATES)


def _epg_engine(protocol, tissue, kind):
    """EpgEngine.simulate (API.md 6.4), which has no Jacobian."""
    d = _description(protocol)
    t = TissueProperties(**{_ENGINE_NAMES[k]: v for k, v in tissue.items()})
    return EpgEngine().simulate(d, t, nstates=STATES).signal


ENTRIES = {"simulate": _simulator, "constructed+bind": _constructed_and_bound, "mrf_sim": _function_form,
           "engine": _engine, "EpgEngine": _epg_engine}


def cases() -> list:
    """(entry, kind, path, placement) of the matrix: every kind an entry offers, in every placement
    (NumPy protocol: forward and Jacobian only, NumPy carries no gradient)."""
    out = []
    for entry in ENTRIES:
        for kind in KINDS:
            if entry == "EpgEngine" and kind in ("jacobian", "second_order"):
                continue
            for path in PATHS:
                for protocol, tissue in PLACEMENTS:
                    if protocol == "numpy" and kind in ("gradient", "second_order"):
                        continue
                    out.append((entry, kind, path, f"{protocol}-{tissue}"))
    return out


def _call(entry: str, kind: str, path: str, place: Placement, flips: int) -> dict:
    """One call, placed; returns the results and the gradients it asked for (with the leaves)."""
    grad = kind in ("gradient", "second_order")
    protocol = {k: place.put(place.protocol, v, grad) for k, v in _protocol_values(path, flips).items()}
    tissue = {k: place.put(place.tissue, v, grad and kind == "gradient" and k == "T1")
              for k, v in _tissue_values(path).items()}
    result = ENTRIES[entry](protocol, tissue, kind)
    signal, J = result if isinstance(result, tuple) else (result, None)
    out = {"signal": signal, "J": J, "library": "numpy" if isinstance(signal, np.ndarray) else "torch"}
    if out["library"] == "numpy":
        out["signal"], out["J"] = torch.from_numpy(signal), None if J is None else torch.from_numpy(J)
    if kind == "gradient":
        loss = (signal.abs() ** 2).sum()
        leaves = {**{k: v for k, v in protocol.items()}, "T1": tissue["T1"]}
        loss.backward()
        out["leaves"] = leaves
    elif kind == "second_order":
        cost = (J.abs() ** 2).sum() * 1e6  # dS/dT ~ 1e-4 per ms: a cost of order 1
        cost.backward()
        out["leaves"] = dict(protocol)
    return out


def check(entry: str, kind: str, path: str, placement: str, to_card: Callable, *, grads_on_device: bool = True,
          flips: int = len(FLIPS_DEG)):
    """Run the case placed and on the CPU, compare, and check devices. `grads_on_device`: check that each
    gradient lives on its leaf's device (a stand-in card cannot place the gradients autograd makes).
    `flips`: the first so many of FLIPS_DEG (a short train where only the placement is tested)."""
    protocol_at, tissue_at = placement.split("-")
    placed = _call(entry, kind, path, Placement(protocol_at, tissue_at, to_card), flips)
    ref = _call(entry, kind, path, Placement("cpu", "cpu", to_card), flips)
    home = "cpu" if tissue_at == "cpu" else "card"
    # API.md 1.3: the simulators answer in the library of the first array of the call (NumPy for a NumPy
    # flip); the engine's functions, which take a description, in torch.
    simulator = entry in ("simulate", "constructed+bind", "mrf_sim")
    library = "numpy" if protocol_at == "numpy" and simulator else "torch"
    assert placed["library"] == library, f"the result came back in {placed['library']}, expected {library}"
    if library == "numpy":
        home = "cpu"
    for name in ("signal", "J"):
        got = placed[name]
        if got is None:
            continue
        where = "cpu" if got.device.type == "cpu" else "card"
        assert where == home, f"{name} came back on {got.device}, the tissue is on the {home}"
    assert rel_max_err(placed["signal"].cpu(), ref["signal"]) < VALUES
    if placed["J"] is not None:
        assert column_rel_err(placed["J"].cpu(), ref["J"]) < FIRST
    tolerance = FIRST if kind == "gradient" else SECOND
    for name, leaf in placed.get("leaves", {}).items():
        expected = ref["leaves"][name].grad
        assert leaf.grad is not None, f"no gradient reached {name}"
        if grads_on_device:
            assert leaf.grad.device == leaf.device, f"the gradient of {name} is on {leaf.grad.device}, {name} on " \
                                                    f"{leaf.device}"
        assert rel_max_err(leaf.grad.cpu(), expected) < tolerance, name


# -- the findings of issue 28, each in two placements: the tissue on the card, and everything on the card --------
FINDING_PLACEMENTS = ("cpu-card", "card-card")


def _finding_tissue(place: Placement, *, b0: bool = False, voxels: int = VOXELS, grad: bool = False) -> dict:
    values = _tissue_values("real")
    if voxels != VOXELS:
        g = torch.Generator().manual_seed(3)
        values["T1"] = torch.exp(torch.empty(voxels).uniform_(math.log(200.0), math.log(3000.0), generator=g))
        values["T2"] = torch.minimum(torch.exp(torch.empty(voxels).uniform_(math.log(10.0), math.log(300.0),
                                                                             generator=g)), 0.9 * values["T1"])
    if b0:
        values["B0"] = torch.linspace(-30.0, 30.0, len(values["T1"]))
    return {k: place.put(place.tissue, v, grad and k == "T1") for k, v in values.items()}


def _steady_simulator(name: str):
    """An MRF train (winding: its limit is played out, or extrapolated on the host) and a balanced TrueFISP
    train with B0 (never winds: the host solves its fixed point)."""
    from blochsim.simulators import TrueFISPSimulator

    if name == "mrf":
        return MRFSimulator(), {"flip": torch.tensor(FLIPS_DEG[:12]), "TR": torch.tensor(TR_MS, dtype=torch.float64)}
    return TrueFISPSimulator(), {"flip": torch.tensor(40.0, dtype=torch.float64),
                                 "TR": torch.tensor(5.0, dtype=torch.float64), "nshots": 20, "pulse_duration": 0.0}


STEADY_CASES = ("mrf", "truefisp")


def steady(name: str, placement: str, to_card: Callable, *, explicit: bool = True, grads_on_device: bool = True):
    """`repetitions="auto"` with the tissue (and protocol) on the card against the host's steady state (float64
    extrapolation, narrowed) and, with `explicit`, against 5,000 explicit repetitions on the host: values,
    the tissue Jacobian, and the gradient along the flips. Returns the measured errors."""
    protocol_at, tissue_at = placement.split("-")
    place, host = Placement(protocol_at, tissue_at, to_card), Placement("cpu", "cpu", to_card)
    sim, protocol = _steady_simulator(name)
    b0 = name == "truefisp"
    names = ("T1", "T2", "B0") if b0 else ("T1", "T2")

    def call(where: Placement, **settings):
        given = {k: where.put(where.protocol, v, k == "flip") if isinstance(v, torch.Tensor) else v
                 for k, v in protocol.items()}
        tissue = _finding_tissue(where, b0=b0)
        signal = sim.simulate(**given, **tissue, **settings)
        (signal.abs() ** 2).sum().backward()
        _, J = sim.jacobian(names, **given, **tissue, **settings)
        return signal, J, given["flip"]

    got, got_J, got_flip = call(place, repetitions="auto")
    want, want_J, want_flip = call(host, repetitions="auto")
    assert (got.device.type == "cpu") == (tissue_at == "cpu") and got_J.device == got.device
    if grads_on_device:
        assert got_flip.grad.device == got_flip.device
    errors = {"auto vs host auto": rel_max_err(got.cpu(), want)}
    # The device plays the train until the transient has gone (engine.steady: 20 of the longest relaxation
    # time); the host extrapolates in float64. They differ by float32 round-off: on the host's own float32
    # kernels, played out this way, 1.3e-6 (MRF) and 3.9e-6 (TrueFISP with B0) of the largest sample; the
    # Jacobian's columns 1.8e-6 and 6.6e-6, the flip gradient 4.9e-7 and 6.1e-6. On the H200 (2026-12-04)
    # TrueFISP with B0 came to 1.07e-5, and the card's float32 kernels played 200, 1,000 or 5,000 times gave
    # the same 1.07e-5 against the host's float64: round-off of the card's float32 over the ~T1/TR = 370
    # repetitions the state remembers, not the play-out (the play-out is held to explicit repetitions on the
    # same kernels below).
    assert errors["auto vs host auto"] < STEADY_VALUES, errors
    errors["J (per column)"] = column_rel_err(got_J.cpu(), want_J)
    assert errors["J (per column)"] < FIRST, errors
    errors["flip gradient"] = rel_max_err(got_flip.grad.cpu(), want_flip.grad)
    # The card's adjoint sums the flip's gradient in float32 over every event it plays (TrueFISP with B0: 20 of
    # T1 = 1,838 ms at 5 ms, ~7,400 playings of 20 shots); the host extrapolates in float64. On the H200
    # (2026-12-04) 1.05e-4 and 1.10e-4 of the gradient for TrueFISP, against 6.1e-6 on the host's float32
    # kernels played the same way: the card's float32 accumulation, bounded here.
    assert errors["flip gradient"] < STEADY_GRADIENT, errors
    if explicit:
        given = {k: place.put(place.protocol, v.detach()) if isinstance(v, torch.Tensor) else v
                 for k, v in protocol.items()}
        many = sim.simulate(**given, **_finding_tissue(place, b0=b0), repetitions=5000)
        errors["auto vs 5,000 repetitions"] = rel_max_err(got.detach().cpu(), many.detach().cpu())
        # 5,000 playings (about 500 s) against 20 of the longest relaxation time (50 s), on the same kernels:
        # the same limit, up to float32 round-off (1.5e-7 apart on the host's float32 kernels; on the H200 the
        # card's 200-, 1,000- and 5,000-repetition results lie within 7e-8 of one another).
        assert errors["auto vs 5,000 repetitions"] < 1e-6, errors
    return errors


def epg_engine_steady(placement: str, to_card: Callable):
    """EpgEngine.simulate(repetitions="auto") on the card (it asked the CUDA build for float64 too), against
    the host's float64 extrapolation: the raw samples of an MRF train."""
    protocol_at, tissue_at = placement.split("-")
    place, host = Placement(protocol_at, tissue_at, to_card), Placement("cpu", "cpu", to_card)

    def call(where: Placement):
        protocol = {k: where.put(where.protocol, v) for k, v in _protocol_values("real", 12).items()}
        tissue = _finding_tissue(where)
        return EpgEngine().simulate(_description(protocol), TissueProperties(t1_ms=tissue["T1"], t2_ms=tissue["T2"]),
                                    repetitions="auto", nstates=STATES).signal

    got, want = call(place), call(host)
    assert (got.device.type == "cpu") == (tissue_at == "cpu")
    errors = {"auto vs host auto": rel_max_err(got.cpu(), want)}
    assert errors["auto vs host auto"] < VALUES  # float32 round-off over the playings, as in `steady`
    return errors


def cest_pool_b(placement: str, to_card: Callable):
    """CEST with an exchanging pool B (amide-like, 3.5 ppm), offsets and field strength on the card or not:
    values and the Jacobian along the pool's fraction, against the host. (With these on the card and the
    saturation a number, the offsets in Hz and the sampled pulse's phases were card tensors beside a waveform
    on the host: the mix that issue 28 item 2 reports, at SampledPulse's phases.)"""
    from blochsim.simulators import CESTSimulator

    protocol_at, tissue_at = placement.split("-")
    place, host = Placement(protocol_at, tissue_at, to_card), Placement("cpu", "cpu", to_card)
    offsets = torch.tensor([-4.0, -1.0, 0.0, 2.0, 3.5, 6.0], dtype=torch.float64)
    pool = {"poolB_fraction": torch.linspace(0.005, 0.02, VOXELS), "poolB_exchange": torch.tensor(40.0),
            "poolB_T1": torch.tensor(1000.0), "poolB_T2": torch.tensor(15.0), "poolB_shift": torch.tensor(447.0)}
    sim = CESTSimulator(pulse_duration=10.0, dwell=0.1, recovery=1.0)

    def call(where: Placement):
        tissue = {**_finding_tissue(where), **{k: where.put(where.tissue, v) for k, v in pool.items()}}
        given = {"offsets": where.put(where.protocol, offsets) if where.protocol != "cpu" else offsets.tolist(),
                 "B1sat": 1.5, "field_strength": where.put(where.protocol, torch.tensor(3.0, dtype=torch.float64))}
        return sim.jacobian(("poolB_fraction", "T1"), **given, **tissue)

    got, got_J = call(place)
    want, want_J = call(host)
    assert (got.device.type == "cpu") == (tissue_at == "cpu")
    errors = {"values": rel_max_err(got.cpu(), want), "J (per column)": column_rel_err(got_J.cpu(), want_J)}
    assert errors["values"] < VALUES and errors["J (per column)"] < FIRST
    return errors


#: FLASH of issue 28 item 3: sampled sinc pulses (100 samples each), RF spoiling and the adiabatic inversion
#: (1,000 samples), 50 shots.
FLASH_PROTOCOL = dict(flip=10.0, TR=10.0, TE=5.0, nshots=50, rf_spoiling=117.0, inversion="adiabatic")
#: The host's own float32 against its float64 on this case: 1.36e-4 of the largest sample (these 64 voxels, T1
#: 200-3000 ms, B0 +-30 Hz; 1.25e-4 on another draw, 1.32e-4 at 200 shots, 4e-5 without the inversion).
#: Float32 round-off: each hard pulse of the sampled waveforms rounds the length of M by a few 1e-9 (3e-6 of
#: M0 over the 1,000 samples of the adiabatic pulse, 3e-7 over a sinc, in a float32 replay of the rotations
#: alone), and the train carries that into samples of 0.17 M0 at most. The GPU's float32 rounds otherwise
#: (fused multiply-adds, its own sin/cos), by as much: against float64 it is held to about twice the host's
#: deviation, and against the host's float32, where the two deviations add, to about three times.
FLASH_VS_FLOAT64 = 3e-4
FLASH_VS_HOST = 4e-4


def flash_sampled(placement: str, to_card: Callable):
    """FLASH with sampled sinc pulses, RF spoiling and the adiabatic inversion, against the host in float32 and
    float64 (engine.simulate on its description)."""
    from blochsim.simulators import FLASHSimulator

    protocol_at, tissue_at = placement.split("-")
    place, host = Placement(protocol_at, tissue_at, to_card), Placement("cpu", "cpu", to_card)
    sim = FLASHSimulator()
    numbers = {k: v for k, v in FLASH_PROTOCOL.items() if isinstance(v, float)}
    structure = {k: v for k, v in FLASH_PROTOCOL.items() if k not in numbers}

    def call(where: Placement):
        given = {k: where.put(where.protocol, torch.tensor(v, dtype=torch.float64)) if where.protocol != "cpu" else v
                 for k, v in numbers.items()}
        return sim.simulate(**given, **structure, **_finding_tissue(where, b0=True, voxels=64))

    got = call(place)
    host32 = call(host)
    tissue = _finding_tissue(host, b0=True, voxels=64)
    host64 = engine.simulate(sim.describe(**FLASH_PROTOCOL), TissueProperties(
        t1_ms=tissue["T1"], t2_ms=tissue["T2"], b0_hz=tissue["B0"]), dtype=torch.float64)
    assert (got.device.type == "cpu") == (tissue_at == "cpu")
    errors = {"vs host float64": rel_max_err(got.cpu(), host64), "vs host float32": rel_max_err(got.cpu(), host32),
              "host float32 vs float64": rel_max_err(host32, host64)}
    assert errors["vs host float64"] < FLASH_VS_FLOAT64 and errors["vs host float32"] < FLASH_VS_HOST
    return errors
