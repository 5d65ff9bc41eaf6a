"""The Trainer, in process through its public methods, and the loop's behaviour end to end:
exact steps, checkpoints, exact resume, divergence, progress bars."""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from hydra import compose, initialize_config_module
from train_helpers import TINY, inq_train_here

from inq.errors import ConfigError
from inq.runfiles import LATEST
from inq.train import checkpoint as ckpt
from inq.train.build import check_amp
from inq.train.checkpoint import CHECKPOINT_DIR, load_checkpoint
from inq.train.config import Config, register, validate
from inq.train.distributed import setup
from inq.train.loop import Trainer
from inq.train.progress import Progress
from inq.train.rundir import RunStopped, Terminated, stop_signals


def tiny(*overrides: str) -> Config:
    """A tiny run: one float epoch, then two INQ stages of one epoch; 8 steps per epoch."""
    register()
    with initialize_config_module("inq.conf", version_base="1.3"):
        return validate(compose("config", [*TINY, "inq.portions=[0.5,1.0]", *overrides]))


@pytest.fixture
def cfg() -> Config:
    return tiny()


def _float_phase(trainer: Trainer) -> None:
    (phase, *_) = trainer.phases_left()
    assert phase.name == "float" and trainer.at_phase_start()
    trainer.restart_schedule(phase)
    for epoch in trainer.epochs_left(phase):
        trainer.train_epoch(phase, epoch)
        trainer.save()
    trainer.end_phase(phase)


def _first_stage(trainer: Trainer) -> None:
    (phase, *_) = trainer.phases_left()
    assert phase.name == "stage1" and trainer.at_phase_start()
    trainer.quantize(phase.stage)
    trainer.restart_schedule(phase)
    trainer.train_epoch(phase, 0)


def test_a_phase_is_trained_recorded_and_checkpointed(cfg: Config, tmp_path: Path) -> None:
    trainer = Trainer(cfg, tmp_path, setup("cpu"), saved=None)
    assert [p.name for p in trainer.phases_left()] == ["float", "stage1", "stage2"]
    _float_phase(trainer)
    trainer.tb.close()
    assert trainer.progress == Progress(phase=1, epoch=0, batch=0, step=8, seconds=0.0)
    assert [p.name for p in trainer.phases_left()] == ["stage1", "stage2"]
    assert list(trainer.history) == ["float"] and list(trainer.timings) == ["float"]
    assert trainer.history["float"]["portion"] == 0.0 and trainer.history["float"]["count"] > 0
    folder = tmp_path / CHECKPOINT_DIR
    assert sorted(p.name for p in folder.iterdir()) == ["float.pt", "latest.pt"]
    assert (folder / "float.pt").samefile(tmp_path / LATEST)
    saved = load_checkpoint(tmp_path / LATEST)
    assert saved["progress"]["phase"] == 1 and saved["progress"]["step"] == 8
    assert saved["history"] == trainer.history


COMPILED = ("inq.cache_values=true", "trainer.compile=true")


