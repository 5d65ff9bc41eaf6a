"""hls4ml export of an integer model: an FPGA project made by hls4ml's own PyTorch converter
whose C simulation (g++) computes what the integer model computes, bit for bit.

hls4ml is handed a float64 *shadow* of the integer model in real units, with every type set by
hand so that no value is ever rounded where the integer model does not round:

- each conv/linear: the power-of-two weights ``w * 2**-frac`` and the bias, in the narrowest
  ``ap_fixed`` types that hold them exactly (:func:`exact_type`), and an accumulator type wide
  enough for the layer's accumulator bound (:func:`inq.quant.integer.accumulator_bound`): the
  sum is exact, as the integer model's int32 sum is;
- its requantization ``(acc + bias) * multiplier >> shift`` as a BatchNorm whose scale is the
  exact dyadic ``multiplier * 2**-shift * (unit / scale)`` per channel and whose result type is
  the integer model's activation type, ``ap_(u)fixed<bits, ..., AP_RND, AP_SAT>``: ``AP_RND``
  rounds half toward +inf and ``AP_SAT`` clamps, exactly ``clamp(floor(v + 1/2), lo, hi)``
  (a folded ReLU is the unsigned type's saturation at 0);
- the input: the same type, so the conversion of the float input is ``floor(x / scale + 1/2)``;
- max pooling as is; average pooling over a power-of-two window with an accumulator holding
  the sum and its quotient exactly, rounded on assignment; residual adds as one exact BatchNorm
  per branch (``m_x * 2**-shift``) and an add whose result type rounds and saturates.

Weights are exact ``ap_fixed`` constants, not hls4ml's exponent type: that type holds no zero
(INQ weights are often 0), is reachable only through a QKeras quantizer, and its writer calls
``np.product`` (gone in NumPy 2). Every weight, bias and scale array is ``static const`` where
Vitis HLS reads it, and so is every parameter it is passed to (:func:`declare_constants`; hls4ml
writes plain globals): the synthesised C++ has no ``a * w`` with a non-constant ``w``, and Vitis
HLS sees each product as one by a constant, a shift (or plain wiring) for ``±2**k``, K shifts
added for a sum of K signed powers of two. The C simulation keeps hls4ml's own copies, filled
with the same values from text files (g++ compiles tens of thousands of ``ap_fixed``
initializers many times slower than the rest of a project). :class:`HlsLayer` counts, per
layer, the constants that are not ``0`` or ``±2**k`` and the most signed powers of two one of
them is the sum of: none and 1 among the weights; the BatchNorm scales are the requantization
multipliers, one per channel, each a sum of at most K signed powers of two where the model was
calibrated with ``requant_terms=K``, so with K=1 every constant a product takes is 0 or
``±2**k``.

Refused, in one line naming the op: activation scales that are not powers of two, a value range
narrower than its type (a ReLU6 clamp), windowed or non-power-of-two average pooling whose
multiplier is not the window's reciprocal, ops hls4ml's PyTorch converter has no layer for.

Example::

    hls_model, layers = export_hls4ml(load_integer("model.int.safetensors"), "hls_prj")
    hls_model.predict(np.ascontiguousarray(x, np.float64))  # the integer model, in real units
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import errno
import math
import os
import re
import shutil
import signal
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import numpy as np
import torch
from torch import nn

from inq import project
from inq.codes import decode_weight
from inq.data import input_shape
from inq.deploy.target import INTEGER_SOURCE, PROJECT_DIR, Job, Target
from inq.fileio import atomic_dir, describe_os_error
from inq.pow2 import exact_log2
from inq.quant.integer import IntegerModel, IntOp, accumulator_bound

__all__ = [
    "BACKEND",
    "IO_TYPES",
    "MANIFEST",
    "TARGET",
    "HlsLayer",
    "declare_constants",
    "exact_type",
    "export_hls4ml",
    "hls_shadow",
    "project_problem",
    "run_csim",
    "write_manifest",
]

BACKEND = "Vitis"  # hls4ml's backend for Vitis HLS (its C simulation needs only g++)
BUILD_LOG = "inq_build.log"
IO_TYPES = ("io_parallel", "io_stream")


@dataclass
class HlsLayer:
    """One hls4ml layer of the shadow: its ``name``, the integer op it comes from, the types
    ``inq`` set (``weight``, ``bias``, ``accum``, ``scale``, ``result``) and the constants it
    multiplies by (``constants``: count, ``non_pow2``: those not zero or ``±2**k``, ``terms``:
    the most signed powers of two one of them is the sum of, so 1 where every one is a shift;
    a requantization calibrated with ``requant_terms=K`` has at most K)."""

    name: str
    op: str
    types: dict[str, str]
    constants: int = 0
    non_pow2: int = 0
    terms: int = 0
    values: dict[str, np.ndarray] = field(default_factory=dict, repr=False)


def exact_type(values: np.ndarray, rounding: str = "") -> str:
    """The narrowest hls4ml fixed-point type holding every float64 in ``values`` exactly.

    Example:
        >>> exact_type(np.array([0.5, -0.25, 0.0]))
        'fixed<3,1>'
        >>> exact_type(np.array([3.0, 0.125]))
        'ufixed<5,2>'
    """
    nonzero = values[values != 0].astype(np.float64)
    lsb = min((_lowest_bit(float(v)) for v in nonzero.flat), default=0)
    ints = np.ldexp(values.astype(np.float64), -lsb)  # exact: a power-of-two scaling
    return _fixed(lsb, int(ints.min()), int(ints.max()), rounding)


def _lowest_bit(value: float) -> int:
    numerator, denominator = value.as_integer_ratio()
    trailing = (abs(numerator) & -abs(numerator)).bit_length() - 1
    return trailing - (denominator.bit_length() - 1)


def _fixed(lsb: int, lo: int, hi: int, rounding: str = "") -> str:
    """``fixed<W,I>`` (``ufixed`` where ``lo >= 0``) holding the integers ``lo..hi`` times
    ``2**lsb``; ``rounding`` (e.g. ``RND,SAT``) appended."""
    bits, _, signed = _type_range(lo, hi)
    kind = "fixed" if signed else "ufixed"
    return f"{kind}<{bits},{bits + lsb}{',' + rounding if rounding else ''}>"


def _type_range(lo: int, hi: int) -> tuple[int, bool, bool]:
    """The bits of the narrowest (un)signed type holding ``lo..hi``, and whether that type's
    whole range is ``lo..hi`` (so its saturation is the op's clamp), and whether it is signed."""
    if lo < 0:
        bits = max((-lo - 1).bit_length(), hi.bit_length()) + 1
        return bits, lo == -(1 << (bits - 1)) and hi == (1 << (bits - 1)) - 1, True
    bits = max(1, hi.bit_length())
    return bits, lo == 0 and hi == (1 << bits) - 1, False


def _log2(value: float, op: IntOp) -> int:
    k = exact_log2(value)
    if k is None:
        raise ValueError(
            f"{op.name}: activation scale {value} is not a power of two; the hls4ml export is "
            "exact for power-of-two scales only (calibrate without --float-scales)"
        )
    return k


def _activation(op: IntOp) -> str:
    """The type of ``op``'s value in the integer model: the narrowest fixed-point type of its
    scale holding ``lo..hi``, rounding half up (``RND``) and saturating (``SAT``) to the type's
    range (a range narrower at the top, a ReLU6, is cut by :meth:`_Builder._cut`).

    Raises:
        ValueError: ``lo`` above the type's lowest value (a Hardtanh clamp below zero).
    """
    a = op.attrs
    bits, _, signed = _type_range(a["lo"], a["hi"])
    lowest = -(1 << (bits - 1)) if signed else 0
    if a["lo"] != lowest:
        raise ValueError(
            f"{op.name}: its range {a['lo']}..{a['hi']} starts above its {bits}-bit type's "
            "(a Hardtanh clamp); no hls4ml form here"
        )
    return _fixed(_log2(a["scale"], op), lowest, _type_top(bits, signed), "RND,SAT")


def _type_top(bits: int, signed: bool) -> int:
    return (1 << (bits - 1)) - 1 if signed else (1 << bits) - 1


class _Shadow(nn.Module):
    """A float64 module in real units that hls4ml's tracer reads op by op: ``steps`` run in
    order, each a submodule on one value, or ``add``/``sub`` of two (``torch.add``/``sub``)."""

    def __init__(self) -> None:
        super().__init__()
        self.steps: list[tuple[str, str, tuple[str, ...]]] = []  # (out, module or fn, inputs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        values = {"x": x}
        for out, module, inputs in self.steps:
            args = [values[name] for name in inputs]
            if module in _MERGES:
                values[out] = _MERGES[module](*args)
            else:
                values[out] = getattr(self, module)(*args)
        return values[self.steps[-1][0]]


_MERGES = {"add": torch.add, "sub": torch.sub}


def hls_shadow(model: IntegerModel, dims: Sequence[int]) -> tuple[_Shadow, str, list[HlsLayer]]:
    """The float64 shadow of ``model`` (one input of shape ``dims``, e.g. ``(C, H, W)``) for
    hls4ml's PyTorch converter, its input type, and its
    layers with the types to set (each ``torch.add`` layer named ``add``, ``add_1``, ... as the
    tracer names them, and ``sub`` likewise).

    Raises:
        ValueError: an op with no exact hls4ml form, naming it.
    """
    builder = _Builder(model, dims)
    for op in model.ops:
        builder.add(op)
    return builder.shadow, builder.input_type, builder.layers


class _Builder:
    def __init__(self, model: IntegerModel, dims: Sequence[int]) -> None:
        self.model = model
        self.dims = tuple(dims)
        self.shadow = _Shadow()
        self.layers: list[HlsLayer] = []
        self.ops: dict[str, IntOp] = {}
        self.value: dict[str, str] = {}  # integer op -> the shadow's value holding it
        self.flat: dict[str, bool] = {}  # integer op -> its value is [N, features]
        self.input_type = ""
        self._merges = {name: 0 for name in _MERGES}

    def add(self, op: IntOp) -> None:
        self.ops[op.name] = op
        kind, a = op.op, op.attrs
        self.flat[op.name] = kind in ("flatten", "linear") or (
            kind != "input" and self.flat[op.inputs[0]]
        )
        if kind == "input":
            self.input_type = _activation(op)
            self.value[op.name] = "x"
        elif kind in ("conv", "linear"):
            self._weight_op(op)
        elif kind == "add":
            self._add(op)
        elif kind == "maxpool":
            if a["dilation"] != [1, 1] or a["ceil_mode"]:
                raise ValueError(f"{op.name}: a dilated or ceil_mode max pool has no hls4ml form")
            pool = nn.MaxPool2d(tuple(a["kernel"]), tuple(a["stride"]), tuple(a["padding"]))
            self._step(op, _layer_name("pool", op), pool, {"result": _activation(op)})
        elif kind == "avgpool":
            self._avgpool(op)
        elif kind == "flatten" and a["start_dim"] == 1 and a["end_dim"] == -1:
            source = self.value[op.inputs[0]]
            self.value[op.name] = self._module(_layer_name("flat", op), nn.Flatten(), (source,))
        elif kind == "relu":
            self._step(op, _layer_name("relu", op), nn.ReLU(), {"result": _activation(op)})
        elif kind == "clamp":
            self._clamp(op)
        else:
            raise ValueError(f"{op.name}: op {kind} has no hls4ml form here")
        bits, whole, signed = _type_range(a.get("lo", 0), a.get("hi", 1))
        if kind in ("conv", "linear", "add", "avgpool", "relu", "clamp") and not whole:
            self._cut(op, _type_top(bits, signed))

    def _clamp(self, op: IntOp) -> None:
        """A clamp no op folded: a ReLU where it cuts a signed input at 0 (then, as for any
        op, :meth:`_cut` where ``hi`` is below its type's top)."""
        lo, below = op.attrs["lo"], self.ops[op.inputs[0]].attrs["lo"]
        if lo == 0 and below < 0:
            self._step(op, _layer_name("relu", op), nn.ReLU(), {"result": _activation(op)})
        elif lo == below:
            self.value[op.name] = self.value[op.inputs[0]]
        else:
            raise ValueError(
                f"{op.name}: a clamp to {lo}..{op.attrs['hi']} has no hls4ml form here"
            )

    def _module(self, name: str, module: nn.Module, inputs: Sequence[str]) -> str:
        """``module`` on the shadow values ``inputs``; its output is the value ``name``."""
        self.shadow.add_module(name, module)
        self.shadow.steps.append((name, name, tuple(inputs)))
        return name

    def _step(self, op: IntOp, name: str, module: nn.Module, types: dict[str, str],
              source: str | None = None) -> None:  # fmt: skip
        """``module`` on ``source`` (default: ``op``'s input) as ``op``'s value."""
        source = source or self.value[op.inputs[0]]
        self.value[op.name] = self._module(name, module, (source,))
        self.layers.append(HlsLayer(name, op.name, types))

    def _merge(self, fn: str, op: IntOp, values: Sequence[str], result: str) -> str:
        """``torch.add``/``sub`` of ``values`` (shadow values) as hls4ml's merge layer named
        as the tracer names it, its sum rounded and saturated to ``result``."""
        count = self._merges[fn]
        self._merges[fn] += 1
        out = f"{fn}{len(self.shadow.steps)}"
        self.shadow.steps.append((out, fn, tuple(values)))
        self.layers.append(HlsLayer(fn if count == 0 else f"{fn}_{count}", op.name,
                                    {"result": result}))  # fmt: skip
        return out

    def _cut(self, op: IntOp, top: int) -> None:
        """Clamp ``op``'s value (in its type, ``0..top``) to ``hi``: ``v - relu(v - hi)``, a
        BatchNorm of scale 1 and bias ``-hi``, a ReLU and a subtraction, all exact."""
        a = op.attrs
        if a["lo"] != 0:
            raise ValueError(f"{op.name}: a clamp to {a['lo']}..{a['hi']} has no hls4ml form here")
        lsb, hi, value = _log2(a["scale"], op), a["hi"], self.value[op.name]
        ones = np.ones(self._channels(op.name))
        over = self._rescale(op, _layer_name("over", op), value, ones, _fixed(lsb, -hi, top - hi),
                             bias=-math.ldexp(hi, lsb))  # fmt: skip
        cut = {"result": _fixed(lsb, 0, top - hi)}
        self._step(op, _layer_name("cut", op), nn.ReLU(), cut, over)
        self.value[op.name] = self._merge("sub", op, (value, self.value[op.name]),
                                          _fixed(lsb, 0, hi, "RND,SAT"))  # fmt: skip

    def _weight_op(self, op: IntOp) -> None:
        a, t = op.attrs, self.model.op_tensors(op.name)
        x_op = self.ops[op.inputs[0]]
        if op.op == "conv":
            shape = tuple(a["weight_shape"])
            if a["groups"] != 1 or a["dilation"] != [1, 1]:
                raise ValueError(f"{op.name}: a grouped or dilated conv has no hls4ml form here")
            module: nn.Conv2d | nn.Linear = nn.Conv2d(
                shape[1], shape[0], shape[2:], tuple(a["stride"]), tuple(a["padding"]),
                dtype=torch.float64,
            )  # fmt: skip
        else:
            shape = (a["out_features"], a["in_features"])
            module = nn.Linear(shape[1], shape[0], dtype=torch.float64)
        ints = decode_weight(t["codes"], a["bits"], a["frac"], shape, torch.float64)
        unit = _log2(x_op.attrs["scale"], x_op) - a["frac"]  # the accumulator's LSB
        weight = np.ldexp(ints.numpy(), -a["frac"])
        bias = np.ldexp(t["bias"].double().numpy(), unit)
        module.weight = nn.Parameter(torch.from_numpy(weight))
        module.bias = nn.Parameter(torch.from_numpy(bias))
        x_max = max(abs(x_op.attrs["lo"]), abs(x_op.attrs["hi"]))
        bound = int(accumulator_bound(t["codes"], a["bits"], a["frac"], x_max).max())
        bound += int(t["bias"].abs().max())
        acc = _fixed(unit, -bound, bound)
        types = {"weight": exact_type(weight), "bias": exact_type(bias), "accum": acc,
                 "result": acc}  # fmt: skip
        name = self._module(_layer_name(op.op, op), module, (self.value[op.inputs[0]],))
        self.layers.append(HlsLayer(name, op.name, types, *_constants(weight),
                                    {"weight": weight}))  # fmt: skip
        scale = np.ldexp(t["multiplier"].double().numpy(),
                         _log2(a["scale"], op) - unit - t["shift"].numpy())  # fmt: skip
        self.value[op.name] = self._rescale(op, _layer_name("bn", op), name, scale, _activation(op))

    def _rescale(self, op: IntOp, name: str, source: str, scale: np.ndarray, result: str,
                 bias: float = 0.0) -> str:  # fmt: skip
        """A BatchNorm of ``scale`` per channel and ``bias`` (``eps`` 0, mean 0, variance 1:
        hls4ml's scale and bias are these) on the shadow value ``source``, into ``result``."""
        kind = nn.BatchNorm1d if self.flat[op.name] else nn.BatchNorm2d
        bn = kind(len(scale), eps=0.0, dtype=torch.float64)
        with torch.no_grad():
            bn.weight.copy_(torch.from_numpy(scale))
            bn.bias.fill_(bias)
        biases = np.full(len(scale), bias)
        types = {"scale": exact_type(scale), "bias": exact_type(biases), "result": result}
        self.layers.append(HlsLayer(name, op.name, types, *_constants(scale),
                                    {"scale": scale, "bias": biases}))  # fmt: skip
        return self._module(name, bn.eval(), (source,))

    def _avgpool(self, op: IntOp) -> None:
        a = op.attrs
        x_op = self.ops[op.inputs[0]]
        kernel = a["input_size"] if a["kernel"] is None else a["kernel"]
        stride = kernel if a["kernel"] is None else a["stride"]
        count = kernel[0] * kernel[1]
        ratio = x_op.attrs["scale"] / (count * a["scale"])  # what the multiplier must be
        if count & (count - 1) or math.ldexp(a["multiplier"], -a["shift"]) != ratio:
            raise ValueError(
                f"{op.name}: average pooling over {count} values has no exact hls4ml form "
                "(hls4ml divides by the count; exact for a power of two only)"
            )
        lsb = _log2(x_op.attrs["scale"], x_op) - (count.bit_length() - 1)
        types = {"accum": _fixed(lsb, 0, x_op.attrs["hi"] * count * count),
                 "result": _activation(op)}  # fmt: skip
        if x_op.attrs["lo"] < 0:
            types["accum"] = _fixed(lsb, x_op.attrs["lo"] * count * count,
                                    x_op.attrs["hi"] * count * count)  # fmt: skip
        self._step(op, _layer_name("pool", op), nn.AvgPool2d(tuple(kernel), tuple(stride)), types)

    def _add(self, op: IntOp) -> None:
        """``(x * m_x + y * m_y) >> shift``: each branch times ``m * 2**-shift`` in an exact
        type, then an add that rounds and saturates to ``op``'s type."""
        a = op.attrs
        branches = []
        for i, (name, m) in enumerate(zip(op.inputs, a["multipliers"], strict=True)):
            x = self.ops[name]
            factor = math.ldexp(m, -a["shift"]) * a["scale"] / x.attrs["scale"]
            lsb = _lowest_bit(factor)
            whole = int(math.ldexp(factor, -lsb))  # factor = whole * 2**lsb
            exact = _fixed(_log2(x.attrs["scale"], x) + lsb, x.attrs["lo"] * whole,
                           x.attrs["hi"] * whole)  # fmt: skip
            scale = np.full(self._channels(name), factor)
            name = self._rescale(op, _layer_name(f"bn{i}", op), self.value[name], scale, exact)
            branches.append(name)
        self.value[op.name] = self._merge("add", op, branches, _activation(op))

    def _channels(self, name: str) -> int:
        op = self.ops[name]
        while op.op not in ("conv", "linear", "input"):
            op = self.ops[op.inputs[0]]
        if op.op == "conv":
            return int(op.attrs["weight_shape"][0])
        return int(op.attrs["out_features"]) if op.op == "linear" else self.dims[0]


def _layer_name(stem: str, op: IntOp) -> str:
    """``stem_<op>``, a C++ identifier (hls4ml names the layer, its types and its code so)."""
    return re.sub(r"_+", "_", re.sub(r"\W", "_", f"{stem}_{op.name}"))


def _constants(values: np.ndarray) -> tuple[int, int, int]:
    """``HlsLayer``'s figures of the constants ``values``: how many; how many are neither 0 nor
    ``±2**k`` (the multiplications by them that need a multiplier, the rest are shifts); the
    most signed powers of two one of them is the sum of (0 if all are 0)."""
    digits = _signed_digits(values)
    return values.size, int((digits > 1).sum()), int(digits.max(initial=0))


def _signed_digits(values: np.ndarray) -> np.ndarray:
    """For each of ``values`` (float64s, each an integer times a power of two), the fewest
    signed powers of two it is the sum of: the non-zero digits of its canonical signed-digit
    form, so a product by it is that many shifts added (0 for 0, 1 for ``±2**k``).

    Example:
        >>> _signed_digits(np.array([0.0, 0.25, -3.0, 0.75, 11.0])).tolist()
        [0, 1, 2, 2, 3]
    """
    magnitudes, where = np.unique(np.abs(values.astype(np.float64)), return_inverse=True)
    digits = np.zeros(len(magnitudes), np.int64)
    for i, value in enumerate(magnitudes.tolist()):
        if value:
            n = int(math.ldexp(value, -_lowest_bit(value)))  # odd
            digits[i] = ((3 * n) ^ n).bit_count()  # the digits of n's non-adjacent form
    return digits[where.reshape(-1)].reshape(values.shape)


def export_hls4ml(
    model: IntegerModel,
    out_dir: str | os.PathLike[str],
    shape: Sequence[int] | None = None,
    force: bool = False,
    before_compile: Callable[[], None] | None = None,
    io_type: str = "io_parallel",
) -> tuple[Any, list[HlsLayer]]:
    """Write ``model`` as an hls4ml project in ``out_dir`` (backend :data:`BACKEND`) and
    compile its C simulation with g++; returns the compiled hls4ml model (``predict`` runs the
    C++) and its layers with the types ``inq`` set.

    ``io_type`` is hls4ml's: ``io_parallel`` (every layer unrolled, the lowest latency; its C++
    grows with the image: fine for digits, too big to compile quickly for 28x28 maps) or
    ``io_stream`` (line buffers; the same arithmetic and types, so equally exact).

    The project is made, compiled and checked in a temporary directory beside ``out_dir``,
    which then takes its place whole (:func:`inq.fileio.atomic_dir`): a failed, interrupted or
    killed export leaves ``out_dir`` as it was. ``out_dir`` must be absent or empty, or, with
    ``force``, a project this function wrote whose files are all as it wrote them (its
    :data:`MANIFEST` lists them with their sha256): ``force`` replaces that and nothing else.
    ``before_compile`` is called once the checks have passed, before the slow part; g++ runs in
    its own process group, stopped with the export.

    Raises:
        ValueError: an op with no exact form, a written constant that does not read back
            exactly, no ``hls4ml`` (naming the ``fpga`` extra), an output directory that is not
            empty (or, with ``force``, not a project inq wrote, or changed since), a compile
            failure (the compiler's first error line; a full disk said as such).
    """
    hls4ml = _hls4ml()
    if io_type not in IO_TYPES:
        raise ValueError(f"io_type {io_type!r}: use one of {', '.join(IO_TYPES)}")
    out = Path(out_dir)
    dims = _input_dims(model, shape)
    shadow, input_type, layers = hls_shadow(model, dims)  # refusals come before any writing
    project.may_write(out, force, PROJECT_FORMAT, _WHAT)
    project.stop_abandoned_builds(out)
    try:
        with atomic_dir(out) as staging:  # making it checks the place is writable
            if before_compile is not None:
                before_compile()
            hls_model = _convert(hls4ml, shadow, dims, input_type, layers, staging, io_type)
            _check_written(hls_model, layers, staging)
            _check_csim(model, hls_model, dims)
            config = staging / "hls4ml_config.yml"  # where hls4ml records its output directory
            config.write_text(config.read_text().replace(str(staging), str(out)))
            write_manifest(staging)
    except OSError as err:
        raise ValueError(f"-o {out}: cannot write the project ({_write_error(err)})") from None
    return hls_model, layers


def _write_error(err: OSError) -> str:
    """:func:`inq.fileio.describe_os_error` of a failed write, or of the first failure of
    hls4ml's copy of its header templates (``shutil.copytree`` gathers them in one error
    that has no errno, only the system's words)."""
    if isinstance(err, shutil.Error) and err.args and isinstance(err.args[0], list):
        first = str(err.args[0][0][-1])
        disk = _disk_error(first)
        return first if disk is None else describe_os_error(disk)
    return describe_os_error(err)


MANIFEST = project.MANIFEST  # in a project: its format and every file's sha256
PROJECT_FORMAT = project.HLS4ML_FORMAT
_WHAT = "an hls4ml project"


def write_manifest(folder: Path) -> None:
    """Record every file under ``folder`` with its sha256 in ``folder/MANIFEST``."""
    project.write_manifest(folder, PROJECT_FORMAT)


def project_problem(folder: Path) -> str | None:
    """Why the directory ``folder`` is not an hls4ml project this module wrote, exactly as it
    wrote it (a file it did not write, or one changed since), or None if it is
    (:func:`inq.project.project_problem`)."""
    return project.project_problem(folder, PROJECT_FORMAT, _WHAT)


def _hls4ml() -> Any:
    try:
        import hls4ml
    except ImportError as err:
        raise ValueError(
            f"hls4ml projects need the fpga extra: pip install 'inq[fpga]' ({err.name} is missing)"
        ) from None
    return hls4ml


def _input_dims(model: IntegerModel, given: Sequence[int] | None) -> list[int]:
    shape = given or ((model.info.get("data") or {}).get("input") or {}).get("shape")
    if not shape:
        raise ValueError("the integer model records no input shape (data); hls4ml needs one")
    return [int(v) for v in shape]


def _convert(hls4ml: Any, shadow: _Shadow, dims: list[int], input_type: str,
             layers: list[HlsLayer], out: Path, io_type: str) -> Any:  # fmt: skip
    """hls4ml's converter on ``shadow`` with every type set, then the project written, its
    arrays declared constant (:func:`declare_constants`) and its C simulation compiled
    (:func:`_compile`); hls4ml's printing goes to ``out/inq_build.log``."""
    log = out / BUILD_LOG
    with open(log, "w") as sink, contextlib.redirect_stdout(sink):
        config = hls4ml.utils.config_from_pytorch_model(
            shadow, tuple(dims), granularity="name", backend=BACKEND,
            default_precision="fixed<32,16>", transpose_outputs=True,
            channels_last_conversion="internal",
        )  # fmt: skip
        names = config["LayerName"]
        names[next(iter(names))]["Precision"]["result"] = input_type
        for layer in layers:
            if layer.name not in names:
                raise ValueError(f"hls4ml made no layer {layer.name} (of op {layer.op})")
            names[layer.name]["Precision"].update(layer.types)
        hls_model = hls4ml.converters.convert_from_pytorch_model(
            shadow, output_dir=str(out), backend=BACKEND, io_type=io_type,
            hls_config=config,
        )  # fmt: skip
        hls_model.write()
        declare_constants(hls_model, out)
        sink.flush()
        _compile(hls_model, out, sink)
    return hls_model


def declare_constants(hls_model: Any, out: Path) -> None:
    """Declare every weight, bias and scale array of the project in ``out`` constant where
    Vitis HLS reads it. hls4ml 1.3 (no writer option changes it) writes each as a plain global
    in ``firmware/weights/<name>.h``, twice: under ``#ifndef __SYNTHESIS__`` without values,
    filled from ``<name>.txt`` at the C simulation's first call, and for synthesis with its
    values, which this makes ``static const``. The functions it is passed to take it as
    ``typename CONFIG_T::weight_t weights[N]`` (``bias_t``, ``scale_t``), and a const array
    can be passed only where that type is const: each such typedef in ``parameters.h`` is made
    const too (the C simulation's writable arrays pass all the same). Then no product in the
    synthesised C++ is by a non-constant array.

    Raises:
        ValueError: naming the file where an array's two declarations, or a typedef of its type,
            are not as hls4ml 1.3 writes them (so an hls4ml that writes them otherwise cannot
            leave an array non-const unnoticed).
    """
    firmware = out / "firmware"
    kinds: set[str] = set()
    for layer in hls_model.get_layers():
        for variable in layer.get_weights():
            name, kind = re.escape(variable.name), re.escape(variable.type.name)
            path = firmware / "weights" / f"{variable.name}.h"
            text, count = re.subn(
                rf"^(#ifndef __SYNTHESIS__\n{kind} {name}\[(\d+)\];\n#else\n)({kind} {name}"
                rf"\[\2\] = \{{)", r"\1static const \3", path.read_text(), flags=re.M,
            )  # fmt: skip
            if count != 1 or len(re.findall(rf"\b{name}\[", text)) != 2:
                raise ValueError(f"{path}: not hls4ml 1.3's two declarations of "
                                 f"{variable.name}; it would not be constant")  # fmt: skip
            path.write_text(text)
            kinds.add(variable.type.name)
    path = firmware / "parameters.h"
    text = path.read_text()
    for kind in sorted(kinds):
        text, count = re.subn(rf"^( *typedef )(?:const )?({re.escape(kind)} (?:weight|bias|scale)"
                              r"_t;)$", r"\1const \2", text, flags=re.M)  # fmt: skip
        if count == 0:
            raise ValueError(f"{path}: no typedef of {kind} as a layer's weight_t, bias_t or "
                             "scale_t; its array would not be constant")  # fmt: skip
    path.write_text(text)


def _compile(hls_model: Any, out: Path, log: IO[str]) -> None:
    """Run the project's ``build_lib.sh`` (g++, what hls4ml's ``compile()`` runs) in a process
    group of its own, killed whole if the export stops (hls4ml's own call kills only the shell,
    and g++ ran on), with the elapsed time on a terminal; its output is kept in memory (a full
    disk would swallow it), then appended to ``log``. Then load the library as hls4ml does.

    Raises:
        OSError, ValueError: the build failed (:func:`_raise_compile_error`).
    """
    returncode, output = project.run_build(["bash", "build_lib.sh"], out, "g++")
    if returncode != 0:
        _raise_compile_error(output)
    log.write(output)
    stamp = hls_model.config.get_config_value("Stamp")
    library = out / "firmware" / f"{hls_model.config.get_project_name()}-{stamp}.so"
    hls_model._top_function_lib = ctypes.cdll.LoadLibrary(str(library))  # as compile() does


_DISK_ERRORS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)  # a full disk, or a file size limit


