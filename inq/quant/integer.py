"""The integer model: a program of integer ops, its reference arithmetic, and its file.

Every activation is an integer tensor ``q`` standing for ``q * scale`` (int8, or uint8 where
it cannot be negative); the scale of each value is fixed at calibration and, by default, a power
of two. Every value has attributes ``scale``, ``lo``, ``hi`` and dtype ``value_dtype(lo, hi)``;
its op clamps it to ``[lo, hi]``, which may be narrower than the dtype's range (a ReLU6 at scale
``2**-5``: ``0..192``, uint8). Ops (``IntOp.op``):

- ``input``: ``q = clamp(floor(x / scale + 1/2), lo, hi)`` — the only float arithmetic;
- ``conv`` / ``linear``: ``acc = inq::shift_conv2d_int8 / shift_linear_int8(q, codes, frac)``
  (int32 shifts and adds), then :func:`requantize` ``(acc + bias) * multiplier >> shift``
  per output channel, clamped to ``[lo, hi]`` (a folded ReLU sets ``lo = 0``, a ReLU6 or Hardtanh
  cuts the range to its bounds' integers, :func:`inq.quant.lower.clamp_range`). BatchNorm's scale
  lives in the multipliers, its shift in the int32 bias. The model's last op keeps int32. Both
  steps run as one op, ``inq::shift_conv2d_int8_requant`` / ``shift_linear_int8_requant``
  (on a GPU, one int8 tensor-core kernel with the requantization in its epilogue);
- ``add``: ``(a * m_a + b * m_b) >> shift``, clamped (residual connections, activation folded);
- ``avgpool``: the window sum, ``* multiplier >> shift`` (the 1/count is in the multiplier),
  one op, ``inq::avg_pool2d_requant`` (one kernel on a GPU);
- ``maxpool`` (``inq::max_pool2d_int``), ``relu``, ``flatten``, ``slice``, ``pad``: exact on
  the integers, same scale;
- ``clamp``: ``x.clamp(lo, hi)``, same scale (a ReLU6 or Hardtanh no op folds), ``lo..hi``
  within its input's range.

``x >> s`` rounds half up: ``(v + 2**(s-1)) >> s`` with an arithmetic shift. Overflow cannot
happen: :func:`program_problems` checks, from the codes and the value ranges, that every int32
accumulator (bias included) stays below ``2**31`` and that the int64 products do too; the file
is refused otherwise. Multipliers are stored normalised (odd unless the shift is 0), so a
requantization by a power of two is a pure shift; those of ``add`` and ``avgpool`` are positive
(ratios of scales), a conv/linear channel's takes the sign of its BatchNorm scale.

:func:`program_problems` is what makes a file valid, whatever its digest says: besides the
overflow bounds, every attribute has its type and range (bits 2..8, scales finite and > 0,
every value's range within a 2..8-bit activation range, ``act_bits``/``input_bits`` where the
file records them, except an int32 conv/linear at the end; shifts 0..62, multipliers within
int32, geometry a convolution can have) and the file's descriptions theirs (``act_bits`` 2..8,
``model`` and ``data`` JSON objects, ...).

The file (``inq calibrate``) is safetensors with integer tensors only: per op ``<op>.codes``
(packed, :mod:`inq.packed`), ``<op>.bias``, ``<op>.multiplier``, ``<op>.shift`` (int32); the
program, the scales (floats, one per value) and the model/data descriptions are JSON metadata.

Example:
    >>> ops = [IntOp("x", "input", [], {"scale": 0.5, "lo": -128, "hi": 127}),
    ...        IntOp("r", "relu", ["x"], {"scale": 0.5, "lo": 0, "hi": 127})]
    >>> model = IntegerModel(ops, {})
    >>> model(torch.tensor([[-1.0, 0.7, 100.0]]))
    tensor([[  0,   1, 127]], dtype=torch.uint8)
    >>> model.output_scale()
    0.5
"""

from __future__ import annotations

import json
import math
import os
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeGuard

import torch
import torch.nn.functional as F
from torch import Tensor, nn

import inq.kernels  # noqa: F401  (registers torch.ops.inq.*)
from inq.codes import codes_problem, row_bytes, unpack_codes
from inq.fileio import (
    DIGEST_KEY,
    SafetensorsFile,
    digest_problem,
    metadata_n1,
    open_safetensors,
    write_safetensors,
)
from inq.kernels.int8 import max_frac_bits, requantize, value_dtype
from inq.packed import n1_problem
from inq.pow2 import MAX_BITS, MIN_BITS

