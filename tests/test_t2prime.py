"""T2' (`t2_prime_ms`, public `T2prime`): each sample times exp(-|τ|/T2'), τ its unrefocused time
(API.md 3.3 step 4; the rule is in `blochsim.engine.t2_prime`).

The engine's τ comes from the compiled program; the oracle walks the description on its own. Values and
derivatives are held to the oracle at the tolerances of test_engine_forward.py (values) and
test_engine_derivatives.py (first derivatives): T2' adds one float64 factor per sample, narrowed once, so
it adds at most one rounding of the kernel dtype to those error budgets.
"""

from __future__ import annotations

import math

import pytest
import torch
from conftest import DTYPES, F64, STATES, T1_MS, T2_MS, f64, ramp, rel_max_err
from torch.autograd import forward_ad as fwAD

from blochsim import Simulator, SSFPFidReadout
from blochsim._reference import play
from blochsim.engine import jacobian, simulate
from blochsim.engine.program import compile_program
from blochsim.engine.t2_prime import unrefocused_time_s
from blochsim.sequence import (
    Delay,
    Dephase,
    Excitation,
    Inversion,
    Readout,
    Refocusing,
    SequenceDescription,
    SPGRReadout,
    SSFPEchoReadout,
    TissueProperties,
    bSSFPReadout,
    fse_description,
    mrf_description,
)
from blochsim.simulators import MRFSimulator

TOL = {torch.float32: 1e-5, torch.float64: 1e-12}  # values, as test_engine_forward.py
FIRST = {torch.float32: 1e-4, torch.float64: 1e-10}  # first derivatives, as test_engine_derivatives.py
T2P_MS = (15.0, 40.0, 120.0)  # short enough that exp(-|τ|/T2') moves the samples by 2-20 %
N = 8


# -- sequences ----------------------------------------------------------------------------------------
def fisp(flips=None, tr_s=0.01, te_s=0.003, *, inversion=False) -> SequenceDescription:
    """FISP sampled `te_s` after each pulse, one winding per TR: τ = TE. `inversion` leads with an inversion
    and 20 ms (an inversion neither ends nor starts a stretch)."""
    flips = ramp(N, 15, 60) if flips is None else flips
    ops = [Inversion(), Delay(0.02)] if inversion else []
    ops += [Excitation(a) @ Delay(te_s) @ Readout() @ Dephase() @ Delay(tr_s - te_s) for a in flips]
    return SequenceDescription.from_operators(*ops)


def fse_off_echo(flips=None, esp_s=0.01, early_s=0.0015) -> SequenceDescription:
    """CPMG (90 about y, crushed refocusing about x) sampled `early_s` before each spin echo: τ = -early_s."""
    flips = (170.0 - 50.0 * torch.arange(N, dtype=F64) / (N - 1)) * math.pi / 180 if flips is None else flips
    ops = [Excitation(math.pi / 2, math.pi / 2)]
    ops += [Delay(esp_s / 2) @ Refocusing(a) @ Delay(esp_s / 2 - early_s) @ Readout() @ Delay(early_s) for a in flips]
    return SequenceDescription.from_operators(*ops)


#: name -> (description builder, repetitions)
CASES = {
    "fisp": (fisp, 1),
    "fisp_inversion": (lambda: fisp(inversion=True), 1),
    "fisp_repeated": (fisp, 3),  # the stretch that wraps into the next playing counts
    "fse_off_echo": (fse_off_echo, 1),
}


def tissue(**given) -> TissueProperties:
    values = {"t1_ms": f64(T1_MS), "t2_ms": f64(T2_MS), "t2_prime_ms": f64(T2P_MS)}
    values.update(given)
    return TissueProperties(**values)


def oracle(description, t, repetitions=1) -> torch.Tensor:
    return play(description, t, states=STATES, repetitions=repetitions).signal


