"""``inq::shift_linear_int8`` and ``inq::shift_conv2d_int8``: integer activations, power-of-two
weights, int32 shifts and adds.

The arithmetic of multiplier-free fixed-point hardware. Activations are int8, or uint8 (0..255,
after a ReLU). With ``frac = frac_bits`` fractional bits in the accumulator, every weight
``(-1)**s * 2**(n1 - o)`` contributes

    term = ((-x if s else x) * 2**frac) >> o          (arithmetic shift: floor; code 0 adds 0)

and ``y = sum_k term`` is an int32. ``y * 2**(n1 - frac)`` (:func:`int8_value`) approximates
``x @ W.T`` (or the convolution); it is exact when ``frac >= o`` for every offset in use, in
particular for ``frac_bits = exact_frac_bits(bits)``. ``n1`` plays no part in the integer
result: it is one scale applied afterwards, like a hardware requantisation shift.

Overflow cannot happen: the ops refuse any ``frac_bits`` above :func:`max_frac_bits` of the
number of terms per output ``K`` (``in_features``, or ``Cin/groups * kh * kw``). Integer addition
is then associative, so the Triton kernels (any summation order) and the references here agree
bit for bit.

The references below run on any device and get the integers from float64 matrix products
(exact, see :func:`shift_linear_int8_reference`), or, with ``method="int64"``, add the floored
terms one by one in int64 (the definition, slow). The Triton kernels
(:mod:`inq.kernels.triton.int8`) are registered as the CUDA implementations.

Example:
    >>> from inq.codes import pack_codes
    >>> codes = torch.tensor([[8, 13, 0]], dtype=torch.uint8)  # 4 bits: 2**n1 * [1, -1/2, 0]
    >>> x = torch.tensor([[3, 5, 7]], dtype=torch.int8)
    >>> y = torch.ops.inq.shift_linear_int8(x, pack_codes(codes, 4), 4, 3, frac_bits=3)
    >>> y  # (3 << 3) - ((5 << 3) >> 1)
    tensor([[4]], dtype=torch.int32)
    >>> int8_value(y, n1=1, frac_bits=3)  # 2**1 * (3 - 5 / 2)
    tensor([[1.]], dtype=torch.float64)
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor

from inq.codes import unpack_codes
from inq.kernels.layout import cached_layout
from inq.kernels.ops import conv2d_output_size
from inq.pow2 import check_bits

__all__ = [
    "INT_DTYPES",
    "Method",
    "check_conv2d_int8_args",
    "check_int8_args",
    "check_requant_args",
    "check_skip",
    "exact_frac_bits",
    "int8_value",
    "max_frac_bits",
    "quantize_input",
    "quantize_input_reference",
    "requant_add",
    "requant_add_reference",
    "requantize",
    "requantize_channels",
    "shift_conv2d_int8",
    "shift_conv2d_int8_reference",
    "shift_conv2d_int8_requant",
    "shift_conv2d_int8_requant_add",
    "shift_conv2d_int8_requant_add_reference",
    "shift_conv2d_int8_requant_reference",
    "shift_linear_int8",
    "shift_linear_int8_reference",
    "shift_linear_int8_requant",
    "shift_linear_int8_requant_reference",
    "term_classes",
    "value_dtype",
]

INT_DTYPES = (torch.int8, torch.uint8)
Method = Literal["auto", "float64", "int64"]
_MAX_TERMS = 1 << 24  # int64 terms materialised at once by the int64 path
_FLOAT_CHUNK = 1 << 19  # float64 activations per matrix product (stays in cache on a CPU)
_INT32_MAX = (1 << 31) - 1


def exact_frac_bits(bits: int) -> int:
    """The smallest ``frac_bits`` for which every term is exact: the largest offset, 2**(bits-2)-1.

    Example:
        >>> exact_frac_bits(4)
        3
    """
    return (1 << (check_bits(bits) - 2)) - 1


def max_frac_bits(in_features: int, unsigned: bool = False) -> int:
    """The largest ``frac_bits`` that cannot overflow int32 for ``in_features`` terms of int8
    (or, ``unsigned``, uint8) activations.

    A term's magnitude is at most ``m * 2**frac``, where ``m`` is the largest ``|x|`` after the
    sign: 128 for int8 (``-(-128)``), 255 for uint8 (the floor of a negative term, ``-v >> o``,
    is no smaller than ``-v``). ``K`` terms, and every partial sum of them, then stay within
    ``K * m * 2**frac``, which int32 holds when it is at most ``2**31 - 1``. For int8 that is
    ``K * 2**(7 + frac) < 2**31``; for uint8 ``K * 255 * 2**frac < 2**31``. Since
    ``128 <= 255 < 2 * 128``, the uint8 limit is the int8 one or one less.

    Example:
        >>> max_frac_bits(4096), max_frac_bits(4096, unsigned=True)
        (11, 11)
        >>> max_frac_bits(3000), max_frac_bits(3000, unsigned=True)
        (12, 11)

    Raises:
        ValueError: if ``in_features`` is below 1, or so large that even ``frac_bits = 0`` can
            overflow int32.
    """
    m = 255 if unsigned else 128
    if not 1 <= in_features <= _INT32_MAX // m:
        raise ValueError(
            f"in_features must be in [1, {_INT32_MAX // m}] for int32 sums of "
            f"{'uint8' if unsigned else 'int8'} terms, got {in_features}"
        )
    frac = 0
    while (in_features * m) << (frac + 1) <= _INT32_MAX:
        frac += 1
    return frac


def int8_value(y: Tensor, n1: int, frac_bits: int) -> Tensor:
    """The real value ``y * 2**(n1 - frac_bits)`` of an int32 result, in float64 (exact).

    Example:
        >>> int8_value(torch.tensor([6], dtype=torch.int32), n1=0, frac_bits=2)
        tensor([1.5000], dtype=torch.float64)
    """
    return torch.ldexp(y.to(torch.float64), torch.tensor(float(n1 - frac_bits), device=y.device))


def value_dtype(lo: int, hi: int) -> torch.dtype:
    """The narrowest integer dtype of ``[lo, hi]``: uint8, int8 or int32.

    Example:
        >>> value_dtype(0, 255), value_dtype(-8, 7), value_dtype(-2**31, 2**31 - 1)
        (torch.uint8, torch.int8, torch.int32)
    """
    if lo >= 0 and hi <= 255:
        return torch.uint8
    if lo >= -128 and hi <= 127:
        return torch.int8
    return torch.int32


def requantize(
    v: Tensor, multiplier: Tensor | int, shift: Tensor | int, lo: int, hi: int
) -> Tensor:
    """``clamp((v * multiplier + 2**(shift-1)) >> shift, lo, hi)`` in int64 (round half up).

    Example:
        >>> requantize(torch.tensor([5, 6, -6, 1000]), 3, 2, -128, 127)  # 15/4, 18/4, -18/4
        tensor([  4,   5,  -4, 127])
    """
    # Python ints stay scalars: no host-to-device copy, so a CUDA graph can capture this
    if isinstance(shift, Tensor):
        shift = shift.to(torch.int64)
        half: Tensor | int = torch.bitwise_left_shift(torch.ones_like(shift), shift) >> 1
    else:
        half = (1 << shift) >> 1
    if isinstance(multiplier, Tensor):
        multiplier = multiplier.to(torch.int64)
    v = v.to(torch.int64) * multiplier
    return torch.bitwise_right_shift(v + half, shift).clamp_(lo, hi)


def requantize_channels(
    acc: Tensor,
    bias: Tensor,
    multiplier: Tensor,
    shift: Tensor,
    lo: int,
    hi: int,
    channel_dim: int,
) -> Tensor:
    """``requantize(acc + bias, multiplier, shift, lo, hi)`` per output channel along
    ``channel_dim`` (1 of a conv's ``[N, O, OH, OW]``, -1 of a linear op's ``[..., O]``), in
    :func:`value_dtype` of ``[lo, hi]``, keeping ``acc``'s memory format.

    Example:
        >>> acc = torch.tensor([[10, -10]], dtype=torch.int32)
        >>> one = torch.ones(2, dtype=torch.int32)
        >>> shift = torch.tensor([1, 2], dtype=torch.int32)
        >>> requantize_channels(acc, one, one, shift, 0, 255, channel_dim=-1)
        tensor([[6, 0]], dtype=torch.uint8)
    """
    shape = [1] * acc.dim()
    shape[channel_dim] = -1
    v = acc.to(torch.int64) + bias.reshape(shape)
    q = requantize(v, multiplier.reshape(shape), shift.reshape(shape), lo, hi)
    return q.to(value_dtype(lo, hi))


# ---------------------------------------------------------------------------------- checks


def check_int8_args(x: Tensor, bits: int, in_features: int, frac_bits: int) -> None:
    """Raise ``ValueError`` unless the arguments of ``inq::shift_linear_int8`` are valid and
    cannot overflow int32.

    Example:
        >>> check_int8_args(torch.zeros(2, 3000, dtype=torch.uint8), 5, 3000, 12)
        Traceback (most recent call last):
        ...
        ValueError: shift_linear_int8: frac_bits=12 can overflow int32 with 3000 terms of torch.uint8 inputs (allowed: 0..11)
    """  # noqa: E501
    _check_terms("shift_linear_int8", x, bits, in_features, frac_bits)
    if x.shape[-1] != in_features:
        raise ValueError(
            f"shift_linear_int8: x has {x.shape[-1]} features, the weight {in_features}"
        )


def check_conv2d_int8_args(
    x: Tensor,
    bits: int,
    weight_shape: list[int],
    stride: list[int],
    padding: list[int],
    dilation: list[int],
    groups: int,
    frac_bits: int,
) -> None:
    """Raise ``ValueError`` unless the arguments of ``inq::shift_conv2d_int8`` are valid, give
    at least one output pixel and cannot overflow int32 (``K = Cin/groups * kh * kw`` terms).

    Example:
        >>> check_conv2d_int8_args(torch.zeros(1, 3, 8, 8, dtype=torch.int8), 4, [2, 4, 3, 3],
        ...                        [1, 1], [1, 1], [1, 1], 1, 0)
        Traceback (most recent call last):
        ...
        ValueError: shift_conv2d_int8: input [1, 3, 8, 8] does not fit weight [2, 4, 3, 3] with groups=1
    """  # noqa: E501
    op = "shift_conv2d_int8"
    if len(weight_shape) != 4 or min(weight_shape[1:], default=0) < 1 or weight_shape[0] < 0:
        raise ValueError(f"{op}: weight_shape must be [O, Cin/groups, kh, kw], got {weight_shape}")
    if not (len(stride) == len(padding) == len(dilation) == 2):
        raise ValueError(f"{op}: stride, padding and dilation must have two entries each")
    if min(*stride, *dilation) < 1 or min(padding) < 0:
        raise ValueError(
            f"{op}: stride {stride} and dilation {dilation} must be >= 1, padding {padding} >= 0"
        )
    o, cg, kh, kw = weight_shape
    if groups < 1 or x.dim() != 4 or x.shape[1] != cg * groups or o % groups:
        raise ValueError(
            f"{op}: input {list(x.shape)} does not fit weight {weight_shape} with groups={groups}"
        )
    oh, ow = conv2d_output_size(x.shape[-2:], weight_shape, stride, padding, dilation)
    if oh <= 0 or ow <= 0:
        raise ValueError(
            f"{op}: the padded input {list(x.shape[-2:])} is smaller than the dilated kernel "
            f"{weight_shape[2:]}: no output pixel"
        )
    _check_terms(op, x, bits, cg * kh * kw, frac_bits)


def check_requant_args(op: str, rows: int, bias: Tensor, multiplier: Tensor, shift: Tensor) -> None:
    """Raise ``ValueError`` unless ``bias``, ``multiplier`` and ``shift`` are integer tensors of
    ``rows`` entries with shifts in ``0..62`` (the integer model's requantization)."""
    for name, t in (("bias", bias), ("multiplier", multiplier), ("shift", shift)):
        if t.dtype not in (torch.int32, torch.int64) or t.numel() != rows:
            raise ValueError(f"{op}: {name} must be {rows} int32 or int64 values, got {t.dtype} "
                             f"{list(t.shape)}")  # fmt: skip
    # checked once per shift tensor (a device sync the first time, none after: a CUDA graph
    # can capture a warmed-up call)
    if not cached_layout(
        shift, ("shift range",), lambda: bool(((shift >= 0) & (shift <= 62)).all())
    ):
        raise ValueError(f"{op}: shifts must lie in 0..62")


def check_skip(op: str, shape: list[int], skip: Tensor) -> None:
    """Raise ``ValueError`` unless ``skip``, the residual a fused add reads, is an integer value
    (int8, uint8 or int32) of the convolution's output ``shape``."""
    if skip.dtype not in (*INT_DTYPES, torch.int32) or list(skip.shape) != shape:
        raise ValueError(f"{op}: skip must be an int8, uint8 or int32 tensor of the output's "
                         f"shape {shape}, got {skip.dtype} {list(skip.shape)}")  # fmt: skip


def _check_terms(op: str, x: Tensor, bits: int, terms: int, frac_bits: int) -> None:
    """Raise ``ValueError`` unless ``bits`` is valid, ``x`` int8/uint8 and ``frac_bits`` within
    :func:`max_frac_bits` of ``terms``."""
    check_bits(bits)
    if x.dtype not in INT_DTYPES:
        raise ValueError(f"{op}: x must be int8 or uint8, got {x.dtype}")
    limit = max_frac_bits(terms, unsigned=x.dtype == torch.uint8)
    if not 0 <= frac_bits <= limit:
        raise ValueError(
            f"{op}: frac_bits={frac_bits} can overflow int32 with {terms} terms of {x.dtype} "
            f"inputs (allowed: 0..{limit})"
        )


# ---------------------------------------------------------------------------------- ops


@torch.library.custom_op(
    "inq::shift_linear_int8",
    mutates_args=(),
    schema="(Tensor x, Tensor packed, int bits, int in_features, int frac_bits) -> Tensor",
)
def shift_linear_int8(
    x: Tensor, packed: Tensor, bits: int, in_features: int, frac_bits: int
) -> Tensor:
    """int32 ``[..., O]`` from int8 or uint8 ``x [..., in_features]`` (see the module docstring).

    Raises:
        ValueError: as :func:`check_int8_args`.
    """
    return shift_linear_int8_reference(x, packed, bits, in_features, frac_bits)


@shift_linear_int8.register_fake
def _(x: Tensor, packed: Tensor, bits: int, in_features: int, frac_bits: int) -> Tensor:
    torch._check(x.shape[-1] == in_features, lambda: "shift_linear_int8: x.shape[-1] != K")
    return x.new_empty((*x.shape[:-1], packed.shape[0]), dtype=torch.int32)


@torch.library.custom_op(
    "inq::shift_conv2d_int8",
    mutates_args=(),
    schema="(Tensor x, Tensor packed, int bits, int[] weight_shape, int[] stride, "
    "int[] padding, int[] dilation, int groups, int frac_bits) -> Tensor",
)
def shift_conv2d_int8(
    x: Tensor,
    packed: Tensor,
    bits: int,
    weight_shape: list[int],
    stride: list[int],
    padding: list[int],
    dilation: list[int],
    groups: int,
    frac_bits: int,
) -> Tensor:
    """int32 ``[N, O, OH, OW]`` in channels_last memory format (what the next layer's
    tensor-core kernel reads): the 2-d convolution of int8 or uint8 ``x [N, Cin, H, W]``
    (zero padding) in shift-add terms (see the module docstring).

    Raises:
        ValueError: as :func:`check_conv2d_int8_args`.
    """
    return shift_conv2d_int8_reference(
        x, packed, bits, weight_shape, stride, padding, dilation, groups, frac_bits
    )


@shift_conv2d_int8.register_fake
def _(
    x: Tensor,
    packed: Tensor,
    bits: int,
    weight_shape: list[int],
    stride: list[int],
    padding: list[int],
    dilation: list[int],
    groups: int,
    frac_bits: int,
) -> Tensor:
    torch._check(x.dim() == 4, lambda: "shift_conv2d_int8: x must be [N, Cin, H, W]")
    torch._check(
        x.shape[1] == weight_shape[1] * groups, lambda: "shift_conv2d_int8: channels do not match"
    )
    spatial = conv2d_output_size(x.shape[-2:], weight_shape, stride, padding, dilation)
    return torch.empty((x.shape[0], weight_shape[0], *spatial), dtype=torch.int32,
                       device=x.device, memory_format=torch.channels_last)  # fmt: skip


@torch.library.custom_op(
    "inq::shift_linear_int8_requant",
    mutates_args=(),
    schema="(Tensor x, Tensor packed, int bits, int in_features, int frac_bits, Tensor bias, "
    "Tensor multiplier, Tensor shift, int lo, int hi) -> Tensor",
)
def shift_linear_int8_requant(
    x: Tensor, packed: Tensor, bits: int, in_features: int, frac_bits: int, bias: Tensor,
    multiplier: Tensor, shift: Tensor, lo: int, hi: int,
) -> Tensor:  # fmt: skip
    """``inq::shift_linear_int8`` with the integer model's requantization fused:
    :func:`requantize_channels` of its int32 result with int32 ``bias``, ``multiplier`` and
    ``shift`` per output, in :func:`value_dtype` of ``[lo, hi]``.

    Raises:
        ValueError: as :func:`check_int8_args` and :func:`check_requant_args`.
    """
    return shift_linear_int8_requant_reference(
        x, packed, bits, in_features, frac_bits, bias, multiplier, shift, lo, hi
    )


@shift_linear_int8_requant.register_fake
def _(x, packed, bits, in_features, frac_bits, bias, multiplier, shift, lo, hi):
    torch._check(x.shape[-1] == in_features, lambda: "shift_linear_int8_requant: x.shape[-1] != K")
    return x.new_empty((*x.shape[:-1], packed.shape[0]), dtype=value_dtype(lo, hi))


@torch.library.custom_op(
    "inq::shift_conv2d_int8_requant",
    mutates_args=(),
    schema="(Tensor x, Tensor packed, int bits, int[] weight_shape, int[] stride, "
    "int[] padding, int[] dilation, int groups, int frac_bits, Tensor bias, Tensor multiplier, "
    "Tensor shift, int lo, int hi) -> Tensor",
)
def shift_conv2d_int8_requant(
    x: Tensor, packed: Tensor, bits: int, weight_shape: list[int], stride: list[int],
    padding: list[int], dilation: list[int], groups: int, frac_bits: int, bias: Tensor,
    multiplier: Tensor, shift: Tensor, lo: int, hi: int,
) -> Tensor:  # fmt: skip
    """``inq::shift_conv2d_int8`` with the integer model's requantization fused (as
    :func:`shift_linear_int8_requant`, per output channel), channels_last.

    Raises:
        ValueError: as :func:`check_conv2d_int8_args` and :func:`check_requant_args`.
    """
    return shift_conv2d_int8_requant_reference(
        x, packed, bits, weight_shape, stride, padding, dilation, groups, frac_bits, bias,
        multiplier, shift, lo, hi,
    )  # fmt: skip


@shift_conv2d_int8_requant.register_fake
def _(x, packed, bits, weight_shape, stride, padding, dilation, groups, frac_bits, bias,
      multiplier, shift, lo, hi):  # fmt: skip
    torch._check(x.dim() == 4, lambda: "shift_conv2d_int8_requant: x must be [N, Cin, H, W]")
    spatial = conv2d_output_size(x.shape[-2:], weight_shape, stride, padding, dilation)
    return torch.empty((x.shape[0], weight_shape[0], *spatial), dtype=value_dtype(lo, hi),
                       device=x.device, memory_format=torch.channels_last)  # fmt: skip


@torch.library.custom_op(
    "inq::requant_add",
    mutates_args=(),
    schema="(Tensor x, Tensor y, int m_x, int m_y, int shift, int lo, int hi) -> Tensor",
)
def requant_add(x: Tensor, y: Tensor, m_x: int, m_y: int, shift: int, lo: int, hi: int) -> Tensor:
    """The integer model's residual add: ``requantize(x * m_x + y * m_y, 1, shift, lo, hi)`` in
    int64, in :func:`value_dtype` of ``[lo, hi]``, ``x``'s memory format (one pass on a GPU).

    Example:
        >>> x, y = torch.tensor([10, 200], dtype=torch.uint8), torch.tensor([-3, 7], dtype=torch.int8)
        >>> requant_add(x, y, 2, 4, 2, 0, 255)  # (20 - 12) / 4, (400 + 28) / 4
        tensor([  2, 107], dtype=torch.uint8)
    """  # noqa: E501
    return requant_add_reference(x, y, m_x, m_y, shift, lo, hi)


def requant_add_reference(
    x: Tensor, y: Tensor, m_x: int, m_y: int, shift: int, lo: int, hi: int
) -> Tensor:
    """The reference of ``inq::requant_add`` (PyTorch int64 ops)."""
    v = x.to(torch.int64) * m_x + y.to(torch.int64) * m_y
    return requantize(v, 1, shift, lo, hi).to(value_dtype(lo, hi))


@requant_add.register_fake
def _(x, y, m_x, m_y, shift, lo, hi):
    torch._check(x.shape == y.shape, lambda: "requant_add: x and y differ in shape")
    return torch.empty_like(x, dtype=value_dtype(lo, hi))


@torch.library.custom_op(
    "inq::shift_conv2d_int8_requant_add",
    mutates_args=(),
    schema="(Tensor x, Tensor packed, int bits, int[] weight_shape, int[] stride, "
    "int[] padding, int[] dilation, int groups, int frac_bits, Tensor bias, Tensor multiplier, "
    "Tensor shift, int lo, int hi, Tensor skip, int m_conv, int m_skip, int add_shift, "
    "int add_lo, int add_hi) -> Tensor",
)
def shift_conv2d_int8_requant_add(
    x: Tensor, packed: Tensor, bits: int, weight_shape: list[int], stride: list[int],
    padding: list[int], dilation: list[int], groups: int, frac_bits: int, bias: Tensor,
    multiplier: Tensor, shift: Tensor, lo: int, hi: int, skip: Tensor, m_conv: int, m_skip: int,
    add_shift: int, add_lo: int, add_hi: int,
) -> Tensor:  # fmt: skip
    """A convolution and the residual add that takes it, as one op:
    ``requant_add(shift_conv2d_int8_requant(x, ...), skip, m_conv, m_skip, add_shift, add_lo,
    add_hi)``, channels_last. The convolution's requantized value (clamped to ``[lo, hi]``) is
    what the add reads, so the result is the two ops' bit for bit; on a GPU the add runs in the
    convolution's epilogue and the convolution's output is never written.

    Raises:
        ValueError: as :func:`shift_conv2d_int8_requant`, or where ``skip`` is not an integer
            tensor of the convolution's output shape.
    """
    return shift_conv2d_int8_requant_add_reference(
        x, packed, bits, weight_shape, stride, padding, dilation, groups, frac_bits, bias,
        multiplier, shift, lo, hi, skip, m_conv, m_skip, add_shift, add_lo, add_hi,
    )  # fmt: skip


def shift_conv2d_int8_requant_add_reference(
    x: Tensor, packed: Tensor, bits: int, weight_shape: list[int], stride: list[int],
    padding: list[int], dilation: list[int], groups: int, frac_bits: int, bias: Tensor,
    multiplier: Tensor, shift: Tensor, lo: int, hi: int, skip: Tensor, m_conv: int, m_skip: int,
    add_shift: int, add_lo: int, add_hi: int,
) -> Tensor:  # fmt: skip
    """The reference of ``inq::shift_conv2d_int8_requant_add``: the two references in turn."""
    conv = shift_conv2d_int8_requant_reference(
        x, packed, bits, weight_shape, stride, padding, dilation, groups, frac_bits, bias,
        multiplier, shift, lo, hi,
    )  # fmt: skip
    check_skip("shift_conv2d_int8_requant_add", list(conv.shape), skip)
    return requant_add_reference(conv, skip, m_conv, m_skip, add_shift, add_lo, add_hi)


@shift_conv2d_int8_requant_add.register_fake
def _(x, packed, bits, weight_shape, stride, padding, dilation, groups, frac_bits, bias,
      multiplier, shift, lo, hi, skip, m_conv, m_skip, add_shift, add_lo, add_hi):  # fmt: skip
    torch._check(x.dim() == 4, lambda: "shift_conv2d_int8_requant_add: x must be [N, Cin, H, W]")
    spatial = conv2d_output_size(x.shape[-2:], weight_shape, stride, padding, dilation)
    shape = [x.shape[0], weight_shape[0], *spatial]
    torch._check(
        list(skip.shape) == shape,
        lambda: "shift_conv2d_int8_requant_add: skip differs from the output in shape",
    )
    return x.new_empty(shape, dtype=value_dtype(add_lo, add_hi)).contiguous(
        memory_format=torch.channels_last
    )


@torch.library.custom_op(
    "inq::quantize_input",
    mutates_args=(),
    schema="(Tensor x, float scale, int lo, int hi) -> Tensor",
)
def quantize_input(x: Tensor, scale: float, lo: int, hi: int) -> Tensor:
    """The integer model's input: ``clamp(floor(x / scale + 1/2), lo, hi)`` in float64, in
    :func:`value_dtype` of ``[lo, hi]`` (one pass on a GPU).

    Example:
        >>> quantize_input(torch.tensor([0.26, -1.0, 9.0]), 0.125, -8, 7)  # 2.08, -8, 72
        tensor([ 2, -8,  7], dtype=torch.int8)
    """
    return quantize_input_reference(x, scale, lo, hi)


def quantize_input_reference(x: Tensor, scale: float, lo: int, hi: int) -> Tensor:
    """The reference of ``inq::quantize_input`` (PyTorch float64 ops)."""
    q = torch.floor(x.to(torch.float64) / scale + 0.5).clamp_(lo, hi)
    return q.to(value_dtype(lo, hi))


@quantize_input.register_fake
def _(x, scale, lo, hi):
    return torch.empty_like(x, dtype=value_dtype(lo, hi))


# ---------------------------------------------------------------------------------- references


def shift_linear_int8_reference(
    x: Tensor,
    packed: Tensor,
    bits: int,
    in_features: int,
    frac_bits: int,
    method: Method = "auto",
) -> Tensor:
    """The integer reference of ``inq::shift_linear_int8``, on ``x``'s device.

    ``method="int64"`` adds every floored term in int64 tensor arithmetic: the definition, and
    slow (one int64 tensor element per term). ``method="float64"`` (what ``"auto"`` takes,
    except on MPS, which has no float64) gets the same integers from float64 matrix products:

    - Where ``frac >= o`` no shift floors: the term is the exact integer ``x * w`` with
      ``w = (-1)**s * 2**(frac - o)``, so these codes give ``x @ W.T`` for that integer ``W``.
      When ``frac_bits`` reaches every offset in the weight, that one product is all.
    - Where ``o > frac`` the term is ``floor((-1)**s * x / 2**d)``, ``d = o - frac``: an integer
      transform of ``x`` (the same for every ``d >= 8``, as ``|x| < 2**8``) times a 0/1
      indicator of the codes with that sign and ``d``: one more product a class in use.

    All products go into one matrix product (the classes stacked along K). It is exact in any
    summation order (and with FMAs): every product is one term or zero, an integer below
    ``2**31``, and the overflow check bounds every partial sum of any subset of the terms by
    ``sum |term| <= K * max|x| * 2**frac < 2**31 < 2**53``, so float64 holds every intermediate
    exactly.

    Example:
        >>> from inq.codes import pack_codes
        >>> packed = pack_codes(torch.tensor([[9, 0, 15]], dtype=torch.uint8), 4)  # [1/2, 0, -1/8]
        >>> x = torch.tensor([[200, 7, 9]], dtype=torch.uint8)
        >>> shift_linear_int8_reference(x, packed, 4, 3, frac_bits=3)  # 200*4 - 9
        tensor([[791]], dtype=torch.int32)
        >>> shift_linear_int8_reference(x, packed, 4, 3, frac_bits=0)  # (200 >> 1) + (-9 >> 3)
        tensor([[98]], dtype=torch.int32)

    Raises:
        ValueError: as :func:`check_int8_args`; for bad packed codes or ``method``.
    """
    check_int8_args(x, bits, in_features, frac_bits)
    codes = unpack_codes(packed, bits, in_features).to(torch.int64)
    rows = x.reshape(-1, in_features)
    out = torch.empty((rows.shape[0], codes.shape[0]), dtype=torch.int32, device=x.device)
    parts = _float_parts(codes, bits, frac_bits, method, x.device)
    if parts is not None:
        classes, weights = parts  # weights [P, O, K] -> [O, P * K]
        weight = weights.permute(1, 0, 2).reshape(codes.shape[0], len(classes) * in_features)
        step = max(1, _FLOAT_CHUNK // weight.shape[1])
    else:
        step = max(1, _MAX_TERMS // in_features)
    for r in range(0, rows.shape[0], step):
        block = rows[r : r + step]
        if parts is not None:
            stacked = _floor_classes(block, classes, dim=1).flatten(1)  # [rows, P * K]
            out[r : r + step] = F.linear(stacked, weight).to(torch.int32)
        else:
            out[r : r + step] = _term_sums(block, codes, bits, frac_bits).to(torch.int32)
    return out.reshape(*x.shape[:-1], codes.shape[0])


def shift_conv2d_int8_reference(
    x: Tensor,
    packed: Tensor,
    bits: int,
    weight_shape: list[int],
    stride: list[int],
    padding: list[int],
    dilation: list[int],
    groups: int,
    frac_bits: int,
    method: Method = "auto",
) -> Tensor:
    """The integer reference of ``inq::shift_conv2d_int8``, on ``x``'s device (channels_last
    memory format, as the op).

    Output ``(n, o, i, j)`` of group ``g`` sums the linear op's terms over ``k`` in the packed
    row order ``(c, r, s)`` of ``weight.reshape(O, -1)``, with the activation
    ``x[n, g * Cin/groups + c, i * stride_h - pad_h + r * dil_h, j * stride_w - pad_w + s * dil_w]``,
    0 outside the input. The activations are gathered (an im2col of ``x``'s own dtype, a few
    images at a time) and summed as in :func:`shift_linear_int8_reference`, whose ``method``
    (and exactness argument for float64) this shares: an explicit matrix product, so no
    convolution algorithm (FFT, Winograd) can round.

    Example:
        >>> from inq.codes import pack_codes
        >>> codes = torch.tensor([[8, 0, 0, 9]], dtype=torch.uint8)  # 2x2 taps [[1, 0], [0, 1/2]]
        >>> x = torch.arange(9, dtype=torch.uint8).reshape(1, 1, 3, 3)
        >>> shift_conv2d_int8_reference(x, pack_codes(codes, 4), 4, [1, 1, 2, 2], [1, 1],
        ...                             [0, 0], [1, 1], 1, frac_bits=1)  # 2 * x[i, j] + x[i+1, j+1]
        tensor([[[[ 4,  7],
                  [13, 16]]]], dtype=torch.int32)

    Raises:
        ValueError: as :func:`check_conv2d_int8_args`; for bad packed codes or ``method``.
    """  # noqa: E501
    check_conv2d_int8_args(x, bits, weight_shape, stride, padding, dilation, groups, frac_bits)
    o, cg, kh, kw = weight_shape
    k, og = cg * kh * kw, o // groups
    codes = unpack_codes(packed, bits, k).to(torch.int64)
    if codes.shape[0] != o:
        raise ValueError(f"shift_conv2d_int8: {codes.shape[0]} packed rows for {o} outputs")
    oh, ow = conv2d_output_size(x.shape[-2:], weight_shape, stride, padding, dilation)
    n, pixels = x.shape[0], oh * ow
    out = torch.empty((n, o, oh, ow), dtype=torch.int32, device=x.device)
    parts = _float_parts(codes, bits, frac_bits, method, x.device)
    if parts is not None:
        classes, weights = parts  # weights [P, O, K] -> [G, Og, P * K]
        weight = weights.view(len(classes), groups, og, k).permute(1, 2, 0, 3)
        weight = weight.reshape(groups, og, len(classes) * k)
        budget = _FLOAT_CHUNK // (groups * len(classes) * k)  # output pixels a block
    else:
        budget = _MAX_TERMS // (groups * k)
    images, block = max(1, budget // pixels), max(1, min(pixels, budget))
    flat = out.view(n, o, pixels)
    for i in range(0, n, images):
        cols = _im2col(x[i : i + images], (kh, kw), stride, padding, dilation, (oh, ow))
        cols = cols.view(cols.shape[0], groups, k, pixels)
        for p in range(0, pixels, block):
            part = cols[..., p : p + block]  # [n, G, K, pixels]
            if parts is not None:  # [G, Og, P * K] @ [n, G, P * K, pixels]
                y = torch.matmul(weight, _floor_classes(part, classes, dim=2).flatten(2, 3))
            else:
                y = _conv_term_sums(part, codes, bits, frac_bits)
            flat[i : i + images, :, p : p + block] = y.reshape(part.shape[0], o, part.shape[-1])
    return out.contiguous(memory_format=torch.channels_last)


def shift_linear_int8_requant_reference(
    x: Tensor, packed: Tensor, bits: int, in_features: int, frac_bits: int, bias: Tensor,
    multiplier: Tensor, shift: Tensor, lo: int, hi: int,
) -> Tensor:  # fmt: skip
    """The reference of ``inq::shift_linear_int8_requant``: :func:`requantize_channels` of
    :func:`shift_linear_int8_reference`."""
    check_requant_args("shift_linear_int8_requant", packed.shape[0], bias, multiplier, shift)
    acc = shift_linear_int8_reference(x, packed, bits, in_features, frac_bits)
    return requantize_channels(acc, bias, multiplier, shift, lo, hi, channel_dim=-1)


def shift_conv2d_int8_requant_reference(
    x: Tensor, packed: Tensor, bits: int, weight_shape: list[int], stride: list[int],
    padding: list[int], dilation: list[int], groups: int, frac_bits: int, bias: Tensor,
    multiplier: Tensor, shift: Tensor, lo: int, hi: int,
) -> Tensor:  # fmt: skip
    """The reference of ``inq::shift_conv2d_int8_requant``: :func:`requantize_channels` of
    :func:`shift_conv2d_int8_reference` (channels_last)."""
    check_requant_args("shift_conv2d_int8_requant", weight_shape[0], bias, multiplier, shift)
    acc = shift_conv2d_int8_reference(
        x, packed, bits, weight_shape, stride, padding, dilation, groups, frac_bits
    )
    return requantize_channels(acc, bias, multiplier, shift, lo, hi, channel_dim=1)


def _fields(codes: Tensor, bits: int) -> tuple[Tensor, Tensor, Tensor]:
    """(non-zero, negative, offset) of int64 codes."""
    nonzero = (codes >> (bits - 1)) != 0
    negative = ((codes >> (bits - 2)) & 1) != 0
    return nonzero, negative, codes & ((1 << (bits - 2)) - 1)


def _float_parts(
    codes: Tensor, bits: int, frac_bits: int, method: Method, device: torch.device
) -> tuple[list[tuple[int, int]], Tensor] | None:
    """None where ``method`` takes the int64 path; else the float64 path's classes
    ``(sign, d)``, each standing for the activations ``floor(sign * x / 2**d)``, and the float64
    weights ``[P, O, K]`` they multiply (see :func:`shift_linear_int8_reference`)."""
    if method not in ("auto", "float64", "int64"):
        raise ValueError(f"method must be 'auto', 'float64' or 'int64', got {method!r}")
    if method == "int64" or (method == "auto" and device.type == "mps"):
        return None
    return term_classes(codes, bits, frac_bits)


def term_classes(codes: Tensor, bits: int, frac_bits: int) -> tuple[list[tuple[int, int]], Tensor]:
    """The shift-add op as integer matrix products: classes ``(sign, d)``, each standing for
    the activations ``floor(sign * x / 2**d)`` (``(1, 0)`` first: ``x`` itself), and the
    float64 integer weights ``[P, O, K]`` they multiply, so that the op is
    ``sum_p floor(sign_p * x / 2**d_p) @ weights[p].T`` exactly.

    Example:
        >>> codes = torch.tensor([[9, 0, 15]])  # 4 bits: [1/2, 0, -1/8]
        >>> classes, weights = term_classes(codes, 4, frac_bits=0)
        >>> classes, weights.tolist()  # floor(x / 2) + floor(-x / 8)
        ([(1, 0), (1, 1), (-1, 3)], [[[0.0, 0.0, 0.0]], [[1.0, 0.0, 0.0]], [[0.0, 0.0, 1.0]]])
    """
    nonzero, negative, offset = _fields(codes, bits)
    exact = nonzero & (offset <= frac_bits)
    magnitude = (1 << (frac_bits - offset).clamp(min=0)).to(torch.float64)
    classes = [(1, 0)]
    weights = [torch.where(negative, -magnitude, magnitude).masked_fill_(~exact, 0.0)]
    shift = (offset - frac_bits).clamp(max=8)  # |x| < 2**8: every larger shift floors alike
    for d in range(1, 9):
        for sign, members in ((1, nonzero & ~negative), (-1, nonzero & negative)):
            member = members & (shift == d)
            if bool(member.any()):
                classes.append((sign, d))
                weights.append(member.to(torch.float64))
    return classes, torch.stack(weights)


def _floor_classes(x: Tensor, classes: list[tuple[int, int]], dim: int) -> Tensor:
    """float64 ``floor(sign * x / 2**d)`` of integer ``x`` for every class, stacked at ``dim``
    (exact: ``x * 2**-d`` is a float64 without rounding)."""
    wide = x.to(torch.float64).unsqueeze(dim)
    if len(classes) == 1:  # (1, 0): x itself
        return wide
    scale = [sign * 2.0**-d for sign, d in classes]
    scale = torch.tensor(scale, dtype=torch.float64, device=x.device)
    return torch.floor_(wide * scale.view(-1, *[1] * (x.dim() - dim)))


def _conv_term_sums(cols: Tensor, codes: Tensor, bits: int, frac_bits: int) -> Tensor:
    """int64 ``[n, O, pixels]`` of ``cols [n, G, K, pixels]`` by :func:`_term_sums`, a group at
    a time."""
    n, groups, k, pixels = cols.shape
    og = codes.shape[0] // groups
    sums = []
    for g in range(groups):
        rows = cols[:, g].transpose(1, 2).reshape(n * pixels, k)
        y = _term_sums(rows, codes[g * og : (g + 1) * og], bits, frac_bits)
        sums.append(y.view(n, pixels, og).transpose(1, 2))
    return torch.cat(sums, dim=1)


def _term_sums(rows: Tensor, codes: Tensor, bits: int, frac_bits: int) -> Tensor:
    """int64 ``[M, O]``: every term of integer ``rows [M, K]`` and int64 ``codes [O, K]``,
    floored and added one by one (a few output columns at a time)."""
    nonzero, negative, offset = _fields(codes, bits)
    v = rows.to(torch.int64) << frac_bits
    out = torch.empty((rows.shape[0], codes.shape[0]), dtype=torch.int64, device=rows.device)
    step = max(1, _MAX_TERMS // max(1, rows.numel()))
    for o in range(0, codes.shape[0], step):
        sl = slice(o, o + step)
        signed = torch.where(negative[None, sl], -v[:, None, :], v[:, None, :])  # [M, o, K]
        terms = (signed >> offset[None, sl]).masked_fill_(~nonzero[None, sl], 0)
        out[:, sl] = terms.sum(dim=-1)
    return out


def _im2col(
    x: Tensor,
    kernel: tuple[int, int],
    stride: list[int],
    padding: list[int],
    dilation: list[int],
    out_size: tuple[int, int],
) -> Tensor:
    """``[N, Cin * kh * kw, OH * OW]`` in ``x``'s dtype, rows in ``(c, r, s)`` order; zero
    padding (``F.unfold`` has no integer kernels)."""
    (kh, kw), (oh, ow) = kernel, out_size
    xp = F.pad(x, (padding[1], padding[1], padding[0], padding[0]))
    taps = [
        xp[:, :,
           r * dilation[0] : r * dilation[0] + stride[0] * (oh - 1) + 1 : stride[0],
           s * dilation[1] : s * dilation[1] + stride[1] * (ow - 1) + 1 : stride[1]]
        for r in range(kh)
        for s in range(kw)
    ]  # fmt: skip
    return torch.stack(taps, dim=2).reshape(x.shape[0], -1, oh * ow)
