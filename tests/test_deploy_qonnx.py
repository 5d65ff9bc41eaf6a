"""QONNX export (inq.deploy.qonnx): qonnx's own executor computes the integer model bit for bit
(digits at 2, 4 and 5 bits on the whole test split, a residual block with negative multipliers,
a MobileNet-style block with ReLU6 and depthwise convs), every weight an exact power of two
behind its Quant node, and one clear refusal where the exact form does not exist."""

from __future__ import annotations

import contextlib
import copy
import io
import json
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from deploy_helpers import (
    shared_digits_integer,
    shared_mobilenet_integer_model,
    shared_residual_integer_model,
)
from export_fixtures import (
    DIGITS_DATA,
    FASHION_DATA,
    digits_run,
    fashion_integer_model,
    mobilenet_inputs,
    quantize_on,
)
from onnx import numpy_helper

from inq.cli import main
from inq.data import build_datasets
from inq.deploy.onnx import save_onnx
from inq.deploy.qonnx import LEVELS_KEY, export_qonnx, qonnx_graph, run_qonnx, verify_qonnx
from inq.fileio import MODIFIED
from inq.masked import load_masked
from inq.packed import packed_from_masked
from inq.quant.integer import IntegerModel, save_integer
from inq.quant.pipeline import QuantSettings


def _expected(model: IntegerModel, x: torch.Tensor) -> np.ndarray:
    return (model(x).double() * model.output_scale()).numpy()


def _digits(bits: int, tmp_path_factory: pytest.TempPathFactory) -> tuple[IntegerModel, Path]:
    folder = tmp_path_factory.mktemp(f"qonnx{bits}")
    _, model = shared_digits_integer(folder, bits)
    save_integer(folder / "d.int.safetensors", model)
    return model, folder / "d.int.safetensors"


@pytest.fixture(scope="module", params=[2, 4, 5])
def digits(request, tmp_path_factory: pytest.TempPathFactory) -> tuple[IntegerModel, Path]:
    """A digits run at 2, 4 and 5 bits, its integer model (8-bit activations) and its file."""
    return _digits(request.param, tmp_path_factory)


@pytest.fixture(scope="module")
def digits4(tmp_path_factory: pytest.TempPathFactory) -> tuple[IntegerModel, Path]:
    """The 4-bit run alone, for what the bits do not change: the commands' file handling."""
    return _digits(4, tmp_path_factory)


def test_qonnx_executor_equals_the_integer_model_on_the_whole_test_split(digits) -> None:
    model, _ = digits
    x, _ = build_datasets(DIGITS_DATA)[1].tensors
    got = run_qonnx(qonnx_graph(model), x.numpy())
    expected = _expected(model, x)
    assert got.shape == (450, 10) and int((got != expected).sum()) == 0


def test_a_residual_block_and_relu6_blocks_are_exact_too() -> None:
    residual = shared_residual_integer_model()
    x = 2 * torch.randn(64, 2, 4, 4, generator=torch.Generator().manual_seed(1))
    assert np.array_equal(run_qonnx(qonnx_graph(residual, shape=(2, 4, 4)), x.numpy()),
                          _expected(residual, x))  # fmt: skip
    _, mobilenet = shared_mobilenet_integer_model()
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


# --- inq eval and inq verify of a QONNX file -----------------------------------------------------


def _export(int_file: Path, out: Path) -> onnx.ModelProto:
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(["export", str(int_file), "--qonnx", "-o", str(out), "--force"]) == 0
    return onnx.load(out)


def test_inq_eval_of_a_qonnx_file_prints_the_integer_models_accuracy(
    digits4, tmp_path: Path, capsys
) -> None:
    """The data set comes from the file (no --data): the QONNX file records it as the integer
    model does; accuracy and loss are the integer model's, to the last digit."""
    model, int_file = digits4
    out = tmp_path / "d.qonnx.onnx"
    proto = _export(int_file, out)
    props = {p.key: json.loads(p.value) for p in proto.metadata_props}
    recorded = model.info["data"]  # the file's record, with the defaults filled in
    assert {key: props["inq_data"][key] for key in recorded} == recorded
    assert props["inq_model"] == model.info["model"]
    x, y = build_datasets(DIGITS_DATA)[1].tensors
    correct = int((torch.from_numpy(_expected(model, x)).argmax(1) == y).sum())
    assert main(["eval", str(out)]) == 0
    qonnx_line = capsys.readouterr().out
    assert qonnx_line.startswith(f"{out} (QONNX, qonnx's executor, CPU) on digits (450 samples)")
    assert f"accuracy {100 * correct / 450:.2f}% ({correct}/450)" in qonnx_line
    assert main(["eval", str(int_file), "--device", "cpu"]) == 0
    int_line = capsys.readouterr().out
    assert qonnx_line.split("): ")[-1] == int_line.split("): ")[-1]  # accuracy and loss
    assert main(["info", str(out)]) == 0  # read from the graph: ONNX Runtime cannot load it
    quants = sum(node.op_type == "Quant" for node in proto.graph.node)
    info = capsys.readouterr().out.splitlines()
    assert info[0].startswith(f"{out}: QONNX model, {len(proto.graph.node)} nodes ({quants} Quant")
    assert info[1] == "input x: tensor(float) [1, 1, 8, 8]"
    assert info[2] == "output y: tensor(double) [1, 10]"  # issue 46: it said [batch, y1]
    assert info[3] == f"model {json.dumps(model.info['model'])}" and info[4] == "data digits"


