"""QONNX export of an integer model: the graph the FPGA tools read (FINN, hls4ml), computing
what the integer model computes, bit for bit, in ``qonnx``'s own executor.

Every value of the integer model is a real tensor ``q * scale`` behind a QONNX ``Quant`` node of
its width (``bitwidth`` = the activation bits, ``signed`` from its range, ``narrow`` 0), so a
tool reads each activation's fixed-point type from the graph. The arithmetic between them:

- ``input``: ``Floor(x / scale + 1/2)`` in float64, clipped to ``[lo, hi]``, as the integer
  model quantizes its input;
- ``conv``/``linear``: the power-of-two weights as float32 initializers ``w * 2**-frac`` behind a
  ``Quant`` node (``scale = 2**-frac``: each weight an integer of the layer's width there), a
  float32 ``Conv``/``Gemm`` (exact: its accumulator bound is checked below ``2**24``, the
  integers float32 holds), then the integer requantization in int64 ops,
  ``(acc + bias) * multiplier + 2**(shift-1)`` floor-divided by ``2**shift`` (``Div`` of a
  dividend made non-negative by an offset, so its truncation is a floor), clipped to
  ``[lo, hi]``: the integer model's arithmetic, not a float approximation of it. Where one
  ``Conv`` cannot be exact the weights go in exponent bands summed in int64: the integer
  weights in as few bands of consecutive exponents as keep each band's bound below ``2**24``
  (wide 8-bit layers), and the terms the integer model floors one by one (a level set reaching
  below the layer's ``frac``, capped by its int32 accumulator), ``floor(±x / 2**d)`` per
  ``d``, as ``Floor`` of the input times ``±2**-d`` (exact) convolved with that band's 0/1 taps;
- ``add``, ``avgpool``: the same int64 requantization of ``x * m_x + y * m_y`` or of the window
  sum;
- ``relu``, ``clamp``, ``maxpool``, ``flatten``, ``pad``: the ONNX op on the real values (exact).

The file records, in its ``metadata_props``, the model and data descriptions (``inq_model``,
``inq_data``, as the plain ONNX export does: ``inq eval`` evaluates it on that data) and each
conv/linear layer's level set under ``inq_levels/<Conv or Gemm node>``: ``{"op", "bits",
"n1", "frac"}`` (``n1`` an int, or one per output channel; a layer in bands has one entry
per band, ``frac`` the band's grid, and a floored band ``"floor": d`` and ``"sign"``). Its
weights are stored as ``w * 2**-n1`` (each channel's ``2**n1`` is in its requantization
multiplier), so every stored weight is 0 or ``±2**e`` with ``1 - 2**(bits-2) <= e <= 0``, and
an integer on its ``Quant`` node's grid ``2**-frac`` (a floored band's taps are 0 or 1): what
``inq verify`` checks (:func:`qonnx_levels`).

Refused, in one line naming the layer: activation scales that are not powers of two
(``--float-scales``: ``q * scale`` would round in float32), windowed average pooling (no model
of the README has it; global pooling is exported), a band whose accumulator bound reaches
``2**24`` (the weights of one exponent alone; no conv of fewer than 65,000 terms).

Example::

    proto = export_qonnx(load_integer("model.int.safetensors"), "model.qonnx.onnx")
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from inq.codes import decode_weight
from inq.data import data_record, input_shape
from inq.deploy.onnx import load_onnx, onnx_digest_problem, recorded_descriptions, save_onnx
from inq.deploy.target import INTEGER_SOURCE, Job, Target
from inq.deploy.verify import LayerReport, VerifyReport
from inq.fileio import metadata_n1
from inq.levels import describe_n1
from inq.pow2 import N1, exact_log2
from inq.quant.integer import IntegerModel, IntOp, accumulator_bound

__all__ = [
    "LEVELS_KEY",
    "QONNX_DOMAIN",
    "TARGET",
    "QonnxModel",
    "export_qonnx",
    "is_qonnx",
    "prepare_qonnx",
    "qonnx_graph",
    "qonnx_levels",
    "run_qonnx",
    "verify_qonnx",
]

QONNX_DOMAIN = "qonnx.custom_op.general"
LEVELS_KEY = "inq_levels/"  # + a Conv/Gemm node's name: its layer's level set (JSON)
EXACT_FLOAT32 = 1 << 24  # every integer below it is a float32
INT64_LIMIT = 1 << 62  # the requantization's dividend stays below 2**63 with its offset
EVAL_BATCH = 1000  # images per executor call when evaluating (each call has a fixed cost) ...
EVAL_MEMORY = 2 << 30  # ... fewer where the executor would hold more than this (it keeps every
# intermediate tensor of a call)


def export_qonnx(
    model: IntegerModel, path: str | os.PathLike[str], shape: Sequence[int] | None = None
) -> dict[str, int]:
    """Write ``model`` as a QONNX file at ``path`` (:func:`qonnx_graph`, batch 1), checked by
    ``qonnx`` itself (its ``ModelWrapper``, cleanup and shape inference take it); returns its
    node, ``Quant`` node, initializer and byte counts.

    Raises:
        ValueError: a layer the exact QONNX form cannot hold (see the module docstring), or
            no ``qonnx``/``onnx`` (the message names the ``fpga`` extra).
    """
    _, wrapper, cleanup = _modules()
    proto = qonnx_graph(model, 1, shape)
    cleanup(wrapper(proto))  # what FPGA flows run first: it must take the graph
    return {
        "nodes": len(proto.graph.node),
        "quant_nodes": sum(node.op_type == "Quant" for node in proto.graph.node),
        "initializers": len(proto.graph.initializer),
        "bytes": save_onnx(proto, path),  # atomically, with its digest
    }


def _modules() -> tuple[Any, Any, Any]:
    try:
        import onnx
        from qonnx.core.modelwrapper import ModelWrapper
        from qonnx.util.cleanup import cleanup_model
    except ImportError as err:
        raise ValueError(
            f"QONNX needs the fpga extra: pip install 'inq[fpga]' "
            f"({str(err.name).split('.')[0]} is missing)"  # the package, not its submodule
        ) from None
    return onnx, ModelWrapper, cleanup_model


def qonnx_graph(model: IntegerModel, batch: int = 1, shape: Sequence[int] | None = None) -> Any:
    """The QONNX ``ModelProto`` of ``model``: input ``x`` (float32, ``[batch, C, H, W]`` of the
    data its file records), output ``y`` (float64): the last op's integers times
    :meth:`~inq.quant.integer.IntegerModel.output_scale`. QONNX tools take fixed shapes; FPGA
    flows one image at a time (``batch`` 1). ``shape`` (one input's, e.g. ``(C, H, W)``) stands
    in for a file that records none.

    Raises:
        ValueError: a layer the exact QONNX form cannot hold, naming it.
    """
    import onnx
    from onnx import TensorProto, helper

    graph = _Graph()
    for op in model.ops:
        graph.add(op, model.op_tensors(op.name))
    last = model.ops[-1]
    out = graph.node("Cast", [graph.ints[last.name]], "y_double", to=TensorProto.DOUBLE)
    graph.node("Mul", [out, graph.const("y_scale", np.float64(last.attrs["scale"]))], "y")
    graph.nodes[-1].output[0] = "y"
    dims = _input_dims(model, batch, shape)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, dims)
    y = helper.make_tensor_value_info("y", TensorProto.DOUBLE, _output_dims(model, dims))
    proto = helper.make_model(
        helper.make_graph(graph.nodes, "inq_integer_model", [x], [y], graph.initializers),
        opset_imports=[helper.make_opsetid("", 13), helper.make_opsetid(QONNX_DOMAIN, 1)],
        producer_name="inq",
    )
    info = model.info
    data = info.get("data") or {}
    records = {
        "inq_model": info.get("model") or {},
        "inq_data": data_record(data) if "name" in data else data,  # a data set's, or a shape
        **{LEVELS_KEY + node: levels for node, levels in graph.levels.items()},
    }
    proto.metadata_props.extend(
        onnx.StringStringEntryProto(key=key, value=json.dumps(value))
        for key, value in records.items()
    )
    onnx.checker.check_model(proto)
    return proto


def is_qonnx(proto: Any) -> bool:
    """Whether the ONNX ``ModelProto`` is a QONNX graph: it imports the QONNX operator domain or
    has a node of it (a plain ONNX runtime cannot run it)."""
    return any(o.domain == QONNX_DOMAIN for o in proto.opset_import) or any(
        node.domain == QONNX_DOMAIN for node in proto.graph.node
    )


def qonnx_levels(proto: Any) -> dict[str, Any]:
    """The level sets a QONNX file of :func:`export_qonnx` records: Conv/Gemm node name ->
    ``{"op", "bits", "n1", "frac"}`` as read (each value's JSON, or the text that is not
    JSON, left for the caller to refuse)."""
    levels: dict[str, Any] = {}
    for prop in proto.metadata_props:
        if prop.key.startswith(LEVELS_KEY):
            try:
                levels[prop.key.removeprefix(LEVELS_KEY)] = json.loads(prop.value)
            except ValueError:
                levels[prop.key.removeprefix(LEVELS_KEY)] = prop.value
    return levels


def run_qonnx(proto: Any, x: np.ndarray, prepared: Any = None) -> np.ndarray:
    """``proto`` run by ``qonnx``'s executor on the batch ``x`` (the graph's batch set to
    ``len(x)``, then qonnx's cleanup and shape inference: :func:`prepare_qonnx`, or
    ``prepared``, what it returned for this batch size): the QONNX tools' own reading.

    Raises:
        ImportError: without ``qonnx`` (``pip install 'inq[fpga]'``).
    """
    from qonnx.core.onnx_exec import execute_onnx

    wrapper = prepare_qonnx(proto, len(x)) if prepared is None else prepared
    inputs = {wrapper.graph.input[0].name: np.ascontiguousarray(x, np.float32)}
    out: np.ndarray = execute_onnx(wrapper, inputs)[wrapper.graph.output[0].name]
    return out


def prepare_qonnx(proto: Any, batch: int) -> Any:
    """qonnx's ``ModelWrapper`` of ``proto`` for batches of ``batch``, cleaned up and its
    shapes inferred, ready for its executor (about a third of a second for a small model:
    worth keeping between calls of one size).

    Raises:
        ImportError: without ``qonnx`` (``pip install 'inq[fpga]'``).
    """
    from qonnx.core.modelwrapper import ModelWrapper
    from qonnx.transformation.infer_shapes import InferShapes
    from qonnx.util.cleanup import cleanup_model

    wrapper = ModelWrapper(proto)
    for value in (wrapper.graph.input[0], wrapper.graph.output[0]):
        wrapper.set_tensor_shape(value.name, [batch, *wrapper.get_tensor_shape(value.name)[1:]])
    return cleanup_model(wrapper).transform(InferShapes())


class QonnxModel(torch.nn.Module):
    """A QONNX file run by ``qonnx``'s executor (:func:`run_qonnx`) on the CPU, as a module:
    float input, the graph's float64 logits. One executor call per batch (it starts a session
    per node each call, ~0.15 s for the digits CNN; the graph prepared once per batch size):
    give it large batches. ``model`` and ``data`` are the descriptions the file records
    (``{}`` if it records none).

    Raises:
        ValueError: without ``qonnx`` (the message names the ``fpga`` extra), or if the file
            records a description that is not JSON.
    """

    def __init__(self, proto: Any, path: str | os.PathLike[str]) -> None:
        super().__init__()
        _modules()  # the fpga extra, before any work
        self.proto = proto
        self.model, self.data = recorded_descriptions(proto, path)
        dims = proto.graph.input[0].type.tensor_type.shape.dim
        self.input_shape = [d.dim_value or None for d in dims][1:]  # one input's (C, H, W)
        self.batch = max(1, min(EVAL_BATCH, EVAL_MEMORY // _bytes_per_input(proto)))
        self._prepared: dict[int, Any] = {}  # batch size -> prepare_qonnx's wrapper

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits of ``x`` (float64).

        Raises:
            ValueError: if one input of ``x`` does not have the graph's fixed shape.
        """
        if list(x.shape[1:]) != self.input_shape:
            raise ValueError(
                f"the QONNX model takes inputs of shape {['N', *self.input_shape]}, the data "
                f"gives {list(x.shape)}"
            )
        if len(x) not in self._prepared:
            self._prepared[len(x)] = prepare_qonnx(self.proto, len(x))
        batch = x.detach().cpu().float().numpy()
        return torch.from_numpy(run_qonnx(self.proto, batch, self._prepared[len(x)]))


