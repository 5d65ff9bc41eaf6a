"""ONNX export of an INQ model, and its evaluation in ONNX Runtime (the ``onnx`` extra).

:func:`export_onnx` writes the float-activation network of a packed model: the graph that
``torch.onnx.export`` (the ``torch.export``-based exporter, opset :data:`OPSET`) makes of the
model rebuilt from the file, with the input's batch dimension dynamic (``batch``) and the
power-of-two weights as initializers named by their state-dict keys. Its constants are folded
(not BatchNorm: the exporter's optimizer would fold it into the weights), so ONNX Runtime folds
BatchNorm when it loads the file and runs what a plain ``optimize=True`` export runs. The export
is checked before it is written: ``onnx.checker`` passes, and every quantized weight is an
initializer equal to its decoded codes bit for bit. The file records the model and data
descriptions in its ``metadata_props``, so ``inq eval model.onnx`` evaluates it on the run's
data.

:func:`export_qdq` writes an integer model (:mod:`inq.quant.integer`) as the Q/DQ graph that
ONNX Runtime fuses into integer kernels. Each conv/linear is a node unit:
``DequantizeLinear`` of its input, of int8 weights ``±2**k`` (zero point 0) with one scale per
output channel carrying the power-of-two exponent and the folded BatchNorm factor
(:func:`qdq_weight`), and of an int32 bias (scale: input scale times weight scale); the op; a
``Relu`` where the model has one; ``QuantizeLinear`` with the next value's scale. Adds and
average pooling are node units too, of standard ops only (``DequantizeLinear``, ``Add`` or
``AveragePool``, ``QuantizeLinear``: ONNX Runtime fuses them into its ``QLinearAdd`` and
``QLinearAveragePool``); max pooling, flatten, slicing and zero padding run on the integers.
Every value is uint8: zero point 0 where the integer model's value is unsigned, 128 where it is
int8 (as ONNX Runtime runs int8 activations on x86). TensorRT takes int8 values with zero point
0 only: for an integer model with symmetric activations (``inq calibrate --symmetric``) the
export writes TensorRT's form instead (:mod:`inq.export_tensorrt`). Where a value's range is
narrower than uint8's (fewer activation bits, a ReLU6), a ``Clip`` of the integers follows its
``QuantizeLinear``. The last conv/linear, which the integer model keeps in int32, gives float
logits.

Where a layer's integers exceed ``±64`` (``128`` at 5 bits, wider level sets at 6-8 bits: see
:attr:`QdqWeight.int8`), its weights are float initializers of the same values, exact
(``±2**k`` times a float32 scale), and its input is dequantized by ``Cast``, ``Sub`` and
``Mul`` (the same arithmetic): ONNX Runtime then runs the layer as a float convolution instead
of re-quantizing its weights to per-tensor int8 (its WeightBiasQuantization rewrite would, for a
float conv between a ``DequantizeLinear`` and a ``QuantizeLinear``). :func:`export_qdq` reports
how many layers took each form.

ONNX Runtime rounds half to even where the integer model rounds half up, and requantizes in
float32: a value exactly (or within float32 precision) halfway between two integers can differ
by one step, e.g. average pooling by a power of two. Float-weight layers and the float logits
also sum in float32 (relative error ~K * 2**-24 for K terms), and where the integer model caps
``frac`` (wide 7-8-bit level sets) it floors the smallest terms, which the export computes
exactly: there the bound is relative (~3e-4 measured on an 8-bit 2048-input layer), not one
step.

Example (shell)::

    inq export outputs/run --onnx -o model.onnx
    inq export model.int.safetensors --onnx -o model.qdq.onnx
    inq eval model.onnx
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from inq.codes import decode_weight, unpack_codes
from inq.data import data_record
from inq.fileio import atomic_path
from inq.models import build_model
from inq.packed import PackedFile
from inq.quant.integer import INT32_MAX, INT32_MIN, IntegerModel, IntOp, value_dtype

__all__ = [
    "OPSET",
    "OnnxModel",
    "QdqWeight",
    "export_onnx",
    "export_qdq",
    "first_line",
    "is_onnx",
    "load_onnx",
    "qdq_weight",
]

OPSET = 18
INPUT_NAME, OUTPUT_NAME = "input", "logits"


def _modules() -> tuple[Any, Any]:
    try:
        import onnx
        import onnxruntime
    except ImportError as err:
        raise ValueError(
            f"ONNX needs the onnx extra: pip install 'inq[onnx]' ({err.name} is missing)"
        ) from None
    return onnx, onnxruntime


def export_onnx(
    packed: PackedFile,
    path: str | os.PathLike[str],
    input_shape: tuple[int, ...],
    model: nn.Module | None = None,
) -> dict[str, Any]:
    """Write the float-activation ONNX model of ``packed`` for inputs ``[batch, *input_shape]``;
    returns ``{"opset", "nodes", "initializers", "bytes"}``. The model is built from the file's
    description unless ``model`` (the float architecture) is given.

    Raises:
        ValueError: if the onnx extra is missing, the file does not fit the model, the exporter
            cannot express a layer, or the export changed a quantized weight.
    """
    onnx, _ = _modules()
    model = build_model(packed.model) if model is None else model
    packed.load_into(model)
    model.eval()
    example = torch.zeros(2, *input_shape)
    with contextlib.redirect_stdout(io.StringIO()):  # the exporter narrates its passes
        try:
            program = torch.onnx.export(
                model,
                (example,),
                dynamo=True,
                opset_version=OPSET,
                input_names=[INPUT_NAME],
                output_names=[OUTPUT_NAME],
                dynamic_shapes=({0: torch.export.Dim("batch")},),
                optimize=False,  # its optimizer folds BatchNorm into the power-of-two weights
                verbose=False,
            )
        except Exception as err:  # the exporter raises many kinds; all mean "cannot express"
            raise ValueError(f"ONNX cannot express the model: {first_line(err)}") from None
    proto = program.model_proto
    _simplify(proto)
    _check_weights(proto, packed, onnx)
    return _save(proto, path, onnx, packed.model, packed.data)


def _simplify(proto: Any) -> None:
    """Fold what the exporter computes from constants (a bias-less conv's zero bias is a
    ``Shape``/``Expand`` of its weight; a flatten's target shape), in place: then ONNX Runtime
    folds BatchNorm into the convolutions when it loads the file and runs what a plain
    ``optimize=True`` export runs, while the file keeps the power-of-two weights and BatchNorm
    apart."""
    try:
        from onnxscript import rewriter
        from onnxscript.optimizer import fold_constants, remove_unused_nodes
        from onnxscript.rewriter.rules.common import materialize_reshape_shape_rule
    except ImportError as err:
        raise ValueError(
            f"the ONNX export needs onnxscript >= 0.7.2: pip install -U 'inq[onnx]' ({err})"
        ) from None

    fold_constants(proto)
    proto.CopyFrom(rewriter.rewrite(proto, pattern_rewrite_rules=[materialize_reshape_shape_rule]))
    remove_unused_nodes(proto)


def _save(
    proto: Any, path: str | os.PathLike[str], onnx: Any, model: Any, data: Any
) -> dict[str, Any]:
    """Record the model and data descriptions (the data as :func:`inq.data.data_record`
    records it, with the input preprocessing), check the graph, write it atomically; returns
    its sizes."""
    proto.metadata_props.extend(
        onnx.StringStringEntryProto(key=f"inq_{key}", value=json.dumps(value))
        for key, value in (("model", model), ("data", data_record(data)))
    )
    onnx.checker.check_model(proto, full_check=True)
    serialized = proto.SerializeToString()
    with atomic_path(path) as tmp:
        tmp.write_bytes(serialized)
    return {
        "opset": OPSET,
        "nodes": len(proto.graph.node),
        "initializers": len(proto.graph.initializer),
        "bytes": len(serialized),
    }


def _check_weights(proto: Any, packed: PackedFile, onnx: Any) -> None:
    initializers = {t.name: t for t in proto.graph.initializer}
    for key, layer in packed.layers.items():
        found = initializers.get(key)
        if found is None:
            raise ValueError(f"the ONNX export has no initializer {key!r}: the exporter folded it")
        array = onnx.numpy_helper.to_array(found)
        expected = layer.weight().numpy()
        if array.dtype != expected.dtype or not np.array_equal(
            array.view(np.uint8), expected.view(np.uint8)
        ):
            raise ValueError(f"the ONNX export changed the weight {key!r}")


def export_qdq(
    model: IntegerModel, path: str | os.PathLike[str], input_shape: tuple[int, ...]
) -> dict[str, Any]:
    """Write the Q/DQ ONNX graph of an integer model for inputs ``[batch, *input_shape]``;
    returns ``{"opset", "nodes", "initializers", "bytes", "int8_layers", "float_layers"}``
    (how many conv/linear layers have int8 weights, and how many keep float weights).

    Raises:
        ValueError: if the onnx extra is missing or an op has no ONNX form here.
    """
    onnx, _ = _modules()
    symmetric = model.info.get("symmetric") is True
    if symmetric:  # TensorRT's form; its module imports this one
        from inq.export_tensorrt import SymmetricQdqGraph, readers, trt_problems

        graph: _QdqGraph = SymmetricQdqGraph(onnx, readers(model))
    else:
        graph = _QdqGraph(onnx)
    for op in model.ops:
        graph.add(op, model.op_tensors(op.name))
    named = {"name": OUTPUT_NAME} if symmetric else {}  # TensorRT's form names every node
    graph.nodes.append(
        onnx.helper.make_node("Identity", [graph.real(model.ops[-1].name)], [OUTPUT_NAME], **named)
    )
    shape = ["batch", *input_shape]
    output = onnx.helper.make_tensor_value_info(OUTPUT_NAME, onnx.TensorProto.FLOAT, None)
    source = onnx.helper.make_tensor_value_info(INPUT_NAME, onnx.TensorProto.FLOAT, shape)
    proto = onnx.helper.make_model(
        onnx.helper.make_graph(graph.nodes, "inq_qdq", [source], [output], graph.initializers),
        opset_imports=[onnx.helper.make_opsetid("", OPSET)],
        producer_name="inq",
    )
    _output_shape(proto, onnx)
    if symmetric and (problems := trt_problems(proto)):
        raise ValueError(f"the TensorRT-form export breaks a TensorRT rule (a bug): {problems[0]}")
    stats = _save(proto, path, onnx, model.info.get("model", {}), model.info.get("data", {}))
    form = "tensorrt" if symmetric else "uint8"
    return {**stats, "int8_layers": graph.layers[0], "float_layers": graph.layers[1], "form": form}


@dataclass
class QdqWeight:
    """A conv/linear layer in Q/DQ form (float64 tensors, every value exact): the integer
    weights ``ints`` (``±2**k``), the ``bias`` in units of ``s_in * scale`` (an integer) and one
    weight ``scale`` per output channel."""

    ints: Tensor
    bias: Tensor
    scale: Tensor
    floored: bool = False  # the integer model floors some terms (offsets beyond its frac)

    @property
    def int8(self) -> bool:
        """Whether the layer runs as int8: every integer within ``±64`` (so that a uint8 input
        times two weights cannot saturate the int16 pair sums of CPUs without VNNI: 2 * 255 *
        64 < 2**15; the next power of two, 128, would), the bias within int32, and the integer
        model's accumulator exact (then its int32 bound holds here too)."""
        return (
            not self.floored
            and float(self.ints.abs().max()) <= 64
            and float(self.bias.abs().max()) <= INT32_MAX
        )


def qdq_weight(op: IntOp, tensors: dict[str, Tensor], in_scale: float) -> QdqWeight:
    """The Q/DQ form of a conv/linear op of the integer model: the same function, no weight
    changed.

    Row ``c`` of the op computes ``(acc + bias) * M`` (before rounding), ``acc`` summing
    ``x * ±2**(frac - offset)`` and ``M = multiplier * 2**-shift``. With ``top`` the row's
    largest offset (at least ``frac``), its Q/DQ weights are the integers
    ``sign(M) * ±2**(top - offset)``, its bias ``sign(M) * bias * 2**(top - frac)`` and its
    weight scale ``|M| * 2**(frac - top) * s_out / s_in``: the power-of-two exponent and the
    folded BatchNorm factor in one number, so that ``s_in * scale / s_out`` is ``|M|``, the
    requantization of a QLinearConv.

    Example:
        >>> from inq.codes import pack_codes
        >>> codes = pack_codes(torch.tensor([[8, 13, 0]], dtype=torch.uint8), 4)  # 1, -1/2, 0
        >>> tensors = {"codes": codes, "bias": torch.tensor([3], dtype=torch.int32),
        ...            "multiplier": torch.tensor([-3]), "shift": torch.tensor([4])}
        >>> op = IntOp("fc", "linear", ["x"], {"bits": 4, "frac": 1, "in_features": 3,
        ...            "out_features": 1, "scale": 0.5, "lo": -128, "hi": 127})
        >>> w = qdq_weight(op, tensors, in_scale=0.25)
        >>> w.ints.tolist(), w.bias.tolist(), w.scale.tolist(), w.int8
        ([[-2.0, 1.0, -0.0]], [-3.0], [0.375], True)
    """
    a = op.attrs
    shape = tuple(a["weight_shape"]) if op.op == "conv" else (a["out_features"], a["in_features"])
    bits, frac = a["bits"], a["frac"]
    codes = unpack_codes(tensors["codes"], bits, math.prod(shape[1:])).to(torch.int64)
    top = torch.where(codes != 0, codes & ((1 << (bits - 2)) - 1), 0).amax(dim=1).clamp(min=frac)
    sign = torch.where(tensors["multiplier"] < 0, -1.0, 1.0).double()
    ints = decode_weight(tensors["codes"], bits, top.to(torch.int32), shape, torch.float64)
    ints = ints * sign.reshape(-1, *[1] * (len(shape) - 1))
    bias = torch.ldexp(tensors["bias"].double() * sign, (top - frac).double())
    scale = torch.ldexp(
        tensors["multiplier"].abs().double() * (a["scale"] / in_scale),
        (frac - top - tensors["shift"].to(torch.int64)).double(),
    )
    return QdqWeight(ints, bias, scale, floored=bool((top > frac).any()))


class _QdqGraph:
    """Nodes and initializers of a Q/DQ graph, one integer op at a time.

    ``values`` maps each op to the ONNX tensor of its integers (uint8/int8 as the integer model
    stores them), or of its real values where the model keeps int32 (a last conv/linear)."""

    def __init__(self, onnx: Any) -> None:
        self.onnx, self.nodes, self.initializers = onnx, [], []
        self.values: dict[str, str] = {}
        self.ops: dict[str, IntOp] = {}
        self.layers = [0, 0]  # conv/linear layers with int8 weights, with float weights
        self.count = 0

    def name(self, stem: str) -> str:
        self.count += 1
        return f"{stem}_{self.count}"

    def const(self, stem: str, array: np.ndarray) -> str:
        name = self.name(stem)
        self.initializers.append(self.onnx.numpy_helper.from_array(array, name))
        return name

    def node(self, kind: str, inputs: list[str], stem: str, **attrs: Any) -> str:
        out = self.name(stem)
        self.nodes.append(self.onnx.helper.make_node(kind, inputs, [out], **attrs))
        return out

    def real(self, name: str) -> str:
        """A DequantizeLinear of value ``name`` (one per consumer, as runtimes expect)."""
        op = self.ops[name]
        if _is_real(op):
            return self.values[name]
        return self.node("DequantizeLinear", [self.values[name], *self.scale_zero(op)],
                         f"{name}_dq")  # fmt: skip

    def real_by_hand(self, name: str) -> str:
        """``(Cast(q) - zero) * scale``: what DequantizeLinear computes, but no Q/DQ node unit
        forms around its reader."""
        op = self.ops[name]
        x = self.node("Cast", [self.values[name]], f"{name}_float", to=self.onnx.TensorProto.FLOAT)
        if _zero_point(op):
            x = self.node("Sub", [x, self.const("zero", np.array(_zero_point(op), np.float32))],
                          f"{name}_centred")  # fmt: skip
        scale = self.const("scale", np.array(op.attrs["scale"], np.float32))
        return self.node("Mul", [x, scale], f"{name}_real")

    def scale_zero(self, op: IntOp) -> list[str]:
        """The scale and zero point of ``op``'s value."""
        return [self.const("scale", np.array(op.attrs["scale"], np.float32)),
                self.const("zero", np.array(_zero_point(op), np.uint8))]  # fmt: skip

    def quantize(self, y: str, op: IntOp) -> str:
        """QuantizeLinear with the op's scale, then a Clip of the integers where the op's range
        is narrower than uint8's (fewer bits, ReLU6)."""
        a, zero = op.attrs, _zero_point(op)
        q = self.node("QuantizeLinear", [y, *self.scale_zero(op)], f"{op.name}_q")
        if (a["lo"] + zero, a["hi"] + zero) == (0, 255):
            return q
        bounds = [self.const(key, np.array(a[key] + zero, np.uint8)) for key in ("lo", "hi")]
        return self.node("Clip", [q, *bounds], op.name)

    def clip_real(self, y: str, op: IntOp) -> str:
        """The real values of an int32 op (the last conv/linear), clipped where its range is
        narrower than int32 below a ReLU (a folded ReLU6: ``hi = 6 / scale``)."""
        a = op.attrs
        if a["hi"] == INT32_MAX and a["lo"] in (0, INT32_MIN):
            return y
        bounds = [
            self.const(key, np.array(a[key] * a["scale"], np.float32)) for key in ("lo", "hi")
        ]
        return self.node("Clip", [y, *bounds], op.name)

    def add(self, op: IntOp, tensors: dict[str, Tensor]) -> None:
        self.ops[op.name] = op
        a, kind = op.attrs, op.op
        ins = op.inputs
        if kind == "input":
            value = self.quantize(INPUT_NAME, op)
        elif kind in ("conv", "linear", "add"):
            y = self.weight_op(op, tensors) if kind != "add" else self.node(
                "Add", [self.real(i) for i in ins], op.name)  # fmt: skip
            y = self.activate(y, op)
            value = self.clip_real(y, op) if _is_real(op) else self.quantize(y, op)
        elif kind == "avgpool":
            x = self.real(ins[0])
            if a["kernel"] is None:
                pooled = self.node("GlobalAveragePool", [x], op.name)
            else:
                pooled = self.node("AveragePool", [x], op.name, kernel_shape=a["kernel"],
                                   strides=a["stride"])  # fmt: skip
            value = self.quantize(pooled, op)
        elif kind in ("relu", "clamp"):  # QuantizeLinear saturates at 0, a Clip at the bounds
            value = self.quantize(self.real(ins[0]), op)
        else:
            value = self.exact_op(op)
        self.values[op.name] = value

    def activate(self, y: str, op: IntOp) -> str:
        """A folded ReLU on the op's real output (redundant before a zero point of 0: runtimes
        fuse it away)."""
        return self.node("Relu", [y], op.name) if op.attrs["lo"] == 0 else y

    def exact_op(self, op: IntOp) -> str:
        """An op exact on the integers (max pooling, flatten, slicing, zero padding): on the
        integers, the runtime's integer kernels, no Q/DQ."""
        return self.integer_op(op, self.values[op.inputs[0]])

    def pad_value(self, op: IntOp) -> np.ndarray:
        """The integer that stands for 0 in the op's value (its zero point)."""
        return np.array(_zero_point(op), np.uint8)

    def integer_op(self, op: IntOp, x: str) -> str:
        a, kind = op.attrs, op.op
        if kind == "maxpool":
            k, st, pad, dil = (a[key] for key in ("kernel", "stride", "padding", "dilation"))
            return self.node("MaxPool", [x], op.name, kernel_shape=k, strides=st, pads=pad + pad,
                             dilations=dil, ceil_mode=int(a["ceil_mode"]))  # fmt: skip
        if kind == "flatten" and a["start_dim"] == 1 and a["end_dim"] == -1:
            return self.node("Flatten", [x], op.name, axis=1)
        if kind == "slice" and None not in a["index"]:
            axes = [i for i, s in enumerate(a["index"]) if s != [None, None, None]]
            big = np.iinfo(np.int64).max
            parts = [[a["index"][i][j] for i in axes] for j in range(3)]
            starts, ends, steps = ([d if v is None else v for v in vals] for d, vals in
                                   zip((0, big, 1), parts, strict=True))  # fmt: skip
            arrays = [np.array(v, np.int64) for v in (starts, ends, axes, steps)]
            names = [
                self.const(stem, arr)
                for stem, arr in zip(("starts", "ends", "axes", "steps"), arrays, strict=True)
            ]
            return self.node("Slice", [x, *names], op.name)
        if kind == "pad" and len(a["pad"]) % 2 == 0:
            pairs = [a["pad"][i : i + 2] for i in range(0, len(a["pad"]), 2)]  # last dim first
            pairs = [[0, 0]] * (4 - len(pairs)) + pairs[::-1]
            pads = np.array([p[0] for p in pairs] + [p[1] for p in pairs], np.int64)
            zero = self.const("pad_value", self.pad_value(op))
            return self.node("Pad", [x, self.const("pads", pads), zero], op.name, mode="constant")
        raise ValueError(f"op {op.name!r} ({kind}, {a}) has no ONNX form in the Q/DQ export")

    def weight_op(self, op: IntOp, tensors: dict[str, Tensor]) -> str:
        """``Conv``/``Gemm`` of the ``DequantizeLinear``'d input, int8 weights (one scale per
        output channel) and int32 bias (scale: input scale times weight scale). Where the
        layer does not run as int8 (:attr:`QdqWeight.int8`), the weights are float initializers
        of the same values, exact (an integer ``±2**k`` times a float32 scale), and the bias
        the int32 bias times its float32 scale, rounded to float32: runtimes run that layer as
        a float convolution."""
        in_scale = np.float32(self.ops[op.inputs[0]].attrs["scale"])
        w = self.qdq_weight(op, tensors, float(in_scale))
        int8 = self.runs_int8(w)
        self.layers[not int8] += 1
        bias_scale = in_scale * w.scale.float().numpy()  # float32, as a runtime computes it
        if int8:
            weight = self.int8_weight(op, w)
            bias = self.node("DequantizeLinear", [
                self.const("b", w.bias.to(torch.int32).numpy()),
                self.const("b_scale", bias_scale),
                self.const("b_zero", np.zeros(len(bias_scale), np.int32)),
            ], f"{op.name}_b", axis=0)  # fmt: skip
            x = self.real(op.inputs[0])
        else:
            # an input dequantized by hand keeps ONNX Runtime from re-quantizing the weights (per
            # tensor, to int8), as its WeightBiasQuantization rewrite would between DQ and Q
            weight, bias = self.float_weight(w, bias_scale)
            x = self.real_by_hand(op.inputs[0])
        return self.layer(op, x, weight, bias)

    def qdq_weight(self, op: IntOp, tensors: dict[str, Tensor], in_scale: float) -> QdqWeight:
        return qdq_weight(op, tensors, in_scale)

    def runs_int8(self, w: QdqWeight) -> bool:
        return w.int8

    def int8_weight(self, op: IntOp, w: QdqWeight) -> str:
        """The int8 weights (zero point 0) dequantized with one scale per output channel."""
        scale = w.scale.float().numpy()
        return self.node("DequantizeLinear", [
            self.const("w", w.ints.to(torch.int8).numpy()),
            self.const("w_scale", scale),
            self.const("w_zero", np.zeros(len(scale), np.int8)),
        ], f"{op.name}_w", axis=0)  # fmt: skip

    def float_weight(self, w: QdqWeight, bias_scale: np.ndarray) -> tuple[str, str]:
        """Float initializers of the same weights (exact) and of the bias times its scale."""
        view = (-1, *[1] * (w.ints.dim() - 1))
        weight = self.const("w", (w.ints.float() * w.scale.float().reshape(view)).numpy())
        return weight, self.float_bias(w, bias_scale)

    def float_bias(self, w: QdqWeight, bias_scale: np.ndarray) -> str:
        """The integer bias times its float32 scale, rounded to float32."""
        return self.const("b", (w.bias * torch.from_numpy(bias_scale).double()).float().numpy())

    def layer(self, op: IntOp, x: str, weight: str, bias: str | None) -> str:
        """The ``Gemm`` or ``Conv`` node (without a bias where ``bias`` is None)."""
        a, inputs = op.attrs, [x, weight] if bias is None else [x, weight, bias]
        if op.op == "linear":
            return self.node("Gemm", inputs, op.name, transB=1)
        return self.node("Conv", inputs, op.name, strides=a["stride"], pads=a["padding"] * 2,
                         dilations=a["dilation"], group=a["groups"])  # fmt: skip


def _output_shape(proto: Any, onnx: Any) -> None:
    """Declare the graph's output shape as ONNX's shape inference finds it, the batch named
    ``batch`` (as the float export has it: ``[batch, classes]`` for a classifier's logits).

    Raises:
        ValueError: the inference cannot tell the shape (an op of the graph it does not know).
    """
    inferred = onnx.shape_inference.infer_shapes(proto)
    dims = [d.dim_value or d.dim_param for d in
            inferred.graph.output[0].type.tensor_type.shape.dim]  # fmt: skip
    if not dims or dims[0] != "batch" or not all(isinstance(d, int) and d for d in dims[1:]):
        raise ValueError(f"the Q/DQ graph's output shape is {dims}, not [batch, sizes...]")
    value = proto.graph.output[0]
    value.CopyFrom(onnx.helper.make_tensor_value_info(value.name, onnx.TensorProto.FLOAT, dims))


def first_line(err: BaseException) -> str:
    """The first line of a library's error, or its type's name where it has no text."""
    return (str(err).strip().splitlines() or [type(err).__name__])[0]


def _zero_point(op: IntOp) -> int:
    """Every value is uint8 in the graph: the integer model's int8 values (signed ranges) with
    zero point 128, its uint8 ones with 0. (ONNX Runtime runs int8 activations as uint8 + 128
    on x86 anyway, but converts a value only where one DequantizeLinear reads it.)"""
    return 128 if op.attrs["lo"] < 0 else 0


def _is_real(op: IntOp) -> bool:
    """Whether the graph keeps the op's value real: an int32 value of the integer model (the
    last conv/linear), which the Q/DQ graph leaves unquantized."""
    return value_dtype(op.attrs["lo"], op.attrs["hi"]) == torch.int32


class OnnxModel(nn.Module):
    """An ONNX file run by ONNX Runtime on the CPU, as a module: float input, float logits.

    ``model`` and ``data`` are the descriptions the file records (``{}`` if it records none).
    ``proto``: the file's ``ModelProto`` where the caller has loaded it (:func:`load_onnx`).

    Raises:
        ValueError: if the file cannot be read or the onnx extra is missing.
    """

    def __init__(self, path: str | os.PathLike[str], proto: Any = None) -> None:
        super().__init__()
        _, ort = _modules()
        proto = load_onnx(path) if proto is None else proto
        try:
            self.session = ort.InferenceSession(
                proto.SerializeToString(), providers=["CPUExecutionProvider"]
            )
        except Exception as err:  # onnx and onnxruntime raise their own kinds
            raise ValueError(f"{path}: cannot load as ONNX ({err})") from None
        self.describe(proto, path)
        ends = (("input", self.session.get_inputs()), ("output", self.session.get_outputs()))
        self.signature = [  # (input/output, name, element type, dims: sizes or names)
            (role, v.name, v.type, v.shape) for role, values in ends for v in values
        ]
        graph_input = self.session.get_inputs()[0]
        self.input = graph_input.name
        self.input_shape = [d if isinstance(d, int) else None for d in graph_input.shape]

    def describe(self, proto: Any, path: str | os.PathLike[str]) -> None:
        """Read what the file says of itself: the recorded ``model`` and ``data``, its
        ``opset``, and how many ``nodes`` and ``initializers`` it has."""
        self.model, self.data = recorded_descriptions(proto, path)
        self.opset = next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")),
                          None)  # fmt: skip
        self.nodes, self.initializers = len(proto.graph.node), len(proto.graph.initializer)

    def forward(self, x: Tensor) -> Tensor:
        """Logits of ``x``.

        Raises:
            ValueError: if ``x`` does not fit the graph's input (a fixed dimension differs).
        """
        fixed = self.input_shape  # None where the graph takes any size (the batch)
        fits = len(fixed) == x.dim() and all(
            d in (None, n) for d, n in zip(fixed, x.shape, strict=True)
        )
        if not fits:
            wanted = [d if d is not None else "N" for d in fixed]
            raise ValueError(
                f"the ONNX model takes inputs of shape {wanted}, the data gives {list(x.shape)}"
            )
        out = self.session.run(None, {self.input: x.detach().cpu().float().numpy()})[0]
        return torch.from_numpy(out)


def recorded_descriptions(
    proto: Any, path: str | os.PathLike[str]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The model and data descriptions an inq export records in ``proto``'s ``metadata_props``
    (``inq_model``, ``inq_data``; empty where absent).

    Raises:
        ValueError: a description that is not JSON, naming ``path``.
    """
    props = {p.key: p.value for p in proto.metadata_props}
    try:
        return json.loads(props.get("inq_model", "{}")), json.loads(props.get("inq_data", "{}"))
    except ValueError as err:
        raise ValueError(f"{path}: its inq_model or inq_data is not JSON ({err})") from None


def load_onnx(path: str | os.PathLike[str]) -> Any:
    """The ``ModelProto`` of the ONNX file at ``path`` (external data not loaded).

    Raises:
        ValueError: if the file cannot be read as ONNX or the onnx extra is missing.
    """
    onnx, _ = _modules()
    try:
        return onnx.load(str(path), load_external_data=False)
    except Exception as err:  # onnx raises its own kinds
        raise ValueError(f"{path}: cannot load as ONNX ({err})") from None


def is_onnx(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` names an ONNX file (by its suffix)."""
    return Path(path).suffix == ".onnx"
