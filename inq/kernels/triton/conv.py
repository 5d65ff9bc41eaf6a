"""``inq::shift_conv2d`` in Triton: 2-d convolution with the weight read as packed codes.

- fp16/bf16, ``groups=1``, at least half a chunk of channels: the tensor-core kernel on the
  kernel layout (:mod:`inq.kernels.triton.conv_mma`).
- :func:`_few_channels_kernel`: fp16/bf16, ``groups=1``, taps x channels (each rounded up to
  a power of two) of at most :data:`FEW_CHANNELS_K` columns (a network's first convolution:
  7 x 7 taps of 3 channels in 64 x 4): the weights decoded once a program and kept,
  persistent programs walking 2-d pixel tiles of a padded channels-last copy of the input
  (one ``F.pad``), so no per-pixel division or bounds check and a tap's channels in one
  load, the next tile's inputs loaded while the MMA runs.
- :func:`_implicit_gemm_kernel` (everything else but depthwise: fp32 with IEEE products,
  grouped convolutions, a few channels over many taps): the convolution as a GEMM of output
  pixels (``N*OH*OW``) by output channels over ``K = Cin/groups * kh * kw``; each step gathers
  an activation tile (stride, padding, dilation; any strides, so NCHW and channels_last
  alike), decodes a code tile in registers and multiplies with fp32 accumulation. Groups are a
  grid dimension.
- :func:`_depthwise_kernel`: one input channel per group (depthwise, channel multiplier too),
  where a GEMM would waste the tensor cores: a direct loop over the filter taps on CUDA cores.

The result is contiguous NCHW (the reference's layout); every kernel multiplies the reference's
weights exactly, so results differ only by fp32 summation order.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from torch import Tensor

from inq.codes import code_width
from inq.kernels.ops import conv2d_output_size, effective_n1, output_format
from inq.kernels.triton.conv_mma import conv_layout, conv_mma, conv_mma_fits
from inq.kernels.triton.decode import (
    FLOAT_DTYPES,
    MIN_EXP,
    check_devices,
    check_operands,
    decode,
    dot,
    dot_upcast,
    downcast,
    load_codes,
    n1_args,
    output_tensor,
    sm_count,
)
from inq.kernels.triton.geometry import conv_tile, pixel_origins

__all__ = [
    "FEW_CHANNELS_K",
    "FEW_CHANNELS_PROGRAMS",
    "ConvConfig",
    "conv_config",
    "few_channels_columns",
    "gather_patches",
    "pixel_block",
    "shift_conv2d",
]


FEW_CHANNELS_K = 256  # K columns the few-channels kernel holds whole (decoded once a program)
FEW_CHANNELS_PROGRAMS = 1  # its programs an SM, each walking pixel tiles (sm_90 check: 1 fits)


@dataclass(frozen=True)
class ConvConfig:
    """Tiles of one launch: ``kernel`` is "implicit_gemm", "few_channels" or "depthwise"."""

    kernel: str
    block_m: int  # output pixels
    block_n: int  # output channels
    block_k: int  # reduction (the few-channels kernel: its whole padded K; depthwise: 0)
    num_warps: int
    num_stages: int

    @property
    def variant(self) -> str:
        """The static check's name of the kernel in these tiles (``inq bench kernel --static``).

        Example:
            >>> conv_config(12544, 64, 64, 9).variant, conv_config(12544, 8, 1, 9).variant
            ('conv implicit gemm 128x64x32', 'conv depthwise 64x32')
        """
        k = f"x{self.block_k}" if self.block_k else ""
        return f"conv {self.kernel.replace('_', ' ')} {self.block_m}x{self.block_n}{k}"


@triton.jit
def gather_patches(
    x_base, ih0, iw0, p_ok, rk, K, H, W, sxc, sxh, sxw, dil_h, dil_w,
    KH: tl.constexpr, KW: tl.constexpr,
):  # fmt: skip
    """The activation tile ``[pixels, rk]`` of an implicit GEMM: for each output pixel (input
    corner ``ih0, iw0``, images at ``x_base``) the inputs of taps ``rk`` in the packed row order
    (channel, tap row, tap column); 0 in the padding and past ``K``."""
    c = rk // (KH * KW)
    r = (rk // KW) % KH
    s = rk % KW
    ih = ih0[:, None] + (r * dil_h)[None, :]
    iw = iw0[:, None] + (s * dil_w)[None, :]
    ok = p_ok[:, None] & (rk < K)[None, :] & (ih >= 0) & (ih < H) & (iw >= 0) & (iw < W)
    offsets = (c * sxc)[None, :] + ih * sxh + iw * sxw
    return tl.load(x_base[:, None] + offsets, mask=ok, other=0)


@triton.jit
def _implicit_gemm_kernel(
    x_ptr, codes_ptr, n1_ptr, n1, bias_ptr, out_ptr,
    P, H, W, OH, OW, COUT, CG, OG, K, GROUPS,
    stride_h, stride_w, pad_h, pad_w, dil_h, dil_w,
    sxn, sxc, sxh, sxw, row_stride,
    KH: tl.constexpr, KW: tl.constexpr,
    BITS: tl.constexpr, WIDTH: tl.constexpr, MIN_EXP: tl.constexpr,
    PER_ROW_N1: tl.constexpr, HAS_BIAS: tl.constexpr, UPCAST: tl.constexpr, IEEE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    CHANNELS_LAST: tl.constexpr,
):  # fmt: skip
    g, rp, rn = conv_tile(tl.program_id(0), P, OG, BLOCK_M, BLOCK_N)
    p_ok = rp < P
    n_ok = rn < OG
    oc = g * OG + rn
    if PER_ROW_N1:
        n1 = tl.load(n1_ptr + oc, mask=n_ok, other=0)[:, None]
    n, oh, ow, ih0, iw0 = pixel_origins(rp, OH, OW, stride_h, stride_w, pad_h, pad_w)
    x_base = x_ptr + n * sxn + g * CG * sxc
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in range(0, K, BLOCK_K):
        rk = k0 + tl.arange(0, BLOCK_K)  # (channel, tap row, tap column), the packed row order
        xt = gather_patches(x_base, ih0, iw0, p_ok, rk, K, H, W, sxc, sxh, sxw, dil_h, dil_w,
                            KH, KW)  # fmt: skip
        codes = load_codes(codes_ptr, oc, rk, row_stride, K, n_ok, WIDTH)
        w = decode(codes, n1, BITS, MIN_EXP)
        if not UPCAST:
            w = w.to(x_ptr.dtype.element_ty, fp_downcast_rounding="rtne")  # exact: no rounding
        acc = dot(xt, tl.trans(w), acc, UPCAST, IEEE)
    _store_output(acc, n, oh * OW + ow, oc, p_ok, n_ok, bias_ptr, out_ptr, COUT, OH * OW, HAS_BIAS,
                  CHANNELS_LAST)  # fmt: skip


@triton.jit
def _few_channels_kernel(
    x_ptr, codes_ptr, n1_ptr, n1, bias_ptr, out_ptr,
    NB, OH, OW, COUT, C, stride_h, stride_w, dil_h, dil_w, image_pixels, row_pixels, row_stride,
    KH: tl.constexpr, KW: tl.constexpr,
    BITS: tl.constexpr, WIDTH: tl.constexpr, MIN_EXP: tl.constexpr,
    PER_ROW_N1: tl.constexpr, HAS_BIAS: tl.constexpr, UPCAST: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_W: tl.constexpr, BLOCK_N: tl.constexpr,
    TAPS: tl.constexpr, CP: tl.constexpr, EVEN: tl.constexpr, CHANNELS_LAST: tl.constexpr,
):  # fmt: skip
    """The whole K of a convolution with few input channels (a network's first) in one MMA,
    on a copy of the input padded beforehand: channels last, ``CP`` channels (a power of two,
    zeros past ``C``) a pixel, so every tap of an output pixel lies in it and a tap's channels
    load as one vector. K runs ``(tap, channel)`` over ``TAPS x CP`` columns (``TAPS``: the
    taps rounded up to a power of two; zero weights past them). Each program decodes its
    output channels' weights once, keeps them, and walks tiles of ``BLOCK_H x BLOCK_W`` output
    pixels of one image, ``program_id(0)``, ``+ num_programs(0)``, ...: no index math divides,
    and no bounds are checked, per pixel (``EVEN``: the tiles cover the output exactly, so not
    even whether a pixel exists)."""
    oc = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = oc < COUT
    if PER_ROW_N1:
        n1 = tl.load(n1_ptr + oc, mask=n_ok, other=0)[:, None]
    column = tl.arange(0, TAPS * CP)
    tap = column // CP
    channel = column % CP
    real = (tap < KH * KW) & (channel < C)
    k = C * KH * KW  # the packed row order is (channel, tap): index k reads as a zero code
    codes = load_codes(codes_ptr, oc, tl.where(real, channel * (KH * KW) + tap, k), row_stride,
                       k, n_ok, WIDTH)  # fmt: skip
    w = decode(codes, n1, BITS, MIN_EXP)
    if not UPCAST:
        w = w.to(x_ptr.dtype.element_ty, fp_downcast_rounding="rtne")  # exact: no rounding
    taps = tl.arange(0, TAPS)
    tap_offset = ((taps // KW) * dil_h * row_pixels + (taps % KW) * dil_w) * CP
    tap_ok = taps < KH * KW
    if HAS_BIAS:  # once, not per tile (a load in the loop could alias the stores)
        bias = tl.load(bias_ptr + oc, mask=n_ok, other=0.0).to(tl.float32)
    tiles_w = tl.cdiv(OW, BLOCK_W)
    tiles = NB * tl.cdiv(OH, BLOCK_H) * tiles_w
    step = tl.num_programs(0)
    # software-pipelined: the next tile's inputs are in flight while this one's MMA runs
    n, pixel, p_ok, corner = _pixel_tile(
        tl.program_id(0), tiles, tiles_w, OH, OW, stride_h, stride_w, image_pixels, row_pixels,
        BLOCK_H, BLOCK_W, EVEN,
    )  # fmt: skip
    x = _patches(x_ptr, corner, p_ok, tap_offset, tap_ok, CP)
    for tile in range(tl.program_id(0), tiles, step):
        acc = dot(x, tl.trans(w), tl.zeros([BLOCK_H * BLOCK_W, BLOCK_N], tl.float32), UPCAST,
                  False)  # fmt: skip
        next_n, next_pixel, next_ok, corner = _pixel_tile(
            tile + step, tiles, tiles_w, OH, OW, stride_h, stride_w, image_pixels, row_pixels,
            BLOCK_H, BLOCK_W, EVEN,
        )  # fmt: skip
        x = _patches(x_ptr, corner, next_ok, tap_offset, tap_ok, CP)
        if HAS_BIAS:
            acc += bias[None, :]
        _store_output(acc, n, pixel, oc, p_ok, n_ok, bias_ptr, out_ptr, COUT, OH * OW, False,
                      CHANNELS_LAST)  # fmt: skip
        n, pixel, p_ok = next_n, next_pixel, next_ok


@triton.jit
def _patches(x_ptr, corner, p_ok, tap_offset, tap_ok, CP: tl.constexpr):
    """The inputs ``[pixels, taps x CP]`` of the pixels whose first tap is the padded input's
    pixel ``corner`` (``tap_offset``: multiples of ``CP``; each tap's channels one vector)."""
    channels = tl.arange(0, CP)
    offsets = (corner * CP)[:, None, None] + tap_offset[None, :, None] + channels[None, None, :]
    x = tl.load(x_ptr + offsets, mask=p_ok[:, None, None] & tap_ok[None, :, None], other=0)
    return tl.reshape(x, [corner.shape[0], tap_offset.shape[0] * CP])


@triton.jit
def _pixel_tile(tile, tiles, tiles_w, OH, OW, stride_h, stride_w, image_pixels, row_pixels,
                BLOCK_H: tl.constexpr, BLOCK_W: tl.constexpr, EVEN: tl.constexpr):  # fmt: skip
    """Pixel tile ``tile`` of the few-channels kernel (none past ``tiles``): its image, its
    pixels' index in the image, which exist, and the padded input's pixel of their first taps
    (each tile lies in one image: its image is a scalar)."""
    within = tl.arange(0, BLOCK_H * BLOCK_W)
    tiles_h = tl.cdiv(OH, BLOCK_H)
    n = tile // (tiles_h * tiles_w)
    oh = (tile // tiles_w) % tiles_h * BLOCK_H + within // BLOCK_W
    ow = tile % tiles_w * BLOCK_W + within % BLOCK_W
    p_ok = (within >= 0) & (tile < tiles)  # EVEN: the tiles cover the output exactly
    if not EVEN:
        p_ok = p_ok & (oh < OH) & (ow < OW)
    return n, oh * OW + ow, p_ok, n * image_pixels + oh * stride_h * row_pixels + ow * stride_w


@triton.jit
def _depthwise_kernel(
    x_ptr, codes_ptr, n1_ptr, n1, bias_ptr, out_ptr,
    P, H, W, OH, OW, COUT, MULT,
    stride_h, stride_w, pad_h, pad_w, dil_h, dil_w,
    sxn, sxc, sxh, sxw, row_stride,
    KH: tl.constexpr, KW: tl.constexpr,
    BITS: tl.constexpr, WIDTH: tl.constexpr, MIN_EXP: tl.constexpr,
    PER_ROW_N1: tl.constexpr, HAS_BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CHANNELS_LAST: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    tiles_m = tl.cdiv(P, BLOCK_M)
    rp = (pid % tiles_m) * BLOCK_M + tl.arange(0, BLOCK_M)
    oc = (pid // tiles_m) * BLOCK_N + tl.arange(0, BLOCK_N)
    p_ok = rp < P
    c_ok = oc < COUT
    if PER_ROW_N1:
        n1 = tl.load(n1_ptr + oc, mask=c_ok, other=0)[:, None]
    n = rp // (OH * OW)
    oh = (rp // OW) % OH
    ow = rp % OW
    x_base = x_ptr + (n * sxn)[:, None] + (oc // MULT * sxc)[None, :]
    # every tap's decoded weight at once: [channels, taps] (K = kh * kw is small)
    taps = tl.arange(0, triton.next_power_of_2(KH * KW))
    w_all = decode(load_codes(codes_ptr, oc, taps, row_stride, KH * KW, c_ok, WIDTH), n1, BITS,
                   MIN_EXP)  # fmt: skip
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for r in tl.static_range(KH):
        ih = oh * stride_h - pad_h + r * dil_h
        for s in tl.static_range(KW):
            iw = ow * stride_w - pad_w + s * dil_w
            ok = p_ok & (ih >= 0) & (ih < H) & (iw >= 0) & (iw < W)
            xt = tl.load(x_base + (ih * sxh + iw * sxw)[:, None], mask=ok[:, None] & c_ok[None, :],
                         other=0.0)  # fmt: skip
            w = tl.sum(tl.where(taps[None, :] == r * KW + s, w_all, 0.0), axis=1)
            acc += xt.to(tl.float32) * w[None, :]
    _store_output(acc, n, oh * OW + ow, oc, p_ok, c_ok, bias_ptr, out_ptr, COUT, OH * OW, HAS_BIAS,
                  CHANNELS_LAST)  # fmt: skip


@triton.jit
def _store_output(acc, n, pixel, oc, p_ok, c_ok, bias_ptr, out_ptr, COUT, PIXELS,
                  HAS_BIAS: tl.constexpr, CHANNELS_LAST: tl.constexpr):  # fmt: skip
    """Store an fp32 ``[pixels, channels]`` tile into a dense NCHW (or ``CHANNELS_LAST``)
    output, bias added, one rounding."""
    if HAS_BIAS:
        acc += tl.load(bias_ptr + oc, mask=c_ok, other=0.0).to(tl.float32)[None, :]
    if CHANNELS_LAST:
        offsets = ((n * PIXELS + pixel) * COUT)[:, None] + oc[None, :]
    else:
        offsets = (n * COUT * PIXELS + pixel)[:, None] + (oc * PIXELS)[None, :]
    y = downcast(acc, out_ptr.dtype.element_ty)  # to nearest even, also under the interpreter
    tl.store(out_ptr + offsets, y, p_ok[:, None] & c_ok[None, :])


def conv_config(
    pixels: int, out_per_group: int, in_per_group: int, taps: int, fp32: bool = False,
    groups: int = 1,
) -> ConvConfig:  # fmt: skip
    """The kernel and tiles for a convolution with ``pixels = N*OH*OW`` outputs per channel
    (``fp32``: IEEE products on CUDA cores, smaller tiles; sizes from the sm_90 static check).
    An fp16/bf16 ``groups=1`` convolution whose whole K fits :data:`FEW_CHANNELS_K` columns (a
    network's first) takes the few-channels kernel; ``block_k`` is then its padded K.

    Example:
        >>> conv_config(12544, 64, 64, 9)
        ConvConfig(kernel='implicit_gemm', block_m=128, block_n=64, block_k=32, num_warps=8, num_stages=3)
        >>> conv_config(401408, 64, 3, 49)  # ResNet's 7x7 first convolution at batch 32
        ConvConfig(kernel='few_channels', block_m=128, block_n=64, block_k=256, num_warps=8, num_stages=1)
    """  # noqa: E501
    if in_per_group == 1:
        return ConvConfig("depthwise", 64, 32, 0, 8, 1)
    block_m = 128 if pixels >= 4096 else 64 if pixels >= 512 else 32
    block_n = min(128 if block_m < 128 else 64, max(16, triton.next_power_of_2(out_per_group)))
    columns = few_channels_columns(in_per_group, taps)
    if groups == 1 and not fp32 and columns[0] * columns[1] <= FEW_CHANNELS_K:
        block_n = min(block_n, 64)  # its weights stay in registers
        return ConvConfig("few_channels", block_m, block_n, columns[0] * columns[1],
                          8 if block_m * block_n >= 128 * 64 else 4, 1)  # fmt: skip
    block_k = 16 if in_per_group * taps <= 16 else 32
    warps = 8 if block_m * block_n >= 128 * 64 else 4  # fewer threads spill (sm_90 check)
    if fp32:
        return ConvConfig("implicit_gemm", min(block_m, 64), min(block_n, 64), 16, 8, 2)
    return ConvConfig("implicit_gemm", block_m, block_n, block_k, warps, 3)


def pixel_block(block_m: int, out_width: int) -> tuple[int, int]:
    """The few-channels kernel's pixel tile, ``block_m`` pixels as rows x columns of one
    image's output (up to 16 columns, at least 2 rows).

    Example:
        >>> pixel_block(128, 112), pixel_block(32, 5)
        ((8, 16), (4, 8))
    """
    block_w = min(16, triton.next_power_of_2(out_width), block_m // 2)
    return block_m // block_w, block_w


def few_channels_columns(channels: int, taps: int) -> tuple[int, int]:
    """The few-channels kernel's K as (taps, channels) a tap, each rounded up to a power of
    two (their product at least one MMA's depth, 16).

    Example:
        >>> few_channels_columns(3, 49), few_channels_columns(3, 9), few_channels_columns(2, 1)
        ((64, 4), (16, 4), (1, 16))
    """
    padded = triton.next_power_of_2(channels)
    return triton.next_power_of_2(taps), max(padded, 16 // triton.next_power_of_2(taps))


def shift_conv2d(
    x: Tensor,
    packed: Tensor,
    bits: int,
    n1: int | Tensor,
    weight_shape: list[int],
    bias: Tensor | None,
    stride: list[int],
    padding: list[int],
    dilation: list[int],
    groups: int,
    out: Tensor | None = None,
    n1_rows: Tensor | None = None,
) -> Tensor:
    """``inq::shift_conv2d`` on Triton kernels (CUDA tensors, or CPU under the interpreter).

    ``x`` is ``[N, Cin, H, W]`` (any memory format) or unbatched ``[Cin, H, W]``; the result is
    dense in ``x``'s memory format, channels_last for a channels_last ``x``, as ``F.conv2d``'s
    (``out``, such a ``[N, O, OH, OW]`` tensor, receives it if given). ``n1``
    may be an int32 tensor ``[O]``, or ``n1 + n1_rows`` the exponents per row (the op's form,
    which keeps the tensor-core kernel's layout cached with ``n1_rows``).

    Raises:
        ValueError: on a dtype other than fp32/fp16/bf16, channels that do not match, or an
            input smaller than the dilated kernel.
    """
    if x.dtype not in FLOAT_DTYPES:
        raise ValueError(f"shift_conv2d kernels take fp32, fp16 or bf16 input, got {x.dtype}")
    o, cg, kh, kw = weight_shape
    if x.dim() not in (3, 4) or x.shape[-3] != cg * groups or o % groups:
        raise ValueError(
            f"shift_conv2d: input {list(x.shape)} does not fit weight {weight_shape} "
            f"with groups={groups}"
        )
    check_devices("shift_conv2d", x, packed, bias, n1 if isinstance(n1, Tensor) else None)
    batched = x.unsqueeze(0) if x.dim() == 3 else x
    nb, _, h, w = batched.shape
    oh, ow = conv2d_output_size((h, w), weight_shape, stride, padding, dilation)
    if oh <= 0 or ow <= 0:  # as F.conv2d
        raise ValueError(
            f"shift_conv2d: the padded input {h}x{w} is smaller than the dilated kernel "
            f"{weight_shape[2:]}: no output pixel"
        )
    k = cg * kh * kw
    check_operands("shift_conv2d", packed, bits, o, k, bias, x.numel(), nb * o * oh * ow)
    memory_format = output_format(batched)
    out = output_tensor(out, (nb, o, oh, ow), x.dtype, x.device, memory_format)
    channels_last = memory_format == torch.channels_last
    effective = n1 if n1_rows is None else effective_n1(int(n1), n1_rows)
    n1_ptr, n1_value, per_row = n1_args(effective, o, x.dtype, x.device)  # checks n1
    if groups == 1 and x.dtype != torch.float32 and out.numel() and conv_mma_fits(cg, bits):
        layout = conv_layout(packed, bits, n1, weight_shape, x.dtype, n1_rows)
        if layout is not None:
            conv_mma(batched, layout, weight_shape, bias, stride, padding, dilation, out)
            return out.squeeze(0) if x.dim() == 3 else out
    pixels = out.shape[0] * out.shape[2] * out.shape[3]
    b = None if bias is None else bias.to(x.dtype).contiguous()
    if out.numel():
        cfg = conv_config(pixels, o // groups, cg, kh * kw, x.dtype == torch.float32, groups)
        head = (batched, packed.contiguous(), n1_ptr, n1_value, out if b is None else b, out)
        args = (*head, pixels, h, w, oh, ow, o)
        geometry = (*stride, *padding, *dilation, *batched.stride(), packed.stride(0))
        width, min_exp, has_bias = code_width(bits), MIN_EXP[x.dtype], b is not None
        launch = {"num_warps": cfg.num_warps, "num_stages": cfg.num_stages}
        tiles_m = triton.cdiv(pixels, cfg.block_m)
        if cfg.kernel == "few_channels":
            tap_columns, cp = few_channels_columns(cg, kh * kw)
            block_h, block_w = pixel_block(cfg.block_m, ow)
            tiles = nb * triton.cdiv(oh, block_h) * triton.cdiv(ow, block_w)
            programs = min(tiles, sm_count(x.device) * FEW_CHANNELS_PROGRAMS)
            # channels last, cp channels a pixel, the padding in place: one copy
            pads = (0, cp - cg, padding[1], padding[1], padding[0], padding[0])
            padded = F.pad(batched.permute(0, 2, 3, 1), pads)
            _few_channels_kernel[(programs, triton.cdiv(o, cfg.block_n))](
                padded, *head[1:], nb, oh, ow, o, cg, *stride, *dilation,
                padded.shape[1] * padded.shape[2], padded.shape[2], packed.stride(0),
                KH=kh, KW=kw, BITS=bits, WIDTH=width, MIN_EXP=min_exp, PER_ROW_N1=per_row,
                HAS_BIAS=has_bias, UPCAST=dot_upcast(x.dtype), BLOCK_H=block_h, BLOCK_W=block_w,
                BLOCK_N=cfg.block_n, TAPS=tap_columns, CP=cp,
                EVEN=oh % block_h == 0 and ow % block_w == 0, CHANNELS_LAST=channels_last,
                **launch,
            )  # fmt: skip
        elif cfg.kernel == "depthwise":
            grid = (tiles_m * triton.cdiv(o, cfg.block_n),)
            _depthwise_kernel[grid](
                *args, o // groups, *geometry,
                KH=kh, KW=kw, BITS=bits, WIDTH=width, MIN_EXP=min_exp, PER_ROW_N1=per_row,
                HAS_BIAS=has_bias, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
                CHANNELS_LAST=channels_last, **launch,
            )  # fmt: skip
        else:
            og = o // groups
            grid = (groups * tiles_m * triton.cdiv(og, cfg.block_n),)
            _implicit_gemm_kernel[grid](
                *args, cg, og, k, groups, *geometry,
                KH=kh, KW=kw, BITS=bits, WIDTH=width, MIN_EXP=min_exp, PER_ROW_N1=per_row,
                HAS_BIAS=has_bias, UPCAST=dot_upcast(x.dtype), IEEE=x.dtype == torch.float32,
                BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
                CHANNELS_LAST=channels_last, **launch,
            )  # fmt: skip
    return out.squeeze(0) if x.dim() == 3 else out
