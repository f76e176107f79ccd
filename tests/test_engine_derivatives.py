"""Derivatives of the kernels against autograd through the float64 oracle (blochsim._reference.play).

First order: forward mode (engine.jacobian, torch.autograd.forward_ad through engine.simulate) and reverse
mode (torch.autograd.grad through engine.simulate), with respect to the sequence's flips, phases and
durations (a repetition-time tensor that feeds the timestamps) and every tissue property of pool model 0.
Second order: the gradient of a cost of the Jacobian, and a Hessian-vector product by double backward,
against autograd-through-autograd on the oracle. Then the dot-product test between the JVP and the VJP,
and torch.autograd.gradcheck / gradgradcheck on the float64 kernels.

Tolerances, relative to the largest entry of the oracle's derivative (per input):
- first order, float32: 1e-4. A derivative is a sum over events of products of states and adjoint states,
  each with float32 round-off ~1e-6 relative (see test_engine_forward.py), and the sum cancels: a
  derivative that is small next to its terms (a T1 derivative in a train dominated by T2, a Jacobian column
  of D) loses another factor ~10. Seen: up to 1.5e-5 (Jacobian), 7e-6 (VJP), 6e-6 (forward AD).
- first order, float64: 1e-10 (the same argument at 1.1e-16 round-off gives ~1e-13; seen: up to 2e-14).
- second order, float32: 1e-3 and float64: 1e-9: one more differentiation is one more cancelling sum of
  products, allowed ~10x the first-order error (seen: 1e-5 and 2e-14, so the margin is wide).
A derivative that is zero in exact arithmetic (B0 on FISP and CPMG trains, which are blind to a uniform
off-resonance; the inversion efficiency without an inversion) has no scale to be relative to: there the
engine's derivative must be below an absolute 1e-5 (float32) or 1e-13 (float64) per unit of the input. It is
a sum of cancelling terms of size ~0.1 per unit (B0 in Hz) with float32 round-off, ~1e-7 seen; 1e-5 is still
far below a real sensitivity (bSSFP: ~0.05 per Hz).
"""

from __future__ import annotations

import functools
import math

import pytest
import torch
from conftest import (
    CASES,
    DTYPES,
    F64,
    PATHS,
    PHASE_FIELDS,
    STATES,
    SWITCH_VALUES,
    T1_MS,
    T2_MS,
    f64,
    off_axis,
    path_cases,
    quadratic_phases,
    ramp,
    rel_max_err,
)
from torch.autograd import forward_ad as fwAD

from blochsim._reference import play
from blochsim.engine import jacobian, simulate
from blochsim.sequence import TissueProperties, mrf_description

# torch.autograd.forward_ad.make_dual loads torch's forward-mode decompositions, which script with torch.jit
# (deprecated in recent torch): a warning of torch's, not ours.
pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")

FIRST = {torch.float32: 1e-4, torch.float64: 1e-10}  # see the module docstring
SECOND = {torch.float32: 1e-3, torch.float64: 1e-9}
NEGLIGIBLE_REF = 1e-12  # an oracle derivative below this (per unit input) is zero in exact arithmetic
ZERO_ATOL = {torch.float32: 1e-5, torch.float64: 1e-13}

EVENT_INPUTS = ("flips", "tr_s", "phases")


# ---------------------------------------------------------------------------------------------
# Inputs: named values -> (description, tissue)
# ---------------------------------------------------------------------------------------------


def tissue_fields(path: str) -> tuple:
    """Tissue properties differentiated on a path: all of pool model 0 on the complex path; the real path
    cannot carry B0, B1phase or v."""
    fields = ("t1_ms", "t2_ms") + tuple(SWITCH_VALUES)
    return fields if path == "complex" else tuple(f for f in fields if f not in PHASE_FIELDS)


def values(case_name: str, path: str, *, with_phases: bool | None = None) -> dict:
    """Float64 values of every differentiated input of a case: flips, the repetition time (or echo spacing),
    the RF phases (complex path), and the tissue of three voxels."""
    case = CASES[case_name]
    n = case.shots
    flips = (170.0 - 50.0 * torch.arange(n, dtype=F64) / (n - 1)) * math.pi / 180 if case_name == "cpmg" else None
    x = {"flips": ramp(n, 15, 65) if flips is None else flips, "tr_s": f64(0.01)}
    if with_phases is None:
        with_phases = path == "complex"
    if with_phases:
        j = torch.arange(n, dtype=F64)
        if case_name == "mrf_quadratic":
            x["phases"] = quadratic_phases(n)
        elif case_name == "bssfp":
            x["phases"] = math.pi * (j % 2) + 0.05 * torch.sin(j)
        else:
            x["phases"] = 0.3 * torch.sin(1.3 * j)
    x["t1_ms"], x["t2_ms"] = f64(T1_MS), f64(T2_MS)
    for name in tissue_fields(path)[2:]:
        x[name] = f64(SWITCH_VALUES[name])
    return x


