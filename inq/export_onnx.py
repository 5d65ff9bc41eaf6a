"""ONNX export of an INQ model, and its evaluation in ONNX Runtime (the ``onnx`` extra).

:func:`export_onnx` writes the float-activation network of a packed model: the graph that
``torch.onnx.export`` (the ``torch.export``-based exporter, opset :data:`OPSET`) makes of the
model rebuilt from the file, with the input's batch dimension dynamic (``batch``) and the
power-of-two weights as initializers named by their state-dict keys. The export is checked
before it is written: ``onnx.checker`` passes, and every quantized weight is an initializer
equal to its decoded codes bit for bit (an exporter that folded BatchNorm into a weight would
be refused). The file records the model and data descriptions in its ``metadata_props``, so
``inq eval model.onnx`` evaluates it on the run's data.

:func:`export_qdq` writes an integer model (:mod:`inq.quant.integer`) as a Q/DQ graph: every
value quantized by ``QuantizeLinear``/``DequantizeLinear`` with its scale (zero point 0; uint8
or int8 as the integer model stores it, clipped to its range first, so 2-8 bits and folded
ReLUs are kept), float Conv/Gemm between them, the folded BatchNorm as the per-channel factor
and offset the integer requantization applies, ``(acc + bias) * m * 2**-r`` in real units. The
weights are int8 initializers behind a ``DequantizeLinear`` with a power-of-two scale (one per
output channel) where the level set fits int8, up to 4 bits (5 bits would need +128), and exact
float initializers otherwise. It computes the integer model's function in float, rounding half
to even where the integer model rounds half up.

Example (shell)::

    inq export outputs/run --onnx -o model.onnx
    inq export model.int.safetensors --onnx -o model.qdq.onnx
    inq eval model.onnx
"""

from __future__ import annotations

import contextlib
import io
import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from inq.codes import decode_weight
from inq.io import atomic_path
from inq.models import build_model
from inq.packed import PackedFile
from inq.quant.integer import IntegerModel

__all__ = ["OPSET", "OnnxModel", "export_onnx", "export_qdq", "is_onnx"]

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
            first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            raise ValueError(f"ONNX cannot express the model: {first}") from None
    proto = program.model_proto
    _check_weights(proto, packed, onnx)
    return _save(proto, path, onnx, packed.model, packed.data)


