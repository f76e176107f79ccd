"""`blochsim simulate`: one shipped simulator on a protocol and tissues from flags or a file, to an array file."""

from __future__ import annotations

import time
from typing import Any

import click

from ._common import note_text_values, plotting, reports_errors
from ._files import as_numpy, check_output, save_arrays
from ._simulators import SimulatorName, shipped_simulators, signature_line, simulator_class, split_values
from ._values import parse_assignments, read_config

__all__ = ["simulate", "Repetitions", "gather_request", "request_options"]


class Repetitions(click.ParamType):
    """A count of playings >= 1, or "auto" (until the steady state)."""

    name = "N|auto"

    def convert(self, value: Any, param: Any, ctx: Any) -> Any:
        if value == "auto" or isinstance(value, int) and value >= 1:
            return value
        try:
            count = int(value)
        except (TypeError, ValueError):
            count = 0
        if count < 1:
            self.fail(f"{value!r} is not a count >= 1 or 'auto'", param, ctx)
        return count


def request_options(command):
    """The flags that say what to simulate: simulator, config file, protocol, tissue, run settings."""
    options = [
        click.argument("simulator", type=SimulatorName(), required=False),
        click.option("-c", "--config", type=click.Path(exists=True, dir_okay=False),
                     help="A TOML or JSON file with `simulator`, [protocol], [tissue], [settings] (flags override "
                          "it)."),
        click.option("-p", "--protocol", "protocol_flags", multiple=True, metavar="NAME=VALUE",
                     help="A protocol value (ms, degrees): 10 | 10,20,30 | START:STOP:COUNT[:log] | [[..]] | "
                          "@file.npy | a word (inversion=ideal). Repeatable."),
        click.option("-t", "--tissue", "tissue_flags", multiple=True, metavar="NAME=VALUE",
                     help="A tissue property (T1=800 ms, T2, B1, M0, ...), same syntax. Repeatable."),
        click.option("--states", type=click.IntRange(min=1), default=None, help="EPG orders (event trains)."),
        click.option("--repetitions", type=Repetitions(), default=None,
                     help="Playings of the train, the last recorded (or 'auto': the steady state)."),
        click.option("--device", default=None, help="Where to run: cpu, cuda, cuda:1 (default: where the data is)."),
    ]
    for option in reversed(options):
        command = option(command)
    return command


def gather_request(simulator: type | None, config: str | None, protocol_flags: tuple, tissue_flags: tuple,
                   states: int | None, repetitions: Any, device: str | None, *, sections: tuple) -> dict:
    """{"class", "name", "protocol", "tissue", "settings", "config"} of a request: the config file's values,
    then the flags over them. Raises click.UsageError when no simulator is named anywhere."""
    file = read_config(config, ("simulator", "protocol", "tissue", "settings", *sections))
    if simulator is None:
        if "simulator" not in file:
            raise click.UsageError("name a SIMULATOR (e.g. `blochsim simulate mrf ...`) or give `simulator = "
                                   "\"...\"` in the --config file; `blochsim simulate --list` lists them")
        simulator = simulator_class(str(file["simulator"]))
    protocol = {**file.get("protocol", {}), **parse_assignments(protocol_flags, "--protocol")}
    tissue = {**file.get("tissue", {}), **parse_assignments(tissue_flags, "--tissue")}
    settings = dict(file.get("settings", {}))
    for name, value in (("states", states), ("repetitions", repetitions), ("device", device)):
        if value is not None:
            settings[name] = value
    note_text_values({**protocol, **tissue})
    short = next(k for k, v in shipped_simulators().items() if v is simulator)
    return {"class": simulator, "name": short, "protocol": protocol, "tissue": tissue, "settings": settings,
            "config": file}


def _list() -> None:
    click.echo("Shipped simulators and their arguments (protocol in ms and degrees; tissue T1, T2, ... in ms):")
    for short, cls in sorted(shipped_simulators().items()):
        click.echo("  " + signature_line(short, cls))


