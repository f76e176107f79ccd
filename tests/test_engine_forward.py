"""The forward kernels (engine.simulate) against the float64 oracle (blochsim._reference.play), pool model 0.

Tolerances, relative to the largest sample of the oracle (DESIGN.md, "The oracle and how kernels are checked"):
- float32: 1e-5. Each event is a few dozen float32 operations with round-off 6e-8 each; the states are
  contracting (|rotation| = 1, relaxation < 1), so errors add up roughly linearly over the 30-60 events
  (x repetitions) here, not exponentially: ~3e-7 to 1e-6 seen. The largest, 4e-6 (MRF with quadratic
  phases and B1phase), is not accumulation but the phases themselves: 117-degree increments reach ~130 rad
  in 12 TRs, which float32 holds to ~4e-6 rad (see test_long_quadratic_phase_train_float32).
- float64: 1e-12. The same argument with round-off 1.1e-16 gives ~1e-14 (seen: up to 2.5e-15); the
  oracle's own matrix exponentials are accurate to rounding (see blochsim._reference.interval._expm).
The engine and the oracle truncate at the same number of EPG orders (conftest.STATES), so truncation
does not enter the comparison.
"""

from __future__ import annotations

import functools

import pytest
import torch
from conftest import (
    CASES,
    DTYPES,
    PATHS,
    STATES,
    SWITCHES,
    T1_MS,
    T2_MS,
    carried_train,
    complex_only,
    f64,
    folding_train,
    mixed_readouts,
    mrf,
    off_axis,
    path_cases,
    quadratic_phases,
    ramp,
    rel_max_err,
    tissue,
)

from blochsim import _native as nat
from blochsim._reference import play
from blochsim.engine import simulate
from blochsim.engine.program import compile_program

TOL = {torch.float32: 1e-5, torch.float64: 1e-12}  # see the module docstring


@functools.cache
def oracle(case_name: str, fields: tuple = (), geometry: str = "none") -> torch.Tensor:
    """The oracle's signal for a case with the named switch fields on (cached: the oracle is the slow part)."""
    case = CASES[case_name]
    description = case.build(geometry=geometry)
    return play(description, tissue(fields), states=STATES, repetitions=case.repetitions).signal


def engine(case_name: str, fields=(), geometry="none", **kw) -> torch.Tensor:
    case = CASES[case_name]
    description = case.build(geometry=geometry)
    return simulate(description, tissue(fields), states=STATES, repetitions=case.repetitions, **kw)


# ---------------------------------------------------------------------------------------------
# Sequences
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(("case_name", "path"), path_cases())
def test_sequence_matches_oracle(case_name, path, dtype):
    """MRF, MRF with 117-degree quadratic phases, CPMG, SPGR (3 repetitions), bSSFP (phase alternation)."""
    signal = engine(case_name, dtype=dtype, path=path)
    expected = oracle(case_name)
    assert signal.dtype == (torch.complex64 if dtype == torch.float32 else torch.complex128)
    assert signal.shape == expected.shape
    assert rel_max_err(signal, expected) < TOL[dtype]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_auto_path_matches_oracle(dtype):
    """path="auto" (the default) picks a path by itself; its result is the oracle's either way."""
    for case_name in CASES:
        assert rel_max_err(engine(case_name, dtype=dtype), oracle(case_name)) < TOL[dtype], case_name


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("states", [1, 2, STATES])
def test_off_axis_pulses_late_start_few_states(states, path, dtype):
    """Pulses about 0.7 rad (alternating sign), ADC phase 0.2 rad, the first event 3 ms into the repetition
    (the wrap interval is then not the first interval), 3 repetitions; 1 and 2 orders are the edge cases of
    the shift (with K = 1 a shift empties the transverse states)."""
    description = off_axis()
    expected = play(description, tissue(), states=states, repetitions=3).signal
    signal = simulate(description, tissue(), states=states, repetitions=3, dtype=dtype, path=path)
    assert rel_max_err(signal, expected) < TOL[dtype]


