"""``inq::max_pool2d_int`` and ``inq::avg_pool2d_requant``: the integer model's pooling.

Both take integer activations ``x [N, C, H, W]`` (uint8, int8, int16 or int32; the integer
model's values are uint8 or int8) in either memory format.

- ``max_pool2d_int``: ``F.max_pool2d``'s geometry (kernel, stride, padding, dilation,
  ceil_mode), in ``x``'s dtype and the memory format PyTorch's pooling gives (channels_last in,
  channels_last out). A maximum picks one of its inputs, so it is exact in any order.
- ``avg_pool2d_requant``: window sums (``kernel``/``stride``, no padding) or, with ``kernel``
  None, the sum over the whole map (global average pooling, ``[N, C, 1, 1]``), then
  :func:`~inq.kernels.int8.requantize` ``(total, multiplier, shift, lo, hi)``: int64, round half
  up, clamp, in :func:`~inq.kernels.int8.value_dtype` of ``[lo, hi]``. The ``1/count`` of the
  average lives in the multiplier (as the integer model computes it).

The references here run on any device and define the results; the Triton kernels
(:mod:`inq.kernels.triton.pool`) are registered as the CUDA implementations.

Example:
    >>> x = torch.tensor([[[[1, 9], [250, 3]]]], dtype=torch.uint8)
    >>> max_pool2d_int(x, [2, 2], [2, 2], [0, 0], [1, 1], False)
    tensor([[[[250]]]], dtype=torch.uint8)
    >>> avg_pool2d_requant(x, None, None, 1, 2, 0, 255)  # (263 + 2) >> 2
    tensor([[[[66]]]], dtype=torch.uint8)
"""

from __future__ import annotations

from functools import cache

import torch
import torch.nn.functional as F
from torch import Tensor

from inq.kernels.int8 import requantize, value_dtype
from inq.kernels.ops import output_format

__all__ = [
    "POOL_DTYPES",
    "avg_pool2d_requant",
    "avg_pool2d_requant_reference",
    "check_avg_pool_args",
    "check_max_pool_args",
    "max_pool2d_int",
    "max_pool2d_int_reference",
    "pool_output_size",
]

POOL_DTYPES = (torch.uint8, torch.int8, torch.int16, torch.int32)
MAX_SHIFT = 62  # as the integer model: total * multiplier + the rounding half stays in int64


def pool_output_size(size: int, kernel: int, stride: int, padding: int, dilation: int,
                     ceil_mode: bool) -> int:  # fmt: skip
    """Output length of one spatial dimension, as PyTorch's pooling computes it (with
    ``ceil_mode`` the last window must start inside the input or its left padding).

    Example:
        >>> pool_output_size(112, 3, 2, 1, 1, False), pool_output_size(5, 2, 2, 0, 1, True)
        (56, 3)
    """
    span = size + 2 * padding - dilation * (kernel - 1) - 1 + (stride - 1 if ceil_mode else 0)
    out = span // stride + 1
    if ceil_mode and (out - 1) * stride >= size + padding:
        out -= 1
    return out


@cache
def _window_misses(size: int, k: int, stride: int, pad: int, dilation: int, out: int) -> bool:
    """Whether some window of one dimension holds no input element (only dilation can do it:
    PyTorch keeps ``pad <= k // 2``, and with ``ceil_mode`` every window starts before the
    input's end)."""
    return any(
        all(not 0 <= i * stride - pad + r * dilation < size for r in range(k)) for i in range(out)
    )


def _check_x(op: str, x: Tensor) -> None:
    if x.dim() != 4 or x.dtype not in POOL_DTYPES:
        raise ValueError(
            f"{op}: x must be [N, C, H, W] of uint8, int8, int16 or int32, got {x.dtype} "
            f"{list(x.shape)}"
        )


def _pairs(op: str, **pairs: list[int]) -> None:
    for name, value in pairs.items():
        if len(value) != 2:
            raise ValueError(f"{op}: {name} must have two entries, got {list(value)}")


