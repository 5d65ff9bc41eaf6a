"""summary.json and the printed table: their content, key order and exact text."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from omegaconf import OmegaConf
from torch import nn

from inq.runfiles import SUMMARY
from inq.scheduler import INQScheduler
from inq.train.config import Config, SGDConfig
from inq.train.phases import Phase
from inq.train.summary import METHOD_LABELS, summarize, table, write_summary, zero_fraction

FLOAT = {"portion": 0.0, "pruned": 0.0, "loss": 0.3, "acc": 0.9125, "count": 400.0}
STAGES = {
    "stage1": {"portion": 0.5, "pruned": 0.0, "loss": 0.4, "acc": 0.9, "count": 400.0},
    "stage2": {"portion": 1.0, "pruned": 0.0, "loss": 0.35, "acc": 0.905, "count": 400.0},
}


def _summary(**changes: object) -> dict[str, object]:
    summary = {
        "method": "inq",
        "bits": 5,
        "float_acc": FLOAT["acc"],
        "final_acc": STAGES["stage2"]["acc"],
        "float": FLOAT,
        "stages": STAGES,
    }
    return {**summary, **changes}


def test_table_of_an_inq_run() -> None:
    assert table(_summary()) == (
        "phase      quantized  val acc\n"
        "float           0.0%   91.25%\n"
        "stage1         50.0%   90.00%\n"
        "stage2        100.0%   90.50%\n"
        "float 91.25% -> 5-bit INQ 90.50% (-0.75 points)"
    )


def test_table_adds_a_pruned_column_only_for_runs_that_prune() -> None:
    pruned = {**STAGES["stage2"], "pruned": 0.6}
    summary = _summary(stages={"prune1": {**FLOAT, "pruned": 0.6, "acc": 0.8}, "stage2": pruned})
    assert table(summary).splitlines()[:4] == [
        "phase      quantized   pruned  val acc",
        "float           0.0%     0.0%   91.25%",
        "prune1          0.0%    60.0%   80.00%",
        "stage2        100.0%    60.0%   90.50%",
    ]


def test_table_shows_the_integer_model_and_the_method() -> None:
    summary = _summary(method="ste", bits=3, final_acc=0.95, integer={"act_bits": 8, "acc": 0.94})
    lines = table(summary).splitlines()
    assert lines[-2:] == [
        "integer    8-bit act   94.00%",
        "float 91.25% -> 3-bit STE 95.00% (+3.75 points)",
    ]
    assert table(_summary(method="oneshot")).endswith("-> 5-bit one-shot 90.50% (-0.75 points)")
    assert set(METHOD_LABELS) == {"inq", "oneshot", "ste"}


def _scheduler() -> INQScheduler:
    layer = nn.Linear(4, 2, bias=False)
    with torch.no_grad():
        layer.weight.copy_(torch.tensor([[1.0, 0.5, 0.01, -0.25], [0.0, -1.0, 0.002, 0.125]]))
    return INQScheduler(layer, bits=3, portions=(0.5, 1.0))


def test_zero_fraction_counts_zero_levels_among_the_quantized_weights() -> None:
    sched = _scheduler()
    assert zero_fraction(sched) == 0.0  # nothing quantized yet
    sched.step()  # the 4 largest: 1.0, 0.5, -1.0, -0.25 (3 bits: levels 0, ±0.5, ±1)
    assert zero_fraction(sched) == 0.0  # -0.25 is the tie between 0 and -0.5: it goes up
    sched.step()  # 0.01, 0.002, 0.0 and 0.125 round to zero
    assert zero_fraction(sched) == 0.5


def test_summarize_records_the_run_in_a_fixed_key_order() -> None:
    cfg = OmegaConf.merge(OmegaConf.structured(Config), {"optim": SGDConfig()})
    cfg.trainer.seed = 7
    sched = _scheduler()
    sched.step()
    sched.step()
    phases = [
        Phase("float", 0, 3, 0.1, "all"),
        Phase("stage1", 1, 2, 0.01, "all"),
        Phase("stage2", 2, 2, 0.01, "all"),
    ]
    history = {"float": FLOAT, **STAGES}
    timings = {"float": 1.5, "stage1": 0.5, "stage2": 0.25}
    summary = summarize(cfg, sched, phases, history, timings, prune_targets={}, world_size=2)
    assert list(summary) == [
        "method", "float_acc", "final_acc", "bits", "portions", "strategy", "n1_rule",
        "granularity", "zero_fraction", "pruned_fraction", "seed", "retrain_epochs", "stages",
        "float", "timings_s", "world_size",
    ]  # fmt: skip
    assert summary["method"] == "inq" and summary["seed"] == 7 and summary["world_size"] == 2
    assert (summary["float_acc"], summary["final_acc"]) == (0.9125, 0.905)
    assert (summary["bits"], summary["portions"], summary["retrain_epochs"]) == (3, [0.5, 1.0], 4)
    assert summary["stages"] == STAGES and summary["float"] == FLOAT
    assert summary["zero_fraction"] == 0.5
    assert summary["timings_s"] == timings
    pruned = summarize(cfg, sched, phases, history, timings, prune_targets={"": 0.5}, world_size=1)
    assert list(pruned)[-1] == "prune" and pruned["prune"]["targets"] == {"": 0.5}
    assert pruned["prune"]["steps"] == cfg.prune.steps
    cfg.inq.distill.weight = 0.5
    distilled = summarize(cfg, sched, phases, history, timings, prune_targets={}, world_size=1)
    assert distilled["distill"] == {"weight": 0.5, "temperature": 4.0}
    assert list(distilled).index("distill") == list(distilled).index("retrain_epochs") + 1


def test_write_summary_writes_indented_json_atomically(tmp_path: Path) -> None:
    summary = _summary()
    path = write_summary(tmp_path, summary)
    assert path == tmp_path / SUMMARY
    assert path.read_text() == json.dumps(summary, indent=2) + "\n"
    assert json.loads(path.read_text()) == summary
    assert sorted(p.name for p in tmp_path.iterdir()) == [SUMMARY]  # no temporary left
