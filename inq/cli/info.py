"""``inq info``: what a model file holds: sizes, compression, bits and layers of a packed file
(or of a masked checkpoint, shown packed), the ops of an integer model, the signature and
records of an ONNX or QONNX file. ``inq export`` and ``inq calibrate`` print their output with
the same lines (:func:`sizes_line`, :func:`integer_table`).

::

    inq info model.inq.safetensors      # sizes, ratio, bits, layers
    inq info m.int.safetensors          # settings, then one line per op
"""

from __future__ import annotations

import argparse
import json
import math
import os
from collections.abc import Sequence
from typing import Any

import torch

from inq.artefact import open_artefact
from inq.cli.base import Command
from inq.data import data_record, describe_input
from inq.deploy.onnx import OnnxModel, load_onnx, recorded_descriptions
from inq.deploy.qonnx import is_qonnx
from inq.levels import describe_n1
from inq.packed import PackStats, pack_stats
from inq.quant.integer import INT_FORMAT, IntegerModel, IntOp
from inq.runfiles import (
    INTEGER_MODEL,
    MASKED_CHECKPOINT,
    ONNX_MODEL,
    PACKED_FILE,
    RUN,
    command_file,
    load_model,
)


def _info_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "file",
        help="a packed file (inq export), an integer model (inq calibrate), a masked checkpoint "
        "(shown packed, as inq export would write it), an ONNX or QONNX model or a run directory "
        "(its packed file)",
    )


def _info(args: argparse.Namespace) -> int:
    header = command_file(
        args.file, "info", (PACKED_FILE, INTEGER_MODEL, MASKED_CHECKPOINT, ONNX_MODEL, RUN)
    )
    if header.kind == INTEGER_MODEL:
        print(integer_table(open_artefact(header), args.file))
        return 0
    if header.kind == ONNX_MODEL:
        proto = load_onnx(args.file)
        print(qonnx_summary(proto, args.file) if is_qonnx(proto) else
              onnx_summary(OnnxModel(args.file, proto), args.file))  # fmt: skip
        return 0
    packed, read = load_model(header)
    stored = header.kind == PACKED_FILE
    stats = pack_stats(packed, os.path.getsize(read) if stored else 0)
    how = "" if stored else ", shown packed as inq export would write it"
    print(f"{read}: {header.format}{how}; model {json.dumps(packed.model)}")
    if packed.data:
        print(_input_line(packed.data))
    bits = sorted({layer.bits for layer in packed.layers.values()})
    print(
        f"{len(packed.layers)} quantized layers (bits {bits}), {len(packed.tensors)} other tensors"
    )
    print(sizes_line(stats))
    width = max([len("tensor"), *(len(k) for k in packed.layers)])
    n1_width = max([4, *(len(describe_n1(layer.n1)) for layer in packed.layers.values())])
    print(
        f"{'tensor':<{width}}  {'shape':<18}  bits  {'n1':>{n1_width}}   zeros  storage  "
        f"{'dense B':>8}  {'stored B':>8}  {'x fp32':>7}"
    )
    for key, layer in packed.layers.items():
        shape = "x".join(map(str, layer.shape))
        storage = layer.storage + (f"/{layer.sparse.gap_bits}" if layer.storage == "gaps" else "")
        zeros = float((layer.codes() == 0).double().mean()) if layer.packed.numel() else 0.0
        fp32 = 4 * math.prod(layer.shape)
        print(
            f"{key:<{width}}  {shape:<18}  {layer.bits:>4}  {describe_n1(layer.n1):>{n1_width}}  "
            f"{100 * zeros:>5.1f}%  {storage:<7}  {layer.packed.numel():>8}  "
            f"{layer.stored_bytes:>8}  {fp32 / max(1, layer.stored_bytes):>6.1f}x"
        )
    return 0


def sizes_line(stats: PackStats) -> str:
    """The sizes line of a packed file that ``inq info`` and ``inq export`` print."""
    return (
        f"quantized weights: fp32 {stats.fp32_bytes} B -> {stats.packed_bytes} B in the file "
        f"(compression {stats.compression:.2f}x; dense rows {stats.dense_bytes} B); "
        f"other tensors {stats.other_bytes} B"
        + (f"; file {stats.file_bytes} B" if stats.file_bytes else "")
    )


def _input_line(data: dict) -> str:
    """The input preprocessing a file records with its data (or, in a file older than that
    record, what its dataset's loader does)."""
    recorded = data.get("input")
    if recorded is None:
        return describe_input(data_record(data)["input"]) + " (not recorded: the loader's)"
    return describe_input(recorded)


