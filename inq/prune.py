"""Pruning schedules: how much of each layer is pruned, and in how many rounds.

Pruning itself is :meth:`inq.scheduler.INQScheduler.prune` (magnitude, frozen at exact zeros);
this module turns a run's settings into the sparsity of every layer at every round:

- :func:`layer_targets`: one target sparsity for all layers, with per-layer overrides by
  module-name glob (Deep Compression and the INQ paper's Table 5 prune fully connected layers
  harder than convolutions);
- :func:`sparsity_schedule`: the sparsity after each of ``steps`` rounds, rising to the target
  ``cubic`` (Zhu & Gupta's gradual pruning: large steps first, small ones near the target, where
  each weight matters more) or ``linear``.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping, Sequence

__all__ = ["SCHEDULES", "layer_targets", "sparsity_schedule"]

SCHEDULES = ("cubic", "linear")


def layer_targets(
    names: Sequence[str], sparsity: float, overrides: Mapping[str, float] | None = None
) -> dict[str, float]:
    """The target sparsity of each layer: the first override whose glob matches, else ``sparsity``.

    Example:
        >>> layer_targets(["conv1", "conv2", "fc"], 0.8, {"fc": 0.95, "conv1": 0.5})
        {'conv1': 0.5, 'conv2': 0.8, 'fc': 0.95}

    Raises:
        ValueError: on a sparsity outside ``[0, 1)`` or a glob that matches no layer.
    """
    overrides = dict(overrides or {})
    for pattern, value in [("*", sparsity), *overrides.items()]:
        if not 0.0 <= value < 1.0:
            raise ValueError(f"sparsity {value} for {pattern!r} must lie in [0, 1)")
    for pattern in overrides:
        if not any(fnmatch.fnmatchcase(name, pattern) for name in names):
            raise ValueError(f"pattern {pattern!r} matches no target layer; layers are {names}")
    return {
        name: next(
            (v for p, v in overrides.items() if fnmatch.fnmatchcase(name, p)), float(sparsity)
        )
        for name in names
    }


def sparsity_schedule(target: float, steps: int, schedule: str = "cubic") -> list[float]:
    """The sparsity after each of ``steps`` pruning rounds, ending exactly at ``target``.

    ``cubic``: ``target * (1 - (1 - k / steps) ** 3)``; ``linear``: ``target * k / steps``.

    Example:
        >>> [round(s, 4) for s in sparsity_schedule(0.9, 3)]
        [0.6333, 0.8667, 0.9]
        >>> sparsity_schedule(0.9, 3, "linear")
        [0.3, 0.6, 0.9]

    Raises:
        ValueError: on ``steps < 1`` or an unknown schedule.
    """
    if steps < 1:
        raise ValueError(f"pruning needs at least one step, got {steps}")
    if schedule not in SCHEDULES:
        raise ValueError(f"unknown pruning schedule {schedule!r}; choose one of {SCHEDULES}")
    shape = (lambda t: 1 - (1 - t) ** 3) if schedule == "cubic" else (lambda t: t)
    return [target * shape(k / steps) if k < steps else target for k in range(1, steps + 1)]