def _bytes_per_input(proto: Any) -> int:
    """A bound on the bytes the executor holds per input image: every tensor of the graph (shapes
    inferred at batch 1) at 8 bytes a value."""
    from qonnx.core.modelwrapper import ModelWrapper
    from qonnx.transformation.infer_shapes import InferShapes
    from qonnx.util.cleanup import cleanup_model

    wrapper = cleanup_model(ModelWrapper(proto)).transform(InferShapes())
    graph = wrapper.graph
    names = [v.name for v in (*graph.input, *graph.value_info, *graph.output)]
    return 8 * sum(
        math.prod(d or 1 for d in wrapper.get_tensor_shape(name) or []) for name in names
    )


class _Graph:
    """Nodes and initializers, one integer op at a time. ``ints`` maps each op to the int64
    tensor of its integers, ``reals`` to the float32 tensor of its real values (``q * scale``
    behind a ``Quant`` node)."""

    def __init__(self) -> None:
        from onnx import numpy_helper

        self._numpy_helper = numpy_helper
        self.nodes: list[Any] = []
        self.initializers: list[Any] = []
        self.ints: dict[str, str] = {}
        self.reals: dict[str, str] = {}
        self.ops: dict[str, IntOp] = {}
        self.levels: dict[str, dict[str, Any]] = {}  # Conv/Gemm node -> its layer's level set
        self._names: set[str] = set()

    def name(self, stem: str) -> str:
        name, i = stem, 0
        while name in self._names:
            i += 1
            name = f"{stem}_{i}"
        self._names.add(name)
        return name

    def const(self, stem: str, array: Any) -> str:
        name = self.name(stem)
        self.initializers.append(self._numpy_helper.from_array(np.asarray(array), name))
        return name

    def node(self, kind: str, inputs: list[str], stem: str, domain: str = "", **attrs: Any) -> str:
        from onnx import helper

        out = self.name(stem)
        self.nodes.append(helper.make_node(kind, inputs, [out], out, domain=domain, **attrs))
        return out

    def add(self, op: IntOp, tensors: dict[str, torch.Tensor]) -> None:
        """The nodes of ``op``; its integers and real values registered under its name."""
        self.ops[op.name] = op
        a, kind = op.attrs, op.op
        scale = a.get("scale")
        if scale is not None and exact_log2(scale) is None:
            raise ValueError(
                f"{op.name}: activation scale {scale} is not a power of two; the QONNX export "
                "is exact for power-of-two scales only (calibrate without --float-scales)"
            )
        if kind == "input":
            from onnx import TensorProto

            x = self.node("Cast", ["x"], "x_double", to=TensorProto.DOUBLE)
            x = self.node("Div", [x, self.const("in_scale", np.float64(scale))], "x_scaled")
            x = self.node("Add", [x, self.const("half", np.float64(0.5))], "x_half")
            x = self.node("Floor", [x], "x_floor")
            self._integers(op, self.node("Cast", [x], "x_int", to=TensorProto.INT64))
        elif kind in ("conv", "linear"):
            self._weight_op(op, tensors)
        elif kind == "add":
            x, y = (self.ints[name] for name in op.inputs)
            m_x, m_y = a["multipliers"]
            total = self.node("Add", [
                self.node("Mul", [x, self.const("m_x", np.int64(m_x))], f"{op.name}_mx"),
                self.node("Mul", [y, self.const("m_y", np.int64(m_y))], f"{op.name}_my"),
            ], f"{op.name}_sum")  # fmt: skip
            self._integers(op, self._requantize(op, total, 1, a["shift"]))
        elif kind == "avgpool":
            self._integers(op, self._avgpool(op))
        else:
            self._exact_op(op)

    def _integers(self, op: IntOp, ints: str) -> None:
        """Clip ``ints`` (int64) to ``op``'s range and put its real value behind ``Quant``."""
        from onnx import TensorProto

        a = op.attrs
        bounds = [self.const("lo", np.int64(a["lo"])), self.const("hi", np.int64(a["hi"]))]
        ints = self.node("Clip", [ints, *bounds], f"{op.name}_clip")
        self.ints[op.name] = ints
        real = self.node("Cast", [ints], f"{op.name}_float", to=TensorProto.FLOAT)
        real = self.node("Mul", [real, self.const("scale", np.float32(a["scale"]))], op.name)
        self.reals[op.name] = self._quant(real, a["scale"], a["lo"], a["hi"], op.name)

    def _quant(self, real: str, scale: float, lo: int, hi: int, stem: str) -> str:
        """``real`` behind a QONNX ``Quant`` of the narrowest width holding ``[lo, hi]``: an
        identity on the values (they are on its grid and in its range), the type for tools."""
        signed = lo < 0
        bits = max(int(abs(v)).bit_length() for v in (lo, hi)) + int(signed)
        return self.node(
            "Quant",
            [real, self.const("q_scale", np.float32(scale)), self.const("q_zero", np.float32(0)),
             self.const("q_bits", np.float32(max(bits, 2)))],
            f"{stem}_quant", domain=QONNX_DOMAIN, signed=int(signed), narrow=0,
            rounding_mode="ROUND",
        )  # fmt: skip

    def _weight_op(self, op: IntOp, tensors: dict[str, torch.Tensor]) -> None:
        """Bands of weights summed in int64 (:func:`_integer_groups`, :meth:`_floored_band`),
        then the bias and the requantization."""
        a = op.attrs
        x_op = self.ops[op.inputs[0]]
        shape = (
            tuple(a["weight_shape"]) if op.op == "conv" else (a["out_features"], a["in_features"])
        )
        x_lo, x_hi = x_op.attrs["lo"], x_op.attrs["hi"]
        x_max = max(abs(x_lo), abs(x_hi))
        bound = int(accumulator_bound(tensors["codes"], a["bits"], a["frac"], x_max).max())
        levels = decode_weight(tensors["codes"], a["bits"], 0, shape, torch.float64).numpy()
        signs = np.sign(levels).astype(np.int64)
        offsets = np.where(signs != 0, -np.log2(np.where(signs != 0, np.abs(levels), 1)), 0)
        offsets = offsets.astype(np.int64)
        terms = [
            self._integer_band(op, np.where(band, signs << np.maximum(top - offsets, 0), 0), top)
            for band, top in _integer_groups(op.name, signs, offsets, a["frac"], x_max)
        ]
        # floor(s * x / 2**d) is the same for every d with 2**d > x_max: one band for them
        shifts = np.minimum(offsets - a["frac"], x_max.bit_length())
        for d in sorted(set(shifts[(signs != 0) & (shifts > 0)].tolist())):
            for sign in (1, -1):  # the sign goes in before the floor
                taps = ((shifts == d) & (signs == sign)).astype(np.int64)
                low, high = sorted((sign * x_lo >> d, sign * x_hi >> d))
                if taps.any() and (low, high) != (0, 0):  # all zero: floors to 0 whatever x
                    terms.append(self._floored_band(op, taps, d, sign, low, high))
        if not terms:  # an all-zero layer
            terms.append(self._integer_band(op, np.zeros(shape, np.int64), a["frac"]))
        acc = terms[0]
        for term in terms[1:]:
            acc = self.node("Add", [acc, term], f"{op.name}_bands")
        view = (1, -1) if op.op == "linear" else (1, -1, 1, 1)
        acc = self.node("Add", [acc, self.const("bias", _int64(tensors["bias"], view))],
                        f"{op.name}_bias")  # fmt: skip
        multiplier, shift = _int64(tensors["multiplier"], view), _int64(tensors["shift"], view)
        largest = (bound + int(tensors["bias"].abs().max())) * int(np.abs(multiplier).max())
        if largest + (1 << int(shift.max())) >= INT64_LIMIT:
            raise ValueError(f"{op.name}: its requantization may reach 2**62; not exported")
        self._integers(op, self._requantize(op, acc, multiplier, shift))

    def _layer(self, op: IntOp, x: str, weight: str, stem: str) -> str:
        """The float32 ``Conv``/``Gemm`` of ``op``'s geometry on ``x`` and ``weight``."""
        a = op.attrs
        if op.op == "linear":
            return self.node("Gemm", [x, weight], f"{stem}_gemm", transB=1)
        return self.node("Conv", [x, weight], f"{stem}_conv", strides=a["stride"],
                         pads=a["padding"] * 2, dilations=a["dilation"],
                         group=a["groups"])  # fmt: skip

    def _integer_band(self, op: IntOp, ints: np.ndarray, top: int) -> str:
        """The int64 accumulator (units ``2**-frac``) of the integer weights ``ints`` (units
        ``2**-top``): a float32 layer on the real input (exact: the band's bound is below
        ``2**24``, :func:`_integer_groups`), divided by its unit, times ``2**(frac - top)``."""
        from onnx import TensorProto

        x_op, frac = self.ops[op.inputs[0]], op.attrs["frac"]
        step = 2.0**-top
        weight = self.const("w", (ints * step).astype(np.float32))
        weight = self._quant(weight, step, int(ints.min()), int(ints.max()), f"{op.name}_w")
        acc = self._layer(op, self.reals[op.inputs[0]], weight, op.name)
        self.levels[acc] = {"op": op.name, "bits": op.attrs["bits"], "n1": op.attrs["n1"],
                            "frac": top}  # fmt: skip
        unit = np.float32(x_op.attrs["scale"] * step)  # a power of two: the division is exact
        acc = self.node("Div", [acc, self.const("unit", unit)], f"{op.name}_units")
        acc = self.node("Cast", [acc], f"{op.name}_acc", to=TensorProto.INT64)
        if top == frac:
            return acc
        return self.node("Mul", [acc, self.const("up", np.int64(1 << (frac - top)))],
                         f"{op.name}_up")  # fmt: skip

    def _floored_band(
        self, op: IntOp, taps: np.ndarray, d: int, sign: int, low: int, high: int
    ) -> str:
        """The int64 sum of ``floor(sign * x / 2**d)`` over the 0/1 ``taps``: the terms the
        integer model floors one by one (offset ``frac + d``), each floored exactly in float32
        (a power-of-two product), behind a ``Quant`` of its range ``[low, high]``, then a
        float32 layer with the taps (exact: the band's bound is checked below ``2**24``)."""
        from onnx import TensorProto

        x_op = self.ops[op.inputs[0]]
        rows = taps.reshape(taps.shape[0], -1).sum(axis=1)
        if int(rows.max()) * max(abs(low), abs(high)) >= EXACT_FLOAT32:
            raise ValueError(f"{op.name}: a floored band's accumulator reaches 2**24; not exported")
        stem = f"{op.name}_d{d}" + ("n" if sign < 0 else "")
        factor = np.float32(sign * 2.0**-d / x_op.attrs["scale"])
        x = self.node("Mul", [self.reals[op.inputs[0]], self.const("f", factor)], f"{stem}_x")
        x = self._quant(self.node("Floor", [x], f"{stem}_floor"), 1.0, low, high, stem)
        weight = self._quant(self.const("w", taps.astype(np.float32)), 1.0, 0, 1, f"{stem}_w")
        acc = self._layer(op, x, weight, stem)
        self.levels[acc] = {"op": op.name, "bits": op.attrs["bits"], "n1": op.attrs["n1"],
                            "frac": 0, "floor": d, "sign": sign}  # fmt: skip
        return self.node("Cast", [acc], f"{stem}_acc", to=TensorProto.INT64)

    def _avgpool(self, op: IntOp) -> str:
        a = op.attrs
        x = self.ints[op.inputs[0]]
        if a["kernel"] is None:
            total = self.node("ReduceSum", [x, self.const("axes", np.array([2, 3], np.int64))],
                              f"{op.name}_sum", keepdims=1)  # fmt: skip
        else:
            raise ValueError(f"{op.name}: windowed average pooling has no QONNX form here yet")
        return self._requantize(op, total, a["multiplier"], a["shift"])

    def _requantize(self, op: IntOp, v: str, multiplier: Any, shift: Any) -> str:
        """``floor((v * multiplier + 2**(shift-1)) / 2**shift)`` in int64: a ``Div`` of a
        dividend made non-negative by ``offset * 2**shift`` (so that truncation floors)."""
        shift = np.asarray(shift, np.int64)
        if bool((shift > 62).any()):
            raise ValueError(f"{op.name}: a shift beyond 62 has no int64 form")
        denominator = np.left_shift(np.int64(1), shift)
        half = np.right_shift(denominator, 1)
        offset = np.right_shift(np.int64(INT64_LIMIT), shift)  # * 2**shift: 2**62
        product = self.node("Mul", [v, self.const("m", np.asarray(multiplier, np.int64))],
                            f"{op.name}_times")  # fmt: skip
        biased = self.node("Add", [product, self.const("half", half + offset * denominator)],
                           f"{op.name}_half")  # fmt: skip
        floor = self.node("Div", [biased, self.const("d", denominator)], f"{op.name}_shift")
        return self.node("Sub", [floor, self.const("offset", offset)], f"{op.name}_ints")

    def _exact_op(self, op: IntOp) -> None:
        """Ops exact on the integers (same scale): run on the int64 values."""
        a, kind = op.attrs, op.op
        x = self.ints[op.inputs[0]]
        if kind == "relu" or kind == "clamp":
            self._integers(op, x)  # the clip to [lo, hi] is the op
            return
        if kind == "flatten" and a["start_dim"] == 1 and a["end_dim"] == -1:
            y = self.node("Flatten", [x], f"{op.name}_flat", axis=1)
        elif kind == "maxpool":
            from onnx import TensorProto

            k, st, pad, dil = (a[key] for key in ("kernel", "stride", "padding", "dilation"))
            real = self.node("Cast", [x], f"{op.name}_f", to=TensorProto.FLOAT)  # exact: int8
            y = self.node("MaxPool", [real], f"{op.name}_max", kernel_shape=k, strides=st,
                          pads=pad + pad, dilations=dil, ceil_mode=int(a["ceil_mode"]))  # fmt: skip
            y = self.node("Cast", [y], f"{op.name}_i", to=TensorProto.INT64)
        else:
            raise ValueError(f"{op.name}: op {kind} has no QONNX form here yet")
        self._integers(op, y)


