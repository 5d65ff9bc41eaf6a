"""The typed schema of ``inq-train``'s config, registered in Hydra's ConfigStore.

The YAML files under ``conf/`` (shipped as ``inq.conf``) fill these dataclasses, so a misspelt key
or a value of the wrong type stops Hydra; :func:`composition_error` turns its report into one
line naming the key, the value and what it must be, and :func:`check_given` refuses what
OmegaConf takes but should not (``2`` for a boolean). :func:`validate` checks what OmegaConf
cannot express (each section's ``check()``, then the rules between sections) and returns the
typed :class:`Config` (``OmegaConf.to_object``) that the run uses from then on; its list options
are parsed there, once (:attr:`INQConfig.bits_by_glob`, :attr:`PruneConfig.sparsity_by_glob`).
"""

from __future__ import annotations

import math
import re
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, is_dataclass
from enum import Enum
from functools import cached_property
from typing import Any, TypeVar

import torch
from hydra.core.config_store import ConfigStore
from hydra.errors import HydraException, MissingConfigException, OverrideParseException
from omegaconf import II, MISSING, DictConfig, OmegaConf
from omegaconf.errors import ConfigAttributeError, ConfigKeyError, OmegaConfBaseException

from inq.data import DataConfig, check_data
from inq.errors import ConfigError
from inq.pow2 import check_bits
from inq.quant.pipeline import QuantSettings
from inq.scheduler import check_portions

__all__ = [
    "AUTO",
    "OPTIMIZERS",
    "AdamWConfig",
    "AutoConfig",
    "BudgetConfig",
    "Config",
    "INQConfig",
    "LRConfig",
    "OptimConfig",
    "PruneConfig",
    "SGDConfig",
    "TrainerConfig",
    "check_given",
    "composition_error",
    "register",
    "schema_of",
    "to_dict",
    "validate",
]

_Value = TypeVar("_Value", int, float)


# The library's options, as enums for the schema: a bad value fails with the list of good ones.
# Each lists its library constant's names, in order (tests/test_train_config.py checks it).
class Strategy(Enum):  # inq.partition.STRATEGIES
    magnitude = 1
    random = 2
    error = 3


class N1Rule(Enum):  # inq.levels.N1_RULES
    max = 1
    mse = 2


class Granularity(Enum):  # inq.levels.GRANULARITIES
    layer = 1
    channel = 2


class Method(Enum):
    inq = 1  # incremental: partition, snap, retrain, per portion (the paper)
    oneshot = 2  # baseline: snap every weight at once, no retraining
    ste = 3  # baseline: straight-through fine-tuning of all weights, INQ's epoch budget


class AutoMethod(Enum):  # inq.allocate.METHODS
    loss = 1  # the loss increase with one layer alone snapped to b bits
    hessian = 2  # Hutchinson's Hessian trace times the squared rounding error (HAWQ-v2)


class SizeUnit(Enum):  # inq.allocate.SIZES
    packed = 1  # bytes of the packed file's codes (nibbles for 2-4 bits, bytes for 5-8)
    nominal = 2  # ceil(n * b / 8) bytes a layer


class PruneSchedule(Enum):  # inq.prune.SCHEDULES
    cubic = 1
    linear = 2


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

    def check(self) -> None:
        _check_positive({"model.width": self.width})


@dataclass
class OptimConfig:
    """The optimizer group's typed base (Hydra's structured-config pattern): what every
    optimizer has. ``conf/optim/<name>.yaml`` picks a subclass; ``_target_`` is instantiated
    with the parameters and the phase's lr."""

    _target_: str = MISSING
    lr: float = MISSING
    weight_decay: float = 0.0

    def check(self) -> None:
        _check_positive({"optim.lr": self.lr})
        _check_at_least(0, {"optim.weight_decay": self.weight_decay})


@dataclass
class SGDConfig(OptimConfig):
    _target_: str = "torch.optim.SGD"
    lr: float = 0.1
    momentum: float = 0.9
    weight_decay: float = 5e-4
    nesterov: bool = False

    def check(self) -> None:
        super().check()
        if not 0.0 <= self.momentum < 1.0:  # >= 1: the step grows without bound
            raise ConfigError("optim.momentum", f"must lie in [0, 1), got {self.momentum}")


