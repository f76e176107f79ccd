"""Loads the kernel library `libblochsim_cpu.so` with ctypes and checks it matches this package.

The library exposes the C ABI of `csrc/capi.h`; the ctypes structures below mirror it field for field.
The library is found beside this file (the installed wheel), in the installed distribution when a source
checkout is imported instead of it, or at `BLOCHSIM_CPU_LIBRARY` (a development build). It is loaded on
first use, so importing blochsim never fails for want of it.
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

from ._version import __version__

__all__ = ["ABI_VERSION", "NUM_TISSUE", "TISSUE_PARAMS", "NativeLibraryError", "cpu_library", "check_status"]

#: The ABI this Python package speaks (BS_ABI_VERSION in csrc/capi.h).
ABI_VERSION = 5

#: Tissue properties of the kernels, in the order of `enum bs_tissue_param`.
TISSUE_PARAMS = (
    "t1_ms",
    "t2_ms",
    "m0",
    "b1",
    "b1_phase_rad",
    "b0_hz",
    "inversion_efficiency",
    "diffusion_um2_per_ms",
    "velocity_m_per_s",
)
NUM_TISSUE = len(TISSUE_PARAMS)

PATH_REAL, PATH_COMPLEX = 0, 1
FLOAT32, FLOAT64 = 0, 1

# Packed action bits (enum bs_action).
CRUSH_BEFORE, CRUSH_AFTER, INVERSION, SPOIL_AFTER, SHIFT_AFTER = 1, 2, 4, 8, 16
RECORD, ROTATE, INTERVAL = 32, 64, 256

_p = ctypes.c_void_p
_i64 = ctypes.c_int64
_i32 = ctypes.c_int32


class Program(ctypes.Structure):
    _fields_ = [
        ("num_events", _i64),
        ("num_repetitions", _i64),
        ("num_samples", _i64),
        ("num_states", _i64),
        ("path", _i32),
        ("checkpoint_stride", _i32),
        ("action", _p),
        ("record", _p),
        ("dt_s", _p),
        ("dt_wrap_s", _p),
        ("flip_rad", _p),
        ("phase_rad", _p),
        ("crusher_dk_rad_per_m", ctypes.c_double),
        ("voxel_size_m", ctypes.c_double),
        ("num_transverse_pools", _i32),
        ("num_longitudinal_pools", _i32),
        ("tabulated", _i32),
        ("checkpoint_slots", _i32),
        ("num_intervals", _i64),
        ("interval", _p),
        ("wrap_interval", _i64),
        ("field_row", _p),
        ("profile_row", _p),
        ("spinor_row", _p),
        ("num_field_rows", _i64),
        ("num_spinor_rows", _i64),
        ("num_profile_rows", _i64),
        ("num_positions", _i64),
        ("voxel_offset", _i64),
        ("profile_bins", _i64),
        ("profile_theta_max", ctypes.c_double),
    ]


#: Tables, in the order of `struct bs_tables`: a tabulated layout's (L, r, T, zeq, sat), then the per-voxel
#: pulses' (field, spinor, profile: csrc/include/blochsim/pulses.hpp).
TABLES = ("L", "r", "T", "zeq", "sat", "field", "spinor", "profile")
POOL_TABLES = TABLES[:5]


class Tables(ctypes.Structure):
    _fields_ = [(name, _p) for name in TABLES] + [("stride_v", _i64 * len(TABLES)), ("stride_p", _i64 * len(TABLES))]


class TableGrads(ctypes.Structure):
    _fields_ = [(name, _p) for name in TABLES]


class Tissue(ctypes.Structure):
    _fields_ = [("num_voxels", _i64), ("data", _p * NUM_TISSUE), ("stride", _i64 * NUM_TISSUE)]


class Tangents(ctypes.Structure):
    _fields_ = [
        ("count", _i32),
        ("tissue", _p * NUM_TISSUE),
        ("tissue_stride_p", _i64 * NUM_TISSUE),
        ("tissue_stride_v", _i64 * NUM_TISSUE),
        ("dt_s", _p),
        ("dt_wrap_s", _p),
        ("flip_rad", _p),
        ("phase_rad", _p),
    ]


class Grads(ctypes.Structure):
    _fields_ = [("dt_s", _p), ("dt_wrap_s", _p), ("flip_rad", _p), ("phase_rad", _p), ("tissue", _p * NUM_TISSUE)]


class ForwardArgs(ctypes.Structure):
    _fields_ = [
        ("dtype", _i32),
        ("num_threads", _i32),
        ("stream", _p),
        ("program", Program),
        ("tissue", Tissue),
        ("tables", Tables),
        ("signal", _p),
        ("scratch", _p),
        ("scratch_bytes", _i64),
    ]


class JvpArgs(ctypes.Structure):
    _fields_ = [
        ("dtype", _i32),
        ("num_threads", _i32),
        ("stream", _p),
        ("program", Program),
        ("tissue", Tissue),
        ("tables", Tables),
        ("tangents", Tangents),
        ("tables_tangent", Tables),
        ("signal", _p),
        ("signal_tangent", _p),
        ("scratch", _p),
        ("scratch_bytes", _i64),
    ]


class VjpArgs(ctypes.Structure):
    _fields_ = [
        ("dtype", _i32),
        ("num_threads", _i32),
        ("stream", _p),
        ("program", Program),
        ("tissue", Tissue),
        ("tables", Tables),
        ("cotangent", _p),
        ("grads", Grads),
        ("table_grads", TableGrads),
        ("scratch", _p),
        ("scratch_bytes", _i64),
    ]


class VjpJvpArgs(ctypes.Structure):
    _fields_ = [
        ("dtype", _i32),
        ("num_threads", _i32),
        ("stream", _p),
        ("program", Program),
        ("tissue", Tissue),
        ("tables", Tables),
        ("tangents", Tangents),
        ("tables_tangent", Tables),
        ("cotangent", _p),
        ("cotangent_tangent", _p),
        ("grads", Grads),
        ("grads_tangent", Grads),
        ("table_grads", TableGrads),
        ("table_grads_tangent", TableGrads),
        ("signal", _p),
        ("signal_tangent", _p),
        ("scratch", _p),
        ("scratch_bytes", _i64),
    ]


class NativeLibraryError(ImportError):
    """The kernel library is missing, or was built for another ABI or release of blochsim."""


_ENTRY_POINTS = {
    "bs_epg_forward": ForwardArgs,
    "bs_epg_jvp": JvpArgs,
    "bs_epg_vjp": VjpArgs,
    "bs_epg_vjp_jvp": VjpJvpArgs,
}


def _candidates() -> list[Path]:
    """Where the host library may be: `BLOCHSIM_CPU_LIBRARY` alone when set; else beside this file, then in
    the installed distribution.

    The second place serves a source checkout imported ahead of its own installed build (`pip install .`,
    then `python -m pytest` from the checkout root, which puts the checkout first on sys.path): the checkout
    holds no compiled library, the installed copy of the same release does. `load_library` still checks its
    ABI and release against this package.
    """
    env = os.environ.get("BLOCHSIM_CPU_LIBRARY")
    if env:
        return [Path(env)]
    beside = Path(__file__).resolve().parent / "libblochsim_cpu.so"
    candidates = [beside]
    try:
        from importlib.metadata import PackageNotFoundError, distribution

        installed = Path(distribution("blochsim").locate_file("blochsim/libblochsim_cpu.so")).resolve()
    except (PackageNotFoundError, TypeError, ValueError):
        installed = None
    if installed is not None and installed != beside:
        candidates.append(installed)
    return candidates


def load_library(path: Path, *, expected_abi: int = ABI_VERSION, expected_version: str = __version__):
    """Load the library at `path` and check its ABI and release against this package."""
    try:
        lib = ctypes.CDLL(str(path))
    except OSError as exc:
        raise NativeLibraryError(f"cannot load the blochsim kernel library {path}: {exc}") from exc
    lib.bs_abi_version.restype = ctypes.c_int32
    lib.bs_version.restype = ctypes.c_char_p
    lib.bs_last_error.restype = ctypes.c_char_p
    abi = lib.bs_abi_version()
    if abi != expected_abi:
        raise NativeLibraryError(
            f"the kernel library {path} speaks ABI version {abi}, but this blochsim {expected_version} "
            f"needs ABI version {expected_abi}: reinstall blochsim (pip install --force-reinstall blochsim)"
        )
    built = lib.bs_version().decode()
    if built != expected_version:
        raise NativeLibraryError(
            f"the kernel library {path} was built for blochsim {built}, but this is blochsim "
            f"{expected_version}: reinstall blochsim so both come from one release"
        )
    type_entry_points(lib, _ENTRY_POINTS, "bs_epg_scratch_bytes", "bs_epg_resident_voxels")
    return lib


def type_entry_points(lib, entries: dict, *queries: str) -> None:
    """Give a kernel family's C entry points their ctypes signatures: each `name(const Args*) -> int32 status`
    of `entries` (name -> Args structure), and its `queries` (a scratch query, and the EPG family's resident
    voxels), each `query(int32 pass, const void* args) -> int64`."""
    for name, args in entries.items():
        fn = getattr(lib, name)
        fn.restype = ctypes.c_int32
        fn.argtypes = [ctypes.POINTER(args)]
    for name in queries:
        query = getattr(lib, name)
        query.restype = ctypes.c_int64
        query.argtypes = [ctypes.c_int32, ctypes.c_void_p]


_cpu = None


def cpu_library():
    """The loaded host kernel library (loaded and checked on first call)."""
    global _cpu
    if _cpu is None:
        errors = []
        for path in _candidates():
            if path.exists():
                _cpu = load_library(path)
                break
            errors.append(str(path))
        else:
            raise NativeLibraryError(
                "the blochsim kernel library libblochsim_cpu.so was not found (looked at "
                + ", ".join(errors)
                + "): install blochsim with pip, which compiles it, or set BLOCHSIM_CPU_LIBRARY to a build of it"
            )
    return _cpu



#: The bits of bs_host_lane_sets and bs_host_lanes_running (csrc/cpu/epg_lanes.cpp).
HOST_LANE_SETS = {1: "portable 4 lanes", 2: "AVX2", 4: "AVX-512"}


def host_lanes() -> tuple[list[str], str | None]:
    """The SIMD lane sets the host library holds (a source build holds its processor's widest; a wheel all),
    and the one the real plain path runs in this process (None: the per-voxel path)."""
    lib = cpu_library()
    for name in ("bs_host_lane_sets", "bs_host_lanes_running"):
        getattr(lib, name).restype = ctypes.c_int32
    built, running = lib.bs_host_lane_sets(), lib.bs_host_lanes_running()
    if running < 0:
        check_status(lib, 1, "bs_host_lanes_running")
    return [name for bit, name in HOST_LANE_SETS.items() if built & bit], HOST_LANE_SETS.get(running)


_cuda = None


def cuda_library():
    """The CUDA kernel library for torch's CUDA major version (loaded and checked on first call).

    `BLOCHSIM_CUDA_LIBRARY` points at a development build. Otherwise the package `blochsim_cuda12` or
    `blochsim_cuda13` matching `torch.version.cuda` is imported; a missing package, one for another major, or
    one from another release raises `CudaBuildMismatch` naming the extra to install.
    """
    global _cuda
    if _cuda is not None:
        return _cuda
    env = os.environ.get("BLOCHSIM_CUDA_LIBRARY")
    if env:
        _cuda = load_library(Path(env))
        return _cuda
    import importlib

    import torch

    from ._errors import CUDA_PACKAGES, CudaBuildMismatch, _install_line

    if torch.version.cuda is None:
        raise RuntimeError(
            f"this torch ({torch.__version__}) was built without CUDA; blochsim runs on the CPU until a CUDA "
            f"build of torch and the matching blochsim CUDA package are installed: {_install_line()}"
        )
    major = int(torch.version.cuda.split(".")[0])
    if major not in CUDA_PACKAGES:
        raise CudaBuildMismatch(f"torch uses CUDA {torch.version.cuda}: blochsim has CUDA builds for majors "
                                f"{sorted(CUDA_PACKAGES)} only. {_install_line()}")
    module, extra, driver = CUDA_PACKAGES[major]
    install = f'pip install "blochsim[{extra}]=={__version__}" (NVIDIA driver {driver})'
    try:
        package = importlib.import_module(module)
    except ImportError:
        others = [m for k, (m, _, _) in CUDA_PACKAGES.items() if k != major and _installed(m)]
        found = f" (found {', '.join(others)}, built for another CUDA major)" if others else ""
        raise CudaBuildMismatch(
            f"torch uses CUDA {torch.version.cuda} (major {major}) and no {module} is installed{found}: {install}"
        ) from None
    built_for = getattr(package, "CUDA_MAJOR", major)
    if built_for != major:
        raise CudaBuildMismatch(f"{module} says it was built for CUDA {built_for}, but torch uses CUDA "
                                f"{torch.version.cuda}: {install}")
    built = getattr(package, "__version__", "unknown")
    if built != __version__:
        raise CudaBuildMismatch(
            f"{module} {built} is installed, but this is blochsim {__version__}: both must come from one "
            f"release: {install}"
        )
    library = getattr(package, "LIBRARY", None) or Path(package.__file__).resolve().parent / "libblochsim_cuda.so"
    try:
        _cuda = load_library(Path(library))
    except NativeLibraryError as exc:
        raise CudaBuildMismatch(f"{exc}; reinstall: {install}") from exc
    return _cuda


def _installed(module: str) -> bool:
    """Whether `module` is imported or importable (find_spec raises for a module set to None in sys.modules)."""
    import importlib.util
    import sys

    if sys.modules.get(module) is not None:
        return True
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def check_status(lib, status: int, entry: str) -> None:
    """Raise RuntimeError with the library's message when an entry point failed."""
    if status != 0:
        raise RuntimeError(f"{entry} failed: {lib.bs_last_error().decode()}")