def _integer_groups(
    name: str, signs: np.ndarray, offsets: np.ndarray, frac: int, x_max: int
) -> list[tuple[np.ndarray, int]]:
    """The weights at offsets ``<= frac`` (integers in accumulator units) as bands of
    consecutive offsets, each a mask and its largest offset ``top`` (the band's weights are the
    integers ``±2**(top - offset)``), as few as keep every band's accumulator bound
    ``x_max * sum |weight|`` per output row below ``2**24``: one band wherever the layer's
    bound allows.

    Raises:
        ValueError: if the weights of one offset alone may reach ``2**24``.
    """
    rows = signs.shape[0]
    groups: list[tuple[list[int], np.ndarray]] = []
    for offset in sorted(set(offsets[signs != 0].tolist()) & set(range(frac + 1))):
        count = ((offsets == offset) & (signs != 0)).reshape(rows, -1).sum(axis=1)
        if int(count.max()) * x_max >= EXACT_FLOAT32:
            raise ValueError(
                f"{name}: its accumulator may reach {int(count.max()) * x_max} in one band, "
                "beyond the 2**24 that float32 holds exactly; not exported"
            )
        if groups:
            members, sums = groups[-1]
            grown = sums * (1 << (offset - members[-1])) + count * x_max
            if int(grown.max()) < EXACT_FLOAT32:
                groups[-1] = ([*members, offset], grown)
                continue
        groups.append(([offset], count * x_max))
    return [(np.isin(offsets, members) & (signs != 0), members[-1]) for members, _ in groups]