__all__ = [
    "INT_FORMAT",
    "IntOp",
    "IntegerModel",
    "accumulator_bound",
    "load_integer",
    "problem_line",
    "program_problems",
    "requantize",
    "residual_fusions",
    "save_integer",
    "value_dtype",
]

INT_FORMAT = "inq-int/1"  # the integer model's format: the metadata "format" of its file
INT32_MIN, INT32_MAX = -(1 << 31), (1 << 31) - 1
MAX_SHIFT = 62  # (acc + bias) * multiplier < 2**62, plus the rounding half: below 2**63
_WEIGHT_OPS = ("conv", "linear")
_TENSOR_FIELDS = ("codes", "bias", "multiplier", "shift")


@dataclass
class IntOp:
    """One op of the program: a unique ``name`` (its output value), ``op`` kind, ``inputs``
    (names of earlier ops) and JSON-able ``attrs`` (geometry, ``scale``/``lo``/``hi`` of its
    output, ...). Its tensors live in the model under ``"<name>.<field>"``."""

    name: str
    op: str
    inputs: list[str]
    attrs: dict[str, Any] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        return {"name": self.name, "op": self.op, "inputs": self.inputs, "attrs": self.attrs}


def accumulator_bound(codes: Tensor, bits: int, frac: int, x_max: int) -> Tensor:
    """Per output row, a bound on ``|acc|`` of the shift-add op for inputs ``|x| <= x_max``.

    A term ``(x << frac) >> offset`` has magnitude at most ``(x_max << frac) >> offset``, plus 1
    where the shift drops bits (``offset > frac``: floor of a negative value).

    Example:
        >>> codes = torch.tensor([[8, 13, 0]], dtype=torch.uint8)  # 4 bits: offsets 0 and 1
        >>> accumulator_bound(codes, bits=4, frac=3, x_max=128)  # 128 * 8 + 128 * 4
        tensor([1536])
    """
    c = codes.reshape(codes.shape[0], -1).to(torch.int64)
    offset = c & ((1 << (bits - 2)) - 1)
    terms = torch.bitwise_right_shift(torch.full_like(offset, x_max << frac), offset)
    terms += (offset > frac).to(torch.int64)
    return torch.where(c != 0, terms, 0).sum(dim=1)


class _Tensors(nn.Module):
    """The integer tensors of one op, as buffers (so ``.to(device)`` moves them)."""

    def __init__(self, tensors: dict[str, Tensor]) -> None:
        super().__init__()
        for key, value in tensors.items():
            self.register_buffer(key, value)


