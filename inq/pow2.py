"""Power-of-two arithmetic of INQ: n1, the level set, Eq. 4 rounding, and integer codes.

For a layer quantized to ``bits`` bits (2 <= bits <= 8) one bit encodes zero, so the layer has
``2**(bits-2)`` magnitudes ``2**n2 .. 2**n1`` with ``n2 = n1 + 1 - 2**(bits-2)`` and the level set

    P = {0} U {+-2**e : n2 <= e <= n1}            (2**(bits-1) + 1 values)

Rounding (Eq. 4 of the INQ paper, made exact) sends a weight to the nearest level on a linear
scale; a weight halfway between two levels goes to the larger magnitude ("ties go up"). The
literal Eq. 4 sends ``|w| >= 1.5 * 2**n1`` to zero; that can only happen to weights that grew
past the layer's initial maximum during retraining, and zeroing the largest weights of a layer is
never what a user wants, so here they clamp to ``2**n1`` instead.

Codes (``bits`` bits in a ``uint8``)::

    0                    -> 0
    1 s o_{b-3} .. o_0   -> (-1)**s * 2**(n1 - o),   0 <= o < 2**(bits-2)

i.e. a set top bit marks a non-zero weight, then its sign, then its exponent offset below n1.
Codes with the top bit clear other than 0 are invalid.

Wherever a function takes ``n1`` it accepts an int (one level set for the whole tensor) or an
integer tensor of shape ``[O]`` (one level set per slice along dim 0, i.e. per output channel of
a conv or linear weight; see :mod:`inq.levels`). Codes do not depend on n1's granularity.
"""

from __future__ import annotations

import functools
import math
from typing import overload

import torch

N1 = int | torch.Tensor  # one n1 per tensor, or an integer tensor [O]: one per slice of dim 0

__all__ = [
    "MAX_BITS",
    "MIN_BITS",
    "N1",
    "broadcast_n1",
    "check_bits",
    "check_quantizable",
    "check_top_level",
    "exact_log2",
    "exp2",
    "max_rule_n1",
    "pow2_decode",
    "pow2_encode",
    "pow2_levels",
    "pow2_n1",
    "pow2_n2",
    "pow2_quantize",
    "pow2_quantize_codes",
]

MIN_BITS = 2
MAX_BITS = 8
_FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def check_bits(bits: int) -> int:
    """Return ``bits`` if it is an int in [2, 8]; raise ``ValueError`` otherwise.

    Example:
        >>> check_bits(5)
        5
    """
    if isinstance(bits, bool) or not isinstance(bits, int) or not MIN_BITS <= bits <= MAX_BITS:
        raise ValueError(
            f"bits must be an integer from {MIN_BITS} to {MAX_BITS} (one bit encodes zero), "
            f"got {bits!r}"
        )
    return bits


def pow2_n1(weight: torch.Tensor) -> int:
    """Largest exponent of a layer: ``floor(log2(4 * max|w| / 3))``, computed exactly.

    ``2**n1`` is the largest level, so every weight up to ``1.5 * 2**n1`` rounds to within the
    level set. An all-zero or empty tensor has no scale; it returns 0, and since zero always
    rounds to zero (and an empty tensor has nothing to round) any n1 would do.

    Example:
        >>> pow2_n1(torch.tensor([0.1, -0.75, 0.2]))
        0
        >>> pow2_n1(torch.tensor([0.74]))
        -1
        >>> pow2_n1(torch.zeros(0, 3))
        0

    Raises:
        ValueError: if the tensor is not floating point, or holds NaN or infinity.
    """
    _check_float(weight)
    if weight.numel() == 0:
        return 0
    peak = weight.detach().abs().max().to(torch.float32)  # exact for every supported dtype
    if not bool(torch.isfinite(peak)):
        raise ValueError("pow2_n1: the weight holds NaN or infinity; fix the model first")
    return int(max_rule_n1(peak))


def max_rule_n1(peak: torch.Tensor) -> torch.Tensor:
    """The paper's n1 of each ``max|w|`` in a float32 tensor (int32; 0 where the peak is 0).

    Exact: with ``peak = m * 2**k``, ``m`` in [0.5, 1), ``2**n <= 4/3 * peak`` holds for
    ``n = k`` exactly when ``m >= 0.75``, else for ``n = k - 1``.

    Example:
        >>> max_rule_n1(torch.tensor([0.75, 0.74, 0.0])).tolist()
        [0, -1, 0]
    """
    mantissa, exponent = torch.frexp(peak)
    n1 = exponent - 1 + (mantissa >= 0.75).to(exponent.dtype)
    return n1.masked_fill_(peak == 0, 0).to(torch.int32)


