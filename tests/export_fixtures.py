"""Small fully quantized models and their masked checkpoints, for the export/deployment tests."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from inq.data import FASHION_MNIST_ROOT
from inq.masked import save_masked
from inq.scheduler import INQScheduler

if TYPE_CHECKING:
    from inq.fit import Distill
    from inq.packed import PackedFile
    from inq.quant.integer import IntegerModel
    from inq.quant.pipeline import QuantSettings


class MixedNet(nn.Module):
    """Conv2d (odd channel counts), batch norm, a depthwise conv, Conv1d and Linear layers."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 5, 3, padding=1)
        self.bn = nn.BatchNorm2d(5)
        self.depthwise = nn.Conv2d(5, 5, 3, stride=2, groups=5, bias=False)
        self.seq = nn.Conv1d(5, 7, 3)
        self.fc = nn.Linear(7 * 1, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.depthwise(torch.relu(self.bn(self.conv(x))))  # [N, 5, 3, 3]
        x = self.seq(x.flatten(2))  # [N, 7, 7]
        return self.fc(x.mean(-1, keepdim=True).flatten(1))


def quantize(
    model: nn.Module, bits: int, portions: tuple[float, ...] = (1.0,), **levels: str
) -> INQScheduler:
    """Run every INQ stage of ``model`` (no training) and return the finished scheduler;
    ``levels`` are the scheduler's ``n1_rule``/``granularity``."""
    sched = INQScheduler(model, bits=bits, portions=portions, **levels)
    while not sched.done:
        sched.step()
    return sched


def masked_file(
    folder: Path, bits: int = 5, seed: int = 0, model: nn.Module | None = None, **levels: str
) -> tuple[Path, nn.Module]:
    """A fully quantized model (``MixedNet`` by default) saved as a masked checkpoint."""
    torch.manual_seed(seed)
    model = MixedNet() if model is None else model
    sched = quantize(model, bits, **levels)
    path = folder / f"mixed{bits}.safetensors"
    save_masked(path, model, sched, {"name": "mixed"})
    return path, model


def masked_v2(path: Path, out: Path) -> Path:
    """The masked checkpoint at ``path`` rewritten as format ``inq-masked/2`` (no bits per
    layer, before per-layer bit-widths) at ``out``, with a matching digest."""
    from inq.fileio import DIGEST_KEY, read_safetensors, write_safetensors

    tensors, metadata = read_safetensors(path)
    layers = json.loads(metadata["layers"])
    for info in layers.values():
        del info["bits"]
    metadata.update(format="inq-masked/2", layers=json.dumps(layers))
    write_safetensors(out, tensors, {k: v for k, v in metadata.items() if k != DIGEST_KEY})
    return out


DIGITS_MODEL = {"name": "digits_cnn", "num_classes": 10, "in_channels": 1, "width": 8}
DIGITS_DATA = {"name": "digits", "val_fraction": 0.25, "split_seed": 0}


def digits_masked(folder: Path, data: dict | None = None, name: str = "d") -> Path:
    """The app's digits CNN, untrained, quantized in one stage (no training) and saved as a
    masked checkpoint recording ``data`` (default: the digits config ``inq-train`` records):
    a file every command takes, in a fraction of a second."""
    from inq.data import eval_data_config
    from inq.models import build_model

    torch.manual_seed(0)
    model = build_model(DIGITS_MODEL)
    path = folder / f"{name}.safetensors"
    data = eval_data_config({}, ["digits"]) if data is None else data
    save_masked(path, model, quantize(model, 5), DIGITS_MODEL, data)
    return path


def digits_run(
    folder: Path, bits: int = 5, epochs: int = 4, **levels: Any
) -> tuple[Path, nn.Module]:
    """Train the app's digits CNN briefly, run INQ (two stages), save the masked checkpoint;
    ``levels`` go to the scheduler (``layer_bits``, ``n1_rule``, ``granularity``)."""
    return trained_run(folder, DIGITS_MODEL, DIGITS_DATA, bits, epochs, **levels)


def trained_run(
    folder: Path,
    model_cfg: dict[str, Any],
    data: dict[str, Any],
    bits: int,
    epochs: int,
    train_size: int | None = None,
    lr: float = 2e-2,
    **levels: Any,
) -> tuple[Path, nn.Module]:
    """Train ``model_cfg`` on the first ``train_size`` training images of ``data`` (Adam,
    batches of 256) for ``epochs``, run INQ (portions 0.5, 1.0, ``epochs // 2`` each) with the
    scheduler options ``levels``, and save the masked checkpoint in ``folder``."""
    from inq.data import build_datasets
    from inq.models import build_model

    torch.manual_seed(0)
    model = build_model(model_cfg)
    train, _ = build_datasets(data)
    x, y = (t[:train_size] for t in train.tensors)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)

    def fit(n: int) -> None:
        model.train()
        for _ in range(n):
            for batch in torch.randperm(len(x)).split(256):
                optimizer.zero_grad()
                nn.functional.cross_entropy(model(x[batch]), y[batch]).backward()
                optimizer.step()

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny tensors: one thread is fastest, and the cores are shared
    try:
        fit(epochs)
        sched = INQScheduler(model, bits=bits, portions=(0.5, 1.0), **levels)
        sched.attach(optimizer)
        while not sched.done:
            sched.step()
            fit(epochs // 2)
    finally:
        torch.set_num_threads(threads)
    path = folder / f"{data['name']}.safetensors"
    save_masked(path, model, sched, model_cfg)
    return path, model.eval()


def packed_model(model: nn.Module, bits: int = 5, **levels: str) -> nn.Module:
    """``model`` with every conv/linear weight quantized (no training) and swapped for the
    packed shift modules of :mod:`inq.nn`, in eval mode."""
    from inq.masked import MaskedCheckpoint
    from inq.nn import convert_model
    from inq.packed import packed_from_masked

    sched = quantize(model, bits, **levels)
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    masks = {f"{layer.name}.weight": layer.mask.clone() for layer in sched.layers}
    n1 = {f"{layer.name}.weight": layer.n1 for layer in sched.layers}
    ckpt = MaskedCheckpoint(state, masks, n1, bits, tuple(sched.portions), sched.stage, "magnitude")
    return convert_model(model, packed_from_masked(ckpt)).eval()


class ResidualNet(nn.Module):
    """A conv + BatchNorm branch added to a 1x1 conv, ReLU, global average pooling, Linear: every
    integer op kind that carries requantization parameters (conv, add, avgpool, linear)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(2, 4, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(4)
        self.skip = nn.Conv2d(2, 4, 1)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn(self.conv(x)) + self.skip(x))
        return self.fc(self.pool(y).flatten(1))


def residual_integer_model(seed: int = 0, symmetric: bool = False, **levels: str) -> IntegerModel:
    """The integer model of a 5-bit :class:`ResidualNet` whose BatchNorm has negative scales
    (so some conv multipliers are negative), calibrated on random inputs ``[N, 2, 4, 4]``, with
    the descriptions ``inq calibrate`` records (``--symmetric`` with ``symmetric``); ``levels``
    as :func:`quantize` takes them."""
    from inq.quant.lower import Lowering

    torch.manual_seed(seed)
    net = ResidualNet()
    with torch.no_grad():
        net.bn.weight.copy_(torch.tensor([1.0, -0.5, 0.7, -1.2]))
    lowering = Lowering(packed_model(net, **levels), act_bits=8, symmetric=symmetric)
    lowering.calibrate([torch.randn(8, 2, 4, 4)])
    info = {"model": {"name": "residual"}, "data": {}, "act_bits": 8, "input_bits": 8,
            "calibration": "max", "pow2_scales": True, "calibration_batches": 1,
            "finetune_epochs": 0, "weight_bits": [5], "symmetric": symmetric}  # fmt: skip
    return lowering.integer_model(info)


def _conv_bn(cin: int, cout: int, k: int = 1, stride: int = 1, groups: int = 1) -> list[nn.Module]:
    conv = nn.Conv2d(cin, cout, k, stride, k // 2, groups=groups, bias=False)
    return [conv, nn.BatchNorm2d(cout)]


class InvertedResidual(nn.Module):
    """MobileNetV2's block: 1x1 expansion and 3x3 depthwise conv (BatchNorm, ReLU6), a linear 1x1
    projection (BatchNorm, no activation), and the residual add where the shapes allow."""

    def __init__(self, cin: int, cout: int, stride: int, expand: int = 2) -> None:
        super().__init__()
        hidden = cin * expand
        self.conv = nn.Sequential(
            *_conv_bn(cin, hidden), nn.ReLU6(inplace=True),
            *_conv_bn(hidden, hidden, 3, stride, groups=hidden), nn.ReLU6(inplace=True),
            *_conv_bn(hidden, cout),
        )  # fmt: skip
        self.residual = stride == 1 and cin == cout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv(x) if self.residual else self.conv(x)


class MobileNetV2Style(nn.Module):
    """A small MobileNetV2 (as torchvision builds it): a Conv-BN-ReLU6 stem, inverted residual
    blocks (one with stride 2, two with a residual add), a 1x1 Conv-BN-ReLU6, global average
    pooling, Dropout and Linear."""

    def __init__(self, num_classes: int = 10, width: int = 8) -> None:
        super().__init__()
        self.features = nn.Sequential(
            *_conv_bn(3, width, 3, stride=2), nn.ReLU6(inplace=True),
            InvertedResidual(width, width, 1),
            InvertedResidual(width, 2 * width, 2),
            InvertedResidual(2 * width, 2 * width, 1),
            *_conv_bn(2 * width, 4 * width), nn.ReLU6(inplace=True),
        )  # fmt: skip
        self.classifier = nn.Sequential(nn.Dropout(0.2), nn.Linear(4 * width, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = nn.functional.adaptive_avg_pool2d(self.features(x), (1, 1))
        return self.classifier(torch.flatten(x, 1))


def mobilenet_style(seed: int = 0) -> nn.Module:
    """A :class:`MobileNetV2Style` in eval mode with random BatchNorm statistics and affine
    parameters (negative scales too), as a trained model has."""
    torch.manual_seed(seed)
    model = MobileNetV2Style()
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                c = m.num_features
                m.running_mean.copy_(torch.randn(c, generator=gen) * 0.3)
                m.running_var.copy_(torch.rand(c, generator=gen) + 0.5)
                m.weight.copy_(torch.randn(c, generator=gen))
                m.bias.copy_(torch.randn(c, generator=gen) * 0.2)
    return model.eval()


SYNTHETIC_DATA = {"name": "synthetic", "num_classes": 10, "in_channels": 3, "image_size": 16,
                  "train_size": 64, "val_size": 32, "eval_batch_size": 32}  # fmt: skip


def mobilenet_inputs(count: int, seed: int = 0) -> torch.Tensor:
    """``count`` random inputs ``[3, 16, 16]`` (the shape of :data:`SYNTHETIC_DATA`), large
    enough that several ReLU6 of :func:`mobilenet_style` saturate at 6."""
    return 4 * torch.randn(count, 3, 16, 16, generator=torch.Generator().manual_seed(seed))


def mobilenet_integer_model(
    seed: int = 0, bits: int = 5, symmetric: bool = False
) -> tuple[nn.Module, IntegerModel]:
    """The packed :func:`mobilenet_style` model (5-bit) and its integer model, calibrated
    (``max``) on :func:`mobilenet_inputs`, with the descriptions ``inq calibrate`` records
    (``--symmetric`` with ``symmetric``)."""
    from inq.quant.lower import Lowering

    model = packed_model(mobilenet_style(seed), bits)
    lowering = Lowering(model, act_bits=8, symmetric=symmetric)
    lowering.calibrate(mobilenet_inputs(64, seed).split(16))
    info = {"model": {"name": "mobilenet_style", "num_classes": 10, "in_channels": 3},
            "data": SYNTHETIC_DATA, "act_bits": 8, "input_bits": 8, "calibration": "max",
            "pow2_scales": True, "calibration_batches": 4, "finetune_epochs": 0,
            "weight_bits": [bits], "symmetric": symmetric}  # fmt: skip
    return model, lowering.integer_model(info)


def quantize_on(
    packed: PackedFile,
    data: dict[str, object],
    settings: QuantSettings,
    distill: Distill | None = None,
) -> tuple[IntegerModel, dict[str, object]]:
    """:func:`inq.quant.pipeline.quantize` of ``packed`` on the data set ``data`` as ``inq
    calibrate`` runs it (:func:`inq.data.calibration_loader`, :func:`inq.data.finetune_loader`)."""
    from inq.data import calibration_loader, data_record, finetune_loader
    from inq.quant.pipeline import quantize

    calibration = (x for x, _ in calibration_loader(data, settings.batches, seed=0))
    finetune = finetune_loader(data, seed=0) if settings.epochs else ()
    record = data_record(data)
    return quantize(packed, calibration, settings, finetune=finetune, data=record, distill=distill)


FASHION_DATA = {"name": "fashion_mnist", "root": FASHION_MNIST_ROOT, "num_classes": 10,
                "in_channels": 1, "image_size": 28, "eval_batch_size": 256}  # fmt: skip
FASHION_MODEL = {"name": "mnist_cnn", "num_classes": 10, "in_channels": 1}
FASHION_FILES = ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz",
                 "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz")  # fmt: skip


def fashion_integer_model(folder: Path, bits: int, eight_bit_ends: bool = False) -> IntegerModel:
    """The README's Fashion-MNIST CNN trained briefly (:func:`trained_run`, 1,000 images) at
    ``bits`` (first and last layer at 8 bits with ``eight_bit_ends``), as an integer model
    (8-bit activations, 2 calibration batches). Skips the test, naming the package, where the
    data set is not installed."""
    import pytest

    from inq.masked import load_masked
    from inq.packed import packed_from_masked
    from inq.quant.pipeline import QuantSettings

    root = Path(str(FASHION_DATA["root"]))
    if not all((root / f).is_file() for f in FASHION_FILES):
        pytest.skip(f"Fashion-MNIST is not in {root} (needs the package dataset-fashion-mnist: "
                    "apt-get install dataset-fashion-mnist)")  # fmt: skip
    levels = {"layer_bits": {"0": 8, "15": 8}} if eight_bit_ends else {}
    masked, _ = trained_run(folder, FASHION_MODEL, FASHION_DATA, bits, epochs=2,
                            train_size=1000, lr=2e-3, **levels)  # fmt: skip
    model, _ = quantize_on(packed_from_masked(load_masked(masked)), FASHION_DATA,
                           QuantSettings(act_bits=8, batches=2))  # fmt: skip
    return model