class IntegerModel(nn.Module):
    """Runs a program of :class:`IntOp` in integer arithmetic (the reference; the conv/linear
    ops dispatch to the Triton kernels on CUDA, which match it bit for bit).

    ``forward`` takes the float input and returns the last op's integers; multiply by
    :meth:`output_scale` for real values (logits). ``info`` holds the file's descriptions
    (``model``, ``data``, ``act_bits``, ``calibration``, ...).
    """

    def __init__(
        self, ops: list[IntOp], tensors: dict[str, Tensor], info: dict[str, Any] | None = None
    ) -> None:
        super().__init__()
        self.ops, self.info = list(ops), dict(info or {})
        self.digest_problem: str | None = None  # set by load_integer
        grouped: dict[str, dict[str, Tensor]] = {op.name: {} for op in ops}
        for key, value in tensors.items():
            name, _, part = key.rpartition(".")
            grouped[name][part] = value
        self.params: dict[str, _Tensors] = {}
        for i, (name, group) in enumerate(grouped.items()):
            if group:  # registered by position: op names may hold dots
                self.params[name] = _Tensors(group)
                self.add_module(f"op{i}", self.params[name])

    def tensors(self) -> dict[str, Tensor]:
        """Every tensor, keyed ``"<op>.<field>"`` as in the file."""
        return {
            f"{name}.{k}": v for name, m in self.params.items() for k, v in m.state_dict().items()
        }

    def output_scale(self) -> float:
        """The real value of one unit of the output."""
        return float(self.ops[-1].attrs["scale"])

    def forward(self, x: Tensor) -> Tensor:
        """The last op's integers for the float input ``x``: :meth:`run`'s, with each
        convolution that only a residual add reads computed with that add as one op
        (:func:`residual_fusions`; bit for bit the two: on a GPU the add runs in the
        convolution's epilogue, and the convolution's output is never written)."""
        values: dict[str, Tensor] = {}
        for op, conv in self.schedule():
            values[op.name] = self.step(op, values, x, conv)
        return values[self.ops[-1].name]

    def schedule(self) -> list[tuple[IntOp, tuple[IntOp, int] | None]]:
        """The ops :meth:`forward` runs, in order, each with the convolution it runs with (and
        which input of the add that is; see :meth:`step`) or ``None``."""
        fused = residual_fusions(self.ops)
        convs = {conv.name for conv, _ in fused.values()}
        return [(op, fused.get(op.name)) for op in self.ops if op.name not in convs]

    def run(self, x: Tensor) -> dict[str, Tensor]:
        """The value of every op for the float input ``x``, one op at a time."""
        values: dict[str, Tensor] = {}
        for op in self.ops:
            values[op.name] = self.step(op, values, x)
        return values

    def step(
        self,
        op: IntOp,
        values: Mapping[str, Tensor],
        x: Tensor,
        conv: tuple[IntOp, int] | None = None,
    ) -> Tensor:
        """The value of ``op`` from the values of the ops before it (``x``: the float input,
        which the first op reads); with ``conv``, a residual add's convolution and which input
        of it that is, the add computed with the convolution from the convolution's input."""
        if conv is not None:
            source, index = conv
            a = op.attrs
            multipliers = a["multipliers"]
            out: Tensor = torch.ops.inq.shift_conv2d_int8_requant_add(
                *_conv_args(source, self.op_tensors(source.name), values[source.inputs[0]]),
                values[op.inputs[1 - index]], multipliers[index], multipliers[1 - index],
                a["shift"], a["lo"], a["hi"],
            )  # fmt: skip
            return out
        args = [values[i] for i in op.inputs] if op.inputs else [x]
        return _RUN[op.op](op, self.op_tensors(op.name), *args)

    def op_tensors(self, name: str) -> dict[str, Tensor]:
        """The tensors of op ``name``, by field (``codes``, ``bias``, ...): the buffers
        themselves, so the kernels' layouts cached per tensor are made once."""
        return dict(self.params[name].named_buffers()) if name in self.params else {}


def _clamped(op: IntOp, v: Tensor) -> Tensor:
    return v.to(value_dtype(op.attrs["lo"], op.attrs["hi"]))


def _input(op: IntOp, t: dict[str, Tensor], x: Tensor) -> Tensor:
    a = op.attrs
    out: Tensor = torch.ops.inq.quantize_input(x, float(a["scale"]), a["lo"], a["hi"])
    return out


def _conv_args(op: IntOp, t: dict[str, Tensor], x: Tensor) -> tuple[Any, ...]:
    """The arguments of ``inq::shift_conv2d_int8_requant`` for conv ``op`` on ``x``."""
    a = op.attrs
    return (x, t["codes"], a["bits"], a["weight_shape"], a["stride"], a["padding"],
            a["dilation"], a["groups"], a["frac"], t["bias"], t["multiplier"], t["shift"],
            a["lo"], a["hi"])  # fmt: skip


def _conv(op: IntOp, t: dict[str, Tensor], x: Tensor) -> Tensor:
    out: Tensor = torch.ops.inq.shift_conv2d_int8_requant(*_conv_args(op, t, x))
    return out


def residual_fusions(ops: list[IntOp]) -> dict[str, tuple[IntOp, int]]:
    """The residual adds :meth:`IntegerModel.forward` runs with a convolution: add name ->
    (the conv, which input of the add it is). A conv qualifies where that add is its only
    reader and it is not the program's result; of two, the add's first input.

    Example:
        >>> ops = [IntOp("x", "input", []), IntOp("c", "conv", ["x"]),
        ...        IntOp("y", "add", ["x", "c"]), IntOp("z", "relu", ["y"])]
        >>> {add: (conv.name, index) for add, (conv, index) in residual_fusions(ops).items()}
        {'y': ('c', 1)}
    """
    readers = Counter(name for op in ops for name in op.inputs)
    convs = {op.name: op for op in ops[:-1] if op.op == "conv"}
    fused = {}
    for op in ops:
        for index, name in enumerate(op.inputs if op.op == "add" else []):
            if name in convs and readers[name] == 1:
                fused[op.name] = (convs[name], index)
                break
    return fused