@click.command(short_help="Simulate a shipped simulator to a .npy/.npz/.h5 file.", epilog="""\b
Examples:
  blochsim simulate --list
  blochsim simulate mrf -p flip=5:60:100 -p TR=10 -t T1=800,1200 -t T2=80 -o signal.npy
  blochsim simulate spgr -p flip=2:30:15 -p TR=10 -p TE=4 -t T1=1000 -t T2star=40 -o spgr.npz
  blochsim simulate fse -p flip=@refocusing.npy -p ESP=10 -t T1=1000 -t T2=80 -o fse.h5
  blochsim simulate -c protocol.toml --jacobian T1,T2 -o signal.npz --plot signal.png --sequence sequence.png
\b
A config file (TOML; JSON with the same keys):
  simulator = "mrf"
  [protocol]
  flip = "5:60:100"        # or a list, or "@flips.npy"
  TR = 10
  [tissue]
  T1 = [800, 1200]
  T2 = 80
  [settings]
  states = 16
""")
@request_options
@click.option("--jacobian", "diff", default=None, metavar="NAMES",
              help="Also the Jacobian with respect to these tissue properties (comma-separated, e.g. T1,T2).")
@click.option("-o", "--output", type=click.Path(dir_okay=False), default=None,
              help="Output file: .npy (the signal), .npz or .h5 (signal, jacobian, and the request).")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False), default=None,
              help="Also write a figure of the signals (PNG, ...).")
@click.option("--sequence", "sequence_path", type=click.Path(dir_okay=False), default=None,
              help="Also draw the sequence: RF pulses and samples against time (event trains; PNG, ...).")
@click.option("--list", "list_simulators", is_flag=True, help="List the shipped simulators and their arguments.")
@reports_errors
def simulate(simulator, config, protocol_flags, tissue_flags, states, repetitions, device, diff, output, plot_path,
             sequence_path, list_simulators) -> None:
    """Simulate a shipped SIMULATOR (mrf, fse, spgr, bssfp, ...) and write the signal to a file.

    Tissue properties broadcast against each other: T1=800,1200 with T2=80 gives 2 voxels; the signal has
    shape (*voxels, samples) (a train axis first where the protocol makes several trains).
    """
    if list_simulators:
        _list()
        return
    if output is None:
        raise click.UsageError("give an output file with -o/--output (or --list to list the simulators)")
    out = check_output(output)
    if plot_path or sequence_path:
        plotting()  # before the work: a missing matplotlib is said at once
    request = gather_request(simulator, config, protocol_flags, tissue_flags, states, repetitions, device,
                             sections=())
    sim = request["class"]()
    split_values(sim, request["protocol"], request["tissue"])
    if sequence_path and not sim.variables:
        raise ValueError(f"{type(sim).__name__} is a closed form: it has no event train for --sequence to draw")
    values = {**request["protocol"], **request["tissue"], **request["settings"]}
    names = tuple(n.strip() for n in diff.split(",") if n.strip()) if diff else ()
    if diff is not None and not names:
        raise click.BadParameter("name at least one property, e.g. --jacobian T1,T2", param_hint="'--jacobian'")
    if names and out.suffix.lower() == ".npy":
        raise ValueError(f"{output}: a .npy file holds one array; write .npz or .h5 to keep the Jacobian too")
    started = time.perf_counter()
    if names:
        signal, jac = sim.jacobian(names, **values)
        arrays = {"signal": as_numpy(signal), "jacobian": as_numpy(jac)}
    else:
        arrays = {"signal": as_numpy(sim.simulate(**values))}
    elapsed_ms = 1e3 * (time.perf_counter() - started)
    metadata = {"simulator": type(sim).__name__, "protocol": request["protocol"], "tissue": request["tissue"],
                "settings": {k: v for k, v in request["settings"].items() if k != "device"},
                "jacobian_names": list(names)}
    save_arrays(out, arrays, metadata=metadata)
    signal = arrays["signal"]
    click.echo(f"{type(sim).__name__}: signal {signal.dtype} {tuple(signal.shape)}"
               + (f", jacobian {tuple(arrays['jacobian'].shape)} ({', '.join(names)})" if names else "")
               + f" in {elapsed_ms:.1f} ms -> {out}")
    if plot_path:
        plot = plotting()

        axis = plot.signals(signal if signal.ndim else signal.reshape(1, 1), part="abs" if signal.dtype.kind == "c"
                            else "real", title=f"{type(sim).__name__}")
        click.echo(f"figure: {plot.save(axis, plot_path)}")
    if sequence_path:
        plot = plotting()
        description = sim.describe(**request["protocol"])
        axis = plot.sequence(description)
        axis.set_title(f"{type(sim).__name__}: one repetition")
        click.echo(f"sequence: {plot.save(axis, sequence_path)}")
