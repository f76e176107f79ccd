"""The engine's one packing and binding path (engine.tissue.pack_tissue, engine.bind.run).

`engine.simulate`/`jacobian`, `EpgEngine` and `Simulator` pack their tissue with one function, under one
device rule and one cache, and run through one binding. What differed between the two paths that this
replaced is held here.
"""

from __future__ import annotations

import pytest
import torch
import torch.autograd.forward_ad as fwAD

from blochsim import engine
from blochsim._reference import play
from blochsim.engine.tissue import pack_tissue, tissue_device
from blochsim.sequence import EpgEngine, TissueProperties, mrf_description
from blochsim.simulators import MRFSimulator

# Forward mode through the oracle scripts torch's decompositions: a deprecation warning of torch's.
pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")

F64 = torch.float64
FLIPS_RAD = torch.deg2rad(torch.linspace(5, 60, 20, dtype=F64))
POOL_B = dict(pool_b_exchange_hz=30.0, t1_pool_b_ms=500.0, t2_pool_b_ms=20.0)
T1_MS, T2_MS = torch.tensor([800.0, 1200.0], dtype=F64), torch.tensor([60.0, 90.0], dtype=F64)
#: float64 kernels against the float64 oracle: the pool tables' Taylor exponential truncates at ~2e-14
#: relative and 20 events add rounding; measured 4.4e-15.
REL = 1e-10


def _oracle_column(description, **fraction_free):
    """d signal / d pool_b_fraction at 0 by forward mode through the oracle."""
    with fwAD.dual_level():
        f = fwAD.make_dual(torch.tensor(0.0, dtype=F64), torch.tensor(1.0, dtype=F64))
        tissue = TissueProperties(t1_ms=T1_MS, t2_ms=T2_MS, pool_b_fraction=f, **POOL_B)
        return fwAD.unpack_dual(play(description, tissue, states=8).signal).tangent


def test_jacobian_along_a_pool_the_tissue_lacks():
    """A Jacobian along the fraction of a pool at 0 (a Python number) is the derivative of adding that pool.

    The engine's own path decided the pools from the numbers given (0: no pool) and then built the tables'
    tangents with the pool present, which fitted no kernel input: the column came back zero. The packing
    now counts a field differentiated along as present.
    """
    d = mrf_description(FLIPS_RAD, 0.01)
    want = _oracle_column(d)
    tissue = TissueProperties(t1_ms=T1_MS, t2_ms=T2_MS, pool_b_fraction=0.0, **POOL_B)
    _, jac = engine.jacobian(d, tissue, ["pool_b_fraction", "t1_ms"], states=8, dtype=F64)
    assert float(want.abs().max()) > 1e-3  # the pool matters
    assert float((jac[..., 0, :] - want).abs().max()) <= REL * float(want.abs().max())

    sim = MRFSimulator(flip=torch.rad2deg(FLIPS_RAD), TR=10.0, states=8)
    _, jac = sim.jacobian(["poolB_fraction"], T1=T1_MS, T2=T2_MS, poolB_fraction=0.0, poolB_exchange=30.0,
                          poolB_T1=500.0, poolB_T2=20.0, dtype=F64)
    # MRFSimulator multiplies the engine's samples by i (post_rotation_rad = pi/2).
    assert float((jac[..., 0, :] - 1j * want).abs().max()) <= REL * float(want.abs().max())


def test_a_zero_fraction_map_is_no_pool():
    """A pool fraction given as a map of zeros adds no pool (no tables): the same signal as without it."""
    zero = torch.zeros(2, dtype=F64)
    packed = pack_tissue(TissueProperties(t1_ms=T1_MS, t2_ms=T2_MS, pool_b_fraction=zero, **POOL_B))
    assert not packed.pools.pooled and packed.voxel_shape == (2,)
    d = mrf_description(FLIPS_RAD, 0.01)
    with_map = engine.simulate(d, TissueProperties(t1_ms=T1_MS, t2_ms=T2_MS, pool_b_fraction=zero, **POOL_B),
                               states=8)
    assert torch.equal(with_map, engine.simulate(d, TissueProperties(t1_ms=T1_MS, t2_ms=T2_MS), states=8))
    assert pack_tissue(TissueProperties(t1_ms=T1_MS, t2_ms=T2_MS, pool_b_fraction=zero + 0.1)).pools.letters == ("b",)


def test_every_entry_point_gives_the_same_signal():
    """engine.simulate, EpgEngine and a Simulator from the description run one path: bit for bit equal."""
    d = mrf_description(FLIPS_RAD, 0.01)
    tissue = TissueProperties(t1_ms=T1_MS.float(), t2_ms=T2_MS.float(), b0_hz=torch.tensor([0.0, 7.0]),
                              pool_b_fraction=0.1, **POOL_B)
    direct = engine.simulate(d, tissue, states=8)
    described = EpgEngine().simulate(d, tissue, nstates=8).signal
    assert torch.equal(direct, described)


def test_one_device_rule():
    """Work runs where the first tissue tensor off the CPU is, else on the CPU; numbers do not decide."""
    cpu = torch.device("cpu")
    assert tissue_device({"t1_ms": 800.0, "t2_ms": torch.tensor(60.0)}) == cpu
    meta = torch.empty(2, device="meta")
    assert tissue_device({"t1_ms": torch.tensor([800.0, 900.0]), "t2_ms": meta}) == meta.device