def _linear(op: IntOp, t: dict[str, Tensor], x: Tensor) -> Tensor:
    a = op.attrs
    out: Tensor = torch.ops.inq.shift_linear_int8_requant(
        x, t["codes"], a["bits"], a["in_features"], a["frac"], t["bias"], t["multiplier"],
        t["shift"], a["lo"], a["hi"],
    )  # fmt: skip
    return out


def _add(op: IntOp, t: dict[str, Tensor], x: Tensor, y: Tensor) -> Tensor:
    a = op.attrs
    m_x, m_y = a["multipliers"]
    out: Tensor = torch.ops.inq.requant_add(x, y, m_x, m_y, a["shift"], a["lo"], a["hi"])
    return out


def _avgpool(op: IntOp, t: dict[str, Tensor], x: Tensor) -> Tensor:
    a = op.attrs
    # global: the calibrated input size only (the count is in the multiplier)
    if a["kernel"] is None and list(x.shape[2:]) != a["input_size"]:
        raise ValueError(
            f"{op.name}: global average pooling was calibrated on {a['input_size']} maps, "
            f"got {list(x.shape[2:])}"
        )
    out: Tensor = torch.ops.inq.avg_pool2d_requant(
        x, a["kernel"], a["stride"], a["multiplier"], a["shift"], a["lo"], a["hi"]
    )
    return out


def _maxpool(op: IntOp, t: dict[str, Tensor], x: Tensor) -> Tensor:
    a = op.attrs
    out: Tensor = torch.ops.inq.max_pool2d_int(
        x, a["kernel"], a["stride"], a["padding"], a["dilation"], a["ceil_mode"]
    )
    return out


def _slice(op: IntOp, t: dict[str, Tensor], x: Tensor) -> Tensor:
    index = tuple(Ellipsis if s is None else slice(*s) for s in op.attrs["index"])
    return x[index]


_RUN: dict[str, Callable[..., Tensor]] = {  # op kind: how it runs
    "input": _input,
    "conv": _conv,
    "linear": _linear,
    "add": _add,
    "avgpool": _avgpool,
    "maxpool": _maxpool,
    "relu": lambda op, t, x: _clamped(op, x.clamp(min=0)),
    "clamp": lambda op, t, x: _clamped(op, x.clamp(op.attrs["lo"], op.attrs["hi"])),
    "flatten": lambda op, t, x: torch.flatten(x, op.attrs["start_dim"], op.attrs["end_dim"]),
    "slice": _slice,
    "pad": lambda op, t, x: F.pad(x, op.attrs["pad"]),
}


# ---------------------------------------------------------------------------------- checks


def program_problems(model: IntegerModel) -> list[tuple[str, str]]:
    """``(where, problem)`` for everything that makes a model invalid, empty if it is sound.

    ``where`` is a key of ``model.info`` (the file's descriptions: ``act_bits`` not in 2..8,
    ``model`` not a JSON object, ...; these come first) or an op's name: an unknown op or input,
    an attribute of the wrong type or out of range (bits, scales, ranges, multipliers, shifts,
    geometry), non-integer or misshapen tensors, invalid codes, and any possible int32/int64
    overflow. :func:`problem_line` says which.

    Example:
        >>> ops = [IntOp("x", "input", [], {"scale": 0.5, "lo": -128, "hi": 127}),
        ...        IntOp("r", "relu", ["x"], {"scale": 0.5, "lo": 0, "hi": 127})]
        >>> program_problems(IntegerModel(ops, {}, {"act_bits": 8}))
        []
        >>> ops[1].attrs["lo"] = -1
        >>> for where, problem in program_problems(IntegerModel(ops, {}, {"act_bits": 9})):
        ...     print(where, "-", problem)
        act_bits - must be an integer from 2 to 8, got 9
        r - range -1..127 is not its input's 0..127
    """
    problems = _info_problems(model.info)
    seen: dict[str, IntOp] = {}
    for op in model.ops:
        try:
            problem = _op_problem(op, model.op_tensors(op.name), seen, model)
        except (KeyError, TypeError, ValueError) as err:
            problem = f"malformed op ({err!r})"
        if problem:
            problems.append((op.name, problem))
        seen[op.name] = op
    return problems


