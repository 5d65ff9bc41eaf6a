"""Pieces of the training loop: the phase plan, optimizer and LR schedule factories, evaluation.

A run is a list of phases: ``float`` (pretraining; 0 epochs when ``model.checkpoint`` is given),
with pruning (``prune.sparsity`` or ``prune.layers``) ``prune1`` .. ``pruneR`` (one per round),
``stage1`` .. ``stageK`` (one per INQ portion) and, if ``inq.final_epochs`` > 0, ``bias_norm``.
The baselines (``inq.method``) replace the stages by one phase: ``oneshot`` (0 epochs) or
``ste`` (as many epochs as the INQ stages and ``bias_norm`` together).
Every phase gets a fresh LR schedule; :mod:`inq.train.app` runs them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from hydra.utils import instantiate
from omegaconf import DictConfig
from torch import nn
from torch.optim.lr_scheduler import LambdaLR

from inq.train.config import prune_layers

__all__ = [
    "NORM_TYPES",
    "Phase",
    "bias_norm_parameters",
    "build_lr_schedule",
    "build_optimizer",
    "method_name",
    "plan_phases",
    "prunes",
]

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
