"""The integer ops in Triton: ``inq::shift_linear_int8``, ``inq::shift_conv2d_int8``, their
``_requant`` forms, ``inq::requant_add`` and ``inq::quantize_input``.

The launchers pick the kernel (``kernel="auto"``): the int8 tensor cores of
:mod:`inq.kernels.triton.imma` where a layer's terms are all products and a group has 16
outputs or more, else the shift-add kernels here, which compute the definition directly:

- :func:`_int8_kernel`: rows x outputs, reducing over ``in_features`` a tile at a time.
- :func:`_conv_int8_kernel`: the convolution as an implicit GEMM of output pixels (``N*OH*OW``)
  by output channels over ``K = Cin/groups * kh * kw``, gathering each activation tile with
  stride, padding (0 outside the input) and dilation from any strides; groups are a grid
  dimension.

Activations widen to int32 from their own type (uint8 zero-extends, int8 sign-extends). Every
term is ``((-x if s else x) << frac) >> o`` (an arithmetic shift; code 0 adds 0), summed in
int32, exactly the definition in :mod:`inq.kernels.int8`. Offsets reach 63 at 8 bits; a shift
by 31 already gives what any larger one would (0 or -1, since ``|x << frac| < 2**31``), so the
shift is clamped there and stays defined on every machine. Integer addition is associative and
the ops refuse any ``frac`` that could overflow, so the result is the reference's bit for bit
whatever the tiling. The ``_requant`` forms requantize in the tensor-core kernel's epilogue (in
PyTorch after a shift-add kernel); the residual add and the input quantization are one pass
each over a dense tensor.
"""

from __future__ import annotations

import math
import struct

import torch
import triton
import triton.language as tl
from torch import Tensor

from inq.codes import code_width
from inq.kernels.int8 import (
    check_conv2d_int8_args,
    check_int8_args,
    check_requant_args,
    check_skip,
    quantize_input_reference,
    requant_add_reference,
    requantize_channels,
    value_dtype,
)
from inq.kernels.int8_layout import Int8Weight, cached_int8_weight
from inq.kernels.ops import conv2d_output_size
from inq.kernels.triton.conv import ConvConfig, gather_patches
from inq.kernels.triton.decode import check_devices, check_operands, load_codes, output_tensor
from inq.kernels.triton.geometry import conv_tile, pixel_origins
from inq.kernels.triton.imma import MIN_OUTPUTS, Requant, Residual, imma_conv2d, residual

__all__ = [
    "KERNELS",
    "conv_int8_config",
    "quantize_input",
    "requant_add",
    "shift_conv2d_int8",
    "shift_conv2d_int8_requant",
    "shift_conv2d_int8_requant_add",
    "shift_linear_int8",
    "shift_linear_int8_requant",
]

KERNELS = ("auto", "imma", "shift_add")  # which kernel a launcher runs ("auto": imma if it can)

BLOCK_M, BLOCK_O, BLOCK_K = 4, 32, 64
_CONV_TERMS = 8192  # terms per conv tile (BLOCK_M * BLOCK_N * BLOCK_K), as the linear tile
_CONV_BLOCK_K = 16


@triton.jit
def _shift_add(v, codes, BITS: tl.constexpr):
    """int32 ``[M, N]``: the terms of ``v = x << frac [M, K]`` and int32 ``codes [N, K]``,
    summed over K."""
    # the sign as a factor (+1, -1, or 0 for code 0), so each term is one multiply and one
    # arithmetic shift of the signed value: (-v) >> o, not -(v >> o). Selecting between -v and v
    # on the [M, N, K] terms and then masking code 0 crashes the layout pass of Triton 3.4 to 3.6
    # at 8 bits ("operand #0 does not dominate this use"); this form compiles on 3.4 to 3.9.
    sign = tl.where(codes != 0, 1 - 2 * ((codes >> (BITS - 2)) & 1), 0)  # [N, K]
    shift = tl.minimum(codes & ((1 << (BITS - 2)) - 1), 31)
    terms = (v[:, None, :] * sign[None, :, :]) >> shift[None, :, :]  # [M, N, K]
    return tl.sum(terms, axis=2)


