"""The typed schema of ``inq-train``'s config, registered in Hydra's ConfigStore.

The YAML files under ``conf/`` (shipped as ``inq.conf``) fill these dataclasses, so a misspelt key
or a value of the wrong type stops Hydra with one message; :func:`validate` checks the ranges
OmegaConf cannot express.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, fields, is_dataclass
from enum import Enum
from typing import Any, TypeVar

import torch
from hydra.core.config_store import ConfigStore
from omegaconf import II, MISSING, DictConfig, OmegaConf

from inq.data import DataConfig, check_data
from inq.errors import ConfigError
from inq.levels import GRANULARITIES, N1_RULES
from inq.partition import STRATEGIES
from inq.pow2 import check_bits
from inq.prune import SCHEDULES
from inq.quant.pipeline import QuantSettings
from inq.scheduler import check_portions

__all__ = ["Config", "layer_bits", "prune_layers", "to_dict", "validate"]

_Value = TypeVar("_Value", int, float)


# The library's options, as enums for the schema: a bad value fails with the list of good ones.
Strategy = Enum("Strategy", STRATEGIES)  # inq.partition
N1Rule = Enum("N1Rule", N1_RULES)  # inq.levels
Granularity = Enum("Granularity", GRANULARITIES)  # inq.levels


class Method(Enum):
    inq = 1  # incremental: partition, snap, retrain, per portion (the paper)
    oneshot = 2  # baseline: snap every weight at once, no retraining
    ste = 3  # baseline: straight-through fine-tuning of all weights, INQ's epoch budget


PruneSchedule = Enum("PruneSchedule", SCHEDULES)  # inq.prune


class Schedule(Enum):
    constant = 1
    cosine = 2
    step = 3


@dataclass
class ModelConfig:
    name: str = "digits_cnn"  # digits_cnn, mnist_cnn, resnet20/32/56, or a torchvision model
    num_classes: int = II("data.num_classes")
    in_channels: int = II("data.in_channels")
    width: int = 16
    checkpoint: str | None = None  # float weights to start from; None = pretrain here


@dataclass
class SGDConfig:
    _target_: str = "torch.optim.SGD"
    lr: float = 0.1
    momentum: float = 0.9
    weight_decay: float = 5e-4
    nesterov: bool = False


@dataclass
class AdamWConfig:
    _target_: str = "torch.optim.AdamW"
    lr: float = 1e-3
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    weight_decay: float = 0.01


@dataclass
class LRConfig:
    name: Schedule = Schedule.cosine  # restarted at every stage
    warmup_epochs: float = 0.0
    min_factor: float = 0.0  # cosine floor, as a fraction of the base lr
    milestones: list[float] = field(default_factory=lambda: [0.5, 0.75])  # step: phase fractions
    gamma: float = 0.1


@dataclass
class DistillConfig:
    weight: float = 0.0  # share of the distillation loss, in [0, 1]; 0 = off
    temperature: float = 4.0  # softens teacher and student logits; > 0


@dataclass
class INQConfig:
    method: Method = Method.inq  # oneshot/ste: baselines on the same level sets (inq.baselines)
    bits: int = 5
    portions: list[float] = field(default_factory=lambda: [0.3, 0.6, 0.8, 1.0])
    strategy: Strategy = Strategy.magnitude
    n1_rule: N1Rule = N1Rule.max
    granularity: Granularity = Granularity.layer
    epochs: int = 6  # retraining epochs per stage
    lr: float | None = 0.01  # retraining lr; None = optim.lr
    include: list[str] | None = None  # module-name globs
    exclude: list[str] | None = None
    reset_optimizer: bool = True  # fresh optimizer state at every stage
    final_epochs: int = 0  # after the last stage: train biases and norm layers only
    layer_bits: list[str] = field(default_factory=list)  # ["GLOB:BITS", ...]; first match wins
    distill: DistillConfig = field(default_factory=DistillConfig)  # from the float model


@dataclass
class PruneConfig:
    sparsity: float = 0.0  # pruned fraction of every layer before INQ, in [0, 1); 0 = no pruning
    layers: list[str] = field(default_factory=list)  # ["GLOB:SPARSITY", ...]; first match wins
    steps: int = 3  # pruning rounds (magnitude), each followed by prune.epochs of retraining
    schedule: PruneSchedule = PruneSchedule.cubic  # how the rounds rise to the target
    epochs: int = 2  # retraining epochs after each round
    lr: float | None = None  # retraining lr; None = inq.lr (or optim.lr)


@dataclass
class TrainerConfig:
    device: str = "auto"  # auto = cuda if available, else cpu
    amp: bool = False  # float16 autocast + grad scaling (CUDA only)
    grad_clip: float | None = None  # max global grad norm
    seed: int = 0
    num_threads: int = 1  # CPU threads per process; 1 suits small models; 0 = torch's default
    float_epochs: int = 20  # pretraining when model.checkpoint is None
    eval_every: int = 0  # epochs; 0 = at the end of each stage only
    checkpoint_every: int = 0  # optimizer steps; 0 = at epoch ends only
    keep_checkpoints: int | None = 1  # newest stage ones kept beside latest and float; null: all
    log_every: int = 10  # optimizer steps between train/* scalars
    resume: str | None = None  # run dir or checkpoint file of a killed run
    allow_nonempty_dir: bool = False  # a new run may write beside other files in hydra.run.dir
    progress: bool = True  # tqdm bars (only when stderr is a terminal)


@dataclass
class Config:
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    optim: Any = MISSING
    lr: LRConfig = field(default_factory=LRConfig)
    inq: INQConfig = field(default_factory=INQConfig)
    prune: PruneConfig = field(default_factory=PruneConfig)
    quant: QuantSettings = field(default_factory=QuantSettings)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)


def register() -> None:
    """Put the schema in Hydra's ConfigStore (``conf/config.yaml`` starts from ``inq_schema``)."""
    store = ConfigStore.instance()
    store.store(name="inq_schema", node=Config)
    # at the root, not in the optim group: `inq-train --help` lists a group's entries as choices
    store.store(name="optim_sgd_schema", node=SGDConfig)
    store.store(name="optim_adamw_schema", node=AdamWConfig)


