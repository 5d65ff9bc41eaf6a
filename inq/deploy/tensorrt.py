"""TensorRT's form of the Q/DQ export: the graph of an integer model with symmetric activations
(``inq calibrate --symmetric``, ``quant.symmetric=true``), and the check of TensorRT's rules.

TensorRT's explicit quantization takes int8 ``QuantizeLinear``/``DequantizeLinear`` with zero
point 0 only, weights per output channel, activations per tensor, and no other op on an int8
tensor. :func:`inq.deploy.onnx.export_qdq` writes this form for a symmetric model
(:class:`SymmetricQdqGraph`), in a layout that ONNX Runtime still fuses into integer kernels on
x86, where it runs int8 values as uint8 + 128 only where a ``QuantizeLinear`` has one reader:

- every op that makes a value ends in one ``QuantizeLinear`` (int8, zero point 0) and one
  ``DequantizeLinear``;
- a folded activation or a narrower range (ReLU, ReLU6, fewer bits) is a float ``Relu`` or
  ``Clip`` after that pair, then a ``QuantizeLinear`` at the same scale: exact, as the clamp
  commutes with rounding and the bounds are integers times a power-of-two scale;
- a value read by several ops gets one ``QuantizeLinear``/``DequantizeLinear`` per reader, from a
  float fan-out point (its activation, else a ``Clip`` to the float range);
- biases are float initializers (TensorRT has no int32 ``DequantizeLinear``; ONNX Runtime turns
  them back into the same int32 where they are within :data:`EXACT_FLOAT_BIAS`, and a layer with
  a larger bias keeps float weights), the last linear is a ``Gemm`` without bias and an ``Add``;
- max pooling, flatten, slicing and zero padding act on the dequantized values, then the same
  scale again;
- a layer whose weights cannot be int8 (:attr:`inq.deploy.qdq.QdqWeight.int8`) reads its
  input through a ``Clip`` to the float range, so that no runtime re-quantizes its float weights.

:func:`trt_problems` checks a file against TensorRT's ONNX parser rules; the export runs it on
what it writes. The rules come from TensorRT's documentation, cited by key:

- [ops]: onnx-tensorrt ``docs/operators.md`` (TensorRT 10):
  https://github.com/onnx/onnx-tensorrt/blob/main/docs/operators.md
- [qdq]: the parser's ``QuantizeLinear``/``DequantizeLinear`` importer (zero points all zero,
  scales positive, per-axis scales for weights only) and
  https://docs.nvidia.com/deeplearning/tensorrt/latest/inference-library/quantized-types-explicit-quantization.html

No TensorRT is installed where inq is tested: the check proves the documented restrictions hold,
not that TensorRT fuses every op. A user builds an engine with
``trtexec --onnx=model.qdq.onnx --stronglyTyped`` (TensorRT 10: the file is opset 18, which
TensorRT 8.6's parser, up to opset 17, does not take).

Example (shell)::

    inq calibrate outputs/run --symmetric -o model.int.safetensors
    inq export model.int.safetensors --onnx -o model.qdq.onnx    # TensorRT form, checked
    trtexec --onnx=model.qdq.onnx --stronglyTyped --saveEngine=model.plan
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np
import torch

from inq.deploy.qdq import QdqGraph, QdqWeight, is_real
from inq.quant.integer import IntegerModel, IntOp

__all__ = ["TRT_OPS", "SymmetricQdqGraph", "readers", "trt_problems"]

FLOAT_MAX = float(np.finfo(np.float32).max)
# ONNX Runtime re-derives an int32 bias from its float32 value times input and weight scale:
# exact where |bias| <= 2**21 (the two float32 roundings then move it by less than 1/2)
EXACT_FLOAT_BIAS = 1 << 21

OPSETS = (9, 20)  # the ONNX opsets TensorRT 10.0's parser takes [ops]
_FLOATS = frozenset({1, 10, 16})  # TensorProto FLOAT, FLOAT16, BFLOAT16: scale types [qdq]
# The ops of the form [ops] lists for TensorRT 10 (float types; int8 only through Q/DQ).
TRT_OPS = frozenset({
    "QuantizeLinear", "DequantizeLinear", "Conv", "Gemm", "MatMul", "Add", "Relu", "Clip",
    "MaxPool", "AveragePool", "GlobalAveragePool", "Flatten", "Reshape", "Slice", "Pad",
    "Identity",
})  # fmt: skip


def readers(model: IntegerModel) -> Counter[str]:
    """How many ops read each value of ``model`` (the graph output counts as one)."""
    counts = Counter(name for op in model.ops for name in op.inputs)
    counts[model.ops[-1].name] += 1
    return counts


class SymmetricQdqGraph(QdqGraph):
    """The Q/DQ graph of a symmetric integer model in TensorRT's form (see the module
    docstring); ``counts`` is :func:`readers` of the model. Every node is named after its
    output, so a rule problem can name it."""

    named_nodes = True

    def __init__(self, onnx: Any, counts: Counter[str]) -> None:
        super().__init__(onnx)
        self.counts = counts
        self.requantized: set[str] = set()  # values each reader quantizes again

    def scale_zero(self, op: IntOp) -> list[str]:
        return [self.const("scale", np.array(op.attrs["scale"], np.float32)),
                self.const("zero", np.array(0, np.int8))]  # fmt: skip

    def pair(self, y: str, op: IntOp) -> str:
        """``DequantizeLinear(QuantizeLinear(y))`` at the op's scale."""
        q = self.node("QuantizeLinear", [y, *self.scale_zero(op)], f"{op.name}_q")
        return self.node("DequantizeLinear", [q, *self.scale_zero(op)], f"{op.name}_dq")

    def quantize(self, y: str, op: IntOp) -> str:
        """The op's Q/DQ pair, then its range's clamp (a fan-out point every reader quantizes
        again), a ``Clip`` to the float range where several ops read it, or nothing."""
        value, (lo, hi), scale = (
            self.pair(y, op),
            (op.attrs["lo"], op.attrs["hi"]),
            op.attrs["scale"],
        )
        if (lo, hi) == (0, 127):
            value = self.node("Relu", [value], op.name)
        elif (lo, hi) != (-128, 127):
            value = self.clip(value, lo * scale, hi * scale, op.name)
        elif self.counts[op.name] > 1:
            value = self.clip(value, -FLOAT_MAX, FLOAT_MAX, op.name)
        else:
            return value
        self.requantized.add(op.name)
        return value

    def clip(self, x: str, low: float, high: float, stem: str) -> str:
        bounds = [
            self.const(key, np.array(v, np.float32)) for key, v in (("lo", low), ("hi", high))
        ]
        return self.node("Clip", [x, *bounds], stem)

    def real(self, name: str) -> str:
        """The real values of ``name`` for one reader: its own Q/DQ pair where the value is a
        fan-out point."""
        if name not in self.requantized:
            return self.values[name]
        return self.pair(self.values[name], self.ops[name])

    def real_by_hand(self, name: str) -> str:
        """A float layer's input: a ``Clip`` to the float range between it and its
        ``DequantizeLinear``, so that ONNX Runtime does not re-quantize the weights."""
        return self.clip(self.real(name), -FLOAT_MAX, FLOAT_MAX, f"{name}_guard")

    def activate(self, y: str, op: IntOp) -> str:
        """Only the int32 last op's ReLU comes before its output; the others' follow the Q/DQ
        pair (:meth:`quantize`)."""
        return super().activate(y, op) if is_real(op) else y

    def exact_op(self, op: IntOp) -> str:
        return self.quantize(self.integer_op(op, self.real(op.inputs[0])), op)

    def pad_value(self, op: IntOp) -> np.ndarray:
        return np.array(0.0, np.float32)

    def qdq_weight(self, op: IntOp, tensors: dict[str, torch.Tensor], in_scale: float) -> QdqWeight:
        """As the base's, a channel with scale 0 (a BatchNorm scale of 0: its output is 0)
        given scale 1, weights 0 and bias 0, as TensorRT takes positive scales only."""
        w = super().qdq_weight(op, tensors, in_scale)
        dead = w.scale == 0
        if bool(dead.any()):
            view = (-1, *[1] * (w.ints.dim() - 1))
            w.ints = torch.where(dead.reshape(view), 0.0, w.ints)
            w.bias, w.scale = torch.where(dead, 0.0, w.bias), torch.where(dead, 1.0, w.scale)
        return w

    def runs_int8(self, op: IntOp, w: QdqWeight) -> bool:
        """As the base's; a layer whose float bias ONNX Runtime re-quantizes (one that ends in a
        ``QuantizeLinear``) also needs it exact in float32 (:data:`EXACT_FLOAT_BIAS`)."""
        return w.int8 and (is_real(op) or float(w.bias.abs().max()) <= EXACT_FLOAT_BIAS)

    def int8_bias(self, op: IntOp, w: QdqWeight, bias_scale: np.ndarray) -> str:
        """A float bias: TensorRT has no int32 ``DequantizeLinear``; ONNX Runtime turns it back
        into the same int32 (:data:`EXACT_FLOAT_BIAS`)."""
        return self.float_bias(w, bias_scale)

    def int8_layer(self, op: IntOp, x: str, weight: str, bias: str) -> str:
        """The last linear (int32 logits) is a ``Gemm`` without bias, then an ``Add``: ONNX
        Runtime then runs it as an integer ``QGemm`` with float output."""
        if op.op == "linear" and is_real(op):
            return self.node("Add", [self.layer(op, x, weight, None), bias], f"{op.name}_bias")
        return self.layer(op, x, weight, bias)


