"""The command line: `blochsim COMMAND ...` (also `python -m blochsim COMMAND ...`).

Commands: `demo`, `simulate`, `dictionary`, `match`, `fit`, `bench`, `info`; `blochsim COMMAND --help` shows
each one's flags and examples. Exit status: 0 done; 1 bad data (one line on stderr saying what is wrong);
2 a bad flag (with the usage line); 130 interrupted (a dictionary resumes where it stopped when run again).
"""

from __future__ import annotations

import sys

import click

from .._version import __version__
from . import bench, demo, dictionary, estimate, info, simulate

__all__ = ["main", "cli"]

_EPILOG = """\b
Examples:
  blochsim demo --tissues 2000 --plot demo.png
  blochsim simulate mrf -p flip=5:60:100 -p TR=10 -t T1=800,1200 -t T2=80 -o signal.npy
  blochsim dictionary mrf -p flip=5:60:100 -p TR=10 --grid T1=200:3000:40:log --grid T2=10:300:30:log -o dict.npz
  blochsim match signals.npy dict.npz -o maps.npz --png maps.png
  blochsim info
"""


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110}, epilog=_EPILOG)
@click.version_option(__version__, "--version", "-V", prog_name="blochsim", message="%(prog)s %(version)s")
@click.option("--debug", is_flag=True, help="Show the full traceback of an error instead of one line.")
@click.pass_context
def cli(ctx: click.Context, debug: bool) -> None:
    """blochsim: differentiable MRI signal simulation (extended phase graphs) for PyTorch."""
    ctx.obj = {"debug": debug}


for _command in (demo.demo, simulate.simulate, dictionary.dictionary, estimate.match, estimate.fit, bench.bench,
                 info.info):
    cli.add_command(_command)


def main(argv: list[str] | None = None) -> int:
    """Run the command line on `argv` (default: sys.argv[1:]) and return its exit status."""
    try:
        result = cli.main(args=argv, prog_name="blochsim", standalone_mode=False)
    except click.exceptions.Abort:  # Ctrl-C (click turns KeyboardInterrupt into Abort)
        click.echo("blochsim: interrupted", err=True)
        return 130
    except click.ClickException as exc:
        exc.show()
        return exc.exit_code
    except click.exceptions.Exit as exc:
        return exc.exit_code
    return result if isinstance(result, int) else 0


if __name__ == "__main__":
    sys.exit(main())