def forward_tangent(fn, x: torch.Tensor) -> torch.Tensor:
    """d fn(x) / dx along ones, by forward-mode autograd."""
    with fwAD.dual_level():
        return fwAD.unpack_dual(fn(fwAD.make_dual(x, torch.ones_like(x)))).tangent


# -- the unrefocused time -------------------------------------------------------------------------------
@pytest.mark.parametrize(("build", "expected_s"), [
    (lambda: fisp(te_s=0.003), 0.003),  # FID at TE
    (lambda: mrf_description(ramp(N, 10, 50), 0.01), 0.0),  # FISP sampled at the pulse (MRF)
    (lambda: fse_description(ramp(N, 120, 170), 0.01), 0.0),  # CPMG spin echoes
    (lambda: fse_off_echo(early_s=0.0015), -0.0015),
    (lambda: SequenceDescription.from_operators(  # PSIF: the echo the next pulse refocuses, one TR early
        *[Excitation(0.5) @ SSFPEchoReadout(duration_s=0.008)] * N), -0.008),
    (lambda: SequenceDescription.from_operators(  # spoiled: no complete stretch, τ = TE
        *[Excitation(0.3) @ Delay(0.004) @ SPGRReadout(duration_s=0.006)] * N), 0.004),
], ids=["fisp", "mrf", "cpmg", "fse_off_echo", "psif", "spgr"])
def test_unrefocused_time(build, expected_s):
    """τ of every sample from the compiled program, against what each sequence's echoes mean physically."""
    tau = unrefocused_time_s(compile_program(build()))
    # 1e-15 s: timestamps are float64 us summed over < 100 ms, rounding ~1e-17 s per event.
    assert torch.allclose(tau, torch.full_like(tau, expected_s), rtol=0, atol=1e-15), tau


def test_sample_before_any_pulse_has_zero_time():
    """No pulse before a sample (no transverse magnetization): τ = 0, not an error."""
    description = SequenceDescription.from_operators(Readout() @ Delay(0.005), *[Excitation(0.4) @ Delay(0.002)
                                                     @ Readout() @ Dephase() @ Delay(0.008)] * 3)
    tau = unrefocused_time_s(compile_program(description))
    assert tau.tolist()[0] == 0.0 and torch.allclose(tau[1:], torch.full((3,), 0.002, dtype=F64), atol=1e-15)


# -- closed forms ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_fid_closed_form(dtype):
    """90 degrees, then samples t later: |s| = exp(-t/T2 - t/T2') (no winding, τ = t)."""
    t_s = (0.002, 0.005, 0.011)
    ops = [Excitation(math.pi / 2)]
    for k, t in enumerate(t_s):
        ops.append(Delay(t - (t_s[k - 1] if k else 0.0)) @ Readout())
    signal = simulate(SequenceDescription.from_operators(*ops), tissue(), states=STATES, dtype=dtype)
    t_ms = 1e3 * f64(t_s)
    expected = torch.exp(-t_ms / f64(T2_MS)[:, None] - t_ms / f64(T2P_MS)[:, None])
    assert rel_max_err(signal.abs(), expected) < TOL[dtype]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_spin_echo_closed_form(dtype):
    """90, crushed 180 at TE/2, a sample at the echo (T2' refocused) and one `late` after it (τ = late)."""
    te, late = 0.02, 0.004
    ops = [Excitation(math.pi / 2, math.pi / 2), Delay(te / 2) @ Refocusing(math.pi) @ Delay(te / 2) @ Readout()
           @ Delay(late) @ Readout()]
    signal = simulate(SequenceDescription.from_operators(*ops), tissue(), states=STATES, dtype=dtype)
    t2, t2p = f64(T2_MS)[:, None], f64(T2P_MS)[:, None]
    expected = torch.exp(-1e3 * f64([te, te + late]) / t2 - 1e3 * f64([0.0, late]) / t2p)
    assert rel_max_err(signal.abs(), expected) < TOL[dtype]


