"""Check built wheels of blochsim, blochsim-cuda12 and blochsim-cuda13 before they are published.

For each wheel: its tag and files; for every library in it `NEEDED`, `RUNPATH` and the newest glibc
symbol it needs (readelf); for the CUDA libraries the embedded architectures (cuobjdump: machine code for
sm_75, sm_80, sm_90 and PTX for compute_90) and that libcudart is linked by soname with an rpath into the
nvidia runtime wheel; then the library is loaded bare with ctypes in a fresh process, from a folder laid
out like site-packages (the wheel unpacked beside the nvidia runtime wheel torch depends on), its ABI and
release are read back, and the libcudart that got mapped must be the runtime wheel's; last, the version
pins (blochsim[cu12]/[cu13] -> blochsim-cudaNN==X.Y.Z -> blochsim==X.Y.Z).

    python scripts/check_wheel.py dist/*.whl [--runtime-wheels DIR]

The runtime wheels (nvidia-cuda-runtime-cu12, nvidia-cuda-runtime) come from DIR or are fetched once with
`pip download` into .whl/. cuobjdump is taken from PATH, /usr/local/cuda/bin, or the nvidia-cuda-cuobjdump
package (installed, or in .whl/tools where scripts/build_wheels.sh puts it). Exits non-zero if a check fails.
"""

from __future__ import annotations

import argparse
import email.parser
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CUDA = {  # package -> (module, runtime requirement, runtime wheel glob, runtime library, rpath)
    "blochsim-cuda12": ("blochsim_cuda12", "nvidia-cuda-runtime-cu12>=12.0,<13", "nvidia_cuda_runtime_cu12-12.*.whl",
                        "nvidia/cuda_runtime/lib/libcudart.so.12", "$ORIGIN/../nvidia/cuda_runtime/lib"),
    "blochsim-cuda13": ("blochsim_cuda13", "nvidia-cuda-runtime>=13.0,<14", "nvidia_cuda_runtime-13.*.whl",
                        "nvidia/cu13/lib/libcudart.so.13", "$ORIGIN/../nvidia/cu13/lib"),
}
# The oldest runtime of each major that torch ships (cu126, cu130): what the libraries must load against.
RUNTIME_DOWNLOADS = {"blochsim-cuda12": "nvidia-cuda-runtime-cu12==12.6.*",
                     "blochsim-cuda13": "nvidia-cuda-runtime==13.0.*"}
EXPECTED_ARCHS = {"elf": {"sm_75", "sm_80", "sm_90"}, "ptx": {"sm_90"}}

failures: list[str] = []


def check(ok: bool, what: str) -> bool:
    print(f"    {'ok  ' if ok else 'FAIL'} {what}")
    if not ok:
        failures.append(what)
    return ok


def read_metadata(whl: zipfile.ZipFile) -> tuple[dict, email.message.Message]:
    info = next(n.split("/")[0] for n in whl.namelist() if n.endswith(".dist-info/WHEEL"))
    wheel = email.parser.Parser().parsestr(whl.read(f"{info}/WHEEL").decode())
    meta = email.parser.Parser().parsestr(whl.read(f"{info}/METADATA").decode())
    return {"tags": wheel.get_all("Tag"), "purelib": wheel["Root-Is-Purelib"]}, meta


def requirement(text: str) -> tuple[str, frozenset, str]:
    """(name, specifiers, marker) of a Requires-Dist line, normalised (metadata reorders specifiers)."""
    spec, _, marker = text.partition(";")
    m = re.match(r"\s*([A-Za-z0-9_.-]+)\s*(.*)", spec)
    name = re.sub(r"[-_.]+", "-", m.group(1)).lower()
    return name, frozenset(s.replace(" ", "") for s in m.group(2).split(",") if s.strip()), marker.replace(" ", "")


def readelf(lib: Path) -> tuple[list[str], list[str], list[str]]:
    out = subprocess.run(["readelf", "-dW", str(lib)], capture_output=True, text=True, check=True).stdout
    needed = re.findall(r"\(NEEDED\).*\[(.*)\]", out)
    runpath = re.findall(r"\(RUNPATH\).*\[(.*)\]", out)
    rpath = re.findall(r"\(RPATH\).*\[(.*)\]", out)
    return needed, runpath, rpath


