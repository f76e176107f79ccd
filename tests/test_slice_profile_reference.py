"""Slice profiles, spinors and parallel transmit in the float64 oracle (blochsim._reference), held to an
independent Bloch simulation of the same pulses (tests/_bloch_pulses.py: Rodrigues rotations of magnetization
vectors, sample by sample) and to the small-tip Fourier relation.

Tolerances: the oracle (Cayley-Klein pairs composed pairwise, EPG states) and the Bloch simulation (3-vectors,
sample after sample) compute the same thing in float64 along different roundings: a few hundred samples of
|rotation| = 1 each add ~1e-16, so 1e-12 of the largest sample leaves three orders of margin (seen: ~1e-14).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from _bloch_pulses import crush, play_pulse, relax

from blochsim._reference import play
from blochsim.sequence import (
    EventAction,
    ExactSliceProfile,
    Excitation,
    Readout,
    Refocusing,
    SequenceDescription,
    ShimDefinition,
    TissueProperties,
    compose_spinor,
    exact_slice_profile,
    ideal_rf_definition,
    rf_definition,
)

F64 = torch.float64
T1_MS, T2_MS = 800.0, 60.0
DWELL_S = 1e-5


def sinc_pulse(samples=200, lobes=4, *, phase_ramp_rad=0.0, definition_id=1):
    """A Hann-windowed sinc of `lobes` zero crossings each side (time-bandwidth product 2 lobes)."""
    t = np.linspace(-lobes, lobes, samples)
    w = np.sinc(t) * np.hanning(samples + 2)[1:-1] * np.exp(1j * phase_ramp_rad * t / lobes)
    duration = samples * DWELL_S
    return rf_definition(w, dwell_s=DWELL_S, bandwidth_hz=2 * lobes / duration, definition_id=definition_id)


def bloch_gre(definition, flip, phase, positions, te_s, *, b1=1.0):
    """Mean over positions of the sample te_s after the pulse (M0 = 1, from equilibrium)."""
    m = np.zeros((positions.size, 3))
    m[:, 2] = 1
    m = play_pulse(m, definition.complex_envelope(), definition.sample_durations(), flip * b1, phase, positions,
                   definition.bandwidth_hz)
    m = relax(m, te_s, T1_MS, T2_MS)
    return np.mean(m[:, 0] + 1j * m[:, 1])


def test_compose_spinor_matches_rotations():
    # A hard pulse of area t about x: (cos t/2, -i sin t/2).
    a, b = compose_spinor(torch.tensor([0.3, 0.4], dtype=F64), torch.tensor(0.0))
    assert a.dtype == torch.complex128
    torch.testing.assert_close(a, torch.tensor(math.cos(0.35), dtype=torch.complex128), rtol=0, atol=1e-15)
    torch.testing.assert_close(b, torch.tensor(-1j * math.sin(0.35), dtype=torch.complex128), rtol=0, atol=1e-15)
    # Random samples (drive and turn): +z ends where Rodrigues puts it, Mxy = -2 conj(a b), Mz = |a|^2 - |b|^2.
    g = torch.Generator().manual_seed(3)
    drive = torch.randn(7, 3, dtype=torch.complex128, generator=g)
    turn = torch.randn(7, 3, dtype=F64, generator=g)
    a, b = compose_spinor(drive, list(turn))
    from _bloch_pulses import rodrigues
    m = np.zeros((3, 3))
    m[:, 2] = 1
    for k in range(7):
        m = rodrigues(m, np.stack([drive[k].real.numpy(), drive[k].imag.numpy(), turn[k].numpy()], -1))
    mxy, mz = -2 * (a * b).conj(), a.abs() ** 2 - b.abs() ** 2
    np.testing.assert_allclose(mxy.numpy(), m[:, 0] + 1j * m[:, 1], rtol=0, atol=1e-14)  # 7 rotations' rounding
    np.testing.assert_allclose(mz.numpy(), m[:, 2], rtol=0, atol=1e-14)


def test_compose_spinor_inputs_and_derivatives():
    drive = torch.tensor([0.2, 0.0, -0.1j], dtype=torch.complex128)
    a1, b1 = compose_spinor(drive, torch.tensor(0.05, dtype=F64))
    a2, b2 = compose_spinor(iter(list(drive)), [torch.tensor(0.05, dtype=F64)] * 3)  # iterables, one per sample
    torch.testing.assert_close((a1, b1), (a2, b2), rtol=0, atol=0)
    with pytest.raises(ValueError, match="turn_z holds 2 per-sample turns, drive 3 samples"):
        compose_spinor(drive, [0.1, 0.2])
    with pytest.raises(ValueError, match="no samples"):
        compose_spinor(torch.zeros(0, dtype=torch.complex128), 0.0)
    # Differentiable, also through a zero rotation (a zero sample on resonance: the series branch).
    d = torch.tensor([0.3 + 0.1j, 0.0, 0.2j], dtype=torch.complex128, requires_grad=True)
    t = torch.tensor([0.1, 0.0, -0.2], dtype=F64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda d, t: torch.view_as_real(torch.stack(compose_spinor(d, list(t)))),
                                    (d, t))


def test_exact_slice_profile():
    assert torch.equal(ExactSliceProfile().positions(), torch.linspace(-1, 1, 21, dtype=F64))
    assert torch.equal(exact_slice_profile(1).positions(), torch.zeros(1, dtype=F64))
    assert torch.equal(exact_slice_profile(torch.tensor([0.1, -0.2], dtype=F64)).positions(),
                       torch.tensor([0.1, -0.2], dtype=F64))
    assert ExactSliceProfile(5) == exact_slice_profile(5, extent=2.0)
    for bad, match in ((0, "points must be an int >= 1"), (2.5, "points must be an int"),
                       (torch.zeros(0), "non-empty 1-D")):
        with pytest.raises(ValueError, match=match):
            ExactSliceProfile(bad)
    with pytest.raises(ValueError, match="bins must be an int >= 2"):
        ExactSliceProfile(5, bins=1)
    with pytest.raises(ValueError, match="theta_max must be a finite number > 0"):
        ExactSliceProfile(5, theta_max=-1.0)


def gre(definition, flip, phase, te_s):
    return SequenceDescription.from_operators(
        Excitation(flip, phase, definition_id=definition.id), (te_s, Readout()),
        rf_definitions={0: ideal_rf_definition(), definition.id: definition})


@pytest.mark.parametrize("flip_deg, phase_ramp", [(20.0, 0.0), (90.0, 0.0), (150.0, 2.0)])
def test_slice_resolved_excitation_matches_bloch(flip_deg, phase_ramp):
    definition = sinc_pulse(phase_ramp_rad=phase_ramp)
    flip, phase, te = math.radians(flip_deg), 0.3, 4e-3
    profile = ExactSliceProfile(points=torch.linspace(-1.2, 1.2, 25, dtype=F64))
    b1 = torch.tensor([1.0, 0.8], dtype=F64)
    tissue = TissueProperties(t1_ms=T1_MS, t2_ms=T2_MS, b1=b1)
    got = play(gre(definition, flip, phase, te), tissue, states=4, across_slice=profile).signal
    want = [bloch_gre(definition, flip, phase, profile.positions().numpy(), te, b1=float(x)) for x in b1]
    np.testing.assert_allclose(got[:, 0].numpy(), want, rtol=0, atol=1e-12)  # see the module docstring


def test_slice_resolved_spin_echo_matches_bloch():
    """Slice-selective 90 and 180 with crushers: every pathway of the refocusing pulse's profile."""
    exc, ref = sinc_pulse(definition_id=1), sinc_pulse(160, 3, definition_id=2)
    te = 10e-3
    description = SequenceDescription.from_operators(
        Excitation(math.pi / 2, math.pi / 2, definition_id=1),
        (te / 2, Refocusing(2.6, 0.0, definition_id=2)),  # 149 deg: the FID and stimulated pathways survive
        (te, Readout()), (1.5 * te, Refocusing(2.6, 0.0, definition_id=2)), (2 * te, Readout()),
        rf_definitions={0: ideal_rf_definition(), 1: exc, 2: ref})
    positions = np.linspace(-1, 1, 13)
    got = play(description, TissueProperties(t1_ms=T1_MS, t2_ms=T2_MS), states=8,
               across_slice=ExactSliceProfile(torch.from_numpy(positions))).signal

    spins = 16  # crusher grid: exact for every order below 16 (the train reaches order 4)
    zeta = 2 * math.pi * np.arange(spins) / spins
    m = np.zeros((positions.size, spins, 3))
    m[..., 2] = 1

    def pulse(m, d, flip, phase):
        return play_pulse(m, d.complex_envelope(), d.sample_durations(), flip, phase, positions, d.bandwidth_hz)

    samples = []
    m = pulse(m, exc, math.pi / 2, math.pi / 2)
    for _ in range(2):
        m = relax(m, te / 2, T1_MS, T2_MS)
        m = pulse(crush(m, zeta[None, :]), ref, 2.6, 0.0)  # Refocusing: crushed before and after
        m = relax(crush(m, zeta[None, :]), te / 2, T1_MS, T2_MS)
        samples.append(np.mean(m[..., 0] + 1j * m[..., 1]))
    np.testing.assert_allclose(got.numpy(), samples, rtol=0, atol=1e-12)  # see the module docstring