def build(case_name: str, x: dict, geometry: str = "crusher"):
    """(description, tissue) of named values (by default with the crusher geometry: diffusion, flow and washout
    act; "none": the intervals relax alone)."""
    kw = {name: x[name] for name in EVENT_INPUTS if name in x}
    description = CASES[case_name].build(geometry=geometry, **kw)
    tissue = TissueProperties(**{k: v for k, v in x.items() if k not in EVENT_INPUTS})
    return description, tissue


def run_oracle(case_name: str, x: dict, geometry: str = "crusher") -> torch.Tensor:
    description, tissue = build(case_name, x, geometry)
    return play(description, tissue, states=STATES, repetitions=CASES[case_name].repetitions).signal


def run_engine(case_name: str, x: dict, dtype, path, geometry: str = "crusher", **kw) -> torch.Tensor:
    description, tissue = build(case_name, x, geometry)
    return simulate(description, tissue, states=STATES, repetitions=CASES[case_name].repetitions, dtype=dtype,
                    path=path, **kw)


def leaves(x: dict) -> dict:
    return {k: v.detach().clone().requires_grad_() for k, v in x.items()}


def random_like(x: dict, seed: int) -> dict:
    """A random direction in every input, each scaled to a tenth of its input's mean size (so that T1 in ms
    and the repetition time in s move the signal alike, and no input's contribution hides below the
    tolerance of another's)."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for k, v in x.items():
        scale = float(v.abs().mean()) or 1.0
        out[k] = 0.1 * scale * torch.randn(v.shape, dtype=F64, generator=g)
    return out


def random_complex(shape, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.complex(torch.randn(shape, dtype=F64, generator=g), torch.randn(shape, dtype=F64, generator=g))


def grads(output: torch.Tensor, inputs: dict, **kw) -> dict:
    """torch.autograd.grad of a real scalar w.r.t. named inputs; an unused input gets zeros."""
    got = torch.autograd.grad(output, list(inputs.values()), allow_unused=True, **kw)
    return {k: torch.zeros_like(v) if g is None else g for (k, v), g in zip(inputs.items(), got, strict=True)}


def assert_close(actual: torch.Tensor, expected: torch.Tensor, tol: float, dtype, what: str) -> None:
    """Relative-to-max comparison; an exactly-zero derivative is held to an absolute bound instead."""
    if float(expected.abs().max()) <= NEGLIGIBLE_REF:
        assert float(actual.abs().max()) <= ZERO_ATOL[dtype], f"{what}: expected 0, got {actual}"
    else:
        err = rel_max_err(actual, expected)
        assert err < tol, f"{what}: relative error {err:.3g} (tolerance {tol})"


def inner(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The real inner product of complex arrays, Re sum(conj(a) b)."""
    return (a.conj() * b).real.sum()


# ---------------------------------------------------------------------------------------------
# First order: reverse mode
# ---------------------------------------------------------------------------------------------


@functools.cache
def oracle_vjp(case_name: str, path: str):
    """(cotangent w, gradients of Re<w, signal>) on the oracle, for every input of `values`."""
    x = leaves(values(case_name, path))
    signal = run_oracle(case_name, x)
    w = random_complex(signal.shape, seed=1)
    return w, grads(inner(w, signal), x)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(("case_name", "path"), path_cases())
def test_vjp_matches_oracle(case_name, path, dtype):
    """torch.autograd.grad through engine.simulate: flips, phases, TR, T1, T2, B0, B1, B1phase, M0, inversion
    efficiency, D, v."""
    w, expected = oracle_vjp(case_name, path)
    x = leaves(values(case_name, path))
    signal = run_engine(case_name, x, dtype, path)
    got = grads(inner(w.to(signal.dtype), signal), x)
    for name in x:
        assert got[name].dtype == F64  # gradients arrive in the inputs' dtype
        assert_close(got[name], expected[name], FIRST[dtype], dtype, name)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("path", PATHS)
