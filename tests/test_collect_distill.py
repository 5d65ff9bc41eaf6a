"""experiments/collect_distill.py: the distillation study's table, goal checks, plot, section."""

from __future__ import annotations

import json
from pathlib import Path

from train_helpers import load_experiment

collect = load_experiment("collect_distill")


def fake_run(root: Path, job: str, seed: int, final: float, float_acc: float = 0.90) -> None:
    run = root / job / f"seed{seed}"
    run.mkdir(parents=True)
    summary = {"seed": seed, "float_acc": float_acc, "final_acc": final}
    (run / "summary.json").write_text(json.dumps(summary))


def test_table_goals_plot_and_section(tmp_path: Path) -> None:
    study = tmp_path / "study"
    for seed, float_acc in ((0, 0.90), (1, 0.92)):
        fake_run(study, "float", seed, float_acc, float_acc)
        fake_run(study, "inq3_kd", seed, float_acc - 0.004, float_acc)  # -0.4: meets -0.5
        fake_run(study, "ste3_kd", seed, float_acc - 0.001, float_acc)  # INQ 0.3 behind: missed
        fake_run(study, "inq2_kd", seed, float_acc - 0.02, float_acc)  # -2.0: misses -1.5
        fake_run(study, "inq2_kd_ends8", seed, float_acc - 0.01, float_acc)
    fake_run(study, "inq2", 0, 0.85)  # one seed only
    assert collect.main([str(study), "--name", "fashion_mnist"]) == 0

    text = (study / "RESULTS.md").read_text()
    assert "<!-- study:distill_fashion_mnist:start -->" in text
    assert "| float (seeds 2) | 91.00 ± 1.41 % |" in text
    assert (
        "| INQ + KD | — | — | 90.60 ± 1.41 % (-0.40, n=2) | 89.00 ± 1.41 % (-2.00, n=2) |" in text
    )
    assert "| INQ | — | — | — | 85.00 ± 0.00 % (-5.00, n=1) |" in text
    assert "- INQ + KD at 3 bits >= float -0.5: -0.40 points (n=2), met" in text
    assert "- INQ + KD at 2 bits >= float -1.5: -2.00 points (n=2), missed by 0.50 points" in text
    assert "- INQ + KD >= STE + KD -0.2 at 3 bits: -0.30 points, missed by 0.10 points" in text
    assert "INQ + KD, 8-bit ends" in text
    assert (study / "distill_fashion_mnist.png").stat().st_size > 0


def test_an_empty_folder_is_one_message(tmp_path: Path, capsys) -> None:
    assert collect.main([str(tmp_path), "--name", "resnet20"]) == 1
    assert "no finished job" in capsys.readouterr().err
