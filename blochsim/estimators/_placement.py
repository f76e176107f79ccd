"""Where an estimator's work runs and how large its blocks are, under the active execution policy.

Estimators run torch arithmetic (matrix products, reductions) and the simulator; their blocks are sized
here from a byte budget: the policy's `budget_bytes`, else on a CUDA device its free memory (plus what
torch holds cached and unused) less `reserve_bytes`, else on the host a quarter of the free memory, at
most `HOST_BUDGET_BYTES`. Work runs where the volume is unless the policy names a target; results return
to the volume's device.
"""

from __future__ import annotations

import os

import torch

from .. import _execution

__all__ = ["run_device", "budget_bytes", "stage", "HOST_BUDGET_BYTES"]

#: Without a policy budget, host blocks touch at most this much: larger blocks buy no speed on the host
#: (the products are memory-bound at a dictionary's small ranks) and would crowd other processes.
HOST_BUDGET_BYTES = 512 * 2**20


def run_device(home: torch.device) -> torch.device:
    """The device work on tensors living on `home` runs on, under the active policy."""
    return _execution.active().device_for(home)


def budget_bytes(device: torch.device) -> int:
    """Bytes one block of work on `device` may touch."""
    policy = _execution.active()
    if policy.budget_bytes is not None:
        return policy.budget_bytes
    if device.type == "cuda":
        free = _execution.cuda_free_bytes(device)
        return max(free - policy.reserve_bytes, 0)
    try:
        free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):  # not Linux: assume plenty
        free = 4 * HOST_BUDGET_BYTES
    return min(HOST_BUDGET_BYTES, free // 4)


def stage(x: torch.Tensor | None, device: torch.device) -> torch.Tensor | None:
    """`x` on `device` (host tensors to a CUDA device through pinned memory)."""
    if x is None or x.device == device:
        return x
    if device.type == "cuda" and x.device.type == "cpu" and torch.cuda.is_available():
        return x.pin_memory().to(device, non_blocking=True)
    return x.to(device)
