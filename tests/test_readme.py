"""The README's Python examples run exactly as printed."""

import json
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


@pytest.mark.slow
def test_readme_default_run_table_is_what_inq_train_prints(tmp_path: Path) -> None:
    """Issue 12: the README's per-stage table must come from a run, and reproduce."""
    from train_helpers import inq_train

    printed = inq_train(cwd=tmp_path).stdout  # README command 1's job, exactly: no overrides
    table = printed[printed.index("phase      quantized") :].strip()
    readme = README.read_text()
    assert f"```\n{table}\n```" in readme, f"README.md should show this run's table:\n{table}"
    summary = json.loads(next(tmp_path.glob("outputs/*/*/summary.json")).read_text())
    float_acc, final = 100 * summary["float_acc"], 100 * summary["final_acc"]
    assert f"float {float_acc:.2f} % ->\n5-bit INQ {final:.2f} % validation accuracy" in readme