def newest_glibc(lib: Path) -> str:
    out = subprocess.run(["readelf", "--dyn-syms", "-W", str(lib)], capture_output=True, text=True).stdout
    versions = {tuple(int(x) for x in v.split(".")) for v in re.findall(r"@GLIBC_([0-9.]+)", out)}
    return ".".join(map(str, max(versions))) if versions else "none"


def find_cuobjdump() -> str | None:
    found = shutil.which("cuobjdump") or shutil.which("cuobjdump", path="/usr/local/cuda/bin")
    if found:
        return found
    spec = importlib.util.find_spec("nvidia")
    folders = [Path(f) for f in (spec.submodule_search_locations if spec else [])] + [ROOT / ".whl/tools/nvidia"]
    for folder in folders:
        for candidate in folder.glob("*/bin/cuobjdump"):
            return str(candidate)
    return None


def embedded_archs(lib: Path, cuobjdump: str) -> dict[str, set[str]]:
    out = subprocess.run([cuobjdump, "--list-elf", "--list-ptx", str(lib)], capture_output=True, text=True)
    text = out.stdout + out.stderr
    return {"elf": set(re.findall(r"ELF file\s+\d+:.*\.(sm_\d+)\.cubin", text)),
            "ptx": set(re.findall(r"PTX file\s+\d+:.*\.(sm_\d+)\.ptx", text))}


def runtime_wheel(package: str, folder: Path | None) -> Path:
    pattern = CUDA[package][2]
    for where in [folder, ROOT / ".whl"]:
        if where and sorted(where.glob(pattern)):
            return sorted(where.glob(pattern))[-1]
    dest = ROOT / ".whl"
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", str(dest),
                    RUNTIME_DOWNLOADS[package]], check=True)
    return sorted(dest.glob(pattern))[-1]


LOAD = r"""
import ctypes, json, sys
lib = ctypes.CDLL(sys.argv[1])
lib.bs_version.restype = ctypes.c_char_p
maps = [line.split()[-1] for line in open("/proc/self/maps") if "libcudart" in line]
lanes = lib.bs_host_lane_sets() if hasattr(lib, "bs_host_lane_sets") else None
print(json.dumps({"abi": lib.bs_abi_version(), "version": lib.bs_version().decode(), "cudart": sorted(set(maps)),
                  "lanes": lanes}))
"""


def load_bare(lib: Path) -> dict:
    import json

    env = {k: v for k, v in os.environ.items() if k not in ("LD_LIBRARY_PATH", "LD_PRELOAD")}
    out = subprocess.run([sys.executable, "-c", LOAD, str(lib)], capture_output=True, text=True, env=env)
    if out.returncode != 0:
        return {"error": out.stderr.strip().splitlines()[-1] if out.stderr.strip() else f"exit {out.returncode}"}
    return json.loads(out.stdout)


def expected_abi() -> int:
    text = (ROOT / "blochsim" / "_native.py").read_text()
    return int(re.search(r"^ABI_VERSION = (\d+)", text, re.M).group(1))


