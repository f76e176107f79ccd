"""Where a CUDA kernel's machine code goes, by the source lines of one function: a static profile, no card needed.

Compiles one kernel (`--kernel`, a specialisation of a kernel template in csrc/cuda/epg_device.cuh) for sm_90
with line information, disassembles it with nvdisasm (from PATH, or the copy Triton's wheel carries) and
gives every instruction to the statement of `--function` it was inlined from: each statement's instruction
count, register moves and local-memory (spill) loads and stores, and the ptxas summary (registers, stack,
spills). Instructions outside the function (the kernel's entry and exit) are counted as "outside".

Static counts are not executed instructions: a statement in a loop over events runs once an event, one
before the loop once a call. They tell where the code of a change went (a variant against the tree), before
a card times it; docs/design.md quotes them beside the card's numbers.

Run: python benchmarks/sass_regions.py [--kernel "bs::vjp_kernel<float, float, 32, float>"]
         [--function vjp_voxel_plain] [--source DIR] [--patch benchmarks/variants/NAME.patch]
"""

from __future__ import annotations

import argparse
import collections
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FRAME = re.compile(r'\s*//## File "(.*?)", line (\d+)(?: inlined at "(.*?)", line (\d+))?')
INSTRUCTION = re.compile(r"\s*/\*([0-9a-f]{4,})\*/\s+(.*?);")


def tool(name: str) -> str:
    """nvcc or nvdisasm: from PATH, else the copy in Triton's package (pip install triton carries nvdisasm)."""
    found = shutil.which(name)
    if found:
        return found
    try:
        import triton

        candidate = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / name
        if candidate.exists():
            return str(candidate)
    except ImportError:
        pass
    sys.exit(f"sass_regions: {name} not found (on PATH, or in an installed triton's backends/nvidia/bin)")


def function_lines(source: Path, function: str) -> tuple[Path, int, int]:
    """The header and line range of `function`'s definition (its name followed by '(' at the start of a
    BS_HD declaration), found in csrc/include/blochsim and csrc/cuda."""
    for path in sorted((source / "csrc").rglob("*.[hc]*")):
        lines = path.read_text().splitlines()
        for i, line in enumerate(lines):
            if re.search(rf"\b{re.escape(function)}\(", line) and ("BS_HD" in line or "__device__" in line):
                depth, opened = 0, False
                for j in range(i, len(lines)):
                    depth += lines[j].count("{") - lines[j].count("}")
                    opened = opened or "{" in lines[j]
                    if opened and depth == 0:
                        return path, i + 1, j + 1
    sys.exit(f"sass_regions: no definition of {function} under {source / 'csrc'}")


def compile_kernel(source: Path, kernel: str, work: Path) -> tuple[Path, str]:
    """The kernel's cubin (sm_90, -lineinfo) and ptxas's summary of it. Taking the kernel's address in a host
    function instantiates it without spelling out its parameters."""
    unit = work / "one_kernel.cu"
    unit.write_text(f'#include "cuda/epg_device.cuh"\nvoid* bs_sass_regions_kernel() {{ return (void*)&{kernel}; }}\n')
    cubin = work / "one_kernel.cubin"
    command = [tool("nvcc"), f"-I{source / 'csrc' / 'include'}", f"-I{source / 'csrc'}", "-O3", "-DNDEBUG",
               "-std=c++17", "--generate-code=arch=compute_90,code=sm_90", "--expt-relaxed-constexpr", "-lineinfo",
               "-Xptxas", "-v", "-cubin", "-o", str(cubin), str(unit)]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode:
        sys.exit(done.stderr[-4000:])
    summary = [line.split(":", 1)[-1].strip() for line in done.stderr.splitlines()
               if "Used" in line or "spill" in line]
    return cubin, "; ".join(summary)


def attribute(disassembly: str, header: Path, first: int, last: int) -> dict:
    """Instructions, moves and local loads/stores per statement line of the function (outermost inlined frame
    inside its range)."""
    counts = collections.defaultdict(collections.Counter)
    frames: list[tuple[str, int]] = []
    fresh = False
    for line in disassembly.splitlines():
        frame = FRAME.match(line)
        if frame:
            if not fresh:
                frames, fresh = [], True
            if not frames:
                frames.append((frame.group(1), int(frame.group(2))))
            if frame.group(3):
                frames.append((frame.group(3), int(frame.group(4))))
            continue
        found = INSTRUCTION.match(line)
        if not (found and frames):
            continue
        fresh = False
        site = "outside"
        for path, number in frames:
            if Path(path).name == header.name and first <= number <= last:
                site = number
        words = found.group(2).split()
        opcode = words[1] if words[0].startswith("@") else words[0]
        counts[site]["instructions"] += 1
        counts[site]["moves"] += opcode.startswith("MOV")
        counts[site]["local"] += opcode.startswith(("LDL", "STL"))
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernel", default="bs::vjp_kernel<float, float, 32, float>")
    parser.add_argument("--function", default="vjp_voxel_plain")
    parser.add_argument("--source", type=Path, default=ROOT, help="the tree whose csrc/ is compiled")
    parser.add_argument("--patch", type=Path, help="a variant (benchmarks/variants/*.patch) applied to a copy")
    parser.add_argument("--min", type=int, default=40, help="list statements with at least this many instructions")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as name:
        work = Path(name)
        source = args.source
        if args.patch:
            source = work / "tree"
            shutil.copytree(args.source / "csrc", source / "csrc")
            subprocess.run(["patch", "-p1", "-s", "-i", str(args.patch.resolve())], cwd=source, check=True)
        header, first, last = function_lines(source, args.function)
        cubin, summary = compile_kernel(source, args.kernel, work)
        disassembly = subprocess.run([tool("nvdisasm"), "--print-line-info-inline", str(cubin)], check=True,
                                     capture_output=True, text=True).stdout
        text = header.read_text().splitlines()
    counts = attribute(disassembly, header, first, last)
    print(f"{args.kernel}: {summary}")
    print(f"{args.function} ({header.name}:{first}-{last}), statements of {args.min}+ instructions or any spill:")
    print(f"{'line':>8}{'instr':>8}{'moves':>7}{'local':>7}  statement")
    for site in sorted(counts, key=lambda s: (s == "outside", s if s != "outside" else 0)):
        c = counts[site]
        if c["instructions"] < args.min and not c["local"] and site != "outside":
            continue
        statement = "" if site == "outside" else text[site - 1].strip()[:70]
        print(f"{site:>8}{c['instructions']:>8}{c['moves']:>7}{c['local']:>7}  {statement}")
    total = collections.Counter()
    for c in counts.values():
        total.update(c)
    print(f"{'total':>8}{total['instructions']:>8}{total['moves']:>7}{total['local']:>7}")


if __name__ == "__main__":
    main()
