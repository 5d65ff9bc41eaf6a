"""experiments/collect_mixed.py: the mixed-precision study's sizes, table, goal checks, plot."""

from __future__ import annotations

import json
from pathlib import Path

from train_helpers import load_experiment

collect = load_experiment("collect_mixed")
LAYERS = [{"name": "0", "params": 100}, {"name": "1", "params": 300}]


def fake_run(root: Path, job: str, seed: int, final: float, **extra: object) -> None:
    run = root / job / f"seed{seed}"
    run.mkdir(parents=True)
    summary = {"seed": seed, "float_acc": 0.90, "final_acc": final, "bits": 2, **extra}
    (run / "summary.json").write_text(json.dumps(summary))


def auto(avg_bits: float) -> dict:
    timings = {"float": 90.0, "allocate": 10.0, "stage1": 100.0}  # stage1's 100 s hold the 10
    return {"allocation": {"avg_bits": avg_bits, "layers": LAYERS}, "timings_s": timings}


def test_sizes_table_goals_plot_and_section(tmp_path: Path) -> None:
    study = tmp_path / "study"
    for seed in (0, 1):
        fake_run(study, "float", seed, 0.90)
        fake_run(study, "uniform3", seed, 0.880, bits=3)
        fake_run(study, "ends2", seed, 0.885, layer_bits={"0": 8, "1": 2})  # 3.5 bits
        fake_run(study, "auto_loss_3.0", seed, 0.884, **auto(2.98))  # +0.4: met
        fake_run(study, "auto_loss_2.5", seed, 0.879, **auto(2.49))  # -0.1: missed
        fake_run(study, "auto_hessian_3.5", seed, 0.886, **auto(3.5))  # +0.1 over the rule
    fake_run(study, "uniform3", 2, 0.70, bits=3)  # a seed no auto job ran: left out of the goals
    assert collect.main([str(study), "--name", "fashion_mnist"]) == 0

    text = (study / "RESULTS.md").read_text()
    assert "<!-- study:mixed_fashion_mnist:start -->" in text
    assert "| uniform 3 | 3.000 | 82.00 ± 10.39 % | -8.00 | 3 | — |" in text
    assert "| ends 2 | 3.500 | 88.50 ± 0.00 % | -1.50 | 2 | — |" in text
    assert "| auto loss 3.0 | 2.980 | 88.40 ± 0.00 % | -1.60 | 2 | 5.3 % (largest) |" in text
    assert (
        "- auto (loss) at 3.0 average bits >= uniform 3-bit + 0.3: +0.40 points (n=2), met" in text
    )
    assert (
        "- auto (loss) at 2.5 average bits >= uniform 3-bit: -0.10 points (n=2), "
        "missed by 0.10 points" in text
    )
    assert (
        "- auto (hessian) at 3.5 average bits >= the 8-bit-ends rule (ends 2): +0.10 points "
        "(n=2), met" in text
    )
    assert "- auto (hessian) at 3.0 average bits >= uniform 3-bit + 0.3: not run" in text
    assert (study / "mixed_fashion_mnist.png").stat().st_size > 0


def test_a_study_without_an_auto_job_is_one_error(tmp_path: Path, capsys) -> None:
    fake_run(tmp_path, "uniform2", 0, 0.8)
    assert collect.main([str(tmp_path), "--name", "fashion_mnist"]) == 1
    assert "no finished auto job" in capsys.readouterr().err
