"""The host library's build: what `pip install .` configures (CMake only, nothing compiled: a few seconds)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

needs_cmake = pytest.mark.skipif(shutil.which("cmake") is None or shutil.which("ninja") is None,
                                 reason="needs cmake and ninja")


@pytest.fixture(scope="module")
def build_ninja(tmp_path_factory) -> str:
    """build.ninja of a Release configure of the checkout, as scikit-build-core runs it."""
    out = tmp_path_factory.mktemp("install_configure")
    subprocess.run(["cmake", "-S", str(ROOT), "-B", str(out), "-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release"],
                   check=True, capture_output=True)
    return (out / "build.ninja").read_text()


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
def test_only_the_real_path_second_order_is_compiled_at_O2(build_ninja):
    # Every other unit holds a hot path measured slower at -O2 (docs/design.md, "Build and loading"): the
    # last -O on a unit's command line is the one GCC uses.
    def level(flags: str) -> str:
        return re.findall(r"(?<!\S)-O\w*", flags)[-1]

    levels = {Path(o).name: level(f) for o, f in host_objects(build_ninja)}
    lowered = sorted(name for name, opt in levels.items() if opt != "-O3")
    assert lowered == ["epg_vjp_jvp_double_false.cpp.o", "epg_vjp_jvp_float_false.cpp.o"], levels
    assert {levels[n] for n in lowered} == {"-O2"}


@needs_cmake
def test_the_longest_units_are_listed_first(build_ninja):
    # Ninja starts units in the order listed: the lane units and the JVP at 8 tangents (the longest compiles)
    # first, so two cores do not end the build waiting on one of them.
    names = [Path(o).name for o, _ in host_objects(build_ninja)]
    first = names[:5]
    assert {n.split(".")[0] for n in first} == {"epg_lanes_avx2", "epg_lanes_avx512", "epg_lanes_sse2",
                                                "epg_jvp_float_8", "epg_jvp_double_8"}, names
