"""inq-train with ``inq.distill``: the teacher is the frozen float model (from the float phase or
``model.checkpoint``), restored from ``checkpoints/float.pt`` on resume; every retraining phase
and the integer fine-tuning distill from it; off, the run is the plain one bit for bit."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from export_fixtures import quantize_on
from hydra import compose, initialize_config_module
from omegaconf import DictConfig, OmegaConf
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from train_helpers import INQ_TRAIN, TINY, inq_train, killed_and_resumed, torchrun_logs

from inq.distill import frozen_teacher
from inq.errors import ConfigError
from inq.fit import Distill
from inq.masked import load_masked, save_masked
from inq.models import build_model
from inq.packed import packed_from_masked
from inq.quant.pipeline import QuantSettings
from inq.runfiles import LATEST
from inq.scheduler import INQScheduler
from inq.train.checkpoint import CHECKPOINT_DIR, KILL_ENV, load_checkpoint
from inq.train.config import register, validate
from inq.train.distributed import setup
from inq.train.loop import Trainer

KD = ("inq.distill.weight=0.5", "inq.distill.temperature=2.0")


def compose_cfg(*overrides: str) -> DictConfig:
    """A tiny run: one float epoch, then two INQ stages of one epoch; 8 steps per epoch."""
    register()
    with initialize_config_module("inq.conf", version_base="1.3"):
        return compose("config", overrides=[*TINY, "inq.portions=[0.5,1.0]", *overrides])


def run_phase(trainer: Trainer, name: str) -> None:
    (phase, *_) = trainer.phases_left()
    assert phase.name == name and trainer.at_phase_start()
    if phase.stage > trainer.sched.stage:
        trainer.quantize(phase.stage)
    trainer.restart_schedule(phase)
    for epoch in trainer.epochs_left(phase):
        trainer.train_epoch(phase, epoch)
        trainer.save()
    trainer.end_phase(phase)


def states_equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.fixture
def threads() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # as inq-train (trainer.num_threads=1); the cores are shared
    yield
    torch.set_num_threads(before)


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("inq.distill.weight=1.5", "inq.distill.weight"),
        ("inq.distill.weight=-0.1", "inq.distill.weight"),
        ("inq.distill.temperature=0", "inq.distill.temperature"),
        ("inq.distill.temperature=-2", "inq.distill.temperature"),
    ],
)
def test_validate_names_the_bad_distill_key(override: str, key: str) -> None:
    with pytest.raises(ConfigError) as info:
        validate(compose_cfg(override))
    assert info.value.key == key and str(info.value).startswith(f"{key}: ")


def test_validate_takes_the_ends_of_the_range() -> None:
    validate(compose_cfg("inq.distill.weight=1.0", "inq.distill.temperature=0.5"))
    validate(compose_cfg("inq.distill.weight=0"))


def test_the_teacher_is_the_frozen_float_model_and_is_restored_on_resume(
    tmp_path: Path, threads: None
) -> None:
    env = setup("cpu")
    whole = Trainer(validate(compose_cfg(*KD)), tmp_path / "whole", env, saved=None)
    run_phase(whole, "float")
    float_file = tmp_path / "whole" / CHECKPOINT_DIR / "float.pt"
    float_state = load_checkpoint(float_file)["model"]
    teacher = whole.teacher
    assert teacher is not None and not teacher.training
    assert not any(p.requires_grad for p in teacher.parameters())
    assert states_equal(teacher.state_dict(), float_state)
    assert all(
        p is not q for p, q in zip(teacher.parameters(), whole.model.parameters(), strict=True)
    )

    run_phase(whole, "stage1")  # distills: the loss mixes in train/kd_loss, logged
    assert whole.teacher is teacher and not teacher.training
    assert states_equal(teacher.state_dict(), float_state)  # the teacher never moved
    assert not states_equal(whole.model.state_dict(), float_state)  # the student did
    whole.tb.close()
    kd_points = scalar_points(tmp_path / "whole")["train/kd_loss"]
    assert [step for step, _ in kd_points] == [10, 12, 14, 16]  # float: steps 1-8, no teacher
    assert all(value >= 0 for _, value in kd_points)

    # resumed from the float checkpoint in another directory: the teacher comes from the
    # float.pt beside the checkpoint (then linked into the new run's), the run goes on exactly
    cfg = compose_cfg(*KD)
    cfg.trainer.resume = str(float_file)
    resumed = Trainer(validate(cfg), tmp_path / "resumed", env, saved=load_checkpoint(float_file))
    assert resumed.teacher is not None and not resumed.teacher.training
    assert states_equal(resumed.teacher.state_dict(), float_state)
    assert (tmp_path / "resumed" / CHECKPOINT_DIR / "float.pt").read_bytes() == (
        float_file.read_bytes()
    )
    run_phase(resumed, "stage1")
    resumed.tb.close()
    assert states_equal(resumed.model.state_dict(), whole.model.state_dict())


def test_a_distilled_resume_without_the_float_checkpoint_is_refused(
    tmp_path: Path, threads: None
) -> None:
    env = setup("cpu")
    trainer = Trainer(validate(compose_cfg(*KD)), tmp_path / "run", env, saved=None)
    run_phase(trainer, "float")
    trainer.tb.close()
    saved = load_checkpoint(tmp_path / "run" / LATEST)
    (tmp_path / "run" / CHECKPOINT_DIR / "float.pt").unlink()
    missing = r"^trainer\.resume: distillation .*/float\.pt, which is missing"
    with pytest.raises(ConfigError, match=missing):
        Trainer(validate(compose_cfg(*KD)), tmp_path / "run", env, saved=saved)


def test_the_weights_of_model_checkpoint_are_the_teacher(tmp_path: Path, threads: None) -> None:
    torch.manual_seed(3)
    model = build_model({"name": "digits_cnn", "num_classes": 10, "in_channels": 1})
    torch.save(model.state_dict(), tmp_path / "float.pt")
    cfg = compose_cfg(*KD, f"model.checkpoint={tmp_path / 'float.pt'}", "trainer.float_epochs=0")
    trainer = Trainer(validate(cfg), tmp_path / "run", setup("cpu"), saved=None)
    assert trainer.phases[0].epochs == 0 and trainer.teacher is None
    run_phase(trainer, "float")
    trainer.tb.close()
    assert states_equal(trainer.teacher.state_dict(), model.state_dict())


def test_weight_zero_is_the_plain_run(tmp_path: Path, threads: None) -> None:
    env = setup("cpu")
    runs = []
    for name, overrides in (("default", ()), ("zero", ("inq.distill.weight=0",))):
        trainer = Trainer(validate(compose_cfg(*overrides)), tmp_path / name, env, saved=None)
        run_phase(trainer, "float")
        run_phase(trainer, "stage1")
        trainer.tb.close()
        assert trainer.teacher is None
        runs.append(trainer.model.state_dict())
    assert states_equal(*runs)


def test_the_integer_fine_tuning_distills_from_a_teacher(tmp_path: Path, threads: None) -> None:
    torch.manual_seed(0)
    info = {"name": "digits_cnn", "num_classes": 10, "in_channels": 1, "width": 8}
    model = build_model(info)
    teacher = frozen_teacher(model)  # the float model
    before = {k: v.clone() for k, v in teacher.state_dict().items()}
    sched = INQScheduler(model, bits=5, portions=(1.0,))
    sched.step()
    save_masked(tmp_path / "m.safetensors", model, sched, info)
    packed = packed_from_masked(load_masked(tmp_path / "m.safetensors"))
    data = {"name": "digits", "train_size": 128, "batch_size": 32, "eval_batch_size": 64}
    settings = QuantSettings(act_bits=8, epochs=1, batches=1)
    plain, plain_report = quantize_on(packed, data, settings)
    zero, zero_report = quantize_on(packed, data, settings, Distill(teacher, 0.0, 4.0))
    kd, kd_report = quantize_on(packed, data, settings, Distill(teacher, 0.5, 4.0))
    assert zero_report["finetune_loss"] == plain_report["finetune_loss"]
    assert states_equal(zero.state_dict(), plain.state_dict())
    assert [op.attrs for op in zero.ops] == [op.attrs for op in plain.ops]  # the scales too
    assert kd_report["finetune_loss"] != plain_report["finetune_loss"]
    trained_apart = not states_equal(kd.state_dict(), plain.state_dict()) or [
        op.attrs for op in kd.ops
    ] != [op.attrs for op in plain.ops]
    assert trained_apart  # the teacher changed what the fine-tuning learned, not just its loss
    assert states_equal(teacher.state_dict(), before)
    with pytest.raises(ValueError, match="distillation weight must lie in"):
        Distill(teacher, 2.0, 4.0)


# --- the console script (subprocesses) ---

QUANT = ("quant.act_bits=8", "quant.epochs=1", "quant.batches=1")
RESUMABLE_KD = (*TINY, *KD, *QUANT, "inq.final_epochs=1", "trainer.checkpoint_every=3")
FILES = ("model_masked.safetensors", "model.inq.safetensors", "model.int.safetensors")


def scalar_points(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    events = EventAccumulator(str(run_dir / "tb"), size_guidance={"scalars": 0})
    events.Reload()
    return {
        tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]
    }


@pytest.mark.slow
def test_distillation_off_gives_the_default_run_byte_for_byte(tmp_path: Path) -> None:
    settings = (*TINY, *QUANT, "prune.sparsity=0.5", "prune.steps=1", "prune.epochs=1")
    inq_train(*settings, f"hydra.run.dir={tmp_path / 'default'}")
    inq_train(*settings, "inq.distill.weight=0", f"hydra.run.dir={tmp_path / 'zero'}")
    for name in FILES:
        assert (tmp_path / "zero" / name).read_bytes() == (tmp_path / "default" / name).read_bytes()
    points = scalar_points(tmp_path / "zero")
    assert points == scalar_points(tmp_path / "default") and "train/kd_loss" not in points


@pytest.mark.slow
def test_a_distilled_run_killed_mid_stage_resumes_byte_for_byte(tmp_path: Path) -> None:
    whole, killed = tmp_path / "whole", tmp_path / "killed"
    inq_train(*RESUMABLE_KD, f"hydra.run.dir={whole}")
    # step:13: mid stage 1 (steps 9-16), a step after the checkpoint of step 12; step:52: in
    # the middle of the integer phase's fine-tuning epoch (steps 49-56), a step after the
    # checkpoint of step 51: it resumes there, distilling, as every phase does
    killed_and_resumed(RESUMABLE_KD, killed, ("step:13", "step:52"))
    for name in FILES:
        assert (killed / name).read_bytes() == (whole / name).read_bytes(), name
    points = scalar_points(killed)
    assert points == scalar_points(whole)
    kd = points["train/kd_loss"]  # logged from the first step after the float phase (1-8) on,
    assert kd[0][0] == 9 and kd[-1][0] == 56 and all(value >= 0 for _, value in kd)  # to the end
    # the teacher is the float phase's model: float.pt, kept and never rewritten
    saved = load_checkpoint(whole / CHECKPOINT_DIR / "float.pt")
    assert saved["progress"]["phase"] == 1 and saved["progress"]["step"] == 8
    assert OmegaConf.create(saved["config"]).inq.distill.weight == 0.5


@pytest.mark.slow
def test_ste_with_distillation_resumes_byte_for_byte(tmp_path: Path) -> None:
    settings = (*TINY, *KD, "inq.method=ste", "inq.bits=3", "trainer.checkpoint_every=3")
    inq_train(*settings, f"hydra.run.dir={tmp_path / 'whole'}")
    run_dir = tmp_path / "run"
    proc = inq_train(*settings, f"hydra.run.dir={run_dir}", env={KILL_ENV: "step:20"}, check=False)
    assert proc.returncode == -9, proc.stderr[-2000:]
    inq_train(*settings, f"trainer.resume={run_dir}")  # the teacher: float.pt, not STE shadows
    reference = (tmp_path / "whole" / "model_masked.safetensors").read_bytes()
    assert (run_dir / "model_masked.safetensors").read_bytes() == reference
    assert "train/kd_loss" in scalar_points(run_dir)


@pytest.mark.slow
def test_two_gloo_processes_distill_and_resume_with_identical_ranks(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    torchrun = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=2",
        *torchrun_logs(tmp_path),
    ]
    settings = (*TINY, *KD, "trainer.checkpoint_every=3")
    # 4 steps per epoch and rank: float 1-4, stage 1 5-8; both ranks die at step 7, after the
    # checkpoint of step 6, and each loads the teacher from float.pt on resume
    for overrides, kill_at in (
        ((*settings, f"hydra.run.dir={run_dir}"), "step:7"),
        ((f"trainer.resume={run_dir}",), ""),
    ):
        proc = subprocess.run(
            [*torchrun, str(INQ_TRAIN), *overrides],
            capture_output=True,
            text=True,
            timeout=600,
            env={**os.environ, KILL_ENV: kill_at},
        )
        assert (proc.returncode != 0) == bool(kill_at), proc.stdout[-3000:] + proc.stderr[-3000:]
    # check_identical() compared every weight, buffer and mask of the ranks at each stage end
    assert "ranks diverged" not in proc.stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["world_size"] == 2 and list(summary["stages"])[-1] == "stage4"
    assert "train/kd_loss" in scalar_points(run_dir)