@pytest.mark.parametrize("phased", (False, True))
def test_folding_train_matches_oracle(phased):
    """The train the GPU tests use for the device's event folding (conftest.folding_train), on the host
    against the oracle, twice through; and it holds every case the folding must get right."""
    description = folding_train(12, phased=phased)
    expected = play(description, tissue(), states=STATES, repetitions=2).signal
    signal = simulate(description, tissue(), states=STATES, repetitions=2)
    assert rel_max_err(signal, expected) < TOL[torch.float32]
    program = compile_program(description, states=STATES)
    action, record = program.action.tolist(), program.record.tolist()
    after = nat.CRUSH_AFTER | nat.SHIFT_AFTER | nat.SPOIL_AFTER
    # Pairs (head, next) where next has no interval, crusher ahead or pulse: next could fold into head.
    pairs = [(h, h + 1) for h in range(len(action) - 1)
             if not action[h + 1] & (nat.INTERVAL | nat.CRUSH_BEFORE | nat.ROTATE | nat.INVERSION)]
    assert any(record[h] < 0 and record[n] >= 0 and not action[h] & after for h, n in pairs)  # folds
    assert any(record[h] >= 0 and record[n] >= 0 for h, n in pairs)  # two samples: no fold
    assert any(action[h] & after and record[n] >= 0 for h, n in pairs)  # a shift, then a sample: no fold
    assert any(record[n] < 0 and action[n] & after and not action[h] & after for h, n in pairs)  # folds
    assert any(action[h] & nat.ROTATE and action[h] & nat.INTERVAL and action[h] & nat.CRUSH_BEFORE
               for h in range(len(action)))  # a crushed pulse after an interval


def test_carried_shifts_and_spoilers_match_oracle():
    """The real plain forward carries shifts and spoilers into the next event's one pass (event_loop.hpp
    step_forward_plain): two shifts pending at a pulse and then at a sample, a shift ahead of an inversion, a
    crushed pulse with a shift pending, a sample and an interval after a spoiler. Against the oracle, in both
    precisions."""
    description = carried_train()
    expected = play(description, tissue(), states=STATES, repetitions=2).signal
    for dtype in DTYPES:
        signal = simulate(description, tissue(), states=STATES, repetitions=2, dtype=dtype, path="real")
        assert rel_max_err(signal, expected) < TOL[dtype], dtype
    # Per block: the sample after two shifts, the crushed pulse's, two after the spoiler of every odd block
    # (none there), the last pulse's.
    per_block = expected.reshape(3, 6, 5).abs()  # voxels, blocks, samples of the last repetition
    assert per_block[:, 1::2, 2:4].max() == 0 and per_block[:, 0::2, 2:4].min() > 1e-3
    assert per_block[:, :, 0].max() > 1e-3 and per_block[:, :, 4].min() > 1e-3


def test_long_quadratic_phase_train_float32():
    """40 TRs of RF spoiling (117 degree quadratic increments, as in a spoiled MRF or SPGR train) in float32."""
    n = 40
    description = mrf(flips=ramp(n, 10, 70), phases=quadratic_phases(n), n=n)
    expected = play(description, tissue(), states=STATES).signal
    signal = simulate(description, tissue(), states=STATES, dtype=torch.float32)
    assert rel_max_err(signal, expected) < TOL[torch.float32]


def test_wrapped_quadratic_phases_float32():
    """The same train with its phases wrapped to [0, 2 pi) before the call: float32 is well within tolerance,
    so the error above is the phases' float32 rounding, not accumulation over 40 TRs."""
    n = 40
    phases = quadratic_phases(n)
    expected = play(mrf(flips=ramp(n, 10, 70), phases=phases, n=n), tissue(), states=STATES).signal
    wrapped = mrf(flips=ramp(n, 10, 70), phases=torch.remainder(phases, 2 * torch.pi), n=n)
    signal = simulate(wrapped, tissue(), states=STATES, dtype=torch.float32)
    assert rel_max_err(signal, expected) < TOL[torch.float32] / 10


# ---------------------------------------------------------------------------------------------
# Tissue switches
# ---------------------------------------------------------------------------------------------


def _switch_params():
    params = []
    for switch, (fields, _) in SWITCHES.items():
        for case_name, case in CASES.items():
            for path in PATHS:
                if path == "real" and (not case.real_ok or complex_only(fields)):
                    continue
                params.append(pytest.param(switch, case_name, path, id=f"{switch}-{case_name}-{path}"))
    return params


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(("switch", "case_name", "path"), _switch_params())
def test_tissue_switch_matches_oracle(switch, case_name, path, dtype):
    """B0, B1, B1phase, M0, inversion efficiency, diffusion, flow (with washout) and washout alone."""
    fields, geometry = SWITCHES[switch]
    signal = engine(case_name, fields, geometry, dtype=dtype, path=path)
    assert rel_max_err(signal, oracle(case_name, fields, geometry)) < TOL[dtype]


