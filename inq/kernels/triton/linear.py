"""``inq::shift_linear`` in Triton: ``y = x @ W.T + bias`` with ``W`` read as packed codes.

:func:`shift_linear` lays the weight out for the kernels once (:mod:`inq.kernels.layout`,
cached with the packed tensor) and runs the kernels of :mod:`inq.kernels.triton.swar`. The few
weights that layout cannot hold exactly (fp16 byte codes whose live levels span more than 32
powers of two, or a row scale outside the normal fp32 range) run on the generic kernels of this
module, which decode every code from the packed rows (sign and exponent ``n1 - offset`` built
into the float's bits, with the reference's subnormals and flush):

- ``M <= 4``: :func:`_gemv_kernel`, fused decode + GEMV on CUDA cores;
- otherwise :func:`_gemm_kernel`, code tiles decoded in registers inside a tensor-core GEMM.

Both split K where the output tiles alone would leave SMs idle: each split writes fp32 partial sums
and :func:`inq.kernels.triton.decode.reduce_kernel` adds them in split order (deterministic, no
atomics), then the bias, and rounds once to the output dtype (to nearest even, also under the
interpreter: :func:`inq.kernels.triton.decode.downcast`). Results differ from the reference only by
fp32 summation order (the bound is derived in ``tests/test_kernels_triton.py``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from torch import Tensor

from inq.codes import code_width
from inq.kernels.layout import cached_kernel_weight
from inq.kernels.ops import effective_n1
from inq.kernels.triton.decode import (
    FLOAT_DTYPES,
    MIN_EXP,
    check_devices,
    check_n1,
    check_n1_rows,
    check_operands,
    decode,
    dot,
    dot_upcast,
    finish,
    grouped_tile,
    load_codes,
    n1_args,
    output_tensor,
    reduce_partials,
    sm_count,
)
from inq.kernels.triton.swar import swar_linear

__all__ = ["GEMV_MAX_ROWS", "SKINNY_MAX_ROWS", "LinearConfig", "linear_config", "shift_linear"]

GEMV_MAX_ROWS = 4
SKINNY_MAX_ROWS = 64
_MAX_SPLIT = 16


@dataclass(frozen=True)
class LinearConfig:
    """Tiles of one launch: ``kernel`` is "gemv" or "gemm"; ``block_k`` counts codes."""

    kernel: str
    block_m: int
    block_n: int
    block_k: int
    split_k: int
    num_warps: int
    num_stages: int


@triton.jit
def _gemv_kernel(
    x_ptr, codes_ptr, n1_ptr, n1, bias_ptr, out_ptr, part_ptr,
    M, N, K, KB, stride_xm, stride_xk, row_stride, bytes_per_split,
    BITS: tl.constexpr, WIDTH: tl.constexpr, MIN_EXP: tl.constexpr,
    PER_ROW_N1: tl.constexpr, HAS_BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_O: tl.constexpr, BLOCK_B: tl.constexpr, SPLIT_K: tl.constexpr,
):  # fmt: skip
    pid_o = tl.program_id(0)
    pid_k = tl.program_id(1)
    rows = pid_o * BLOCK_O + tl.arange(0, BLOCK_O)
    row_ok = rows < N
    if PER_ROW_N1:
        n1 = tl.load(n1_ptr + rows, mask=row_ok, other=0)[:, None]
    rm = tl.arange(0, BLOCK_M)
    m_ok = rm < M
    acc = tl.zeros([BLOCK_M, BLOCK_O], tl.float32)
    start = pid_k * bytes_per_split
    for b0 in range(start, tl.minimum(start + bytes_per_split, KB), BLOCK_B):
        cols = b0 + tl.arange(0, BLOCK_B)
        mask = row_ok[:, None] & (cols < KB)[None, :]
        byte = tl.load(codes_ptr + rows[:, None] * row_stride + cols[None, :], mask=mask, other=0)
        byte = byte.to(tl.int32)
        if WIDTH == 4:
            k_even = 2 * cols
            w_even = decode(byte & 15, n1, BITS, MIN_EXP)
            w_odd = decode(byte >> 4, n1, BITS, MIN_EXP)
            x_ptrs = x_ptr + rm[:, None] * stride_xm + k_even[None, :] * stride_xk
            x_even = tl.load(x_ptrs, mask=m_ok[:, None] & (k_even < K)[None, :], other=0.0)
            x_odd = tl.load(
                x_ptrs + stride_xk, mask=m_ok[:, None] & (k_even + 1 < K)[None, :], other=0.0
            )
            prod = w_even[None, :, :] * x_even.to(tl.float32)[:, None, :]
            prod += w_odd[None, :, :] * x_odd.to(tl.float32)[:, None, :]
        else:
            w = decode(byte, n1, BITS, MIN_EXP)
            x_ptrs = x_ptr + rm[:, None] * stride_xm + cols[None, :] * stride_xk
            xk = tl.load(x_ptrs, mask=m_ok[:, None] & (cols < K)[None, :], other=0.0)
            prod = w[None, :, :] * xk.to(tl.float32)[:, None, :]
        acc += tl.sum(prod, axis=2)
    finish(acc, rm, rows, m_ok, row_ok, pid_k, n1_ptr, bias_ptr, out_ptr, part_ptr, M, N, False,
           HAS_BIAS, SPLIT_K)  # fmt: skip


@triton.jit
def _gemm_kernel(
    x_ptr, codes_ptr, n1_ptr, n1, bias_ptr, out_ptr, part_ptr,
    M, N, K, stride_xm, stride_xk, row_stride, tiles_per_split,
    BITS: tl.constexpr, WIDTH: tl.constexpr, MIN_EXP: tl.constexpr,
    PER_ROW_N1: tl.constexpr, HAS_BIAS: tl.constexpr, UPCAST: tl.constexpr, IEEE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr,
    GROUP_M: tl.constexpr,
):  # fmt: skip
    rm, rn = grouped_tile(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    pid_k = tl.program_id(1)
    m_ok = rm < M
    n_ok = rn < N
    if PER_ROW_N1:
        n1 = tl.load(n1_ptr + rn, mask=n_ok, other=0)[:, None]
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    first = pid_k * tiles_per_split
    for t in range(first, tl.minimum(first + tiles_per_split, tl.cdiv(K, BLOCK_K))):
        rk = t * BLOCK_K + tl.arange(0, BLOCK_K)
        x_ptrs = x_ptr + rm[:, None] * stride_xm + rk[None, :] * stride_xk
        xt = tl.load(x_ptrs, mask=m_ok[:, None] & (rk < K)[None, :], other=0.0)
        codes = load_codes(codes_ptr, rn, rk, row_stride, K, n_ok, WIDTH)
        w = decode(codes, n1, BITS, MIN_EXP)  # fp32, exact in the input dtype
        if not UPCAST:
            w = w.to(x_ptr.dtype.element_ty, fp_downcast_rounding="rtne")  # exact: no rounding
        acc = dot(xt, tl.trans(w), acc, UPCAST, IEEE)
    finish(acc, rm, rn, m_ok, n_ok, pid_k, n1_ptr, bias_ptr, out_ptr, part_ptr, M, N, False,
           HAS_BIAS, SPLIT_K)  # fmt: skip


def linear_config(
    rows: int,
    out_features: int,
    in_features: int,
    bits: int,
    sms: int,
    fp32: bool = False,
    split_k: int | None = None,
) -> LinearConfig:
    """The kernel and tiles for a ``[rows, in_features] x [out_features, in_features]`` product.

    ``fp32`` activations multiply on CUDA cores (IEEE fp32, no TF32), in smaller tiles: the
    sizes are those the sm_90 static check passes without spills. ``split_k`` (default: enough
    splits for about two programs per SM, at most 16) is clamped so that every split gets at
    least one K tile.

    Example:
        >>> linear_config(1, 4096, 4096, bits=4, sms=132)
        LinearConfig(kernel='gemv', block_m=1, block_n=16, block_k=256, split_k=2, num_warps=4, num_stages=2)
    """  # noqa: E501
    if rows <= GEMV_MAX_ROWS:
        block_m = triton.next_power_of_2(rows)
        block_k = 256 if bits <= 4 else 128 if block_m < 4 else 64  # 4x128 bytes spill per row n1
        block_n, warps, stages, kernel = 16, 4, 2, "gemv"
    elif rows <= SKINNY_MAX_ROWS:
        block_m = max(16, triton.next_power_of_2(rows))
        block_n, block_k, warps, stages, kernel = 64, 128, 8, 3, "gemm"
        if fp32:
            block_k, warps, stages = 16, 8 if block_m == 64 else 4, 2  # K 32 spills (3.6, 3.8)
    elif fp32:
        block_m, block_n, block_k, warps, stages, kernel = 128, 64, 16, 8, 2, "gemm"
    else:
        block_m, block_n, block_k, warps, stages, kernel = 128, 128, 64, 8, 3, "gemm"
    k_tiles = triton.cdiv(in_features, block_k)
    if split_k is None:
        tiles = triton.cdiv(rows, block_m) * triton.cdiv(out_features, block_n)
        split_k = min(_MAX_SPLIT, triton.cdiv(2 * sms, tiles)) if rows <= SKINNY_MAX_ROWS else 1
    split_k = max(1, min(split_k, k_tiles))
    split_k = triton.cdiv(k_tiles, triton.cdiv(k_tiles, split_k))  # no empty split
    return LinearConfig(kernel, block_m, block_n, block_k, split_k, warps, stages)


def shift_linear(
    x: Tensor,
    packed: Tensor,
    bits: int,
    n1: int | Tensor,
    in_features: int,
    bias: Tensor | None,
    split_k: int | None = None,
    out: Tensor | None = None,
    n1_rows: Tensor | None = None,
) -> Tensor:
    """``inq::shift_linear`` on Triton kernels (CUDA tensors, or CPU under the interpreter).

    ``n1`` may be an int32 tensor ``[O]`` (one exponent per output row), or an int with
    ``n1_rows`` ``[O]`` added per row; ``split_k`` overrides the heuristic (tests use it to reach
    every path); ``out``, a contiguous ``[rows, O]`` tensor of ``x``'s dtype, receives the
    result. The weight is re-laid out for the kernels once and cached with ``packed``
    (:func:`inq.kernels.layout.cached_kernel_weight`); the few weights that layout cannot hold
    exactly run on the generic kernels of this module, which decode the packed codes.

    Example:
        >>> import os
        >>> from inq.codes import pack_codes
        >>> codes = torch.tensor([[8, 13], [0, 9]], dtype=torch.uint8)  # 4 bits: [[2, -1], [0, 1]]
        >>> x = torch.tensor([[1.0, 3.0]])
        >>> run = shift_linear if os.environ.get("TRITON_INTERPRET") == "1" else (
        ...     torch.ops.inq.shift_linear)
        >>> run(x, pack_codes(codes, 4), 4, 1, 2, None)
        tensor([[-1.,  3.]])

    Raises:
        ValueError: on a dtype other than fp32/fp16/bf16, or arguments that do not fit.
    """
    if x.dtype not in FLOAT_DTYPES:
        raise ValueError(f"shift_linear kernels take fp32, fp16 or bf16 input, got {x.dtype}")
    if x.shape[-1] != in_features:
        raise ValueError(f"shift_linear: x has {x.shape[-1]} features, the weight {in_features}")
    per_row = n1 if isinstance(n1, Tensor) else n1_rows
    check_devices("shift_linear", x, packed, bias, per_row)
    rows = x.reshape(math.prod(x.shape[:-1]), in_features)
    m, o = rows.shape[0], packed.shape[0]
    check_operands("shift_linear", packed, bits, o, in_features, bias, x.numel(), m * o * 16)
    check_n1_rows(per_row, o)
    b = None if bias is None else bias.to(x.dtype).contiguous()
    out = output_tensor(out, (m, o), x.dtype, x.device)
    if not (m and o):
        return out.reshape(*x.shape[:-1], o)
    if in_features == 0:
        check_n1(effective_n1(n1, n1_rows), o, x.dtype)
        out.zero_()
        if b is not None:
            out += b
        return out.reshape(*x.shape[:-1], o)
    layout = cached_kernel_weight(packed, bits, n1, in_features, x.dtype, n1_rows)
    if layout is not None:
        swar_linear(rows.contiguous(), layout, b, out, sms=sm_count(x.device), split_k=split_k)
    else:
        n1_ptr, n1_value, per = n1_args(effective_n1(n1, n1_rows), o, x.dtype, x.device)
        _launch(rows, packed.contiguous(), bits, n1_ptr, n1_value, per, b, out, split_k)
    return out.reshape(*x.shape[:-1], o)


def _launch(
    x: Tensor,
    packed: Tensor,
    bits: int,
    n1_ptr: Tensor,
    n1: int,
    per_row: bool,
    bias: Tensor | None,
    out: Tensor,
    split_k: int | None,
) -> None:
    m, k = x.shape
    o = out.shape[1]
    cfg = linear_config(m, o, k, bits, sm_count(x.device), x.dtype == torch.float32, split_k)
    part = out if cfg.split_k == 1 else x.new_empty((cfg.split_k, m, o), dtype=torch.float32)
    b = out if bias is None else bias  # any pointer: unused without HAS_BIAS
    width = code_width(bits)
    min_exp, has_bias = MIN_EXP[x.dtype], bias is not None
    if cfg.kernel == "gemv":
        block_bytes = cfg.block_k * width // 8
        kb = packed.shape[1]
        bytes_per_split = triton.cdiv(triton.cdiv(kb, block_bytes), cfg.split_k) * block_bytes
        _gemv_kernel[(triton.cdiv(o, cfg.block_n), cfg.split_k)](
            x, packed, n1_ptr, n1, b, out, part,
            m, o, k, kb, x.stride(0), x.stride(1), packed.stride(0), bytes_per_split,
            BITS=bits, WIDTH=width, MIN_EXP=min_exp, PER_ROW_N1=per_row, HAS_BIAS=has_bias,
            BLOCK_M=cfg.block_m, BLOCK_O=cfg.block_n, BLOCK_B=block_bytes, SPLIT_K=cfg.split_k,
            num_warps=cfg.num_warps, num_stages=cfg.num_stages,
        )  # fmt: skip
    else:
        tiles_per_split = triton.cdiv(triton.cdiv(k, cfg.block_k), cfg.split_k)
        grid = (triton.cdiv(m, cfg.block_m) * triton.cdiv(o, cfg.block_n), cfg.split_k)
        _gemm_kernel[grid](
            x, packed, n1_ptr, n1, b, out, part,
            m, o, k, x.stride(0), x.stride(1), packed.stride(0), tiles_per_split,
            BITS=bits, WIDTH=width, MIN_EXP=min_exp, PER_ROW_N1=per_row, HAS_BIAS=has_bias,
            UPCAST=dot_upcast(x.dtype), IEEE=x.dtype == torch.float32,
            BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, SPLIT_K=cfg.split_k,
            GROUP_M=8,
            num_warps=cfg.num_warps, num_stages=cfg.num_stages,
        )  # fmt: skip
    if cfg.split_k > 1:
        reduce_partials(part, None, bias, out)