@triton.jit
def _int8_kernel(
    x_ptr, codes_ptr, out_ptr, M, N, K, frac, stride_xm, stride_xk, row_stride,
    BITS: tl.constexpr, WIDTH: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_O: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)  # one axis: any number of rows
    tiles_o = tl.cdiv(N, BLOCK_O)
    rm = (pid // tiles_o) * BLOCK_M + tl.arange(0, BLOCK_M)
    ro = (pid % tiles_o) * BLOCK_O + tl.arange(0, BLOCK_O)
    m_ok = rm < M
    o_ok = ro < N
    acc = tl.zeros([BLOCK_M, BLOCK_O], tl.int32)
    for k0 in range(0, K, BLOCK_K):
        rk = k0 + tl.arange(0, BLOCK_K)
        xk = tl.load(x_ptr + rm[:, None] * stride_xm + rk[None, :] * stride_xk,
                     mask=m_ok[:, None] & (rk < K)[None, :], other=0)  # fmt: skip
        v = xk.to(tl.int32) << frac  # [M, K]
        codes = load_codes(codes_ptr, ro, rk, row_stride, K, o_ok, WIDTH)  # [N, K]
        acc += _shift_add(v, codes, BITS)
    tl.store(out_ptr + rm[:, None] * N + ro[None, :], acc, m_ok[:, None] & o_ok[None, :])


@triton.jit
def _conv_int8_kernel(
    x_ptr, codes_ptr, out_ptr, frac,
    P, H, W, OH, OW, COUT, CG, OG, K,
    stride_h, stride_w, pad_h, pad_w, dil_h, dil_w,
    sxn, sxc, sxh, sxw, row_stride,
    KH: tl.constexpr, KW: tl.constexpr, BITS: tl.constexpr, WIDTH: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    g, rp, rn = conv_tile(tl.program_id(0), P, OG, BLOCK_M, BLOCK_N)
    p_ok = rp < P
    n_ok = rn < OG
    oc = g * OG + rn
    n, _, _, ih0, iw0 = pixel_origins(rp, OH, OW, stride_h, stride_w, pad_h, pad_w)
    x_base = x_ptr + n * sxn + g * CG * sxc
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.int32)
    for k0 in range(0, K, BLOCK_K):
        rk = k0 + tl.arange(0, BLOCK_K)  # (channel, tap row, tap column), the packed row order
        xt = gather_patches(
            x_base, ih0, iw0, p_ok, rk, K, H, W, sxc, sxh, sxw, dil_h, dil_w, KH, KW
        )  # fmt: skip  (padding adds 0)
        v = xt.to(tl.int32) << frac
        codes = load_codes(codes_ptr, oc, rk, row_stride, K, n_ok, WIDTH)  # [N, K]
        acc += _shift_add(v, codes, BITS)
    offsets = rp[:, None] * COUT + oc[None, :]  # channels_last
    tl.store(out_ptr + offsets, acc, p_ok[:, None] & n_ok[None, :])


def shift_linear_int8(
    x: Tensor,
    packed: Tensor,
    bits: int,
    in_features: int,
    frac_bits: int,
    out: Tensor | None = None,
    kernel: str = "auto",
) -> Tensor:
    """``inq::shift_linear_int8`` on a Triton kernel (CUDA, or CPU under the interpreter), int8
    or uint8 ``x``; ``out``, a contiguous int32 ``[rows, O]`` tensor, receives the result if given.
    ``kernel`` (:data:`KERNELS`): int8 tensor cores where the layer allows
    (:mod:`inq.kernels.triton.imma`), else shift-add.

    Raises:
        ValueError: as :func:`inq.kernels.int8.check_int8_args`; ``kernel="imma"`` for a layer
            the tensor-core kernel cannot run.
    """
    check_int8_args(x, bits, in_features, frac_bits)
    check_devices("shift_linear_int8", x, packed)
    rows = x.reshape(math.prod(x.shape[:-1]), in_features)
    m, o = rows.shape[0], packed.shape[0]
    check_operands("shift_linear_int8", packed, bits, o, in_features, None, x.numel(), m * o)
    out = output_tensor(out, (m, o), torch.int32, x.device)
    imma = _imma_weight("shift_linear_int8", kernel, packed, bits, in_features, frac_bits, 1, o)
    if m and o and imma is not None:
        imma_conv2d(rows.view(m, in_features, 1, 1), imma, [o, in_features, 1, 1], [1, 1],
                    [0, 0], [1, 1], 1, out.view(m, o, 1, 1))  # fmt: skip
    elif m and o:
        grid = (triton.cdiv(m, BLOCK_M) * triton.cdiv(o, BLOCK_O),)
        _int8_kernel[grid](
            rows, packed.contiguous(), out, m, o, in_features, frac_bits,
            rows.stride(0), rows.stride(1), packed.stride(0),
            BITS=bits, WIDTH=code_width(bits), BLOCK_M=BLOCK_M, BLOCK_O=BLOCK_O, BLOCK_K=BLOCK_K,
        )  # fmt: skip
    return out.reshape(*x.shape[:-1], o)


def conv_int8_config(out_per_group: int) -> ConvConfig:
    """Tiles of the conv kernel: 16 output channels a tile, or 4 where a group has fewer than 8
    (depthwise); pixels fill the rest of the 8192 terms; 8 warps keep it near 128 registers a
    thread (sm_90 check).

    Example:
        >>> conv_int8_config(1)
        ConvConfig(kernel='int8', block_m=128, block_n=4, block_k=16, num_warps=8, num_stages=3)
    """
    block_n = 16 if out_per_group >= 8 else 4
    block_m = _CONV_TERMS // (block_n * _CONV_BLOCK_K)
    return ConvConfig("int8", block_m, block_n, _CONV_BLOCK_K, num_warps=8, num_stages=3)


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
    out: Tensor | None = None,
    kernel: str = "auto",
) -> Tensor:
    """``inq::shift_conv2d_int8`` on a Triton kernel (CUDA, or CPU under the interpreter):
    int8 or uint8 ``x [N, Cin, H, W]`` (any memory format) to an int32 ``[N, O, OH, OW]`` in
    channels_last memory format; ``out``, such a tensor, receives the result if given.
    ``kernel`` as for :func:`shift_linear_int8`.

    Raises:
        ValueError: as :func:`inq.kernels.int8.check_conv2d_int8_args`; on packed codes that
            do not fit ``weight_shape``; ``kernel="imma"`` for a layer it cannot run.
    """
    check_conv2d_int8_args(x, bits, weight_shape, stride, padding, dilation, groups, frac_bits)
    check_devices("shift_conv2d_int8", x, packed)
    o, cg, kh, kw = weight_shape
    nb, _, h, w = x.shape
    oh, ow = conv2d_output_size((h, w), weight_shape, stride, padding, dilation)
    k = cg * kh * kw
    check_operands("shift_conv2d_int8", packed, bits, o, k, None, x.numel(), nb * o * oh * ow)
    out = output_tensor(out, (nb, o, oh, ow), torch.int32, x.device, torch.channels_last)
    og = o // groups
    imma = _imma_weight("shift_conv2d_int8", kernel, packed, bits, k, frac_bits, kh * kw, og)
    if out.numel() and imma is not None:
        imma_conv2d(x, imma, weight_shape, stride, padding, dilation, groups, out)
    elif out.numel():
        pixels = nb * oh * ow
        cfg = conv_int8_config(og)
        grid = (groups * triton.cdiv(pixels, cfg.block_m) * triton.cdiv(og, cfg.block_n),)
        _conv_int8_kernel[grid](
            x, packed.contiguous(), out, frac_bits, pixels, h, w, oh, ow, o, cg, og, k,
            *stride, *padding, *dilation, *x.stride(), packed.stride(0),
            KH=kh, KW=kw, BITS=bits, WIDTH=code_width(bits),
            BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
            num_warps=cfg.num_warps, num_stages=cfg.num_stages,
        )  # fmt: skip
    return out


