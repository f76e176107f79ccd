"""`blochsim.optim.crlb` against independent numbers.

1. The inverse Fisher information computed here in float64 from a central-difference Jacobian of the oracle
   (`blochsim._reference.play`), for MRF, FSE and SPGR trains, against `crlb` of the engine's forward-mode
   Jacobian (float64 kernels).
2. DESPOT1 (SPGR at two flip angles, unknowns M0 and T1): the published error propagation of the two-angle
   T1 estimate, derived below.
3. The options (known, of, names, noise_variance, singular) and the errors.

Tolerance 1e-4 relative (the issue's bound) against the finite-difference reference: central differences
with a step of 1e-5 of the value have truncation error ~(1e-5)^2 relative and rounding ~1e-16/1e-5 = 1e-11,
and the inversion amplifies both by the Fisher matrix's condition number (equilibrated, at most ~1e3 here),
so the reference itself is good to ~1e-7; the engine's float64 Jacobian is within ~1e-13 of the oracle's.
"""

from __future__ import annotations

import math

import pytest
import torch
from conftest import rel_max_err

from blochsim._reference import play
from blochsim.optim import crlb, fisher_information
from blochsim.sequence import TissueProperties, spgr_description
from blochsim.simulators import FSESimulator, MRFSimulator, SPGRSimulator

F64 = torch.float64
FD_REL = 1e-4
FD_STEP = 1e-5  # relative to each property's value (see the module docstring)


def oracle_jacobian(signal_of, fields: dict, names: tuple) -> torch.Tensor:
    """Central differences of `signal_of(fields) (*voxel, S)` along each field in `names`: (*voxel, P, S)."""
    columns = []
    for name in names:
        value = torch.as_tensor(fields[name], dtype=F64)
        h = FD_STEP * value.abs()
        up, down = dict(fields), dict(fields)
        up[name], down[name] = value + h, value - h
        columns.append((signal_of(up) - signal_of(down)) / (2 * h)[..., None])
    return torch.stack(columns, -2)


def inverse_fisher_diagonal(J: torch.Tensor, sigma2: float) -> torch.Tensor:
    """diag((Re(J^H J)/sigma^2)^-1) by plain float64 inversion, per voxel."""
    fisher = torch.einsum("...ps,...qs->...pq", J.conj(), J).real / sigma2
    return torch.linalg.inv(fisher).diagonal(dim1=-2, dim2=-1)


T1 = torch.tensor([450.0, 900.0, 1600.0], dtype=F64)
T2 = torch.tensor([40.0, 80.0, 150.0], dtype=F64)
M0 = torch.tensor([1.0, 0.8, 1.2], dtype=F64)


def test_crlb_mrf_matches_oracle_fisher():
    """MRF (inversion, 40 FISP repetitions), unknowns T1, T2, M0; sigma^2 = 1e-4."""
    flip = torch.cat([torch.linspace(10, 60, 20), torch.linspace(60, 5, 20)]).to(F64)
    sim = MRFSimulator(flip=flip, TR=12.0, states=10)
    names = ("T1", "T2", "M0")

    def oracle(f):
        tissue = TissueProperties(t1_ms=f["T1"], t2_ms=f["T2"], m0=f["M0"])
        return play(sim.describe(), tissue, states=10).signal

    expected = inverse_fisher_diagonal(oracle_jacobian(oracle, {"T1": T1, "T2": T2, "M0": M0}, names), 1e-4)
    _, J = sim.jacobian(names, T1=T1, T2=T2, M0=M0, dtype=F64)
    got = crlb(J, noise_variance=1e-4)
    assert got.shape == (3, 3) and got.dtype == F64
    assert rel_max_err(got / expected, torch.ones_like(expected)) < FD_REL  # entry by entry, relative


def test_crlb_fse_matches_oracle_fisher():
    """FSE (CPMG, 10 echoes, refocusing 120-180 degrees): T2, B1 and M0 (B1 is seen through the stimulated
    echoes of the reduced refocusing)."""
    flip = torch.linspace(120, 180, 10, dtype=F64)
    sim = FSESimulator(flip=flip, ESP=10.0, states=10)
    names = ("T2", "B1", "M0")
    b1 = torch.tensor([0.85, 1.0, 1.1], dtype=F64)

    def oracle(f):
        tissue = TissueProperties(t1_ms=T1, t2_ms=f["T2"], b1=f["B1"], m0=f["M0"])
        return play(sim.describe(), tissue, states=10, repetitions=2).signal

    expected = inverse_fisher_diagonal(oracle_jacobian(oracle, {"T2": T2, "B1": b1, "M0": M0}, names), 2e-4)
    _, J = sim.jacobian(names, T1=T1, T2=T2, B1=b1, M0=M0, dtype=F64)
    got = crlb(J, noise_variance=2e-4)
    assert rel_max_err(got / expected, torch.ones_like(expected)) < FD_REL


