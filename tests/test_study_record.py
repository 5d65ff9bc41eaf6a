"""experiments/study_record.py: a study's finished runs kept in a tracked file and restored."""

from __future__ import annotations

import json
from pathlib import Path

from test_collect_mixed import auto, fake_run
from train_helpers import load_experiment

record = load_experiment("study_record")
collect = load_experiment("collect_mixed")


def test_saved_runs_come_back_on_a_fresh_machine_but_the_float_model_does_not(
    tmp_path: Path,
) -> None:
    old, new, kept = tmp_path / "old", tmp_path / "new", tmp_path / "runs.json"
    fake_run(old, "float", 0, 0.90, files={"float": "/old/machine/float.pt"})
    fake_run(old, "uniform3", 0, 0.88, bits=3)
    fake_run(old, "auto_loss_3.0", 0, 0.885, **auto(2.98))
    assert record.main(["save", str(old), str(kept)]) == 0
    assert record.save(old, kept) == 0  # nothing new the second time
    runs = json.loads(kept.read_text())
    assert sorted(runs) == ["auto_loss_3.0/seed0", "float/seed0", "uniform3/seed0"]
    assert "files" not in runs["float/seed0"]

    assert record.main(["restore", str(kept), str(new)]) == 0
    assert not (new / "float").exists()  # trained again: the jobs still to run need it
    restored = json.loads((new / "uniform3/seed0/summary.json").read_text())
    assert restored["final_acc"] == 0.88 and restored["restored_from"] == str(kept)
    assert record.restore(kept, new) == 0  # what is there is left alone
    assert collect.main([str(new), "--name", "fashion_mnist"]) == 0
    assert (
        "| uniform 3 | 3.000 | 88.00 ± 0.00 % | -2.00 | 1 | — |" in (new / "RESULTS.md").read_text()
    )


def test_a_float_model_made_again_differently_is_refused(tmp_path: Path, capsys) -> None:
    kept = tmp_path / "runs.json"
    fake_run(tmp_path / "old", "uniform2", 1, 0.80)
    assert record.save(tmp_path / "old", kept) == 1
    fresh = tmp_path / "fresh"
    fake_run(fresh, "float", 1, 0.91, float_acc=0.91)
    before = kept.read_text()
    assert record.main(["save", str(fresh), str(kept)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("study_record: error: seed 1:") and "not reproduced" in err
    assert kept.read_text() == before  # nothing written
