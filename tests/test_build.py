"""The host library's build: what `pip install .` configures (CMake only, nothing compiled: a few seconds)."""

from __future__ import annotations

import os
import platform
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

needs_cmake = pytest.mark.skipif(shutil.which("cmake") is None or shutil.which("ninja") is None,
                                 reason="needs cmake and ninja")


def configure(out: Path, *defines: str) -> subprocess.CompletedProcess:
    """A Release configure of the checkout with Ninja, as scikit-build-core runs it (its build tree)."""
    return subprocess.run(["cmake", "-S", str(ROOT), "-B", str(out), "-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release",
                           *defines], capture_output=True, text=True)


@pytest.fixture(scope="module")
def configured(tmp_path_factory) -> Path:
    """The configure of the tests' install (README's test command: every lane set built)."""
    out = tmp_path_factory.mktemp("install_configure")
    done = configure(out, "-DBLOCHSIM_HOST_LANES=all")
    assert done.returncode == 0, done.stderr[-2000:]
    return out


@pytest.fixture(scope="module")
def build_ninja(configured) -> str:
    """build.ninja of that configure."""
    return (configured / "build.ninja").read_text()


def wide_lane_units(build_ninja: str) -> list[str]:
    return sorted(Path(o).name for o, _ in host_objects(build_ninja) if re.search(r"epg_lanes_avx\d+\.cpp\.o$", o))


def processor_widest() -> str:
    flags = Path("/proc/cpuinfo").read_text().split() if Path("/proc/cpuinfo").exists() else []
    if "avx2" in flags and "fma" in flags:
        return "avx512" if {"avx512f", "avx512vl", "avx512dq"} <= set(flags) else "avx2"
    return "none"


gcc_x86 = pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64") or shutil.which("g++") is None
                             or not Path("/proc/cpuinfo").exists(),
                             reason="the wide lanes are built by GCC on x86-64 (the processor read from /proc/cpuinfo)")


@needs_cmake
@gcc_x86
def test_a_source_build_compiles_only_its_processors_lane_set(tmp_path, build_ninja):
    # `pip install .` (BLOCHSIM_HOST_LANES=native, the default) compiles the one wide lane unit this processor
    # runs, about 20 s of CPU less than both; the tests' install (`all`) and the wheels compile both.
    done = configure(tmp_path / "native")
    assert done.returncode == 0, done.stderr[-2000:]
    native = wide_lane_units((tmp_path / "native" / "build.ninja").read_text())
    widest = processor_widest()
    assert native == ([] if widest == "none" else [f"epg_lanes_{widest}.cpp.o"]), (widest, native)
    assert f"host lane units for this processor: {widest}" in done.stdout
    assert wide_lane_units(build_ninja) == ["epg_lanes_avx2.cpp.o", "epg_lanes_avx512.cpp.o"]


@needs_cmake
def test_an_unknown_lane_choice_is_refused(tmp_path):
    done = configure(tmp_path / "bad", "-DBLOCHSIM_HOST_LANES=avx2")
    assert done.returncode != 0
    assert "BLOCHSIM_HOST_LANES must be native or all, got 'avx2'" in done.stderr


def host_objects(build_ninja: str) -> list[tuple[str, str]]:
    """(object path, its FLAGS) of each unit of libblochsim_cpu, in the order ninja lists them."""
    found = []
    for m in re.finditer(r"^build (\S*blochsim_cpu\.dir/\S+\.o): \S+ (.*?)(?=^build |\Z)", build_ninja, re.M | re.S):
        flags = re.search(r"^\s*FLAGS = (.*)$", m.group(2), re.M)
        found.append((m.group(1), flags.group(1) if flags else ""))
    return found


@needs_cmake
def test_host_objects_survive_a_second_install(build_ninja):
    # scikit-build-core deletes the top-level CMakeFiles/ when pip's build environment moves (every `pip
    # install`): objects kept there would all compile again for the README's second set-up command.
    objects = [o for o, _ in host_objects(build_ninja)]
    assert len(objects) > 20, objects
    assert all(o.startswith("csrc/cpu/CMakeFiles/") for o in objects), objects


def test_build_dir_is_a_fixed_folder_of_the_checkout():
    # The second `pip install` finds the first one's build only in a folder that does not change between them.
    if sys.version_info < (3, 11):
        pytest.skip("tomllib is Python 3.11+")
    import tomllib

    build_dir = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["scikit-build"]["build-dir"]
    assert not Path(build_dir).is_absolute() and build_dir.startswith("build/"), build_dir
    assert "{state}" not in build_dir and "{build_type}" not in build_dir, build_dir


