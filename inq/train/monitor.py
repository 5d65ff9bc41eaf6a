"""TensorBoard logging of a run (rank 0 only): train/val scalars and INQ progress per layer.

Tags: ``train/{loss,acc,lr}``, ``val/{loss,acc,acc_top5}``, ``inq/stage``,
``inq/quantized_fraction`` (total) and ``inq/quantized_fraction/<layer>``,
``inq/quant_error/<layer>`` (mean |w - Q(w)| over the layer's still-float weights) and
``weights/<layer>`` histograms at stage boundaries.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch.utils.tensorboard import SummaryWriter

from inq.levels import select_n1
from inq.pow2 import pow2_quantize
from inq.scheduler import INQScheduler

__all__ = ["Monitor"]


class Monitor:
    """A SummaryWriter that does nothing on ranks other than 0.

    Example:
        >>> import tempfile
        >>> tb = Monitor(Path(tempfile.mkdtemp()), enabled=True)
        >>> tb.scalars(0, {"train/loss": 2.3})
        >>> tb.close()
    """

    def __init__(self, log_dir: Path, enabled: bool, purge_step: int | None = None) -> None:
        # purge_step drops events a killed run wrote after its last checkpoint
        self.writer = SummaryWriter(str(log_dir), purge_step=purge_step) if enabled else None

    def scalars(self, step: int, values: dict[str, float]) -> None:
        """Log each ``tag: value`` at ``step``."""
        if self.writer:
            for tag, value in values.items():
                self.writer.add_scalar(tag, value, step)

    @torch.no_grad()
    def inq_state(self, step: int, scheduler: INQScheduler, histograms: bool) -> None:
        """Stage, quantized fractions, quantization error of the float weights (per layer)."""
        if not self.writer:
            return
        fractions = scheduler.quantized_fraction(per_layer=True)
        self.writer.add_scalar("inq/stage", scheduler.stage, step)
        self.writer.add_scalar("inq/quantized_fraction", scheduler.quantized_fraction(), step)
        for layer in scheduler.layers:
            self.writer.add_scalar(
                f"inq/quantized_fraction/{layer.name}", fractions[layer.name], step
            )
            weight = layer.weight.detach()
            free = ~layer.mask.to(weight.device)
            if bool(free.any()):
                n1 = layer.n1
                if n1 is None:
                    n1 = select_n1(weight, scheduler.bits, scheduler.n1_rule, scheduler.granularity)
                error = (weight - pow2_quantize(weight, n1, scheduler.bits))[free].abs().mean()
                self.writer.add_scalar(f"inq/quant_error/{layer.name}", error.item(), step)
            if histograms:
                self.writer.add_histogram(f"weights/{layer.name}", weight.float().cpu(), step)

    def close(self) -> None:
        """Flush and close the event file."""
        if self.writer:
            self.writer.close()
