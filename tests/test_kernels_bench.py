"""CPU-checkable parts of ``inq bench kernel``: the models it times and its tables."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from inq.kernels.bench import (
    EndToEnd,
    OpLayer,
    format_end_to_end,
    quantized_resnet18,
    to_op_layers,
)
from inq.pow2 import pow2_levels, pow2_n1, pow2_quantize


def test_end_to_end_models_compute_the_same_function() -> None:
    """The converted ResNet-18 holds only op layers and gives the float model's logits bit for
    bit (both use the same exactly decoded weights on the CPU)."""
    float_model = quantized_resnet18(bits=4)
    for m in float_model.modules():
        if isinstance(m, nn.Conv2d | nn.Linear):
            levels = pow2_levels(pow2_n1(m.weight), 4)
            assert torch.isin(m.weight, levels).all()
    op_model = to_op_layers(float_model, bits=4)
    layers = [m for m in op_model.modules() if isinstance(m, OpLayer)]
    assert [layer.op for layer in layers].count(torch.ops.inq.shift_conv2d) == 20
    assert [layer.op for layer in layers].count(torch.ops.inq.shift_linear) == 1
    assert not any(isinstance(m, nn.Conv2d | nn.Linear) for m in op_model.modules())
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        assert torch.equal(op_model(x), float_model(x))


@pytest.mark.parametrize("bias", [True, False])
def test_op_layer_keeps_the_conv_geometry(bias: bool) -> None:
    conv = nn.Conv2d(4, 6, 3, stride=2, padding=2, dilation=2, groups=2, bias=bias)
    with torch.no_grad():
        conv.weight.copy_(pow2_quantize(conv.weight, n1=-1, bits=5))
    layer = OpLayer(conv, bits=5)
    assert layer.packed.dtype == torch.uint8 and layer.packed.shape[0] == 6
    x = torch.randn(2, 4, 9, 9)
    with torch.no_grad():
        assert torch.equal(layer(x), conv(x))


def test_end_to_end_table_has_one_row_per_case() -> None:
    rows = [EndToEnd(1, 4, "fp16", 1.0, 2.0, 0.5, 0.25), EndToEnd(32, 4, "fp16", 3, 3, 2, 4)]
    table = format_end_to_end(rows).splitlines()
    assert len(table) == 4
    assert table[2].split()[-1] == "2.00x" and table[3].split()[-1] == "0.50x"
