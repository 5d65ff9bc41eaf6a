"""experiments/collect_prune.py: the pruning study's table, goal check, plot and section."""

from __future__ import annotations

import json
from pathlib import Path

from train_helpers import load_experiment

collect = load_experiment("collect_prune")


def fake_run(
    root: Path, name: str, bits: int, sparsity: float, acc: float, stored: int, epochs: int = 1
) -> None:
    run = root / name
    run.mkdir(parents=True)
    targets = {"0": min(sparsity, 0.5), "3": sparsity, "15": sparsity} if sparsity else None
    summary = {
        "method": "inq",
        "bits": bits,
        "seed": 0,
        "float_acc": 0.90,
        "final_acc": acc,
        "zero_fraction": sparsity + 0.01,
        "pruned_fraction": sparsity,
        "portions": [0.5, 0.75, 0.875, 1.0],
        "retrain_epochs": 8,
        "packed": {
            "fp32_bytes": 40_000,
            "packed_bytes": stored,
            "other_bytes": 1000,
            "file_bytes": stored + 4000,
        },
        **(
            {"prune": {"sparsity": sparsity, "targets": targets, "steps": 3, "epochs": epochs}}
            if targets
            else {}
        ),
    }
    (run / "summary.json").write_text(json.dumps(summary))


def test_table_goal_plot_and_section(tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    fake_run(sweep, "dense", 5, 0.0, 0.899, 6250)
    fake_run(sweep, "p80", 5, 0.8, 0.895, 2000)  # 20x
    fake_run(sweep, "p90", 5, 0.9, 0.8925, 1250)  # 32x, -0.75 points: meets the goal
    fake_run(sweep, "p95", 5, 0.95, 0.85, 800)  # 50x, too inaccurate
    fake_run(sweep, "b3", 3, 0.9, 0.88, 900)
    fake_run(sweep, "long", 5, 0.85, 0.85, 900, epochs=3)  # a longer budget: its own line
    float_run = sweep / "float" / "summary.json"
    float_run.parent.mkdir()
    float_run.write_text(json.dumps({"method": "oneshot"}))  # the shared float run: left out
    assert collect.main([str(sweep), "--dataset", "fashion_mnist"]) == 0

    text = (sweep / "RESULTS.md").read_text()
    assert "<!-- study:prune_fashion_mnist:start -->" in text
    row = "| 5 | 0 | 90 % (0: 50 %) | 3x1 + 4x2 | 91.0 % | 40000 | 1250 | **32.0x** | 5250 | 7.8x "
    assert row + "| 89.25 | -0.75 |" in text
    assert "| 5 | 0 | 0 % | 4x2 | 1.0 % | 40000 | 6250 | **6.4x** | 10250 | 4.0x | 89.90 |" in text
    assert "**Met** by 1 run(s); the most compressed: 90 % (0: 50 %) pruned, 32.0x" in text
    assert "| INQ paper: DNS + INQ | 5 | 53x" in text
    assert (sweep / "prune_fashion_mnist.png").stat().st_size > 10_000
    rows = [line for line in text.splitlines() if line.startswith("| 5 |")]
    labels = [row.split("|")[3].strip() for row in rows]  # sorted by zeros
    assert labels == ["0 %", "80 % (0: 50 %)", "85 % (0: 50 %)", "90 % (0: 50 %)", "95 % (0: 50 %)"]

    (sweep / "p90").joinpath("summary.json").unlink()
    assert collect.main([str(sweep), "--dataset", "fashion_mnist"]) == 0
    again = (sweep / "RESULTS.md").read_text()
    assert "**Not met.** The most compressed within 1 point: 20.0x" in again
    assert again.count("<!-- study:prune_fashion_mnist:start -->") == 1  # replaced, not added


def test_a_sweep_without_runs_is_one_message(tmp_path: Path, capsys) -> None:
    assert collect.main([str(tmp_path)]) == 1
    assert "collect_prune: error: no INQ summary.json under" in capsys.readouterr().err


def test_a_broken_summary_is_named(tmp_path: Path, capsys) -> None:
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "summary.json").write_text(json.dumps({"method": "inq", "bits": 5}))
    assert collect.main([str(tmp_path)]) == 1
    assert "not a pruning study summary" in capsys.readouterr().err


def test_datasets_without_a_goal_say_so(tmp_path: Path) -> None:
    fake_run(tmp_path, "p", 4, 0.5, 0.9, 4000)
    assert collect.main([str(tmp_path), "--dataset", "digits"]) == 0
    assert "No goal is set on this dataset" in (tmp_path / "RESULTS.md").read_text()
