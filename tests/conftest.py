"""Shared helpers for the tests: error measures, the CUDA skip, and the sequences and tissues of the engine tests.

Error measures (`rel_max_err`, `column_rel_err`) are the ones every test uses to hold a result to its reference;
closed-form references live in tests/_closed_forms.py.

Tests marked `cuda` (pyproject.toml) are skipped here unless an NVIDIA GPU and a blochsim CUDA build are present
(`cuda_ready`); a CUDA test module needs only `pytestmark = pytest.mark.cuda`.

Every kernel result is held to the float64 oracle `blochsim._reference.play` (DESIGN.md, "The oracle
and how kernels are checked"). The sequences here are small (10-40 events, a few voxels, 10 EPG
orders) so that the whole engine suite runs in seconds; each builder takes its differentiable values
(flips, phases, a repetition time) as numbers or tensors, so a test can put a tensor that requires
grad, or a forward-mode dual tensor, into the timestamps and event params.

The engine and the oracle truncate the EPG at the same number of orders, so they are compared at an
explicit `states` (never the engine's default, which the oracle does not share).
"""

from __future__ import annotations

import cmath
import functools
import math
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.autograd.forward_ad as fwAD

import blochsim
from blochsim._reference import play
from blochsim.sequence import (
    AdcRole,
    Delay,
    Dephase,
    EventAction,
    Excitation,
    Readout,
    RfUse,
    SequenceDescription,
    SequenceEvent,
    TissueProperties,
    bSSFPReadout,
    fse_description,
    mrf_description,
    spgr_description,
)
from blochsim.sequence.rf import ideal_rf_definition

DEG = math.pi / 180.0
F64 = torch.float64
DTYPES = (torch.float32, torch.float64)
PATHS = ("real", "complex")

#: EPG orders for every comparison (the oracle and the engine truncate identically).
STATES = 10

#: Crusher geometry: 4 turns across a 1 mm voxel, dk = 2.5e4 rad/m. With D ~ 1-3 um^2/ms and 10 ms
#: intervals, b = D dk^2 dt ~ 0.01-0.02 per unit order^2, and with v ~ 1-2 cm/s the flow phase is
#: ~2-5 rad per order per interval: both effects are large, so the tests see them.
CRUSHER_RAD = 8 * math.pi
VOXEL_M = 1e-3

# ---------------------------------------------------------------------------------------------
# Error measures
# ---------------------------------------------------------------------------------------------


def _complex128(values) -> torch.Tensor:
    """`values` as a complex128 tensor on the host: a tensor (any device, any dtype, detached), or an array, a list
    or a number through NumPy (which keeps Python floats in float64, where torch.as_tensor would make them
    float32 and a 1e-10 comparison would see the rounding)."""
    if isinstance(values, torch.Tensor):
        return values.detach().cpu().to(torch.complex128)
    return torch.from_numpy(np.asarray(values).astype(np.complex128))  # a copy: read-only views (broadcast_to) too


def rel_max_err(actual, expected) -> float:
    """max |actual - expected| / max |expected|: the error relative to the reference's largest entry (not entry by
    entry), in complex128 on the host. The shapes must match (no broadcasting), and a reference that is
    identically zero has no scale: both raise."""
    actual, expected = _complex128(actual), _complex128(expected)
    assert actual.shape == expected.shape, (tuple(actual.shape), tuple(expected.shape))
    scale = float(expected.abs().max())
    assert scale > 0, "the reference is identically zero: the comparison would prove nothing"
    return float((actual - expected).abs().max()) / scale


#: A Jacobian column of the reference at most this large (per unit of its property) is zero in exact arithmetic:
#: float64 round-off of a cancelling sum (~1e-17 seen). Real sensitivities are decades larger (dS/dT1 ~1e-4 per ms,
#: dS/d(pool shift) ~1e-5 per Hz).
NEGLIGIBLE_COLUMN = 1e-12


