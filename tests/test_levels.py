"""Level-set choice (inq.levels): the max and mse rules, per layer and per channel."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import inq
from inq.levels import describe_n1, n1_rows_max, select_n1
from inq.pow2 import pow2_quantize


def squared_error(weight: torch.Tensor, n1: int, bits: int) -> float:
    """sum (w - Q(w))**2 in float64 for one level set, computed directly."""
    return float(((weight.double() - pow2_quantize(weight, n1, bits).double()) ** 2).sum())


@st.composite
def weights(draw, rows: int | None = None) -> torch.Tensor:
    """Trained-layer-like weights: Gaussian or heavy-tailed, scaled, with a few exact zeros;
    now and then empty (no row, or rows of no weight)."""
    shape = (draw(st.integers(0, 6)) if rows is None else rows, draw(st.integers(0, 40)))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**31)))
    w = torch.randn(shape, generator=g)
    if draw(st.booleans()):
        w = w * torch.rand(shape, generator=g).pow(4) * 4  # heavy tail: a few large weights
    w = w * 2.0 ** draw(st.integers(-12, 4))
    return torch.where(torch.rand(shape, generator=g) < 0.1, 0.0, w)


# the relative rounding of a float64 sum of K <= 240 non-negative terms is below K * 2**-53
SUM_BOUND = 240 * 2.0**-53


@settings(max_examples=60)
@given(weight=weights(), bits=st.integers(2, 8))
def test_mse_never_has_a_larger_squared_error_than_max(weight, bits) -> None:
    mse, paper = select_n1(weight, bits, "mse"), select_n1(weight, bits, "max")
    assert squared_error(weight, mse, bits) <= squared_error(weight, paper, bits) * (1 + SUM_BOUND)


@settings(max_examples=60)
@given(weight=weights(), bits=st.integers(2, 8))
def test_mse_search_is_exact(weight, bits) -> None:
    """Brute force over a wide window of n1 finds no smaller error than the pruned search."""
    mse = select_n1(weight, bits, "mse")
    paper = inq.pow2_n1(weight)
    errors = {n1: squared_error(weight, n1, bits) for n1 in range(paper - 40, paper + 4)}
    best = min(errors.values())
    assert errors[mse] <= best * (1 + SUM_BOUND)
    assert mse <= paper  # no n1 above the paper's helps


@settings(max_examples=60)
@given(weight=weights(), bits=st.integers(2, 8), rule=st.sampled_from(["max", "mse"]))
def test_channel_n1_is_the_layer_rule_applied_to_each_row(weight, bits, rule) -> None:
    rows = select_n1(weight, bits, rule, "channel")
    assert rows.dtype == torch.int32 and rows.shape == (weight.shape[0],)
    assert rows.tolist() == [select_n1(row, bits, rule) for row in weight]


@settings(max_examples=60)
@given(weight=weights(), bits=st.integers(2, 8))
def test_per_channel_mse_error_is_at_most_the_per_layer_one(weight, bits) -> None:
    rows = select_n1(weight, bits, "mse", "channel")
    per_row = sum(squared_error(w, int(n), bits) for w, n in zip(weight, rows, strict=True))
    layer = squared_error(weight, select_n1(weight, bits, "mse"), bits)
    assert per_row <= layer * (1 + SUM_BOUND)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_rows_max_matches_pow2_n1_at_the_edges(dtype) -> None:
    """Exactly 0.75 * 2**k and its neighbours, in every dtype, row by row."""
    values = []
    for k in (-10, -1, 0, 3, 10):
        edge = torch.tensor(0.75 * 2.0**k, dtype=dtype)
        values += [edge, torch.nextafter(edge, torch.tensor(0.0, dtype=dtype)), edge * 2]
    rows = torch.stack([torch.stack([v, -v / 3, torch.zeros((), dtype=dtype)]) for v in values])
    assert n1_rows_max(rows).tolist() == [inq.pow2_n1(row) for row in rows]


def test_all_zero_rows_and_degenerate_inputs() -> None:
    zero = torch.zeros(3, 5)
    assert select_n1(zero, 3, "mse") == 0
    assert select_n1(zero, 2, "mse", "channel").tolist() == [0, 0, 0]
    with pytest.raises(ValueError, match="NaN or infinity"):
        select_n1(torch.tensor([[1.0, math.inf]]), 3, "mse")
    with pytest.raises(ValueError, match="n1_rule must be one of"):
        select_n1(zero, 3, "least-squares")
    with pytest.raises(ValueError, match="granularity must be one of"):
        select_n1(zero, 3, "mse", "row")
    with pytest.raises(ValueError, match="rank >= 1"):
        select_n1(torch.tensor(0.5), 3, "mse", "channel")


@pytest.mark.parametrize("shape", [(0,), (0, 3), (3, 0), (2, 0, 4)])
@pytest.mark.parametrize("rule", ["max", "mse"])
@pytest.mark.parametrize("bits", [2, 5])
def test_empty_weights_and_rows_have_no_scale(shape: tuple[int, ...], rule: str, bits: int) -> None:
    """An empty layer or row gets n1 = 0, as an all-zero one does (nothing to round)."""
    weight = torch.zeros(shape)
    assert select_n1(weight, bits, rule) == 0
    per_row = select_n1(weight, bits, rule, "channel")
    assert torch.equal(per_row, torch.zeros(shape[0], dtype=torch.int32))


def test_rows_max_of_empty_rows() -> None:
    assert torch.equal(n1_rows_max(torch.zeros(3, 0)), torch.zeros(3, dtype=torch.int32))
    assert torch.equal(n1_rows_max(torch.zeros(0, 0)), torch.zeros(0, dtype=torch.int32))


def test_mse_lowers_the_zero_share_of_a_ternary_layer() -> None:
    """The reason for the option: the paper's rule zeroes most of a Gaussian layer at 2 bits."""
    w = torch.randn(64, 64, generator=torch.Generator().manual_seed(0))
    paper = pow2_quantize(w, select_n1(w, 2, "max"), 2)
    mse = pow2_quantize(w, select_n1(w, 2, "mse"), 2)
    assert float((paper == 0).float().mean()) > 0.9
    assert float((mse == 0).float().mean()) < 0.6


def test_describe_n1() -> None:
    assert describe_n1(torch.zeros(0, dtype=torch.int32)) == "-"  # per channel, no channel
    assert describe_n1(torch.tensor([2, 2])) == "2"
    assert describe_n1(torch.tensor([-1, 2])) == "-1..2"
