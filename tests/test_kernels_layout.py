"""The kernels' weight layout (:mod:`inq.kernels.layout`): decoded the way the kernels decode it,
every code of every bit-width gives the reference's weight bit for bit, per layer and per row
``n1``, through each dtype's flush edge; weights it cannot hold have no layout."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from inq.codes import decode_weight, pack_codes
from inq.kernels.layout import CHUNK_WORDS, dequantize, kernel_weight

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def every_code(bits: int, rows: int, k: int, seed: int) -> torch.Tensor:
    """``uint8 [rows, k]`` codes: each row starts with every code of ``bits`` (zero included),
    the rest random."""
    top = 1 << (bits - 1)
    gen = torch.Generator().manual_seed(seed)
    codes = torch.randint(top, 2 * top, (rows, k), generator=gen)
    codes[torch.rand(rows, k, generator=gen) < 0.2] = 0
    everything = torch.cat([torch.zeros(1, dtype=torch.int64), torch.arange(top, 2 * top)])
    codes[:, : min(k, everything.numel())] = everything[:k]
    return codes.to(torch.uint8)


def assert_layout_exact(codes: torch.Tensor, bits: int, n1, dtype: torch.dtype) -> None:
    rows, k = codes.shape
    packed = pack_codes(codes, bits)
    layout = kernel_weight(packed, bits, n1, k, dtype)
    assert layout is not None
    per_row_n1 = n1 if isinstance(n1, torch.Tensor) else torch.full((rows,), n1)
    want = torch.cat([
        decode_weight(packed[r : r + 1], bits, int(per_row_n1[r]), (1, k), dtype)
        for r in range(rows)
    ]).float()  # fmt: skip
    got = dequantize(layout)
    chunk = CHUNK_WORDS * layout.per_word
    assert got.shape == (rows, max(1, math.ceil(k / chunk)) * chunk)
    assert torch.equal(got[:, :k], want)  # values: a flushed level's -0.0 is stored as 0.0
    assert not got[:, k:].any()  # padding columns hold the zero code


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bits", range(2, 9))
def test_every_code_and_flush_edge(bits: int, dtype: torch.dtype) -> None:
    """Every code, with ``n1`` through each dtype's subnormal range and flush edge."""
    depth = (1 << (bits - 2)) - 1
    top_n1 = int(math.log2(torch.finfo(dtype).max))
    edges = {-14, -24, -25, -126, -133, -134, -149, -150}
    n1s = sorted({e + d for e in edges for d in (0, 1, depth)} | {0, top_n1, -118})
    codes = every_code(bits, 3, 150, seed=bits)
    for n1 in n1s:
        if n1 > top_n1 or (n1 - 4 < -126 and bits <= 4) or n1 < -200:
            continue
        if kernel_weight(pack_codes(codes, bits), bits, n1, 150, dtype) is None:
            continue  # checked by the next test: only where the layout cannot be exact
        assert_layout_exact(codes, bits, n1, dtype)


def test_no_layout_only_where_it_cannot_be_exact() -> None:
    """fp16 byte codes whose live levels span more than 32 powers (e5m2 holds 32), and a row
    scale below the normal fp32 range, have no layout; the same weights in bf16 have one."""
    codes = every_code(8, 2, 70, seed=0)  # offsets 0 .. 63 in every row
    packed = pack_codes(codes, 8)
    assert kernel_weight(packed, 8, 15, 70, torch.float16) is None  # 2**15 .. 2**-24 live
    assert kernel_weight(packed, 8, -10, 70, torch.float16) is not None  # only 15 live
    assert_layout_exact(codes, 8, 15, torch.bfloat16)
    nibbles = pack_codes(every_code(4, 2, 9, seed=1), 4)
    assert kernel_weight(nibbles, 4, -130, 9, torch.float32) is None  # 2**(n1 - 4) subnormal
    assert kernel_weight(nibbles, 4, -130, 9, torch.float16) is not None  # all flushed to zero


@pytest.mark.parametrize("bits", [3, 4, 6, 8])
def test_per_row_n1(bits: int) -> None:
    codes = every_code(bits, 5, 40, seed=bits)
    n1 = torch.tensor([-3, 0, 2, -20, 7], dtype=torch.int32)
    for dtype in DTYPES:
        assert_layout_exact(codes, bits, n1, dtype)


@settings(max_examples=40)
@given(
    bits=st.integers(2, 8),
    rows=st.integers(1, 4),
    k=st.integers(0, 300),
    n1=st.integers(-30, 8),
    dtype=st.sampled_from(DTYPES),
    seed=st.integers(0, 2**16),
)
def test_any_shape(bits: int, rows: int, k: int, n1: int, dtype, seed: int) -> None:
    """Ragged K (every slot of the last word, chunk boundaries) and empty rows."""
    codes = every_code(bits, rows, k, seed)
    if kernel_weight(pack_codes(codes, bits), bits, n1, k, dtype) is not None:
        assert_layout_exact(codes, bits, n1, dtype)
    else:
        assert dtype == torch.float16 and bits == 8


@pytest.mark.parametrize("bits", [4, 8])
def test_paired_words_are_the_plain_ones_with_halves_traded(bits: int) -> None:
    """fp16/bf16 layouts are paired by default (fp32 and conv layouts plain): word ``2j``
    holds the low halves of the plain words ``2j`` and ``2j + 1``, word ``2j + 1`` their high
    halves; both decode to the same weight."""
    packed = pack_codes(every_code(bits, 3, 300, seed=bits), bits)
    for dtype in (torch.float16, torch.bfloat16):
        paired = kernel_weight(packed, bits, 0, 300, dtype)
        plain = kernel_weight(packed, bits, 0, 300, dtype, paired=False)
        assert paired.paired and not plain.paired
        a, b = (plain.words.to(torch.int64) & 0xFFFFFFFF).view(3, -1, 2).unbind(-1)
        low, high = (paired.words.to(torch.int64) & 0xFFFFFFFF).view(3, -1, 2).unbind(-1)
        assert torch.equal(low, (a & 0xFFFF) | ((b & 0xFFFF) << 16))
        assert torch.equal(high, (a >> 16) | (b & 0xFFFF0000))
        assert torch.equal(dequantize(paired), dequantize(plain))
    assert not kernel_weight(packed, bits, 0, 300, torch.float32).paired