@dataclass
class AdamWConfig(OptimConfig):
    _target_: str = "torch.optim.AdamW"
    lr: float = 1e-3
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    weight_decay: float = 0.01

    def check(self) -> None:
        super().check()
        betas = self.betas
        if len(betas) != 2 or not all(0.0 <= b < 1.0 for b in betas):
            raise ConfigError("optim.betas", f"two values in [0, 1), got {list(betas)}")


@dataclass
class LRConfig:
    name: Schedule = Schedule.cosine  # restarted at every stage
    warmup_epochs: float = 0.0
    min_factor: float = 0.0  # cosine floor, as a fraction of the base lr
    milestones: list[float] = field(default_factory=lambda: [0.5, 0.75])  # step: phase fractions
    gamma: float = 0.1

    def check(self) -> None:
        """Warmup >= 0, gamma > 0, the cosine floor in [0, 1], rising milestones."""
        _check_at_least(0, {"lr.warmup_epochs": self.warmup_epochs})
        _check_positive({"lr.gamma": self.gamma})
        if not 0.0 <= self.min_factor <= 1.0:
            raise ConfigError("lr.min_factor", f"must lie in [0, 1], got {self.min_factor}")
        marks = list(self.milestones)
        if any(not 0.0 < m < 1.0 for m in marks) or marks != sorted(set(marks)):
            raise ConfigError("lr.milestones", f"rising fractions of a stage, in (0, 1): {marks}")


@dataclass
class DistillConfig:
    weight: float = 0.0  # share of the distillation loss, in [0, 1]; 0 = off
    temperature: float = 4.0  # softens teacher and student logits; > 0

    def check(self) -> None:
        if not 0.0 <= self.weight <= 1.0:
            raise ConfigError("inq.distill.weight", f"must lie in [0, 1], got {self.weight}")
        _check_positive({"inq.distill.temperature": self.temperature})


AUTO = "auto"  # inq.bits: each layer's bits chosen after the float phase (inq.allocate)


@dataclass
class BudgetConfig:
    """The size budget of ``inq.bits=auto``: give one."""

    avg_bits: float | None = None  # mean bits a quantized weight costs (8 * bytes / weights)
    bytes: int | None = None  # bytes of all quantized layers' codes, headers aside


@dataclass
class AutoConfig:
    """How ``inq.bits=auto`` chooses (:func:`inq.allocate.allocate`)."""

    choices: list[int] = field(default_factory=lambda: [2, 3, 4, 5, 8])
    method: AutoMethod = AutoMethod.loss
    size: SizeUnit = SizeUnit.packed  # how a layer's bytes are counted
    batches: int = 4  # calibration batches of data.eval_batch_size training images
    samples: int = 8  # Hutchinson vectors (method=hessian)

    def check(self) -> None:
        _check_positive({"inq.auto.batches": self.batches, "inq.auto.samples": self.samples})
        if not self.choices:
            raise ConfigError("inq.auto.choices", "is empty; give bit-widths, e.g. [2, 3, 4, 5, 8]")
        for bits in self.choices:
            try:
                check_bits(bits)
            except ValueError as err:
                raise ConfigError("inq.auto.choices", str(err)) from None