# -- engine against the oracle ---------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", CASES)
def test_values_match_oracle(name, dtype):
    build, repetitions = CASES[name]
    description = build()
    signal = simulate(description, tissue(), states=STATES, repetitions=repetitions, dtype=dtype)
    expected = oracle(description, tissue(), repetitions)
    assert rel_max_err(signal, expected) < TOL[dtype]
    without = oracle(description, tissue(t2_prime_ms=math.inf), repetitions)
    assert rel_max_err(without, expected) > 1e-2  # T2' visibly acts


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", ["fisp", "fse_off_echo"])
def test_jacobian_matches_oracle(name, dtype):
    """engine.jacobian along T1 and T2' against forward-mode autograd through the oracle."""
    build, repetitions = CASES[name]
    description = build()
    signal, J = jacobian(description, tissue(), ("t1_ms", "t2_prime_ms"), states=STATES,
                         repetitions=repetitions, dtype=dtype)
    d_t1 = forward_tangent(lambda x: oracle(description, tissue(t1_ms=x), repetitions), f64(T1_MS))
    d_t2p = forward_tangent(lambda x: oracle(description, tissue(t2_prime_ms=x), repetitions), f64(T2P_MS))
    assert J.shape == (len(T1_MS), 2, signal.shape[-1])
    assert rel_max_err(J[:, 0], d_t1) < FIRST[dtype]
    assert rel_max_err(J[:, 1], d_t2p) < FIRST[dtype]
    assert rel_max_err(signal, oracle(description, tissue(), repetitions)) < TOL[dtype]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", ["fisp", "fse_off_echo"])
def test_reverse_gradient_matches_oracle(name, dtype):
    """Reverse mode w.r.t. T2', T1 and the timing (TE or the echo offset, which moves τ)."""
    build_timed = {"fisp": lambda s: fisp(te_s=s), "fse_off_echo": lambda s: fse_off_echo(early_s=s)}[name]
    timing = {"fisp": 0.003, "fse_off_echo": 0.0015}[name]

    def gradients(run):
        t1, t2p, when = f64(T1_MS).requires_grad_(), f64(T2P_MS).requires_grad_(), f64(timing).requires_grad_()
        signal = run(build_timed(when), tissue(t1_ms=t1, t2_prime_ms=t2p))
        weights = torch.linspace(0.5, 1.5, signal.shape[-1], dtype=F64)
        cost = ((signal.abs() ** 2) * weights).sum()
        return torch.autograd.grad(cost, (t1, t2p, when))

    got = gradients(lambda d, t: simulate(d, t, states=STATES, dtype=dtype))
    expected = gradients(oracle)
    for g, e, what in zip(got, expected, ("T1", "T2prime", "timing"), strict=True):
        assert rel_max_err(g, e) < FIRST[dtype], what


# -- off, and where τ does not exist ---------------------------------------------------------------------
def test_infinite_is_off():
    """T2' = inf (a number or a tensor) gives exactly the samples and Jacobian of T2' omitted."""
    description = fisp()
    base = TissueProperties(t1_ms=f64(T1_MS), t2_ms=f64(T2_MS))
    expected = simulate(description, base, states=STATES)
    for off in (math.inf, torch.full((3,), math.inf, dtype=F64)):
        assert torch.equal(simulate(description, tissue(t2_prime_ms=off), states=STATES), expected)
    signal, J = jacobian(description, base, ("t1_ms",), states=STATES)
    signal_off, J_off = jacobian(description, tissue(t2_prime_ms=math.inf), ("t1_ms",), states=STATES)
    assert torch.equal(signal_off, signal) and torch.equal(J_off, J)


def bssfp() -> SequenceDescription:
    return SequenceDescription.from_operators(
        *[Excitation(0.6, math.pi * (j % 2)) @ Delay(0.003) @ bSSFPReadout(duration_s=0.003) for j in range(N)])