def test_small_tip_fourier_relation():
    """At a small flip the profile is the Fourier transform of the envelope (Pauly 1989): sample k, tipped at
    its middle t_k, precesses at x BW from there to the pulse middle, and its own span averages the turn
    (sinc(x BW dt))."""
    definition = sinc_pulse(phase_ramp_rad=1.0)
    theta = 1e-4
    positions = torch.linspace(-1.5, 1.5, 31, dtype=F64)
    result = play(gre(definition, theta, 0.0, 0.0), TissueProperties(t1_ms=T1_MS, t2_ms=T2_MS), states=2,
                  across_slice=ExactSliceProfile(positions))
    got = result.fplus[:, 0, 0].numpy()  # F+(0) at each position, right after the pulse
    w, dt = definition.complex_envelope(), definition.sample_durations()
    t_mid = np.cumsum(dt) - dt / 2
    f = positions.numpy()[:, None] * definition.bandwidth_hz
    phase = np.exp(-2j * math.pi * f * (dt.sum() / 2 - t_mid))
    want = -1j * theta * (2 * math.pi * w * dt * phase * np.sinc(f * dt)).sum(-1)
    # The relation is first order: the next term is of order theta^3 relative to theta (1e-8); 1e-7 of theta.
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-7 * theta)
    # A windowed sinc of BW selects the slice [-1/2, 1/2]: inside flat, outside nearly nothing.
    profile = np.abs(got) / theta
    x = positions.numpy()
    assert profile[np.abs(x) <= 0.2].min() > 0.95 and profile[np.abs(x) >= 0.9].max() < 0.05


