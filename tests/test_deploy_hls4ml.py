"""hls4ml export (inq.deploy.hls4ml): the C simulation that g++ compiles from the project hls4ml
writes equals the integer model bit for bit (digits at 2, 4 and 5 bits on the whole test split, a
residual block, ReLU6 clamps, requantization by powers of two), every conv/dense weight constant
is 0 or a power of two, every weight, bias and scale array is static const where synthesis reads
it (read from the C++, its synthesis path compiled), every activation type is the integer
model's, and bad requests are refused in one line with nothing lost. Each project compiles for
20-40 s: marked slow."""

from __future__ import annotations

import contextlib
import copy
import io
import math
import os
import re
import resource
import signal
import stat
import subprocess
import sys
import time
import types
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from deploy_helpers import shared_mobilenet_integer_model, shared_residual_integer_model
from export_fixtures import (
    DIGITS_DATA,
    FASHION_DATA,
    digits_run,
    fashion_integer_model,
    packed_model,
    quantize_on,
)
from torch import nn

from inq.cli import main
from inq.data import build_datasets
from inq.deploy.hls4ml import (
    HlsLayer,
    declare_constants,
    exact_type,
    export_hls4ml,
    hls_shadow,
    project_problem,
    run_csim,
    write_manifest,
)
from inq.fileio import lock_dir
from inq.masked import load_masked
from inq.packed import packed_from_masked
from inq.quant.integer import IntegerModel, save_integer
from inq.quant.pipeline import QuantSettings

pytest.importorskip("hls4ml")


def _expected(model: IntegerModel, x: torch.Tensor) -> np.ndarray:
    return (model(x).double() * model.output_scale()).reshape(len(x), -1).numpy()


@pytest.fixture(scope="module", params=[2, 4, 5])
def digits(request, tmp_path_factory) -> tuple[IntegerModel, Any, list[HlsLayer], Path, str]:
    """A digits run at 2, 4 and 5 bits, its integer model (8-bit activations) and the hls4ml
    project ``inq export --hls4ml`` makes of its file (compiled), with what the command
    printed."""
    folder = tmp_path_factory.mktemp(f"hls{request.param}")
    masked, _ = digits_run(folder, bits=request.param, epochs=2)
    model, _ = quantize_on(packed_from_masked(load_masked(masked)), DIGITS_DATA,
                           QuantSettings(act_bits=8))  # fmt: skip
    save_integer(folder / "d.int.safetensors", model)
    hls_model, layers, printed = _export_by_the_cli(folder / "d.int.safetensors", folder / "prj")
    return model, hls_model, layers, folder / "prj", printed


def _export_by_the_cli(source: Path, project: Path) -> tuple[Any, list[HlsLayer], str]:
    """``inq export SOURCE --hls4ml -o PROJECT``: the command's own hls4ml model (kept for its
    C simulation), its layers and what it printed."""
    made = []

    def keep(*args: Any, **kwargs: Any) -> tuple[Any, list[HlsLayer]]:
        made.append(export_hls4ml(*args, **kwargs))
        return made[-1]

    argv = ["export", str(source), "--hls4ml", "-o", str(project)]
    with pytest.MonkeyPatch.context() as patch, contextlib.redirect_stdout(io.StringIO()) as out:
        patch.setattr("inq.deploy.hls4ml.export_hls4ml", keep)
        assert main(argv) == 0
    ((hls_model, layers),) = made
    return hls_model, layers, out.getvalue()


@pytest.mark.slow
def test_c_simulation_equals_the_integer_model_on_the_whole_test_split(digits) -> None:
    model, hls_model, *_ = digits
    x, _ = build_datasets(DIGITS_DATA)[1].tensors
    got = run_csim(hls_model, x.numpy())
    assert got.shape == (450, 10) and int((got != _expected(model, x)).sum()) == 0