def _disk_error(text: str) -> OSError | None:
    """The full disk (or file size limit) that ``text``, a tool's output, reports in the
    system's words (a compiler killed by a file size limit names its signal), or None."""
    if (signal.strsignal(signal.SIGXFSZ) or "SIGXFSZ") in text:
        return OSError(errno.EFBIG, os.strerror(errno.EFBIG))
    number = next((n for n in _DISK_ERRORS if os.strerror(n) in text), None)
    return None if number is None else OSError(number, os.strerror(number))


def _raise_compile_error(output: str) -> None:
    """Raise what a failed build's ``output`` means: a full disk as the OSError it is (g++ and
    ld print the system's words), else the compiler's first error line.

    Raises:
        OSError: the disk is full (or a file size limit was reached).
        ValueError: otherwise.
    """
    disk = _disk_error(output)
    if disk is not None:
        raise disk
    lines = output.splitlines()
    first = next((line for line in lines if re.search(r"\berror\b", line)), None)
    if first is None:
        first = f"no error line; its last: {lines[-1].strip()}" if lines else "it printed nothing"
    raise ValueError(f"the generated project does not compile: {first.strip()}")


def _check_written(hls_model: Any, layers: list[HlsLayer], out: Path) -> None:
    """Every weight and scale of the project, read back from the text files its C simulation
    loads and from the headers synthesis reads, is the value ``inq`` gave (hls4ml prints them
    in decimal, and may reorder a conv's weights to channels-last: compared as sorted arrays).

    Raises:
        ValueError: naming the first file that does not read back.
    """
    given = {(layer.name, key): values for layer in layers for key, values in layer.values.items()}
    for layer in hls_model.get_layers():
        for key, variable in layer.weights.items():
            expected = given.get((layer.name, key), np.asarray(variable.data, np.float64))
            for suffix in (".txt", ".h"):
                path = out / "firmware" / "weights" / f"{variable.name}{suffix}"
                if not np.array_equal(np.sort(_written(path)), np.sort(expected.ravel())):
                    raise ValueError(f"{path}: its values are not {layer.name}'s {key} exactly")


