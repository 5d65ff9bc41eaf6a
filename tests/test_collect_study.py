"""experiments/collect_study.py on a tiny synthetic sweep: the table, the checks and the PNG."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from train_helpers import load_experiment

collect = load_experiment("collect_study")
FLOAT = {0: 0.90, 1: 0.92, 2: 0.94}  # per-seed float accuracy
# (method, bits, strategy, portions) -> accuracy minus float, per seed
RUNS = {
    ("inq", 5, "magnitude", collect.PAPER_SCHEDULES[5]): (0.01, 0.02, 0.03),
    ("inq", 5, "magnitude", (0.3, 0.6, 0.8, 1.0)): (0.0, 0.0, 0.0),
    ("inq", 5, "random", collect.PAPER_SCHEDULES[5]): (0.02, 0.03, 0.04),
    ("inq", 2, "magnitude", collect.PAPER_SCHEDULES[2]): (-0.02, -0.03, -0.04),
    ("ste", 2, "magnitude", (1.0,)): (-0.10, -0.10, -0.10),
    ("oneshot", 5, "magnitude", (1.0,)): (-0.48, -0.5, -0.52),
    ("oneshot", 2, "magnitude", (1.0,)): (-0.8, -0.8, -0.8),
}


def fake_sweep(root: Path, runs: dict = RUNS, **extra: object) -> Path:
    for n, ((method, bits, strategy, portions), deltas) in enumerate(runs.items()):
        for seed, delta in enumerate(deltas):
            run = root / "group" / f"{n}_{seed}"
            run.mkdir(parents=True)
            summary = {
                "method": method,
                "bits": bits,
                "strategy": strategy,
                "portions": list(portions),
                "seed": seed,
                "float_acc": FLOAT[seed],
                "final_acc": FLOAT[seed] + delta,
                "stages": {},
                **extra,
            }
            (run / "summary.json").write_text(json.dumps(summary))
    return root


def table_row(text: str, start: str) -> list[str]:
    rows = [line for line in text.splitlines() if line.startswith(start)]
    assert len(rows) == 1, (start, rows)
    return [cell.strip() for cell in rows[0].strip("|").split("|")]


def test_collector_writes_the_table_checks_and_png(tmp_path: Path) -> None:
    sweep = fake_sweep(tmp_path / "sweep")
    results = tmp_path / "RESULTS.md"
    results.write_text("# Results\n\n## Other section\n\nkept as it is\n")
    png = tmp_path / "plots" / "study.png"
    assert collect.main([str(sweep), "--results", str(results), "--plot", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    text = results.read_text()
    assert text.startswith("# Results\n\n## Other section\n\nkept as it is\n")
    assert "(plots/study.png)" in text
    assert table_row(text, "| 32 | float") == ["32", "float", "", "", "3", "92.00 ± 2.00", "", ""]
    paper = "paper (max, layer)"
    assert table_row(text, f"| 5 | INQ magnitude | {paper} | 0.5/") == [
        "5", "INQ magnitude", paper, "0.5/0.75/0.875/1", "3", "94.00 ± 3.00", "+2.00 ± 1.00", "-"
    ]  # fmt: skip
    row = table_row(text, f"| 5 | INQ magnitude | {paper} | 0.3/")
    assert row[5:] == ["92.00 ± 2.00", "+0.00 ± 0.00", "-"]
    assert table_row(text, "| 2 | STE")[3:] == ["", "3", "82.00 ± 2.00", "-10.00 ± 0.00", "-"]
    assert table_row(text, "| 5 | one-shot")[3:7] == ["", "3", "42.00 ± 0.00", "-50.00 ± 2.00"]
    # table order: float, then bits descending, INQ magnitude before random, STE, one-shot
    ours = [line for line in text.splitlines() if line[:4] in ("| 5 ", "| 2 ") and "±" in line]
    ours = [line for line in ours if "paper (max" in line]
    order = [line.split("|")[1:3] for line in ours]
    assert [m.strip() for _, m in order] == [
        "INQ magnitude", "INQ magnitude", "INQ random", "one-shot",
        "INQ magnitude", "STE", "one-shot",
    ]  # fmt: skip
    assert table_row(text, "| 5-bit INQ >= float")[1:] == ["+2.00 ± 1.00", "holds (within noise)"]
    assert table_row(text, "| 5-bit magnitude >= random")[1:] == ["-1.00 ± 0.00", "fails"]
    assert table_row(text, "| 2-bit INQ (paper) >= STE on its level sets -0.3")[1:] == [
        "+7.00 ± 1.00",
        "holds",
    ]
    assert table_row(text, "| 2-bit INQ (paper) >= float -2.5")[1:] == [
        "-3.00 ± 1.00",
        "fails (within noise)",
    ]
    assert table_row(text, "| 4-bit INQ within 0.3")[1:] == ["not run", ""]
    assert table_row(text, "| 2 (ternary) | 33.98")[3] == "-2.25"  # the paper, beside ours


def test_rerun_replaces_only_the_marked_section(tmp_path: Path) -> None:
    sweep = fake_sweep(tmp_path / "sweep")
    results = tmp_path / "RESULTS.md"
    args = [str(sweep), "--results", str(results), "--plot", str(tmp_path / "p.png")]
    assert collect.main(args) == 0
    results.write_text(results.read_text() + "\n### Discussion\n\nhand-written\n")
    first = results.read_text()
    assert collect.main(args) == 0
    assert results.read_text() == first
    assert first.count(collect.START) == 1 and first.endswith("hand-written\n")


def test_bad_sweeps_end_in_one_message(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    results = tmp_path / "RESULTS.md"
    empty = tmp_path / "empty"
    empty.mkdir()
    assert collect.main([str(empty), "--results", str(results)]) == 1
    assert "no summary.json" in capsys.readouterr().err
    sweep = fake_sweep(tmp_path / "dup")
    twin = sweep / "again" / "summary.json"
    twin.parent.mkdir()
    twin.write_text((sweep / "group" / "0_0" / "summary.json").read_text())
    assert collect.main([str(sweep), "--results", str(results)]) == 1
    assert "are the same run" in capsys.readouterr().err
    (sweep / "again" / "summary.json").write_text(json.dumps({"bits": 5}))
    assert collect.main([str(sweep), "--results", str(results)]) == 1
    assert "not a study summary" in capsys.readouterr().err
    assert not results.exists()


def test_fashion_mnist_section_with_level_set_options(tmp_path: Path) -> None:
    """Runs with mse n1 per channel get their own rows, zero shares and goal checks; the
    default output is the sweep folder, under the dataset's own markers."""
    paper = fake_sweep(tmp_path / "sweep" / "paper", {k: v for k, v in RUNS.items() if k[1] == 2})
    options = {"n1_rule": "mse", "granularity": "channel", "zero_fraction": 0.4}
    mse = {
        ("inq", 2, "magnitude", collect.PAPER_SCHEDULES[2]): (-0.01, -0.01, -0.01),
        ("ste", 2, "magnitude", (1.0,)): (-0.005, -0.015, -0.01),
    }
    fake_sweep(tmp_path / "sweep" / "mse", mse, **options)
    assert collect.main([str(paper.parent), "--dataset", "fashion_mnist"]) == 0
    results = tmp_path / "sweep" / "RESULTS.md"
    assert (tmp_path / "sweep" / "study_fashion_mnist.png").is_file()
    text = results.read_text()
    start, end = collect.markers("fashion_mnist")
    assert start in text and end in text and collect.START not in text
    row = table_row(text, "| 2 | INQ magnitude | mse, channel")
    assert row[5:] == ["91.00 ± 2.00", "-1.00 ± 0.00", "40 %"]
    assert table_row(text, "| 2-bit INQ, mse n1 per channel >= float -1.5")[2] == "holds"
    check = table_row(text, "| 2-bit INQ, mse n1 per channel >= STE on its level sets -0.3")
    assert check[1:] == ["+0.00 ± 0.50", "holds (within noise)"]
    assert table_row(text, "| 2-bit INQ (paper) >= float -1.5")[1:] == [
        "-3.00 ± 1.00",
        "fails (within noise)",
    ]
    assert table_row(text, "| 5-bit INQ (paper) >= float -0.2")[1:] == ["not run", ""]
