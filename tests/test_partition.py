"""Partition (inq.partition): exact counts, growing masks, magnitude and random choice."""

from __future__ import annotations

from decimal import ROUND_HALF_UP, Decimal

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import inq
from inq.partition import STRATEGIES, grow_mask, prune_mask, quantized_count

ODD_SIZES = (1, 3, 7, 13, 101)
SCHEDULES = (
    (0.3, 0.6, 0.8, 1.0),
    (0.5, 0.75, 0.875, 1.0),
    (0.2, 0.4, 0.6, 0.8, 1.0),
    (0.1, 0.15, 0.5, 0.95, 1.0),
    (1.0,),
)


def decimal_half_up(portion: float, numel: int) -> int:
    """round(portion * numel) half up on the shortest decimal that names ``portion``."""
    exact = Decimal(repr(float(portion))) * numel
    return int(exact.quantize(Decimal(1), rounding=ROUND_HALF_UP))


def brute_force_magnitude(weight: torch.Tensor, mask: torch.Tensor, count: int) -> torch.Tensor:
    """Reference: sort the still-float weights by (-|w|, flat index) and take the first ones."""
    flat_w = weight.flatten().tolist()
    flat_m = mask.flatten().tolist()
    free = [i for i, taken in enumerate(flat_m) if not taken]
    free.sort(key=lambda i: (-abs(flat_w[i]), i))
    new = list(flat_m)
    for i in free[: count - sum(flat_m)]:
        new[i] = True
    return torch.tensor(new, dtype=torch.bool).view(mask.shape)


def empty_mask(weight: torch.Tensor) -> torch.Tensor:
    return torch.zeros_like(weight, dtype=torch.bool)


# ---------------------------------------------------------------- quantized_count


@pytest.mark.parametrize(
    ("portion", "numel", "expected"),
    [
        (0.3, 10, 3),
        (0.5, 5, 3),  # exact half rounds up
        (0.5, 7, 4),
        (0.5, 1, 1),
        (0.875, 4, 4),  # 3.5 -> 4
        (0.3, 5, 2),  # 1.5 -> 2 although float(0.3) * 5 < 1.5
        (0.15, 10, 2),  # 1.5 -> 2 although float(0.15) < 0.15
        (0.35, 10, 4),  # 3.5 -> 4 although float(0.35) < 0.35
        (1.0, 7, 7),
        (1.0, 0, 0),
        (0.0, 9, 0),
        (0.2, 101, 20),
    ],
)
def test_quantized_count_examples(portion: float, numel: int, expected: int) -> None:
    assert quantized_count(portion, numel) == expected


@settings(max_examples=300)
@given(
    st.floats(min_value=0.0, max_value=1.0, allow_nan=False),
    st.integers(min_value=0, max_value=10**7),
)
def test_quantized_count_is_decimal_half_up(portion: float, numel: int) -> None:
    assert quantized_count(portion, numel) == decimal_half_up(portion, numel)


@settings(max_examples=100)
@given(
    st.integers(min_value=0, max_value=10**4).map(lambda k: k / 10**4),
    st.integers(min_value=1, max_value=5000),
)
def test_quantized_count_on_short_decimals(portion: float, numel: int) -> None:
    exact = Decimal(str(portion)) * numel
    assert quantized_count(portion, numel) == int(exact.quantize(Decimal(1), ROUND_HALF_UP))


# ---------------------------------------------------------------- grow_mask: counts and growth


@pytest.mark.parametrize("strategy", ["magnitude", "random"])
@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("numel", ODD_SIZES)
def test_counts_exact_and_masks_only_grow(
    numel: int, schedule: tuple[float, ...], strategy: str
) -> None:
    weight = torch.randn(numel, generator=torch.Generator().manual_seed(numel))
    mask = empty_mask(weight)
    for stage, portion in enumerate(schedule, start=1):
        count = quantized_count(portion, numel)
        new = grow_mask(weight, mask, count, strategy, seed=1, key=f"layer/stage{stage}")
        assert new.dtype == torch.bool and new.shape == weight.shape
        assert int(new.sum()) == count == decimal_half_up(portion, numel)
        assert not (mask & ~new).any(), "a quantized weight went back to float"
        mask = new
    assert bool(mask.all())


@pytest.mark.parametrize("shape", [(3, 5), (2, 3, 1, 5), (7, 1)])
def test_grow_mask_keeps_shape_of_multi_dim_weights(shape: tuple[int, ...]) -> None:
    weight = torch.randn(shape, generator=torch.Generator().manual_seed(0))
    mask = grow_mask(weight, empty_mask(weight), 4)
    assert mask.shape == weight.shape and int(mask.sum()) == 4
    flat_expected = brute_force_magnitude(weight.flatten(), empty_mask(weight.flatten()), 4)
    assert torch.equal(mask.flatten(), flat_expected)


