"""Checkpoints: weights_only loads, config checks, and kill-and-resume that is bit-identical."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf
from safetensors.torch import load_file
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
from train_helpers import TINY, inq_train

from inq.errors import ConfigError
from inq.models import build_model
from inq.runfiles import LATEST
from inq.scheduler import INQScheduler
from inq.train.checkpoint import (
    CHECKPOINT_DIR,
    FORMAT,
    KILL_ENV,
    get_rng_state,
    load_checkpoint,
    load_float_weights,
    resolve_resume,
    restore_optimizer,
    restore_training_state,
    resumed_config,
    save_run_checkpoint,
    set_rng_state,
    training_state,
)
from inq.train.config import Config, SGDConfig, to_dict

# 8 steps per epoch, one float epoch then 4 stages of one epoch: 40 steps, checkpoint every 3
RESUMABLE = (*TINY, "trainer.checkpoint_every=3")


@pytest.fixture(scope="module")
def reference_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("uninterrupted")
    inq_train(*RESUMABLE, f"hydra.run.dir={out}")
    return out


def scalar_points(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar tag of a run's TensorBoard events with its (step, value) points, in order."""
    events = EventAccumulator(str(run_dir / "tb"))
    events.Reload()
    return {
        tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]
    }


@pytest.mark.slow
def test_killed_four_times_then_resumed_is_bit_identical(
    tmp_path: Path, reference_dir: Path
) -> None:
    reference = load_file(reference_dir / "model_masked.safetensors")
    run_dir = tmp_path / "run"
    # each resumed process is killed again somewhere else; kill points count within a process
    for attempt, kill_at in enumerate(
        (
            "step:13",  # mid-epoch in stage 1, one step after a checkpoint: a step is replayed
            "step:17",  # first step of stage 2: the stage-1 evaluation and the stage-2
            # partition logged at step 16 after the checkpoint of step 16 are logged again
            "stage:3",  # right after the stage-3 partition, before any retraining
            "eval:2",  # during the final evaluation (the 1st eval of this process ends stage 3)
            None,
        )
    ):
        overrides = [*RESUMABLE, f"hydra.run.dir={run_dir}"]
        if attempt:
            overrides.append(f"trainer.resume={run_dir}")
        proc = inq_train(*overrides, env={KILL_ENV: kill_at or ""}, check=kill_at is None)
        if kill_at:
            assert proc.returncode == -9, proc.stderr[-2000:]
            assert not (run_dir / "model_masked.safetensors").exists()
    resumed = load_file(run_dir / "model_masked.safetensors")
    assert resumed.keys() == reference.keys()
    for key, tensor in reference.items():
        assert torch.equal(resumed[key], tensor), key
    summary = json.loads((run_dir / "summary.json").read_text())
    assert set(summary["stages"]) == {"stage1", "stage2", "stage3", "stage4"}
    # TensorBoard: every point of the uninterrupted run, once, with the same value, wherever
    # the kills fell
    assert scalar_points(run_dir) == scalar_points(reference_dir)
    # one run directory with one log that all four processes appended to
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]
    assert (run_dir / "app.log").read_text().count("resuming ") == 4
    # stage checkpoints: the newest only (trainer.keep_checkpoints=1), beside latest and float
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == [
        "float.pt",
        "latest.pt",
        "stage4.pt",
    ]

    # the finished run cannot be continued with other settings, and the message says why
    proc = inq_train(
        *RESUMABLE,
        "inq.bits=4",
        f"trainer.resume={run_dir}",
        f"hydra.run.dir={run_dir}",
        check=False,
    )
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr
    expected = "trainer.resume: these settings shape the weights and cannot change when a run "
    expected += "resumes: inq.bits=5 (given 4)"
    assert expected in proc.stderr


