"""Integer deployment of a finished model: calibrate its activations on training data, optionally
fine-tune them with fake quantization, lower it to an integer model and evaluate that.

Used by ``inq calibrate`` and by ``inq-train``'s final phase (``quant.act_bits``). Both are
seeded by ``seed``: the calibration images (a random draw from the training split, not
augmented) and the fine-tuning batches, so on the CPU a rerun gives the same file.

Example (shell)::

    inq calibrate outputs/run --calibration mse -o model.int.safetensors
    inq eval model.int.safetensors
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.data import DataLoader, Subset

from inq.data import build_datasets, data_record
from inq.distill import distill_loss
from inq.nn import from_packed
from inq.packed import PackedFile
from inq.pow2 import MAX_BITS, MIN_BITS
from inq.quant.integer import IntegerModel
from inq.quant.lower import IntegerModelError, Lowering
from inq.quant.observers import CALIBRATIONS

__all__ = ["IntegerModelError", "QuantSettings", "RealOutput", "quantize"]

log = logging.getLogger("inq.train")


@dataclass
class QuantSettings:
    """What the integer model is made with: ``inq-train``'s ``quant`` config group (this is its
    schema) and ``inq calibrate``'s options.

    Example:
        >>> QuantSettings(act_bits=4, calibration="mse").problem()
        >>> QuantSettings(act_bits=9).problem()
        ('act_bits', 'from 2 to 8, got 9')
    """

    act_bits: int | None = None  # activation bits, 2-8; None: inq-train makes no integer model
    input_bits: int = 8  # of the model input: images are 8-bit data
    calibration: str = "max"  # how each activation range is chosen: one of CALIBRATIONS
    pow2_scales: bool = True  # power-of-two activation scales: requantizations are shifts
    batches: int = 8  # calibration batches of data.eval_batch_size training images
    epochs: int = 0  # fine-tuning epochs with fake-quantized activations
    lr: float = 1e-3  # Adam, on the BatchNorm affine parameters and the log2 scales

    def problem(self) -> tuple[str, str] | None:
        """The first setting out of range, as ``(field, message)``; None if all are fine."""
        for name in ("act_bits", "input_bits"):
            bits = getattr(self, name)
            if bits is not None and not MIN_BITS <= bits <= MAX_BITS:
                return name, f"from {MIN_BITS} to {MAX_BITS}, got {bits}"
        if self.calibration not in CALIBRATIONS:
            return "calibration", f"one of {list(CALIBRATIONS)}, got {self.calibration!r}"
        for name, least in (("batches", 1), ("epochs", 0)):
            if getattr(self, name) < least:
                return name, f"must be >= {least}, got {getattr(self, name)}"
        if not self.lr > 0:
            return "lr", f"must be > 0, got {self.lr}"
        return None


class RealOutput(nn.Module):
    """An integer model whose output is turned into real values (float64 logits), for
    evaluation code that wants logits."""

    def __init__(self, model: IntegerModel) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: Tensor) -> Tensor:
        return self.model(x).double() * self.model.output_scale()


def quantize(
    packed: PackedFile,
    data: Mapping[str, Any],
    settings: QuantSettings,
    device: torch.device | None = None,
    on_epoch: Callable[[int, dict[str, float]], None] = lambda epoch, values: None,
    seed: int = 0,
    teacher: nn.Module | None = None,
    distill_weight: float = 0.0,
    temperature: float = 4.0,
) -> tuple[IntegerModel, dict[str, Any]]:
    """The integer model of ``packed`` and a report (``calibration_s``, ``finetune_s``,
    ``scales``, and the fine-tuning loss per epoch, ``finetune_loss``).

    ``on_epoch(epoch, values)`` sees, before fine-tuning (epoch 0) and after each epoch, the
    log2 scale and clipped fraction of every point (``quant/log2_scale/<point>``,
    ``quant/clipped/<point>``) and the loss (``quant/loss``). ``seed`` picks the calibration
    images and the fine-tuning batches. With a ``teacher`` (a frozen model taking the same
    input, e.g. :func:`inq.distill.frozen_teacher` of the float model, on ``device``) and
    ``distill_weight`` > 0, the fine-tuning loss is :func:`inq.distill.distill_loss` with
    ``temperature``.

    Raises:
        ValueError: a setting out of range (:meth:`QuantSettings.problem`) or no ``act_bits``;
            a ``distill_weight`` outside [0, 1] or a ``temperature`` not > 0.
        IntegerModelError: if the model has a layer the integer model cannot express, or no
            calibration data.
    """
    problem = settings.problem() or (
        ("act_bits", "the activation bits must be set") if settings.act_bits is None else None
    )
    if problem is not None:
        raise ValueError(f"{problem[0]}: {problem[1]}")
    if not (0.0 <= distill_weight <= 1.0 and temperature > 0):
        raise ValueError(
            f"distill_weight must lie in [0, 1] and temperature be > 0, got {distill_weight} "
            f"and {temperature}"
        )
    distill = None
    if teacher is not None and distill_weight > 0:
        distill = (teacher, distill_weight, temperature)
    device = device or torch.device("cpu")
    with torch.random.fork_rng(devices=[]):  # seeded here, the caller's generator untouched
        torch.manual_seed(seed)
        model = from_packed(packed).to(device)
        lowering = Lowering(
            model, settings.act_bits, settings.calibration, settings.pow2_scales,
            settings.input_bits,
        )  # fmt: skip
        start = time.perf_counter()
        lowering.calibrate(
            x.to(device) for x, _ in _calibration_batches(data, settings.batches, seed)
        )
        report: dict[str, Any] = {"calibration_s": time.perf_counter() - start}
        on_epoch(0, _scale_values(lowering))
        if settings.epochs:
            start = time.perf_counter()
            report["finetune_loss"] = _finetune(
                lowering, data, settings, device, on_epoch, seed, distill
            )
            report["finetune_s"] = time.perf_counter() - start
    report["scales"] = lowering.scales()
    info = {
        "model": packed.model,
        "data": data_record(data),  # without loader settings, with the input
        "act_bits": settings.act_bits,
        "input_bits": settings.input_bits,
        "calibration": settings.calibration,
        "pow2_scales": settings.pow2_scales,
        "calibration_batches": settings.batches,
        "finetune_epochs": settings.epochs,
        "weight_bits": sorted({layer.bits for layer in packed.layers.values()}),
    }
    return lowering.integer_model(info).to(device), report


def _calibration_batches(data: Mapping[str, Any], batches: int, seed: int) -> DataLoader:
    """``batches`` batches of training images as evaluation sees them (no
    augmentation), drawn at random (seeded): a dataset sorted by class (ImageFolder) would
    otherwise calibrate on a few classes."""
    train = build_datasets({**data, "augment": False})[0]
    size = int(data.get("eval_batch_size", 256))
    gen = torch.Generator().manual_seed(seed)
    pick = torch.randperm(len(train), generator=gen)[: batches * size]
    return DataLoader(Subset(train, pick.tolist()), batch_size=size)


def _finetune(
    lowering: Lowering,
    data: Mapping[str, Any],
    settings: QuantSettings,
    device: torch.device,
    on_epoch: Callable[[int, dict[str, float]], None],
    seed: int,
    distill: tuple[nn.Module, float, float] | None = None,
) -> list[float]:
    """Adam on the BatchNorm affine parameters and the log2 scales; the packed weights are
    buffers and the BatchNorm statistics stay frozen (eval mode), as the integer model folds
    them. ``distill``: ``(teacher, weight, temperature)`` to distill from, or None."""
    train = build_datasets(data)[0]  # augmented as in training (data.augment)
    fq_model = lowering.fake_quant_model().to(device)
    params = [p for p in fq_model.parameters() if p.requires_grad]
    optimizer = torch.optim.Adam(params, lr=settings.lr)
    gen = torch.Generator().manual_seed(seed)
    loader = DataLoader(
        train, batch_size=int(data.get("batch_size", 64)), shuffle=True, generator=gen
    )
    fq_model.eval()  # BatchNorm: running statistics, as folded
    losses = []
    for epoch in range(settings.epochs):
        total = count = 0.0
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            logits = fq_model(x)
            if distill is None:
                loss = F.cross_entropy(logits, y)
            else:
                teacher, weight, temperature = distill
                with torch.no_grad():
                    teacher_logits = teacher(x)
                loss = distill_loss(logits, teacher_logits, y, weight, temperature)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            total, count = total + float(loss.detach()) * len(y), count + len(y)
        losses.append(total / max(count, 1))
        log.info("quant fine-tuning epoch %d/%d: loss %.4f", epoch + 1, settings.epochs, losses[-1])
        on_epoch(epoch + 1, {**_scale_values(lowering), "quant/loss": losses[-1]})
    return losses


def _scale_values(lowering: Lowering) -> dict[str, float]:
    """The log2 scale and clipped fraction of every point: of the last fine-tuning batch, or
    of the calibration data."""
    values = {}
    for name, scale in lowering.scales().items():
        fq = lowering.fake_quants.get(name)
        clipped = fq.clipped if fq else lowering.observers[name].clipped(scale, lowering.bits(name))
        values[f"quant/log2_scale/{name}"] = (
            float(fq.log2_scale.detach()) if fq else math.log2(scale)
        )
        values[f"quant/clipped/{name}"] = clipped
    return values
