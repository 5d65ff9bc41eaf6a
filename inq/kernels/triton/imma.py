"""``inq::shift_conv2d_int8`` and ``inq::shift_linear_int8`` on int8 tensor cores.

Where a layer's terms are all plain products (:mod:`inq.kernels.int8_layout`), the op is an
integer matrix product, and an int8 x int8 -> int32 MMA computes it exactly. One kernel,
:func:`_imma_kernel`, runs both ops: a linear layer is a 1x1 convolution of a 1x1 image.

- The convolution is an implicit GEMM of output pixels (``N*OH*OW``) by output channels over
  ``K = kh * kw * Cin/groups`` in ``(kh, kw, c)`` order, on a channels_last copy of the input:
  a K step is one tap times ``BLOCK_K`` consecutive channels, so its index math (input row and
  column, bounds, address) is per pixel, not per element, and its loads are contiguous. Layers
  with fewer than 32 channels a group (a network's first conv) take flat steps of 64 columns
  over any taps, on a copy of the input whose channels are padded to ``FLAT_CG``, a power of
  two (the weights alike: :func:`inq.kernels.int8_layout.flat_columns`): a column's tap and
  channel are a shift and a mask, and no step divides.
- uint8 activations are flipped to ``x - 128`` on load and corrected by ``128 * row_sum`` at the
  end; weights beyond int8 run a second product (``parts[1]``, shifted by 7).
- Where the tiles of an output would leave SMs idle, or run more than ``MAX_STEPS`` serial
  K steps, K is split across CTAs that add their int32 sums atomically: integer addition is
  associative, so the result does not depend on the order (unlike a float split-K).

Groups with fewer than 16 outputs (depthwise) and layers with no int8 layout (a term that
floors, or weights needing three parts) keep the shift-add kernels of
:mod:`inq.kernels.triton.int8`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from torch import Tensor

from inq.kernels.int8_layout import (
    FLAT_BLOCK_K,
    FLAT_CHANNELS,
    PART_SHIFT,
    Int8Weight,
    flat_columns,
)
from inq.kernels.triton.decode import sm_count
from inq.kernels.triton.geometry import conv_tile, k_splits, pixel_origins
from inq.kernels.triton.swar import choose

__all__ = [
    "MIN_OUTPUTS",
    "ImmaConfig",
    "Requant",
    "Residual",
    "imma_config",
    "imma_conv2d",
    "imma_launches",
    "k_steps",
    "launch_imma",
    "requant",
    "residual",
]

MIN_OUTPUTS = 16  # outputs per group below which the shift-add kernel runs (depthwise)
SHIFT = tl.constexpr(PART_SHIFT)


@dataclass(frozen=True)
class ImmaConfig:
    """Tiles and K split of one launch of :func:`_imma_kernel`."""

    block_m: int  # output pixels (rows)
    block_n: int  # output channels
    block_k: int  # channels of one tap (or flat K columns) a step
    tapwise: bool  # a K step is one tap x block_k channels
    split_k: int
    num_warps: int
    num_stages: int


@triton.jit
def _imma_kernel(
    x_ptr, w_ptr, row_sum_ptr, out_ptr, acc_bias_ptr, mult_ptr, shift_ptr, lo, hi,
    skip_ptr, m_conv, m_skip, add_half, add_shift, add_lo, add_hi,
    P, H, W, C, OH, OW, COUT, CG, OG, K, STEPS, STEPS_PER_SPLIT,
    stride_h, stride_w, pad_h, pad_w, dil_h, dil_w, part_stride,
    KH: tl.constexpr, KW: tl.constexpr, UNSIGNED: tl.constexpr, PARTS: tl.constexpr,
    TAPWISE: tl.constexpr, FLAT_CG: tl.constexpr, FLAT_C: tl.constexpr, EVEN_K: tl.constexpr,
    EVEN_N: tl.constexpr, SPLIT_K: tl.constexpr, REQUANT: tl.constexpr, ADD: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    g, rp, rn = conv_tile(tl.program_id(0), P, OG, BLOCK_M, BLOCK_N)
    pid_k = tl.program_id(1)
    p_ok = rp < P
    n_ok = rn < OG
    oc = g * OG + rn
    n, _, _, ih0, iw0 = pixel_origins(rp, OH, OW, stride_h, stride_w, pad_h, pad_w)
    rk = tl.arange(0, BLOCK_K)
    pixel_base = ((n * H + ih0) * W + iw0) * C + g * CG  # the first tap's channel 0
    w_rows = w_ptr + oc[:, None] * K  # [BLOCK_N, 1]: weights are [O, K], K contiguous
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.int32)
    high = tl.zeros([BLOCK_M, BLOCK_N], tl.int32)
    first = pid_k * STEPS_PER_SPLIT
    # tap-wise steps walk (tap row r, tap column s, channel c0) without dividing in the loop
    c_tiles = tl.cdiv(CG, BLOCK_K)
    tap = first // c_tiles
    c0 = (first - tap * c_tiles) * BLOCK_K
    r = tap // KW
    s = tap - r * KW
    for t in range(first, tl.minimum(first + STEPS_PER_SPLIT, STEPS)):
        if TAPWISE:  # one tap, channels c0 + rk: index math per pixel
            dh = r * dil_h
            dw = s * dil_w
            # 0 <= ih < H as one unsigned compare (a negative ih wraps above H)
            pix_ok = p_ok & ((ih0 + dh).to(tl.uint32) < H) & ((iw0 + dw).to(tl.uint32) < W)
            k = (r * KW + s) * CG + c0 + rk
            x_offsets = pixel_base[:, None] + ((dh * W + dw) * C + c0 + rk)[None, :]
            if EVEN_K:
                k_ok = rk < BLOCK_K
                x_ok = pix_ok[:, None]
            else:
                k_ok = c0 + rk < CG
                x_ok = pix_ok[:, None] & k_ok[None, :]
            c0 += BLOCK_K
            next_tap = c0 >= CG
            c0 = tl.where(next_tap, 0, c0)
            s = tl.where(next_tap, s + 1, s)
            next_row = s == KW
            s = tl.where(next_row, 0, s)
            r = tl.where(next_row, r + 1, r)
        else:  # columns k of any tap: FLAT_CG channels a tap (padded, the weights too) of the
            # FLAT_C of a pixel; constants, so no column divides
            k = t * BLOCK_K + rk
            k_ok = rk < BLOCK_K  # whole steps: the padding's weights are 0
            tap_k = k // FLAT_CG
            ih = ih0[:, None] + ((tap_k // KW) * dil_h)[None, :]
            iw = iw0[:, None] + ((tap_k % KW) * dil_w)[None, :]
            x_ok = p_ok[:, None] & (ih.to(tl.uint32) < H) & (iw.to(tl.uint32) < W)
            channel = g * FLAT_CG + k % FLAT_CG
            x_offsets = ((n[:, None] * H + ih) * W + iw) * FLAT_C + channel[None, :]
        x = tl.load(x_ptr + x_offsets, mask=x_ok, other=0)
        if UNSIGNED:  # x - 128 as an int8: flip the top bit
            x = (x ^ 0x80).to(tl.int8, bitcast=True)
        if EVEN_N and EVEN_K:  # no weight mask: every row and column of the tile exists
            w = tl.load(w_rows + k[None, :])  # [BLOCK_N, BLOCK_K], K-major
            if PARTS == 2:
                w_high = tl.load(w_rows + part_stride + k[None, :])
        else:
            w_ok = n_ok[:, None] & k_ok[None, :]
            w = tl.load(w_rows + k[None, :], mask=w_ok, other=0)
            if PARTS == 2:
                w_high = tl.load(w_rows + part_stride + k[None, :], mask=w_ok, other=0)
        acc = tl.dot(x, tl.trans(w), acc, out_dtype=tl.int32)  # (Triton 3.6: fp32 default)
        if PARTS == 2:
            high = tl.dot(x, tl.trans(w_high), high, out_dtype=tl.int32)
    if PARTS == 2:
        acc += high << SHIFT
    if UNSIGNED:  # the correction once, whatever the split
        zero_point = tl.where(pid_k == 0, 128, 0)
        acc += zero_point * tl.load(row_sum_ptr + oc, mask=n_ok, other=0)[None, :]
    offsets = rp[:, None] * COUT + oc[None, :]  # channels_last
    mask = p_ok[:, None] & n_ok[None, :]
    if SPLIT_K > 1:  # int32 partial sums (a requantization follows in _requant_kernel)
        tl.atomic_add(out_ptr + offsets, acc, mask, sem="relaxed")
    elif REQUANT:
        q = requant(acc, oc, n_ok, acc_bias_ptr, mult_ptr, shift_ptr, lo, hi)
        if ADD:
            q = residual(q, skip_ptr + offsets, mask, m_conv, m_skip, add_half, add_shift,
                         add_lo, add_hi)  # fmt: skip
        tl.store(out_ptr + offsets, q.to(out_ptr.dtype.element_ty), mask)
    else:
        tl.store(out_ptr + offsets, acc, mask)


@triton.jit
def requant(acc, oc, oc_ok, acc_bias_ptr, mult_ptr, shift_ptr, lo, hi):
    """``clamp(((acc + bias) * multiplier + 2**(shift-1)) >> shift, lo, hi)`` per output channel
    ``oc`` of an int32 ``[rows, channels]`` tile, in int64 (round half up; the arithmetic
    shift floors), exactly :func:`inq.kernels.int8.requantize`."""
    bias = tl.load(acc_bias_ptr + oc, mask=oc_ok, other=0).to(tl.int64)
    multiplier = tl.load(mult_ptr + oc, mask=oc_ok, other=0).to(tl.int64)
    shift = tl.load(shift_ptr + oc, mask=oc_ok, other=0).to(tl.int64)
    half = (tl.full(shift.shape, 1, tl.int64) << shift) >> 1
    v = (acc.to(tl.int64) + bias[None, :]) * multiplier[None, :] + half[None, :]
    return tl.minimum(tl.maximum(v >> shift[None, :], lo), hi)


@triton.jit
def residual(q, skip_ptrs, mask, m_conv, m_skip, half, shift, lo, hi):
    """The residual add on a requantized tile ``q`` (int64): ``clamp((q * m_conv + skip *
    m_skip + half) >> shift, lo, hi)``, exactly :func:`inq.kernels.int8.requant_add` (whose
    one-pass kernel is this on its first input)."""
    v = q * m_conv + tl.load(skip_ptrs, mask=mask, other=0).to(tl.int64) * m_skip
    return tl.minimum(tl.maximum((v + half) >> shift, lo), hi)


@triton.jit
def _requant_kernel(acc_ptr, acc_bias_ptr, mult_ptr, shift_ptr, out_ptr, lo, hi, skip_ptr,
                    m_conv, m_skip, add_half, add_shift, add_lo, add_hi, ROWS, COUT,
                    ADD: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):  # fmt: skip
    """:func:`requant` of an int32 ``[ROWS, COUT]`` (channels last) into ``out`` (``ADD``: then
    :func:`residual`)."""
    rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = rn < COUT
    mask = (rm < ROWS)[:, None] & n_ok[None, :]
    offsets = rm[:, None] * COUT + rn[None, :]
    acc = tl.load(acc_ptr + offsets, mask=mask, other=0)
    q = requant(acc, rn, n_ok, acc_bias_ptr, mult_ptr, shift_ptr, lo, hi)
    if ADD:
        q = residual(q, skip_ptr + offsets, mask, m_conv, m_skip, add_half, add_shift, add_lo,
                     add_hi)  # fmt: skip
    tl.store(out_ptr + offsets, q.to(out_ptr.dtype.element_ty), mask)


def k_steps(channels: int, taps: int, block_k: int) -> int:
    """K steps of one output tile: taps x channel tiles, or where the steps are flat (few
    channels), ``block_k`` columns over the padded taps
    (:func:`inq.kernels.int8_layout.flat_columns`)."""
    flat = flat_columns(channels, taps)
    if flat is None:
        return taps * triton.cdiv(channels, block_k)
    return triton.cdiv(flat[1], block_k)


def imma_config(pixels: int, out_per_group: int, groups: int, channels: int, taps: int,
                sms: int) -> ImmaConfig:  # fmt: skip
    """Tiles for ``pixels`` output rows, ``out_per_group`` x ``groups`` outputs and
    ``channels`` (per group) x ``taps`` terms, on a GPU of ``sms`` SMs: large tiles, then
    split-K as :func:`inq.kernels.triton.geometry.k_splits` says.

    Example:
        >>> imma_config(49, 512, 1, 512, 9, 132)  # ResNet-18 layer4 at batch 1
        ImmaConfig(block_m=64, block_n=128, block_k=128, tapwise=True, split_k=9, num_warps=4, num_stages=3)
    """  # noqa: E501
    block_n = 128 if out_per_group >= 128 else 64 if out_per_group >= 64 else 32
    tiles_n = groups * triton.cdiv(out_per_group, block_n)
    tapwise = channels >= FLAT_CHANNELS
    block_k = 128 if channels >= 128 else 64 if channels >= 64 else 32 if tapwise else FLAT_BLOCK_K
    steps = k_steps(channels, taps, block_k)
    # 128-pixel tiles from 2048 pixels (a batch-1 56x56 layer), unless a long K would then
    # leave SMs idle; 64 below; 16 for a linear layer's few rows
    wide = pixels >= 2048 and (steps < 16 or triton.cdiv(pixels, 128) * tiles_n >= sms)
    block_m = 128 if wide else 64 if pixels > 16 else 16
    tiles = triton.cdiv(pixels, block_m) * tiles_n
    split = k_splits(steps, tiles, sms)
    warps = 8 if block_m * block_n >= 128 * 128 else 4
    return ImmaConfig(block_m, block_n, block_k, tapwise, split, warps, 3)


@dataclass(frozen=True)
class Requant:
    """The integer model's requantization of a layer: int32 ``bias``, ``multiplier`` and
    ``shift`` per output channel, results clamped to ``[lo, hi]``."""

    bias: Tensor
    multiplier: Tensor
    shift: Tensor
    lo: int
    hi: int

    def tensors(self) -> tuple[Tensor, Tensor, Tensor]:
        return self.bias.contiguous(), self.multiplier.contiguous(), self.shift.contiguous()


@dataclass(frozen=True)
class Residual:
    """The integer model's residual add after a requantized convolution: ``clamp((q * m_conv +
    skip * m_skip) >> shift, lo, hi)`` (round half up), ``skip`` of the output's shape."""

    skip: Tensor
    m_conv: int
    m_skip: int
    shift: int
    lo: int
    hi: int

    def arguments(self) -> tuple[object, ...]:
        """The kernels' residual arguments, ``skip`` dense channels_last."""
        skip = self.skip.contiguous(memory_format=torch.channels_last)
        return (skip, self.m_conv, self.m_skip, (1 << self.shift) >> 1, self.shift, self.lo,
                self.hi)  # fmt: skip


