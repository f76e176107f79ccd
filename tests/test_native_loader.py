"""Where the host kernel library is looked for (`blochsim._native._candidates`)."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, distribution
from pathlib import Path

import pytest

import blochsim
from blochsim import _native


def test_a_source_checkout_finds_its_installed_build(monkeypatch):
    """`python3 -m pytest` from a checkout imports the checkout (no compiled library in it) ahead of the
    installed package: the loader must fall back to the installed build of the same release."""
    try:
        installed = Path(distribution("blochsim").locate_file("blochsim/libblochsim_cpu.so")).resolve()
    except PackageNotFoundError:
        pytest.skip("blochsim is not installed as a distribution here")
    monkeypatch.delenv("BLOCHSIM_CPU_LIBRARY", raising=False)
    candidates = _native._candidates()
    assert candidates[0] == Path(blochsim.__file__).resolve().parent / "libblochsim_cpu.so"
    assert installed in candidates
    assert any(path.exists() for path in candidates), candidates


def test_the_environment_variable_is_the_only_place_when_set(monkeypatch, tmp_path):
    monkeypatch.setenv("BLOCHSIM_CPU_LIBRARY", str(tmp_path / "libblochsim_cpu.so"))
    assert _native._candidates() == [tmp_path / "libblochsim_cpu.so"]