def _input_dims(model: IntegerModel, batch: int, given: Sequence[int] | None) -> list[int]:
    """``[batch, *shape]`` of the input the model's file records (``data.input.shape``).

    Raises:
        ValueError: if it records none (QONNX graphs have fixed shapes).
    """
    shape = given or ((model.info.get("data") or {}).get("input") or {}).get("shape")
    if not shape:
        raise ValueError("the integer model records no input shape (data); QONNX needs one")
    return [batch, *map(int, shape)]


def _output_dims(model: IntegerModel, dims: list[int]) -> list[int]:
    """The graph's output shape: the integer model's, run on zeros of the input's ``dims``."""
    with torch.no_grad():
        return list(model(torch.zeros(dims)).shape)


def _int64(tensor: torch.Tensor, view: tuple[int, ...]) -> np.ndarray:
    return tensor.to(torch.int64).reshape(view).numpy()


def verify_qonnx(proto: Any, path: str = "") -> VerifyReport:
    """Check every Conv/Gemm weight of a QONNX ``ModelProto`` (written by
    :func:`export_qonnx`) against the level set the file records for its node
    (:func:`qonnx_levels`): the weight is an initializer behind a QONNX
    ``Quant`` node of scale ``2**-frac`` and zero point 0; each value is 0 or ``±2**e`` with
    ``1 - 2**(bits-2) <= e <= 0`` (the level set ``{0, ±2**n2..±2**n1}`` as stored,
    ``w * 2**-n1``), an integer on the ``Quant`` grid and within its width (else the ``Quant``
    node would change it). One report per Conv/Gemm node; a level set recorded for no such node
    is a problem, and so is a file that does not match its sha256 digest
    (:func:`inq.deploy.onnx.onnx_digest_problem`: a weight's sign flipped stays in its level
    set, and only the digest tells).
    """
    from onnx import numpy_helper

    values = {t.name: numpy_helper.to_array(t) for t in proto.graph.initializer}
    made_by = {out: node for node in proto.graph.node for out in node.output}
    levels = qonnx_levels(proto)
    reports = tuple(
        _qonnx_layer(node, made_by, values, levels.pop(node.name, None))
        for node in proto.graph.node
        if node.op_type in ("Conv", "Gemm")
    )
    others = tuple((LEVELS_KEY + name, "a level set recorded for no Conv/Gemm node")
                   for name in levels)  # fmt: skip
    digest = onnx_digest_problem(proto, required=True)
    return VerifyReport(path, "QONNX", reports, digest, others)


