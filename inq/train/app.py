"""``inq-train``: Algorithm 1 of the INQ paper as a Hydra app.

Float weights come from ``model.checkpoint`` or are pretrained here; with ``inq.bits=auto``,
each layer's bits are then chosen under ``inq.budget`` (:mod:`inq.train.allocation`); then, for
each portion,
partition + snap, restart the LR schedule (and the optimizer if ``inq.reset_optimizer``), retrain
and evaluate; optionally train only biases/norms at the end. ``inq.method`` selects a baseline on
the same level sets instead: ``oneshot`` snaps every weight at once without retraining, ``ste``
fine-tunes all weights with a straight-through estimator for INQ's epoch budget
(:mod:`inq.baselines`). With ``inq.distill.weight`` > 0, all retraining after the float phase
(pruning rounds, stages, ``bias_norm``, ``ste``, the integer model's fine-tuning) also distills
from the float model, frozen (:mod:`inq.distill`). Everything lands in the Hydra run dir, which
one process owns at a time and only ``trainer.resume`` continues (:mod:`inq.train.rundir`):
``tb/`` (TensorBoard), ``checkpoints/{latest,float,stageK}.pt`` (``float.pt`` also serves as the
distillation teacher of a resumed run), ``model_masked.safetensors``, ``model.inq.safetensors``,
``app.log`` and ``summary.json``; with ``quant.act_bits``, the integer model
``model.int.safetensors`` (:mod:`inq.quant.pipeline`).

Example (shell)::

    inq-train                                # digits, small CNN, 5-bit INQ
    inq-train inq.bits=4 trainer.float_epochs=10
    inq-train inq.method=ste inq.bits=3      # the STE baseline
    inq-train inq.bits=auto inq.budget.avg_bits=5   # per-layer bits under a size budget
    inq-train trainer.resume=outputs/2024-01-01/12-00-00   # continue a killed run
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import sys
import time
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any, NoReturn

import hydra
import torch
from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf
from torch import nn

from inq.errors import ConfigError
from inq.masked import save_masked
from inq.packed import export_packed
from inq.quant.pipeline import QuantSettings
from inq.runfiles import INTEGER, MASKED, PACKED
from inq.scheduler import INQScheduler
from inq.train.allocation import allocation_phase
from inq.train.build import allocation_of
from inq.train.checkpoint import load_checkpoint, resumed_config
from inq.train.config import AUTO, Config, check_given, composition_error, register, validate
from inq.train.distributed import Dist, setup, teardown
from inq.train.integer import integer_phase
from inq.train.loop import Trainer
from inq.train.phases import Phase
from inq.train.rundir import (
    RECORDED_CONFIG,
    RunStopped,
    claimed,
    describe_os_error,
    remove_unused,
)
from inq.train.summary import summarize, table, write_summary

__all__ = ["export_artifacts", "main", "run", "train", "train_phase"]

log = logging.getLogger("inq.train")


def run(
    cfg: DictConfig,
    out_dir: Path,
    dir_chosen: bool = True,
    hydra_files: dict[str, str] | None = None,
    given: Collection[str] | Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Run (or resume) a whole INQ training described by ``cfg``; returns the summary.

    ``out_dir`` is the run directory (Hydra's); ``dir_chosen`` says the user picked it (False for
    Hydra's timestamped default, which a resumed run discards for the killed run's directory).
    ``hydra_files`` (``{relative path: text}``) are written into a new run's directory once it
    is known to hold no other run. A resumed run goes on with the config it recorded; of
    ``cfg``, only the keys in ``given`` (the command line's; ``None``: all) that may change
    (:data:`inq.train.checkpoint.RESUMABLE_CHANGES`) apply. Given as ``{key: value}`` (the
    command line's parsed values), the values are checked too (:func:`check_given`).

    Raises:
        ConfigError: on any bad input, naming the config key to fix.
        RunStopped: on Ctrl-C or SIGTERM, and on a failed write (disk full, read-only), saying
            how to resume.
    """
    try:
        if isinstance(given, Mapping):
            check_given(cfg, given)
        typed = validate(cfg)
    except ConfigError:
        remove_unused(out_dir, dir_chosen)  # Hydra made it before inq-train could refuse it
        raise
    env = setup(typed.trainer.device)
    if typed.trainer.num_threads:
        torch.set_num_threads(typed.trainer.num_threads)
    if not env.main:
        log.setLevel(logging.WARNING)
    try:
        with claimed(typed.trainer, out_dir, dir_chosen, env.main, hydra_files) as claim:
            saved = load_checkpoint(claim.resume_path) if claim.resume_path is not None else None
            recorded = json.loads(saved["config"]) if saved is not None else claim.recorded
            if recorded is not None:
                typed = _resumed(recorded, cfg, given, saved, claim.home)
            return train(typed, claim.home, env, saved)
    finally:
        teardown()