def test_grow_mask_with_nothing_to_add_returns_a_copy() -> None:
    weight = torch.tensor([0.1, 0.2, 0.3])
    mask = torch.tensor([False, True, False])
    same = grow_mask(weight, mask, 1)
    assert torch.equal(same, mask) and same is not mask
    same[0] = True
    assert not mask[0], "grow_mask returned a view of the caller's mask"


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("shape", [(0,), (0, 3), (3, 0)])
def test_empty_weights_grow_and_prune_to_empty_masks(strategy: str, shape: tuple[int, ...]) -> None:
    weight = torch.zeros(shape)
    grown = grow_mask(weight, empty_mask(weight), 0, strategy, snapped=weight)
    assert torch.equal(grown, empty_mask(weight))
    assert torch.equal(prune_mask(weight, empty_mask(weight), 0), empty_mask(weight))


def test_grow_mask_does_not_modify_inputs() -> None:
    weight = torch.tensor([0.4, -0.1, 0.3, 0.2])
    mask = torch.tensor([True, False, False, False])
    weight_before, mask_before = weight.clone(), mask.clone()
    grow_mask(weight, mask, 3)
    grow_mask(weight, mask, 3, "random", seed=2, key="k")
    assert torch.equal(weight, weight_before) and torch.equal(mask, mask_before)


