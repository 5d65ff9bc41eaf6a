"""Activation ranges and scales (inq.quant.observers)."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from inq.quant.observers import Observer, act_range, fake_quantize, pow2_ceil


@given(st.floats(min_value=1e-30, max_value=1e30))
def test_pow2_ceil_is_the_smallest_power_of_two_above(value: float) -> None:
    p = pow2_ceil(value)
    assert math.frexp(p)[0] == 0.5  # a power of two
    assert p >= value > p / 2


@pytest.mark.parametrize("bits", [2, 4, 8])
def test_act_range_uses_every_code(bits: int) -> None:
    lo, hi = act_range(bits, signed=True)
    assert hi - lo + 1 == 2**bits and lo == -hi - 1
    assert act_range(bits, signed=False) == (0, 2**bits - 1)


@pytest.mark.parametrize("bits", [1, 9, 8.0, True])
def test_act_range_refuses_bad_bits(bits: object) -> None:
    with pytest.raises(ValueError, match="activation bits"):
        act_range(bits, signed=True)  # type: ignore[arg-type]


@given(
    st.lists(
        st.floats(-1e4, 1e4).filter(lambda v: v == 0 or abs(v) > 1e-30), min_size=1, max_size=50
    ),
    st.sampled_from([2, 4, 8]),
)
def test_max_scale_is_the_least_power_of_two_that_clips_nothing(values, bits) -> None:
    x = torch.tensor(values, dtype=torch.float64)
    obs = Observer("max", signed=None)
    obs.update(x)
    scale = obs.scale(bits, pow2=True)
    lo, hi = act_range(bits, obs.signed)
    if not bool((x != 0).any()):
        assert scale == 1.0
        return
    assert x.min() >= lo * scale and x.max() <= hi * scale  # nothing clipped
    assert x.min() < lo * scale / 2 or x.max() > hi * scale / 2  # half of it would clip
    assert obs.clipped(scale, bits) == 0.0


def test_percentile_clips_outliers_and_mse_beats_max() -> None:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(100_000, generator=gen)
    x[0] = 30.0  # one outlier decides the max scale
    scales = {}
    errors = {}
    for method in ("max", "percentile", "mse"):
        obs = Observer(method, signed=True)
        obs.update(x)
        scales[method] = obs.scale(8, pow2=True)
        errors[method] = float((fake_quantize(x, scales[method], -128, 127) - x).square().sum())
    assert scales["max"] == 0.25  # 30 / 127 -> 2**-2
    assert scales["percentile"] == 2**-5  # |x| < 3.9 but for 0.01 %: 3.9 / 127 -> 2**-5
    assert scales["percentile"] < scales["max"] and scales["mse"] < scales["max"]
    assert errors["mse"] <= min(errors.values())


def test_unseen_observer_and_unknown_method_fail_clearly() -> None:
    with pytest.raises(ValueError, match="no calibration data"):
        Observer("max", signed=True).scale(8, pow2=True)
    with pytest.raises(ValueError, match="unknown calibration 'minmax'"):
        Observer("minmax", signed=True)


def test_float_scales_are_exact_ratios() -> None:
    obs = Observer("max", signed=False)
    obs.update(torch.tensor([0.0, 3.0]))
    assert obs.scale(8, pow2=False) == 3.0 / 255
