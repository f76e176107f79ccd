"""Every shipped simulator on a device (issue 28): one small representative call per simulator, in two
placements, against the same call on the host build. Used by tests/test_cuda_api.py (a GPU) and
tests/test_device_placement.py (the stand-in card of tests/_fake_card.py).

Placements: "tissue-card" (the protocol as Python numbers, lists, tuples or NumPy arrays; the tissue tensors on
the card) and "all-card" (every list or array of the protocol a card tensor too, the tissue on the card).
Structural integers (`nshots`, `readouts`) stay Python values in both: they fix the layout, not a value.

The simulators are taken from `blochsim.simulators.__all__` (every `Simulator` subclass it exports, event
trains and closed forms alike), so a new simulator without a case here fails `missing_cases`.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

import numpy as np
import torch
from conftest import rel_max_err

import blochsim.simulators as simulators
from blochsim.model import Simulator

VOXELS = 4

#: Per-voxel tissue values (public names, public units), float32 CPU tensors of VOXELS voxels, or 0-d for the
#: pool B constants.
_TISSUE = {
    "T1": [400.0, 800.0, 1200.0, 2000.0], "T2": [40.0, 60.0, 90.0, 150.0], "T2star": [20.0, 30.0, 45.0, 60.0],
    "M0": [1.0, 0.9, 1.1, 1.0], "B1": [0.9, 1.0, 1.05, 1.1], "B0": [-20.0, -5.0, 5.0, 20.0],
    "D": [0.5, 1.0, 2.0, 3.0], "CBF": [30.0, 50.0, 60.0, 80.0], "ATT": [800.0, 1000.0, 1300.0, 1600.0],
    "fat_fraction": [0.0, 0.1, 0.3, 0.5], "poolB_fraction": [0.005, 0.01, 0.015, 0.02], "poolB_exchange": 40.0,
    "poolB_T1": 1000.0, "poolB_T2": 15.0, "poolB_shift": 447.0, "pool1_amplitude": [0.1, 0.2, 0.3, 0.4],
    "pool1_width": [1.0, 1.5, 2.0, 2.5], "pool1_shift": [-3.5, -1.0, 1.0, 3.5],
}

#: name -> (constructor arguments, protocol of the call, tissue names). Lists and arrays become card tensors in
#: "all-card"; tuples and the names in STRUCTURAL stay as given.
CASES = {
    "CESTSimulator": ({}, dict(offsets=[-4.0, -1.0, 0.0, 2.0, 3.5, 6.0], B1sat=1.5, field_strength=3.0,
                               pulse_duration=10.0, dwell=0.1, recovery=1.0),
                      ("T1", "T2", "B0", "poolB_fraction", "poolB_exchange", "poolB_T1", "poolB_T2", "poolB_shift")),
    "FLASHSimulator": ({}, dict(flip=[8.0, 12.0, 15.0, 10.0], TR=6.0, TE=2.5, nshots=4, rf_spoiling=117.0,
                                inversion="adiabatic"), ("T1", "T2", "B0", "B1")),
    "fmSSFPSimulator": ({}, dict(flip=np.array([30.0, 35.0, 40.0, 45.0, 50.0]), TR=5.0, nshots=5, sweeps=2),
                        ("T1", "T2", "B0", "B1")),
    "FSESimulator": ({}, dict(flip=[120.0, 130.0, 140.0, 150.0, 160.0, 170.0], ESP=9.0, TR=400.0),
                     ("T1", "T2", "B1")),
    "HyperechoSimulator": ({}, dict(flip=[60.0, 130.0, 90.0], phases=[10.0, 40.0, 70.0], ESP=8.0, TR=600.0),
                           ("T1", "T2", "B1")),
    "MPnRAGESimulator": ({}, dict(nshots=40, flip=7.0, TR=12.0, TI=30.0), ("T1", "B1")),
    "MPRAGESimulator": ({}, dict(TI=300.0, flip=8.0, TRspgr=9.0, nshots=(12, 20), phases=np.arange(32.0) * 3),
                        ("T1",)),
    "StimulatedEchoSimulator": ({}, dict(flip=[80.0, 100.0, 95.0], TE=16.0, TM=60.0), ("T1", "T2", "B0")),
    "TrueFISPSimulator": ({}, dict(flip=40.0, TR=4.0, nshots=8, inversion="ideal", spoiler=2.0),
                          ("T1", "T2", "B0")),
    "MRFSimulator": ({}, dict(flip=np.linspace(5.0, 60.0, 24), TR=8.0, TI=20.0,
                              phases=117.0 * np.arange(24) * (np.arange(24) + 1) / 2), ("T1", "T2", "B1")),
    "ASLSimulator": ({}, dict(t=[1000.0, 1500.0, 2000.0, 2500.0, 3000.0], tau=1800.0), ("CBF", "ATT", "T1")),
    "bSSFPSimulator": ({}, dict(flip=[20.0, 40.0, 60.0], TR=5.0), ("T1", "T2", "B0")),
    "IRbSSFPSimulator": ({}, dict(flip=40.0, TI=[100.0, 300.0, 600.0, 1200.0, 2500.0]), ("T1", "T2", "B1")),
    "LorentzianSimulator": ({"pools": 1}, dict(offsets=np.linspace(-5.0, 5.0, 11)),
                            ("M0", "pool1_amplitude", "pool1_width", "pool1_shift")),
    "DiffusionSimulator": ({}, dict(b=[0.0, 500.0, 1000.0, 2000.0]), ("D", "M0")),
    "MultiGradientEchoSimulator": ({}, dict(TE=[1.2, 2.4, 3.6, 4.8, 6.0]), ("T2star", "B0", "fat_fraction")),
    "IRMultiGradientEchoSimulator": ({}, dict(TI=[100.0, 400.0, 100.0, 400.0], TE=[2.0, 2.0, 4.0, 4.0]),
                                     ("T1", "T2star", "B0", "fat_fraction")),
    "HSFPSimulator": ({}, dict(flip=60.0 * np.sin(np.linspace(0.0, np.pi, 20)) + 5.0, TR=5.0), ("T1", "T2")),
    "LookLockerSimulator": ({}, dict(flip=8.0, TR=100.0, TI=[100.0, 300.0, 700.0, 1500.0, 3000.0]), ("T1", "B1")),
    "MOLLISimulator": ({}, dict(flip=35.0, TR=1000.0, readouts=(5, 3, 3), recovery=3000.0), ("T1", "B1")),
    "MP2RAGESimulator": ({}, dict(TI=[700.0, 2500.0], flip=[4.0, 5.0], TRspgr=7.0, TRmp2rage=5000.0,
                                  nshots=(60, 100)), ("T1",)),
    "DoubleAngleSimulator": ({}, dict(flip=[60.0, 120.0]), ("B1", "M0")),
    "InversionRecoverySimulator": ({}, dict(TI=[100.0, 400.0, 1000.0, 2500.0]), ("T1",)),
    "MultiEchoSimulator": ({}, dict(TE=[10.0, 20.0, 40.0, 80.0]), ("T2",)),
    "SpinEchoSimulator": ({}, dict(TE=[20.0, 40.0, 80.0], TR=2000.0), ("T1", "T2")),
    "SPGRSimulator": ({}, dict(flip=[3.0, 10.0, 20.0], TR=10.0, TE=5.0), ("T1", "T2star")),
}

STRUCTURAL = ("nshots", "readouts")
PLACEMENTS = ("tissue-card", "all-card")

#: float32 on both sides (the closed forms in the promoted dtype of their float32 tissue, the event trains on the
#: float32 kernels of each build): a GPU rounds otherwise (fused multiply-adds, its own sin/cos/exp), by float32
#: round-off accumulated over the call. 2e-4 of the largest entry bounds that with room (the H200 run of issue 28:
#: every case but one at most 2e-5).
TOLERANCE = 2e-4
#: FLASH with sampled sinc pulses, RF spoiling and the adiabatic inversion (1,000 samples): each sampled hard pulse
#: rounds |M| in float32, and the host's own float32 is 1.25e-4 off its float64 on such a train
#: (tests/_placement.py, FLASH_VS_FLOAT64); the GPU rounds otherwise by as much, and the two deviations add
#: (measured on the H200: 2.4e-4 against the host's float64, 2.85e-4 against its float32).
TOLERANCES = {"FLASHSimulator": 4e-4}


def shipped() -> list[str]:
    """The names of every simulator `blochsim.simulators` exports."""
    return sorted(name for name in simulators.__all__
                  if inspect.isclass(obj := getattr(simulators, name)) and issubclass(obj, Simulator))


def missing_cases() -> list[str]:
    return [name for name in shipped() if name not in CASES]


def _protocol(protocol: dict, on_card: bool, to_card: Callable) -> dict:
    """`protocol` as the placement gives it: lists and arrays as card tensors (float64, as NumPy gives them) if
    `on_card`, else as Python lists (a NumPy array would make the answer NumPy: API.md 1.3)."""
    out = {}
    for key, value in protocol.items():
        if key not in STRUCTURAL and isinstance(value, (list, np.ndarray)):
            array = np.asarray(value, dtype=np.float64)
            value = to_card(torch.from_numpy(array)) if on_card else array.tolist()
        out[key] = value
    return out


def _tissue(names, to: Callable) -> dict:
    return {name: to(torch.tensor(_TISSUE[name], dtype=torch.float32)) for name in names}


def check(name: str, placement: str, to_card: Callable) -> dict:
    """Run simulator `name`'s case placed and on the host; check the result's device and compare. Returns the
    measured error (for the printed summary)."""
    assert name in CASES, f"{name} is a shipped simulator without a case in tests/_every_simulator.py CASES"
    construct, protocol, tissue_names = CASES[name]
    cls = getattr(simulators, name)
    placed = cls(**construct).simulate(**_protocol(protocol, placement == "all-card", to_card),
                                       **_tissue(tissue_names, to_card))
    # The same call on the host: the protocol in the same form (CPU tensors for card ones), the tissue on the CPU.
    host = cls(**construct).simulate(**_protocol(protocol, placement == "all-card", lambda t: t),
                                     **_tissue(tissue_names, lambda t: t))
    assert isinstance(placed, torch.Tensor), f"{name} returned {type(placed).__name__}, expected a tensor"
    assert placed.device.type == "cuda", f"{name}: the result came back on {placed.device}, the tissue is on the card"
    assert placed.shape == host.shape and placed.dtype == host.dtype, (placed.shape, host.shape, placed.dtype,
                                                                      host.dtype)
    error = rel_max_err(placed.detach().cpu(), host.detach())
    tolerance = TOLERANCES.get(name, TOLERANCE)
    assert error < tolerance, f"{name} {placement}: {error:.2e} of the largest entry from the host (bound {tolerance})"
    return {"vs host": error}
