"""inq.codes: packing codes into rows, decoding them, and which codes are valid."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from inq.codes import code_width, codes_problem, decode_weight, pack_codes, unpack_codes
from inq.pow2 import pow2_decode, pow2_encode, pow2_quantize

shapes = st.lists(st.integers(1, 9), min_size=1, max_size=4).map(tuple)


def valid_codes(shape: tuple[int, ...], bits: int, seed: int) -> torch.Tensor:
    """Random valid ``bits``-bit codes: 0 or top bit set with any sign and offset."""
    g = torch.Generator().manual_seed(seed)
    nonzero = torch.randint(1 << (bits - 1), 1 << bits, shape, generator=g)
    return torch.where(torch.rand(shape, generator=g) < 0.2, 0, nonzero).to(torch.uint8)


@settings(max_examples=60)
@given(bits=st.integers(2, 8), shape=shapes, seed=st.integers(0, 2**16))
def test_pack_unpack_round_trip(bits: int, shape: tuple[int, ...], seed: int) -> None:
    codes = valid_codes(shape, bits, seed)
    packed = pack_codes(codes, bits)
    k = math.prod(shape[1:])
    assert packed.dtype == torch.uint8
    assert packed.shape == (shape[0], math.ceil(k * code_width(bits) / 8))
    assert torch.equal(unpack_codes(packed, bits, k).reshape(shape), codes)


@settings(max_examples=60)
@given(
    bits=st.integers(2, 8),
    shape=shapes,
    seed=st.integers(0, 2**16),
    n1=st.integers(-12, 3),
    dtype=st.sampled_from([torch.float32, torch.float16, torch.bfloat16]),
)
def test_weights_round_trip_bit_for_bit(bits, shape, seed, n1, dtype) -> None:
    g = torch.Generator().manual_seed(seed)
    weight = pow2_quantize(torch.randn(shape, generator=g).mul(2.0**n1).to(dtype), n1, bits)
    packed = pack_codes(pow2_encode(weight, n1, bits), bits)
    decoded = decode_weight(packed, bits, n1, shape, dtype)
    raw = torch.int32 if dtype == torch.float32 else torch.int16  # compare bit patterns
    assert decoded.dtype == dtype and torch.equal(decoded.view(raw), weight.view(raw))


def test_nibble_layout_is_the_contract() -> None:
    # element k in byte k // 2, low nibble for even k; odd rows end in a zero nibble
    codes = torch.tensor([[0x8, 0xB, 0xF], [0x0, 0x9, 0xC]], dtype=torch.uint8)
    assert pack_codes(codes, 4).tolist() == [[0xB8, 0x0F], [0x90, 0x0C]]
    assert torch.equal(pack_codes(codes, 5), codes)  # bytes as they are
    assert pack_codes(codes.reshape(2, 3, 1, 1), 4).shape == (2, 2)  # [O, ...] -> [O, K]


def test_pack_codes_rejects_what_does_not_fit() -> None:
    with pytest.raises(ValueError, match="does not fit in 3 bits"):
        pack_codes(torch.tensor([[8]], dtype=torch.uint8), 3)
    with pytest.raises(ValueError, match="uint8"):
        pack_codes(torch.tensor([[4]]), 3)
    with pytest.raises(ValueError, match=r"uint8 \[O, 2\]"):
        unpack_codes(torch.zeros(2, 3, dtype=torch.uint8), 4, 3)


@pytest.mark.parametrize("bits", range(2, 9))
def test_codes_problem_finds_codes_outside_the_level_set(bits: int) -> None:
    top = 1 << (bits - 1)
    assert codes_problem(torch.tensor([0, top, 2 * top - 1], dtype=torch.uint8), bits) is None
    assert "first: 1 at flat index 1" in codes_problem(
        torch.tensor([0, 1], dtype=torch.uint8), bits
    )
    if bits < 8:
        beyond = torch.tensor([2 * top], dtype=torch.uint8)
        assert codes_problem(beyond, bits) is not None
    # the pow2 decoder agrees on which codes are valid
    for code in range(256):
        c = torch.tensor([code], dtype=torch.uint8)
        try:
            pow2_decode(c, 0, bits)
            valid = True
        except ValueError:
            valid = False
        assert valid == (codes_problem(c, bits) is None)
