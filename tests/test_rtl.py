"""inq export --rtl: the Verilog's Verilator simulation equals the integer model, bit for bit."""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from export_fixtures import (
    DIGITS_DATA,
    DIGITS_MODEL,
    packed_model,
    quantize_on,
    residual_integer_model,
    trained_run,
)
from torch import nn

from inq.cli import main
from inq.data import build_datasets
from inq.masked import load_masked
from inq.packed import packed_from_masked
from inq.quant.integer import IntegerModel, save_integer
from inq.quant.pipeline import QuantSettings

pytest.importorskip("da4ml")
from inq.rtl import RtlModel, export_rtl
from inq.rtl.design import RtlRefusal, plan
from inq.rtl.logic import layer_graph
from inq.rtl.sim import simulate

SMALL_DIGITS = {**DIGITS_MODEL, "width": 4}  # the README's digits CNN, narrow: a fast build


@pytest.fixture(scope="module")
def digits(tmp_path_factory) -> tuple[IntegerModel, Path, str]:
    """A narrow digits CNN (4-bit INQ, 8-bit activations) as an integer model file and the RTL
    project ``inq export --rtl`` makes of it, with what the command printed."""
    folder = tmp_path_factory.mktemp("rtl")
    masked, _ = trained_run(folder, SMALL_DIGITS, DIGITS_DATA, bits=4, epochs=2)
    model, _ = quantize_on(packed_from_masked(load_masked(masked)), DIGITS_DATA,
                           QuantSettings(act_bits=8))  # fmt: skip
    save_integer(folder / "d.int.safetensors", model)
    argv = ["export", str(folder / "d.int.safetensors"), "--rtl", "-o", str(folder / "prj")]
    with contextlib.redirect_stdout(io.StringIO()) as out:
        assert main(argv) == 0
    return model, folder / "prj", out.getvalue()


@pytest.mark.slow
def test_simulation_equals_the_integer_model_on_the_whole_digits_test_split(digits) -> None:
    model, project, _ = digits
    x, _ = build_datasets(DIGITS_DATA)[1].tensors
    got = RtlModel(project).integers(x)
    want = model(x)
    assert got.shape == want.shape and got.dtype == want.dtype == torch.int32
    assert int((got != want).any(dim=1).sum()) == 0  # 0 differing logits, of 450 images


@pytest.mark.slow
def test_inq_eval_runs_the_simulation_and_gives_the_integer_models_figures(digits, capsys):
    _, project, _ = digits
    source = project.parent / "d.int.safetensors"
    assert main(["eval", str(source)]) == 0
    integer = capsys.readouterr().out
    assert main(["eval", str(project)]) == 0
    simulated = capsys.readouterr().out
    assert "(its Verilog, simulated by Verilator) on digits (450 samples)" in simulated
    assert simulated.split("accuracy")[1] == integer.split("accuracy")[1]  # accuracy and loss


@pytest.mark.slow
def test_export_reports_no_multiplier_and_the_project_verifies(digits, capsys) -> None:
    _, project, printed = digits
    assert "multipliers: 0;" in printed
    record = json.loads((project / "design.json").read_text())
    assert [layer["op"] for layer in record["layers"]] == [
        "conv", "conv", "maxpool", "conv", "avgpool", "linear"
    ]  # fmt: skip
    assert all(layer["multipliers"] == 0 and layer["adders"] > 0 for layer in record["layers"])
    assert record["interval_cycles"] == 64 + record["frame_gap"]
    assert 0 < record["latency_cycles"] < 4 * record["interval_cycles"]
    assert main(["verify", str(project)]) == 0
    (project / "inq_top.v").write_text("// changed\n")
    assert main(["verify", str(project)]) == 1
    assert "inq_top.v was changed since the export wrote it" in capsys.readouterr().err


