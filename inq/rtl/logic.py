"""Each streaming layer's arithmetic as one constant adder graph (da4ml), from a window of
integer activations to the layer's integer outputs, exactly as :mod:`inq.quant.integer` computes
them.

A window is ``KH x KW x C`` activations in tap order ``(u, v, c)``; the graph computes, per
output channel, one of:

- conv/linear: the shift-add sum (every ``(x << frac) >> offset`` term, floored where the
  offset exceeds ``frac``: :func:`inq.kernels.int8.term_classes`), ``+ bias``,
  ``* multiplier`` (a constant: shifts and adds, no multiplier), rounded half up by
  ``>> shift`` and clamped to ``[lo, hi]``. An op whose tensors hold ``weights`` (integers,
  the weight's shape) in place of ``codes`` sums ``x * weight`` instead (any integer weights,
  e.g. uniform int4/int8, through the same generator: da4ml writes each constant as shifts
  and adds);
- maxpool: the largest tap; avgpool: the taps' sum, ``* multiplier >> shift``, clamped;
- relu/clamp: the single tap, clamped;
- add: two 1x1 windows (the operands' pixels, each its own range), ``x * m_x + y * m_y``
  rounded by ``>> shift`` and clamped.

da4ml traces these with exact fixed-point ranges and solves each constant matrix-vector
product as an adder graph with shared subexpressions; :func:`pipelined` cuts the graph into
register stages. Every activation of a layer's input shares one range, so the window is a bus
of equal ``width``-bit fields (:func:`field_width`).

Example::

    graph = layer_graph(op, tensors, window=(3, 3, 16), in_range=(0, 255))
    pipeline = pipelined(graph, stage_delay=6.0)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from da4ml.trace import FixedVariable, FixedVariableArray, HWConfig, comb_trace, to_pipeline
from da4ml.types import CombLogic, Op, Pipeline, QInterval, minimal_kif
from torch import Tensor

from inq.codes import unpack_codes
from inq.kernels.int8 import term_classes
from inq.quant.integer import IntOp

__all__ = [
    "Window",
    "adders",
    "field_width",
    "layer_graph",
    "multipliers",
    "output_fields",
    "pipelined",
]

_HW = HWConfig(1, -1, -1)  # da4ml's defaults: 1-bit adder cells, no carry lookahead limit
# one decomposition search, not all of them: 5x faster, the same adders on INQ's kernels
_SOLVER = {"search_all_decompose_dc": False}


@dataclass(frozen=True)
class Window:
    """The activations a layer's graph reads per output pixel: ``kh x kw`` taps of
    ``channels`` values in ``[lo, hi]``; a join (an add) reads a second operand of ``taps``
    values in ``other``'s range after them."""

    kh: int
    kw: int
    channels: int
    lo: int
    hi: int
    other: tuple[int, int] | None = None

    @property
    def taps(self) -> int:
        return self.kh * self.kw * self.channels

    @property
    def ranges(self) -> list[tuple[int, int]]:
        """The range of each operand's ``taps`` values, in bus order."""
        return [(self.lo, self.hi)] + ([self.other] if self.other else [])


def field_width(lo: int, hi: int) -> int:
    """Bits of one activation in ``[lo, hi]`` on a bus (two's complement if ``lo < 0``).

    Example:
        >>> field_width(0, 255), field_width(-128, 127), field_width(0, 192)
        (8, 8, 8)
    """
    return int(sum(minimal_kif(QInterval(float(lo), float(hi), 1.0))))


def _inputs(window: Window) -> FixedVariableArray:
    n = window.taps
    low = np.concatenate([np.full(n, float(lo)) for lo, _ in window.ranges])
    high = np.concatenate([np.full(n, float(hi)) for _, hi in window.ranges])
    return FixedVariableArray.from_lhs(low, high, np.ones(len(low)), hwconf=_HW)


def _clamp(v: FixedVariable, lo: int, hi: int) -> FixedVariable:
    """``clamp(v, lo, hi)`` as ReLUs of differences: ``lo + relu(v - lo)``, ``hi - relu(hi - v)``
    (not da4ml's min/max mux, whose Verilog misaligns a constant kept at a finer step than the
    value: it gave 254 for ``min(260, 255)`` when the value carried a factor of ``2**-32``)."""
    if v.low < lo:
        v = (v - float(lo)).relu() + float(lo) if lo else v.relu()
    if v.high > hi:
        v = float(hi) - (float(hi) - v).relu()
    return v


def _requantize(v: FixedVariable, multiplier: int, shift: int, lo: int, hi: int) -> FixedVariable:
    """``clamp((v * multiplier + 2**(shift-1)) >> shift, lo, hi)`` (round half up)."""
    scaled = v * float(multiplier) * 2.0**-shift
    return _clamp(scaled.quantize(1, 40, 0, round_mode="RND"), lo, hi)


