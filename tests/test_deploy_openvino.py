"""OpenVINO as a second CPU runtime (inq.deploy.openvino, ``inq eval --runtime openvino``): inq's
float and Q/DQ exports run there as in ONNX Runtime and the integer model, the int8-weight layers
in u8/i8 kernels, and what cannot run is one message. (``inq bench onnx --runtime``:
test_deploy_bench.py.) openvino is in the dev extra, as onnxruntime is: no skip."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import onnx
import pytest
import test_deploy_onnx
import torch
from deploy_helpers import shared_mobilenet_integer_model, shared_residual_integer_model
from export_fixtures import (
    SYNTHETIC_DATA,
    mobilenet_inputs,
    mobilenet_style,
    quantize,
)
from onnx import helper, numpy_helper

from inq.cli import main
from inq.deploy.onnx import OnnxModel, export_onnx, export_qdq
from inq.deploy.openvino import (
    LayerPrecision,
    OpenVinoModel,
    layer_precisions,
    openvino_version,
    precision_line,
)
from inq.deploy.qonnx import QONNX_DOMAIN
from inq.masked import load_masked, save_masked
from inq.packed import packed_from_masked
from inq.quant.integer import IntegerModel, save_integer
from inq.quant.pipeline import RealOutput

MOBILENET = {"name": "mobilenet_style", "num_classes": 10, "in_channels": 3}
SHAPE = (3, 16, 16)


@pytest.fixture(scope="module")
def exports(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A 5-bit MobileNetV2-style model exported both ways, recording the synthetic data: the
    float export, and the Q/DQ export of its integer model (3 layers with int8 weights, 9 whose
    integers exceed +-64 kept in float), with the integer model and the export's stats."""
    folder = tmp_path_factory.mktemp("openvino")
    model = mobilenet_style()
    save_masked(folder / "m.safetensors", model, quantize(model, 5), MOBILENET, SYNTHETIC_DATA)
    packed = packed_from_masked(load_masked(folder / "m.safetensors"))
    export_onnx(packed, folder / "m.onnx", SHAPE, model=mobilenet_style())
    _, int_model = shared_mobilenet_integer_model()
    save_integer(folder / "m.int.safetensors", int_model)
    stats = export_qdq(int_model, folder / "m.qdq.onnx", SHAPE)
    return {"folder": folder, "float": folder / "m.onnx", "qdq": folder / "m.qdq.onnx",
            "int_model": int_model, "stats": stats}  # fmt: skip


def test_the_float_export_runs_as_in_onnx_runtime(exports) -> None:
    """The same descriptions and input as OnnxModel reads; any batch (compiled once, dynamic);
    float32 throughout (INFERENCE_PRECISION_HINT=f32), so the logits are ORT's within float32
    rounding of different kernels (1e-4 of the largest), and every layer runs in f32."""
    ov, ort = OpenVinoModel(exports["float"]), OnnxModel(exports["float"])
    assert (ov.model, ov.data, ov.input) == (ort.model, ort.data, ort.input)
    assert ov.model == MOBILENET and ov.data["name"] == "synthetic"
    assert ov.input_shape == [None, *SHAPE] and (ov.opset, ov.nodes) == (ort.opset, ort.nodes)
    for batch in (5, 2):
        x = mobilenet_inputs(batch, seed=batch)
        want = ort(x)
        got = ov(x)
        assert got.shape == (batch, 10) and got.dtype == torch.float32
        assert float((got - want).abs().max()) <= 1e-4 * float(want.abs().max())
    layers = layer_precisions(ov.compiled)
    assert len(layers) == 12 and {x.precision for x in layers} == {"f32"}
    assert precision_line(layers) == "conv/linear: 0 int8, 12 f32"


def _int8_weights(proto: Any) -> dict[str, bool]:
    """Each Conv/Gemm node of a Q/DQ file (by its output): whether its weights are int8 (a
    DequantizeLinear of an int8 initializer), as export_qdq writes a QdqWeight.int8 layer."""
    producer = {out: node for node in proto.graph.node for out in node.output}
    int8 = {t.name for t in proto.graph.initializer if numpy_helper.to_array(t).dtype == "int8"}
    return {
        node.output[0]: (w := producer.get(node.input[1])) is not None
        and w.op_type == "DequantizeLinear" and w.input[0] in int8
        for node in proto.graph.node if node.op_type in ("Conv", "Gemm")
    }  # fmt: skip


