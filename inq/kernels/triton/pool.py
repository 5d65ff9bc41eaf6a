"""The integer model's pooling in Triton: ``inq::max_pool2d_int`` and
``inq::avg_pool2d_requant``, one pass each, bit for bit the references of
:mod:`inq.kernels.pool`.

- :func:`_max_pool_kernel` and :func:`_avg_pool_kernel`: a tile of output pixels x channels of
  one image; the window's taps are unrolled (``KH`` x ``KW`` constexpr), each a masked load of
  the input tile, and the result is stored in place, in the input's memory format.
- :func:`_global_avg_pool_kernel`: one image and a tile of channels, summing the whole map a
  tile of pixels at a time (no reduction inside the loop), then one reduction and the
  requantization.

They take dense inputs, contiguous or channels_last (the layout is a constexpr, so the channel
or the pixel index is the unit stride the compiler sees); any other strides, an image of
``2**31`` elements or more, or more than 65535 channel tiles run the reference instead.

Sums are exact: in int32 where ``count * max|x| < 2**31`` (``count`` the window's or the map's
elements, ``max|x|`` 255 for uint8, 128 for int8: maps up to 8421504 pixels), else in int64
(int16/int32 inputs, huge maps), which wraps exactly as the reference's int64 sums. The
requantization is the reference's int64 ``(total * multiplier + half) >> shift``, clamped.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from inq.kernels.int8 import value_dtype
from inq.kernels.ops import output_format
from inq.kernels.pool import (
    avg_pool2d_requant_reference,
    check_avg_pool_args,
    check_max_pool_args,
    max_pool2d_int_reference,
)

__all__ = ["avg_pool2d_requant", "max_pool2d_int", "pool_tiles"]

_INT32_MAX = (1 << 31) - 1
_GRID_Y = 65535  # CUDA's limit on the second grid dimension (the channel tiles)


def pool_tiles(channels_last: bool) -> tuple[int, int]:
    """``(pixels, channels)`` a program of the pooling kernels: 1024 elements, the longer side
    along the unit stride (channels in channels_last, pixels in NCHW)."""
    return (16, 64) if channels_last else (64, 16)


@triton.jit
def _offsets(p, c, C, P, CHANNELS_LAST: tl.constexpr):
    """Offsets ``[len(p), len(c)]`` of flat pixels ``p`` (``h * W + w``) and channels ``c`` in
    a dense image of ``C`` channels and ``P`` pixels."""
    if CHANNELS_LAST:
        return p[:, None] * C + c[None, :]
    else:
        return p[:, None] + c[None, :] * P


@triton.jit
def _requantize(total, mult, half, shift, lo, hi):
    """int64 ``clamp((total * mult + half) >> shift, lo, hi)``, as the reference."""
    v = total.to(tl.int64) * mult + half
    return tl.minimum(tl.maximum(v >> shift, lo), hi)


@triton.jit
def _tile(x_ptr, out_ptr, C, H, W, OH, OW, BLOCK_Q: tl.constexpr, BLOCK_C: tl.constexpr):
    """This program's image, as its input ``x_img`` and output ``out_img``, its output pixels
    ``q`` (row ``oh``, column ``ow``), channels ``c`` and which of ``[q, c]`` exist (``live``):
    grid (images x pixel tiles, channel tiles)."""
    tiles = tl.cdiv(OH * OW, BLOCK_Q)
    n = tl.program_id(0) // tiles
    q = (tl.program_id(0) % tiles) * BLOCK_Q + tl.arange(0, BLOCK_Q)
    c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    live = (q < OH * OW)[:, None] & (c < C)[None, :]
    x_img = x_ptr + n.to(tl.int64) * (C * H * W)
    out_img = out_ptr + n.to(tl.int64) * (C * (OH * OW))
    return x_img, out_img, q, c, live, q // OW, q % OW


@triton.jit
def _max_pool_kernel(x_ptr, out_ptr, C, H, W, OH, OW, SH, SW, PH, PW, DH, DW,
                     KH: tl.constexpr, KW: tl.constexpr, LOWEST: tl.constexpr,
                     CHANNELS_LAST: tl.constexpr, BLOCK_Q: tl.constexpr,
                     BLOCK_C: tl.constexpr):  # fmt: skip
    x_img, out_img, q, c, live, oh, ow = _tile(x_ptr, out_ptr, C, H, W, OH, OW, BLOCK_Q, BLOCK_C)
    # padding loads the dtype's minimum. It never decides the result: PyTorch keeps padding
    # within half the kernel and, with ceil_mode, starts every window before the input's end,
    # and the op refuses the dilated windows that would still miss the input, so every window
    # holds an input element, which is >= the minimum.
    acc = tl.full((BLOCK_Q, BLOCK_C), LOWEST, x_ptr.dtype.element_ty)
    for r in tl.static_range(KH):
        ih = oh * SH - PH + r * DH
        for s in tl.static_range(KW):
            iw = ow * SW - PW + s * DW
            inside = (ih >= 0) & (ih < H) & (iw >= 0) & (iw < W)
            offs = _offsets(ih * W + iw, c, C, H * W, CHANNELS_LAST)
            v = tl.load(x_img + offs, mask=live & inside[:, None], other=LOWEST)
            acc = tl.maximum(acc, v)
    tl.store(out_img + _offsets(q, c, C, OH * OW, CHANNELS_LAST), acc, live)


@triton.jit
def _avg_pool_kernel(x_ptr, out_ptr, C, H, W, OH, OW, SH, SW, mult, half, shift, lo, hi,
                     KH: tl.constexpr, KW: tl.constexpr, WIDE: tl.constexpr,
                     CHANNELS_LAST: tl.constexpr, BLOCK_Q: tl.constexpr,
                     BLOCK_C: tl.constexpr):  # fmt: skip
    x_img, out_img, q, c, live, oh, ow = _tile(x_ptr, out_ptr, C, H, W, OH, OW, BLOCK_Q, BLOCK_C)
    acc = tl.zeros((BLOCK_Q, BLOCK_C), tl.int64 if WIDE else tl.int32)
    for r in tl.static_range(KH):
        for s in tl.static_range(KW):  # no padding: every tap of a live pixel is inside
            p = (oh * SH + r) * W + ow * SW + s
            v = tl.load(x_img + _offsets(p, c, C, H * W, CHANNELS_LAST), mask=live, other=0)
            acc += v.to(acc.dtype)
    y = _requantize(acc, mult, half, shift, lo, hi).to(out_ptr.dtype.element_ty)
    tl.store(out_img + _offsets(q, c, C, OH * OW, CHANNELS_LAST), y, live)


@triton.jit
def _global_avg_pool_kernel(x_ptr, out_ptr, C, P, mult, half, shift, lo, hi,
                            WIDE: tl.constexpr, CHANNELS_LAST: tl.constexpr,
                            BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr):  # fmt: skip
    n = tl.program_id(0)
    c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    c_ok = c < C
    x_img = x_ptr + n.to(tl.int64) * (C * P)
    acc = tl.zeros((BLOCK_P, BLOCK_C), tl.int64 if WIDE else tl.int32)
    for p0 in range(0, P, BLOCK_P):
        p = p0 + tl.arange(0, BLOCK_P)
        ok = (p < P)[:, None] & c_ok[None, :]
        v = tl.load(x_img + _offsets(p, c, C, P, CHANNELS_LAST), mask=ok, other=0)
        acc += v.to(acc.dtype)
    y = _requantize(tl.sum(acc, axis=0), mult, half, shift, lo, hi)
    tl.store(out_ptr + n.to(tl.int64) * C + c, y.to(out_ptr.dtype.element_ty), c_ok)


def _layout(x: Tensor, out: Tensor) -> bool | None:
    """Whether the kernels read ``x`` and write ``out`` as channels_last (False: contiguous),
    or None where they cannot: ``x`` not dense in one of the two formats, ``out`` not dense in
    ``x``'s, an image of ``2**31`` elements or more, or too many channel tiles."""
    channels_last = not x.is_contiguous()
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    if not x.is_contiguous(memory_format=fmt) or not out.is_contiguous(memory_format=fmt):
        return None
    c, h, w = x.shape[1:]
    image = c * max(h * w, out.shape[2] * out.shape[3])
    if image > _INT32_MAX or triton.cdiv(c, pool_tiles(channels_last)[1]) > _GRID_Y:
        return None
    return channels_last


