"""The Dynamo-wrapped entry points of `blochsim._tracing`, apart so that `import blochsim` does not import
torch._dynamo (seconds, and sympy): only a call traced by torch.compile or torch.export imports this module."""

import torch._dynamo

from ._tracing import _plan, _run

__all__ = ["plan", "run_plan"]

# The plan is made on real values at trace time; Dynamo takes its (name, output spec) as a constant.
plan = torch._dynamo.assume_constant_result(_plan)

# Dynamo hands the plan's graph to AOTAutograd as it is, without interpreting it node by node (hundreds of nodes
# with pools: seconds); torch before 2.7 lacks nonstrict_trace, and there Dynamo inlines it.
run_plan = torch._dynamo.nonstrict_trace(_run) if hasattr(torch._dynamo, "nonstrict_trace") else _run