def onnx_summary(model: OnnxModel, path: str) -> str:
    """What ``inq info`` shows of an ONNX file: opset, size, inputs and outputs, and the model,
    data and input preprocessing it records."""
    head = f"ONNX opset {model.opset}, {model.nodes} nodes, {model.initializers} initializers"
    return _graph_summary(path, head, model.signature, model.model, model.data)


def qonnx_summary(proto: Any, path: str) -> str:
    """:func:`onnx_summary` of a QONNX file, read from the graph (ONNX Runtime cannot load its
    ``Quant`` nodes), with its count of ``Quant`` nodes."""
    from onnx import TensorProto

    nodes = proto.graph.node
    quants = sum(node.op_type == "Quant" for node in nodes)
    head = (f"QONNX model, {len(nodes)} nodes ({quants} Quant), {len(proto.graph.initializer)} "
            "initializers")  # fmt: skip
    signature = [
        (role, value.name, f"tensor({TensorProto.DataType.Name(kind.elem_type).lower()})",
         [d.dim_param or d.dim_value for d in kind.shape.dim])
        for role, values in (("input", proto.graph.input), ("output", proto.graph.output))
        for value in values
        for kind in [value.type.tensor_type]
    ]  # fmt: skip
    return _graph_summary(path, head, signature, *recorded_descriptions(proto, path))


def _graph_summary(
    path: str, head: str, signature: Sequence[tuple[str, str, str, Any]], model: dict, data: dict
) -> str:
    lines = [
        f"{path}: {head}, {os.path.getsize(path)} B",
        *(f"{role} {name}: {dtype} {dims}" for role, name, dtype, dims in signature),
        f"model {json.dumps(model)}",
    ]
    if data:
        lines += [f"data {data.get('name')}", _input_line(data)]
    else:
        lines.append("no data recorded: inq eval needs --data NAME")
    return "\n".join(lines)


def integer_table(model: IntegerModel, path: str) -> str:
    """What ``inq info`` shows of an integer model: its settings, then one line per op with
    bits, accumulator fraction bits, output scale (as log2), range and requantization."""
    info = model.info
    weight_bits = info.get("weight_bits")  # every bit-width the layers use (each op: its own)
    if isinstance(weight_bits, list):
        weight_bits = "/".join(map(str, weight_bits))
    lines = [
        f"{path}: {INT_FORMAT}, model {json.dumps(info.get('model', {}))}",
        f"activations {info.get('act_bits')}-bit, input {info.get('input_bits')}-bit "
        f"({info.get('calibration')} calibration, "
        f"{'power-of-two' if info.get('pow2_scales', True) else 'float'} scales"
        f"{', symmetric: TensorRT form' if info.get('symmetric') else ''}), weights "
        f"{weight_bits}-bit; output scale {model.output_scale()!r}",
    ]
    width = max(len("op"), *(len(op.name) for op in model.ops))
    lines.append(f"{'op':<{width}}  {'kind':<8} {'bits':>4} {'frac':>4} {'log2 scale':>10}  "
                 f"{'range':<24} requantization")  # fmt: skip
    for op in model.ops:
        a = op.attrs
        requant = _requant_kind(op, model.op_tensors(op.name))
        log2, value_range = math.log2(a["scale"]), f"{a['lo']}..{a['hi']}"
        lines.append(
            f"{op.name:<{width}}  {op.op:<8} {a.get('bits', '-'):>4} {a.get('frac', '-'):>4} "
            f"{log2:>10.4g}  {value_range:<24} {requant}"
        )
    return "\n".join(lines)


def _requant_kind(op: IntOp, tensors: dict[str, torch.Tensor]) -> str:
    """``shift`` / ``multiplier`` counts of an op's requantizations (``-`` for none)."""
    if op.op in ("conv", "linear"):
        m = tensors["multiplier"].to(torch.int64).abs()
        shifts = int(((m & (m - 1)) == 0).sum())  # 0, 1 or a power of two
        return f"{shifts} shift, {m.numel() - shifts} multiplier (of {m.numel()} channels)"
    multipliers = op.attrs.get(
        "multipliers", [op.attrs["multiplier"]] if "multiplier" in op.attrs else None
    )
    if multipliers is None:
        return "-"
    pure = all(abs(m) & (abs(m) - 1) == 0 for m in multipliers)
    return f"{'shift' if pure else 'multiplier'} {multipliers} >> {op.attrs['shift']}"


COMMAND = Command(
    "sizes, bits, layers and input of a model file (packed, masked, integer, ONNX, QONNX)",
    _info_args,
    _info,
)