@overload
def pow2_n2(n1: int, bits: int) -> int: ...
@overload
def pow2_n2(n1: torch.Tensor, bits: int) -> torch.Tensor: ...
def pow2_n2(n1: N1, bits: int) -> N1:
    """Smallest exponent of the level set: ``n1 + 1 - 2**(bits-2)``.

    Example:
        >>> pow2_n2(0, 5)
        -7
    """
    return n1 + 1 - (1 << (check_bits(bits) - 2))


def pow2_levels(n1: int, bits: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The level set ``P`` in ascending order: ``2**(bits-1) + 1`` values.

    Example:
        >>> pow2_levels(0, 2)
        tensor([-1.,  0.,  1.])
        >>> len(pow2_levels(-3, 5))
        17
    """
    mags = [math.ldexp(1.0, e) for e in range(pow2_n2(n1, bits), n1 + 1)]
    return torch.tensor([-m for m in reversed(mags)] + [0.0] + mags, dtype=torch.float64).to(dtype)


def pow2_quantize(weight: torch.Tensor, n1: N1, bits: int) -> torch.Tensor:
    """Round every weight to the nearest level of ``P(n1, bits)`` (Eq. 4; ties go up).

    Vectorised and exact on any device, for float32, float16 and bfloat16 tensors; the
    result has the input's dtype, shape and device. ``|w| >= 1.5 * 2**n1`` clamps to ``2**n1``;
    ``|w| < 2**(n2-1)`` becomes zero. ``n1`` may be a tensor ``[O]``: row ``i`` (``weight[i]``)
    uses ``n1[i]``.

    Example:
        >>> w = torch.tensor([0.9, -0.3, 0.05, 0.0])
        >>> pow2_quantize(w, n1=0, bits=3)
        tensor([ 1.0000, -0.5000,  0.0000,  0.0000])
        >>> pow2_quantize(torch.tensor([[0.9, 0.3], [0.9, 0.3]]), torch.tensor([0, -1]), bits=3)
        tensor([[1.0000, 0.5000],
                [0.5000, 0.2500]])

    Raises:
        ValueError: on a non-float tensor, bits outside [2, 8], NaN/infinite weights, or an n1
            whose level ``2**n1`` overflows the dtype.
    """
    return decode_unchecked(pow2_quantize_codes(weight, n1, bits), n1, bits, weight.dtype)


def pow2_quantize_codes(weight: torch.Tensor, n1: N1, bits: int) -> torch.Tensor:
    """Eq. 4 straight to codes: ``pow2_encode(pow2_quantize(w, n1, bits), n1, bits)``, faster.

    Example:
        >>> pow2_quantize_codes(torch.tensor([0.9, -0.3, 0.05, 0.0]), n1=0, bits=3)
        tensor([4, 7, 0, 0], dtype=torch.uint8)

    Raises:
        ValueError: as :func:`pow2_quantize`.
    """
    check_quantizable(weight, n1)
    n1 = broadcast_n1(n1, weight)
    n2 = pow2_n2(n1, bits)
    work = weight.detach().to(torch.float32)  # exact for every supported dtype
    mantissa, exponent = torch.frexp(work)  # |w| = |m| * 2**k, |m| in [0.5, 1)
    # |w| in [2**(k-1), 2**k): the midpoint 1.5 * 2**(k-1) is |m| = 0.75; ties go up.
    rounded = exponent - 1 + (mantissa.abs() >= 0.75).to(exponent.dtype)
    if isinstance(n1, int):  # one clamp, typed for each kind of n1
        e = rounded.clamp(pow2_n2(n1, bits), n1)
    else:
        e = torch.clamp(rounded, pow2_n2(n1, bits), n1)
    # k >= n2  <=>  |w| >= 2**(n2-1), the midpoint between 0 and 2**n2.
    zero = (exponent < n2) | (work == 0)
    codes = (1 << (bits - 1)) | ((mantissa < 0).to(e.dtype) << (bits - 2)) | (n1 - e)
    return codes.masked_fill_(zero, 0).to(torch.uint8)


def check_quantizable(weight: torch.Tensor, n1: N1) -> None:
    """Raise unless :func:`pow2_quantize` can round ``weight`` with this ``n1``.

    An empty ``weight`` (with an empty per-row ``n1`` if it has no rows) always passes: there is
    nothing to round.

    Example:
        >>> check_quantizable(torch.zeros(0), n1=torch.zeros(0, dtype=torch.int32))
        >>> check_quantizable(torch.tensor([0.5, float("nan")]), n1=0)
        Traceback (most recent call last):
        ...
        ValueError: pow2_quantize: the weight holds NaN or infinity

    Raises:
        ValueError: on a non-float tensor, a per-row n1 of the wrong shape, NaN/infinite
            weights, or an n1 whose level ``2**n1`` overflows the dtype.
    """
    _check_float(weight)
    check_top_level(broadcast_n1(n1, weight), weight.dtype)
    if not bool(torch.isfinite(weight).all()):
        raise ValueError("pow2_quantize: the weight holds NaN or infinity")


def pow2_encode(quantized: torch.Tensor, n1: N1, bits: int) -> torch.Tensor:
    """Integer codes (``uint8``, same shape) of a tensor whose values lie in ``P(n1, bits)``.

    Example:
        >>> pow2_encode(torch.tensor([1.0, -0.5, 0.0]), n1=0, bits=3)
        tensor([4, 7, 0], dtype=torch.uint8)

    Raises:
        ValueError: if a value is not in the level set (use :func:`pow2_quantize` first).
    """
    _check_float(quantized)
    finite = quantized.detach().nan_to_num(posinf=0.0, neginf=0.0)  # NaN/inf fail the test below
    codes = pow2_quantize_codes(finite, n1, bits)
    off_level = decode_unchecked(codes, n1, bits, quantized.dtype) != quantized
    if bool(off_level.any()):
        first = quantized.detach()[off_level].flatten()[0].item()
        where = f"n1={n1}" if isinstance(n1, int) else "their row's n1"
        raise ValueError(
            f"pow2_encode: {int(off_level.sum())} value(s) are not in the {bits}-bit level set "
            f"of {where} (first: {first!r}); quantize with pow2_quantize first"
        )
    return codes


def pow2_decode(
    codes: torch.Tensor, n1: N1, bits: int, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """Values of integer codes made by :func:`pow2_encode`; the exact inverse.

    Example:
        >>> pow2_decode(torch.tensor([4, 7, 0], dtype=torch.uint8), n1=0, bits=3)
        tensor([ 1.0000, -0.5000,  0.0000])

    Raises:
        ValueError: if a code is not a valid ``bits``-bit code.
    """
    check_bits(bits)
    c = codes.to(torch.int32)
    top = 1 << (bits - 1)
    valid = (c == 0) | ((c >= top) & (c < 2 * top))
    if not bool(valid.all()):
        first = int(c[~valid].flatten()[0])
        raise ValueError(
            f"pow2_decode: invalid {bits}-bit code {first} (valid: 0 and {top}..{2 * top - 1})"
        )
    return decode_unchecked(c, n1, bits, dtype)


def decode_unchecked(codes: torch.Tensor, n1: N1, bits: int, dtype: torch.dtype) -> torch.Tensor:
    """:func:`pow2_decode` without validation, for codes this library produced itself.

    Invalid codes map to NaN, never to a plausible value. One n1: a lookup in a 256-entry table;
    n1 per row: the same formula as the table's, element by element (so the same values).
    """
    if isinstance(n1, int):
        # under torch.compile (an STE forward) the table's arithmetic is traced, not cached
        build = decode_table.__wrapped__ if torch.compiler.is_compiling() else decode_table
        table = build(n1, bits, dtype, codes.device)
        return torch.index_select(table, 0, codes.reshape(-1).to(torch.int32)).view(codes.shape)
    check_bits(bits)
    n1 = broadcast_n1(n1, codes)
    check_top_level(n1, dtype)
    return _code_values(codes.to(torch.int32), n1, bits).to(dtype)


@functools.lru_cache(maxsize=256)
def decode_table(n1: int, bits: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Value of every byte as a ``bits``-bit code of ``P(n1, bits)``; NaN for invalid codes.

    Example:
        >>> decode_table(0, 2, torch.float32, torch.device("cpu"))[[0, 1, 2, 3]]
        tensor([ 0., nan,  1., -1.])
    """
    check_bits(bits)
    check_top_level(n1, dtype)
    return _code_values(torch.arange(256, dtype=torch.int32), n1, bits).to(dtype).to(device)


def _code_values(c: torch.Tensor, n1: N1, bits: int) -> torch.Tensor:
    """float32 value of every int32 code ``c`` (NaN for invalid codes); ``n1`` broadcasts."""
    top = 1 << (bits - 1)
    offset = c & ((1 << (bits - 2)) - 1)
    sign = 1.0 - 2.0 * ((c >> (bits - 2)) & 1).to(torch.float32)
    values = torch.where((c >= top) & (c < 2 * top), sign * exp2(n1 - offset), float("nan"))
    return values.masked_fill_(c == 0, 0.0)


@overload
def broadcast_n1(n1: int, like: torch.Tensor) -> int: ...
@overload
def broadcast_n1(n1: torch.Tensor, like: torch.Tensor) -> torch.Tensor: ...
def broadcast_n1(n1: N1, like: torch.Tensor) -> N1:
    """``n1`` ready to broadcast against ``like``: an int as it is, a tensor ``[O]`` (one n1 per
    slice ``like[i]``) as int32 ``[O, 1, ..., 1]`` on ``like``'s device.

    Example:
        >>> broadcast_n1(torch.tensor([0, -2]), torch.zeros(2, 3, 3)).shape
        torch.Size([2, 1, 1])

    Raises:
        ValueError: if the tensor is not integer, or its length is not ``like.shape[0]``.
    """
    if isinstance(n1, int) and not isinstance(n1, bool):
        return n1
    if not isinstance(n1, torch.Tensor) or n1.is_floating_point() or n1.dtype == torch.bool:
        raise ValueError(f"n1 must be an int or an integer tensor [O], got {n1!r}")
    if n1.dim() != 1 or like.dim() == 0 or n1.shape[0] != like.shape[0]:
        raise ValueError(
            f"a per-row n1 must have one entry per slice along dim 0: shape "
            f"[{like.shape[0] if like.dim() else 0}], got {list(n1.shape)}"
        )
    return n1.to(device=like.device, dtype=torch.int32).view(-1, *[1] * (like.dim() - 1))


def exact_log2(value: float) -> int | None:
    """``k`` if ``value`` is exactly ``2**k``, else None (zero, a negative, any other number).

    Example:
        >>> exact_log2(0.125), exact_log2(1.0), exact_log2(0.3), exact_log2(-2.0)
        (-3, 0, None, None)
    """
    mantissa, exponent = math.frexp(value)
    return exponent - 1 if value > 0 and mantissa == 0.5 else None


def exp2(e: torch.Tensor) -> torch.Tensor:
    """``2.0**e`` in float32 for an int32 tensor, exact (built from exponent bits, no ``pow``).

    Results below float32's subnormal range are 0. The product of two normal powers of two is
    rounded once, so subnormal results are exact too.

    Example:
        >>> exp2(torch.tensor([0, -3, -149], dtype=torch.int32)).tolist() == [1.0, 0.125, 2**-149]
        True
    """
    e = e.to(torch.int32).clamp(-200, 127)
    high = e.clamp(min=-126)
    return _normal_exp2(high) * _normal_exp2(e - high)


def _normal_exp2(e: torch.Tensor) -> torch.Tensor:
    return ((e + 127) << 23).view(torch.float32)  # sign 0, biased exponent, mantissa 0


def _check_float(t: torch.Tensor) -> None:
    if t.dtype not in _FLOAT_DTYPES:
        raise ValueError(f"expected a float32, float16 or bfloat16 tensor, got {t.dtype}")


def check_top_level(n1: N1, dtype: torch.dtype) -> None:
    """Raise ``ValueError`` if a top level ``2**n1`` overflows ``dtype``.

    ``n1`` is an int or an integer tensor of any shape (every entry is checked; an empty one has
    no level to check).

    Example:
        >>> check_top_level(15, torch.float16)
        >>> check_top_level(torch.tensor([], dtype=torch.int32), torch.float16)
        >>> check_top_level(torch.tensor([3, 16]), torch.float16)
        Traceback (most recent call last):
        ValueError: the largest level 2**16 overflows torch.float16
    """
    limit = math.log2(torch.finfo(dtype).max)
    if isinstance(n1, torch.Tensor):
        if bool((n1 > limit).any()):  # false for an empty n1, so max() below sees an entry
            raise ValueError(f"the largest level 2**{int(n1.max())} overflows {dtype}")
    elif n1 > limit:
        raise ValueError(f"the largest level 2**{n1} overflows {dtype}")
