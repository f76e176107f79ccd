"""Pulses played per voxel in the kernels (host build): slice profiles, static shims and dynamic pTx, held to the
float64 oracle (blochsim._reference, itself held to an independent Bloch simulation in
tests/test_slice_profile_reference.py), values and derivatives.

Tolerances, relative to the oracle's largest entry:
- Slice profiles are read from tables by cubic Hermite interpolation over the effective flip, whose error
  falls as h^4 (h the knot spacing): 9e-8 at the default 64 knots over 2 pi for the spin echo here, 4e-10
  at 256, 1.4e-12 at 1024 (test_profile_interpolation_converges_at_fourth_order pins the rate). Float64 cases
  take 512 knots (~2e-11) and 1e-10; float32 cases the default 64 knots and 1e-5 (float32 round-off ~1e-6,
  see tests/test_engine_forward.py, plus the interpolation's 1e-7).
- Shims and dynamic pTx pulses have no interpolation: float64 1e-12 (rounding over a few dozen events, seen
  ~1e-15), float32 1e-5 as for every kernel.
- Derivatives: float64 1e-7 with profiles (the interpolation's error, differentiated: the slope of a cubic
  Hermite interpolant converges as h^3, one order less; seen 1.2e-9 at 1024 knots, 1.1e-8 at 512) and
  1e-10 without (as
  tests/test_engine_derivatives.py).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from conftest import rel_max_err

from blochsim import execution
from blochsim._reference import play
from blochsim.engine import jacobian, simulate
from blochsim.sequence import (
    EpgEngine,
    ExactSliceProfile,
    Excitation,
    Readout,
    Refocusing,
    SequenceDescription,
    ShimDefinition,
    SSFPFidReadout,
    TissueProperties,
    ideal_rf_definition,
    rf_definition,
)
from blochsim.simulators import MRFSimulator

F64 = torch.float64
STATES = 8
FINE = ExactSliceProfile(9, bins=512)  # float64 cases (module docstring)
COARSE = ExactSliceProfile(9)  # float32: the default 64 knots
PROFILE_TOL = {F64: 1e-10, torch.float32: 1e-5}
PLAIN_TOL = {F64: 1e-12, torch.float32: 1e-5}


def sinc(samples=200, lobes=4, definition_id=1, ramp=0.0):
    t = np.linspace(-lobes, lobes, samples)
    w = np.sinc(t) * np.hanning(samples + 2)[1:-1] * np.exp(1j * ramp * t / lobes)
    return rf_definition(w, dwell_s=1e-5, bandwidth_hz=2 * lobes / (samples * 1e-5), definition_id=definition_id)


EXC, REF = sinc(definition_id=1, ramp=1.0), sinc(160, 3, definition_id=2)
DEFINITIONS = {0: ideal_rf_definition(), 1: EXC, 2: REF}


def spin_echo(exc_flip=math.pi / 2, ref_flip=2.6):
    """Profiled 90 and two profiled refocusing pulses with crushers: every pathway of the refocusing profile."""
    return SequenceDescription.from_operators(
        Excitation(exc_flip, math.pi / 2, definition_id=1), (5e-3, Refocusing(ref_flip, 0.0, definition_id=2)),
        (10e-3, Readout()), (15e-3, Refocusing(ref_flip, 0.0, definition_id=2)), (20e-3, Readout()),
        rf_definitions=DEFINITIONS)


def train(flips):
    """An SSFP train of profiled excitations (FISP readouts), played twice."""
    parts = []
    for k, flip in enumerate(flips):
        parts += [(k * 8e-3, Excitation(flip, 0.0, definition_id=1)), (k * 8e-3 + 2e-3, SSFPFidReadout())]
    return SequenceDescription.from_operators(*parts, (len(flips) * 8e-3, Readout(is_echo=False)),
                                              rf_definitions=DEFINITIONS)


def tissue(**extra):
    fields = dict(t1_ms=torch.tensor([800.0, 1000.0, 1200.0], dtype=F64), t2_ms=60.0,
                  b1=torch.tensor([1.0, 0.8, 1.1], dtype=F64))
    fields.update(extra)
    return TissueProperties(**fields)


CASES = {
    "spin_echo": lambda: spin_echo(),
    "negative_flips": lambda: spin_echo(-math.pi / 2, -2.6),
    "train": lambda: train([0.3, -0.7, 1.2, 0.5]),
}


@pytest.mark.parametrize("dtype", [F64, torch.float32])
@pytest.mark.parametrize("case", list(CASES))
def test_slice_profiles_match_the_oracle(case, dtype):
    description = CASES[case]()
    profile = FINE if dtype == F64 else COARSE
    repetitions = 2 if case == "train" else 1
    b0 = tissue(b0_hz=torch.tensor([0.0, 5.0, -3.0], dtype=F64))
    want = play(description, b0, states=STATES, repetitions=repetitions, across_slice=FINE).signal
    got = simulate(description, b0, states=STATES, repetitions=repetitions, across_slice=profile, dtype=dtype)
    assert got.shape == want.shape
    assert rel_max_err(got, want) < PROFILE_TOL[dtype]  # see the module docstring


def test_profile_interpolation_converges_at_fourth_order():
    description, t = spin_echo(), tissue()
    want = play(description, t, states=STATES, across_slice=FINE).signal
    errors = [rel_max_err(simulate(description, t, states=STATES, dtype=F64,
                                   across_slice=ExactSliceProfile(FINE.points, bins=bins)), want) for bins in (64, 256)]
    # Cubic Hermite: the error falls as h^4, 4^4 = 256 for 4x the knots (seen 236).
    assert 150 < errors[0] / errors[1] < 400


def test_slice_profile_jacobian_and_gradients():
    description = spin_echo()
    t = tissue()
    fields = ("t1_ms", "t2_ms", "b1")
    _, jac = jacobian(description, t, fields, states=STATES, across_slice=FINE, dtype=F64)
    # The oracle's derivative of each sample along each field, per voxel (voxels are independent, so the
    # gradient of a sum over voxels is each voxel's own).
    leaves = {name: getattr(t, name).clone().requires_grad_() if isinstance(getattr(t, name), torch.Tensor)
              else torch.full((3,), getattr(t, name), dtype=F64, requires_grad=True) for name in fields}
    signal = play(description, TissueProperties(**{**dict(t.items()), **leaves}), states=STATES,
                  across_slice=FINE).signal
    for k, name in enumerate(fields):
        columns = []
        for s in range(signal.shape[-1]):
            re, = torch.autograd.grad(signal[:, s].real.sum(), leaves[name], retain_graph=True)
            im, = torch.autograd.grad(signal[:, s].imag.sum(), leaves[name], retain_graph=True)
            columns.append(torch.complex(re, im))
        want = torch.stack(columns, -1)
        assert rel_max_err(jac[:, k, :], want) < 1e-7, name  # see the module docstring

    # Reverse mode through the flips (the description's amplitudes) and B1.
    flips = torch.tensor([math.pi / 2, 2.6], dtype=F64, requires_grad=True)
    b1 = t.b1.clone().requires_grad_()

    def loss(run, across):
        d = SequenceDescription.from_operators(
            Excitation(flips[0], math.pi / 2, definition_id=1), (5e-3, Refocusing(flips[1], definition_id=2)),
            (10e-3, Readout()), (15e-3, Refocusing(flips[1], definition_id=2)), (20e-3, Readout()),
            rf_definitions=DEFINITIONS)
        signal = run(d, TissueProperties(t1_ms=t.t1_ms, t2_ms=60.0, b1=b1), across)
        return (signal.abs() ** 2).sum()

    engine_grads = torch.autograd.grad(loss(lambda d, x, a: simulate(d, x, states=STATES, dtype=F64,
                                                                      across_slice=a), FINE), (flips, b1))
    oracle_grads = torch.autograd.grad(loss(lambda d, x, a: play(d, x, states=STATES, across_slice=a).signal,
                                            FINE), (flips, b1))
    for got, want in zip(engine_grads, oracle_grads, strict=True):
        assert rel_max_err(got, want) < 1e-7  # see the module docstring


def test_slice_resolved_chunks_keep_their_positions():
    """Chunks cut the V * P kernel voxels anywhere (at 16-voxel blocks on the host): each keeps its positions."""
    description = train([0.3, 0.7, 1.2])
    t = tissue(t1_ms=torch.linspace(500, 1500, 7, dtype=F64), b1=torch.linspace(0.8, 1.2, 7, dtype=F64))
    whole = simulate(description, t, states=STATES, across_slice=COARSE, dtype=F64)
    with execution("cpu", budget_bytes=40_000):  # a few dozen kernel voxels a chunk
        chunked = simulate(description, t, states=STATES, across_slice=COARSE, dtype=F64)
    torch.testing.assert_close(chunked, whole, rtol=0, atol=0)  # each voxel's arithmetic is the same


@pytest.mark.parametrize("dtype", [F64, torch.float32])
def test_profiles_with_uniform_b1_formed_once_per_launch(dtype):
    """B1 and its phase the same in every voxel: the value forward forms each profiled pulse's rotation once per
    (event, position) and every voxel reads it (pulses.hpp pairs_per_launch). Held to the oracle, to the
    rotations formed per voxel (the same B1 given voxel by voxel), and to itself cut into chunks, some with
    fewer voxels than positions (formed per voxel there) and each starting at another position."""
    description = train([0.3, -0.7, 1.2, 0.5])
    profile = FINE if dtype == F64 else COARSE
    t1_ms = torch.linspace(500, 1500, 5, dtype=F64)
    uniform = TissueProperties(t1_ms=t1_ms, t2_ms=60.0, b1=0.9, b1_phase_rad=0.4)
    per_voxel = TissueProperties(t1_ms=t1_ms, t2_ms=60.0, b1=torch.full((5,), 0.9, dtype=F64),
                                 b1_phase_rad=torch.full((5,), 0.4, dtype=F64))
    want = play(description, uniform, states=STATES, repetitions=2, across_slice=FINE).signal
    got = simulate(description, uniform, states=STATES, repetitions=2, across_slice=profile, dtype=dtype)
    assert rel_max_err(got, want) < PROFILE_TOL[dtype]  # see the module docstring
    # The same operations, formed once or per voxel: only the compiler's contraction of them may differ.
    alike = simulate(description, per_voxel, states=STATES, repetitions=2, across_slice=profile, dtype=dtype)
    assert rel_max_err(got, alike) < (1e-14 if dtype == F64 else 1e-6)
    # 21 positions: 105 kernel voxels, cut into chunks of 9 to 64 voxels by these budgets (the byte model of
    # engine/chunks.py), so chunks of fewer voxels than positions and chunks starting mid-slice both occur.
    wide = ExactSliceProfile(21, bins=profile.bins)
    whole = simulate(description, uniform, states=STATES, repetitions=2, across_slice=wide, dtype=dtype)
    for budget_bytes in (800, 1_500, 3_000):
        with execution("cpu", budget_bytes=budget_bytes):
            chunked = simulate(description, uniform, states=STATES, repetitions=2, across_slice=wide, dtype=dtype)
        assert rel_max_err(chunked, whole) < (1e-14 if dtype == F64 else 1e-6)  # as above


def test_effective_flip_past_theta_max_is_refused():
    with pytest.raises(ValueError, match="effective flip .* above the slice profile's theta_max"):
        simulate(spin_echo(ref_flip=3.0), tissue(b1=torch.tensor([1.0, 1.2, 0.9], dtype=F64)), states=STATES,
                 across_slice=ExactSliceProfile(5, theta_max=3.2))


# ---- parallel transmit ------------------------------------------------------------------------------------
def shimmed(magnitudes=(1.0, 0.5), phases=(0.0, 1.0), definition_id=0):
    shims = {1: ShimDefinition(1, magnitudes, phases), 2: ShimDefinition(2, [0.3, 0.9], [0.5, -0.4])}
    return SequenceDescription.from_operators(
        Excitation(0.7, 0.2, shim_id=1, definition_id=definition_id), (3e-3, Readout()),
        (5e-3, Refocusing(2.4, 0.0, shim_id=2)), (10e-3, Readout()), (15e-3, Refocusing(2.0, 0.3, shim_id=1)),
        (20e-3, Readout()), rf_definitions=DEFINITIONS, shim_definitions=shims)


def channel_maps(voxels=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (0.5 + torch.rand(2, voxels, dtype=F64, generator=g), torch.rand(2, voxels, dtype=F64, generator=g) * 2)


@pytest.mark.parametrize("dtype", [F64, torch.float32])
def test_static_shims_match_the_oracle(dtype):
    b1, phase = channel_maps()
    t = TissueProperties(t1_ms=torch.tensor([800.0, 900, 1000, 1100], dtype=F64), t2_ms=60.0, b1=b1,
                         b1_phase_rad=phase)
    want = play(shimmed(), t, states=STATES).signal
    got = simulate(shimmed(), t, states=STATES, dtype=dtype)
    assert rel_max_err(got, want) < PLAIN_TOL[dtype]  # see the module docstring
    # EpgEngine takes the same description (labels aside).
    assert rel_max_err(EpgEngine().simulate(shimmed(), t, nstates=STATES).signal, want) < 1e-5


def test_shim_weights_and_maps_get_their_gradients():
    """Reverse mode to the shim weights (shim design) and the channel maps, against autograd through the
    oracle; and forward mode along T1 and T2 with shims on."""
    magnitudes = torch.tensor([1.0, 0.5], dtype=F64, requires_grad=True)
    phases = torch.tensor([0.0, 1.0], dtype=F64, requires_grad=True)
    b1, phase = (x.requires_grad_() for x in channel_maps())
    t = TissueProperties(t1_ms=torch.tensor([800.0, 900, 1000, 1100], dtype=F64), t2_ms=60.0, b1=b1,
                         b1_phase_rad=phase)
    inputs = (magnitudes, phases, b1, phase)

    def loss(signal):
        return (signal.abs() ** 2).sum() + signal.real.sum()

    got = torch.autograd.grad(loss(simulate(shimmed(magnitudes, phases), t, states=STATES, dtype=F64)), inputs)
    want = torch.autograd.grad(loss(play(shimmed(magnitudes, phases), t, states=STATES).signal), inputs)
    for g, w in zip(got, want, strict=True):
        assert rel_max_err(g, w) < 1e-10  # see the module docstring
    plain = TissueProperties(t1_ms=t.t1_ms.detach(), t2_ms=60.0, b1=b1.detach(), b1_phase_rad=phase.detach())
    _, jac = jacobian(shimmed(), plain, ("t1_ms", "t2_ms"), states=STATES, dtype=F64)
    leaf = plain.t1_ms.clone().requires_grad_()
    signal = play(shimmed(), TissueProperties(**{**dict(plain.items()), "t1_ms": leaf}), states=STATES).signal
    d_re = torch.stack([torch.autograd.grad(signal[:, s].real.sum(), leaf, retain_graph=True)[0] for s in range(3)], -1)
    d_im = torch.stack([torch.autograd.grad(signal[:, s].imag.sum(), leaf, retain_graph=True)[0] for s in range(3)], -1)
    assert rel_max_err(jac[:, 0], torch.complex(d_re, d_im)) < 1e-10  # see the module docstring


def test_shims_with_slice_profiles():
    b1, phase = channel_maps(3, seed=2)
    t = TissueProperties(t1_ms=torch.tensor([800.0, 1000, 1200], dtype=F64), t2_ms=60.0, b1=b1, b1_phase_rad=phase)
    description = shimmed(definition_id=1)
    want = play(description, t, states=STATES, across_slice=FINE).signal
    assert rel_max_err(simulate(description, t, states=STATES, dtype=F64, across_slice=FINE), want) < 1e-10


def dynamic_pulse(definition_id=3, bandwidth_hz=0.0):
    t = np.linspace(-1, 1, 120)
    channels = np.stack([np.exp(-8 * t**2), 0.6 * np.exp(-6 * (t - 0.2) ** 2) * np.exp(1.5j * t)])
    return rf_definition(channels, dwell_s=1e-5, definition_id=definition_id, bandwidth_hz=bandwidth_hz)


@pytest.mark.parametrize("across", [None, ExactSliceProfile(7)])
def test_dynamic_ptx_matches_the_oracle_with_gradients(across):
    definitions = {0: ideal_rf_definition(), 3: dynamic_pulse(bandwidth_hz=0.0 if across is None else 8e3)}
    flip = torch.tensor(1.2, dtype=F64, requires_grad=True)

    def description():
        return SequenceDescription.from_operators(
            Excitation(flip, 0.4, definition_id=3), (2e-3, Readout()), (6e-3, Refocusing(2.0, 0.1, definition_id=3)),
            (10e-3, Readout()), rf_definitions=definitions)

    b1, phase = (x.requires_grad_() for x in channel_maps(3, seed=1))
    t = TissueProperties(t1_ms=torch.tensor([800.0, 1000, 1200], dtype=F64), t2_ms=60.0, b1=b1, b1_phase_rad=phase)
    want = play(description(), t, states=STATES, across_slice=across).signal
    got = simulate(description(), t, states=STATES, dtype=F64, across_slice=across)
    assert rel_max_err(got, want) < 1e-12  # see the module docstring
    inputs = (flip, b1, phase)
    g_got = torch.autograd.grad((got.abs() ** 2).sum(), inputs)
    g_want = torch.autograd.grad((want.abs() ** 2).sum(), inputs)
    for g, w in zip(g_got, g_want, strict=True):
        assert rel_max_err(g, w) < 1e-10  # see the module docstring
    assert rel_max_err(simulate(description(), t, states=STATES, across_slice=across), want) < 1e-5  # float32


def test_transmit_refusals():
    b1, phase = channel_maps()
    t = TissueProperties(t1_ms=1000.0, t2_ms=60.0, b1=b1, b1_phase_rad=phase)
    with pytest.raises(ValueError, match="Jacobian along b1 is not available while it carries a channel axis"):
        jacobian(shimmed(), t, ("b1",), states=STATES)
    unshimmed = SequenceDescription.from_operators(
        Excitation(0.5, shim_id=1), (3e-3, Readout()), (5e-3, Refocusing(2.0)), (10e-3, Readout()),
        shim_definitions={1: ShimDefinition(1, [1.0, 1.0], [0.0, 0.0])})
    with pytest.raises(ValueError, match=r"events\[2\] is a pulse without a shim"):
        simulate(unshimmed, t, states=STATES)
    with pytest.raises(ValueError, match="leading channel axis of 2 channels"):
        simulate(shimmed(), TissueProperties(t1_ms=1000.0, t2_ms=60.0, b1=torch.ones(3, 4)), states=STATES)


# ---- the Simulator ----------------------------------------------------------------------------------------
def test_simulators_take_shims_and_slice_profiles():
    b1, phase = channel_maps(3, seed=4)
    t1 = torch.tensor([800.0, 1000, 1200])
    simulator = MRFSimulator.from_description(shimmed(definition_id=1))
    got = simulator.simulate(T1=t1, T2=60.0, B1=b1, B1phase=phase, across_slice=COARSE, states=STATES)
    want = play(simulator.describe(), TissueProperties(t1_ms=t1.double(), t2_ms=60.0, b1=b1, b1_phase_rad=phase),
                states=STATES, across_slice=FINE).signal
    assert rel_max_err(got, want) < 1e-5  # float32 and the default knots (module docstring)
    # A shaped, slice-selective pulse as the MRF train's excitation, resolved across the slice, and again from
    # the second call on (the structure cache resolves the values of a protocol seen twice).
    flips = [10.0, 40.0, 70.0, 30.0]
    mrf = MRFSimulator(flip=flips, TR=8.0, pulse=sinc(definition_id=0), states=STATES)
    first = mrf.simulate(T1=t1, T2=60.0, B1=torch.tensor([1.0, 0.9, 1.1]), across_slice=7)
    again = mrf.simulate(T1=t1, T2=60.0, B1=torch.tensor([1.0, 0.9, 1.1]), across_slice=7)
    torch.testing.assert_close(again, first, rtol=0, atol=0)
    centre = mrf.simulate(T1=t1, T2=60.0, B1=torch.tensor([1.0, 0.9, 1.1]))
    assert rel_max_err(first, centre) > 0.05  # the slice's edges flip less than its centre


def test_profile_knot_slopes_match_autograd():
    """The profile tables' derivative along the flip (the product rule through the composition) against
    autograd through definition_spinor: the same float64 arithmetic reordered, 1e-14."""
    from blochsim.sequence.spinor import definition_spinor, profile_knots

    theta = torch.linspace(0, 2 * math.pi, 9, dtype=F64)
    x = torch.linspace(-1, 1, 5, dtype=F64)
    a, b, da, db = profile_knots(EXC, theta, x)
    leaf = theta.expand(5, -1).clone().requires_grad_()
    want_a, want_b = definition_spinor(EXC, leaf, x[:, None])
    slopes = [torch.autograd.grad(part.sum(), leaf, retain_graph=True)[0]
              for part in (want_a.real, want_a.imag, want_b.real, want_b.imag)]
    torch.testing.assert_close((a, b), (want_a.detach(), want_b.detach()), rtol=0, atol=1e-14)
    torch.testing.assert_close((da, db), (torch.complex(*slopes[:2]), torch.complex(*slopes[2:])), rtol=0,
                               atol=1e-14)


def test_second_order_through_shims_and_profiles():
    """A Hessian-vector product by double backward (the second-order kernel, its dual-number adjoint reading the
    pulse tables' tangents) against autograd-through-autograd on the oracle: through the shim weights, the flips
    of profiled pulses and B1 across the slice."""
    magnitudes = torch.tensor([1.0, 0.5], dtype=F64, requires_grad=True)
    phases = torch.tensor([0.0, 1.0], dtype=F64, requires_grad=True)
    b1, phase = channel_maps(3, seed=5)
    t = TissueProperties(t1_ms=torch.tensor([800.0, 1000, 1200], dtype=F64), t2_ms=60.0, b1=b1, b1_phase_rad=phase)
    direction = (torch.tensor([0.3, -0.2], dtype=F64), torch.tensor([0.1, 0.4], dtype=F64))

    def hvp(run):
        signal = run(shimmed(magnitudes, phases, definition_id=1), t)
        grads = torch.autograd.grad((signal.abs() ** 2).sum(), (magnitudes, phases), create_graph=True)
        return torch.autograd.grad(sum((g * d).sum() for g, d in zip(grads, direction, strict=True)),
                                   (magnitudes, phases))

    got = hvp(lambda d, x: simulate(d, x, states=STATES, dtype=F64, across_slice=FINE))
    want = hvp(lambda d, x: play(d, x, states=STATES, across_slice=FINE).signal)
    for g, w in zip(got, want, strict=True):
        # The interpolant's second derivative along the flip is accurate to O(h^2) only, and less where a flip
        # falls near a knot (seen 1.5e-6 at 512 knots, 3e-8 at 1024; without profiles 2e-15).
        assert rel_max_err(g, w) < 1e-5


def test_channel_maps_are_not_split_across_ranks(tmp_path):
    """Splitting a call over ranks or devices cuts its tissue arrays as voxels; B1's leading channel axis is not
    one, so such a call is refused by name (a one-rank gloo group stands in for torchrun)."""
    import torch.distributed as dist

    import blochsim

    b1, phase = channel_maps()
    simulator = MRFSimulator.from_description(shimmed())
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        with blochsim.distributed(), pytest.raises(NotImplementedError, match="carry a channel axis .* one device"):
            simulator.simulate(T1=torch.full((4,), 900.0), T2=60.0, B1=b1.float(), B1phase=phase.float(),
                               states=STATES)
    finally:
        dist.destroy_process_group()


def test_steady_state_across_the_slice():
    """repetitions='auto' on a slice-resolved train: the positions ride through the playings the steady state
    extrapolates from. Against 1,000 explicit playings: the extrapolation of a winding train is good to about
    1e-5 (the engine's documented accuracy for single-mode trains; seen 5e-6)."""
    description, t = train([0.3, 0.7, 1.2, 0.5]), tissue()
    auto = EpgEngine().simulate(description, t, repetitions="auto", across_slice=COARSE, nstates=STATES).signal
    many = EpgEngine().simulate(description, t, repetitions=1000, across_slice=COARSE, nstates=STATES).signal
    assert rel_max_err(auto, many) < 5e-5


def test_packed_events_keep_their_slice_profile():
    from blochsim.sequence import pack_description

    description, t = spin_echo(), tissue()
    packed = pack_description(description, slice_profile=COARSE, nstates=STATES)
    direct = EpgEngine().simulate(description, t, across_slice=COARSE, nstates=STATES).signal
    torch.testing.assert_close(EpgEngine().simulate(description, t, events=packed).signal, direct, rtol=0, atol=0)
    with pytest.raises(ValueError, match="differs from the slice_profile the events were packed with"):
        EpgEngine().simulate(description, t, events=packed, across_slice=5)