def test_vjp_broadcast_shapes_and_shared_values(path, dtype):
    """Tissue of shapes (4, 1) and (5,) broadcast to (4, 5) voxels, one B1 for all (a 0-d tensor: sent with
    stride 0, its per-voxel gradients summed back), an M0 of shape (1,), a TR tensor and flips: the gradients
    keep the inputs' shapes and match the oracle's."""
    x = {"flips": ramp(8, 20, 50), "tr_s": f64(0.008), "t1_ms": torch.linspace(200.0, 1800.0, 4, dtype=F64)[:, None],
         "t2_ms": torch.linspace(20.0, 200.0, 5, dtype=F64), "b1": f64(0.9), "m0": f64([1.1])}
    if path == "complex":
        x["b0_hz"] = torch.linspace(-8.0, 8.0, 5, dtype=F64)

    def run(fn, leaf):
        description = CASES["bssfp"].build(flips=leaf["flips"], tr_s=leaf["tr_s"], n=8)
        return fn(description, TissueProperties(**{k: v for k, v in leaf.items() if k not in EVENT_INPUTS}))

    leaf = leaves(x)
    ref = run(lambda d, t: play(d, t, states=STATES, repetitions=2).signal, leaf)
    w = random_complex(ref.shape, seed=6)
    expected = grads(inner(w, ref), leaf)
    leaf = leaves(x)
    signal = run(lambda d, t: simulate(d, t, states=STATES, repetitions=2, dtype=dtype, path=path), leaf)
    assert signal.shape == ref.shape == (4, 5, 8)
    got = grads(inner(w.to(signal.dtype), signal), leaf)
    for name in x:
        assert got[name].shape == x[name].shape, name
        assert_close(got[name], expected[name], FIRST[dtype], dtype, name)


FIXED_TIMING_FIELDS = ("flips", "phases", "t1_ms", "t2_ms", "b0_hz", "m0")
#: A second water pool exchanging with free water (the tabulated layout): the sample reads the sum of both
#: pools' F+(0), which the adjoint keeps for each sample without a pass.
POOL_B = {"pool_b_fraction": 0.25, "pool_b_exchange_hz": 20.0, "t1_pool_b_ms": 700.0, "t2_pool_b_ms": 25.0,
          "pool_b_shift_hz": 12.0}


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(("case_name", "pool_b"), [("mrf", False), ("mrf_quadratic", False), ("mrf", True)])
def test_vjp_with_fixed_timing_matches_oracle(case_name, pool_b, dtype):
    """With the repetition time fixed (not differentiated) an MRF train's samples are events of their own, with
    no zero-length interval kept for a derivative: the complex adjoint's sample-only events, whose state
    the gradients of M0 and the phases read. Those, the flips', T1's, T2's and B0's against the oracle, with
    pool model 0 and with a second water pool (pool_b: both pools' F+(0) kept for each such sample).
    (test_vjp_matches_oracle differentiates the repetition time, whose intervals make every sample a pass.)"""
    x = values(case_name, "complex")
    if pool_b:
        x.update({k: f64([v] * len(T1_MS)) for k, v in POOL_B.items()})

    def gradients(run):
        leaf = leaves({k: x[k] for k in FIXED_TIMING_FIELDS})
        signal = run({**x, **leaf})
        w = random_complex(signal.shape, seed=11)
        return grads(inner(w.to(signal.dtype), signal), leaf)

    expected = gradients(lambda d: run_oracle(case_name, d))
    got = gradients(lambda d: run_engine(case_name, d, dtype, "complex"))
    for name in FIXED_TIMING_FIELDS:
        assert_close(got[name], expected[name], FIRST[dtype], dtype, name)


#: A semisolid pool beside the second water pool: the RF saturation's adjoint too (its table's cotangent).
BOUND = {"bound_fraction": 0.1, "bound_exchange_hz": 4.3, "t1_bound_ms": 1000.0}


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("path", ["real", "complex"])
@pytest.mark.parametrize("table_cotangents", [False, True])
def test_a_pooled_flip_gradient_matches_oracle_with_and_without_table_cotangents(path, table_cotangents, dtype):
    """Free water, a second water pool and a semisolid pool with no crusher geometry (the tables are the whole
    interval: no diffusion, flow or washout): the flips' gradient against the oracle, with no pool table's
    cotangent asked (only the flips differentiated: relax_tables.hpp's TableGrad.wanted false, so the adjoint
    forms none) and with them asked (T1 differentiated too), on both paths. The first runs relax_tables.hpp's
    loop of the tables' transposes alone: with its order 0 skipped, the four cases without cotangents fail."""
    x = values("mrf", path)
    pools = {**POOL_B, **BOUND}
    if path == "real":  # (a pool's shift needs the complex path)
        del pools["pool_b_shift_hz"]
    x.update({k: f64([v] * len(T1_MS)) for k, v in pools.items()})
    differentiated = ("flips", "t1_ms") if table_cotangents else ("flips",)

    def gradients(run):
        leaf = leaves({k: x[k] for k in differentiated})
        signal = run({**x, **leaf})
        w = random_complex(signal.shape, seed=12)
        return grads(inner(w.to(signal.dtype), signal), leaf)

    expected = gradients(lambda d: run_oracle("mrf", d, geometry="none"))
    got = gradients(lambda d: run_engine("mrf", d, dtype, path, geometry="none"))
    for name in differentiated:
        assert_close(got[name], expected[name], FIRST[dtype], dtype, name)


