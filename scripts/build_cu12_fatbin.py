"""Compile the CUDA 12 package's kernels without nvcc: NVRTC 12 -> cubins + PTX -> one compressed fatbin.

Why this exists: PyPI ships no CUDA 12 nvcc, but NVRTC (`nvidia-cuda-nvrtc-cu12`) compiles the same device
headers as nvcc, and nvFatbin (`nvidia-nvfatbin-cu12`) packs its output, so the blochsim-cuda12 wheel
builds from PyPI packages alone. The kernels are templates; NVRTC instantiates each one
from its name expression and reports its lowered (mangled) name, which the g++ launcher
(csrc/cuda12_launcher/launcher.cpp) needs to find it in the loaded library. The expressions are those the
launcher can start, as csrc/cuda12_launcher/kernel_list.cpp lists them from the launch plan it shares with
the nvcc library (csrc/include/blochsim/launch_plan.hpp). Outputs: the fatbin and a header mapping every
name expression to its lowered name.

CMake runs this for BLOCHSIM_CUDA_PACKAGE=12, after the list; by hand:
    g++ -std=c++17 -Icsrc/include -Icsrc csrc/cuda12_launcher/kernel_list.cpp -o build/kernel_list
    build/kernel_list build/cu12/cu12_kernels.txt
    python scripts/build_cu12_fatbin.py --out build/cu12 --kernels build/cu12/cu12_kernels.txt --archs 75 80 90 --ptx 90
"""

from __future__ import annotations

import argparse
import ctypes
import importlib.util
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / "csrc" / "cuda12_launcher" / "kernels.cu"
INCLUDES = [
    ROOT / "csrc" / "cuda12_launcher" / "nvrtc_include",  # first: stands in for the standard headers
    ROOT / "csrc" / "cuda",
    ROOT / "csrc" / "include",
    ROOT / "csrc",
]
# NVRTC rejects -O3 (it optimises fully by default); the rest matches the nvcc build in CMakeLists.txt.
OPTIONS = ["--std=c++17", "-default-device", "-DNDEBUG", "--diag-suppress=1097"]


def read_kernels(path: Path) -> list[str]:
    """The name expressions in `path`, one a line (kernel_list.cpp's output)."""
    names = [line.strip() for line in path.read_text().splitlines() if line.strip()]
    if not names:
        raise SystemExit(f"{path} lists no kernels")
    return names


def _package_lib(package: str, pattern: str) -> Path:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit(f"{package} is not installed: pip install the CUDA 12 build requirements "
                         "(packages/blochsim-cuda12/pyproject.toml)")
    for folder in spec.submodule_search_locations:
        found = sorted((Path(folder) / "lib").glob(pattern))
        if found:
            return found[0]
    raise SystemExit(f"no {pattern} in {package}")


def _check(lib, status: int, what: str, prog=None) -> None:
    if status == 0:
        return
    lib_error = getattr(lib, "nvrtcGetErrorString", None)
    message = lib_error(status).decode() if lib_error else f"status {status}"
    log = ""
    if prog is not None:
        size = ctypes.c_size_t()
        lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
        buf = ctypes.create_string_buffer(size.value)
        lib.nvrtcGetProgramLog(prog, buf)
        log = "\n" + buf.value.decode(errors="replace")
    raise RuntimeError(f"{what}: {message}{log}")


