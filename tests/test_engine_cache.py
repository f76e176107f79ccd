"""Programs kept on their descriptions: reused only while nothing is differentiated; the GPU's expm series."""

import math

import torch

from blochsim import engine
from blochsim.engine.pools import expm
from blochsim.engine.program import compile_program
from blochsim.sequence import TissueProperties, mrf_description

FLIPS = torch.deg2rad(torch.linspace(5, 60, 40, dtype=torch.float64))
TISSUE = TissueProperties(t1_ms=torch.tensor([800.0, 1200.0]), t2_ms=torch.tensor([60.0, 90.0]))


def test_constant_program_is_reused_with_its_device_values():
    d = mrf_description(FLIPS, 0.01)
    p1 = compile_program(d, states=16)
    p2 = compile_program(d, states=16)
    assert p2.flip_rad is p1.flip_rad and p2.bound is p1.bound  # one compilation, copies handed out
    assert compile_program(d, states=17).flip_rad is not p1.flip_rad  # other arguments, other program
    first = engine.simulate(d, TISSUE, states=16)
    assert p1.bound, "the values moved to the device are kept on the program"
    again = engine.simulate(d, TISSUE, states=16)
    assert torch.equal(first, again)


def test_a_copy_with_other_values_does_not_reuse_the_device_values():
    import dataclasses

    from blochsim.engine.bind import event_inputs
    d = mrf_description(FLIPS, 0.01)
    p = compile_program(d, states=16)
    cpu = torch.device("cpu")
    event_inputs(p, None, torch.float32, cpu)
    half = dataclasses.replace(p, flip_rad=p.flip_rad / 2)
    inputs = event_inputs(half, None, torch.float32, cpu)
    assert torch.allclose(inputs[2].double(), p.flip_rad / 2)
    p.num_states = 8  # a caller's own copy: the kept program is not changed
    assert compile_program(d, states=16).num_states == 16


def test_differentiated_program_is_compiled_every_call_and_carries_gradients():
    flips = FLIPS.clone().requires_grad_()
    d = mrf_description(flips, 0.01)
    assert compile_program(d, states=16) is not compile_program(d, states=16)
    g = []
    for _ in range(2):  # a kept graph would fail the second backward
        s = engine.simulate(d, TISSUE, states=16)
        g.append(torch.autograd.grad(s.abs().square().sum(), flips)[0])
    assert torch.equal(g[0], g[1]) and g[0].abs().sum() > 0


def test_no_grad_compilation_is_not_kept_for_later_gradients():
    flips = FLIPS.clone().requires_grad_()
    d = mrf_description(flips, 0.01)
    with torch.no_grad():
        engine.simulate(d, TISSUE, states=16)
    s = engine.simulate(d, TISSUE, states=16)
    assert s.requires_grad


def test_expm_matmul_series_matches_entrywise_and_matrix_exp():
    g = torch.Generator().manual_seed(1)
    a = torch.randn(64, 4, 4, dtype=torch.float64, generator=g) * 3
    ref = torch.linalg.matrix_exp(a)
    entry, mat = expm(a, matmul=False), expm(a, matmul=True)
    # Same series in another order: they agree to rounding; matrix_exp to its own ~1e-11 here.
    assert (entry - mat).abs().max() < 1e-12 * ref.abs().max()
    assert (mat - ref).abs().max() < 1e-9 * ref.abs().max()
    c = torch.complex(a, a.flip(-1)) * (1 / math.sqrt(2))
    assert (expm(c, matmul=True) - torch.linalg.matrix_exp(c)).abs().max() < 1e-9 * c.abs().max().exp()


def test_kept_tissue_packing_follows_in_place_changes_and_new_tensors():
    from blochsim.simulators import MRFSimulator
    sim = MRFSimulator(TR=10.0)
    flips = torch.linspace(5, 60, 20)
    T1, T2 = torch.tensor([800.0, 1200.0]), torch.tensor([60.0, 90.0])
    first = sim.simulate(flip=flips, T1=T1, T2=T2)
    assert torch.equal(sim.simulate(flip=flips, T1=T1, T2=T2), first)  # the kept packing serves it
    T1[0] = 400.0  # in place: the version counter moves, the tissue is packed again
    changed = sim.simulate(flip=flips, T1=T1, T2=T2)
    fresh = MRFSimulator(TR=10.0).simulate(flip=flips, T1=T1.clone(), T2=T2.clone())
    assert torch.equal(changed, fresh) and not torch.equal(changed[0], first[0])
    T2[1] = math.nan  # the checks run again on a changed map
    try:
        sim.simulate(flip=flips, T1=T1, T2=T2)
    except ValueError as error:
        assert "T2" in str(error)
    else:
        raise AssertionError("a NaN T2 written in place was not caught")
    other = torch.tensor([60.0, 70.0])  # another tensor object
    assert torch.equal(sim.simulate(flip=flips, T1=T1, T2=other),
                       MRFSimulator(TR=10.0).simulate(flip=flips, T1=T1.clone(), T2=other.clone()))