FEW_STATES_FIELDS = ("t1_ms", "t2_ms", "b1")


def few_states_values() -> dict:
    return {"flips": 0.3 + 0.05 * torch.arange(8, dtype=F64), "t1_ms": f64(T1_MS), "t2_ms": f64(T2_MS),
            "b1": f64(SWITCH_VALUES["b1"])}


@functools.cache
def oracle_few_states(states: int):
    """(cotangent, VJP w.r.t. flips, T1, T2, Jacobian along T1, T2, B1) of `off_axis` on the oracle."""
    x = leaves(few_states_values())
    props = TissueProperties(**{k: v for k, v in x.items() if k != "flips"})
    signal = play(off_axis(x["flips"]), props, states=states, repetitions=2).signal
    w = random_complex(signal.shape, seed=7)
    vjp = grads(inner(w, signal), {k: x[k] for k in ("flips", "t1_ms", "t2_ms")})
    # Jacobian columns in one forward pass over voxels tiled once per field (as in oracle_jacobian).
    P, V = len(FEW_STATES_FIELDS), len(T1_MS)
    with fwAD.dual_level():
        tiled = {}
        for p, name in enumerate(FEW_STATES_FIELDS):
            tangent = torch.zeros(P, V, dtype=F64)
            tangent[p] = 1.0
            tiled[name] = fwAD.make_dual(x[name].detach().repeat(P), tangent.reshape(-1))
        out = play(off_axis(), TissueProperties(**tiled), states=states, repetitions=2).signal
        J = fwAD.unpack_dual(out).tangent.reshape(P, V, -1).transpose(0, 1)
    return w, vjp, J


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("states", [1, 2])
def test_vjp_and_jacobian_with_few_states(states, path, dtype):
    """One and two EPG orders (the edge cases of the shift and its adjoint), pulses off the x axis, a late first
    event and 2 repetitions: VJP w.r.t. flips, T1 and T2; Jacobian along T1, T2 and B1."""
    w, expected, expected_J = oracle_few_states(states)
    x = leaves(few_states_values())
    props = TissueProperties(**{k: v for k, v in x.items() if k != "flips"})
    signal = simulate(off_axis(x["flips"]), props, states=states, repetitions=2, dtype=dtype, path=path)
    got = grads(inner(w.to(signal.dtype), signal), {k: x[k] for k in expected})
    for name in expected:
        assert_close(got[name], expected[name], FIRST[dtype], dtype, name)
    plain = TissueProperties(**{k: v.detach() for k, v in x.items() if k != "flips"})
    _, J = jacobian(off_axis(), plain, FEW_STATES_FIELDS, states=states, repetitions=2, dtype=dtype, path=path)
    for p, name in enumerate(FEW_STATES_FIELDS):
        assert_close(J[:, p], expected_J[:, p], FIRST[dtype], dtype, name)


# ---------------------------------------------------------------------------------------------
# First order: forward mode
# ---------------------------------------------------------------------------------------------


@functools.cache
def oracle_jacobian(case_name: str, path: str) -> torch.Tensor:
    """d signal / d tissue, (voxels, fields, samples), by forward mode through the oracle: the voxels are
    tiled once per field and each copy carries a unit tangent on its own field, so one pass gives all
    columns (voxels are independent)."""
    x = values(case_name, path)
    fields = tissue_fields(path)
    P, V = len(fields), len(T1_MS)
    with fwAD.dual_level():
        duals = {}
        for k, v in x.items():
            if k in fields:
                tangent = torch.zeros(P, V, dtype=F64)
                tangent[fields.index(k)] = 1.0
                duals[k] = fwAD.make_dual(v.repeat(P), tangent.reshape(-1))
            else:
                duals[k] = v
        description, tissue = build(case_name, duals)
        signal = play(description, tissue, states=STATES, repetitions=CASES[case_name].repetitions).signal
        columns = fwAD.unpack_dual(signal).tangent
    return columns.reshape(P, V, -1).transpose(0, 1)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(("case_name", "path"), path_cases())
def test_jacobian_matches_oracle(case_name, path, dtype):
    """engine.jacobian along every tissue property (9 on the complex path: more than the 8 tangents a kernel
    carries, so it runs in two groups)."""
    fields = tissue_fields(path)
    x = values(case_name, path)
    description, tissue = build(case_name, x)
    signal, J = jacobian(description, tissue, fields, states=STATES, repetitions=CASES[case_name].repetitions,
                         dtype=dtype, path=path)
    expected = oracle_jacobian(case_name, path)
    assert J.shape == expected.shape == (len(T1_MS), len(fields), signal.shape[-1])
    for p, name in enumerate(fields):
        assert_close(J[:, p], expected[:, p], FIRST[dtype], dtype, name)
    assert rel_max_err(signal, run_oracle(case_name, x)) < FIRST[dtype]