def problem_line(model: IntegerModel, where: str, problem: str) -> str:
    """One line for a problem of :func:`program_problems`: ``op '<name>': ...`` or
    ``metadata '<key>': ...``.

    Example:
        >>> model = IntegerModel([IntOp("x", "input", [], {})], {})
        >>> problem_line(model, "x", "bad"), problem_line(model, "act_bits", "bad")
        ("op 'x': bad", "metadata 'act_bits': bad")
    """
    kind = "op" if any(op.name == where for op in model.ops) else "metadata"
    return f"{kind} {where!r}: {problem}"


def _is_int(value: object, low: int = INT32_MIN, high: int = INT32_MAX) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


def _is_ints(value: object, count: int, low: int, high: int = INT32_MAX) -> bool:
    return (
        isinstance(value, list)
        and len(value) == count
        and all(_is_int(v, low, high) for v in value)
    )


def _is_bits(value: object) -> TypeGuard[int]:
    return _is_int(value, MIN_BITS, MAX_BITS)


def _is_bits_list(value: object) -> TypeGuard[list[int]]:
    return isinstance(value, list) and all(_is_bits(b) for b in value)


_Rule = tuple[Callable[[Any], bool], str]  # a test of one value, and what it requires
_BITS: _Rule = (_is_bits, f"an integer from {MIN_BITS} to {MAX_BITS}")
_COUNT: _Rule = (lambda v: _is_int(v, 1), "an integer >= 1")
_SHIFT: _Rule = (lambda v: _is_int(v, 0, MAX_SHIFT), f"an integer from 0 to {MAX_SHIFT}")
_POSITIVE_PAIR: _Rule = (lambda v: _is_ints(v, 2, 1), "two integers >= 1")
_PAIR: _Rule = (lambda v: _is_ints(v, 2, 0), "two integers >= 0")
_DIM: _Rule = (lambda v: _is_int(v, -4, 3), "an integer from -4 to 3")

# What the file's descriptions must be, where present (inq.quant.pipeline writes them).
_INFO: dict[str, _Rule] = {
    "act_bits": _BITS,
    "input_bits": _BITS,
    "weight_bits": (_is_bits_list, f"a list of integers from {MIN_BITS} to {MAX_BITS}"),
    "model": (lambda v: isinstance(v, dict), "a JSON object"),
    "data": (lambda v: isinstance(v, dict), "a JSON object"),
    "calibration": (lambda v: isinstance(v, str), "a string"),
    "pow2_scales": (lambda v: isinstance(v, bool), "true or false"),
    "calibration_batches": _COUNT,
    "finetune_epochs": (lambda v: _is_int(v, 0), "an integer >= 0"),
    "symmetric": (lambda v: isinstance(v, bool), "true or false"),
    "requant_terms": (lambda v: v is None or _is_int(v, 1, 8), "null or an integer from 1 to 8"),
}

# The attributes of each op kind besides scale/lo/hi, and their ranges (cross-checks below).
_ATTRS: dict[str, dict[str, _Rule]] = {
    "conv": {
        "bits": _BITS,
        "frac": (lambda v: _is_int(v, 0), "an integer >= 0"),
        "weight_shape": (lambda v: _is_ints(v, 4, 1), "four integers >= 1"),
        "stride": _POSITIVE_PAIR,
        "padding": _PAIR,
        "dilation": _POSITIVE_PAIR,
        "groups": _COUNT,
    },
    "linear": {
        "bits": _BITS,
        "frac": (lambda v: _is_int(v, 0), "an integer >= 0"),
        "in_features": _COUNT,
        "out_features": _COUNT,
    },
    "add": {
        "multipliers": (lambda v: _is_ints(v, 2, 1), "two integers from 1 to 2**31 - 1"),
        "shift": _SHIFT,
    },
    "avgpool": {
        "multiplier": (lambda v: _is_int(v, 1), "an integer from 1 to 2**31 - 1"),
        "shift": _SHIFT,
        "kernel": (lambda v: v is None or _is_ints(v, 2, 1), "null or two integers >= 1"),
    },
    "maxpool": {
        "kernel": _POSITIVE_PAIR,
        "stride": _POSITIVE_PAIR,
        "padding": _PAIR,
        "dilation": _POSITIVE_PAIR,
        "ceil_mode": (lambda v: isinstance(v, bool), "true or false"),
    },
    "flatten": {"start_dim": _DIM, "end_dim": _DIM},
    "slice": {
        "index": (
            lambda v: isinstance(v, list) and all(s is None or _is_slice(s) for s in v),
            "a list of null (...) or [start, stop, step] (integers or null, step >= 1)",
        )
    },
    "pad": {
        "pad": (
            lambda v: isinstance(v, list) and len(v) in (2, 4, 6, 8) and all(map(_is_int, v)),
            "2, 4, 6 or 8 integers",
        )
    },
}


