"""experiments/bench_train.py on a tiny configuration (ResNet-20 on 16x16 images, batch 4, eager,
float32): the figures it returns, its check that frozen weights stay exact, its time budget."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from train_helpers import load_experiment

import inq

bench_train = load_experiment("bench_train")

TINY = bench_train.Group("resnet20", "fp32", "eager", batch=4, image_size=16)


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    """One torch thread: beside other test processes on the same cores, two threads of tiny
    convolutions wait on each other (seconds a step instead of milliseconds)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_a_group_reports_each_arm_and_finds_the_frozen_weights_exact() -> None:
    figures = bench_train.bench_group(TINY, device="cpu", steps=2, warmup=1, log=lambda _: None)
    assert figures["status"] == "done"
    for arm in bench_train.ARMS:
        assert figures[f"{arm}_step_ms"] > 0 and figures[f"{arm}_first_step_s"] > 0
        assert figures[f"{arm}_images_per_s"] == pytest.approx(4e3 / figures[f"{arm}_step_ms"])
    assert figures["ratio"] == pytest.approx(figures["inq_step_ms"] / figures["plain_step_ms"])
    assert figures["compile_s"] is None  # eager
    assert figures["frozen_fraction"] == pytest.approx(0.6, abs=1e-3)
    # both INQ arms, every frozen weight: 60 % of the 268,336 of ResNet-20's 20 layers, each
    assert figures["frozen_exact"] is True
    assert figures["frozen_checked"] == 2 * 160_999
    assert "skipped" not in bench_train.row(figures)


def test_a_frozen_weight_off_its_power_of_two_is_caught() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(8, 4))
    sched = inq.INQScheduler(model, bits=5)
    sched.step()
    assert bench_train.check_frozen(sched) == 10  # 30 % of 32
    layer = sched.layers[0]
    with torch.no_grad():
        layer.weight[tuple(layer.mask.nonzero()[0])] *= 1.0 + 2**-20
    with pytest.raises(AssertionError, match="0: 1 of 10 frozen weights differ"):
        bench_train.check_frozen(sched)


def test_groups_past_the_budget_are_skipped_and_listed() -> None:
    seen: list[dict[str, Any]] = []
    results = bench_train.run_groups(
        [TINY, bench_train.Group("resnet18", "bf16", "compiled", 4, 16)],
        device="cpu",
        steps=1,
        warmup=0,
        budget_s=0,
        on_done=seen.append,
    )
    assert results == seen
    assert [r["status"] for r in results] == ["skipped", "skipped"]
    assert bench_train.row(results[1]).endswith("skipped (budget spent)")
    assert bench_train.compiled_over_eager(results) == {}


def test_the_script_prints_the_table_and_writes_the_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "train.json"
    argv = ["--device", "cpu", "--models", "resnet20", "--dtypes", "fp32", "--modes", "eager"]
    bench_train.main([*argv, "--batch", "2", "--steps", "1", "--warmup", "0", "--json", str(out)])
    assert torch.get_num_threads() == 1  # --threads not given: the threads as found
    printed = capsys.readouterr().out
    assert printed.startswith(f"torch {torch.__version__}")
    assert printed.splitlines()[0].endswith(", 1 thread")
    assert bench_train.HEADER in printed
    assert "after the timed steps of all 2 INQ arms" in printed
    record = json.loads(out.read_text())
    (group,) = record["groups"]
    assert group["status"] == "done" and group["image_size"] == 32 and group["batch"] == 2
    assert record["settings"]["device"] == "cpu"