def to_dict(node: DictConfig) -> dict[str, Any]:
    """A resolved plain-dict copy of a config node (enums as their names).

    Example:
        >>> to_dict(OmegaConf.structured(DataConfig))["name"]
        'digits'
    """
    return OmegaConf.to_container(node, resolve=True, enum_to_str=True)  # type: ignore[return-value]


def validate(cfg: DictConfig) -> None:
    """Check what the types cannot: ranges and cross-field rules.

    Example:
        >>> register()
        >>> cfg = OmegaConf.merge(OmegaConf.structured(Config), {"optim": SGDConfig()})
        >>> validate(cfg)
        >>> cfg.inq.bits = 9
        >>> validate(cfg)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        inq.errors.ConfigError: inq.bits: bits must be an integer from 2 to 8 ...

    Raises:
        ConfigError: naming the first offending key.
    """
    _check_known_keys(cfg)
    missing = sorted(OmegaConf.missing_keys(cfg))
    if missing:
        raise ConfigError(missing[0], "must be set (it is ??? in the config)")
    _check_finite(to_dict(cfg))
    _check_trainer(cfg.trainer)
    _check_inq(cfg)
    check_data(cfg.data, "data.")
    if cfg.model.width <= 0:
        raise ConfigError("model.width", f"must be > 0, got {cfg.model.width}")
    _check_optimizer(cfg.optim)
    _check_quant(cfg.quant)
    _check_float_weights(cfg)
    _check_prune(cfg)
    _check_lr(cfg.lr)
    _check_distill(cfg)


def _check_trainer(t: DictConfig) -> None:
    """``trainer.*``: counts >= 0, positive intervals, a seed numpy takes, a device there is."""
    if t.resume == "":
        raise ConfigError("trainer.resume", "is empty; name the run directory to continue")
    counts = ("seed", "float_epochs", "eval_every", "checkpoint_every", "num_threads")
    _check_at_least(0, {f"trainer.{k}": t[k] for k in counts})
    _check_at_least(0, {"trainer.keep_checkpoints": t.keep_checkpoints or 0})
    if t.seed >= 2**32:  # numpy's and torch's seeding limit
        raise ConfigError("trainer.seed", f"must be < 2**32, got {t.seed}")
    if t.log_every <= 0:
        raise ConfigError("trainer.log_every", f"must be > 0, got {t.log_every}")
    if t.grad_clip is not None and t.grad_clip <= 0:
        raise ConfigError("trainer.grad_clip", f"must be > 0 or null, got {t.grad_clip}")
    if t.device not in ("auto", "cpu") and not t.device.startswith("cuda"):
        raise ConfigError("trainer.device", f"use auto, cpu or cuda[:N], got {t.device!r}")
    if t.device.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError("trainer.device", f"{t.device!r} asked for, but no CUDA GPU is visible")