def test_crlb_spgr_matches_oracle_fisher():
    """SPGR at two flip angles: the closed form's Jacobian against the oracle's spoiled train played to its
    steady state. TR = 50 ms: each playing multiplies the distance to the steady state by E1 cos(a) <= 0.97,
    so 600 playings leave ~1e-8 of it, far below the 1e-4 compared."""
    flips_deg, tr_ms = (10.0, 30.0), 50.0
    names = ("M0", "T1")

    def oracle(f):
        samples = []
        for a in flips_deg:
            train = spgr_description(math.radians(a), tr_ms * 1e-3, 0.0)
            tissue = TissueProperties(t1_ms=f["T1"], t2_ms=math.inf, m0=f["M0"])
            samples.append(play(train, tissue, states=1, repetitions=600).signal[..., 0])
        return torch.stack(samples, -1)

    expected = inverse_fisher_diagonal(oracle_jacobian(oracle, {"M0": M0, "T1": T1}, names), 1.0)
    _, J = SPGRSimulator(flip=torch.tensor(flips_deg, dtype=F64), TR=tr_ms, TE=0.0).jacobian(names, T1=T1, M0=M0)
    got = crlb(J)
    assert got.dtype == F64
    assert rel_max_err(got / expected, torch.ones_like(expected)) < FD_REL


def despot1_t1_variance(flips_rad, tr_ms, t1_ms, m0, sigma2):
    """The variance of the two-angle DESPOT1 T1 estimate by first-order error propagation (Deoni, Rutt and
    Peters 2003, MRM 49:515; Cheng and Wright 2006, MRM 55:566).

    DESPOT1 linearises the SPGR signal S_i = M0 (1 - E1) sin a_i / (1 - E1 cos a_i) as
        S_i / sin a_i = E1 (S_i / tan a_i) + M0 (1 - E1),
    so with y_i = S_i / sin a_i = a_i' S_i and x_i = S_i / tan a_i = b_i' S_i (a' = 1/sin a, b' = 1/tan a)
    the slope through the two points is m = (y2 - y1) / (x2 - x1) = N / D and T1 = -TR / ln m.
    With N = m D:
        dm/dS1 = (b1' m - a1') / D,   dm/dS2 = (a2' - b2' m) / D,   dT1/dm = TR / (m ln(m)^2),
    and with independent noise of variance sigma^2 on S1 and S2,
        Var(T1) = sigma^2 (dT1/dm)^2 [(dm/dS1)^2 + (dm/dS2)^2].
    Two measurements and two unknowns make the estimate the exact inverse of the signal model, so this
    linearised variance is the Cramer-Rao bound of T1 with M0 unknown.
    """
    a1, a2 = flips_rad
    E1 = math.exp(-tr_ms / t1_ms)
    S1, S2 = (m0 * (1 - E1) * math.sin(a) / (1 - E1 * math.cos(a)) for a in (a1, a2))
    ia1, ia2, ib1, ib2 = 1 / math.sin(a1), 1 / math.sin(a2), 1 / math.tan(a1), 1 / math.tan(a2)
    D = ib2 * S2 - ib1 * S1
    m = (ia2 * S2 - ia1 * S1) / D
    dT1_dm = tr_ms / (m * math.log(m) ** 2)
    return sigma2 * dT1_dm**2 * (((ib1 * m - ia1) / D) ** 2 + ((ia2 - ib2 * m) / D) ** 2)


@pytest.mark.parametrize(("flips_deg", "tr_ms", "t1_ms"), [((3.0, 17.0), 15.0, 1000.0), ((4.0, 19.0), 5.0, 600.0),
                                                            ((2.0, 13.0), 20.0, 2500.0)])
def test_crlb_despot1_matches_error_propagation(flips_deg, tr_ms, t1_ms):
    """Float64 closed form: the bound equals the propagated variance to rounding (1e-9: the formula's
    D and N are differences of nearby signals, losing ~3 digits of the 1e-16)."""
    sigma2 = 1e-6
    sim = SPGRSimulator(flip=torch.tensor(flips_deg, dtype=F64), TR=tr_ms, TE=0.0)
    _, J = sim.jacobian(("M0", "T1"), T1=torch.tensor(t1_ms, dtype=F64), M0=torch.tensor(1.0, dtype=F64))
    got = float(crlb(J, noise_variance=sigma2)[1])
    expected = despot1_t1_variance([math.radians(a) for a in flips_deg], tr_ms, t1_ms, 1.0, sigma2)
    assert abs(got - expected) / expected < 1e-9