def _qonnx_layer(
    node: Any, made_by: dict[str, Any], values: dict[str, np.ndarray], record: Any
) -> LayerReport:
    """One Conv/Gemm node's weight against its recorded level set (see :func:`verify_qonnx`)."""
    quant = made_by.get(node.input[1]) if len(node.input) > 1 else None
    if (
        quant is None
        or quant.op_type != "Quant"
        or quant.domain != QONNX_DOMAIN
        or any(name not in values for name in quant.input[:4])
    ):
        problem = "its weight is not an initializer behind a QONNX Quant node"
        return LayerReport(node.name, 0, None, None, None, problem)
    weight = values[quant.input[0]].astype(np.float64)
    rows = weight.shape[0] if weight.ndim else 0
    bad = _record_problem(record, rows)
    if bad is not None:
        return LayerReport(node.name, 0, None, None, None, bad)
    bits, n1, frac = record["bits"], metadata_n1(record["n1"]), record["frac"]
    floored = "floor" in record  # a band of terms floored one by one: 0/1 taps on a unit grid
    problems = [
        p
        for p in (
            _quant_problem(quant, values, frac),
            _taps_problem(weight) if floored else _stored_level_problem(weight, bits, n1),
            _grid_problem(weight, quant, values, frac),
        )
        if p is not None
    ]
    used, zeros = len(np.unique(weight)), float((weight == 0).mean()) if weight.size else 0.0
    return LayerReport(node.name, bits, n1, used, zeros, "; ".join(problems) or None)