def _check_inq(cfg: DictConfig) -> None:
    """``inq.*``: bits, portions, epochs, lr and each ``layer_bits`` entry."""
    for key, check, value in (
        ("inq.bits", check_bits, cfg.inq.bits),
        ("inq.portions", check_portions, list(cfg.inq.portions)),
    ):
        try:
            check(value)
        except ValueError as err:
            raise ConfigError(key, str(err)) from None
    _check_at_least(0, {"inq.epochs": cfg.inq.epochs, "inq.final_epochs": cfg.inq.final_epochs})
    if cfg.inq.lr is not None and cfg.inq.lr <= 0:
        raise ConfigError("inq.lr", f"must be > 0 or null, got {cfg.inq.lr}")
    for glob, bits in layer_bits(cfg).items():
        try:
            check_bits(bits)
        except ValueError as err:
            raise ConfigError("inq.layer_bits", f"{glob!r}: {err}") from None


def _check_prune(cfg: DictConfig) -> None:
    """``prune.*``: rounds, epochs, lr and every pruned fraction in [0, 1)."""
    p = cfg.prune
    _check_at_least(0, {"prune.epochs": p.epochs})
    if p.steps <= 0:
        raise ConfigError("prune.steps", f"must be > 0, got {p.steps}")
    if p.lr is not None and p.lr <= 0:
        raise ConfigError("prune.lr", f"must be > 0 or null, got {p.lr}")
    for key, value in [("prune.sparsity", p.sparsity), *prune_layers(cfg).items()]:
        if not 0.0 <= value < 1.0:
            where = key if key == "prune.sparsity" else f"prune.layers {key}"
            raise ConfigError(where, f"a pruned fraction in [0, 1), got {value}")


def _check_lr(lr: DictConfig) -> None:
    """``lr.*``: warmup >= 0, gamma > 0, the cosine floor in [0, 1], rising milestones."""
    _check_at_least(0, {"lr.warmup_epochs": lr.warmup_epochs})
    if lr.gamma <= 0:
        raise ConfigError("lr.gamma", f"must be > 0, got {lr.gamma}")
    if not 0.0 <= lr.min_factor <= 1.0:
        raise ConfigError("lr.min_factor", f"must lie in [0, 1], got {lr.min_factor}")
    milestones = list(lr.milestones)
    if any(not 0.0 < m < 1.0 for m in milestones) or milestones != sorted(set(milestones)):
        raise ConfigError("lr.milestones", f"rising fractions of a stage, in (0, 1): {milestones}")


def _check_at_least(least: float, values: dict[str, float]) -> None:
    for key, value in values.items():
        if value < least:
            raise ConfigError(key, f"must be >= {least}, got {value}")


def _check_finite(settings: dict[str, Any], prefix: str = "") -> None:
    """Refuse NaN and infinite numbers anywhere in the (plain-dict) config: none is meaningful."""
    for key, value in settings.items():
        values = value if isinstance(value, list) else [value]
        if isinstance(value, dict):
            _check_finite(value, f"{prefix}{key}.")
        elif any(isinstance(v, float) and not math.isfinite(v) for v in values):
            raise ConfigError(f"{prefix}{key}", f"must be a finite number, got {value}")


def _check_quant(quant: DictConfig) -> None:
    """The integer phase's settings in range, and none given without ``quant.act_bits``."""
    settings: QuantSettings = OmegaConf.to_object(quant)  # type: ignore[assignment]
    problem = settings.problem()
    if problem is not None:
        raise ConfigError(f"quant.{problem[0]}", problem[1])
    if settings.act_bits is None:
        unused = [f.name for f in fields(QuantSettings) if getattr(settings, f.name) != f.default]
        if unused:
            raise ConfigError(
                f"quant.{unused[0]}",
                "has no effect without quant.act_bits (which makes the integer model); set "
                "quant.act_bits too, or leave it out",
            )


def _check_float_weights(cfg: DictConfig) -> None:
    """Float weights from exactly one source: ``model.checkpoint``, or pretraining here."""
    epochs, default = cfg.trainer.float_epochs, TrainerConfig.float_epochs
    if epochs == 0 and not cfg.model.checkpoint:
        raise ConfigError(
            "model.checkpoint",
            "no float weights: give a local file to start from, or trainer.float_epochs > 0 "
            "to pretrain here",
        )
    if cfg.model.checkpoint and epochs not in (0, default):
        raise ConfigError(
            "trainer.float_epochs",
            f"model.checkpoint gives the float weights, so no float pretraining runs; leave "
            f"trainer.float_epochs out (or 0), got {epochs}",
        )


