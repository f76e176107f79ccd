"""The README's example runs as written."""

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"


@pytest.mark.skipif(not README.exists(), reason="README.md not beside the tests")
def test_readme_python_example_runs():
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    assert blocks, "the README shows a Python example"
    namespace = {}
    for block in blocks:
        exec(compile(block, str(README), "exec"), namespace)
    assert namespace["atoms"].shape == (2, 100) and namespace["dT"].shape == (2, 2, 100)
    signal, J, flips = namespace["signal"], namespace["J"], namespace["flips"]
    assert tuple(signal.shape) == (2, 100) and tuple(J.shape) == (2, 2, 100)
    assert flips.grad is not None and tuple(flips.grad.shape) == (100,)