def _record_problem(record: Any, rows: int) -> str | None:
    """Why a recorded level set is not ``{"bits": 2..8, "n1": int or [rows ints], "frac": >= 0}``
    (None if it is)."""
    if record is None:
        return "no level set recorded for it (export the file again with this inq)"
    n1 = record.get("n1") if isinstance(record, dict) else None
    ok = (
        isinstance(record, dict)
        and isinstance(record.get("bits"), int)
        and 2 <= record["bits"] <= 8
        and isinstance(record.get("frac"), int)
        and record["frac"] >= 0
        and (isinstance(n1, int) or (isinstance(n1, list) and len(n1) == rows
                                      and all(isinstance(v, int) for v in n1)))
    )  # fmt: skip
    return None if ok else f"its recorded level set is not bits, n1, frac: {record!r}"


def _quant_problem(quant: Any, values: dict[str, np.ndarray], frac: int) -> str | None:
    """Why the weight's ``Quant`` node does not have scale ``2**-frac`` and zero point 0."""
    scale, zero = values[quant.input[1]], values[quant.input[2]]
    if scale.size != 1 or float(scale) != 2.0**-frac or zero.size != 1 or float(zero) != 0:
        return (
            f"its Quant node {quant.name!r} has scale {scale.tolist()} and zero point "
            f"{zero.tolist()}; the level set records scale 2**-{frac}, zero point 0"
        )
    return None


