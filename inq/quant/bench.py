"""The integer model of a benchmark network, for ``inq bench kernel`` on a GPU.

:func:`integer_pair` turns a float model whose weights are already powers of two (the benchmark's
random-weight ResNet-18) into its integer model: its Conv2d/Linear layers become ShiftConv2d/
ShiftLinear, the activation ranges come from random images (no data set is needed to time real
shapes and code paths), and the lowering of :mod:`inq.quant.lower` gives the integers.

Example::

    from inq.kernels.bench import quantized_resnet18
    on_gpu, reference = integer_pair(quantized_resnet18(4), bits=4)
    x = torch.randn(2, 3, 224, 224)
    assert torch.equal(on_gpu(x.cuda()).cpu(), reference(x))   # int8 tensor cores, bit for bit
"""

from __future__ import annotations

import torch
from torch import nn

from inq.nn import ShiftConv2d, ShiftLinear
from inq.pow2 import pow2_n1
from inq.quant.integer import IntegerModel
from inq.quant.lower import Lowering

__all__ = ["integer_pair", "to_shift_layers"]


def to_shift_layers(model: nn.Module, bits: int) -> nn.Module:
    """``model`` (power-of-two weights, changed in place) with ShiftConv2d/ShiftLinear layers.

    Example:
        >>> from inq.pow2 import pow2_quantize
        >>> fc = nn.Linear(4, 2)
        >>> with torch.no_grad():
        ...     _ = fc.weight.copy_(pow2_quantize(fc.weight, pow2_n1(fc.weight), 4))
        >>> type(to_shift_layers(nn.Sequential(fc), 4)[0]).__name__
        'ShiftLinear'
    """
    for name, m in list(model.named_modules()):
        if isinstance(m, nn.Conv2d | nn.Linear):
            kind = ShiftConv2d if isinstance(m, nn.Conv2d) else ShiftLinear
            layer = kind.from_float(m, pow2_n1(m.weight.detach()), bits)
            parent, _, attr = name.rpartition(".")
            setattr(model.get_submodule(parent), attr, layer)
    return model


def integer_pair(
    model: nn.Module, bits: int, image_size: int = 224, batches: int = 8
) -> tuple[IntegerModel, IntegerModel]:
    """The integer model (8-bit activations) of ``model`` (power-of-two ``bits``-bit weights,
    an image network), calibrated on ``batches`` of 16 random images: ``(on CUDA, on the CPU)``.
    Moved to CUDA outside inference mode, so the kernels' cached layouts track its tensors."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    lowering = Lowering(to_shift_layers(model, bits).to(device), act_bits=8)
    with torch.no_grad():
        images = (torch.randn(16, 3, image_size, image_size, device=device) for _ in range(batches))
        lowering.calibrate(images)
    return lowering.integer_model().to(device), lowering.integer_model().cpu()