def trt_problems(proto: Any) -> list[tuple[str, str]]:
    """Where ``proto`` breaks a rule of TensorRT's ONNX parser for explicitly quantized
    networks, as ``(node, rule)`` pairs (a node by its name, else its first output); empty if
    none.

    Example:
        >>> import onnx
        >>> from onnx import helper, TensorProto
        >>> zero = helper.make_tensor("zero", TensorProto.UINT8, [], [128])
        >>> scale = helper.make_tensor("scale", TensorProto.FLOAT, [], [0.5])
        >>> q = helper.make_node("QuantizeLinear", ["x", "scale", "zero"], ["q"], name="q")
        >>> graph = helper.make_graph([q], "g", [helper.make_tensor_value_info(
        ...     "x", TensorProto.FLOAT, [1])], [], [zero, scale])
        >>> trt_problems(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]))[0]
        ('q', 'zero point: uint8, not int8 (TensorRT takes int8 Q/DQ only [qdq])')
    """
    from onnx import TensorProto, numpy_helper

    graph = proto.graph
    consts = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    types = {t.name: t.data_type for t in graph.initializer}
    produced_by = {out: node for node in graph.node for out in node.output}
    read_by: dict[str, list[Any]] = {}
    for node in graph.node:
        for name in node.input:
            read_by.setdefault(name, []).append(node)
    problems: list[tuple[str, str]] = []

    def dtype(name: str) -> int | None:
        """The element type of a constant, or of a Q/DQ output (what the graph makes)."""
        if name in types:
            return types[name]
        node = produced_by.get(name)
        if node is not None and node.op_type == "QuantizeLinear" and len(node.input) > 2:
            return dtype(node.input[2])
        return TensorProto.FLOAT if node is not None else None

    opset = next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), None)
    if opset is None or not OPSETS[0] <= opset <= OPSETS[1]:
        problems.append(("model", f"opset {opset}: TensorRT 10.0's parser takes opsets "
                                  f"{OPSETS[0]}-{OPSETS[1]} [ops]"))  # fmt: skip
    for value in (*graph.input, *graph.output):
        if value.type.tensor_type.elem_type != TensorProto.FLOAT:
            problems.append((value.name, "graph input/output: not float [ops]"))
    for node in graph.node:
        where = node.name or node.output[0]
        for rule in _node_problems(node, consts, dtype, read_by):
            problems.append((where, rule))
    return problems