def compile_target(target: str, nvrtc_path: str, names: list[str]) -> tuple[str, bytes, dict[str, str], float]:
    """Compile kernels.cu for `target` ('sm_80': a cubin; 'compute_90': PTX), instantiating the kernels
    `names` (name expressions). Runs in a worker process."""
    start = time.perf_counter()
    nvrtc = ctypes.CDLL(nvrtc_path)
    nvrtc.nvrtcGetErrorString.restype = ctypes.c_char_p
    prog = ctypes.c_void_p()
    source = SOURCE.read_bytes()
    _check(nvrtc, nvrtc.nvrtcCreateProgram(ctypes.byref(prog), source, b"kernels.cu", 0, None, None), "create")
    for name in names:
        _check(nvrtc, nvrtc.nvrtcAddNameExpression(prog, name.encode()), f"name expression {name}")
    opts = OPTIONS + [f"-I{p}" for p in INCLUDES] + [f"--gpu-architecture={target}"]
    argv = (ctypes.c_char_p * len(opts))(*[o.encode() for o in opts])
    _check(nvrtc, nvrtc.nvrtcCompileProgram(prog, len(opts), argv), f"compile for {target}", prog)
    lowered = {}
    for name in names:
        out = ctypes.c_char_p()
        _check(nvrtc, nvrtc.nvrtcGetLoweredName(prog, name.encode(), ctypes.byref(out)), f"lowered name {name}")
        lowered[name] = out.value.decode()
    ptx = target.startswith("compute_")
    get_size, get = (nvrtc.nvrtcGetPTXSize, nvrtc.nvrtcGetPTX) if ptx else (nvrtc.nvrtcGetCUBINSize,
                                                                            nvrtc.nvrtcGetCUBIN)
    size = ctypes.c_size_t()
    _check(nvrtc, get_size(prog, ctypes.byref(size)), "output size")
    buf = ctypes.create_string_buffer(size.value)
    _check(nvrtc, get(prog, buf), "output")
    nvrtc.nvrtcDestroyProgram(ctypes.byref(prog))
    code = buf.raw if not ptx else buf.raw.rstrip(b"\0")
    return target, code, lowered, time.perf_counter() - start


def pack_fatbin(nvfatbin_path: str, parts: list[tuple[str, bytes]]) -> bytes:
    """One fatbin, every entry compressed (-compress-all: R525+ can read it, unlike --compress-mode)."""
    fb = ctypes.CDLL(nvfatbin_path)
    handle = ctypes.c_void_p()
    opts = (ctypes.c_char_p * 2)(b"-64", b"-compress-all")
    if fb.nvFatbinCreate(ctypes.byref(handle), opts, 2) != 0:
        raise RuntimeError("nvFatbinCreate failed")
    for target, code in parts:
        arch = target.split("_")[1].encode()
        if target.startswith("compute_"):
            status = fb.nvFatbinAddPTX(handle, code, len(code), arch, b"blochsim", None)
        else:
            status = fb.nvFatbinAddCubin(handle, code, len(code), arch, b"blochsim")
        if status != 0:
            raise RuntimeError(f"nvFatbin could not add {target} (status {status})")
    size = ctypes.c_size_t()
    fb.nvFatbinSize(handle, ctypes.byref(size))
    out = ctypes.create_string_buffer(size.value)
    if fb.nvFatbinGet(handle, out) != 0:
        raise RuntimeError("nvFatbinGet failed")
    fb.nvFatbinDestroy(ctypes.byref(handle))
    return out.raw


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="folder for blochsim_cu12.fatbin and cu12_kernels.h")
    ap.add_argument("--kernels", type=Path, required=True,
                    help="the kernels' name expressions, one a line (csrc/cuda12_launcher/kernel_list.cpp)")
    ap.add_argument("--archs", nargs="+", default=["75", "80", "90"], help="machine code (cubins) for these")
    ap.add_argument("--ptx", nargs="*", default=["90"], help="PTX for these virtual architectures")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="compilations in parallel (one process each)")
    args = ap.parse_args(argv)
    nvrtc = _package_lib("nvidia.cuda_nvrtc", "libnvrtc.so.12")
    nvfatbin = _package_lib("nvidia.nvfatbin", "libnvfatbin.so.12")
    names = read_kernels(args.kernels)
    targets = [f"sm_{a}" for a in args.archs] + [f"compute_{a}" for a in args.ptx]
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        results = list(pool.map(compile_target, targets, [str(nvrtc)] * len(targets), [names] * len(targets)))
    lowered = results[0][2]
    for target, code, target_lowered, seconds in results:
        if target_lowered != lowered:
            raise RuntimeError(f"lowered names differ for {target}")
        print(f"nvrtc {target}: {len(code) / 1e6:.1f} MB in {seconds:.0f} s", file=sys.stderr)
    fatbin = pack_fatbin(str(nvfatbin), [(t, c) for t, c, _, _ in results])
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "blochsim_cu12.fatbin").write_bytes(fatbin)
    rows = "\n".join(f'    {{"{k}", "{v}"}},' for k, v in lowered.items())
    header = ("// Generated by scripts/build_cu12_fatbin.py: kernel name expression -> lowered name in the fatbin.\n"
              f"#pragma once\nstatic const char* const kKernelNames[][2] = {{\n{rows}\n}};\n")
    (args.out / "cu12_kernels.h").write_text(header)
    print(f"fatbin {', '.join(targets)}: {len(fatbin) / 1e6:.1f} MB compressed", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
