"""`ModelOperator`: dot-product tests <A_jvp u, w> = <u, A_vjp w> in float64, the Jacobian against central
differences, the variable maps (bounds, scale), `initial`/`split`, `select`, subspace outputs and `execution=`.

The inner product is the real one, <a, b> = Re sum conj(a) b. Dot-product bound 1e-12 relative: both sides are
the same float64 derivatives contracted in another order (~1e-15 seen). Central differences: step 1e-6 of a
free variable of order 1, truncation ~1e-12, rounding ~1e-16/1e-6; bound 1e-7 of the largest entry.
"""

from __future__ import annotations

import pytest
import torch
from conftest import rel_max_err

import blochsim
from blochsim import ModelOperator, Subspace
from blochsim.simulators import InversionRecoverySimulator, MRFSimulator

F64 = torch.float64
FLIP = torch.cat([torch.linspace(5, 60, 20), torch.linspace(60, 5, 20)]).to(F64)


def inner(a, b):
    return (a.conj() * b).real.sum()


def mrf(**kw):
    return MRFSimulator(flip=FLIP, TR=10.0, states=10, **kw).bind(dtype=F64)


def operators():
    """(name, operator, x) of every kind the tests cover."""
    g = torch.Generator().manual_seed(1)
    t1 = torch.linspace(300.0, 2000.0, 6, dtype=F64)
    t2 = torch.linspace(30.0, 200.0, 6, dtype=F64)
    amplitude = torch.complex(torch.rand(6, dtype=F64, generator=g) + 0.5, torch.rand(6, dtype=F64, generator=g))
    two_sided = ModelOperator(mrf(), "T1", "T2", bounds={"T1": (100.0, 4000.0), "T2": (5.0, 500.0)})
    one_sided = ModelOperator(mrf(), "T1", "T2", bounds={"T1": (100.0, None), "T2": (None, 500.0)},
                              scale={"T1": 500.0, "T2": 50.0})
    free = ModelOperator(mrf(B1=torch.linspace(0.8, 1.1, 6, dtype=F64)), "T1", "T2", scale={"T1": 1000, "T2": 100})
    dictionary = mrf().simulate(T1=torch.linspace(200.0, 3000.0, 40, dtype=F64)[:, None],
                                T2=torch.linspace(10.0, 300.0, 15, dtype=F64))
    projected = ModelOperator(mrf(), "T1", "T2", bounds={"T1": (100.0, 4000.0), "T2": (5.0, 500.0)},
                              subspace=Subspace.fit(dictionary, rank=5))
    closed = ModelOperator(InversionRecoverySimulator(TI=torch.tensor([50.0, 200.0, 600.0, 1500.0], dtype=F64)), "T1",
                           bounds={"T1": (10.0, 5000.0)})
    no_amplitude = ModelOperator(mrf(), "T1", "T2", bounds={"T1": (100.0, 4000.0), "T2": (5.0, 500.0)},
                                 amplitude=False)
    out = []
    for name, op in (("two_sided", two_sided), ("one_sided", one_sided), ("free", free), ("subspace", projected),
                     ("no_amplitude", no_amplitude)):
        values = {"T1": t1, "T2": t2} | ({"amplitude": amplitude} if op.amplitude else {})
        out.append((name, op, op.initial((6,), **values)))
    out.append(("closed_form", closed, closed.initial((6,), T1=t1, amplitude=amplitude)))
    return out


CASES = operators()


@pytest.mark.parametrize(("name", "op", "x"), CASES, ids=[c[0] for c in CASES])
def test_dot_product(name, op, x):
    g = torch.Generator().manual_seed(2)
    y = op(x)
    assert y.dtype == torch.complex128 and x.dtype == F64
    u = torch.randn(x.shape, dtype=F64, generator=g)
    w = torch.complex(torch.randn(y.shape, dtype=F64, generator=g), torch.randn(y.shape, dtype=F64, generator=g))
    left, right = inner(op.A_jvp(x, u), w), (u * op.A_vjp(x, w)).sum()
    assert abs(float(left - right)) <= 1e-12 * abs(float(left))


@pytest.mark.parametrize(("name", "op", "x"), CASES, ids=[c[0] for c in CASES])
def test_jvp_and_jacobian_match_differences(name, op, x):
    g = torch.Generator().manual_seed(4)
    u = torch.randn(x.shape, dtype=F64, generator=g)
    h = 1e-6
    fd = (op(x + h * u) - op(x - h * u)) / (2 * h)
    jvp = op.A_jvp(x, u)
    assert rel_max_err(jvp, fd) < 1e-7
    J = op.jacobian(x)
    assert J.shape == x.shape + y_last(op, x)
    assert rel_max_err((u[..., None] * J).sum(-2), jvp) < 1e-12  # the same columns


def y_last(op, x):
    return op(x).shape[-1:]