@pytest.mark.parametrize(
    ("mask", "count", "message"),
    [
        (torch.zeros(4, dtype=torch.bool), 5, "outside"),
        (torch.tensor([True, True, False, False]), 1, "masks only grow"),
        (torch.zeros(4, dtype=torch.bool), -1, "outside"),
        (torch.zeros(5, dtype=torch.bool), 2, "shape"),
        (torch.zeros(4, dtype=torch.uint8), 2, "bool"),
    ],
)
def test_grow_mask_rejects_bad_arguments(mask: torch.Tensor, count: int, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        grow_mask(torch.ones(4), mask, count)


def test_grow_mask_rejects_unknown_strategy() -> None:
    with pytest.raises(ValueError, match="unknown partition strategy 'largest'"):
        grow_mask(torch.ones(4), torch.zeros(4, dtype=torch.bool), 2, strategy="largest")


# ---------------------------------------------------------------- magnitude


TIE_PRONE_VALUES = (-2.0, -1.0, -0.5, -0.0, 0.0, 0.5, 1.0, 2.0)


@settings(max_examples=200)
@given(st.data())
def test_magnitude_matches_brute_force_with_ties(data: st.DataObject) -> None:
    numel = data.draw(st.integers(min_value=1, max_value=40), label="numel")
    values = data.draw(st.lists(st.sampled_from(TIE_PRONE_VALUES), min_size=numel, max_size=numel))
    taken = data.draw(st.lists(st.booleans(), min_size=numel, max_size=numel))
    dtype = data.draw(st.sampled_from([torch.float32, torch.float16, torch.bfloat16]))
    weight = torch.tensor(values, dtype=dtype)
    mask = torch.tensor(taken, dtype=torch.bool)
    count = data.draw(st.integers(min_value=int(mask.sum()), max_value=numel), label="count")
    got = grow_mask(weight, mask, count, "magnitude")
    assert torch.equal(got, brute_force_magnitude(weight, mask, count))


@settings(max_examples=100)
@given(
    st.lists(
        st.floats(min_value=-4, max_value=4, allow_nan=False, width=32), min_size=1, max_size=64
    ),
    st.data(),
)
def test_magnitude_matches_brute_force_on_arbitrary_floats(
    values: list[float], data: st.DataObject
) -> None:
    weight = torch.tensor(values).view(1, -1)
    count = data.draw(st.integers(min_value=0, max_value=len(values)))
    got = grow_mask(weight, empty_mask(weight), count)
    assert torch.equal(got, brute_force_magnitude(weight, empty_mask(weight), count))


def test_magnitude_prefers_largest_magnitude_then_lower_index() -> None:
    weight = torch.tensor([0.5, -0.9, 0.9, 0.1, -0.5, 0.5])
    mask = grow_mask(weight, empty_mask(weight), 3)
    assert mask.tolist() == [True, True, True, False, False, False]
    mask = grow_mask(weight, mask, 4)
    assert mask.tolist() == [True, True, True, False, True, False]


# ---------------------------------------------------------------- random


def random_pick(
    weight: torch.Tensor, mask: torch.Tensor, count: int, seed: int, key: str
) -> torch.Tensor:
    return grow_mask(weight, mask, count, "random", seed=seed, key=key)


def test_random_is_reproducible_for_same_seed_and_key() -> None:
    weight = torch.randn(1000, generator=torch.Generator().manual_seed(0))
    mask = empty_mask(weight)
    first = random_pick(weight, mask, 300, seed=7, key="conv1/stage1")
    again = random_pick(weight, mask, 300, seed=7, key="conv1/stage1")
    assert torch.equal(first, again)
    # the draw does not depend on the global RNG
    torch.manual_seed(123)
    assert torch.equal(random_pick(weight, mask, 300, seed=7, key="conv1/stage1"), first)


def test_random_differs_across_seeds_and_keys() -> None:
    weight = torch.randn(1000, generator=torch.Generator().manual_seed(0))
    mask = empty_mask(weight)
    base = random_pick(weight, mask, 300, seed=7, key="conv1/stage1")
    assert not torch.equal(base, random_pick(weight, mask, 300, seed=8, key="conv1/stage1"))
    assert not torch.equal(base, random_pick(weight, mask, 300, seed=7, key="conv2/stage1"))
    assert not torch.equal(base, random_pick(weight, mask, 300, seed=7, key="conv1/stage2"))
    magnitude = grow_mask(weight, mask, 300, "magnitude")
    assert not torch.equal(base, magnitude)


def test_random_only_picks_still_float_weights() -> None:
    weight = torch.randn(200, generator=torch.Generator().manual_seed(1))
    mask = torch.zeros(200, dtype=torch.bool)
    mask[::3] = True
    have = int(mask.sum())
    for seed in range(10):
        new = random_pick(weight, mask, have + 50, seed=seed, key="fc")
        assert int(new.sum()) == have + 50
        assert bool(new[mask].all()), "an already quantized weight was dropped"
        assert int((new & ~mask).sum()) == 50


def test_random_is_roughly_uniform_over_free_weights() -> None:
    weight = torch.arange(8.0)  # magnitudes would always pick index 7
    mask = torch.tensor([True, False, True, False, False, True, False, True])
    hits = torch.zeros(8)
    draws = 800
    for i in range(draws):
        hits += random_pick(weight, mask, int(mask.sum()) + 1, seed=i, key="x").float()
    free_hits = hits[~mask]  # each draw adds exactly one free weight
    assert int(free_hits.sum()) == draws
    expected = draws / int((~mask).sum())
    assert bool(((free_hits - expected).abs() < 0.3 * expected).all()), free_hits.tolist()


def test_public_api_exports_partition_functions() -> None:
    assert inq.grow_mask is grow_mask and inq.quantized_count is quantized_count


def test_magnitude_rejects_non_finite_weights() -> None:
    weight = torch.tensor([0.5, float("nan"), 0.1, 0.2])
    with pytest.raises(ValueError, match="NaN"):
        grow_mask(weight, torch.zeros(4, dtype=torch.bool), 2)


@settings(max_examples=50)
@given(st.integers(1, 60), st.integers(0, 2**31), st.integers(2, 8))
def test_error_strategy_takes_the_smallest_rounding_errors_first(numel, seed, bits) -> None:
    weight = torch.randn(numel, generator=torch.Generator().manual_seed(seed))
    snapped = inq.pow2_quantize(weight, inq.pow2_n1(weight), bits)
    error = (weight - snapped).abs().tolist()
    mask = empty_mask(weight)
    for count in sorted({numel // 3, numel // 2, numel}):
        new = grow_mask(weight, mask, count, "error", snapped=snapped)
        free = [i for i in range(numel) if not mask[i]]
        free.sort(key=lambda i: (error[i], i))  # reference: smallest error, then lower index
        expected = mask.clone()
        expected[free[: count - int(mask.sum())]] = True
        assert torch.equal(new, expected)
        mask = new


def test_error_strategy_ranks_tiny_errors_exactly() -> None:
    """An error of 2**-30 is not a tie with an error of 0, whatever the largest error is."""
    weight = torch.tensor([2**-7 + 2**-30, 1.0, 0.74])  # 5 bits, n1 = 0: errors 2**-30, 0, 0.24
    snapped = inq.pow2_quantize(weight, 0, 5)
    first = grow_mask(weight, empty_mask(weight), 1, "error", snapped=snapped)
    assert torch.equal(first, torch.tensor([False, True, False]))
    second = grow_mask(weight, first, 2, "error", snapped=snapped)
    assert torch.equal(second, torch.tensor([True, True, False]))


def test_error_strategy_needs_the_snapped_weights() -> None:
    with pytest.raises(ValueError, match="needs the snapped weights"):
        grow_mask(torch.ones(3), torch.zeros(3, dtype=torch.bool), 1, "error")
