"""ONNX export of an INQ model, and its evaluation in ONNX Runtime (the ``onnx`` extra).

:func:`export_onnx` writes the float-activation network of a packed model: the graph that
``torch.onnx.export`` (the ``torch.export``-based exporter, opset :data:`OPSET`) makes of the
model rebuilt from the file, with the input's batch dimension dynamic (``batch``) and the
power-of-two weights as initializers named by their state-dict keys. The export is checked
before it is written: ``onnx.checker`` passes, and every quantized weight is an initializer
equal to its decoded codes bit for bit (an exporter that folded BatchNorm into a weight would
be refused). The file records the model and data descriptions in its ``metadata_props``, so
``inq eval model.onnx`` evaluates it on the run's data.

Example (shell)::

    inq export outputs/run --onnx -o model.onnx
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

from inq.io import atomic_path
from inq.packed import PackedFile

__all__ = ["OPSET", "OnnxModel", "export_onnx", "is_onnx"]

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
        ValueError: if the onnx extra is missing, the exporter cannot express a layer, or the
            export changed a quantized weight.
    """
    onnx, _ = _modules()
    from inq.train.models import build_model  # the model zoo rebuilds the architecture

    model = build_model(packed.model) if model is None else model
    model.load_state_dict(packed.state_dict())
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
    proto.metadata_props.extend(
        onnx.StringStringEntryProto(key=key, value=json.dumps(value))
        for key, value in (("inq_model", packed.model), ("inq_data", packed.data))
    )
    onnx.checker.check_model(proto)
    _check_weights(proto, packed, onnx)
    data = proto.SerializeToString()
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)
    return {
        "opset": OPSET,
        "nodes": len(proto.graph.node),
        "initializers": len(proto.graph.initializer),
        "bytes": len(data),
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
        self.input = self.session.get_inputs()[0].name

    def forward(self, x: Tensor) -> Tensor:
        out = self.session.run(None, {self.input: x.detach().cpu().float().numpy()})[0]
        return torch.from_numpy(out)


def is_onnx(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` names an ONNX file (by its suffix)."""
    return Path(path).suffix == ".onnx"