def _written(project: Path, hls_model: Any, kinds: tuple[str, ...]) -> dict[str, np.ndarray]:
    """The constants of the project's layers of ``kinds`` as its C simulation reads them."""
    out = {}
    for layer in hls_model.get_layers():
        if type(layer).__name__.endswith(kinds):
            for key, variable in layer.weights.items():
                text = (project / "firmware" / "weights" / f"{variable.name}.txt").read_text()
                out[f"{layer.name}.{key}"] = np.array(text.replace(",", " ").split(), float)
    return out


def _pow2_or_zero(values: np.ndarray) -> bool:
    magnitudes = np.abs(values[values != 0])
    return bool(np.array_equal(magnitudes, np.exp2(np.round(np.log2(magnitudes)))))


_ARRAY = re.compile(r"^(?P<qualifiers>(?:\w+ )*?)(?P<type>\w+) (?P<name>\w+)\[(?P<size>\d+)\]"
                    r"(?: = \{(?P<values>[^}]*)\})?;$")  # fmt: skip


def _builds(code: str) -> list[tuple[str, str]]:
    """Each line of the C++ ``code`` that is not a preprocessor conditional, with the build it
    is in: ``sim`` (under ``#ifndef __SYNTHESIS__``: the C simulation), ``synth`` (its
    ``#else``) or ``both``."""
    lines, branches = [], []
    for line in code.splitlines():
        if line.startswith("#if"):
            branches.append("sim" if line == "#ifndef __SYNTHESIS__" else "both")
        elif line == "#else":
            branches[-1] = {"sim": "synth", "synth": "sim"}.get(branches[-1], "both")
        elif line == "#endif":
            branches.pop()
        else:
            lines.append((next((b for b in reversed(branches) if b != "both"), "both"), line))
    return lines


def _declarations(code: str) -> list[tuple[str, re.Match[str]]]:
    """The array declarations of the C++ ``code``, each with its build (:func:`_builds`)."""
    return [(build, array) for build, line in _builds(code) if (array := _ARRAY.match(line))]