def column_rel_err(actual: torch.Tensor, expected: torch.Tensor, *, axis: int = -2) -> float:
    """The relative error of a Jacobian, each column held to its own scale, in float64:

        max over p of  max |actual_p - expected_p| / max |expected_p|,

    p indexing `axis`, the properties axis (-2 for the `(*voxel, P, samples)` of `Simulator.jacobian` and
    `engine.jacobian`; -1 where the samples axis was dropped, as in MPRAGE's `(*voxel, P)`).

    Why per column: each column carries the units of its property, so their sizes differ by decades (dS/dT1 is
    ~1e-4 per ms where dS/dM0 is ~0.5 and dS/dB1 ~1). Measured against the largest entry of the whole
    Jacobian (`rel_max_err`), a T1 column wrong by 1 % is an error of ~1e-6 and passes every first-derivative
    tolerance; here it is 1e-2. tests/test_simulator_mrf.py::test_column_measure_rejects_a_t1_column_off_by_1_percent
    shows both. A column that is zero in the reference (below NEGLIGIBLE_COLUMN: zero in exact arithmetic, as
    dS/dB0 of an echo) has no scale to be relative to: this raises, and such a column is held to an absolute
    bound instead, stated where it is used.
    """
    actual, expected = _complex128(actual), _complex128(expected)
    assert actual.shape == expected.shape, (tuple(actual.shape), tuple(expected.shape))
    errors = []
    for p, (got, want) in enumerate(zip(actual.unbind(axis), expected.unbind(axis), strict=True)):
        scale = float(want.abs().max())
        assert scale > NEGLIGIBLE_COLUMN, (f"column {p} of the reference is zero (largest entry {scale:.3g}): hold "
                                           "it to an absolute bound instead")
        errors.append(float((got - want).abs().max()) / scale)
    return max(errors)


def f64(values) -> torch.Tensor:
    return torch.as_tensor(values, dtype=F64)


# ---------------------------------------------------------------------------------------------
# Simulators against the oracle
# ---------------------------------------------------------------------------------------------


def simulator_oracle(sim, fields: dict, *, states: int, repetitions: int | None = None, record: str = "all",
                     **protocol) -> torch.Tensor:
    """What `sim.simulate(**protocol)` returns, from the float64 oracle: the samples of `sim.describe(**protocol)`
    for the tissue `fields` (TissueProperties names), times the simulator's post-rotation. `repetitions`: the
    simulator's class default unless given, as `simulate` plays."""
    repetitions = type(sim).repetitions if repetitions is None else repetitions
    signal = play(sim.describe(**protocol), TissueProperties(**fields), states=states, repetitions=repetitions,
                  record=record).signal
    return signal * cmath.exp(1j * sim.post_rotation_rad)


def simulator_oracle_jacobian(sim, fields: dict, names, **kwargs) -> torch.Tensor:
    """Forward-mode columns of `simulator_oracle` along the tissue fields `names`: (*voxel, P, samples)."""
    columns = []
    for name in names:
        dual = {k: torch.as_tensor(v, dtype=F64) for k, v in fields.items()}
        with fwAD.dual_level():
            dual[name] = fwAD.make_dual(dual[name], torch.ones_like(dual[name]))
            columns.append(fwAD.unpack_dual(simulator_oracle(sim, dual, **kwargs)).tangent)
    shape = torch.broadcast_shapes(*(c.shape for c in columns))
    return torch.stack([c.expand(shape) for c in columns], -2)


# ---------------------------------------------------------------------------------------------
# Tests that need a GPU
# ---------------------------------------------------------------------------------------------

CUDA_REASON = "needs an NVIDIA GPU and a blochsim CUDA build (BLOCHSIM_CUDA_LIBRARY or blochsim[cuNN])"


@functools.cache
def rank_environment(world: int | None = None, **extra) -> dict:
    """The environment of a worker process a test starts (torch.distributed ranks, torchrun): the blochsim under
    test first on the path, one thread a process (two ranks share the 2-core CI machine), and with `world` a
    rendezvous on a free loopback port for that many ranks."""
    root = Path(blochsim.__file__).resolve().parents[1]  # where the blochsim under test is imported from
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(root), env.get("PYTHONPATH", "")])
    env["OMP_NUM_THREADS"] = env["BLOCHSIM_NUM_THREADS"] = "1"
    if world is not None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE=str(world))
    env.update(extra)
    return env


def cuda_ready() -> bool:
    """A CUDA device is visible and blochsim's CUDA library loads (asked once, when a `cuda` test is collected)."""
    if not torch.cuda.is_available():
        return False
    try:
        from blochsim import _native

        _native.cuda_library()
    except Exception:
        return False
    return True


def pytest_collection_modifyitems(config, items):
    """Skip every test marked `cuda` (pyproject.toml's marker) where `cuda_ready()` is False."""
    marked = [item for item in items if item.get_closest_marker("cuda") is not None]
    if marked and not cuda_ready():
        skip = pytest.mark.skip(reason=CUDA_REASON)
        for item in marked:
            item.add_marker(skip)


