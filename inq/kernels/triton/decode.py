"""Decoding power-of-two codes inside Triton kernels, and what every launcher shares.

A ``bits``-bit code is 0 (the zero level) or ``1 s o`` in binary: top bit set, sign bit ``s``,
then the offset ``o`` in ``bits - 2`` bits; its value is ``(-1)**s * 2**(n1 - o)``. The kernels
build that float's bit pattern from the sign and the exponent ``e = n1 - o`` (no table, no
``exp2``): a normal fp32 for ``e >= -126``, a subnormal one down to the smallest power of two
the activation dtype holds (``MIN_EXP``), zero below it. That is exactly what
:func:`inq.pow2.decode_unchecked` gives after its rounding to the dtype (fp16 keeps ``2**-24``
and flushes ``2**-25`` to zero, bf16 keeps ``2**-133``, fp32 ``2**-149``), so the value is
representable in the dtype and converting it there is exact, on a GPU and under the
interpreter.

Results are rounded once to fp16/bf16 by :func:`downcast`: to nearest even, as the GPU's
``cvt.rn`` does. Triton's interpreter (3.9) truncates fp32 to bf16 whatever
``fp_downcast_rounding`` asks for (and mishandles bf16 subnormals), so there :func:`downcast`
rounds bf16 in integer arithmetic instead; fp16 it already rounds to nearest even (numpy).

``n1`` is one scalar per layer or, with ``PER_ROW_N1``, one int32 per output row (a level set per
output channel): one load per row tile either way.

Example (CPU tensors need ``TRITON_INTERPRET=1`` before triton is imported):
    >>> import os, torch
    >>> from inq.kernels.triton import decode_weight
    >>> packed = torch.tensor([[0x8C]], dtype=torch.uint8)  # 4-bit codes 12, 8: -2**n1, 2**n1
    >>> if os.environ.get("TRITON_INTERPRET") == "1":
    ...     print(decode_weight(packed, 4, -1, (1, 2), torch.float32))
    ... else:
    ...     print(torch.tensor([[-0.5, 0.5]]))
    tensor([[-0.5000,  0.5000]])
"""

from __future__ import annotations

import math
import os

import torch
import triton
import triton.language as tl
from torch import Tensor

from inq.codes import code_width, row_bytes
from inq.kernels.layout import MIN_EXP
from inq.pow2 import check_bits, check_top_level

__all__ = [
    "FLOAT_DTYPES",
    "MIN_EXP",
    "check_devices",
    "check_n1",
    "check_n1_rows",
    "check_operands",
    "decode",
    "decode_weight",
    "dot",
    "dot_upcast",
    "downcast",
    "finish",
    "grouped_tile",
    "interpreting",
    "load_codes",
    "n1_args",
    "output_tensor",
    "pow2",
    "reduce_kernel",
    "reduce_partials",
    "sm_count",
]

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_LOWEST_N1 = -300
_NOMINAL_SMS = 132  # an H100 SXM: split-K heuristics under the interpreter (no device to ask)
# read when the kernels are defined, as Triton reads TRITON_INTERPRET to choose the interpreter
_INTERPRETED = tl.constexpr(os.environ.get("TRITON_INTERPRET", "0") == "1")


@triton.jit
def decode(codes, n1, BITS: tl.constexpr, MIN_EXP: tl.constexpr):
    """The fp32 value of int32 ``codes`` (see the module docstring); ``n1`` broadcasts."""
    e = n1 - (codes & ((1 << (BITS - 2)) - 1))
    normal = (e + 127) << 23
    subnormal = 1 << tl.minimum(tl.maximum(e + 149, 0), 22)  # clamped: shifts >= 32 are UB
    magnitude = tl.where(e >= MIN_EXP, tl.where(e >= -126, normal, subnormal), 0)
    magnitude = tl.where(codes != 0, magnitude, 0)
    sign = (codes >> (BITS - 2)) & 1
    return (magnitude | (sign << 31)).to(tl.float32, bitcast=True)


