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
    trained_run,
)
from onnx import numpy_helper

from inq.cli import main
from inq.data import FASHION_MNIST_ROOT, build_datasets
from inq.export_qonnx import export_qonnx, qonnx_graph, run_qonnx
from inq.masked import load_masked
from inq.packed import packed_from_masked
from inq.quant.integer import IntegerModel, save_integer
from inq.quant.pipeline import QuantSettings

FASHION_FILES = ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz",
                 "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz")  # fmt: skip


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


def _digits_integer_model(folder: Path, bits: int, **levels: object) -> IntegerModel:
    """A short digits run with the scheduler options ``levels``, its integer model (8-bit
    activations)."""
    masked, _ = digits_run(folder, bits=bits, epochs=2, **levels)
    model, _ = quantize_on(packed_from_masked(load_masked(masked)), DIGITS_DATA,
                           QuantSettings(act_bits=8))  # fmt: skip
    return model


def _assert_exact_on_the_test_split(model: IntegerModel) -> None:
    x, _ = build_datasets(DIGITS_DATA)[1].tensors
    got = run_qonnx(qonnx_graph(model), x.numpy())
    assert got.shape == (450, 10) and np.array_equal(got, _expected(model, x))


@pytest.mark.parametrize("bits", [2, 4])
def test_per_layer_bits_first_and_last_layer_at_8_bits(bits: int, tmp_path: Path) -> None:
    model = _digits_integer_model(tmp_path, bits, layer_bits={"0": 8, "12": 8})
    layers = [op for op in model.ops if op.op in ("conv", "linear")]
    assert [op.attrs["bits"] for op in layers] == [8, bits, bits, 8]
    _assert_exact_on_the_test_split(model)


@pytest.mark.parametrize("bits", [2, 3])
def test_per_channel_level_sets_of_the_lowbit_config(bits: int, tmp_path: Path) -> None:
    model = _digits_integer_model(tmp_path, bits, n1_rule="mse", granularity="channel")
    n1s = [op.attrs["n1"] for op in model.ops if op.op in ("conv", "linear")]
    assert all(isinstance(n1, list) for n1 in n1s)  # one level set per output channel
    assert any(len(set(n1)) > 1 for n1 in n1s)  # and they differ within a layer
    _assert_exact_on_the_test_split(model)


def _spread_8bit_model(relu: bool) -> IntegerModel:
    """An 8-bit conv + linear model (512 inputs) whose weights spread over ~2**-24..1, so its
    level sets reach far below each layer's ``frac`` (capped by the int32 accumulator), and
    the conv's accumulator bound passes 2**24; signed or (``relu``) unsigned linear inputs."""
    from export_fixtures import packed_model
    from torch import nn

    from inq.quant.lower import Lowering

    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(2, 8, 3, padding=1), nn.ReLU() if relu else nn.Identity(),
                        nn.Flatten(), nn.Linear(8 * 8 * 8, 5))  # fmt: skip
    with torch.no_grad():
        for layer in (net[0], net[3]):
            layer.weight.mul_(torch.exp2(-24 * torch.rand_like(layer.weight)))
    lowering = Lowering(packed_model(net, 8), act_bits=8)
    lowering.calibrate([torch.randn(16, 2, 8, 8)])
    return lowering.integer_model({"data": {"input": {"shape": [2, 8, 8]}}})


@pytest.mark.slow
@pytest.mark.parametrize("relu", [True, False])
def test_terms_below_frac_are_exact_in_exponent_bands(relu: bool) -> None:
    from inq.codes import unpack_codes

    model = _spread_8bit_model(relu)
    linear = model.ops[-1]
    codes = unpack_codes(model.op_tensors(linear.name)["codes"], 8, linear.attrs["in_features"])
    assert int((codes.long() & 63)[codes != 0].max()) > linear.attrs["frac"]  # floored terms
    proto = qonnx_graph(model)
    kinds = [node.op_type for node in proto.graph.node]
    assert kinds.count("Floor") > 1 and kinds.count("Conv") > 1  # bands: floored, and split
    made_by = {out: node for node in proto.graph.node for out in node.output}
    for node in proto.graph.node:
        if node.op_type in ("Conv", "Gemm"):
            assert made_by[node.input[1]].op_type == "Quant"
    x = 2 * torch.randn(32, 2, 8, 8, generator=torch.Generator().manual_seed(2))
    assert np.array_equal(run_qonnx(proto, x.numpy()), _expected(model, x))


FASHION_DATA = {"name": "fashion_mnist", "root": FASHION_MNIST_ROOT, "num_classes": 10,
                "in_channels": 1, "image_size": 28, "eval_batch_size": 256}  # fmt: skip
FASHION_MODEL = {"name": "mnist_cnn", "num_classes": 10, "in_channels": 1}


@pytest.fixture(scope="module", params=["2", "4", "5", "4, 8-bit ends"])
def fashion(request, tmp_path_factory: pytest.TempPathFactory) -> IntegerModel:
    """The README's Fashion-MNIST CNN trained briefly (1,000 images) at 2, 4 and 5 bits, and
    at 4 bits with the first and last layer at 8 bits, as an integer model (8-bit
    activations, 2 calibration batches)."""
    if not all((Path(FASHION_MNIST_ROOT) / f).is_file() for f in FASHION_FILES):
        pytest.skip(f"Fashion-MNIST is not in {FASHION_MNIST_ROOT} (needs the package "
                    "dataset-fashion-mnist: apt-get install dataset-fashion-mnist)")  # fmt: skip
    bits, *ends = request.param.split(",")
    levels = {"layer_bits": {"0": 8, "15": 8}} if ends else {}
    folder = tmp_path_factory.mktemp("fashion")
    masked, _ = trained_run(folder, FASHION_MODEL, FASHION_DATA, int(bits), epochs=2,
                            train_size=1000, lr=2e-3, **levels)  # fmt: skip
    model, _ = quantize_on(packed_from_masked(load_masked(masked)), FASHION_DATA,
                           QuantSettings(act_bits=8, batches=2))  # fmt: skip
    return model


@pytest.mark.slow
def test_the_readme_fashion_mnist_cnn_is_exact(fashion: IntegerModel) -> None:
    x, _ = build_datasets(FASHION_DATA)[1].tensors
    x = x[:300]
    got = run_qonnx(qonnx_graph(fashion), x.numpy())
    assert got.shape == (300, 10) and np.array_equal(got, _expected(fashion, x))