def _runtime_layer(layers: list[LayerPrecision], output: str) -> list[LayerPrecision]:
    """The runtime layers an ONNX node's output was fused into (originalLayersNames names it,
    or a node OpenVINO derived from it, ``output/...``)."""

    def fused(name: str) -> bool:
        return name == output or name.startswith(f"{output}/")

    return [x for x in layers if any(map(fused, x.name.split(",")))]


@pytest.mark.parametrize("which", ["mobilenet", "residual", "mobilenet4-tensorrt",
                                   "residual-tensorrt"])  # fmt: skip
def test_int8_weight_layers_run_in_u8_or_i8(exports, which: str, tmp_path: Path) -> None:
    """The runtime model: each conv/linear whose weights the Q/DQ export writes as int8
    (export_qdq's int8_layers) runs in u8/i8; the float-weight ones run in f32. The residual
    model has negative multipliers and a quantized add; both activation forms (uint8, and
    TensorRT's int8 with zero point 0 from symmetric calibration)."""
    symmetric = which.endswith("tensorrt")
    path = tmp_path / "m.qdq.onnx"
    if which == "mobilenet":
        path, stats = exports["qdq"], exports["stats"]
    elif which.startswith("mobilenet4"):
        stats = export_qdq(shared_mobilenet_integer_model(bits=4, symmetric=True)[1], path, SHAPE)
    else:
        stats = export_qdq(shared_residual_integer_model(symmetric=symmetric), path, (2, 4, 4))
    assert stats["form"] == ("tensorrt" if symmetric else "uint8")
    weights = _int8_weights(onnx.load(str(path)))
    assert sum(weights.values()) == stats["int8_layers"] >= 2
    assert (
        len(weights) - stats["int8_layers"]
        == stats["float_layers"]
        >= (which != "mobilenet4-tensorrt")
    )
    layers = layer_precisions(OpenVinoModel(path).compiled)
    assert len(layers) == len(weights)
    for output, int8 in weights.items():
        found = _runtime_layer(layers, output)  # a float last layer may go by the output's name
        assert len(found) == 1 if int8 else len(found) <= 1, (output, layers)
        assert all(x.int8 == int8 for x in found), (output, found)
    assert [x.int8 for x in layers].count(True) == stats["int8_layers"]
    assert precision_line(layers).startswith(f"conv/linear: {stats['int8_layers']} int8 (")
    floats = f", {stats['float_layers']} f32" if stats["float_layers"] else " int8 ("
    assert floats in precision_line(layers) and precision_line(layers).count("f32") <= 1


