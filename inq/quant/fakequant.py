"""Fake quantization of activations for fine-tuning: straight-through rounding, learnable scale.

:class:`FakeQuant` stores a tensor's scale as ``log2_scale`` (a parameter). Forward computes
exactly what the integer model stores, ``clamp(floor(x / s + 1/2), lo, hi) * s`` with
``s = 2**round(log2_scale)`` (power-of-two scales) or ``s = 2**log2_scale``; backward passes
the gradient straight through the rounding: to ``x`` inside the range (zero where clipped),
and to the scale as in LSQ (Esser et al., 2020) — ``round(x/s) - x/s`` inside ``[lo, hi]``,
``lo``/``hi`` outside — scaled by ``1/sqrt(features * hi)`` so the scale's step size matches the
weights'. The rounding of ``log2_scale`` is straight-through as well, so a power-of-two scale
moves once its log2 crosses a half-integer.

Example:
    >>> fq = FakeQuant(scale=0.25, lo=-4, hi=3)
    >>> fq(torch.tensor([0.3, -0.2, 9.0]))
    tensor([ 0.2500, -0.2500,  0.7500], grad_fn=<MulBackward0>)
    >>> fq.clipped
    0.3333333333333333
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

__all__ = ["FakeQuant"]


def _round_ste(x: Tensor) -> Tensor:
    """``floor(x + 1/2)`` forward, identity backward."""
    return x + (torch.floor(x + 0.5) - x).detach()


def _scale_grad(x: Tensor, factor: float) -> Tensor:
    """``x`` forward, gradient times ``factor`` backward."""
    return x * factor + (x - x * factor).detach()


class FakeQuant(nn.Module):
    """Quantize-dequantize one activation tensor (see the module docstring).

    ``clipped`` holds the fraction of values of the last batch outside the range.
    """

    def __init__(self, scale: float, lo: int, hi: int, pow2: bool = True) -> None:
        super().__init__()
        if not scale > 0:
            raise ValueError(f"scale must be > 0, got {scale}")
        self.log2_scale = nn.Parameter(torch.tensor(math.log2(scale)))
        self.lo, self.hi, self.pow2 = lo, hi, pow2
        self.clipped = 0.0

    def scale(self) -> float:
        """The scale the integer model will use."""
        t = float(self.log2_scale.detach())
        return math.ldexp(1.0, math.floor(t + 0.5)) if self.pow2 else 2.0**t

    def forward(self, x: Tensor) -> Tensor:
        features = max(1, x[0].numel() if x.dim() > 1 else x.numel())
        log2 = _scale_grad(self.log2_scale, 1.0 / math.sqrt(features * self.hi))
        s = torch.exp2(_round_ste(log2) if self.pow2 else log2)
        v = x / s
        with torch.no_grad():
            self.clipped = float(((v < self.lo - 0.5) | (v >= self.hi + 0.5)).double().mean())
        return _round_ste(torch.clamp(v, self.lo, self.hi)) * s  # as floor-then-clamp, forward

    def extra_repr(self) -> str:
        return f"scale={self.scale()}, lo={self.lo}, hi={self.hi}, pow2={self.pow2}"