def check_max_pool_args(
    x: Tensor, kernel: list[int], stride: list[int], padding: list[int], dilation: list[int],
    ceil_mode: bool,
) -> tuple[int, int]:  # fmt: skip
    """The output size ``(OH, OW)`` of ``inq::max_pool2d_int``.

    Raises:
        ValueError: unless ``x`` is a 4-d tensor of :data:`POOL_DTYPES`, the geometry is one
            ``F.max_pool2d`` takes (two entries each, kernel, stride and dilation >= 1,
            ``0 <= padding <= kernel // 2``), gives an output pixel, and every window holds an
            input element (with dilation one can miss the input, where PyTorch's float path
            gives ``-inf``, which has no integer).
    """
    op = "max_pool2d_int"
    _check_x(op, x)
    _pairs(op, kernel=kernel, stride=stride, padding=padding, dilation=dilation)
    if min(*kernel, *stride, *dilation) < 1 or not all(
        0 <= p <= k // 2 for p, k in zip(padding, kernel, strict=True)
    ):
        raise ValueError(
            f"{op}: kernel {kernel}, stride {stride} and dilation {dilation} must be >= 1, "
            f"padding {padding} from 0 to half the kernel"
        )
    size = x.shape[-2:]
    geometry = list(zip(size, kernel, stride, padding, dilation, strict=True))
    out = [pool_output_size(*g, ceil_mode) for g in geometry]
    if min(out) < 1:
        raise ValueError(f"{op}: input {list(size)} gives no output pixel with kernel {kernel}")
    if any(_window_misses(*g, o) for g, o in zip(geometry, out, strict=True)):
        raise ValueError(
            f"{op}: a window of kernel {kernel}, dilation {dilation}, padding {padding} holds "
            f"no element of the input {list(size)}"
        )
    return out[0], out[1]


def check_avg_pool_args(
    x: Tensor, kernel: list[int] | None, stride: list[int] | None, shift: int
) -> tuple[list[int], list[int]]:
    """The window and stride of ``inq::avg_pool2d_requant``: ``(H, W)`` twice for a global pool
    (``kernel`` None), ``stride`` defaulting to ``kernel``.

    Raises:
        ValueError: unless ``x`` is a 4-d tensor of :data:`POOL_DTYPES`, the window fits the
            input, ``stride`` is None for a global pool, and ``0 <= shift <= 62``.
    """
    op = "avg_pool2d_requant"
    _check_x(op, x)
    if not 0 <= shift <= MAX_SHIFT:
        raise ValueError(f"{op}: shift must lie in 0..{MAX_SHIFT}, got {shift}")
    size = list(x.shape[-2:])
    if kernel is None:
        if stride is not None:
            raise ValueError(f"{op}: a global pool (kernel None) takes no stride, got {stride}")
        return size, size
    stride = kernel if stride is None else stride
    _pairs(op, kernel=kernel, stride=stride)
    if min(*kernel, *stride) < 1 or any(k > s for k, s in zip(kernel, size, strict=True)):
        raise ValueError(
            f"{op}: kernel {kernel} and stride {stride} must be >= 1, the kernel within the "
            f"input {size}"
        )
    return list(kernel), list(stride)


# ---------------------------------------------------------------------------------- ops


@torch.library.custom_op(
    "inq::max_pool2d_int",
    mutates_args=(),
    schema="(Tensor x, int[] kernel, int[] stride, int[] padding, int[] dilation, "
    "bool ceil_mode) -> Tensor",
)
def max_pool2d_int(
    x: Tensor, kernel: list[int], stride: list[int], padding: list[int], dilation: list[int],
    ceil_mode: bool,
) -> Tensor:  # fmt: skip
    """``F.max_pool2d`` of integer ``x`` in its own dtype (one pass on a GPU; see the module
    docstring).

    Example:
        >>> x = torch.tensor([[[[-128, 7, 127]]]], dtype=torch.int8)
        >>> max_pool2d_int(x, [1, 2], [1, 2], [0, 1], [1, 1], False)  # padding never wins
        tensor([[[[-128,  127]]]], dtype=torch.int8)

    Raises:
        ValueError: as :func:`check_max_pool_args`.
    """
    return max_pool2d_int_reference(x, kernel, stride, padding, dilation, ceil_mode)