def test_without_across_slice_profiled_pulses_turn_by_their_integral():
    definition = sinc_pulse()
    tissue = TissueProperties(t1_ms=T1_MS, t2_ms=T2_MS)
    centre = play(gre(definition, 1.0, 0.0, 1e-3), tissue, states=2).signal
    # The definition's float32 shapes leave |I| 1e-9 off 1/(2 pi): the hard pulse takes its exact flip.
    flip, extra = definition.signed_flip(1.0)
    ideal = play(gre(ideal_rf_definition(1), flip, extra, 1e-3), tissue, states=2).signal
    torch.testing.assert_close(centre, ideal, rtol=0, atol=1e-15)
    # One position at the centre: a real, symmetric envelope referenced to its middle turns by its integral.
    one = play(gre(definition, 1.0, 0.0, 1e-3), tissue, states=2, across_slice=1).signal
    torch.testing.assert_close(one, ideal, rtol=0, atol=1e-13)  # 200 composed samples' rounding


@pytest.mark.parametrize("bad, error, match", [(0, ValueError, "int >= 1"), (1.5, TypeError, "across_slice must be"),
                                               ("21", TypeError, "across_slice must be")])
def test_across_slice_checked(bad, error, match):
    with pytest.raises(error, match=match):
        play(gre(sinc_pulse(), 1.0, 0.0, 1e-3), TissueProperties(t1_ms=T1_MS, t2_ms=T2_MS), states=2,
             across_slice=bad)


# ---- parallel transmit ------------------------------------------------------------------------------------
def shimmed(shim_ids=(1, 2)):
    shims = {1: ShimDefinition(1, [1.0, 0.5], [0.0, 1.0]), 2: ShimDefinition(2, [0.3, 0.9], [0.5, -0.4])}
    return SequenceDescription.from_operators(
        Excitation(0.7, 0.2, shim_id=shim_ids[0]), (3e-3, Readout()),
        (5e-3, Refocusing(2.4, 0.0, shim_id=shim_ids[1])), (10e-3, Readout()),
        shim_definitions=shims), shims


def test_static_shims_are_the_weighted_channel_field():
    description, shims = shimmed()
    g = torch.Generator().manual_seed(0)
    b1 = 0.5 + torch.rand(2, 4, dtype=F64, generator=g)  # (channels, voxels)
    b1_phase = torch.rand(2, 4, dtype=F64, generator=g) * 2
    tissue = TissueProperties(t1_ms=T1_MS, t2_ms=T2_MS, b1=b1, b1_phase_rad=b1_phase)
    got = play(description, tissue, states=6).signal
    # By hand: each event as a single-channel pulse with B1 = |field| and B1phase = arg(field).
    want = []
    for v in range(4):
        samples = []
        for which in (0, 1):
            field = (shims[which + 1].weights().to(torch.complex128) * torch.polar(b1[:, v], b1_phase[:, v])).sum()
            samples.append(field)
        ev = [SequenceDescription.from_operators(Excitation(0.7 * float(samples[0].abs()),
                                                            0.2 + float(samples[0].angle())), (3e-3, Readout()),
                                                 (5e-3, Refocusing(2.4 * float(samples[1].abs()),
                                                                   float(samples[1].angle()))), (10e-3, Readout()))]
        want.append(play(ev[0], TissueProperties(t1_ms=T1_MS, t2_ms=T2_MS), states=6).signal)
    torch.testing.assert_close(got, torch.stack(want), rtol=0, atol=1e-14)  # the same arithmetic, reordered


