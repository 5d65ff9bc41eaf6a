"""The integer reference of ``inq::shift_linear_int8`` (CPU): its definition and its exactness."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from inq.kernels.int8 import (
    exact_frac_bits,
    int8_value,
    max_frac_bits,
    shift_linear_int8,
    shift_linear_int8_reference,
)
from inq.packed import decode_weight, pack_codes


def random_codes(o: int, k: int, bits: int, gen: torch.Generator) -> torch.Tensor:
    top = 1 << (bits - 1)
    codes = torch.randint(top, 2 * top, (o, k), generator=gen, dtype=torch.int64)
    codes[torch.rand(o, k, generator=gen) < 0.25] = 0
    return codes.to(torch.uint8)


def scalar_model(x: list[int], codes: list[int], bits: int, frac: int) -> int:
    """The definition, one Python integer at a time."""
    total = 0
    for xk, c in zip(x, codes, strict=True):
        if c >> (bits - 1):
            v = -xk if (c >> (bits - 2)) & 1 else xk
            total += (v * 2**frac) >> (c & ((1 << (bits - 2)) - 1))  # Python >> floors
    return total


@settings(max_examples=60, deadline=None)
@given(
    bits=st.integers(2, 8),
    o=st.integers(1, 5),
    k=st.integers(1, 40),
    batch=st.integers(1, 3),
    seed=st.integers(0, 2**16),
    data=st.data(),
)
def test_reference_matches_the_definition(bits, o, k, batch, seed, data) -> None:
    gen = torch.Generator().manual_seed(seed)
    codes = random_codes(o, k, bits, gen)
    x = torch.randint(-128, 128, (batch, k), generator=gen, dtype=torch.int8)
    frac = data.draw(st.integers(0, max_frac_bits(k)))
    y = shift_linear_int8(x, pack_codes(codes, bits), bits, k, frac)
    assert y.dtype == torch.int32 and y.shape == (batch, o)
    for b in range(batch):
        for r in range(o):
            assert int(y[b, r]) == scalar_model(x[b].tolist(), codes[r].tolist(), bits, frac)


@pytest.mark.parametrize("bits", [2, 3, 4, 5, 6])
@pytest.mark.parametrize("n1", [-4, 0, 3])
def test_exact_frac_bits_give_the_float_result_exactly(bits: int, n1: int) -> None:
    """With frac_bits = the largest offset every shift is a left shift: y * 2**(n1 - frac)
    equals x @ W.T computed in float64 (exact here: integers times powers of two, 53 bits)."""
    gen = torch.Generator().manual_seed(bits)
    k = 300 if bits <= 5 else 64  # bits 6: frac 15, K * 2**22 < 2**31
    codes = random_codes(7, k, bits, gen)
    packed = pack_codes(codes, bits)
    x = torch.randint(-128, 128, (4, k), generator=gen, dtype=torch.int8)
    frac = exact_frac_bits(bits)
    y = shift_linear_int8(x, packed, bits, k, frac)
    w = decode_weight(packed, bits, n1, (7, k), torch.float64)
    assert torch.equal(int8_value(y, n1, frac), x.double() @ w.T)


def test_truncating_shift_floors_negative_terms() -> None:
    codes = torch.tensor([[13]], dtype=torch.uint8)  # 4 bits: -2**(n1 - 1)
    x = torch.tensor([[3]], dtype=torch.int8)
    # -(3 * 2**0) >> 1 = floor(-1.5) = -2, not -1 (truncation toward zero)
    assert shift_linear_int8(x, pack_codes(codes, 4), 4, 1, 0).item() == -2


def test_batch_dims_and_reference_agree() -> None:
    gen = torch.Generator().manual_seed(0)
    packed = pack_codes(random_codes(6, 10, 5, gen), 5)
    x = torch.randint(-128, 128, (2, 3, 10), generator=gen, dtype=torch.int8)
    y = torch.ops.inq.shift_linear_int8(x, packed, 5, 10, 7)
    assert y.shape == (2, 3, 6)
    flat = shift_linear_int8_reference(x.reshape(6, 10), packed, 5, 10, 7)
    assert torch.equal(y.reshape(6, 6), flat)


def test_frac_bits_limits() -> None:
    assert exact_frac_bits(2) == 0 and exact_frac_bits(8) == 63
    assert max_frac_bits(1) == 23
    k = 4096
    assert k << (7 + max_frac_bits(k)) < 2**31 <= k << (8 + max_frac_bits(k))
    with pytest.raises(ValueError, match="in_features"):
        max_frac_bits(2**24)


@pytest.mark.parametrize(
    ("x", "frac", "match"),
    [
        (torch.zeros(1, 4, dtype=torch.int16), 0, "int8"),
        (torch.zeros(1, 3, dtype=torch.int8), 0, "features"),
        (torch.zeros(1, 4, dtype=torch.int8), 30, "overflow"),
        (torch.zeros(1, 4, dtype=torch.int8), -1, "overflow"),
    ],
)
def test_bad_arguments_are_clear_errors(x: torch.Tensor, frac: int, match: str) -> None:
    packed = pack_codes(torch.zeros(2, 4, dtype=torch.uint8), 4)
    with pytest.raises(ValueError, match=match):
        shift_linear_int8(x, packed, 4, 4, frac)