def train(cfg: Config, out_dir: Path, env: Dist, saved: dict[str, Any] | None) -> dict[str, Any]:
    """The run in ``out_dir``, from the start or from the checkpoint ``saved``: float
    pretraining, pruning rounds, INQ stages (or a baseline), exports, the integer phase and the
    summary, which it returns."""
    trainer = Trainer(cfg, out_dir, env, saved)  # the model, INQ scheduler, data and optimizer
    with trainer.bars.running():
        for phase in trainer.phases_left():  # float, prune1.., stage1.. (oneshot, ste), bias_norm
            if phase.name != "float":
                allocation_phase(trainer)  # inq.bits=auto: once, before anything is quantized
            train_phase(trainer, phase)
        summary = summarize(
            cfg, trainer.sched, trainer.phases, trainer.history, trainer.timings,
            prune_targets=trainer.prune_targets, world_size=env.world_size,
        )  # fmt: skip
        if env.main:  # byte-reproducible: a resumed run writes the same files again
            summary["files"], summary["packed"] = export_artifacts(
                out_dir, trainer.model, trainer.sched, trainer.model_info, trainer.data_info
            )
        try:
            if trainer.integer is not None:
                summary["integer"] = integer_phase(out_dir, trainer)
        except BaseException:
            trainer.tb.close(finished=False)  # the last checkpoint's events only
            raise
        trainer.tb.close()  # after the integer phase's events
    if env.main:
        if "integer" in summary:
            summary["files"]["integer"] = str(out_dir / INTEGER)
        write_summary(out_dir, summary)
        log.info("results in %s\n%s", out_dir, table(summary))
    return summary


def train_phase(trainer: Trainer, phase: Phase) -> None:
    """Run weight phase ``phase`` (or its rest, resumed in its middle): start it (STE, an INQ
    stage's partition and snap, or a pruning round), train its epochs, evaluating every
    ``trainer.eval_every`` and saving after each, and end it."""
    if trainer.at_phase_start():  # else resumed in its middle: already started
        if phase.name == "ste":
            trainer.start_ste()
        elif phase.stage > trainer.sched.stage:
            trainer.quantize(phase.stage)  # partition, snap, freeze
        elif phase.prune:
            trainer.prune(phase.prune)
        trainer.restart_schedule(phase)
    every = trainer.cfg.trainer.eval_every
    for epoch in trainer.epochs_left(phase):
        trainer.train_epoch(phase, epoch)
        if every and (epoch + 1) % every == 0 and epoch + 1 < phase.epochs:
            trainer.evaluate()  # before the save, so a kill during it redoes it on resume
        trainer.save()
    trainer.end_phase(phase)


def export_artifacts(
    out_dir: Path,
    model: nn.Module,
    sched: INQScheduler,
    model_info: dict[str, Any],
    data_info: dict[str, Any],
) -> tuple[dict[str, str], dict[str, float]]:
    """Write the masked checkpoint and the packed codes of a finished run into ``out_dir``.

    Both record ``model_info`` (to rebuild the model) and ``data_info`` (what ``inq eval``
    evaluates it on).

    Returns ``{kind: path}`` and the packed file's sizes (``ratio``: packed / fp32 bytes of the
    quantized tensors), which ``summary.json`` records under ``packed``.
    """
    masked = out_dir / MASKED
    save_masked(masked, model, sched, model_info=model_info, data_info=data_info)
    packed = out_dir / PACKED
    stats = export_packed(masked, packed)
    return {"masked": str(masked), "packed": str(packed)}, stats.as_dict()