def test_static_shim_gradients_reach_the_weights():
    description, _ = shimmed()
    magnitudes = torch.tensor([1.0, 0.5], dtype=F64, requires_grad=True)
    phases = torch.tensor([0.0, 1.0], dtype=F64, requires_grad=True)
    b1 = torch.tensor([[0.9, 1.1], [1.2, 0.7]], dtype=F64)

    def signal(m, p):
        shims = dict(description.shim_definitions)
        shims[1] = ShimDefinition(1, m, p)
        d = SequenceDescription(0, description.tr_duration_us, description.events, description.rf_definitions, shims)
        return torch.view_as_real(play(d, TissueProperties(t1_ms=T1_MS, t2_ms=T2_MS, b1=b1), states=6).signal)

    assert torch.autograd.gradcheck(signal, (magnitudes, phases))


def test_transmit_errors():
    description, _ = shimmed()
    tissue = TissueProperties(t1_ms=T1_MS, t2_ms=T2_MS, b1=torch.ones(3, 2, dtype=F64))
    with pytest.raises(ValueError, match="leading channel axis of 2 channels"):
        play(description, tissue, states=4)
    with pytest.raises(ValueError, match="without a shim"):
        play(shimmed((1, 0))[0], TissueProperties(t1_ms=T1_MS, t2_ms=T2_MS, b1=torch.ones(2, 2)), states=4)
    missing = SequenceDescription.from_operators(Excitation(0.5, shim_id=7), (1e-3, Readout()))
    with pytest.raises(ValueError, match="shim_id=7, which shim_definitions does not hold"):
        play(missing, TissueProperties(t1_ms=T1_MS, t2_ms=T2_MS), states=4)


def dynamic_pulse(definition_id=3):
    t = np.linspace(-1, 1, 120)
    channels = np.stack([np.exp(-8 * t**2), 0.6 * np.exp(-6 * (t - 0.2) ** 2) * np.exp(1.5j * t)])
    return rf_definition(channels, dwell_s=DWELL_S, definition_id=definition_id)


def test_dynamic_ptx_matches_bloch():
    definition = dynamic_pulse()
    assert definition.channel_count == 2
    g = torch.Generator().manual_seed(1)
    b1 = 0.5 + torch.rand(2, 3, dtype=F64, generator=g)
    b1_phase = torch.rand(2, 3, dtype=F64, generator=g) * 3
    flip, phase, te = 1.2, 0.4, 2e-3
    description = SequenceDescription.from_operators(
        Excitation(flip, phase, definition_id=3), (te, Readout()),
        rf_definitions={0: ideal_rf_definition(), 3: definition})
    got = play(description, TissueProperties(t1_ms=T1_MS, t2_ms=T2_MS, b1=b1, b1_phase_rad=b1_phase),
               states=2).signal
    sensitivities = torch.polar(b1, b1_phase).numpy()
    m = np.zeros((1, 3, 3))
    m[..., 2] = 1
    m = play_pulse(m, definition.channel_envelopes(), definition.sample_durations(), flip, phase, np.zeros(1), 0.0,
                   channel_weights=sensitivities)
    m = relax(m, te, T1_MS, T2_MS)
    np.testing.assert_allclose(got[:, 0].numpy(), (m[0, :, 0] + 1j * m[0, :, 1]), rtol=0, atol=1e-12)
    with pytest.raises(ValueError, match="must carry a leading channel axis of 2 channels"):
        play(description, TissueProperties(t1_ms=T1_MS, t2_ms=T2_MS, b1=torch.ones(3, dtype=F64)), states=2)
    with pytest.raises(NotImplementedError, match="semisolid pool by a dynamic pTx pulse"):
        play(description, TissueProperties(t1_ms=T1_MS, t2_ms=T2_MS, b1=b1, bound_fraction=0.1), states=2)


def test_crusher_action_constant():
    # The spin echo test's Refocusing crushes before and after (its default): pinned here, since the Bloch
    # reference above plays a crusher on each side.
    (event,) = Refocusing(1.0).emit(0.0)
    assert event.action == EventAction.CRUSH_BEFORE | EventAction.CRUSH_AFTER
