"""The int8 tensor cores' weight layout (:mod:`inq.kernels.int8_layout`): the parts add up to
the integer weight of every term bit for bit, in ``(kh, kw, c)`` order (few channels padded
with zeros to flat steps); layers whose terms floor, or that need three parts, have none; the
cache follows in-place changes."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from inq.codes import pack_codes, row_bytes
from inq.kernels.int8_layout import (
    FLAT_BLOCK_K,
    MAX_PARTS,
    PART_SHIFT,
    cached_int8_weight,
    flat_columns,
    int8_weight,
)


def integer_weight(codes: torch.Tensor, bits: int, frac: int) -> torch.Tensor:
    """int64 ``[O, K]``: ``(-1)**s * 2**(frac - o)`` per live code, 0 for code 0 (the
    definition; every offset at most ``frac``)."""
    c = codes.to(torch.int64)
    live = (c >> (bits - 1)) != 0
    sign = 1 - 2 * ((c >> (bits - 2)) & 1)
    offset = c & ((1 << (bits - 2)) - 1)
    return torch.where(live, sign * (1 << (frac - offset).clamp(min=0)), 0)


def tap_columns(parts: torch.Tensor, channels: int, taps: int) -> torch.Tensor:
    """``parts [P, O, columns]`` as ``[P, O, taps * channels]``: a flat layout's padding (its
    channels to a power of two, its rows to whole steps) dropped, after checking it is zero."""
    flat = flat_columns(channels, taps)
    if flat is None:
        return parts
    padded, columns = flat
    assert parts.shape[-1] == columns and columns % FLAT_BLOCK_K == 0
    assert not parts[..., taps * padded :].any()
    by_tap = parts[..., : taps * padded].reshape(*parts.shape[:-1], taps, padded)
    assert not by_tap[..., channels:].any()
    return by_tap[..., :channels].reshape(*parts.shape[:-1], taps * channels)


@settings(max_examples=60)
@given(
    bits=st.integers(2, 8),
    rows=st.integers(1, 9),
    channels=st.integers(1, 7),
    taps=st.sampled_from([1, 2, 9]),
    seed=st.integers(0, 2**16),
    data=st.data(),
)
def test_parts_add_up_to_the_integer_weight(bits, rows, channels, taps, seed, data) -> None:
    k, top = channels * taps, (1 << (bits - 2)) - 1
    frac = data.draw(st.integers(0, min(top, 2 * PART_SHIFT - 1)))
    gen = torch.Generator().manual_seed(seed)
    offsets = torch.randint(0, frac + 1, (rows, k), generator=gen)
    signs = torch.randint(0, 2, (rows, k), generator=gen)
    codes = (1 << (bits - 1)) | (signs << (bits - 2)) | offsets
    codes[torch.rand(rows, k, generator=gen) < 0.3] = 0
    weight = int8_weight(pack_codes(codes.to(torch.uint8), bits), bits, k, frac, taps)
    want = integer_weight(codes, bits, frac)
    assert weight is not None and weight.parts.dtype == torch.int8
    parts = tap_columns(weight.parts.to(torch.int64), channels, taps)
    total = sum(parts[p] << (PART_SHIFT * p) for p in range(parts.shape[0]))  # [O, K]
    tap_major = want.view(rows, channels, taps).transpose(1, 2).reshape(rows, k)
    assert torch.equal(total, tap_major)
    top_exponent = int(want.abs().max()).bit_length() - 1 if bool(want.any()) else 0
    assert parts.shape[0] == top_exponent // PART_SHIFT + 1
    assert torch.equal(weight.row_sum.to(torch.int64), want.sum(dim=1))


def test_weights_of_128_take_a_second_part() -> None:
    codes = torch.tensor([[16, 23, 31, 0]], dtype=torch.uint8)  # 5 bits: +2**7, +1, -1 (frac 7)
    weight = int8_weight(pack_codes(codes, 5), 5, 4, frac_bits=7, taps=1)
    assert weight is not None and weight.parts.shape[0] == 2
    assert tap_columns(weight.parts, 4, 1)[:, 0].tolist() == [[0, 1, -1, 0], [1, 0, 0, 0]]
    assert weight.row_sum.tolist() == [128]


def test_no_layout_where_a_term_floors_or_three_parts() -> None:
    codes = torch.tensor([[9, 8]], dtype=torch.uint8)  # 4 bits: offsets 1 and 0
    assert int8_weight(pack_codes(codes, 4), 4, 2, frac_bits=0, taps=1) is None  # 1 > frac
    wide = torch.tensor([[128 | 20, 128]], dtype=torch.uint8)  # 8 bits: offsets 20 and 0
    assert int8_weight(pack_codes(wide, 8), 8, 2, frac_bits=20, taps=1) is None
    assert MAX_PARTS * PART_SHIFT <= 20


def test_cache_follows_in_place_changes() -> None:
    packed = pack_codes(torch.tensor([[8, 13]], dtype=torch.uint8), 4)
    first = cached_int8_weight(packed, 4, 2, 3, 1)
    assert first is cached_int8_weight(packed, 4, 2, 3, 1)
    assert first is not cached_int8_weight(packed, 4, 2, 2, 1)  # another frac
    packed.fill_(0x99)
    again = cached_int8_weight(packed, 4, 2, 3, 1)
    assert again is not first and tap_columns(again.parts, 2, 1)[0, 0].tolist() == [4, 4]


@pytest.mark.parametrize("bits", [4, 5])
def test_empty_weight(bits: int) -> None:
    weight = int8_weight(torch.zeros(0, row_bytes(2, bits), dtype=torch.uint8), bits, 2, 1, 1)
    assert weight is not None and weight.parts.shape == (1, 0, FLAT_BLOCK_K)


def test_cache_takes_inference_tensors() -> None:
    """Inference tensors have no version counter: the layout is made once for them."""
    with torch.inference_mode():
        packed = pack_codes(torch.tensor([[8, 13]], dtype=torch.uint8), 4)
        assert cached_int8_weight(packed, 4, 2, 3, 1) is cached_int8_weight(packed, 4, 2, 3, 1)
