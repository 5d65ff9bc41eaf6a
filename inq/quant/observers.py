"""Activation ranges seen on calibration data, and the scale each method picks.

An activation tensor is stored as integers ``q`` in ``[lo, hi]`` standing for ``q * scale``;
signed tensors use ``[-2**(b-1), 2**(b-1) - 1]``, tensors that cannot be negative (after a
ReLU) use ``[0, 2**b - 1]``, so ``b`` bits are never wasted on a sign. A power-of-two scale
``2**-f`` is stored as its exponent ``f``. The output of a ReLU6 or Hardtanh is observed after
the clamp, so its scale fits the clamped values; the integer model then cuts ``[lo, hi]`` to the
clamp's bounds (:func:`inq.quant.lower.clamp_range`).

Methods (``CALIBRATIONS``):

- ``max``: the smallest scale that represents the largest value seen without clipping;
- ``percentile``: the same for the 99.99th percentile of ``|x|`` (outliers are clipped);
- ``mse``: the scale with the least squared quantization error over the values seen, searched
  among the ``max`` scale and finer ones.

Example:
    >>> obs = Observer("max", signed=True)
    >>> obs.update(torch.tensor([-1.0, 0.25, 3.0]))
    >>> obs.scale(bits=8, pow2=True)   # 3.0 / 127 needs 2**-5 (2**-6 * 127 < 3)
    0.03125
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

__all__ = ["CALIBRATIONS", "Observer", "act_range", "fake_quantize", "pow2_ceil"]

CALIBRATIONS = ("max", "percentile", "mse")
PERCENTILE = 99.99
_SAMPLES_PER_BATCH = 1 << 16  # values kept per update (percentile, mse, clipped share)
_MSE_CANDIDATES = 12  # finer scales tried below the max one (powers of two, or 0.9**i steps)


def act_range(bits: int, signed: bool) -> tuple[int, int]:
    """The integer range of a ``bits``-bit activation.

    Example:
        >>> act_range(8, signed=True), act_range(8, signed=False), act_range(4, signed=True)
        ((-128, 127), (0, 255), (-8, 7))

    Raises:
        ValueError: if ``bits`` is not in 2..8.
    """
    if isinstance(bits, bool) or not isinstance(bits, int) or not 2 <= bits <= 8:
        raise ValueError(f"activation bits must be an integer from 2 to 8, got {bits!r}")
    return (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if signed else (0, (1 << bits) - 1)


def pow2_ceil(value: float) -> float:
    """The smallest power of two ``>= value`` (``value > 0``), exactly.

    Example:
        >>> pow2_ceil(0.3), pow2_ceil(0.25), pow2_ceil(5.0)
        (0.5, 0.25, 8.0)
    """
    mantissa, exponent = math.frexp(value)  # value = mantissa * 2**exponent, 0.5 <= m < 1
    return math.ldexp(1.0, exponent - 1 if mantissa == 0.5 else exponent)


def fake_quantize(x: Tensor, scale: float, lo: int, hi: int) -> Tensor:
    """``clamp(floor(x / scale + 1/2), lo, hi) * scale``: what the integer model stores.

    Example:
        >>> fake_quantize(torch.tensor([0.3, -0.2, 9.0]), 0.25, -4, 3)
        tensor([ 0.2500, -0.2500,  0.7500])
    """
    return torch.floor(x / scale + 0.5).clamp_(lo, hi) * scale


class Observer:
    """Range statistics of one activation tensor over calibration batches.

    ``signed`` False: the tensor cannot be negative (a ReLU or ReLU6 clamps it), or was never seen
    negative (the model input, when ``signed`` is None: decided by the data).
    """

    def __init__(self, method: str, signed: bool | None, seed: int = 0) -> None:
        if method not in CALIBRATIONS:
            raise ValueError(f"unknown calibration {method!r}; use one of {list(CALIBRATIONS)}")
        self.method, self.declared_signed = method, signed
        self.low, self.high = math.inf, -math.inf
        self.samples: list[Tensor] = []
        self._gen = torch.Generator().manual_seed(seed)

    @property
    def seen(self) -> bool:
        return self.high >= self.low

    @property
    def signed(self) -> bool:
        return self.low < 0 if self.declared_signed is None else self.declared_signed

    def update(self, x: Tensor) -> None:
        """Take the values of one batch."""
        x = x.detach()
        if not x.numel():
            return
        self.low = min(self.low, float(x.min()))
        self.high = max(self.high, float(x.max()))
        flat = x.reshape(-1).float().cpu()
        if flat.numel() > _SAMPLES_PER_BATCH:
            pick = torch.randint(flat.numel(), (_SAMPLES_PER_BATCH,), generator=self._gen)
            flat = flat[pick]
        self.samples.append(flat)

    def scale(self, bits: int, pow2: bool, signed: bool | None = None) -> float:
        """The scale this observer's method picks for ``bits``-bit integers, signed ones if
        ``signed`` (None: as :attr:`signed`; True for symmetric activations, whose
        non-negative values then use ``0..2**(b-1) - 1`` at about twice the scale).

        Raises:
            ValueError: if no value was ever seen.
        """
        if not self.seen:
            raise ValueError("no calibration data reached this tensor")
        lo, hi = act_range(bits, self.signed if signed is None else signed)
        peak = max(self.high, 0.0) / hi
        if lo < 0:
            peak = max(peak, -min(self.low, 0.0) / -lo)
        if self.method == "percentile":
            values = torch.cat(self.samples).abs()
            top = float(torch.quantile(values[: 1 << 24], PERCENTILE / 100))
            peak = min(peak, top / hi) if top > 0 else peak
        if peak <= 0.0:  # an all-zero tensor: any scale stores it exactly
            return 1.0
        best = pow2_ceil(peak) if pow2 else peak
        if self.method == "mse":
            best = self._least_mse(best, lo, hi, pow2)
        return best

    def clipped(self, scale: float, bits: int, signed: bool | None = None) -> float:
        """The fraction of the values seen (a sample of them) that ``scale`` clips
        (``signed`` as in :meth:`scale`).

        Example:
            >>> obs = Observer("max", signed=False)
            >>> obs.update(torch.tensor([0.0, 1.0, 2.0, 3.0]))
            >>> obs.clipped(scale=1 / 64, bits=7)  # 127 / 64 < 2 <= 3
            0.5
        """
        lo, hi = act_range(bits, self.signed if signed is None else signed)
        values = torch.cat(self.samples) / scale
        return float(((values < lo - 0.5) | (values >= hi + 0.5)).float().mean())

    def _least_mse(self, start: float, lo: int, hi: int, pow2: bool) -> float:
        values = torch.cat(self.samples).double()
        best, best_error = start, math.inf
        for i in range(_MSE_CANDIDATES + 1):
            scale = math.ldexp(start, -i) if pow2 else start * 0.9**i
            error = float((fake_quantize(values, scale, lo, hi) - values).square().sum())
            if error < best_error:
                best, best_error = scale, error
        return best
