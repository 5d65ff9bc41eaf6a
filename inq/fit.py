"""One training step, the package's only one: ``inq-train``'s Trainer (every phase, the integer
phase's fine-tuning included) and :func:`inq.quant.pipeline.quantize`'s fine-tuning both take
their optimizer steps here.

The step: forward (in float16 or bfloat16 autocast with ``amp``), the loss (cross-entropy, or with
:class:`Distill` the distillation loss of :mod:`inq.distill`), backward through the grad scaler,
optional gradient clipping, the optimizer step (where an attached
:class:`~inq.scheduler.INQScheduler` writes the frozen weights back) and the scaler's update.

Example, in a loop of one's own::

    for x, y in loader:
        loss, logits, kd = fit_step(model, optimizer, x, y)
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from inq.distill import blend, kd_loss

__all__ = ["Distill", "fit_step"]


@dataclass(frozen=True)
class Distill:
    """Distillation from ``teacher`` (a frozen model taking the same input, e.g.
    :func:`inq.distill.frozen_teacher` of the float model): :func:`inq.distill.distill_loss`
    with ``weight`` in [0, 1] and ``temperature`` > 0 (``weight`` 0: cross-entropy, bit for bit).

    Raises:
        ValueError: a weight outside [0, 1] or a temperature not > 0.
    """

    teacher: nn.Module
    weight: float
    temperature: float

    def __post_init__(self) -> None:
        if not (0.0 <= self.weight <= 1.0 and self.temperature > 0):
            raise ValueError(
                "the distillation weight must lie in [0, 1] and the temperature be > 0, got "
                f"{self.weight} and {self.temperature}"
            )


def fit_step(
    net: nn.Module,
    optimizer: torch.optim.Optimizer,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    distill: Distill | None = None,
    scaler: torch.amp.GradScaler | None = None,
    amp: bool | torch.dtype = False,
    grad_clip: tuple[Iterable[nn.Parameter], float] | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """One optimizer step of ``net`` on the batch ``(x, y)``; returns the loss, the logits and,
    when distilling, the distillation term (:func:`inq.distill.kd_loss`; else None).

    ``amp`` is the autocast dtype (``True``: float16; ``False``: none); ``scaler`` scales the
    loss (float16 ``amp``; None: no scaling; bfloat16 needs none); ``grad_clip`` is
    ``(parameters, max global norm)``. The teacher is not wrapped in DDP: it needs no
    communication between processes.

    Example:
        >>> net = nn.Linear(3, 2)
        >>> optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
        >>> loss, logits, kd = fit_step(net, optimizer, torch.ones(4, 3), torch.zeros(4).long())
        >>> tuple(logits.shape), kd is None
        ((4, 2), True)
    """
    kd = None
    dtype = torch.float16 if isinstance(amp, bool) else amp
    with torch.autocast(x.device.type, dtype, enabled=amp is not False):
        logits = net(x)
        if distill is None or distill.weight == 0:
            loss = F.cross_entropy(logits, y)
        else:
            with torch.no_grad():
                teacher_logits = distill.teacher(x)
            kd = kd_loss(logits, teacher_logits, distill.temperature)
            loss = blend(logits, y, kd, distill.weight)  # distill_loss, keeping the kd term
    optimizer.zero_grad(set_to_none=True)
    scaler = scaler or torch.amp.GradScaler(x.device.type, enabled=False)
    torch.autograd.backward(scaler.scale(loss))
    if grad_clip is not None:
        scaler.unscale_(optimizer)
        nn.utils.clip_grad_norm_(grad_clip[0], grad_clip[1])
    scaler.step(optimizer)
    scaler.update()
    return loss, logits, kd
