"""The builders' direct layout (blochsim.sequence.builders) against the operator algebra it stands for.

The builders lay their events out without composing operators (one array check, one event per
event); these tests hold that layout to `SequenceDescription.from_operators` over the operators the
builder docstrings name: the same events (type, action, timestamps, params, value by value and type
by type), the same repetition length, and autograd from the description back to the caller's
tensors. No timings here: the project keeps timed checks out of the unit tests.
"""

import math

import pytest
import torch
from torch.autograd import forward_ad as fwAD

import blochsim.sequence.builders as builders
from blochsim.sequence import (
    AdcRole,
    Delay,
    EventType,
    Excitation,
    FSEReadout,
    Inversion,
    Refocusing,
    RfUse,
    SequenceDescription,
    SPGRReadout,
    SSFPFidReadout,
    fse_description,
    mpnrage_description,
    mprage_description,
    mrf_description,
    spgr_description,
)

F64 = torch.float64
N = 24


def _same(actual, expected, where):
    """Equal value and type; tensors equal in dtype, shape, values and whether they require grad."""
    if isinstance(expected, torch.Tensor):
        assert isinstance(actual, torch.Tensor), f"{where}: {actual!r} is not a tensor, expected {expected!r}"
        assert (actual.dtype, actual.shape, actual.requires_grad) == (
            expected.dtype, expected.shape, expected.requires_grad), f"{where}: {actual!r} vs {expected!r}"
        assert torch.equal(actual.detach(), expected.detach()), f"{where}: {actual!r} vs {expected!r}"
    else:
        assert type(actual) is type(expected) and actual == expected, f"{where}: {actual!r} vs {expected!r}"


def assert_same_description(actual, expected):
    assert len(actual.events) == len(expected.events)
    for i, (a, e) in enumerate(zip(actual.events, expected.events, strict=True)):
        assert a.type is e.type, f"events[{i}].type: {a.type!r} vs {e.type!r}"
        _same(a.action, e.action, f"events[{i}].action")
        _same(a.timestamp_us, e.timestamp_us, f"events[{i}].timestamp_us")
        assert len(a.params) == len(e.params), f"events[{i}].params: {a.params!r} vs {e.params!r}"
        for j, (pa, pe) in enumerate(zip(a.params, e.params, strict=True)):
            _same(pa, pe, f"events[{i}].params[{j}]")
    _same(actual.tr_duration_us, expected.tr_duration_us, "tr_duration_us")
    assert actual.rf_definitions.keys() == expected.rf_definitions.keys() == {0}
    assert actual.shim_definitions == expected.shim_definitions == {}
    assert (actual.subsequence_index, actual.crusher_dephasing_rad, actual.voxel_size_m, actual.rf_raster_time_s) == (
        expected.subsequence_index, expected.crusher_dephasing_rad, expected.voxel_size_m, expected.rf_raster_time_s)


@pytest.fixture
def direct_only(monkeypatch):
    """Fail any builder that falls back to composing operators: the checks below must see the direct layout."""
    def composed(*args, **kwargs):
        raise AssertionError("the builder composed operators instead of laying its events out directly")

    monkeypatch.setattr(builders, "_describe", composed)


def _per_shot(values, count):
    """What the builders split a scalar or array into: `count` copies, or the entries along the last axis."""
    if isinstance(values, torch.Tensor):
        return [values] * count if values.dim() == 0 else list(values.unbind(-1))
    if isinstance(values, list):
        return list(torch.as_tensor(values, dtype=F64).unbind(-1))
    return [float(values)] * count


def _time(value):
    """A duration as `Delay` holds it: a float, or a float64 tensor."""
    return value.to(F64) if isinstance(value, torch.Tensor) else value


def flips(requires_grad=False, dtype=F64):
    values = torch.linspace(0.05, 1.2, N, dtype=F64).to(dtype)
    return values.requires_grad_() if requires_grad else values