def _wide(x: Tensor, count: int) -> bool:
    """Whether sums of ``count`` elements of ``x``'s dtype need int64 (else int32 holds every
    partial sum: ``count * max|x| < 2**31``)."""
    info = torch.iinfo(x.dtype)
    return count * max(-info.min, info.max) > _INT32_MAX


def max_pool2d_int(
    x: Tensor, kernel: list[int], stride: list[int], padding: list[int], dilation: list[int],
    ceil_mode: bool,
) -> Tensor:  # fmt: skip
    """``inq::max_pool2d_int`` in one Triton pass on a dense ``x`` (else the reference); bit for
    bit :func:`inq.kernels.pool.max_pool2d_int`."""
    oh, ow = check_max_pool_args(x, kernel, stride, padding, dilation, ceil_mode)
    n, c, h, w = x.shape
    out = torch.empty((n, c, oh, ow), dtype=x.dtype, device=x.device,
                      memory_format=output_format(x))  # fmt: skip
    channels_last = _layout(x, out)
    if channels_last is None:
        return max_pool2d_int_reference(x, kernel, stride, padding, dilation, ceil_mode)
    if out.numel():
        block_q, block_c = pool_tiles(channels_last)
        grid = (n * triton.cdiv(oh * ow, block_q), triton.cdiv(c, block_c))
        _max_pool_kernel[grid](
            x, out, c, h, w, oh, ow, *stride, *padding, *dilation, KH=kernel[0], KW=kernel[1],
            LOWEST=torch.iinfo(x.dtype).min, CHANNELS_LAST=channels_last, BLOCK_Q=block_q,
            BLOCK_C=block_c,
        )  # fmt: skip
    return out


