"""``inq-train``: Algorithm 1 of the INQ paper as a Hydra app.

Float weights come from ``model.checkpoint`` or are pretrained here; then, for each portion,
partition + snap, restart the LR schedule (and the optimizer if ``inq.reset_optimizer``), retrain
and evaluate; optionally train only biases/norms at the end. ``inq.method`` selects a baseline on
the same level sets instead: ``oneshot`` snaps every weight at once without retraining, ``ste``
fine-tunes all weights with a straight-through estimator for INQ's epoch budget
(:mod:`inq.baselines`). Everything lands in the Hydra run dir, which one process owns at a time
and only ``trainer.resume`` continues (:mod:`inq.train.rundir`): ``tb/`` (TensorBoard),
``checkpoints/{latest,float,stageK}.pt``, ``model_masked.safetensors``,
``model.inq.safetensors``, ``app.log`` and ``summary.json``; with ``quant.act_bits``, the integer
model ``model.int.safetensors`` (:mod:`inq.quant.pipeline`).

Example (shell)::

    inq-train                                # digits, small CNN, 5-bit INQ
    inq-train inq.bits=4 trainer.float_epochs=10
    inq-train inq.method=ste inq.bits=3      # the STE baseline
    inq-train trainer.resume=outputs/2024-01-01/12-00-00   # continue a killed run
"""

from __future__ import annotations

import json
import logging
import math
import random
import sys
import time
from collections.abc import Collection
from contextlib import nullcontext
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import hydra
import numpy as np
import torch
import torch.nn.functional as F
import yaml
from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from tqdm import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm

from inq.baselines import STEQuantizer
from inq.data import batches_per_epoch, build_datasets, build_eval_loader, build_train_loader
from inq.errors import ConfigError
from inq.evaluation import evaluate
from inq.export import save_masked
from inq.io import atomic_path
from inq.models import build_model
from inq.packed import export_packed, load_packed
from inq.prune import layer_targets, sparsity_schedule
from inq.quant.integer import load_integer, save_integer
from inq.quant.lower import IntegerModelError, check_expressible
from inq.quant.pipeline import QuantSettings, RealOutput, quantize
from inq.scheduler import INQScheduler, check_portions
from inq.train import checkpoint as ckpt
from inq.train.config import prune_layers, register, to_dict, validate
from inq.train.distributed import (
    Dist,
    all_sum,
    broadcast_buffers,
    check_identical,
    setup,
    share,
    teardown,
)
from inq.train.loop import (
    Phase,
    build_lr_schedule,
    build_optimizer,
    method_name,
    plan_phases,
    prunes,
)
from inq.train.monitor import Monitor
from inq.train.rundir import (
    RunDir,
    RunStopped,
    holds_run,
    remove_if_empty,
    saved_nothing,
    stop_signals,
)

__all__ = ["export_artifacts", "main", "run"]

log = logging.getLogger("inq.train")


@dataclass
class Progress:
    """Where the run is: phase index, epochs done in it, batches done in the epoch, total steps."""

    phase: int = 0
    epoch: int = 0
    batch: int = 0
    step: int = 0
    seconds: float = 0.0  # spent in this phase by earlier (killed) processes


