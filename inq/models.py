"""Models by name: small CNNs for 8x8 digits and 28x28 (Fashion-)MNIST, CIFAR ResNet-20/32/56,
any torchvision classifier.

:func:`build_model` takes the resolved ``model`` config group as a plain dict. That same dict
(minus ``checkpoint``) is stored in the masked export's metadata, so ``build_model`` rebuilds the
architecture from an exported file without Hydra.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from inq.errors import ConfigError

__all__ = [
    "CIFAR_RESNET_DEPTHS",
    "DigitsCNN",
    "MnistCNN",
    "ResNetCIFAR",
    "build_model",
]

CIFAR_RESNET_DEPTHS = {"resnet20": 20, "resnet32": 32, "resnet56": 56}


class DigitsCNN(nn.Sequential):
    """Three 3x3 conv layers with batch norm, global pooling and a linear classifier.

    Example:
        >>> DigitsCNN(num_classes=10, in_channels=1)(torch.zeros(2, 1, 8, 8)).shape
        torch.Size([2, 10])
    """

    def __init__(self, num_classes: int = 10, in_channels: int = 1, width: int = 16) -> None:
        super().__init__(
            *_conv_bn_relu(in_channels, width),
            *_conv_bn_relu(width, 2 * width),
            nn.MaxPool2d(2),
            *_conv_bn_relu(2 * width, 4 * width),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
            nn.Linear(4 * width, num_classes),
        )


class MnistCNN(nn.Sequential):
    """Four 3x3 conv layers with batch norm (two per resolution, 28 and 14 pixels), max-pooling to
    7x7, and a linear classifier over the flattened features.

    Example:
        >>> MnistCNN(num_classes=10, in_channels=1)(torch.zeros(2, 1, 28, 28)).shape
        torch.Size([2, 10])
    """

    def __init__(self, num_classes: int = 10, in_channels: int = 1, width: int = 16) -> None:
        super().__init__(
            *_conv_bn_relu(in_channels, width),
            *_conv_bn_relu(width, width),
            nn.MaxPool2d(2),
            *_conv_bn_relu(width, 2 * width),
            *_conv_bn_relu(2 * width, 2 * width),
            nn.MaxPool2d(2),
            nn.Flatten(),
            nn.Linear(2 * width * 7 * 7, num_classes),
        )


def _conv_bn_relu(cin: int, cout: int) -> list[nn.Module]:
    """3x3 conv (no bias), batch norm, ReLU."""
    return [nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU()]


class _BasicBlock(nn.Module):
    # Option-A shortcut of He et al. (2016) for CIFAR: subsample and zero-pad channels, no weights.
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.stride, self.pad = stride, cout - cin

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        shortcut = x[:, :, :: self.stride, :: self.stride] if self.stride > 1 else x
        if self.pad:
            shortcut = F.pad(shortcut, (0, 0, 0, 0, self.pad // 2, self.pad - self.pad // 2))
        return F.relu(out + shortcut)


class ResNetCIFAR(nn.Module):
    """The CIFAR ResNet of He et al. (2016): depth 6n+2, widths w, 2w, 4w.

    Example:
        >>> ResNetCIFAR(depth=20)(torch.zeros(1, 3, 32, 32)).shape
        torch.Size([1, 10])

    Raises:
        ValueError: if ``depth`` is not of the form 6n+2.
    """

    def __init__(
        self, depth: int = 20, num_classes: int = 10, in_channels: int = 3, width: int = 16
    ) -> None:
        super().__init__()
        if depth < 8 or (depth - 2) % 6:
            raise ValueError(f"CIFAR ResNet depth must be 6n+2 (20, 32, 56, ...), got {depth}")
        n = (depth - 2) // 6
        self.conv = nn.Conv2d(in_channels, width, 3, 1, 1, bias=False)
        self.bn = nn.BatchNorm2d(width)
        blocks: list[nn.Module] = []
        cin = width
        for i, cout in enumerate((width, 2 * width, 4 * width)):
            for j in range(n):
                blocks.append(_BasicBlock(cin, cout, 2 if i > 0 and j == 0 else 1))
                cin = cout
        self.layers = nn.Sequential(*blocks)
        self.fc = nn.Linear(cin, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d | nn.Linear):
                nn.init.kaiming_normal_(m.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.layers(F.relu(self.bn(self.conv(x))))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def _torchvision_names() -> list[str]:
    import torchvision  # slow import; only needed for torchvision models

    return sorted(torchvision.models.list_models(module=torchvision.models))


def build_model(cfg: Mapping[str, Any]) -> nn.Module:
    """Build the float model described by a ``model`` config dict (no weights are loaded).

    Keys: ``name`` (``digits_cnn``, ``mnist_cnn``, ``resnet20``/``32``/``56``, or any torchvision
    classification model such as ``resnet18``), ``num_classes``, ``in_channels`` and ``width``
    (base channel count of our models). Other keys (``checkpoint``) are ignored. Torchvision models
    are built with ``weights=None``; pretrained weights come from ``model.checkpoint`` only.

    Example:
        >>> net = build_model({"name": "digits_cnn", "num_classes": 10, "in_channels": 1})
        >>> net(torch.zeros(4, 1, 8, 8)).shape
        torch.Size([4, 10])

    Raises:
        ConfigError: unknown ``model.name`` or arguments the model cannot take.
    """
    name = str(cfg["name"])
    num_classes = int(cfg.get("num_classes", 10))
    in_channels = int(cfg.get("in_channels", 3))
    width = int(cfg.get("width", 16))
    ours: dict[str, Callable[[], nn.Module]] = {
        "digits_cnn": lambda: DigitsCNN(num_classes, in_channels, width),
        "mnist_cnn": lambda: MnistCNN(num_classes, in_channels, width),
        **{
            key: (lambda d=depth: ResNetCIFAR(d, num_classes, in_channels, width))
            for key, depth in CIFAR_RESNET_DEPTHS.items()
        },
    }
    if name in ours:
        return ours[name]()
    if name not in _torchvision_names():
        raise ConfigError(
            "model.name",
            f"unknown model {name!r}; use digits_cnn, mnist_cnn, resnet20, resnet32, resnet56 or a "
            "torchvision classification model such as resnet18 (torchvision.models.list_models())",
        )
    if in_channels != 3:
        raise ConfigError("model.in_channels", f"torchvision models take 3, not {in_channels}")
    import torchvision

    return torchvision.models.get_model(name, weights=None, num_classes=num_classes)
