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
export writes TensorRT's form instead (:mod:`inq.deploy.tensorrt`). Where a value's range is
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
import hashlib
import io
import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from inq.artefact import open_artefact
from inq.data import data_record, input_shape
from inq.deploy.qdq import INPUT_NAME, OUTPUT_NAME, QdqGraph, QdqWeight, qdq_weight
from inq.deploy.target import Job, Source, Target
from inq.deploy.tensorrt import SymmetricQdqGraph, readers, trt_problems
from inq.fileio import MODIFIED, atomic_path
from inq.models import build_model
from inq.packed import PackedFile
from inq.quant.integer import IntegerModel
from inq.runfiles import INTEGER_MODEL, MASKED_CHECKPOINT, PACKED_FILE, RUN, load_model

__all__ = [
    "DIGEST_PROP",
    "OPSET",
    "TARGET",
    "OnnxModel",
    "QdqWeight",
    "export_onnx",
    "export_qdq",
    "first_line",
    "is_onnx",
    "load_onnx",
    "onnx_digest_problem",
    "qdq_weight",
    "save_onnx",
    "unchecked_digest",
]

OPSET = 18
_SUFFIX = ".onnx"  # what the name of every ONNX file inq writes ends in (inq.cli.output.ONNX)
DIGEST_PROP = "inq_sha256"  # metadata_props entry: digest of the rest of the file (save_onnx)


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
    records it, with the input preprocessing), check the graph, write it (:func:`save_onnx`);
    returns its sizes."""
    proto.metadata_props.extend(
        onnx.StringStringEntryProto(key=f"inq_{key}", value=json.dumps(value))
        for key, value in (("model", model), ("data", data_record(data)))
    )
    onnx.checker.check_model(proto, full_check=True)
    return {
        "opset": OPSET,
        "nodes": len(proto.graph.node),
        "initializers": len(proto.graph.initializer),
        "bytes": save_onnx(proto, path),
    }


def save_onnx(proto: Any, path: str | os.PathLike[str]) -> int:
    """Write ``proto`` to ``path`` atomically (:func:`inq.fileio.atomic_path`) with its sha256
    digest in its ``metadata_props`` (:data:`DIGEST_PROP`, :func:`onnx_digest_problem`), as
    every ONNX file inq writes; returns the file's size in bytes."""
    _sign(proto)
    serialized = proto.SerializeToString(deterministic=True)
    with atomic_path(path) as tmp:
        tmp.write_bytes(serialized)
    return len(serialized)


def _sign(proto: Any) -> None:
    for i in reversed(range(len(proto.metadata_props))):
        if proto.metadata_props[i].key == DIGEST_PROP:
            del proto.metadata_props[i]
    value = json.dumps({"sha256": _onnx_digest(proto), "producer": proto.producer_name})
    digest = proto.metadata_props.add()
    digest.key, digest.value = DIGEST_PROP, value


def _onnx_digest(proto: Any) -> str:
    """sha256 of ``proto`` serialized without its digest entry (deterministically: protobuf
    writes known fields in field order, so a file read back serializes to the same bytes).
    The entry is taken out of ``proto`` for the serialization and put back in its place, so
    the graph (a model's weights) is not copied."""
    props = [(p.key, p.value) for p in proto.metadata_props]
    del proto.metadata_props[:]
    try:
        for key, value in props:
            if key != DIGEST_PROP:
                proto.metadata_props.add(key=key, value=value)
        return hashlib.sha256(proto.SerializeToString(deterministic=True)).hexdigest()
    finally:
        del proto.metadata_props[:]
        for key, value in props:
            proto.metadata_props.add(key=key, value=value)


