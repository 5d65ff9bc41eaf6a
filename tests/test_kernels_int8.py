"""The integer references of ``inq::shift_linear_int8`` and ``inq::shift_conv2d_int8`` (CPU):
their definition, int8 and uint8, the float64 and int64 paths, and their refusals."""

from __future__ import annotations

import pytest
import torch
from helpers import random_codes
from hypothesis import given, settings
from hypothesis import strategies as st

from inq.codes import decode_weight, pack_codes
from inq.kernels import int8 as int8_module
from inq.kernels.int8 import (
    exact_frac_bits,
    int8_value,
    max_frac_bits,
    shift_conv2d_int8_reference,
    shift_linear_int8,
    shift_linear_int8_reference,
)


def scalar_model(x: list[int], codes: list[int], bits: int, frac: int) -> int:
    """The definition, one Python integer at a time."""
    total = 0
    for xk, c in zip(x, codes, strict=True):
        if c >> (bits - 1):
            v = -xk if (c >> (bits - 2)) & 1 else xk
            total += (v * 2**frac) >> (c & ((1 << (bits - 2)) - 1))  # Python >> floors
    return total


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


# ---------------------------------------------------------------------------------- uint8


def random_x(shape: tuple[int, ...], dtype: torch.dtype, gen: torch.Generator) -> torch.Tensor:
    """Activations over the whole range of ``dtype`` (int8 or uint8)."""
    low, high = (0, 256) if dtype == torch.uint8 else (-128, 128)
    return torch.randint(low, high, shape, generator=gen, dtype=torch.int64).to(dtype)


@pytest.mark.parametrize("dtype", [torch.int8, torch.uint8])
@settings(max_examples=60)
@given(
    bits=st.integers(2, 8),
    o=st.integers(1, 5),
    k=st.integers(1, 40),
    batch=st.integers(1, 3),
    seed=st.integers(0, 2**16),
    data=st.data(),
)
def test_reference_matches_the_definition(dtype, bits, o, k, batch, seed, data) -> None:
    gen = torch.Generator().manual_seed(seed)
    codes = random_codes(o, k, bits, gen)
    x = random_x((batch, k), dtype, gen)
    frac = data.draw(st.integers(0, max_frac_bits(k, unsigned=dtype == torch.uint8)))
    packed = pack_codes(codes, bits)
    expected = [[scalar_model(x[b].tolist(), codes[r].tolist(), bits, frac) for r in range(o)]
                for b in range(batch)]  # fmt: skip
    for method in ("auto", "int64"):
        y = shift_linear_int8_reference(x, packed, bits, k, frac, method)
        assert y.dtype == torch.int32 and y.shape == (batch, o)
        assert y.tolist() == expected
    assert shift_linear_int8(x, packed, bits, k, frac).tolist() == expected  # the op


def test_uint8_is_not_sign_extended() -> None:
    """200 as uint8 is 200, not -56 (its int8 bit pattern)."""
    packed = pack_codes(torch.tensor([[8, 13]], dtype=torch.uint8), 4)  # [1, -1/2]
    x = torch.tensor([[200, 255]], dtype=torch.uint8)
    for method in ("auto", "int64"):
        y = shift_linear_int8_reference(x, packed, 4, 2, 1, method)
        assert y.item() == 400 - 255  # (200 << 1) + ((-255 << 1) >> 1)


@pytest.mark.parametrize("k", [1, 2, 3, 9, 144, 1000, 3000, 4096, 8_421_504])
def test_uint8_frac_limit_is_tight(k: int) -> None:
    """The largest frac with K * 255 * 2**frac < 2**31, at most one below the int8 limit."""
    frac = max_frac_bits(k, unsigned=True)
    assert k * 255 << frac < 2**31 <= k * 255 << (frac + 1)
    if k < 2**24:
        assert max_frac_bits(k) - frac in (0, 1)
    assert max_frac_bits(3000) == 12 and max_frac_bits(3000, unsigned=True) == 11
    with pytest.raises(ValueError, match="in_features"):
        max_frac_bits(8_421_505, unsigned=True)  # 255 * K >= 2**31 even at frac 0
    with pytest.raises(ValueError, match="in_features"):
        max_frac_bits(0, unsigned=True)