def run(
    cfg: DictConfig,
    out_dir: Path,
    dir_chosen: bool = True,
    hydra_files: dict[str, str] | None = None,
    given: Collection[str] | None = None,
) -> dict[str, Any]:
    """Run (or resume) a whole INQ training described by ``cfg``; returns the summary.

    ``out_dir`` is the run directory (Hydra's); ``dir_chosen`` says the user picked it (False for
    Hydra's timestamped default, which a resumed run discards for the killed run's directory).
    ``hydra_files`` (``{relative path: text}``) are written into a new run's directory once it
    is known to hold no other run. A resumed run goes on with the config it recorded; of
    ``cfg``, only the keys in ``given`` (the command line's; ``None``: all) that may change
    (:data:`inq.train.checkpoint.RESUMABLE_CHANGES`) apply.

    Raises:
        ConfigError: on any bad input, naming the config key to fix.
        RunStopped: on Ctrl-C or SIGTERM, and on a failed write (disk full, read-only), saying
            how to resume.
    """
    try:
        validate(cfg)
    except ConfigError:
        _remove_unused(out_dir, dir_chosen)  # Hydra made it before inq-train could refuse it
        raise
    env = setup(cfg.trainer.device)
    if cfg.trainer.num_threads:
        torch.set_num_threads(cfg.trainer.num_threads)
    if not env.main:
        log.setLevel(logging.WARNING)
    claim, problem = None, None
    if env.main:
        try:
            claim = _claim(cfg, out_dir, dir_chosen)
        except ConfigError as err:
            problem = err
    owner, note = (claim.owner, claim.note) if claim else (None, None)
    shared = (claim.home, claim.resume_path, claim.continues, claim.recorded) if claim else None
    problem, shared = share((problem, shared))
    if problem is not None or shared[0] != out_dir:
        _remove_unused(out_dir, dir_chosen)
    if problem is not None:
        teardown()
        raise problem
    out_dir, resume_path, continues, recorded = shared
    try:
        with stop_signals():
            if owner is not None:
                if continues:
                    owner.remove_temporaries()
                else:
                    for name, text in (hydra_files or {}).items():
                        with atomic_path(out_dir / name) as tmp:
                            tmp.write_text(text)
                owner.start_log()
                if note:
                    log.info("%s: %s", out_dir, note)
            saved = ckpt.load_checkpoint(resume_path) if resume_path is not None else None
            if saved is not None:
                recorded = json.loads(saved["config"])
            if recorded is not None:
                cfg = _resumed(recorded, cfg, given, saved)
            return _train(cfg, out_dir, env, saved)
    except BaseException as err:
        if owner is not None:  # a new run that stopped before its first checkpoint leaves nothing
            owner.release(discard=not continues)
            _remove_unused(out_dir, dir_chosen)
        if isinstance(err, (KeyboardInterrupt, OSError)):
            raise RunStopped.after(err, out_dir) from None
        raise
    finally:
        if owner is not None:
            owner.release()
        teardown()


def _remove_unused(out_dir: Path, dir_chosen: bool) -> None:
    remove_if_empty(out_dir)
    if not dir_chosen:  # Hydra's default outputs/<date>/<time>: <date> and outputs, if empty now
        remove_if_empty(out_dir.parent)
        remove_if_empty(out_dir.parent.parent)


@dataclass(frozen=True)
class _Claim:
    """The directory a run owns and how it goes on there."""

    owner: RunDir
    resume_path: Path | None = None  # the checkpoint it resumes from
    continues: bool = False  # in its own directory, which a failed start must not delete
    recorded: dict[str, Any] | None = None  # the config of a run started again from nothing
    note: str | None = None  # what was done to the directory, for the run's log

    @property
    def home(self) -> Path:
        return self.owner.path


def _claim(cfg: DictConfig, hydra_dir: Path, dir_chosen: bool) -> _Claim:
    """Own the directory the run writes to: a resumed run's own, else ``hydra_dir``, which must
    hold no run; the start of a run that saved nothing (:func:`saved_nothing`) is cleared, and
    ``trainer.resume`` of one starts it again from its recorded config."""
    resume = Path(cfg.trainer.resume).expanduser() if cfg.trainer.resume else None
    if resume is not None and resume.is_dir() and saved_nothing(resume):
        _check_same_dir(resume, hydra_dir, dir_chosen)
        return _restart(RunDir(resume, "trainer.resume"))
    resume_path = ckpt.resolve_resume(str(resume)) if resume is not None else None
    home = resume_path.parent.parent if resume_path is not None else hydra_dir
    if resume_path is not None and resume_path.parent.name == "checkpoints" and holds_run(home):
        _check_same_dir(home, hydra_dir, dir_chosen)
        return _Claim(RunDir(home, "trainer.resume"), resume_path, continues=True)
    owner = RunDir(hydra_dir, "hydra.run.dir")  # a new run (perhaps from a loose checkpoint)
    note = None
    if saved_nothing(hydra_dir):
        owner.clear_start()
        note = "cleared the start of a run that stopped before its first checkpoint"
    elif holds_run(hydra_dir):
        owner.release()
        raise ConfigError(
            "hydra.run.dir",
            f"{hydra_dir} already holds a run: continue it with trainer.resume={hydra_dir}, or "
            "choose another directory",
        )
    return _Claim(owner, resume_path, note=note)


