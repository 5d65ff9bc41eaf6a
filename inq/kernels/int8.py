"""``inq::shift_linear_int8``: int8 activations, power-of-two weights, int32 shifts and adds.

The arithmetic of multiplier-free fixed-point hardware. With ``frac = frac_bits`` fractional bits
in the accumulator, every weight ``(-1)**s * 2**(n1 - o)`` contributes

    term = ((-x if s else x) * 2**frac) >> o          (arithmetic shift: floor; code 0 adds 0)

and ``y = sum_k term`` is an int32. ``y * 2**(n1 - frac)`` (:func:`int8_value`) approximates
``x @ W.T``; it is exact when ``frac >= o`` for every offset in use, in particular for
``frac_bits = exact_frac_bits(bits)``. ``n1`` plays no part in the integer result: it is one
scale applied afterwards, like a hardware requantisation shift.

Overflow cannot happen: the op refuses ``frac_bits`` with ``K * 2**(7 + frac) >= 2**31``
(:func:`max_frac_bits`), since ``|term| <= 2**(7 + frac)``. Integer addition is then associative,
so the Triton kernel (any summation order) and the reference here agree bit for bit.

The implementation below is the integer reference and runs on any device; the Triton kernel
(:mod:`inq.kernels.triton.int8`) is registered as the CUDA implementation.

Example:
    >>> from inq.packed import pack_codes
    >>> codes = torch.tensor([[8, 13, 0]], dtype=torch.uint8)  # 4 bits: 2**n1 * [1, -1/2, 0]
    >>> x = torch.tensor([[3, 5, 7]], dtype=torch.int8)
    >>> y = torch.ops.inq.shift_linear_int8(x, pack_codes(codes, 4), 4, 3, frac_bits=3)
    >>> y  # (3 << 3) - ((5 << 3) >> 1)
    tensor([[4]], dtype=torch.int32)
    >>> int8_value(y, n1=1, frac_bits=3)  # 2**1 * (3 - 5 / 2)
    tensor([[1.]], dtype=torch.float64)
"""

from __future__ import annotations

import torch
from torch import Tensor

from inq.packed import unpack_codes
from inq.pow2 import check_bits

__all__ = [
    "check_int8_args",
    "exact_frac_bits",
    "int8_value",
    "max_frac_bits",
    "shift_linear_int8",
    "shift_linear_int8_reference",
]

_MAX_TERMS = 1 << 24  # int64 terms materialised at once by the reference


def exact_frac_bits(bits: int) -> int:
    """The smallest ``frac_bits`` for which every term is exact: the largest offset, 2**(bits-2)-1.

    Example:
        >>> exact_frac_bits(4)
        3
    """
    return (1 << (check_bits(bits) - 2)) - 1


def max_frac_bits(in_features: int) -> int:
    """The largest ``frac_bits`` that cannot overflow int32 for ``in_features`` terms.

    Example:
        >>> max_frac_bits(4096)
        11
    """
    if not 1 <= in_features < 1 << 24:
        raise ValueError(f"in_features must be in [1, 2**24) for int32 sums, got {in_features}")
    frac = 0
    while in_features << (7 + frac + 1) < 1 << 31:
        frac += 1
    return frac


def int8_value(y: Tensor, n1: int, frac_bits: int) -> Tensor:
    """The real value ``y * 2**(n1 - frac_bits)`` of an int32 result, in float64 (exact)."""
    return torch.ldexp(y.to(torch.float64), torch.tensor(float(n1 - frac_bits), device=y.device))


@torch.library.custom_op(
    "inq::shift_linear_int8",
    mutates_args=(),
    schema="(Tensor x, Tensor packed, int bits, int in_features, int frac_bits) -> Tensor",
)
def shift_linear_int8(
    x: Tensor, packed: Tensor, bits: int, in_features: int, frac_bits: int
) -> Tensor:
    """int32 ``[..., O]`` from int8 ``x [..., in_features]`` (see the module docstring).

    Raises:
        ValueError: if ``x`` is not int8, or ``frac_bits`` is negative or can overflow int32.
    """
    check_int8_args(x, bits, in_features, frac_bits)
    return shift_linear_int8_reference(x, packed, bits, in_features, frac_bits)


@shift_linear_int8.register_fake
def _(x: Tensor, packed: Tensor, bits: int, in_features: int, frac_bits: int) -> Tensor:
    torch._check(x.shape[-1] == in_features, lambda: "shift_linear_int8: x.shape[-1] != K")
    return x.new_empty((*x.shape[:-1], packed.shape[0]), dtype=torch.int32)


def shift_linear_int8_reference(
    x: Tensor, packed: Tensor, bits: int, in_features: int, frac_bits: int
) -> Tensor:
    """The integer reference of the op, in int64 tensor arithmetic on ``x``'s device."""
    codes = unpack_codes(packed, bits, in_features).to(torch.int64)
    nonzero = (codes >> (bits - 1)) != 0
    negative = ((codes >> (bits - 2)) & 1) != 0
    offset = codes & ((1 << (bits - 2)) - 1)
    rows = x.reshape(-1, in_features).to(torch.int64) << frac_bits  # [B, K]
    out = torch.empty((rows.shape[0], codes.shape[0]), dtype=torch.int64, device=x.device)
    step = max(1, _MAX_TERMS // max(1, rows.shape[0] * in_features))
    for o in range(0, codes.shape[0], step):
        sl = slice(o, o + step)
        v = torch.where(negative[None, sl], -rows[:, None, :], rows[:, None, :])  # [B, o, K]
        terms = (v >> offset[None, sl]).masked_fill_(~nonzero[None, sl], 0)
        out[:, sl] = terms.sum(dim=-1)
    return out.to(torch.int32).reshape(*x.shape[:-1], codes.shape[0])


def check_int8_args(x: Tensor, bits: int, in_features: int, frac_bits: int) -> None:
    """Raise ``ValueError`` unless the op's arguments are valid and cannot overflow int32."""
    check_bits(bits)
    if x.dtype != torch.int8:
        raise ValueError(f"shift_linear_int8: x must be int8, got {x.dtype}")
    if x.shape[-1] != in_features:
        raise ValueError(
            f"shift_linear_int8: x has {x.shape[-1]} features, the weight {in_features}"
        )
    if not 0 <= frac_bits <= max_frac_bits(in_features):
        raise ValueError(
            f"shift_linear_int8: frac_bits={frac_bits} can overflow int32 for "
            f"in_features={in_features} (allowed: 0..{max_frac_bits(in_features)})"
        )