def _tap_order(rows: Tensor, window: Window) -> Tensor:
    """``rows [O, taps]`` in the weight's ``(c, u, v)`` order (a linear op's flatten order
    too) as ``[O, taps]`` in the window's tap order ``(u, v, c)``."""
    o = rows.shape[0]
    view = rows.reshape(o, window.channels, window.kh, window.kw)
    return view.permute(0, 2, 3, 1).reshape(o, window.taps)


def _weight_taps(op: IntOp, tensors: dict[str, Tensor], window: Window) -> Tensor:
    """Codes ``[O, taps]`` in the window's tap order ``(u, v, c)``."""
    codes = unpack_codes(tensors["codes"], op.attrs["bits"], window.taps).to(torch.int64)
    return _tap_order(codes, window)


def _shift_sums(
    op: IntOp, tensors: dict[str, Tensor], x: FixedVariableArray, window: Window
) -> FixedVariableArray:
    """The shift-add sums of the codes: one product of the floored classes of ``x``."""
    a = op.attrs
    codes = _weight_taps(op, tensors, window)
    classes, weights = term_classes(codes, a["bits"], a["frac"])
    columns = []
    for sign, d in classes:
        if (sign, d) == (1, 0):
            columns.append(x)
        else:  # floor(sign * x / 2**d): an arithmetic shift of x or -x
            columns.append((x * (sign * 2.0**-d)).quantize(1, 9, 0))
    stacked = FixedVariableArray(
        np.concatenate([c._vars for c in columns]), solver_options=_SOLVER, hwconf=_HW
    )
    kernel = weights.permute(0, 2, 1).reshape(-1, codes.shape[0]).numpy()  # [P * taps, O]
    return stacked @ kernel


def _integer_sums(
    tensors: dict[str, Tensor], x: FixedVariableArray, window: Window
) -> FixedVariableArray:
    """``x @ weights.T`` for integer ``weights`` (``[O, ...]``, the weight's shape)."""
    w = tensors["weights"]
    if w.dtype.is_floating_point or w.dtype.is_complex:
        raise ValueError(f"integer weights expected, got {w.dtype}")
    rows = _tap_order(w.to(torch.int64).reshape(w.shape[0], -1), window)
    x = FixedVariableArray(x._vars, solver_options=_SOLVER, hwconf=_HW)
    return x @ rows.T.to(torch.float64).numpy()  # [taps, O]: exact below 2**53


def _weight_outputs(op: IntOp, tensors: dict[str, Tensor], x: FixedVariableArray, window: Window):
    a = op.attrs
    if "weights" in tensors:
        acc = _integer_sums(tensors, x, window)
    else:
        acc = _shift_sums(op, tensors, x, window)
    bias, multiplier, shift = (tensors[key].tolist() for key in ("bias", "multiplier", "shift"))
    lo, hi = a["lo"], a["hi"]
    return [
        _requantize(acc._vars[o] + float(bias[o]), multiplier[o], shift[o], lo, hi)
        for o in range(len(bias))
    ]


def _per_channel(
    x: FixedVariableArray, window: Window, reduce: Callable[[list[Any]], FixedVariable]
) -> list[FixedVariable]:
    taps = x._vars.reshape(window.kh * window.kw, window.channels)
    return [reduce(list(taps[:, c])) for c in range(window.channels)]


def _max(values: list[Any]) -> FixedVariable:
    best = values[0]
    for v in values[1:]:
        best = best.max_of(v)
    return best


def layer_graph(op: IntOp, tensors: dict[str, Tensor], window: Window) -> CombLogic:
    """The adder graph of ``op`` (conv, linear, maxpool, avgpool, relu, clamp, add) on
    ``window``.

    Raises:
        ValueError: for another op kind.
    """
    a = op.attrs
    x = _inputs(window)
    if op.op in ("conv", "linear"):
        outputs = _weight_outputs(op, tensors, x, window)
    elif op.op == "maxpool":
        outputs = _per_channel(x, window, _max)
    elif op.op == "avgpool":
        outputs = _per_channel(
            x,
            window,
            lambda v: _requantize(sum(v[1:], v[0]), a["multiplier"], a["shift"], a["lo"], a["hi"]),
        )
    elif op.op in ("relu", "clamp"):
        outputs = _per_channel(x, window, lambda v: _clamp(v[0], a["lo"], a["hi"]))
    elif op.op == "add":
        (m_x, m_y), c, shift = a["multipliers"], window.channels, a["shift"]
        pairs = zip(x._vars[:c], x._vars[c:], strict=True)
        outputs = [_requantize(u * float(m_x) + v * float(m_y), 1, shift, a["lo"], a["hi"])
                   for u, v in pairs]  # fmt: skip
    else:
        raise ValueError(f"{op.name}: no adder graph for a {op.op} op")
    return comb_trace(list(x._vars), outputs, keep_dead_inputs=True)