def _resumed(
    recorded: dict[str, Any],
    cfg: DictConfig,
    given: Collection[str] | None,
    saved: dict[str, Any] | None,
    run_dir: Path,
) -> Config:
    """The run's recorded config with the allowed changes ``given`` makes; checked (typed) and
    logged. Without ``quant.act_bits`` now, the integer phase's other recorded settings go
    too."""
    cfg, changes = resumed_config(recorded, cfg, given)
    if cfg.quant.act_bits is None:
        _check_integer_kept(run_dir)
        cfg.quant = OmegaConf.structured(QuantSettings)
    typed = validate(cfg)
    if saved is not None:
        _check_calibration_kept(typed, saved, changes)
        log.info("resuming at step %d", saved["progress"]["step"])
    changed = [
        f"{k}={new!r} (was {old!r})" for k, (old, new) in changes.items() if k != "trainer.resume"
    ]
    if changed:
        log.info("changed on resume: %s", ", ".join(changed))
    return typed


def _check_calibration_kept(
    cfg: Config, saved: dict[str, Any], changes: Mapping[str, tuple[Any, Any]]
) -> None:
    """Before ``inq.bits=auto`` has chosen the bits, a resume keeps what they are measured
    with, so that they come out as the uninterrupted run's: ``data.eval_batch_size`` (the
    calibration batches' size) is refused; another ``trainer.device`` (other float rounding,
    rarely other bits) is allowed, with a warning."""
    if cfg.inq.bits != AUTO or allocation_of(saved) is not None:
        return
    if "data.eval_batch_size" in changes:
        old, _ = changes["data.eval_batch_size"]
        raise ConfigError(
            "data.eval_batch_size",
            f"sizes the batches inq.bits=auto measures, and this run has not chosen its bits "
            f"yet: resume with data.eval_batch_size={old} (it may change once they are chosen)",
        )
    if "trainer.device" in changes:
        old, new = changes["trainer.device"]
        log.warning(
            "trainer.device=%s (was %s) before inq.bits=auto has chosen the bits: measured "
            "there, they may differ from the uninterrupted run's", new, old,
        )  # fmt: skip


def _check_integer_kept(run_dir: Path) -> None:
    """A resumed run without ``quant.act_bits`` would leave its earlier integer model in the
    directory, no longer described by ``summary.json``: refuse it, losing nothing."""
    if (run_dir / INTEGER).exists():
        raise ConfigError(
            "quant.act_bits",
            f"{run_dir / INTEGER} was made by this run; resuming without quant.act_bits would "
            "leave it out of the run's summary: keep quant.act_bits, or move the file away first",
        )


HYDRA_DEFAULT_RUN_DIR = "outputs/${now:%Y-%m-%d}/${now:%H-%M-%S}"
RANK_WAIT_S = 30.0  # how long a rank other than 0 leaves rank 0 to report a shared error
SLURM_LAUNCHER = (
    "SlurmLauncher"  # hydra-submitit-launcher's class for hydra/launcher=submitit_slurm
)


class HydraChecks(Callback):
    """What Hydra would fail on with a traceback, checked before it acts (``conf/config.yaml``
    registers this callback): a run or sweep directory that cannot be made, and a Slurm sweep
    on a machine without Slurm. Each ends ``inq-train`` with one line."""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        _check_output_dir(config.hydra.run.dir, "hydra.run.dir")

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        launcher = str(OmegaConf.select(config, "hydra.launcher._target_", default=""))
        if launcher.endswith(SLURM_LAUNCHER) and shutil.which("sbatch") is None:
            _fail(
                ConfigError(
                    "hydra/launcher",
                    "submitit_slurm submits to Slurm, but this machine has no Slurm (no sbatch "
                    "on PATH); run the sweep here with hydra/launcher=submitit_local, or submit "
                    "it from a Slurm login node",
                )
            )
        _check_output_dir(config.hydra.sweep.dir, "hydra.sweep.dir")


