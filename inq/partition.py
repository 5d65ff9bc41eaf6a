"""Which still-float weights join the quantized group at a stage.

A partition is cumulative: at stage k exactly ``quantized_count(portion_k, N)`` weights of a layer
are quantized, the new ones drawn only from the weights that are still float. A quantized weight
never returns to the float group.

- ``magnitude`` (the paper's "pruning-inspired" rule, the default): largest ``|w|`` first, ties
  broken by the lower flat index, so the choice is deterministic.
- ``random``: uniform over the still-float weights, from a CPU generator seeded by
  ``(seed, layer name, stage)``; every process of a distributed run draws the same set.
- ``error`` (beyond the paper, which suggests it): smallest rounding error ``|w - Q(w)|`` to the
  layer's level set first, ties to the lower flat index; the weights far from every level stay
  float longest, so retraining can move them before they are snapped.
"""

from __future__ import annotations

import hashlib
import math
from fractions import Fraction

import torch

__all__ = ["STRATEGIES", "grow_mask", "prune_mask", "quantized_count"]

STRATEGIES = ("magnitude", "random", "error")


def quantized_count(portion: float, numel: int) -> int:
    """``round(portion * numel)``, half up, on the exact decimal value of ``portion``.

    Using the decimal the user wrote (``0.3`` is 3/10, not the binary float just below it) keeps
    the count free of floating-point surprises: ``quantized_count(0.5, 5) == 3``.

    Example:
        >>> quantized_count(0.3, 10), quantized_count(0.5, 7), quantized_count(1.0, 7)
        (3, 4, 7)
    """
    exact = Fraction(repr(float(portion))) * numel
    return int(exact + Fraction(1, 2)) if exact >= 0 else 0  # int() floors non-negatives


def grow_mask(
    weight: torch.Tensor,
    mask: torch.Tensor,
    count: int,
    strategy: str = "magnitude",
    seed: int = 0,
    key: str = "",
    snapped: torch.Tensor | None = None,
) -> torch.Tensor:
    """A new mask with exactly ``count`` entries set: ``mask`` plus weights chosen by ``strategy``.

    Args:
        weight: the layer's weights (any shape, any device).
        mask: bool tensor of the same shape, True where a weight is already quantized.
        count: how many weights must be quantized after this call (``>= mask.sum()``).
        strategy: ``"magnitude"``, ``"random"`` or ``"error"``.
        seed, key: seed the ``random`` draw (key names the layer and stage).
        snapped: ``error`` only: the weights rounded to their level sets (same shape).

    Example:
        >>> w = torch.tensor([0.1, -0.5, 0.3, 0.5])
        >>> grow_mask(w, torch.zeros(4, dtype=torch.bool), 2)
        tensor([False,  True, False,  True])

    Raises:
        ValueError: on an unknown strategy, mismatched shapes, a count outside
            ``[mask.sum(), weight.numel()]``, NaN/infinite weights (``magnitude``, ``error``),
            or ``error`` without ``snapped``.
    """
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown partition strategy {strategy!r}; choose one of {STRATEGIES}")
    need = _needed(weight, mask, count)
    if need == 0:
        return mask.clone()
    if strategy in ("magnitude", "error"):
        scores = _magnitudes(weight, "grow_mask")
        if strategy == "error":
            if snapped is None or snapped.shape != weight.shape:
                raise ValueError("grow_mask: strategy 'error' needs the snapped weights")
            # negation is exact; ``error.max() - error`` would round tiny errors into ties
            scores = (weight.detach().float() - snapped.float()).abs_().neg_()
    else:  # uniform keys from a CPU generator: the same draw on every device and process
        generator = torch.Generator().manual_seed(_seed_for(seed, key))
        scores = torch.rand(weight.shape, generator=generator).to(weight.device)
    return mask | _largest_free(scores, mask, need)


def prune_mask(weight: torch.Tensor, pruned: torch.Tensor, count: int) -> torch.Tensor:
    """A new mask with exactly ``count`` entries set: ``pruned`` plus the smallest ``|w|`` of the
    rest, ties to the lower flat index (magnitude pruning; masks only grow).

    Example:
        >>> w = torch.tensor([0.1, -0.5, 0.0, -0.1])
        >>> prune_mask(w, torch.tensor([False, False, False, False]), 2)
        tensor([ True, False,  True, False])

    Raises:
        ValueError: on mismatched shapes, a count outside ``[pruned.sum(), weight.numel()]``
            or NaN/infinite weights.
    """
    need = _needed(weight, pruned, count)
    if need == 0:
        return pruned.clone()
    scores = _magnitudes(weight, "prune_mask").neg_()  # exact: the smallest |w| scores highest
    return pruned | _largest_free(scores, pruned, need)


def _needed(weight: torch.Tensor, mask: torch.Tensor, count: int) -> int:
    """How many entries a mask must gain to hold ``count`` (masks only grow)."""
    if mask.shape != weight.shape or mask.dtype != torch.bool:
        raise ValueError("mask must be a bool tensor with the weight's shape")
    have = int(mask.sum())
    if not have <= count <= weight.numel():
        raise ValueError(f"count {count} outside [{have}, {weight.numel()}] (masks only grow)")
    return count - have


def _magnitudes(weight: torch.Tensor, caller: str) -> torch.Tensor:
    """``|w|`` in float32, a fresh tensor; refuses NaN and infinity, which cannot be ranked."""
    scores = weight.detach().abs().float()
    if not bool(torch.isfinite(scores).all()):
        raise ValueError(f"{caller}: the weight holds NaN or infinity; cannot rank it")
    return scores


def _largest_free(scores: torch.Tensor, mask: torch.Tensor, k: int) -> torch.Tensor:
    """Mask of the ``k`` largest finite scores outside ``mask``, ties to the lower flat index.

    O(n): one k-th value selection over the free entries, no sort. ``scores`` is scratch: the
    caller's own temporary, overwritten here.
    """
    free = ~mask.flatten()
    free_scores = scores.flatten()[free]
    if k == free_scores.numel():
        return free.view_as(mask)
    threshold = _kth_smallest(free_scores, free_scores.numel() - k + 1)
    flat = scores.flatten().masked_fill_(~free, -math.inf)  # frozen entries are never taken
    above = flat > threshold
    at = flat == threshold
    room = k - int(above.sum())
    if int(at.sum()) > room:
        at &= at.cumsum(0) <= room
    return (above | at).view_as(mask)


def _kth_smallest(values: torch.Tensor, k: int) -> float:
    """The k-th smallest value (1-based) of a scratch tensor, which it may reorder.

    The value is unique whatever the algorithm; numpy's in-place introselect is several times
    faster than ``torch.kthvalue`` on CPU.
    """
    if values.device.type == "cpu":
        array = values.numpy()
        array.partition(k - 1)
        return float(array[k - 1])
    return float(torch.kthvalue(values, k).values)


def _seed_for(seed: int, key: str) -> int:
    digest = hashlib.sha256(f"{seed}/{key}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)