# ---------------------------------------------------------------------------------------------
# Sequences
# ---------------------------------------------------------------------------------------------


def _geometry(geometry: str) -> dict:
    """'none'; 'crusher': crusher and voxel (diffusion, flow, washout); 'voxel': voxel only (washout)."""
    if geometry == "none":
        return {}
    if geometry == "crusher":
        return {"crusher_dephasing_rad": CRUSHER_RAD, "voxel_size_m": VOXEL_M}
    if geometry == "voxel":
        return {"voxel_size_m": VOXEL_M}
    raise ValueError(geometry)


def ramp(n: int, lo_deg: float, hi_deg: float) -> torch.Tensor:
    """n flips in rad, a ramp with a bump so no two consecutive TRs are alike."""
    j = torch.arange(n, dtype=F64)
    return (lo_deg + (hi_deg - lo_deg) * j / max(n - 1, 1) + 6.0 * torch.sin(1.7 * j)) * DEG


def quadratic_phases(n: int, increment_deg: float = 117.0) -> torch.Tensor:
    """RF-spoiling phases phi_j = increment * j (j + 1) / 2, in rad."""
    j = torch.arange(n, dtype=F64)
    return increment_deg * DEG * j * (j + 1) / 2


def mrf(flips=None, tr_s=0.012, phases=0.0, *, n=12, geometry="none") -> SequenceDescription:
    """MRF (FISP): inversion, 20 ms, then per TR excitation / ADC / one winding; flips ramping."""
    flips = ramp(n, 10, 70) if flips is None else flips
    return mrf_description(flips, tr_s, inversion_time_s=0.02, phases_rad=phases, **_geometry(geometry))


def mrf_quadratic(flips=None, tr_s=0.012, phases=None, *, n=12, geometry="none") -> SequenceDescription:
    """The MRF train with quadratic (117 degree) RF phase increments: pulses on many axes, complex path."""
    phases = quadratic_phases(n) if phases is None else phases
    return mrf(flips, tr_s, phases, n=n, geometry=geometry)


def cpmg(flips=None, tr_s=0.01, phases=0.0, *, n=8, geometry="none") -> SequenceDescription:
    """CPMG/FSE: 90 about y, then `n` crushed refocusing pulses about x (imperfect: 120-170 degrees),
    one echo each, `tr_s` the echo spacing. Excitation and refocusing axes differ: complex path only."""
    flips = (170.0 - 50.0 * torch.arange(n, dtype=F64) / max(n - 1, 1)) * DEG if flips is None else flips
    return fse_description(flips, tr_s, phases_rad=phases, **_geometry(geometry))


def spgr(flips=None, tr_s=0.01, phases=0.0, *, n=6, geometry="none") -> SequenceDescription:
    """Spoiled gradient echo (ideal spoiling after each ADC), TE = 4 ms; played for several repetitions."""
    flips = ramp(n, 8, 30) if flips is None else flips
    return spgr_description(flips, tr_s, 0.004, phases_rad=phases, **_geometry(geometry))


def bssfp(flips=None, tr_s=0.006, phases=None, *, n=12, geometry="none") -> SequenceDescription:
    """Balanced SSFP with phase alternation (0, pi, 0, ...; one axis: the real path folds the signs),
    ADC at TE = TR/2 demodulated by its pulse's phase. Sensitive to B0, unlike the spoiled trains."""
    flips = ramp(n, 30, 50) if flips is None else flips
    phases = math.pi * (torch.arange(n, dtype=F64) % 2) if phases is None else phases
    half = tr_s / 2
    ops = [
        Excitation(flips[j], phases[j]) @ Delay(half) @ bSSFPReadout(phases[j], duration_s=half) for j in range(n)
    ]
    return SequenceDescription.from_operators(*ops, **_geometry(geometry))


def mixed_readouts(flips=None, tr_s=0.01, *, n=9) -> SequenceDescription:
    """FISP-like train whose ADCs differ in role and echo flag, for record modes.

    ADC j: role NON_ACQUIRED when j % 3 == 2 (else SINGLE), is_echo when j % 2 == 0 and it is acquired (a
    readout that is not acquired is never an echo). "all" keeps 9 samples, "acquired" 6, "echo" 3.
    """
    flips = ramp(n, 15, 60) if flips is None else flips
    ops = []
    for j in range(n):
        role = AdcRole.NON_ACQUIRED if j % 3 == 2 else AdcRole.SINGLE
        echo = j % 2 == 0 and role != AdcRole.NON_ACQUIRED
        ops.append(Excitation(flips[j]) @ Readout(role=role, is_echo=echo) @ Dephase() @ Delay(tr_s))
    return SequenceDescription.from_operators(*ops)


