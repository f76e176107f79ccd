"""Errors users must get: messages that name the argument, its value and what works.

Built-in exception types are kept for compatibility; only the CUDA loader adds its own class,
`CudaBuildMismatch` (an `ImportError`).
"""

from __future__ import annotations

import difflib

import torch

from ._version import __version__

__all__ = [
    "CudaBuildMismatch",
    "nearest",
    "unknown_name",
    "missing_property",
    "check_device",
    "CUDA_PACKAGES",
]

#: The per-CUDA-major packages and their driver floors.
CUDA_PACKAGES = {12: ("blochsim_cuda12", "cu12", "R525+"), 13: ("blochsim_cuda13", "cu13", "R580+")}


class CudaBuildMismatch(ImportError):
    """The blochsim CUDA package is missing, or does not match torch's CUDA major or this blochsim release."""


def nearest(name: str, names) -> str:
    """' (did you mean 'T2'?)' for the closest of `names`, or ''."""
    close = difflib.get_close_matches(name, list(names), n=1, cutoff=0.5)
    if not close:  # case slips ("t1" for "T1") score low on short names
        folded = {n.lower(): n for n in names}
        if name.lower() in folded:
            close = [folded[name.lower()]]
    return f" (did you mean {close[0]!r}?)" if close else ""


def unknown_name(name: str, simulator: str, accepted, *, where: str = "", listing: str | None = None) -> TypeError:
    """TypeError for a property or protocol name `simulator` does not take.

    `accepted` is searched for the nearest match; `listing` (default: `accepted` joined) is what the
    message lists. `where` follows the simulator's name, e.g. ".simulate()".
    """
    listing = listing if listing is not None else (", ".join(accepted) if accepted else "none")
    return TypeError(f"{simulator}{where} got an unknown argument {name!r}{nearest(name, accepted)}; "
                     f"it accepts: {listing}")


def missing_property(name: str, simulator: str, unit: str | None) -> TypeError:
    """TypeError for a required property or protocol argument that no call, constructor or bind gave."""
    what = f"{name!r} ({unit})" if unit else repr(name)
    return TypeError(f"{simulator} needs {what}: give it in the call ({simulator}(...).simulate({name}=...)), "
                     f"in the constructor ({simulator}({name}=...)), or with bind ({name}=...)")


def _install_line() -> str:
    return (f'pip install "blochsim[cu12]=={__version__}" (CUDA 12, NVIDIA driver R525+) or '
            f'pip install "blochsim[cu13]=={__version__}" (CUDA 13, driver R580+)')


def check_device(device) -> None:
    """Raise the documented error when `device` asks for CUDA that cannot be served.

    A torch built without CUDA, or no visible GPU, gives RuntimeError; a missing or mismatched blochsim
    CUDA package gives `CudaBuildMismatch` (from the loader, `blochsim._native.cuda_library`). `None` and
    CPU devices pass.
    """
    if device is None:
        return
    kind = device.type if isinstance(device, torch.device) else str(device).split(":")[0]
    if kind == "cpu":
        return
    if kind != "cuda":
        raise ValueError(f"device must be 'cpu' or a CUDA device ('cuda', 'cuda:1', ...), got {device!r}")
    if torch.version.cuda is None:
        raise RuntimeError(
            f"device={device!r} asks for CUDA, but this torch ({torch.__version__}) was built without CUDA; "
            "blochsim runs on the CPU until a CUDA build of torch and the matching blochsim CUDA package are "
            f"installed: {_install_line()}"
        )
    if not torch.cuda.is_available():
        raise RuntimeError(f"device={device!r} asks for CUDA, but torch sees no CUDA device (driver or "
                           "CUDA_VISIBLE_DEVICES); run on the CPU (device=None) or on a machine with a GPU")
    from . import _native

    _native.cuda_library()  # raises CudaBuildMismatch naming the extra to install
