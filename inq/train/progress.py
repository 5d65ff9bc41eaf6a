"""Where a run is and how it is going: :class:`Progress` (what a checkpoint records of it),
:class:`StepTotals` (the sums the logs show) and :class:`Bars` (progress bars and the epoch's
log line with its ETA)."""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any

import torch
from tqdm import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm

__all__ = ["Bars", "Progress", "StepTotals"]

log = logging.getLogger("inq.train")


class StepTotals:
    """Sums over training steps, kept on the device so that a step does not wait for it: the
    loss and the distillation term (each times the batch size), the hits and the samples.

    Example:
        >>> totals = StepTotals(torch.device("cpu"))
        >>> totals.add(torch.tensor(0.5), torch.tensor([[1.0, 0.0], [0.0, 1.0]]),
        ...            torch.tensor([0, 0]), None)
        >>> totals.means()
        {'loss': 0.5, 'acc': 0.5, 'kd_loss': 0.0}
    """

    def __init__(self, device: torch.device, sums: list[float] | None = None) -> None:
        self.sums = torch.tensor(sums or [0.0] * 4, dtype=torch.float64, device=device)

    def add(
        self, loss: torch.Tensor, logits: torch.Tensor, y: torch.Tensor, kd: torch.Tensor | None
    ) -> None:
        n = self.sums.new_tensor(len(y))
        kd_sum = kd.detach().double() * n if kd is not None else self.sums.new_tensor(0.0)
        hits = (logits.argmax(1) == y).sum()
        self.sums += torch.stack([loss.detach().double() * n, hits, n, kd_sum])

    def move_to(self, other: StepTotals) -> None:
        """Add these sums to ``other`` and start again from zero."""
        other.sums += self.sums
        self.sums.zero_()

    @property
    def count(self) -> int:
        return int(self.sums[2])

    def means(self) -> dict[str, float]:
        """The mean loss, accuracy and distillation term (all 0 when empty)."""
        loss, hits, count, kd = self.sums.tolist()
        count = max(count, 1.0)
        return {"loss": loss / count, "acc": hits / count, "kd_loss": kd / count}


@dataclass
class Progress:
    """Where the run is: phase index, epochs done in it, batches done in the epoch, total steps,
    and the sums of the epoch's steps so far (:class:`StepTotals`)."""

    phase: int = 0
    epoch: int = 0
    batch: int = 0
    step: int = 0
    seconds: float = 0.0  # spent in this phase by earlier (killed) processes
    totals: list[float] = field(default_factory=lambda: [0.0] * 4)


class Bars:
    """The run's progress bar (``total`` steps, from ``step`` on), one bar per epoch and the
    epoch's log line; bars only for rank 0 (``main``) with ``show`` and a terminal."""

    def __init__(self, total: int, step: int, main: bool, show: bool) -> None:
        self.quiet = not (main and show and sys.stderr.isatty())
        self.run = tqdm(total=total, initial=step, desc="run", unit="step", disable=self.quiet)
        self._started = time.perf_counter()
        self._last: float | None = None  # when this process's last step ended
        self._timed = (0.0, 0)  # seconds and steps the ETA extrapolates (see step_done)
        self._graphs = 0  # graphs torch.compile had compiled at the last step (see step_done)

    @contextmanager
    def running(self) -> Iterator[None]:
        """In a terminal, log lines print between the bars; the run's bar closes at the end."""
        with logging_redirect_tqdm() if not self.quiet else nullcontext():
            yield
        self.run.close()

    def epoch(self, batches: Iterable[Any], desc: str, total: int, done: int) -> tqdm:
        """``batches`` with a bar ``desc`` of ``total`` (``done`` of them already)."""
        return tqdm(
            batches, desc=desc, total=total, initial=done, disable=self.quiet, leave=False,
            position=1,
        )  # fmt: skip

    def step_done(self, graphs: int = 0) -> None:
        """One step done; ``graphs``: how many graphs torch.compile has compiled in this
        process so far (0 eager): a step that raised it compiled one.

        The ETA extrapolates the time from one step's end to the next's (what happens between
        epochs included), except for this process's first step (warm-up, and its compile) and
        the steps that compiled a graph: that time is spent once, not per step."""
        self.run.update()
        now = time.perf_counter()
        compiled, self._graphs = graphs > self._graphs, graphs
        if self._last is not None and not compiled:
            seconds, steps = self._timed
            self._timed = (seconds + now - self._last, steps + 1)
        self._last = now

    def log_epoch(self, name: str, totals: StepTotals, lr: float, step: int) -> None:
        """The log line of epoch ``name`` (e.g. ``stage1 epoch 2/6``) at run step ``step``,
        with the time this process spent and the time left: the mean time of its timed steps
        (:meth:`step_done`) times the steps left, ``?`` before the first; compile time is not
        extrapolated (it would give hours for a run of minutes)."""
        if not totals.count:  # resumed after the epoch's last batch: nothing trained here
            return
        means = totals.means()
        seconds, left = time.perf_counter() - self._started, self.run.total - step
        timed, steps = self._timed
        log.info(
            "%s: loss %.4f, acc %.2f %%, lr %.3g, elapsed %s, ETA %s",
            name, means["loss"], 100 * means["acc"], lr,
            _clock(seconds), _clock(timed / steps * left) if steps else "?",
        )  # fmt: skip


def _clock(seconds: float) -> str:
    """``m:ss``, or ``h:mm:ss`` from an hour on.

    Example:
        >>> _clock(59.6), _clock(3725)
        ('1:00', '1:02:05')
    """
    minutes, secs = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"