def avg_pool2d_requant(
    x: Tensor, kernel: list[int] | None, stride: list[int] | None, multiplier: int, shift: int,
    lo: int, hi: int,
) -> Tensor:  # fmt: skip
    """``inq::avg_pool2d_requant`` in one Triton pass on a dense ``x`` (else the reference),
    global or windowed; bit for bit :func:`inq.kernels.pool.avg_pool2d_requant`."""
    (kh, kw), (sh, sw) = check_avg_pool_args(x, kernel, stride, shift)
    n, c, h, w = x.shape
    dtype = value_dtype(lo, hi)
    if kernel is None:
        out = torch.empty((n, c, 1, 1), dtype=dtype, device=x.device)
    else:
        shape = (n, c, (h - kh) // sh + 1, (w - kw) // sw + 1)
        out = torch.empty(shape, dtype=dtype, device=x.device, memory_format=output_format(x))
    channels_last = _layout(x, out)
    if channels_last is None:
        return avg_pool2d_requant_reference(x, kernel, stride, multiplier, shift, lo, hi)
    if out.numel():
        block_q, block_c = pool_tiles(channels_last)
        requant = (multiplier, (1 << shift) >> 1, shift, lo, hi)
        if kernel is None:
            grid = (n, triton.cdiv(c, block_c))
            _global_avg_pool_kernel[grid](x, out, c, h * w, *requant, WIDE=_wide(x, h * w),
                                          CHANNELS_LAST=channels_last, BLOCK_P=block_q,
                                          BLOCK_C=block_c)  # fmt: skip
        else:
            oh, ow = out.shape[2:]
            grid = (n * triton.cdiv(oh * ow, block_q), triton.cdiv(c, block_c))
            _avg_pool_kernel[grid](x, out, c, h, w, oh, ow, sh, sw, *requant, KH=kh, KW=kw,
                                   WIDE=_wide(x, kh * kw), CHANNELS_LAST=channels_last,
                                   BLOCK_Q=block_q, BLOCK_C=block_c)  # fmt: skip
    return out
