"""The CUDA loader (`blochsim._native.cuda_library`) without a GPU.

torch's CUDA version is mocked (`torch.version.cuda`) and the per-major packages are faked in `sys.modules`,
so every refusal is checked on the CPU: no CUDA torch, an unsupported major, a missing package (with and
without the other major's package installed), a package built for another major or from another release,
and a broken library. A fake package whose library is a copy of the host library (it exports the same
bs_* ABI and release) shows the package is chosen by torch's major and loaded. Last, the two CUDA launchers
(the nvcc library's and the CUDA 12 package's g++ one) are held to their one launch table: every kernel is a
row of it, no launcher file names a kernel or starts one by hand, and the CUDA 12 package's kernel list is
compiled from the shared launch plan.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch

import blochsim
from blochsim import _native
from blochsim._errors import CudaBuildMismatch

V = blochsim.__version__


@pytest.fixture
def cuda(monkeypatch):
    """Set torch's CUDA version; no blochsim CUDA package is importable until `fake_package` adds one."""
    monkeypatch.delenv("BLOCHSIM_CUDA_LIBRARY", raising=False)
    monkeypatch.setattr(_native, "_cuda", None)
    for module in ("blochsim_cuda12", "blochsim_cuda13"):
        monkeypatch.setitem(sys.modules, module, None)  # None: `import` raises ImportError

    def set_version(version):
        monkeypatch.setattr(torch.version, "cuda", version)

    return set_version


@pytest.fixture
def fake_package(monkeypatch, tmp_path):
    def make(major: int, version: str = V, library: Path | None = None, cuda_major: int | None = None):
        folder = tmp_path / f"blochsim_cuda{major}"
        folder.mkdir(exist_ok=True)
        if library is None:  # the host library speaks the same ABI and release
            library = folder / "libblochsim_cuda.so"
            shutil.copy(_native.cpu_library()._name, library)
        module = types.ModuleType(f"blochsim_cuda{major}")
        module.__file__ = str(folder / "__init__.py")
        module.__version__ = version
        module.CUDA_MAJOR = major if cuda_major is None else cuda_major
        module.LIBRARY = library
        monkeypatch.setitem(sys.modules, module.__name__, module)
        return module

    return make


def test_mismatch_is_an_import_error():
    assert issubclass(CudaBuildMismatch, ImportError)


def test_torch_without_cuda_says_how_to_get_the_gpu_build(cuda):
    cuda(None)
    with pytest.raises(RuntimeError, match=r"built without CUDA.*blochsim\[cu12\].*blochsim\[cu13\]"):
        _native.cuda_library()


def test_unsupported_major_names_both_extras(cuda):
    cuda("11.8")
    with pytest.raises(CudaBuildMismatch, match=rf'CUDA 11.8.*pip install "blochsim\[cu12\]=={V}".*\[cu13\]'):
        _native.cuda_library()


@pytest.mark.parametrize("version,extra,driver", [("13.0", "cu13", "R580"), ("12.6", "cu12", "R525")])
def test_missing_package_names_the_extra_and_driver(cuda, version, extra, driver):
    cuda(version)
    with pytest.raises(CudaBuildMismatch, match=rf'no blochsim_{extra.replace("cu", "cuda")} is installed: '
                                                rf'pip install "blochsim\[{extra}\]=={V}" \(NVIDIA driver {driver}'):
        _native.cuda_library()


def test_package_for_the_other_major_is_refused(cuda, fake_package):
    fake_package(13)
    cuda("12.4")
    with pytest.raises(CudaBuildMismatch, match=rf'found blochsim_cuda13, built for another CUDA major.*'
                                                rf'"blochsim\[cu12\]=={V}"'):
        _native.cuda_library()


def test_package_that_says_another_major_is_refused(cuda, fake_package):
    fake_package(13, cuda_major=12)
    cuda("13.0")
    with pytest.raises(CudaBuildMismatch, match=rf'built for CUDA 12, but torch uses CUDA 13.0.*\[cu13\]=={V}'):
        _native.cuda_library()


def test_package_from_another_release_is_refused(cuda, fake_package):
    fake_package(13, version="0.0.1")
    cuda("13.0")
    with pytest.raises(CudaBuildMismatch, match=rf'blochsim_cuda13 0.0.1 is installed, but this is blochsim {V}.*'
                                                rf'pip install "blochsim\[cu13\]=={V}"'):
        _native.cuda_library()