@pytest.mark.parametrize("dtype", [torch.int8, torch.uint8])
@pytest.mark.parametrize("k", [1, 3, 100])
def test_extreme_sums_at_the_frac_limit_fit_int32(dtype: torch.dtype, k: int) -> None:
    """The largest |x| (-128 negated, 255) times the top level, K times, at the largest frac:
    the reference's int32 result is the exact integer, both signs."""
    frac = max_frac_bits(k, unsigned=dtype == torch.uint8)
    m = 255 if dtype == torch.uint8 else -128
    x = torch.full((1, k), m, dtype=dtype)
    codes = torch.tensor([[8] * k, [12] * k], dtype=torch.uint8)  # 4 bits: +1, -1
    for method in ("float64", "int64"):
        y = shift_linear_int8_reference(x, pack_codes(codes, 4), 4, k, frac, method)
        assert y.tolist() == [[k * m << frac, -(k * m << frac)]]
        assert abs(k * m << frac) < 2**31


def test_uint8_limit_is_refused_where_int8_is_allowed() -> None:
    packed = pack_codes(torch.zeros(2, 3, dtype=torch.uint8), 4)
    assert max_frac_bits(3) == 22 and max_frac_bits(3, unsigned=True) == 21
    shift_linear_int8(torch.zeros(1, 3, dtype=torch.int8), packed, 4, 3, 22)
    with pytest.raises(ValueError, match=r"overflow int32 with 3 terms of torch\.uint8.*0\.\.21"):
        shift_linear_int8(torch.zeros(1, 3, dtype=torch.uint8), packed, 4, 3, 22)


# ---------------------------------------------------------------------------------- two paths


