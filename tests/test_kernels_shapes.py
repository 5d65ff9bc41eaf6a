"""The benchmark shapes: ResNet-18's convolutions as torchvision builds them, and linear shapes
the static check may specialise (multiples of 16)."""

from __future__ import annotations

import torch
from torch import nn

from inq.kernels.shapes import LINEAR_SHAPES, resnet18_convs


def _geometry(conv: nn.Conv2d) -> tuple[object, ...]:
    return conv.weight.shape, conv.stride, conv.padding, conv.dilation, conv.groups


def test_resnet18_convs_are_torchvision_resnet18_convs() -> None:
    from torchvision.models import resnet18  # ~1.3 s: only in the worker that runs this

    reference = {n: m for n, m in resnet18().named_modules() if isinstance(m, nn.Conv2d)}
    layers = resnet18_convs(batch=3)
    assert [layer.name for layer in layers] == list(reference)  # every conv, in call order
    for layer in layers:
        assert _geometry(layer.conv) == _geometry(reference[layer.name]), layer.name


def test_resnet18_activation_shapes_at_224() -> None:
    layers = {layer.name: layer for layer in resnet18_convs(batch=3)}
    assert len(layers) == 20
    assert layers["conv1"].input_shape == (3, 3, 224, 224)
    assert layers["conv1"].output_shape == (3, 64, 112, 112)
    assert layers["layer1.0.conv1"].input_shape == (3, 64, 56, 56)  # after the max pool
    assert layers["layer2.0.downsample.0"].output_shape == (3, 128, 28, 28)
    assert layers["layer4.1.conv2"].output_shape == (3, 512, 7, 7)
    for layer in layers.values():
        assert layer.input_shape[1] == layer.conv.in_channels
        assert layer.output_shape[1] == layer.conv.out_channels
        with torch.no_grad():
            out = layer.conv(torch.zeros(1, *layer.input_shape[1:]))
        assert out.shape[1:] == layer.output_shape[1:]


def test_linear_shapes_are_multiples_of_16() -> None:
    """The static check compiles with sizes and row strides divisible by 16, as Triton
    specialises them at run time for these shapes."""
    assert all(out_f % 16 == 0 and in_f % 16 == 0 for out_f, in_f in LINEAR_SHAPES)