def test_broken_library_is_refused_with_the_reinstall_line(cuda, fake_package, tmp_path):
    fake_package(13, library=tmp_path / "missing.so")
    cuda("13.0")
    with pytest.raises(CudaBuildMismatch, match=rf'cannot load.*reinstall: pip install "blochsim\[cu13\]=={V}"'):
        _native.cuda_library()


@pytest.mark.parametrize("version,chosen", [("12.6", 12), ("13.0", 13), ("13.2", 13)])
def test_the_package_of_torchs_major_is_loaded(cuda, fake_package, version, chosen):
    packages = {major: fake_package(major) for major in (12, 13)}
    cuda(version)
    lib = _native.cuda_library()
    assert Path(lib._name) == packages[chosen].LIBRARY
    assert lib.bs_abi_version() == _native.ABI_VERSION
    assert _native.cuda_library() is lib  # loaded once


def test_development_build_overrides_the_packages(cuda, monkeypatch):
    cuda("13.0")
    monkeypatch.setenv("BLOCHSIM_CUDA_LIBRARY", _native.cpu_library()._name)
    assert _native.cuda_library().bs_version().decode() == V


# ---- both CUDA launchers are written over one launch table (launch_table.def) -----------------------------
CSRC = Path(__file__).resolve().parents[1] / "csrc"
TABLE = CSRC / "include/blochsim/launch_table.def"
PLAN = "include/blochsim/launch_plan.hpp"
RULES = ("threads_for", "blocks_for", "padded_voxels", "registers_layout", "forward_scratch_bytes",
         "vjp_state_bytes", "vjp_scratch_bytes")
# Rules the kernels read too (a thread's scratch tile: epg_device.cuh thread_scratch), so they live in the
# device-side header launch_rules.hpp includes (it is host-only: NVRTC has no <cstdlib>).
SHARED_RULES = ("device_scratch_per_voxel", "lane_store_size")
# The host code of both CUDA libraries: the shared plan and C ABI, the nvcc library's launcher and pass
# units, the CUDA 12 package's launcher and kernel list. PERK's unit (cuda/perk.cu) is not EPG launch code:
# its kernels are a family of their own, outside the table, started by that unit alone.
LAUNCH_FILES = sorted(
    [PLAN, "include/blochsim/cuda_abi.inc", "cuda/epg_launch.cuh", "cuda/passes.cuh",
     "cuda12_launcher/launcher.cpp", "cuda12_launcher/fatbin_kernels.hpp", "cuda12_launcher/kernel_list.cpp"]
    + [str(p.relative_to(CSRC)) for p in (CSRC / "cuda").glob("*.cu") if not p.name.startswith("perk")])


def table_rows() -> dict[str, str]:
    """tag -> kernel, for each row of the table."""
    return dict(re.findall(r"^BS_KERNEL\((\w+), (\w+),", TABLE.read_text(), re.M))


def code(path: Path) -> str:
    """The file without its // comments (which may name kernels)."""
    return re.sub(r"//[^\n]*", "", path.read_text())


def device_kernels() -> set[str]:
    text = re.sub(r"__launch_bounds__\((?:[^()]|\((?:[^()]|\([^()]*\))*\))*\)", "", code(CSRC / "cuda/epg_device.cuh"))
    return set(re.findall(r"__global__\s+void\s+(\w+)\(", text))


def test_every_kernel_is_a_row_of_the_launch_table():
    """A kernel the table lacks could not be started; a row without a kernel or a use is dead."""
    rows = table_rows()
    assert sorted(rows.values()) == sorted(device_kernels())
    plan = code(CSRC / PLAN)
    for tag in rows:
        assert re.search(rf"\b{tag}<", plan), f"launch_plan.hpp never starts {tag} (launch_table.def)"


@pytest.mark.parametrize("host_file", LAUNCH_FILES)
def test_launchers_name_kernels_only_through_the_table(host_file):
    """Launch code starts kernels by the table's tags (launch_plan.hpp): a kernel named in it, or started
    by hand, would be a second place to change for a new kernel or launch rule."""
    text = code(CSRC / host_file)
    named = sorted(kernel for kernel in table_rows().values() if re.search(rf"\b{kernel}\b", text))
    assert not named, f"{host_file} names {named}"
    # One <<<>>> (the nvcc launcher's, for every row) and one cuLaunchKernel (the CUDA 12 launcher's).
    assert text.count("<<<") == (host_file == "cuda/epg_launch.cuh")
    assert len(re.findall(r"\blaunch_kernel\(", text)) == (host_file == "cuda12_launcher/launcher.cpp")