def _check_distill(cfg: DictConfig) -> None:
    distill = cfg.inq.distill
    if not 0.0 <= distill.weight <= 1.0:
        raise ConfigError("inq.distill.weight", f"must lie in [0, 1], got {distill.weight}")
    if not distill.temperature > 0:
        raise ConfigError("inq.distill.temperature", f"must be > 0, got {distill.temperature}")
    retrains = (
        cfg.inq.method.name != "oneshot"
        or cfg.inq.final_epochs > 0
        or bool(cfg.prune.sparsity or cfg.prune.layers)
        or (cfg.quant.act_bits is not None and cfg.quant.epochs > 0)
    )
    if distill.weight > 0 and not retrains:
        raise ConfigError(
            "inq.distill.weight",
            "inq.method=oneshot retrains nothing, so nothing distills; leave it out (or add "
            "pruning, inq.final_epochs or quant.epochs, which retrain)",
        )


def prune_layers(cfg: DictConfig) -> dict[str, float]:
    """``prune.layers`` (``["GLOB:SPARSITY", ...]``) as ``{glob: sparsity}``, in order.

    Example:
        >>> prune_layers(OmegaConf.create({"prune": {"layers": ["fc*:0.95", "conv1:0.5"]}}))
        {'fc*': 0.95, 'conv1': 0.5}

    Raises:
        ConfigError: on an entry that is not ``GLOB:NUMBER``, or a glob given twice.
    """
    return _glob_values(
        cfg.prune.get("layers"), "prune.layers", "GLOB:SPARSITY, e.g. fc*:0.95", float
    )


def layer_bits(cfg: DictConfig) -> dict[str, int]:
    """``inq.layer_bits`` (``["GLOB:BITS", ...]``) as ``{glob: bits}``, in order (the first glob
    that matches a layer sets its bits; :func:`inq.scheduler.assign_layer_bits`).

    Example:
        >>> layer_bits(OmegaConf.create({"inq": {"layer_bits": ["conv1:8", "fc:8"]}}))
        {'conv1': 8, 'fc': 8}

    Raises:
        ConfigError: on an entry that is not ``GLOB:INTEGER``, or a glob given twice (the range
            of the bits is :func:`validate`'s).
    """
    return _glob_values(cfg.inq.get("layer_bits"), "inq.layer_bits", "GLOB:BITS, e.g. conv1:8", int)


def _glob_values(
    items: Any, key: str, form: str, parse: Callable[[str], _Value]
) -> dict[str, _Value]:
    """``["GLOB:VALUE", ...]`` as ``{glob: parse(VALUE)}``, in order; errors name ``key``."""
    values: dict[str, _Value] = {}
    for item in items or ():
        glob, _, value = str(item).rpartition(":")
        if glob in values:
            raise ConfigError(key, f"{glob!r} is given twice")
        try:
            values[glob] = parse(value)
        except ValueError:
            glob = ""
        if not glob:
            raise ConfigError(key, f"entries are {form}; got {item!r}")
    return values


def _check_optimizer(optim: DictConfig) -> None:
    """``optim.*``: lr > 0, weight decay >= 0, momentum and betas in [0, 1)."""
    if optim.lr <= 0:
        raise ConfigError("optim.lr", f"must be > 0, got {optim.lr}")
    if optim.get("weight_decay", 0.0) < 0:
        raise ConfigError("optim.weight_decay", f"must be >= 0, got {optim.weight_decay}")
    if not 0.0 <= optim.get("momentum", 0.0) < 1.0:  # >= 1: the step grows without bound
        raise ConfigError("optim.momentum", f"must lie in [0, 1), got {optim.momentum}")
    betas = optim.get("betas")
    if betas is not None and (len(betas) != 2 or not all(0.0 <= b < 1.0 for b in betas)):
        raise ConfigError("optim.betas", f"two values in [0, 1), got {list(betas)}")


def _check_known_keys(cfg: DictConfig) -> None:
    # Hydra's "+key=value" force-adds keys even to typed nodes; refuse what the schema lacks.
    def walk(node: DictConfig, schema: type, prefix: str) -> None:
        known = {f.name: f for f in fields(schema)}
        for key in node:
            if key not in known:
                raise ConfigError(
                    f"{prefix}{key}",
                    f"unknown key; {prefix.rstrip('.') or 'the config'} has "
                    f"{sorted(k for k in known if not k.startswith('_'))}",
                )
            if OmegaConf.is_missing(node, key):
                continue
            child_type = OmegaConf.get_type(node, key)
            if isinstance(node[key], DictConfig) and is_dataclass(child_type):
                walk(node[key], child_type, f"{prefix}{key}.")

    walk(cfg, Config, "")