@dataclass
class INQConfig:
    method: Method = Method.inq  # oneshot/ste: baselines on the same level sets (inq.baselines)
    bits: int | str = 5  # or auto: per-layer bits under inq.budget (inq.auto)
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
    # each layer's mask and frozen values kept between stages: 2 kernels a layer per training
    # step instead of 6, for 5 more bytes a float32 weight; the same bits; null = on CUDA only
    cache_values: bool | None = None
    budget: BudgetConfig = field(default_factory=BudgetConfig)  # with bits=auto
    auto: AutoConfig = field(default_factory=AutoConfig)

    @cached_property
    def bits_by_glob(self) -> dict[str, int]:
        """``layer_bits`` parsed, ``{glob: bits}`` in order (the first glob that matches a
        layer sets its bits: :func:`inq.scheduler.assign_layer_bits`).

        Example:
            >>> INQConfig(layer_bits=["conv1:8", "fc:8"]).bits_by_glob
            {'conv1': 8, 'fc': 8}

        Raises:
            ConfigError: on an entry that is not ``GLOB:INTEGER``, or a glob given twice.
        """
        return _glob_values(self.layer_bits, "inq.layer_bits", "GLOB:BITS, e.g. conv1:8", int)

    def check(self) -> None:
        """Bits (or ``auto`` with its budget), portions, epochs, lr, each ``layer_bits`` entry and
        the distillation."""
        self._check_auto()
        for key, check in (
            ("inq.bits", lambda: isinstance(self.bits, str) or check_bits(self.bits)),
            ("inq.portions", lambda: check_portions(self.portions)),
        ):
            try:
                check()
            except ValueError as err:
                raise ConfigError(key, str(err)) from None
        _check_at_least(0, {"inq.epochs": self.epochs, "inq.final_epochs": self.final_epochs})
        _check_positive({"inq.lr": self.lr}, null=True)
        for glob, bits in self.bits_by_glob.items():
            try:
                check_bits(bits)
            except ValueError as err:
                raise ConfigError("inq.layer_bits", f"{glob!r}: {err}") from None
        self.distill.check()

    def _check_auto(self) -> None:
        """``inq.bits=auto`` with one budget and good choices; no budget or ``inq.auto``
        setting without it."""
        if isinstance(self.bits, str) and self.bits != AUTO:
            raise ConfigError("inq.bits", f"an integer from 2 to 8, or auto; got {self.bits!r}")
        budget = {f.name: getattr(self.budget, f.name) for f in fields(BudgetConfig)}
        given = {k: v for k, v in budget.items() if v is not None}
        if self.bits != AUTO:
            default = AutoConfig()
            unused = [f"budget.{k}" for k in given] + [
                f"auto.{f.name}"
                for f in fields(AutoConfig)
                if getattr(self.auto, f.name) != getattr(default, f.name)
            ]
            if unused:
                raise ConfigError(
                    f"inq.{unused[0]}", "has no effect without inq.bits=auto; set that too"
                )
            return
        if len(given) != 1:
            raise ConfigError(
                "inq.budget",
                "inq.bits=auto needs one budget: inq.budget.avg_bits (mean bits a weight) or "
                f"inq.budget.bytes; got {given or 'none'}",
            )
        _check_positive({"inq.budget.avg_bits": self.budget.avg_bits}, null=True)
        _check_at_least(0, {"inq.budget.bytes": self.budget.bytes or 0})
        self.auto.check()


@dataclass
class PruneConfig:
    sparsity: float = 0.0  # pruned fraction of every layer before INQ, in [0, 1); 0 = no pruning
    layers: list[str] = field(default_factory=list)  # ["GLOB:SPARSITY", ...]; first match wins
    steps: int = 3  # pruning rounds (magnitude), each followed by prune.epochs of retraining
    schedule: PruneSchedule = PruneSchedule.cubic  # how the rounds rise to the target
    epochs: int = 2  # retraining epochs after each round
    lr: float | None = None  # retraining lr; None = inq.lr (or optim.lr)

    @cached_property
    def sparsity_by_glob(self) -> dict[str, float]:
        """``layers`` parsed, ``{glob: sparsity}`` in order.

        Example:
            >>> PruneConfig(layers=["fc*:0.95", "conv1:0.5"]).sparsity_by_glob
            {'fc*': 0.95, 'conv1': 0.5}

        Raises:
            ConfigError: on an entry that is not ``GLOB:NUMBER``, or a glob given twice.
        """
        form = "GLOB:SPARSITY, e.g. fc*:0.95"
        return _glob_values(self.layers, "prune.layers", form, float)

    @property
    def active(self) -> bool:
        """Whether the run prunes before INQ (``sparsity`` or a ``layers`` entry > 0).

        Example:
            >>> PruneConfig(layers=["fc*:0.9"]).active, PruneConfig().active
            (True, False)
        """
        return self.sparsity > 0 or any(self.sparsity_by_glob.values())

    def check(self) -> None:
        """Rounds, epochs, lr and every pruned fraction in [0, 1)."""
        _check_at_least(0, {"prune.epochs": self.epochs})
        _check_positive({"prune.steps": self.steps})
        _check_positive({"prune.lr": self.lr}, null=True)
        for key, value in [("prune.sparsity", self.sparsity), *self.sparsity_by_glob.items()]:
            if not 0.0 <= value < 1.0:
                where = key if key == "prune.sparsity" else f"prune.layers {key}"
                raise ConfigError(where, f"a pruned fraction in [0, 1), got {value}")