def max_pool2d_int_reference(
    x: Tensor, kernel: list[int], stride: list[int], padding: list[int], dilation: list[int],
    ceil_mode: bool,
) -> Tensor:  # fmt: skip
    """The reference of ``inq::max_pool2d_int``: ``F.max_pool2d`` in float32 (float64 for
    int32), exact since every integer of the dtype is a float of that precision and the
    maximum picks one of them; PyTorch's memory format."""
    check_max_pool_args(x, kernel, stride, padding, dilation, ceil_mode)
    wide = torch.float64 if x.dtype == torch.int32 else torch.float32
    y = F.max_pool2d(x.to(wide), kernel, stride, padding, dilation, ceil_mode)
    return y.to(x.dtype)


@max_pool2d_int.register_fake
def _(x, kernel, stride, padding, dilation, ceil_mode):
    torch._check(x.dim() == 4, lambda: "max_pool2d_int: x must be [N, C, H, W]")
    geometry = zip(x.shape[-2:], kernel, stride, padding, dilation, strict=True)
    out = [pool_output_size(*g, ceil_mode) for g in geometry]
    return torch.empty((*x.shape[:2], *out), dtype=x.dtype, device=x.device,
                       memory_format=output_format(x))  # fmt: skip


@torch.library.custom_op(
    "inq::avg_pool2d_requant",
    mutates_args=(),
    schema="(Tensor x, int[]? kernel, int[]? stride, int multiplier, int shift, int lo, int hi) "
    "-> Tensor",
)
def avg_pool2d_requant(
    x: Tensor, kernel: list[int] | None, stride: list[int] | None, multiplier: int, shift: int,
    lo: int, hi: int,
) -> Tensor:  # fmt: skip
    """The integer model's average pooling: window sums (``kernel``, ``stride`` defaulting to
    it, no padding) or, ``kernel`` None, map sums ``[N, C, 1, 1]``, requantized by
    ``requantize(total, multiplier, shift, lo, hi)`` in :func:`value_dtype` of ``[lo, hi]``
    (one pass on a GPU).

    Example:
        >>> x = torch.tensor([[[[-3, -2], [0, 0]]]], dtype=torch.int8)
        >>> avg_pool2d_requant(x, None, None, 1, 1, -128, 127)  # -5 / 2 rounds half up to -2
        tensor([[[[-2]]]], dtype=torch.int8)
        >>> avg_pool2d_requant(x, [1, 2], None, 3, 2, -128, 127)  # -15 / 4, 0
        tensor([[[[-4],
                  [ 0]]]], dtype=torch.int8)

    Raises:
        ValueError: as :func:`check_avg_pool_args`.
    """
    return avg_pool2d_requant_reference(x, kernel, stride, multiplier, shift, lo, hi)


def avg_pool2d_requant_reference(
    x: Tensor, kernel: list[int] | None, stride: list[int] | None, multiplier: int, shift: int,
    lo: int, hi: int,
) -> Tensor:  # fmt: skip
    """The reference of ``inq::avg_pool2d_requant``: int64 sums (over the map, or of the
    window's strided slices, in PyTorch's memory format for the pooled map), then
    :func:`requantize`."""
    (kh, kw), (sh, sw) = check_avg_pool_args(x, kernel, stride, shift)
    wide = x.to(torch.int64)
    if kernel is None:
        total = wide.sum(dim=(2, 3), keepdim=True)
    else:
        oh, ow = (x.shape[2] - kh) // sh + 1, (x.shape[3] - kw) // sw + 1
        total = torch.empty((*x.shape[:2], oh, ow), dtype=torch.int64, device=x.device,
                            memory_format=output_format(x)).zero_()  # fmt: skip
        for r in range(kh):
            for s in range(kw):
                total += wide[:, :, r : r + sh * (oh - 1) + 1 : sh, s : s + sw * (ow - 1) + 1 : sw]
    return requantize(total, multiplier, shift, lo, hi).to(value_dtype(lo, hi))


@avg_pool2d_requant.register_fake
def _(x, kernel, stride, multiplier, shift, lo, hi):
    torch._check(x.dim() == 4, lambda: "avg_pool2d_requant: x must be [N, C, H, W]")
    if kernel is None:
        return x.new_empty((*x.shape[:2], 1, 1), dtype=value_dtype(lo, hi))
    stride = kernel if stride is None else stride
    out = [(n - k) // s + 1 for n, k, s in zip(x.shape[-2:], kernel, stride, strict=True)]
    return torch.empty((*x.shape[:2], *out), dtype=value_dtype(lo, hi), device=x.device,
                       memory_format=output_format(x))  # fmt: skip