def _save(
    proto: Any, path: str | os.PathLike[str], onnx: Any, model: Any, data: Any
) -> dict[str, Any]:
    """Record the model and data descriptions, check the graph, write it atomically; returns
    its sizes."""
    proto.metadata_props.extend(
        onnx.StringStringEntryProto(key=f"inq_{key}", value=json.dumps(value))
        for key, value in (("model", model), ("data", data))
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
    returns ``{"opset", "nodes", "initializers", "bytes"}``.

    Raises:
        ValueError: if the onnx extra is missing or an op has no ONNX form here.
    """
    onnx, _ = _modules()
    graph = _QdqGraph(onnx)
    values: dict[str, str] = {}
    scales = {op.name: float(op.attrs["scale"]) for op in model.ops}
    for op in model.ops:
        ins = [values[i] for i in op.inputs] or [INPUT_NAME]
        in_scale = scales[op.inputs[0]] if op.inputs else 1.0
        own = model.op_tensors(op.name)
        values[op.name] = graph.op(op, ins, own, op is model.ops[-1], in_scale)
    output = onnx.helper.make_tensor_value_info(
        OUTPUT_NAME, onnx.TensorProto.FLOAT, ["batch", "classes"]
    )
    graph.nodes.append(
        onnx.helper.make_node("Identity", [values[model.ops[-1].name]], [OUTPUT_NAME])
    )
    shape = ["batch", *input_shape]
    source = onnx.helper.make_tensor_value_info(INPUT_NAME, onnx.TensorProto.FLOAT, shape)
    proto = onnx.helper.make_model(
        onnx.helper.make_graph(graph.nodes, "inq_qdq", [source], [output], graph.initializers),
        opset_imports=[onnx.helper.make_opsetid("", OPSET)],
        producer_name="inq",
    )
    return _save(proto, path, onnx, model.info.get("model", {}), model.info.get("data", {}))


class _QdqGraph:
    """Nodes and initializers of a Q/DQ graph, one integer op at a time (float tensors)."""

    def __init__(self, onnx: Any) -> None:
        self.onnx, self.nodes, self.initializers = onnx, [], []
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

    def qdq(self, x: str, op: Any) -> str:
        """Clip to the op's integer range, quantize with its scale, dequantize."""
        a = op.attrs
        scale = np.float32(a["scale"])
        low, high = (np.array(v * scale, np.float32) for v in (a["lo"], a["hi"]))
        clipped = self.node("Clip", [x, self.const("lo", low), self.const("hi", high)], op.name)
        zero = np.array(0, np.uint8 if a["lo"] >= 0 else np.int8)
        args = [self.const("scale", np.array(scale, np.float32)), self.const("zero", zero)]
        q = self.node("QuantizeLinear", [clipped, *args], f"{op.name}_q")
        return self.node("DequantizeLinear", [q, *args], f"{op.name}_dq")

    def op(self, op: Any, ins: list[str], t: dict[str, Tensor], last: bool, in_scale: float) -> str:
        a, kind = op.attrs, op.op
        if kind == "input":
            return self.qdq(ins[0], op)
        if kind in ("conv", "linear"):
            y = self.weight_op(op, ins[0], t, in_scale)
            if last:
                return self.node("Relu", [y], op.name) if a["lo"] == 0 else y
            return self.qdq(y, op)
        if kind == "add":
            return self.qdq(self.node("Add", ins, op.name), op)
        if kind == "avgpool":
            if a["kernel"] is None:
                pooled = self.node("GlobalAveragePool", ins, op.name)
            else:
                pooled = self.node("AveragePool", ins, op.name, kernel_shape=a["kernel"],
                                   strides=a["stride"])  # fmt: skip
            return self.qdq(pooled, op)
        if kind == "maxpool":
            k, st, pad, dil = (a[key] for key in ("kernel", "stride", "padding", "dilation"))
            return self.node("MaxPool", ins, op.name, kernel_shape=k, strides=st, pads=pad + pad,
                             dilations=dil, ceil_mode=int(a["ceil_mode"]))  # fmt: skip
        if kind == "relu":
            return self.node("Relu", ins, op.name)
        if kind == "flatten" and a["start_dim"] == 1 and a["end_dim"] == -1:
            return self.node("Flatten", ins, op.name, axis=1)
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
            return self.node("Slice", [ins[0], *names], op.name)
        if kind == "pad" and len(a["pad"]) % 2 == 0:
            pairs = [a["pad"][i : i + 2] for i in range(0, len(a["pad"]), 2)]  # last dim first
            pairs = [[0, 0]] * (4 - len(pairs)) + pairs[::-1]
            pads = np.array([p[0] for p in pairs] + [p[1] for p in pairs], np.int64)
            return self.node("Pad", [ins[0], self.const("pads", pads)], op.name, mode="constant")
        raise ValueError(f"op {op.name!r} ({kind}, {a}) has no ONNX form in the Q/DQ export")

    def weight_op(self, op: Any, x: str, t: dict[str, Tensor], in_scale: float) -> str:
        """Conv/Gemm on dequantized inputs, then the requantization's factor and offset."""
        a = op.attrs
        rows = a["weight_shape"][0] if op.op == "conv" else a["out_features"]
        shape = tuple(a["weight_shape"]) if op.op == "conv" else (rows, a["in_features"])
        exponents = torch.as_tensor(a["n1"], dtype=torch.int64).expand(rows)
        weight = decode_weight(t["codes"], a["bits"], exponents.to(torch.int32), shape,
                               torch.float32)  # fmt: skip
        top = (1 << (a["bits"] - 2)) - 1  # the largest offset: integers up to 2**top
        if top <= 3:  # int8 codes behind a power-of-two scale per output channel
            scale = torch.ldexp(torch.ones(rows), (exponents - top).float())
            ints = (weight / scale.reshape(-1, *[1] * (len(shape) - 1))).round().to(torch.int8)
            parts = [
                self.const("w", ints.numpy()),
                self.const("w_scale", scale.numpy()),
                self.const("w_zero", np.zeros(rows, np.int8)),
            ]
            w = self.node("DequantizeLinear", parts, f"{op.name}_w", axis=0)
        else:
            w = self.const("w", weight.numpy())
        if op.op == "conv":
            y = self.node("Conv", [x, w], op.name, strides=a["stride"], pads=a["padding"] * 2,
                          dilations=a["dilation"], group=a["groups"])  # fmt: skip
        else:
            y = self.node("Gemm", [x, w], op.name, transB=1)
        acc_scale = torch.ldexp(torch.full((rows,), in_scale, dtype=torch.float64),
                                (exponents - a["frac"]).double())  # fmt: skip
        factor = t["multiplier"].double() * torch.ldexp(
            torch.ones(rows, dtype=torch.float64), -t["shift"].double()
        )
        gain = factor * a["scale"] / acc_scale  # real output per real conv output
        offset = t["bias"].double() * factor * a["scale"]
        view = (1, rows, 1, 1) if op.op == "conv" else (1, rows)
        y = self.node("Mul", [y, self.const("gain", gain.float().reshape(view).numpy())], op.name)
        return self.node(
            "Add", [y, self.const("offset", offset.float().reshape(view).numpy())], op.name
        )


class OnnxModel(nn.Module):
    """An ONNX file run by ONNX Runtime on the CPU, as a module: float input, float logits.

    ``model`` and ``data`` are the descriptions the file records (``{}`` if it records none).

    Raises:
        ValueError: if the file cannot be read or the onnx extra is missing.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        super().__init__()
        onnx, ort = _modules()
        try:
            proto = onnx.load(str(path), load_external_data=False)
            self.session = ort.InferenceSession(
                proto.SerializeToString(), providers=["CPUExecutionProvider"]
            )
        except Exception as err:  # onnx and onnxruntime raise their own kinds
            raise ValueError(f"{path}: cannot load as ONNX ({err})") from None
        props = {p.key: p.value for p in proto.metadata_props}
        self.model: dict[str, Any] = json.loads(props.get("inq_model", "{}"))
        self.data: dict[str, Any] = json.loads(props.get("inq_data", "{}"))
        graph_input = self.session.get_inputs()[0]
        self.input = graph_input.name
        self.input_shape = [d if isinstance(d, int) else None for d in graph_input.shape]

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


def is_onnx(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` names an ONNX file (by its suffix)."""
    return Path(path).suffix == ".onnx"