def test_balanced_and_variable_tr_raise():
    """bSSFP (stretches without winding) and a variable TR: τ is undefined, so T2' raises (engine and oracle);
    T2' off still simulates them."""
    variable_tr = mrf_description(ramp(N, 10, 50), torch.linspace(0.008, 0.012, N, dtype=F64))
    for description, why in ((bssfp(), "without a winding"), (variable_tr, "variable TR")):
        with pytest.raises(ValueError, match=f"T2prime.*winds steadily.*{why}"):
            simulate(description, tissue(), states=STATES)
        with pytest.raises(ValueError, match="winds steadily"):
            oracle(description, tissue())
        simulate(description, tissue(t2_prime_ms=math.inf), states=STATES)


def test_negative_or_nan_raise():
    for bad in (-1.0, math.nan):
        with pytest.raises(ValueError, match="t2_prime_ms must be a time >= 0 ms.*first at index \\(1,\\)"):
            simulate(fisp(), tissue(t2_prime_ms=f64([40.0, bad, 80.0])), states=STATES)
        with pytest.raises(ValueError, match="T2prime must be a time >= 0 ms"):  # the name the caller gave
            MRFSimulator(TR=10.0, flip=ramp(N, 10, 50) * 180 / math.pi).simulate(T1=800.0, T2=60.0, T2prime=bad)


# -- the Simulator API ------------------------------------------------------------------------------------
class TEFisp(Simulator):
    """FISP sampled TE after each pulse (API.md 2.4's example with a TE)."""

    readout = SSFPFidReadout
    states = STATES

    def layout(self, *, flip, TR, TE):
        ops = []
        for a in torch.as_tensor(flip, dtype=torch.float64):
            ops.append(self.operators.excitation(torch.deg2rad(a)) @ self.operators.delay(TE * 1e-3)
                       @ self.operators.readout(duration_s=(TR - TE) * 1e-3))
        return ops


def test_simulator_end_to_end():
    """simulate(T2prime=...) scales by exp(-TE/T2'); jacobian(('T1', 'T2prime')) matches reverse mode."""
    sim = TEFisp(TR=8.0, TE=2.0, flip=torch.linspace(10, 40, N))
    t1, t2p = torch.tensor([800.0, 1200.0]), torch.tensor([20.0, 40.0])
    off = sim.simulate(T1=t1, T2=60.0)
    on = sim.simulate(T1=t1, T2=60.0, T2prime=t2p)
    # float32 signal: the ratio of two float32 results is good to a few 1e-7.
    assert torch.allclose((on / off).abs(), torch.exp(-2.0 / t2p)[:, None].expand(2, N), rtol=1e-6, atol=0)

    signal, J = sim.jacobian(("T1", "T2prime"), T1=t1, T2=60.0, T2prime=t2p)
    assert J.shape == (2, 2, N) and rel_max_err(signal, on) < 1e-6
    for p, x in ((0, t1.clone().requires_grad_()), (1, t2p.clone().requires_grad_())):
        w = torch.linspace(0.5, 1.5, N)
        values = {"T1": t1, "T2prime": t2p} | {("T1", "T2prime")[p]: x}
        s = sim.simulate(T2=60.0, **values)
        (grad,) = torch.autograd.grad((s.abs() ** 2 * w).sum(), x)
        # Both float32 kernels: 1e-4 as FIRST[float32].
        assert rel_max_err(grad, (2 * (s.conj() * J[:, p]).real * w).sum(-1)) < 1e-4

    # Steady state: the factor commutes with the extrapolation (float32 output, 1e-5 relative).
    steady = sim.simulate(T1=t1, T2=60.0, T2prime=t2p, repetitions="auto")
    assert rel_max_err(steady, sim.simulate(T1=t1, T2=60.0, repetitions="auto") * torch.exp(-2.0 / t2p)[:, None]) < 1e-5