def pipelined(graph: CombLogic, stage_delay: float) -> Pipeline:
    """``graph`` cut into register stages of at most ``stage_delay`` (da4ml's delay units:
    about one carry-chain adder each, a constant add or negation after an adder counted as
    one too: :func:`_count_tail`), reading the same input bus as ``graph``.

    da4ml's retiming traces the stages again without the inputs no output reads (a tap whose
    weights are all zero), which narrows the first stage's input bus and shifts every field
    after it; such inputs are put back into the first stage, unread, at their place.
    """
    pipeline = to_pipeline(_count_tail(graph), stage_delay, verbose=False)
    first = pipeline.solutions[0]
    present = {op.id0 for op in first.ops if op.opcode == -1}
    lost = [
        Op(i, -1, -1, 0, qint, 0.0, 0.0)
        for i, qint in enumerate(graph.inp_qint)
        if i not in present and qint.max > qint.min
    ]
    if not lost:
        return pipeline
    first = first._replace(ops=[*first.ops, *lost])  # appended: no index in use moves
    return Pipeline((first, *pipeline.solutions[1:]))


# da4ml's opcodes read here: an input (-1) and a constant (5) have no operand; a mux (6, -6)
# holds its condition's id in the low 32 bits of ``data``; an add or subtract of two values
# (0, 1); after one, a constant add, relu(-x) or quantize(-x) is a carry chain each
_NO_OPERANDS, _MUXES, _ADDS, _CHAINS = (-1, 5), (6, -6), (0, 1), (4, -2, -3)


def _count_tail(graph: CombLogic) -> CombLogic:
    """``graph`` with each constant add and negation after an adder counted as one more unit
    of delay, like an adder: da4ml's tracer gives them none, so the requantization's rounding
    add and the clamp's constant adds and negations, each a carry chain, would share a stage
    with the last adder. (Negations of the inputs, before any adder, keep da4ml's count.)
    Where da4ml retimes the stages (``stage_delay`` above 1) it balances them by its own
    delay model; the stage count is this one's."""
    ops: list[Op] = []
    after_adder: list[bool] = []
    for op in graph.ops:
        parents = [] if op.opcode in _NO_OPERANDS else [op.id0] + [op.id1] * (op.id1 >= 0)
        if op.opcode in _MUXES:
            parents.append(op.data & 0xFFFFFFFF)
        delta = op.latency - max((graph.ops[p].latency for p in parents), default=0.0)
        downstream = any(after_adder[p] for p in parents)
        if op.opcode in _CHAINS and downstream:
            delta = max(delta, 1.0)
        start = max((ops[p].latency for p in parents), default=0.0)
        ops.append(op._replace(latency=start + delta))
        after_adder.append(downstream or op.opcode in _ADDS)
    return graph._replace(ops=ops)


def adders(pipeline: Pipeline) -> int:
    """Adders and subtractors in ``pipeline`` (da4ml opcodes 0, 1 and 4: with a variable or a
    constant); a multiplier would be opcode 7, which the graphs here never hold."""
    return sum(op.opcode in (0, 1, 4) for stage in pipeline.solutions for op in stage.ops)


def multipliers(pipeline: Pipeline) -> int:
    """Multipliers in ``pipeline`` (da4ml opcode 7): 0 for every graph built here."""
    return sum(op.opcode == 7 for stage in pipeline.solutions for op in stage.ops)


@dataclass(frozen=True)
class OutputField:
    """Where output ``index`` sits on da4ml's output bus and how to read it: ``width`` raw bits
    from ``offset`` (two's complement if ``signed``), times ``2**-frac``; a ``width`` of 0 is
    the constant ``const``."""

    offset: int
    width: int
    signed: bool
    frac: int
    const: int


def output_fields(pipeline: Pipeline) -> list[OutputField]:
    """The output bus layout of ``pipeline`` (da4ml packs each output in its minimal width)."""
    last = pipeline.solutions[-1]
    fields, offset = [], 0
    for index, qint in zip(last.out_idxs, pipeline.out_qint, strict=True):
        k, i, f = minimal_kif(qint)
        bits = int(k + i + f)  # reserved on the bus even where da4ml assigns no wire
        width = bits if index >= 0 else 0
        const = int(qint.min) if width == 0 else 0
        fields.append(OutputField(offset, width, bool(k), int(f), const))
        offset += bits
    return fields