def onnx_digest_problem(proto: Any, required: bool = False) -> str | None:
    """Why an ONNX file inq wrote does not match the digest written with it (a byte flipped, a
    weight edited, a node added), or None if it does.

    The digest (:data:`DIGEST_PROP`) records the file's producer: a tool that rewrites an inq
    export as its own file (ONNX Runtime's ``quantize_static`` copies the metadata and names
    itself the producer) made another file, not a modified one, and it is not checked. Nor is a
    file with no digest (another exporter's, or inq's from before it signed its ONNX files),
    unless ``required`` (``inq verify``).

    Example:
        >>> from onnx import helper
        >>> proto = helper.make_model(helper.make_graph([], "g", [], []))
        >>> onnx_digest_problem(proto) is None  # not an inq file
        True
        >>> _sign(proto)
        >>> onnx_digest_problem(proto) is None
        True
        >>> proto.graph.name = "h"
        >>> onnx_digest_problem(proto)  # doctest: +ELLIPSIS
        'the contents do not match their sha256 digest: the file was modified after it was written'
        >>> proto.producer_name = "onnx.quantize"  # another tool's file, made from inq's
        >>> onnx_digest_problem(proto) is None
        True
    """
    props = {p.key: p.value for p in proto.metadata_props}
    if DIGEST_PROP not in props:
        if not required:
            return None
        return f"no sha256 digest ({DIGEST_PROP}) in its metadata: not written by inq, or edited"
    try:
        recorded = json.loads(props[DIGEST_PROP])
        digest, producer = recorded["sha256"], recorded["producer"]
    except (ValueError, TypeError, KeyError):
        return f"its sha256 digest ({DIGEST_PROP}) is not what inq writes: edited"
    if producer != proto.producer_name and not required:
        return None
    return MODIFIED if _onnx_digest(proto) != digest else None


def unchecked_digest(proto: Any) -> str | None:
    """Why :func:`onnx_digest_problem` did not check a file that records inq's descriptions:
    it has no digest, or another tool rewrote it (the producer changed); None if it checked it,
    or for a file with nothing of inq's.

    Example:
        >>> from onnx import helper
        >>> proto = helper.make_model(helper.make_graph([], "g", [], []), producer_name="inq")
        >>> _ = proto.metadata_props.add(key="inq_model", value="{}")
        >>> unchecked_digest(proto)
        'no sha256 digest: not checked'
        >>> _sign(proto)
        >>> unchecked_digest(proto) is None
        True
        >>> proto.producer_name = "onnx.quantize"
        >>> unchecked_digest(proto)
        "made from an inq export by 'onnx.quantize': its digest not checked"
    """
    props = {p.key: p.value for p in proto.metadata_props}
    if DIGEST_PROP not in props:
        return "no sha256 digest: not checked" if any(k.startswith("inq_") for k in props) else None
    try:
        producer = json.loads(props[DIGEST_PROP])["producer"]
    except (ValueError, TypeError, KeyError):
        return None  # a digest inq cannot read is a problem of onnx_digest_problem's
    if producer == proto.producer_name:
        return None
    return f"made from an inq export by {proto.producer_name!r}: its digest not checked"


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
    """Write the Q/DQ ONNX graph of an integer model for inputs ``[batch, *input_shape]``, in
    TensorRT's form where the model's activations are symmetric (``info["symmetric"]``,
    :mod:`inq.deploy.tensorrt`), else the uint8 form; returns ``{"opset", "nodes",
    "initializers", "bytes", "int8_layers", "float_layers", "form"}`` (how many conv/linear
    layers have int8 weights, how many keep float weights; ``"tensorrt"`` or ``"uint8"``).

    Raises:
        ValueError: if the onnx extra is missing, an op has no ONNX form here, or (a bug) the
            TensorRT form breaks one of TensorRT's rules.
    """
    onnx, _ = _modules()
    symmetric = model.info.get("symmetric") is True
    if symmetric:  # TensorRT's form
        graph: QdqGraph = SymmetricQdqGraph(onnx, readers(model))
    else:
        graph = QdqGraph(onnx)
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


