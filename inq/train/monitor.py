"""TensorBoard logging of a run (rank 0 only): train/val scalars and INQ progress per layer.

Tags: ``train/{loss,acc,lr}`` (and ``train/kd_loss``, the distillation term, when
``inq.distill.weight`` > 0), ``val/{loss,acc,acc_top5}``, ``inq/stage``,
``inq/quantized_fraction`` (total) and ``inq/quantized_fraction/<layer>``, with pruning
``prune/sparsity`` and ``prune/sparsity/<layer>`` (the pruned fractions),
``inq/quant_error/<layer>`` (mean |w - Q(w)| over the layer's still-float weights) and
``weights/<layer>`` histograms at stage boundaries; with ``inq.bits=auto``, ``inq/auto/*`` (the
allocation: its table as text, a bar chart of the bits, the average bits and bytes).

Events reach the event file only when a checkpoint is saved (:meth:`Monitor.commit`), so the file
is a function of the checkpoints: a resumed run purges whatever a killed process wrote at or
after its checkpoint's step and replays the events of that step, which the checkpoint carries
(what :meth:`Monitor.commit` returned, given back as ``pending``). Nothing is lost and no point
appears twice, wherever the kill fell; a tag logged twice at one step keeps its last value.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import torch
from tensorboard.summary.writer.event_file_writer import _AsyncWriterThread
from torch.utils.tensorboard import SummaryWriter

from inq.pow2 import pow2_quantize
from inq.scheduler import INQScheduler

__all__ = ["Monitor"]


Event = tuple[str, str, Any, int]  # (kind: "scalar" | "histogram" | "text" | "image", tag, value,
# step); an image is a uint8 tensor [H, W, 3]


class Monitor:
    """A SummaryWriter that does nothing on ranks other than 0 and writes at checkpoints.

    ``resume_step`` and ``pending`` come from the checkpoint a run resumes from.

    Example:
        >>> import tempfile
        >>> tb = Monitor(Path(tempfile.mkdtemp()), enabled=True)
        >>> tb.scalars(0, {"train/loss": 2.3})
        >>> tb.scalars(1, {"train/loss": 2.1})
        >>> tb.commit(step=1)  # writes the step-0 point; the step-1 one goes in the checkpoint
        [('scalar', 'train/loss', 2.1, 1)]
        >>> tb.close()
    """

    def __init__(
        self,
        log_dir: Path,
        enabled: bool,
        resume_step: int | None = None,
        pending: list[Event] | None = None,
    ) -> None:
        self.writer = SummaryWriter(str(log_dir), purge_step=resume_step) if enabled else None
        if threading.excepthook is not _quiet_writer_thread:
            threading.excepthook = _quiet_writer_thread
        self.buffer: list[Event] = list(pending or []) if enabled else []

    def scalars(self, step: int, values: dict[str, float]) -> None:
        """Log each ``tag: value`` at ``step`` (replacing a value logged for it at ``step``)."""
        self._add([("scalar", tag, float(value), step) for tag, value in values.items()])

    def text(self, step: int, tag: str, text: str) -> None:
        """Log ``text`` (markdown) under ``tag`` at ``step``."""
        self._add([("text", tag, text, step)])

    def image(self, step: int, tag: str, image: torch.Tensor) -> None:
        """Log an RGB ``image`` (``uint8 [H, W, 3]``) under ``tag`` at ``step``."""
        self._add([("image", tag, image, step)])

    def _add(self, events: list[Event]) -> None:
        """Buffer ``events``; the last one logged for a tag at a step is the one kept (at a
        stage boundary, the end-of-stage state and the next stage's start share a step)."""
        if not self.writer:
            return
        new = {(kind, tag, step) for kind, tag, _, step in events}
        self.buffer = [e for e in self.buffer if (e[0], e[1], e[3]) not in new] + events

    def commit(self, step: int) -> list[Event]:
        """Write every event before ``step`` (call before saving the checkpoint of ``step``);
        returns the events at ``step``, which that checkpoint must carry."""
        self._write([e for e in self.buffer if e[3] < step])
        self.buffer = [e for e in self.buffer if e[3] >= step]
        return list(self.buffer)

    def _write(self, events: list[Event]) -> None:
        """Write ``events`` to the event file. A failed write (disk full) raises here as the
        OSError it is, naming ``tb/``; TensorBoard's writer thread, where it happened, stays
        quiet (:func:`_quiet_writer_thread`)."""
        if not (self.writer and events):
            return
        try:
            for kind, tag, value, step in events:
                if kind == "scalar":
                    self.writer.add_scalar(tag, value, step)
                elif kind == "text":
                    self.writer.add_text(tag, value, step)
                elif kind == "image":
                    self.writer.add_image(tag, value, step, dataformats="HWC")
                else:
                    self.writer.add_histogram(tag, value, step)
            self.writer.flush()
        except OSError as err:
            err.filename = err.filename or self.writer.get_logdir()
            raise

    @torch.no_grad()
    def inq_state(self, step: int, scheduler: INQScheduler, histograms: bool) -> None:
        """Stage, quantized fractions, quantization error of the float weights (per layer)."""
        if not self.writer:
            return
        fractions = scheduler.quantized_fraction(per_layer=True)
        values = {
            "inq/stage": scheduler.stage,
            "inq/quantized_fraction": scheduler.quantized_fraction(),
        }
        values.update({f"inq/quantized_fraction/{k}": v for k, v in fractions.items()})
        pruned_total = scheduler.pruned_fraction()
        if pruned_total:
            values["prune/sparsity"] = pruned_total
            pruned = scheduler.pruned_fraction(per_layer=True)
            values.update({f"prune/sparsity/{k}": v for k, v in pruned.items()})
        for layer in scheduler.layers:
            weight = layer.weight.detach()
            free = ~layer.mask.to(weight.device)
            if bool(free.any()):
                n1 = scheduler.current_n1(layer)  # before a stage: what one would choose
                error = (weight - pow2_quantize(weight, n1, layer.bits))[free].abs().mean()
                values[f"inq/quant_error/{layer.name}"] = error.item()
            if histograms:
                copy = weight.to("cpu", torch.float32, copy=True)  # the weights train on
                self._add([("histogram", f"weights/{layer.name}", copy, step)])
        self.scalars(step, values)

    def close(self, finished: bool = True) -> None:
        """Write every event and close the event file; for a run that stops before it is
        ``finished`` (Ctrl-C, SIGTERM, an error), only the events its checkpoints covered,
        written already: its resumed run logs the rest again from the last checkpoint, so
        TensorBoard never has to purge a point (and warn that it did)."""
        if self.writer:
            if finished:
                self._write(self.buffer)
            self.buffer = []
            self.writer.close()


_print_thread_error = threading.excepthook


def _quiet_writer_thread(args: threading.ExceptHookArgs) -> None:
    """``threading.excepthook``: an OSError in TensorBoard's writer thread prints nothing (the
    writer raises it again in the main thread at its next write or flush, where the run stops
    with one message); every other error in a thread prints as before."""
    quiet = isinstance(args.thread, _AsyncWriterThread) and issubclass(args.exc_type, OSError)
    if not quiet:
        _print_thread_error(args)
