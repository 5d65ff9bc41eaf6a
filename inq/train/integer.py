"""The integer phase of ``inq-train`` (``quant.act_bits``): the run's packed model calibrated,
its fake-quantized form fine-tuned by the Trainer like any phase (so it resumes from its middle),
lowered to ``model.int.safetensors`` and evaluated by every rank from that file.

The steps are :mod:`inq.quant.pipeline`'s (:func:`~inq.quant.pipeline.lowering_of`, calibration
on :func:`inq.data.calibration_loader`, :func:`~inq.quant.pipeline.trainable`,
:func:`~inq.quant.pipeline.lowered`); only the training loop is the Trainer's.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from inq.data import calibration_loader
from inq.errors import ConfigError
from inq.evaluation import evaluate
from inq.packed import PackedFile, load_packed
from inq.quant.integer import load_integer, save_integer
from inq.quant.lower import Lowering
from inq.quant.pipeline import (
    QuantSettings,
    RealOutput,
    SymmetricLossError,
    calibrate,
    lowered,
    lowering_of,
    scale_values,
)
from inq.runfiles import INTEGER, PACKED
from inq.train import checkpoint as ckpt
from inq.train.distributed import share
from inq.train.loop import Trainer

__all__ = ["integer_phase"]

log = logging.getLogger("inq.train")
T = TypeVar("T")


def integer_phase(out_dir: Path, trainer: Trainer) -> dict[str, Any]:
    """Run (or finish, or, done before a kill, recall) the integer phase of ``trainer``'s run
    in ``out_dir``, whose packed model rank 0 has written; returns what ``summary.json``
    records of it (accuracy, loss, timings, the fine-tuning loss per epoch).

    Deterministic on the CPU: a run killed anywhere in it resumes to the same file.

    Raises:
        ConfigError: naming ``quant.act_bits`` if the model has no integer form, or
            ``quant.symmetric_tolerance`` if symmetric activations lose too much.
    """
    phase, env, q = trainer.integer, trainer.env, trainer.cfg.quant
    assert phase is not None
    if trainer.progress.phase == len(trainer.phases):  # not done yet
        share(None)  # every rank waits for rank 0's packed file
        packed = load_packed(out_dir / PACKED)
        start = time.perf_counter()
        lowering = _no_integer_model_if_fails(lambda: _calibrated(trainer, packed, q))
        fq_model = lowering.fake_quant_model().to(env.device).eval()  # BatchNorm as folded
        if trainer.start_phase_of(phase, fq_model):
            trainer.history[phase.name] = {"calibration_s": time.perf_counter() - start}
            trainer.tb.scalars(trainer.progress.step, scale_values(lowering))
            ckpt.kill_point("quant", 1)
        for epoch in trainer.epochs_left(phase):
            loss = trainer.train_epoch(phase, epoch)["loss"]
            trainer.history[phase.name].setdefault("finetune_loss", []).append(loss)
            values = {**scale_values(lowering), "quant/loss": loss}
            trainer.tb.scalars(trainer.progress.step, values)
            trainer.save()
            ckpt.kill_point("quant", epoch + 2)
        int_model = _no_integer_model_if_fails(
            lambda: lowered(lowering, packed, q, trainer.data_info)
        )
        if env.main:
            save_integer(out_dir / INTEGER, int_model)
        share(None)  # written: every rank evaluates the file
        trainer.end_phase(phase, _evaluated(out_dir / INTEGER, trainer))
    record = {**trainer.history[phase.name], "seconds": trainer.timings[phase.name]}
    log.info(
        "integer model (%d-bit activations, %s calibration%s): val acc %.2f %%, in %s",
        q.act_bits, q.calibration,
        f", {q.epochs} fine-tuning epoch{'s' if q.epochs > 1 else ''}" if q.epochs else "",
        100 * record["acc"], out_dir / INTEGER,
    )  # fmt: skip
    return {"act_bits": q.act_bits, **record}


def _calibrated(trainer: Trainer, packed: PackedFile, settings: QuantSettings) -> Lowering:
    """The lowering of ``packed`` calibrated on ``quant.batches`` training images (the same on
    every rank and after a resume)."""
    device = trainer.env.device
    lowering = lowering_of(packed, settings, device)
    batches = calibration_loader(trainer.data, settings.batches, trainer.cfg.trainer.seed)
    calibrate(lowering, (x.to(device) for x, _ in batches), settings)
    return lowering


def _no_integer_model_if_fails(make: Callable[[], T]) -> T:
    """``make()``, a ValueError (IntegerModelError among them: the model, not a bug) turned
    into the config error of ``quant.act_bits`` (of ``quant.symmetric_tolerance`` where
    symmetric activations lose too much)."""
    try:
        return make()
    except SymmetricLossError as err:
        raise ConfigError("quant.symmetric_tolerance", str(err)) from None
    except ValueError as err:
        raise ConfigError("quant.act_bits", f"no integer model: {err}") from None


def _evaluated(path: Path, trainer: Trainer) -> dict[str, float]:
    """The metrics of the integer model file ``path`` on the validation split (each rank its
    shard), logged as ``val/int_acc`` and ``val/int_loss``."""
    device = trainer.env.device
    int_model = RealOutput(load_integer(path).to(device))
    metrics = evaluate(int_model, trainer.val_loader, device, top5=False)
    values = {"val/int_acc": metrics["acc"], "val/int_loss": metrics["loss"]}
    trainer.tb.scalars(trainer.progress.step, values)
    return metrics
