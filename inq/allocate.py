"""Mixed precision chosen for the user: per-layer bits under a size budget, solved exactly.

Each layer INQ quantizes (the scheduler's targets, same names, same ``include``/``exclude``
globs) gets one bit-width from ``choices`` so that the summed *sensitivity* of the layers is the
least any allocation within the size budget reaches. The sensitivity of layer ``l`` at ``b``
bits is measured on a few calibration batches, without training:

- ``method="loss"``: the mean loss increase when layer ``l`` alone is snapped to its ``b``-bit
  level set (the paper's: :func:`inq.levels.select_n1` with the scheduler's ``n1_rule`` and
  ``granularity``, then :func:`inq.pow2.pow2_quantize`, Eq. 4), every other layer float; the
  weight is written back bit for bit afterwards.
- ``method="hessian"`` (HAWQ-v2): ``tr(H_l) / n_l * ||W_l - Q_b(W_l)||^2``, the mean Hessian
  trace of the layer's ``n_l`` weights times its squared rounding error at ``b`` bits. The
  trace is Hutchinson's estimate ``E[v^T H v]`` over ``samples`` Rademacher vectors ``v`` (drawn
  from a generator seeded by ``seed``), each product ``H v`` by double backprop of the mean
  loss over the batches; one ``v`` covers every layer at once (the cross terms have mean 0).
  The estimate of a small trace can come out negative (seen on ResNet-20's last convs with 8
  samples). The layer's sensitivities are then <= 0 and non-decreasing in ``b`` (more bits
  never add rounding error). So its lowest choice has both the least sensitivity and the least
  size, and is chosen, as it would be with the trace clamped at 0.

Size: what the packed file (:mod:`inq.packed`) stores for a layer's codes, headers aside
(``size="packed"``, the default): a weight ``[O, ...]`` of ``K`` weights a row takes ``O *
ceil(K * w / 8)`` bytes, ``w = 4`` (nibbles) for 2 to 4 bits and ``w = 8`` (a byte) for 5 to 8
bits (:func:`inq.codes.row_bytes`). So 2, 3 and 4 bits cost the same in that file, as do 5 to 8
bits: under a packed budget a lower choice is taken only where it is no more sensitive.
``size="nominal"`` counts ``ceil(n * b / 8)`` bytes a layer instead: the size of a store with
``b``-bit fields (the figure most papers quote). A budget is bytes, or average bits per
quantized weight: ``8 * bytes / weights`` over every quantized layer, pinned ones included.

The solve is a multiple-choice knapsack, exact (:func:`solve_knapsack`).

Example:
    >>> import torch
    >>> from torch import nn
    >>> from inq import INQScheduler
    >>> _ = torch.manual_seed(0)
    >>> model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    >>> batches = [(torch.randn(32, 8), torch.randint(0, 4, (32,)))]
    >>> bits = allocate_bits(model, nn.functional.cross_entropy, batches, avg_bits=6.0,
    ...                      choices=(4, 8))
    >>> bits
    {'0': 4, '2': 8}
    >>> sched = INQScheduler(model, bits=4, layer_bits=bits)   # then INQ as usual
"""

from __future__ import annotations

import contextlib
import fnmatch
import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import torch
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_leaves

from inq.codes import row_bytes
from inq.levels import check_level_options, select_n1
from inq.pow2 import N1, check_bits, pow2_quantize
from inq.scheduler import _select_targets, assign_layer_bits

__all__ = [
    "DEFAULT_CHOICES",
    "METHODS",
    "SIZES",
    "Allocation",
    "BudgetError",
    "LayerAllocation",
    "MethodError",
    "allocate",
    "allocate_bits",
    "check_budget",
    "check_method",
    "hessian_traces",
    "layer_bytes",
    "loss_sensitivities",
    "solve_knapsack",
]

DEFAULT_CHOICES = (2, 3, 4, 5, 8)
METHODS = ("loss", "hessian")
SIZES = ("packed", "nominal")
Batch = tuple[torch.Tensor, torch.Tensor]
LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
CACHE_BYTES = 2**30  # the loss method's kept activations, per calibration batch


class BudgetError(ValueError):
    """No allocation meets the budget; ``argument`` says what to change: ``"pinned"`` (the
    pinned layers alone exceed it) or ``"budget"``."""

    def __init__(self, argument: str, message: str) -> None:
        super().__init__(message)
        self.argument = argument


class MethodError(ValueError):
    """The sensitivity method cannot run on the model (``"hessian"``: it cannot be
    differentiated twice)."""


