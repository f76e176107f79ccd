"""Inputs that used to pass silently, or fail with the wrong words (issue 20, items 3, 4 and 6).

* A static shim (`shim_id` other than 0) that the description does not define: every entry point raises
  ValueError naming the event and the id, rather than playing the pulse unshimmed.
* Every tissue property has an accepted range (`engine.tissue.FIELD_RANGES`, and for the closed-form
  names `simulators._closed_form.range_of`); a value outside it raises ValueError naming the property as
  the caller gave it, the first bad index and the range. The walk below takes its names from the code's
  own vocabulary (API.md 4.1's table and every shipped simulator's declared names), so a new property or
  simulator is walked without editing this file, and a name without a range fails here.
* `states` takes NumPy integers, and refuses absurd counts before anything is allocated.
* Empty property arrays give empty results of the broadcast shape; repetition times must be > 0; T1 = 0 is
  accepted (clamped) and the messages say so; protocol values are named as the caller gave them.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import re

import numpy as np
import pytest
import torch

import blochsim.simulators as shipped
from blochsim import engine
from blochsim.engine.program import MAX_STATES
from blochsim.engine.tissue import FIELD_RANGES, Accepted
from blochsim.model import POSITIVE_TIMES, PUBLIC_FIELDS, Simulator
from blochsim.sequence import (
    Delay,
    EpgEngine,
    Excitation,
    Inversion,
    SequenceDescription,
    SPGRReadout,
    TissueProperties,
    mrf_description,
    pack_description,
)
from blochsim.simulators import MRFSimulator, mrf_sim
from blochsim.simulators._closed_form import range_of
from blochsim.simulators._function_form import function_form
from blochsim.simulators.diffusion import TENSOR

# -- the shipped simulators, each with a protocol it accepts ------------------------------------------------
PROTOCOLS = {
    "ASLSimulator": dict(t=[500.0, 1500.0], tau=1800.0),
    "CESTSimulator": dict(offsets=[-3.0, 0.0, 3.0]),
    "DiffusionSimulator": dict(b=[0.0, 1000.0], directions=[[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]]),
    "DoubleAngleSimulator": dict(flip=[60.0, 120.0]),
    "FLASHSimulator": dict(flip=10.0, TR=10.0, TE=4.0, nshots=4),
    "FSESimulator": dict(flip=[150.0, 150.0], ESP=10.0),
    "HSFPSimulator": dict(flip=[10.0, 40.0], TR=5.0),
    "HyperechoSimulator": dict(flip=[150.0, 150.0], ESP=10.0),
    "IRMultiGradientEchoSimulator": dict(TI=[100.0, 500.0], TE=[1.0, 2.0]),
    "IRbSSFPSimulator": dict(flip=60.0, TI=[100.0, 500.0]),
    "InversionRecoverySimulator": dict(TI=[100.0, 500.0], TR=3000.0),
    "LookLockerSimulator": dict(flip=8.0, TR=50.0, TI=[0.0, 100.0]),
    "LorentzianSimulator": dict(offsets=[-3.0, 0.0, 3.0]),
    "MOLLISimulator": dict(flip=35.0, TR=900.0, readouts=(5, 3, 3), recovery=2000.0),
    "MP2RAGESimulator": dict(TI=[800.0, 2700.0], flip=[4.0, 5.0], TRspgr=6.9, TRmp2rage=6000.0, nshots=160),
    "MPRAGESimulator": dict(TI=800.0, flip=8.0, TRspgr=7.0, nshots=8),
    "MPnRAGESimulator": dict(nshots=4, flip=8.0, TR=7.0),
    "MRFSimulator": dict(flip=[10.0, 20.0, 30.0], TR=10.0),
    "MultiEchoSimulator": dict(TE=[10.0, 20.0]),
    "MultiGradientEchoSimulator": dict(TE=[1.0, 2.0]),
    "SPGRSimulator": dict(flip=10.0, TR=10.0, TE=4.0),
    "SpinEchoSimulator": dict(TE=[10.0, 20.0], TR=1000.0),
    "StimulatedEchoSimulator": dict(flip=90.0, TE=10.0, TM=50.0),
    "TrueFISPSimulator": dict(flip=30.0, TR=5.0, nshots=4),
    "bSSFPSimulator": dict(flip=30.0, TR=5.0),
    "fmSSFPSimulator": dict(flip=30.0, TR=5.0, nshots=4),
}
SHIPPED = {name: cls for name, cls in vars(shipped).items() if inspect.isclass(cls) and issubclass(cls, Simulator)}


def test_every_shipped_simulator_is_walked():
    """The walks below cover every shipped simulator: a new one needs a protocol in PROTOCOLS."""
    assert set(PROTOCOLS) == set(SHIPPED)


def declared(name: str) -> tuple:
    """The tissue names simulator `name` declares (the Lorentzian's for its default single pool)."""
    return tuple(SHIPPED[name]().exposes if name == "LorentzianSimulator" else SHIPPED[name].model.properties)


def good_value(accepted: Accepted) -> float:
    """A value every range accepts: 0.1 (above every lower bound, a fraction small enough for four pools)."""
    return 0.1


def bad_values(accepted: Accepted) -> list:
    """Values outside `accepted`: NaN and -inf always; +inf, the lower and the upper bound's far sides where
    they apply."""
    out = [math.nan, -math.inf]
    if not accepted.infinite:
        out.append(math.inf)
    if accepted.low is not None:
        out.append(accepted.low if accepted.low_open else accepted.low - 1.0)
    if accepted.high is not None:
        out.append(accepted.high + 1.0)
    return out


# -- 4. tissue ranges, walked over every public name -----------------------------------------------------------
def test_every_field_has_a_range():
    """Every `TissueProperties` field, and every name a shipped simulator declares, has an accepted range."""
    assert set(FIELD_RANGES) == {f.name for f in dataclasses.fields(TissueProperties)}
    for name in SHIPPED:
        if not SHIPPED[name]._event_train:
            missing = [p for p in declared(name) if range_of(p) is None]
            assert not missing, f"{name} declares {missing} without an accepted range"


TRAIN_CASES = [(name, value) for name in PUBLIC_FIELDS
               for value in bad_values(FIELD_RANGES[PUBLIC_FIELDS[name]])]
CLOSED_CASES = [(sim, name, value) for sim in sorted(SHIPPED) if not SHIPPED[sim]._event_train
                for name in declared(sim) for value in bad_values(range_of(name))]


def test_the_walks_cover_the_vocabulary():
    """Every API.md 4.1 name is walked on an event train, and every closed-form name on a closed form."""
    assert {name for name, _ in TRAIN_CASES} == set(PUBLIC_FIELDS)
    closed = {name for sim in SHIPPED if not SHIPPED[sim]._event_train for name in declared(sim)}
    assert {name for _, name, _ in CLOSED_CASES} == closed and {"T2star", "Dxx", "pool1_width"} <= closed


def expected(name: str, accepted: Accepted, index: str, count: str) -> str:
    return f"^{re.escape(name)} must be {re.escape(accepted.text)}; {count} value\\(s\\) are bad, the first at index " \
           f"{re.escape(index)}"


def bad_map(value: float) -> torch.Tensor:
    """A (2, 3) map whose bad entries are (1, 0) and (1, 2)."""
    m = torch.full((2, 3), 0.1, dtype=torch.float64)
    m[1, 0] = m[1, 2] = value
    return m


@pytest.mark.parametrize(("name", "value"), TRAIN_CASES, ids=[f"{n}={v}" for n, v in TRAIN_CASES])
def test_event_train_rejects_out_of_range(name, value):
    """An event train names the property as given, the first bad index and the range, for a map or a number."""
    accepted = FIELD_RANGES[PUBLIC_FIELDS[name]]
    sim = MRFSimulator(flip=[10.0, 20.0], TR=10.0)
    base = {"T1": 1000.0, "T2": 80.0}
    with pytest.raises(ValueError, match=expected(name, accepted, "(1, 0)", "2 of 6")):
        sim.simulate(**{**base, name: bad_map(value)})
    with pytest.raises(ValueError, match=expected(name, accepted, "()", "1 of 1")):
        sim.simulate(**{**base, name: value})


def closed_form_tissue(sim: str, name: str) -> dict:
    """Valid values of what `sim` needs, with `name` among them (a diffusion tensor or D, not both)."""
    names = declared(sim)
    if sim == "DiffusionSimulator":
        names = TENSOR + ("M0",) if name in TENSOR else ("D", "M0")
    return {n: good_value(range_of(n)) for n in names}


@pytest.mark.parametrize(("sim", "name", "value"), CLOSED_CASES,
                         ids=[f"{s}-{n}={v}" for s, n, v in CLOSED_CASES])
def test_closed_form_rejects_out_of_range(sim, name, value):
    accepted = range_of(name)
    simulator = SHIPPED[sim](**PROTOCOLS[sim])
    tissue = closed_form_tissue(sim, name)
    with pytest.raises(ValueError, match=expected(name, accepted, "(1, 0)", "2 of 6")):
        simulator.simulate(**{**tissue, name: bad_map(value)})


@pytest.mark.parametrize("field", sorted(FIELD_RANGES))
def test_engine_rejects_out_of_range(field):
    """engine.simulate and EpgEngine name the `TissueProperties` field (the name their caller used)."""
    tissue = TissueProperties(**{"t1_ms": 1000.0, "t2_ms": 80.0, field: bad_map(math.nan)})
    description = mrf_description([0.1, 0.2], 0.01)
    pattern = expected(field, FIELD_RANGES[field], "(1, 0)", "2 of 6")
    with pytest.raises(ValueError, match=pattern):
        engine.simulate(description, tissue, states=4)
    with pytest.raises(ValueError, match=pattern):
        EpgEngine().simulate(description, tissue, nstates=4)


@pytest.mark.parametrize(("sim", "values"), [
    ("MRFSimulator", dict(D=-1.0)), ("MRFSimulator", dict(bound_fraction=0.1, bound_exchange=-1.0)),
    ("MRFSimulator", dict(poolB_fraction=0.1, poolB_exchange=-1.0)), ("MRFSimulator", dict(T2prime=-1.0)),
    ("SPGRSimulator", dict(T2star=-1.0)), ("DiffusionSimulator", dict(D=-1.0)),
])
def test_negative_rates_and_times_rejected(sim, values):
    """The negatives the issue names, written out (the walk derives its bad values from the ranges)."""
    name = [n for n in values if values[n] < 0][0]
    base = {"T1": 1000.0, "T2": 80.0} if sim == "MRFSimulator" else {"T1": 1000.0} if sim == "SPGRSimulator" else {}
    with pytest.raises(ValueError, match=f"^{name} must be .*>= 0"):
        SHIPPED[sim](**PROTOCOLS[sim]).simulate(**base, **values)


def test_fraction_sum_names_the_properties_as_given():
    sim = MRFSimulator(flip=[10.0], TR=10.0)
    with pytest.raises(ValueError, match=r"\(bound_fraction \+ poolB_fraction\) share the voxel.*1\) sums to 1.1"):
        sim.simulate(T1=1000.0, T2=80.0, bound_fraction=torch.tensor([0.5, 0.6]), poolB_fraction=0.5)
    with pytest.raises(ValueError, match=r"\(poolB_fraction \+ poolC_fraction\) share the voxel.*sums to 1.2"):
        sim.simulate(T1=1000.0, T2=80.0, poolB_fraction=0.6, poolC_fraction=0.6)  # numbers: summed in Python


def test_states_as_numpy_integer():
    """A NumPy integer is an integer (`states=np.int64(5)` used to raise)."""
    sim = MRFSimulator(flip=[10.0, 20.0], TR=10.0)
    # The same kernels on the same inputs: bitwise equal.
    assert torch.equal(sim.simulate(T1=1000.0, T2=80.0, states=np.int64(5)), sim.simulate(T1=1000.0, T2=80.0, states=5))
    description = mrf_description([0.1, 0.2], 0.01)
    tissue = TissueProperties(t1_ms=1000.0, t2_ms=80.0)
    assert torch.equal(engine.simulate(description, tissue, states=np.int32(5)),
                       engine.simulate(description, tissue, states=5))
    assert torch.equal(EpgEngine().simulate(description, tissue, nstates=np.int16(5)).signal,
                       EpgEngine().simulate(description, tissue, nstates=5).signal)


def test_absurd_states_fail_before_allocation():
    """10**9 orders would ask the kernels for gigabytes per voxel: a ValueError names the limit first."""
    description = mrf_description([0.1, 0.2], 0.01)
    tissue = TissueProperties(t1_ms=1000.0, t2_ms=80.0)
    limit = f"more EPG orders than blochsim allocates \\({MAX_STATES} = 2\\*\\*16\\)"
    with pytest.raises(ValueError, match=f"^states=1000000000 asks for {limit}"):
        MRFSimulator(flip=[10.0], TR=10.0).simulate(T1=1000.0, T2=80.0, states=10**9)
    with pytest.raises(ValueError, match=f"^states=1000000000 asks for {limit}"):
        MRFSimulator(flip=[10.0], TR=10.0, states=10**9)
    with pytest.raises(ValueError, match=f"^states=1000000000 asks for {limit}"):
        engine.simulate(description, tissue, states=10**9)
    with pytest.raises(ValueError, match=f"^nstates=1000000000 asks for {limit}"):
        EpgEngine().simulate(description, tissue, nstates=10**9)
    for bad in (0, 2.5, True, "8"):
        with pytest.raises(ValueError, match="states must be an integer >= 1"):
            MRFSimulator(flip=[10.0], TR=10.0).simulate(T1=1000.0, T2=80.0, states=bad)


# -- 3. static shims --------------------------------------------------------------------------------------------
def shimmed() -> SequenceDescription:
    """An inversion, a wait, then a pulse of shim 1 at events[2] (index 2 of the description)."""
    return SequenceDescription.from_operators(Inversion(), Delay(0.01), Excitation(0.5, shim_id=1),
                                              SPGRReadout(0.0, duration_s=0.01))


class Shimmed(Simulator):
    """A layout whose pulse plays shim 3."""

    states = 4

    def layout(self, *, flip):
        return [self.operators.excitation(flip * math.pi / 180, shim_id=3), SPGRReadout(0.0, duration_s=0.01)]


shimmed_sim = function_form(Shimmed, "shimmed_sim", ("flip", "T1", "T2"), (("diff", None),))
TISSUE = TissueProperties(t1_ms=torch.tensor([1000.0]), t2_ms=80.0)
SHIM_CALLS = {
    "engine.simulate": lambda: engine.simulate(shimmed(), TISSUE, states=4),
    "engine.jacobian": lambda: engine.jacobian(shimmed(), TISSUE, ["t1_ms"], states=4),
    "EpgEngine.simulate": lambda: EpgEngine().simulate(shimmed(), TISSUE, nstates=4),
    "pack_description": lambda: pack_description(shimmed()),
    "from_description": lambda: MRFSimulator.from_description(shimmed()),
    "Simulator.simulate": lambda: Shimmed(flip=10.0).simulate(T1=1000.0, T2=80.0),
    "Simulator.jacobian": lambda: Shimmed(flip=10.0).jacobian("T1", T1=1000.0, T2=80.0),
    "Simulator.bind": lambda: Shimmed().bind(flip=10.0, T2=80.0).simulate(T1=1000.0),
    "function form": lambda: shimmed_sim(10.0, 1000.0, 80.0),
    "function form, diff": lambda: shimmed_sim(10.0, 1000.0, 80.0, diff="T1"),
}


@pytest.mark.parametrize("call", list(SHIM_CALLS))
def test_undefined_shim_is_refused_everywhere(call):
    """A pulse of a shim other than 0 used to play unshimmed; now each entry point names the event and the id
    of a shim the description does not define (shims it defines play: tests/test_pulses_engine.py)."""
    where, shim = ("events\\[2\\]", "shim_id=1") if "Simulator" not in call and "function" not in call \
        else ("events\\[0\\]", "shim_id=3")
    with pytest.raises(ValueError, match=f"^{where} plays {shim}, which shim_definitions does not hold"):
        SHIM_CALLS[call]()


def test_shim_zero_and_descriptions_still_work():
    """shim_id=0 plays, and describing a shimmed layout is allowed: only running it without the shim is
    refused."""
    plain = SequenceDescription.from_operators(Excitation(0.5, shim_id=0), SPGRReadout(0.0, duration_s=0.01))
    assert engine.simulate(plain, TISSUE, states=4).shape == (1, 1)
    assert Shimmed(flip=10.0).describe().events[0].rf_shim_id == 3


# -- 6. edge cases ----------------------------------------------------------------------------------------------
EMPTY_SHAPES = [(0,), (2, 0)]


@pytest.mark.parametrize("shape", EMPTY_SHAPES)
def test_empty_maps_give_empty_results(shape):
    """An empty T1 broadcasts as NumPy would, to an empty result, through every path (it used to raise
    'tissue T1 and T2 are required' from the kernels)."""
    sim = MRFSimulator(flip=[10.0, 20.0, 30.0], TR=10.0)
    t1 = np.zeros(shape)
    assert sim.simulate(T1=t1, T2=80.0).shape == shape + (3,)
    signal, jac = sim.jacobian(("T1", "T2"), T1=t1, T2=np.float64(80.0))
    assert signal.shape == shape + (3,) and jac.shape == shape + (2, 3)
    assert sim.simulate(T1=t1, T2=80.0, repetitions="auto").shape == shape + (3,)
    assert sim.simulate(T1=t1, T2=80.0, bound_fraction=0.1, bound_exchange=10.0).shape == shape + (3,)
    assert sim.simulate(T1=t1, T2=80.0, T2prime=20.0).shape == shape + (3,)

    description = mrf_description([0.1, 0.2], 0.01)
    tissue = TissueProperties(t1_ms=torch.zeros(shape), t2_ms=80.0)
    assert engine.simulate(description, tissue, states=4).shape == shape + (2,)
    signal, jac = engine.jacobian(description, tissue, ["t1_ms", "t2_ms"], states=4)
    assert signal.shape == shape + (2,) and jac.shape == shape + (2, 2)
    assert EpgEngine().simulate(description, tissue, nstates=4).signal.shape == shape + (2,)


def test_empty_maps_differentiate_to_zero():
    """A loss over no voxels has zero gradient along the sequence, and an empty one along the tissue."""
    flips = torch.tensor([10.0, 20.0, 30.0], dtype=torch.float64, requires_grad=True)
    t1 = torch.zeros(0, requires_grad=True)
    signal = MRFSimulator(flip=flips, TR=10.0).simulate(T1=t1, T2=80.0)
    signal.abs().sum().backward()
    assert torch.equal(flips.grad, torch.zeros(3, dtype=torch.float64)) and t1.grad.shape == (0,)


POSITIVE_CASES = [(sim, name) for sim in sorted(PROTOCOLS) for name in POSITIVE_TIMES
                  if name in SHIPPED[sim]._variables + SHIPPED[sim]._protocol_names]


def test_positive_times_cover_the_simulators_with_a_tr():
    assert ("MRFSimulator", "TR") in POSITIVE_CASES and ("FSESimulator", "ESP") in POSITIVE_CASES
    assert ("MP2RAGESimulator", "TRmp2rage") in POSITIVE_CASES and len(POSITIVE_CASES) >= 15


@pytest.mark.parametrize(("sim", "name"), POSITIVE_CASES, ids=[f"{s}-{n}" for s, n in POSITIVE_CASES])
@pytest.mark.parametrize("value", [0.0, -5.0])
def test_repetition_times_must_be_positive(sim, name, value):
    """TR = 0 plays every pulse at once (MRFSimulator accepted it silently); it is refused by name."""
    tissue = {n: 1000.0 if n.startswith("T") else 1.0 for n in declared(sim) if not n.startswith("pool")}
    with pytest.raises(ValueError, match=f"^{name} must be a finite time > 0 ms .*first at index \\(\\): {value}"):
        SHIPPED[sim](**{**PROTOCOLS[sim], name: value}).simulate(**tissue)


def test_one_bad_tr_is_found_by_index():
    with pytest.raises(ValueError, match=r"^TR must be a finite time > 0 ms .*1 of 3 value\(s\) are bad, the first at "
                                         r"index \(1,\): 0.0"):
        MRFSimulator(flip=[10.0, 20.0, 30.0], TR=[10.0, 0.0, 10.0]).simulate(T1=1000.0, T2=80.0)


def test_t1_zero_is_accepted_and_clamped():
    """API.md 4.3: T = 0 is clamped to 1e-6 ms. T1 = 0 recovers at once (it does not give no signal), so the
    message for a negative T1 says what 0 does rather than contradicting it."""
    sim = MRFSimulator(flip=[10.0, 20.0, 30.0], TR=10.0)
    zero, clamped = sim.simulate(T1=0.0, T2=80.0), sim.simulate(T1=1e-6, T2=80.0)
    # One float32 kernel on the same clamped rate: equal to a few float32 ulps.
    assert torch.allclose(zero, clamped, rtol=1e-6, atol=1e-7) and bool((zero.abs() > 0.1).all())
    with pytest.raises(ValueError, match="^T1 must be a time >= 0 ms, not NaN \\(0 relaxes at once") as error:
        sim.simulate(T1=-1.0, T2=80.0)
    assert "no signal" not in str(error.value)


@pytest.mark.parametrize("form", ["class", "function", "resolved"])
def test_protocol_nan_is_named_as_given(form):
    """A NaN flip was reported as `flip_rad` (the operators' name, in rad) without its index."""
    flips = torch.tensor([10.0, math.nan, 30.0], dtype=torch.float64)
    pattern = r"^flip must be a finite number \(deg\); 1 of 3 value\(s\) are bad, the first at index \(1,\): nan"
    with pytest.raises(ValueError, match=pattern):
        if form == "class":
            MRFSimulator(flip=flips, TR=10.0).simulate(T1=1000.0, T2=80.0)
        elif form == "function":
            mrf_sim(flips, 10.0, 1000.0, 80.0)
        else:  # after two calls the structure is resolved and the layout is no longer walked
            sim = MRFSimulator(TR=10.0)
            for good in (torch.tensor([10.0, 20.0, 30.0], dtype=torch.float64),
                         torch.tensor([11.0, 21.0, 31.0], dtype=torch.float64)):
                sim.simulate(flip=good, T1=1000.0, T2=80.0)
            sim.simulate(flip=flips, T1=1000.0, T2=80.0)
