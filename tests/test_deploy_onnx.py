"""ONNX export (inq.deploy.onnx): exact power-of-two initializers, the same predictions in ONNX
Runtime as the packed model in PyTorch, and one message for what ONNX cannot express."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime
import pytest
import torch
from deploy_helpers import (
    shared_digits_integer,
    shared_digits_run,
    shared_mobilenet_integer_model,
    shared_residual_integer_model,
)
from export_fixtures import (
    DIGITS_DATA,
    masked_file,
    mobilenet_inputs,
    packed_model,
)
from onnx import numpy_helper
from torch import nn

from inq.cli import main
from inq.codes import decode_weight, pack_codes
from inq.data import build_datasets
from inq.deploy.bench import read_file
from inq.deploy.onnx import (
    DIGEST_PROP,
    OPSET,
    OnnxModel,
    QdqWeight,
    export_onnx,
    export_qdq,
    qdq_weight,
)
from inq.fileio import DIGEST_KEY, MODIFIED, read_safetensors, write_safetensors
from inq.masked import load_masked
from inq.models import build_model
from inq.nn import from_packed
from inq.packed import packed_from_masked
from inq.quant.integer import IntegerModel, IntOp, save_integer
from inq.quant.lower import Lowering
from inq.quant.pipeline import RealOutput


@pytest.fixture(scope="module")
def digits(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("onnx")
    masked, _ = shared_digits_run(folder, epochs=2)
    out = folder / "d.onnx"
    assert main(["export", str(masked), "--onnx", "-o", str(out), "--data", "digits"]) == 0
    return masked, out


def test_weights_are_exact_initializers_and_the_checker_passes(digits) -> None:
    masked, path = digits
    proto = onnx.load(str(path))
    onnx.checker.check_model(proto)
    assert {o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")} == {OPSET}
    initializers = {t.name: numpy_helper.to_array(t) for t in proto.graph.initializer}
    packed = packed_from_masked(load_masked(masked))
    for key, layer in packed.layers.items():
        assert np.array_equal(initializers[key], layer.weight().numpy()), key
    assert "BatchNormalization" in {n.op_type for n in proto.graph.node}  # not folded away


def test_onnx_runtime_runs_the_graph_of_a_plain_export(digits, tmp_path: Path) -> None:
    """The file keeps BatchNorm and the exact weights, yet ONNX Runtime's optimized graph runs
    the convolutions a plain ``torch.onnx.export(..., optimize=True)`` of the same model runs
    (its optimizer folds BatchNorm into the weights): the same op types, BatchNorm fused, no Cast
    or Expand left."""
    masked, path = digits
    packed = packed_from_masked(load_masked(masked))
    model = build_model(packed.model)
    packed.load_into(model)
    plain = tmp_path / "plain.onnx"
    with contextlib.redirect_stdout(io.StringIO()):
        batch = ({0: torch.export.Dim("batch")},)
        torch.onnx.export(model.eval(), (torch.zeros(2, 1, 8, 8),), str(plain), dynamo=True,
                          dynamic_shapes=batch, optimize=True)  # fmt: skip
    ours, theirs = read_file(path, tmp_path).ops, read_file(plain, tmp_path).ops
    assert ours == theirs and ours.float == {"FusedConv": 3, "Gemm": 1}
    assert not {"BatchNormalization", "Cast", "Expand"} & {*ours.other}


def test_onnx_runtime_predicts_what_the_packed_model_does(digits) -> None:
    """Both run the same fp32 network with the same exact weights; only summation order and
    kernels differ. Per layer a dot product of K <= 288 terms errs by at most K * 2**-24 of
    the sum of |terms| (fp32 summation bound), four layers: 4 * 288 * 2**-24 ~ 7e-5 of the
    logits' scale; the test allows 1e-4."""
    masked, path = digits
    x = build_datasets(DIGITS_DATA)[1].tensors[0]
    packed = packed_from_masked(load_masked(masked))
    with torch.no_grad():
        expected = from_packed(packed)(x)
    got = OnnxModel(path)(x)
    assert got.shape == expected.shape  # 450 rows through a graph exported with batch 2
    assert torch.equal(got.argmax(1), expected.argmax(1))
    assert float((got - expected).abs().max()) <= 1e-4 * float(expected.abs().max())
    assert OnnxModel(path)(x[:1]).shape == (1, 10)


