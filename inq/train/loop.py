"""The training loop: the phase plan, the optimizer and LR schedule factories, and the
:class:`Trainer` that runs one phase after another.

A run is a list of phases: ``float`` (pretraining; 0 epochs when ``model.checkpoint`` is given),
with pruning (``prune.sparsity`` or ``prune.layers``) ``prune1`` .. ``pruneR`` (one per round),
``stage1`` .. ``stageK`` (one per INQ portion) and, if ``inq.final_epochs`` > 0, ``bias_norm``.
The baselines (``inq.method``) replace the stages by one phase: ``oneshot`` (0 epochs) or
``ste`` (as many epochs as the INQ stages and ``bias_norm`` together).
Every phase gets a fresh LR schedule; :mod:`inq.train.app` runs them. With
``inq.distill.weight`` > 0, every phase after ``float`` distills from the float model (its
weights at the end of the ``float`` phase, which ``checkpoints/float.pt`` holds), frozen
(:mod:`inq.distill`).
"""

from __future__ import annotations

import logging
import math
import random
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from hydra.utils import instantiate
from omegaconf import DictConfig
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.optim.lr_scheduler import LambdaLR
from tqdm import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm

from inq.baselines import STEQuantizer
from inq.data import (
    batches_per_epoch,
    build_datasets,
    build_eval_loader,
    build_train_loader,
    data_record,
)
from inq.distill import blend, frozen_teacher, kd_loss
from inq.errors import ConfigError
from inq.evaluation import evaluate
from inq.models import build_model
from inq.prune import layer_targets, sparsity_schedule
from inq.quant.lower import IntegerModelError, check_expressible
from inq.scheduler import INQScheduler, check_portions
from inq.train import checkpoint as ckpt
from inq.train.config import layer_bits, prune_layers, to_dict
from inq.train.distributed import (
    Dist,
    all_sum,
    broadcast_buffers,
    check_identical,
    launch_command,
)
from inq.train.monitor import Monitor
from inq.train.rundir import TB_DIR, RunStopped, diverged_hint

__all__ = [
    "NORM_TYPES",
    "Phase",
    "Progress",
    "Trainer",
    "bias_norm_parameters",
    "build_lr_schedule",
    "build_optimizer",
    "method_name",
    "plan_phases",
    "prunes",
]

log = logging.getLogger("inq.train")

NORM_TYPES = (
    nn.modules.batchnorm._BatchNorm,
    nn.GroupNorm,
    nn.LayerNorm,
    nn.modules.instancenorm._InstanceNorm,
)


@dataclass(frozen=True)
class Phase:
    """One block of epochs: its name, INQ stage (0 = float), epochs, base lr, trained params and
    pruning round (0 = none)."""

    name: str
    stage: int
    epochs: int
    lr: float
    params: str  # "all" or "bias_norm"
    prune: int = 0


def plan_phases(cfg: DictConfig) -> list[Phase]:
    """The phases of a run, in order.

    Example:
        >>> from omegaconf import OmegaConf
        >>> cfg = OmegaConf.create({"model": {"checkpoint": None}, "optim": {"lr": 0.1},
        ...     "trainer": {"float_epochs": 3},
        ...     "inq": {"portions": [0.5, 1.0], "epochs": 2, "lr": 0.01, "final_epochs": 1}})
        >>> [(p.name, p.epochs, p.lr) for p in plan_phases(cfg)]
        [('float', 3, 0.1), ('stage1', 2, 0.01), ('stage2', 2, 0.01), ('bias_norm', 1, 0.01)]
        >>> cfg.inq.method = "ste"
        >>> [(p.name, p.stage, p.epochs) for p in plan_phases(cfg)]
        [('float', 0, 3), ('ste', 1, 5)]
        >>> cfg.prune = {"sparsity": 0.9, "layers": [], "steps": 2, "epochs": 1, "lr": None}
        >>> [(p.name, p.prune, p.epochs) for p in plan_phases(cfg)][:3]
        [('float', 0, 3), ('prune1', 1, 1), ('prune2', 2, 1)]
    """
    float_epochs = 0 if cfg.model.checkpoint else cfg.trainer.float_epochs
    lr = cfg.inq.lr if cfg.inq.lr is not None else cfg.optim.lr
    phases = [Phase("float", 0, float_epochs, cfg.optim.lr, "all")]
    if prunes(cfg):
        prune_lr = cfg.prune.lr if cfg.prune.lr is not None else lr
        phases += [
            Phase(f"prune{r}", 0, cfg.prune.epochs, prune_lr, "all", prune=r)
            for r in range(1, cfg.prune.steps + 1)
        ]
    stages = len(cfg.inq.portions)
    method = method_name(cfg)
    if method == "oneshot":
        return [*phases, Phase("oneshot", 1, 0, lr, "all")]
    if method == "ste":
        return [*phases, Phase("ste", 1, stages * cfg.inq.epochs + cfg.inq.final_epochs, lr, "all")]
    phases += [Phase(f"stage{k}", k, cfg.inq.epochs, lr, "all") for k in range(1, stages + 1)]
    if cfg.inq.final_epochs:
        phases.append(Phase("bias_norm", stages, cfg.inq.final_epochs, lr, "bias_norm"))
    return phases