@pytest.mark.parametrize(
    ("options", "backend"),
    [
        ((), None),
        (("trainer.amp=bf16", "trainer.channels_last=true"), None),
        # graph capture and AOTAutograd's backward without inductor's C++ build (12 s on a cold
        # cache), which the slow case adds
        (COMPILED, "aot_eager"),
        pytest.param(COMPILED, "inductor", marks=pytest.mark.slow),
    ],
)
def test_a_train_step_keeps_the_quantized_weights_exact(
    options: tuple[str, ...], backend: str | None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if backend:
        monkeypatch.setattr("inq.train.build.COMPILE_BACKEND", backend)
    trainer = Trainer(tiny(*options), tmp_path, setup("cpu"), saved=None)
    phase = trainer.phases[1]
    trainer.quantize(phase.stage)  # stage 1 straight from the initial weights
    trainer.restart_schedule(phase)
    generator = torch.Generator().manual_seed(0)
    x, y = torch.randn(32, 1, 8, 8, generator=generator), torch.arange(32) % 10
    before = {layer.name: layer.weight.detach().clone() for layer in trainer.sched.layers}
    loss, logits, lr, kd = trainer.train_step(x, y)
    trainer.tb.close()
    assert logits.shape == (32, 10) and loss.ndim == 0 and lr == phase.lr
    assert kd is None  # no distillation (inq.distill.weight 0)
    assert (trainer.progress.step, trainer.progress.batch) == (1, 1)
    for layer in trainer.sched.layers:
        frozen = layer.mask
        weight = layer.weight.detach()
        assert torch.equal(weight[frozen], layer.frozen_values()[frozen])
        assert torch.equal(weight[frozen], before[layer.name][frozen])
        assert not torch.equal(weight[~frozen], before[layer.name][~frozen])  # these trained
    nhwc = "trainer.channels_last=true" in options
    conv = trainer.sched.layers[1].weight  # 16 input channels: one layout or the other
    assert conv.dim() == 4 and conv.is_contiguous(memory_format=torch.channels_last) == nhwc
    assert trainer.sched.layers[0].cache_values == ("inq.cache_values=true" in options)
    assert logits.dtype == (torch.bfloat16 if "trainer.amp=bf16" in options else torch.float32)


def test_bf16_on_a_gpu_without_bfloat16_is_refused_naming_the_key(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *_, **__: False)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *_: "Tesla V100-SXM2-16GB")
    expected = r"^trainer\.amp: Tesla V100-SXM2-16GB has no bfloat16; use trainer\.amp=fp16$"
    with pytest.raises(ConfigError, match=expected):
        check_amp(tiny("trainer.amp=bf16"), torch.device("cuda"))
    check_amp(tiny("trainer.amp=bf16"), torch.device("cpu"))  # CPU autocast takes bfloat16


def test_a_model_torch_cannot_compile_is_refused_naming_the_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken_backend(graph: torch.fx.GraphModule, inputs: list[torch.Tensor]) -> None:
        raise RuntimeError("no kernel for this op")

    monkeypatch.setattr("inq.train.build.COMPILE_BACKEND", broken_backend)
    trainer = Trainer(tiny("trainer.compile=true"), tmp_path, setup("cpu"), saved=None)
    trainer.restart_schedule(trainer.phases[0])
    before = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    with pytest.raises(ConfigError) as err:
        trainer.train_step(torch.randn(4, 1, 8, 8), torch.arange(4))
    trainer.tb.close()
    assert str(err.value).startswith(
        "trainer.compile: torch.compile cannot compile digits_cnn: backend='broken_backend' "
        "raised: RuntimeError: no kernel for this op; run without it"
    )
    for key, value in trainer.model.state_dict().items():  # the failed step changed nothing
        assert torch.equal(value, before[key]), key


def test_the_eta_leaves_the_time_spent_compiling_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 46: the first epoch's ETA extrapolated torch.compile's one-off compile time over
    the whole run (ETA 57:13 for a 2-minute run). Here a compile takes 1000 s of the clock the
    progress lines read, at the first step and at the epoch's last, smaller batch (the second
    graph); the ETA after the first epoch is the other steps'."""
    skew = [0.0]

    class Clock:  # the time module as progress and loop use it, compiles 1000 s long
        @staticmethod
        def perf_counter() -> float:
            return time.perf_counter() + skew[0]

    def slow_backend(graph: torch.fx.GraphModule, inputs: list[torch.Tensor]) -> Any:
        skew[0] += 1000.0
        return graph.forward

    monkeypatch.setattr("inq.train.build.COMPILE_BACKEND", slow_backend)
    monkeypatch.setattr("inq.train.progress.time", Clock)
    cfg = tiny("trainer.compile=true", "data.train_size=200")  # 7 steps: 6 of 32, 1 of 8
    trainer = Trainer(cfg, tmp_path, setup("cpu"), saved=None)
    phase = trainer.phases[0]
    trainer.restart_schedule(phase)
    with caplog.at_level(logging.INFO, logger="inq.train"):
        trainer.train_epoch(phase, 0)  # 7 of 21 steps, the first and the last compiling
    trainer.tb.close()
    assert skew[0] == 2000.0  # two graphs (two batch shapes), each compiled once
    (line,) = [r.getMessage() for r in caplog.records if " epoch " in r.getMessage()]
    # elapsed counts the compiles; the ETA (5 steps timed, 14 left) does not: 1:06:40 before
    assert re.search(r"elapsed 33:\d\d, ETA 0:\d\d$", line), line


