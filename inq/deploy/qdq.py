"""The Q/DQ graph of an integer model, op by op: the node units ONNX Runtime fuses into its
integer kernels, in the uint8 form (:func:`inq.deploy.onnx.export_qdq` writes it and describes
it; :mod:`inq.deploy.tensorrt` derives TensorRT's form from it). :func:`qdq_weight` gives a
conv/linear op's weights, bias and per-channel scale in that form, exactly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from inq.codes import decode_weight, unpack_codes
from inq.quant.integer import INT32_MAX, INT32_MIN, IntOp, value_dtype

__all__ = [
    "INPUT_NAME",
    "OUTPUT_NAME",
    "QdqGraph",
    "QdqWeight",
    "is_real",
    "qdq_weight",
    "zero_point",
]

INPUT_NAME, OUTPUT_NAME = "input", "logits"


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


class QdqGraph:
    """Nodes and initializers of a Q/DQ graph, one integer op at a time.

    ``values`` maps each op to the ONNX tensor of its integers (uint8/int8 as the integer model
    stores them), or of its real values where the model keeps int32 (a last conv/linear)."""

    named_nodes = False  # name each node after its output (the uint8 form's nodes have no name)

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
        named = {"name": out} if self.named_nodes else {}
        self.nodes.append(self.onnx.helper.make_node(kind, inputs, [out], **named, **attrs))
        return out

    def real(self, name: str) -> str:
        """A DequantizeLinear of value ``name`` (one per consumer, as runtimes expect)."""
        op = self.ops[name]
        if is_real(op):
            return self.values[name]
        return self.node("DequantizeLinear", [self.values[name], *self.scale_zero(op)],
                         f"{name}_dq")  # fmt: skip

    def real_by_hand(self, name: str) -> str:
        """``(Cast(q) - zero) * scale``: what DequantizeLinear computes, but no Q/DQ node unit
        forms around its reader."""
        op = self.ops[name]
        x = self.node("Cast", [self.values[name]], f"{name}_float", to=self.onnx.TensorProto.FLOAT)
        if zero_point(op):
            x = self.node("Sub", [x, self.const("zero", np.array(zero_point(op), np.float32))],
                          f"{name}_centred")  # fmt: skip
        scale = self.const("scale", np.array(op.attrs["scale"], np.float32))
        return self.node("Mul", [x, scale], f"{name}_real")

    def scale_zero(self, op: IntOp) -> list[str]:
        """The scale and zero point of ``op``'s value."""
        return [self.const("scale", np.array(op.attrs["scale"], np.float32)),
                self.const("zero", np.array(zero_point(op), np.uint8))]  # fmt: skip

    def quantize(self, y: str, op: IntOp) -> str:
        """QuantizeLinear with the op's scale, then a Clip of the integers where the op's range
        is narrower than uint8's (fewer bits, ReLU6)."""
        a, zero = op.attrs, zero_point(op)
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
            value = self.clip_real(y, op) if is_real(op) else self.quantize(y, op)
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
        return np.array(zero_point(op), np.uint8)

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
        output channel) and bias (:meth:`int8_bias`: int32 at input scale times weight scale;
        float in TensorRT's form). Where the
        layer does not run as int8 (:attr:`QdqWeight.int8`), the weights are float initializers
        of the same values, exact (an integer ``±2**k`` times a float32 scale), and the bias
        the int32 bias times its float32 scale, rounded to float32: runtimes run that layer as
        a float convolution."""
        in_scale = np.float32(self.ops[op.inputs[0]].attrs["scale"])
        w = self.qdq_weight(op, tensors, float(in_scale))
        int8 = self.runs_int8(op, w)
        self.layers[not int8] += 1
        bias_scale = in_scale * w.scale.float().numpy()  # float32, as a runtime computes it
        if not int8:
            # an input dequantized by hand keeps ONNX Runtime from re-quantizing the weights (per
            # tensor, to int8), as its WeightBiasQuantization rewrite would between DQ and Q
            weight, bias = self.float_weight(w, bias_scale)
            return self.layer(op, self.real_by_hand(op.inputs[0]), weight, bias)
        weight = self.int8_weight(op, w)
        bias = self.int8_bias(op, w, bias_scale)
        return self.int8_layer(op, self.real(op.inputs[0]), weight, bias)

    def qdq_weight(self, op: IntOp, tensors: dict[str, Tensor], in_scale: float) -> QdqWeight:
        return qdq_weight(op, tensors, in_scale)

    def runs_int8(self, op: IntOp, w: QdqWeight) -> bool:
        return w.int8

    def int8_bias(self, op: IntOp, w: QdqWeight, bias_scale: np.ndarray) -> str:
        """The int32 bias, dequantized at input scale times weight scale."""
        return self.node("DequantizeLinear", [
            self.const("b", w.bias.to(torch.int32).numpy()),
            self.const("b_scale", bias_scale),
            self.const("b_zero", np.zeros(len(bias_scale), np.int32)),
        ], f"{op.name}_b", axis=0)  # fmt: skip

    def int8_layer(self, op: IntOp, x: str, weight: str, bias: str) -> str:
        return self.layer(op, x, weight, bias)

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


def zero_point(op: IntOp) -> int:
    """Every value is uint8 in the graph: the integer model's int8 values (signed ranges) with
    zero point 128, its uint8 ones with 0. (ONNX Runtime runs int8 activations as uint8 + 128
    on x86 anyway, but converts a value only where one DequantizeLinear reads it.)"""
    return 128 if op.attrs["lo"] < 0 else 0


def is_real(op: IntOp) -> bool:
    """Whether the graph keeps the op's value real: an int32 value of the integer model (the
    last conv/linear), which the Q/DQ graph leaves unquantized."""
    return value_dtype(op.attrs["lo"], op.attrs["hi"]) == torch.int32
