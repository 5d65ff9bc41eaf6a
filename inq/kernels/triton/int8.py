"""``inq::shift_linear_int8`` in Triton: int8 activations, true int32 shifts and adds.

Every term is ``((-x if s else x) << frac) >> o`` (an arithmetic shift; code 0 adds 0), summed
in int32, exactly the definition in :mod:`inq.kernels.int8`. Offsets reach 63 at 8 bits; a shift
by 31 already gives what any larger one would (0 or -1, since ``|x << frac| < 2**31``), so the
shift is clamped there and stays defined on every machine. Integer addition is associative and
the op refuses any ``frac`` that could overflow, so the result is the reference's bit for bit
whatever the tiling.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl
from torch import Tensor

from inq.kernels.int8 import check_int8_args
from inq.kernels.triton.decode import check_devices, check_operands, load_codes, output_tensor
from inq.packed import code_width

__all__ = ["shift_linear_int8"]

BLOCK_M, BLOCK_O, BLOCK_K = 4, 32, 64


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
        negative = ((codes >> (BITS - 2)) & 1) != 0
        shift = tl.minimum(codes & ((1 << (BITS - 2)) - 1), 31)
        signed = tl.where(negative[None, :, :], -v[:, None, :], v[:, None, :])  # [M, N, K]
        terms = tl.where(codes[None, :, :] != 0, signed >> shift[None, :, :], 0)
        acc += tl.sum(terms, axis=2)
    tl.store(out_ptr + rm[:, None] * N + ro[None, :], acc, m_ok[:, None] & o_ok[None, :])


def shift_linear_int8(
    x: Tensor,
    packed: Tensor,
    bits: int,
    in_features: int,
    frac_bits: int,
    out: Tensor | None = None,
) -> Tensor:
    """``inq::shift_linear_int8`` on a Triton kernel (CUDA, or CPU under the interpreter);
    ``out``, a contiguous int32 ``[rows, O]`` tensor, receives the result if given.

    Raises:
        ValueError: as :func:`inq.kernels.int8.check_int8_args`.
    """
    check_int8_args(x, bits, in_features, frac_bits)
    check_devices("shift_linear_int8", x, packed)
    rows = x.reshape(math.prod(x.shape[:-1]), in_features)
    m, o = rows.shape[0], packed.shape[0]
    check_operands("shift_linear_int8", packed, bits, o, in_features, None, x.numel(), m * o)
    out = output_tensor(out, (m, o), torch.int32, x.device)
    if m and o and not in_features:
        out.zero_()
    elif m and o:
        grid = (triton.cdiv(m, BLOCK_M) * triton.cdiv(o, BLOCK_O),)
        _int8_kernel[grid](
            rows, packed.contiguous(), out, m, o, in_features, frac_bits,
            rows.stride(0), rows.stride(1), packed.stride(0),
            bits, code_width(bits), BLOCK_M, BLOCK_O, BLOCK_K,
        )  # fmt: skip
    return out.reshape(*x.shape[:-1], o)