@pytest.mark.parametrize("switch", list(SWITCHES))
def test_each_switch_changes_the_signal(switch):
    """The comparisons above mean something: every switch changes the oracle's signal by over 1% on at least
    one sequence (some sequences are blind to some switches: FISP and CPMG to B0, trains without an inversion
    to the inversion efficiency)."""
    fields, geometry = SWITCHES[switch]
    effects = {name: rel_max_err(oracle(name, (), geometry), oracle(name, fields, geometry)) for name in CASES}
    assert max(effects.values()) > 1e-2, effects


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("path", PATHS)
def test_every_switch_at_once(path, dtype):
    """All the switches together (crusher geometry, so diffusion, flow and washout all act) on MRF and CPMG."""
    fields = ("b1", "m0", "inversion_efficiency", "diffusion_um2_per_ms")
    if path == "complex":
        fields += ("b0_hz", "b1_phase_rad", "velocity_m_per_s")
    for case_name in ("mrf", "cpmg") if path == "complex" else ("mrf",):
        signal = engine(case_name, fields, "crusher", dtype=dtype, path=path)
        assert rel_max_err(signal, oracle(case_name, fields, "crusher")) < TOL[dtype], case_name


# ---------------------------------------------------------------------------------------------
# Record modes and voxel shapes
# ---------------------------------------------------------------------------------------------

#: Samples each record mode keeps from `mixed_readouts` (9 ADCs: 3 NON_ACQUIRED, 3 acquired echoes).
RECORDED = {"all": 9, "acquired": 6, "echo": 3}


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("record", list(RECORDED))
def test_record_modes(record, path, dtype):
    description = mixed_readouts()
    expected = play(description, tissue(), states=STATES, record=record).signal
    signal = simulate(description, tissue(), states=STATES, record=record, dtype=dtype, path=path)
    assert signal.shape == (3, RECORDED[record])
    assert rel_max_err(signal, expected) < TOL[dtype]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("path", PATHS)
def test_record_modes_keep_samples_in_order(path, dtype):
    """"acquired" and "echo" are subsets of "all", in the same order (each sample is its ADC's)."""
    description = mixed_readouts()
    full = simulate(description, tissue(), states=STATES, dtype=dtype, path=path)
    acquired = simulate(description, tissue(), states=STATES, record="acquired", dtype=dtype, path=path)
    echo = simulate(description, tissue(), states=STATES, record="echo", dtype=dtype, path=path)
    assert torch.equal(acquired, full[:, [j for j in range(9) if j % 3 != 2]])
    assert torch.equal(echo, full[:, [j for j in range(9) if j % 2 == 0 and j % 3 != 2]])


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("path", PATHS)
def test_broadcast_voxel_shapes(path, dtype):
    """T1 of shape (4, 1) and T2 of shape (5,) broadcast to (4, 5) voxels; B1 (5,) and M0 () with them."""
    t1 = torch.linspace(200.0, 1800.0, 4, dtype=torch.float64).reshape(4, 1)
    t2 = torch.linspace(20.0, 200.0, 5, dtype=torch.float64)
    extra = {"b1": torch.linspace(0.8, 1.2, 5, dtype=torch.float64), "m0": f64(0.9)}
    if path == "complex":
        extra["b0_hz"] = torch.linspace(-10.0, 10.0, 4, dtype=torch.float64).reshape(4, 1)
    description = CASES["bssfp"].build()
    tissue_ = tissue(t1=t1, t2=t2, **extra)
    expected = play(description, tissue_, states=STATES, repetitions=2).signal
    signal = simulate(description, tissue_, states=STATES, repetitions=2, dtype=dtype, path=path)
    assert signal.shape == (4, 5, expected.shape[-1])
    assert rel_max_err(signal, expected) < TOL[dtype]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_single_voxel_of_scalars(dtype):
    """Python numbers for every property: voxel shape (), the signal has the samples axis only."""
    description = CASES["mrf"].build()
    tissue_ = tissue(t1=800.0, t2=60.0, b1=0.9, m0=1.2)
    signal = simulate(description, tissue_, states=STATES, dtype=dtype)
    expected = play(description, tissue_, states=STATES).signal
    assert signal.shape == expected.shape == (12,)
    assert rel_max_err(signal, expected) < TOL[dtype]


def test_voxel_signal_independent_of_other_voxels():
    """Each voxel is simulated alone: the signal of a voxel does not depend on the other voxels or their count."""
    description = CASES["mrf_quadratic"].build()
    full = simulate(description, tissue(("b1", "b0_hz")), states=STATES, dtype=torch.float64)
    one = simulate(description, tissue(t1=f64(T1_MS[1:2]), t2=f64(T2_MS[1:2]), b1=f64([1.0]), b0_hz=f64([2.5])),
                   states=STATES, dtype=torch.float64)
    assert torch.equal(full[1:2], one)