def _is_slice(value: object) -> bool:
    if not isinstance(value, list) or len(value) != 3:
        return False
    start, stop, step = value
    return all(v is None or _is_int(v) for v in (start, stop)) and (
        step is None or _is_int(step, 1)
    )


def _info_problems(info: dict[str, Any]) -> list[tuple[str, str]]:
    return [
        (key, f"must be {requirement}, got {info[key]!r}")
        for key, (test, requirement) in _INFO.items()
        if key in info and not test(info[key])
    ]


def _attrs_problem(op: IntOp) -> str | None:
    """Why an op's attributes have the wrong types or ranges, or None."""
    a = op.attrs
    scale = a.get("scale")
    if isinstance(scale, bool) or not isinstance(scale, int | float):
        return f"scale must be a number, got {scale!r}"
    if not (math.isfinite(scale) and scale > 0):
        return f"scale {scale} must be a finite number > 0"
    lo, hi = a.get("lo"), a.get("hi")
    if not (_is_int(lo) and _is_int(hi) and lo <= hi):
        return f"range {lo!r}..{hi!r} must be integers lo <= hi within int32"
    for key, (test, requirement) in _ATTRS.get(op.op, {}).items():
        if not test(a.get(key)):
            return f"{key} must be {requirement}, got {a.get(key)!r}"
    if op.op == "conv" and a["weight_shape"][0] % a["groups"]:
        return f"groups={a['groups']} does not divide the {a['weight_shape'][0]} output channels"
    if op.op == "avgpool":
        key = "input_size" if a["kernel"] is None else "stride"  # a global pool has no stride
        if not _is_ints(a.get(key), 2, 1):
            return f"{key} must be two integers >= 1, got {a.get(key)!r}"
    if op.op == "maxpool":
        reach = [(k - 1) * d + 1 for k, d in zip(a["kernel"], a["dilation"], strict=True)]
        if any(2 * p > r for p, r in zip(a["padding"], reach, strict=True)):
            return f"padding {a['padding']} exceeds half the (dilated) kernel {reach}"
    return _multiplier_problem(op)


def _multiplier_problem(op: IntOp) -> str | None:
    """Multipliers are normalised: one is odd unless the shift is 0 (see the module docstring)."""
    if op.op not in ("add", "avgpool"):
        return None
    a = op.attrs
    multipliers = a["multipliers"] if op.op == "add" else [a["multiplier"]]
    if a["shift"] and all(m % 2 == 0 for m in multipliers):
        return f"multipliers {multipliers} >> {a['shift']} are not normalised (all even)"
    return None


def _range_problem(op: IntOp, last: bool, info: dict[str, Any]) -> str | None:
    """A value an op creates lies within a ``bits``-bit activation range (``input_bits`` for
    the input, ``act_bits`` otherwise, any of 2..8 if the file records none; a clamp makes it
    narrower); only a conv/linear that ends the program keeps int32."""
    lo, hi = _value_range(op)
    if last and op.op in _WEIGHT_OPS:
        return None
    key = "input_bits" if op.op == "input" else "act_bits"
    recorded = info.get(key)
    widths = [recorded] if _is_bits(recorded) else range(MIN_BITS, MAX_BITS + 1)
    kinds = (True,) if info.get("symmetric") is True else (True, False)
    ranges = [_act_range(b, signed) for b in widths for signed in kinds]
    if any(low <= lo and hi <= high for low, high in ranges):
        return None
    within = " or ".join(f"{low}..{high}" for low, high in ranges[: len(kinds)])
    symmetric = " (symmetric)" if len(kinds) == 1 else ""
    if _is_bits(recorded):
        return f"range {lo}..{hi} is not within {key}={recorded}'s{symmetric} ({within})"
    kind = "a symmetric" if symmetric else "an"
    return f"range {lo}..{hi} is not within {kind} activation range of {MIN_BITS}-{MAX_BITS} bits"


