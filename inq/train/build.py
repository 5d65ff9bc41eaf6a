"""What a run is made of, built from its config: the model, the INQ scheduler, the pruning
targets, the optimizer over the phase's parameters and the phase's LR schedule.

Each factory turns a value the library refuses into a :class:`~inq.errors.ConfigError` naming
the config key to fix.
"""

from __future__ import annotations

import contextlib
import glob
import math
import random
from collections import Counter
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import torch
from hydra.utils import instantiate
from torch import nn
from torch.nn.functional import cross_entropy
from torch.optim.lr_scheduler import LambdaLR
from torch.utils.data import DataLoader, Dataset

from inq import models
from inq.allocate import BudgetError, MethodError, check_budget, check_method
from inq.data import build_datasets, build_eval_loader, build_train_loader
from inq.errors import ConfigError
from inq.prune import layer_targets
from inq.quant.lower import IntegerModelError, check_expressible
from inq.quant.pipeline import trainable
from inq.scheduler import INQScheduler, TargetError
from inq.train import checkpoint as ckpt
from inq.train.config import AUTO, Config, LRConfig, Method, OptimConfig, PruneConfig
from inq.train.distributed import Dist
from inq.train.phases import ALLOCATE

__all__ = [
    "NORM_TYPES",
    "allocation_of",
    "allocation_options",
    "bias_norm_parameters",
    "budget_error",
    "build_loaders",
    "build_lr_schedule",
    "build_model",
    "build_optimizer",
    "build_scheduler",
    "check_amp",
    "check_auto_method",
    "compile_errors",
    "compiled",
    "compiled_graphs",
    "prune_targets",
    "seed_everything",
]

NORM_TYPES = (
    nn.modules.batchnorm._BatchNorm,
    nn.GroupNorm,
    nn.LayerNorm,
    nn.modules.instancenorm._InstanceNorm,
)


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
    optim_cfg: OptimConfig, model: nn.Module, params: str, lr: float
) -> torch.optim.Optimizer:
    """Instantiate ``optim`` (its ``_target_``) over all parameters (``params="all"``) or
    biases/norms only (``"bias_norm"``); for the integer phase's fake-quantized model
    (``"quant"``), Adam over what it trains (:func:`inq.quant.pipeline.trainable`)."""
    if params == "quant":
        return torch.optim.Adam(trainable(model), lr=lr)
    chosen = list(model.parameters()) if params == "all" else bias_norm_parameters(model)
    optimizer: torch.optim.Optimizer = instantiate(optim_cfg, params=chosen, lr=lr)
    return optimizer


