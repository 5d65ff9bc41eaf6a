"""The Triton kernels (:mod:`inq.kernels.triton`) against the references.

Without a GPU they run under the Triton interpreter on CPU tensors (``tests/conftest.py`` sets
``TRITON_INTERPRET=1``); with one, on the GPU. Shapes stay near one tile: the interpreter runs
programs one after another, some 10 ms per program-iteration.

Decoding is checked bit for bit. Float results are compared with the exact (float64) product
``ref`` of the same decoded weights (decoded in the activation dtype, so flushed exactly as the
reference flushes them). Products ``x * 2**e`` are exact in fp32, so a kernel makes two errors:

- fp32 summation: its fp32 result ``a`` has ``|a - ref| <= E``, with
  ``E = 2 * (K + S + 2) * 2**-24 * (|x| @ |W|.T)`` (K terms added in any order, S split-K
  partial sums, the bias: at most ``(K + S + 2) * 2**-24 * sum|x||w|``; 2x that as margin);
- one rounding of ``a`` to the output dtype, to nearest even (:func:`downcast`, on the GPU and
  under the interpreter alike): at most half an ulp, ``u * |a|`` with the dtype's unit roundoff
  ``u`` (2**-8 bf16, 2**-11 fp16, 2**-24 fp32), or half a subnormal step ``h`` below the
  normal range (2**-134, 2**-25, 2**-150). With ``|a| <= |ref| + E``:

    |y - ref| <= E + u * (|ref| + E) + h

A conversion that truncates (moves up to a whole ulp, ``2u``) breaks that bound. Where every
sum is exact (small integers times powers of two), every path must give the reference bit for
bit, and where the exact sum is not representable in the output dtype, torch's rounding of it
(to nearest, ties to even) bit for bit. The int8/uint8 ops are bit-exact by definition.
"""

from __future__ import annotations

import ast
import math
import zlib
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from helpers import CPU_ROUTE, random_codes, residual_net, route_on_cpu

import inq.kernels  # registers torch.ops.inq.* and their CUDA implementations
from inq.codes import decode_weight, pack_codes
from inq.kernels import int8, ops
from inq.kernels import triton as tk
from inq.kernels.int8 import (
    exact_frac_bits,
    max_frac_bits,
    shift_conv2d_int8_reference,
    shift_linear_int8_reference,
)
from inq.kernels.layout import cached_kernel_weight, kernel_weight
from inq.kernels.triton import decode as tdecode
from inq.kernels.triton import swar
from inq.kernels.triton.linear import GEMV_MAX_ROWS, SKINNY_MAX_ROWS, linear_config
from inq.quant.integer import residual_fusions

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
# unit roundoff u (half an ulp relative to the value) and half the subnormal step h of each dtype
_ROUNDING = {torch.float32: 2.0**-24, torch.float16: 2.0**-11, torch.bfloat16: 2.0**-8}
_HALF_STEP = {torch.float32: 2.0**-150, torch.float16: 2.0**-25, torch.bfloat16: 2.0**-134}
_BITS_VIEW = {torch.float32: torch.int32, torch.float16: torch.int16, torch.bfloat16: torch.int16}


def assert_close_fp32_sum(y, x, w, ref, k: int, splits: int, abs_op) -> None:
    """``y`` within the bound of the module docstring (fp32 summation, then one rounding to
    nearest); ``abs_op(|x|, |w|)`` in float64."""
    assert y.dtype == x.dtype and y.shape == ref.shape
    fp32 = 2 * (k + splits + 2) * 2.0**-24 * abs_op(x.double().abs(), w.abs())  # E
    bound = fp32 + _ROUNDING[y.dtype] * (ref.abs() + fp32) + _HALF_STEP[y.dtype]
    err = (y.double().cpu() - ref).abs()
    worst = (err / bound).max().item() if err.numel() else 0.0
    assert worst <= 1.0, (
        f"error {worst:.3g} x the bound (fp32 summation + one rounding to nearest {y.dtype})"
    )


def guarded(shape: tuple[int, ...], dtype: torch.dtype, guard: int = 64,
            channels_last: bool = False):  # fmt: skip
    """(out, check): ``out`` is a contiguous (or, 4-d, channels_last) view in the middle of a
    sentinel-filled buffer, ``check()`` asserts the kernel wrote nothing around it (the
    interpreter does not fault on an out-of-bounds store)."""
    n = math.prod(shape)
    buf = torch.full((n + 2 * guard,), 77, dtype=dtype, device=DEVICE)
    sentinel = buf[:guard].clone()

    def check() -> None:
        assert torch.equal(buf[:guard], sentinel) and torch.equal(buf[guard + n :], sentinel)

    inner = buf[guard : guard + n]
    if channels_last:
        nb, c, h, w = shape
        return inner.view(nb, h, w, c).permute(0, 3, 1, 2), check
    return inner.view(shape), check


# ---------------------------------------------------------------------------------- decode


@pytest.mark.parametrize("bits", range(2, 9))
@pytest.mark.parametrize("dtype", DTYPES)
def test_decode_is_bit_exact_for_every_code_and_edge(bits: int, dtype: torch.dtype) -> None:
    """Every code, n1 through the subnormal range and the flush edge of each dtype (fp16
    2**-14 .. 2**-25, bf16/fp32 2**-126 .. 2**-134 / 2**-150), and the top of the range: all
    n1 in one launch (one per row), and the scalar n1 at the bottom, a flush edge and the top."""
    top = 1 << (bits - 1)
    codes = torch.cat([torch.zeros(1, dtype=torch.int64), torch.arange(top, 2 * top)])
    codes = codes.to(torch.uint8)
    depth = (1 << (bits - 2)) - 1  # n1 - depth is the smallest level
    top_n1 = int(math.log2(torch.finfo(dtype).max))
    edges = {-14, -24, -25, -126, -133, -134, -149, -150}
    n1s = [n for n in sorted({e + d for e in edges for d in (0, 1, depth)} | {0, top_n1, -200})
           if n <= top_n1]  # fmt: skip
    rows = codes.repeat(2 * len(n1s), 1)  # each n1 on two rows
    packed = pack_codes(rows, bits)
    n1 = torch.tensor(n1s, dtype=torch.int32).repeat_interleave(2)
    expected = torch.cat(
        [
            decode_weight(packed[r : r + 1], bits, int(n1[r]), (1, len(codes)), dtype)
            for r in range(len(rows))
        ]
    )
    launches = [(n1, packed, expected)] + [
        (n, packed[2 * i : 2 * i + 2], expected[2 * i : 2 * i + 2])
        for i, n in enumerate(n1s)
        if n in (n1s[0], -134 + depth, top_n1)
    ]
    # fp32: the values before any conversion (one launch where dtype is fp32 already)
    for out_dtype in dict.fromkeys((dtype, torch.float32)):
        view = _BITS_VIEW[out_dtype]
        for n, words, want in launches:
            got = tk.decode_weight(words.to(DEVICE), bits, n, tuple(want.shape), dtype, out_dtype)
            assert torch.equal(got.cpu().view(view), want.to(out_dtype).view(view)), (
                f"n1={n if isinstance(n, int) else 'per row'} {out_dtype}"
            )


@pytest.mark.parametrize("bits", [3, 6])
def test_decode_per_row_n1(bits: int) -> None:
    codes = random_codes(5, 9, bits, seed=bits)
    packed = pack_codes(codes, bits)
    n1 = torch.tensor([-3, 0, 2, -20, 7], dtype=torch.int32)
    got = tk.decode_weight(packed.to(DEVICE), bits, n1.to(DEVICE), (5, 9), torch.float16).cpu()
    for row in range(5):
        expected = decode_weight(packed[row : row + 1], bits, int(n1[row]), (1, 9), torch.float16)
        assert torch.equal(got[row : row + 1].view(torch.int16), expected.view(torch.int16))


