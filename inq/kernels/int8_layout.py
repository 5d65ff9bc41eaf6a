"""The weight layout of the integer ops on int8 tensor cores, made once per weight.

``inq::shift_linear_int8`` and ``inq::shift_conv2d_int8`` add the terms
``((-x if s else x) << frac) >> o`` (:mod:`inq.kernels.int8`). Where ``o <= frac`` no shift
floors and the term is the product ``x * w`` with the integer ``w = (-1)**s * 2**(frac - o)``,
so a layer whose live offsets are all at most ``frac`` (what the integer model picks unless
int32 overflow forbids it) is one integer matrix product, which an int8 x int8 -> int32 tensor
core computes exactly. Two things do not fit int8 and are handled here:

- **Weights of 128 and more** (``frac - o >= 7``; at 5 bits the top level of a layer that also
  uses the bottom one is ``+-128``): the weight is split by exponent into parts,
  ``W = W0 + 2**7 * W1`` with every entry of each part in ``{0, +-1, ..., +-64}``. The kernel
  runs one product per part; at most :data:`MAX_PARTS`.
- **uint8 activations** (0..255, after a ReLU): the kernel uses ``x - 128`` (an int8, by
  flipping the top bit) and adds ``128 * row_sum[o]`` back, ``row_sum`` being the sum of row
  ``o``'s integer weights. A zero the kernel loads for padding becomes ``-128`` too and is
  corrected alike, so padding still adds 0.

All of it is exact in int32: the ops refuse any ``frac`` for which ``K * max|x| * 2**frac``
could reach ``2**31``, and every partial sum here (one part's product, the correction) is a
sum of a subset of those terms, or wraps modulo ``2**32`` to the same final value.

Columns are ordered ``(kh, kw, c)`` (``c`` fastest) so that a convolution's K tile is one tap
times consecutive channels of a channels_last input: ``parts[p, o, k]`` is ``int8
[MAX_PARTS or fewer, O, K]``, K contiguous (an int8 tensor core takes both operands K-major).
A layer with fewer than :data:`FLAT_CHANNELS` channels a group (a network's first conv) takes
flat K steps of :data:`FLAT_BLOCK_K` columns over any taps: its channels are padded to a power
of two a tap (the kernel's activations alike), so a column's tap and channel are a shift and
a mask, and its rows to whole steps, with zero weights (:func:`flat_columns`).

Example:
    >>> from inq.codes import pack_codes
    >>> codes = torch.tensor([[8, 15, 0]], dtype=torch.uint8)  # 4 bits: 2**n1 * [1, -1/8, 0]
    >>> weight = int8_weight(pack_codes(codes, 4), 4, 3, frac_bits=3, taps=1)
    >>> weight.parts[0, 0, :4].tolist(), weight.row_sum.tolist()  # 8 * [1, -1/8, 0], padding
    ([8, -1, 0, 0], [7])
    >>> weight.parts.shape  # 3 channels padded to 4, the row to a flat step of 64 columns
    torch.Size([1, 1, 64])
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from inq.codes import unpack_codes
from inq.kernels.layout import cached_layout

__all__ = [
    "FLAT_BLOCK_K",
    "FLAT_CHANNELS",
    "MAX_PARTS",
    "PART_SHIFT",
    "Int8Weight",
    "cached_int8_weight",
    "flat_columns",
    "int8_weight",
]

MAX_PARTS = 2
PART_SHIFT = 7  # part p holds exponents 7p .. 7p + 6, so its entries fit int8 (|w| <= 64)
FLAT_CHANNELS = 32  # channels a group below which the tensor-core kernel takes flat K steps
FLAT_BLOCK_K = 64  # columns of one flat K step


def flat_columns(channels: int, taps: int) -> tuple[int, int] | None:
    """``(channels a tap, columns a row)`` of the layout of a group of ``channels`` x ``taps``
    that takes flat K steps: the channels padded to a power of two, the row to whole steps;
    ``None`` where the K steps are tap-wise (no padding).

    Example:
        >>> flat_columns(3, 49), flat_columns(64, 9)  # ResNet's first conv, a later one
        ((4, 256), None)
    """
    if channels >= FLAT_CHANNELS:
        return None
    padded = 1 << (channels - 1).bit_length()
    return padded, -(-padded * taps // FLAT_BLOCK_K) * FLAT_BLOCK_K


@dataclass(frozen=True)
class Int8Weight:
    """A weight in the int8 tensor cores' layout (see the module docstring)."""

    parts: Tensor  # int8 [P, O, K]: W = sum_p 2**(7p) * parts[p], K in (kh, kw, c) order
    row_sum: Tensor  # int32 [O]: sum over K of the integer weight (the uint8 correction)


def int8_weight(packed: Tensor, bits: int, k: int, frac_bits: int, taps: int) -> Int8Weight | None:
    """``packed`` codes of ``[O, K]`` (``K = C * taps``, in the file's ``(c, kh, kw)`` order)
    as an :class:`Int8Weight` on ``packed``'s device (columns padded where the K steps are
    flat: :func:`flat_columns`), or ``None`` where a term floors (an offset above
    ``frac_bits``) or the weights need more than :data:`MAX_PARTS` parts.
    """
    codes = unpack_codes(packed, bits, k).to(torch.int64)
    live = (codes >> (bits - 1)) != 0
    offset = codes & ((1 << (bits - 2)) - 1)
    if bool((live & (offset > frac_bits)).any()):
        return None
    exponent = torch.where(live, frac_bits - offset, 0)
    parts = int(exponent.max()) // PART_SHIFT + 1 if codes.numel() else 1
    if parts > MAX_PARTS:
        return None
    sign = torch.where(((codes >> (bits - 2)) & 1) != 0, -1, 1) * live
    rows, channels = codes.shape[0], k // taps
    flat = flat_columns(channels, taps)

    def tap_major(w: Tensor) -> Tensor:  # [O, (c, kh, kw)] -> [O, (kh, kw, c)], padded if flat
        by_tap = w.view(rows, channels, taps).transpose(1, 2)
        if flat is None:
            return by_tap.reshape(rows, k)
        padded, columns = flat
        by_tap = F.pad(by_tap, (0, padded - channels)).reshape(rows, taps * padded)
        return F.pad(by_tap, (0, columns - taps * padded))

    split = [
        tap_major((sign * (exponent // PART_SHIFT == p)) << (exponent - PART_SHIFT * p).clamp(0))
        for p in range(parts)
    ]
    row_sum = (sign << exponent).sum(dim=1)
    return Int8Weight(torch.stack(split).to(torch.int8).contiguous(), row_sum.to(torch.int32))


def cached_int8_weight(
    packed: Tensor, bits: int, k: int, frac_bits: int, taps: int
) -> Int8Weight | None:
    """:func:`int8_weight`, made once per ``packed`` tensor and kept while it lives (rebuilt if
    it changes in place).

    Example:
        >>> from inq.codes import pack_codes
        >>> packed = pack_codes(torch.tensor([[8, 13]], dtype=torch.uint8), 4)
        >>> cached_int8_weight(packed, 4, 2, 3, 1) is cached_int8_weight(packed, 4, 2, 3, 1)
        True
    """
    key = ("int8", bits, k, frac_bits, taps)
    return cached_layout(packed, key, lambda: int8_weight(packed, bits, k, frac_bits, taps))