def imma_launches(pixels: int, out_per_group: int, groups: int, channels: int, taps: int,
                  sms: int) -> list[ImmaConfig]:  # fmt: skip
    """The launches offered for one shape: :func:`imma_config`'s first, and where it splits K
    the same tiles with K whole (no zeroed sums, no requantization pass, fewer CTAs, a longer
    loop). On a GPU the first call of a shape times each once and keeps the faster
    (:func:`inq.kernels.triton.swar.choose`); the sums are integers, so both give the same bits.

    Example:
        >>> [cfg.split_k for cfg in imma_launches(1568, 512, 1, 512, 9, 132)]  # layer4, batch 32
        [2, 1]
    """
    cfg = imma_config(pixels, out_per_group, groups, channels, taps, sms)
    return [cfg] if cfg.split_k == 1 else [cfg, replace(cfg, split_k=1)]


def imma_conv2d(
    x: Tensor,
    weight: Int8Weight,
    weight_shape: list[int],
    stride: list[int],
    padding: list[int],
    dilation: list[int],
    groups: int,
    out: Tensor,
    requant: Requant | None = None,
    residual: Residual | None = None,
) -> None:
    """Write ``inq::shift_conv2d_int8`` of int8/uint8 ``x [N, Cin, H, W]`` (checked by the
    caller) into ``out [N, O, OH, OW]`` (channels_last) on int8 tensor cores: the int32 sums, or
    with ``requant`` the requantized values in ``out``'s dtype (with ``residual`` too: the
    residual add of those); on the launch :func:`imma_launches` offers and the GPU picks."""
    o, cg, kh, kw = weight_shape
    pixels = x.shape[0] * out.shape[-2] * out.shape[-1]
    options = imma_launches(pixels, o // groups, groups, cg, kh * kw, sm_count(x.device))
    geometry = (weight_shape, stride, padding, dilation, groups)
    key = ("imma", x.device, x.dtype, tuple(x.shape), *map(tuple, geometry[:4]), groups,
           weight.parts.shape[0], requant is not None, residual is not None)  # fmt: skip

    def run(i: int) -> None:
        launch_imma(x, weight, geometry, out, options[i], requant, residual)

    run(choose(key, len(options) if x.is_cuda else 1, run))


def launch_imma(
    x: Tensor,
    weight: Int8Weight,
    geometry: tuple,
    out: Tensor,
    cfg: ImmaConfig,
    requant: Requant | None = None,
    residual: Residual | None = None,
) -> None:
    """:func:`imma_conv2d` on the launch ``cfg`` (one of :func:`imma_launches`); ``geometry``
    is its ``(weight_shape, stride, padding, dilation, groups)``."""
    weight_shape, stride, padding, dilation, groups = geometry
    o, cg, kh, kw = weight_shape
    nb, _, h, w = x.shape
    oh, ow = out.shape[-2:]
    pixels = nb * oh * ow
    nhwc = x.permute(0, 2, 3, 1).contiguous()
    flat = flat_columns(cg, kh * kw)
    if flat is not None:  # each group's channels padded to a power of two, as the weights
        nhwc = F.pad(nhwc.view(nb, h, w, groups, cg), (0, flat[0] - cg)).view(nb, h, w, -1)
    steps = k_steps(cg, kh * kw, cfg.block_k)
    sums = out
    if cfg.split_k > 1:
        sums = out if requant is None else torch.empty_like(out, dtype=torch.int32)
        sums.zero_()
    grid = (groups * triton.cdiv(pixels, cfg.block_m) * triton.cdiv(o // groups, cfg.block_n),
            cfg.split_k)  # fmt: skip
    parts = weight.parts
    fused = requant if requant is not None and cfg.split_k == 1 else None
    epilogue = (sums, sums, sums, 0, 0) if fused is None else (*fused.tensors(), fused.lo, fused.hi)
    bare = (sums, 0, 0, 0, 0, 0, 0)  # no residual add (the pointer is never read)
    add = bare if residual is None else residual.arguments()
    added = fused is not None and residual is not None
    _imma_kernel[grid](
        nhwc, parts, weight.row_sum, sums, *epilogue, *(add if added else bare),
        pixels, h, w, nhwc.shape[-1], oh, ow, o, cg, o // groups, parts.shape[-1], steps,
        triton.cdiv(steps, cfg.split_k), *stride, *padding, *dilation,
        parts.stride(0) if parts.shape[0] > 1 else 0,
        KH=kh, KW=kw, UNSIGNED=x.dtype == torch.uint8, PARTS=parts.shape[0],
        TAPWISE=cfg.tapwise, FLAT_CG=1 if flat is None else flat[0],
        FLAT_C=1 if flat is None else nhwc.shape[-1],
        EVEN_K=flat is not None or cg % cfg.block_k == 0,
        EVEN_N=(o // groups) % cfg.block_n == 0, SPLIT_K=cfg.split_k, REQUANT=fused is not None,
        ADD=added,
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )  # fmt: skip
    if requant is not None and fused is None:
        block_m, block_n = 64, 64
        rows = (pixels, o)
        _requant_kernel[(triton.cdiv(pixels, block_m), triton.cdiv(o, block_n))](
            sums, *requant.tensors(), out, requant.lo, requant.hi, *add, *rows,
            ADD=residual is not None, BLOCK_M=block_m, BLOCK_N=block_n,
        )  # fmt: skip
