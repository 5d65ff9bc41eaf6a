"""TensorRT's Q/DQ form (inq.deploy.tensorrt): symmetric calibration, an export that passes the
rule check of TensorRT's ONNX parser, runs every int8-weight layer in ONNX Runtime's integer
kernels and computes each op within one step of the integer model; each broken rule names its
node."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import numpy as np
import onnx
import onnxruntime
import pytest
import torch
from deploy_helpers import (
    shared_digits_run,
    shared_integer,
    shared_mobilenet_integer_model,
    shared_residual_integer_model,
)
from onnx import TensorProto, helper, numpy_helper
from test_deploy_onnx import _accuracy, _layers, _ops_within_one_step

from inq.cli import main
from inq.deploy.bench import read_file
from inq.deploy.onnx import OnnxModel, export_qdq
from inq.deploy.tensorrt import trt_problems
from inq.quant.integer import IntegerModel, load_integer
from inq.quant.pipeline import RealOutput


@pytest.fixture(scope="module")
def digits4(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, IntegerModel, Path, str]:
    """A 4-bit digits run, ``inq calibrate --symmetric`` of it, the TensorRT-form export of that
    and what ``inq export`` printed."""
    folder = tmp_path_factory.mktemp("trt")
    masked, _ = shared_digits_run(folder, bits=4, epochs=2)
    int_file, path = folder / "d.int.safetensors", folder / "d.trt.onnx"
    with contextlib.redirect_stdout(io.StringIO()) as out:
        argv = ["calibrate", str(masked), "--symmetric", "--data", "digits", "-o", str(int_file)]
        assert main(argv) == 0
        assert main(["export", str(int_file), "--onnx", "-o", str(path)]) == 0
    return masked, load_integer(int_file), path, out.getvalue()


def test_calibrate_symmetric_records_it_and_export_writes_the_tensorrt_form(digits4) -> None:
    _, model, path, printed = digits4
    assert model.info["symmetric"] is True
    assert "power-of-two scales, symmetric: TensorRT form)" in printed
    assert "(TensorRT form: int8, zero point 0, checked against TensorRT's parser" in printed
    proto = onnx.load(str(path))
    assert trt_problems(proto) == []
    zero_points = [
        numpy_helper.to_array(t) for t in proto.graph.initializer if t.name.startswith("zero")
    ]
    assert zero_points and all(z.dtype == np.int8 and not z.any() for z in zero_points)
    assert all(node.name for node in proto.graph.node)


def test_every_int8_layer_runs_in_an_integer_kernel_as_in_the_uint8_form(
    digits4, tmp_path: Path
) -> None:
    """The same layers as the uint8 export of the run's unsigned integer model (all 4 at 4
    bits); no float bias is left on an int8 layer (ONNX Runtime made it int32 again)."""
    masked, model, path, _ = digits4
    unsigned = shared_integer(masked)  # quantize_on(..., QuantSettings(act_bits=8)), once
    export_qdq(unsigned, tmp_path / "u.onnx", (1, 8, 8))
    ops, uint8_ops = read_file(path, tmp_path).ops, read_file(tmp_path / "u.onnx", tmp_path).ops
    assert sum(ops.integer.values()) == sum(w.int8 for w in _layers(model)) == 4
    assert ops.integer == uint8_ops.integer and not ops.float


def test_each_op_is_the_integer_models_within_one_step(digits4, tmp_path: Path) -> None:
    """As the uint8 form (ONNX Runtime rounds ties to even, the integer model half up)."""
    kinds = _ops_within_one_step(digits4[1], (1, 8, 8), tmp_path)
    assert kinds == [*["conv"] * 3, "avgpool", "linear"]


def test_the_export_keeps_the_integer_models_accuracy(digits4) -> None:
    """Within 0.3 points (one digit image of 450 is 0.22)."""
    _, model, path, _ = digits4
    assert abs(_accuracy(OnnxModel(path)) - _accuracy(RealOutput(model))) <= 0.003


def _adds_within_one_step(model: IntegerModel, shape: tuple[int, ...], folder: Path) -> int:
    """Cut each add out of the whole model's TensorRT-form file, from the float values its
    inputs' QuantizeLinear read to its own value after its Q/DQ pair (and its Relu/Clip), feed
    it the integer model's input values times their scales (exact in float32) and check its
    values are the integer model's within one step; returns how many adds were checked."""
    values = model.run(torch.randn(64, *shape, generator=torch.Generator().manual_seed(0)))
    export_qdq(model, folder / "whole.onnx", shape)
    nodes = onnx.load(str(folder / "whole.onnx")).graph.node
    producer = {out: node for node in nodes for out in node.output}
    reader = {i: node for node in nodes for i in node.input}
    ops = {op.name: op for op in model.ops}
    checked = 0
    for op in (op for op in model.ops if op.op == "add"):
        add = next(n for n in nodes if n.op_type == "Add" and n.name.rsplit("_", 1)[0] == op.name)
        feeds = [producer[producer[i].input[0]].input[0] for i in add.input]  # float <- Q <- DQ
        out = add.output[0]
        while not producer[out].name.startswith(f"{op.name}_dq"):
            out = reader[out].output[0]
        after = reader.get(out)
        if after is not None and after.name.rsplit("_", 1)[0] == op.name:  # its Relu/Clip
            out = after.output[0]
        onnx.utils.extract_model(str(folder / "whole.onnx"), str(folder / "add.onnx"), feeds, [out])
        session = onnxruntime.InferenceSession(
            str(folder / "add.onnx"), providers=["CPUExecutionProvider"]
        )
        inputs = {name: (values[i].double() * ops[i].attrs["scale"]).float().numpy()
                  for name, i in zip(feeds, op.inputs, strict=True)}  # fmt: skip
        (got,) = session.run([out], inputs)
        steps = torch.from_numpy(got).double() / op.attrs["scale"]
        assert float((steps - values[op.name].double()).abs().max()) <= 1, op.name
        checked += 1
    return checked


