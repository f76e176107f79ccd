"""LookupTable: B1 from a double-angle ratio, T1 from the MP2RAGE uniform image, monotonic stretches, errors."""

import numpy as np
import pytest
import torch

from blochsim.estimators import LookupTable
from blochsim.simulators import DoubleAngleSimulator, MP2RAGESimulator


def ratio(s):
    return s[..., 1] / s[..., 0]


def uniform(s):
    return s[..., 0] * s[..., 1] / (s[..., 0] ** 2 + s[..., 1] ** 2)


def test_double_angle_b1():
    """sin(2a)/sin(a) = 2 cos(a) falls monotonically in B1 for a = 60 B1 degrees below 180."""
    acquisition = DoubleAngleSimulator(flip=[60.0, 120.0])
    table = LookupTable(acquisition, combine=ratio).fit(B1=(0.5, 1.45))
    assert table.points == 10000 and table.span[0] < table.span[1]
    b1 = torch.linspace(0.6, 1.4, 9)
    maps = table.map(acquisition.simulate(B1=b1, M0=2.0).numpy())  # the ratio cancels M0
    assert isinstance(maps["B1"], np.ndarray) and maps["B1"].shape == (9,)
    # Linear interpolation on a 1e-4 grid of a smooth curve: error ~ h^2 |f''| / 8 ~ 1e-9, far below the
    # float32 signals' 1e-7 relative round-off, which the ratio's slope (2 sin(a) a) amplifies to ~1e-6.
    assert np.allclose(maps["B1"], b1.numpy(), atol=1e-5)


def test_mp2rage_keeps_the_longest_monotonic_stretch():
    """The MP2RAGE uniform image falls from 0.49 to -0.5 and turns near T1 = 4600 ms: the table keeps the
    falling stretch and drops the rest."""
    acquisition = MP2RAGESimulator(TI=[700.0, 2500.0], flip=[4.0, 5.0], TRspgr=7.0, TRmp2rage=5000.0, nshots=176)
    table = LookupTable(acquisition, combine=uniform).fit(T1=(200.0, 5000.0))
    assert table.points < 10000 and float(table.table_unknown.max()) < 4700
    t1 = torch.tensor([300.0, 500.0, 1000.0, 1500.0, 2500.0, 4000.0], dtype=torch.float64)
    maps = table.map(acquisition.simulate(T1=t1))
    # A float64 closed form tabulated on a 0.48 ms grid: interpolation error ~ h^2 |f''| / 8 relative to the
    # slope is far below 0.01 ms, the bound kept for the steep long-T1 end (slope 1e-5 per ms).
    assert torch.allclose(maps["T1"].double(), t1, atol=0.05)
    with pytest.raises(ValueError, match="not strictly monotonic.*turns at table point"):
        LookupTable(acquisition, combine=uniform, monotonic=False).fit(T1=(200.0, 5000.0))


def test_outside_the_span_reads_the_nearer_endpoint():
    acquisition = DoubleAngleSimulator(flip=[60.0, 120.0])
    table = LookupTable(acquisition, combine=ratio).fit(B1=(0.8, 1.2))
    signals = acquisition.simulate(B1=torch.tensor([0.5, 1.4]))
    maps = table.map(signals)
    # Exactly the endpoint values of the table (0.8 and 1.2 as float64 grid ends, returned in float32).
    assert torch.equal(maps["B1"], torch.tensor([0.8, 1.2]))


def test_given_curve_and_errors():
    t = torch.linspace(0, 1, 101)
    table = LookupTable().fit(signals=torch.exp(-3 * t)[:, None], parameters={"x": t})
    assert torch.allclose(table.map(torch.exp(-3 * torch.tensor([[0.25], [0.5]])))["x"], torch.tensor([0.25, 0.5]),
                          atol=2e-4)  # linear interpolation of exp on a 0.01 grid: h^2 * 9 / 8 ~ 1.1e-4
    acquisition = DoubleAngleSimulator(flip=[60.0, 120.0])
    with pytest.raises(ValueError, match="2 contrasts; give combine="):
        LookupTable(acquisition).fit(B1=(0.5, 1.5))
    with pytest.raises(ValueError, match="exactly one unknown, got 2"):
        LookupTable(acquisition, combine=ratio).fit(B1=(0.5, 1.5), M0=(0.5, 1.0))
    with pytest.raises(ValueError, match="known properties"):
        LookupTable(acquisition, combine=ratio).fit(B1=(0.5, 1.5), known={"M0": (0.5, 1.0)})
    with pytest.raises(ValueError, match="combine must map"):
        LookupTable(acquisition, combine=lambda s: s).fit(B1=(0.5, 1.5))
    with pytest.raises(NotImplementedError, match="PERK and NonlinearLeastSquares"):
        table.map(torch.ones(2, 1), uncertainty=True)
    with pytest.raises(RuntimeError, match="not trained"):
        LookupTable(acquisition, combine=ratio).map(torch.ones(2, 2))
