"""The phase plan of a run: which blocks of epochs it trains, in order, at which lr.

A run is a list of phases: ``float`` (pretraining; 0 epochs when ``model.checkpoint`` is given),
with pruning (``prune.sparsity`` or ``prune.layers``) ``prune1`` .. ``pruneR`` (one per round),
``stage1`` .. ``stageK`` (one per INQ portion) and, if ``inq.final_epochs`` > 0, ``bias_norm``.
The baselines (``inq.method``) replace the stages by one phase: ``oneshot`` (0 epochs) or
``ste`` (as many epochs as the INQ stages and ``bias_norm`` together). Every phase gets a fresh
LR schedule (:mod:`inq.train.loop`).
"""

from __future__ import annotations

from dataclasses import dataclass

from inq.train.config import Config, Method

__all__ = ["ALLOCATE", "INTEGER", "Phase", "integer_phase", "plan_phases"]

INTEGER = "integer"  # the integer model's phase, after the weight phases and the exports
# inq.bits=auto: the per-layer bits chosen after the float phase (inq.train.allocation); its
# record in a run's history and summary, not a phase of epochs
ALLOCATE = "allocate"


@dataclass(frozen=True)
class Phase:
    """One block of epochs: its name, INQ stage (0 = float), epochs, base lr, trained params and
    pruning round (0 = none)."""

    name: str
    stage: int
    epochs: int
    lr: float
    params: str  # "all", "bias_norm" or "quant" (the integer phase's)
    prune: int = 0


def plan_phases(cfg: Config) -> list[Phase]:
    """The phases of a run, in order.

    Example:
        >>> from inq.train.config import INQConfig, PruneConfig, SGDConfig, TrainerConfig
        >>> cfg = Config(optim=SGDConfig(lr=0.1), trainer=TrainerConfig(float_epochs=3),
        ...              inq=INQConfig(portions=[0.5, 1.0], epochs=2, lr=0.01, final_epochs=1))
        >>> [(p.name, p.epochs, p.lr) for p in plan_phases(cfg)]
        [('float', 3, 0.1), ('stage1', 2, 0.01), ('stage2', 2, 0.01), ('bias_norm', 1, 0.01)]
        >>> cfg.inq.method = Method.ste
        >>> [(p.name, p.stage, p.epochs) for p in plan_phases(cfg)]
        [('float', 0, 3), ('ste', 1, 5)]
        >>> cfg.prune = PruneConfig(sparsity=0.9, steps=2, epochs=1)
        >>> [(p.name, p.prune, p.epochs) for p in plan_phases(cfg)][:3]
        [('float', 0, 3), ('prune1', 1, 1), ('prune2', 2, 1)]
    """
    float_epochs = 0 if cfg.model.checkpoint else cfg.trainer.float_epochs
    lr = cfg.inq.lr if cfg.inq.lr is not None else cfg.optim.lr
    phases = [Phase("float", 0, float_epochs, cfg.optim.lr, "all")]
    if cfg.prune.active:
        prune_lr = cfg.prune.lr if cfg.prune.lr is not None else lr
        phases += [
            Phase(f"prune{r}", 0, cfg.prune.epochs, prune_lr, "all", prune=r)
            for r in range(1, cfg.prune.steps + 1)
        ]
    stages = len(cfg.inq.portions)
    if cfg.inq.method == Method.oneshot:
        return [*phases, Phase("oneshot", 1, 0, lr, "all")]
    if cfg.inq.method == Method.ste:
        return [*phases, Phase("ste", 1, stages * cfg.inq.epochs + cfg.inq.final_epochs, lr, "all")]
    phases += [Phase(f"stage{k}", k, cfg.inq.epochs, lr, "all") for k in range(1, stages + 1)]
    if cfg.inq.final_epochs:
        phases.append(Phase("bias_norm", stages, cfg.inq.final_epochs, lr, "bias_norm"))
    return phases


def integer_phase(cfg: Config) -> Phase | None:
    """The integer phase (``quant.act_bits``): calibration, then ``quant.epochs`` of fine-tuning
    the fake-quantized model at ``quant.lr``; None without ``quant.act_bits``.

    Example:
        >>> from inq.quant.pipeline import QuantSettings
        >>> from inq.train.config import INQConfig, SGDConfig
        >>> cfg = Config(optim=SGDConfig(), inq=INQConfig(portions=[1.0]),
        ...              quant=QuantSettings(act_bits=8, epochs=3, lr=0.001))
        >>> integer_phase(cfg)
        Phase(name='integer', stage=1, epochs=3, lr=0.001, params='quant', prune=0)
    """
    q = cfg.quant
    if q.act_bits is None:
        return None
    return Phase(INTEGER, plan_phases(cfg)[-1].stage, q.epochs, q.lr, "quant")
