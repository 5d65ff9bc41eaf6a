"""The :class:`Trainer`: the state a checkpoint holds and the steps that change it.

:mod:`inq.train.app` drives it through the run's phases (:mod:`inq.train.phases`), built by
:mod:`inq.train.build`. The weight phases train the model; the integer phase (``quant.act_bits``)
trains the fake-quantized form of the packed model (its BatchNorm affine parameters and log2
activation scales, :func:`inq.quant.pipeline.trainable`) with the same loop, so it has AMP, DDP,
distillation, TensorBoard, progress bars and a resume from its middle like every phase. With
``inq.distill.weight`` > 0, every phase after ``float`` distills from the float model (its weights
at the end of the ``float`` phase, which ``checkpoints/float.pt`` holds), frozen
(:mod:`inq.distill`).
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.optim.lr_scheduler import LambdaLR

from inq.baselines import STEQuantizer
from inq.data import ResumableSampler, batches_per_epoch, data_record
from inq.distill import frozen_teacher
from inq.evaluation import evaluate
from inq.fileio import stops_held
from inq.fit import Distill, fit_step
from inq.prune import sparsity_schedule
from inq.train import checkpoint as ckpt
from inq.train.build import (
    build_loaders,
    build_lr_schedule,
    build_model,
    build_optimizer,
    build_scheduler,
    check_amp,
    compile_errors,
    compiled,
    compiled_graphs,
    prune_targets,
    seed_everything,
)
from inq.train.config import Config, to_dict
from inq.train.distributed import Dist, all_sum, broadcast_buffers, check_identical, wrap_ddp
from inq.train.monitor import Monitor
from inq.train.phases import Phase, integer_phase, plan_phases
from inq.train.progress import Bars, Progress, StepTotals
from inq.train.rundir import TB_DIR, RunStopped, diverged_hint

__all__ = ["Trainer"]

log = logging.getLogger("inq.train")


class Trainer:
    """The state a checkpoint holds and the steps of a run that change it.

    Built from the config (model, INQ scheduler, data, phase plan), or restored from ``saved``
    (a checkpoint of the run, :func:`inq.train.checkpoint.training_state`). :mod:`inq.train.app`
    drives it phase by phase; every method keeps :attr:`progress` and the checkpoints in step.

    Raises:
        ConfigError: on a config that does not fit the model or data, or a checkpoint saved by
            another number of processes.
    """

    def __init__(self, cfg: Config, out_dir: Path, env: Dist, saved: dict[str, Any] | None) -> None:
        if saved is not None:
            ckpt.check_world_size(saved, env.world_size, out_dir)
        check_amp(cfg, env.device)
        self.cfg, self.out, self.env = cfg, out_dir, env
        seed_everything(cfg.trainer.seed)
        self.data = to_dict(cfg.data)
        self._train_loader, self.val_loader, val = build_loaders(self.data, cfg.trainer.seed, env)
        self.model_info = {k: v for k, v in to_dict(cfg.model).items() if k != "checkpoint"}
        self.data_info = data_record(self.data)  # what the run's model files record
        self.model = build_model(cfg, self.model_info, env.device, fresh=saved is None)
        self.sched = build_scheduler(self.model, cfg, saved, examples=val)
        self.prune_targets = prune_targets(self.sched, cfg.prune) if cfg.prune.active else {}
        self._steps_per_epoch = batches_per_epoch(self._train_loader)
        self.phases = plan_phases(cfg)  # the weight phases
        self.integer = integer_phase(cfg)  # after the exports; None without quant.act_bits
        self._amp = cfg.trainer.amp_dtype  # None: no autocast; float16 scales the loss
        self._scaler = torch.amp.GradScaler(env.device.type, enabled=self._amp == torch.float16)
        self._nhwc = cfg.trainer.channels_last
        self._reset_state()
        if saved is not None:
            self._restore(saved)
        self._monitor(saved is not None, saved.get("tb_pending") if saved is not None else None)

    def _reset_state(self) -> None:
        """What the phases change, as a fresh run starts it."""
        self._ste: STEQuantizer | None = None  # active during the ``ste`` phase only
        # the frozen float model, from the end of the float phase on when distilling
        self.teacher: nn.Module | None = None
        self._saved: dict[str, Any] | None = None  # a checkpoint taken inside the integer phase
        self._trained: nn.Module = self.model  # what the phase trains
        self._net = wrap_ddp(self.env, compiled(self.cfg, self.model))
        self._optimizer: torch.optim.Optimizer | None = None
        self._params = ""
        self._lr_sched: LambdaLR | None = None
        self.progress = Progress()
        self._clock = time.perf_counter()  # when this process started on the current phase
        self.history: dict[str, dict[str, Any]] = {}
        self.timings: dict[str, float] = {}
        self._evals = 0

    def _monitor(self, resumed: bool, pending: list[Any] | None) -> None:
        """The progress bars and the TensorBoard writer, from the step the run is at."""
        epochs = sum(p.epochs for p in self.phases) + (self.integer.epochs if self.integer else 0)
        step, main = self.progress.step, self.env.main
        self.bars = Bars(epochs * self._steps_per_epoch, step, main, self.cfg.trainer.progress)
        self.tb = Monitor(self.out / TB_DIR, main, step if resumed else None, pending)

    def phases_left(self) -> list[Phase]:
        """The weight phases still to run, the current one first."""
        return self.phases[self.progress.phase :]

    def at_phase_start(self) -> bool:
        """True unless the current phase was resumed in its middle."""
        return self.progress.epoch == self.progress.batch == 0

    def start_ste(self) -> None:
        """Start the STE baseline: float shadow weights, power-of-two forward passes."""
        self._ste = STEQuantizer(self.model, self.sched)
        log.info("STE: %d-bit forward, float shadow weights", self.sched.bits)

    def quantize(self, stage: int) -> None:
        """INQ stage ``stage`` (the next one): partition each layer, snap and freeze."""
        self.sched.step()
        pruned = self.sched.pruned_fraction()
        log.info(
            "stage %d: %.1f %% of the weights quantized%s",
            stage, 100 * self.sched.quantized_fraction(),
            f" ({100 * pruned:.1f} % pruned to zero)" if pruned else "",
        )  # fmt: skip
        ckpt.kill_point("stage", stage)
        self.tb.inq_state(self.progress.step, self.sched, histograms=True)

    def prune(self, r: int) -> None:
        """Pruning round ``r`` (1-based) of ``prune.steps``: each layer to its sparsity then."""
        p = self.cfg.prune
        sparsity = {
            name: sparsity_schedule(target, p.steps, p.schedule.name)[r - 1]
            for name, target in self.prune_targets.items()
        }
        fraction = self.sched.prune(sparsity)
        log.info("pruning round %d/%d: %.1f %% of the weights pruned", r, p.steps, 100 * fraction)
        ckpt.kill_point("prune", r)
        self.tb.inq_state(self.progress.step, self.sched, histograms=True)

    def start_phase_of(self, phase: Phase, module: nn.Module) -> bool:
        """Train ``module`` (e.g. the integer phase's fake-quantized model) from now on, in
        ``phase``: a fresh schedule, or the saved state of a run killed in its middle (then
        False).
        """
        self._trained, self._net = module, wrap_ddp(self.env, compiled(self.cfg, module))
        saved, self._saved = self._saved, None
        if saved is None:
            self.restart_schedule(phase)
            return True
        module.load_state_dict(saved["quant"])
        self._restore_optimizer(saved, phase)
        return False

    def restart_schedule(self, phase: Phase) -> None:
        """A fresh LR schedule at ``phase.lr``, on a new optimizer when the trained parameters
        change or ``inq.reset_optimizer`` asks for one."""
        if self._optimizer is None or self.cfg.inq.reset_optimizer or phase.params != self._params:
            self._new_optimizer(phase.params, phase.lr)
        assert self._optimizer is not None
        for group in self._optimizer.param_groups:
            group["lr"] = group["initial_lr"] = phase.lr
        self._lr_sched = build_lr_schedule(
            self.cfg.lr, self._optimizer, phase.epochs, self._steps_per_epoch
        )

    def epochs_left(self, phase: Phase) -> range:
        """The epochs of ``phase`` still to train (the current one included)."""
        return range(self.progress.epoch, phase.epochs)

    def train_epoch(self, phase: Phase, epoch: int) -> dict[str, float]:
        """Epoch ``epoch`` of ``phase`` (or its rest, after a resume); logs and checkpoints at
        their intervals (``trainer.log_every``, ``trainer.checkpoint_every``). Returns the
        epoch's means over every rank (:meth:`StepTotals.means`).

        Raises:
            RunStopped: when the loss or a weight is no longer finite (on every rank, before any
                save).
        """
        t, device = self.cfg.trainer, self.env.device
        sampler, per_batch = self._train_loader.sampler, self._train_loader.batch_size
        assert isinstance(sampler, ResumableSampler) and per_batch is not None
        sampler.set_epoch(
            self.progress.phase * 100_000 + epoch, start=self.progress.batch * per_batch
        )
        window, epoch_totals = StepTotals(device), StepTotals(device, self.progress.totals)
        lr = float(self._lr_sched.get_last_lr()[0]) if self._lr_sched else phase.lr
        desc = f"{phase.name} epoch {epoch + 1}/{phase.epochs}"
        batches = self.bars.epoch(
            self._train_loader, desc, self._steps_per_epoch, self.progress.batch
        )
        for x, y in batches:
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            if self._nhwc and x.dim() == 4:
                x = x.contiguous(memory_format=torch.channels_last)
            loss, logits, lr, kd = self.train_step(x, y)
            window.add(loss, logits, y, kd)
            step = self.progress.step
            due = bool(t.checkpoint_every) and step % t.checkpoint_every == 0
            if due or step % t.log_every == 0 or self.progress.batch == self._steps_per_epoch:
                self._log_window(window, lr)
                window.move_to(epoch_totals)
                self.progress.totals = epoch_totals.sums.tolist()
            self.bars.step_done(compiled_graphs() if t.compile else 0)
            if due:
                self.save()
            ckpt.kill_point("step", step)
        broadcast_buffers(self._trained)
        all_sum(epoch_totals.sums)
        self.progress.epoch, self.progress.batch, self.progress.totals = epoch + 1, 0, [0.0] * 4
        self.bars.log_epoch(desc, epoch_totals, lr, self.progress.step)
        return epoch_totals.means()

    def train_step(
        self, x: torch.Tensor, y: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, float, torch.Tensor | None]:
        """One optimizer step on the batch ``(x, y)``; returns the loss, the logits, the lr it
        stepped with and, when distilling, the distillation term (:func:`inq.distill.kd_loss`;
        else None).

        The step is :func:`inq.fit.fit_step`: the INQ scheduler's step hook
        (:meth:`~inq.scheduler.INQScheduler.attach`) writes the frozen weights back to their
        powers of two inside ``scaler.step``; with a teacher, the loss is
        :func:`inq.distill.distill_loss`.
        """
        assert self._optimizer is not None and self._lr_sched is not None
        d, clip = self.cfg.inq.distill, self.cfg.trainer.grad_clip
        with compile_errors(self.cfg):  # torch.compile compiles at a module's first step
            loss, logits, kd = fit_step(
                self._net,
                self._optimizer,
                x,
                y,
                distill=Distill(self.teacher, d.weight, d.temperature) if self.teacher else None,
                scaler=self._scaler,
                amp=self._amp or False,
                grad_clip=(self._trained.parameters(), clip) if clip else None,
            )
        lr = float(self._lr_sched.get_last_lr()[0])
        self._lr_sched.step()
        self.progress.batch += 1
        self.progress.step += 1
        return loss, logits, lr, kd

    def evaluate(self) -> dict[str, float]:
        """Validation metrics of what the phase trains, logged as ``val/*`` with the INQ state
        at the current step."""
        self._evals += 1
        count = self._evals
        dtype = self._amp or torch.float16
        with torch.autocast(self.env.device.type, dtype, enabled=self._amp is not None):
            metrics = evaluate(
                self._trained,
                self.val_loader,
                self.env.device,
                top5=self.cfg.data.num_classes > 10,
                on_batch=lambda: ckpt.kill_point("eval", count),
            )
        self.tb.scalars(self.progress.step, {f"val/{k}": v for k, v in metrics.items()})
        self.tb.inq_state(self.progress.step, self.sched, histograms=False)
        log.info(
            "step %d, stage %d: val acc %.2f %%, loss %.4f",
            self.progress.step, self.sched.stage, 100 * metrics["acc"], metrics["loss"],
        )  # fmt: skip
        return metrics

    def end_phase(self, phase: Phase, metrics: dict[str, float] | None = None) -> None:
        """Close ``phase``: snap the STE shadows, evaluate (unless given its ``metrics``) and
        record the phase, check the ranks agree and save its checkpoint (``<phase>.pt``; the
        integer phase's is ``latest.pt`` only)."""
        if self._ste is not None:
            self._ste.finalize()  # snap the shadows: self.sched now holds every weight, exact
            self._ste = None
        if metrics is None:
            metrics = {
                "portion": self.sched.quantized_fraction(),
                "pruned": self.sched.pruned_fraction(),
                **self.evaluate(),
            }
        self.history.setdefault(phase.name, {}).update(metrics)
        self.timings[phase.name] = self.phase_seconds()
        if self.cfg.trainer.compile:  # a stage change recompiles nothing: no new graph here
            log.info("torch.compile: %d graphs compiled by this process", compiled_graphs())
        self.progress = Progress(phase=self.progress.phase + 1, step=self.progress.step)
        self._clock = time.perf_counter()
        check_identical(self.model, self.sched)
        self.save(*(() if phase is self.integer else (phase.name,)))
        if phase.name == "float" and self.cfg.inq.distill.weight > 0:
            self.teacher = frozen_teacher(self.model)  # = checkpoints/float.pt, which stays

    def save(self, *names: str) -> None:
        """Write ``checkpoints/latest.pt`` (and ``<name>.pt`` for each name); rank 0 only.

        The TensorBoard events before this step are written first; the checkpoint carries the
        ones of this step (see :mod:`inq.train.monitor`). Only the newest
        ``trainer.keep_checkpoints`` stage checkpoints stay. Ctrl-C or SIGTERM waits for the
        checkpoint (inside OmegaConf's copy of the config, it came out as another error).
        """
        self._stop_if_diverged(ckpt.first_non_finite(self._trained))
        if not self.env.main:
            return
        with stops_held():
            state = ckpt.training_state(
                tb_pending=self.tb.commit(self.progress.step), model=self.model,
                sched=self.sched, optimizer=self._optimizer, params=self._params,
                lr_schedule=self._lr_sched, scaler=self._scaler,
                progress={**asdict(self.progress), "seconds": self.phase_seconds()},
                history=self.history, timings=self.timings, world_size=self.env.world_size,
                config=self.cfg,
                quant=self._trained.state_dict() if self._trained is not self.model else None,
            )  # fmt: skip
            keep = self.cfg.trainer.keep_checkpoints
            stale: list[str] = []
            if names and keep is not None:
                done = [p.name for p in self.phases[: self.progress.phase] if p.name != "float"]
                stale = done[: max(0, len(done) - keep)]
            ckpt.save_run_checkpoint(self.out, state, names, stale)

    def _stop_if_diverged(self, problem: str | None) -> None:
        """Stop the run, on every rank together, if any rank found a ``problem`` (a non-finite
        loss or weight): before any save, so every checkpoint holds finite values.

        Raises:
            RunStopped: saying where, and how to go on from this directory.
        """
        diverged = all_sum(torch.tensor(float(problem is not None), device=self.env.device))
        if not bool(diverged):
            return
        phases = [*self.phases, *([self.integer] if self.integer else [])]
        where = phases[min(self.progress.phase, len(phases) - 1)].name
        raise RunStopped(
            f"training diverged: {problem or 'non-finite values on another process'} at step "
            f"{self.progress.step} ({where}); {diverged_hint(self.out)}"
        )

    def phase_seconds(self) -> float:
        """Wall-clock seconds spent in the current phase, by this process and killed ones."""
        return self.progress.seconds + time.perf_counter() - self._clock

    def _log_window(self, window: StepTotals, lr: float) -> None:
        """``train/*`` scalars of the steps since the last ones; stop if the loss diverged."""
        means = window.means()
        loss = means["loss"]
        self._stop_if_diverged(None if math.isfinite(loss) else f"the loss is {loss}")
        shown = ("loss", "acc", "kd_loss") if self.teacher is not None else ("loss", "acc")
        values = {f"train/{k}": means[k] for k in shown}
        self.tb.scalars(self.progress.step, {**values, "train/lr": lr})

    def _new_optimizer(self, params: str, lr: float) -> None:
        if self._optimizer is not None:
            self.sched.detach(self._optimizer)
        self._optimizer = build_optimizer(self.cfg.optim, self._trained, params, lr)
        self._params = params
        if params == "all":  # a bias/norm-only optimizer never touches a quantized weight
            self.sched.attach(self._optimizer)

    def _restore_optimizer(self, saved: dict[str, Any], phase: Phase) -> None:
        """The saved optimizer and, resumed in the middle of ``phase``, its LR schedule."""
        self._new_optimizer(saved["params"], lr=1.0)  # the saved state sets the lr
        assert self._optimizer is not None
        if not self.at_phase_start():
            self._lr_sched = build_lr_schedule(
                self.cfg.lr, self._optimizer, phase.epochs, self._steps_per_epoch
            )
        ckpt.restore_optimizer(saved, self._optimizer, self._lr_sched)

    def _restore(self, saved: dict[str, Any]) -> None:
        self.progress = Progress(**saved["progress"])
        self.history, self.timings = saved["history"], saved["timings"]
        if self.progress.phase > 0 and self.cfg.inq.distill.weight > 0:
            resume = self.cfg.trainer.resume
            self.teacher = ckpt.saved_teacher(self.model, self.out, resume, self.env.main)
        if self.progress.phase >= len(self.phases):  # the integer phase: start_phase_of restores
            self._saved = None if self.at_phase_start() else saved
        else:
            phase = self.phases[self.progress.phase]
            if phase.name == "ste" and not self.at_phase_start():  # the state holds the shadows
                self._ste = STEQuantizer(self.model, self.sched)
            if saved["optimizer"] is not None:
                self._restore_optimizer(saved, phase)
        ckpt.restore_training_state(saved, self.model, self.sched, self._scaler)