@triton.jit
def load_codes(codes_ptr, rows, ks, row_stride, K, row_ok, WIDTH: tl.constexpr):
    """int32 codes ``[len(rows), len(ks)]`` of packed rows; 0 (value 0.0) outside the weight."""
    mask = row_ok[:, None] & (ks < K)[None, :]
    byte = tl.load(codes_ptr + rows[:, None] * row_stride + (ks * WIDTH // 8)[None, :], mask=mask)
    byte = tl.where(mask, byte.to(tl.int32), 0)
    if WIDTH == 4:
        return (byte >> ((ks & 1) * 4)[None, :]) & 15
    return byte


@triton.jit
def _decode_kernel(
    codes_ptr, n1_ptr, n1, out_ptr, ROWS, K, row_stride,
    BITS: tl.constexpr, WIDTH: tl.constexpr, MIN_EXP: tl.constexpr, PER_ROW_N1: tl.constexpr,
    BLOCK_O: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    rows = tl.program_id(0) * BLOCK_O + tl.arange(0, BLOCK_O)
    ks = tl.program_id(1) * BLOCK_K + tl.arange(0, BLOCK_K)
    row_ok = rows < ROWS
    if PER_ROW_N1:
        n1 = tl.load(n1_ptr + rows, mask=row_ok, other=0)[:, None]
    codes = load_codes(codes_ptr, rows, ks, row_stride, K, row_ok, WIDTH)
    value = decode(codes, n1, BITS, MIN_EXP)
    if out_ptr.dtype.element_ty == tl.bfloat16:
        # the top half of the fp32 bits, exact: the interpreter's conversion flushes subnormals
        value = (value.to(tl.int32, bitcast=True) >> 16).to(tl.int16).to(tl.bfloat16, bitcast=True)
    mask = row_ok[:, None] & (ks < K)[None, :]
    value = value.to(out_ptr.dtype.element_ty, fp_downcast_rounding="rtne")  # exact: no rounding
    tl.store(out_ptr + rows[:, None] * K + ks[None, :], value, mask)


@triton.jit
def downcast(x, dtype: tl.constexpr):
    """fp32 ``x`` in ``dtype``, rounded to nearest even (ties to even, subnormals kept, overflow
    to inf) on the GPU and under the interpreter alike (see the module docstring)."""
    if dtype == tl.bfloat16 and _INTERPRETED:
        # the top half of the fp32 bits after adding just under half a bf16 ulp, plus one where
        # the kept half is odd: a tie then carries up to the even neighbour; NaN stays NaN
        bits = x.to(tl.int32, bitcast=True)
        bits = tl.where(x == x, bits + (0x7FFF + ((bits >> 16) & 1)), 0x7FC00000)
        return (bits >> 16).to(tl.int16).to(tl.bfloat16, bitcast=True)
    return x.to(dtype, fp_downcast_rounding="rtne")


@triton.jit
def pow2(e):
    """``2**e`` for int32 ``e`` in [-126, 127], built from its exponent bits (exact)."""
    return ((e + 127) << 23).to(tl.float32, bitcast=True)


@triton.jit
def grouped_tile(pid, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """The rows ``[BLOCK_M]`` and columns ``[BLOCK_N]`` of a flat program id's output tile,
    ``GROUP_M`` row tiles at a time (L2 reuse); one grid axis, so no dimension is limited to
    65535 tiles."""
    tiles_m = tl.cdiv(M, BLOCK_M)
    tiles_n = tl.cdiv(N, BLOCK_N)
    group = pid // (GROUP_M * tiles_n)
    first_m = group * GROUP_M
    size = tl.minimum(tiles_m - first_m, GROUP_M)
    pid_m = first_m + (pid % (GROUP_M * tiles_n)) % size
    pid_n = (pid % (GROUP_M * tiles_n)) // size
    return pid_m * BLOCK_M + tl.arange(0, BLOCK_M), pid_n * BLOCK_N + tl.arange(0, BLOCK_N)


@triton.jit
def finish(acc, rm, rn, m_ok, n_ok, pid_k, scale_ptr, bias_ptr, out_ptr, part_ptr, M, N,
           HAS_SCALE: tl.constexpr, HAS_BIAS: tl.constexpr, SPLIT_K: tl.constexpr):  # fmt: skip
    """Store an fp32 ``[rows of x, outputs]`` tile: the output (times ``2**scale[output]`` with
    ``HAS_SCALE``, bias added, rounded once) or, when K is split, this split's partial sums
    (``part[pid_k, M, N]``, unscaled)."""
    mask = m_ok[:, None] & n_ok[None, :]
    offsets = rm[:, None] * N + rn[None, :]
    if SPLIT_K == 1:
        if HAS_SCALE:
            acc = acc * pow2(tl.load(scale_ptr + rn, mask=n_ok, other=0))[None, :]
        if HAS_BIAS:
            acc += tl.load(bias_ptr + rn, mask=n_ok, other=0.0).to(tl.float32)[None, :]
        tl.store(out_ptr + offsets, downcast(acc, out_ptr.dtype.element_ty), mask)
    else:
        tl.store(part_ptr + pid_k * M * N + offsets, acc, mask)


@triton.jit
def reduce_kernel(part_ptr, scale_ptr, bias_ptr, out_ptr, total, N, INNER,
                  SPLIT_K: tl.constexpr, HAS_SCALE: tl.constexpr, HAS_BIAS: tl.constexpr,
                  BLOCK: tl.constexpr):  # fmt: skip
    """``out = (sum over splits, in order) * 2**scale[channel] + bias[channel]`` on a flat
    range of ``total`` elements, one rounding; the channel of element ``i`` is
    ``(i // INNER) % N`` (``[M, N]``: ``INNER = 1``; NCHW: ``INNER = H * W``)."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < total
    acc = tl.load(part_ptr + offs, mask=ok, other=0.0)
    for s in tl.static_range(1, SPLIT_K):
        acc += tl.load(part_ptr + s * total + offs, mask=ok, other=0.0)
    channel = (offs // INNER) % N
    if HAS_SCALE:
        acc = acc * pow2(tl.load(scale_ptr + channel, mask=ok, other=0))
    if HAS_BIAS:
        acc += tl.load(bias_ptr + channel, mask=ok, other=0.0).to(tl.float32)
    tl.store(out_ptr + offs, downcast(acc, out_ptr.dtype.element_ty), ok)


def reduce_partials(
    part: Tensor, scale: Tensor | None, bias: Tensor | None, out: Tensor, channel_dim: int = -1
) -> None:
    """``out = part.sum(0) * 2**scale[channel] + bias[channel]`` in split order, one rounding
    (``scale`` and ``bias`` optional); channels along ``channel_dim`` of the contiguous
    ``out`` (the last, or 1 of an NCHW result)."""
    total, block = out.numel(), 1024
    inner = math.prod(out.shape[channel_dim:][1:])
    reduce_kernel[(triton.cdiv(total, block),)](
        part, out if scale is None else scale, out if bias is None else bias, out, total,
        out.shape[channel_dim], max(inner, 1),
        SPLIT_K=part.shape[0], HAS_SCALE=scale is not None, HAS_BIAS=bias is not None,
        BLOCK=block,
    )  # fmt: skip


@triton.jit
def dot(a, b, acc, UPCAST: tl.constexpr, IEEE: tl.constexpr):
    """``acc + a @ b`` in fp32: IEEE fp32 products for fp32 operands (no TF32)."""
    if UPCAST:
        a = a.to(tl.float32)
    if IEEE:
        return tl.dot(a, b, acc, input_precision="ieee")
    return tl.dot(a, b, acc)


def decode_weight(
    packed: torch.Tensor,
    bits: int,
    n1: int | torch.Tensor,
    shape: tuple[int, ...],
    dtype: torch.dtype,
    out_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """The weight that packed codes stand for, decoded by the kernels' own :func:`decode`.

    Bit for bit :func:`inq.codes.decode_weight` (the tests check every code, bit-width,
    dtype and an ``n1`` range through the subnormal and flush edges); ``n1`` may be an int32
    tensor with one exponent per output row. The levels are those of ``dtype``; ``out_dtype``
    (default ``dtype``) stores them, fp32 showing the values the kernels multiply with. Not an
    inference path: the ops never write a dense weight.
    """
    o, k = shape[0], math.prod(shape[1:])
    out = torch.empty((o, k), dtype=out_dtype or dtype, device=packed.device)
    if out.numel():
        n1_ptr, n1_value, per_row = n1_args(n1, o, dtype, packed.device)
        block_o, block_k = 16, 128
        grid = (triton.cdiv(o, block_o), triton.cdiv(k, block_k))
        _decode_kernel[grid](
            packed, n1_ptr, n1_value, out, o, k, packed.stride(0),
            BITS=check_bits(bits), WIDTH=code_width(bits), MIN_EXP=MIN_EXP[dtype],
            PER_ROW_N1=per_row, BLOCK_O=block_o, BLOCK_K=block_k,
        )  # fmt: skip
    return out.view(shape)


def check_n1(n1: int | torch.Tensor, rows: int, dtype: torch.dtype) -> None:
    """Raise ``ValueError`` unless ``n1`` is an int, or an integer tensor ``[rows]``, whose top
    level ``2**n1`` fits ``dtype``."""
    check_n1_rows(n1 if isinstance(n1, torch.Tensor) else None, rows)
    if isinstance(n1, torch.Tensor):
        if n1.numel():
            check_top_level(int(n1.max()), dtype)
    else:
        check_top_level(int(n1), dtype)


def check_n1_rows(n1: torch.Tensor | None, rows: int) -> None:
    """Raise ``ValueError`` unless ``n1`` is None or an integer tensor ``[rows]`` (no device
    sync: the values are checked where they are read)."""
    if n1 is not None and (n1.dtype not in (torch.int32, torch.int64) or n1.shape != (rows,)):
        raise ValueError(
            f"a per-row n1 must be an integer tensor [{rows}], got {n1.dtype} {list(n1.shape)}"
        )


def n1_args(
    n1: int | torch.Tensor, rows: int, dtype: torch.dtype, device: torch.device
) -> tuple[torch.Tensor, int, bool]:
    """Kernel arguments for ``n1``: (int32 per-row tensor or a dummy, scalar, per-row flag)."""
    check_n1(n1, rows, dtype)
    # below -300 every level decodes to 0 anyway: clamping keeps n1 - offset inside int32
    if isinstance(n1, torch.Tensor):
        return n1.clamp(min=_LOWEST_N1).to(device=device, dtype=torch.int32).contiguous(), 0, True
    return torch.empty(1, dtype=torch.int32, device=device), max(int(n1), _LOWEST_N1), False


def output_tensor(
    out: Tensor | None,
    shape: tuple[int, ...],
    dtype: torch.dtype,
    device: torch.device,
    memory_format: torch.memory_format = torch.contiguous_format,
) -> Tensor:
    """``out`` checked to be a tensor of ``shape`` and ``dtype``, contiguous in
    ``memory_format``, or a new one."""
    if out is None:
        return torch.empty(shape, dtype=dtype, device=device, memory_format=memory_format)
    dense = out.is_contiguous(memory_format=memory_format)
    if out.shape != shape or out.dtype != dtype or not dense:
        layout = "channels_last" if memory_format == torch.channels_last else "contiguous"
        raise ValueError(
            f"out must be a {layout} {dtype} tensor of shape {list(shape)}, got "
            f"{out.dtype} {list(out.shape)}"
        )
    return out


def check_devices(op: str, x: Tensor, *others: Tensor | None) -> None:
    """Raise ``ValueError`` unless every tensor given lies on ``x``'s device (a kernel would
    read another device's pointer as its own)."""
    for t in others:
        if t is not None and t.device != x.device:
            raise ValueError(f"{op}: tensors on {x.device} and {t.device}; move them to one device")


def check_operands(
    op: str, packed: Tensor, bits: int, rows: int, k: int, bias: Tensor | None, *sizes: int
) -> None:
    """Raise ``ValueError`` unless ``packed`` is ``uint8 [rows, row_bytes(k, bits)]``, ``bias``
    (if any) has ``rows`` entries and every element count in ``sizes`` fits the kernels'
    int32 offsets (below ``2**31``)."""
    expected = (rows, row_bytes(k, bits))
    if packed.dtype != torch.uint8 or tuple(packed.shape) != expected:
        raise ValueError(
            f"{op}: packed codes must be uint8 {list(expected)} for {rows}x{k} {bits}-bit codes, "
            f"got {packed.dtype} {list(packed.shape)}"
        )
    if bias is not None and bias.numel() != rows:
        raise ValueError(f"{op}: bias has {bias.numel()} entries, the weight {rows} rows")
    if max((packed.numel(), *sizes), default=0) >= 1 << 31:
        raise ValueError(f"{op}: tensors of 2**31 elements or more are beyond int32 offsets")


def interpreting() -> bool:
    """Whether the kernels run under the Triton interpreter (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def dot_upcast(dtype: torch.dtype) -> bool:
    """Whether ``tl.dot`` operands are upcast to fp32 first: only bf16 under the interpreter,
    whose ``tl.dot`` multiplies bf16 as raw 16-bit integers. The products are exact either way
    (every weight is a power of two), so this changes no result."""
    return dtype == torch.bfloat16 and interpreting()


def sm_count(device: torch.device) -> int:
    """Streaming multiprocessors of ``device`` (a nominal H100 where there is no GPU)."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return _NOMINAL_SMS