def build_lr_schedule(
    lr_cfg: LRConfig, optimizer: torch.optim.Optimizer, epochs: int, steps_per_epoch: int
) -> LambdaLR:
    """Per-step schedule over one phase: optional linear warmup, then constant/cosine/step.

    Example:
        >>> from inq.train.config import Schedule
        >>> opt = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=1.0)
        >>> cfg = LRConfig(name=Schedule.step, milestones=[0.5], gamma=0.1)
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
    name = lr_cfg.name.name

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


def check_amp(cfg: Config, device: torch.device) -> None:
    """Refuse float16 ``trainer.amp`` off a CUDA device, and bf16 on a GPU without bfloat16.

    Raises:
        ConfigError: naming ``trainer.amp``.
    """
    dtype = cfg.trainer.amp_dtype
    if dtype == torch.float16 and device.type != "cuda":
        raise ConfigError(
            "trainer.amp",
            f"float16 autocast runs on a CUDA GPU only; this run is on {device} (bf16 runs here)",
        )
    if dtype == torch.bfloat16 and device.type == "cuda" and not torch.cuda.is_bf16_supported():
        raise ConfigError(
            "trainer.amp",
            f"{torch.cuda.get_device_name(device)} has no bfloat16; use trainer.amp=fp16",
        )


# torch.compile's backend (a test seam: a backend that fails stands for a model torch cannot
# compile)
COMPILE_BACKEND: Any = "inductor"


def compiled(cfg: Config, net: nn.Module) -> nn.Module:
    """``net`` under ``torch.compile`` if ``trainer.compile`` asks for it (compiling happens at
    its first call: :func:`compile_errors` names the key when that fails), else ``net``.

    DDP wraps the compiled model, not the other way round: dynamo skips DDP's own forward, so a
    compiled DDP module would run eagerly.

    Shapes are static (``dynamic=False``): each batch shape gets its own graph (two when the
    epoch's last batch is smaller), so the kernels a step runs are a function of its shape alone.
    Dynamo's default instead recompiles at the second shape into a dynamic-shape graph that then
    serves every shape, the full batches included: a resumed process, which starts on the
    static graph again, would run other kernels (other bf16 roundings) than the uninterrupted
    run for the rest of its first epoch, and end on other weights."""
    if not cfg.trainer.compile:
        return net
    compiled_net: nn.Module = torch.compile(  # type: ignore[assignment]
        net, backend=COMPILE_BACKEND, dynamic=False
    )
    return compiled_net


@contextlib.contextmanager
def compile_errors(cfg: Config) -> Iterator[None]:
    """Turn an error torch.compile raises (at a compiled model's first call, or a recompile) into
    one :class:`ConfigError` naming ``trainer.compile``; other errors pass unchanged."""
    from torch._dynamo.exc import TorchDynamoException  # inductor's errors derive from it

    try:
        yield
    except TorchDynamoException as err:
        if not cfg.trainer.compile:
            raise
        lines = [line.strip() for line in str(err).splitlines() if line.strip()]
        why = " ".join(lines[:2]) or type(err).__name__  # e.g. "backend='x' raised: Error: ..."
        raise ConfigError(
            "trainer.compile",
            f"torch.compile cannot compile {cfg.model.name}: {why}; run without it",
        ) from None


def compiled_graphs() -> int:
    """The graphs torch.compile has compiled in this process so far."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def build_loaders(
    data: dict[str, Any], seed: int, env: Dist
) -> tuple[DataLoader[Any], DataLoader[Any], Dataset[Any]]:
    """The training loader (shuffled by ``seed``) and the validation loader of the data config
    ``data``, each rank of ``env`` on its own shard, and the whole validation set."""
    train_set, val_set = build_datasets(data)
    train = build_train_loader(data, train_set, seed, env.rank, env.world_size)
    return train, build_eval_loader(data, val_set, env.rank, env.world_size), val_set


def build_model(
    cfg: Config, model_info: dict[str, Any], device: torch.device, fresh: bool
) -> nn.Module:
    """The model, refused early if ``quant.act_bits`` asks for an integer form it has not;
    a ``fresh`` run (not a resumed one) starts from ``model.checkpoint`` if there is one."""
    model = models.build_model(model_info).to(device)
    if cfg.trainer.channels_last:  # before the scheduler, whose codes take the weights' layout
        model = model.to(memory_format=torch.channels_last)
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


def build_scheduler(
    model: nn.Module,
    cfg: Config,
    saved: Mapping[str, Any] | None = None,
    examples: Dataset[Any] | None = None,
) -> INQScheduler:
    """The INQ scheduler of ``inq.*`` (one stage for the baselines) over ``model``'s targets.

    With ``inq.bits=auto``, every layer at the bits the run allocated (the ``allocate`` record
    of ``saved``'s history, :mod:`inq.train.allocation`); before that, the budget checked (and
    with ``examples``, the method: :func:`check_auto_method`) and the layers
    ``inq.layer_bits`` pins at their bits, the others at the largest choice.

    Raises:
        ConfigError: the target layers ``inq.include``, ``inq.exclude`` or ``inq.layer_bits``
            name do not fit the model (``model.name``: it has no layer to quantize), or no
            allocation meets ``inq.budget``.
    """
    inq = cfg.inq
    record = allocation_of(saved)
    try:
        bits, layer_bits = _scheduler_bits(model, cfg, record)
        if examples is not None and record is None and inq.bits == AUTO:
            check_auto_method(cfg, model, examples)
        return INQScheduler(
            model,
            bits=bits,
            portions=inq.portions if inq.method == Method.inq else (1.0,),
            strategy=inq.strategy.name,
            seed=cfg.trainer.seed,
            include=inq.include,
            exclude=inq.exclude,
            n1_rule=inq.n1_rule.name,
            granularity=inq.granularity.name,
            layer_bits=layer_bits,
            cache_values=_on_cuda(model) if inq.cache_values is None else inq.cache_values,
        )
    except TargetError as err:
        key = "model.name" if err.argument == "model" else f"inq.{err.argument}"
        raise ConfigError(key, str(err)) from None
    except BudgetError as err:
        raise budget_error(cfg, err) from None


def allocation_of(saved: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The ``inq.bits=auto`` allocation a checkpoint ``saved`` records (None: not made yet)."""
    record: dict[str, Any] | None = (saved or {}).get("history", {}).get(ALLOCATE)
    return record


def budget_error(cfg: Config, err: BudgetError) -> ConfigError:
    """``err`` as the one-line error of the key it concerns: ``inq.layer_bits`` for pinned
    layers over the budget, else the budget key given."""
    budget = "avg_bits" if cfg.inq.budget.avg_bits is not None else "bytes"
    key = "inq.layer_bits" if err.argument == "pinned" else f"inq.budget.{budget}"
    return ConfigError(key, str(err))


_CHECK_OPTIONS = ("pinned", "include", "exclude")  # check_method's of allocation_options


def check_auto_method(cfg: Config, model: nn.Module, examples: Dataset[Any]) -> None:
    """For ``inq.bits=auto`` with no allocation yet, refuse now, before the float phase
    writes anything, an ``inq.auto.method`` the allocation could not run on ``model`` (the
    Hessian's needs it differentiable twice): :func:`inq.allocate.check_method` on the first
    of ``examples`` (the whole validation set, the same example on every rank: no loader, no
    random draw).

    Raises:
        ConfigError: naming ``inq.auto.method``.
    """
    method = cfg.inq.auto.method.name
    if method == "loss":  # forward passes only: training would fail first
        return
    image, label = examples[0]
    batch = (image.unsqueeze(0), torch.as_tensor([label]))
    options = {k: v for k, v in allocation_options(cfg).items() if k in _CHECK_OPTIONS}
    try:
        check_method(model, cross_entropy, batch, method, **options)
    except MethodError as err:
        raise ConfigError("inq.auto.method", f"{err}; the loss method runs forward only") from None


def allocation_options(cfg: Config) -> dict[str, Any]:
    """The keyword arguments of :func:`inq.allocate.allocate` that ``inq.*`` sets (all but the
    sensitivity's: ``method``, ``samples``, ``seed``, the level-set options).

    Example:
        >>> from inq.train.config import INQConfig
        >>> inq = INQConfig(bits="auto", layer_bits=["fc:8"])
        >>> inq.budget.avg_bits = 4.5
        >>> allocation_options(Config(inq=inq))["pinned"]
        {'fc': 8}
    """
    inq = cfg.inq
    return {
        "avg_bits": inq.budget.avg_bits,
        "max_bytes": inq.budget.bytes,
        "choices": tuple(inq.auto.choices),
        "pinned": inq.bits_by_glob,
        "include": inq.include,
        "exclude": inq.exclude,
        "size": inq.auto.size.name,
    }


def _scheduler_bits(
    model: nn.Module, cfg: Config, record: Mapping[str, Any] | None
) -> tuple[int, dict[str, int]]:
    """The scheduler's ``bits`` and ``layer_bits``: the config's; with ``inq.bits=auto``, the
    allocation ``record``'s (each layer by its name, the default the bits most weights got), or
    before it, the largest choice and the pinned layers'."""
    inq = cfg.inq
    if inq.bits != AUTO:
        return int(inq.bits), inq.bits_by_glob
    if record is None:
        check_budget(model, **allocation_options(cfg))
        return max(inq.auto.choices), inq.bits_by_glob
    weights: Counter[int] = Counter()
    for row in record["layers"]:
        weights[int(row["bits"])] += int(row["params"])
    default = min(weights, key=lambda bits: (-weights[bits], bits))
    return default, {glob.escape(row["name"]): int(row["bits"]) for row in record["layers"]}


def _on_cuda(model: nn.Module) -> bool:
    return any(p.is_cuda for p in model.parameters())


def prune_targets(sched: INQScheduler, prune: PruneConfig) -> dict[str, float]:
    """Each target layer's final sparsity (``prune.sparsity``, ``prune.layers``).

    Raises:
        ConfigError: naming ``prune.layers`` if a glob fits no target layer.
    """
    try:
        names = [layer.name for layer in sched.layers]
        return layer_targets(names, prune.sparsity, prune.sparsity_by_glob)
    except ValueError as err:
        raise ConfigError("prune.layers", str(err)) from None


def seed_everything(seed: int) -> None:
    """Seed Python's, NumPy's and torch's generators: a run's start is a function of its seed."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
