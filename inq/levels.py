"""Choosing level sets: the n1 of a layer or of each output channel, by the paper's rule or by
least squared rounding error.

The INQ paper takes ``n1 = floor(log2(4 * max|W| / 3))`` per layer (``rule="max"``): the top
level ``2**n1`` covers the largest weight. The zero threshold ``2**(n2-1)`` then lies between
``max|W| / 3`` and ``2 max|W| / 3`` at 2 bits, between ``max|W| / 6`` and ``max|W| / 3`` at 3
bits, and most weights of a trained layer, which cluster near zero, become zero.
``rule="mse"`` instead picks, per level set, the n1 whose Eq. 4 rounding has the least squared
error ``sum (w - Q(w))**2`` over the float weights (an exact search, see :func:`select_n1`).
``granularity="channel"`` gives every slice along dim 0 (the output channel of a conv or linear
weight) its own level set.

Example:
    >>> w = torch.tensor([[1.0, 0.4, 0.4, 0.4], [0.1, 0.05, -0.02, 0.0]])
    >>> select_n1(w, bits=2)                      # the paper: one n1 from max|W| = 1.0
    0
    >>> select_n1(w, bits=2, rule="mse")          # ternary {0, +-0.5}: less error than +-1
    -1
    >>> select_n1(w, bits=2, granularity="channel").tolist()
    [0, -3]
"""

from __future__ import annotations

import math

import torch

from inq.pow2 import N1, check_bits, max_rule_n1, pow2_n1, pow2_quantize

__all__ = [
    "GRANULARITIES",
    "N1_RULES",
    "check_level_options",
    "describe_n1",
    "n1_rows_max",
    "select_n1",
]

N1_RULES = ("max", "mse")
GRANULARITIES = ("layer", "channel")


def check_level_options(n1_rule: str, granularity: str) -> None:
    """Raise ``ValueError`` unless ``n1_rule`` and ``granularity`` are known options.

    Example:
        >>> check_level_options("mse", "channel")
    """
    if n1_rule not in N1_RULES:
        raise ValueError(f"n1_rule must be one of {N1_RULES}, got {n1_rule!r}")
    if granularity not in GRANULARITIES:
        raise ValueError(f"granularity must be one of {GRANULARITIES}, got {granularity!r}")


def select_n1(weight: torch.Tensor, bits: int, rule: str = "max", granularity: str = "layer") -> N1:
    """The n1 of ``weight``'s level set(s): an int per layer, or int32 ``[O]`` per channel.

    ``rule="max"`` is :func:`inq.pow2.pow2_n1` (per row for channels). ``rule="mse"`` returns
    the n1 with the least squared rounding error, ties to the larger n1. The search is exact:

    - no n1 above the max rule's helps: every ``|w| < 1.5 * 2**n1``, so each weight rounds to
      the same level or, near zero, to a coarser one (the smallest level is lost);
    - going down from there, the weights above ``1.5 * 2**n1`` clamp to ``2**n1`` and their
      error alone is a lower bound of the total that only grows as n1 falls; the search stops
      once that bound reaches the best error found, so no skipped n1 can be better.

    Errors are sums of squares in float64 (relative rounding at most ``K * 2**-53`` for ``K``
    weights per level set), so "less error" is decided to that precision.

    An empty weight, or an empty row, has no scale: its n1 is 0, as for all-zero weights.

    Example:
        >>> select_n1(torch.zeros(3, 0), bits=4, granularity="channel").tolist()
        [0, 0, 0]

    Raises:
        ValueError: on bad bits, rule or granularity, a non-float or 0-d weight, or NaN/inf.
    """
    check_bits(bits)
    check_level_options(rule, granularity)
    if granularity == "layer" and rule == "max":
        return pow2_n1(weight)
    if weight.dim() == 0:
        raise ValueError("select_n1 needs a tensor of rank >= 1, got a 0-d tensor")
    count = 1 if granularity == "layer" else weight.shape[0]
    # explicit widths: reshape(0, -1) of a [0, K] weight is ambiguous and raises
    width = weight.numel() if granularity == "layer" else math.prod(weight.shape[1:])
    rows = weight.detach().reshape(count, width)
    n1 = n1_rows_max(rows)
    if rule == "mse":
        n1 = _least_squares_n1(rows, n1, bits)
    return int(n1) if granularity == "layer" else n1


def describe_n1(n1: N1 | None) -> str:
    """n1 for a table: the int, or the range of a per-channel n1 ("-" for none, or no channel).

    Example:
        >>> describe_n1(-3), describe_n1(torch.tensor([-3, -5, -4])), describe_n1(None)
        ('-3', '-5..-3', '-')
    """
    if n1 is None or (isinstance(n1, torch.Tensor) and n1.numel() == 0):
        return "-"
    if isinstance(n1, int):
        return str(n1)
    low, high = int(n1.min()), int(n1.max())
    return str(low) if low == high else f"{low}..{high}"


def n1_rows_max(rows: torch.Tensor) -> torch.Tensor:
    """The paper's n1 of every row of a 2-d tensor (int32 ``[R]``, on ``rows``' device); 0 for an
    all-zero or empty row (:func:`inq.pow2.max_rule_n1` of the row maxima).

    Example:
        >>> n1_rows_max(torch.tensor([[0.1, -0.75], [0.74, 0.0], [0.0, 0.0]])).tolist()
        [0, -1, 0]
        >>> n1_rows_max(torch.zeros(2, 0)).tolist()
        [0, 0]

    Raises:
        ValueError: if a row holds NaN or infinity.
    """
    if rows.shape[1] == 0:  # amax over an empty dim raises; an empty row's peak is 0
        return torch.zeros(rows.shape[0], dtype=torch.int32, device=rows.device)
    peak = rows.abs().amax(dim=1).to(torch.float32)
    if not bool(torch.isfinite(peak).all()):
        raise ValueError("select_n1: the weight holds NaN or infinity; fix the model first")
    return max_rule_n1(peak)


def _least_squares_n1(rows: torch.Tensor, n1_max: torch.Tensor, bits: int) -> torch.Tensor:
    magnitude = rows.abs().double()
    best = n1_max.clone()
    best_error = _squared_error(rows, best, bits)
    searching = torch.ones_like(best, dtype=torch.bool)
    candidate = n1_max.clone()
    while bool(searching.any()):
        candidate -= 1
        top = torch.ldexp(torch.ones_like(magnitude[:, :1]), candidate[:, None].double())
        clamped = torch.where(magnitude >= 1.5 * top, (magnitude - top) ** 2, 0.0).sum(dim=1)
        searching &= clamped < best_error
        error = _squared_error(rows, candidate, bits)
        better = searching & (error < best_error)
        best = torch.where(better, candidate, best)
        best_error = torch.where(better, error, best_error)
    return best


def _squared_error(rows: torch.Tensor, n1: torch.Tensor, bits: int) -> torch.Tensor:
    """``sum (w - Q(w))**2`` per row, in float64."""
    snapped = pow2_quantize(rows, n1, bits)
    return ((rows.double() - snapped.double()) ** 2).sum(dim=1)