def prunes(cfg: DictConfig) -> bool:
    """Whether the run prunes before INQ (``prune.sparsity`` or a ``prune.layers`` entry > 0).

    Example:
        >>> from omegaconf import OmegaConf
        >>> prunes(OmegaConf.create({"prune": {"sparsity": 0.0, "layers": ["fc*:0.9"]}}))
        True
    """
    prune = cfg.get("prune")
    return prune is not None and (prune.sparsity > 0 or any(prune_layers(cfg).values()))


def method_name(cfg: DictConfig) -> str:
    """``inq.method`` as a string (``"inq"`` when the config has none).

    Example:
        >>> from omegaconf import OmegaConf
        >>> method_name(OmegaConf.create({"inq": {"bits": 5}}))
        'inq'
    """
    method = cfg.inq.get("method", "inq")
    return str(getattr(method, "name", method))  # a Method enum or its name


def bias_norm_parameters(model: nn.Module) -> list[nn.Parameter]:
    """Biases of every layer and all parameters of normalization layers.

    Example:
        >>> net = nn.Sequential(nn.Conv2d(1, 2, 3), nn.BatchNorm2d(2), nn.Linear(2, 2, bias=False))
        >>> [tuple(p.shape) for p in bias_norm_parameters(net)]
        [(2,), (2,), (2,)]
    """
    chosen: dict[int, nn.Parameter] = {}
    for module in model.modules():
        for name, param in module.named_parameters(recurse=False):
            if isinstance(module, NORM_TYPES) or name == "bias":
                chosen.setdefault(id(param), param)
    return list(chosen.values())


def build_optimizer(
    optim_cfg: DictConfig, model: nn.Module, params: str, lr: float
) -> torch.optim.Optimizer:
    """Instantiate ``optim`` (its ``_target_``) over all parameters or biases/norms only."""
    chosen = list(model.parameters()) if params == "all" else bias_norm_parameters(model)
    return instantiate(optim_cfg, params=chosen, lr=lr)


def build_lr_schedule(
    lr_cfg: DictConfig, optimizer: torch.optim.Optimizer, epochs: int, steps_per_epoch: int
) -> LambdaLR:
    """Per-step schedule over one phase: optional linear warmup, then constant/cosine/step.

    Example:
        >>> from omegaconf import OmegaConf
        >>> opt = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=1.0)
        >>> cfg = OmegaConf.create({"name": "step", "warmup_epochs": 0, "milestones": [0.5],
        ...                         "gamma": 0.1, "min_factor": 0.0})
        >>> sched = build_lr_schedule(cfg, opt, epochs=2, steps_per_epoch=2)
        >>> lrs = []
        >>> for _ in range(4):
        ...     lrs.append(round(sched.get_last_lr()[0], 3))
        ...     opt.step()
        ...     sched.step()
        >>> lrs
        [1.0, 1.0, 0.1, 0.1]
    """
    total = max(1, epochs * steps_per_epoch)
    warmup = round(lr_cfg.warmup_epochs * steps_per_epoch)
    name = getattr(lr_cfg.name, "name", lr_cfg.name)  # a Schedule enum or its name

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        t = (step - warmup) / max(1, total - warmup)
        if name == "cosine":
            return lr_cfg.min_factor + (1 - lr_cfg.min_factor) * 0.5 * (1 + math.cos(math.pi * t))
        if name == "step":
            return lr_cfg.gamma ** sum(step / total >= m for m in lr_cfg.milestones)
        return 1.0

    return LambdaLR(optimizer, factor)


