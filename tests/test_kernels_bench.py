"""CPU-checkable parts of ``inq bench kernel``: the models it times and its tables."""

from __future__ import annotations

import torch
from torch import nn

from inq.kernels.bench import (
    EndToEnd,
    format_end_to_end,
    quantized_resnet18,
    to_shift_modules,
)
from inq.nn import ShiftConv2d, ShiftLinear
from inq.pow2 import pow2_levels, pow2_n1


def test_end_to_end_models_compute_the_same_function() -> None:
    """The converted ResNet-18 holds only shift modules and gives the float model's logits
    bit for bit (both use the same exactly decoded weights on the CPU)."""
    float_model = quantized_resnet18(bits=4)
    for m in float_model.modules():
        if isinstance(m, nn.Conv2d | nn.Linear):
            levels = pow2_levels(pow2_n1(m.weight), 4)
            assert torch.isin(m.weight, levels).all()
    shift_model = to_shift_modules(float_model, bits=4)
    kinds = [type(m) for m in shift_model.modules()]
    assert kinds.count(ShiftConv2d) == 20 and kinds.count(ShiftLinear) == 1
    assert not any(k in (nn.Conv2d, nn.Linear) for k in kinds)
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        assert torch.equal(shift_model(x), float_model(x))


def test_end_to_end_table_has_one_row_per_case() -> None:
    rows = [EndToEnd(1, 4, "fp16", 1.0, 2.0, 0.5, 0.25), EndToEnd(32, 4, "fp16", 3, 3, 2, 4)]
    table = format_end_to_end(rows).splitlines()
    assert len(table) == 4
    assert table[2].split()[-1] == "2.00x" and table[3].split()[-1] == "0.50x"