def _act_range(bits: int, signed: bool) -> tuple[int, int]:
    """As :func:`inq.quant.observers.act_range`."""
    return (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if signed else (0, (1 << bits) - 1)


def _op_problem(
    op: IntOp, t: dict[str, Tensor], seen: dict[str, IntOp], model: IntegerModel
) -> str | None:
    if op.op not in _RUN:
        return f"unknown op {op.op!r}"
    if op.name in seen:
        return "the name is used twice"
    missing = [i for i in op.inputs if i not in seen]
    if missing:
        return f"inputs {missing} are not earlier ops"
    floats = [k for k, v in t.items() if v.is_floating_point()]
    if floats:
        return f"tensors {floats} are not integer"
    bad = _attrs_problem(op)
    if bad:
        return bad
    a = op.attrs
    arity = {"input": 0, "add": 2}.get(op.op, 1)
    if len(op.inputs) != arity or (op.op == "input") != (not seen):
        return f"{op.op} takes {arity} input(s), and only the first op is the input"
    ins = [seen[i] for i in op.inputs]
    if op.op in _PASS_THROUGH:  # the input's scale, and its range (a ReLU cuts it at 0)
        lo, hi = _value_range(ins[0])
        expected = (max(lo, 0), hi) if op.op == "relu" else (lo, hi)
        if op.op == "clamp" and not lo <= a["lo"] <= a["hi"] <= hi:
            return f"range {a['lo']}..{a['hi']} is not within its input's {lo}..{hi}"
        if op.op != "clamp" and _value_range(op) != expected:
            return f"range {a['lo']}..{a['hi']} is not its input's {expected[0]}..{expected[1]}"
        if a["scale"] != ins[0].attrs["scale"]:
            return f"scale {a['scale']!r} is not its input's {ins[0].attrs['scale']!r}"
        return None
    bad = _range_problem(op, op is model.ops[-1], model.info)
    if bad:
        return bad
    if op.op in _WEIGHT_OPS:
        return _weight_op_problem(op, t, ins[0], model.info)
    if op.op in ("add", "avgpool"):
        multipliers = a["multipliers"] if op.op == "add" else [a["multiplier"]]
        if op.op == "add":
            peak = sum(_magnitude(x) * m for x, m in zip(ins, multipliers, strict=True))
        else:
            window = a["kernel"] if a["kernel"] is not None else a["input_size"]
            peak = math.prod(window) * _magnitude(ins[0]) * multipliers[0]
        if peak >= 1 << MAX_SHIFT:
            return "the int64 products can overflow"
    return None


_PASS_THROUGH = ("maxpool", "relu", "clamp", "flatten", "slice", "pad")


def _magnitude(op: IntOp) -> int:
    return max(abs(int(op.attrs["lo"])), abs(int(op.attrs["hi"])))


def _weight_op_problem(
    op: IntOp, t: dict[str, Tensor], source: IntOp, info: dict[str, Any]
) -> str | None:
    a = op.attrs
    bits = a["bits"]
    weight_bits = info.get("weight_bits")
    if _is_bits_list(weight_bits) and bits not in weight_bits:
        return f"bits={bits} is not among the file's weight_bits {weight_bits}"
    out_channels = a["weight_shape"][0] if op.op == "conv" else a["out_features"]
    k = math.prod(a["weight_shape"][1:]) if op.op == "conv" else a["in_features"]
    expected = {
        "codes": (torch.uint8, [out_channels, row_bytes(k, bits)]),
        "bias": (torch.int32, [out_channels]),
        "multiplier": (torch.int32, [out_channels]),
        "shift": (torch.int32, [out_channels]),
    }
    for key, (dtype, shape) in expected.items():
        if key not in t or t[key].dtype != dtype or list(t[key].shape) != shape:
            found = "missing" if key not in t else f"{t[key].dtype} {list(t[key].shape)}"
            return f"{key} must be {dtype} {shape}, found {found}"
    n1 = a.get("n1")
    if not (_is_int(n1) or _is_ints(n1, out_channels, INT32_MIN)):
        return f"n1 must be an int or {out_channels} ints (one per output channel), got {n1!r}"
    bad = n1_problem(metadata_n1(n1), out_channels, torch.float32)  # ONNX decodes to float32
    if bad:
        return bad
    codes = unpack_codes(t["codes"], bits, k)
    bad = codes_problem(codes, bits)
    if bad:
        return bad
    lo, hi = _value_range(source)
    if lo < -128 or hi > 255:
        return f"its input is not 8-bit (range {lo}..{hi})"
    unsigned = lo >= 0
    if not 0 <= a["frac"] <= max_frac_bits(k, unsigned=unsigned):
        return f"frac={a['frac']} can overflow the int32 accumulator over {k} terms"
    bound = accumulator_bound(codes, bits, a["frac"], max(-lo, hi)) + t["bias"].long().abs()
    if not bound.numel():
        return None
    if int(bound.max()) > INT32_MAX:
        row = int(bound.argmax())
        return f"channel {row}: accumulator + bias can reach {int(bound[row])} > 2**31 - 1"
    shift, multiplier = t["shift"].to(torch.int64), t["multiplier"].to(torch.int64)
    if bool(((shift < 0) | (shift > MAX_SHIFT)).any()):
        return f"shifts must lie in 0..{MAX_SHIFT}"
    bad = _channel_multiplier_problem(multiplier, shift)
    if bad:
        return bad
    if int((bound * multiplier.abs()).max()) >= 1 << MAX_SHIFT:
        return "(accumulator + bias) * multiplier can overflow int64"
    return None


def _channel_multiplier_problem(multiplier: Tensor, shift: Tensor) -> str | None:
    """Per channel, ``|multiplier| < 2**31`` (a BatchNorm's negative scale makes it negative),
    odd unless the shift is 0 (normalised: 0 only with shift 0)."""
    wide = multiplier == INT32_MIN
    if bool(wide.any()):
        return f"channel {int(wide.nonzero()[0])}: multiplier -2**31 is out of range"
    loose = (multiplier % 2 == 0) & (shift != 0)
    if bool(loose.any()):
        c = int(loose.nonzero()[0])
        return (
            f"channel {c}: multiplier {int(multiplier[c])} >> {int(shift[c])} is not normalised "
            "(even with a non-zero shift)"
        )
    return None


def _value_range(op: IntOp) -> tuple[int, int]:
    return int(op.attrs["lo"]), int(op.attrs["hi"])


# ---------------------------------------------------------------------------------- file


def save_integer(path: str | os.PathLike[str], model: IntegerModel) -> None:
    """Write an integer model atomically as safetensors with a sha256 digest.

    Raises:
        ValueError: if the model fails :func:`program_problems` (nothing is written).
    """
    problems = program_problems(model)
    if problems:
        raise ValueError(f"the integer model is unsound at {problem_line(model, *problems[0])}")
    metadata = {
        "format": INT_FORMAT,
        "program": json.dumps([op.as_json() for op in model.ops]),
        **{k: json.dumps(v) for k, v in model.info.items()},
    }
    write_safetensors(path, {k: v.cpu() for k, v in model.tensors().items()}, metadata)


def load_integer(
    path: str | os.PathLike[str] | SafetensorsFile, validate: bool = True
) -> IntegerModel:
    """Read a file written by :func:`save_integer` (nothing is unpickled), from its path or
    opened already (:func:`inq.artefact.open_artefact` opens any of inq's files).

    With ``validate`` (the default) the digest and :func:`program_problems` are checked; without
    it, ``model.digest_problem`` says whether the contents match their digest (for ``inq
    verify``, which reports every problem).

    Raises:
        ValueError: if the file is missing, not an integer model or malformed; with
            ``validate``, also if it was modified after it was written or is unsound.
    """
    file = open_safetensors(path)
    path, metadata = file.path, file.metadata
    fmt = metadata.get("format")
    if fmt != INT_FORMAT:
        raise ValueError(f"{path}: not an INQ integer model (format {fmt!r}); see inq calibrate")
    tensors = file.tensors()
    try:
        ops = [IntOp(d["name"], d["op"], list(d["inputs"]), dict(d["attrs"]))
               for d in json.loads(metadata["program"])]  # fmt: skip
        skip = ("format", "program", DIGEST_KEY)
        info = {k: json.loads(v) for k, v in metadata.items() if k not in skip}
        names = {op.name for op in ops}
        stray = [k for k in tensors if k.rpartition(".")[0] not in names
                 or k.rpartition(".")[2] not in _TENSOR_FIELDS]  # fmt: skip
        if stray or not ops:
            raise ValueError(f"tensors {stray} belong to no op" if stray else "an empty program")
        model = IntegerModel(ops, tensors, info)
    except (KeyError, TypeError, ValueError, AttributeError) as err:
        raise ValueError(f"{path}: corrupt integer model ({err})") from err
    model.digest_problem = digest_problem(tensors, metadata)
    if validate:
        if model.digest_problem:
            raise ValueError(f"{path}: {model.digest_problem}")
        problems = program_problems(model)
        if problems:
            raise ValueError(f"{path}: {problem_line(model, *problems[0])}")
    return model