MRF_CASES = {
    "tensor": lambda: dict(flip_rad=flips(), repetition_time_s=0.01),
    "tensor-requiring-grad": lambda: dict(flip_rad=flips(True), repetition_time_s=0.01, inversion_time_s=0.02),
    "list": lambda: dict(flip_rad=flips().tolist(), repetition_time_s=8e-3, phases_rad=[0.0, 1.0] * (N // 2)),
    "float32": lambda: dict(flip_rad=flips(dtype=torch.float32), repetition_time_s=7e-3, phases_rad=0.5),
    "per-shot-times": lambda: dict(flip_rad=flips(True), repetition_time_s=torch.linspace(5e-3, 9e-3, N, dtype=F64),
                                   phases_rad=torch.linspace(0, 3, N, dtype=F64, requires_grad=True)),
    "per-shot-times-requiring-grad": lambda: dict(
        flip_rad=flips(), repetition_time_s=torch.linspace(5e-3, 9e-3, N).requires_grad_(),
        inversion_time_s=torch.tensor(0.03, dtype=F64, requires_grad=True)),
    # the moments before the first duration on the graph stay off it, as the operators leave them
    "tensor-delay-then-times-requiring-grad": lambda: dict(
        flip_rad=flips(), repetition_time_s=torch.linspace(5e-3, 9e-3, N, dtype=F64, requires_grad=True),
        inversion_time_s=torch.tensor(0.03, dtype=torch.float32)),
    "per-shot-times-as-a-list": lambda: dict(flip_rad=flips().tolist(), repetition_time_s=[6e-3, 9e-3] * (N // 2)),
    "train-axis": lambda: dict(flip_rad=torch.rand(3, N, dtype=F64), repetition_time_s=0.01, inversion=False,
                               crusher_dephasing_rad=2 * math.pi, voxel_size_m=1e-3),
}


@pytest.mark.parametrize("case", list(MRF_CASES))
def test_mrf_description_matches_the_operators(case, direct_only):
    args = MRF_CASES[case]()
    description = mrf_description(**args)
    a = _per_shot(args["flip_rad"], None)
    n = len(a)
    trs = [_time(tr) for tr in _per_shot(args["repetition_time_s"], n)]
    p = _per_shot(args.get("phases_rad", 0), n)
    head = [Inversion(), Delay(args.get("inversion_time_s", 0))] if args.get("inversion", True) else []
    shots = [Excitation(a[k], p[k]) @ SSFPFidReadout(p[k], duration_s=trs[k]) for k in range(n)]
    expected = SequenceDescription.from_operators(
        *head, *shots, crusher_dephasing_rad=args.get("crusher_dephasing_rad", 0.0),
        voxel_size_m=args.get("voxel_size_m"))
    assert_same_description(description, expected)
    rf = [e for e in description.events if e.type == EventType.RF and e.rf_use == RfUse.EXCITATION]
    assert len(rf) == n and all(torch.equal(e.rf_amplitude_hz, a[k]) for k, e in enumerate(rf))


SPOILED_CASES = {
    "tensor": lambda: dict(flip_rad=flips(), repetition_time_s=6e-3),
    "tensor-requiring-grad": lambda: dict(flip_rad=flips(True), repetition_time_s=6e-3, inversion_time_s=0.4,
                                          phases_rad=torch.rand(N, dtype=F64)),
    "list": lambda: dict(flip_rad=flips().tolist(), repetition_time_s=[5e-3] * N, phases_rad=0.25),
    "scalar": lambda: dict(flip_rad=0.15, repetition_time_s=torch.tensor(6e-3, requires_grad=True)),
}


@pytest.mark.parametrize("case", list(SPOILED_CASES))
def test_mpnrage_description_matches_the_operators(case, direct_only):
    args = SPOILED_CASES[case]()
    description = mpnrage_description(N, **args)
    a = _per_shot(args["flip_rad"], N)
    trs = [_time(tr) for tr in _per_shot(args["repetition_time_s"], N)]
    p = _per_shot(args.get("phases_rad", 0), N)
    shots = [Excitation(a[k], p[k]) @ SPGRReadout(p[k], duration_s=trs[k]) for k in range(N)]
    expected = SequenceDescription.from_operators(Inversion(), Delay(args.get("inversion_time_s", 0)), *shots)
    assert_same_description(description, expected)


@pytest.mark.parametrize("tr_s", [8e-3, torch.tensor(8e-3, dtype=F64, requires_grad=True)])
def test_mprage_description_matches_the_operators(tr_s, direct_only):
    flip = flips(True)
    description = mprage_description(5, N - 5, flip, tr_s, 0.5, phases_rad=0.1)
    roles = [AdcRole.NON_ACQUIRED] * 5 + [AdcRole.SINGLE] + [AdcRole.NON_ACQUIRED] * (N - 6)
    shots = [Excitation(a, 0.1) @ SPGRReadout(0.1, duration_s=tr_s, role=role)
             for a, role in zip(flip.unbind(), roles, strict=True)]
    expected = SequenceDescription.from_operators(Inversion(), Delay(0.5 - 5 * tr_s), *shots)
    assert_same_description(description, expected)


@pytest.mark.parametrize("te_s", [4e-3, torch.tensor(4e-3, dtype=F64, requires_grad=True)])
def test_spgr_description_matches_the_operators(te_s, direct_only):
    flip, phases = flips(True), torch.rand(N, dtype=F64)
    description = spgr_description(flip, 0.01, te_s, phases_rad=phases)
    shots = [Excitation(a, p) @ Delay(te_s) @ SPGRReadout(p, duration_s=0.01 - te_s)
             for a, p in zip(flip.unbind(), phases.unbind(), strict=True)]
    assert_same_description(description, SequenceDescription.from_operators(*shots))


@pytest.mark.parametrize("repetition_time_s", [None, 0.5, torch.tensor(0.5, dtype=F64, requires_grad=True)])
def test_fse_description_matches_the_operators(repetition_time_s, direct_only):
    flip = (torch.rand(2, N, dtype=F64) + 2).requires_grad_()  # (trains, ETL)
    spacing_s = 2 * torch.tensor(5e-3, dtype=F64, requires_grad=True)
    description = fse_description(flip, spacing_s, phases_rad=0.2, repetition_time_s=repetition_time_s)
    half_s = spacing_s / 2
    ops = [Excitation(math.pi / 2, math.pi / 2)]
    ops += [Delay(half_s) @ Refocusing(a, 0.2) @ Delay(half_s) @ FSEReadout(0.2) for a in flip.unbind(-1)]
    if repetition_time_s is not None:
        ops.append(Delay(repetition_time_s - 2 * half_s * N))
    assert_same_description(description, SequenceDescription.from_operators(*ops))


def test_gradients_reach_the_flips_and_durations():
    flip = flips(True)
    tr_s = torch.full((N,), 7e-3, dtype=F64, requires_grad=True)
    description = mrf_description(flip, tr_s, inversion_time_s=0.02)
    rf = [e for e in description.events if e.type == EventType.RF and e.rf_use == RfUse.EXCITATION]
    amplitudes = torch.stack([e.rf_amplitude_hz for e in rf])
    weights = torch.arange(1.0, N + 1, dtype=F64)
    (grad,) = torch.autograd.grad((weights * amplitudes).sum(), flip)
    torch.testing.assert_close(grad, weights)
    # the k-th excitation plays after the inversion delay and the k TRs before it
    (grad,) = torch.autograd.grad(rf[3].timestamp_us, tr_s)
    torch.testing.assert_close(grad, torch.tensor([1e6] * 3 + [0.0] * (N - 3), dtype=F64))
    (grad,) = torch.autograd.grad(description.tr_duration_us, tr_s)
    torch.testing.assert_close(grad, torch.full((N,), 1e6, dtype=F64))
    # float durations give float timestamps, as the operators add them
    assert all(type(e.timestamp_us) is float for e in mrf_description([0.1, 0.2], 0.01).events)


# make_dual loads torch's forward-mode decompositions, which script with torch.jit (deprecated): torch's warning
@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")
def test_forward_mode_tangents_match_the_operators(direct_only):
    """Forward-mode duals in the durations and values: the same events carry tangents, of the same values."""
    def tangents(description):
        values = [description.tr_duration_us]
        for e in description.events:
            values += [e.timestamp_us, *e.params]
        return [fwAD.unpack_dual(v).tangent if isinstance(v, torch.Tensor) else None for v in values]

    with fwAD.dual_level():
        flip = fwAD.make_dual(flips(), torch.ones(N, dtype=F64))
        trs = fwAD.make_dual(torch.full((N,), 8e-3, dtype=F64), torch.arange(N, dtype=F64))
        description = mrf_description(flip, trs, inversion_time_s=torch.tensor(0.02, dtype=F64))
        shots = [Excitation(a, 0.0) @ SSFPFidReadout(0.0, duration_s=tr)
                 for a, tr in zip(flip.unbind(), trs.unbind(), strict=True)]
        expected = SequenceDescription.from_operators(Inversion(), Delay(torch.tensor(0.02, dtype=F64)), *shots)
        got, want = tangents(description), tangents(expected)
    assert [t is None for t in got] == [t is None for t in want]
    assert sum(t is not None for t in got) == N + 4 * (N - 1) + 1  # flips; events after the first TR; the end
    assert all(torch.equal(g, w) for g, w in zip(got, want, strict=True) if g is not None)


@pytest.mark.parametrize(("build", "match"), [
    (lambda: mrf_description([0.1, math.nan, 0.3], 0.01), "flip_rad must be finite"),
    (lambda: mrf_description(torch.tensor([0.1, math.inf], requires_grad=True), 0.01), "flip_rad must be finite"),
    (lambda: mrf_description([0.1, 0.2], [0.01, -0.01]), "duration_s must be a finite time >= 0"),
    (lambda: mrf_description([0.1, 0.2], 0.01, phases_rad=[0.0, math.nan]), "phase_rad must be finite"),
    (lambda: mrf_description([0.1, 0.2], 0.01, inversion_time_s=-1.0), "duration_s must be a finite time >= 0"),
    (lambda: mpnrage_description(2, torch.ones(2, dtype=torch.complex128), 0.01), "flip_rad must be real"),
    (lambda: spgr_description([0.1, math.nan], 0.01, 0.004), "flip_rad must be finite"),
    (lambda: fse_description([3.0, 3.0], 0.01, excitation_flip_rad=math.inf), "flip_rad must be finite"),
    (lambda: fse_description([3.0, 3.0], 0.01, repetition_time_s=0.01), "repetition_time_s"),
    (lambda: mrf_description([0.1, 0.2], 0.01, voxel_size_m=-1.0), "voxel_size_m"),
])
def test_bad_values_raise_the_operators_errors(build, match):
    with pytest.raises(ValueError, match=match):
        build()
