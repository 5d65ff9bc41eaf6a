"""OpenVINO as a second CPU runtime for the ONNX exports (``--runtime openvino``).

:class:`OpenVinoModel` runs an ONNX file in OpenVINO's CPU plugin where :class:`OnnxModel`
runs it in ONNX Runtime (``inq eval FILE.onnx --runtime openvino``); :func:`read_onnx` and
:func:`compile_onnx` read and compile a file (``inq bench onnx --runtime openvino``);
:func:`layer_precisions` reads from the compiled (runtime) model which precision each
convolution and linear layer runs in, and :func:`precision_line` sums that up in one line.

Every compile sets ``INFERENCE_PRECISION_HINT=f32``: on bf16-capable CPUs the CPU plugin would
otherwise run float layers in bfloat16. A file is loaded with :func:`inq.deploy.onnx.load_onnx`
first, so OpenVINO only ever sees a valid ONNX file; a QONNX file (``Quant`` nodes) is refused.

Example::

    model = OpenVinoModel("model.qdq.onnx")
    logits = model(torch.randn(8, 3, 32, 32))
    print(precision_line(layer_precisions(model.compiled)))
    # conv/linear: 20 int8 (19 u8, 1 i8), 1 f32
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from inq.deploy.onnx import OnnxModel, load_onnx
from inq.deploy.qonnx import is_qonnx

__all__ = [
    "CONV_LINEAR",
    "F32",
    "INT8",
    "RUNTIMES",
    "LayerPrecision",
    "OpenVinoModel",
    "OpenVinoSession",
    "compile_onnx",
    "layer_precisions",
    "openvino",
    "openvino_version",
    "precision_line",
    "read_onnx",
]

RUNTIMES = ("onnxruntime", "openvino")  # the CPU runtimes of an ONNX file, the default first
CONV_LINEAR = frozenset({"Convolution", "GroupConvolution", "FullyConnected", "MatMul"})
INT8 = frozenset({"u8", "i8"})  # runtime precisions of a layer that runs in int8
F32 = {"INFERENCE_PRECISION_HINT": "f32"}  # float layers in float32, also on bf16 CPUs
_NOISE = ("Exception from", "Check '")  # OpenVINO's lines that name its own source files


def openvino() -> Any:
    """The ``openvino`` module, or one message naming the extra that brings it.

    Raises:
        ValueError: ``--runtime openvino needs the openvino extra: pip install
            'inq[openvino]' (openvino is missing)``.
    """
    try:
        import openvino as ov
    except ImportError as err:
        raise ValueError(
            "--runtime openvino needs the openvino extra: pip install 'inq[openvino]' "
            f"({err.name or 'openvino'} is missing)"
        ) from None
    return ov


def openvino_version() -> str:
    """OpenVINO's release, e.g. ``2026.4.1`` (its build suffix dropped)."""
    return str(openvino().__version__).split("-")[0]