def test_residual_and_relu6_models_pass_and_stay_within_one_step(tmp_path: Path) -> None:
    """Negative multipliers, a 5-bit conv with float weights (its input through a Clip to the
    float range, kept float by ONNX Runtime), a residual add read twice, ReLU6 clamps (Clip
    after the Q/DQ pair) and mixed Relu: the rules hold, ONNX Runtime fuses the same layers as
    in the uint8 form, every op is within one step."""
    residual = shared_residual_integer_model(symmetric=True)
    assert [w.int8 for w in _layers(residual)] == [False, True, True]
    stats = export_qdq(residual, tmp_path / "r.onnx", (2, 4, 4))
    assert (stats["form"], stats["int8_layers"], stats["float_layers"]) == ("tensorrt", 2, 1)
    ops = read_file(tmp_path / "r.onnx", tmp_path).ops
    assert ops.integer == {"QLinearConv": 1, "QGemm": 1} and ops.float == {"Conv": 1}
    assert _ops_within_one_step(residual, (2, 4, 4), tmp_path) == [
        "conv", "conv", "avgpool", "linear"
    ]  # fmt: skip
    assert _adds_within_one_step(residual, (2, 4, 4), tmp_path) == 1
    _, mobilenet = shared_mobilenet_integer_model(bits=4, symmetric=True)
    layers = [op for op in mobilenet.ops if op.op in ("conv", "linear")]
    export_qdq(mobilenet, tmp_path / "m.onnx", (3, 16, 16))
    assert trt_problems(onnx.load(str(tmp_path / "m.onnx"))) == []
    ops = read_file(tmp_path / "m.onnx", tmp_path).ops
    assert sum(ops.integer.values()) == len(layers) and not ops.float
    assert _adds_within_one_step(mobilenet, (3, 16, 16), tmp_path) >= 1