def test_the_kernel_runs_without_autograd_only_when_nothing_is_differentiated():
    from blochsim.simulators import MRFSimulator
    sim = MRFSimulator(TR=10.0)
    flips = torch.linspace(5, 60, 20)
    T1 = torch.tensor([800.0, 1200.0])
    plain = sim.simulate(flip=flips, T1=T1, T2=60.0)
    assert plain.grad_fn is None
    T1g = T1.clone().requires_grad_()
    for _ in range(2):  # the same tissue twice: a packing with a derivative is never kept
        out = sim.simulate(flip=flips, T1=T1g, T2=60.0)
        assert out.grad_fn is not None
        (grad,) = torch.autograd.grad(out.real.sum(), T1g)
        assert torch.isfinite(grad).all() and (grad != 0).all()
    flips_g = flips.clone().requires_grad_()
    assert sim.simulate(flip=flips_g, T1=T1, T2=60.0).grad_fn is not None
    assert torch.equal(sim.simulate(flip=flips_g, T1=T1, T2=60.0).detach(), plain)


def test_pool_tables_are_kept_for_the_same_tissue_and_rebuilt_when_it_changes():
    from blochsim.engine.pools import pool_tables
    from blochsim.engine.tissue import pack_tissue
    d = mrf_description(FLIPS, 0.01)
    fraction = torch.tensor([0.1, 0.2])
    tissue = TissueProperties(t1_ms=TISSUE.t1_ms, t2_ms=TISSUE.t2_ms, pool_b_fraction=fraction,
                              pool_b_exchange_hz=10.0, t1_pool_b_ms=500.0, t2_pool_b_ms=20.0)
    program = compile_program(d, states=16)

    def tables():
        lengths = torch.tensor([0.01, 0.0], dtype=torch.float64)  # a fresh tensor each call, as the engine's
        return pool_tables(dict(tissue.items()), pack_tissue(tissue).pools, (2,), lengths, program.sat_per_rad2,
                           program.rf_hz, "super-lorentzian")

    first = engine.simulate(d, tissue, states=16)
    kept = tables()
    assert tables() is kept
    fraction[1] = 0.05  # in place: the tables are built again
    assert tables() is not kept
    changed = engine.simulate(d, tissue, states=16)
    fresh = engine.simulate(d, TissueProperties(**{**dict(tissue.items()), "pool_b_fraction": fraction.clone()}),
                            states=16)
    assert torch.equal(changed, fresh) and not torch.equal(changed[1], first[1])
    torch.testing.assert_close(changed[0], first[0])
    f = fraction.clone().requires_grad_()  # a differentiated pool property is never served kept tables
    for _ in range(2):
        out = engine.simulate(d, TissueProperties(**{**dict(tissue.items()), "pool_b_fraction": f}), states=16)
        (g,) = torch.autograd.grad((out.abs() ** 2).sum(), f)
        assert (g != 0).all()


def test_engine_calls_follow_in_place_changes_of_kept_tissue():
    d = mrf_description(FLIPS, 0.01)
    for extra in ({}, dict(pool_b_fraction=0.1, pool_b_exchange_hz=10.0, t1_pool_b_ms=500.0, t2_pool_b_ms=20.0)):
        t1 = torch.tensor([800.0, 1200.0])
        tissue = TissueProperties(t1_ms=t1, t2_ms=TISSUE.t2_ms, **extra)
        first = engine.simulate(d, tissue, states=16)
        assert torch.equal(engine.simulate(d, tissue, states=16), first)
        t1[1] = 300.0  # in place: packing and tables are made again
        fresh = engine.simulate(d, TissueProperties(t1_ms=t1.clone(), t2_ms=TISSUE.t2_ms, **extra), states=16)
        changed = engine.simulate(d, tissue, states=16)
        assert torch.equal(changed, fresh) and not torch.equal(changed[1], first[1])
        t1[0] = math.nan
        try:
            engine.simulate(d, tissue, states=16)
        except ValueError as error:
            assert "t1" in str(error).lower()
        else:
            raise AssertionError("a NaN T1 written in place was not caught")


def test_a_kept_tissue_object_misses_on_in_place_numbers_and_on_requires_grad():
    # The same TissueProperties object skips walking its fields (LastResult.kept_for): its tensors' versions,
    # a 0-d CPU tensor's too (lookup matches those by value), and requires_grad decide. T2 in float64: the
    # packing holds a float32 copy of it, not a view that would follow the change anyway.
    d = mrf_description(FLIPS, 0.01)
    t1, t2 = torch.tensor([800.0, 1200.0]), torch.tensor(60.0, dtype=torch.float64)
    tissue = TissueProperties(t1_ms=t1, t2_ms=t2)
    first = engine.simulate(d, tissue, states=16)
    assert torch.equal(engine.simulate(d, tissue, states=16), first)
    t2.fill_(30.0)
    changed = engine.simulate(d, tissue, states=16)
    assert torch.equal(changed, engine.simulate(d, TissueProperties(t1_ms=t1.clone(), t2_ms=30.0), states=16))
    assert not torch.equal(changed, first)
    t1.requires_grad_()
    assert engine.simulate(d, tissue, states=16).grad_fn is not None
