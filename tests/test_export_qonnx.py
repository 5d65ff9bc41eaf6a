"""QONNX export (inq.export_qonnx): qonnx's own executor computes the integer model bit for bit
(digits at 2, 4 and 5 bits on the whole test split, a residual block with negative multipliers,
a MobileNet-style block with ReLU6 and depthwise convs), every weight an exact power of two
behind its Quant node, and one clear refusal where the exact form does not exist."""

from __future__ import annotations

import contextlib
import copy
import io
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from export_fixtures import (
    DIGITS_DATA,
    digits_run,
    mobilenet_inputs,
    mobilenet_integer_model,
    quantize_on,
    residual_integer_model,
)
from onnx import numpy_helper

from inq.cli import main
from inq.data import build_datasets
from inq.export_qonnx import export_qonnx, qonnx_graph, run_qonnx
from inq.masked import load_masked
from inq.packed import packed_from_masked
from inq.quant.integer import IntegerModel, save_integer
from inq.quant.pipeline import QuantSettings


def _expected(model: IntegerModel, x: torch.Tensor) -> np.ndarray:
    return (model(x).double() * model.output_scale()).numpy()


@pytest.fixture(scope="module", params=[2, 4, 5])
def digits(request, tmp_path_factory: pytest.TempPathFactory) -> tuple[IntegerModel, Path]:
    """A digits run at 2, 4 and 5 bits, its integer model (8-bit activations) and its file."""
    folder = tmp_path_factory.mktemp(f"qonnx{request.param}")
    masked, _ = digits_run(folder, bits=request.param, epochs=2)
    packed = packed_from_masked(load_masked(masked))
    model, _ = quantize_on(packed, DIGITS_DATA, QuantSettings(act_bits=8))
    save_integer(folder / "d.int.safetensors", model)
    return model, folder / "d.int.safetensors"


def test_qonnx_executor_equals_the_integer_model_on_the_whole_test_split(digits) -> None:
    model, _ = digits
    x, _ = build_datasets(DIGITS_DATA)[1].tensors
    got = run_qonnx(qonnx_graph(model), x.numpy())
    expected = _expected(model, x)
    assert got.shape == (450, 10) and int((got != expected).sum()) == 0


def test_a_residual_block_and_relu6_blocks_are_exact_too() -> None:
    residual = residual_integer_model()
    x = 2 * torch.randn(64, 2, 4, 4, generator=torch.Generator().manual_seed(1))
    assert np.array_equal(run_qonnx(qonnx_graph(residual, shape=(2, 4, 4)), x.numpy()),
                          _expected(residual, x))  # fmt: skip
    _, mobilenet = mobilenet_integer_model()
    x = mobilenet_inputs(32, seed=3)
    assert np.array_equal(run_qonnx(qonnx_graph(mobilenet, shape=(3, 16, 16)), x.numpy()),
                          _expected(mobilenet, x))  # fmt: skip


def test_every_weight_is_a_power_of_two_behind_its_quant_node(digits) -> None:
    model, _ = digits
    proto = qonnx_graph(model)
    made_by = {out: node for node in proto.graph.node for out in node.output}
    values = {init.name: numpy_helper.to_array(init) for init in proto.graph.initializer}
    layers = [node for node in proto.graph.node if node.op_type in ("Conv", "Gemm")]
    assert len(layers) == sum(op.op in ("conv", "linear") for op in model.ops)
    for layer in layers:
        quant = made_by[layer.input[1]]
        assert quant.op_type == "Quant" and quant.domain == "qonnx.custom_op.general"
        weight, scale = values[quant.input[0]], float(values[quant.input[1]])
        ints = weight.astype(np.float64) / scale
        magnitudes = np.abs(ints[ints != 0])
        assert np.array_equal(ints, np.round(ints))  # on the Quant node's grid
        assert np.array_equal(magnitudes, 2.0 ** np.round(np.log2(magnitudes)))  # powers of two


def test_inq_export_qonnx_writes_a_file_qonnx_takes(digits, tmp_path: Path) -> None:
    model, int_file = digits
    out = tmp_path / "d.qonnx.onnx"
    with contextlib.redirect_stdout(io.StringIO()) as printed:
        assert main(["export", str(int_file), "--qonnx", "-o", str(out)]) == 0
    assert f"-> {out}: QONNX, " in printed.getvalue()
    proto = onnx.load(out)
    assert [d.dim_value for d in proto.graph.input[0].type.tensor_type.shape.dim] == [1, 1, 8, 8]
    x, _ = build_datasets(DIGITS_DATA)[1].tensors
    assert np.array_equal(run_qonnx(proto, x[:20].numpy()), _expected(model, x[:20]))


def test_bad_requests_are_refused_in_one_line(digits, tmp_path: Path, capsys) -> None:
    model, int_file = digits
    for args, message in (
        ([], "--qonnx needs -o FILE.onnx"),
        (["--onnx", "-o", str(tmp_path / "a.onnx")], "--onnx and --qonnx: choose one"),
    ):
        assert main(["export", str(int_file), "--qonnx", *args]) == 1
        assert capsys.readouterr().err == f"inq export: error: {message}\n"
    scaled = copy.deepcopy(model)
    scaled.ops[1].attrs["scale"] = 0.3  # as calibrate --float-scales makes it
    with pytest.raises(ValueError, match=r"scale 0\.3 is not a power of two"):
        export_qonnx(scaled, tmp_path / "s.onnx")
    assert not (tmp_path / "s.onnx").exists()