def _tampered(
    proto: onnx.ModelProto, path: Path, value: float, sign: bool = True, index: int = 3
) -> str:
    """``proto`` with one weight (``index``) of its last Gemm set to ``value``, saved at
    ``path`` (with a new digest where ``sign``: the level sets are checked whatever the digest
    says); returns the Gemm node's name."""
    proto = copy.deepcopy(proto)
    made_by = {out: node for node in proto.graph.node for out in node.output}
    gemm = next(node for node in proto.graph.node if node.op_type == "Gemm")
    init = next(t for t in proto.graph.initializer if t.name == made_by[gemm.input[1]].input[0])
    weight = numpy_helper.to_array(init).copy()
    weight.flat[index] = value
    init.CopyFrom(numpy_helper.from_array(weight, init.name))
    save_onnx(proto, path) if sign else onnx.save(proto, path)
    return gemm.name


def test_inq_verify_passes_an_export_and_names_the_node_of_a_tampered_weight(
    digits, tmp_path: Path, capsys
) -> None:
    """Every weight 0 or ±2**e within its layer's level set: an exported file passes; one weight
    made 3 * 2**-2, a power of two above 2**n1 or below 2**n2 fails, naming the Gemm node."""
    model, int_file = digits
    out = tmp_path / "d.qonnx.onnx"
    proto = _export(int_file, out)
    assert main(["verify", str(out)]) == 0
    printed = capsys.readouterr().out
    layers = sum(op.op in ("conv", "linear") for op in model.ops)
    assert printed.splitlines()[-1].startswith(f"OK: {layers} Conv/Gemm weights lie in their")
    bits = next(op.attrs["bits"] for op in model.ops if op.op == "linear")
    lowest = 1 - (1 << (bits - 2))  # the stored level set: 0, ±2**lowest .. ±1 (w * 2**-n1)
    for value in (3 * 2.0**-2, 2.0, -(2.0 ** (lowest - 1))):
        node = _tampered(proto, tmp_path / "t.onnx", value)
        assert main(["verify", str(tmp_path / "t.onnx")]) == 1, value
        printed, err = capsys.readouterr()
        problem, summary = err.splitlines()  # one line per problem, then the summary
        start = f"inq verify: {tmp_path / 't.onnx'}: "
        assert problem.startswith(f"{start}node '{node}': 1 weight(s) off the {bits}-bit level "
                                  "set"), err  # fmt: skip
        assert summary == f"{start}1 problem(s); 1 of {layers} weight layers fail"
        assert [line.split()[0] for line in printed.splitlines() if "FAIL" in line] == [node]
    frac = next(op.attrs["frac"] for op in model.ops if op.op == "linear")
    for value in (2.0 ** max(lowest, -frac), -1.0, 0.0):  # in the level set: still passes
        _tampered(proto, tmp_path / "t.onnx", value)
        assert main(["verify", str(tmp_path / "t.onnx")]) == 0, value
    capsys.readouterr()