def _ops_in_openvino(model: IntegerModel, shape: tuple[int, ...], folder: Path) -> list[str]:
    """test_deploy_onnx's per-op check (each conv, linear, average pool and clamp exported
    alone, fed the integer model's input value) with OpenVINO running the file."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(test_deploy_onnx, "OnnxModel", OpenVinoModel)
        return test_deploy_onnx._ops_within_one_step(model, shape, folder)


def test_each_op_is_the_integer_models_within_one_step(exports, tmp_path: Path) -> None:
    """The bound, as for ONNX Runtime: OpenVINO requantizes in float32 and rounds ties half to
    even (the integer model: half up), so each op's output integers are the integer model's
    within one step (one unit of the op's output scale), never more. Errors add up over a whole
    model, so it is checked per op; the whole Q/DQ model predicts the integer model's class."""
    kinds = _ops_in_openvino(exports["int_model"], SHAPE, tmp_path)
    assert kinds == ["conv"] * 11 + ["avgpool", "linear"]
    for symmetric in (False, True):
        assert _ops_in_openvino(shared_residual_integer_model(symmetric=symmetric), (2, 4, 4),
                                tmp_path) == ["conv", "conv", "avgpool", "linear"]  # fmt: skip
    _, symmetric_model = shared_mobilenet_integer_model(bits=4, symmetric=True)
    assert _ops_in_openvino(symmetric_model, SHAPE, tmp_path) == ["conv"] * 11 + [
        "avgpool",
        "linear",
    ]
    x = mobilenet_inputs(32, seed=3)
    got, want = OpenVinoModel(exports["qdq"])(x), RealOutput(exports["int_model"])(x)
    assert float((got.argmax(1) == want.argmax(1)).double().mean()) >= 30 / 32


def test_eval_runs_both_exports_in_openvino(exports, capsys) -> None:
    """inq eval --runtime openvino: where it runs, on the data the file records; the figures are
    ONNX Runtime's (the float export: the same classes; the Q/DQ export: within one image of
    the 32, one step of rounding can move a close logit)."""
    for kind in ("float", "qdq"):
        lines = {}
        for runtime in ("onnxruntime", "openvino"):
            argv = ["eval", str(exports[kind]), "--runtime", runtime, "--device", "cpu"]
            assert main(argv) == 0
            out = capsys.readouterr().out
            lines[runtime] = out
        assert f"m{'.qdq' if kind == 'qdq' else ''}.onnx (OpenVINO {openvino_version()}, CPU) " \
            "on synthetic (32 samples): accuracy " in lines["openvino"]  # fmt: skip
        assert "(ONNX Runtime, CPU) on synthetic (32 samples)" in lines["onnxruntime"]
        correct = {r: int(line.split("(")[-1].split("/")[0]) for r, line in lines.items()}
        # float32 sums in another order, or a tie rounded another way: a near-tie may flip
        assert abs(correct["openvino"] - correct["onnxruntime"]) <= 1, lines


def _one_node(path: Path, op: str, domain: str) -> None:
    """A one-node ONNX file [batch, 4] -> [batch, 4] that imports ``domain`` (version 1)."""
    graph = helper.make_graph(
        [helper.make_node(op, ["input"], ["logits"], domain=domain)], "one",
        [helper.make_tensor_value_info("input", onnx.TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("logits", onnx.TensorProto.FLOAT, ["batch", 4])],
    )  # fmt: skip
    opsets = [helper.make_opsetid("", 18), helper.make_opsetid(domain, 1)]
    onnx.save(helper.make_model(graph, opset_imports=opsets), path)


@pytest.mark.parametrize(
    ("file", "message"),
    [
        ("garbage.onnx", "garbage.onnx: cannot load as ONNX (Error parsing message"),
        ("empty.onnx", 'empty.onnx: OpenVINO cannot read it (Unable to read the model: "'),
        ("unknown.onnx", "unknown.onnx: OpenVINO cannot read it (-- No conversion rule found "
                         "for operations: com.example.Frobnicate)"),
        ("q.onnx", "q.onnx: a QONNX model (Quant nodes): OpenVINO cannot run it; evaluate it "
                   "with --runtime onnxruntime (qonnx's executor)"),
        ("INT", "--runtime openvino runs ONNX files; "),
    ],
)  # fmt: skip
def test_what_openvino_cannot_run_is_one_line(
    exports, tmp_path: Path, capsys, monkeypatch, file: str, message: str
) -> None:
    """Each refusal is one line through the CLI's error path (no traceback, none of OpenVINO's
    "Exception from src/..." lines, and no TensorFlow parse noise: a file that is not ONNX never
    reaches OpenVINO)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "garbage.onnx").write_bytes(b"not a model")
    (tmp_path / "empty.onnx").write_bytes(b"")  # parses as an empty ModelProto
    _one_node(tmp_path / "unknown.onnx", "Frobnicate", "com.example")  # no such op anywhere
    _one_node(tmp_path / "q.onnx", "Quant", QONNX_DOMAIN)  # a QONNX file
    path = str(exports["folder"] / "m.int.safetensors") if file == "INT" else file
    code = main(["eval", path, "--runtime", "openvino", "--device", "cpu", "--data", "synthetic"])
    out, err = capsys.readouterr()
    assert (code, out) == (1, "")
    assert err.startswith(f"inq eval: error: {message}") and err.count("\n") == 1, err
    assert "Exception from" not in err and "text_format" not in err


def test_without_the_openvino_module_one_message(exports, capsys, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "openvino", None)  # import openvino -> ImportError
    code = main(["eval", str(exports["qdq"]), "--runtime", "openvino", "--device", "cpu"])
    out, err = capsys.readouterr()
    assert (code, out) == (1, "")
    assert err == (
        "inq eval: error: --runtime openvino needs the openvino extra: pip install "
        "'inq[openvino]' (openvino is missing)\n"
    )
    assert main(["eval", str(exports["qdq"]), "--device", "cpu"]) == 0  # ORT needs none of it
    assert "(ONNX Runtime, CPU)" in capsys.readouterr().out
