"""The benchmark's integer model (:mod:`inq.quant.bench`): a float model with power-of-two
weights becomes an integer model calibrated on random images, the same on both devices."""

from __future__ import annotations

import torch
from helpers import pow2_weights
from torch import nn

from inq.quant.bench import integer_pair, to_shift_layers


def tiny_net(bits: int) -> nn.Module:
    torch.manual_seed(0)
    net = nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 5),
    ).eval()  # fmt: skip
    return pow2_weights(net, bits)


def test_integer_pair_runs_the_same_program_and_tracks_the_float_model() -> None:
    net = tiny_net(5)
    x = torch.randn(4, 3, 8, 8)
    with torch.no_grad():
        want = net(x)
    first, second = integer_pair(tiny_net(5), 5, image_size=8, batches=2)
    assert [op.op for op in first.ops] == ["input", "conv", "avgpool", "flatten", "linear"]
    logits = first(x)
    assert logits.dtype == torch.int32 and torch.equal(logits, second(x))
    assert logits.shape == want.shape  # 8-bit activations: the classes mostly agree
    assert (logits.argmax(1) == want.argmax(1)).float().mean() >= 0.75


def test_to_shift_layers_keeps_the_weights_bit_for_bit() -> None:
    net = tiny_net(4)
    weights = [m.weight.detach().clone() for m in net.modules() if isinstance(m, nn.Conv2d)]
    shifted = to_shift_layers(net, 4)
    conv = shifted[0]
    assert type(conv).__name__ == "ShiftConv2d"
    x = torch.randn(2, 3, 8, 8)
    ref = nn.functional.conv2d(x, weights[0], conv.bias, padding=1)
    assert torch.equal(conv(x), ref)
