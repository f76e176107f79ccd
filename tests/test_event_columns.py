"""The compiler's fast path: builders' event columns, events made on first read, the kept layout.

A builder lays the compiler's columns (`blochsim.sequence.columns`) out beside its events with a few
vector ops, and makes the events themselves only where they are read; the compiler keeps the layout of
the last structure it saw (`engine.program._layout`). These tests hold the columns to a walk over the
events (value by value, and gradient by gradient through the compiled program), and make each kept
thing fail where it could be stale: a source changed in place, a copy, and structures that differ
only in an action, a role, the record mode, a definition, or the intervals.
"""

import copy
import math
import pickle

import numpy as np
import pytest
import torch

import blochsim.engine.program as program_module
from blochsim import _native as nat
from blochsim import engine
from blochsim.engine.program import compile_program
from blochsim.sequence import (
    AdcRole,
    Delay,
    EventAction,
    EventType,
    Excitation,
    Readout,
    SequenceDescription,
    TissueProperties,
    fse_description,
    mpnrage_description,
    mprage_description,
    mrf_description,
    rf_definition,
    spgr_description,
)
from blochsim.sequence.columns import COLUMNS_KEY, walk

F64 = torch.float64
N = 16
TISSUE = TissueProperties(t1_ms=torch.tensor([800.0, 1400.0]), t2_ms=torch.tensor([60.0, 110.0]))


def flips(dtype=F64):
    return torch.linspace(0.05, 1.2, N, dtype=F64).to(dtype).requires_grad_()


def lin(lo, hi, dtype=F64):
    return torch.linspace(lo, hi, N, dtype=F64).to(dtype).requires_grad_()


def scalar(value):
    return torch.tensor(value, dtype=F64, requires_grad=True)


def _mrf():
    f = flips(torch.float32)
    return mrf_description(f, 0.01), [f]


def _mrf_phases_times():
    f, p, tr, ti = flips(), lin(0, 3), lin(5e-3, 9e-3), scalar(0.03)
    return mrf_description(f, tr, phases_rad=p, inversion_time_s=ti), [f, p, tr, ti]


