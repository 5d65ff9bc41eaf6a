"""Sparse code storage (inq.sparse): bit packing, bitmap and gap layouts, choice, validation."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from helpers import random_codes
from hypothesis import given, settings
from hypothesis import strategies as st

from inq.sparse import SparseCodes, decode_sparse, encode_sparse, pack_bits, unpack_bits

ALL_BITS = tuple(range(2, 9))
CANDIDATES = (("bitmap", None), *(("gaps", g) for g in range(2, 9)))  # in tie-break order

# ---------------------------------------------------------------- references (plain Python)


def reference_pack(values: list[int], width: int) -> list[int]:
    """The bit stream as one little-endian integer: field i at bits i*width .. i*width+width-1."""
    stream = sum(v << (i * width) for i, v in enumerate(values))
    return list(stream.to_bytes((len(values) * width + 7) // 8, "little"))


def reference_symbols(codes: list[int], g: int) -> list[int]:
    """Gap symbols written one by one: escapes M for each full M zeros, then the remainder."""
    escape, symbols, run = 2**g - 1, [], 0
    for code in codes:
        if code == 0:
            run += 1
            continue
        symbols += [escape] * (run // escape) + [run % escape]
        run = 0
    return symbols


def reference_encoding(codes: list[int], bits: int, layout: str, g: int | None) -> dict:
    """Bytes and counts of one candidate encoding, independent of inq.sparse."""
    top = 2 ** (bits - 1)
    nonzero = [c for c in codes if c]
    out = {"values": reference_pack([c - top for c in nonzero], bits - 1), "nonzero": len(nonzero)}
    if layout == "bitmap":
        return {**out, "index": reference_pack([int(c != 0) for c in codes], 1), "symbols": 0}
    symbols = reference_symbols(codes, g)
    return {**out, "index": reference_pack(symbols, g), "symbols": len(symbols)}


def codes_from_runs(bits: int, runs: list[int], tail: int, seed: int) -> torch.Tensor:
    """Non-zero codes separated by zero runs ``runs`` (before each one), then ``tail`` zeros."""
    gen = torch.Generator().manual_seed(seed)
    levels = torch.randint(2 ** (bits - 1), 2**bits, (len(runs),), generator=gen).tolist()
    flat = [c for run, level in zip(runs, levels, strict=True) for c in [0] * run + [level]]
    return torch.tensor(flat + [0] * tail, dtype=torch.uint8)


def check_encoding(codes: torch.Tensor, bits: int) -> SparseCodes:
    """Round trip, every candidate against the reference, and the choice of the smallest."""
    numel, as_list = codes.numel(), codes.flatten().tolist()
    sizes = []
    for layout, g in CANDIDATES:
        forced = encode_sparse(codes, bits, layout=layout, gap_bits=g)
        expected = reference_encoding(as_list, bits, layout, g)
        assert (forced.layout, forced.gap_bits) == (layout, g or 0)
        assert forced.values.tolist() == expected["values"]
        assert forced.index.tolist() == expected["index"]
        assert (forced.nonzero, forced.symbols) == (expected["nonzero"], expected["symbols"])
        assert forced.nbytes == len(expected["values"]) + len(expected["index"])
        assert torch.equal(decode_sparse(forced, bits, numel), codes.flatten())
        sizes.append(forced.nbytes)
    chosen = encode_sparse(codes, bits)
    best = sizes.index(min(sizes))  # the first of equal sizes: bitmap, then the smaller g
    assert (chosen.layout, chosen.gap_bits) == (CANDIDATES[best][0], CANDIDATES[best][1] or 0)
    assert chosen.nbytes == min(sizes)
    decoded = decode_sparse(chosen, bits, numel)
    assert decoded.dtype == torch.uint8 and torch.equal(decoded, codes.flatten())
    return chosen


# ---------------------------------------------------------------- pack_bits / unpack_bits


@pytest.mark.parametrize("width", range(1, 9))
def test_pack_round_trip_every_width_and_length(width: int) -> None:
    gen = torch.Generator().manual_seed(width)
    for n in [*range(18), 31, 32, 33, 63, 64, 65]:
        values = torch.randint(0, 2**width, (n,), generator=gen)
        packed = pack_bits(values, width)
        assert packed.dtype == torch.uint8 and packed.shape == ((n * width + 7) // 8,)
        assert packed.tolist() == reference_pack(values.tolist(), width)
        assert torch.equal(unpack_bits(packed, width, n), values.to(torch.uint8))


def test_pack_bit_order_by_hand() -> None:
    # 5 = 101b -> stream bits 0..2 = 1,0,1; 2 = 010b -> bits 3..5 = 0,1,0; 7 -> bits 6..8 = 1,1,1
    packed = pack_bits(torch.tensor([5, 2, 7], dtype=torch.uint8), 3)
    assert packed.tolist() == [0b11010101, 0b00000001]
    assert pack_bits(torch.tensor([1, 0, 0, 1, 1, 0, 0, 0, 1]), 1).tolist() == [0b00011001, 1]
    assert pack_bits(torch.tensor([0xAB, 7]), 8).tolist() == [0xAB, 7]
    assert pack_bits(torch.tensor([], dtype=torch.int64), 5).tolist() == []


@pytest.mark.parametrize(
    ("values", "width", "match"),
    [
        (torch.tensor([1]), 0, "width"),
        (torch.tensor([1]), 9, "width"),
        (torch.tensor([1]), True, "width"),
        (torch.tensor([1.0]), 4, "integer tensor"),
        (torch.tensor([True]), 1, "integer tensor"),
        (torch.tensor([[1]]), 4, "1-D"),
        (torch.tensor([0, 16]), 4, "do not fit in 4 bits"),
        (torch.tensor([-1, 2], dtype=torch.int8), 4, "do not fit"),
        (torch.tensor([256]), 8, "do not fit"),
    ],
)
def test_pack_bits_rejects(values: torch.Tensor, width: int, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        pack_bits(values, width)


@pytest.mark.parametrize(
    ("data", "width", "count", "match"),
    [
        (torch.tensor([0, 0], dtype=torch.uint8), 3, 2, r"expected uint8 \[1\]"),
        (torch.tensor([0, 0], dtype=torch.uint8), 3, 6, r"expected uint8 \[3\]"),
        (torch.tensor([0, 0], dtype=torch.int16), 3, 4, "expected uint8"),
        (torch.zeros(1, 2, dtype=torch.uint8), 3, 4, "expected uint8"),
        (torch.tensor([0, 0b10000000], dtype=torch.uint8), 3, 5, "padding"),
        (torch.tensor([0b00010000], dtype=torch.uint8), 1, 4, "padding"),
        (torch.tensor([0], dtype=torch.uint8), 9, 1, "width"),
        (torch.tensor([0], dtype=torch.uint8), 1, -1, "count"),
    ],
)
def test_unpack_bits_rejects(data: torch.Tensor, width: int, count: int, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        unpack_bits(data, width, count)


# ---------------------------------------------------------------- encode / decode


@settings(max_examples=60)
@given(
    bits=st.sampled_from(ALL_BITS),
    numel=st.integers(0, 3000),
    density=st.sampled_from([0.0, 0.001, 0.01, 0.05, 0.1, 0.3, 0.5, 0.9, 1.0]) | st.floats(0, 1),
    seed=st.integers(0, 2**31),
)
def test_round_trip_and_smallest_choice(bits: int, numel: int, density: float, seed: int) -> None:
    check_encoding(random_codes(1, numel, bits, seed, zeros=1 - density)[0], bits)


@settings(max_examples=60)
@given(
    bits=st.sampled_from(ALL_BITS),
    runs=st.lists(st.integers(0, 800) | st.sampled_from([3, 6, 7, 14, 15, 255, 510]), max_size=12),
    tail=st.integers(0, 800),
    seed=st.integers(0, 2**31),
)
def test_round_trip_with_long_zero_runs(bits: int, runs: list[int], tail: int, seed: int) -> None:
    check_encoding(codes_from_runs(bits, runs, tail, seed), bits)


def test_escapes_for_long_runs_and_zeros_at_both_ends() -> None:
    # 1000 leading zeros, then runs of exactly M, 2M and M - 1 at g = 2 (M = 3), 5000 trailing
    codes = codes_from_runs(4, [1000, 3, 6, 2, 0], tail=5000, seed=0)
    sparse = encode_sparse(codes, 4, layout="gaps", gap_bits=2)
    symbols = unpack_bits(sparse.index, 2, sparse.symbols).tolist()
    assert symbols == [3] * 333 + [1] + [3, 0] + [3, 3, 0] + [2] + [0]
    assert sparse.nonzero == 5 and sparse.symbols == 333 + 1 + 2 + 3 + 2
    assert torch.equal(decode_sparse(sparse, 4, codes.numel()), codes)
    chosen = check_encoding(codes, 4)
    assert chosen.layout == "gaps" and chosen.nbytes < (codes.numel() + 7) // 8


def test_all_zero_and_dense_layers() -> None:
    zeros = torch.zeros(5, 7, dtype=torch.uint8)
    sparse = check_encoding(zeros, 3)
    assert (sparse.layout, sparse.gap_bits, sparse.nbytes, sparse.nonzero) == ("gaps", 2, 0, 0)
    assert check_encoding(torch.zeros(0, dtype=torch.uint8), 5).layout == "bitmap"  # tie at 0
    dense = torch.full((40,), 200, dtype=torch.uint8)
    sparse = check_encoding(dense, 8)
    assert (sparse.layout, sparse.index.tolist()) == ("bitmap", [255] * 5)
    assert sparse.values.tolist() == reference_pack([200 - 128] * 40, 7)


def test_hand_example_exact_bytes() -> None:
    # bits = 3 (top bit 4): non-zeros 5, 7, 4 at flat 1, 4, 12 of 30; stored values 1, 3, 0
    codes = torch.zeros(30, dtype=torch.uint8)
    codes[[1, 4, 12]] = torch.tensor([5, 7, 4], dtype=torch.uint8)
    codes = codes.reshape(5, 6)  # taken flat, row-major
    # values at 2 bits: 01 | 11 << 2 | 00 << 4 = 0b001101
    bitmap = encode_sparse(codes, 3, layout="bitmap")
    assert bitmap.values.tolist() == [0b00001101]
    assert bitmap.index.tolist() == [0b00010010, 0b00010000, 0, 0]  # bits 1, 4 and 12
    assert (bitmap.nonzero, bitmap.gap_bits, bitmap.symbols, bitmap.nbytes) == (3, 0, 0, 5)
    # gaps z = 1, 2, 7; g = 2, M = 3: symbols 1 | 2 | 3 3 1 (7 = 2 * 3 + 1), trailing zeros dropped
    gaps = encode_sparse(codes, 3, layout="gaps", gap_bits=2)
    assert gaps.index.tolist() == [0b11111001, 0b00000001]
    assert (gaps.nonzero, gaps.gap_bits, gaps.symbols, gaps.nbytes) == (3, 2, 5, 3)
    # g = 3, M = 7: symbols 1 | 2 | 7 0 -> 12 bits, also 2 bytes: the tie goes to g = 2
    assert encode_sparse(codes, 3, gap_bits=3).index.tolist() == [0b11010001, 0b00000001]
    chosen = encode_sparse(codes, 3)
    assert (chosen.layout, chosen.gap_bits, chosen.index.tolist()) == ("gaps", 2, [249, 1])
    assert torch.equal(decode_sparse(chosen, 3, 30), codes.flatten())
    # at 16 codes the bitmap is 2 bytes too, and wins the tie
    assert encode_sparse(codes.flatten()[:16], 3).layout == "bitmap"


@pytest.mark.parametrize(
    ("codes", "bits", "kwargs", "match"),
    [
        (torch.tensor([0, 4], dtype=torch.int64), 3, {}, "uint8"),
        (torch.tensor([0, 1], dtype=torch.uint8), 3, {}, "first: 1 at flat index 1"),
        (torch.tensor([8, 0], dtype=torch.uint8), 3, {}, "outside the 3-bit level set"),
        (torch.tensor([127], dtype=torch.uint8), 8, {}, "valid: 0 and 128..255"),
        (torch.tensor([0], dtype=torch.uint8), 9, {}, "bits"),
        (torch.tensor([0], dtype=torch.uint8), 3, {"layout": "rle"}, "no encoding"),
        (torch.tensor([0], dtype=torch.uint8), 3, {"layout": "bitmap", "gap_bits": 3}, "no enc"),
        (torch.tensor([0], dtype=torch.uint8), 3, {"gap_bits": 9}, "no encoding"),
    ],
)
def test_encode_rejects(codes: torch.Tensor, bits: int, kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        encode_sparse(codes, bits, **kwargs)


# ---------------------------------------------------------------- tampering

CODES = torch.tensor([0, 5, 0, 0, 7] + [0] * 7 + [4] + [0] * 17, dtype=torch.uint8)  # 30 codes
BITMAP = encode_sparse(CODES, 3, layout="bitmap")  # values [13], index [18, 16, 0, 0]
GAPS = encode_sparse(CODES, 3, layout="gaps", gap_bits=2)  # index [249, 1]: symbols 1 2 3 3 1
U8 = torch.uint8
TRAILING_ESCAPE = dataclasses.replace(GAPS, index=torch.tensor([249, 13], dtype=U8), symbols=6)


@pytest.mark.parametrize(
    ("sparse", "numel", "match"),
    [
        (dataclasses.replace(GAPS, layout="rle"), 30, "unknown sparse layout 'rle'"),
        (dataclasses.replace(BITMAP, layout=None), 30, "unknown sparse layout"),
        (dataclasses.replace(BITMAP, values=torch.tensor([13, 0], dtype=U8)), 30, "values"),
        (dataclasses.replace(GAPS, values=torch.tensor([], dtype=U8)), 30, r"uint8 \[1\]"),
        (dataclasses.replace(GAPS, values=torch.tensor([13], dtype=torch.int8)), 30, "uint8"),
        (dataclasses.replace(GAPS, values=[13]), 30, "values"),
        (dataclasses.replace(BITMAP, index=BITMAP.index[:3]), 30, r"bitmap index.*uint8 \[4\]"),
        (dataclasses.replace(GAPS, index=torch.tensor([249, 1, 0], dtype=U8)), 30, "gaps index"),
        (dataclasses.replace(GAPS, symbols=9), 30, r"uint8 \[3\]"),
        (BITMAP, 24, r"bitmap index.*uint8 \[3\]"),  # bitmap length follows numel
        (dataclasses.replace(BITMAP, index=torch.tensor([18, 16, 0, 64], dtype=U8)), 30, "beyond"),
        (dataclasses.replace(BITMAP, index=torch.tensor([19, 16, 0, 0], dtype=U8)), 30, "4 bits"),
        (dataclasses.replace(BITMAP, nonzero=2), 30, "3 bits set but nonzero = 2"),
        (dataclasses.replace(BITMAP, values=torch.tensor([13])), 30, "values.*int64"),
        (dataclasses.replace(GAPS, index=torch.tensor([251, 1], dtype=U8)), 30, "2 value symbols"),
        (TRAILING_ESCAPE, 30, "end with an escape symbol"),
        (dataclasses.replace(GAPS, index=torch.tensor([249, 2], dtype=U8)), 13, "position 13"),
        (GAPS, 12, "position 12 >= 12"),
        (dataclasses.replace(GAPS, gap_bits=1), 30, "gap_bits"),
        (dataclasses.replace(GAPS, gap_bits=9), 30, "gap_bits"),
        (dataclasses.replace(GAPS, gap_bits=2.0), 30, "gap_bits"),
        (dataclasses.replace(BITMAP, gap_bits=2), 30, "bitmap has gap_bits"),
        (dataclasses.replace(BITMAP, symbols=5), 30, "bitmap has gap_bits"),
        (dataclasses.replace(GAPS, symbols=-1), 30, "symbols"),
        (GAPS, 2, "nonzero must be an integer from 0 to 2, got 3"),
        (dataclasses.replace(GAPS, nonzero=-1), 30, "nonzero"),
        (dataclasses.replace(GAPS, values=torch.tensor([13 | 64], dtype=U8)), 30, "padding"),
        (dataclasses.replace(GAPS, index=torch.tensor([249, 1 | 128], dtype=U8)), 30, "padding"),
        (GAPS, -1, "numel"),
    ],
)
def test_decode_rejects_tampering(sparse: SparseCodes, numel: int, match: str) -> None:
    assert torch.equal(decode_sparse(BITMAP, 3, 30), CODES)  # the originals are fine
    assert torch.equal(decode_sparse(GAPS, 3, 30), CODES)
    with pytest.raises(ValueError, match=match):
        decode_sparse(sparse, 3, numel)


@settings(max_examples=60)
@given(
    bits=st.sampled_from(ALL_BITS),
    numel=st.integers(1, 400),
    density=st.sampled_from([0.0, 0.02, 0.2, 0.8]),
    seed=st.integers(0, 2**31),
    candidate=st.sampled_from(CANDIDATES),
    field=st.sampled_from(["index", "values", "nonzero", "symbols", "numel"]),
    where=st.integers(0, 10**6),
    delta=st.sampled_from([-2, -1, 1, 2]),
)
def test_tampered_input_is_rejected_or_canonical(
    bits: int,
    numel: int,
    density: float,
    seed: int,
    candidate: tuple[str, int | None],
    field: str,
    where: int,
    delta: int,
) -> None:
    """A flipped bit or a changed count gives a ValueError, or (when still consistent) a valid
    layer whose encoding is exactly the input: never an IndexError or an off-level code."""
    codes = random_codes(1, numel, bits, seed, zeros=1 - density)[0]
    sparse = encode_sparse(codes, bits, layout=candidate[0], gap_bits=candidate[1])
    if field in ("index", "values"):
        data = getattr(sparse, field).clone()
        if data.numel() == 0:
            return
        data[where % data.numel()] ^= 1 << (where % 8)
        sparse = dataclasses.replace(sparse, **{field: data})
    elif field == "numel":
        numel += delta
    else:
        sparse = dataclasses.replace(sparse, **{field: getattr(sparse, field) + delta})
    try:
        decoded = decode_sparse(sparse, bits, numel)
    except ValueError:
        return
    assert decoded.dtype == torch.uint8 and decoded.shape == (numel,)
    again = encode_sparse(decoded, bits, layout=sparse.layout, gap_bits=sparse.gap_bits or None)
    assert (again.nonzero, again.symbols) == (sparse.nonzero, sparse.symbols)
    assert torch.equal(again.values, sparse.values) and torch.equal(again.index, sparse.index)
