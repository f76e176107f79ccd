"""`blochsim match` and `blochsim fit`: an estimator over a saved signal volume to parameter maps."""

from __future__ import annotations

import click

__all__ = ["match", "fit"]


@click.command()
def match() -> None:
    """Match a signal volume to a dictionary (in progress)."""


@click.command()
def fit() -> None:
    """Fit a simulator to a signal volume (in progress)."""
