"""The kernel library: loading, the ABI/version handshake, and the exported symbols."""

import shutil
import subprocess
from pathlib import Path

import pytest

from blochsim import _native as nat


def test_library_loads_with_matching_abi_and_version():
    lib = nat.cpu_library()
    assert lib.bs_abi_version() == nat.ABI_VERSION
    assert lib.bs_version().decode() == __import__("blochsim").__version__


def _library_path() -> Path:
    return Path(nat.cpu_library()._name)


def test_abi_mismatch_is_refused_with_a_clear_message():
    with pytest.raises(nat.NativeLibraryError, match=rf"ABI version {nat.ABI_VERSION}, but .* needs ABI version 99"):
        nat.load_library(_library_path(), expected_abi=99)


def test_release_mismatch_is_refused_with_a_clear_message():
    with pytest.raises(nat.NativeLibraryError, match=r"built for blochsim .* but this is blochsim 9\.9\.9"):
        nat.load_library(_library_path(), expected_version="9.9.9")


def test_missing_library_names_the_fix(tmp_path):
    with pytest.raises(nat.NativeLibraryError, match="cannot load"):
        nat.load_library(tmp_path / "libblochsim_cpu.so")


@pytest.mark.skipif(shutil.which("readelf") is None, reason="readelf not installed")
def test_only_the_bs_abi_is_exported():
    out = subprocess.run(["readelf", "--dyn-syms", "-W", str(_library_path())], capture_output=True, text=True).stdout
    exported = {
        line.split()[-1]
        for line in out.splitlines()
        if " GLOBAL " in line and " DEFAULT " in line and " UND " not in line and "FUNC" in line
    }
    assert exported, "no exported functions found"
    assert all(name.startswith("bs_") for name in exported), sorted(exported)
    assert {"bs_abi_version", "bs_last_error", "bs_epg_forward", "bs_epg_vjp"} <= exported


def test_a_failing_entry_point_reports_its_error():
    import ctypes

    lib = nat.cpu_library()
    args = nat.ForwardArgs()
    args.dtype = 7
    status = lib.bs_epg_forward(ctypes.byref(args))
    assert status != 0
    assert "dtype must be BS_FLOAT32" in lib.bs_last_error().decode()