@pytest.mark.slow
def test_a_run_stopped_in_the_integer_phase_leaves_tensorboard_nothing_to_purge(
    tmp_path: Path,
) -> None:
    """Issue 46: SIGTERM in the integer phase wrote the events logged since the last checkpoint
    (the phase's try/finally closed the writer), so the resumed run's purge_step removed them
    again and TensorBoard warned "Detected out of order event.step ... Removing 17 scalars".
    A stopped run now writes only what its checkpoints cover, as in the weight phases."""
    # 40 steps of weight phases (checkpoint at 40), then 2 fine-tuning epochs: SIGTERM at 44
    settings = (*TINY, "quant.act_bits=8", "quant.epochs=2")
    reference, run_dir = tmp_path / "reference", tmp_path / "run"
    inq_train(*settings, f"hydra.run.dir={reference}")
    stopped = inq_train(
        *settings, f"hydra.run.dir={run_dir}", env={KILL_ENV: "step:44:TERM"}, check=False
    )
    assert stopped.returncode == 143 and "stopped by SIGTERM" in stopped.stderr, stopped.stderr
    (first,) = (run_dir / "tb").iterdir()
    inq_train(*settings, f"trainer.resume={run_dir}", f"hydra.run.dir={run_dir}")
    assert "resuming at step 40" in (run_dir / "app.log").read_text()
    steps = [e.step for e in EventFileLoader(str(first)).Load() if e.HasField("summary")]
    assert steps and max(steps) < 40, max(steps)  # nothing at or after the checkpoint's step
    assert scalar_points(run_dir) == scalar_points(reference)


def resumed_after_a_kill_at_step_13(
    tmp_path: Path, settings: tuple[str, ...], kill_at: str = "step:13"
) -> Path:
    """Run ``settings`` whole (``reference/``) and killed at ``kill_at`` then resumed (``run/``);
    assert both export the same masked checkpoint, bit for bit; return the resumed run's dir."""
    inq_train(*settings, f"hydra.run.dir={tmp_path / 'reference'}")
    run_dir = tmp_path / "run"
    proc = inq_train(*settings, f"hydra.run.dir={run_dir}", env={KILL_ENV: kill_at}, check=False)
    assert proc.returncode == -9, proc.stderr[-2000:]
    inq_train(*settings, f"trainer.resume={run_dir}", f"hydra.run.dir={run_dir}")
    reference = load_file(tmp_path / "reference" / "model_masked.safetensors")
    resumed = load_file(run_dir / "model_masked.safetensors")
    assert resumed.keys() == reference.keys()
    for key, tensor in reference.items():
        assert torch.equal(resumed[key], tensor), key
    return run_dir


LEVEL_OPTIONS = ("inq.bits=3", "inq.n1_rule=mse", "inq.granularity=channel")


@pytest.mark.slow
@pytest.mark.parametrize("method", ["inq", "ste"])
def test_resume_is_bit_identical_with_per_channel_mse_level_sets(
    tmp_path: Path, method: str
) -> None:
    settings = (*RESUMABLE, *LEVEL_OPTIONS, f"inq.method={method}")
    run_dir = resumed_after_a_kill_at_step_13(tmp_path, settings)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert (summary["n1_rule"], summary["granularity"]) == ("mse", "channel")
    assert 0.0 < summary["zero_fraction"] < 1.0


SPEED_OPTIONS = ("trainer.compile=true", "trainer.channels_last=true", "trainer.amp=bf16")
# 7 steps an epoch: 6 batches of 32 and a last one of 8, so a compiled model meets two shapes
UNEVEN = (*TINY, "data.train_size=200")


@pytest.mark.slow
@pytest.mark.parametrize(
    "options",
    [
        SPEED_OPTIONS,
        SPEED_OPTIONS[:2],  # compiled, NHWC
        SPEED_OPTIONS[::2],  # compiled, bf16
        SPEED_OPTIONS[:1],
        SPEED_OPTIONS[1:],  # NHWC, bf16: eager
        SPEED_OPTIONS[1:2],
        SPEED_OPTIONS[2:],
    ],
    ids=lambda options: "+".join(o.split(".")[1].split("=")[0] for o in options),
)
def test_every_speed_option_combination_resumes_bit_identically(
    tmp_path: Path, options: tuple[str, ...]
) -> None:
    """torch.compile (inductor, on the CPU), NHWC and bfloat16 autocast, each combination: a run
    killed in stage 2 and resumed from the end of stage 1 ends where the uninterrupted run does.
    The epoch's last batch is smaller, so a compiled model meets two batch shapes; the resumed
    process meets them in the order the uninterrupted one did after its first epoch, and each
    shape has its own graph (one per shape and process, none more at a stage change)."""
    run_dir = resumed_after_a_kill_at_step_13(tmp_path, (*UNEVEN, *options), kill_at="step:17")
    if "trainer.compile=true" in options:
        for log in (tmp_path / "reference" / "app.log", run_dir / "app.log"):
            counts = re.findall(r"torch\.compile: (\d+) graphs compiled", log.read_text())
            assert len(counts) >= 4 and set(counts) == {"2"}, (log, counts)  # float and stages


