"""Progress bars of long matches and fits: shown when forced (execution(progress=True)), counting every voxel;
never when off; quiet by default when stderr is not a terminal (as under pytest)."""

import sys
import types

import pytest
import torch

import blochsim
from blochsim.estimators import DictionaryMatcher, NonlinearLeastSquares
from blochsim.simulators import MRFSimulator

FLIP_DEG = torch.linspace(5, 60, 12)


@pytest.fixture
def bars(monkeypatch):
    made = []

    class Bar:
        def __init__(self, **kwargs):
            self.kwargs, self.done, self.closed = kwargs, 0, False
            made.append(self)

        def update(self, n=1):
            self.done += n

        def close(self):
            self.closed = True

        def __enter__(self):  # as tqdm's bars
            return self

        def __exit__(self, *exc):
            self.close()

    module = types.ModuleType("tqdm.auto")
    module.tqdm = Bar
    monkeypatch.setitem(sys.modules, "tqdm.auto", module)
    return made


def ours(bars, word):
    return [b for b in bars if word in b.kwargs.get("desc", "")]


def test_progress_of_matching_and_least_squares(bars):
    sim = MRFSimulator(flip=FLIP_DEG, TR=10.0)
    t1 = torch.linspace(300, 2000, 50)
    matcher = DictionaryMatcher(sim).fit(T1=t1, T2=torch.full((50,), 80.0))
    signals = sim.simulate(T1=t1[:30], T2=80.0)
    with blochsim.execution(progress=True, budget_bytes=16 * 256 * 8):  # blocks of 8 atoms: several blocks
        matcher.match(signals)
    (bar,) = ours(bars, "dictionary")
    assert bar.kwargs["total"] == 30 and bar.done == 30 and bar.closed
    nlls = NonlinearLeastSquares(sim).fit(T1=(200.0, 3000.0), T2=(10.0, 300.0), samples=100, seed=0)
    with blochsim.execution(progress=True):
        nlls.map(signals)
    (bar,) = ours(bars, "least squares")
    assert bar.kwargs["total"] == 30 and bar.done == 30 and bar.closed
    count = len(bars)
    with blochsim.execution(progress=False):
        matcher.match(signals)
        nlls.map(signals)
    matcher.match(signals)  # default: stderr is not a terminal under pytest
    assert len(bars) == count