def forward_ad(fn, x: dict, tangents: dict) -> torch.Tensor:
    """The tangent of fn(x) along `tangents`, by torch.autograd.forward_ad."""
    with fwAD.dual_level():
        duals = {k: fwAD.make_dual(v, tangents[k]) for k, v in x.items()}
        out = fwAD.unpack_dual(fn(duals)).tangent
    assert out is not None, "no tangent came out: the inputs' tangents were dropped"
    return out


@functools.cache
def oracle_jvp(case_name: str, path: str) -> torch.Tensor:
    x = values(case_name, path)
    return forward_ad(lambda d: run_oracle(case_name, d), x, random_like(x, seed=2))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(("case_name", "path"), path_cases())
def test_forward_ad_matches_oracle(case_name, path, dtype):
    """torch.autograd.forward_ad through engine.simulate, along a random direction in every input at once
    (flips, phases, TR and the tissue): EpgSimulate.jvp, the JVP kernel with event-value tangents."""
    x = values(case_name, path)
    got = forward_ad(lambda d: run_engine(case_name, d, dtype, path), x, random_like(x, seed=2))
    assert rel_max_err(got, oracle_jvp(case_name, path)) < FIRST[dtype]


@pytest.mark.parametrize("path", PATHS)
def test_torch_func_jvp_matches_oracle(path):
    """torch.func.jvp through engine.simulate (the functorch front end of forward mode), tissue tangents only."""
    x = values("bssfp", path)
    tangents = random_like(x, seed=3)
    fields = tissue_fields(path)
    description, _ = build("bssfp", x)

    def signal(*tissue_values):
        tissue = TissueProperties(**dict(zip(fields, tissue_values, strict=True)))
        return simulate(description, tissue, states=STATES, repetitions=2, dtype=torch.float64, path=path)

    _, got = torch.func.jvp(signal, tuple(x[k] for k in fields), tuple(tangents[k] for k in fields))
    expected = forward_ad(lambda d: run_oracle("bssfp", {**x, **d}), {k: x[k] for k in fields},
                          {k: tangents[k] for k in fields})
    assert rel_max_err(got, expected) < FIRST[torch.float64]


def test_forward_ad_phase_tangent_on_auto_path():
    """A uniform tangent on every RF and ADC phase turns the whole experiment about z: the demodulated signal
    does not change, so its tangent is 0 (the oracle agrees). The engine, on the auto path, turns the ADCs only."""
    x = {"flips": ramp(12, 15, 65), "tr_s": f64(0.01), "phases": torch.zeros(12, dtype=F64),
         "t1_ms": f64(T1_MS), "t2_ms": f64(T2_MS)}
    tangents = {k: torch.zeros_like(v) for k, v in x.items()}
    tangents["phases"] = torch.ones(12, dtype=F64)
    got = forward_ad(lambda d: run_engine("mrf", d, torch.float64, "auto"), x, tangents)
    scale = float(run_oracle("mrf", x).abs().max())
    assert float(got.abs().max()) / scale < FIRST[torch.float64]


def test_forward_ad_tangent_at_identity_value():
    """bSSFP is sensitive to B0: d signal / d B0 at B0 = 0 is not 0 (the oracle gives ~0.05 per Hz)."""
    x = values("bssfp", "complex", with_phases=False)
    x["b0_hz"] = torch.zeros(3, dtype=F64)
    tangents = {k: torch.zeros_like(v) for k, v in x.items()}
    tangents["b0_hz"] = torch.ones(3, dtype=F64)
    expected = forward_ad(lambda d: run_oracle("bssfp", d), x, tangents)
    got = forward_ad(lambda d: run_engine("bssfp", d, torch.float64, "complex"), x, tangents)
    assert rel_max_err(got, expected) < FIRST[torch.float64]


def test_forward_ad_tangent_on_zero_length_interval():
    """d signal / d TI at TI = 0 (inversion, then excitation at once): forward mode must give what reverse mode
    gives. Compared with the engine's own reverse mode, which matches the oracle's (test_vjp_matches_oracle);
    the oracle's forward mode drops this tangent too."""
    def run(ti):
        description = mrf_description([0.3, 0.5, 0.7], 0.01, inversion_time_s=ti)
        return simulate(description, TissueProperties(t1_ms=800.0, t2_ms=60.0), states=8, dtype=torch.float64)

    ti = torch.tensor(0.0, dtype=F64, requires_grad=True)
    (reverse,) = torch.autograd.grad(run(ti).imag.sum(), ti)
    forward = forward_ad(lambda d: run(d["ti"]), {"ti": f64(0.0)}, {"ti": f64(1.0)})
    assert abs(float(reverse)) > 1.0  # the recovery from -1 at once: dZ/dt = 2/T1, a real derivative
    assert abs(float(forward.imag.sum()) - float(reverse)) < 1e-10 * abs(float(reverse))