def shift_linear_int8_requant(
    x: Tensor, packed: Tensor, bits: int, in_features: int, frac_bits: int, bias: Tensor,
    multiplier: Tensor, shift: Tensor, lo: int, hi: int, kernel: str = "auto",
) -> Tensor:  # fmt: skip
    """``inq::shift_linear_int8_requant``: on int8 tensor cores with the requantization in the
    kernel's epilogue where the layer allows (``kernel`` as for :func:`shift_linear_int8`), else
    the shift-add kernel and the requantization in PyTorch.

    Raises:
        ValueError: as :func:`shift_linear_int8` and
            :func:`inq.kernels.int8.check_requant_args`.
    """
    op = "shift_linear_int8_requant"
    check_requant_args(op, packed.shape[0], bias, multiplier, shift)
    check_int8_args(x, bits, in_features, frac_bits)
    check_devices(op, x, packed, bias, multiplier, shift)
    m, o = math.prod(x.shape[:-1]), packed.shape[0]
    check_operands(op, packed, bits, o, in_features, None, x.numel(), m * o)
    imma = _imma_weight(op, kernel, packed, bits, in_features, frac_bits, 1, o)
    if imma is None or not m * o:
        acc = shift_linear_int8(x, packed, bits, in_features, frac_bits, kernel="shift_add")
        return requantize_channels(acc, bias, multiplier, shift, lo, hi, channel_dim=-1)
    out = torch.empty((m, o), dtype=value_dtype(lo, hi), device=x.device)
    rows = x.reshape(m, in_features, 1, 1)
    imma_conv2d(rows, imma, [o, in_features, 1, 1], [1, 1], [0, 0], [1, 1], 1,
                out.view(m, o, 1, 1), Requant(bias, multiplier, shift, lo, hi))  # fmt: skip
    return out.reshape(*x.shape[:-1], o)


