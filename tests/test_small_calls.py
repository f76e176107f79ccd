"""Issue 30 item 4: a small call pays little Python over its kernels (docs/design.md, "Small calls").

A design loop calls the public API again and again on one structure with new flip values. Once the structure
is resolved, such a call is a few torch operations and two kernel calls; everything else is Python on the
host, which on a GPU is most of a call at a few thousand tissues. These tests count the Python function calls
(`sys.setprofile` "call" events: blochsim's, and torch's Python that blochsim's use of it runs) of one warm
call, so that per-call work cannot grow back unnoticed. Counts, not times: they do not depend on the
machine or its load.
"""

from __future__ import annotations

import torch

from blochsim._benchmark_cases import python_calls
from blochsim.simulators import MRFSimulator

FLIPS = 50


def design_loop_step(sim, t1, t2, backward: bool):
    """One step of a design loop: new flip values (a fresh leaf tensor), the signal, and its gradient."""
    def step():
        flip = torch.linspace(5.0, 60.0, FLIPS).requires_grad_()
        signal = sim.simulate(flip=flip, T1=t1, T2=t2)
        if backward:
            torch.view_as_real(signal).square().sum().backward()
    return step


def warm_counts() -> tuple[int, int]:
    if torch.cuda.is_available():
        # Until CUDA is initialised torch counts the devices through NVML on every ask (~30 Python calls; the
        # routing asks on every call): a GPU process has initialised it long before its loop.
        torch.cuda.init()
    sim = MRFSimulator(TR=10.0, states=16)
    t1, t2 = torch.linspace(300.0, 2000.0, 20), torch.linspace(30.0, 150.0, 20)
    forward, gradient = design_loop_step(sim, t1, t2, False), design_loop_step(sim, t1, t2, True)
    for _ in range(3):  # walk, resolve, resolved
        gradient()
    return python_calls(forward), python_calls(gradient)


def test_a_warm_call_makes_few_python_calls():
    """Measured with torch 2.13 on the CPU: 136 calls per simulate and 232 per simulate + backward, against
    275 and 529 before issue 30's cuts (74b757a). The bounds leave about 25 % for a new check or two; they
    fail if torch's per-call signature binding in `Function.apply` comes back (~50 calls per kernel
    Function: `engine.functions._apply`), or the routing of `distributed()` and several devices stops being
    one short check when neither is in use (`_sharding.route`)."""
    forward, gradient = warm_counts()
    assert forward <= 170, f"{forward} Python calls per warm simulate (bound 170)"
    assert gradient <= 290, f"{gradient} Python calls per warm simulate + backward (bound 290)"


def test_a_warm_call_equals_the_walked_one():
    """The calls counted above give what a fresh walk of the layout gives (the resolved map and the kernels'
    arguments are unchanged by the cuts): signal and flip gradient."""
    t1, t2 = torch.linspace(300.0, 2000.0, 20), torch.linspace(30.0, 150.0, 20)
    sim = MRFSimulator(TR=10.0, states=16)
    for _ in range(3):
        design_loop_step(sim, t1, t2, True)()
    results = []
    for simulator in (sim, MRFSimulator(TR=10.0, states=16, resolve=False)):
        flip = torch.linspace(5.0, 60.0, FLIPS).requires_grad_()
        signal = simulator.simulate(flip=flip, T1=t1, T2=t2)
        torch.view_as_real(signal).square().sum().backward()
        results.append((signal.detach(), flip.grad))
    (signal, grad), (signal_ref, grad_ref) = results
    # The resolved map computes the event values in float64 like the walk, then narrows them to float32 once:
    # the kernels see the same float32 values, so signals and gradients agree to float32 rounding.
    assert torch.allclose(signal, signal_ref, rtol=0, atol=1e-6 * signal_ref.abs().max())
    assert torch.allclose(grad, grad_ref, rtol=0, atol=1e-5 * grad_ref.abs().max())


def test_a_design_loop_step_reads_nothing_from_the_card():
    """On a GPU a host read of a card value waits for the card, which costs more than the Python above. With
    the flips and the tissue on a stand-in card (tests/_fake_card.py), a resolved design-loop step (new flip
    values, the signal, its gradient) reads nothing back: the map of the protocol, both kernel passes and the
    backward run on the card. (Calls repeating the very values of the resolving call in fresh tensors read
    once per call, to compare them with the point the map was fitted at, until a new point verifies it:
    docs/design.md, "Structure resolution".)"""
    from _fake_card import SYNCS, card, fake_card

    sim = MRFSimulator(TR=10.0, states=16)
    with fake_card():
        t1, t2 = card(torch.linspace(300.0, 2000.0, 20)), card(torch.linspace(30.0, 150.0, 20))
        base = card(torch.linspace(5.0, 60.0, FLIPS))
        reads = []
        for k in range(5):  # walk, resolve, then resolved and verified (the values differ)
            SYNCS.clear()
            flip = (base + 0.01 * k).detach().requires_grad_()
            torch.view_as_real(sim.simulate(flip=flip, T1=t1, T2=t2)).square().sum().backward()
            reads.append(list(SYNCS))
    assert reads[2:] == [[], [], []], reads
