"""Where a CUDA kernel's machine code goes, by the source lines of one function: a static profile, no card needed.

Compiles one kernel (`--kernel`, a specialisation of a kernel template in csrc/cuda/epg_device.cuh) for sm_90
with line information, disassembles it with nvdisasm (from PATH, or the copy Triton's wheel carries) and
gives every instruction to the statement of `--function` it was inlined from: each statement's instruction
count, register moves and local-memory (spill) loads and stores, and the ptxas summary (registers, stack,
spills). Instructions outside the function (the kernel's entry and exit) are counted as "outside".

Static counts are not executed instructions: a statement in a loop over events runs once an event, one
before the loop once a call. They tell where the code of a change went (a variant against the tree), before
a card times it; docs/design.md quotes them beside the card's numbers.

Executed counts: `--library` takes the kernel's machine code from a CUDA library built with -lineinfo
(CMAKE_CUDA_FLAGS=-lineinfo: the same code, with line tables) instead of compiling it, and `--executed` reads
ncu's per-instruction counters of one launch of that kernel from that library (`ncu --section SourceCounters
--export R ...`, then `ncu --import R.ncu-rep --page source --csv --print-source sass > FILE`): each statement
then shows the warp instructions it executed and the warp-state samples (stalls) taken on it.

Run: python benchmarks/sass_regions.py [--kernel "bs::vjp_kernel<float, float, 32, float>"]
         [--function vjp_voxel_plain] [--source DIR] [--patch benchmarks/variants/NAME.patch]
         [--library build/lineinfo/libblochsim_cuda.so --executed ncu-source.csv [--stalls]]
"""

from __future__ import annotations

import argparse
import collections
import csv
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


def library_disassembly(library: Path, kernel: str, work: Path) -> tuple[str, str]:
    """The kernel's disassembly with inlined line information, from the cubin in a built CUDA library that holds
    it, and its registers and stack (cuobjdump -res-usage)."""
    listing = subprocess.run([tool("cuobjdump"), "-lelf", str(library)], check=True, capture_output=True, text=True)
    for name in re.findall(r"ELF file\s+\d+: (\S+\.cubin)", listing.stdout):
        subprocess.run([tool("cuobjdump"), "-xelf", name, str(library)], cwd=work, check=True, capture_output=True)
        cubin = work / name
        symbols = subprocess.run(["readelf", "-sW", str(cubin)], check=True, capture_output=True, text=True).stdout
        functions = [line.split() for line in symbols.splitlines()]
        functions = [f for f in functions if len(f) >= 8 and f[3] == "FUNC"]  # (index, ..., mangled name)
        names = subprocess.run(["c++filt"], input="\n".join(f[-1] for f in functions), capture_output=True,
                               text=True).stdout.splitlines()
        for fields, demangled in zip(functions, names, strict=True):
            mangled = fields[-1]
            if not re.match(rf"(void )?{re.escape(kernel)}\(", demangled):  # (a kernel's demangled name: void ...)
                continue
            text = subprocess.run([tool("nvdisasm"), "--print-line-info-inline", "-fun", fields[0].rstrip(":"),
                                   str(cubin)], check=True, capture_output=True, text=True).stdout
            # -fun restricts nothing but the executable sections printed: keep the kernel's own.
            section = re.search(rf"\.text\.{re.escape(mangled)}:\n(.*?)(?=\n\s*\.section|\Z)", text, flags=re.S)
            usage = subprocess.run([tool("cuobjdump"), "-res-usage", str(cubin)], capture_output=True,
                                   text=True).stdout
            found = re.search(rf"Function {re.escape(mangled)}:\s*\n\s*(.*)", usage)
            return section.group(1), found.group(1).strip() if found else ""
        cubin.unlink()
    sys.exit(f"sass_regions: no {kernel} in {library}")


def executed_counts(path: Path) -> dict:
    """Offset in the function -> (warp instructions executed, warp-state samples, the samples by stall reason),
    from ncu's SASS source page (csv). Addresses there are the loaded code's: offsets count from the first."""
    with path.open(newline="") as handle:
        lines = handle.read().splitlines()
    # (ncu writes a line naming the kernel ahead of the header row)
    start = next((i for i, line in enumerate(lines) if line.startswith('"Address"')), 0)
    rows = [row for row in csv.DictReader(lines[start:]) if row.get("Address", "").startswith("0x")]

    def column(*names: str) -> str:
        for name in names:
            if name in rows[0]:
                return name
        sys.exit(f"sass_regions: none of {names} in {path}'s columns: {list(rows[0])}")

    def number(text: str) -> float:
        return float(text.replace(",", "") or 0)

    executed = column("Instructions Executed", "Warp Instructions Executed")
    samples = column("Warp Stall Sampling (All Samples)", "Sampling Data (All)")
    reasons = [name for name in rows[0] if name.startswith("stall_") and not name.endswith("(Not Issued)")]
    base = min(int(row["Address"], 16) for row in rows)
    return {int(row["Address"], 16) - base: (number(row[executed]), number(row[samples]),
                                             {name[len("stall_"):]: number(row[name]) for name in reasons})
            for row in rows}