def test_channels_split_and_initial():
    op = ModelOperator(mrf(), "T1", "T2", bounds={"T1": (100.0, 4000.0), "T2": (5.0, None)}, scale={"T2": 20.0})
    assert op.names == ("T1", "T2", "amplitude.real", "amplitude.imag") and op.channels == 4
    x = op.initial((3,), T1=torch.tensor([500.0, 1000.0, 3000.0], dtype=F64), T2=80.0, amplitude=0.5 - 0.2j)
    values = op.split(x)
    torch.testing.assert_close(values["T1"], torch.tensor([500.0, 1000.0, 3000.0], dtype=F64))
    torch.testing.assert_close(values["T2"], torch.full((3,), 80.0, dtype=F64))
    torch.testing.assert_close(values["amplitude"], torch.full((3,), 0.5 - 0.2j, dtype=torch.complex128))
    mid = op.initial((2,), T2=80.0)  # T1 left out: mid-bound
    torch.testing.assert_close(op.split(mid)["T1"], torch.full((2,), 2050.0))
    assert torch.equal(op.split(mid)["amplitude"], torch.ones(2, dtype=torch.complex64))
    with pytest.raises(ValueError, match="needs a value of 'T2'"):
        op.initial((2,))
    with pytest.raises(ValueError, match="not strictly inside"):
        op.initial((1,), T1=100.0, T2=80.0)
    with pytest.raises(ValueError, match="must end in 4 channels"):
        op(torch.zeros(3, 3))


def test_select_indexes_bound_maps():
    b1 = torch.linspace(0.8, 1.2, 5, dtype=F64)
    low = torch.linspace(100.0, 300.0, 5, dtype=F64)
    op = ModelOperator(mrf(B1=b1), "T1", "T2", bounds={"T1": (low, 4000.0), "T2": (5.0, 500.0)})
    x = op.initial((5,), T1=torch.linspace(400.0, 2000.0, 5, dtype=F64), T2=60.0)
    keep = torch.tensor([True, False, True, False, True])
    part = op.select(keep)
    torch.testing.assert_close(part(x[keep]), op(x)[keep], rtol=0, atol=1e-14)  # the same voxels' physics
    torch.testing.assert_close(part.split(x[keep])["T1"], op.split(x)["T1"][keep])
    as_numpy = ModelOperator(mrf(B1=b1.numpy()), "T1", "T2", bounds={"T1": (low, 4000.0), "T2": (5.0, 500.0)})
    torch.testing.assert_close(as_numpy.select(keep)(x[keep]), op(x)[keep], rtol=0, atol=1e-14)  # NumPy maps too


def test_execution_setting_and_top_level():
    """execution= reaches every simulation: a host policy gives the same numbers as none (CPU tensors)."""
    op = ModelOperator(mrf(T2=80.0), "T1", bounds={"T1": (100.0, 4000.0)}, execution=blochsim.execution("cpu"))
    x = op.initial((4,), T1=torch.linspace(300.0, 2000.0, 4, dtype=F64))
    plain = ModelOperator(mrf(T2=80.0), "T1", bounds={"T1": (100.0, 4000.0)})
    assert torch.equal(op(x), plain(x))
    assert torch.equal(op.A_vjp(x, op(x)), plain.A_vjp(x, plain(x)))
    assert blochsim.ModelOperator is ModelOperator and isinstance(op, torch.nn.Module)


def test_constructor_errors():
    with pytest.raises(ValueError, match="'T7' is not a property"):
        ModelOperator(mrf(), "T7")
    with pytest.raises(ValueError, match="not an unknown"):
        ModelOperator(mrf(), "T1", bounds={"T2": (1.0, 2.0)})
    with pytest.raises(ValueError, match="low must be below high"):
        ModelOperator(mrf(), "T1", bounds={"T1": (2000.0, 100.0)})
    with pytest.raises(ValueError, match="two-sided bound sets the step"):
        ModelOperator(mrf(), "T1", bounds={"T1": (100.0, 4000.0)}, scale={"T1": 10.0})
    with pytest.raises(ValueError, match="at least one unknown"):
        ModelOperator(mrf(), amplitude=False)


def test_physics_needs_deepinv():
    op = ModelOperator(mrf(T2=80.0), "T1", bounds={"T1": (100.0, 4000.0)})
    try:
        import deepinv  # noqa: F401
    except ImportError:
        with pytest.raises(ImportError, match="pip install deepinv"):
            op.physics()
        return
    physics = op.physics()
    x = torch.movedim(op.initial((2, 3, 4), T1=900.0), -1, 1)  # (batch, channels, *xyz)
    y = physics.A(x)
    assert y.shape == (2, 40, 3, 4)
    w = torch.randn(y.shape, dtype=y.dtype)
    u = torch.randn(x.shape, dtype=x.dtype)
    left = (torch.movedim(op.A_jvp(torch.movedim(x, 1, -1), torch.movedim(u, 1, -1)), -1, 1).conj() * w).real.sum()
    assert abs(float(left - (u * physics.A_vjp(x, w)).sum())) <= 1e-10 * abs(float(left))