def layer_bytes(shape: Sequence[int], bits: int, size: str = "packed") -> int:
    """Bytes of a weight of ``shape``'s codes at ``bits`` bits: as the packed file stores them
    (``"packed"``: ``O`` rows of :func:`inq.codes.row_bytes`) or ``ceil(n * bits / 8)``
    (``"nominal"``).

    Example:
        >>> layer_bytes((16, 3, 3, 3), 3), layer_bytes((16, 3, 3, 3), 5)
        (224, 432)
        >>> layer_bytes((16, 3, 3, 3), 3, size="nominal")
        162
    """
    check_bits(bits)
    if size not in SIZES:
        raise ValueError(f"size must be one of {SIZES}, got {size!r}")
    rows, per_row = (shape[0], math.prod(shape[1:])) if len(shape) else (1, 1)
    if size == "nominal":
        return (rows * per_row * bits + 7) // 8
    return rows * row_bytes(per_row, bits)


@dataclass(frozen=True)
class LayerAllocation:
    """One quantized layer: its name, weight shape, sensitivity per choice (empty for a pinned
    layer, which is not measured), the bits it gets, whether a ``pinned`` glob set them, and
    its bytes at those bits."""

    name: str
    shape: tuple[int, ...]
    sensitivity: dict[int, float]
    bits: int
    pinned: bool
    nbytes: int

    @property
    def params(self) -> int:
        """Number of weights."""
        return math.prod(self.shape)