def _check_output_dir(path: str | None, key: str) -> None:
    """Make the directory ``path`` as Hydra would, or end with one line saying why not."""
    if not path:
        _fail(ConfigError(key, "is empty; name the directory to write the run into"))
    folder = Path(str(path)).expanduser()
    if folder.exists() and not folder.is_dir():
        _fail(ConfigError(key, f"{folder} is a file, not a directory; choose another {key}"))
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        _fail(ConfigError(key, f"cannot make {folder}: {describe_os_error(err)}"))


def _fail(err: ConfigError | RunStopped, exit_code: int = 1) -> NoReturn:
    """End ``inq-train`` with ``err`` in one line, printed by rank 0.

    Every rank of a ``torchrun`` job meets the same error at about the same time. The others
    wait (:data:`RANK_WAIT_S`) so that rank 0's exit is the first torchrun sees: it then stops
    them (SIGTERM), and its message and exit status are the job's. Only an error of one rank
    alone outlives the wait, and that rank prints it. After Ctrl-C or SIGTERM, which reach
    every rank, the others leave at once and silently.
    """
    if int(os.environ.get("RANK", "0")) != 0:
        if exit_code in (130, 143):
            sys.exit(exit_code)
        time.sleep(RANK_WAIT_S)
    prefix = "inq-train: error: " if isinstance(err, ConfigError) else "inq-train: "
    print(f"{prefix}{err}", file=sys.stderr)
    sys.exit(exit_code)


@hydra.main(version_base="1.3", config_path="pkg://inq.conf", config_name="config")
def _hydra_app(cfg: DictConfig) -> float:
    hydra_cfg = HydraConfig.get()
    chosen = (
        hydra_cfg.mode == RunMode.MULTIRUN
        or OmegaConf.to_container(hydra_cfg.run, resolve=False)["dir"] != HYDRA_DEFAULT_RUN_DIR
    )
    # what Hydra writes itself when output_subdir is set (conf/config.yaml turns that off)
    files = {
        RECORDED_CONFIG: OmegaConf.to_yaml(cfg),
        ".hydra/hydra.yaml": OmegaConf.to_yaml({"hydra": hydra_cfg}),
        ".hydra/overrides.yaml": OmegaConf.to_yaml(hydra_cfg.overrides.task),
    }
    overrides = list(hydra_cfg.overrides.task)
    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
        given = {o.key_or_group: o.value() for o in parsed}
        return run(cfg, Path(hydra_cfg.runtime.output_dir), chosen, files, given)["final_acc"]
    except ConfigError as err:
        _fail(err)
    except RunStopped as stop:
        _fail(stop, stop.exit_code)


def main() -> None:
    """Console entry point of ``inq-train`` (all arguments are Hydra overrides).

    A config Hydra cannot compose (a bad value or unknown key, in an override or a config
    file, a group option that does not exist, an override it cannot parse) ends in one line
    naming the key (:func:`inq.train.config.composition_error`), not Hydra's multi-line report;
    with ``HYDRA_FULL_ERROR=1`` set by the user, Hydra's own traceback as before."""
    register()
    full_error = os.environ.get(HYDRA_FULL_ERROR)
    os.environ[HYDRA_FULL_ERROR] = "1"  # Hydra's errors reach this function instead of printing
    try:
        _hydra_app()
    except HydraException as err:
        if full_error == "1":
            raise
        _fail(composition_error(err))
    finally:
        if full_error is None:
            os.environ.pop(HYDRA_FULL_ERROR, None)
        else:
            os.environ[HYDRA_FULL_ERROR] = full_error


HYDRA_FULL_ERROR = "HYDRA_FULL_ERROR"


if __name__ == "__main__":  # python -m inq.train.app: where the console script is not installed
    main()