def test_a_weight_changed_within_its_level_set_fails_verify_and_eval_by_its_digest(
    digits4, tmp_path: Path, capsys
) -> None:
    """Issue 46: one weight's sign flipped stays in its level set and changed the loss, and
    verify said OK; one byte flipped, and eval printed an accuracy. The file's sha256 digest
    (inq.deploy.onnx.save_onnx) now tells both."""
    _, int_file = digits4
    proto = _export(int_file, tmp_path / "d.qonnx.onnx")
    made_by = {out: node for node in proto.graph.node for out in node.output}
    gemm = next(node for node in proto.graph.node if node.op_type == "Gemm")
    init = next(t for t in proto.graph.initializer if t.name == made_by[gemm.input[1]].input[0])
    weight = numpy_helper.to_array(init)
    index = int(np.flatnonzero(weight)[0])
    flipped = tmp_path / "flipped.onnx"
    _tampered(proto, flipped, -float(weight.flat[index]), sign=False, index=index)
    capsys.readouterr()
    assert main(["verify", str(flipped)]) == 1
    problem, summary = capsys.readouterr().err.splitlines()
    assert problem == f"inq verify: {flipped}: {MODIFIED}"
    layers = sum(node.op_type in ("Conv", "Gemm") for node in proto.graph.node)
    assert summary == f"inq verify: {flipped}: 1 problem(s); 0 of {layers} weight layers fail"
    data = bytearray((tmp_path / "d.qonnx.onnx").read_bytes())
    data[len(data) // 2] ^= 0x01  # inside an initializer's raw data
    byte = tmp_path / "byte.onnx"
    byte.write_bytes(bytes(data))
    for path in (flipped, byte):
        assert main(["eval", str(path)]) == 1
        assert capsys.readouterr() == ("", f"inq eval: error: {path}: {MODIFIED}\n")


def test_verify_wants_each_layers_recorded_level_set(tmp_path: Path, capsys) -> None:
    """Per-channel level sets verify too (the export is exact with them); a file without its
    level sets, or with one of a wrong shape, fails naming the node; a plain ONNX file is not
    verified."""
    model = shared_residual_integer_model(granularity="channel")
    assert any(isinstance(op.attrs.get("n1"), list) for op in model.ops)
    proto = qonnx_graph(model, shape=(2, 4, 4))
    x = 2 * torch.randn(64, 2, 4, 4, generator=torch.Generator().manual_seed(2))
    assert np.array_equal(run_qonnx(proto, x.numpy()), _expected(model, x))
    save_onnx(proto, tmp_path / "r.onnx")
    assert main(["verify", str(tmp_path / "r.onnx")]) == 0
    levels = [p for p in proto.metadata_props if p.key.startswith(LEVELS_KEY)]
    assert len(levels) == sum(op.op in ("conv", "linear") for op in model.ops)
    node = levels[0].key.removeprefix(LEVELS_KEY)
    for edit, problem in (
        (lambda p: p.metadata_props.remove(p.metadata_props[2]), "no level set recorded for it"),
        (lambda p: setattr(p.metadata_props[2], "value", json.dumps({"bits": 5, "n1": [0],
                                                                     "frac": 3})),
         "its recorded level set is not bits, n1, frac"),
    ):  # fmt: skip
        broken = copy.deepcopy(proto)
        assert broken.metadata_props[2].key == LEVELS_KEY + node
        edit(broken)
        save_onnx(broken, tmp_path / "b.onnx")
        capsys.readouterr()
        assert main(["verify", str(tmp_path / "b.onnx")]) == 1
        assert f"node '{node}': {problem}" in capsys.readouterr().err
    plain = tmp_path / "plain.onnx"
    onnx.save(onnx.helper.make_model(onnx.helper.make_graph([], "g", [], [])), plain)
    assert main(["verify", str(plain)]) == 1  # not inq's: no digest to prove it is as written
    assert capsys.readouterr().err == (
        f"inq verify: {plain}: no sha256 digest (inq_sha256) in its metadata: not written by inq, "
        "or edited\n"
    )


def test_without_the_fpga_extra_eval_says_what_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    save_onnx(qonnx_graph(shared_residual_integer_model(), shape=(2, 4, 4)), tmp_path / "r.onnx")
    for name in [m for m in sys.modules if m.startswith("qonnx.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "qonnx", None)  # import qonnx fails: not installed
    assert main(["eval", str(tmp_path / "r.onnx"), "--data", "digits"]) == 1
    assert capsys.readouterr().err == (
        "inq eval: error: QONNX needs the fpga extra: pip install 'inq[fpga]' (qonnx is missing)\n"
    )


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
    report = verify_qonnx(proto)  # each band's weights checked against its recorded entry
    assert len(report.layers) == kinds.count("Conv") + kinds.count("Gemm")
    assert [layer.problem for layer in report.layers if layer.problem] == []
    assert not report.other_problems


@pytest.fixture(scope="module", params=["2", "4", "5", "4, 8-bit ends"])
def fashion(request, tmp_path_factory: pytest.TempPathFactory) -> IntegerModel:
    """The README's Fashion-MNIST CNN trained briefly at 2, 4 and 5 bits, and at 4 bits with the
    first and last layer at 8 bits, as an integer model (:func:`fashion_integer_model`)."""
    bits, *ends = request.param.split(",")
    return fashion_integer_model(tmp_path_factory.mktemp("fashion"), int(bits), bool(ends))


@pytest.mark.slow
def test_the_readme_fashion_mnist_cnn_is_exact(fashion: IntegerModel) -> None:
    x, _ = build_datasets(FASHION_DATA)[1].tensors
    x = x[:300]
    got = run_qonnx(qonnx_graph(fashion), x.numpy())
    assert got.shape == (300, 10) and np.array_equal(got, _expected(fashion, x))