def attribute(disassembly: str, header: Path, first: int, last: int, executed: dict | None = None) -> dict:
    """Instructions, moves and local loads/stores per statement line of the function (outermost inlined frame
    inside its range), and with `executed` (executed_counts) the warp instructions executed and the samples."""
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
        if executed is not None:
            done, sampled, reasons = executed.get(int(found.group(1), 16), (0.0, 0.0, {}))
            counts[site]["executed"] += done
            counts[site]["samples"] += sampled
            for reason, n in reasons.items():
                counts[site]["stall " + reason] += n
    return counts


def top_stalls(c: collections.Counter, count: int = 3) -> str:
    """A statement's largest stall reasons, each its share of the statement's samples (%)."""
    reasons = {k[len("stall "):]: v for k, v in c.items() if k.startswith("stall ")}
    whole = sum(reasons.values())
    ranked = sorted(reasons.items(), key=lambda item: -item[1])[:count]
    return ", ".join(f"{name} {100 * v / whole:.0f}" for name, v in ranked if v) if whole else ""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernel", default="bs::vjp_kernel<float, float, 32, float>")
    parser.add_argument("--function", default="vjp_voxel_plain")
    parser.add_argument("--source", type=Path, default=ROOT, help="the tree whose csrc/ is compiled")
    parser.add_argument("--patch", type=Path, help="a variant (benchmarks/variants/*.patch) applied to a copy")
    parser.add_argument("--min", type=int, default=40, help="list statements with at least this many instructions")
    parser.add_argument("--library", type=Path, help="take the kernel from this CUDA library (built with -lineinfo)")
    parser.add_argument("--executed", type=Path, help="ncu's SASS source page (csv) of one launch of the kernel "
                        "from --library: executed instructions and samples per statement")
    parser.add_argument("--stalls", action="store_true",
                        help="with --executed, each statement's three largest stall reasons (%% of its samples)")
    args = parser.parse_args()
    if args.executed and not args.library:
        parser.error("--executed reads a launch of the kernel of --library")
    if args.stalls and not args.executed:
        parser.error("--stalls reads the samples of --executed")
    with tempfile.TemporaryDirectory() as name:
        work = Path(name)
        source = args.source
        if args.patch:
            source = work / "tree"
            shutil.copytree(args.source / "csrc", source / "csrc")
            subprocess.run(["patch", "-p1", "-s", "-i", str(args.patch.resolve())], cwd=source, check=True)
        header, first, last = function_lines(source, args.function)
        if args.library:
            disassembly, summary = library_disassembly(args.library, args.kernel, work)
        else:
            cubin, summary = compile_kernel(source, args.kernel, work)
            disassembly = subprocess.run([tool("nvdisasm"), "--print-line-info-inline", str(cubin)], check=True,
                                         capture_output=True, text=True).stdout
        text = header.read_text().splitlines()
    executed = executed_counts(args.executed) if args.executed else None
    counts = attribute(disassembly, header, first, last, executed)
    total = collections.Counter()
    for c in counts.values():
        total.update(c)
    print(f"{args.kernel}: {summary}")
    print(f"{args.function} ({header.name}:{first}-{last}), statements of {args.min}+ instructions or any spill"
          + (", or 1 % of the executed instructions or samples:" if executed else ":"))
    dynamic = f"{'executed':>12}{'%':>6}{'samples %':>10}" if executed else ""
    print(f"{'line':>8}{'instr':>8}{'moves':>7}{'local':>7}{dynamic}  statement")

    def share(c, key: str) -> float:
        return 100.0 * c[key] / total[key] if total[key] else 0.0

    for site in sorted(counts, key=lambda s: (s == "outside", s if s != "outside" else 0)):
        c = counts[site]
        wide = executed is not None and (share(c, "executed") >= 1 or share(c, "samples") >= 1)
        if c["instructions"] < args.min and not c["local"] and site != "outside" and not wide:
            continue
        statement = "" if site == "outside" else text[site - 1].strip()[:70]
        dynamic = f"{c['executed']:>12.4g}{share(c, 'executed'):>6.1f}{share(c, 'samples'):>10.1f}" if executed else ""
        reasons = f"  [{top_stalls(c)}]" if args.stalls else ""
        print(f"{site:>8}{c['instructions']:>8}{c['moves']:>7}{c['local']:>7}{dynamic}  {statement}{reasons}")
    dynamic = f"{total['executed']:>12.4g}{100.0:>6.1f}{100.0:>10.1f}" if executed else ""
    print(f"{'total':>8}{total['instructions']:>8}{total['moves']:>7}{total['local']:>7}{dynamic}")


if __name__ == "__main__":
    main()