def _node_problems(
    node: Any, consts: dict[str, np.ndarray], dtype: Any, read_by: dict[str, list[Any]]
) -> list[str]:
    from onnx import TensorProto

    kind, found = node.op_type, []
    if node.domain not in ("", "ai.onnx"):
        return [f"op {node.domain}::{kind}: not in TensorRT's ONNX parser (contrib domain) [ops]"]
    if kind not in TRT_OPS:
        return [f"op {kind}: not an op TensorRT's ONNX parser takes [ops]"]
    if kind in ("QuantizeLinear", "DequantizeLinear"):
        found += _qdq_problems(node, consts, dtype, read_by)
    else:
        for name in node.input[:1] if kind in ("Clip", "Pad", "Slice") else node.input:
            if name and dtype(name) == TensorProto.INT8:
                found.append(f"{kind} reads the int8 tensor {name!r}: TensorRT's ops take int8 "
                             "only through DequantizeLinear [ops]")  # fmt: skip
    if kind in ("Conv", "Gemm") and len(node.input) > 2 and node.input[2]:
        bias = node.input[2]
        if bias not in consts or dtype(bias) != TensorProto.FLOAT:
            found.append(f"bias {bias!r}: not a float initializer (DequantizeLinear takes "
                         "INT8/FP8/INT4, no int32 bias) [ops]")  # fmt: skip
    if kind in ("MaxPool", "AveragePool"):
        attrs = {a.name: list(a.ints) for a in node.attribute}
        if any(d != 1 for d in attrs.get("dilations", [])):
            found.append(f"{kind}: dilations must be empty or all ones [ops]")
        if len(attrs.get("kernel_shape", [])) not in (2, 3) or len(node.output) > 1:
            found.append(f"{kind}: 2-D or 3-D kernels, no indices output [ops]")
    if kind in ("Pad", "Slice") and len(node.input) > 3 and node.input[3] not in ("", *consts):
        found.append(f"{kind}: axes must be an initializer [ops]")
    return found