@triton.jit
def _downcast_kernel(x_ptr, out_ptr, N, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < N
    x = tl.load(x_ptr + offs, mask=ok)
    tl.store(out_ptr + offs, tdecode.downcast(x, out_ptr.dtype.element_ty), ok)


def _fp32_patterns() -> torch.Tensor:
    """fp32 values by bit pattern: random ones; every low half around a bf16 tie (and an fp16
    tie) under random high halves, so every exponent, subnormals and both parities of the kept
    bits; the largest finite values (rounding to inf), inf, NaN, zeros."""
    gen = torch.Generator().manual_seed(0)
    randoms = torch.randint(-(2**31), 2**31, (20_000,), generator=gen)
    high = torch.randint(0, 1 << 16, (2048,), generator=gen) << 16
    lows = torch.tensor([0, 1, 0x0FFF, 0x1000, 0x1001, 0x7FFF, 0x8000, 0x8001, 0xFFFF])
    special = torch.tensor([0x7F7FFFFF, 0x7F7F8000, 0x7F7F7FFF, 0x477FEFFF, 0x477FF000,
                            0x7F800000, 0x7FC00000, 0x7FFFFFFF, 0x7F800001, 0x00008000,
                            0x00018000, 0x007FFFFF, 0x007F8000, 0x00000001, 0])  # fmt: skip
    bits = torch.cat([randoms, (high[:, None] | lows).flatten(), special, special | (1 << 31)])
    return (bits - ((bits >= 2**31) << 32)).to(torch.int32).view(torch.float32)


@pytest.mark.filterwarnings("ignore:overflow encountered in cast")  # numpy's fp16: to inf
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_downcast_rounds_to_nearest_even(dtype) -> None:
    """The kernels' one rounding of fp32 results is torch's, bit for bit: to nearest, ties to
    even, subnormals kept, overflow to inf, NaN kept (any payload). Triton's interpreter
    converts fp32 to bf16 by truncation whatever rounding is asked for; this holds only because
    :func:`inq.kernels.triton.decode.downcast` rounds itself there."""
    x = _fp32_patterns()
    out = torch.empty(x.shape, dtype=dtype, device=DEVICE)
    _downcast_kernel[(triton.cdiv(x.numel(), 1024),)](x.to(DEVICE), out, x.numel(), 1024)
    got, want = out.cpu(), x.to(dtype)
    wrong = (got.view(torch.int16) != want.view(torch.int16)) & ~(got.isnan() & want.isnan())
    assert not wrong.any(), f"{int(wrong.sum())} of {x.numel()} values not rounded to nearest even"


def test_tensors_on_another_device_are_refused() -> None:
    """A kernel must not read a pointer of another device as its own (meta stands in for a
    second device here)."""
    packed = pack_codes(random_codes(2, 4, 4, seed=0), 4).to(DEVICE)
    x, x8 = torch.randn(1, 4, device=DEVICE), torch.ones(1, 4, dtype=torch.int8, device=DEVICE)
    elsewhere = torch.empty(2, 2, dtype=torch.uint8, device="meta")
    with pytest.raises(ValueError, match="move them to one device"):
        tk.shift_linear(x, elsewhere, 4, 0, 4, None)
    with pytest.raises(ValueError, match="move them to one device"):
        tk.shift_linear(x, packed, 4, 0, 4, torch.zeros(2, device="meta"))
    with pytest.raises(ValueError, match="move them to one device"):
        tk.shift_linear_int8(x8, elsewhere, 4, 4, 0)
    with pytest.raises(ValueError, match="move them to one device"):
        conv = torch.randn(1, 1, 3, 3, device=DEVICE)
        tk.shift_conv2d(conv, elsewhere, 4, 0, [2, 1, 1, 4], None, [1, 1], [0, 0], [1, 1], 1)


def test_bad_codes_bias_and_sizes_are_refused() -> None:
    """Short code rows or a short bias would be read out of bounds on a GPU; offsets past
    2**31 would wrap."""
    packed = pack_codes(random_codes(3, 8, 4, seed=0), 4).to(DEVICE)
    x = torch.randn(2, 8, device=DEVICE)
    with pytest.raises(ValueError, match=r"must be uint8 \[3, 4\]"):
        tk.shift_linear(x, packed[:, :3], 4, 0, 8, None)
    with pytest.raises(ValueError, match="bias has 1 entries"):
        tk.shift_linear(x, packed, 4, 0, 8, torch.zeros(1, device=DEVICE))
    with pytest.raises(ValueError, match="must be uint8"):
        tk.shift_conv2d(x.view(1, 2, 2, 4), packed, 4, 0, [3, 2, 1, 1], None, [1, 1], [0, 0],
                        [1, 1], 1)  # fmt: skip
    with pytest.raises(ValueError, match="must be uint8"):
        tk.shift_linear_int8(x.to(torch.int8), packed[:, :3], 4, 8, 0)
    huge = torch.empty(1 << 16, 1 << 15, dtype=torch.uint8, device="meta")
    with pytest.raises(ValueError, match="int32 offsets"):
        from inq.kernels.triton.decode import check_operands

        check_operands("op", huge, 4, 1 << 16, 1 << 16, None)


def test_very_low_n1_decodes_to_zero() -> None:
    """An n1 far below every dtype's range (int32 would wrap it) gives zero weights."""
    packed = pack_codes(random_codes(2, 4, 4, seed=0), 4).to(DEVICE)
    n1 = torch.tensor([-(2**40), -5000], dtype=torch.int64, device=DEVICE)
    assert torch.equal(tk.decode_weight(packed, 4, n1, (2, 4), torch.float32).cpu(),
                       torch.zeros(2, 4))  # fmt: skip
    x = torch.ones(1, 4, device=DEVICE)
    assert torch.equal(tk.shift_linear(x, packed, 4, -(2**40), 4, None).cpu(), torch.zeros(1, 2))


def test_n1_out_of_range_is_a_clear_error() -> None:
    packed = pack_codes(random_codes(2, 4, 4, seed=0), 4)
    x = torch.randn(1, 4, dtype=torch.float16, device=DEVICE)
    with pytest.raises(ValueError, match=r"overflows torch\.float16"):
        tk.shift_linear(x, packed.to(DEVICE), 4, 16, 4, None)
    with pytest.raises(ValueError, match="per-row n1"):
        n1 = torch.zeros(3, dtype=torch.int32, device=DEVICE)
        tk.shift_linear(x, packed.to(DEVICE), 4, n1, 4, None)


# ---------------------------------------------------------------------------------- linear

# (rows, out, in): rows on both sides of each path's limit (GEMV 4, skinny 64), sizes at the
# tiles +-1 (16/64/128 outputs, 128/256 codes per GEMV step, 128/64 per GEMM step), odd sizes
LINEAR_CASES = [
    (1, 16, 256),
    (1, 17, 255),
    (2, 15, 257),
    (3, 33, 100),
    (4, 7, 1),
    (5, 64, 128),
    (16, 65, 129),
    (17, 63, 127),
    (64, 20, 300),
    (65, 129, 64),
    (130, 40, 65),
]


def distinct_splits(x, packed, bits: int, n1: int, k: int, wanted: set[int]) -> list[int]:
    """The split-K values of ``wanted`` that launch distinct kernels, the smallest of each: a
    request is clamped (every split gets a K step) to the split the op's own config function
    gives it, on the kernel layout (:func:`swar.offered`) or the generic kernels
    (:func:`linear_config`); two requests clamped alike are the same launch, bit for bit."""
    layout = cached_kernel_weight(packed, bits, n1, k, x.dtype)
    sms = tdecode.sm_count(x.device)
    runs: dict[int, int] = {}
    for split in sorted(wanted):
        if layout is not None:
            runs.setdefault(swar.offered(x, layout, sms, split)[0][0].split_k, split)
        else:
            fp32 = x.dtype == torch.float32
            runs.setdefault(linear_config(x.shape[0], packed.shape[0], k, bits, sms, fp32,
                                          split).split_k, split)  # fmt: skip
    return sorted(runs.values())


def _dtype_id(dtype: torch.dtype) -> str:
    """The id pytest gives ``dtype`` in ``parametrize("dtype", DTYPES)``."""
    return f"dtype{DTYPES.index(dtype)}"


def covering(cases: list, dtypes: list, halves: tuple[tuple, tuple]) -> list[tuple]:
    """(case, dtype, value) for every case and dtype, with the values of one of the two
    ``halves``, alternating (by the case's and the dtype's index) so that every case and every
    dtype meets every value: each pair of values of any two of the three is covered, and every
    (case, dtype) pair takes one value from each half."""
    return [(case, dtype, value) for i, case in enumerate(cases)
            for j, dtype in enumerate(dtypes) for value in halves[(i + j) % 2]]  # fmt: skip


# Bit-widths by a covering design, not the full product: every (shape, dtype) runs a width of
# 8 codes a word (2 or 4) and one of 4 (5 or 8), the two kernel layouts; every shape and every
# dtype meets all four widths. Every code of every width is checked bit for bit by
# test_decode_is_bit_exact_for_every_code_and_edge (and every level of widths 3, 4, 7 and 8,
# through these kernels, by test_every_code_slot_of_a_word_is_bit_exact).
@pytest.mark.parametrize(
    ("m", "o", "k", "dtype", "bits"),
    [pytest.param(*case, dtype, bits, id=f"{'-'.join(map(str, case))}-{_dtype_id(dtype)}-{bits}")
     for case, dtype, bits in covering(LINEAR_CASES, DTYPES, ((2, 5), (4, 8)))],
)  # fmt: skip
def test_shift_linear_matches_reference(m: int, o: int, k: int, dtype, bits: int) -> None:
    seed = m * 10_000 + o * 100 + k + bits
    codes = random_codes(o, k, bits, seed)
    packed = pack_codes(codes, bits).to(DEVICE)
    n1 = -20 if dtype == torch.float16 and bits == 5 else -1  # fp16: reaches the flush edge
    w = decode_weight(packed.cpu(), bits, n1, (o, k), dtype).double()
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=gen).to(dtype)
    bias = torch.randn(o, generator=gen) if m % 2 else None  # float32: cast like the reference
    ref = x.double() @ w.T + (0 if bias is None else bias.to(dtype).double())
    wanted = {1, 3, linear_config(m, o, k, bits, 132, dtype == torch.float32).split_k}
    for split in distinct_splits(x.to(DEVICE), packed, bits, n1, k, wanted):
        out, check = guarded((m, o), dtype)
        bias_dev = None if bias is None else bias.to(DEVICE)
        y = tk.shift_linear(x.to(DEVICE), packed, bits, n1, k, bias_dev, split_k=split, out=out)
        check()
        assert_close_fp32_sum(y, x, w, ref, k, split, lambda a, b: a @ b.T)


@pytest.mark.parametrize("dtype", DTYPES)
def test_every_path_is_exact_where_the_arithmetic_is(dtype) -> None:
    """Small integers times levels 1 and 2: every sum is exact in fp32 and in the output
    dtype, so GEMV, skinny and large GEMM, split or not, give the reference bit for bit;
    each row the same whatever the batch it is in."""
    o, k, bits, n1 = 48, 32, 3, 1
    packed = pack_codes(random_codes(o, k, bits, seed=5), bits).to(DEVICE)
    gen = torch.Generator().manual_seed(0)
    x = torch.randint(-2, 3, (130, k), generator=gen).to(dtype)
    ref = ops.shift_linear_reference(x, packed.cpu(), bits, n1, k, None)
    for rows in (1, 3, 5, 64, 130):
        for split in (1, 2):
            y = tk.shift_linear(x[:rows].to(DEVICE), packed, bits, n1, k, None, split_k=split)
            assert torch.equal(y.cpu(), ref[:rows]), (rows, split)


def assert_rounded(y: torch.Tensor, exact: torch.Tensor, where: object) -> None:
    """``y`` is fp32 ``exact`` rounded to ``y.dtype`` by torch (to nearest even), bit for bit."""
    want = exact.to(y.dtype).view(torch.int16)
    wrong = int((y.cpu().view(torch.int16) != want).sum())
    assert not wrong, f"{wrong} of {y.numel()} results not rounded to nearest even ({where})"


