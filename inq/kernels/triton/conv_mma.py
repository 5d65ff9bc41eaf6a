"""``inq::shift_conv2d`` for fp16/bf16 on the tensor cores, on the linear kernels' weight layout.

The convolution as an implicit GEMM computed transposed, ``out.T [O, pixels] = W @ cols.T``,
as :func:`inq.kernels.triton.swar._mma_kernel` computes a linear layer: the weight rows decode
from the SWAR words of :mod:`inq.kernels.layout` (one shift and one mask per pair of weights,
``n1`` factored out as ``2**scale[row]``) into the MMA's register operand, and the pixels are the
narrow side. What makes it a convolution is the order of K, fixed when the layout is made
(:func:`conv_layout`): ``(kh, kw, c)`` with each tap's channels padded to whole chunks, so a
chunk is one tap times consecutive channels of a channels_last input. The input row, column,
bounds and address are worked out once per pixel and chunk, and each 16-column slot of the
chunk loads a ``[16 channels, pixels]`` tile with contiguous channels.

Groups of one (ordinary convolutions) only; grouped and depthwise convolutions, fp32
activations and weights the layout cannot hold keep the kernels of
:mod:`inq.kernels.triton.conv`. Results differ from the reference only by fp32 summation order.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch
import triton
import triton.language as tl
from torch import Tensor

from inq.codes import pack_codes, unpack_codes
from inq.kernels.layout import (
    CHUNK_WORDS,
    KernelWeight,
    cached_layout,
    chunk_columns,
    kernel_weight,
)
from inq.kernels.triton.decode import (
    dot_upcast,
    downcast,
    grouped_tile,
    pow2,
    reduce_partials,
    sm_count,
)
from inq.kernels.triton.geometry import k_splits, pixel_origins
from inq.kernels.triton.swar import choose, decode_pair, remembered, slot_dot

__all__ = [
    "ConvLayout",
    "ConvMmaGrid",
    "chunk_pairs",
    "conv_layout",
    "conv_mma",
    "conv_mma_fits",
    "conv_mma_grid",
    "conv_mma_grids",
    "conv_mma_name",
    "conv_mma_tiles",
    "launch_grid",
    "offered_grids",
]


@dataclass(frozen=True)
class ConvLayout:
    """The kernel layout of a conv weight whose K is ``(kh, kw, c)``, ``c`` padded to
    ``channels_padded`` (whole chunks of the layout)."""

    weight: KernelWeight
    channels_padded: int


def conv_layout(
    packed: Tensor,
    bits: int,
    n1: int | Tensor,
    weight_shape: list[int],
    dtype: torch.dtype,
    n1_rows: Tensor | None = None,
) -> ConvLayout | None:
    """The layout of a ``groups=1`` conv weight for :func:`conv_mma` (top exponents ``n1``,
    plus ``n1_rows`` per row if given), made once per packed tensor (and per-row tensor) and
    kept while it lives, or ``None`` where :func:`inq.kernels.layout.kernel_weight` has none.

    Example:
        >>> codes = torch.full((2, 3 * 9), 8, dtype=torch.uint8)  # 3 channels, 3x3 taps: 2**n1
        >>> layout = conv_layout(pack_codes(codes, 4), 4, 0, [2, 3, 3, 3], torch.float16)
        >>> layout.channels_padded, layout.weight.words.shape  # 128 columns a tap
        (128, torch.Size([2, 144]))
    """
    o, c, kh, kw = weight_shape
    rows = n1 if isinstance(n1, Tensor) else n1_rows
    base = 0 if isinstance(n1, Tensor) else int(n1)
    key = ("conv", bits, tuple(weight_shape), dtype, base, None if rows is None else id(rows))

    def build() -> ConvLayout | None:
        chunk = chunk_columns(bits)
        padded = triton.cdiv(c, chunk) * chunk
        codes = unpack_codes(packed, bits, c * kh * kw).view(o, c, kh * kw).transpose(1, 2)
        tap_major = torch.zeros((o, kh * kw, padded), dtype=codes.dtype, device=codes.device)
        tap_major[:, :, :c] = codes
        flat = tap_major.reshape(o, kh * kw * padded)
        exponents = n1 if rows is None else rows.to(torch.int64) + base
        weight = kernel_weight(pack_codes(flat, bits), bits, exponents, flat.shape[1], dtype,
                               paired=False)  # fmt: skip
        return None if weight is None else ConvLayout(weight, padded)

    return cached_layout(packed, key, build, rows)


@triton.jit
def _conv_mma_kernel(
    x_ptr, words_ptr, scale_ptr, bias_ptr, out_ptr, part_ptr,
    P, H, W, C, OH, OW, COUT, KWORDS, CHUNKS_PER_TAP, CHUNKS_PER_SPLIT,
    stride_h, stride_w, pad_h, pad_w, dil_h, dil_w,
    KH: tl.constexpr, KW: tl.constexpr, PER_WORD: tl.constexpr, BF16: tl.constexpr,
    HAS_BIAS: tl.constexpr, IEEE: tl.constexpr, EVEN_C: tl.constexpr, PAIRS: tl.constexpr,
    SPLIT_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_N: tl.constexpr,
    CHANNELS_LAST: tl.constexpr,
):  # fmt: skip
    # PAIRS: the pairs of 16-column slots a chunk decodes and multiplies (chunk_pairs)
    # rn: output channels (weight rows), rm: output pixels
    rn, rm = grouped_tile(tl.program_id(0), COUT, P, BLOCK_N, BLOCK_M, GROUP_N)
    pid_k = tl.program_id(1)
    p_ok = rm < P
    n_ok = rn < COUT
    n, oh, ow, ih0, iw0 = pixel_origins(rm, OH, OW, stride_h, stride_w, pad_h, pad_w)
    pixel_base = ((n * H + ih0) * W + iw0) * C
    w16 = tl.arange(0, 16)
    chunk: tl.constexpr = 16 * PER_WORD
    word_ptrs = words_ptr + rn[:, None] * KWORDS + w16[None, :]
    acc = tl.zeros([BLOCK_N, BLOCK_M], tl.float32)
    first = pid_k * CHUNKS_PER_SPLIT
    tap = first // CHUNKS_PER_TAP  # then walked without dividing in the loop
    c0 = (first - tap * CHUNKS_PER_TAP) * chunk
    r = tap // KW
    s = tap - r * KW
    for c in range(first, tl.minimum(first + CHUNKS_PER_SPLIT, KH * KW * CHUNKS_PER_TAP)):
        words = tl.load(word_ptrs + c * 16, mask=n_ok[:, None], other=0)
        dh = r * dil_h
        dw = s * dil_w
        # 0 <= ih < H as one unsigned compare (a negative ih wraps above H)
        pix_ok = p_ok & ((ih0 + dh).to(tl.uint32) < H) & ((iw0 + dw).to(tl.uint32) < W)
        rows = pixel_base + (dh * W + dw) * C + c0
        for g in tl.static_range(PAIRS):
            pair = decode_pair(words, g, PER_WORD, BF16)
            for high in tl.static_range(2):
                slot = (2 * g + high) * 16 + w16
                # EVEN_C: every channel of the slots multiplied exists, the pixel mask alone
                x_ok = pix_ok[None, :] if EVEN_C else pix_ok[None, :] & (c0 + slot < C)[:, None]
                xt = tl.load(x_ptr + rows[None, :] + slot[:, None], mask=x_ok, other=0.0)
                acc = slot_dot(pair, high, xt, acc, IEEE)
        c0 += chunk
        next_tap = c0 >= CHUNKS_PER_TAP * chunk
        c0 = tl.where(next_tap, 0, c0)
        s = tl.where(next_tap, s + 1, s)
        next_row = s == KW
        s = tl.where(next_row, 0, s)
        r = tl.where(next_row, r + 1, r)
    if CHANNELS_LAST:  # out[pixel, o]: the pixels are in (n, oh, ow) order
        offsets = rn[:, None] + (rm * COUT)[None, :]
    else:  # contiguous NCHW: out[n, o, pixel]
        offsets = (rn * (OH * OW))[:, None] + (n * COUT * OH * OW + oh * OW + ow)[None, :]
    mask = n_ok[:, None] & p_ok[None, :]
    if SPLIT_K > 1:  # unscaled fp32 partial sums, reduced in split order (reduce_partials)
        tl.store(part_ptr + pid_k * P * COUT + offsets, acc, mask)
    else:
        acc = acc * pow2(tl.load(scale_ptr + rn, mask=n_ok, other=0))[:, None]
        if HAS_BIAS:
            acc += tl.load(bias_ptr + rn, mask=n_ok, other=0.0).to(tl.float32)[:, None]
        tl.store(out_ptr + offsets, downcast(acc, out_ptr.dtype.element_ty), mask)


def conv_mma_tiles(pixels: int, out_channels: int) -> tuple[int, int, int]:
    """(pixels, output channels, warps) of a tile: pixels are the MMA's narrow side.

    Example:
        >>> conv_mma_tiles(12544, 64), conv_mma_tiles(6272, 256), conv_mma_tiles(49, 512)
        ((128, 64, 4), (128, 128, 8), (64, 128, 4))
    """
    block_m = 128 if pixels >= 2048 else 64 if pixels > 32 else 16
    if block_m == 128 and out_channels >= 128:
        # each pixel's inputs read from the L2 once for 128 outputs, not 64: the time model's
        # bound at batch 32 (8 warps: 114 registers on Triton 3.6, 2 CTAs an SM, no spill)
        return 128, 128, 8
    return block_m, 128 if out_channels >= 128 else 64, 4


def conv_mma_fits(channels: int, bits: int) -> bool:
    """Whether a ``groups=1`` fp16/bf16 convolution with ``channels`` input channels goes to
    :func:`conv_mma`: at least half a chunk of them a tap (with fewer, most of each chunk's
    products would be padding; a first convolution's 3 channels take the few-channels kernel).

    Example:
        >>> conv_mma_fits(3, 4), conv_mma_fits(64, 4), conv_mma_fits(32, 8)
        (False, True, True)
    """
    return 2 * channels >= chunk_columns(bits)


def chunk_pairs(channels: int, per_word: int) -> int:
    """Pairs of 16-column slots (32 columns) of each chunk that :func:`conv_mma` decodes and
    multiplies: all ``per_word // 2``, but where a tap's ``channels`` fill part of one chunk,
    only those that hold channels (the rest is padding: zero weights).

    Example:
        >>> chunk_pairs(64, 8), chunk_pairs(96, 8), chunk_pairs(256, 8), chunk_pairs(64, 4)
        (2, 3, 4, 2)
    """
    return min(per_word // 2, triton.cdiv(channels, 32))


def conv_mma_name(block_m: int, block_n: int, per_word: int, pairs: int) -> str:
    """The static check's name of the kernel's variant in these tiles (``pairs``: see
    :func:`chunk_pairs`).

    Example:
        >>> conv_mma_name(128, 64, 8, 4), conv_mma_name(128, 64, 8, 2)
        ('conv mma 128x64', 'conv mma 128x64, 64 of 128 columns')
    """
    name = f"conv mma {block_m}x{block_n}"
    if pairs < per_word // 2:
        return f"{name}, {32 * pairs} of {16 * per_word} columns"
    return name


_FEW_STEPS = 9  # K steps (a 3x3 conv's taps) from which few tiles split K as far as one round
_FEW_TILES_PER_SM = 8  # "few tiles": at most one an 8th of the SMs
_BOTH_TILES_FROM = 1024  # output pixels from which 64- and 128-pixel tiles are both offered


class ConvMmaGrid(NamedTuple):
    """The launch of :func:`conv_mma` (the time model of :mod:`inq.kernels.model` reads it)."""

    block_m: int  # output pixels a CTA covers
    block_n: int  # output channels a CTA covers
    warps: int
    per_tap: int  # chunks of one tap's (padded) channels
    tiles: int  # output tiles
    split: int  # CTAs that share each tile's K loop


def conv_mma_grid(
    pixels: int, out_channels: int, channels: int, taps: int, chunk: int, sms: int
) -> ConvMmaGrid:
    """The tiles and the K split of :func:`conv_mma` for ``pixels = N*OH*OW`` outputs of
    ``out_channels`` from ``channels`` in ``taps = KH*KW`` taps, ``chunk`` columns a chunk.

    Example:
        >>> conv_mma_grid(49, 512, 512, 9, 128, 132)  # ResNet-18's last convs at batch 1
        ConvMmaGrid(block_m=64, block_n=128, warps=4, per_tap=4, tiles=4, split=18)
    """
    block_m, block_n, warps = conv_mma_tiles(pixels, out_channels)
    per_tap = triton.cdiv(channels, chunk)
    tiles = triton.cdiv(pixels, block_m) * triton.cdiv(out_channels, block_n)
    steps = taps * per_tap
    slots = tiles * warps // 4  # an 8-warp CTA takes two 4-warp slots
    # tiles that fill the SMs keep their whole K (the time model: a split's reduce pass and
    # the second round cost more than a long loop)
    split = k_splits(steps, slots, sms) if slots < sms else 1
    if steps >= _FEW_STEPS and tiles * _FEW_TILES_PER_SM <= sms:
        # few tiles, each a serial loop of one warp a scheduler: the time model finds K split
        # across a round of CTAs, a step or two each, worth the reduce pass (ResNet-18 layer2-4
        # at batch 1: 2-4 us a layer)
        split = max(split, triton.cdiv(steps, triton.cdiv(steps, min(sms // tiles, steps))))
    return ConvMmaGrid(block_m, block_n, warps, per_tap, tiles, split)


def conv_mma_grids(
    pixels: int, out_channels: int, channels: int, taps: int, chunk: int, sms: int
) -> tuple[ConvMmaGrid, ...]:
    """The launches :func:`conv_mma` offers, :func:`conv_mma_grid`'s first: from
    :data:`_BOTH_TILES_FROM` pixels of 128 outputs or more, 64- and 128-pixel tiles both, with
    the same K split, so that whichever a GPU picks (:func:`inq.kernels.triton.swar.choose`,
    timed once per shape) every output is the same sum in the same order. The time model ranks
    them differently by layer (ResNet-18 at batch 32: 64 pixels for layer2, 128 for layer4).

    Example:
        >>> [g[:3] for g in conv_mma_grids(1568, 512, 512, 9, 128, 132)]  # layer4, batch 32
        [(64, 128, 4), (128, 128, 8)]
    """
    first = conv_mma_grid(pixels, out_channels, channels, taps, chunk, sms)
    if pixels < _BOTH_TILES_FROM or out_channels < 128:
        return (first,)
    block_m, warps = (64, 4) if first.block_m == 128 else (128, 8)
    tiles = triton.cdiv(pixels, block_m) * triton.cdiv(out_channels, first.block_n)
    return first, first._replace(block_m=block_m, warps=warps, tiles=tiles)


def _offer(
    x: Tensor, layout: ConvLayout, weight_shape: list[int], conv_args: tuple, out: Tensor
) -> tuple[tuple[ConvMmaGrid, ...], tuple]:
    """The launches on offer for one call, and the key :func:`choose` remembers its pick by."""
    o, _, kh, kw = weight_shape
    pixels = x.shape[0] * out.shape[-2] * out.shape[-1]
    chunk = CHUNK_WORDS * layout.weight.per_word
    grids = conv_mma_grids(pixels, o, layout.channels_padded, kh * kw, chunk, sm_count(x.device))
    key = ("conv mma", x.device, x.dtype, layout.weight.per_word, tuple(x.shape),
           tuple(weight_shape), *map(tuple, conv_args), out.is_contiguous())  # fmt: skip
    return grids, key


def offered_grids(
    x: Tensor, layout: ConvLayout, weight_shape: list[int], stride: list[int],
    padding: list[int], dilation: list[int], out: Tensor,
) -> tuple[tuple[ConvMmaGrid, ...], int]:  # fmt: skip
    """The launches :func:`conv_mma` offers for these arguments, and the index of the one it
    runs: the pick :func:`choose` remembers for them, else the default (0)."""
    grids, key = _offer(x, layout, weight_shape, (stride, padding, dilation), out)
    return grids, remembered(key)


def conv_mma(
    x: Tensor,
    layout: ConvLayout,
    weight_shape: list[int],
    bias: Tensor | None,
    stride: list[int],
    padding: list[int],
    dilation: list[int],
    out: Tensor,
) -> None:
    """Write the convolution of fp16/bf16 ``x [N, C, H, W]`` (any memory format; checked by the
    caller, ``groups=1``) into ``out [N, O, OH, OW]``, dense NCHW or channels_last. On a GPU the
    first call of a shape times the launches on offer (:func:`conv_mma_grids`); they give the
    same result."""
    grids, key = _offer(x, layout, weight_shape, (stride, padding, dilation), out)
    args = (x, layout, weight_shape, bias, stride, padding, dilation, out)
    best = choose(key, len(grids) if x.is_cuda else 1, lambda i: launch_grid(*args, grids[i]))
    launch_grid(*args, grids[best])


def launch_grid(
    x: Tensor, layout: ConvLayout, weight_shape: list[int], bias: Tensor | None,
    stride: list[int], padding: list[int], dilation: list[int], out: Tensor, grid: ConvMmaGrid,
) -> None:  # fmt: skip
    """:func:`conv_mma` on the launch ``grid`` (one of :func:`offered_grids`)."""
    o, c, kh, kw = weight_shape
    nb, _, h, w = x.shape
    oh, ow = out.shape[-2:]
    pixels = nb * oh * ow
    weight = layout.weight
    nhwc = x.permute(0, 2, 3, 1).contiguous()
    chunk = CHUNK_WORDS * weight.per_word
    per_tap, split = grid.per_tap, grid.split
    per_split = triton.cdiv(kh * kw * per_tap, split)
    channels_last = not out.is_contiguous()  # then dense channels_last (the caller's check)
    # the partial sums in out's order, and out as the reduce sees it: channels last or second
    target = out.permute(0, 2, 3, 1) if channels_last else out
    part = target.new_empty((split, *target.shape), dtype=torch.float32) if split > 1 else out
    b = None if bias is None else bias.to(x.dtype).contiguous()
    pairs = chunk_pairs(c, weight.per_word)
    _conv_mma_kernel[(grid.tiles, split)](
        nhwc, weight.words, weight.scale, out if b is None else b, out, part,
        pixels, h, w, c, oh, ow, o, weight.words.shape[1], per_tap, per_split,
        *stride, *padding, *dilation,
        KH=kh, KW=kw, PER_WORD=weight.per_word, BF16=weight.fmt == "bf16", HAS_BIAS=b is not None,
        IEEE=dot_upcast(x.dtype), EVEN_C=c % chunk == 0 or c == 32 * pairs, PAIRS=pairs,
        SPLIT_K=split, BLOCK_M=grid.block_m, BLOCK_N=grid.block_n, GROUP_N=8,
        CHANNELS_LAST=channels_last, num_warps=grid.warps, num_stages=3,
    )  # fmt: skip
    if split > 1:
        reduce_partials(part, weight.scale, b, target, channel_dim=-1 if channels_last else 1)