@needs_cmake
def test_the_double_adjoints_and_the_real_path_second_order_are_compiled_at_O2(build_ninja):
    # -O2 where the speed lost was measured and accepted (docs/design.md, "Build and loading"): the
    # double-precision adjoints (float64 is the oracle's and the fitting's precision) and the real-path second
    # order of float; every other unit, the double forward among them, holds a hot path measured slower at -O2.
    # The last -O on a unit's command line is the one GCC uses.
    def level(flags: str) -> str:
        return re.findall(r"(?<!\S)-O\w*", flags)[-1]

    levels = {Path(o).name: level(f) for o, f in host_objects(build_ninja)}
    lowered = sorted(name for name, opt in levels.items() if opt != "-O3")
    doubles = ["epg_vjp_double.cpp.o", "epg_vjp_jvp_double_false.cpp.o", "epg_vjp_jvp_double_true.cpp.o"]
    assert lowered == sorted([*doubles, "epg_vjp_jvp_float_false.cpp.o"]), levels
    assert {levels[n] for n in lowered} == {"-O2"}


@needs_cmake
def test_the_longest_units_are_listed_first(build_ninja):
    # Ninja starts units in the order listed: the wide lane units and the complex second order (the longest
    # compiles) first, so two cores do not end the build waiting on one of them. The SSE2 lane unit, empty under
    # GCC on x86-64 (test_no_baseline_lanes_beside_the_wide_ones), is not among them.
    names = [Path(o).name for o, _ in host_objects(build_ninja)]
    assert {n.split(".")[0] for n in names[:4]} == {"epg_lanes_avx2", "epg_lanes_avx512", "epg_vjp_jvp_float_true",
                                                    "epg_vjp_jvp_double_true"}, names


@needs_cmake
def test_compiles_run_one_per_core(configured, build_ninja):
    # Ninja's default runs cores + 2 jobs; on 2 cores four of the long units at once cost 11-13% more CPU and
    # wall time than two (csrc/cpu/CMakeLists.txt), so the host units share a pool as deep as the cores.
    units = host_objects(build_ninja)
    pooled = re.findall(r"^build \S*blochsim_cpu\.dir/\S+\.o: .*?\n(?:\s+\S+ = .*\n)*?\s+pool = blochsim_compile$",
                        build_ninja, re.M)
    assert len(pooled) == len(units), (len(pooled), len(units))
    rules = (configured / re.search(r"^include (\S*rules\.ninja)$", build_ninja, re.M).group(1)).read_text()
    depth = re.search(r"^pool blochsim_compile\n\s+depth = (\d+)$", rules, re.M)
    assert depth and 1 <= int(depth.group(1)) <= (os.cpu_count() or 1), rules[:400]


@needs_cmake
def test_no_unit_for_eight_tangents(build_ninja):
    # The JVP runs eight tangents as two passes of four (csrc/cpu/epg_jvp.cpp): a unit for eight, 15-19 s of a
    # fresh install's CPU each, would be compiled for nothing.
    names = [Path(o).name for o, _ in host_objects(build_ninja)]
    assert not [n for n in names if n.startswith("epg_jvp_") and n.endswith("_8.cpp.o")], names
    assert {f"epg_jvp_{r}_{p}.cpp.o" for r in ("float", "double") for p in (1, 2, 4)} <= set(names), names


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64") or shutil.which("g++") is None,
                    reason="the wide lanes are built by GCC on x86-64")
def test_no_baseline_lanes_beside_the_wide_ones():
    # Under GCC on x86-64 the AVX2 and AVX-512 lanes are built, and a processor with neither runs the per-voxel
    # path: the SSE2 lane code (18 s of a fresh install's CPU) is preprocessed away. Elsewhere it is the only
    # lane code, so it must still be there without the wide sets (preprocessed both ways: -D__clang__ plays a
    # compiler without GCC's target regions).
    def preprocessed(*defines: str) -> str:
        command = ["g++", "-std=gnu++17", "-E", "-P", f"-I{ROOT / 'csrc/include'}", f"-I{ROOT / 'csrc'}", *defines,
                   str(ROOT / "csrc/cpu/epg_lanes_sse2.cpp")]
        return subprocess.run(command, check=True, capture_output=True, text=True).stdout

    assert "lanes_sse2" not in preprocessed()
    assert "lanes_sse2" in preprocessed("-D__clang__")