def _qdq_problems(
    node: Any, consts: dict[str, np.ndarray], dtype: Any, read_by: dict[str, list[Any]]
) -> list[str]:
    from onnx import TensorProto

    found, kind = [], node.op_type
    if len(node.input) < 3 or not node.input[2]:
        return [f"{kind} without a zero point: ONNX's default is uint8; TensorRT takes int8 [qdq]"]
    scale_name, zero_name = node.input[1], node.input[2]
    if dtype(zero_name) != TensorProto.INT8:
        name = TensorProto.DataType.Name(dtype(zero_name) or 0).lower()
        found.append(f"zero point: {name}, not int8 (TensorRT takes int8 Q/DQ only [qdq])")
    elif zero_name not in consts or np.any(consts[zero_name] != 0):
        found.append("zero point: not all zero (TensorRT takes symmetric quantization only [qdq])")
    scale = consts.get(scale_name)
    if scale is None or dtype(scale_name) not in _FLOATS:
        found.append("scale: not a float32/float16/bfloat16 initializer [qdq]")
    elif not (np.all(np.isfinite(scale)) and np.all(scale > 0)):
        found.append("scale: must be finite and > 0 [qdq]")
    elif scale.size > 1 and not _weight_axis(node, consts, read_by):
        found.append("scale: per-axis, but not of a weight on its output-channel axis "
                     "(activations are per tensor) [qdq]")  # fmt: skip
    if kind == "DequantizeLinear" and dtype(node.input[0]) != TensorProto.INT8:
        name = TensorProto.DataType.Name(dtype(node.input[0]) or 0).lower()
        found.append(f"data: {name}, not int8 (DequantizeLinear takes INT8/FP8/INT4) [ops]")
    if kind == "QuantizeLinear":
        users = read_by.get(node.output[0], [])
        if not users or any(u.op_type != "DequantizeLinear" for u in users):
            readers = [u.op_type for u in users]
            found.append(f"output read by {readers}: an int8 tensor goes only to "
                         "DequantizeLinear (no op takes int8 otherwise) [ops]")  # fmt: skip
    return found


def _weight_axis(node: Any, consts: dict[str, np.ndarray], read_by: dict[str, list[Any]]) -> bool:
    """Whether a per-axis DequantizeLinear dequantizes a constant weight (rank >= 2) on the
    output-channel axis of the Conv/Gemm that reads it (Conv: 0; Gemm: 0 with transB, else 1)."""
    weight = consts.get(node.input[0])
    if node.op_type != "DequantizeLinear" or weight is None or weight.ndim < 2:
        return False
    axis = next((a.i for a in node.attribute if a.name == "axis"), 1)
    for user in read_by.get(node.output[0], []):
        if user.op_type not in ("Conv", "Gemm") or list(user.input[1:2]) != [node.output[0]]:
            return False
        trans_b = next((a.i for a in user.attribute if a.name == "transB"), 0)
        wanted = 0 if user.op_type == "Conv" or trans_b else 1
        if axis % weight.ndim != wanted or weight.shape[wanted] != consts[node.input[1]].size:
            return False
    return bool(read_by.get(node.output[0]))
