"""Fake quantization with a learnable log2 scale (inq.quant.fakequant)."""

from __future__ import annotations

import math

import torch

from inq.quant.fakequant import FakeQuant
from inq.quant.observers import fake_quantize


def test_forward_is_what_the_integer_model_stores() -> None:
    x = torch.randn(4, 3, 5, 5, generator=torch.Generator().manual_seed(0)) * 3
    fq = FakeQuant(scale=2**-4, lo=-128, hi=127)
    assert torch.equal(fq(x), fake_quantize(x, 2**-4, -128, 127))
    assert fq.scale() == 2**-4


def test_gradients_are_straight_through_and_lsq() -> None:
    fq = FakeQuant(scale=0.5, lo=0, hi=3)
    x = torch.tensor([[0.3, 0.9, 1.4, 5.0, -1.0]], requires_grad=True)
    fq(x).sum().backward()
    # to x: 1 inside the range, 0 outside (5.0 / 0.5 > 3 and -1.0 / 0.5 < 0)
    assert torch.equal(x.grad, torch.tensor([[1.0, 1.0, 1.0, 0.0, 0.0]]))
    # to s (LSQ): round(x/s) - x/s inside, lo/hi where clipped; times s ln2 for log2 s, times
    # the gradient scale 1/sqrt(features * hi)
    v = torch.tensor([0.6, 1.8, 2.8])
    d_scale = float((torch.floor(v + 0.5) - v).sum()) + 3 + 0
    expected = d_scale * 0.5 * math.log(2) / math.sqrt(5 * 3)
    assert math.isclose(float(fq.log2_scale.grad), expected, rel_tol=1e-6)
    assert fq.clipped == 0.4


def test_power_of_two_scale_moves_once_log2_crosses_a_half() -> None:
    fq = FakeQuant(scale=0.25, lo=-8, hi=7)
    with torch.no_grad():
        fq.log2_scale.fill_(-1.6)
    assert fq.scale() == 0.25
    with torch.no_grad():
        fq.log2_scale.fill_(-1.4)
    assert fq.scale() == 0.5
    free = FakeQuant(scale=0.3, lo=-8, hi=7, pow2=False)
    assert math.isclose(free.scale(), 0.3, rel_tol=1e-6)
