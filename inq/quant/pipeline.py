"""Integer deployment of a finished model: calibrate its activations on training data, optionally
fine-tune them with fake quantization, lower it to an integer model and evaluate that.

The library face, :func:`quantize`, takes batches (calibration images, fine-tuning batches) and
builds no datasets: ``inq calibrate`` passes it :func:`inq.data.calibration_loader` and a
training loader, and ``inq-train``'s integer phase (``quant.act_bits``) runs the same steps
(:func:`lowering_of`, calibration, fine-tuning :func:`trainable`, :func:`lowered`) in its
Trainer. Seeded loaders make a rerun on the CPU give the same file.

Example (shell)::

    inq calibrate outputs/run --calibration mse -o model.int.safetensors
    inq eval model.int.safetensors
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from inq.fit import Distill, fit_step
from inq.nn import from_packed
from inq.packed import PackedFile
from inq.pow2 import MAX_BITS, MIN_BITS
from inq.quant.integer import IntegerModel
from inq.quant.lower import IntegerModelError, Lowering
from inq.quant.observers import CALIBRATIONS

__all__ = [
    "IntegerModelError",
    "QuantSettings",
    "RealOutput",
    "SymmetricLossError",
    "calibrate",
    "lowered",
    "lowering_of",
    "quantize",
    "scale_values",
    "trainable",
]

log = logging.getLogger("inq.train")


class SymmetricLossError(IntegerModelError):
    """Symmetric activations lose more top-1 agreement than ``symmetric_tolerance`` allows."""


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
    # int8 activations with zero point 0 everywhere (TensorRT's form): ReLU outputs use 0..127
    # at twice the scale; refused if that changes the top-1 class of more than
    # symmetric_tolerance of the calibration images beyond what unsigned ones change
    symmetric: bool = False
    symmetric_tolerance: float = 0.01
    # each requantization multiplier a sum of at most this many signed powers of two (1: a
    # pure shift): no multiplier left in hardware (inq export --rtl); None: 31-bit multipliers
    requant_terms: int | None = None

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
        if self.requant_terms is not None and not 1 <= self.requant_terms <= 8:
            return "requant_terms", f"from 1 to 8 (or unset), got {self.requant_terms}"
        if not 0 <= self.symmetric_tolerance <= 1:
            return "symmetric_tolerance", f"from 0 to 1, got {self.symmetric_tolerance}"
        if not self.symmetric and self.symmetric_tolerance != QuantSettings.symmetric_tolerance:
            return "symmetric_tolerance", "has no effect without symmetric activations"
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
    calibration: Iterable[Tensor],
    settings: QuantSettings,
    device: torch.device | None = None,
    finetune: Iterable[tuple[Tensor, Tensor]] = (),
    data: Mapping[str, Any] | None = None,
    on_epoch: Callable[[int, dict[str, float]], None] = lambda epoch, values: None,
    distill: Distill | None = None,
    seed: int = 0,
) -> tuple[IntegerModel, dict[str, Any]]:
    """The integer model of ``packed`` and a report (``calibration_s``, ``finetune_s``,
    ``scales``, the fine-tuning loss per epoch, ``finetune_loss``, and ``top1``: the float
    and the integer model's top-1 classes of the first calibration images, those
    :meth:`~inq.quant.lower.Lowering.calibrate` keeps: a check that the model works).

    ``calibration`` yields the input batches to calibrate on (e.g.
    :func:`inq.data.calibration_loader`); ``finetune`` the ``(x, y)`` batches of one
    fine-tuning epoch, iterated ``settings.epochs`` times; ``data`` is what the integer
    model's file records of the data (:func:`inq.data.data_record` of the data config).
    ``on_epoch(epoch, values)`` sees, before fine-tuning (epoch 0) and after each epoch,
    :func:`scale_values` and the loss (``quant/loss``). With
    ``distill``, the fine-tuning loss is :func:`inq.distill.distill_loss`. ``seed`` seeds the
    random draws of the batches' augmentation (the caller's generator untouched). ``inq-train``
    runs the same fine-tuning as a phase of its Trainer (:mod:`inq.train.loop`).

    Raises:
        ValueError: a setting out of range (:meth:`QuantSettings.problem`) or no ``act_bits``.
        IntegerModelError: if the model has a layer the integer model cannot express, or no
            calibration data.
    """
    device = device or torch.device("cpu")
    with torch.random.fork_rng(devices=[]):  # augmentations draw: seeded, the caller's RNG kept
        torch.manual_seed(seed)
        lowering = lowering_of(packed, settings, device)
        start = time.perf_counter()
        calibrate(lowering, (x.to(device) for x in calibration), settings)
        report: dict[str, Any] = {"calibration_s": time.perf_counter() - start}
        sample = lowering.sample
        assert sample is not None  # calibrate() refuses no data
        with torch.no_grad():  # before fine-tuning, which changes the folded layers
            reference = lowering.graph_module(sample).argmax(-1)
        on_epoch(0, scale_values(lowering))
        if settings.epochs:
            start = time.perf_counter()
            fq_model = lowering.fake_quant_model().to(device).eval()  # BatchNorm as folded
            optimizer = torch.optim.Adam(trainable(fq_model), lr=settings.lr)
            report["finetune_loss"] = []
            for epoch in range(settings.epochs):
                loss = _finetune_epoch(fq_model, optimizer, finetune, device, distill)
                report["finetune_loss"].append(loss)
                log.info("fine-tuning epoch %d/%d: loss %.4f", epoch + 1, settings.epochs, loss)
                on_epoch(epoch + 1, {**scale_values(lowering), "quant/loss": loss})
            report["finetune_s"] = time.perf_counter() - start
    report["scales"] = lowering.scales()
    model = lowered(lowering, packed, settings, data or {}).to(device)
    with torch.no_grad():
        report["top1"] = {"float": reference.cpu(), "integer": model(sample).argmax(-1).cpu()}
    return model, report


def lowering_of(packed: PackedFile, settings: QuantSettings, device: torch.device) -> Lowering:
    """The :class:`~inq.quant.lower.Lowering` of ``packed`` with ``settings``, not calibrated.

    Raises:
        ValueError: a setting out of range (:meth:`QuantSettings.problem`) or no ``act_bits``.
        IntegerModelError: a layer the integer model cannot express.
    """
    problem = settings.problem() or (
        ("act_bits", "the activation bits must be set") if settings.act_bits is None else None
    )
    if problem is not None:
        raise ValueError(f"{problem[0]}: {problem[1]}")
    assert settings.act_bits is not None
    with torch.random.fork_rng(devices=[]):  # building modules draws: leave the caller's RNG be
        model = from_packed(packed).to(device)
    return Lowering(
        model, settings.act_bits, settings.calibration, settings.pow2_scales, settings.input_bits,
        settings.symmetric, settings.requant_terms,
    )  # fmt: skip


def calibrate(lowering: Lowering, batches: Iterable[Tensor], settings: QuantSettings) -> None:
    """Calibrate ``lowering`` on ``batches``; with ``settings.symmetric``, check what symmetric
    activations cost (:meth:`~inq.quant.lower.Lowering.symmetric_agreement`), before any
    fine-tuning (which may win some of it back).

    Raises:
        IntegerModelError: no calibration data.
        SymmetricLossError: symmetric activations agree with the float model's top-1 class on
            more than ``settings.symmetric_tolerance`` fewer calibration images than unsigned
            ones.
    """
    lowering.calibrate(batches)
    if not settings.symmetric:
        return
    symmetric, unsigned = lowering.symmetric_agreement()
    if unsigned is None:
        log.warning("symmetric activations: no unsigned integer model to compare them with "
                    "(a folded bias beyond int32 at its finer scales); not checked")  # fmt: skip
    elif unsigned - symmetric > settings.symmetric_tolerance:
        count = len(lowering.sample) if lowering.sample is not None else 0
        raise SymmetricLossError(
            f"symmetric activations (quant.symmetric, --symmetric) agree with the float model's "
            f"top-1 class on {100 * symmetric:.1f} % of {count} calibration images against "
            f"{100 * unsigned:.1f} % for unsigned ones: {100 * (unsigned - symmetric):.1f} points "
            f"lost, more than quant.symmetric_tolerance={settings.symmetric_tolerance:g} "
            "(--symmetric-tolerance) allows; calibrate without symmetric activations, or with "
            "more activation bits"
        )


def trainable(fq_model: nn.Module) -> list[nn.Parameter]:
    """What fine-tuning trains: the BatchNorm affine parameters and the log2 scales (the
    packed weights are buffers; the BatchNorm statistics stay frozen, as the integer model
    folds them, so the model trains in eval mode)."""
    return [p for p in fq_model.parameters() if p.requires_grad]


def lowered(
    lowering: Lowering, packed: PackedFile, settings: QuantSettings, data: Mapping[str, Any]
) -> IntegerModel:
    """The integer model of a calibrated (and maybe fine-tuned) ``lowering``, its file's
    ``info`` saying how it was made and on which ``data`` (what
    :func:`inq.data.data_record` makes of the data config: without loader settings, with the
    input's preprocessing).

    Raises:
        IntegerModelError: see :meth:`~inq.quant.lower.Lowering.integer_model`.
    """
    info = {
        "model": packed.model,
        "data": dict(data),
        "act_bits": settings.act_bits,
        "input_bits": settings.input_bits,
        "calibration": settings.calibration,
        "pow2_scales": settings.pow2_scales,
        "calibration_batches": settings.batches,
        "finetune_epochs": settings.epochs,
        "symmetric": settings.symmetric,
        "requant_terms": settings.requant_terms,
        "weight_bits": sorted({layer.bits for layer in packed.layers.values()}),
    }
    return lowering.integer_model(info)


def _finetune_epoch(
    fq_model: nn.Module,
    optimizer: torch.optim.Optimizer,
    batches: Iterable[tuple[Tensor, Tensor]],
    device: torch.device,
    distill: Distill | None,
) -> float:
    """One epoch of Adam over ``batches``; the mean loss."""
    total = count = 0.0
    for x, y in batches:
        x, y = x.to(device), y.to(device)
        loss, _, _ = fit_step(fq_model, optimizer, x, y, distill=distill)
        total, count = total + float(loss.detach()) * len(y), count + len(y)
    return total / max(count, 1)


def scale_values(lowering: Lowering) -> dict[str, float]:
    """The log2 scale and clipped fraction of every point: of the last fine-tuning batch, or
    of the calibration data."""
    values = {}
    for name, scale in lowering.scales().items():
        fq = lowering.fake_quants.get(name)
        clipped = (
            fq.clipped
            if fq
            else lowering.observers[name].clipped(scale, lowering.bits(name), lowering.signed(name))
        )
        values[f"quant/log2_scale/{name}"] = (
            float(fq.log2_scale.detach()) if fq else math.log2(scale)
        )
        values[f"quant/clipped/{name}"] = clipped
    return values
