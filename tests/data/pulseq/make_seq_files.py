"""Writes the Pulseq files of this folder and pypulseq's reading of each (`<name>.json`).

The files are written by pypulseq's own example scripts (`pypulseq/seq_examples/scripts`, shipped in
the pypulseq 1.4.2 wheel), run with smaller matrices so that each file stays small, and by pypulseq
itself: the `_v14` files by pypulseq 1.4.2 (format 1.4.2; MPRAGE, whose script needs sigpy there, by
pypulseq 1.5's 1.4.1 writer), the `_v15` files by pypulseq 1.5 (format 1.5.0). pypulseq ships no
bSSFP script; `write_bssfp` below follows Pulseq's writeTrufi demo (alternating RF phase, balanced
gradients, readout centred in the repetition). Each file carries `TRSize`, the blocks of one
repetition (for the bSSFP two of its TRs, so that a repetition holds the phase cycle), added to its
definitions just before it is written.

`<name>.json` holds what pypulseq 1.5's reader makes of the file, so that the tests can hold our
reader to it without pypulseq installed: block durations, the centre time and use of every pulse,
and for every readout the time of the sample where the axes it sweeps come closest to k = 0 and |k|
there (from `Sequence.calculate_kspace`).

Run (needs network access to PyPI, once):

    pip download --no-deps pypulseq==1.4.2 -d /tmp/pp142
    pip install --no-deps --target /tmp/pp142/lib /tmp/pp142/pypulseq-1.4.2-*.whl
    pip install pypulseq==1.5.0.post1
    python tests/data/pulseq/make_seq_files.py --pypulseq-14 /tmp/pp142/lib
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import re
import subprocess
import sys
import types
import warnings
from pathlib import Path

HERE = Path(__file__).resolve().parent

#: name -> (example script, {pattern: replacement} applied to its source, blocks per repetition or None for
#: all of them: a single-shot EPI is one repetition)
CASES = {
    "gre": ("write_gre.py", {r"Nx = 256": "Nx = 16", r"Ny = 256": "Ny = 16"}, 5),
    "tse": ("write_tse.py", {r"Nx, Ny = 128, 128": "Nx, Ny = 16, 16", r"n_echo = 16": "n_echo = 4"}, 6 + 4 * 4),
    "epi": ("write_epi.py", {r"Nx = 64": "Nx = 16", r"Ny = 64": "Ny = 16", r"n_slices = 3": "n_slices = 1"}, None),
    "mprage": ("write_MPRAGE.py", {r"N = \[192, 240, 256\]": "N = [12, 3, 32]"}, 2 + 2 * 12 + 1),
    "bssfp": (None, {}, 8),  # two repetitions of 4 blocks: the RF phase alternates (0, pi) from one to the next
}


def write_bssfp(seq_filename: str) -> None:
    """A 2D bSSFP after Pulseq's writeTrufi demo: sinc excitation with alternating phase (0, pi), balanced
    slice, phase and read gradients, the readout centred in the repetition."""
    import numpy as np
    import pypulseq as pp

    system = pp.Opts(max_grad=28, grad_unit="mT/m", max_slew=150, slew_unit="T/m/s", rf_ringdown_time=20e-6,
                     rf_dead_time=100e-6, adc_dead_time=10e-6)
    seq = pp.Sequence(system)
    fov, nx, ny, alpha_deg, thickness = 220e-3, 16, 16, 40, 5e-3
    rf, gz, gz_reph = pp.make_sinc_pulse(flip_angle=math.radians(alpha_deg), duration=1e-3, slice_thickness=thickness,
                                         apodization=0.5, time_bw_product=1.5, system=system, return_gz=True)
    delta_k = 1 / fov
    gx = pp.make_trapezoid(channel="x", flat_area=nx * delta_k, flat_time=1.28e-3, system=system)
    adc = pp.make_adc(num_samples=nx, duration=gx.flat_time, delay=gx.rise_time, system=system)
    gx_pre = pp.make_trapezoid(channel="x", area=-gx.area / 2, duration=0.6e-3, system=system)
    gz_pre = pp.make_trapezoid(channel="z", area=-gz.area / 2, duration=0.6e-3, system=system)
    phase_areas = (np.arange(ny) - ny / 2) * delta_k
    for i in range(ny):
        rf.phase_offset = math.pi * (i % 2)
        adc.phase_offset = math.pi * (i % 2)
        gy_pre = pp.make_trapezoid(channel="y", area=phase_areas[i], duration=0.6e-3, system=system)
        gy_rew = pp.make_trapezoid(channel="y", area=-phase_areas[i], duration=0.6e-3, system=system)
        seq.add_block(rf, gz)
        seq.add_block(gx_pre, gy_pre, gz_pre)
        seq.add_block(gx, adc)
        seq.add_block(gx_pre, gy_rew, gz_pre)
    seq.set_definition("FOV", [fov, fov, thickness])
    seq.set_definition("Name", "bssfp")
    seq.write(seq_filename)


def _stub_sigpy() -> None:
    """pypulseq 1.4.2 imports sigpy at start for its adiabatic pulses, which these scripts but MPRAGE never make."""
    for name in ("sigpy", "sigpy.mri", "sigpy.mri.rf", "sigpy.plot"):
        module = sys.modules.setdefault(name, types.ModuleType(name))
        module.__path__ = []
    sys.modules["sigpy.mri.rf"].hypsec = sys.modules["sigpy.mri.rf"].wurst = None


def run_case(name: str, out: str, examples: str | None, v141: bool) -> None:
    """Write case `name` to `out` with the pypulseq on sys.path (a worker process)."""
    if "1.4" in os.environ.get("PYPULSEQ_SERIES", ""):
        _stub_sigpy()
    import pypulseq as pp

    script, substitutions, size = CASES[name]
    original = pp.Sequence.write

    def write(self, file_name, *args, **kwargs):
        self.set_definition("TRSize", len(self.block_events) if size is None else size)
        if v141:
            kwargs["v141_compat"] = True
        return original(self, file_name, *args, **kwargs)

    pp.Sequence.write = write
    pp.Sequence.test_report = lambda self: ""  # slow, and not part of the file
    if script is None:
        write_bssfp(out)
        return
    source = (Path(examples) / script).read_text()
    for pattern, replacement in substitutions.items():
        source, count = re.subn(pattern, replacement, source)
        if count != 1:
            raise RuntimeError(f"{script}: {pattern!r} matched {count} times")
    module = types.ModuleType(name)
    exec(compile(source, script, "exec"), module.__dict__)  # noqa: S102 - pypulseq's own example script
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        module.main(plot=False, write_seq=True, seq_filename=out)


def pypulseq_view(path: Path) -> dict:
    """What pypulseq 1.5's reader makes of `path` (see the module docstring)."""
    import numpy as np
    import pypulseq as pp

    seq = pp.Sequence()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        seq.read(str(path))
        k_adc, _, _, _, t_adc = seq.calculate_kspace()
    durations = [float(seq.block_durations[b]) for b in seq.block_events]
    starts = np.concatenate([[0.0], np.cumsum(durations)[:-1]])
    pulses, readouts = [], []
    sample = 0
    for index, b in enumerate(seq.block_events):
        block = seq.get_block(b)
        if block.rf is not None:
            pulses.append({"block": index, "centre_s": float(starts[index] + block.rf.delay + block.rf.center),
                           "use": block.rf.use, "phase_rad": float(block.rf.phase_offset)})
        if block.adc is not None:
            n = int(block.adc.num_samples)
            k = k_adc[:, sample:sample + n]
            swept = np.ptp(k, axis=1) > 1e-9 * (1 + np.abs(k).max())
            closest = int(np.argmin((k[swept] ** 2).sum(axis=0))) if swept.any() else 0
            readouts.append({"block": index, "closest_s": float(t_adc[sample + closest]),
                             "k_per_m": float(np.sqrt((k[:, closest] ** 2).sum())),
                             "k_unswept_per_m": float(np.sqrt((k[~swept, closest] ** 2).sum())),
                             "centre_s": float(starts[index] + block.adc.delay + n * block.adc.dwell / 2),
                             "dwell_s": float(block.adc.dwell), "phase_rad": float(block.adc.phase_offset)})
            sample += n
    return {"pypulseq": pp.__version__, "durations_s": durations, "pulses": pulses, "readouts": readouts,
            "definitions": {k: (v.tolist() if hasattr(v, "tolist") else v) for k, v in seq.definitions.items()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pypulseq-14", help="a folder holding pypulseq 1.4.2 (pip install --target)")
    parser.add_argument("--examples", help="pypulseq 1.4.2's seq_examples/scripts (default: in --pypulseq-14)")
    parser.add_argument("--views-only", action="store_true", help="rewrite the .json readings of the files here")
    parser.add_argument("--cases", nargs="*", default=list(CASES), help="the cases to write (default: all)")
    parser.add_argument("--worker", nargs=3, metavar=("CASE", "OUT", "V141"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.views_only:
        for path in sorted(HERE.glob("*.seq")):
            path.with_suffix(".json").write_text(json.dumps(pypulseq_view(path), indent=1) + "\n")
        return
    if args.worker:
        case, out, v141 = args.worker
        run_case(case, out, args.examples, v141 == "1")
        return
    examples = args.examples or str(Path(args.pypulseq_14) / "pypulseq" / "seq_examples" / "scripts")
    current = importlib.util.find_spec("pypulseq")
    if current is None:
        raise SystemExit("pypulseq 1.5 must be installed (pip install pypulseq==1.5.0.post1)")
    for name in args.cases:
        for suffix, path, v141 in (("v14", args.pypulseq_14, name == "mprage"), ("v15", None, False)):
            if v141:
                path = None  # MPRAGE 1.4: pypulseq 1.5's 1.4.1 writer (1.4.2's script needs sigpy)
            out = HERE / f"{name}_{suffix}.seq"
            env = dict(os.environ)
            if path:
                env["PYTHONPATH"] = path
                env["PYPULSEQ_SERIES"] = "1.4"
            subprocess.run([sys.executable, __file__, "--examples", examples, "--worker", name, str(out),
                            "1" if v141 else "0"], check=True, env=env)
            view = pypulseq_view(out)
            (HERE / f"{name}_{suffix}.json").write_text(json.dumps(view, indent=1) + "\n")
            print(f"{out.name}: {out.stat().st_size} bytes, {len(view['durations_s'])} blocks")


if __name__ == "__main__":
    main()