def test_a_stop_during_a_save_acts_once_the_checkpoint_is_written(
    cfg: Config, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A SIGTERM in the middle of a save, inside OmegaConf's copy of the config, came out of it
    as an AttributeError (CI, stop 64): the save now holds it until the checkpoint is whole."""
    trainer = Trainer(cfg, tmp_path, setup("cpu"), saved=None)
    copy_config = ckpt.to_dict

    def stopped_while_copying(config: Any) -> dict[str, Any]:
        os.kill(os.getpid(), signal.SIGTERM)
        return copy_config(config)

    monkeypatch.setattr(ckpt, "to_dict", stopped_while_copying)
    with pytest.raises(Terminated), stop_signals():
        trainer.save()
    trainer.tb.close()
    assert load_checkpoint(tmp_path / LATEST)["config"] == json.dumps(copy_config(cfg))


def test_a_restored_trainer_goes_on_bit_identically(cfg: Config, tmp_path: Path) -> None:
    env = setup("cpu")
    whole = Trainer(cfg, tmp_path / "whole", env, saved=None)
    _float_phase(whole)
    _first_stage(whole)
    whole.tb.close()
    saved = load_checkpoint(tmp_path / "whole" / CHECKPOINT_DIR / "float.pt")
    resumed = Trainer(cfg, tmp_path / "resumed", env, saved=saved)
    assert resumed.progress.step == 8 and resumed.history == saved["history"]
    _first_stage(resumed)
    resumed.tb.close()
    assert (resumed.progress.phase, resumed.progress.epoch, resumed.progress.step) == (1, 1, 16)
    assert (whole.progress.phase, whole.progress.epoch, whole.progress.step) == (1, 1, 16)
    for key, value in whole.model.state_dict().items():
        assert torch.equal(resumed.model.state_dict()[key], value), key


def test_a_checkpoint_of_other_processes_is_refused(cfg: Config, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"^trainer\.resume: saved by 2 processes, not 1") as err:
        Trainer(cfg, tmp_path, setup("cpu"), saved={"world_size": 2})
    assert str(err.value).endswith(
        f": resume it with inq-torchrun --nproc_per_node=2 trainer.resume={tmp_path}"
    )


def test_diverging_training_stops_with_one_message(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    status, _, err = inq_train_here(*TINY, "optim.lr=1e30", f"hydra.run.dir={run_dir}",
                                    cwd=tmp_path)  # fmt: skip
    assert status == 1 and "Traceback" not in err
    assert (
        "inq-train: training diverged: the loss is nan at step 2 (float); lower optim.lr (or "
        in err
    )
    assert not (run_dir / "checkpoints").exists()  # no checkpoint holds the NaN weights
    again = inq_train_here(*TINY, f"hydra.run.dir={run_dir}", cwd=tmp_path)  # as the message says
    assert again[0] == 0, again[2]


def test_non_finite_norm_statistics_stop_the_run_before_a_save(cfg: Config, tmp_path: Path) -> None:
    """Issue 33: a loss that climbs without overflowing (momentum 2: ~4e17) left BatchNorm's
    running_var infinite in every checkpoint, and the run failed at packing with a traceback."""
    trainer = Trainer(cfg, tmp_path, setup("cpu"), saved=None)
    _float_phase(trainer)
    (phase, *_) = trainer.phases_left()
    trainer.quantize(phase.stage)
    trainer.restart_schedule(phase)
    trainer.train_epoch(phase, 0)
    good = (tmp_path / LATEST).read_bytes()
    norm = next(m for m in trainer.model.modules() if isinstance(m, torch.nn.BatchNorm2d))
    norm.running_var[0] = float("inf")
    with pytest.raises(RunStopped) as stop:
        trainer.save()
    trainer.tb.close()
    assert str(stop.value).startswith("training diverged: ")
    assert "running_var' holds NaN or infinite values at step 16 (stage1); lower optim.lr" in (
        str(stop.value)
    )
    assert f"in a new directory ({tmp_path} keeps this run's" in str(stop.value)
    assert (tmp_path / LATEST).read_bytes() == good


def test_progress_bars_in_a_terminal(tmp_path: Path) -> None:
    status, _, shown = inq_train_here(*TINY, f"hydra.run.dir={tmp_path}", cwd=tmp_path,
                                      terminal=True)  # fmt: skip
    assert status == 0, shown[-2000:]
    assert "run: 100%" in shown and "40/40" in shown  # the whole run: 5 epochs of 8 steps
    assert "stage4 epoch 1/1" in shown
