"""`blochsim info`: what this installation has: version, kernels, CUDA package and devices, threads, extras."""

from __future__ import annotations

import os
import platform
import sys
from pathlib import Path

import click

from ._common import reports_errors

__all__ = ["info"]


def _version(module: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(module)
    except PackageNotFoundError:
        return None


def _cpu_flags() -> str:
    """The instruction sets the host kernels choose between, as this processor reports them."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return "unknown"
    for line in text.splitlines():
        if line.startswith("flags"):
            flags = line.split(":", 1)[1].split()
            return ", ".join(f for f in ("sse2", "avx2", "fma", "avx512f") if f in flags) or "none of sse2/avx2/avx512f"
    return "unknown"


def _host_kernels() -> str:
    from .. import _native

    try:
        lib = _native.cpu_library()
    except ImportError as exc:  # NativeLibraryError: missing, or of another ABI or release
        return f"NOT LOADED: {exc}"
    built, running = _native.host_lanes()
    return (f"{lib._name} (ABI {lib.bs_abi_version()}, built for {lib.bs_version().decode()}; SIMD lanes built: "
            f"{', '.join(built) or 'none'}; running: {running or 'none (the per-voxel path)'})")


def _cuda() -> list:
    import torch

    from .._errors import CUDA_PACKAGES

    lines = []
    packages = []
    for module, extra, driver in (CUDA_PACKAGES[major] for major in sorted(CUDA_PACKAGES)):
        found = _version(module.replace("_", "-"))
        packages.append(f"{module} {found}" if found else
                        f"{module} not installed (blochsim[{extra}], NVIDIA driver {driver})")
    lines.append("CUDA packages: " + "; ".join(packages))
    if torch.version.cuda is None:
        lines.append("CUDA devices: none (this torch is built without CUDA)")
        return lines
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    names = [f"cuda:{i} {torch.cuda.get_device_name(i)}" for i in range(count)]
    lines.append(f"CUDA devices (torch CUDA {torch.version.cuda}): " + (", ".join(names) if names else "none visible"))
    if count:
        from .. import _native

        try:
            lib = _native.cuda_library()
            lines.append(f"CUDA kernels: {lib._name}")
        except (ImportError, RuntimeError) as exc:  # CudaBuildMismatch is an ImportError
            lines.append(f"CUDA kernels: NOT LOADED: {exc}")
    return lines


@click.command(short_help="Show the version, kernels, CUDA package and devices, threads.", epilog="""\b
Example:
  blochsim info
""")
@reports_errors
def info() -> None:
    """Print the version, the kernels found, the CUDA package and devices, and the threads."""
    import numpy
    import torch

    from .._version import __version__
    from ..engine.kernels import num_threads

    click.echo(f"blochsim {__version__} ({Path(__file__).resolve().parents[1]})")
    click.echo(f"python {platform.python_version()} ({sys.executable}), torch {torch.__version__}, "
               f"numpy {numpy.__version__}, {platform.platform()}")
    click.echo(f"host kernels: {_host_kernels()}")
    isa = os.environ.get("BLOCHSIM_HOST_ISA")
    click.echo(f"host instruction sets: {_cpu_flags()} (" + (f"BLOCHSIM_HOST_ISA={isa}" if isa else
               "the widest is used; BLOCHSIM_HOST_ISA narrows it") + ")")
    env = os.environ.get("BLOCHSIM_NUM_THREADS")
    click.echo(f"threads: {num_threads()} (" + (f"BLOCHSIM_NUM_THREADS={env}" if env else
               "torch.get_num_threads(); BLOCHSIM_NUM_THREADS sets it") + f"), {os.cpu_count()} cores")
    for line in _cuda():
        click.echo(line)
    extras = {"tqdm": "progress", "matplotlib": "plot", "h5py": "HDF5 files"}
    click.echo("optional: " + ", ".join(f"{name} {_version(name) or 'not installed'} ({use})"
                                         for name, use in extras.items()))