def _stored_level_problem(weight: np.ndarray, bits: int, n1: N1) -> str | None:
    """Why a stored weight (``w * 2**-n1``) has values outside ``{0, ±2**(1-2**(bits-2))..±1}``."""
    lowest = 1 - (1 << (bits - 2))
    with np.errstate(invalid="ignore"):
        mantissa, exponent = np.frexp(np.abs(weight))  # |w| = mantissa * 2**exponent
        ok = (weight == 0) | ((mantissa == 0.5) & (exponent - 1 >= lowest) & (exponent - 1 <= 0))
    return _off(ok, weight, f"the {bits}-bit level set of n1={describe_n1(n1)}",
                f"stored as w * 2**-n1: 0 or ±2**{lowest}..±1")  # fmt: skip


def _taps_problem(weight: np.ndarray) -> str | None:
    """Why a floored band's taps are not all 0 or 1."""
    bad = int(((weight != 0) & (weight != 1)).sum())
    return f"{bad} tap(s) of a floored band not 0 or 1" if bad else None


def _grid_problem(
    weight: np.ndarray, quant: Any, values: dict[str, np.ndarray], frac: int
) -> str | None:
    """Why the weight's integers ``w * 2**frac`` are not integers within the ``Quant`` node's
    width (where they are not, the node changes the weight)."""
    width, signed = float(values[quant.input[3]]), _attr(quant, "signed", 1)
    narrow = _attr(quant, "narrow", 0)
    lo = -(2.0 ** (width - 1)) + narrow if signed else 0.0
    hi = 2.0 ** (width - int(signed)) - 1 - (narrow if not signed else 0)
    ints = np.ldexp(weight, frac)
    ok = np.isfinite(ints) & (ints == np.round(ints)) & (ints >= lo) & (ints <= hi)
    return _off(ok, weight, "its Quant node's grid", f"integers {lo:g}..{hi:g} times 2**-{frac}")