@pytest.mark.parametrize("dtype", [torch.int8, torch.uint8])
@pytest.mark.parametrize("bits", [2, 3, 5, 6, 8])
def test_linear_float64_and_int64_paths_agree(dtype: torch.dtype, bits: int) -> None:
    """Both paths bit for bit from frac 0 (most terms floor; at 8 bits shifts up to 63) to the
    limit (at 5 bits past every offset: one product)."""
    gen = torch.Generator().manual_seed(bits)
    k = 200
    packed = pack_codes(random_codes(33, k, bits, gen), bits)
    x = random_x((17, k), dtype, gen)
    x[0], x[1] = (255 if dtype == torch.uint8 else -128), 0  # the extremes
    limit = max_frac_bits(k, unsigned=dtype == torch.uint8)
    middle = min(exact_frac_bits(bits), limit)
    for frac in sorted({0, 1, middle // 2, middle, limit}):
        fast = shift_linear_int8_reference(x, packed, bits, k, frac, "float64")
        assert torch.equal(fast, shift_linear_int8_reference(x, packed, bits, k, frac, "int64"))
        assert torch.equal(fast, shift_linear_int8_reference(x, packed, bits, k, frac))


def test_float64_path_floors_and_bad_methods_are_refused() -> None:
    packed = pack_codes(torch.tensor([[8, 11, 15]], dtype=torch.uint8), 4)  # 1, 1/8, -1/8
    x = torch.tensor([[1, 9, 9]], dtype=torch.int8)
    # frac 2: 4 + floor(36 / 8) + floor(-36 / 8) = 4 + 4 - 5
    for method in ("float64", "int64"):
        assert shift_linear_int8_reference(x, packed, 4, 3, 2, method).item() == 3
    with pytest.raises(ValueError, match="method"):
        shift_linear_int8_reference(x, packed, 4, 3, 3, "float32")  # type: ignore[arg-type]


@pytest.mark.parametrize("dtype", [torch.int8, torch.uint8])
def test_both_paths_floor_every_term(dtype: torch.dtype) -> None:
    """frac 0 with offsets up to 7: most terms floor (negative ones away from zero)."""
    gen = torch.Generator().manual_seed(7)
    codes = random_codes(6, 30, 5, gen)
    x = random_x((4, 30), dtype, gen)
    expected = [[scalar_model(x[b].tolist(), codes[r].tolist(), 5, 0) for r in range(6)]
                for b in range(4)]  # fmt: skip
    for method in ("int64", "float64"):
        y = shift_linear_int8_reference(x, pack_codes(codes, 5), 5, 30, 0, method)
        assert y.tolist() == expected
    truncated = [[_truncating_model(x[b].tolist(), codes[r].tolist(), 5) for r in range(6)]
                 for b in range(4)]  # fmt: skip
    assert expected != truncated  # the case does reach floors that truncation would miss


def _truncating_model(x: list[int], codes: list[int], bits: int) -> int:
    total = 0
    for xk, c in zip(x, codes, strict=True):
        if c >> (bits - 1):
            v = -xk if (c >> (bits - 2)) & 1 else xk
            total += int(v / 2 ** (c & ((1 << (bits - 2)) - 1)))  # rounds toward zero
    return total


# ---------------------------------------------------------------------------------- conv2d


def conv_scalar_model(
    x: torch.Tensor,
    codes: torch.Tensor,
    bits: int,
    weight_shape: list[int],
    stride: list[int],
    padding: list[int],
    dilation: list[int],
    groups: int,
    frac: int,
) -> torch.Tensor:
    """The conv definition, one output and one Python integer at a time (tiny inputs only)."""
    o, cg, kh, kw = weight_shape
    n, _, h, w = x.shape
    oh = (h + 2 * padding[0] - dilation[0] * (kh - 1) - 1) // stride[0] + 1
    ow = (w + 2 * padding[1] - dilation[1] * (kw - 1) - 1) // stride[1] + 1
    xs, cs = x.tolist(), codes.tolist()
    out = torch.zeros(n, o, oh, ow, dtype=torch.int64)
    for b in range(n):
        for oc in range(o):
            g = oc // (o // groups)
            for i in range(oh):
                for j in range(ow):
                    inputs, row = [], []
                    for c in range(cg):
                        for r in range(kh):
                            for s in range(kw):
                                ih = i * stride[0] - padding[0] + r * dilation[0]
                                iw = j * stride[1] - padding[1] + s * dilation[1]
                                inside = 0 <= ih < h and 0 <= iw < w
                                inputs.append(xs[b][g * cg + c][ih][iw] if inside else 0)
                                row.append(cs[oc][(c * kh + r) * kw + s])
                    out[b, oc, i, j] = scalar_model(inputs, row, bits, frac)
    return out.to(torch.int32)


@settings(max_examples=40)
@given(
    bits=st.integers(2, 8),
    unsigned=st.booleans(),
    batch=st.integers(1, 2),
    cin_per_group=st.integers(1, 3),
    out_per_group=st.integers(1, 3),
    groups=st.integers(1, 2),
    kernel=st.tuples(st.integers(1, 3), st.integers(1, 3)),
    stride=st.tuples(st.integers(1, 2), st.integers(1, 2)),
    padding=st.tuples(st.integers(0, 2), st.integers(0, 2)),
    dilation=st.tuples(st.integers(1, 2), st.integers(1, 2)),
    seed=st.integers(0, 2**16),
    data=st.data(),
)
def test_conv_reference_matches_the_definition(
    bits, unsigned, batch, cin_per_group, out_per_group, groups, kernel, stride, padding,
    dilation, seed, data,
) -> None:  # fmt: skip
    gen = torch.Generator().manual_seed(seed)
    shape = [out_per_group * groups, cin_per_group, *kernel]
    k = cin_per_group * kernel[0] * kernel[1]
    codes = random_codes(shape[0], k, bits, gen)
    dtype = torch.uint8 if unsigned else torch.int8
    hw = [dilation[i] * (kernel[i] - 1) + 1 - 2 * padding[i] for i in range(2)]
    x = random_x((batch, cin_per_group * groups, max(1, hw[0]) + 2, max(1, hw[1]) + 1), dtype, gen)
    frac = data.draw(st.integers(0, max_frac_bits(k, unsigned)))
    geometry = (list(stride), list(padding), list(dilation), groups)
    expected = conv_scalar_model(x, codes, bits, shape, *geometry, frac)
    for method in ("auto", "int64"):
        packed = pack_codes(codes, bits)
        y = shift_conv2d_int8_reference(x, packed, bits, shape, *geometry, frac, method)
        assert y.is_contiguous(memory_format=torch.channels_last) and torch.equal(y, expected)
    assert torch.equal(torch.ops.inq.shift_conv2d_int8(x, packed, bits, shape, *geometry, frac),
                       expected)  # fmt: skip


@pytest.mark.parametrize("dtype", [torch.int8, torch.uint8])
@pytest.mark.parametrize(
    ("shape", "stride", "padding", "dilation", "groups"),
    [
        ([16, 3, 3, 3], [1, 1], [1, 1], [1, 1], 1),
        ([12, 4, 5, 3], [2, 1], [2, 0], [1, 2], 2),
        ([8, 1, 3, 3], [2, 2], [1, 1], [2, 2], 8),  # depthwise
    ],
)
def test_conv_float64_and_int64_paths_agree(dtype, shape, stride, padding, dilation, groups):
    """Both paths bit for bit, with and without floors; where nothing floors the float op
    (``inq::shift_conv2d`` in float64, n1 = frac) gives the same integers: an independent
    decode and F.conv2d."""
    bits = 5
    gen = torch.Generator().manual_seed(shape[0])
    k = shape[1] * shape[2] * shape[3]
    packed = pack_codes(random_codes(shape[0], k, bits, gen), bits)
    x = random_x((3, shape[1] * groups, 11, 10), dtype, gen)
    geometry = (stride, padding, dilation, groups)
    for frac in (0, 3, exact_frac_bits(bits), max_frac_bits(k, unsigned=dtype == torch.uint8)):
        fast = shift_conv2d_int8_reference(x, packed, bits, shape, *geometry, frac, "float64")
        slow = shift_conv2d_int8_reference(x, packed, bits, shape, *geometry, frac, "int64")
        assert torch.equal(fast, slow)
        if frac >= exact_frac_bits(bits):
            real = torch.ops.inq.shift_conv2d(x.double(), packed, bits, frac, shape, None,
                                              *geometry)  # fmt: skip
            assert torch.equal(fast.double(), real)


@pytest.mark.parametrize("method", ["float64", "int64"])
def test_conv_floors(method: str) -> None:
    """One tap of -1/2 on 3 (and padding): floor(-3/2) = -2 where the tap sees the input."""
    packed = pack_codes(torch.tensor([[13]], dtype=torch.uint8), 4)  # 1x1: -2**(n1 - 1)
    x = torch.tensor([[[[3, 1], [0, 2]]]], dtype=torch.uint8)
    geometry = ([1, 1], [1, 1], [1, 1], 1)
    y = shift_conv2d_int8_reference(x, packed, 4, [1, 1, 1, 1], *geometry, 0, method)
    expected = [[0, 0, 0, 0], [0, -2, -1, 0], [0, 0, -1, 0], [0, 0, 0, 0]]
    assert y.tolist() == [[expected]]


def test_chunks_and_layouts_agree(monkeypatch: pytest.MonkeyPatch) -> None:
    """Blocks of a few images, of part of an image, of a few rows (both paths, with and without
    floors), channels_last and a strided x: one result."""
    gen = torch.Generator().manual_seed(3)
    shape, geometry = [6, 2, 3, 3], ([1, 1], [1, 1], [1, 1], 2)
    packed = pack_codes(random_codes(6, 18, 4, gen), 4)
    x = random_x((7, 4, 6, 5), torch.uint8, gen)
    rows = random_x((300, 18), torch.int8, gen)
    cases = [(0, "int64"), (3, "int64"), (0, "float64"), (3, "float64")]
    whole = [
        (shift_conv2d_int8_reference(x, packed, 4, shape, *geometry, frac, method),
         shift_linear_int8_reference(rows, packed, 4, 18, frac, method))
        for frac, method in cases
    ]  # fmt: skip
    # G * K = 36 activations an output pixel, 30 pixels an image; frac 3: one float64 class
    for terms, chunk in ((2 * 30 * 36, 3 * 30 * 36), (20 * 36, 7 * 36)):
        monkeypatch.setattr(int8_module, "_MAX_TERMS", terms)
        monkeypatch.setattr(int8_module, "_FLOAT_CHUNK", chunk)
        for (frac, method), (y, y_rows) in zip(cases, whole, strict=True):
            chunked = shift_conv2d_int8_reference(x, packed, 4, shape, *geometry, frac, method)
            assert torch.equal(chunked, y)
            chunked = shift_linear_int8_reference(rows, packed, 4, 18, frac, method)
            assert torch.equal(chunked, y_rows)
    strided = torch.stack([x, x], dim=-1)[..., 0]
    assert strided.stride(-1) == 2
    for layout in (x.contiguous(memory_format=torch.channels_last), strided):
        for (frac, method), (y, _) in zip(cases, whole, strict=True):
            assert torch.equal(
                shift_conv2d_int8_reference(layout, packed, 4, shape, *geometry, frac, method), y
            )


@pytest.mark.parametrize(
    ("x", "shape", "geometry", "frac", "match"),
    [
        (torch.zeros(1, 2, 5, 5), [3, 2, 3, 3], ([1, 1], [0, 0], [1, 1], 1), 0, "int8 or uint8"),
        (torch.zeros(1, 2, 5, 5, dtype=torch.int16), [3, 2, 3, 3], ([1, 1], [0, 0], [1, 1], 1), 0,
         "int8 or uint8"),
        (torch.zeros(2, 5, 5, dtype=torch.int8), [3, 2, 3, 3], ([1, 1], [0, 0], [1, 1], 1), 0,
         "does not fit"),
        (torch.zeros(1, 3, 5, 5, dtype=torch.int8), [3, 2, 3, 3], ([1, 1], [0, 0], [1, 1], 1), 0,
         "does not fit"),
        (torch.zeros(1, 4, 5, 5, dtype=torch.int8), [3, 2, 3, 3], ([1, 1], [0, 0], [1, 1], 2), 0,
         "does not fit"),
        (torch.zeros(1, 2, 2, 5, dtype=torch.int8), [3, 2, 3, 3], ([1, 1], [0, 0], [1, 1], 1), 0,
         "no output pixel"),
        (torch.zeros(1, 2, 5, 5, dtype=torch.int8), [3, 2, 3, 3], ([0, 1], [0, 0], [1, 1], 1), 0,
         ">= 1"),
        (torch.zeros(1, 2, 5, 5, dtype=torch.int8), [3, 2, 3, 3], ([1, 1], [0, 0], [1], 1), 0,
         "two entries"),
        (torch.zeros(1, 2, 5, 5, dtype=torch.uint8), [3, 2, 3, 3], ([1, 1], [0, 0], [1, 1], 1),
         20, r"frac_bits=20 can overflow int32 with 18 terms of torch\.uint8 inputs \(allowed: "
         r"0\.\.18\)"),
        (torch.zeros(1, 2, 5, 5, dtype=torch.int8), [3, 2, 3, 3], ([1, 1], [0, 0], [1, 1], 1), -1,
         "overflow"),
    ],
)  # fmt: skip
def test_conv_bad_arguments_are_clear_errors(x, shape, geometry, frac, match) -> None:
    k = shape[1] * shape[2] * shape[3]
    packed = pack_codes(torch.zeros(shape[0], k, dtype=torch.uint8), 4)
    with pytest.raises(ValueError, match=match):
        torch.ops.inq.shift_conv2d_int8(x, packed, 4, shape, *geometry, frac)


def test_conv_packed_rows_must_fit_the_weight() -> None:
    x = torch.zeros(1, 2, 5, 5, dtype=torch.int8)
    geometry = ([1, 1], [0, 0], [1, 1], 1)
    with pytest.raises(ValueError, match="2 packed rows for 3 outputs"):
        shift_conv2d_int8_reference(x, pack_codes(torch.zeros(2, 18, dtype=torch.uint8), 4), 4,
                                    [3, 2, 3, 3], *geometry, 0)  # fmt: skip
    with pytest.raises(ValueError, match="unpack_codes"):
        shift_conv2d_int8_reference(x, pack_codes(torch.zeros(3, 9, dtype=torch.uint8), 4), 4,
                                    [3, 2, 3, 3], *geometry, 0)  # fmt: skip


@pytest.mark.parametrize("method", ["auto", "int64"])
def test_conv_empty_batch_or_outputs(method: str) -> None:
    geometry = ([1, 1], [1, 1], [1, 1], 2)
    x = torch.ones(2, 4, 5, 5, dtype=torch.uint8)
    no_rows = torch.empty(0, 9, dtype=torch.uint8)  # 18 codes of 4 bits a row
    y = shift_conv2d_int8_reference(x, no_rows, 4, [0, 2, 3, 3], *geometry, 3, method)
    assert y.shape == (2, 0, 5, 5) and y.dtype == torch.int32
    packed = pack_codes(torch.full((4, 18), 8, dtype=torch.uint8), 4)
    y = shift_conv2d_int8_reference(x[:0], packed, 4, [4, 2, 3, 3], *geometry, 3, method)
    assert y.shape == (0, 4, 5, 5) and y.dtype == torch.int32


def test_ops_schema_and_opcheck() -> None:
    """Schema, fake implementation and dynamic shapes of both integer ops (reference)."""
    assert str(torch.ops.inq.shift_conv2d_int8.default._schema) == (
        "inq::shift_conv2d_int8(Tensor x, Tensor packed, int bits, int[] weight_shape, "
        "int[] stride, int[] padding, int[] dilation, int groups, int frac_bits) -> Tensor"
    )
    gen = torch.Generator().manual_seed(0)
    packed = pack_codes(random_codes(6, 18, 4, gen), 4)
    for dtype in (torch.int8, torch.uint8):
        x = random_x((2, 4, 7, 8), dtype, gen)
        args = (x, packed, 4, [6, 2, 3, 3], [2, 1], [1, 0], [1, 2], 2, 3)
        torch.library.opcheck(torch.ops.inq.shift_conv2d_int8.default, args)
        rows = random_x((5, 18), dtype, gen)
        torch.library.opcheck(torch.ops.inq.shift_linear_int8.default, (rows, packed, 4, 18, 5))
