"""The shapes ``inq bench kernel`` times on a GPU and ``--static`` estimates without one.

Linear layers of LLMs at four batch sizes, and every convolution of a torchvision ResNet-18 at
224x224 at two. Both :mod:`inq.kernels.bench` and :mod:`inq.kernels.static` read them here.

Example:
    >>> [(c.name, c.output_shape) for c in resnet18_convs(batch=2)][0]
    ('conv1', (2, 64, 112, 112))
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import nn

__all__ = ["CONV_BATCHES", "LINEAR_BATCHES", "LINEAR_SHAPES", "ConvLayer", "resnet18_convs"]

LINEAR_SHAPES = [(4096, 4096), (11008, 4096), (4096, 11008), (28672, 8192)]  # (out, in)
LINEAR_BATCHES = [1, 16, 256, 1024]
CONV_BATCHES = [1, 32]


class ConvLayer(NamedTuple):
    """One convolution of the benchmark network, with the activation shapes it sees."""

    name: str  # the module's name in the network, e.g. "layer1.0.conv1"
    conv: nn.Conv2d  # random weights
    input_shape: tuple[int, ...]  # (batch, channels, height, width)
    output_shape: tuple[int, ...]


def resnet18_convs(batch: int) -> list[ConvLayer]:
    """Every convolution of a torchvision ResNet-18 (random init) at 224x224, in call order.

    Example:
        >>> layer = resnet18_convs(batch=32)[-1]
        >>> layer.name, tuple(layer.conv.weight.shape), layer.input_shape
        ('layer4.1.conv2', (512, 512, 3, 3), (32, 512, 7, 7))
    """
    from torchvision.models import resnet18  # loads in seconds: only when the shapes are asked

    model = resnet18().eval()
    found: list[ConvLayer] = []

    def record(name: str, conv: nn.Module, inputs: tuple[torch.Tensor], out: torch.Tensor) -> None:
        shapes = (batch, *inputs[0].shape[1:]), (batch, *out.shape[1:])
        found.append(ConvLayer(name, conv, *shapes))

    hooks = [
        m.register_forward_hook(lambda mod, inp, out, name=name: record(name, mod, inp, out))
        for name, m in model.named_modules()
        if isinstance(m, nn.Conv2d)
    ]
    with torch.no_grad():
        model(torch.zeros(1, 3, 224, 224))  # shapes only: one image is enough
    for h in hooks:
        h.remove()
    return found