def _off(ok: np.ndarray, weight: np.ndarray, where: str, detail: str) -> str | None:
    """``"N weight(s) off <where> (<detail>; first: <value> at flat index <i>)"`` for the
    weights where ``ok`` is false, or None if there are none."""
    if bool(ok.all()):
        return None
    index = int(np.flatnonzero(~ok)[0])
    return (
        f"{int((~ok).sum())} weight(s) off {where} ({detail}; first: "
        f"{float(weight.flat[index])!r} at flat index {index})"
    )


def _attr(node: Any, name: str, default: int) -> int:
    """An int attribute of an ONNX node (``default`` if it has none)."""
    return next((int(a.i) for a in node.attribute if a.name == name), default)


def _write(job: Job) -> list[str]:
    """``inq export --qonnx``: the integer model as QONNX, for FINN and hls4ml."""
    int_model = job.integer_model()
    data = job.data(int_model.info.get("data", {}))
    int_model.info["data"] = data  # the file records the data it was made for
    stats = export_qonnx(int_model, job.output, input_shape(data))
    return [
        f"{job.header.path} -> {job.output}: QONNX, {stats['nodes']} nodes ({stats['quant_nodes']} "
        f"Quant), {stats['initializers']} initializers, {stats['bytes']} B; batch 1, integer "
        "steps exact (qonnx's executor equals the integer model)"
    ]


def _check(path: Path) -> str | None:
    """The first problem ``inq verify`` reports of a QONNX file (:func:`verify_qonnx`)."""
    report = verify_qonnx(load_onnx(path, check=False), str(path))
    if not report.layers:
        return "no Conv/Gemm node: nothing to verify"
    bad = report.first_problem
    return f"node {bad.key!r}: {bad.problem}" if bad is not None else report.file_problem


TARGET = Target(
    name="qonnx",
    help="write the integer model (a file, or a run's) as QONNX (-o FILE.onnx needed; "
    "pip install 'inq[fpga]'): qonnx's executor computes it bit for bit",
    source=INTEGER_SOURCE,
    output="FILE.onnx",
    suffix=".onnx",
    write=_write,
    check=_check,
)
