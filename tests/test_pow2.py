"""Properties of the power-of-two math (inq.pow2): Eq. 4 rounding, n1, codes, exp2."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

import inq
from inq.pow2 import broadcast_n1, check_quantizable, check_top_level, exp2, pow2_quantize_codes

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
ALL_BITS = tuple(range(2, 9))

# ---------------------------------------------------------------- helpers


def level_magnitudes(n1: int, bits: int) -> list[float]:
    """The non-zero magnitudes 2**n2 .. 2**n1, computed independently of inq (float64, exact)."""
    return [math.ldexp(1.0, e) for e in range(n1 + 1 - 2 ** (bits - 2), n1 + 1)]


def reference_levels(n1: int, bits: int) -> torch.Tensor:
    """{0} U {+-2**e}, ascending, float64."""
    mags = level_magnitudes(n1, bits)
    return torch.tensor(sorted([0.0, *mags, *(-m for m in mags)]), dtype=torch.float64)


def exponent_range(dtype: torch.dtype) -> tuple[int, int]:
    """Smallest and largest e such that 2**e is a finite number of ``dtype`` (subnormals too)."""
    info = torch.finfo(dtype)
    smallest_subnormal = math.log2(info.smallest_normal) - (info.bits - 1 - _exponent_bits(dtype))
    return int(smallest_subnormal), math.floor(math.log2(info.max))


def _exponent_bits(dtype: torch.dtype) -> int:
    return {torch.float32: 8, torch.float16: 5, torch.bfloat16: 8}[dtype]


def is_representable(value: float, dtype: torch.dtype) -> bool:
    return torch.tensor(value, dtype=torch.float64).to(dtype).double().item() == value


def representable_levels(n1: int, bits: int, dtype: torch.dtype) -> torch.Tensor:
    """The levels that ``dtype`` can hold (float64); all of them unless 2**n2 underflows."""
    levels = reference_levels(n1, bits)
    low, _ = exponent_range(dtype)
    return levels[(levels == 0) | (levels.abs() >= math.ldexp(1.0, low))]


def raw_bits(t: torch.Tensor) -> torch.Tensor:
    """The bit pattern of a float tensor, so -0.0 and 0.0 differ."""
    return t.view(torch.int32 if t.dtype == torch.float32 else torch.int16)


def exact_n1(s: float) -> int:
    """floor(log2(4*s/3)) with rational arithmetic only."""
    ratio = Fraction(4) * Fraction(s) / 3
    n = ratio.numerator.bit_length() - ratio.denominator.bit_length()
    while Fraction(2) ** n > ratio:
        n -= 1
    while Fraction(2) ** (n + 1) <= ratio:
        n += 1
    return n


@st.composite
def weights_and_scale(draw: st.DrawFn) -> tuple[torch.Tensor, int, int]:
    """A tensor of any supported dtype, an n1 whose top level fits the dtype, and bits."""
    dtype = draw(st.sampled_from(DTYPES))
    bits = draw(st.sampled_from(ALL_BITS))
    low, high = exponent_range(dtype)
    n1 = draw(st.integers(min_value=max(low + 2, -130), max_value=high))
    n2 = n1 + 1 - 2 ** (bits - 2)
    # magnitudes spread over (and a bit beyond) the level range, dense around the levels
    exponents = st.integers(min_value=max(n2 - 3, low), max_value=min(n1 + 2, high))
    mantissas = st.floats(min_value=-2.0, max_value=2.0, width=32)
    pairs = draw(st.lists(st.tuples(mantissas, exponents), min_size=1, max_size=48))
    values = [math.ldexp(m, e) for m, e in pairs]
    # exact midpoints between adjacent levels, the 0/2**n2 midpoint and the clamp threshold
    special = [math.ldexp(1.5, e) for e in range(max(n2, low + 1), n1)]
    special += [math.ldexp(1.0, n2 - 1), math.ldexp(1.5, n1), 0.0, -0.0]
    values += draw(st.lists(st.sampled_from(special), max_size=8))
    values = [v if draw(st.booleans()) else -v for v in values]
    finite_max = torch.finfo(dtype).max
    values = [max(-finite_max, min(finite_max, v)) for v in values]
    return torch.tensor(values, dtype=torch.float64).to(dtype), n1, bits


# ---------------------------------------------------------------- pow2_quantize


@settings(max_examples=60)
@given(weights_and_scale())
def test_quantize_outputs_only_levels_and_nearest_with_ties_up(
    case: tuple[torch.Tensor, int, int],
) -> None:
    weight, n1, bits = case
    out = inq.pow2_quantize(weight, n1, bits)
    assert out.dtype == weight.dtype and out.shape == weight.shape

    levels = reference_levels(n1, bits)
    x = weight.double()
    y = out.double()
    assert torch.isin(y, levels).all(), f"off-level outputs {y[~torch.isin(y, levels)]}"

    distances = (x[:, None] - levels[None, :]).abs()
    chosen = (x - y).abs()
    nearest = distances.min(dim=1).values
    assert torch.equal(chosen, nearest), "a level strictly closer than the output exists"
    # ties: any other level at the same distance must have a smaller magnitude
    tied = (distances == chosen[:, None]) & (levels[None, :] != y[:, None])
    smaller = levels.abs()[None, :] < y.abs()[:, None]
    assert not (tied & ~smaller).any(), "a tie went to the smaller magnitude"

    top = math.ldexp(1.0, n1)
    big = x.abs() >= 1.5 * top
    assert torch.equal(y[big].abs(), torch.full_like(y[big], top))
    assert ((y == 0) | (torch.sign(y) == torch.sign(x))).all(), "sign flipped"
    assert not torch.signbit(y[y == 0]).any(), "quantize produced -0.0"


@settings(max_examples=60)
@given(weights_and_scale())
def test_quantize_is_idempotent(case: tuple[torch.Tensor, int, int]) -> None:
    weight, n1, bits = case
    once = inq.pow2_quantize(weight, n1, bits)
    assert torch.equal(inq.pow2_quantize(once, n1, bits), once)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bits", ALL_BITS)
def test_exact_midpoints_round_to_larger_magnitude(dtype: torch.dtype, bits: int) -> None:
    n1 = 3 if dtype is torch.float16 else 0
    n2 = n1 + 1 - 2 ** (bits - 2)
    pairs = [(math.ldexp(1.5, e), math.ldexp(1.0, e + 1)) for e in range(n2, n1)]
    pairs.append((math.ldexp(1.0, n2 - 1), math.ldexp(1.0, n2)))  # midpoint of 0 and 2**n2
    pairs.append((math.ldexp(1.5, n1), math.ldexp(1.0, n1)))  # clamp threshold
    pairs = [(x, want) for x, want in pairs if is_representable(x, dtype)]
    assert len(pairs) >= 2
    inputs = torch.tensor([x for x, _ in pairs] + [-x for x, _ in pairs], dtype=dtype)
    expected = torch.tensor([w for _, w in pairs] + [-w for _, w in pairs], dtype=dtype)
    assert torch.equal(inq.pow2_quantize(inputs, n1, bits), expected)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bits", ALL_BITS)
def test_just_below_midpoint_rounds_down(dtype: torch.dtype, bits: int) -> None:
    n1 = 3 if dtype is torch.float16 else 0
    n2 = n1 + 1 - 2 ** (bits - 2)
    for e in range(max(n2, -10), n1):
        mid = torch.tensor(math.ldexp(1.5, e), dtype=dtype)
        below = torch.nextafter(mid, torch.tensor(0.0, dtype=dtype))
        assert inq.pow2_quantize(below[None], n1, bits).item() == math.ldexp(1.0, e)
    zero_mid = torch.tensor(math.ldexp(1.0, n2 - 1), dtype=dtype)
    if zero_mid.item() != 0.0:
        below = torch.nextafter(zero_mid, torch.tensor(0.0, dtype=dtype))
        assert inq.pow2_quantize(below[None], n1, bits).item() == 0.0


@pytest.mark.parametrize("dtype", DTYPES)
def test_values_beyond_clamp_threshold_go_to_top_level(dtype: torch.dtype) -> None:
    n1 = 2
    big = torch.tensor([6.0, 7.9, 100.0, 1000.0, -6.0, -1000.0], dtype=dtype)
    expected = torch.tensor([4.0, 4.0, 4.0, 4.0, -4.0, -4.0], dtype=dtype)
    for bits in ALL_BITS:
        assert torch.equal(inq.pow2_quantize(big, n1, bits), expected)


def sweep_n1(dtype: torch.dtype, bits: int) -> int:
    """An n1 whose whole level set is representable in ``dtype`` when one exists."""
    low, high = exponent_range(dtype)
    return min(max(0, low + 2 ** (bits - 2) + 1), high)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bits", ALL_BITS)
def test_dense_sweep_image_is_the_whole_level_set(dtype: torch.dtype, bits: int) -> None:
    low, _ = exponent_range(dtype)
    n1 = sweep_n1(dtype, bits)
    n2 = n1 + 1 - 2 ** (bits - 2)
    log_mags = torch.linspace(n2 - 3, n1 + 2, 6000, dtype=torch.float64)
    mags = torch.exp2(log_mags).clamp(max=torch.finfo(dtype).max)
    sweep = torch.cat([mags, -mags, torch.zeros(1, dtype=torch.float64)]).to(dtype)
    image = torch.unique(inq.pow2_quantize(sweep, n1, bits).double())

    assert torch.equal(image, representable_levels(n1, bits, dtype))
    if n2 >= low:  # the whole level set fits the dtype: every level is hit
        assert image.numel() == 2 ** (bits - 1) + 1
    if bits == 5:
        assert image.numel() == 17


def test_two_bits_is_ternary() -> None:
    sweep = torch.linspace(-10, 10, 2001)
    image = torch.unique(inq.pow2_quantize(sweep, n1=1, bits=2))
    assert image.tolist() == [-2.0, 0.0, 2.0]


@pytest.mark.parametrize("dtype", DTYPES)
def test_all_zero_tensor_stays_zero(dtype: torch.dtype) -> None:
    zeros = torch.zeros(3, 4, dtype=dtype)
    for bits in ALL_BITS:
        out = inq.pow2_quantize(zeros, inq.pow2_n1(zeros), bits)
        assert torch.equal(out, zeros) and not torch.signbit(out).any()
    neg_zeros = -torch.zeros(5, dtype=dtype)
    assert not torch.signbit(inq.pow2_quantize(neg_zeros, 0, 5)).any()


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
@pytest.mark.parametrize("dtype", DTYPES)
def test_quantize_rejects_non_finite(bad: float, dtype: torch.dtype) -> None:
    weight = torch.tensor([0.5, bad, 0.25], dtype=dtype)
    with pytest.raises(ValueError, match="NaN or infinity"):
        inq.pow2_quantize(weight, 0, 5)


@pytest.mark.parametrize("bits", [0, 1, 9, 16, -3, 5.0, True, "5"])
def test_quantize_rejects_bad_bits(bits: object) -> None:
    with pytest.raises(ValueError, match="bits must be an integer from 2 to 8"):
        inq.pow2_quantize(torch.ones(3), 0, bits)  # type: ignore[arg-type]


def test_quantize_rejects_non_float_and_overflowing_n1() -> None:
    with pytest.raises(ValueError, match="float32, float16 or bfloat16"):
        inq.pow2_quantize(torch.ones(3, dtype=torch.int32), 0, 5)
    with pytest.raises(ValueError, match="float32, float16 or bfloat16"):
        inq.pow2_quantize(torch.ones(3, dtype=torch.float64), 0, 5)
    with pytest.raises(ValueError, match="overflows"):
        inq.pow2_quantize(torch.ones(3, dtype=torch.float16), 16, 5)


def test_quantize_keeps_shape_of_odd_tensors() -> None:
    weight = torch.randn(3, 1, 5, 7, generator=torch.Generator().manual_seed(0))
    out = inq.pow2_quantize(weight, inq.pow2_n1(weight), 4)
    assert out.shape == weight.shape and out.dtype == weight.dtype
    scalar = inq.pow2_quantize(torch.tensor(0.3), -1, 5)
    assert scalar.shape == () and scalar.item() == 0.25


# ---------------------------------------------------------------- pow2_n1


@settings(max_examples=300)
@given(
    st.floats(min_value=0.0, exclude_min=True, allow_infinity=False, allow_subnormal=True, width=32)
)
def test_n1_matches_rational_floor_log2(s: float) -> None:
    assert inq.pow2_n1(torch.tensor([s, -s / 2, 0.0])) == exact_n1(s)
    assert inq.pow2_n1(torch.tensor([-s])) == exact_n1(s)


@pytest.mark.parametrize("dtype", DTYPES)
def test_n1_at_three_quarter_boundaries(dtype: torch.dtype) -> None:
    low, high = exponent_range(dtype)
    zero = torch.tensor(0.0, dtype=dtype)
    for k in range(low + 2, high + 1):
        boundary = torch.tensor(math.ldexp(0.75, k), dtype=dtype)  # 4*s/3 == 2**k exactly
        assert boundary.double().item() == math.ldexp(0.75, k)
        assert inq.pow2_n1(boundary[None]) == k
        below = torch.nextafter(boundary, zero)
        assert inq.pow2_n1(below[None]) == k - 1 == exact_n1(below.double().item())
        above = torch.nextafter(boundary, torch.tensor(math.inf, dtype=dtype))
        if math.isfinite(above.item()):
            assert inq.pow2_n1(above[None]) == k == exact_n1(above.double().item())


@pytest.mark.parametrize("dtype", DTYPES)
def test_n1_of_subnormals(dtype: torch.dtype) -> None:
    tiny = torch.tensor(torch.finfo(dtype).smallest_normal, dtype=dtype)
    subnormals = [tiny / 2, tiny / 4, tiny / 3, tiny * 0.75]
    low, _ = exponent_range(dtype)
    subnormals.append(torch.tensor(math.ldexp(1.0, low), dtype=dtype))
    for value in subnormals:
        s = value.double().item()
        assert 0 < s < tiny.item()
        assert inq.pow2_n1(value[None]) == exact_n1(s)


def test_n1_examples_and_errors() -> None:
    assert inq.pow2_n1(torch.tensor([0.1, -0.75, 0.2])) == 0
    assert inq.pow2_n1(torch.tensor([0.74])) == -1
    assert inq.pow2_n1(torch.zeros(4)) == 0
    assert inq.pow2_n1(torch.zeros(0)) == inq.pow2_n1(torch.zeros(3, 0)) == 0  # no scale
    with pytest.raises(ValueError, match="NaN or infinity"):
        inq.pow2_n1(torch.tensor([1.0, float("nan")]))
    with pytest.raises(ValueError, match="NaN or infinity"):
        inq.pow2_n1(torch.tensor([float("-inf")]))
    with pytest.raises(ValueError, match="float32, float16 or bfloat16"):
        inq.pow2_n1(torch.ones(2, dtype=torch.int64))


def test_n1_scale_keeps_max_weight_in_range() -> None:
    weight = torch.randn(64, 9, generator=torch.Generator().manual_seed(3))
    n1 = inq.pow2_n1(weight)
    s = weight.abs().max().item()
    assert math.ldexp(1.0, n1) <= 4 * s / 3 < math.ldexp(1.0, n1 + 1)
    assert s < 1.5 * math.ldexp(1.0, n1)


# ---------------------------------------------------------------- levels, encode, decode


@pytest.mark.parametrize("bits", ALL_BITS)
def test_levels_match_definition(bits: int) -> None:
    for n1 in (-9, 0, 4):
        levels = inq.pow2_levels(n1, bits, torch.float32)
        assert torch.equal(levels.double(), reference_levels(n1, bits))
        assert levels.numel() == 2 ** (bits - 1) + 1
        assert inq.pow2_n2(n1, bits) == n1 + 1 - 2 ** (bits - 2)


ODD_SHAPES = [(1,), (7,), (3, 5), (2, 3, 5), (5, 1, 3, 3)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bits", ALL_BITS)
def test_encode_decode_round_trip_is_bit_exact(dtype: torch.dtype, bits: int) -> None:
    n1 = sweep_n1(dtype, bits) - 2
    levels = representable_levels(n1, bits, dtype).to(dtype)
    generator = torch.Generator().manual_seed(bits)
    for shape in ODD_SHAPES:
        picks = torch.randint(levels.numel(), shape, generator=generator)
        values = levels[picks]
        codes = inq.pow2_encode(values, n1, bits)
        assert codes.dtype == torch.uint8 and codes.shape == values.shape
        decoded = inq.pow2_decode(codes, n1, bits, dtype)
        assert decoded.dtype == dtype
        assert torch.equal(raw_bits(decoded), raw_bits(values))


@pytest.mark.parametrize("bits", ALL_BITS)
def test_codes_are_a_bijection_onto_valid_codes(bits: int) -> None:
    n1 = 1
    levels = inq.pow2_levels(n1, bits)
    codes = inq.pow2_encode(levels, n1, bits).int()
    top = 1 << (bits - 1)
    valid = [0, *range(top, 2 * top)]
    assert sorted(codes.tolist()) == valid
    every_code = torch.tensor(valid, dtype=torch.uint8)
    assert torch.equal(inq.pow2_encode(inq.pow2_decode(every_code, n1, bits), n1, bits), every_code)
    # documented layout: top bit set, then sign, then offset below n1
    assert inq.pow2_encode(torch.tensor([math.ldexp(1.0, n1)]), n1, bits).item() == top
    if bits > 2:
        minus_half_top = torch.tensor([-math.ldexp(1.0, n1 - 1)])
        assert inq.pow2_encode(minus_half_top, n1, bits).item() == top | (top >> 1) | 1


@pytest.mark.parametrize("bits", ALL_BITS)
def test_decode_rejects_invalid_codes(bits: int) -> None:
    top = 1 << (bits - 1)
    invalid = [*range(1, top), *range(2 * top, 256)]
    for code in invalid:
        with pytest.raises(ValueError, match="invalid"):
            inq.pow2_decode(torch.tensor([0, code], dtype=torch.uint8), 0, bits)


@pytest.mark.parametrize("bits", ALL_BITS)
def test_encode_rejects_values_off_the_level_set(bits: int) -> None:
    n1 = 0
    n2 = n1 + 1 - 2 ** (bits - 2)
    off_level = [0.75, 3.0, 2.0, -2.0, 0.3, math.ldexp(1.0, n2 - 1), float("nan"), float("inf")]
    for value in off_level:
        with pytest.raises(ValueError, match="not in the"):
            inq.pow2_encode(torch.tensor([1.0, value]), n1, bits)


def test_encode_rejects_bad_bits_and_dtype() -> None:
    with pytest.raises(ValueError, match="bits"):
        inq.pow2_encode(torch.ones(2), 0, 9)
    with pytest.raises(ValueError, match="bits"):
        inq.pow2_decode(torch.zeros(2, dtype=torch.uint8), 0, 1)
    with pytest.raises(ValueError, match="float32"):
        inq.pow2_encode(torch.ones(2, dtype=torch.float64), 0, 5)


def test_exp2_is_exact_against_ldexp() -> None:
    exponents = list(range(-200, 128))
    got = exp2(torch.tensor(exponents, dtype=torch.int32))
    assert got.dtype == torch.float32
    want = torch.tensor([math.ldexp(1.0, e) for e in exponents], dtype=torch.float64).float()
    assert torch.equal(got.view(torch.int32), want.view(torch.int32))
    assert got[exponents.index(-149)].item() == math.ldexp(1.0, -149)
    assert got[exponents.index(127)].item() == math.ldexp(1.0, 127)


def test_quantize_then_encode_decode_reproduces_weights() -> None:
    generator = torch.Generator().manual_seed(11)
    for dtype in DTYPES:
        weight = (torch.randn(13, 7, generator=generator) * 0.05).to(dtype)
        n1 = inq.pow2_n1(weight)
        for bits in ALL_BITS:
            q = inq.pow2_quantize(weight, n1, bits)
            assert torch.equal(inq.pow2_decode(inq.pow2_encode(q, n1, bits), n1, bits, dtype), q)


# ---------------------------------------------------------------- empty selections


@st.composite
def rows_and_selection(draw: st.DrawFn) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """A weight [O, K] (O or K may be 0), one n1 per row, a selection mask (often all False)
    and a bit-width."""
    shape = (draw(st.integers(0, 5)), draw(st.integers(0, 6)))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**31)))
    weight = torch.randn(shape, generator=g) * 2.0 ** draw(st.integers(-8, 4))
    n1 = torch.randint(-10, 6, shape[:1], generator=g, dtype=torch.int32)
    mask = torch.rand(shape, generator=g) < draw(st.sampled_from([0.0, 0.5, 1.0]))
    return weight, n1, mask, draw(st.integers(2, 8))


NO_NEW_WEIGHT = (  # a stage that adds no weight of a per-channel layer
    torch.tensor([[0.9, -0.3], [0.2, 0.05]]),
    torch.tensor([0, -2], dtype=torch.int32),
    torch.zeros(2, 2, dtype=torch.bool),
    3,
)


@settings(max_examples=60)
@given(rows_and_selection())
@example(NO_NEW_WEIGHT)
def test_quantizing_a_selection_is_selecting_from_the_quantized_weight(
    case: tuple[torch.Tensor, torch.Tensor, torch.Tensor, int],
) -> None:
    """What the scheduler does at a stage: round only ``weight[new]``, each with its row's n1;
    an empty selection gives empty codes, not an error."""
    weight, n1, mask, bits = case
    selected_n1 = broadcast_n1(n1, weight).expand(weight.shape)[mask]
    codes = pow2_quantize_codes(weight[mask], selected_n1, bits)
    assert torch.equal(codes, pow2_quantize_codes(weight, n1, bits)[mask])
    values = inq.pow2_quantize(weight[mask], selected_n1, bits)
    assert torch.equal(values, inq.pow2_quantize(weight, n1, bits)[mask])
    assert torch.equal(inq.pow2_decode(codes, selected_n1, bits), values)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(0,), (0, 3), (3, 0), (2, 0, 3)])
def test_empty_tensors_round_encode_and_decode_to_empty(
    dtype: torch.dtype, shape: tuple[int, ...]
) -> None:
    weight = torch.zeros(shape, dtype=dtype)
    for n1 in (-2, torch.full(shape[:1], -2, dtype=torch.int32)):
        check_quantizable(weight, n1)
        codes = pow2_quantize_codes(weight, n1, 5)
        assert codes.dtype == torch.uint8 and codes.shape == shape
        assert torch.equal(inq.pow2_quantize(weight, n1, 5), weight)
        assert torch.equal(inq.pow2_encode(weight, n1, 5), codes)
        assert torch.equal(inq.pow2_decode(codes, n1, 5, dtype), weight)


def test_check_top_level_checks_every_n1_and_none_of_an_empty_one() -> None:
    check_top_level(torch.tensor([], dtype=torch.int32), torch.float16)
    check_top_level(torch.tensor([[15, -3]]), torch.float16)
    with pytest.raises(ValueError, match=r"2\*\*17 overflows torch\.float16"):
        check_top_level(torch.tensor([16, 3, 17]), torch.float16)
    with pytest.raises(ValueError, match=r"2\*\*16 overflows"):
        check_quantizable(torch.zeros(2, 0, dtype=torch.float16), torch.tensor([16, 0]))