# ---------------------------------------------------------------------------------------------
# Second order
# ---------------------------------------------------------------------------------------------

SECOND_ORDER_CASES = [("mrf", "real"), ("mrf", "complex"), ("bssfp", "real"), ("mrf_quadratic", "complex")]


def jacobian_cost_inputs(path: str) -> tuple:
    """The inputs the Jacobian cost is differentiated along: the flips and T1, and on the complex path the
    phases and M0 too, whose gradients read the samples (with the repetition time fixed here, an MRF
    train's samples are events of their own: test_vjp_with_fixed_timing_matches_oracle)."""
    return ("flips", "t1_ms") + (("phases", "m0") if path == "complex" else ())


@functools.cache
def oracle_jacobian_cost_grad(case_name: str, path: str) -> dict:
    """d/d(jacobian_cost_inputs) of sum |d signal / d(T1, T2)|^2 on the oracle: forward mode (tiled voxels,
    as in oracle_jacobian) for the Jacobian, reverse mode through it."""
    x = values(case_name, path)
    wanted = leaves({k: x[k] for k in jacobian_cost_inputs(path)})
    V = len(T1_MS)
    with fwAD.dual_level():
        duals = {**x, **wanted}
        one, zero = torch.ones(V, dtype=F64), torch.zeros(V, dtype=F64)
        duals["t1_ms"] = fwAD.make_dual(wanted["t1_ms"].repeat(2), torch.cat([one, zero]))
        duals["t2_ms"] = fwAD.make_dual(x["t2_ms"].repeat(2), torch.cat([zero, one]))
        tiled = {k: (v if k in ("t1_ms", "t2_ms") or k in EVENT_INPUTS else v.repeat(2)) for k, v in duals.items()}
        description, tissue = build(case_name, tiled)
        signal = play(description, tissue, states=STATES, repetitions=CASES[case_name].repetitions).signal
        J = fwAD.unpack_dual(signal).tangent
    return grads(J.abs().pow(2).sum(), wanted)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(("case_name", "path"), SECOND_ORDER_CASES)
def test_jacobian_cost_gradient_matches_oracle(case_name, path, dtype):
    """The gradient of sum |J(T1, T2)|^2 (a CRLB-like design cost) w.r.t. the flips and T1 (and on the complex
    path the phases and M0: jacobian_cost_inputs): the backward of EpgJacobian, the second-order adjoint
    kernel."""
    x = values(case_name, path)
    wanted = leaves({k: x[k] for k in jacobian_cost_inputs(path)})
    description, tissue = build(case_name, {**x, **wanted})
    _, J = jacobian(description, tissue, ("t1_ms", "t2_ms"), states=STATES,
                    repetitions=CASES[case_name].repetitions, dtype=dtype, path=path)
    got = grads(J.abs().pow(2).sum(), wanted)
    expected = oracle_jacobian_cost_grad(case_name, path)
    for name in wanted:
        assert_close(got[name], expected[name], SECOND[dtype], dtype, name)


def hvp(run, x: dict, wanted: tuple, target: torch.Tensor, direction: dict) -> dict:
    """Hessian of L = sum |signal - target|^2 w.r.t. the `wanted` inputs, times `direction`, by double backward."""
    leaf = leaves({k: x[k] for k in wanted})
    signal = run({**x, **leaf})
    loss = (signal - target.to(signal.dtype)).abs().pow(2).sum()
    g = torch.autograd.grad(loss, list(leaf.values()), create_graph=True)
    gv = sum((gi * direction[k].to(gi.dtype)).sum() for gi, k in zip(g, leaf, strict=True))
    return grads(gv, leaf)


def hvp_inputs(path: str) -> tuple:
    common = ("flips", "tr_s", "t1_ms", "t2_ms", "b1", "diffusion_um2_per_ms")
    return common + (("phases", "b0_hz", "velocity_m_per_s") if path == "complex" else ())


@functools.cache
def oracle_hvp(case_name: str, path: str) -> dict:
    x = values(case_name, path)
    target = random_complex((len(T1_MS), run_oracle(case_name, x).shape[-1]), seed=4) * 0.1
    direction = random_like(x, seed=5)
    return hvp(lambda d: run_oracle(case_name, d), x, hvp_inputs(path), target, direction)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(("case_name", "path"), SECOND_ORDER_CASES)
def test_hessian_vector_product_matches_oracle(case_name, path, dtype):
    """Double backward through engine.simulate (the backward of EpgVjp) against double backward through the
    oracle, over event values and tissue at once."""
    x = values(case_name, path)
    target = random_complex((len(T1_MS), run_oracle(case_name, x).shape[-1]), seed=4) * 0.1
    direction = random_like(x, seed=5)
    got = hvp(lambda d: run_engine(case_name, d, dtype, path), x, hvp_inputs(path), target, direction)
    expected = oracle_hvp(case_name, path)
    for name in hvp_inputs(path):
        assert_close(got[name], expected[name], SECOND[dtype], dtype, name)