def _mrf_half_turns():
    f, p = flips(), torch.tensor([0.4, 0.4 + math.pi] * (N // 2), dtype=F64)
    return mrf_description(f, 7e-3, phases_rad=p, inversion=False, crusher_dephasing_rad=2 * math.pi,
                           voxel_size_m=1e-3), [f]


def _mrf_float32_times():
    f, tr = flips(), lin(5e-3, 9e-3, torch.float32)
    return mrf_description(f, tr, inversion_time_s=torch.tensor(0.02, dtype=torch.float32)), [f, tr]


def _mpnrage():
    f, p = flips(), lin(0, 1)
    return mpnrage_description(N, f, 6e-3, inversion_time_s=0.4, phases_rad=p), [f, p]


def _mprage():
    f, tr = flips(), scalar(8e-3)
    return mprage_description(5, N - 5, f, tr, 0.5, phases_rad=0.1), [f, tr]


def _spgr():
    f, te, p = flips(), scalar(4e-3), lin(0, 2)
    return spgr_description(f, 0.01, te, phases_rad=p), [f, te, p]


def _fse():
    f, spacing = lin(2, 3), scalar(1e-2)
    return fse_description(f, spacing, phases_rad=0.2), [f, spacing]


def _fse_repetition_time():
    """Only the end moves with the repetition time: the intervals of the played events stay constant."""
    f, tr = lin(2, 3), scalar(0.5)
    return fse_description(f, 0.01, repetition_time_s=tr, excitation_phase_rad=0.3), [f, tr]


#: name -> () -> (description, leaves): every builder, with tensors requiring grad in flips, phases and times.
CASES = {"mrf": _mrf, "mrf-phases-times": _mrf_phases_times, "mrf-half-turns": _mrf_half_turns,
         "mrf-float32-times": _mrf_float32_times, "mpnrage": _mpnrage, "mprage": _mprage, "spgr": _spgr,
         "fse": _fse, "fse-repetition-time": _fse_repetition_time}


def _case(name):
    return CASES[name]()


def _walked(description):
    """A copy of `description` that the compiler walks (a copy holds the events, not the columns)."""
    walked = copy.copy(description)
    assert COLUMNS_KEY not in vars(walked)
    return walked


def _program_arrays(p):
    return (p.action, p.record, p.sat_per_rad2, p.rf_hz, np.asarray(p.sample_events),
            (p.num_repetitions, p.num_samples, p.num_states, p.path, p.crusher_dk_rad_per_m, p.voxel_size_m,
             p.axis_phase_rad))


def _assert_same_program(a, b):
    for x, y in zip(_program_arrays(a), _program_arrays(b), strict=True):
        assert np.array_equal(np.asarray(x), np.asarray(y)), (x, y)
    for x, y in zip((a.dt_s, a.dt_wrap_s, a.flip_rad, a.phase_rad), (b.dt_s, b.dt_wrap_s, b.flip_rad, b.phase_rad),
                    strict=True):
        assert x.dtype == y.dtype and x.requires_grad == y.requires_grad
        assert torch.equal(x.detach(), y.detach())  # the same ops on the same numbers: bit for bit


@pytest.mark.parametrize("name", list(CASES))
def test_builder_columns_are_the_walked_columns(name):
    description, _ = _case(name)
    laid = vars(description)[COLUMNS_KEY]
    walked = walk(description.events)
    for field in ("kind", "action", "inversion", "definition_id", "adc_role", "is_echo", "frequency_hz",
                  "timestamp_differentiated"):
        a, b = getattr(laid, field), getattr(walked, field)
        assert a.dtype == b.dtype and np.array_equal(a, b), field
    for field in ("timestamp_us", "amplitude_hz", "phase_rad"):
        a, b = getattr(laid, field), getattr(walked, field)
        assert a.dtype == b.dtype == F64 and torch.equal(a.detach(), b.detach()), field
    assert laid.rf_phase_differentiated == walked.rf_phase_differentiated


@pytest.mark.parametrize("record", ["all", "acquired", "echo"])
@pytest.mark.parametrize("name", list(CASES))
def test_program_from_columns_matches_program_from_events(name, record):
    """Values, structure and the gradient of every leaf, bit for bit, through the columns and the walk."""
    results = []
    for walk_events in (False, True):
        description, leaves = _case(name)
        if walk_events:
            description = _walked(description)
        p = compile_program(description, repetitions=2, record=record)
        values = (p.dt_s, p.dt_wrap_s, p.flip_rad, p.phase_rad)
        g = torch.Generator().manual_seed(3)
        cost = sum((torch.randn(v.shape, dtype=F64, generator=g) * v).sum() for v in values if v.requires_grad)
        results.append((p, torch.autograd.grad(cost, leaves, allow_unused=True)))
    (laid, laid_grads), (walked, walked_grads) = results
    _assert_same_program(laid, walked)
    for a, b in zip(laid_grads, walked_grads, strict=True):
        assert (a is None) == (b is None) and (a is None or torch.equal(a, b))


def test_simulate_and_its_gradient_do_not_make_the_events():
    f = flips()
    description = mrf_description(f, 0.01)
    signal = engine.simulate(description, TISSUE, states=16)
    (grad,) = torch.autograd.grad(signal.abs().square().sum(), f)
    assert grad.abs().sum() > 0
    assert "events" not in vars(description), "the engine read the events instead of the columns"
    events = description.events  # made now, once
    assert len(events) == 2 + 4 * N and description.events is events


def test_events_made_later_keep_the_autograd_mode_of_the_build():
    f = flips()
    description = mrf_description(f, 0.01)
    with torch.no_grad():
        rf = [e for e in description.events if e.type == EventType.RF][1:]  # after the inversion
    assert all(e.rf_amplitude_hz.requires_grad for e in rf)
    (grad,) = torch.autograd.grad(sum(e.rf_amplitude_hz for e in rf), f)
    assert torch.equal(grad, torch.ones(N, dtype=F64))
    with torch.no_grad():  # views made without a graph, as the eager layout made them
        quiet = mrf_description(f, 0.01)
    assert all(e.rf_amplitude_hz.grad_fn is None for e in quiet.events[2:] if e.type == EventType.RF)
    assert all(e.rf_amplitude_hz.grad_fn is not None for e in rf)


def test_copy_and_pickle_hold_the_events():
    description = mrf_description(torch.linspace(0.1, 0.9, N, dtype=F64), 0.01, phases_rad=0.3)
    for other in (copy.copy(description), copy.deepcopy(description), pickle.loads(pickle.dumps(description))):
        assert COLUMNS_KEY not in vars(other)
        assert len(other.events) == len(description.events)
        for a, b in zip(other.events, description.events, strict=True):
            assert (a.type, a.action, a.timestamp_us) == (b.type, b.action, b.timestamp_us)
            assert all(torch.equal(torch.as_tensor(x), torch.as_tensor(y)) for x, y in zip(a.params, b.params,
                                                                                          strict=True))
        assert torch.equal(engine.simulate(other, TISSUE, states=16), engine.simulate(description, TISSUE, states=16))


def test_a_source_changed_in_place_is_seen():
    """The events hold views of the caller's flips and phases: a gradient step taken in place after the
    description was built moves them, so the compiled program must move too (the columns are stale)."""
    f, p = flips(), lin(0.0, 1.0)
    description = mrf_description(f, 0.01, phases_rad=p)
    before = compile_program(description)
    with torch.no_grad():
        f.mul_(2)
        p.add_(0.5)
    after = compile_program(description)
    assert torch.equal(after.flip_rad.detach(), 2 * before.flip_rad.detach())
    phased = torch.from_numpy((after.action & (nat.ROTATE | nat.RECORD)) != 0)  # pulses and samples
    assert torch.equal(after.phase_rad.detach(), torch.where(phased, before.phase_rad.detach() + 0.5, 0.0))
    _assert_same_program(after, compile_program(_walked(description)))


# -- the kept layout ---------------------------------------------------------------------------------
def _fresh(description, **kwargs):
    """`description` compiled with no layout kept from an earlier call."""
    program_module._LAST_LAYOUT = (None, None, None)
    return compile_program(description, **kwargs)


def _shaped():
    return {1: rf_definition(np.hanning(16) * np.exp(0.3j * np.arange(16)), dwell_s=1e-5, definition_id=1)}


def _rectangular():
    return {1: rf_definition(np.ones(16), dwell_s=1e-5, definition_id=1)}


def _operators(definitions, role=AdcRole.SINGLE):
    ops = [Excitation(0.1 * (k + 1), definition_id=1) @ Readout(role=role) @ Delay(0.01) for k in range(4)]
    return SequenceDescription.from_operators(*ops, rf_definitions=definitions)


PAIRS = {
    # same events and times, another action on the waits: dephase (FISP) against spoil
    "action": (lambda: mrf_description(flips(), 0.01), lambda: mpnrage_description(N, flips(), 0.01),
               {}),
    # same length, another centre shot: the sample slots move
    "roles": (lambda: mprage_description(5, N - 5, flips(), 8e-3, 0.5),
              lambda: mprage_description(6, N - 6, flips(), 8e-3, 0.5), {"record": "acquired"}),
    # same events, another pulse under the same definition id: other phase (arg I) and saturation
    "definition": (lambda: _operators(_shaped()), lambda: _operators(_rectangular()), {}),
    # zero-length intervals: the INTERVAL bits follow the times, not the structure
    "intervals": (lambda: mrf_description(flips(), 0.01), lambda: mrf_description(flips(), 0.0), {}),
}


@pytest.mark.parametrize("pair", list(PAIRS))
def test_layout_kept_for_one_structure_is_not_served_to_another(pair):
    first, second, kwargs = PAIRS[pair]
    a = compile_program(first(), **kwargs)
    b = compile_program(second(), **kwargs)  # the layout of `first` is the one kept
    expected = _fresh(second(), **kwargs)
    _assert_same_program(b, expected)
    differs = [not np.array_equal(x, y) for x, y in ((a.action, b.action), (a.record, b.record),
                                                     (a.sat_per_rad2, b.sat_per_rad2))]
    differs += [not torch.equal(x.detach(), y.detach()) for x, y in ((a.flip_rad, b.flip_rad),
                                                                     (a.phase_rad, b.phase_rad))]
    assert any(differs), "the pair must differ where a stale layout would show"


def test_layout_differs_with_the_record_mode():
    description = mprage_description(5, N - 5, flips(), 8e-3, 0.5)
    every, acquired = compile_program(description), compile_program(description, record="acquired")
    assert (every.num_samples, acquired.num_samples) == (N, 1)
    _assert_same_program(acquired, _fresh(description, record="acquired"))


def test_layout_is_kept_across_descriptions_of_one_structure():
    compile_program(mrf_description(flips(), 0.01))
    kept = program_module._LAST_LAYOUT[2]
    p = compile_program(mrf_description(flips() * 1.5, 0.012))
    assert program_module._LAST_LAYOUT[2] is kept
    assert p.action is not kept.action  # each program owns its arrays
    p.action[:] = 0
    assert kept.action.any()


def test_acquired_roles_and_actions_through_the_engine():
    """The spoiled and dephased trains of one length, simulated one after the other, against the oracle's
    walk of their events (a kept layout of the other would give the other signal)."""
    from blochsim._reference import play

    f = torch.linspace(0.1, 0.6, N, dtype=F64)
    for description in (mrf_description(f, 0.01), mpnrage_description(N, f, 0.01),
                        mprage_description(5, N - 5, f, 8e-3, 0.5)):
        signal = engine.simulate(description, TISSUE, states=16, dtype=F64, record="acquired")
        expected = play(description, TISSUE, states=16, record="acquired").signal
        # float64 kernels against the float64 oracle over ~70 events: round-off only
        torch.testing.assert_close(signal, expected.to(signal.dtype), rtol=1e-9, atol=1e-12)


def test_wait_actions_reach_the_program():
    a = compile_program(mrf_description(flips(), 0.01))
    b = compile_program(mpnrage_description(N, flips(), 0.01))
    assert (a.action & int(EventAction.CRUSH_AFTER)).any() and not (a.action & int(EventAction.SPOIL_AFTER)).any()
    assert (b.action & int(EventAction.SPOIL_AFTER)).any() and not (b.action & int(EventAction.CRUSH_AFTER)).any()