# -------------------------------------------------------------------------------------------------
# Options and errors
# -------------------------------------------------------------------------------------------------


def random_jacobian(shape, seed=0, dtype=torch.complex128):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, dtype=dtype, generator=g)


def test_known_drops_the_column_and_of_selects():
    J = random_jacobian((4, 3, 20))
    full = crlb(J, noise_variance=0.5)
    fisher = fisher_information(J, noise_variance=0.5)
    expected = torch.linalg.inv(fisher).diagonal(dim1=-2, dim2=-1)
    assert rel_max_err(full, expected) < 1e-12  # float64 inversions of a well-conditioned 3x3
    with_known = crlb(J, noise_variance=0.5, known=(1,))
    sub = torch.linalg.inv(fisher[:, [0, 2]][:, :, [0, 2]]).diagonal(dim1=-2, dim2=-1)
    assert torch.equal(with_known[:, 1], torch.zeros(4, dtype=F64))  # a known property has no variance
    assert rel_max_err(with_known[:, [0, 2]], sub) < 1e-12
    by_name = crlb(J, noise_variance=0.5, names=("T1", "T2", "B1"), known="T2", of=("B1", "T1"))
    assert by_name.shape == (4, 2)
    assert rel_max_err(by_name, sub[:, [1, 0]]) < 1e-12


def test_noise_variance_per_tissue_and_real_jacobians():
    J = random_jacobian((5, 2, 30), dtype=F64)
    sigma2 = torch.linspace(0.1, 2.0, 5, dtype=F64)
    got = crlb(J, noise_variance=sigma2)
    assert rel_max_err(got, crlb(J) * sigma2[:, None]) < 1e-12  # the bound scales with sigma^2


def test_complex_samples_count_twice():
    """A complex Jacobian counts real and imaginary parts as separate measurements."""
    J = random_jacobian((2, 2, 10))
    stacked = torch.cat([J.real, J.imag], -1)
    assert rel_max_err(crlb(J), crlb(stacked)) < 1e-12


def test_singular_raise_and_infinite():
    J = random_jacobian((3, 2, 8))
    J[1, 1] = 0  # tissue 1 does not see property 1
    with pytest.raises(torch.linalg.LinAlgError, match=r"tissue \(1,\)"):
        crlb(J)
    got = crlb(J, singular="infinite")
    assert torch.isinf(got[1]).all() and torch.isfinite(got[[0, 2]]).all()
    J[2, 1] = 2 * J[2, 0]  # dependent columns
    assert torch.isinf(crlb(J, singular="infinite")[2]).all()


def test_crlb_is_differentiable_through_second_order_kernels():
    """The gradient of a summed bound w.r.t. the flips (the design loop), float64 kernels, against central
    differences of the same cost (step 1e-4 deg: truncation ~1e-8 relative, rounding ~1e-12/1e-4; bound 1e-6)."""
    sim = MRFSimulator(TR=10.0, states=10)
    t1, t2 = torch.tensor([600.0, 1200.0], dtype=F64), torch.tensor([50.0, 100.0], dtype=F64)

    def cost(flip):
        _, J = sim.jacobian(("T1", "T2"), flip=flip, T1=t1, T2=t2, dtype=F64)
        return (crlb(J) / torch.stack([t1, t2], -1) ** 2).sum()

    flip = torch.linspace(10, 50, 16, dtype=F64).requires_grad_()
    (grad,) = torch.autograd.grad(cost(flip), flip)
    h = 1e-4
    fd = torch.stack([(cost(flip.detach() + h * e) - cost(flip.detach() - h * e)) / (2 * h)
                      for e in torch.eye(16, dtype=F64)])
    assert rel_max_err(grad, fd) < 1e-6


def test_errors_name_the_argument():
    J = random_jacobian((2, 20))
    with pytest.raises(ValueError, match="property axis"):
        crlb(J[0])
    with pytest.raises(ValueError, match="singular"):
        crlb(J, singular="nan")
    with pytest.raises(ValueError, match="noise_variance"):
        crlb(J, noise_variance=0.0)
    with pytest.raises(ValueError, match="names="):
        crlb(J, of="T1")
    with pytest.raises(ValueError, match="of holds 5"):
        crlb(J, of=5)