@pytest.mark.parametrize("host_file, includes", [
    (PLAN, ["blochsim/launch_table.def", "blochsim/launch_rules.hpp"]),
    ("cuda/epg_launch.cuh", ["blochsim/launch_table.def", "blochsim/launch_plan.hpp"]),
    ("cuda/capi_cuda.cu", ["blochsim/cuda_abi.inc"]),
    ("cuda12_launcher/launcher.cpp", ["blochsim/cuda_abi.inc", "cuda12_launcher/fatbin_kernels.hpp"]),
    ("cuda12_launcher/kernel_list.cpp", ["blochsim/cuda_abi.inc", "cuda12_launcher/fatbin_kernels.hpp"]),
    ("cuda12_launcher/fatbin_kernels.hpp", ["blochsim/launch_plan.hpp"]),
])
def test_both_launchers_are_written_over_the_plan(host_file, includes):
    text = (CSRC / host_file).read_text()
    for header in includes:
        assert f'#include "{header}"' in text, f"{host_file} does not include {header}"


@pytest.mark.parametrize("host_file", LAUNCH_FILES + ["cuda/epg_device.cuh"])
def test_launch_rules_live_in_one_header(host_file):
    """Both launchers size scratch and blocks by launch_rules.hpp; a private copy could drift from the kernels."""
    text = (CSRC / host_file).read_text()
    for header, functions in (("launch_rules.hpp", RULES), ("event_loop.hpp", SHARED_RULES)):
        rules = (CSRC / "include/blochsim" / header).read_text()
        for function in functions:
            assert re.search(rf"\b{function}\([^;)]*\)\s*\{{", rules), f"{function} missing from {header}"
            assert not re.search(rf"\b{function}\([^;)]*\)\s*\{{", text), f"{host_file} defines its own {function}"


def test_cu12_kernel_list_is_compiled_from_the_plan(tmp_path):
    """The CUDA 12 package's fatbin holds what kernel_list.cpp lists (CMakeLists.txt, build_cu12_fatbin.py):
    the launch plan compiled by g++ with that package's launcher. Its kernels are the table's thread-per-voxel
    rows, named as NVRTC instantiates them; no name is written by hand anywhere."""
    compiler = shutil.which("c++") or shutil.which("g++")
    if compiler is None:
        pytest.skip("no C++ compiler on PATH")
    program = tmp_path / "kernel_list"
    subprocess.run([compiler, "-std=c++17", "-I", str(CSRC / "include"), "-I", str(CSRC),
                    str(CSRC / "cuda12_launcher/kernel_list.cpp"), "-o", str(program)], check=True)
    listed = subprocess.run([str(program)], check=True, capture_output=True, text=True).stdout.splitlines()
    names = [re.fullmatch(r"bs::(\w+)<.*, float>", line) for line in listed]
    assert listed and all(names), listed
    rows = table_rows()
    assert {name.group(1) for name in names} == {rows["ForwardThread"], rows["AdjointThread"]}
    script = (CSRC.parent / "scripts/build_cu12_fatbin.py").read_text()
    assert not [kernel for kernel in rows.values() if kernel in script]


def test_cu12_launcher_passes_the_kernels_parameters():
    """The CUDA 12 launcher passes the plan's arguments byte for byte (cuLaunchKernel converts nothing, unlike
    <<<>>>): a changed signature needs launch_plan.hpp's arguments for it to match exactly."""
    text = " ".join((CSRC / "cuda/epg_device.cuh").read_text().split())
    params = {name: re.search(rf"{name}\((.*?)\) \{{", text).group(1) for name in ("forward_kernel", "vjp_kernel")}
    assert params == {
        "forward_kernel": "const Problem<R> pb_in, int64_t V, SampleIO<N> io, S* scratch",
        "vjp_kernel": "const Problem<R> pb_in, int64_t V, SampleIO<N> io, DeviceEventGrad<N> eg, GradOut<R> out, "
                      "S* scratch, N* table_scratch",
    }