def _cannot_read(
    path: str | os.PathLike[str], err: BaseException, what: str = "read it"
) -> ValueError:
    """One line for an OpenVINO error: its last line that says something (its first lines
    name OpenVINO's source files)."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    meaningful = [line for line in lines if not line.startswith(_NOISE)]
    why = (meaningful or lines or [type(err).__name__])[-1]
    return ValueError(f"{path}: OpenVINO cannot {what} ({why})")


def read_onnx(path: str | os.PathLike[str], proto: Any = None) -> Any:
    """The ONNX file at ``path`` read by OpenVINO (an ``openvino.Model``), after
    :func:`inq.deploy.onnx.load_onnx` has read it as valid ONNX. ``proto``: the file's
    ``ModelProto`` where the caller has loaded it.

    Example::

        model = read_onnx("model.onnx")
        compiled = compile_onnx(model, "model.onnx", batch=1)

    Raises:
        ValueError: the openvino extra is missing, the file is not valid ONNX, is a QONNX file,
            or OpenVINO cannot read it.
    """
    ov = openvino()
    proto = load_onnx(path) if proto is None else proto
    if is_qonnx(proto):
        raise ValueError(
            f"{path}: a QONNX model (Quant nodes): OpenVINO cannot run it; evaluate it with "
            "--runtime onnxruntime (qonnx's executor)"
        )
    try:
        return ov.Core().read_model(str(path))
    except Exception as err:  # OpenVINO raises RuntimeError and its own kinds
        raise _cannot_read(path, err) from None


def compile_onnx(
    model: Any,
    path: str | os.PathLike[str],
    batch: int | None = None,
    config: Mapping[str, Any] | None = None,
) -> Any:
    """``model`` (:func:`read_onnx` of ``path``) compiled for OpenVINO's CPU plugin (a
    ``CompiledModel``): its batch dimension as read (dynamic in inq's exports), or fixed to
    ``batch``; ``config`` on top of :data:`F32`.

    Example::

        compiled = compile_onnx(read_onnx("model.onnx"), "model.onnx", batch=1,
                                config={"INFERENCE_NUM_THREADS": 1})
        logits = compiled({0: x})[0]

    Raises:
        ValueError: OpenVINO cannot compile it (at that batch).
    """
    try:
        if batch is not None:
            shape = model.input(0).get_partial_shape()
            shape[0] = batch
            model.reshape({model.input(0): shape})
        return openvino().Core().compile_model(model, "CPU", {**F32, **(config or {})})
    except Exception as err:  # OpenVINO raises RuntimeError and its own kinds
        raise _cannot_read(path, err, "compile it") from None


class OpenVinoSession:
    """A compiled OpenVINO model behind ONNX Runtime's ``InferenceSession.run`` (one infer
    request, reused), so that code written for a session runs it too.

    Example::

        session = OpenVinoSession(compile_onnx(read_onnx("model.onnx"), "model.onnx"))
        (logits,) = session.run(None, {"input": x})
    """

    def __init__(self, compiled: Any) -> None:
        self.compiled = compiled
        self.request = compiled.create_infer_request()

    def run(self, output_names: Sequence[str] | None, feed: Mapping[str, np.ndarray]) -> list[Any]:
        """Every output for the inputs ``feed`` (by name); ``output_names`` is ignored."""
        result = self.request.infer(dict(feed))
        return [result[output] for output in self.compiled.outputs]


class OpenVinoModel(OnnxModel):
    """An ONNX file run by OpenVINO on the CPU, as a module: float input, float logits. It has
    :class:`~inq.deploy.onnx.OnnxModel`'s attributes (``model``, ``data``, ``opset``,
    ``nodes``, ``initializers``, ``signature``, ``input``, ``input_shape``) and forward; the
    compiled model (``compiled``) takes any batch. ``proto``: the file's ``ModelProto`` where
    the caller has loaded it.

    Example::

        model = OpenVinoModel("model.qdq.onnx")
        logits = model(torch.randn(8, 3, 32, 32))

    Raises:
        ValueError: as :func:`read_onnx` and :func:`compile_onnx`.
    """

    def open(self, path: str | os.PathLike[str], proto: Any) -> Any:
        self.compiled = compile_onnx(read_onnx(path, proto), path)
        return OpenVinoSession(self.compiled)

    def ends(self) -> list[tuple[str, str, str, list[Any]]]:
        ends = (("input", self.compiled.inputs), ("output", self.compiled.outputs))
        return [
            (role, port.get_any_name(), port.get_element_type().get_type_name(), _dims(port))
            for role, ports in ends
            for port in ports
        ]


def _dims(port: Any) -> list[int | None]:
    return [d.get_length() if d.is_static else None for d in port.get_partial_shape()]


@dataclass(frozen=True)
class LayerPrecision:
    """A convolution or linear layer of OpenVINO's runtime model: its ``name`` (the ONNX nodes
    fused into it, ``originalLayersNames``), ``layer_type`` (``Convolution``, ...),
    ``precision`` (``runtimePrecision``: ``u8``, ``i8``, ``f32``, ...) and ``primitive`` (the
    kernel, ``primitiveType``)."""

    name: str
    layer_type: str
    precision: str
    primitive: str

    @property
    def int8(self) -> bool:
        """Whether the layer runs in int8 (runtime precision ``u8`` or ``i8``)."""
        return self.precision in INT8


def layer_precisions(compiled: Any) -> list[LayerPrecision]:
    """The convolution and linear layers (:data:`CONV_LINEAR`) of a compiled model's runtime
    model, in execution order, with the precision each runs in. (The runtime model has them
    without ``PERF_COUNT``.)

    Example::

        compiled = compile_onnx(read_onnx("model.qdq.onnx"), "model.qdq.onnx")
        for layer in layer_precisions(compiled):
            print(layer.name, layer.precision, layer.primitive)
    """
    layers = []
    for op in compiled.get_runtime_model().get_ordered_ops():
        info = op.get_rt_info()
        kind = info["layerType"].astype(str)
        if kind in CONV_LINEAR:
            layers.append(LayerPrecision(
                info["originalLayersNames"].astype(str) or op.get_friendly_name(), kind,
                info["runtimePrecision"].astype(str), info["primitiveType"].astype(str),
            ))  # fmt: skip
    return layers


def precision_line(layers: Sequence[LayerPrecision]) -> str:
    """One line: how many conv/linear layers run in int8 (by precision), then in each other
    precision.

    Example:
        >>> layers = [LayerPrecision("a", "Convolution", "u8", "jit_avx2_I8"),
        ...           LayerPrecision("b", "FullyConnected", "i8", "jit_gemm_i8"),
        ...           LayerPrecision("c", "Convolution", "f32", "brgconv_avx2_f32")]
        >>> precision_line(layers)
        'conv/linear: 2 int8 (1 u8, 1 i8), 1 f32'
        >>> precision_line(layers[2:])
        'conv/linear: 0 int8, 1 f32'
    """
    counts = Counter(layer.precision for layer in layers).most_common()
    int8 = [f"{n} {p}" for p, n in counts if p in INT8]
    total = sum(n for p, n in counts if p in INT8)
    head = f"conv/linear: {total} int8" + (f" ({', '.join(int8)})" if int8 else "")
    return ", ".join([head, *(f"{n} {p}" for p, n in counts if p not in INT8)])