def _model(nodes: list, inits: list, opset: int = 18) -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 4, 4])
    y = helper.make_tensor_value_info(nodes[-1].output[0], TensorProto.FLOAT, None)
    graph = helper.make_graph(nodes, "g", [x], [y], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _const(name: str, value: object, dtype: type = np.float32) -> onnx.TensorProto:
    return numpy_helper.from_array(np.array(value, dtype), name)


def _qdq(zero: onnx.TensorProto) -> tuple[list, list]:
    """x -> Q -> DQ -> MaxPool, with the zero point ``zero``."""
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "s", zero.name], ["q"], name="q"),
        helper.make_node("DequantizeLinear", ["q", "s", zero.name], ["d"], name="d"),
        helper.make_node("MaxPool", ["d"], ["y"], name="pool", kernel_shape=[2, 2]),
    ]
    return nodes, [_const("s", 0.5), zero]


def test_a_valid_graph_passes() -> None:
    nodes, inits = _qdq(_const("z", 0, np.int8))
    assert trt_problems(_model(nodes, inits)) == []


@pytest.mark.parametrize(
    ("mutate", "where", "rule"),
    [
        (lambda n, i: i.__setitem__(1, _const("z", 128, np.uint8)), "q", "zero point: uint8"),
        (lambda n, i: i.__setitem__(1, _const("z", 3, np.int8)), "q", "not all zero"),
        (lambda n, i: i.__setitem__(0, _const("s", 0.0)), "q", "finite and > 0"),
        (lambda n, i: i.__setitem__(0, _const("s", [0.5, 0.5])), "q", "per-axis"),
        (lambda n, i: n[2].input.__setitem__(0, "q"), "q", "goes only to DequantizeLinear"),
        (lambda n, i: n[2].input.__setitem__(0, "q"), "pool", "reads the int8 tensor 'q'"),
        (lambda n, i: n.__setitem__(2, helper.make_node(
            "MaxPool", ["d"], ["y"], name="pool", kernel_shape=[2, 2], dilations=[2, 2])),
         "pool", "dilations must be empty or all ones"),
        (lambda n, i: n.__setitem__(2, helper.make_node(
            "QLinearAdd", ["d"], ["y"], name="qadd", domain="com.microsoft")),
         "qadd", "contrib domain"),
        (lambda n, i: n.__setitem__(2, helper.make_node("Cast", ["d"], ["y"], to=1)),
         "y", "not an op TensorRT's ONNX parser takes"),
        (lambda n, i: n[0].input.__delitem__(2), "q", "without a zero point"),
    ],
)  # fmt: skip
def test_each_broken_rule_names_its_node(mutate, where: str, rule: str) -> None:
    nodes, inits = _qdq(_const("z", 0, np.int8))
    mutate(nodes, inits)
    problems = trt_problems(_model(nodes, inits))
    assert any(node == where and rule in text for node, text in problems), problems


def test_an_int32_bias_and_an_int8_weight_on_the_wrong_axis_are_named() -> None:
    w = _const("w", np.ones((2, 1, 1, 1)), np.int8)
    nodes = [
        helper.make_node("DequantizeLinear", ["w", "ws", "wz"], ["wd"], name="wdq", axis=1),
        helper.make_node("DequantizeLinear", ["b", "bs", "bz"], ["bd"], name="bdq", axis=0),
        helper.make_node("Conv", ["x", "wd", "bd"], ["y"], name="conv"),
    ]
    inits = [w, _const("ws", [0.5, 0.5]), _const("wz", [0, 0], np.int8),
             _const("b", [1, 2], np.int32), _const("bs", [0.25, 0.25]),
             _const("bz", [0, 0], np.int32)]  # fmt: skip
    problems = dict(trt_problems(_model(nodes, inits)))
    assert "per-axis" in problems["wdq"]
    assert "data: int32" in problems["bdq"] or "zero point: int32" in problems["bdq"]
    assert "bias 'bd': not a float initializer" in problems["conv"]


def test_int8_weights_without_dequantize_and_a_newer_opset_are_named() -> None:
    nodes = [helper.make_node("Conv", ["x", "w"], ["y"], name="conv")]
    w = _const("w", np.ones((2, 1, 1, 1)), np.int8)
    problems = trt_problems(_model(nodes, [w], opset=21))
    assert ("conv", "Conv reads the int8 tensor 'w': TensorRT's ops take int8 only through "
            "DequantizeLinear [ops]") in problems  # fmt: skip
    assert ("model", "opset 21: TensorRT 10.0's parser takes opsets 9-20 [ops]") in problems