def check_wheel(path: Path, args, cuobjdump: str | None) -> tuple[str, str, list[str]]:
    print(f"{path.name}  ({path.stat().st_size / 1e6:.1f} MB)")
    with zipfile.ZipFile(path) as whl:
        wheel, meta = read_metadata(whl)
        name, version = meta["Name"], meta["Version"]
        requires = meta.get_all("Requires-Dist") or []
        files = [(i.filename, i.file_size) for i in whl.infolist() if ".dist-info/" not in i.filename]
        print(f"  tag {', '.join(wheel['tags'])}")
        for fname, size in files:
            print(f"    {size:>11,d}  {fname}")
        check(len(wheel["tags"]) == 1 and re.fullmatch(r"py3-none-(linux|manylinux)\w*", wheel["tags"][0]) is not None
              and wheel["purelib"] == "false", "tagged py3-none-<platform>, platlib (one wheel for every CPython)")
        site = Path(tempfile.mkdtemp(prefix="check_wheel_"))
        whl.extractall(site)
    names = {f for f, _ in files}
    libs = sorted(f for f in names if f.endswith(".so"))
    if name == "blochsim":
        check(libs == ["blochsim/libblochsim_cpu.so"], f"one library, blochsim/libblochsim_cpu.so (found {libs})")
    else:
        module, runtime_req, _, cudart, rpath = CUDA[name]
        want = {f"{module}/__init__.py", f"{module}/_version.py", f"{module}/libblochsim_cuda.so"}
        check(names == want, f"exactly {sorted(want)}")
        # Imported, not read: a template that writes a literal backslash-n passes a text search and fails
        # the import (the cause of a broken 0.1.0 build).
        imported = subprocess.run([sys.executable, "-c", f"import {module}; print({module}.__version__)"],
                                  cwd=site, capture_output=True, text=True)
        check(imported.returncode == 0 and imported.stdout.strip() == version,
              f"import {module}: __version__ == {version} ({(imported.stdout + imported.stderr).strip()[-200:]})")
        rt = runtime_wheel(name, args.runtime_wheels)
        with zipfile.ZipFile(rt) as z:
            z.extractall(site)
        print(f"  beside {rt.name}")
    for rel in libs:
        lib = site / rel
        needed, runpath, old_rpath = readelf(lib)
        print(f"  {rel}: NEEDED {', '.join(needed)}; RUNPATH {', '.join(runpath) or '-'}; "
              f"newest glibc symbol {newest_glibc(lib)}")
        check("libstdc++.so.6" not in needed, "libstdc++ linked statically (loads beside any torch)")
        if name != "blochsim":
            soname = Path(cudart).name
            check(soname in needed and "libcudart.so" not in needed, f"libcudart linked by soname ({soname})")
            check(not any(n.startswith("libcuda.so") for n in needed), "no link-time dependency on the driver")
            check(runpath == [rpath] and not old_rpath, f"RUNPATH {rpath} (no DT_RPATH)")
            if cuobjdump:
                archs = embedded_archs(lib, cuobjdump)
                print(f"    cuobjdump: machine code {sorted(archs['elf'])}, PTX "
                      f"{sorted(a.replace('sm_', 'compute_') for a in archs['ptx'])}")
                check(archs == EXPECTED_ARCHS, "sm_75, sm_80, sm_90 machine code and compute_90 PTX")
            else:
                check(False, "cuobjdump found (pip install nvidia-cuda-cuobjdump)")
        loaded = load_bare(lib)
        if check("error" not in loaded, f"loads bare with ctypes {loaded.get('error', '')}".rstrip()):
            check(loaded["abi"] == expected_abi(), f"bs_abi_version() = {loaded['abi']} (blochsim speaks "
                                                   f"{expected_abi()})")
            check(loaded["version"] == version, f"bs_version() = {loaded['version']!r}")
            if name == "blochsim":  # built with BLOCHSIM_HOST_LANES=all: the wheel runs on other processors
                check(loaded["lanes"] == 6, f"AVX2 and AVX-512 lanes both built (bs_host_lane_sets() = "
                                            f"{loaded['lanes']}, want 6)")
            if name != "blochsim":
                mapped = [str(Path(p).resolve()) for p in loaded["cudart"]]
                check(mapped == [str((site / cudart).resolve())],
                      f"libcudart resolved through the rpath into the runtime wheel ({', '.join(mapped)})")
    shutil.rmtree(site, ignore_errors=True)
    if name != "blochsim":
        have = {requirement(r) for r in requires}
        check(requirement(f"blochsim=={version}") in have, f"pins blochsim=={version}")
        check(requirement(CUDA[name][1]) in have, f"depends on {CUDA[name][1]}")
    return name, version, requires


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("wheels", nargs="+", type=Path)
    ap.add_argument("--runtime-wheels", type=Path, help="folder with the nvidia runtime wheels (else pip download)")
    args = ap.parse_args(argv)
    cuobjdump = find_cuobjdump()
    seen = {}
    for path in args.wheels:
        name, version, requires = check_wheel(path, args, cuobjdump)
        seen[name] = (version, requires)
    print("version pins")
    versions = {v for v, _ in seen.values()}
    check(len(versions) == 1, f"one release across the wheels ({', '.join(sorted(versions))})")
    if "blochsim" in seen:
        version, requires = seen["blochsim"]
        have = {requirement(r) for r in requires}
        for extra, package in (("cu12", "blochsim-cuda12"), ("cu13", "blochsim-cuda13")):
            check(requirement(f'{package}=={version}; extra == "{extra}"') in have,
                  f"blochsim[{extra}] -> {package}=={version}")
    print(f"{len(args.wheels)} wheels: {'all checks passed' if not failures else f'{len(failures)} checks FAILED'}")
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