@dataclass(frozen=True)
class Allocation:
    """The result of :func:`allocate`: every quantized layer's bits, and how they were chosen.

    ``budget_bytes`` is the budget in bytes (an ``avg_bits`` budget rounded down to whole
    bytes), ``total_bytes`` what the chosen bits take (``<= budget_bytes``).
    """

    method: str
    size: str
    choices: tuple[int, ...]
    budget_bytes: int
    layers: tuple[LayerAllocation, ...]
    settings: dict[str, Any] = field(default_factory=dict)

    @property
    def bits(self) -> dict[str, int]:
        """``{layer: bits}`` in module order: ``INQScheduler(layer_bits=...)`` takes it."""
        return {layer.name: layer.bits for layer in self.layers}

    @property
    def params(self) -> int:
        """Quantized weights in all."""
        return sum(layer.params for layer in self.layers)

    @property
    def total_bytes(self) -> int:
        """Bytes of every layer's codes at its chosen bits."""
        return sum(layer.nbytes for layer in self.layers)

    @property
    def avg_bits(self) -> float:
        """``8 * total_bytes / params``: the average bits a weight costs."""
        return 8 * self.total_bytes / max(1, self.params)

    @property
    def sensitivity(self) -> float:
        """The summed sensitivity of the free (not pinned) layers at their bits."""
        return math.fsum(layer.sensitivity[layer.bits] for layer in self.layers if not layer.pinned)

    def table(self) -> str:
        """A text table: one row per layer (weights, sensitivity at each choice, bits, bytes),
        then the totals.

        Example:
            >>> row = LayerAllocation("fc", (4, 8), {2: 0.5, 4: 0.125}, 4, False, 16)
            >>> print(Allocation("loss", "packed", (2, 4), 16, (row,)).table())
            layer       weights          2          4  bits    bytes
            fc               32        0.5      0.125     4       16
            total            32                        4.00       16  (budget 16 bytes)
        """
        head = f"{'layer':<10} {'weights':>8} " + " ".join(f"{b:>10}" for b in self.choices)
        lines = [f"{head}  bits    bytes"]
        for layer in self.layers:
            cells = " ".join(
                f"{layer.sensitivity[b]:>10.4g}" if b in layer.sensitivity else f"{'-':>10}"
                for b in self.choices
            )
            bits = f"{layer.bits}{'*' if layer.pinned else ''}"
            lines.append(f"{layer.name:<10} {layer.params:>8} {cells} {bits:>5} {layer.nbytes:>8}")
        pad = " " * (11 * len(self.choices) - 1)
        lines.append(
            f"{'total':<10} {self.params:>8} {pad} {self.avg_bits:>5.2f} {self.total_bytes:>8}"
            f"  (budget {self.budget_bytes} bytes)"
        )
        if any(layer.pinned for layer in self.layers):
            lines.append("* pinned (not measured)")
        return "\n".join(lines)

    def as_dict(self) -> dict[str, Any]:
        """Plain JSON-able form (``summary.json``, checkpoints); :meth:`from_dict` reads it.

        Example:
            >>> row = LayerAllocation("fc", (4, 8), {2: 0.5, 4: 0.125}, 4, False, 16)
            >>> a = Allocation("loss", "packed", (2, 4), 16, (row,))
            >>> Allocation.from_dict(a.as_dict()) == a
            True
        """
        return {
            "method": self.method,
            "size": self.size,
            "choices": list(self.choices),
            "budget_bytes": self.budget_bytes,
            "total_bytes": self.total_bytes,
            "avg_bits": self.avg_bits,
            "params": self.params,
            "sensitivity": self.sensitivity,
            "settings": dict(self.settings),
            "layers": [
                {
                    "name": layer.name,
                    "shape": list(layer.shape),
                    "params": layer.params,
                    "sensitivity": {str(b): s for b, s in layer.sensitivity.items()},
                    "bits": layer.bits,
                    "pinned": layer.pinned,
                    "bytes": layer.nbytes,
                }
                for layer in self.layers
            ],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Allocation:
        """The allocation :meth:`as_dict` wrote."""
        layers = tuple(
            LayerAllocation(
                name=row["name"],
                shape=tuple(row["shape"]),
                sensitivity={int(b): float(s) for b, s in row["sensitivity"].items()},
                bits=int(row["bits"]),
                pinned=bool(row["pinned"]),
                nbytes=int(row["bytes"]),
            )
            for row in data["layers"]
        )
        return cls(
            method=data["method"],
            size=data["size"],
            choices=tuple(data["choices"]),
            budget_bytes=int(data["budget_bytes"]),
            layers=layers,
            settings=dict(data.get("settings", {})),
        )


def allocate_bits(
    model: nn.Module, loss_fn: LossFn, batches: Iterable[Batch], **options: Any
) -> dict[str, int]:
    """``{layer: bits}`` of :func:`allocate` (same arguments): the bits of every quantized
    layer, ready for ``INQScheduler(model, layer_bits=...)``.

    Example:
        >>> model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
        >>> batches = [(torch.randn(8, 4), torch.randint(0, 2, (8,)))]
        >>> allocate_bits(model, nn.functional.cross_entropy, batches, max_bytes=32,
        ...               choices=(4, 8), pinned={"2": 8})
        {'0': 4, '2': 8}
    """
    return allocate(model, loss_fn, batches, **options).bits


def allocate(
    model: nn.Module,
    loss_fn: LossFn,
    batches: Iterable[Batch],
    *,
    avg_bits: float | None = None,
    max_bytes: int | None = None,
    choices: Sequence[int] = DEFAULT_CHOICES,
    method: str = "loss",
    pinned: Mapping[str, int] | None = None,
    include: str | Sequence[str] | None = None,
    exclude: str | Sequence[str] | None = None,
    n1_rule: str = "max",
    granularity: str = "layer",
    size: str = "packed",
    samples: int = 8,
    seed: int = 0,
) -> Allocation:
    """Each quantized layer's bits: the least summed sensitivity within the size budget.

    Give exactly one budget: ``avg_bits`` (average bits per quantized weight, pinned layers
    included: ``8 * bytes / weights``) or ``max_bytes``. ``pinned`` (``{glob: bits}``, as
    ``INQScheduler``'s ``layer_bits``: the first glob that matches a layer sets its bits) fixes
    layers; their bytes count against the budget and their bits need not be among ``choices``.
    ``batches``: ``(inputs, targets)`` pairs (read once, kept, moved to the model's device);
    the loss is ``loss_fn(model(inputs), targets)``, its mean over the batches, in eval mode
    (the model's train/eval flags are put back). ``samples`` and ``seed``: Hutchinson's
    vectors (``method="hessian"``). The rest as :class:`~inq.scheduler.INQScheduler`.

    The result is optimal: no allocation of ``choices`` to the free layers within the budget
    has a smaller summed sensitivity (:func:`solve_knapsack`, exact); of equally sensitive
    ones it takes the smallest, then the one with the lower bits in the first layer where they
    differ. Deterministic: the same model, batches and arguments give the same bits.

    Raises:
        BudgetError: (a ValueError) in one line: a budget no allocation meets (naming the
            smallest one that is met), or pinned layers alone over the budget.
        ValueError: in one line: no budget or both, a budget no allocation meets (naming the
            smallest one that is met), pinned layers alone over the budget, an empty choice
            set, bits outside 2..8, an unknown method, size, n1 rule or granularity, a glob
            that matches no layer, no batches or a non-finite loss.
        MethodError: (a ValueError) a model the Hessian method cannot differentiate twice
            (:func:`check_method` finds it before training).
    """
    _check_method_name(method)
    check_level_options(n1_rule, granularity)
    if samples < 1:
        raise ValueError(f"samples must be >= 1, got {samples}")
    plan = _plan(model, avg_bits, max_bytes, choices, pinned, include, exclude, size)
    choices, free, shapes = plan.choices, plan.free, plan.shapes
    sensitivity: dict[str, dict[int, float]] = {}
    if free:
        data = _materialized(batches, model)
        weights = {name: weight for name, weight in plan.targets if name in free}
        if method == "loss":
            sensitivity = loss_sensitivities(
                model, loss_fn, data, weights, choices, n1_rule, granularity
            )
        else:
            traces = hessian_traces(model, loss_fn, data, weights, samples, seed)
            sensitivity = {
                name: {
                    b: traces[name] / max(1, w.numel()) * _squared_error(w, b, n1_rule, granularity)
                    for b in choices
                }
                for name, w in weights.items()
            }
    values = [[sensitivity[n][b] for b in choices] for n in free]
    picks = solve_knapsack(plan.costs, values, plan.budget - plan.fixed_bytes)
    bits = {**plan.own, **{n: choices[j] for n, j in zip(free, picks, strict=True)}}
    layers = tuple(
        LayerAllocation(
            name=n,
            shape=shapes[n],
            sensitivity=sensitivity.get(n, {}),
            bits=bits[n],
            pinned=n not in free,
            nbytes=layer_bytes(shapes[n], bits[n], size),
        )
        for n in plan.own
    )
    settings = {"n1_rule": n1_rule, "granularity": granularity, "samples": samples, "seed": seed}
    return Allocation(method, size, choices, plan.budget, layers, settings)


def check_budget(
    model: nn.Module,
    *,
    avg_bits: float | None = None,
    max_bytes: int | None = None,
    choices: Sequence[int] = DEFAULT_CHOICES,
    pinned: Mapping[str, int] | None = None,
    include: str | Sequence[str] | None = None,
    exclude: str | Sequence[str] | None = None,
    size: str = "packed",
) -> int:
    """The budget in bytes, once :func:`allocate`'s checks that need no data have passed (so
    an app can refuse a budget before it trains anything).

    Example:
        >>> check_budget(nn.Linear(16, 4), avg_bits=4.0, choices=(2, 4))
        32
        >>> check_budget(nn.Linear(16, 4), avg_bits=3.0, choices=(2, 4))  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        inq.allocate.BudgetError: no allocation of [2, 4] bits fits 24 bytes ...: the smallest ...

    Raises:
        BudgetError: (a ValueError) if no allocation meets the budget.
        ValueError: as :func:`allocate`, for the budget, the choices and the globs.
    """
    return _plan(model, avg_bits, max_bytes, choices, pinned, include, exclude, size).budget


@dataclass(frozen=True)
class _Plan:
    """What the budget check finds: the targets, each layer's default or pinned bits (module
    order), the free layers, their shapes, the budget, the pinned bytes, each free layer's cost
    per choice."""

    choices: tuple[int, ...]
    targets: list[tuple[str, nn.Parameter]]
    own: dict[str, int]
    free: list[str]
    shapes: dict[str, tuple[int, ...]]
    budget: int
    fixed_bytes: int
    costs: list[list[int]]


def _plan(
    model: nn.Module,
    avg_bits: float | None,
    max_bytes: int | None,
    choices: Sequence[int],
    pinned: Mapping[str, int] | None,
    include: str | Sequence[str] | None,
    exclude: str | Sequence[str] | None,
    size: str,
) -> _Plan:
    choices = _checked_choices(choices)
    if size not in SIZES:
        raise ValueError(f"size must be one of {SIZES}, got {size!r}")
    targets = _select_targets(model, include, exclude)
    names = [name for name, _ in targets]
    own = assign_layer_bits(names, choices[0], pinned)  # checks every glob and its bits
    fixed = _pinned_names(names, pinned)
    shapes = {name: tuple(weight.shape) for name, weight in targets}
    params = sum(math.prod(s) for s in shapes.values())
    budget = _budget_bytes(avg_bits, max_bytes, params)
    free = [name for name in names if name not in fixed]
    fixed_bytes = sum(layer_bytes(shapes[n], own[n], size) for n in fixed)
    costs = [[layer_bytes(shapes[n], b, size) for b in choices] for n in free]
    least = fixed_bytes + sum(min(c) for c in costs)
    if fixed_bytes > budget:
        raise BudgetError(
            "pinned",
            f"the pinned layers alone take {fixed_bytes} bytes "
            f"({_avg(fixed_bytes, params)} average bits), over the budget of {budget} bytes "
            f"({_avg(budget, params)}); the smallest budget that fits is {least} bytes "
            f"({_avg_at_least(least, params)} average bits), or pin fewer bits",
        )
    if least > budget:
        raise BudgetError(
            "budget",
            f"no allocation of {list(choices)} bits fits {budget} bytes "
            f"({_avg(budget, params)} average bits): the smallest takes {least} bytes "
            f"({_avg_at_least(least, params)} average bits)",
        )
    return _Plan(choices, targets, own, free, shapes, budget, fixed_bytes, costs)


def solve_knapsack(
    costs: Sequence[Sequence[int]], values: Sequence[Sequence[float]], capacity: int
) -> list[int]:
    """The multiple-choice knapsack, solved exactly: one option ``j`` per group ``g`` so that
    ``sum costs[g][j] <= capacity`` and ``sum values[g][j]`` is least; returns each group's
    option index.

    Exact: values (finite floats, any sign) are scaled to integers by their largest power-of-two
    denominator, so sums and comparisons have no rounding. A dynamic programme over the groups,
    last to first, keeps for each reachable total cost of the groups seen the best partial
    choice, and drops any partial choice another one beats on both cost (<=) and value (<=):
    whatever the earlier groups add, the dropped one's completion is no better than the other's
    (the same completion fits the budget and sums no more), so an optimum survives. Partial
    costs that leave the unseen groups no room even at their cheapest are dropped too. Among
    equal values it returns the one of least cost, then the lexicographically smallest index
    list (options ordered as given: lower bits first). Work: ``O(groups * options * states *
    groups)``, ``states`` at most the distinct partial costs.

    Example:
        >>> solve_knapsack([[1, 2], [1, 2]], [[5.0, 1.0], [3.0, 2.0]], capacity=3)
        [1, 0]

    Raises:
        ValueError: if no choice fits ``capacity``, a group has no option or its costs and
            values differ in length, or a value is not finite.
    """
    if len(costs) != len(values) or any(
        not c or len(c) != len(v) for c, v in zip(costs, values, strict=True)
    ):
        raise ValueError("solve_knapsack: each group needs as many costs as values, at least one")
    flat = [float(x) for v in values for x in v]
    if not all(math.isfinite(x) for x in flat):
        raise ValueError("solve_knapsack: every value must be finite")
    scale = max((Fraction(x).denominator for x in flat), default=1)
    exact = [[int(Fraction(float(x)) * scale) for x in v] for v in values]
    cheapest = [0]  # cheapest[g]: least cost of groups 0..g-1
    for options in costs:
        cheapest.append(cheapest[-1] + min(options))
    if cheapest[-1] > capacity:
        raise ValueError(f"solve_knapsack: the cheapest choice costs {cheapest[-1]} > {capacity}")
    states: dict[int, tuple[int, tuple[int, ...]]] = {0: (0, ())}  # cost -> (value, options)
    for g in range(len(costs) - 1, -1, -1):
        room = capacity - cheapest[g]
        grown: dict[int, tuple[int, tuple[int, ...]]] = {}
        for cost, (value, tail) in states.items():
            for j, (c, v) in enumerate(zip(costs[g], exact[g], strict=True)):
                total = cost + c
                if total > room:
                    continue
                candidate = (value + v, (j, *tail))
                if total not in grown or candidate < grown[total]:
                    grown[total] = candidate
        states, best = {}, None
        for cost in sorted(grown):  # keep only what no cheaper state beats or equals in value
            if best is None or grown[cost][0] < best:
                states[cost] = grown[cost]
                best = grown[cost][0]
    # on the frontier values strictly fall as costs rise: its most costly state is the optimum
    return list(states[max(states)][1])


def loss_sensitivities(
    model: nn.Module,
    loss_fn: LossFn,
    batches: Sequence[Batch],
    weights: Mapping[str, nn.Parameter],
    choices: Sequence[int],
    n1_rule: str = "max",
    granularity: str = "layer",
    cache_bytes: int = CACHE_BYTES,
) -> dict[str, dict[int, float]]:
    """``{layer: {bits: loss increase}}``: the mean loss over ``batches`` with the layer alone
    snapped to ``bits`` (its level set chosen as the scheduler would: ``n1_rule``,
    ``granularity``), minus the float model's, in eval mode. Every weight is written back bit
    for bit, and every module's train/eval flag, whatever happens.

    Each batch's float forward keeps the outputs of the model's leaf modules (up to
    ``cache_bytes``); a forward with one layer snapped takes back those of the calls made before
    that layer's weight is first used, which cannot depend on it (:class:`_Replay`), so only
    the rest of the model runs again: the same losses, bit for bit, at about half the work.

    Raises:
        ValueError: if a loss is not finite.
    """
    base: list[float] = []
    losses: dict[str, dict[int, list[float]]] = {n: {b: [] for b in choices} for n in weights}
    n1s: dict[tuple[str, int], N1] = {}  # each level set chosen once (the search costs)
    with _eval_mode(model), torch.no_grad(), _Replay(model, cache_bytes) as replay:
        for x, y in batches:
            base.append(float(loss_fn(replay.record(x, weights.values()), y)))
            for name, weight in weights.items():
                start, saved = replay.first_use(weight), weight.detach().clone()
                try:
                    for bits in choices:
                        if (name, bits) not in n1s:
                            n1s[name, bits] = select_n1(saved, bits, n1_rule, granularity)
                        weight.copy_(pow2_quantize(saved, n1s[name, bits], bits))
                        losses[name][bits].append(float(loss_fn(replay.run(x, start), y)))
                finally:
                    weight.copy_(saved)
    mean = _finite_mean(base)
    return {n: {b: _finite_mean(losses[n][b]) - mean for b in choices} for n in weights}


class _Replay:
    """Forward passes of ``model`` that take back the outputs of leaf-module calls a change cannot
    reach. :meth:`record` runs the model, keeps each leaf call's tensor output (in call order,
    until ``max_bytes``, and as much again in clones while it runs) and notes where each of
    ``weights`` is first used (by any op: its layer, a layer it is tied to, a functional use);
    :meth:`run` runs it again, the calls before call ``start`` returning what was kept instead
    of computing. A call made before a weight is first used cannot depend on it, so with only
    that weight changed, ``start = first_use(weight)`` gives the output a full forward would,
    bit for bit. An output that the recorded forward changed in place afterwards (an in-place
    ReLU) is kept as a clone taken when it was returned, and handed out as a fresh clone each
    time; the others are kept as they are, and :meth:`run` checks that nothing changed them.
    Leaf modules' ``forward`` is wrapped inside the ``with`` block only.
    """

    def __init__(self, model: nn.Module, max_bytes: int) -> None:
        self.model, self.max_bytes = model, max_bytes
        self.leaves = [m for m in model.modules() if next(m.children(), None) is None]
        self.kept: list[torch.Tensor | None] = []  # per call, in call order
        self.versions: list[int | None] = []  # a kept output's version (None: a clone)
        self.callers: list[nn.Module] = []
        self.nested: list[int] = []  # per call: the leaf calls made inside it
        self.running: list[int] = []  # the calls in progress, outermost first
        self.first: dict[int, int] = {}  # id(weight): its first use's call
        self.clones: list[torch.Tensor | None] = []  # while recording: the kept outputs'
        self.calls, self.start, self.kept_bytes, self.recording = 0, 0, 0, False

    def __enter__(self) -> _Replay:
        self.own = [m.__dict__.get("forward") for m in self.leaves]  # a forward set on one
        for module in self.leaves:
            module.forward = self._wrapped(module, module.forward)
        return self

    def __exit__(self, *exc: object) -> None:
        for module, own in zip(self.leaves, self.own, strict=True):
            del module.forward
            if own is not None:
                module.forward = own

    def record(self, x: torch.Tensor, weights: Iterable[torch.Tensor]) -> Any:
        self.kept, self.versions, self.callers, self.nested, self.first = [], [], [], [], {}
        self.calls, self.kept_bytes, self.recording = 0, 0, True
        try:
            with _FirstUses(self, {id(w) for w in weights}):
                out = self.model(x)
        finally:
            self.recording = False
        for i, (kept, version) in enumerate(zip(self.kept, self.versions, strict=True)):
            if kept is not None and kept._version != version:  # changed in place after
                self.kept[i], self.versions[i] = self.clones[i], None
        self.clones = []
        return out

    def first_use(self, weight: torch.Tensor) -> int:
        """The call during or before which ``weight`` was first used (0: never)."""
        return self.first.get(id(weight), 0)

    def run(self, x: torch.Tensor, start: int) -> Any:
        self.calls, self.start = 0, start
        out = self.model(x)
        for kept, version in zip(self.kept[:start], self.versions, strict=False):
            if kept is not None and version is not None and kept._version != version:
                raise RuntimeError(
                    "the model changed in place an output it left as it was in its forward "
                    "pass before, on the same batch: a forward with state or randomness"
                )
        return out

    def _wrapped(self, module: nn.Module, forward: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            i = self.calls
            self.calls += 1
            if self.recording:
                return self._record_call(i, module, forward, args, kwargs)
            if i < self.start:
                if self.callers[i] is not module:
                    raise RuntimeError(
                        "the model called its modules in another order than in its forward pass "
                        "before, on the same batch: a forward with state or randomness"
                    )
                kept = self.kept[i]
                if kept is not None:
                    self.calls += self.nested[i]
                    return kept if self.versions[i] is not None else kept.clone()
            return forward(*args, **kwargs)

        return call

    def _record_call(
        self, i: int, module: nn.Module, forward: Callable[..., Any], args: Any, kwargs: Any
    ) -> Any:
        self.callers.append(module)
        self.kept.append(None)
        self.versions.append(None)
        self.clones.append(None)
        self.nested.append(0)
        self.running.append(i)
        try:
            out = forward(*args, **kwargs)
        finally:
            self.running.pop()
        self.nested[i] = self.calls - i - 1
        if isinstance(out, torch.Tensor) and self.kept_bytes + out.nbytes <= self.max_bytes:
            self.kept[i], self.versions[i], self.clones[i] = out, out._version, out.clone()
            self.kept_bytes += out.nbytes
        return out


class _FirstUses(TorchFunctionMode):
    """Notes in ``replay.first`` the call in progress (the outermost), or the next call, when
    an op first takes one of the tensors whose ids are ``watched``."""

    def __init__(self, replay: _Replay, watched: set[int]) -> None:
        super().__init__()
        self.replay, self.watched = replay, watched

    def __torch_function__(
        self, func: Any, types: Any, args: Sequence[Any] = (), kwargs: Any = None
    ) -> Any:
        kwargs = kwargs or {}
        for value in tree_leaves((args, kwargs)):
            if id(value) in self.watched and id(value) not in self.replay.first:
                running = self.replay.running
                self.replay.first[id(value)] = running[0] if running else self.replay.calls
        return func(*args, **kwargs)


def hessian_traces(
    model: nn.Module,
    loss_fn: LossFn,
    batches: Sequence[Batch],
    weights: Mapping[str, nn.Parameter],
    samples: int = 8,
    seed: int = 0,
) -> dict[str, float]:
    """``{layer: tr(H)}``: Hutchinson's estimate of the trace of the Hessian of the mean loss
    over ``batches`` with respect to each weight, ``mean_v v^T H v`` over ``samples`` Rademacher
    vectors (seeded by ``seed``, drawn on the CPU: the same on any device), in eval mode.

    Example:
        >>> layer = nn.Linear(3, 1, bias=False)
        >>> loss = lambda out, y: (out ** 2).sum() / 2      # H = X^T X = diag(1, 4, 4)
        >>> x = torch.diag(torch.tensor([1.0, 2.0, 2.0]))
        >>> hessian_traces(layer, loss, [(x, x)], {"w": layer.weight}, samples=2)
        {'w': 9.0}

    Raises:
        MethodError: (a ValueError) if the model cannot be differentiated twice (or a weight
            needs no grad).
        ValueError: if a loss or a trace is not finite.
    """
    generator = torch.Generator().manual_seed(seed)
    params = list(weights.values())
    totals = [0.0] * len(params)
    with _eval_mode(model), torch.enable_grad():
        for _ in range(samples):
            vs = [(torch.randint(0, 2, p.shape, generator=generator) * 2 - 1).to(p) for p in params]
            for x, y in batches:
                loss = loss_fn(model(x), y) / len(batches)
                if not torch.isfinite(loss):
                    raise ValueError(
                        f"the loss on a calibration batch is {float(loss.detach())}, not finite"
                    )
                try:  # the derivatives, not the forward: its errors are the model's
                    grads = torch.autograd.grad(loss, params, create_graph=True)
                    dot = torch.stack([(g * v).sum() for g, v in zip(grads, vs, strict=True)]).sum()
                    hvs = torch.autograd.grad(dot, params)
                except RuntimeError as err:
                    first = str(err).strip().splitlines()[0]
                    raise MethodError(
                        f"method 'hessian' cannot differentiate this model twice: {first}"
                    ) from None
                for i, (hv, v) in enumerate(zip(hvs, vs, strict=True)):
                    totals[i] += float((hv.double() * v.double()).sum())
    traces = {name: total / samples for name, total in zip(weights, totals, strict=True)}
    for name, trace in traces.items():
        if not math.isfinite(trace):
            raise ValueError(f"the Hessian trace of {name!r} is {trace}, not finite")
    return traces


def check_method(
    model: nn.Module,
    loss_fn: LossFn,
    batch: Batch,
    method: str = "loss",
    *,
    pinned: Mapping[str, int] | None = None,
    include: str | Sequence[str] | None = None,
    exclude: str | Sequence[str] | None = None,
) -> None:
    """Refuse now, before any training is spent, a ``method`` :func:`allocate` could not run
    on ``model`` later: for ``"hessian"``, one Hessian-vector product on ``batch`` (one or two
    examples are enough) over the layers it would measure (those not ``pinned``: the
    arguments as :func:`allocate`'s); ``"loss"`` needs only forward passes. Model, gradients,
    train/eval flags and the global RNG are left as they were.

    Example:
        >>> model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
        >>> check_method(model, nn.functional.cross_entropy, (torch.ones(1, 4), torch.zeros(1,
        ...              dtype=torch.long)), "hessian")

    Raises:
        MethodError: (a ValueError) the method cannot run on the model.
        ValueError: an unknown method, or a glob that matches no layer.
    """
    _check_method_name(method)
    if method == "hessian":
        targets = _select_targets(model, include, exclude)
        fixed = _pinned_names([name for name, _ in targets], pinned)
        weights = {name: weight for name, weight in targets if name not in fixed}
        if weights:
            hessian_traces(model, loss_fn, _materialized([batch], model), weights, samples=1)


# ---------------------------------------------------------------------------- helpers


def _check_method_name(method: str) -> None:
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")


def _pinned_names(names: Sequence[str], pinned: Mapping[str, int] | None) -> set[str]:
    return {n for n in names if any(fnmatch.fnmatchcase(n, g) for g in (pinned or {}))}


def _checked_choices(choices: Sequence[int]) -> tuple[int, ...]:
    values = tuple(choices)
    if not values:
        raise ValueError("choices is empty: give at least one bit-width, e.g. (2, 3, 4, 5, 8)")
    for bits in values:
        check_bits(bits)
    return tuple(sorted(set(values)))


def _budget_bytes(avg_bits: float | None, max_bytes: int | None, params: int) -> int:
    if (avg_bits is None) == (max_bytes is None):
        raise ValueError("give exactly one budget: avg_bits or max_bytes")
    if max_bytes is not None:
        if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 0:
            raise ValueError(f"max_bytes must be an integer >= 0, got {max_bytes!r}")
        return max_bytes
    assert avg_bits is not None
    if not math.isfinite(avg_bits) or avg_bits <= 0:
        raise ValueError(f"avg_bits must be a number > 0, got {avg_bits!r}")
    return math.floor(Fraction(avg_bits) * params / 8)  # exact: 8 * bytes <= avg_bits * params


def _avg(nbytes: int, params: int) -> str:
    return f"{8 * nbytes / max(1, params):.4g}"


def _avg_at_least(nbytes: int, params: int) -> str:
    """The least average bits with 4 decimals that, given back as ``avg_bits``, is a budget of
    at least ``nbytes``: rounded up, not to nearest (such budgets are floored to whole bytes),
    and checked as the float the user's number becomes."""
    steps = max(1, math.ceil(Fraction(8 * nbytes * 10**4, max(1, params))))
    while _budget_bytes(steps / 10**4, None, params) < nbytes:
        steps += 1
    return f"{steps / 10**4:.4f}".rstrip("0").rstrip(".")


def _materialized(batches: Iterable[Batch], model: nn.Module) -> list[Batch]:
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    data = [(x.to(device), y.to(device)) for x, y in batches]
    if not data:
        raise ValueError("batches is empty: give at least one (inputs, targets) batch")
    return data


def _finite_mean(losses: Sequence[float]) -> float:
    mean = math.fsum(losses) / len(losses)
    if not math.isfinite(mean):
        raise ValueError(f"the loss on the calibration batches is {mean}, not finite")
    return mean


def _squared_error(weight: torch.Tensor, bits: int, n1_rule: str, granularity: str) -> float:
    w = weight.detach()
    snapped = pow2_quantize(w, select_n1(w, bits, n1_rule, granularity), bits)
    return float(((w.double() - snapped.double()) ** 2).sum())


@contextlib.contextmanager
def _eval_mode(model: nn.Module) -> Iterator[None]:
    """Every module in eval mode inside, each module's own flag back after."""
    flags = [m.training for m in model.modules()]
    model.eval()
    try:
        yield
    finally:
        for module, flag in zip(model.modules(), flags, strict=True):
            module.training = flag