# ---------------------------------------------------------------------------------------------
# The dot-product test
# ---------------------------------------------------------------------------------------------

#: <JVP(t), w> and <t, VJP(w)> are the same sum computed in two orders: they agree to round-off of the
#: sum relative to its largest terms; 1e-4 / 1e-10 as for first derivatives.
DOT = FIRST


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(("case_name", "path"), path_cases())
def test_dot_product_jvp_vjp(case_name, path, dtype):
    """<JVP(t), w> = <t, VJP(w)> (real inner products) for random t over every input and random w."""
    x = values(case_name, path)
    for seed in (10, 11):
        t = random_like(x, seed)
        jvp = forward_ad(lambda d: run_engine(case_name, d, dtype, path), x, t)
        w = random_complex(jvp.shape, seed + 100).to(jvp.dtype)
        leaf = leaves(x)
        vjp = grads(inner(w, run_engine(case_name, leaf, dtype, path)), leaf)
        lhs = float(inner(w, jvp))
        terms = [(t[k] * vjp[k]) for k in x]
        rhs = float(sum(term.sum() for term in terms))
        scale = float(sum(term.abs().sum() for term in terms))  # the size of the terms being summed
        assert abs(lhs - rhs) <= DOT[dtype] * scale, (lhs, rhs, scale)


# ---------------------------------------------------------------------------------------------
# gradcheck and gradgradcheck on the float64 kernels
# ---------------------------------------------------------------------------------------------


def small_problem(path: str):
    """Four shots of MRF with crushers, played twice (the wrap interval is differentiated too), two voxels,
    six orders: small enough for finite differences."""
    names = ["flips", "tr_s", "t1_ms", "t2_ms", "b1", "m0", "inversion_efficiency", "diffusion_um2_per_ms"]
    x = {"flips": f64([0.3, 0.7, 0.5, 0.9]), "tr_s": f64(0.01), "t1_ms": f64([500.0, 900.0]),
         "t2_ms": f64([50.0, 90.0]), "b1": f64([0.9, 1.1]), "m0": f64([1.0, 0.8]),
         "inversion_efficiency": f64([0.9, 1.0]), "diffusion_um2_per_ms": f64([1.0, 2.5])}
    if path == "complex":
        x.update(phases=f64([0.1, -0.4, 0.3, 0.2]), b0_hz=f64([3.0, -5.0]), b1_phase_rad=f64([0.2, -0.1]),
                 velocity_m_per_s=f64([0.01, -0.004]))
        names += ["phases", "b0_hz", "b1_phase_rad", "velocity_m_per_s"]

    def fn(*args):
        named = dict(zip(names, args, strict=True))
        kw = {k: named[k] for k in EVENT_INPUTS if k in named}
        description = CASES["mrf"].build(n=4, geometry="crusher", **kw)
        tissue = TissueProperties(**{k: v for k, v in named.items() if k not in EVENT_INPUTS})
        return simulate(description, tissue, states=6, repetitions=2, dtype=torch.float64, path=path)

    return fn, tuple(x[k].clone().requires_grad_() for k in names)


@pytest.mark.parametrize("path", PATHS)
def test_gradcheck(path):
    """Reverse mode (the VJP kernel) and forward mode (the JVP kernel) against finite differences."""
    fn, inputs = small_problem(path)
    assert torch.autograd.gradcheck(fn, inputs, check_forward_ad=True, check_backward_ad=True)


@pytest.mark.parametrize("path", PATHS)
def test_gradgradcheck(path):
    """The backward of the VJP (the second-order adjoint kernel) against finite differences of the VJP,
    including the derivative w.r.t. the cotangent."""
    fn, inputs = small_problem(path)
    assert torch.autograd.gradgradcheck(fn, inputs)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("b1", ("map", "one value"))