def _check_same_dir(home: Path, hydra_dir: Path, dir_chosen: bool) -> None:
    if home.resolve() != hydra_dir.resolve() and dir_chosen:
        raise ConfigError(
            "hydra.run.dir",
            f"trainer.resume continues the run in {home}, not in {hydra_dir}: leave "
            f"hydra.run.dir out or set it to {home}",
        )


def _restart(owner: RunDir) -> _Claim:
    """Start a run that stopped before its first checkpoint again, from the config it recorded."""
    try:
        recorded = to_dict(OmegaConf.load(owner.path / RECORDED_CONFIG))
        if not isinstance(recorded, dict):
            raise ValueError("not a mapping of settings")
    except (OSError, ValueError, yaml.YAMLError, OmegaConfBaseException) as err:
        owner.release()
        raise ConfigError(
            "trainer.resume",
            f"{owner.path} holds no checkpoint (its run stopped before saving one) and its "
            f"{RECORDED_CONFIG} cannot be read ({str(err).splitlines()[0]}); start a new run there",
        ) from None
    owner.clear_start(keep_config=True)
    note = "no checkpoint was saved; starting the run again from its recorded config"
    return _Claim(owner, continues=True, recorded=recorded, note=note)


def _resumed(
    recorded: dict[str, Any],
    cfg: DictConfig,
    given: Collection[str] | None,
    saved: dict[str, Any] | None,
) -> DictConfig:
    """The run's recorded config with the allowed changes ``given`` makes; checked and logged."""
    cfg, changes = ckpt.resumed_config(recorded, cfg, given)
    validate(cfg)
    if saved is not None:
        log.info("resuming at step %d", saved["progress"]["step"])
    changed = [
        f"{k}={new!r} (was {old!r})" for k, (old, new) in changes.items() if k != "trainer.resume"
    ]
    if changed:
        log.info("changed on resume: %s", ", ".join(changed))
    return cfg


def _train(
    cfg: DictConfig, out_dir: Path, env: Dist, saved: dict[str, Any] | None
) -> dict[str, Any]:
    if saved is not None and saved["world_size"] != env.world_size:
        raise ConfigError(
            "trainer.resume", f"saved by {saved['world_size']} processes, not {env.world_size}"
        )
    r = Trainer(cfg, out_dir, env, saved)
    with logging_redirect_tqdm() if not r.quiet else nullcontext():  # log lines between bars
        _train_phases(cfg, r)
    return r.finish()


def _train_phases(cfg: DictConfig, r: Trainer) -> None:
    for p in range(r.progress.phase, len(r.phases)):
        phase = r.phases[p]
        if r.progress.epoch == r.progress.batch == 0:
            r.start_phase(phase)
        for epoch in range(r.progress.epoch, phase.epochs):
            r.train_epoch(p, phase, epoch)
            r.progress.epoch, r.progress.batch = epoch + 1, 0
            every = cfg.trainer.eval_every
            if every and (epoch + 1) % every == 0 and epoch + 1 < phase.epochs:
                r.evaluate()  # before the save, so a kill during it redoes it on resume
            r.save()
        if r.ste is not None:
            r.ste.finalize()  # snap the shadows: r.sched now holds every weight, exact
            r.ste = None
        r.history[phase.name] = {
            "portion": r.sched.quantized_fraction(),
            "pruned": r.sched.pruned_fraction(),
            **r.evaluate(),
        }
        r.timings[phase.name] = r.phase_seconds()
        r.progress = Progress(phase=p + 1, step=r.progress.step)
        r.clock = time.perf_counter()
        check_identical(r.model, r.sched)
        r.save(phase.name)


