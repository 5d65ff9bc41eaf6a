"""The study scripts (``experiments/*_study.sh``) run every job through inq-train's real config
checks: ``inq-train`` is replaced by a stand-in that composes and validates each job exactly as
``inq-train`` does (Hydra, ``inq.train.app.run``), then writes what a finished run leaves instead
of training. A job whose overrides ``inq-train`` would refuse stops the script, as it would on a
real run (one did: ``trainer.float_epochs`` beside ``model.checkpoint``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
STAND_IN = '''
import json, sys
from pathlib import Path
from inq.train import app


def finished(typed, home, env, saved):
    """What a finished run leaves, with the bits it was given (a float job: its checkpoint)."""
    home = Path(home)
    (home / "checkpoints").mkdir(parents=True, exist_ok=True)
    (home / "checkpoints" / "float.pt").write_bytes(b"")
    summary = {"seed": typed.trainer.seed, "float_acc": 0.9, "final_acc": 0.89,
               "bits": typed.inq.bits}
    if typed.inq.bits == "auto":
        budget = typed.inq.budget.avg_bits
        summary["allocation"] = {"avg_bits": budget, "layers": [{"name": "0", "params": 1}]}
        summary["bits"] = 4
    (home / "summary.json").write_text(json.dumps(summary))
    return summary


app.train = finished
sys.argv[0] = "inq-train"
app.main()
'''


@pytest.fixture
def stand_in(tmp_path: Path) -> dict[str, str]:
    """An environment whose ``inq-train`` is the stand-in (and ``python`` this interpreter)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "inq-train"
    script.write_text(f"#!{sys.executable}\n{STAND_IN}")
    script.chmod(0o755)
    python = bin_dir / "python"  # a link would lose the virtual environment
    python.write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    python.chmod(0o755)
    return {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}


@pytest.mark.slow
@pytest.mark.parametrize(
    ("script", "jobs"),
    [
        ("mixed_study.sh", 1 + 3 + 1 + 2 * 4),  # float, uniform, ends, auto x budgets
        ("distill_study.sh", 1 + 4 * 3 + 2),  # float, 3 methods x 4 bits, ends at 2 and 3 bits
    ],
)
def test_every_job_passes_inq_trains_checks(
    script: str, jobs: int, stand_in: dict[str, str], tmp_path: Path
) -> None:
    out, record = tmp_path / "study", tmp_path / "record.json"  # not the tracked record
    proc = subprocess.run(
        ["bash", str(ROOT / "experiments" / script), "fashion_mnist", str(out), "0"],
        env={**stand_in, "RECORD": str(record)}, capture_output=True, text=True, timeout=900,
        cwd=ROOT,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert len(list(out.glob("*/seed0/summary.json"))) == jobs
    assert (out / "RESULTS.md").is_file()  # the collector read them
    if script == "mixed_study.sh":  # each finished job kept in the record
        assert len(json.loads(record.read_text())) == jobs