def test_a_jacobians_directions_run_in_one_call(path, b1, monkeypatch):
    """The backward of a Jacobian runs its P directions as one call over P copies of the voxels
    (engine.kernels.vjp_jvp_directions) where they are along tissue properties: the gradients of sum |J|^2
    plus sum |signal|^2 along the flips, T1, T2 and B1 (a map, or one value the copies share) equal those of
    one call per direction, float64 (sums in another order: 1e-12)."""
    from blochsim.engine import kernels

    original, batched = kernels.vjp_jvp_directions, []

    def spy(*args, **kwargs):
        batched.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(kernels, "vjp_jvp_directions", spy)

    def gradients():
        flips = f64([0.3, 0.7, 0.5, 0.9, 0.4, 0.2]).requires_grad_()
        t1, t2 = f64([500.0, 900.0, 1400.0]).requires_grad_(), f64([50.0, 90.0, 40.0]).requires_grad_()
        b1_value = f64([0.9, 1.1, 1.0]) if b1 == "map" else f64([0.95])
        b1_value.requires_grad_()
        phases = f64([0.1, -0.4, 0.3, 0.2, 0.0, 0.5]) if path == "complex" else 0.0
        d = mrf_description(flips, 0.01, phases_rad=phases, inversion_time_s=0.02)
        tissue = TissueProperties(t1_ms=t1, t2_ms=t2, b1=b1_value)
        signal, J = jacobian(d, tissue, ("t1_ms", "t2_ms", "b1"), states=8, dtype=torch.float64, path=path)
        loss = (J.abs() ** 2).sum() + (signal.abs() ** 2).sum()
        return torch.autograd.grad(loss, [flips, t1, t2, b1_value])

    one_call = gradients()
    assert batched, "the directions did not run in one call"
    monkeypatch.setattr(kernels, "directions_in_one_call", lambda *a: False)
    per_direction = gradients()
    for name, got, want in zip(("flips", "T1", "T2", "B1"), one_call, per_direction, strict=True):
        assert rel_max_err(got, want) < 1e-12, name


def test_a_jacobians_backward_runs_no_first_order_pass_for_an_unused_signal(monkeypatch):
    """A loss of J alone (the benchmarks' HVP, sum |J|^2) gives the signal no cotangent: the backward runs
    the directions' second-order call and no first-order VJP (a zero cotangent seeded on its own cost one:
    +2.5 ms at 2k tissues and +59 ms on the 20k complex HVP, H100); with the signal in the loss it runs one."""
    from blochsim.engine import kernels

    original, first_order = kernels.vjp, []

    def spy(*args, **kwargs):
        first_order.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(kernels, "vjp", spy)

    def backward(with_signal: bool):
        flips = f64([0.3, 0.7, 0.5, 0.9]).requires_grad_()
        d = mrf_description(flips, 0.01, inversion_time_s=0.02)
        tissue = TissueProperties(t1_ms=f64([500.0, 900.0]), t2_ms=f64([50.0, 90.0]))
        signal, J = jacobian(d, tissue, ("t1_ms", "t2_ms"), states=8, dtype=torch.float64)
        loss = (J.abs() ** 2).sum() + ((signal.abs() ** 2).sum() if with_signal else 0)
        first_order.clear()
        loss.backward()
        return len(first_order), flips.grad

    calls, grad = backward(with_signal=False)
    assert calls == 0 and grad is not None and bool(grad.abs().sum() > 0)
    assert backward(with_signal=True)[0] == 1


def test_a_pooled_jacobians_table_tangents_are_constants_formed_once_along_new_flips(monkeypatch):
    """A Jacobian along pool properties, differentiated along the flips alone (a design loop's HVP), takes
    the pool tables' tangents as constants (no graph: they are formed from the tissue and the intervals,
    not the flips), kept while the tissue's and the intervals' tensors are unmodified; the flips' gradient
    is the one with the tangents' graph kept (a tissue field requiring grad) to 1e-12."""
    from blochsim.engine import bind
    from blochsim.simulators import MRFSimulator

    original, formed = bind.reverse_jvps, []

    def spy(outputs, leaves, differentiable):
        formed.append(differentiable)
        return original(outputs, leaves, differentiable)

    monkeypatch.setattr(bind, "reverse_jvps", spy)
    t1, t2 = f64([500.0, 900.0, 1400.0]), f64([50.0, 90.0, 60.0])
    degrees = f64([20.0, 45.0, 30.0, 60.0])
    sim = MRFSimulator(flip=degrees, TR=10.0, states=8, dtype=torch.float64)  # as a design loop holds it

    def flip_gradient(t1_ms):
        flips = degrees.clone().requires_grad_()
        _, J = sim.jacobian(("T1", "bound_fraction"), flip=flips, T1=t1_ms, T2=t2, bound_fraction=0.1,
                            bound_exchange=4.3, bound_T1=1000.0)
        return torch.autograd.grad((J.abs() ** 2).sum(), flips)[0]

    first = flip_gradient(t1)
    flip_gradient(t1)  # the simulator's resolved train settles at its second call (its intervals' tensors)
    settled = len(formed)
    again = flip_gradient(t1)
    assert len(formed) == settled and formed == [False] * settled  # constant tangents, kept
    t1.mul_(1.0)  # an in-place change (a new version) forms them again
    flip_gradient(t1)
    assert formed == [False] * (settled + 1)
    with_graph = flip_gradient(t1.clone().requires_grad_())
    assert formed[-1] is True
    assert torch.equal(first, again) and rel_max_err(first, with_graph) < 1e-12