class Trainer:
    """The state a checkpoint holds and the steps of :func:`run` that change it."""

    def __init__(
        self, cfg: DictConfig, out_dir: Path, env: Dist, saved: dict[str, Any] | None
    ) -> None:
        self.cfg, self.out, self.env = cfg, out_dir, env
        self.method = method_name(cfg)
        self.ste: STEQuantizer | None = None  # active during the ``ste`` phase only
        _seed_everything(cfg.trainer.seed)
        data = to_dict(cfg.data)
        train_set, val_set = build_datasets(data)
        self.model_info = {k: v for k, v in to_dict(cfg.model).items() if k != "checkpoint"}
        self.data_info = data
        self.model = build_model(self.model_info).to(env.device)
        if cfg.quant.act_bits is not None:  # before any training is spent on it
            try:
                check_expressible(self.model)
            except IntegerModelError as err:
                raise ConfigError(
                    "quant.act_bits", f"no integer model of {cfg.model.name}: {err}"
                ) from None
        if cfg.model.checkpoint and saved is None:
            ckpt.load_float_weights(self.model, cfg.model.checkpoint)
        self.sched = _build_scheduler(self.model, cfg)
        self.prune_targets = _prune_targets(self.sched, cfg) if prunes(cfg) else {}
        self.net: nn.Module = self.model
        if env.world_size > 1:
            ids = [env.device] if env.device.type == "cuda" else None
            self.net = DistributedDataParallel(self.model, device_ids=ids)
        self.train_loader = build_train_loader(
            data, train_set, cfg.trainer.seed, env.rank, env.world_size
        )
        self.val_loader = build_eval_loader(data, val_set, env.rank, env.world_size)
        self.steps_per_epoch = batches_per_epoch(self.train_loader)
        self.phases = plan_phases(cfg)
        self.amp = cfg.trainer.amp and env.device.type == "cuda"
        self.scaler = torch.amp.GradScaler(env.device.type, enabled=self.amp)
        self.optimizer: torch.optim.Optimizer | None = None
        self.params = ""
        self.lr_sched: torch.optim.lr_scheduler.LambdaLR | None = None
        self.progress = Progress()
        self.clock = time.perf_counter()  # when this process started on the current phase
        self.history: dict[str, dict[str, float]] = {}
        self.timings: dict[str, float] = {}
        self.evals = 0
        self.quiet = not (env.main and cfg.trainer.progress and sys.stderr.isatty())
        if saved is not None:
            self._restore(saved)
        total = sum(p.epochs for p in self.phases) * self.steps_per_epoch
        self.run_bar = tqdm(
            total=total, initial=self.progress.step, desc="run", unit="step", disable=self.quiet
        )
        self.started = (time.perf_counter(), self.progress.step)  # for this process's ETA
        self.tb = Monitor(
            out_dir / "tb",
            env.main,
            resume_step=self.progress.step if saved is not None else None,
            pending=saved.get("tb_pending") if saved is not None else None,
        )

    def start_phase(self, phase: Phase) -> None:
        """Partition + snap for a new stage (or start STE); fresh LR schedule (and optimizer)."""
        if phase.name == "ste":
            self.ste = STEQuantizer(self.model, self.sched)
            log.info("STE: %d-bit forward, float shadow weights", self.sched.bits)
        elif phase.stage > self.sched.stage:
            self.sched.step()
            pruned = self.sched.pruned_fraction()
            log.info(
                "stage %d: %.1f %% of the weights quantized%s",
                phase.stage, 100 * self.sched.quantized_fraction(),
                f" ({100 * pruned:.1f} % pruned to zero)" if pruned else "",
            )  # fmt: skip
            ckpt.kill_point("stage", phase.stage)
            self.tb.inq_state(self.progress.step, self.sched, histograms=True)
        elif phase.prune:
            fraction = self.sched.prune(self.prune_round(phase.prune))
            log.info(
                "pruning round %d/%d: %.1f %% of the weights pruned",
                phase.prune, self.cfg.prune.steps, 100 * fraction,
            )  # fmt: skip
            ckpt.kill_point("prune", phase.prune)
            self.tb.inq_state(self.progress.step, self.sched, histograms=True)
        if self.optimizer is None or self.cfg.inq.reset_optimizer or phase.params != self.params:
            self._new_optimizer(phase.params, phase.lr)
        for group in self.optimizer.param_groups:
            group["lr"] = group["initial_lr"] = phase.lr
        self.lr_sched = build_lr_schedule(
            self.cfg.lr, self.optimizer, phase.epochs, self.steps_per_epoch
        )

    def prune_round(self, r: int) -> dict[str, float]:
        """Each layer's sparsity after pruning round ``r`` (1-based) of ``prune.steps``."""
        p = self.cfg.prune
        return {
            name: sparsity_schedule(target, p.steps, p.schedule.name)[r - 1]
            for name, target in self.prune_targets.items()
        }

    def train_epoch(self, p: int, phase: Phase, epoch: int) -> None:
        """One epoch (or its rest, after a resume); logs and checkpoints at their intervals."""
        t = self.cfg.trainer
        bs = self.train_loader.batch_size
        self.train_loader.sampler.set_epoch(p * 100_000 + epoch, start=self.progress.batch * bs)
        window = torch.zeros(3, dtype=torch.float64, device=self.env.device)
        totals = torch.zeros_like(window)  # the epoch's (this process's part of it)
        lr = self.lr_sched.get_last_lr()[0]
        bar = tqdm(
            self.train_loader,
            desc=f"{phase.name} epoch {epoch + 1}/{phase.epochs}",
            total=self.steps_per_epoch,
            initial=self.progress.batch,
            disable=self.quiet,
            leave=False,
            position=1,
        )
        for x, y in bar:
            x, y = (
                x.to(self.env.device, non_blocking=True),
                y.to(self.env.device, non_blocking=True),
            )
            with torch.autocast(self.env.device.type, torch.float16, enabled=self.amp):
                logits = self.net(x)
                loss = F.cross_entropy(logits, y)
            self.optimizer.zero_grad(set_to_none=True)
            self.scaler.scale(loss).backward()
            if t.grad_clip:
                self.scaler.unscale_(self.optimizer)
                nn.utils.clip_grad_norm_(self.model.parameters(), t.grad_clip)
            self.scaler.step(self.optimizer)
            self.scaler.update()
            lr = self.lr_sched.get_last_lr()[0]
            self.lr_sched.step()
            self.progress.batch += 1
            self.progress.step += 1
            window += torch.stack(
                [
                    loss.detach().double() * len(y),
                    (logits.argmax(1) == y).sum(),
                    window.new_tensor(len(y)),
                ]
            )
            step = self.progress.step
            due = bool(t.checkpoint_every) and step % t.checkpoint_every == 0
            if due or step % t.log_every == 0 or self.progress.batch == self.steps_per_epoch:
                loss_sum, correct, count = window.tolist()
                diverged = all_sum(window.new_tensor(0.0 if math.isfinite(loss_sum) else 1.0))
                if bool(diverged):  # on every rank, before any save: no checkpoint holds NaN
                    raise RunStopped(
                        f"training diverged: the loss is {loss_sum / count} at step {step} "
                        f"({phase.name}, epoch {epoch + 1}); lower optim.lr or inq.lr, or set "
                        "trainer.grad_clip, and start again"
                    )
                self.tb.scalars(
                    step,
                    {"train/loss": loss_sum / count, "train/acc": correct / count, "train/lr": lr},
                )
                totals += window
                window.zero_()
            self.run_bar.update()
            if due:
                self.save()
            ckpt.kill_point("step", step)
        bar.close()
        broadcast_buffers(self.model)
        loss_sum, correct, count = totals.tolist()
        if not count:  # resumed after the epoch's last batch: nothing trained here
            return
        seconds = time.perf_counter() - self.started[0]
        done = self.progress.step - self.started[1]
        left = self.run_bar.total - self.progress.step
        log.info(
            "%s epoch %d/%d: loss %.4f, acc %.2f %%, lr %.3g, elapsed %s, ETA %s",
            phase.name,
            epoch + 1,
            phase.epochs,
            loss_sum / max(count, 1),
            100 * correct / max(count, 1),
            lr,
            _clock(seconds),
            _clock(seconds / max(done, 1) * left),
        )

    def evaluate(self) -> dict[str, float]:
        """Validation metrics, logged as ``val/*`` with the INQ state at the current step."""
        self.evals += 1
        count = self.evals
        with torch.autocast(self.env.device.type, torch.float16, enabled=self.amp):
            metrics = evaluate(
                self.model,
                self.val_loader,
                self.env.device,
                top5=self.cfg.data.num_classes > 10,
                on_batch=lambda: ckpt.kill_point("eval", count),
            )
        self.tb.scalars(self.progress.step, {f"val/{k}": v for k, v in metrics.items()})
        self.tb.inq_state(self.progress.step, self.sched, histograms=False)
        log.info(
            "step %d, stage %d: val acc %.2f %%, loss %.4f",
            self.progress.step,
            self.sched.stage,
            100 * metrics["acc"],
            metrics["loss"],
        )
        return metrics

    def save(self, *names: str) -> None:
        """Write ``checkpoints/latest.pt`` (and ``<name>.pt`` for each name); rank 0 only.

        The TensorBoard events before this step are written first; the checkpoint carries the
        ones of this step (see :mod:`inq.train.monitor`). Only the newest
        ``trainer.keep_checkpoints`` stage checkpoints stay.
        """
        if not self.env.main:
            return
        state = {
            "tb_pending": self.tb.commit(self.progress.step),
            "format": ckpt.FORMAT,
            "model": self.model.state_dict(),
            "inq": self.sched.state_dict(),
            "optimizer": self.optimizer.state_dict() if self.optimizer else None,
            "params": self.params,
            "lr_schedule": self.lr_sched.state_dict() if self.lr_sched else None,
            "scaler": self.scaler.state_dict(),
            "progress": {**asdict(self.progress), "seconds": self.phase_seconds()},
            "history": self.history,
            "timings": self.timings,
            "rng": ckpt.get_rng_state(),
            "world_size": self.env.world_size,
            "config": json.dumps(to_dict(self.cfg)),
        }
        folder = self.out / "checkpoints"
        ckpt.save_checkpoint(folder / "latest.pt", state)
        for name in names:
            ckpt.link_checkpoint(folder / "latest.pt", folder / f"{name}.pt")
        keep = self.cfg.trainer.keep_checkpoints
        if names and keep is not None:
            done = [p.name for p in self.phases[: self.progress.phase] if p.name != "float"]
            for name in done[: max(0, len(done) - keep)]:
                (folder / f"{name}.pt").unlink(missing_ok=True)

    def phase_seconds(self) -> float:
        """Wall-clock seconds spent in the current phase, by this process and killed ones."""
        return self.progress.seconds + time.perf_counter() - self.clock

    def finish(self) -> dict[str, Any]:
        """Export, write ``summary.json`` and print the float-vs-INQ table (rank 0)."""
        self.run_bar.close()
        stages = [p.name for p in self.phases if p.name != "float"]
        summary = {
            "method": self.method,
            "float_acc": self.history["float"]["acc"],
            "final_acc": self.history[self.phases[-1].name]["acc"],
            "bits": self.sched.bits,
            "portions": list(self.sched.portions),
            "strategy": self.sched.strategy,
            "n1_rule": self.sched.n1_rule,
            "granularity": self.sched.granularity,
            "zero_fraction": _zero_fraction(self.sched),
            "pruned_fraction": self.sched.pruned_fraction(),
            "seed": self.cfg.trainer.seed,
            "retrain_epochs": sum(p.epochs for p in self.phases if p.stage > 0),
            "stages": {name: self.history[name] for name in stages},
            "float": self.history["float"],
            "timings_s": self.timings,
            "world_size": self.env.world_size,
        }
        if self.prune_targets:
            summary["prune"] = {**to_dict(self.cfg.prune), "targets": self.prune_targets}
        if self.env.main:
            summary["files"], summary["packed"] = export_artifacts(
                self.out, self.model, self.sched, self.model_info, self.data_info
            )
        try:
            if self.cfg.quant.act_bits is not None:
                summary["integer"] = self.integer_phase()
        finally:
            self.tb.close()  # after the integer phase's events
        if self.env.main:
            if "integer" in summary:
                summary["files"]["integer"] = str(self.out / INTEGER_NAME)
            with atomic_path(self.out / "summary.json") as tmp:
                tmp.write_text(json.dumps(summary, indent=2) + "\n")
            log.info("results in %s\n%s", self.out, _table(summary))
        return summary

    def integer_phase(self) -> dict[str, Any]:
        """Rank 0 calibrates (and fine-tunes) the activations and writes
        ``model.int.safetensors``; then every rank loads that file and evaluates its shard, so
        the accuracy is the file's. Deterministic on the CPU, so a run killed here redoes it to
        the same file."""
        q = self.cfg.quant
        settings: QuantSettings = OmegaConf.to_object(q)  # type: ignore[assignment]
        step = self.progress.step

        def on_epoch(epoch: int, values: dict[str, float]) -> None:
            self.tb.scalars(step + epoch, values)
            ckpt.kill_point("quant", epoch + 1)

        problem, report = None, {}
        if self.env.main:
            try:
                packed = load_packed(self.out / PACKED_NAME)
                int_model, report = quantize(
                    packed, self.data_info, settings, self.env.device, on_epoch,
                    seed=self.cfg.trainer.seed,
                )  # fmt: skip
                save_integer(self.out / INTEGER_NAME, int_model)
            except ValueError as err:  # IntegerModelError among them: the model, not a bug
                problem = f"no integer model: {err}"
        problem, report = share((problem, report))
        if problem is not None:
            raise ConfigError("quant.act_bits", problem)
        int_model = load_integer(self.out / INTEGER_NAME).to(self.env.device)
        metrics = evaluate(RealOutput(int_model), self.val_loader, self.env.device, top5=False)
        last = step + q.epochs
        self.tb.scalars(last, {"val/int_acc": metrics["acc"], "val/int_loss": metrics["loss"]})
        log.info(
            "integer model (%d-bit activations, %s calibration%s): val acc %.2f %%, in %s",
            q.act_bits, q.calibration,
            f", {q.epochs} fine-tuning epochs" if q.epochs else "",
            100 * metrics["acc"], self.out / INTEGER_NAME,
        )  # fmt: skip
        return {
            **metrics,
            "act_bits": q.act_bits,
            **{k: v for k, v in report.items() if k != "scales"},
        }

    def _new_optimizer(self, params: str, lr: float) -> None:
        if self.optimizer is not None:
            self.sched.detach(self.optimizer)
        self.optimizer = build_optimizer(self.cfg.optim, self.model, params, lr)
        self.params = params
        if params == "all":  # a bias/norm-only optimizer never touches a quantized weight
            self.sched.attach(self.optimizer)

    def _restore(self, saved: dict[str, Any]) -> None:
        self.progress = Progress(**saved["progress"])
        mid_phase = self.progress.epoch or self.progress.batch
        if mid_phase and self.phases[self.progress.phase].name == "ste":
            self.ste = STEQuantizer(self.model, self.sched)  # the state holds the shadows
        self.model.load_state_dict(saved["model"])
        self.sched.load_state_dict(saved["inq"])
        self.history, self.timings = saved["history"], saved["timings"]
        if saved["optimizer"] is not None:
            self._new_optimizer(saved["params"], lr=1.0)  # the saved state sets the lr
            if mid_phase:  # schedule before optimizer state: LambdaLR's constructor sets the lr
                phase = self.phases[self.progress.phase]
                self.lr_sched = build_lr_schedule(
                    self.cfg.lr, self.optimizer, phase.epochs, self.steps_per_epoch
                )
            self.optimizer.load_state_dict(saved["optimizer"])
            if mid_phase:
                self.lr_sched.load_state_dict(saved["lr_schedule"])
        self.scaler.load_state_dict(saved["scaler"])
        ckpt.set_rng_state(saved["rng"])


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
    masked = out_dir / "model_masked.safetensors"
    save_masked(masked, model, sched, model_info=model_info, data_info=data_info)
    packed = out_dir / PACKED_NAME
    stats = export_packed(masked, packed)
    return {"masked": str(masked), "packed": str(packed)}, stats.as_dict()


