"""inq.prune: per-layer targets and the sparsity schedule of the pruning rounds."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from inq.prune import layer_targets, sparsity_schedule


@given(
    target=st.floats(0.0, 0.999),
    steps=st.integers(1, 20),
    schedule=st.sampled_from(["cubic", "linear"]),
)
def test_schedule_rises_to_the_target_exactly(target: float, steps: int, schedule: str) -> None:
    values = sparsity_schedule(target, steps, schedule)
    assert len(values) == steps and values[-1] == target
    assert all(0.0 <= a <= b <= target for a, b in itertools.pairwise(values))


def test_cubic_prunes_most_in_the_first_rounds() -> None:
    steps = sparsity_schedule(0.9, 4)
    increments = [b - a for a, b in zip([0.0, *steps], steps, strict=False)]
    assert increments == sorted(increments, reverse=True)
    assert steps[0] == pytest.approx(0.9 * (1 - 0.75**3))


@pytest.mark.parametrize(
    ("args", "message"),
    [((0.9, 0), "at least one step"), ((0.9, 3, "exp"), "unknown pruning schedule")],
)
def test_bad_schedules_raise(args: tuple, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        sparsity_schedule(*args)


def test_first_matching_glob_wins_and_others_take_the_default() -> None:
    names = ["features.0", "features.3", "classifier.1", "classifier.4"]
    targets = layer_targets(names, 0.7, {"classifier.4": 0.5, "classifier.*": 0.95})
    assert targets == {
        "features.0": 0.7,
        "features.3": 0.7,
        "classifier.1": 0.95,
        "classifier.4": 0.5,
    }


@pytest.mark.parametrize(
    ("sparsity", "overrides", "message"),
    [
        (1.0, {}, r"must lie in \[0, 1\)"),
        (0.5, {"fc": -0.1}, r"must lie in \[0, 1\)"),
        (0.5, {"head*": 0.9}, "matches no target layer"),
    ],
)
def test_bad_targets_raise(sparsity: float, overrides: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        layer_targets(["conv", "fc"], sparsity, overrides)
