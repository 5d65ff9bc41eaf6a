"""DDP: two gloo processes on the CPU under torchrun keep weights and masks identical."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch
from train_helpers import INQ_TRAIN, TINY

from inq import INQScheduler
from inq.export import load_masked
from inq.train.distributed import check_identical, setup
from inq.train.models import build_model


def test_two_gloo_processes_stay_identical(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
        str(INQ_TRAIN), *TINY, "inq.strategy=random", f"hydra.run.dir={run_dir}",
        "quant.act_bits=8", "quant.epochs=1", "quant.batches=2",
    ]  # fmt: skip
    proc = subprocess.run(command, capture_output=True, text=True, timeout=600, env=os.environ)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    # check_identical() compared every weight, buffer and mask across ranks at each stage end
    assert "ranks diverged" not in proc.stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["world_size"] == 2
    ckpt = load_masked(run_dir / "model_masked.safetensors")
    assert all(mask.all() for mask in ckpt.masks.values())
    state = torch.load(run_dir / "checkpoints" / "latest.pt", weights_only=True)
    assert state["world_size"] == 2
    # the integer phase: every rank computes it, rank 0 writes it; shards sum to the whole set
    from inq.quant.integer import load_integer
    from inq.train.data import build_eval_loader
    from inq.train.loop import evaluate
    from inq.train.quantize import RealOutput

    int_model = load_integer(run_dir / "model.int.safetensors")
    metrics = evaluate(RealOutput(int_model), build_eval_loader(int_model.info["data"]),
                       torch.device("cpu"), top5=False)  # fmt: skip
    assert summary["integer"]["acc"] == metrics["acc"]


def test_single_process_needs_no_group() -> None:
    env = setup("cpu")
    assert (env.rank, env.world_size, env.main) == (0, 1, True)
    model = build_model({"name": "digits_cnn", "num_classes": 10, "in_channels": 1})
    check_identical(model, INQScheduler(model))  # no process group: nothing to compare