def test_checkpoint_loads_weights_only_and_names_bad_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"^trainer\.resume: no checkpoint at"):
        resolve_resume(str(tmp_path))
    bad = tmp_path / "bad.pt"
    # text, a text file whose pickle-like bytes broke PyTorch's unpickler (IndexError), noise
    noise = torch.randint(0, 256, (3000,), generator=torch.Generator().manual_seed(0))
    contents = [b"not a checkpoint", b"root:x:0:0:root:/root:/bin/bash\n"]
    for content in [*contents, bytes(noise.to(torch.uint8).tolist())]:
        bad.write_bytes(content)
        with pytest.raises(ConfigError, match=r"^trainer\.resume: cannot read checkpoint") as err:
            load_checkpoint(bad)
        assert "weights_only" not in str(err.value)  # never the advice to unpickle code
    torch.save({"format": "something else"}, bad)
    with pytest.raises(ConfigError, match="not an inq-train checkpoint"):
        load_checkpoint(bad)
    model = build_model({"name": "digits_cnn", "num_classes": 10, "in_channels": 1})
    with pytest.raises(ConfigError, match=r"^model\.checkpoint: .*does not exist"):
        load_float_weights(model, str(tmp_path / "missing.pt"))
    with pytest.raises(ConfigError, match=r"^model\.checkpoint: cannot read"):
        load_float_weights(model, str(_garbage(tmp_path)))
    torch.save(
        build_model({"name": "resnet20", "num_classes": 10, "in_channels": 3}).state_dict(), bad
    )
    with pytest.raises(ConfigError, match=r"^model\.checkpoint: .*does not fit the model: ") as err:
        load_float_weights(model, str(bad))
    # issue 33: counts and a few names in one line, not ~200 keys
    assert "20 missing ('0.weight', '1.weight', '1.bias', ...), 116 unexpected (" in str(err.value)
    assert len(str(err.value)) < 400 and "\n" not in str(err.value)
    with pytest.raises(ConfigError, match=r"^model\.checkpoint: .* is a directory; name the"):
        load_float_weights(model, str(tmp_path))


def _garbage(tmp_path: Path) -> Path:
    path = tmp_path / "garbage.pth"
    path.write_bytes(b"\x00" * 64)
    return path


def _training(seed: int) -> tuple:
    """A model, scheduler, optimizer, LR schedule and grad scaler of their own kind each."""
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(6, 4), torch.nn.ReLU(), torch.nn.Linear(4, 3))
    sched = INQScheduler(model, bits=4, portions=(0.5, 1.0))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    sched.attach(optimizer)
    lr_schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 0.5**step)
    return model, sched, optimizer, lr_schedule, torch.amp.GradScaler("cpu", enabled=False)


def _train_steps(model, optimizer, lr_schedule, count: int) -> None:
    for _ in range(count):
        optimizer.zero_grad()
        model(torch.randn(5, 6)).square().mean().backward()
        optimizer.step()
        lr_schedule.step()


