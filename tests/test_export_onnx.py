"""ONNX export (inq.export_onnx): exact power-of-two initializers, the same predictions in ONNX
Runtime as the packed model in PyTorch, and one message for what ONNX cannot express."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from export_fixtures import DIGITS_DATA, digits_run, masked_file
from onnx import numpy_helper
from torch import nn

from inq.cli import main
from inq.codes import pack_codes
from inq.data import build_datasets
from inq.export import load_masked
from inq.export_onnx import OPSET, OnnxModel, export_onnx
from inq.io import DIGEST_KEY, read_safetensors, write_safetensors
from inq.nn import from_packed
from inq.packed import packed_from_masked


@pytest.fixture(scope="module")
def digits(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("onnx")
    masked, _ = digits_run(folder, epochs=2)
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


@pytest.mark.parametrize("bits", [4, 5])
def test_qdq_graph_keeps_the_integer_models_accuracy(tmp_path: Path, capsys, bits: int) -> None:
    from inq.quant.integer import save_integer
    from inq.quant.pipeline import QuantSettings, RealOutput, quantize

    masked, _ = digits_run(tmp_path, bits=bits, epochs=2)
    packed = packed_from_masked(load_masked(masked))
    int_model, _ = quantize(packed, DIGITS_DATA, QuantSettings(act_bits=8))
    int_file, qdq = tmp_path / "d.int.safetensors", tmp_path / "d.qdq.onnx"
    save_integer(int_file, int_model)
    assert main(["export", str(int_file), "--onnx", "-o", str(qdq)]) == 0
    assert "Q/DQ graph of the integer model" in capsys.readouterr().out
    proto = onnx.load(str(qdq))
    kinds = [n.op_type for n in proto.graph.node]
    assert kinds.count("QuantizeLinear") >= 5 and "BatchNormalization" not in kinds
    int8 = [t for t in proto.graph.initializer if t.data_type == onnx.TensorProto.INT8 and t.dims]
    weights = [t for t in int8 if len(t.dims) > 1]
    assert len(weights) == (4 if bits <= 4 else 0)  # int8 codes only where +-2**3 fits
    # the goal: within 0.5 points of the integer model (one image of 450 is 0.22)
    assert abs(_accuracy(OnnxModel(qdq)) - _accuracy(RealOutput(int_model))) <= 0.005


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