def _assert_constant_arrays(project: Path, hls_model: Any) -> None:
    """Every weight, bias and scale array of ``project`` is, where synthesis reads it, defined
    once, ``static const``, with the values the C simulation loads into its own copy (the one
    non-const declaration, under ``#ifndef __SYNTHESIS__``); every typedef of its type in the
    layers' configs (the functions take it through those) is const; the arrays and nothing
    else but the layers' values are the arguments of the model's ``nnet::`` calls; and g++
    compiles the synthesis path (``__SYNTHESIS__`` defined once the open-source ``ap_types``,
    which refuse it, are in): no product there takes a non-const array."""
    firmware = project / "firmware"
    arrays = {v.name: v.type.name for layer in hls_model.get_layers() for v in layer.get_weights()}
    assert arrays
    for name, kind in arrays.items():
        declared = _declarations((firmware / "weights" / f"{name}.h").read_text())
        builds = [(build, array["name"], array["type"]) for build, array in declared]
        assert builds == [("sim", name, kind), ("synth", name, kind)], name
        (_, sim), (_, synth) = declared
        assert sim["qualifiers"] == "" and sim["values"] is None, name  # filled from the text
        assert synth["qualifiers"] == "static const " and synth["size"] == sim["size"], name
        text = (firmware / "weights" / f"{name}.txt").read_text()
        assert synth["values"] == text, name  # what the C simulation computes with
    for path in [*firmware.glob("*.h"), *firmware.glob("*.cpp")]:  # no other declaration
        assert not re.search(rf"\b({'|'.join(arrays)})\[", path.read_text()), path
    typedefs = re.findall(r"^ *typedef (const )?(\w+) (?:weight|bias|scale)_t;$",
                          (firmware / "parameters.h").read_text(), re.M)  # fmt: skip
    assert {kind for _, kind in typedefs} == set(arrays.values())
    assert all(const for const, _ in typedefs)
    cpp = "\n".join(line for build, line in _builds((firmware / "myproject.cpp").read_text())
                    if build != "sim")  # fmt: skip
    values = {v.name for v in hls_model.get_input_variables()}
    values |= {v.name for layer in hls_model.get_layers() for v in layer.get_variables()}
    passed = {arg for call in re.findall(r"\bnnet::\w+<[^;]*?>\(([^;]*)\);", cpp)
              for arg in call.split(", ")}  # fmt: skip
    assert set(arrays) <= passed <= values | set(arrays)
    synthesis = '#include "firmware/myproject.h"\n#define __SYNTHESIS__\n' \
        '#include "firmware/myproject.cpp"\n'  # fmt: skip
    compiled = subprocess.run(
        ["g++", "-fsyntax-only", "-std=c++11", f"-I{firmware / 'ap_types'}", f"-I{project}",
         "-x", "c++", "-"], input=synthesis, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert compiled.returncode == 0, compiled.stderr[-3000:]


@pytest.mark.slow
def test_every_weight_constant_in_the_project_is_zero_or_a_power_of_two(digits) -> None:
    model, hls_model, layers, project, _ = digits
    weights = {k: v for k, v in _written(project, hls_model, ("Conv2D", "Dense")).items()
               if k.endswith(".weight")}  # fmt: skip
    assert len(weights) == sum(op.op in ("conv", "linear") for op in model.ops)
    assert all(_pow2_or_zero(values) for values in weights.values())
    assert all(layer.non_pow2 == 0 for layer in layers if "weight" in layer.types)
    scales = _written(project, hls_model, ("BatchNormalization",))
    counted = sum(layer.non_pow2 for layer in layers if "scale" in layer.types)
    written = sum(int((np.frexp(np.abs(v[v != 0]))[0] != 0.5).sum())
                  for k, v in scales.items() if k.endswith(".scale"))  # fmt: skip
    assert counted == written > 0  # the requantization multipliers of the BatchNorm layers


@pytest.mark.slow
def test_every_weight_bias_and_scale_array_in_the_cpp_is_const(digits) -> None:
    _, hls_model, _, project, _ = digits
    _assert_constant_arrays(project, hls_model)


@pytest.mark.slow
def test_every_activation_type_is_the_integer_models(digits) -> None:
    model, _, layers, project, _ = digits
    defines = (project / "firmware" / "defines.h").read_text()
    for op in model.ops:
        if op.op != "conv":
            continue
        integer_bits = 8 + round(math.log2(op.attrs["scale"]))
        (bn,) = [layer for layer in layers if layer.name == f"bn_{op.name}".replace("__", "_")]
        assert bn.types["result"] == f"ufixed<8,{integer_bits},RND,SAT>"  # ReLU: 0..255
        assert f"ap_ufixed<8,{integer_bits},AP_RND,AP_SAT,0>" in defines


class ResidualRelu6(nn.Module):
    """Conv-BN-ReLU6, a 1x1 Conv-BN branch added to it, ReLU6, global average pooling, Linear:
    a residual add and ReLU6 clamps (on a conv and on an add)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Sequential(nn.Conv2d(3, 6, 3, padding=1, bias=False), nn.BatchNorm2d(6),
                                  nn.ReLU6())  # fmt: skip
        self.branch = nn.Sequential(nn.Conv2d(6, 6, 1, bias=False), nn.BatchNorm2d(6))
        self.fc = nn.Linear(6, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        y = nn.functional.relu6(y + self.branch(y))
        return self.fc(nn.functional.adaptive_avg_pool2d(y, 1).flatten(1))


def _residual_relu6_model(requant_terms: int | None = None) -> IntegerModel:
    """:class:`ResidualRelu6` at 3 bits with a level set per output channel (``mse`` n1) and
    random BatchNorm scales (negative ones too), calibrated on inputs large enough that both
    ReLU6 cut at 6 below their type's top; each requantization multiplier a sum of at most
    ``requant_terms`` signed powers of two where given."""
    from inq.quant.lower import Lowering

    torch.manual_seed(0)
    net = ResidualRelu6().eval()
    with torch.no_grad():
        for bn in (net.conv[1], net.branch[1]):
            bn.running_var.uniform_(0.5, 1.5)
            bn.weight.uniform_(-1.5, 1.5)
    lowering = Lowering(packed_model(net, 3, granularity="channel", n1_rule="mse"), act_bits=8,
                        requant_terms=requant_terms)  # fmt: skip
    gen = torch.Generator().manual_seed(2)
    lowering.calibrate([4 * torch.randn(16, 3, 8, 8, generator=gen) for _ in range(2)])
    data = {"name": "synthetic", "in_channels": 3, "image_size": 8, "num_classes": 4}
    return lowering.integer_model({"model": {}, "data": data, "act_bits": 8, "input_bits": 8,
                                   "requant_terms": requant_terms})  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("io_type", ["io_parallel", "io_stream"])
def test_a_residual_block_with_relu6_clamps_and_channel_level_sets_is_exact(
    io_type: str, tmp_path: Path
) -> None:
    model = _residual_relu6_model()
    assert all(isinstance(op.attrs["n1"], list) for op in model.ops if op.op == "conv")
    kinds = {op.op for op in model.ops if op.attrs.get("hi") not in (None, 127, 255, 2**31 - 1)}
    assert kinds == {"conv", "add"}  # both ReLU6 cut below their type's top
    hls_model, layers = export_hls4ml(model, tmp_path / "prj", (3, 8, 8), io_type=io_type)
    assert {layer.name for layer in layers} >= {"add", "sub", "sub_1"}
    x = 4 * torch.randn(512, 3, 8, 8, generator=torch.Generator().manual_seed(5))
    assert np.array_equal(run_csim(hls_model, x.numpy()), _expected(model, x))
    _assert_constant_arrays(tmp_path / "prj", hls_model)


@pytest.mark.slow
def test_requant_terms_1_makes_every_constant_a_power_of_two_and_stays_exact(
    tmp_path: Path,
) -> None:
    """Calibrated with ``requant_terms=1``, every requantization is a shift: the project's
    BatchNorm scales, like its weights, are all 0 or ``±2**k`` (without it they are not), the
    export says so, and the C simulation still equals the integer model bit for bit."""
    _, _, layers = hls_shadow(_residual_relu6_model(), (3, 8, 8))
    assert max(layer.terms for layer in layers) > 1  # the same model with 31-bit multipliers
    model = _residual_relu6_model(requant_terms=1)
    source = tmp_path / "r.int.safetensors"
    save_integer(source, model)
    hls_model, layers, printed = _export_by_the_cli(source, tmp_path / "prj")
    assert all(layer.non_pow2 == 0 and layer.terms <= 1 for layer in layers)
    written = _written(tmp_path / "prj", hls_model, ("Conv2D", "Dense", "BatchNormalization"))
    products = {k: v for k, v in written.items() if k.endswith((".weight", ".scale"))}
    assert sum(k.endswith(".scale") for k in products) >= 3  # conv, branch and fc requantize
    assert all(_pow2_or_zero(values) for values in products.values())
    assert "requantization multipliers not a power of two: 0, each a sum of at most 1 signed " \
        "powers of two (calibrated with requant_terms=1: 0 have more);" in printed  # fmt: skip
    _assert_constant_arrays(tmp_path / "prj", hls_model)
    x = 4 * torch.randn(512, 3, 8, 8, generator=torch.Generator().manual_seed(5))
    assert np.array_equal(run_csim(hls_model, x.numpy()), _expected(model, x))


@pytest.mark.slow
def test_the_readme_fashion_mnist_cnn_with_8_bit_ends_streams_exactly(tmp_path: Path) -> None:
    """Per-layer bits (first and last layer 8-bit, the rest 4-bit) on 28x28 maps, where only
    ``io_stream`` compiles in reasonable time."""
    model = fashion_integer_model(tmp_path, 4, eight_bit_ends=True)
    weight_ops = [op for op in model.ops if op.op in ("conv", "linear")]
    assert [op.attrs["bits"] for op in weight_ops] == [8, 4, 4, 4, 8]
    hls_model, layers = export_hls4ml(model, tmp_path / "prj", io_type="io_stream")
    assert all(layer.non_pow2 == 0 for layer in layers if "weight" in layer.types)
    x, _ = build_datasets(FASHION_DATA)[1].tensors
    x = x[:100]
    assert np.array_equal(run_csim(hls_model, x.numpy()), _expected(model, x))


@pytest.mark.slow
def test_a_clamp_no_op_folded_cuts_a_signed_input_at_both_ends(tmp_path: Path) -> None:
    from inq.quant.integer import IntOp

    ops = [IntOp("x", "input", [], {"scale": 2**-5, "lo": -128, "hi": 127}),
           IntOp("c", "clamp", ["x"], {"scale": 2**-5, "lo": 0, "hi": 96})]  # fmt: skip
    model = IntegerModel(ops, {})
    hls_model, layers = export_hls4ml(model, tmp_path / "prj", (2, 3, 3))
    assert [layer.name for layer in layers] == ["relu_c", "over_c", "cut_c", "sub"]
    x = 3 * torch.randn(256, 2, 3, 3, generator=torch.Generator().manual_seed(0))
    expected = _expected(model, x)
    assert expected.min() == 0 and expected.max() == 96 * 2**-5  # both ends cut
    assert np.array_equal(run_csim(hls_model, x.numpy()), expected)


def test_declare_constants_makes_the_arrays_const_or_names_the_file_it_cannot(
    tmp_path: Path,
) -> None:
    """On the files as hls4ml 1.3 writes them, the synthesis definition of each array becomes
    ``static const`` and the configs' typedefs of its type const; a header with one definition
    for both builds (what ``write_weights_txt=False`` writes) or no typedef of the type in a
    config is refused, naming the file, rather than left non-const."""
    firmware = tmp_path / "firmware"
    (firmware / "weights").mkdir(parents=True)
    variable = types.SimpleNamespace(name="w2", type=types.SimpleNamespace(name="conv_weight_t"))
    hls_model = types.SimpleNamespace(get_layers=lambda: [
        types.SimpleNamespace(get_weights=lambda: [variable])])  # fmt: skip
    header, parameters = firmware / "weights" / "w2.h", firmware / "parameters.h"
    simulated, synthesised = "conv_weight_t w2[3];\n", "conv_weight_t w2[3] = {0.5, 0, -1};\n"
    header.write_text(f"#ifndef __SYNTHESIS__\n{simulated}#else\n{synthesised}#endif\n")
    config = "struct config2 : nnet::conv2d_config {{\n    typedef {}conv_weight_t weight_t;\n}};\n"
    parameters.write_text("typedef conv_accum_t accum_t;\n" + config.format("") * 2)
    declare_constants(hls_model, tmp_path)
    assert header.read_text() == f"#ifndef __SYNTHESIS__\n{simulated}#else\n" \
        f"static const {synthesised}#endif\n"  # fmt: skip
    assert parameters.read_text() == "typedef conv_accum_t accum_t;\n" + config.format("const ") * 2
    header.write_text(synthesised)
    with pytest.raises(ValueError, match=rf"^{re.escape(str(header))}: not hls4ml 1.3's two "):
        declare_constants(hls_model, tmp_path)
    header.write_text(f"#ifndef __SYNTHESIS__\n{simulated}#else\n{synthesised}#endif\n")
    parameters.write_text("typedef conv_accum_t accum_t;\n")
    with pytest.raises(ValueError, match=rf"^{re.escape(str(parameters))}: no typedef of "):
        declare_constants(hls_model, tmp_path)


def test_exact_types_hold_their_values() -> None:
    assert exact_type(np.array([0.5, -0.25, 0.0])) == "fixed<3,1>"
    assert exact_type(np.array([-2.0, 1.0])) == "fixed<2,2>"  # -2 needs no extra bit
    assert exact_type(np.array([0.0])) == "ufixed<1,1>"
    scale = np.ldexp(np.array([2116310661, 1462002175], np.float64), -33)
    assert exact_type(scale) == "ufixed<31,-2>"  # 31-bit multipliers, exactly


def test_ops_without_an_exact_form_are_refused_naming_the_layer() -> None:
    _, mobilenet = shared_mobilenet_integer_model()
    with pytest.raises(ValueError, match=r"a grouped or dilated conv has no hls4ml form"):
        hls_shadow(mobilenet, (3, 16, 16))
    scaled = copy.deepcopy(shared_residual_integer_model())
    scaled.ops[1].attrs["scale"] = 0.3  # as calibrate --float-scales makes it
    with pytest.raises(ValueError, match=r"^conv: activation scale 0\.3 is not a power of two"):
        hls_shadow(scaled, (2, 4, 4))


@pytest.fixture
def int_file(tmp_path: Path) -> Path:
    path = tmp_path / "r.int.safetensors"
    model = shared_residual_integer_model()
    model.info["data"] = {"name": "synthetic", "in_channels": 2, "image_size": 4, "num_classes": 3}
    save_integer(path, model)
    return path


def test_cli_refuses_bad_requests_in_one_line_and_loses_nothing(int_file, tmp_path, capsys,
                                                                monkeypatch) -> None:  # fmt: skip
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "keep.txt").write_text("mine")
    for args, message in (
        ([], "--hls4ml needs -o DIR (the project's directory)"),
        (["--qonnx", "-o", str(tmp_path / "a.onnx")], "--qonnx and --hls4ml: choose one"),
        (["-o", str(busy)], f"{busy} is not empty; choose another -o, or --force to replace it"),
        (["-o", str(int_file)], f"-o {int_file}: a file; an hls4ml project is a directory"),
        (
            ["-o", str(int_file / "p")],
            f"-o {int_file / 'p'}: cannot write the project (File exists)",
        ),
        (
            ["-o", str(busy), "--force"],
            f"{busy} holds no inq_project.json: it is not an hls4ml project inq wrote; --force "
            "replaces only an hls4ml project inq wrote, as it wrote it: choose another -o",
        ),
    ):
        assert main(["export", str(int_file), "--hls4ml", *args]) == 1
        assert capsys.readouterr().err == f"inq export: error: {message}\n"
    monkeypatch.setitem(__import__("sys").modules, "hls4ml", None)
    assert main(["export", str(int_file), "--hls4ml", "-o", str(tmp_path / "x")]) == 1
    assert "pip install 'inq[fpga]'" in capsys.readouterr().err
    assert (busy / "keep.txt").read_text() == "mine" and not (tmp_path / "x").exists()


def test_a_compile_failure_names_the_first_error_and_restores_the_old_project(
    int_file: Path, tmp_path: Path, capsys, monkeypatch
) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "g++"  # a compiler that fails the way g++ does
    fake.write_text("#!/bin/sh\necho 'myproject.cpp:1:1: error: no compiler here' >&2\nexit 1\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    old = tmp_path / "prj"
    old.mkdir()
    (old / "myproject.cpp").write_text("an older project's")
    write_manifest(old)  # as an export leaves it
    argv = ["export", str(int_file), "--hls4ml", "-o", str(old), "--force"]
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(argv) == 1
    assert capsys.readouterr().err == (
        "inq export: error: the generated project does not compile: myproject.cpp:1:1: error: "
        "no compiler here\n"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bin", "prj", "r.int.safetensors"]
    assert sorted(p.name for p in old.iterdir()) == ["inq_project.json", "myproject.cpp"]
    assert (old / "myproject.cpp").read_text() == "an older project's"  # as it was


def _fake_compiler(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, body: str) -> None:
    """A ``g++`` first on PATH, running the shell ``body``."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "g++"
    fake.write_text(f"#!/bin/sh\n{body}\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def test_no_export_deletes_a_run_its_source_or_files_it_did_not_write(
    int_file: Path, tmp_path: Path, capsys, monkeypatch
) -> None:
    """Issue 46: ``--hls4ml -o RUN --force`` deleted a whole run (a running one too, whose
    lock it ignored), ``-o SRCDIR --force`` the source and the user's files, and ``-o .``
    failed with a raw error. --force replaces an hls4ml project inq wrote, unchanged, and
    nothing else; each refusal is one line, before any work, and every file stays."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "summary.json").write_text("{}")
    (run / "model.int.safetensors").write_bytes(int_file.read_bytes())
    (run / "checkpoints").mkdir()
    (run / "checkpoints" / "latest.pt").write_bytes(b"PK\x03\x04 a checkpoint")
    source = run / "model.int.safetensors"
    project = tmp_path / "prj"
    project.mkdir()
    (project / "myproject.cpp").write_text("exported")
    write_manifest(project)
    (project / "myproject.cpp").write_text("edited by hand")
    before = _snapshot(tmp_path)
    live = tmp_path / "live"
    lock = lock_dir(live)  # an inq-train run in progress holds its directory's lock
    (live / "summary.json").write_text("{}")
    monkeypatch.chdir(run / "checkpoints")
    for output, message in (
        (run, f"-o {run}: an inq-train run directory; write the project elsewhere"),
        (live, f"{live}: another process (pid {os.getpid()}) is working there; wait for it"),
        (tmp_path, f"-o {tmp_path}: holds {source}, the model the project is made from; choose "
                   "another -o"),
        (Path("."), "-o .: the current directory (or one holding it); name another"),
        (project, f"{project} myproject.cpp was changed since the export wrote it; --force "
                  "replaces only an hls4ml project inq wrote, as it wrote it: choose another -o"),
    ):  # fmt: skip
        assert main(["export", str(source), "--hls4ml", "-o", str(output), "--force"]) == 1
        assert capsys.readouterr() == ("", f"inq export: error: {message}\n"), output
    assert main(["eval", str(project)]) == 1  # it said "no packed file ..." with format ids
    assert capsys.readouterr().err.startswith(
        f"inq eval: error: {project} is an hls4ml project (inq export --hls4ml); inq eval takes "
    )
    lock.close()
    assert _snapshot(tmp_path) == {**before, "live/summary.json": b"{}",
                                   "live/.lock": f"{os.getpid()}\n".encode()}  # fmt: skip


def test_a_stopped_export_stops_its_compiler_and_leaves_nothing(
    int_file: Path, tmp_path: Path, monkeypatch
) -> None:
    """Issue 46: g++, started by the export, ran on in a deleted directory after SIGTERM. It
    runs in a process group the export kills; the project's directory never appears."""
    pids = tmp_path / "pids"
    _fake_compiler(tmp_path, monkeypatch, f"echo $$ >> {pids}\nexec sleep 60")
    out = tmp_path / "prj"
    export = subprocess.Popen(
        [sys.executable, "-m", "inq.cli", "export", str(int_file), "--hls4ml", "-o", str(out)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert export.stdout is not None
    assert "compiling its C simulation with g++" in export.stdout.readline()
    while not pids.exists() or not pids.read_text().strip():
        assert export.poll() is None, export.communicate()  # waiting for g++ to start
        time.sleep(0.05)
    export.send_signal(signal.SIGTERM)
    _, err = export.communicate(timeout=60)
    assert export.returncode == 143 and err == "inq export: interrupted; nothing was written\n"
    for pid in map(int, pids.read_text().split()):
        assert not _running(pid), pid
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bin", "pids", "r.int.safetensors"]


def test_a_killed_exports_compiler_is_stopped_by_the_next_export(
    int_file: Path, tmp_path: Path, monkeypatch
) -> None:
    """SIGKILL gives the export no chance to stop its g++ (the re-trial of issue 46 found it
    compiling on in a deleted directory): the next export to the same place stops it."""
    pids, fail = tmp_path / "pids", tmp_path / "fail"
    _fake_compiler(tmp_path, monkeypatch, f"[ -e {fail} ] && exit 1\necho $$ >> {pids}\n"
                                          "exec sleep 60")  # fmt: skip
    out = tmp_path / "prj"
    argv = [sys.executable, "-m", "inq.cli", "export", str(int_file), "--hls4ml", "-o", str(out)]
    export = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    while not pids.exists() or not pids.read_text().strip():
        assert export.poll() is None  # waiting for g++ to start
        time.sleep(0.05)
    export.kill()
    export.communicate()
    (pid,) = map(int, pids.read_text().split())
    assert _running(pid)  # on its own, in the temporary project
    fail.touch()  # the next compile fails at once
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(argv[3:]) == 1
    assert not _running(pid)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bin", "fail", "pids",
                                                          "r.int.safetensors"]  # fmt: skip


def _running(pid: int) -> bool:
    """Whether ``pid`` is a process that is not a zombie (killed, not yet reaped by init)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


@pytest.mark.slow
def test_force_replaces_a_project_and_a_killed_exports_leftovers_go(
    int_file: Path, tmp_path: Path
) -> None:
    """A project inq wrote is replaced by --force; a SIGKILLed export's temporary directory is
    removed by the next export to the same place (issue 46: one stayed, hidden, forever)."""
    out = tmp_path / "prj"
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(["export", str(int_file), "--hls4ml", "-o", str(out)]) == 0
    assert project_problem(out) is None
    assert f"OutputDir: {out}" in (out / "hls4ml_config.yml").read_text()
    script = (
        "import os, signal, sys; import inq.deploy.hls4ml as h\n"
        "h._compile = lambda *a: os.kill(os.getpid(), signal.SIGKILL)\n"
        "from inq.cli import main; main(sys.argv[1:])\n"
    )
    argv = ["export", str(int_file), "--hls4ml", "-o", str(out), "--force"]
    assert subprocess.run([sys.executable, "-c", script, *argv], check=False,
                          capture_output=True).returncode == -9  # fmt: skip
    assert len(list(tmp_path.glob(".prj.*.tmp"))) == 1
    (out / "firmware" / "myproject.cpp").unlink()  # the user removed it: still the project
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(argv) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["prj", "r.int.safetensors"]
    assert project_problem(out) is None and (out / "firmware" / "myproject.cpp").exists()
    with contextlib.redirect_stdout(io.StringIO()) as printed:
        assert main(["verify", str(out)]) == 0
    assert printed.getvalue() == f"{out} (hls4ml project): OK: every file is as inq export " \
        "--hls4ml wrote it (sha256)\n"  # fmt: skip
    with open(out / "firmware" / "parameters.h", "a") as edited:
        edited.write("// a change\n")
    assert main(["verify", str(out)]) == 1


@pytest.mark.slow
def test_a_full_disk_leaves_nothing_and_says_so(int_file: Path, tmp_path: Path) -> None:
    """A file size limit (what a full disk does to write): while hls4ml copies its headers,
    and while g++ compiles (it printed "ld returned 1" and a log that no longer existed)."""
    for limit in (64 * 1024, 400 * 1024):
        proc = subprocess.run(
            [sys.executable, "-m", "inq.cli", "export", str(int_file), "--hls4ml", "-o",
             str(tmp_path / "prj")],
            capture_output=True, text=True, timeout=300,
            preexec_fn=lambda limit=limit: resource.setrlimit(resource.RLIMIT_FSIZE,
                                                              (limit, limit)),
        )  # fmt: skip
        assert proc.returncode == 1, proc.stderr
        assert proc.stderr == (
            f"inq export: error: -o {tmp_path / 'prj'}: cannot write the project (file too "
            "large (a file size limit, ulimit -f))\n"
        ), limit
        assert sorted(p.name for p in tmp_path.iterdir()) == ["r.int.safetensors"]


@pytest.mark.slow
def test_inq_export_hls4ml_prints_each_layers_types_and_multiplications(digits) -> None:
    _, _, layers, project, printed = digits
    assert f"d.int.safetensors -> {project}: hls4ml project (Vitis, io_parallel)" in printed
    for layer in layers:
        if "weight" in layer.types:
            row = rf"^{layer.name} +{layer.op} +{re.escape(layer.types['weight'])} +"
            assert re.search(row + rf".* 0/{layer.constants}$", printed, re.M)
    assert "weights multiplied by a non-power-of-two constant: 0;" in printed
    most = max(layer.terms for layer in layers if "scale" in layer.types)
    assert most > 1 and re.search(
        r"; requantization multipliers not a power of two: [1-9]\d*, each a sum of at most "
        rf"{most} signed powers of two \(calibrated without requant_terms\); weights, biases and "
        "scales static const for synthesis;", printed)  # fmt: skip
    assert (project / "build_prj.tcl").exists() and list((project / "firmware").glob("*.so"))
