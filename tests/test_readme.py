"""The README's Python examples run exactly as printed."""

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
PYTHON_BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


def test_readme_has_a_library_example() -> None:
    assert PYTHON_BLOCKS, "README.md must show the library example in a ```python block"


@pytest.mark.parametrize("source", PYTHON_BLOCKS, ids=lambda s: s.splitlines()[0])
def test_readme_python_block_runs(source: str, capsys: pytest.CaptureFixture[str]) -> None:
    exec(compile(source, str(README), "exec"), {"__name__": "readme_example"})
    accuracies = [float(a) for a in re.findall(r"acc (\d\.\d+)", capsys.readouterr().out)]
    if accuracies:  # the INQ example prints float then per-stage accuracy
        assert accuracies[-1] >= accuracies[0] - 0.02, accuracies