def _build_scheduler(model: nn.Module, cfg: DictConfig) -> INQScheduler:
    try:
        portions = check_portions(cfg.inq.portions)  # the baselines take their epochs from it
        return INQScheduler(
            model,
            bits=cfg.inq.bits,
            portions=portions if method_name(cfg) == "inq" else (1.0,),
            strategy=cfg.inq.strategy.name,
            seed=cfg.trainer.seed,
            include=None if cfg.inq.include is None else list(cfg.inq.include),
            exclude=None if cfg.inq.exclude is None else list(cfg.inq.exclude),
            n1_rule=cfg.inq.n1_rule.name,
            granularity=cfg.inq.granularity.name,
        )
    except ValueError as err:
        keys = ("portions", "include", "exclude", "strategy")
        key = next((f"inq.{k}" for k in keys if k in str(err)), "inq")
        raise ConfigError(key, str(err)) from None


def _prune_targets(sched: INQScheduler, cfg: DictConfig) -> dict[str, float]:
    try:
        names = [layer.name for layer in sched.layers]
        return layer_targets(names, cfg.prune.sparsity, prune_layers(cfg))
    except ValueError as err:
        raise ConfigError("prune.layers", str(err)) from None


def _clock(seconds: float) -> str:
    """``m:ss``, or ``h:mm:ss`` from an hour on."""
    minutes, secs = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