@dataclass
class Progress:
    """Where the run is: phase index, epochs done in it, batches done in the epoch, total steps."""

    phase: int = 0
    epoch: int = 0
    batch: int = 0
    step: int = 0
    seconds: float = 0.0  # spent in this phase by earlier (killed) processes


class Trainer:
    """The state a checkpoint holds and the steps of a run that change it.

    Built from the config (model, INQ scheduler, data, phase plan), or restored from ``saved``
    (a checkpoint of the run, :func:`inq.train.checkpoint.training_state`). :mod:`inq.train.app`
    drives it phase by phase; every method keeps :attr:`progress` and the checkpoints in step.

    Raises:
        ConfigError: on a config that does not fit the model or data, or a checkpoint saved by
            another number of processes.
    """

    def __init__(
        self, cfg: DictConfig, out_dir: Path, env: Dist, saved: dict[str, Any] | None
    ) -> None:
        if saved is not None and saved["world_size"] != env.world_size:
            world = saved["world_size"]
            raise ConfigError(
                "trainer.resume",
                f"saved by {world} processes, not {env.world_size}: resume it with "
                f"{launch_command(world)} trainer.resume={out_dir}",
            )
        self.cfg, self.out, self.env = cfg, out_dir, env
        self._ste: STEQuantizer | None = None  # active during the ``ste`` phase only
        # the frozen float model, from the end of the float phase on when distilling
        self.teacher: nn.Module | None = None
        _seed_everything(cfg.trainer.seed)
        data = to_dict(cfg.data)
        train_set, val_set = build_datasets(data)
        self.model_info = {k: v for k, v in to_dict(cfg.model).items() if k != "checkpoint"}
        self.data_info = data_record(data)  # what the run's model files record
        self.model = _build_model(cfg, self.model_info, env.device, fresh=saved is None)
        self.sched = _build_scheduler(self.model, cfg)
        self.prune_targets = _prune_targets(self.sched, cfg) if prunes(cfg) else {}
        self._net: nn.Module = self.model
        if env.world_size > 1:
            ids = [env.device] if env.device.type == "cuda" else None
            self._net = DistributedDataParallel(self.model, device_ids=ids)
        self._train_loader = build_train_loader(
            data, train_set, cfg.trainer.seed, env.rank, env.world_size
        )
        self.val_loader = build_eval_loader(data, val_set, env.rank, env.world_size)
        self._steps_per_epoch = batches_per_epoch(self._train_loader)
        self.phases = plan_phases(cfg)
        if cfg.trainer.amp and env.device.type != "cuda":
            raise ConfigError(
                "trainer.amp",
                f"float16 autocast runs on a CUDA GPU only; this run is on {env.device}",
            )
        self._amp = bool(cfg.trainer.amp)
        self._scaler = torch.amp.GradScaler(env.device.type, enabled=self._amp)
        self._optimizer: torch.optim.Optimizer | None = None
        self._params = ""
        self._lr_sched: LambdaLR | None = None
        self.progress = Progress()
        self._clock = time.perf_counter()  # when this process started on the current phase
        self.history: dict[str, dict[str, float]] = {}
        self.timings: dict[str, float] = {}
        self._evals = 0
        self._quiet = not (env.main and cfg.trainer.progress and sys.stderr.isatty())
        if saved is not None:
            self._restore(saved)
        total = sum(p.epochs for p in self.phases) * self._steps_per_epoch
        self._run_bar = tqdm(
            total=total, initial=self.progress.step, desc="run", unit="step", disable=self._quiet
        )
        self._started = (time.perf_counter(), self.progress.step)  # for this process's ETA
        self.tb = Monitor(
            out_dir / TB_DIR,
            env.main,
            resume_step=self.progress.step if saved is not None else None,
            pending=saved.get("tb_pending") if saved is not None else None,
        )

    @contextmanager
    def running(self) -> Iterator[None]:
        """The block that trains: in a terminal, log lines print between the progress bars,
        and the run's bar closes at its end."""
        with logging_redirect_tqdm() if not self._quiet else nullcontext():
            yield
        self._run_bar.close()

    def phases_left(self) -> list[Phase]:
        """The phases still to run, the current one first."""
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

    def restart_schedule(self, phase: Phase) -> None:
        """A fresh LR schedule at ``phase.lr``, on a new optimizer when the trained parameters
        change or ``inq.reset_optimizer`` asks for one."""
        if self._optimizer is None or self.cfg.inq.reset_optimizer or phase.params != self._params:
            self._new_optimizer(phase.params, phase.lr)
        for group in self._optimizer.param_groups:
            group["lr"] = group["initial_lr"] = phase.lr
        self._lr_sched = build_lr_schedule(
            self.cfg.lr, self._optimizer, phase.epochs, self._steps_per_epoch
        )

    def epochs_left(self, phase: Phase) -> range:
        """The epochs of ``phase`` still to train (the current one included)."""
        return range(self.progress.epoch, phase.epochs)

    def train_epoch(self, phase: Phase, epoch: int) -> None:
        """Epoch ``epoch`` of ``phase`` (or its rest, after a resume); logs and checkpoints at
        their intervals (``trainer.log_every``, ``trainer.checkpoint_every``).

        Raises:
            RunStopped: when the loss or a weight is no longer finite (on every rank, before any
                save).
        """
        t, device = self.cfg.trainer, self.env.device
        start = self.progress.batch * self._train_loader.batch_size
        self._train_loader.sampler.set_epoch(self.progress.phase * 100_000 + epoch, start=start)
        # loss sum, hits, count, distillation term sum
        window = torch.zeros(4, dtype=torch.float64, device=device)
        totals = torch.zeros_like(window)  # the epoch's (this process's part of it)
        lr = self._lr_sched.get_last_lr()[0]
        bar = tqdm(
            self._train_loader,
            desc=f"{phase.name} epoch {epoch + 1}/{phase.epochs}",
            total=self._steps_per_epoch,
            initial=self.progress.batch,
            disable=self._quiet,
            leave=False,
            position=1,
        )
        for x, y in bar:
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            loss, logits, lr, kd = self.train_step(x, y)
            window += torch.stack(
                [
                    loss.detach().double() * len(y),
                    (logits.argmax(1) == y).sum(),
                    window.new_tensor(len(y)),
                    (kd.detach().double() if kd is not None else window.new_tensor(0.0)) * len(y),
                ]
            )
            step = self.progress.step
            due = bool(t.checkpoint_every) and step % t.checkpoint_every == 0
            if due or step % t.log_every == 0 or self.progress.batch == self._steps_per_epoch:
                self._log_window(window, lr, phase, epoch)
                totals += window
                window.zero_()
            self._run_bar.update()
            if due:
                self.save()
            ckpt.kill_point("step", step)
        bar.close()
        broadcast_buffers(self.model)
        self.progress.epoch, self.progress.batch = epoch + 1, 0
        self._log_epoch(totals, lr, phase, epoch)

    def train_step(
        self, x: torch.Tensor, y: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, float, torch.Tensor | None]:
        """One optimizer step on the batch ``(x, y)``; returns the loss, the logits, the lr it
        stepped with and, when distilling, the distillation term (:func:`inq.distill.kd_loss`;
        else None).

        The INQ scheduler's step hook (:meth:`~inq.scheduler.INQScheduler.attach`) writes the
        frozen weights back to their powers of two inside ``scaler.step``. With a teacher, the
        loss is :func:`inq.distill.distill_loss`; the teacher (not wrapped in DDP) needs no
        communication between processes.
        """
        kd = None
        with torch.autocast(self.env.device.type, torch.float16, enabled=self._amp):
            logits = self._net(x)
            if self.teacher is None:
                loss = F.cross_entropy(logits, y)
            else:
                d = self.cfg.inq.distill
                with torch.no_grad():
                    teacher_logits = self.teacher(x)
                kd = kd_loss(logits, teacher_logits, d.temperature)
                loss = blend(logits, y, kd, d.weight)  # distill_loss, reusing the logged term
        self._optimizer.zero_grad(set_to_none=True)
        self._scaler.scale(loss).backward()
        if self.cfg.trainer.grad_clip:
            self._scaler.unscale_(self._optimizer)
            nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.trainer.grad_clip)
        self._scaler.step(self._optimizer)
        self._scaler.update()
        lr = self._lr_sched.get_last_lr()[0]
        self._lr_sched.step()
        self.progress.batch += 1
        self.progress.step += 1
        return loss, logits, lr, kd

    def evaluate(self) -> dict[str, float]:
        """Validation metrics, logged as ``val/*`` with the INQ state at the current step."""
        self._evals += 1
        count = self._evals
        with torch.autocast(self.env.device.type, torch.float16, enabled=self._amp):
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

    def end_phase(self, phase: Phase) -> None:
        """Close ``phase``: snap the STE shadows, evaluate and record the phase, check the ranks
        agree and save its checkpoint (``<phase>.pt``)."""
        if self._ste is not None:
            self._ste.finalize()  # snap the shadows: self.sched now holds every weight, exact
            self._ste = None
        self.history[phase.name] = {
            "portion": self.sched.quantized_fraction(),
            "pruned": self.sched.pruned_fraction(),
            **self.evaluate(),
        }
        self.timings[phase.name] = self.phase_seconds()
        self.progress = Progress(phase=self.progress.phase + 1, step=self.progress.step)
        self._clock = time.perf_counter()
        check_identical(self.model, self.sched)
        self.save(phase.name)
        if phase.name == "float" and self.cfg.inq.distill.weight > 0:
            self.teacher = frozen_teacher(self.model)  # = checkpoints/float.pt, which stays

    def save(self, *names: str) -> None:
        """Write ``checkpoints/latest.pt`` (and ``<name>.pt`` for each name); rank 0 only.

        The TensorBoard events before this step are written first; the checkpoint carries the
        ones of this step (see :mod:`inq.train.monitor`). Only the newest
        ``trainer.keep_checkpoints`` stage checkpoints stay.
        """
        self._stop_if_diverged(_first_non_finite(self.model))
        if not self.env.main:
            return
        state = ckpt.training_state(
            tb_pending=self.tb.commit(self.progress.step),
            model=self.model,
            sched=self.sched,
            optimizer=self._optimizer,
            params=self._params,
            lr_schedule=self._lr_sched,
            scaler=self._scaler,
            progress={**asdict(self.progress), "seconds": self.phase_seconds()},
            history=self.history,
            timings=self.timings,
            world_size=self.env.world_size,
            config=self.cfg,
        )
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
        where = self.phases[min(self.progress.phase, len(self.phases) - 1)].name
        raise RunStopped(
            f"training diverged: {problem or 'non-finite values on another process'} at step "
            f"{self.progress.step} ({where}); {diverged_hint(self.out)}"
        )

    def phase_seconds(self) -> float:
        """Wall-clock seconds spent in the current phase, by this process and killed ones."""
        return self.progress.seconds + time.perf_counter() - self._clock

    def _log_window(self, window: torch.Tensor, lr: float, phase: Phase, epoch: int) -> None:
        """``train/*`` scalars of the steps since the last ones; stop if the loss diverged."""
        step = self.progress.step
        loss_sum, correct, count, kd_sum = window.tolist()
        self._stop_if_diverged(
            None if math.isfinite(loss_sum) else f"the loss is {loss_sum / count}"
        )
        values = {"train/loss": loss_sum / count, "train/acc": correct / count, "train/lr": lr}
        if self.teacher is not None:
            values["train/kd_loss"] = kd_sum / count
        self.tb.scalars(step, values)

    def _log_epoch(self, totals: torch.Tensor, lr: float, phase: Phase, epoch: int) -> None:
        """The epoch's log line, with the time this process spent and the time left."""
        loss_sum, correct, count, _ = totals.tolist()
        if not count:  # resumed after the epoch's last batch: nothing trained here
            return
        seconds = time.perf_counter() - self._started[0]
        done = self.progress.step - self._started[1]
        left = self._run_bar.total - self.progress.step
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

    def _new_optimizer(self, params: str, lr: float) -> None:
        if self._optimizer is not None:
            self.sched.detach(self._optimizer)
        self._optimizer = build_optimizer(self.cfg.optim, self.model, params, lr)
        self._params = params
        if params == "all":  # a bias/norm-only optimizer never touches a quantized weight
            self.sched.attach(self._optimizer)

    def _restore(self, saved: dict[str, Any]) -> None:
        self.progress = Progress(**saved["progress"])
        if self.progress.phase > 0 and self.cfg.inq.distill.weight > 0:
            self.teacher = self._saved_teacher()  # before STE parametrizes self.model
        mid_phase = not self.at_phase_start()
        if mid_phase and self.phases[self.progress.phase].name == "ste":
            self._ste = STEQuantizer(self.model, self.sched)  # the state holds the shadows
        if saved["optimizer"] is not None:
            self._new_optimizer(saved["params"], lr=1.0)  # the saved state sets the lr
            if mid_phase:
                phase = self.phases[self.progress.phase]
                self._lr_sched = build_lr_schedule(
                    self.cfg.lr, self._optimizer, phase.epochs, self._steps_per_epoch
                )
        self.history, self.timings = saved["history"], saved["timings"]
        ckpt.restore_training_state(
            saved,
            self.model,
            self.sched,
            self._optimizer,
            self._lr_sched if mid_phase else None,
            self._scaler,
        )

    def _saved_teacher(self) -> nn.Module:
        """The teacher of a resumed run: the float model that ``checkpoints/float.pt`` holds,
        in the run directory or, for a run resumed from a checkpoint file elsewhere, beside that
        file (then linked into this run's, so that it resumes too).

        Raises:
            ConfigError: naming ``trainer.resume`` if there is no such file.
        """
        here = self.out / ckpt.CHECKPOINT_DIR / "float.pt"
        path = here
        if not here.is_file() and self.cfg.trainer.resume:
            path = ckpt.resolve_resume(self.cfg.trainer.resume).parent / here.name
        if not path.is_file():
            raise ConfigError(
                "trainer.resume",
                f"distillation (inq.distill.weight > 0) needs the run's float model, {here}, "
                "which is missing",
            )
        teacher = frozen_teacher(self.model)
        teacher.load_state_dict(ckpt.load_checkpoint(path)["model"])
        if path != here and self.env.main:
            ckpt.link_checkpoint(path, here)
        return teacher