def off_axis(flips=None, *, n=8) -> SequenceDescription:
    """Pulses about 0.7 rad and its opposite (alternating), ADCs demodulated at 0.2 rad, the first pulse 3 ms
    after the start of the repetition (so the wrap interval differs from the first one), TE 2 ms, TR 8 ms.
    One pulse axis: the real path takes it, in the frame of the axis."""
    flips = 0.3 + 0.05 * torch.arange(n, dtype=F64) if flips is None else flips
    ops = [Delay(0.003)]
    for j in range(n):
        phase = 0.7 + math.pi * (j % 2)
        ops.append(Excitation(flips[j], phase) @ Delay(0.002) @ Readout(0.2) @ Dephase() @ Delay(0.006))
    return SequenceDescription.from_operators(*ops)


def folding_train(blocks=40, *, phased=True) -> SequenceDescription:
    """Events at one instant that fold, or must not, into the event before them (the device's value forward,
    csrc/cuda/epg_device.cuh fold_events). Per 10 ms block: a pulse and its sample (folds), a second sample
    (not: the pulse's event samples), a crusher after it (folds), a third sample (not: a shift comes first), a
    shift after it (folds); 4 ms later a crushed pulse (not: an interval comes first) and a sample, or every
    fifth block a spoiler. `phased`: quadratic pulse phases and samples demodulated at other phases."""
    E, A = SequenceEvent, EventAction
    events = []
    for b in range(blocks):
        t0 = b * 10000.0
        flip = math.radians(10 + 50 * math.sin(0.1 * b) ** 2)
        phase = math.radians(117) * b * (b + 1) / 2 % (2 * math.pi) if phased else 0.0
        turns = (0.3, -0.2) if phased else (0.0, 0.0)
        events += [E.rf(t0, 0, RfUse.EXCITATION, flip, phase), E.adc(t0, phase_rad=phase),
                   E.adc(t0, phase_rad=phase + turns[0]), E.wait(t0, A.CRUSH_AFTER),
                   E.adc(t0, phase_rad=phase + turns[1]), E.wait(t0, A.SHIFT_AFTER),
                   E.rf(t0 + 4000, 0, RfUse.EXCITATION, 0.5 * flip, phase, action=A.CRUSH_BEFORE),
                   E.wait(t0 + 4000, A.SPOIL_AFTER) if b % 5 == 4 else E.adc(t0 + 4000, phase_rad=phase)]
    return SequenceDescription(0, blocks * 10000.0, tuple(events), {0: ideal_rf_definition(0)})


def carried_train(blocks=6) -> SequenceDescription:
    """Shifts and spoilers the real plain forward carries into the next event's one pass (event_loop.hpp
    step_forward_plain), per 10 ms block: two shifts pending at a pulse and then at a sample, a shift ahead
    of an inversion, a crushed pulse with a shift pending, a sample at the spoiler of every odd block and
    one after an interval, then a pulse and its sample. Five samples per block."""
    E, A = SequenceEvent, EventAction
    events = []
    for b in range(blocks):
        t0, flip = b * 10000.0, math.radians(20 + 7 * b)
        events += [E.rf(t0, 0, RfUse.EXCITATION, flip), E.wait(t0, A.SHIFT_AFTER), E.wait(t0, A.CRUSH_AFTER),
                   E.adc(t0), E.wait(t0 + 500, A.SHIFT_AFTER), E.rf(t0 + 1000, 0, RfUse.INVERSION, math.pi),
                   E.wait(t0 + 1500, A.SHIFT_AFTER), E.rf(t0 + 2000, 0, RfUse.EXCITATION, flip, action=A.CRUSH_BEFORE),
                   E.adc(t0 + 2000), E.wait(t0 + 3000, A.SPOIL_AFTER if b % 2 else A.NONE), E.adc(t0 + 3000),
                   E.adc(t0 + 3500), E.rf(t0 + 4000, 0, RfUse.EXCITATION, 0.5 * flip), E.adc(t0 + 4000),
                   E.wait(t0 + 4000, A.SHIFT_AFTER), E.wait(t0 + 5000, A.SHIFT_AFTER)]
    return SequenceDescription(0, blocks * 10000.0, tuple(events), {0: ideal_rf_definition(0)})