def shift_conv2d_int8_requant(
    x: Tensor, packed: Tensor, bits: int, weight_shape: list[int], stride: list[int],
    padding: list[int], dilation: list[int], groups: int, frac_bits: int, bias: Tensor,
    multiplier: Tensor, shift: Tensor, lo: int, hi: int, kernel: str = "auto",
) -> Tensor:  # fmt: skip
    """``inq::shift_conv2d_int8_requant`` (channels_last), as
    :func:`shift_linear_int8_requant`.

    Raises:
        ValueError: as :func:`shift_conv2d_int8` and
            :func:`inq.kernels.int8.check_requant_args`.
    """
    geometry = (weight_shape, stride, padding, dilation, groups)
    requant = (bias, multiplier, shift)
    shape, imma = _requant_conv_checks("shift_conv2d_int8_requant", x, packed, bits, geometry,
                                       frac_bits, requant, kernel)  # fmt: skip
    if imma is None or not math.prod(shape):
        acc = shift_conv2d_int8(x, packed, bits, *geometry, frac_bits, kernel="shift_add")
        return requantize_channels(acc, bias, multiplier, shift, lo, hi, channel_dim=1)
    out = torch.empty(shape, dtype=value_dtype(lo, hi), device=x.device,
                      memory_format=torch.channels_last)  # fmt: skip
    imma_conv2d(x, imma, *geometry, out, Requant(bias, multiplier, shift, lo, hi))
    return out


def shift_conv2d_int8_requant_add(
    x: Tensor, packed: Tensor, bits: int, weight_shape: list[int], stride: list[int],
    padding: list[int], dilation: list[int], groups: int, frac_bits: int, bias: Tensor,
    multiplier: Tensor, shift: Tensor, lo: int, hi: int, skip: Tensor, m_conv: int, m_skip: int,
    add_shift: int, add_lo: int, add_hi: int, kernel: str = "auto",
) -> Tensor:  # fmt: skip
    """``inq::shift_conv2d_int8_requant_add`` (channels_last): on int8 tensor cores, the
    residual add in the epilogue after the requantization (in the requantization pass where K
    is split); else :func:`shift_conv2d_int8_requant` then :func:`requant_add`. Bit for bit
    :func:`inq.kernels.int8.shift_conv2d_int8_requant_add`.

    Raises:
        ValueError: as :func:`shift_conv2d_int8_requant` and
            :func:`inq.kernels.int8.check_skip`.
    """
    op = "shift_conv2d_int8_requant_add"
    geometry = (weight_shape, stride, padding, dilation, groups)
    requant = (bias, multiplier, shift)
    shape, imma = _requant_conv_checks(op, x, packed, bits, geometry, frac_bits, requant, kernel,
                                       skip)  # fmt: skip
    check_skip(op, shape, skip)
    if imma is None or not math.prod(shape) or not 0 <= add_shift <= 62:
        conv = shift_conv2d_int8_requant(x, packed, bits, *geometry, frac_bits, bias, multiplier,
                                         shift, lo, hi, kernel="shift_add")  # fmt: skip
        return requant_add(conv, skip, m_conv, m_skip, add_shift, add_lo, add_hi)
    out = torch.empty(shape, dtype=value_dtype(add_lo, add_hi), device=x.device,
                      memory_format=torch.channels_last)  # fmt: skip
    imma_conv2d(x, imma, *geometry, out, Requant(bias, multiplier, shift, lo, hi),
                Residual(skip, m_conv, m_skip, add_shift, add_lo, add_hi))  # fmt: skip
    return out