def _written(path: Path) -> np.ndarray:
    """The values of a weight array as hls4ml wrote them: all of ``<name>.txt``, or those in
    braces in ``<name>.h``."""
    text = path.read_text()
    if path.suffix == ".h":
        text = text.partition("= {")[2].partition("}")[0]
    return np.array(text.replace(",", " ").split(), np.float64)


def _check_csim(model: IntegerModel, hls_model: Any, dims: list[int], count: int = 64) -> None:
    """The C simulation equals the integer model on ``count`` seeded random inputs that cover
    the input's range (a smoke check of the project; the tests compare whole test splits).

    Raises:
        ValueError: with the number of differing outputs.
    """
    first = model.ops[0].attrs
    low, high = first["lo"] * first["scale"], first["hi"] * first["scale"]
    x = torch.rand([count, *dims], generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    x = (low + (high - low) * x).float()
    expected = (model(x).double() * model.output_scale()).reshape(count, -1).numpy()
    differing = int((run_csim(hls_model, x.numpy()) != expected).sum())
    if differing:
        raise ValueError(f"the C simulation differs from the integer model in {differing} outputs")


def run_csim(hls_model: Any, x: np.ndarray) -> np.ndarray:
    """The compiled project's C simulation on the batch ``x`` (NCHW, as the integer model
    takes it): the integer model's output in real units, ``float64``."""
    if x.ndim == 4:  # the project takes channels-last images (NHWC)
        x = x.transpose(0, 2, 3, 1)
    out: np.ndarray = hls_model.predict(np.ascontiguousarray(x, np.float64))
    return out.reshape(len(x), -1)


def _write(job: Job) -> list[str]:
    """``inq export --hls4ml``: an hls4ml project, its C simulation checked; a line per layer
    with the types set."""
    header, output = job.header, job.output
    io_type = f"io_{job.args.io or 'parallel'}"
    int_model = job.integer_model()
    data = job.data(int_model.info.get("data", {}))
    _, layers = export_hls4ml(int_model, output, input_shape(data), job.args.force, lambda: print(
        f"{header.path} -> {output}: hls4ml project ({BACKEND}, {io_type}); compiling "
        "its C simulation with g++ ...", flush=True), io_type)  # fmt: skip
    lines = [f"{'layer':<12} {'op':<6} {'weight':<12} {'accum':<14} {'scale':<14} "
             f"{'result':<20} terms non-pow2"]  # fmt: skip
    for layer in layers:
        types = layer.types
        lines.append(f"{layer.name:<12} {layer.op:<6} {types.get('weight', '-'):<12} "
                     f"{types.get('accum', '-'):<14} {types.get('scale', '-'):<14} "
                     f"{types.get('result', '-'):<20} {layer.terms:<5} "
                     f"{layer.non_pow2}/{layer.constants}")  # fmt: skip
    weights = sum(layer.non_pow2 for layer in layers if "weight" in layer.types)
    return [
        *lines,
        f"weights multiplied by a non-power-of-two constant: {weights}; "
        f"{_requantization(layers, int_model.info.get('requant_terms'))}; weights, biases and "
        "scales static const for synthesis; C simulation == integer model on 64 random inputs",
        f"synthesis (Vitis HLS, not run here): cd {output} && vitis-run --tcl build_prj.tcl "
        "--mode hls",
    ]


def _requantization(layers: list[HlsLayer], terms: int | None) -> str:
    """What the requantization BatchNorms of ``layers`` multiply by: how many multipliers are
    not a power of two, the most signed powers of two one is the sum of, and how many have
    more than ``terms`` (the model's ``requant_terms``; None: calibrated without)."""
    scales = [layer for layer in layers if "scale" in layer.types]
    most = max((layer.terms for layer in scales), default=0)
    text = (f"requantization multipliers not a power of two: "
            f"{sum(layer.non_pow2 for layer in scales)}, each a sum of at most {most} signed "
            "powers of two")  # fmt: skip
    if terms is None:
        return f"{text} (calibrated without requant_terms)"
    over = sum(int((_signed_digits(layer.values["scale"]) > terms).sum()) for layer in scales)
    return f"{text} (calibrated with requant_terms={terms}: {over} have more)"


def _add_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--io", choices=("parallel", "stream"),
                   help="with --hls4ml: hls4ml's io_type (parallel, the default: every layer "
                   "unrolled; stream: line buffers, for images larger than digits' 8x8: "
                   "compiles in minutes where parallel does not)")  # fmt: skip


TARGET = Target(
    name="hls4ml",
    help="write the integer model (a file, or a run's) as an hls4ml project (-o DIR needed; "
    "pip install 'inq[fpga]') and compile its C simulation with g++: it computes the integer "
    "model bit for bit",
    source=INTEGER_SOURCE,
    output=PROJECT_DIR,
    suffix="",
    write=_write,
    check=lambda path: project.project_problem(path, project.HLS4ML_FORMAT, "an hls4ml project"),
    add_options=_add_options,
    options=("io",),
)