def shot_train(blocks=150, *, every=37) -> SequenceDescription:
    """Shots (an interval, a pulse, its sample, a crusher or a shift after it: csrc/cuda/epg_device.cuh
    shot_event) broken now and then, across the device's chunks of 64 events: every `every`-th block a
    spoiler 5 ms in (an interval and a spoiler), every `every + 4`-th an inversion 2 ms in, block 100 a pulse
    without a sample and block 120 a crusher and a shift after its pulse."""
    E, A = SequenceEvent, EventAction
    events = []
    for b in range(blocks):
        t0, flip = b * 10000.0, math.radians(5 + 55 * math.sin(0.03 * b) ** 2)
        events += [E.rf(t0, 0, RfUse.EXCITATION, flip)]
        events += [E.adc(t0)] if b != 100 else []
        events += [E.wait(t0, A.CRUSH_AFTER if b % 3 else A.SHIFT_AFTER)]  # either is one shift
        if b == 120:
            events += [E.wait(t0, A.SHIFT_AFTER)]  # two: not a shot
        if b % (every + 4) == every + 3:
            events += [E.rf(t0 + 2000, 0, RfUse.INVERSION, math.pi)]
        if b % every == every - 1:
            events += [E.wait(t0 + 5000, A.SPOIL_AFTER)]
    return SequenceDescription(0, blocks * 10000.0, tuple(events), {0: ideal_rf_definition(0)})


@dataclass(frozen=True)
class Case:
    """A sequence family: its builder, how many repetitions to play, whether it can take the real path."""

    name: str
    build: Callable[..., SequenceDescription]
    repetitions: int
    real_ok: bool
    shots: int  # flips (and phases) per repetition


CASES = {
    "mrf": Case("mrf", mrf, 1, True, 12),
    "mrf_quadratic": Case("mrf_quadratic", mrf_quadratic, 1, False, 12),
    "cpmg": Case("cpmg", cpmg, 1, False, 8),
    "spgr": Case("spgr", spgr, 3, True, 6),
    "bssfp": Case("bssfp", bssfp, 2, True, 12),
}


def path_cases() -> list[tuple[str, str]]:
    """(case name, path) for every path a case can take."""
    return [(name, path) for name, case in CASES.items() for path in PATHS if path == "complex" or case.real_ok]


# ---------------------------------------------------------------------------------------------
# Tissue
# ---------------------------------------------------------------------------------------------

#: Three voxels of free water; T1 and T2 in ms.
T1_MS = (300.0, 800.0, 1500.0)
T2_MS = (40.0, 80.0, 150.0)

#: One value per voxel for each runtime switch: far from identity, and v away from 0 (|v| has a kink)
#: and from the washout clamp (|v| dt / L < 1 on every interval).
SWITCH_VALUES = {
    "b0_hz": (-7.0, 2.5, 12.0),
    "b1": (0.8, 1.0, 1.15),
    "b1_phase_rad": (-0.3, 0.1, 0.4),
    "m0": (0.7, 1.0, 1.3),
    "inversion_efficiency": (0.85, 0.95, 1.0),
    "diffusion_um2_per_ms": (0.5, 1.5, 3.0),
    "velocity_m_per_s": (-0.02, 0.005, 0.012),
}
#: Fields that put a phase into the states: the complex path only.
PHASE_FIELDS = ("b0_hz", "b1_phase_rad", "velocity_m_per_s")

#: Each switch of the kernels: (the tissue fields it sets, the geometry it needs).
SWITCHES = {
    "b0": (("b0_hz",), "none"),
    "b1": (("b1",), "none"),
    "b1phase": (("b1_phase_rad",), "none"),
    "m0": (("m0",), "none"),
    "inversion_efficiency": (("inversion_efficiency",), "none"),
    "diffusion": (("diffusion_um2_per_ms",), "crusher"),
    "flow": (("velocity_m_per_s",), "crusher"),  # flow phase and washout
    "washout": (("velocity_m_per_s",), "voxel"),  # washout alone: no crusher, no flow phase
}


def tissue(fields=(), *, t1=None, t2=None, **given) -> TissueProperties:
    """TissueProperties of the three voxels, with the named switch fields at SWITCH_VALUES; `given`
    overrides any field (a tensor there may require grad or be a dual tensor)."""
    values = {"t1_ms": f64(T1_MS) if t1 is None else t1, "t2_ms": f64(T2_MS) if t2 is None else t2}
    for name in fields:
        values[name] = f64(SWITCH_VALUES[name])
    values.update(given)
    return TissueProperties(**values)


def complex_only(fields) -> bool:
    return any(name in PHASE_FIELDS for name in fields)