class OnnxModel(nn.Module):
    """An ONNX file run by ONNX Runtime on the CPU, as a module: float input, float logits.

    ``model`` and ``data`` are the descriptions the file records (``{}`` if it records none).
    ``proto``: the file's ``ModelProto`` where the caller has loaded it (:func:`load_onnx`).

    Raises:
        ValueError: if the file cannot be read or the onnx extra is missing.
    """

    def __init__(self, path: str | os.PathLike[str], proto: Any = None) -> None:
        super().__init__()
        proto = load_onnx(path) if proto is None else proto
        self.session = self.open(path, proto)
        self.model, self.data = recorded_descriptions(proto, path)
        self.opset = next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")),
                          None)  # fmt: skip
        self.nodes, self.initializers = len(proto.graph.node), len(proto.graph.initializer)
        self.signature = self.ends()
        _, self.input, _, dims = self.signature[0]
        self.input_shape = [d if isinstance(d, int) else None for d in dims]

    def open(self, path: str | os.PathLike[str], proto: Any) -> Any:
        """The session that runs the file: ONNX Runtime's, on the CPU."""
        _, ort = _modules()
        try:
            model = proto.SerializeToString()
            return ort.InferenceSession(model, providers=["CPUExecutionProvider"])
        except Exception as err:  # onnx and onnxruntime raise their own kinds
            raise ValueError(f"{path}: cannot load as ONNX ({err})") from None

    def ends(self) -> list[tuple[str, str, str, list[Any]]]:
        """``(input/output, name, element type, dims: sizes, or names where free)`` of each of
        the graph's inputs, then outputs."""
        ends = (("input", self.session.get_inputs()), ("output", self.session.get_outputs()))
        return [(role, v.name, v.type, v.shape) for role, values in ends for v in values]

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


def load_onnx(path: str | os.PathLike[str], check: bool = True) -> Any:
    """The ``ModelProto`` of the ONNX file at ``path`` (external data not loaded), refused if
    inq wrote it and it no longer matches its digest (:func:`onnx_digest_problem`), unless
    ``check`` is off (``inq verify`` reports that itself).

    Raises:
        ValueError: if the file cannot be read as ONNX, does not match its digest, or the onnx
            extra is missing.
    """
    onnx, _ = _modules()
    try:
        proto = onnx.load(str(path), load_external_data=False)
    except Exception as err:  # onnx raises its own kinds
        raise ValueError(f"{path}: cannot load as ONNX ({err})") from None
    problem = onnx_digest_problem(proto) if check else None
    if problem is not None:
        raise ValueError(f"{path}: {problem}")
    return proto


def is_onnx(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` names an ONNX file (by its suffix)."""
    return Path(path).suffix == ".onnx"


def _write(job: Job) -> list[str]:
    """``inq export --onnx``: the float-activation graph of a packed model (or a masked
    checkpoint, packed in memory), or the Q/DQ graph of an integer model."""
    if job.header.kind == INTEGER_MODEL:  # the integer model: Q/DQ
        int_model = open_artefact(job.header)
        data = job.data(int_model.info.get("data", {}))
        int_model.info["data"] = data
        stats = export_qdq(int_model, job.output, input_shape(data))
        read = job.source
        form = (
            "TensorRT form: int8, zero point 0, checked against TensorRT's parser rules"
            if stats["form"] == "tensorrt"
            else "uint8 form; for TensorRT calibrate with --symmetric"
        )
        what = (
            f"Q/DQ graph of the integer model ({form}), {stats['int8_layers']} conv/linear "
            f"layers with int8 weights, {stats['float_layers']} with exact float weights"
            + (" (integers beyond ±64)" if stats["float_layers"] else "")
        )
    else:
        packed, read = load_model(job.header)
        data = job.data(packed.data)
        packed.metadata["data"] = json.dumps(data)  # the file records what it was made for
        stats = export_onnx(packed, job.output, input_shape(data))
        what = "float activations, every quantized weight an exact initializer"
    return [
        f"{read} -> {job.args.output}: ONNX opset {stats['opset']}, dynamic batch, "
        f"{stats['nodes']} nodes, {stats['initializers']} initializers, {stats['bytes']} B; {what}"
    ]


def _check(path: Path) -> str | None:
    """An ONNX file inq wrote records no level sets: its digest is what ``inq verify`` checks."""
    return onnx_digest_problem(load_onnx(path, check=False), required=True)


TARGET = Target(
    name="onnx",
    help=f"write ONNX instead (opset 18, dynamic batch; -o FILE{_SUFFIX} needed): the "
    "float-activation model, or of an integer model (inq calibrate) its Q/DQ graph",
    source=Source((RUN, MASKED_CHECKPOINT, PACKED_FILE, INTEGER_MODEL)),
    output=f"FILE{_SUFFIX}",
    suffix=_SUFFIX,
    write=_write,
    check=_check,
)