def _requant_conv_checks(
    op: str, x: Tensor, packed: Tensor, bits: int, geometry: tuple, frac_bits: int,
    requant: tuple[Tensor, Tensor, Tensor], kernel: str, *more: Tensor,
) -> tuple[list[int], Int8Weight | None]:  # fmt: skip
    """Check a requantized convolution's arguments (``more``: other tensors that must be on
    ``x``'s device); its output shape, and its int8 layout (``None``: the shift-add kernel)."""
    check_conv2d_int8_args(x, bits, *geometry, frac_bits)
    (o, cg, kh, kw), groups = geometry[0], geometry[4]
    check_requant_args(op, o, *requant)
    check_devices(op, x, packed, *requant, *more)
    shape = [x.shape[0], o, *conv2d_output_size(x.shape[-2:], *geometry[:4])]
    check_operands(op, packed, bits, o, cg * kh * kw, None, x.numel(), math.prod(shape))
    return shape, _imma_weight(op, kernel, packed, bits, cg * kh * kw, frac_bits, kh * kw,
                               o // groups)  # fmt: skip


def _imma_weight(
    op: str, kernel: str, packed: Tensor, bits: int, k: int, frac: int, taps: int, og: int
) -> Int8Weight | None:
    """The int8 layout for the tensor-core kernel, or ``None`` where the shift-add kernel runs
    (``kernel="shift_add"``, fewer than :data:`MIN_OUTPUTS` outputs a group, or no layout)."""
    if kernel not in KERNELS:
        raise ValueError(f"{op}: kernel must be one of {KERNELS}, got {kernel!r}")
    weight = None
    if kernel != "shift_add" and og >= MIN_OUTPUTS:
        weight = cached_int8_weight(packed, bits, k, frac, taps)
    if kernel == "imma" and weight is None:
        raise ValueError(
            f"{op}: no int8 tensor-core layout for this layer (fewer than {MIN_OUTPUTS} "
            "outputs a group, a term that floors, or weights beyond two int8 parts)"
        )
    return weight


_ELEMENTS = 1024  # elements a program of the elementwise kernels


@triton.jit
def _requant_add_kernel(x_ptr, y_ptr, out_ptr, m_x, m_y, half, shift, lo, hi, total,
                        BLOCK: tl.constexpr):  # fmt: skip
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < total
    x = tl.load(x_ptr + offs, mask=ok, other=0).to(tl.int64)
    q = residual(x, y_ptr + offs, ok, m_x, m_y, half, shift, lo, hi)
    tl.store(out_ptr + offs, q.to(out_ptr.dtype.element_ty), ok)


@triton.jit
def _quantize_input_kernel(x_ptr, out_ptr, scale_bits, lo, hi, total, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < total
    x = tl.load(x_ptr + offs, mask=ok, other=0.0).to(tl.float64)
    # the scale arrives as the bits of its float64 (a Python float argument would be fp32)
    scale = scale_bits.to(tl.int64).to(tl.float64, bitcast=True)
    q = tl.floor(x / scale + 0.5)  # float64 division rounds correctly (div.rn.f64)
    q = tl.minimum(tl.maximum(q, lo.to(tl.float64)), hi.to(tl.float64))
    tl.store(out_ptr + offs, q.to(out_ptr.dtype.element_ty), ok)


def _same_layout(*tensors: Tensor) -> bool:
    """Whether the tensors are dense in one memory order (elementwise by flat index)."""
    first = tensors[0]
    dense = first.is_contiguous() or first.is_contiguous(memory_format=torch.channels_last)
    return dense and all(t.shape == first.shape and t.stride() == first.stride() for t in tensors)


def requant_add(x: Tensor, y: Tensor, m_x: int, m_y: int, shift: int, lo: int, hi: int) -> Tensor:
    """``inq::requant_add`` in one Triton pass where ``x`` and ``y`` share a dense layout
    (else the reference); bit for bit :func:`inq.kernels.int8.requant_add`."""
    check_devices("requant_add", x, y)
    if x.shape != y.shape:
        raise ValueError(f"requant_add: x {list(x.shape)} and y {list(y.shape)} differ in shape")
    if not _same_layout(x, y) or not 0 <= shift <= 62:
        return requant_add_reference(x, y, m_x, m_y, shift, lo, hi)
    out = torch.empty_like(x, dtype=value_dtype(lo, hi))
    if out.numel():
        grid = (triton.cdiv(out.numel(), _ELEMENTS),)
        _requant_add_kernel[grid](x, y, out, m_x, m_y, (1 << shift) >> 1, shift, lo, hi,
                                  out.numel(), BLOCK=_ELEMENTS)  # fmt: skip
    return out


def quantize_input(x: Tensor, scale: float, lo: int, hi: int) -> Tensor:
    """``inq::quantize_input`` in one Triton pass on a dense ``x`` (else the reference); bit for
    bit :func:`inq.kernels.int8.quantize_input`."""
    if not x.is_floating_point() or not _same_layout(x):
        return quantize_input_reference(x, scale, lo, hi)
    out = torch.empty_like(x, dtype=value_dtype(lo, hi))
    if out.numel():
        grid = (triton.cdiv(out.numel(), _ELEMENTS),)
        bits = struct.unpack("<q", struct.pack("<d", scale))[0]
        _quantize_input_kernel[grid](x, out, bits, lo, hi, out.numel(), BLOCK=_ELEMENTS)
    return out