AMP_DTYPES: dict[bool | str, torch.dtype] = {
    True: torch.float16,
    "fp16": torch.float16,
    "bf16": torch.bfloat16,
}


@dataclass
class TrainerConfig:
    device: str = "auto"  # auto = cuda if available, else cpu
    amp: bool | str = False  # fp16 (or true): float16 autocast + grad scaling, CUDA only; bf16
    compile: bool = False  # torch.compile the trained model (not the teacher, not evaluation)
    channels_last: bool = False  # NHWC memory format for the model's 4-d weights and its inputs
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

    @property
    def amp_dtype(self) -> torch.dtype | None:
        """The autocast dtype ``amp`` asks for (None: no autocast).

        Example:
            >>> TrainerConfig(amp=True).amp_dtype, TrainerConfig(amp="bf16").amp_dtype
            (torch.float16, torch.bfloat16)
        """
        return None if self.amp is False else AMP_DTYPES[self.amp]

    def check(self) -> None:
        """Counts >= 0, positive intervals, a seed numpy takes, a device there is, an amp mode."""
        if self.amp is not False and self.amp not in AMP_DTYPES:
            raise ConfigError("trainer.amp", f"use false, fp16 (or true) or bf16, got {self.amp!r}")
        if self.resume == "":
            raise ConfigError("trainer.resume", "is empty; name the run directory to continue")
        counts = ("seed", "float_epochs", "eval_every", "checkpoint_every", "num_threads")
        _check_at_least(0, {f"trainer.{k}": getattr(self, k) for k in counts})
        _check_at_least(0, {"trainer.keep_checkpoints": self.keep_checkpoints or 0})
        if self.seed >= 2**32:  # numpy's and torch's seeding limit
            raise ConfigError("trainer.seed", f"must be < 2**32, got {self.seed}")
        _check_positive({"trainer.log_every": self.log_every})
        _check_positive({"trainer.grad_clip": self.grad_clip}, null=True)
        device = self.device
        if device not in ("auto", "cpu") and not device.startswith("cuda"):
            raise ConfigError("trainer.device", f"use auto, cpu or cuda[:N], got {device!r}")
        if device.startswith("cuda") and not torch.cuda.is_available():
            raise ConfigError("trainer.device", f"{device!r} asked for, but no CUDA GPU is visible")


@dataclass
class Config:
    """The whole ``inq-train`` config, as :func:`validate` returns it: typed, checked, its list
    options parsed."""

    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    optim: OptimConfig = MISSING
    lr: LRConfig = field(default_factory=LRConfig)
    inq: INQConfig = field(default_factory=INQConfig)
    prune: PruneConfig = field(default_factory=PruneConfig)
    quant: QuantSettings = field(default_factory=QuantSettings)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)

    def check(self) -> None:
        """Each section's own ranges, then the rules between sections."""
        self.trainer.check()
        self.inq.check()
        check_data(to_dict(self.data), "data.")
        self.model.check()
        self.optim.check()
        _check_quant(self.quant)
        _check_float_weights(self)
        self.prune.check()
        self.lr.check()
        _check_distill_retrains(self)


OPTIMIZERS: dict[str, type[OptimConfig]] = {c._target_: c for c in (SGDConfig, AdamWConfig)}


def schema_of(recorded: Mapping[str, Any]) -> DictConfig:
    """The typed schema a recorded config (a plain dict) merges into: :class:`Config`, its
    ``optim`` the subclass of :class:`OptimConfig` whose ``_target_`` it records.

    Example:
        >>> OmegaConf.get_type(schema_of({"optim": {"_target_": "torch.optim.AdamW"}}).optim)
        <class 'inq.train.config.AdamWConfig'>
    """
    schema: DictConfig = OmegaConf.structured(Config)
    target = recorded.get("optim", {}).get("_target_")
    if target in OPTIMIZERS:
        schema.optim = OmegaConf.structured(OPTIMIZERS[target])
    return schema


def register() -> None:
    """Put the schema in Hydra's ConfigStore (``conf/config.yaml`` starts from ``inq_schema``),
    once a process: storing builds each typed config again (12 ms), for every compose."""
    store = ConfigStore.instance()
    if "inq_schema.yaml" in store.repo:
        return
    store.store(name="inq_schema", node=Config)
    # at the root, not in the optim group: `inq-train --help` lists a group's entries as choices
    store.store(name="optim_sgd_schema", node=SGDConfig)
    store.store(name="optim_adamw_schema", node=AdamWConfig)