class Geometry(nn.Module):
    """Strided, padded and 5x5 convolutions over an odd, non-square frame; a negative BatchNorm
    scale; a ReLU6 (a clamp narrower than its type); max pooling; flatten and linear."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(2, 3, 3, stride=2, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(3)
        self.conv2 = nn.Conv2d(3, 4, 5, padding=2)
        self.pool = nn.MaxPool2d(2)
        self.fc = nn.Linear(4 * 2 * 2, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.bn(self.conv1(x)))  # [N, 3, 4, 5]
        x = self.pool(nn.functional.relu6(self.conv2(x)))  # [N, 4, 2, 2]
        return self.fc(x.flatten(1))


def _integer_model(net: nn.Module, shape: tuple[int, ...]) -> IntegerModel:
    from inq.quant.lower import Lowering

    lowering = Lowering(packed_model(net, bits=4), act_bits=8)
    lowering.calibrate([torch.randn(16, *shape)])
    return lowering.integer_model({"model": {}, "data": {}, "act_bits": 8, "input_bits": 8})


@pytest.mark.slow
def test_windows_with_stride_padding_and_clamps_stream_exactly(tmp_path: Path) -> None:
    torch.manual_seed(1)
    net = Geometry()
    with torch.no_grad():
        net.bn.weight.copy_(torch.tensor([1.0, -0.7, 0.4]))
        net.conv2.weight.mul_(20.0)  # past 6: the ReLU6 clamps, at 0..192 of a uint8
    model = _integer_model(net, (2, 7, 9))
    ops = {op.op for op in model.ops}
    assert {"conv", "maxpool", "linear"} <= ops
    assert any(op.attrs.get("hi", 0) < 255 for op in model.ops if op.op == "conv")  # ReLU6
    export_rtl(model, tmp_path / "prj", (2, 7, 9))
    x = torch.randn(40, 2, 7, 9) * 2
    values = model.run(x)
    frames = values["input"].numpy().astype(np.int64)
    want = values[model.ops[-1].name].numpy()
    for seed in (0, 3):  # without, then with, random input gaps and output stalls
        got, stats = simulate(tmp_path / "prj", frames, seed)
        assert np.array_equal(got.reshape(want.shape), want)
        assert stats["latency"] > 0


class Block(nn.Module):
    """A residual block whose skip is a layer's output (the identity): the add waits on two
    3x3 convolutions, so the skip's FIFO holds rows of pixels; max pooling, a linear head."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(2, 3, 3, padding=1)
        self.conv1 = nn.Conv2d(3, 3, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(3)
        self.conv2 = nn.Conv2d(3, 3, 3, padding=1)
        self.pool = nn.MaxPool2d(2)
        self.fc = nn.Linear(3 * 3 * 3, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.stem(x))
        y = torch.relu(y + self.conv2(torch.relu(self.bn(self.conv1(y)))))
        return self.fc(self.pool(y).flatten(1))


@pytest.mark.slow
@pytest.mark.parametrize("skip", ["a 1x1 conv of the input", "the identity"])
def test_residual_adds_stream_exactly_with_stalls(skip: str, tmp_path: Path) -> None:
    if skip == "the identity":
        torch.manual_seed(2)
        model, shape = _integer_model(Block(), (2, 6, 7)), (2, 6, 7)
    else:
        model, shape = residual_integer_model(), (2, 4, 4)
    assert any(op.op == "add" for op in model.ops)
    export_rtl(model, tmp_path / "prj", shape)
    values = model.run(torch.randn(40, *shape) * 2)
    frames = values["input"].numpy().astype(np.int64)
    want = values[model.ops[-1].name].numpy()
    for seed in (0, 3):  # without, then with, random input gaps and output stalls
        got, _ = simulate(tmp_path / "prj", frames, seed)
        assert np.array_equal(got.reshape(want.shape), want)


class Strided(nn.Module):
    """A strided slice (ResNet's "option A" shortcut), which has no streaming form."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(2, 2, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.conv(x))[:, :, ::2, ::2]


def test_a_slice_is_refused_in_one_line_before_anything_is_written(tmp_path) -> None:
    model = _integer_model(Strided(), (2, 4, 4))
    with pytest.raises(RtlRefusal, match=r"^\S+ \(slice\): no streaming form") as err:
        export_rtl(model, tmp_path / "prj", (2, 4, 4))
    assert "\n" not in str(err.value)
    assert not (tmp_path / "prj").exists() and not list(tmp_path.iterdir())


def test_the_cli_refuses_an_rtl_export_without_a_directory(tmp_path, capsys) -> None:
    path = tmp_path / "r.int.safetensors"
    save_integer(path, residual_integer_model())
    assert main(["export", str(path), "--rtl"]) != 0
    assert "--rtl needs -o DIR" in capsys.readouterr().err


@pytest.mark.parametrize("op_kind", ["conv", "maxpool"])
def test_each_layer_graph_equals_the_integer_op_on_random_windows(op_kind: str) -> None:
    """da4ml's graph, executed in Python, against the integer model's op (no Verilog)."""
    model = _integer_model(Geometry(), (2, 7, 9))
    design = plan(model, (2, 7, 9))
    layer = next(layer for layer in design.layers if layer.op.op == op_kind)
    graph = layer_graph(layer.op, layer.tensors, layer.window)
    values = model.run(torch.randn(8, 2, 7, 9) * 2)
    x = values[layer.op.inputs[0]].to(torch.int64)
    (kh, kw), (sh, sw), (ph, pw) = (layer.window.kh, layer.window.kw), layer.stride, layer.padding
    cols = nn.functional.unfold(x.double(), (kh, kw), padding=(ph, pw), stride=(sh, sw))
    n, c = x.shape[:2]
    windows = cols.view(n, c, kh, kw, -1).permute(0, 4, 2, 3, 1).reshape(-1, kh * kw * c)
    want = values[layer.op.name].to(torch.int64).permute(0, 2, 3, 1).reshape(len(windows), -1)
    got = np.array([graph(w.numpy().astype(float)) for w in windows])
    assert np.array_equal(got, want.numpy())


class Tiny(nn.Module):
    """One conv and a linear layer over a 4x4 frame: a design Yosys and nextpnr take in
    seconds."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 2, 3, padding=1)
        self.fc = nn.Linear(2 * 4 * 4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.relu(self.conv(x)).flatten(1))


@pytest.mark.slow
def test_hardware_figures_come_from_yosys_and_nextpnr_with_no_dsp(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = _integer_model(Tiny(), (1, 4, 4))
    record = export_rtl(model, tmp_path / "prj", (1, 4, 4), hardware=50.0)
    ecp5, pnr = record["hardware"]["ecp5"], record["hardware"]["ecp5_pnr"]
    assert ecp5["luts"] > 0 and ecp5["ffs"] > 0 and ecp5["dsps"] == 0
    assert pnr["fmax_mhz"] > 0 and pnr["bitstream_bytes"] > 0
    assert main(["verify", str(tmp_path / "prj")]) == 0  # the figures' files are in the manifest


def test_a_stopped_export_stops_its_verilator_build_and_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The Verilator build runs in a process group the export kills when it stops (as the
    hls4ml export's g++); the project's directory never appears."""
    torch.manual_seed(0)
    source = tmp_path / "t.int.safetensors"
    save_integer(source, _integer_model(Tiny(), (1, 4, 4)))
    pids, bin_dir = tmp_path / "pids", tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "verilator"
    fake.write_text(f"#!/bin/sh\necho $$ >> {pids}\nexec sleep 60\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    argv = ["export", str(source), "--rtl", "-o", str(tmp_path / "prj"), "--data", "synthetic",
            "in_channels=1", "image_size=4"]  # fmt: skip
    export = subprocess.Popen([sys.executable, "-m", "inq.cli", *argv], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)  # fmt: skip
    while not pids.exists() or not pids.read_text().strip():
        assert export.poll() is None, export.communicate()  # waiting for the build to start
        time.sleep(0.05)
    export.send_signal(signal.SIGTERM)
    _, err = export.communicate(timeout=60)
    assert export.returncode == 143 and err == "inq export: interrupted; nothing was written\n"
    for pid in map(int, pids.read_text().split()):
        state = Path(f"/proc/{pid}/stat")
        assert not state.exists() or state.read_text().rsplit(")", 1)[1].split()[0] in "ZX"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bin", "pids", "t.int.safetensors"]


def test_a_conv_graph_of_integer_weights_equals_an_int64_reference() -> None:
    """Uniform int8 weights (``weights`` in place of ``codes``): the graph on random windows
    against an int64 convolution, bias and round-half-up requantization."""
    from inq.kernels.int8 import requantize
    from inq.quant.integer import IntOp
    from inq.rtl.logic import Window

    g = torch.Generator().manual_seed(3)
    weights = torch.randint(-127, 128, (4, 3, 3, 3), generator=g, dtype=torch.int8)
    weights[weights.abs() < 40] = 0  # sparse, as the study's uniform variants
    tensors = {
        "weights": weights,
        "bias": torch.randint(-3000, 3000, (4,), generator=g, dtype=torch.int32),
        "multiplier": torch.tensor([1, 3, -1717986919, 858993459], dtype=torch.int32),
        "shift": torch.tensor([8, 10, 40, 38], dtype=torch.int32),
    }
    op = IntOp("c", "conv", ["x"], {"lo": 0, "hi": 255})
    graph = layer_graph(op, tensors, Window(3, 3, 3, 0, 255))
    x = torch.randint(0, 256, (6, 3, 5, 5), generator=g).to(torch.int64)
    cols = nn.functional.unfold(x.double(), (3, 3))  # [N, C * 9, 9]: (c, u, v) rows
    windows = cols.view(6, 3, 3, 3, -1).permute(0, 4, 2, 3, 1).reshape(-1, 27)  # (u, v, c)
    acc = torch.einsum("nkp,ok->npo", cols.to(torch.int64), weights.to(torch.int64).flatten(1))
    want = requantize(acc.reshape(-1, 4) + tensors["bias"], tensors["multiplier"],
                      tensors["shift"], 0, 255)  # fmt: skip
    got = np.array([graph(w.numpy().astype(float)) for w in windows])
    assert np.array_equal(got, want.numpy())


def test_a_tap_no_weight_reads_keeps_its_place_on_the_pipelines_input_bus() -> None:
    """da4ml's retiming drops an unread input; :func:`pipelined` puts it back, so the graph's
    input bus stays the window's (a 3-bit INQ model with an all-zero tap streamed garbage)."""
    from da4ml.types import minimal_kif

    from inq.quant.integer import IntOp
    from inq.rtl.logic import Window, pipelined

    g = torch.Generator().manual_seed(2)
    weights = torch.randint(-8, 9, (8, 4, 3, 3), generator=g, dtype=torch.int8)
    weights[weights.abs() < 4] = 0
    weights[:, 2, 1, 0] = 0  # tap (1, 0) of channel 2: read by no output
    one = torch.ones(8, dtype=torch.int32)
    tensors = {"weights": weights, "bias": one, "multiplier": one * 1774676009, "shift": one * 33}
    graph = layer_graph(IntOp("c", "conv", ["x"], {"lo": 0, "hi": 255}), tensors,
                        Window(3, 3, 4, 0, 255))  # fmt: skip
    pipeline = pipelined(graph, stage_delay=6.0)  # retimed: da4ml drops the tap here
    assert [sum(minimal_kif(q)) for q in pipeline.inp_qint] == [8] * 36