def _build_model(
    cfg: DictConfig, model_info: dict[str, Any], device: torch.device, fresh: bool
) -> nn.Module:
    """The model, refused early if ``quant.act_bits`` asks for an integer form it has not;
    a ``fresh`` run (not a resumed one) starts from ``model.checkpoint`` if there is one."""
    model = build_model(model_info).to(device)
    if cfg.quant.act_bits is not None:  # before any training is spent on it
        try:
            check_expressible(model)
        except IntegerModelError as err:
            raise ConfigError(
                "quant.act_bits", f"no integer model of {cfg.model.name}: {err}"
            ) from None
    if cfg.model.checkpoint and fresh:
        ckpt.load_float_weights(model, cfg.model.checkpoint)
    return model


def _build_scheduler(model: nn.Module, cfg: DictConfig) -> INQScheduler:
    own_bits = layer_bits(cfg)  # outside the try: its ConfigError names its key already
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
            layer_bits=own_bits,
        )
    except ValueError as err:
        keys = ("layer_bits", "portions", "include", "exclude", "strategy")
        key = next((f"inq.{k}" for k in keys if k in str(err)), "inq")
        raise ConfigError(key, str(err)) from None


def _prune_targets(sched: INQScheduler, cfg: DictConfig) -> dict[str, float]:
    try:
        names = [layer.name for layer in sched.layers]
        return layer_targets(names, cfg.prune.sparsity, prune_layers(cfg))
    except ValueError as err:
        raise ConfigError("prune.layers", str(err)) from None


def _first_non_finite(model: nn.Module) -> str | None:
    """What is not finite in ``model`` (a weight, or a norm layer's running statistics), if any.

    Example:
        >>> bn = nn.BatchNorm1d(2)
        >>> _first_non_finite(bn), bn.running_var.fill_(float("inf")) is not None
        (None, True)
        >>> _first_non_finite(bn)
        "'running_var' holds NaN or infinite values"
    """
    for name, value in model.state_dict().items():
        if value.is_floating_point() and not bool(torch.isfinite(value).all()):
            return f"{name!r} holds NaN or infinite values"
    return None


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def _clock(seconds: float) -> str:
    """``m:ss``, or ``h:mm:ss`` from an hour on.

    Example:
        >>> _clock(59.6), _clock(3725)
        ('1:00', '1:02:05')
    """
    minutes, secs = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"