def to_dict(node: Any) -> dict[str, Any]:
    """A resolved plain-dict copy of a config node or of a typed section (enums as their
    names).

    Example:
        >>> to_dict(OmegaConf.structured(DataConfig))["name"]
        'digits'
        >>> to_dict(LRConfig())["name"]
        'cosine'
    """
    node = OmegaConf.structured(node) if is_dataclass(node) else node
    return OmegaConf.to_container(node, resolve=True, enum_to_str=True)  # type: ignore[return-value]


def validate(cfg: DictConfig) -> Config:
    """Check what the types cannot (ranges and cross-field rules) and return the config typed,
    its list options (``inq.layer_bits``, ``prune.layers``) parsed.

    Example:
        >>> register()
        >>> cfg = OmegaConf.merge(OmegaConf.structured(Config), {"optim": SGDConfig()})
        >>> validate(cfg).optim.momentum
        0.9
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
    typed = OmegaConf.to_object(cfg)
    assert isinstance(typed, Config)
    typed.check()
    return typed


def _check_positive(values: dict[str, float | None], null: bool = False) -> None:
    """Each value > 0, or None where ``null`` allows it."""
    for key, value in values.items():
        if value is None and null:
            continue
        if value is None or value <= 0:
            raise ConfigError(key, f"must be > 0{' or null' if null else ''}, got {value}")


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


def _check_quant(settings: QuantSettings) -> None:
    """The integer phase's settings in range, and none given without ``quant.act_bits``."""
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


def _check_float_weights(cfg: Config) -> None:
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


def _check_distill_retrains(cfg: Config) -> None:
    """Distillation only where something retrains."""
    retrains = (
        cfg.inq.method != Method.oneshot
        or cfg.inq.final_epochs > 0
        or bool(cfg.prune.sparsity or cfg.prune.layers)
        or (cfg.quant.act_bits is not None and cfg.quant.epochs > 0)
    )
    if cfg.inq.distill.weight > 0 and not retrains:
        raise ConfigError(
            "inq.distill.weight",
            "inq.method=oneshot retrains nothing, so nothing distills; leave it out (or add "
            "pruning, inq.final_epochs or quant.epochs, which retrain)",
        )


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


def _check_known_keys(cfg: DictConfig) -> None:
    # Hydra's "+key=value" force-adds keys even to typed nodes; refuse what the schema lacks.
    def walk(node: DictConfig, schema: type, prefix: str) -> None:
        known = {f.name: f for f in fields(schema)}
        for key in map(str, node):
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


def composition_error(err: HydraException) -> ConfigError:
    """The one-line :class:`ConfigError` of an error Hydra raised composing the config (a bad
    value or an unknown key on the command line or in a config file, a config group option
    that does not exist, an override it cannot parse), in place of its multi-line report.

    Example:
        >>> from omegaconf import ValidationError
        >>> from hydra.errors import ConfigCompositionException
        >>> cause = ValidationError("Value 'abc' of type 'str' could not be converted")
        >>> cause.full_key, cause.value = "quant.act_bits", "abc"
        >>> err = ConfigCompositionException("Error merging override quant.act_bits=abc")
        >>> err.__cause__ = cause
        >>> print(composition_error(err))
        quant.act_bits: must be an integer or null, got 'abc'
    """
    cause = err.__cause__ or err.__context__  # a config file's error is the context
    if isinstance(cause, OmegaConfBaseException) and getattr(cause, "full_key", None):
        key = re.sub(r"\[\d+\]$", "", str(cause.full_key))  # a list's entry: the list
        schema = cause.object_type if is_dataclass(cause.object_type) else _schema_class(key)
        name = key.rpartition(".")[2]
        known = sorted(f.name for f in fields(schema) if f.name[0] != "_") if schema else []
        unknown = isinstance(cause, ConfigAttributeError | ConfigKeyError)
        if unknown or (schema is not None and name not in known):
            where = key.rpartition(".")[0] or "the config"
            return ConfigError(key, f"unknown key; {where} has {known}")
        if schema is not None:
            expected = _describe(typing.get_type_hints(schema)[name])
            return ConfigError(key, f"must be {expected}, got {_shown(cause.value)}")
        return ConfigError(key, _first_line(str(cause.msg)))
    if isinstance(err, MissingConfigException) and err.missing_cfg_file:
        group, _, option = err.missing_cfg_file.rpartition("/")
        options = f"; the options are {', '.join(err.options)}" if err.options else ""
        return ConfigError(group or option, f"no config {option!r}{options}")
    if isinstance(err, OverrideParseException):
        return ConfigError(err.override, f"cannot parse this override: {_first_line(err.message)}")
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    return ConfigError("config", " ".join(lines[:2]) or type(err).__name__)


