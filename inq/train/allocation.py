"""``inq.bits=auto``: each layer's bits chosen once, after the float phase and before anything
quantizes or prunes, by :func:`inq.allocate.allocate` under ``inq.budget`` (``inq.auto``: the
choices, the sensitivity method, the size unit, the calibration batches).

The sensitivities are measured on ``inq.auto.batches`` batches of training images as
evaluation sees them (:func:`inq.data.calibration_loader`, drawn by ``trainer.seed``: the same
after a resume), with the training loss (cross-entropy); rank 0's allocation is every rank's.
The scheduler is then rebuilt with every layer at its bits (nothing was quantized yet), and the
allocation is recorded in the run's history (``history["allocate"]``), which the checkpoint
saved right after it holds: a run killed before that save measures again from the float
checkpoint and chooses the same bits (the measurement is deterministic on the same device and
``data.eval_batch_size``: a resume before the bits are chosen may not change the batch size,
and warns when it changes the device), one killed after reads them back
(:func:`inq.train.build.build_scheduler`). ``summary.json`` records it under
``allocation``; the log shows its table, TensorBoard ``inq/auto/*``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

import torch
from torch.nn.functional import cross_entropy

from inq.allocate import Allocation, BudgetError, MethodError, allocate
from inq.data import calibration_loader
from inq.errors import ConfigError
from inq.train import checkpoint as ckpt
from inq.train.build import allocation_options, budget_error, build_scheduler
from inq.train.config import AUTO
from inq.train.distributed import share
from inq.train.loop import Trainer
from inq.train.phases import ALLOCATE

__all__ = ["allocation_phase", "bar_chart", "markdown_table"]

log = logging.getLogger("inq.train")


def allocation_phase(trainer: Trainer) -> None:
    """Choose every layer's bits (``inq.bits=auto``), unless the run has already (or has
    ``inq.bits`` set): measure, solve, rebuild the scheduler, record, show, save.

    Raises:
        ConfigError: naming ``inq.auto.method`` if the method cannot run on the model, or the
            budget key if no allocation meets it.
    """
    cfg = trainer.cfg
    if cfg.inq.bits != AUTO or ALLOCATE in trainer.history:
        return
    inq, start = cfg.inq, time.perf_counter()
    batches = calibration_loader(trainer.data, inq.auto.batches, cfg.trainer.seed)
    options = allocation_options(cfg)
    try:
        allocation = allocate(
            trainer.model,
            cross_entropy,
            batches,
            method=inq.auto.method.name,
            n1_rule=inq.n1_rule.name,
            granularity=inq.granularity.name,
            samples=inq.auto.samples,
            seed=cfg.trainer.seed,
            **options,
        )
    except BudgetError as err:  # build_scheduler checked the budget already: not reached
        raise budget_error(cfg, err) from None
    except MethodError as err:  # check_auto_method tried one example at the start
        raise ConfigError("inq.auto.method", str(err)) from None
    except ValueError as err:  # a loss that is not finite: the model's, not the method's
        raise ConfigError("inq.bits", f"auto cannot measure the model: {err}") from None
    record: dict[str, Any] = share(allocation.as_dict())  # rank 0's on every rank
    ckpt.kill_point("allocate", 1)
    _use_bits(trainer, record)
    trainer.history[ALLOCATE] = record
    trainer.timings[ALLOCATE] = time.perf_counter() - start
    _show(trainer, Allocation.from_dict(record), trainer.timings[ALLOCATE])
    trainer.save()
    ckpt.kill_point("allocate", 2)


def _use_bits(trainer: Trainer, record: dict[str, Any]) -> None:
    """Rebuild the trainer's scheduler (still at stage 0: nothing frozen) with the allocated
    bits; an optimizer kept across phases (``inq.reset_optimizer=false``) follows it."""
    old = trainer.sched
    trainer.sched = build_scheduler(trainer.model, trainer.cfg, {"history": {ALLOCATE: record}})
    old.remove_hooks()
    optimizer = trainer._optimizer  # the float phase's, when the next phase keeps it
    if optimizer is not None and trainer._params == "all":
        trainer.sched.attach(optimizer)


def _show(trainer: Trainer, allocation: Allocation, seconds: float) -> None:
    """The table in the log; text, bar chart and sizes in TensorBoard."""
    log.info(
        "bits chosen (inq.bits=auto, %s sensitivity, %s sizes, %.1f s): %.3f average bits, "
        "%d bytes of a %d-byte budget\n%s",
        allocation.method, allocation.size, seconds, allocation.avg_bits,
        allocation.total_bytes, allocation.budget_bytes, allocation.table(),
    )  # fmt: skip
    step, tb = trainer.progress.step, trainer.tb
    tb.text(step, "inq/auto/table", markdown_table(allocation))
    rows = allocation.layers
    tb.image(step, "inq/auto/bits", bar_chart([r.bits for r in rows], [r.pinned for r in rows]))
    tb.scalars(
        step,
        {
            "inq/auto/avg_bits": allocation.avg_bits,
            "inq/auto/bytes": allocation.total_bytes,
            "inq/auto/budget_bytes": allocation.budget_bytes,
            "inq/auto/seconds": seconds,
        },
    )


def markdown_table(allocation: Allocation) -> str:
    """The allocation as a markdown table (TensorBoard's text tab renders it).

    Example:
        >>> from inq.allocate import LayerAllocation
        >>> row = LayerAllocation("fc", (4, 8), {2: 0.5, 4: 0.125}, 4, False, 16)
        >>> print(markdown_table(Allocation("loss", "packed", (2, 4), 16, (row,))))
        | layer | weights | 2 bits | 4 bits | chosen | bytes |
        |---|---|---|---|---|---|
        | fc | 32 | 0.5 | 0.125 | 4 | 16 |
        | total | 32 |  |  | 4.000 avg | 16 of 16 |
    """
    choices = allocation.choices
    lines = [
        "| layer | weights | " + " | ".join(f"{b} bits" for b in choices) + " | chosen | bytes |",
        "|---" * (len(choices) + 4) + "|",
    ]
    for r in allocation.layers:
        cells = " | ".join(
            f"{r.sensitivity[b]:.4g}" if b in r.sensitivity else "-" for b in choices
        )
        bits = f"{r.bits} (pinned)" if r.pinned else str(r.bits)
        lines.append(f"| {r.name} | {r.params} | {cells} | {bits} | {r.nbytes} |")
    blank = " | ".join("" for _ in choices)
    lines.append(
        f"| total | {allocation.params} | {blank} | {allocation.avg_bits:.3f} avg | "
        f"{allocation.total_bytes} of {allocation.budget_bytes} |"
    )
    return "\n".join(lines)


def bar_chart(bits: Sequence[int], pinned: Sequence[bool], unit: int = 12) -> torch.Tensor:
    """A bar chart of each layer's bits, in module order, as an RGB ``uint8 [H, W, 3]`` image:
    one bar a layer, ``unit`` pixels a bit (grey lines at every bit up to 8), blue where
    chosen, orange where pinned.

    Example:
        >>> image = bar_chart([2, 8, 4], [False, True, False])
        >>> tuple(image.shape), image.dtype
        ((100, 64, 3), torch.uint8)
        >>> image[-1, 4].tolist(), image[-1, 24].tolist()  # bottom row: bar 1, bar 2
        ([31, 119, 180], [255, 127, 14])
    """
    width, gap, margin = 16, 4, 4
    height = 8 * unit + margin
    image = torch.full((height, gap + len(bits) * (width + gap), 3), 255, dtype=torch.uint8)
    for level in range(1, 9):
        image[height - level * unit - 1, :] = 220
    for i, (b, fixed) in enumerate(zip(bits, pinned, strict=True)):
        left = gap + i * (width + gap)
        colour = torch.tensor([255, 127, 14] if fixed else [31, 119, 180], dtype=torch.uint8)
        image[height - b * unit :, left : left + width] = colour
    return image