def test_eval_runs_the_onnx_file_on_the_recorded_data(digits, capsys) -> None:
    _, path = digits
    assert main(["eval", str(path)]) == 0
    out = capsys.readouterr().out
    assert "(ONNX Runtime, CPU) on digits (450 samples): accuracy" in out


def test_eval_refuses_an_edited_export_not_a_file_another_tool_made_of_it(
    digits, tmp_path: Path, capsys
) -> None:
    """Issue 46: every ONNX file inq writes carries a digest that eval checks: one weight
    changed and saved again is refused; ONNX Runtime's quantize_static of the export (its own
    file: it copies inq's metadata, digest included, and names itself the producer) is not."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, quantize_static

    _, path = digits
    proto = onnx.load(path)
    weight = proto.graph.initializer[0]
    edited = numpy_helper.to_array(weight).copy()
    edited.flat[0] = -edited.flat[0]
    weight.CopyFrom(numpy_helper.from_array(edited, weight.name))
    onnx.save(proto, tmp_path / "edited.onnx")
    assert main(["eval", str(tmp_path / "edited.onnx")]) == 1
    assert capsys.readouterr().err == f"inq eval: error: {tmp_path / 'edited.onnx'}: {MODIFIED}\n"

    class Images(CalibrationDataReader):
        def __init__(self) -> None:
            self.batches = iter([{"input": np.zeros((4, 1, 8, 8), np.float32)}])

        def get_next(self) -> dict | None:
            return next(self.batches, None)

    quantized = tmp_path / "ort.onnx"
    quantize_static(str(path), str(quantized), Images(), quant_format=QuantFormat.QDQ)
    assert any(p.key == DIGEST_PROP for p in onnx.load(quantized).metadata_props)
    assert main(["eval", str(quantized)]) == 0
    assert (
        "(ONNX Runtime, CPU; made from an inq export by 'onnx.quantize': its digest not checked) "
        "on digits (450 samples): accuracy"
    ) in capsys.readouterr().out  # said, as the re-trial of issue 46 asked
    del proto.metadata_props[[p.key for p in proto.metadata_props].index(DIGEST_PROP)]
    onnx.save(proto, tmp_path / "unsigned.onnx")
    assert main(["eval", str(tmp_path / "unsigned.onnx")]) == 0
    assert "(ONNX Runtime, CPU; no sha256 digest: not checked) on digits" in (
        capsys.readouterr().out
    )
    assert main(["verify", str(tmp_path / "unsigned.onnx")]) == 1
    assert capsys.readouterr().err.endswith("no sha256 digest (inq_sha256) in its metadata: not "
                                            "written by inq, or edited\n")  # fmt: skip
    assert main(["verify", str(path)]) == 0
    assert capsys.readouterr().out.startswith(f"{path} (ONNX model): OK: the contents match")


class _Opaque(nn.Module):
    """A linear layer followed by an op ONNX has no translation for (an inq custom op)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(64, 4)
        self.register_buffer("codes", pack_codes(torch.full((3, 4), 8, dtype=torch.uint8), 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.inq.shift_linear(self.fc(x.flatten(1)), self.codes, 4, 0, 4, None)


def test_a_layer_onnx_cannot_express_is_one_message(tmp_path: Path) -> None:
    masked, _ = masked_file(tmp_path, model=_Opaque())
    packed = packed_from_masked(load_masked(masked))
    with pytest.raises(ValueError, match="ONNX cannot express the model") as err:
        export_onnx(packed, tmp_path / "m.onnx", (1, 8, 8), model=_Opaque())
    assert len(str(err.value).splitlines()) == 1
    assert not (tmp_path / "m.onnx").exists()


def _dims(value: onnx.ValueInfoProto) -> list[int | str]:
    return [d.dim_value or d.dim_param for d in value.type.tensor_type.shape.dim]


def test_every_export_records_its_input_and_names_its_output_dims(digits, qdq) -> None:
    """The float and the Q/DQ graph: logits [batch, 10], and in ``inq_data`` the preprocessing
    a deployment needs (digits: pixel / 16, then (x - 0.5) / 0.5), no loader settings."""
    for path in (digits[1], qdq[1]):
        proto = onnx.load(str(path))
        assert _dims(proto.graph.input[0]) == ["batch", 1, 8, 8]
        assert _dims(proto.graph.output[0]) == ["batch", 10], path
        data = json.loads({p.key: p.value for p in proto.metadata_props}["inq_data"])
        assert "num_workers" not in data
        assert data["input"] == {"layout": "NCHW", "shape": [1, 8, 8], "dtype": "float32",
                                 "pixels": "0..16 (8x8 grey levels)", "scale": 0.0625,
                                 "mean": [0.5], "std": [0.5]}  # fmt: skip


def test_export_needs_an_onnx_output(capsys, digits) -> None:
    masked, _ = digits
    assert main(["export", str(masked), "--onnx"]) == 1
    assert "--onnx needs -o FILE.onnx" in capsys.readouterr().err
    assert main(["export", str(masked), "--onnx", "-o", "m.safetensors"]) == 1
    assert "-o m.safetensors: an ONNX file's name ends in .onnx" in capsys.readouterr().err


def _accuracy(model: nn.Module) -> float:
    x, y = build_datasets(DIGITS_DATA)[1].tensors
    with torch.no_grad():
        return float((model(x).argmax(1) == y).double().mean())


@pytest.fixture(scope="module", params=[2, 4, 5])
def qdq(request, tmp_path_factory: pytest.TempPathFactory) -> tuple[IntegerModel, Path, str]:
    """A digits run at 2, 4 and 5 bits, its integer model (8-bit activations) and the Q/DQ
    export of its file, with what ``inq export`` printed."""
    folder = tmp_path_factory.mktemp(f"qdq{request.param}")
    _, int_model = shared_digits_integer(folder, request.param)
    int_file, path = folder / "d.int.safetensors", folder / "d.qdq.onnx"
    save_integer(int_file, int_model)
    with contextlib.redirect_stdout(io.StringIO()) as out:
        assert main(["export", str(int_file), "--onnx", "-o", str(path)]) == 0
    return int_model, path, out.getvalue()


def _layers(model: IntegerModel) -> list[QdqWeight]:
    scales = {op.name: op.attrs["scale"] for op in model.ops}
    return [
        qdq_weight(op, model.op_tensors(op.name), float(np.float32(scales[op.inputs[0]])))
        for op in model.ops
        if op.op in ("conv", "linear")
    ]


def test_every_conv_and_linear_runs_in_an_integer_kernel(qdq, tmp_path: Path) -> None:
    """ONNX Runtime's optimized graph: each layer whose integers stay within +-64 (every layer
    at 2-4 bits) is a QLinearConv/QGemm, the others (5 bits, 128) float convolutions; the file
    has no Mul/Add chain between an op and its QuantizeLinear, and no BatchNormalization."""
    int_model, path, printed = qdq
    layers = _layers(int_model)
    fits = sum(w.int8 for w in layers)
    if int_model.info["weight_bits"][0] <= 4:
        assert fits == len(layers) == 4
    ops = read_file(path, tmp_path).ops
    assert sum(ops.integer.values()) == fits and sum(ops.float.values()) == len(layers) - fits
    nodes = onnx.load(str(path)).graph.node
    outputs = {n.output[0] for n in nodes if n.op_type in ("Conv", "Gemm")}
    after = {n.op_type for n in nodes if set(n.input) & outputs}
    assert after <= {"Relu", "QuantizeLinear", "Identity"}, after
    assert "BatchNormalization" not in {n.op_type for n in nodes}
    assert f"{fits} conv/linear layers with int8 weights, {len(layers) - fits} with" in printed


def test_the_weights_are_the_integer_models_exactly(qdq) -> None:
    """Per layer: the int8 initializers in the file are the integers +-2**k of :func:`qdq_weight`
    and its scales, and those integers times the scales are the integer model's weights times
    its multipliers, bit for bit (power-of-two activation scales: every product below is exact
    in float64). (The float initializers of the other layers: integer x scale, built from the
    same :class:`QdqWeight`.)"""
    int_model, path, _ = qdq
    proto = onnx.load(str(path))
    arrays = {t.name: numpy_helper.to_array(t) for t in proto.graph.initializer}
    weights = [n for n in proto.graph.node if n.input and n.input[0].startswith("w_")]
    for w, node in zip([w for w in _layers(int_model) if w.int8], weights, strict=True):
        stored = arrays[node.input[0]]
        assert stored.dtype == np.int8 and np.array_equal(stored, w.ints.numpy())
        assert np.array_equal(arrays[node.input[1]], w.scale.float().numpy())
        nonzero = np.abs(stored[stored != 0]).astype(np.int64)
        assert np.all(nonzero & (nonzero - 1) == 0)  # powers of two
    layers = [op for op in int_model.ops if op.op in ("conv", "linear")]
    for op, w in zip(layers, _layers(int_model), strict=True):
        t, a = int_model.op_tensors(op.name), op.attrs
        multiplier = torch.ldexp(t["multiplier"].double(), -t["shift"].double())
        shape = a.get("weight_shape") or [a["out_features"], a["in_features"]]
        frac = torch.full((shape[0],), a["frac"], dtype=torch.int32)
        codes = decode_weight(t["codes"], a["bits"], frac, tuple(shape), torch.float64)
        view = (-1, *[1] * (len(shape) - 1))
        in_scale = next(o for o in int_model.ops if o.name == op.inputs[0]).attrs["scale"]
        assert torch.equal(
            w.ints * w.scale.reshape(view) * in_scale,
            codes * multiplier.reshape(view) * a["scale"],
        )


def test_the_export_keeps_the_integer_models_accuracy(qdq) -> None:
    """Within 0.3 points (one digit image of 450 is 0.22): ONNX Runtime rounds ties to even."""
    int_model, path, _ = qdq
    assert abs(_accuracy(OnnxModel(path)) - _accuracy(RealOutput(int_model))) <= 0.003


def _ops_within_one_step(model: IntegerModel, shape: tuple[int, ...], folder: Path) -> list[str]:
    """Export each conv, linear, average pool and clamp alone (its input the integer model's
    value, as exact multiples of its scale), check ONNX Runtime's integers are the integer
    model's within one; returns the kinds of the ops checked."""
    values = model.run(torch.randn(64, *shape, generator=torch.Generator().manual_seed(0)))
    ops = {op.name: op for op in model.ops}
    checked = []
    for op in (op for op in model.ops if op.op in ("conv", "linear", "avgpool", "clamp")):
        source = ops[op.inputs[0]]
        entry = IntOp(source.name, "input", [], {k: source.attrs[k] for k in ("scale", "lo", "hi")})
        tensors = {f"{op.name}.{k}": v for k, v in model.op_tensors(op.name).items()}
        form = {k: v for k, v in model.info.items() if k == "symmetric"}  # TensorRT's or uint8
        alone = IntegerModel([entry, op], tensors, form)
        x = (values[source.name].double() * source.attrs["scale"]).float()
        export_qdq(alone, folder / "op.onnx", tuple(x.shape[1:]))
        got = OnnxModel(folder / "op.onnx")(x).double() / op.attrs["scale"]
        assert float((got - alone(x).double()).abs().max()) <= 1, op.name
        checked.append(op.op)
    return checked


def _adds_within_one_step(model: IntegerModel, shape: tuple[int, ...], folder: Path) -> int:
    """Cut each quantized add's node unit (its inputs' DequantizeLinear, Add, Relu, Quantize-
    Linear, Clip) out of the whole model's Q/DQ file, feed it the integer model's two input
    values and check its integers are the integer model's within one step; returns how many
    adds were checked."""
    values = model.run(torch.randn(64, *shape, generator=torch.Generator().manual_seed(0)))
    export_qdq(model, folder / "whole.onnx", shape)
    proto = onnx.load(str(folder / "whole.onnx"))
    producer = {out: node for node in proto.graph.node for out in node.output}
    reader = {i: node for node in proto.graph.node for i in node.input}
    ops = {op.name: op for op in model.ops}
    checked = 0
    for op in (op for op in model.ops if op.op == "add" and op.attrs["hi"] <= 255):
        add = next(n for n in proto.graph.node
                   if n.op_type == "Add" and n.output[0].rsplit("_", 1)[0] == op.name)  # fmt: skip
        feeds = [producer[i].input[0] for i in add.input]  # the uint8 values the DQs read
        out = add.output[0]
        while not (producer[out].op_type == "Clip" or (producer[out].op_type == "QuantizeLinear"
                   and reader.get(out, add).op_type != "Clip")):  # fmt: skip
            out = reader[out].output[0]
        onnx.utils.extract_model(str(folder / "whole.onnx"), str(folder / "add.onnx"), feeds, [out])
        session = onnxruntime.InferenceSession(
            str(folder / "add.onnx"), providers=["CPUExecutionProvider"]
        )
        zero = [128 if ops[i].attrs["lo"] < 0 else 0 for i in [*op.inputs, op.name]]
        inputs = {name: (values[i].int() + z).to(torch.uint8).numpy()
                  for name, i, z in zip(feeds, op.inputs, zero[:2], strict=True)}  # fmt: skip
        (got,) = session.run([out], inputs)
        diff = torch.from_numpy(got).int() - zero[-1] - values[op.name].int()
        assert int(diff.abs().max()) <= 1, op.name
        checked += 1
    return checked


def test_each_requantizing_op_is_the_integer_models_within_one_step(qdq, tmp_path: Path) -> None:
    """ONNX Runtime rounds ties half to even (the integer model: half up) and requantizes in
    float32, so a value can differ by one step, never more."""
    assert _ops_within_one_step(qdq[0], (1, 8, 8), tmp_path) == [*["conv"] * 3, "avgpool", "linear"]


def test_negative_multipliers_and_float_weights_are_within_one_step(tmp_path: Path) -> None:
    """The residual model's BatchNorm has negative scales (the sign moves into the weights) and
    its 5-bit 3x3 conv needs 128 (exact float weights)."""
    model = shared_residual_integer_model()
    assert [w.int8 for w in _layers(model)] == [False, True, True]
    assert _ops_within_one_step(model, (2, 4, 4), tmp_path) == ["conv", "conv", "avgpool", "linear"]
    assert _adds_within_one_step(model, (2, 4, 4), tmp_path) == 1


def test_relu6_blocks_run_in_integer_kernels_with_a_clip(tmp_path: Path) -> None:
    """MobileNetV2-style blocks at 4 bits: every conv and the linear run in an integer kernel,
    each folded ReLU6 is a Clip of the integers after its QuantizeLinear (0..round(6 / s)) where
    that is below 255, and every op is the integer model's within one step."""
    _, model = shared_mobilenet_integer_model(bits=4)
    path = tmp_path / "m.qdq.onnx"
    stats = export_qdq(model, path, (3, 16, 16))
    layers = [op for op in model.ops if op.op in ("conv", "linear")]
    assert stats["int8_layers"] == len(layers) and stats["float_layers"] == 0
    ops = read_file(path, tmp_path).ops
    assert sum(ops.integer.values()) == len(layers) and not ops.float
    clipped = [op for op in layers if op.attrs["clamp"] is not None and op.attrs["hi"] < 255]
    assert clipped and ops.other["Clip"] == len(clipped)  # at scale 2**-6, 6 is above 255 steps
    kinds = _ops_within_one_step(model, (3, 16, 16), tmp_path)
    assert kinds.count("conv") == len(layers) - 1 and "avgpool" in kinds
    assert _adds_within_one_step(model, (3, 16, 16), tmp_path) >= 1


def test_a_standalone_hardtanh_is_the_integer_models_clamp(tmp_path: Path) -> None:
    """A Hardtanh after a max pool is a clamp op of the integer model: exactly its integers."""
    net = nn.Sequential(nn.Conv2d(3, 4, 3), nn.MaxPool2d(2), nn.Hardtanh(-1.0, 1.0),
                        nn.Flatten(), nn.Linear(4 * 7 * 7, 3))  # fmt: skip
    lowering = Lowering(packed_model(net, bits=4), act_bits=8)
    lowering.calibrate([mobilenet_inputs(16)])
    model = lowering.integer_model({})
    assert "clamp" in [op.op for op in model.ops]
    assert _ops_within_one_step(model, (3, 16, 16), tmp_path) == ["conv", "clamp", "linear"]


def test_a_file_that_does_not_fit_its_model_or_data_is_one_message(
    capsys, digits, tmp_path: Path
) -> None:
    """A packed file whose model description was edited and re-signed: export refuses it as
    eval does; an ONNX graph refuses images of another shape before ONNX Runtime sees them."""
    masked, onnx_file = digits
    packed = tmp_path / "d.inq.safetensors"
    assert main(["export", str(masked), "-o", str(packed)]) == 0
    tensors, metadata = read_safetensors(packed)
    model = json.loads(metadata["model"])
    metadata["model"] = json.dumps({**model, "width": model.get("width", 16) * 2})
    write_safetensors(packed, tensors, {k: v for k, v in metadata.items() if k != DIGEST_KEY})
    capsys.readouterr()
    for argv in (["export", packed, "--onnx", "-o", tmp_path / "x.onnx"], ["eval", packed]):
        assert main([str(a) for a in [*argv, "--data", "digits"]]) == 1
        err = capsys.readouterr().err
        assert "the packed file does not match the model 'digits_cnn'" in err, err
        assert len(err.strip().splitlines()) == 1
    assert not (tmp_path / "x.onnx").exists()
    with pytest.raises(ValueError, match=r"takes inputs of shape \['N', 1, 8, 8\], the data"):
        OnnxModel(onnx_file)(torch.zeros(2, 1, 16, 16))


def test_a_mixed_bits_model_exports_both_ways_and_runs_in_onnx_runtime(tmp_path: Path) -> None:
    """A MobileNetV2-style model with its first conv and last linear at 8 bits, the other layers
    at 4: the float export holds every layer's exact weights; in the Q/DQ export (each op at
    its own bits) the 4-bit layers run in int8 kernels and the 8-bit ones, whose integers do
    not fit int8, as exact float layers; ONNX Runtime computes what the integer model does."""
    from export_fixtures import mobilenet_style

    from inq.masked import save_masked
    from inq.nn import convert_model
    from inq.scheduler import INQScheduler

    model = mobilenet_style()
    sched = INQScheduler(
        model, bits=4, portions=(1.0,), layer_bits={"features.0": 8, "classifier.1": 8}
    )
    sched.step()
    save_masked(tmp_path / "m.safetensors", model, sched, {"name": "mobilenet_style"})
    packed = packed_from_masked(load_masked(tmp_path / "m.safetensors"))
    bits = {key: layer.bits for key, layer in packed.layers.items()}
    assert bits["features.0.weight"] == bits["classifier.1.weight"] == 8
    assert sorted(bits.values()) == [4] * (len(bits) - 2) + [8, 8]
    x = mobilenet_inputs(16, seed=1)

    export_onnx(packed, tmp_path / "m.onnx", (3, 16, 16), model=mobilenet_style())
    proto = onnx.load(str(tmp_path / "m.onnx"))
    arrays = {t.name: numpy_helper.to_array(t) for t in proto.graph.initializer}
    for key, layer in packed.layers.items():
        assert np.array_equal(arrays[key], layer.weight().numpy()), key
    with torch.no_grad():
        expected = convert_model(mobilenet_style(), packed).eval()(x)
    got = OnnxModel(tmp_path / "m.onnx")(x)
    assert float((got - expected).abs().max()) <= 1e-4 * float(expected.abs().max())

    lowering = Lowering(convert_model(mobilenet_style(), packed).eval(), act_bits=8)
    lowering.calibrate(mobilenet_inputs(64).split(16))
    int_model = lowering.integer_model({"act_bits": 8, "input_bits": 8, "weight_bits": [4, 8]})
    weighted = [op for op in int_model.ops if op.op in ("conv", "linear")]
    assert [op.attrs["bits"] for op in weighted] == [8] + [4] * (len(weighted) - 2) + [8]
    assert [w.int8 for w in _layers(int_model)] == [op.attrs["bits"] == 4 for op in weighted]
    path = tmp_path / "m.qdq.onnx"
    stats = export_qdq(int_model, path, (3, 16, 16))
    assert (stats["int8_layers"], stats["float_layers"]) == (len(weighted) - 2, 2)
    ops = read_file(path, tmp_path).ops
    assert sum(ops.integer.values()) == len(weighted) - 2
    assert ops.float == {"Conv": 1, "Gemm": 1}  # the 8-bit layers: float, not re-quantized
    got, want = OnnxModel(path)(x), RealOutput(int_model)(x)
    assert torch.equal(got.argmax(1), want.argmax(1))
    kinds = _ops_within_one_step(int_model, (3, 16, 16), tmp_path)
    assert kinds.count("conv") + kinds.count("linear") == len(weighted)


def test_float_weights_on_a_single_channel_input_stay_exact(tmp_path: Path) -> None:
    """8-bit layers (integers beyond int8) whose input has one channel, as a grayscale stem:
    ONNX Runtime runs them as float convolutions, not re-quantized to int8, within one step."""
    net = nn.Sequential(nn.Conv2d(1, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 3))
    lowering = Lowering(packed_model(net, bits=8), act_bits=8)
    lowering.calibrate([torch.randn(32, 1, 8, 8, generator=torch.Generator().manual_seed(0))])
    model = lowering.integer_model({})
    assert [w.int8 for w in _layers(model)] == [False, False]
    path = tmp_path / "m.qdq.onnx"
    assert export_qdq(model, path, (1, 8, 8))["float_layers"] == 2
    ops = read_file(path, tmp_path).ops
    assert not ops.integer and ops.float == {"Conv": 1, "Gemm": 1}
    assert _ops_within_one_step(model, (1, 8, 8), tmp_path) == ["conv", "linear"]