def _ties(exact: torch.Tensor, dtype: torch.dtype) -> tuple[int, int]:
    """(ties whose kept part is even, ties whose kept part is odd) of normal fp32 ``exact``
    rounded to ``dtype``: the dropped bits are exactly one half of the last kept bit."""
    dropped = 16 if dtype == torch.bfloat16 else 13
    bits = exact.view(torch.int32)
    tie = (bits & ((1 << dropped) - 1)) == 1 << (dropped - 1)
    odd = ((bits >> dropped) & 1) == 1
    return int((tie & ~odd).sum()), int((tie & odd).sum())


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_every_path_rounds_exact_sums_to_nearest_even(dtype) -> None:
    """Integers times levels 4 .. 1/2 plus an integer bias: every sum is exact in fp32 but most
    need more bits than the output dtype has, so each path (GEMV, skinny and large GEMM, split
    or not; implicit-GEMM and depthwise conv) must round the exact result once, to nearest with
    ties to even, bit for bit as torch does. Many results are ties, both to the even neighbour
    below and above; truncation and round-half-up are both wrong on some of them."""
    o, k, bits, n1 = 48, 40, 4, 2
    packed = pack_codes(random_codes(o, k, bits, seed=6), bits)
    w = decode_weight(packed, bits, n1, (o, k), torch.float64)
    gen = torch.Generator().manual_seed(1)
    x = torch.randint(-256, 257, (130, k), generator=gen).to(dtype)  # exact in fp16 and bf16
    bias = torch.randint(-64, 65, (o,), generator=gen).to(dtype)
    exact = (x.double() @ w.T + bias.double()).float()  # below 2**24 * (1/2): exact in fp32
    assert exact.abs().max() < torch.finfo(dtype).max
    even, odd = _ties(exact, dtype)
    assert even > 20 and odd > 20, (even, odd)
    for rows in (1, 3, 5, 64, 130):
        for split in (1, 2):
            y = tk.shift_linear(x[:rows].to(DEVICE), packed.to(DEVICE), bits, n1, k,
                                bias.to(DEVICE), split_k=split)  # fmt: skip
            assert_rounded(y, exact[:rows], f"linear, {rows} rows, split_k={split}")
    # conv: 3x3 over 5 channels (K = 45, implicit GEMM), and depthwise (K = 9)
    for cin, groups in ((5, 1), (48, 48)):
        shape = [o, cin // groups, 3, 3]
        kk = math.prod(shape[1:])
        packed = pack_codes(random_codes(o, kk, bits, seed=cin), bits)
        w = decode_weight(packed, bits, n1, tuple(shape), torch.float64)
        image = torch.randint(-256, 257, (2, cin, 6, 7), generator=gen).to(dtype)
        args = ([1, 1], [1, 1], [1, 1], groups)
        exact = F.conv2d(image.double(), w, bias.double(), *args).float()
        assert all(n > 5 for n in _ties(exact, dtype)), _ties(exact, dtype)
        y = tk.shift_conv2d(image.to(DEVICE), packed.to(DEVICE), bits, n1, shape,
                            bias.to(DEVICE), *args)  # fmt: skip
        assert_rounded(y, exact, f"conv2d, groups={groups}")


@pytest.mark.parametrize("m", [1, 20, 70])
def test_per_row_n1_linear(m: int) -> None:
    o, k, bits = 6, 40, 4
    codes = random_codes(o, k, bits, seed=m)
    packed = pack_codes(codes, bits)
    n1 = torch.tensor([-4, -1, 0, 3, -9, 1], dtype=torch.int32)
    w = torch.cat([decode_weight(packed[i : i + 1], bits, int(n1[i]), (1, k), torch.float32)
                   for i in range(o)]).double()  # fmt: skip
    x = torch.randn(m, k)
    y = tk.shift_linear(x.to(DEVICE), packed.to(DEVICE), bits, n1.to(DEVICE), k, None)
    assert_close_fp32_sum(y.cpu(), x, w, x.double() @ w.T, k, 16, lambda a, b: a @ b.T)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_shift_linear_odd_layouts(dtype) -> None:
    """Strided x, 3-d x, float32 bias, and empty inputs (no rows, no outputs, no features)."""
    o, k, bits, n1 = 24, 70, 4, 2
    packed = pack_codes(random_codes(o, k, bits, seed=1), bits).to(DEVICE)
    w = decode_weight(packed.cpu(), bits, n1, (o, k), dtype).double()
    base = torch.randn(3, 5, 2 * k).to(dtype)
    x = base[..., ::2]  # stride 2 along k
    bias = torch.randn(o)
    ref = x.double() @ w.T + bias.to(dtype).double()
    y = tk.shift_linear(x.to(DEVICE), packed, bits, n1, k, bias.to(DEVICE))
    assert y.shape == (3, 5, o)
    assert_close_fp32_sum(y, x, w, ref, k, 16, lambda a, b: a @ b.T)
    empty_x = torch.empty(0, 4, k, dtype=dtype, device=DEVICE)
    assert tk.shift_linear(empty_x, packed, bits, n1, k, None).shape == (0, 4, o)
    none = torch.empty(0, 35, dtype=torch.uint8, device=DEVICE)
    assert tk.shift_linear(x.to(DEVICE), none, bits, n1, k, None).shape == (3, 5, 0)
    no_k = torch.empty(o, 0, dtype=torch.uint8, device=DEVICE)
    ones = torch.ones(2, 0, dtype=dtype, device=DEVICE)
    y = tk.shift_linear(ones, no_k, bits, n1, 0, bias.to(DEVICE))
    assert torch.equal(y.cpu(), bias.to(dtype).expand(2, o))


@pytest.mark.parametrize(
    ("bits", "n1", "dtype", "x_scale"),
    [(8, 15, torch.float16, 2.0**-14), (4, -125, torch.float32, 1.0),
     (6, -130, torch.float32, 1.0)],
)  # fmt: skip
def test_weights_without_a_layout_run_on_the_generic_kernels(
    bits: int, n1: int, dtype, x_scale: float
) -> None:
    """fp16 byte codes whose live levels span more than e5m2's 32 powers, and a row scale
    ``2**(n1 - c)`` below the normal fp32 range, have no kernel layout: the generic kernels
    (which decode every code) give the reference within the same bound."""
    o, k = 20, 150
    codes = random_codes(o, k, bits, seed=bits)
    codes[:, 0] = (1 << (bits - 1)) | ((1 << (bits - 2)) - 1)  # the smallest level in every row
    codes[:, 1] = 1 << (bits - 1)  # and the largest
    packed = pack_codes(codes, bits)
    assert kernel_weight(packed, bits, n1, k, dtype) is None
    w = decode_weight(packed, bits, n1, (o, k), dtype).double()
    gen = torch.Generator().manual_seed(bits)
    for m in (1, 20):
        x = (torch.randn(m, k, generator=gen) * x_scale).to(dtype)  # results stay finite
        y = tk.shift_linear(x.to(DEVICE), packed.to(DEVICE), bits, n1, k, None)
        assert_close_fp32_sum(y, x, w, x.double() @ w.T, k, 16, lambda a, b: a @ b.T)


@pytest.mark.parametrize("dtype", DTYPES)
def test_the_kernel_layout_is_never_stale(dtype) -> None:
    """The layout is cached with the packed tensor: codes changed in place, a new codes tensor,
    per-row exponents changed in place and another n1 each give the new weight's result."""
    o, k, bits = 24, 200, 4
    x = torch.randn(3, k).to(dtype)
    packed = pack_codes(random_codes(o, k, bits, seed=1), bits).to(DEVICE)
    n1_rows = torch.zeros(o, dtype=torch.int32, device=DEVICE)

    def check(codes_now: torch.Tensor, n1: int) -> None:
        y = tk.shift_linear(x.to(DEVICE), codes_now, bits, n1, k, None, n1_rows=n1_rows)
        rows_n1 = n1_rows.cpu().to(torch.int64) + n1
        w = torch.cat([decode_weight(codes_now[r : r + 1].cpu(), bits, int(rows_n1[r]), (1, k),
                                     dtype) for r in range(o)]).double()  # fmt: skip
        assert_close_fp32_sum(y.cpu(), x, w, x.double() @ w.T, k, 16, lambda a, b: a @ b.T)

    check(packed, -1)
    packed.copy_(pack_codes(random_codes(o, k, bits, seed=2), bits))  # in place
    check(packed, -1)
    check(pack_codes(random_codes(o, k, bits, seed=3), bits).to(DEVICE), -1)  # a new tensor
    n1_rows[::2] = -3  # per-row exponents in place
    check(packed, -1)
    check(packed, 2)  # another layer-wide n1


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bits", [3, 4, 7, 8])
def test_every_code_slot_of_a_word_is_bit_exact(bits: int, dtype) -> None:
    """One nonzero code per row, at column ``k = row``, over two chunks and a ragged third (every
    slot of every word, the chunk edges, the padding): each output is one product ``x * level``,
    which every path must give bit for bit, at every level of the bit-width."""
    k = 2 * 16 * (32 // (4 if bits <= 4 else 8)) + 5
    top = 1 << (bits - 1)
    codes = torch.zeros(k, k, dtype=torch.int64)
    level = top + torch.arange(k) % top  # every code, both signs
    codes[torch.arange(k), torch.arange(k)] = level
    packed = pack_codes(codes.to(torch.uint8), bits).to(DEVICE)
    n1 = 3 if bits <= 4 else -2
    w = decode_weight(packed.cpu(), bits, n1, (k, k), dtype)
    gen = torch.Generator().manual_seed(bits)
    for m in (1, 3, 20):
        x = torch.randn(m, k, generator=gen).to(dtype)
        y = tk.shift_linear(x.to(DEVICE), packed, bits, n1, k, None)
        want = (x.float() * w.float().diagonal()).to(dtype)  # one product, exact in fp32
        assert torch.equal(y.cpu(), want), (m, bits, dtype)


@pytest.mark.parametrize(
    ("m", "dtype"),
    [(1, torch.float16), (20, torch.float16), (70, torch.float16), (70, torch.bfloat16)],
)
def test_every_candidate_tiling_gives_the_same_bits(m: int, dtype) -> None:
    """The tilings a GPU may choose between (``swar.choose``) split K alike and run its loop
    in the same order: every output is the same sum, bit for bit, whichever is picked."""
    o, k, bits = 200, 300, 4
    packed = pack_codes(random_codes(o, k, bits, seed=m), bits)
    layout = kernel_weight(packed.to(DEVICE), bits, -1, k, dtype)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(m)).to(dtype).to(DEVICE)
    chunks = layout.words.shape[1] // 16
    bf16 = dtype == torch.bfloat16
    assert swar.candidates(m, False, bf16) == 2
    assert swar.candidates(m, False, True) == (1 if m <= 64 else 2)  # bf16: over budget
    outs = []
    for choice in range(swar.candidates(m, False, bf16)):
        cfg = swar.swar_config(m, o, chunks, False, 4, None, choice, bf16)
        assert cfg.split_k == swar.swar_config(m, o, chunks, False, sms=4).split_k > 1
        out = torch.empty(m, o, dtype=dtype, device=DEVICE)
        swar.launch(x, layout, None, out, cfg)
        outs.append(out.cpu())
    assert all(torch.equal(outs[0].view(torch.int16), y.view(torch.int16)) for y in outs[1:])


def test_a_layout_for_other_activations_is_refused() -> None:
    """The tensor-core kernel reads the paired layout, the fp32 kernels the plain one: either
    handed the other's is one clear error, not a wrong result."""
    packed = pack_codes(random_codes(16, 128, 4, seed=0), 4).to(DEVICE)
    cfg = swar.swar_config(2, 16, 1, False, sms=4)
    for dtype, paired in ((torch.float16, False), (torch.float32, True)):
        layout = kernel_weight(packed, 4, 0, 128, dtype, paired=paired)
        x = torch.ones(2, 128, dtype=dtype, device=DEVICE)
        with pytest.raises(ValueError, match="layout is not for"):
            swar.launch(x, layout, None, torch.empty(2, 16, dtype=dtype, device=DEVICE), cfg)


def test_choose_times_each_candidate_once_per_shape() -> None:
    calls: list[int] = []

    def timer(run, index: int) -> float:
        calls.append(index)
        return [3.0, 1.0][index]

    key = ("test shape", 1)
    assert swar.choose(key, 2, run=lambda i: None, timer=timer) == 1
    assert swar.choose(key, 2, run=lambda i: None, timer=timer) == 1
    assert calls == [0, 1]
    assert swar.choose(("one candidate",), 1, run=lambda i: None, timer=timer) == 0


def test_benchmark_grids_start_in_one_round_on_132_sms() -> None:
    """Where a benchmark shape's tiles leave SMs of an H100 idle, K is split as far as 8 warps
    an SM allow (two tensor-core CTAs of 4 warps, one of 8, one GEMV CTA: a second round on a
    few SMs costs more, by the time model, and a scheduler needs two warps), and no further."""
    from inq.kernels.shapes import LINEAR_BATCHES, LINEAR_SHAPES
    from inq.kernels.triton.swar import swar_config

    for out_f, in_f in LINEAR_SHAPES:
        for batch in LINEAR_BATCHES:
            for per_word, dtype_fp32 in ((8, False), (4, False), (8, True)):
                chunks = math.ceil(in_f / (16 * per_word))
                cfg = swar_config(batch, out_f, chunks, dtype_fp32, sms=132)
                tiles = math.ceil(batch / cfg.block_m) * math.ceil(out_f / cfg.block_n)
                case = (out_f, in_f, batch, cfg)
                slots = 132 * (8 // cfg.num_warps if cfg.kernel == "mma" else 1)
                if tiles < slots:
                    assert tiles * cfg.split_k <= slots < tiles * (cfg.split_k + 1), case
                else:
                    assert cfg.split_k == 1, case


# ---------------------------------------------------------------------------------- conv2d

# conv_config's pixel tiles (N * OH * OW pixels): 32 below 512 pixels, 64 on the depthwise
# kernel. The batched cases with several tiles end on a ragged one and have tiles that cross
# images; their maps are no larger than that needs (each program costs the interpreter some
# 10 ms a K step or tap).
CONV_CASES = [
    # (N, Cin, H, W, Cout, kh, kw, stride, padding, dilation, groups)
    (2, 3, 5, 6, 8, 3, 3, 1, 1, 1, 1),  # K = 27: one K step of 32 (fp32: two of 16); 60 pixels
    (1, 16, 14, 14, 17, 3, 3, 2, 1, 1, 1),  # Cout a tile + 1
    (3, 8, 4, 5, 12, 1, 1, 1, 0, 1, 4),  # grouped 1x1; 60 pixels
    (2, 4, 5, 13, 6, 2, 4, (1, 3), (1, 2), (2, 1), 2),  # K = 16: one step; 50 pixels (5x5)
    (2, 6, 6, 6, 6, 3, 3, 1, 2, 2, 6),  # depthwise, dilated; 72 pixels: a 64-pixel tile + 8
    (1, 5, 8, 9, 10, 5, 3, (2, 1), (2, 0), 1, 5),  # depthwise, channel multiplier 2
    (1, 33, 6, 6, 33, 7, 7, 1, 3, 1, 33),  # depthwise 7x7, channels a tile + 1
]


def _pair(v) -> list[int]:
    return [v, v] if isinstance(v, int) else list(v)


# (bits, channels_last) by a covering design, not the full product: every (case, dtype) runs
# both bit-widths (4- and 8-bit code fields) and both memory formats, in two of the four
# pairings, alternating; every pair of values of any two dimensions is covered. Every code of
# both widths is checked bit for bit by test_decode_is_bit_exact_for_every_code_and_edge;
# both formats on every case and dtype here.
@pytest.mark.parametrize(
    ("case", "dtype", "bits", "channels_last"),
    [pytest.param(case, dtype, bits, cl,
                  id=f"case{CONV_CASES.index(case)}-{_dtype_id(dtype)}-{bits}-{cl}")
     for case, dtype, (bits, cl) in covering(
         CONV_CASES, DTYPES, (((3, False), (6, True)), ((3, True), (6, False))))],
)  # fmt: skip
def test_shift_conv2d_matches_reference(case, dtype, bits: int, channels_last: bool) -> None:
    n, cin, h, wd, cout, kh, kw, stride, padding, dilation, groups = case
    seed = zlib.crc32(repr(case).encode()) % 10_000 + bits  # str hashes differ per process
    shape = [cout, cin // groups, kh, kw]
    packed = pack_codes(random_codes(cout, math.prod(shape[1:]), bits, seed), bits)
    w = decode_weight(packed, bits, 0, tuple(shape), dtype).double()
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, cin, h, wd, generator=gen).to(dtype)
    bias = torch.randn(cout, generator=gen).to(dtype)
    args = (_pair(stride), _pair(padding), _pair(dilation), groups)
    layout = torch.channels_last if channels_last else torch.contiguous_format
    xd = x.to(DEVICE, memory_format=layout)
    ref = F.conv2d(x.double(), w, bias.double(), *args)
    out, check = guarded(tuple(ref.shape), dtype, channels_last=channels_last)
    y = tk.shift_conv2d(xd, packed.to(DEVICE), bits, 0, shape, bias.to(DEVICE), *args, out=out)
    check()
    assert y.is_contiguous(memory_format=ops.output_format(xd))  # as F.conv2d's
    conv = lambda a, b: F.conv2d(a, b, None, *args)  # noqa: E731
    assert_close_fp32_sum(y, x, w, ref, math.prod(shape[1:]), 1, conv)


# (N, Cin, H, W, Cout, kh, kw, stride, padding, dilation): at least half a chunk of channels,
# so fp16/bf16 take the tensor-core kernel on the kernel layout (groups=1)
MMA_CONV_CASES = [
    (2, 64, 5, 6, 17, 3, 3, 1, 1, 1),  # half a nibble chunk, a whole byte chunk; 17 outputs
    (1, 130, 4, 4, 8, 1, 1, 2, 0, 1),  # 1x1, stride 2, ragged second chunk
    (1, 96, 7, 5, 33, 5, 3, (2, 1), (2, 0), (1, 2)),  # 5x3 taps, stride, padding, dilation
    (1, 64, 48, 48, 130, 1, 1, 1, 0, 1),  # 2304 pixels: 128x128 tiles, 8 warps; ragged outputs
]


@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("bits", [4, 6])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("case", MMA_CONV_CASES)
def test_shift_conv2d_tensor_core_path(case, dtype, bits: int, channels_last: bool) -> None:
    n, cin, h, wd, cout, kh, kw, stride, padding, dilation = case
    shape = [cout, cin, kh, kw]
    k = math.prod(shape[1:])
    packed = pack_codes(random_codes(cout, k, bits, seed=cin + bits), bits)
    n1 = torch.arange(cout, dtype=torch.int32) % 5 - 2  # per-row n1 too
    w = torch.cat([decode_weight(packed[i : i + 1], bits, int(n1[i]), (1, *shape[1:]), dtype)
                   for i in range(cout)]).double()  # fmt: skip
    gen = torch.Generator().manual_seed(cin + bits)
    x = torch.randn(n, cin, h, wd, generator=gen).to(dtype)
    args = (_pair(stride), _pair(padding), _pair(dilation), 1)
    layout = torch.channels_last if channels_last else torch.contiguous_format
    size = (n, cout, *ops.conv2d_output_size((h, wd), shape, *args[:3]))
    out, check = guarded(size, dtype, channels_last=channels_last)
    xd = x.to(DEVICE, memory_format=layout)
    y = tk.shift_conv2d(xd, packed.to(DEVICE), bits, n1.to(DEVICE), shape, None, *args, out=out)
    check()
    conv = lambda a, b: F.conv2d(a, b, None, *args)  # noqa: E731
    assert y.is_contiguous(memory_format=ops.output_format(xd))
    assert_close_fp32_sum(y.cpu(), x, w, conv(x.double(), w), k, 1, conv)


@pytest.mark.parametrize(("dtype", "bits"), [(torch.float16, 4), (torch.bfloat16, 7)])
def test_shift_conv2d_split_k(dtype: torch.dtype, bits: int) -> None:
    """A long K (130 channels: two chunks a tap, the second ragged; 3x3 taps) on few pixels
    splits across CTAs; the partial sums reduce in split order, within the bound."""
    from inq.kernels.layout import chunk_columns
    from inq.kernels.triton.conv_mma import conv_mma_grid

    shape, args = [20, 130, 3, 3], ([1, 1], [1, 1], [2, 1], 1)
    k = math.prod(shape[1:])
    split = conv_mma_grid(20, 20, 130, 9, chunk_columns(bits), 132).split  # 4x5 output pixels
    assert split == 9 * (2 if bits <= 4 else 3)  # a chunk a CTA: few tiles split as far as K
    packed = pack_codes(random_codes(20, k, bits, seed=9), bits)
    w = decode_weight(packed, bits, 0, tuple(shape), dtype).double()
    gen = torch.Generator().manual_seed(9)
    x = torch.randn(1, 130, 4, 5, generator=gen).to(dtype)
    bias = torch.randn(20, generator=gen).to(dtype)
    y = tk.shift_conv2d(x.to(DEVICE), packed.to(DEVICE), bits, 0, shape, bias.to(DEVICE), *args)
    ref = F.conv2d(x.double(), w, bias.double(), *args)
    conv = lambda a, b: F.conv2d(a, b, None, *args)  # noqa: E731
    assert_close_fp32_sum(y.cpu(), x, w, ref, k, split, conv)


def test_every_conv_launch_on_offer_gives_the_same_bits() -> None:
    """The 64- and 128-pixel tiles a GPU chooses between (``conv_mma_grids``, timed once by
    ``swar.choose``) split K alike and walk it in the same order: every output is the same
    sum, bit for bit, whichever is picked. 1,024 pixels of 128 outputs, K split 5 ways."""
    from inq.kernels.triton import conv_mma as cm

    shape, args = [128, 64, 3, 3], ([1, 1], [1, 1], [1, 1])
    packed = pack_codes(random_codes(128, 64 * 9, 4, seed=11), 4).to(DEVICE)
    x = torch.randn(1, 64, 32, 32, generator=torch.Generator().manual_seed(11)).half()
    x = x.to(DEVICE)
    layout = cm.conv_layout(packed, 4, 0, shape, torch.float16)
    out = torch.empty(1, 128, 32, 32, dtype=torch.float16, device=DEVICE)
    grids, chosen = cm.offered_grids(x, layout, shape, *args, out)
    assert chosen == 0 and [(g.block_m, g.warps, g.split) for g in grids] == [
        (64, 4, 5),
        (128, 8, 5),
    ]
    outs = []
    for grid in grids:
        cm.launch_grid(x, layout, shape, None, *args, out, grid)
        outs.append(out.cpu().view(torch.int16).clone())
    assert torch.equal(outs[0], outs[1])
    y = tk.shift_conv2d(x, packed, 4, 0, shape, None, *args, 1)  # the default, on the CPU
    assert torch.equal(y.cpu().view(torch.int16), outs[0])


# (N, H, W, kernel, stride, padding, dilation, K columns, pixel tile, tiles): a first conv's
# 7x7 stride-2 geometry (49 taps in 64, 3 channels in 4; the tiles ragged in width), and 3x3
# taps dilated on an output the tiles cover exactly (9 taps in 16)
FEW_CHANNEL_CASES = [
    (3, 15, 13, 7, 2, 3, 1, (64, 4), (4, 8), 3 * 2 * 1),
    (2, 10, 16, 3, 1, 2, 2, (16, 4), (2, 16), 2 * 5 * 1),
]


@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize(("dtype", "bits"), [(torch.float16, 4), (torch.bfloat16, 7)])
@pytest.mark.parametrize("case", FEW_CHANNEL_CASES)
def test_shift_conv2d_few_channels_walks_its_pixel_tiles(
    monkeypatch, case, dtype: torch.dtype, bits: int, channels_last: bool
) -> None:
    """The few-channels kernel (3 input channels, any memory format: its channels-last copy
    holds 4) on one nominal SM: its program walks several pixel tiles, the next tile's inputs
    loaded while one computes, with 70 output channels in two tiles (the second ragged),
    per-row n1 and a bias."""
    from inq.kernels.triton import conv

    n, h, wd, taps, stride, padding, dilation, columns, block, tiles = case
    shape, args = [70, 3, taps, taps], ([stride] * 2, [padding] * 2, [dilation] * 2, 1)
    k = math.prod(shape[1:])
    packed = pack_codes(random_codes(70, k, bits, seed=7), bits)
    n1 = torch.arange(70, dtype=torch.int32) % 4 - 1
    w = torch.cat([decode_weight(packed[i : i + 1], bits, int(n1[i]), (1, *shape[1:]), dtype)
                   for i in range(70)]).double()  # fmt: skip
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(n, 3, h, wd, generator=gen).to(dtype)
    bias = torch.randn(70, generator=gen).to(dtype)
    oh, ow = ops.conv2d_output_size((h, wd), shape, *args[:3])
    cfg = conv.conv_config(n * oh * ow, 70, 3, taps * taps)
    assert (cfg.kernel, conv.few_channels_columns(3, taps * taps)) == ("few_channels", columns)
    assert conv.pixel_block(cfg.block_m, ow) == block
    assert n * -(-oh // block[0]) * -(-ow // block[1]) == tiles
    monkeypatch.setattr(conv, "sm_count", lambda device: 1)  # so fewer programs than tiles
    layout = torch.channels_last if channels_last else torch.contiguous_format
    xd = x.to(DEVICE, memory_format=layout)
    ref = F.conv2d(x.double(), w, bias.double(), *args)
    out, check = guarded(tuple(ref.shape), dtype, channels_last=channels_last)
    y = conv.shift_conv2d(xd, packed.to(DEVICE), bits, n1.to(DEVICE), shape, bias.to(DEVICE),
                          *args, out=out)  # fmt: skip
    check()
    assert y.is_contiguous(memory_format=ops.output_format(xd))
    conv2d = lambda a, b: F.conv2d(a, b, None, *args)  # noqa: E731
    assert_close_fp32_sum(y.cpu(), x, w, ref, k, 1, conv2d)


@pytest.mark.parametrize("dtype", DTYPES)
def test_shift_conv2d_unbatched_per_row_n1_and_errors(dtype: torch.dtype) -> None:
    """Per-row n1 and unbatched input on each path (fp16/bf16: the tensor-core kernel on the
    kernel layout; fp32: the implicit GEMM)."""
    shape, args = [4, 2, 3, 3], ([1, 1], [1, 1], [1, 1], 1)
    packed = pack_codes(random_codes(4, 18, 4, seed=3), 4)
    n1 = torch.tensor([0, -2, 1, -5], dtype=torch.int32)
    w = torch.cat([decode_weight(packed[i : i + 1], 4, int(n1[i]), (1, 2, 3, 3), dtype)
                   for i in range(4)]).double()  # fmt: skip
    x = torch.randn(2, 6, 6).to(dtype)
    y = tk.shift_conv2d(x.to(DEVICE), packed.to(DEVICE), 4, n1.to(DEVICE), shape, None, *args)
    conv = lambda a, b: F.conv2d(a, b, None, *args)  # noqa: E731
    assert y.shape == (4, 6, 6)
    assert_close_fp32_sum(y.cpu(), x, w, conv(x.double(), w), 18, 1, conv)
    with pytest.raises(ValueError, match="smaller than the dilated kernel"):
        tiny = torch.randn(1, 2, 2, 2, device=DEVICE)  # H=2, k=3, p=0, s=2: F.conv2d refuses
        tk.shift_conv2d(tiny, packed.to(DEVICE), 4, 0, shape, None, [2, 2], [0, 0], [1, 1], 1)


# ---------------------------------------------------------------------------------- int8


@pytest.mark.parametrize("bits", range(2, 9))
@pytest.mark.parametrize(("m", "o", "k"), [(1, 1, 1), (3, 33, 100), (5, 31, 65), (9, 4, 300)])
def test_int8_bit_exact(m: int, o: int, k: int, bits: int) -> None:
    packed = pack_codes(random_codes(o, k, bits, seed=o + k + bits), bits)
    gen = torch.Generator().manual_seed(bits)
    x = torch.randint(-128, 128, (m, k), generator=gen, dtype=torch.int8)
    x[0, 0] = -128  # -x does not fit int8: the kernel negates in int32
    for frac in sorted({0, min(exact_frac_bits(bits), max_frac_bits(k)), max_frac_bits(k)}):
        out, check = guarded((m, o), torch.int32)
        y = tk.shift_linear_int8(x.to(DEVICE), packed.to(DEVICE), bits, k, frac, out=out)
        check()
        assert torch.equal(y.cpu(), shift_linear_int8_reference(x, packed, bits, k, frac))


@pytest.mark.parametrize("bits", [2, 5, 8])
@pytest.mark.parametrize(("m", "o", "k"), [(1, 1, 1), (3, 33, 100), (5, 31, 65)])
def test_uint8_linear_bit_exact(m: int, o: int, k: int, bits: int) -> None:
    """uint8 activations widen without sign extension (128..255 stay positive)."""
    codes = random_codes(o, k, bits, seed=o + k + bits)
    codes[0, 0] = 1 << (bits - 1)  # +2**n1: x[0, 0] = 255 counts
    packed = pack_codes(codes, bits)
    gen = torch.Generator().manual_seed(bits)
    x = torch.randint(0, 256, (m, k), generator=gen).to(torch.uint8)
    x[0, 0] = 255
    limit = max_frac_bits(k, unsigned=True)
    for frac in sorted({0, min(exact_frac_bits(bits), limit), limit}):
        y = tk.shift_linear_int8(x.to(DEVICE), packed.to(DEVICE), bits, k, frac)
        assert torch.equal(y.cpu(), shift_linear_int8_reference(x, packed, bits, k, frac))


def test_int8_batch_dims_and_refusals() -> None:
    packed = pack_codes(random_codes(3, 10, 6, seed=0), 6)
    x = torch.randint(-128, 128, (2, 3, 10), dtype=torch.int8)
    y = tk.shift_linear_int8(x.to(DEVICE), packed.to(DEVICE), 6, 10, 4)
    assert torch.equal(y.cpu(), shift_linear_int8_reference(x, packed, 6, 10, 4))
    with pytest.raises(ValueError, match="overflow"):
        tk.shift_linear_int8(x.to(DEVICE), packed.to(DEVICE), 6, 10, 40)


# (N, Cin, H, W, Cout, kh, kw, stride, padding, dilation, groups, bits): output pixels around
# the tiles (32 a tile with 16 channels, 128 with 4), channels not multiples of them, K below,
# at and across BLOCK_K = 16, every bit-width; odd cases take channels_last input
CONV_INT8_CASES = [
    (1, 3, 9, 11, 17, 3, 3, 1, 1, 1, 1, 2),  # 99 pixels, Cout a 16-channel tile + 1
    (2, 16, 4, 4, 16, 1, 1, 1, 0, 1, 1, 3),  # 1x1: one tile exactly (32 pixels, 16 outputs, K 16)
    (3, 4, 10, 9, 8, 5, 3, (2, 1), (2, 0), (1, 2), 2, 4),  # grouped, 4 outputs a group
    (2, 6, 9, 8, 6, 3, 3, 1, 2, 2, 6, 5),  # depthwise, dilated, 144 pixels: a 128-tile + 16
    (1, 4, 9, 9, 8, 3, 3, 2, 1, 1, 4, 6),  # depthwise, channel multiplier 2
    (2, 18, 6, 5, 20, 3, 3, 1, 1, 1, 2, 7),  # K = 81: six K steps, 10 outputs a group
    (1, 7, 13, 6, 33, 5, 3, 2, 2, 2, 1, 8),  # 5x3, stride, padding and dilation 2; 33 outputs
    (1, 5, 3, 43, 3, 1, 1, 1, 0, 1, 1, 4),  # 129 pixels: a 128-pixel tile + 1
]


@pytest.mark.parametrize("dtype", [torch.int8, torch.uint8])
@pytest.mark.parametrize("case", CONV_INT8_CASES)
def test_conv_int8_bit_exact(case, dtype: torch.dtype) -> None:
    n, cin, h, wd, cout, kh, kw, stride, padding, dilation, groups, bits = case
    shape = [cout, cin // groups, kh, kw]
    k = math.prod(shape[1:])
    packed = pack_codes(random_codes(cout, k, bits, seed=cout + k + bits), bits)
    gen = torch.Generator().manual_seed(k)
    low, high = (0, 256) if dtype == torch.uint8 else (-128, 128)
    x = torch.randint(low, high, (n, cin, h, wd), generator=gen).to(dtype)
    x[0, :, 1, 1] = low if dtype == torch.int8 else high - 1  # the extremes: -128, 255
    args = (_pair(stride), _pair(padding), _pair(dilation), groups)
    layout = torch.channels_last if CONV_INT8_CASES.index(case) % 2 else torch.contiguous_format
    xd = x.to(DEVICE, memory_format=layout)
    for frac in (0, max_frac_bits(k, unsigned=dtype == torch.uint8)):
        ref = shift_conv2d_int8_reference(x, packed, bits, shape, *args, frac)
        out, check = guarded(tuple(ref.shape), torch.int32, channels_last=True)
        y = tk.shift_conv2d_int8(xd, packed.to(DEVICE), bits, shape, *args, frac, out=out)
        check()
        assert y.is_contiguous(memory_format=torch.channels_last) and torch.equal(y.cpu(), ref)


def test_conv_int8_refusals() -> None:
    shape, args = [4, 2, 3, 3], ([1, 1], [1, 1], [1, 1], 1)
    packed = pack_codes(random_codes(4, 18, 4, seed=3), 4).to(DEVICE)
    x = torch.zeros(1, 2, 5, 5, dtype=torch.uint8, device=DEVICE)
    with pytest.raises(ValueError, match="overflow"):
        tk.shift_conv2d_int8(x, packed, 4, shape, *args, 19)
    with pytest.raises(ValueError, match="int8 or uint8"):
        tk.shift_conv2d_int8(x.float(), packed, 4, shape, *args, 0)
    with pytest.raises(ValueError, match=r"must be uint8 \[4, 9\]"):
        tk.shift_conv2d_int8(x, packed[:, :5], 4, shape, *args, 0)
    with pytest.raises(ValueError, match="does not fit"):
        tk.shift_conv2d_int8(x[0], packed, 4, shape, *args, 0)
    with pytest.raises(ValueError, match="move them to one device"):
        tk.shift_conv2d_int8(x, packed.to("meta"), 4, shape, *args, 0)
    with pytest.raises(ValueError, match="out must be a channels_last"):
        tk.shift_conv2d_int8(x, packed, 4, shape, *args, 0, out=torch.empty(1, 4, 5, 5))
    nchw = torch.empty(1, 4, 5, 5, dtype=torch.int32, device=DEVICE)
    with pytest.raises(ValueError, match="out must be a channels_last"):
        tk.shift_conv2d_int8(x, packed, 4, shape, *args, 0, out=nchw)
    empty = tk.shift_conv2d_int8(x[:0], packed, 4, shape, *args, 0)
    assert empty.shape == (0, 4, 5, 5) and empty.dtype == torch.int32


# ---------------------------------------------------------------------------------- int8 MMA


def mma_codes(o: int, k: int, bits: int, frac: int, seed: int) -> torch.Tensor:
    """Codes whose offsets are all at most ``frac`` (every term a product: the int8 tensor-core
    kernel's domain), each magnitude ``2**frac`` .. 1 present in row 0 where K allows, and a
    fifth of them zero."""
    gen = torch.Generator().manual_seed(seed)
    offsets = torch.randint(0, min(frac, (1 << (bits - 2)) - 1) + 1, (o, k), generator=gen)
    signs = torch.randint(0, 2, (o, k), generator=gen)
    live = min(k, frac + 1)
    offsets[0, :live] = torch.arange(live).clamp(max=(1 << (bits - 2)) - 1)
    codes = (1 << (bits - 1)) | (signs << (bits - 2)) | offsets
    codes[torch.rand(o, k, generator=gen) < 0.2] = 0
    return codes.to(torch.uint8)


def extreme_activations(shape, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """Random int8 or uint8 values with the extremes (-128 and 127, or 0 and 255) in front."""
    low, high = (0, 256) if dtype == torch.uint8 else (-128, 128)
    x = torch.randint(low, high, shape, generator=torch.Generator().manual_seed(seed))
    flat = x.view(-1)
    flat[: min(2, flat.numel())] = torch.tensor([low, high - 1])[: min(2, flat.numel())]
    return x.to(dtype)


@pytest.mark.parametrize("dtype", [torch.int8, torch.uint8])
@pytest.mark.parametrize(
    ("m", "o", "k", "bits", "frac"),
    [
        (1, 16, 1, 2, 0),  # one term; batch 1
        (3, 17, 100, 3, 1),  # odd outputs and K
        (17, 64, 130, 4, 3),  # rows across a 16-row tile, K across 64-column steps
        (5, 40, 65, 5, 7),  # 5 bits: +-128, a second int8 product
        (2, 33, 2100, 6, 11),  # K split across CTAs (33 steps > 32), exponents up to 11
        (4, 16, 96, 8, 13),  # 8-bit codes, exponents up to 13 (two parts)
    ],
)
def test_imma_linear_bit_exact(m, o, k, bits, frac, dtype: torch.dtype) -> None:
    """The int8 tensor-core path equals the reference bit for bit, both activation types."""
    packed = pack_codes(mma_codes(o, k, bits, frac, seed=o + k), bits)
    x = extreme_activations((m, k), dtype, seed=k)
    out, check = guarded((m, o), torch.int32)
    y = tk.shift_linear_int8(x.to(DEVICE), packed.to(DEVICE), bits, k, frac, out=out,
                             kernel="imma")  # fmt: skip
    check()
    assert torch.equal(y.cpu(), shift_linear_int8_reference(x, packed, bits, k, frac))


# (N, Cin, H, W, Cout, kh, kw, stride, padding, dilation, groups, bits, frac): tap-wise steps
# (>= 32 channels a group) and flat ones (fewer), groups, odd channel counts, stride, padding,
# dilation, split-K, 5-bit weights of +-128
IMMA_CONV_CASES = [
    (1, 3, 11, 9, 16, 3, 3, 2, 1, 1, 1, 4, 3),  # a first conv: 3 channels, flat K steps
    (2, 64, 5, 6, 32, 3, 3, 1, 1, 1, 1, 5, 7),  # tap-wise, 64 channels, +-128
    (1, 33, 7, 7, 17, 3, 3, 1, 2, 2, 1, 4, 3),  # odd channels (33 = a step of 32 + 1), dilated
    (2, 64, 8, 8, 64, 1, 1, 2, 0, 1, 2, 4, 2),  # grouped 1x1, stride 2
    (1, 256, 4, 4, 16, 3, 3, 1, 1, 1, 1, 3, 1),  # 36 steps: K split
    (1, 10, 9, 8, 48, 5, 3, (2, 1), (2, 0), (1, 2), 2, 6, 9),  # 5 channels a group, flat
]


def imma_conv_operands(case: tuple, dtype: torch.dtype) -> tuple:
    """``(x, packed, bits, weight_shape, geometry, frac)`` of an :data:`IMMA_CONV_CASES` case:
    codes in the tensor cores' domain, activations of ``dtype`` with its extremes."""
    n, cin, h, wd, cout, kh, kw, stride, padding, dilation, groups, bits, frac = case
    shape = [cout, cin // groups, kh, kw]
    k = math.prod(shape[1:])
    packed = pack_codes(mma_codes(cout, k, bits, frac, seed=cout + k), bits)
    x = extreme_activations((n, cin, h, wd), dtype, seed=k)
    return x, packed, bits, shape, (_pair(stride), _pair(padding), _pair(dilation), groups), frac


@pytest.mark.parametrize("layout", ["nchw", "channels_last", "view"])
@pytest.mark.parametrize("dtype", [torch.int8, torch.uint8])
@pytest.mark.parametrize("case", IMMA_CONV_CASES)
def test_imma_conv_bit_exact(case, dtype: torch.dtype, layout: str) -> None:
    """Bit-exact with the reference; uint8 with padding checks that a padded zero adds 0. The
    input NCHW, channels_last, or a view dense in neither."""
    x, packed, bits, shape, args, frac = imma_conv_operands(case, dtype)
    n, cin, h, wd = x.shape
    ref = shift_conv2d_int8_reference(x, packed, bits, shape, *args, frac)
    out, check = guarded(tuple(ref.shape), torch.int32, channels_last=True)
    if layout == "view":  # every other column of a tensor twice as wide
        wide = torch.zeros(n, cin, h, 2 * wd, dtype=dtype)
        wide[..., ::2] = x
        x_in = wide.to(DEVICE)[..., ::2]
    else:
        form = torch.channels_last if layout == "channels_last" else torch.contiguous_format
        x_in = x.to(DEVICE, memory_format=form)
    y = tk.shift_conv2d_int8(x_in, packed.to(DEVICE), bits, shape, *args, frac, out=out,
                             kernel="imma")  # fmt: skip
    check()
    assert torch.equal(y.cpu(), ref)


def test_every_int8_launch_on_offer_gives_the_same_bits() -> None:
    """Where K is split, the same tiles with K whole are offered too (``imma_launches``, timed
    once by ``swar.choose`` on a GPU): the int32 sums, the requantized values and the residual
    add are the reference's bit for bit on each."""
    from inq.kernels.int8_layout import cached_int8_weight
    from inq.kernels.triton.imma import Requant, Residual, imma_launches, launch_imma

    x, packed, bits, shape, geometry, frac = imma_conv_operands(IMMA_CONV_CASES[4], torch.uint8)
    cout, k = shape[0], math.prod(shape[1:])
    options = imma_launches(16, cout, 1, shape[1], 9, sms=132)
    assert [cfg.split_k for cfg in options] == [4, 1]
    weight = cached_int8_weight(packed.to(DEVICE), bits, k, frac, 9)
    requant = random_requant(cout, seed=k)
    skip = extreme_activations((1, cout, 4, 4), torch.int8, seed=3)
    sums = shift_conv2d_int8_reference(x, packed, bits, shape, *geometry, frac)
    conv = int8.requantize_channels(sums, *requant, -128, 127, channel_dim=1)
    added = int8.requant_add_reference(conv, skip, 3, -2, 1, 0, 255)
    for cfg in options:
        for epilogue, want in (((), sums), ((Requant(*requant, -128, 127),), conv),
                               ((Requant(*requant, -128, 127), Residual(skip, 3, -2, 1, 0, 255)),
                                added)):  # fmt: skip
            out = torch.empty_like(want).to(DEVICE, memory_format=torch.channels_last)
            launch_imma(x.to(DEVICE), weight, (shape, *geometry), out, cfg, *epilogue)
            assert torch.equal(out.cpu(), want), (cfg, len(epilogue))


def test_imma_dispatch_empty_and_refusals() -> None:
    """``auto`` takes the tensor cores only where a layer allows; empty batches give empty
    results; ``imma`` refuses a layer it cannot run, naming why."""
    shape, args = [16, 32, 3, 3], ([1, 1], [1, 1], [1, 1], 1)
    packed = pack_codes(mma_codes(16, 288, 4, 3, seed=0), 4).to(DEVICE)
    x = torch.zeros(0, 32, 5, 5, dtype=torch.uint8, device=DEVICE)
    empty = tk.shift_conv2d_int8(x, packed, 4, shape, *args, 3, kernel="imma")
    assert empty.shape == (0, 16, 5, 5) and empty.dtype == torch.int32
    rows = tk.shift_linear_int8(torch.zeros(0, 288, dtype=torch.int8, device=DEVICE), packed, 4,
                                288, 3, kernel="imma")  # fmt: skip
    assert rows.shape == (0, 16)
    with pytest.raises(ValueError, match="no int8 tensor-core layout"):  # offset 3 floors
        tk.shift_conv2d_int8(x, packed, 4, shape, *args, 2, kernel="imma")
    depthwise = pack_codes(mma_codes(8, 9, 4, 3, seed=1), 4).to(DEVICE)
    with pytest.raises(ValueError, match="fewer than 16"):
        tk.shift_conv2d_int8(torch.zeros(1, 8, 5, 5, dtype=torch.int8, device=DEVICE), depthwise,
                             4, [8, 1, 3, 3], *args[:3], 8, 3, kernel="imma")  # fmt: skip
    with pytest.raises(ValueError, match="kernel must be one of"):
        tk.shift_linear_int8(torch.zeros(1, 288, dtype=torch.int8, device=DEVICE), packed, 4,
                             288, 3, kernel="cudnn")  # fmt: skip


def random_requant(o: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """int32 bias, multiplier (either sign, up to 31 bits) and shift (0..40) per output: the
    integer model's requantization, with the extremes in front."""
    gen = torch.Generator().manual_seed(seed)
    bias = torch.randint(-(1 << 20), 1 << 20, (o,), generator=gen)
    multiplier = torch.randint(-(1 << 31) + 1, 1 << 31, (o,), generator=gen)
    shift = torch.randint(0, 41, (o,), generator=gen)
    multiplier[0], shift[0] = (1 << 31) - 1, 40
    if o > 1:
        multiplier[1], shift[1] = 1, 0  # a pure pass-through: clamping decides
    return bias.to(torch.int32), multiplier.to(torch.int32), shift.to(torch.int32)


# (lo, hi): a uint8 output (ReLU folded), an int8 one, the int32 logits
REQUANT_RANGES = [(0, 255), (-128, 127), (-(1 << 31), (1 << 31) - 1)]


@pytest.mark.parametrize("lo_hi", REQUANT_RANGES)
@pytest.mark.parametrize("dtype", [torch.int8, torch.uint8])
@pytest.mark.parametrize(("m", "o", "k", "bits", "frac"),
                         [(3, 17, 100, 4, 3), (2, 33, 2100, 5, 7), (5, 16, 40, 4, 1)])  # fmt: skip
def test_linear_requant_bit_exact(m, o, k, bits, frac, dtype, lo_hi) -> None:
    """The fused requantization (tensor-core epilogue, split-K's requantization kernel, and the
    shift-add fallback where a term floors) equals the reference's composition bit for bit."""
    codes = mma_codes(o, k, bits, min(frac + 1, (1 << (bits - 2)) - 1), seed=o + k)
    packed = pack_codes(codes, bits)  # frac 1 with offsets up to 2 floors: the fallback
    x = extreme_activations((m, k), dtype, seed=k)
    requant = (*random_requant(o, seed=o), *lo_hi)
    want = int8.shift_linear_int8_requant_reference(x, packed, bits, k, frac, *requant)
    on = [t.to(DEVICE) for t in requant[:3]]
    got = tk.shift_linear_int8_requant(x.to(DEVICE), packed.to(DEVICE), bits, k, frac, *on,
                                       *lo_hi)  # fmt: skip
    assert got.dtype == want.dtype == int8.value_dtype(*lo_hi) and torch.equal(got.cpu(), want)


@pytest.mark.parametrize("lo_hi", REQUANT_RANGES[:2])
@pytest.mark.parametrize("case", [IMMA_CONV_CASES[i] for i in (0, 1, 4)])
def test_conv_requant_bit_exact(case, lo_hi) -> None:
    """Fused conv requantization: first conv (flat steps), 5-bit weights of 128, split-K."""
    x, packed, bits, shape, geometry, frac = imma_conv_operands(case, torch.uint8)
    cout, k = shape[0], math.prod(shape[1:])
    requant = random_requant(cout, seed=k)
    want = int8.shift_conv2d_int8_requant_reference(x, packed, bits, shape, *geometry, frac,
                                                    *requant, *lo_hi)  # fmt: skip
    got = tk.shift_conv2d_int8_requant(x.to(DEVICE), packed.to(DEVICE), bits, shape, *geometry,
                                       frac, *[t.to(DEVICE) for t in requant], *lo_hi,
                                       kernel="imma")  # fmt: skip
    assert got.is_contiguous(memory_format=torch.channels_last)
    assert got.dtype == want.dtype and torch.equal(got.cpu(), want)


def test_linear_requant_keeps_batch_dims() -> None:
    """Three batch dimensions (a 4-d result) requantize along the last, on both paths."""
    packed = pack_codes(mma_codes(16, 32, 4, 3, seed=2), 4)
    x = extreme_activations((2, 3, 2, 32), torch.int8, seed=2)
    requant = (*random_requant(16, seed=2), -128, 127)
    want = int8.shift_linear_int8_requant_reference(x, packed, 4, 32, 3, *requant)
    for kernel in ("imma", "shift_add"):
        got = tk.shift_linear_int8_requant(x.to(DEVICE), packed.to(DEVICE), 4, 32, 3,
                                           *[t.to(DEVICE) for t in requant[:3]], -128, 127,
                                           kernel=kernel)  # fmt: skip
        assert got.shape == (2, 3, 2, 16) and torch.equal(got.cpu(), want)


def test_requant_refusals() -> None:
    packed = pack_codes(mma_codes(16, 32, 4, 3, seed=0), 4).to(DEVICE)
    x = torch.zeros(2, 32, dtype=torch.int8, device=DEVICE)
    bias, mult, shift = (t.to(DEVICE) for t in random_requant(16, seed=0))
    with pytest.raises(ValueError, match="bias must be 16 int32"):
        tk.shift_linear_int8_requant(x, packed, 4, 32, 3, bias[:3], mult, shift, 0, 255)
    with pytest.raises(ValueError, match=r"shifts must lie in 0\.\.62"):
        tk.shift_linear_int8_requant(x, packed, 4, 32, 3, bias, mult, shift + 70, 0, 255)


@pytest.mark.parametrize("lo_hi", REQUANT_RANGES)
@pytest.mark.parametrize(
    ("x_dtype", "y_dtype", "layout"),
    [(torch.uint8, torch.uint8, torch.channels_last), (torch.int8, torch.uint8, None),
     (torch.int32, torch.int8, torch.channels_last)],
)  # fmt: skip
def test_requant_add_bit_exact(x_dtype, y_dtype, layout, lo_hi) -> None:
    """The residual add in one pass equals the int64 reference bit for bit (multipliers of
    either sign up to 31 bits, shifts 0 and 40, the dtype extremes), keeping the layout."""
    gen = torch.Generator().manual_seed(3)

    def values(dtype: torch.dtype) -> torch.Tensor:
        info = torch.iinfo(dtype)
        v = torch.randint(info.min, info.max, (2, 5, 3, 7), generator=gen, dtype=torch.int64)
        v.view(-1)[:2] = torch.tensor([info.min, info.max])
        v = v.to(dtype)
        return v if layout is None else v.contiguous(memory_format=layout)

    x, y = values(x_dtype), values(y_dtype)
    for m_x, m_y, shift in ((3, -5, 0), ((1 << 31) - 1, -(1 << 30), 40), (1, 1, 1)):
        want = int8.requant_add_reference(x, y, m_x, m_y, shift, *lo_hi)
        got = tk.requant_add(x.to(DEVICE), y.to(DEVICE), m_x, m_y, shift, *lo_hi)
        assert got.dtype == want.dtype and got.stride() == x.stride()
        assert torch.equal(got.cpu(), want)
    mixed = tk.requant_add(x.to(DEVICE), y.to(DEVICE).contiguous(), 1, 1, 1, *lo_hi)  # layouts
    assert torch.equal(mixed.cpu(), int8.requant_add_reference(x, y, 1, 1, 1, *lo_hi))


# (skip dtype, residual ranges): a uint8 skip into a ReLU-folded add, an int8 one saturating
# both ways into an int8 add
RESIDUALS = [(torch.uint8, (0, 255)), (torch.int8, (-128, 127))]


@pytest.mark.parametrize(("skip_dtype", "add_range"), RESIDUALS)
@pytest.mark.parametrize(
    ("case", "kernel"),
    [(IMMA_CONV_CASES[0], "auto"), (IMMA_CONV_CASES[1], "auto"), (IMMA_CONV_CASES[2], "auto"),
     (IMMA_CONV_CASES[4], "auto"), (IMMA_CONV_CASES[1], "shift_add")],
)  # fmt: skip
def test_conv_requant_add_bit_exact(case, kernel: str, skip_dtype, add_range) -> None:
    """The residual add in the convolution's epilogue (flat and tap-wise steps, 5-bit weights of
    128 in a second product, odd channels, split-K's requantization pass; the shift-add
    fallback) equals the two references in turn bit for bit: multipliers of either sign up to
    31 bits, shifts 0 and 40, extreme skips, a skip in either memory format."""
    x, packed, bits, shape, geometry, frac = imma_conv_operands(case, torch.uint8)
    cout, k = shape[0], math.prod(shape[1:])
    requant = (*random_requant(cout, seed=k), -128, 127)
    out_shape = int8.shift_conv2d_int8_requant_reference(x, packed, bits, shape, *geometry, frac,
                                                         *requant).shape  # fmt: skip
    skip = extreme_activations(tuple(out_shape), skip_dtype, seed=cout)
    on = [t.to(DEVICE) for t in requant[:3]]
    adds = ((3, -5, 0), ((1 << 31) - 1, -(1 << 30), 40), (1, 1, 1))
    for i, (m_conv, m_skip, add_shift) in enumerate(adds):  # the first skip channels_last
        residual = (m_conv, m_skip, add_shift, *add_range)
        skip_in = skip.contiguous(memory_format=torch.channels_last) if i == 0 else skip
        want = int8.shift_conv2d_int8_requant_add_reference(
            x, packed, bits, shape, *geometry, frac, *requant, skip_in, *residual
        )
        got = tk.shift_conv2d_int8_requant_add(
            x.to(DEVICE), packed.to(DEVICE), bits, shape, *geometry, frac, *on, *requant[3:],
            skip_in.to(DEVICE), *residual, kernel=kernel,
        )  # fmt: skip
        assert got.is_contiguous(memory_format=torch.channels_last)
        assert got.dtype == want.dtype == int8.value_dtype(*add_range)
        assert torch.equal(got.cpu(), want)


def test_conv_requant_add_empty_and_refusals() -> None:
    """An empty batch gives an empty result; a skip of another shape or a float skip is one
    clear error, on the kernels and the reference alike."""
    shape, geometry = [16, 32, 3, 3], ([1, 1], [1, 1], [1, 1], 1)
    packed = pack_codes(mma_codes(16, 288, 4, 3, seed=0), 4).to(DEVICE)
    requant = (*[t.to(DEVICE) for t in random_requant(16, seed=0)], -128, 127)
    x = torch.zeros(0, 32, 5, 5, dtype=torch.uint8, device=DEVICE)
    skip = torch.zeros(0, 16, 5, 5, dtype=torch.uint8, device=DEVICE)
    args = (packed, 4, shape, *geometry, 3, *requant)
    empty = tk.shift_conv2d_int8_requant_add(x, *args, skip, 1, 1, 0, 0, 255)
    assert empty.shape == (0, 16, 5, 5) and empty.dtype == torch.uint8
    x = torch.zeros(1, 32, 5, 5, dtype=torch.uint8, device=DEVICE)
    for bad in (torch.zeros(1, 16, 4, 5, dtype=torch.uint8), torch.zeros(1, 16, 5, 5)):
        for fn in (tk.shift_conv2d_int8_requant_add, int8.shift_conv2d_int8_requant_add_reference):
            with pytest.raises(ValueError, match="skip must be an int8, uint8 or int32 tensor"):
                fn(x, *args, bad.to(DEVICE), 1, 1, 0, 0, 255)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_quantize_input_bit_exact(dtype: torch.dtype) -> None:
    """Input quantization in one pass: float64 floor(x / scale + 1/2), ties (x / scale = k + 1/2)
    and the clamp included, bit for bit."""
    gen = torch.Generator().manual_seed(4)
    x = (torch.randn(3, 3, 9, 10, generator=gen) * 40).to(dtype)
    x.view(-1)[:4] = torch.tensor([0.3125, -0.3125, 1e4, -1e4]).to(dtype)  # ties at 1/16
    int32 = (-(1 << 31), (1 << 31) - 1)
    for scale, lo, hi in ((0.125, -128, 127), (1 / 3, 0, 255), (2.0**-9, *int32)):
        want = int8.quantize_input_reference(x, scale, lo, hi)
        got = tk.quantize_input(x.to(DEVICE), scale, lo, hi)
        assert got.dtype == want.dtype and torch.equal(got.cpu(), want)


# ---------------------------------------------------------------------------------- ops


@pytest.fixture
def triton_ops():
    """The ``inq::`` ops dispatching to the Triton kernels on ``DEVICE``. On CUDA that is
    their registration; on CPU a test-only kernel routes to the interpreter while this
    fixture is active and to the reference otherwise."""
    if DEVICE == "cuda":
        yield
        return
    CPU_ROUTE["triton"] = True
    try:
        yield
    finally:
        CPU_ROUTE["triton"] = False


def _register_cpu_route() -> None:
    pairs = [  # the float ops through their CUDA registration (which passes n1_rows by name)
        (ops.shift_linear, inq.kernels._shift_linear_cuda, ops.shift_linear_reference),
        (ops.shift_conv2d, inq.kernels._shift_conv2d_cuda, ops.shift_conv2d_reference),
        (int8.shift_linear_int8, tk.shift_linear_int8, int8.shift_linear_int8_reference),
        (int8.shift_conv2d_int8, tk.shift_conv2d_int8, int8.shift_conv2d_int8_reference),
        (
            int8.shift_linear_int8_requant,
            tk.shift_linear_int8_requant,
            int8.shift_linear_int8_requant_reference,
        ),
        (
            int8.shift_conv2d_int8_requant,
            tk.shift_conv2d_int8_requant,
            int8.shift_conv2d_int8_requant_reference,
        ),
        (
            int8.shift_conv2d_int8_requant_add,
            tk.shift_conv2d_int8_requant_add,
            int8.shift_conv2d_int8_requant_add_reference,
        ),
    ]
    route_on_cpu(pairs)


if DEVICE == "cpu":
    _register_cpu_route()


@pytest.mark.parametrize("bits", [3, 6])
def test_opcheck(triton_ops, bits: int) -> None:
    """Schema, fake implementation, autograd registration and dynamic shapes, with the
    Triton kernels behind the ops."""
    packed = pack_codes(random_codes(6, 9, bits, seed=1), bits).to(DEVICE)
    for x, bias in ((torch.randn(5, 9), torch.randn(6)), (torch.randn(2, 3, 9), None)):
        b = None if bias is None else bias.to(DEVICE)
        args = (x.to(DEVICE), packed, bits, 0, 9, b)
        torch.library.opcheck(torch.ops.inq.shift_linear.default, args)
    packed = pack_codes(random_codes(6, 18, bits, seed=2), bits).to(DEVICE)
    conv = ([6, 2, 3, 3], torch.randn(6, device=DEVICE), [2, 1], [1, 0], [1, 2], 2)
    for x in (torch.randn(2, 4, 7, 8), torch.randn(4, 7, 8)):
        args = (x.to(DEVICE), packed, bits, 0, *conv)
        torch.library.opcheck(torch.ops.inq.shift_conv2d.default, args)


def test_conv_layout_is_made_once_with_per_row_n1(triton_ops) -> None:
    """Through the op, per-row n1 keeps one cached tensor-core layout across calls (a layout per
    call would sync the device and could not be captured in a CUDA graph)."""
    from inq.kernels import layout

    shape = [8, 64, 3, 3]
    packed = pack_codes(random_codes(8, 64 * 9, 4, seed=1), 4).to(DEVICE)
    n1_rows = (torch.arange(8, dtype=torch.int32) % 3).to(DEVICE)
    x = torch.randn(1, 64, 5, 5).to(DEVICE, torch.float16)
    args = (x, packed, 4, 0, shape, None, [1, 1], [1, 1], [1, 1], 1, n1_rows)
    first = torch.ops.inq.shift_conv2d(*args)
    (made,) = [entry[2] for entry in layout._entries(packed).values()]
    assert made is not None
    assert torch.equal(torch.ops.inq.shift_conv2d(*args), first)
    (again,) = [entry[2] for entry in layout._entries(packed).values()]
    assert again is made  # the same layout, not rebuilt


def test_opcheck_int8(triton_ops) -> None:
    """The integer ops with the Triton kernels behind them: schema, fake implementation,
    dynamic shapes."""
    packed = pack_codes(random_codes(6, 18, 5, seed=4), 5).to(DEVICE)
    for dtype in (torch.int8, torch.uint8):
        x = torch.randint(0, 100, (2, 4, 7, 8)).to(dtype=dtype, device=DEVICE)
        conv = (x, packed, 5, [6, 2, 3, 3], [2, 1], [1, 0], [1, 2], 2, 9)
        torch.library.opcheck(torch.ops.inq.shift_conv2d_int8.default, conv)
        rows = torch.randint(0, 100, (3, 2, 18)).to(dtype=dtype, device=DEVICE)
        linear = (rows, packed, 5, 18, 7)
        torch.library.opcheck(torch.ops.inq.shift_linear_int8.default, linear)
    # the fused requantization on the tensor-core path (16 outputs, every term a product)
    wide = pack_codes(mma_codes(16, 64, 5, 7, seed=5), 5).to(DEVICE)
    requant = tuple(t.to(DEVICE) for t in random_requant(16, seed=5))
    for lo, hi in REQUANT_RANGES:
        x = torch.randint(0, 100, (2, 16, 5, 6), dtype=torch.uint8, device=DEVICE)
        conv = (x, wide, 5, [16, 16, 2, 2], [1, 1], [1, 1], [1, 1], 1, 7, *requant, lo, hi)
        torch.library.opcheck(torch.ops.inq.shift_conv2d_int8_requant.default, conv)
        rows = torch.randint(-100, 100, (3, 64), dtype=torch.int8, device=DEVICE)
        linear = (rows, wide, 5, 64, 7, *requant, lo, hi)
        torch.library.opcheck(torch.ops.inq.shift_linear_int8_requant.default, linear)
        add = (x, x.to(torch.int8), 3, -2, 1, lo, hi)
        torch.library.opcheck(torch.ops.inq.requant_add.default, add)
        skip = torch.randint(-100, 100, (2, 16, 6, 7), dtype=torch.int8, device=DEVICE)
        fused = (*conv[:-2], -128, 127, skip, 3, -2, 1, lo, hi)
        torch.library.opcheck(torch.ops.inq.shift_conv2d_int8_requant_add.default, fused)
        images = torch.randn(2, 3, 4, 5, device=DEVICE)
        torch.library.opcheck(torch.ops.inq.quantize_input.default, (images, 0.25, lo, hi))


def test_integer_model_with_fused_residual_adds(triton_ops) -> None:
    """A small ResNet's integer model, each block's second convolution and its residual add as
    one tensor-core op (the identity skip and the strided 1x1 one), gives the CPU reference's
    logits bit for bit."""
    from inq.quant.bench import integer_pair

    model, reference = integer_pair(residual_net(4), 4, image_size=8, batches=2)
    assert len(residual_fusions(model.ops)) == 2
    x = torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(2))
    want = reference.run(x)[reference.ops[-1].name]
    assert torch.equal(model(x.to(DEVICE)).cpu(), want)


def test_compile_fullgraph(triton_ops) -> None:
    """``torch.compile(fullgraph=True)`` traces both ops (fake impls) and runs the kernels."""
    lin = pack_codes(random_codes(5, 12, 5, seed=3), 5).to(DEVICE)
    conv = pack_codes(random_codes(3, 18, 3, seed=4), 3).to(DEVICE)

    def net(x: torch.Tensor) -> torch.Tensor:
        y = torch.ops.inq.shift_conv2d(x, conv, 3, 0, [3, 2, 3, 3], None, [1, 1], [1, 1],
                                       [1, 1], 1)  # fmt: skip
        y = torch.relu(y).flatten(1)[:, :12]
        return torch.ops.inq.shift_linear(y, lin, 5, -1, 12, None)

    x = torch.randn(2, 2, 4, 4, device=DEVICE)
    compiled = torch.compile(net, fullgraph=True, backend="aot_eager")
    got = compiled(x)
    CPU_ROUTE["triton"] = False  # the reference, eagerly, for comparison
    expected = torch.ops.inq.shift_linear(
        torch.relu(ops.shift_conv2d_reference(x, conv, 3, 0, [3, 2, 3, 3], None, [1, 1],
                                              [1, 1], [1, 1], 1)).flatten(1)[:, :12],
        lin, 5, -1, 12, None,
    )  # fmt: skip
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_limits_are_what_the_launcher_uses() -> None:
    assert linear_config(GEMV_MAX_ROWS, 64, 64, 4, 132).kernel == "gemv"
    assert linear_config(GEMV_MAX_ROWS + 1, 64, 64, 4, 132).block_m == 16
    assert linear_config(SKINNY_MAX_ROWS, 64, 64, 4, 132).block_m == 64
    assert linear_config(SKINNY_MAX_ROWS + 1, 64, 64, 4, 132).block_m == 128
    # split-K fills the SMs at batch 1 but never leaves a split without work
    assert linear_config(1, 512, 4096, 4, 132).split_k > 1
    assert linear_config(1, 512, 200, 4, 132).split_k == 1


@pytest.mark.cuda
@pytest.mark.slow
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", DTYPES)
def test_converted_digits_model_predicts_like_reference(tmp_path, dtype) -> None:
    """A trained digits model rebuilt from its packed file predicts on the GPU, in each dtype,
    what the reference ops predict on the CPU (ties within dtype rounding not compared)."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent))
    from export_fixtures import DIGITS_DATA, digits_run

    from inq.data import build_datasets
    from inq.nn import from_packed
    from inq.packed import export_packed

    path, _ = digits_run(tmp_path)
    export_packed(path, tmp_path / "digits.inq.safetensors")
    model = from_packed(tmp_path / "digits.inq.safetensors")
    x, _ = build_datasets(DIGITS_DATA)[1].tensors
    with torch.no_grad():
        ref = model(x).double()
        out = model.to("cuda", dtype)(x.to("cuda", dtype)).double().cpu()
    top2 = ref.topk(2, dim=1).values
    clear = (top2[:, 0] - top2[:, 1]) > 64 * _ROUNDING[dtype] * top2[:, 0].abs()
    assert clear.float().mean() > 0.9
    assert torch.equal(out.argmax(1)[clear], ref.argmax(1)[clear])


@pytest.mark.parametrize("m", [1, 9])
def test_cuda_registration_passes_n1_plus_n1_rows(m: int) -> None:
    """The CUDA implementations of the ops turn (n1, n1_rows) into one exponent per row; with
    small integer inputs every fp32 sum is exact, so they equal the reference bit for bit."""
    o, k, bits, n1 = 5, 40, 4, 1
    packed = pack_codes(random_codes(o, k, bits, seed=m), bits)
    n1_rows = torch.tensor([0, -1, -4, -2, -3], dtype=torch.int32)
    x = torch.randint(-3, 4, (m, k), generator=torch.Generator().manual_seed(m)).float()
    bias = torch.arange(o, dtype=torch.float32)
    expected = ops.shift_linear_reference(x, packed, bits, n1, k, bias, n1_rows)
    got = inq.kernels._shift_linear_cuda(
        x.to(DEVICE), packed.to(DEVICE), bits, n1, k, bias.to(DEVICE), n1_rows.to(DEVICE)
    )
    torch.testing.assert_close(got.cpu(), expected, atol=0, rtol=0)
    image = x.reshape(m, 1, 5, 8)
    shape = [o, 1, 5, 8]
    conv_args = (bits, n1, shape, bias, [1, 1], [0, 0], [1, 1], 1)
    expected = ops.shift_conv2d_reference(image, packed, *conv_args, n1_rows)
    got = inq.kernels._shift_conv2d_cuda(
        image.to(DEVICE), packed.to(DEVICE), *conv_args[:3], bias.to(DEVICE), *conv_args[4:],
        n1_rows.to(DEVICE),
    )  # fmt: skip
    torch.testing.assert_close(got.cpu(), expected, atol=0, rtol=0)


def test_integer_model_on_the_kernels_is_its_reference(tmp_path) -> None:
    """Issue 13: a whole integer model (the digits CNN at 8-bit activations: uint8 and int8
    inputs, 3x3 convs with padding, the classifier) gives the same int32 logits, bit for bit,
    with every conv/linear on the Triton kernels as with the reference."""
    from export_fixtures import DIGITS_DATA, digits_run, quantize_on

    from inq.data import build_datasets
    from inq.masked import load_masked
    from inq.packed import packed_from_masked
    from inq.quant.pipeline import QuantSettings

    path, _ = digits_run(tmp_path, epochs=1)
    packed = packed_from_masked(load_masked(path))
    int_model, _ = quantize_on(packed, DIGITS_DATA, QuantSettings(act_bits=8, batches=1))
    x = build_datasets(DIGITS_DATA)[1].tensors[0][:12]
    expected = int_model(x)  # CPU: the reference
    CPU_ROUTE["triton"] = DEVICE == "cpu"
    try:
        got = int_model.to(DEVICE)(x.to(DEVICE))
    finally:
        CPU_ROUTE["triton"] = False
    assert got.dtype == torch.int32
    assert torch.equal(got.cpu(), expected)


_TRITON_SOURCES = Path(tk.__file__).parent


def _is_jit(node: ast.FunctionDef) -> bool:
    """``@triton.jit`` (or ``@jit``, ``@triton.jit(...)``) on a function definition."""
    for deco in node.decorator_list:
        target = deco.func if isinstance(deco, ast.Call) else deco
        if isinstance(target, ast.Attribute) and target.attr == "jit":
            return True
        if isinstance(target, ast.Name) and target.id == "jit":
            return True
    return False


def _constexprs(node: ast.FunctionDef) -> list[str]:
    """The parameters of ``node`` annotated ``tl.constexpr``, in order."""
    params = [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs]
    return [
        a.arg
        for a in params
        if a.annotation is not None and ast.unparse(a.annotation).endswith("constexpr")
    ]


def kernel_launches() -> list[tuple[str, str, list[str], set[str]]]:
    """Every ``kernel[grid](...)`` in :mod:`inq.kernels.triton` of a ``@triton.jit`` function
    defined there: (where, kernel, its ``tl.constexpr`` parameters, the keywords passed)."""
    trees = {
        path.stem: ast.parse(path.read_text()) for path in sorted(_TRITON_SOURCES.glob("*.py"))
    }
    defined = {
        module: {
            n.name: _constexprs(n)
            for n in tree.body
            if isinstance(n, ast.FunctionDef) and _is_jit(n)
        }
        for module, tree in trees.items()
    }
    launches = []
    for module, tree in trees.items():
        visible = dict(defined[module])  # the module's own kernels, then those it imports
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module:
                source = node.module.rpartition(".")[2] if node.level == 0 else node.module
                if node.level or node.module.startswith("inq.kernels.triton."):
                    for alias in node.names:
                        if alias.name in defined.get(source, {}):
                            visible[alias.asname or alias.name] = defined[source][alias.name]
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Subscript)
                and isinstance(node.func.value, ast.Name)
                and node.func.value.id in visible
            ):
                name = node.func.value.id
                keywords = {k.arg for k in node.keywords if k.arg is not None}
                launches.append((f"{module}.py:{node.lineno}", name, visible[name], keywords))
    return launches


def test_kernel_launches_pass_every_constexpr_by_keyword() -> None:
    """Issue 34: at every launch ``kernel[grid](...)`` each ``tl.constexpr`` parameter of the
    kernel is passed by keyword (``BLOCK_M=cfg.block_m``), so the launch shows what specialises
    the kernel and a reordered signature cannot silently swap two tiles; runtime arguments may
    stay positional. (A constexpr inside ``**kwargs`` does not count: the reader cannot see it.)"""
    launches = kernel_launches()
    launched = {name for _, name, _, _ in launches}
    kernels = {
        n.name
        for path in _TRITON_SOURCES.glob("*.py")
        for n in ast.parse(path.read_text()).body
        if isinstance(n, ast.FunctionDef) and _is_jit(n) and n.name.endswith("kernel")
    }
    assert kernels <= launched, f"kernels the walk found no launch of: {sorted(kernels - launched)}"
    for where, name, constexprs, keywords in launches:
        assert constexprs, f"{where}: {name} declares no tl.constexpr (is the walk reading it?)"
        missing = [c for c in constexprs if c not in keywords]
        assert not missing, f"{where}: {name}[grid](...) does not pass {missing} by keyword"