def check_given(cfg: DictConfig, given: Mapping[str, Any]) -> None:
    """Refuse a value that OmegaConf would take but means nothing: anything other than true or
    false (or null where allowed) for a boolean key (OmegaConf reads ``2`` as true). ``given``
    maps the command line's keys to their parsed values; ``cfg`` is the composed config.

    Example:
        >>> cfg = OmegaConf.merge(OmegaConf.structured(Config), {"optim": SGDConfig()})
        >>> check_given(cfg, {"inq.cache_values": None, "trainer.compile": True})
        >>> check_given(cfg, {"inq.cache_values": 2})
        Traceback (most recent call last):
        ...
        inq.errors.ConfigError: inq.cache_values: must be true, false or null, got 2

    Raises:
        ConfigError: naming the key, the value and what it must be.
    """
    for key, value in given.items():
        parent, _, name = key.rpartition(".")
        node = OmegaConf.select(cfg, parent) if parent else cfg
        schema = OmegaConf.get_type(node) if isinstance(node, DictConfig) else None
        if schema is None or not is_dataclass(schema):
            continue
        hint = typing.get_type_hints(schema).get(name)
        takes_bool = hint is bool or (_optional(hint) is bool)
        if takes_bool and not (isinstance(value, bool) or (value is None and hint is not bool)):
            raise ConfigError(key, f"must be {_describe(hint)}, got {_shown(value)}")


def _schema_class(key: str) -> type | None:
    """The dataclass that holds the dotted ``key``'s last part (None past a non-dataclass); the
    optimizer's keys in the union of every optimizer's."""
    schema: type | None = Config
    for part in key.split(".")[:-1]:
        if schema is None or not is_dataclass(schema):
            return None
        hint = typing.get_type_hints(schema).get(part)
        hint = _optional(hint) or hint
        if part == "optim" and schema is Config:
            name = key.split(".")[1] if key.count(".") else ""
            hint = next((c for c in OPTIMIZERS.values() if name in c.__dataclass_fields__), hint)
        schema = hint if isinstance(hint, type) and is_dataclass(hint) else None
    return schema


def _optional(hint: Any) -> Any:
    """``X`` of ``X | None`` (else None)."""
    args = typing.get_args(hint)
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        rest = [a for a in args if a is not type(None)]
        if len(rest) == 1 and len(args) == 2:
            return rest[0]
    return None


def _describe(hint: Any) -> str:
    """What a value of the type ``hint`` is, in words, e.g. ``an integer or null``."""
    inner = _optional(hint)
    if inner is not None:
        text = _describe(inner)
        return f"{text.replace(' or ', ', ')} or null" if inner is bool else f"{text} or null"
    if hint is bool:
        return "true or false"
    if hint is int:
        return "an integer"
    if hint is float:
        return "a number"
    if hint is str:
        return "a string"
    if isinstance(hint, type) and issubclass(hint, Enum):
        return f"one of {', '.join(hint.__members__)}"
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is list:
        item = {int: "integers", float: "numbers", str: "strings"}.get(args[0], "values")
        return f"a list of {item}, e.g. [...]" if item == "values" else f"a list of {item}"
    if isinstance(hint, types.UnionType) or origin is typing.Union:
        return " or ".join(_describe(a) for a in args)
    return f"a {getattr(hint, '__name__', hint)}"


def _shown(value: Any) -> str:
    """``value`` as a config file writes it (null, true, 'text', 2)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    return repr(value) if isinstance(value, str) else str(value)


def _first_line(text: str) -> str:
    return next((line.strip() for line in text.splitlines() if line.strip()), text)