def test_a_restored_training_state_goes_on_bit_identically(tmp_path: Path) -> None:
    model, sched, optimizer, lr_schedule, scaler = _training(seed=0)
    sched.step()
    _train_steps(model, optimizer, lr_schedule, 3)
    state = training_state(
        tb_pending=[("scalar", "train/loss", 1.5, 3)],
        model=model,
        sched=sched,
        optimizer=optimizer,
        params="all",
        lr_schedule=lr_schedule,
        scaler=scaler,
        progress={"phase": 1, "epoch": 0, "batch": 3, "step": 3, "seconds": 0.5},
        history={"float": {"acc": 0.5}},
        timings={"float": 1.0},
        world_size=1,
        config=_config(inq__bits=4),
    )
    assert list(state) == [
        "tb_pending", "format", "model", "inq", "optimizer", "params", "lr_schedule", "scaler",
        "progress", "history", "timings", "rng", "world_size", "config", "quant",
    ]  # fmt: skip
    assert state["format"] == FORMAT and json.loads(state["config"])["inq"]["bits"] == 4
    save_run_checkpoint(tmp_path, state)
    saved = load_checkpoint(tmp_path / LATEST)  # weights_only
    _train_steps(model, optimizer, lr_schedule, 2)  # the uninterrupted run goes on

    other, other_sched, other_optimizer, other_schedule, other_scaler = _training(seed=1)
    restore_optimizer(saved, other_optimizer, other_schedule)
    restore_training_state(saved, other, other_sched, other_scaler)
    _train_steps(other, other_optimizer, other_schedule, 2)  # the same data: the RNG went back
    for key, value in model.state_dict().items():
        assert torch.equal(other.state_dict()[key], value), key
    assert other_sched.state_dict()["stage"] == 1
    assert other_schedule.get_last_lr() == lr_schedule.get_last_lr()


def test_save_run_checkpoint_names_stages_and_drops_stale_ones(tmp_path: Path) -> None:
    folder = tmp_path / CHECKPOINT_DIR
    save_run_checkpoint(tmp_path, {"format": FORMAT, "step": 1}, names=["float"])
    save_run_checkpoint(tmp_path, {"format": FORMAT, "step": 2}, names=["stage1"])
    save_run_checkpoint(tmp_path, {"format": FORMAT, "step": 3})  # mid-stage: latest only
    assert load_checkpoint(folder / "stage1.pt")["step"] == 2  # kept its content
    save_run_checkpoint(tmp_path, {"format": FORMAT, "step": 4}, ["stage2"], stale=["stage1"])
    assert sorted(p.name for p in folder.iterdir()) == ["float.pt", "latest.pt", "stage2.pt"]
    assert (folder / "stage2.pt").samefile(tmp_path / LATEST)
    assert load_checkpoint(folder / "float.pt")["step"] == 1
    assert resolve_resume(str(tmp_path)) == tmp_path / LATEST


def test_rng_state_round_trips() -> None:
    state = get_rng_state()
    first = torch.rand(3)
    set_rng_state(state)
    assert torch.equal(torch.rand(3), first)


def _config(**changes: object) -> OmegaConf:
    cfg = OmegaConf.merge(OmegaConf.structured(Config), {"optim": SGDConfig()})
    for key, value in changes.items():
        OmegaConf.update(cfg, key.replace("__", "."), value)
    return cfg


def test_a_resume_takes_the_recorded_config_and_only_allowed_changes() -> None:
    recorded = to_dict(_config(inq__epochs=2, inq__bits=4, trainer__float_epochs=3))
    current = _config(trainer__resume="run/", trainer__log_every=1, quant__act_bits=8)
    given = ["trainer.resume", "trainer.log_every", "quant.act_bits"]
    cfg, changes = resumed_config(recorded, current, given)
    assert (cfg.inq.epochs, cfg.inq.bits, cfg.trainer.float_epochs) == (2, 4, 3)
    assert (cfg.trainer.resume, cfg.trainer.log_every, cfg.quant.act_bits) == ("run/", 1, 8)
    assert changes == {
        "quant.act_bits": (None, 8),  # the integer phase may be redone with other settings
        "trainer.log_every": (10, 1),
        "trainer.resume": (None, "run/"),
    }
    # a given group (inq=lowbit) stands for its keys; equal values change nothing
    cfg, changes = resumed_config(recorded, _config(inq__epochs=2, inq__bits=4), ["inq"])
    assert changes == {} and cfg.inq.bits == 4
    with pytest.raises(ConfigError, match=r"inq\.bits=4 \(given 5\), inq\.epochs=2 \(given 6\)"):
        resumed_config(recorded, _config(), ["inq"])


def test_a_recording_from_before_a_key_existed_takes_its_default() -> None:
    recorded = to_dict(_config())
    del recorded["prune"]  # saved before pruning existed
    cfg, changes = resumed_config(recorded, _config(prune__steps=3), None)
    assert changes == {} and cfg.prune.sparsity == 0.0