_METHOD_LABELS = {"inq": "INQ", "oneshot": "one-shot", "ste": "STE"}


def _zero_fraction(sched: INQScheduler) -> float:
    """Share of the quantized weights whose level is zero."""
    zeros = sum(int((layer.codes == 0).sum()) for layer in sched.layers)
    return zeros / max(1, sum(layer.count for layer in sched.layers))


def _table(summary: dict[str, Any]) -> str:
    rows = [("float", summary["float"]), *summary["stages"].items()]
    pruned = any(m.get("pruned") for _, m in rows)  # a column only for runs that prune
    lines = [f"{'phase':<10} {'quantized':>9}{'   pruned' if pruned else ''} {'val acc':>8}"]
    for name, m in rows:
        column = f" {100 * m.get('pruned', 0.0):>7.1f}%" if pruned else ""
        lines.append(f"{name:<10} {100 * m['portion']:>8.1f}%{column} {100 * m['acc']:>7.2f}%")
    delta = 100 * (summary["final_acc"] - summary["float_acc"])
    if "integer" in summary:
        act, acc = f"{summary['integer']['act_bits']}-bit act", summary["integer"]["acc"]
        lines.append(f"{'integer':<10} {act:>9} {100 * acc:>7.2f}%")
    lines.append(
        f"float {100 * summary['float_acc']:.2f}% -> {summary['bits']}-bit "
        f"{_METHOD_LABELS[summary['method']]} "
        f"{100 * summary['final_acc']:.2f}% ({delta:+.2f} points)"
    )
    return "\n".join(lines)


PACKED_NAME, INTEGER_NAME = "model.inq.safetensors", "model.int.safetensors"
RECORDED_CONFIG = ".hydra/config.yaml"  # the config a run started with (see _hydra_app)
HYDRA_DEFAULT_RUN_DIR = "outputs/${now:%Y-%m-%d}/${now:%H-%M-%S}"


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
        given = [o.key_or_group for o in OverridesParser.create().parse_overrides(overrides)]
        return run(cfg, Path(hydra_cfg.runtime.output_dir), chosen, files, given)["final_acc"]
    except ConfigError as err:
        sys.exit(f"inq-train: error: {err}")
    except RunStopped as stop:
        print(f"inq-train: {stop}", file=sys.stderr)
        sys.exit(stop.exit_code)


def main() -> None:
    """Console entry point of ``inq-train`` (all arguments are Hydra overrides)."""
    register()
    _hydra_app()


if __name__ == "__main__":  # python -m inq.train.app: where the console script is not installed
    main()
