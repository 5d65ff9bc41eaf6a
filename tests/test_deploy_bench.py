"""``inq bench onnx`` (inq.deploy.bench): the structure of what it prints and writes, which kernels
it finds in ORT's optimized graphs, ORT's own quantization as a peer, and one-line errors. No
assertion on a time: only that every figure is a finite positive number."""

from __future__ import annotations

import errno
import json
import math
import os
import re
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx
import pytest
from deploy_helpers import forkserver_workers
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

from inq.cli import main
from inq.deploy.bench import PEER_NAME, OnnxFile, calibration_inputs, count_ops
from inq.deploy.onnx import save_onnx
from inq.deploy.openvino import RUNTIMES
from inq.deploy.qonnx import QONNX_DOMAIN

DATA = {"name": "synthetic", "in_channels": 3, "image_size": 8, "num_classes": 4}
FAST = ["--repeats", "2", "--batches", "1", "--threads", "1", "--warmup", "1"]


def tiny_float(path: Path, data: dict | None = DATA) -> Path:
    """Conv-ReLU-Conv-ReLU-pool-Gemm on [batch, 3, 8, 8], dynamic batch, opset 18."""
    rng = np.random.default_rng(0)

    def init(name: str, *shape: int) -> TensorProto:
        return numpy_helper.from_array((0.3 * rng.standard_normal(shape)).astype(np.float32), name)

    nodes = [
        helper.make_node("Conv", ["input", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c2"], ["r2"]),
        helper.make_node("GlobalAveragePool", ["r2"], ["pool"]),
        helper.make_node("Flatten", ["pool"], ["flat"]),
        helper.make_node("Gemm", ["flat", "wf", "bf"], ["logits"], transB=1),
    ]
    weights = [init("w1", 8, 3, 3, 3), init("b1", 8), init("w2", 8, 8, 3, 3), init("b2", 8)]
    weights += [init("wf", 4, 8), init("bf", 4)]
    graph = helper.make_graph(
        nodes,
        "tiny",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", 3, 8, 8])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 4])],
        weights,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    if data is not None:
        model.metadata_props.add(key="inq_data", value=json.dumps(data))
    onnx.checker.check_model(model)
    save_onnx(model, path)  # as inq writes it: with its digest
    return path


def tiny_qonnx(path: Path) -> Path:
    """:func:`tiny_float` with its input through a QONNX ``Quant`` node (8-bit, signed): what
    ``inq export --qonnx`` writes, and what ONNX Runtime cannot run."""
    model = onnx.load(str(tiny_float(path)))
    model.graph.initializer.extend(
        numpy_helper.from_array(np.array(v, dtype=np.float32), name)
        for name, v in (("scale", 0.05), ("zero", 0.0), ("bits", 8.0))
    )
    attributes = {"signed": 1, "narrow": 0, "rounding_mode": "ROUND"}
    quant = helper.make_node(
        "Quant", ["input", "scale", "zero", "bits"], ["q"], domain=QONNX_DOMAIN, **attributes
    )
    model.graph.node[0].input[0] = "q"
    model.graph.node.insert(0, quant)
    model.opset_import.append(helper.make_opsetid(QONNX_DOMAIN, 1))
    save_onnx(model, path)  # as inq writes it: with its digest
    return path


class _Random(CalibrationDataReader):
    def __init__(self) -> None:
        rng = np.random.default_rng(1)
        self.feeds = iter(
            {"input": rng.standard_normal((4, 3, 8, 8), dtype=np.float32)} for _ in range(2)
        )

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self.feeds, None)


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """A float model, its QDQ quantization by ONNX Runtime (what ORT runs in integer), and a
    QONNX file."""
    folder = tmp_path_factory.mktemp("bench_onnx")
    float_file = tiny_float(folder / "float.onnx")
    qdq = folder / "qdq.onnx"
    quantize_static(str(float_file), str(qdq), _Random(), quant_format=QuantFormat.QDQ,
                    per_channel=True, activation_type=QuantType.QUInt8,
                    weight_type=QuantType.QInt8)  # fmt: skip
    return float_file, qdq, tiny_qonnx(folder / "q.qonnx.onnx")


@pytest.fixture
def forked(monkeypatch: pytest.MonkeyPatch) -> None:
    """The command's worker processes forked from a fork server (deploy_helpers), not spawned:
    for the tests of what the command prints and writes. The tests of the processes themselves
    (test_each_runtime_is_timed_in_its_own_process, test_a_run_that_fails_in_a_worker_is_one_line)
    spawn them as the command does."""
    forkserver_workers(monkeypatch)


def run(capsys: pytest.CaptureFixture[str], *argv: object) -> tuple[int, str, str]:
    code = main(["bench", "onnx", *map(str, argv)])
    out, err = capsys.readouterr()
    return code, out, err


def _ops_line(out: str, name: str) -> str:
    return next(line for line in out.splitlines() if re.match(rf"{name} +conv/linear: ", line))


def test_two_files_side_by_side(files, tmp_path: Path, capsys, forked) -> None:
    float_file, qdq, _ = files
    out_json = tmp_path / "bench.json"
    code, out, err = run(capsys, float_file, qdq, *FAST, "--json", out_json)
    assert code == 0, err
    assert re.search(r"conv/linear: 0 integer, 3 float \(", _ops_line(out, "float.onnx"))
    qdq_ops = _ops_line(out, "qdq.onnx")
    assert "conv/linear: 3 integer (2 QLinearConv, 1 QGemm), 0 float" in qdq_ops, qdq_ops
    lines = out.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("ONNX Runtime "))
    assert "CPUExecutionProvider" in lines[header] and "median of 2 runs" in lines[header]
    table = lines[header + 1 : header + 5]
    assert table[0].split() == ["file", "b=1", "t=1", "ms", "vs", "1st"]
    assert set(table[1]) == {"-"}
    assert table[2].startswith("float.onnx") and table[2].endswith("1.00x")
    assert table[3].startswith("qdq.onnx") and re.search(r"\d+\.\d{3} +\d+\.\d\dx$", table[3])
    assert err.count("\n") == 1 and "batch 1, 1 thread: 2 files, 2 runs each" in err

    payload = json.loads(out_json.read_text())
    assert {"onnxruntime", "cpu", "settings", "files", "peer", "results"} <= set(payload)
    assert payload["peer"] is None
    assert [f["name"] for f in payload["files"]] == ["float.onnx", "qdq.onnx"]
    assert payload["files"][1]["ops"]["integer"] == {"QLinearConv": 2, "QGemm": 1}
    assert payload["files"][1]["ops"]["float"] == {}
    assert payload["files"][0]["input"] == [3, 8, 8]
    results = payload["results"]
    assert [(r["file"], r["batch"], r["threads"], r["repeats"]) for r in results] == [
        ("float.onnx", 1, 1, 2),
        ("qdq.onnx", 1, 1, 2),
    ]
    for r in results:
        for key in ("median_ms", "min_ms", "speedup"):
            assert math.isfinite(r[key]) and r[key] > 0, r
    assert results[0]["speedup"] == 1.0


def test_the_peer_is_ort_quantize_static_calibrated_on_the_recorded_data(
    files, capsys, forked
) -> None:
    float_file, *_ = files
    code, out, err = run(capsys, float_file, "--peer", *FAST)
    assert code == 0, err
    first = out.splitlines()[0]
    assert first.startswith(f"ort quantize_static of {float_file}: ")
    assert "QDQ, per-channel QInt8 weights, QUInt8 activations" in first
    assert "calibrated on 4 batches of 16 synthetic validation images" in first
    peer_ops = _ops_line(out, "ort quantize_static")
    assert re.search(r"conv/linear: 3 integer \(.*\), 0 float", peer_ops), peer_ops
    assert out.splitlines()[-1].startswith("ort quantize_static ")  # the table's last row


def test_calibration_falls_back_to_random_inputs() -> None:
    plain = OnnxFile(Path("m.onnx"), "m.onnx", "input", (3, 8, 8), {})
    inputs, what = calibration_inputs(plain)
    assert what == "4 batches of 16 random normal inputs (the file records no data)"
    assert [x.shape for x in inputs] == [(16, 3, 8, 8)] * 4
    cifar = OnnxFile(Path("m.onnx"), "m.onnx", "input", (3, 32, 32), {"name": "cifar10"})
    inputs, what = calibration_inputs(cifar)
    assert what.startswith("4 batches of 16 random normal inputs (cifar10 does not load here: ")
    assert inputs[0].dtype == np.float32


def test_op_kinds() -> None:
    ops = count_ops(["NchwcConv", "MatMulInteger", "FusedGemm", "Relu", "NchwcConv"])
    assert ops.integer == {"MatMulInteger": 1}
    assert ops.float == {"NchwcConv": 2, "FusedGemm": 1}
    assert ops.line() == (
        "conv/linear: 1 integer (1 MatMulInteger), 3 float (2 NchwcConv, 1 FusedGemm); "
        "other: 1 Relu"
    )


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["missing.onnx"], "missing.onnx: no such file"),
        (
            ["model.pt"],
            "model.pt is a training checkpoint (for trainer.resume); inq bench onnx "
            "takes an ONNX model",
        ),
        (["dir.onnx"], "dir.onnx is a directory; inq bench onnx takes an ONNX model"),
        (["garbage.onnx"], "garbage.onnx: cannot load as ONNX ("),
        (
            ["FLOAT", "QONNX"],
            "q.qonnx.onnx: a QONNX model (Quant nodes): neither ONNX Runtime nor OpenVINO runs "
            "it, so inq bench onnx cannot time it; inq eval runs it in qonnx's executor",
        ),
        (["FLOAT", "--json", "."], "--json .: a directory; name the file to write"),
        (["QDQ", "--peer"], "is quantized already (2 QLinearConv, 1 QGemm, "),
        (["FLOAT", "--batches", "0"], "--batches 0: must be at least 1"),
        (["FLOAT", "--repeats", "0"], "--repeats 0: must be at least 1"),
        (["FLOAT", "--warmup", "-1"], "--warmup -1: must be at least 0"),
        (["FLOAT", "--warmup", "0"], "--warmup 0: give --repeats too (without it, the number"),
    ],
)
def test_errors_are_one_line(
    files, tmp_path: Path, capsys, monkeypatch, forked, argv, message
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "garbage.onnx").write_bytes(b"not a model")
    (tmp_path / "model.pt").write_bytes(b"PK\x03\x04 a torch.save zip")
    (tmp_path / "dir.onnx").mkdir()
    named = {"FLOAT": str(files[0]), "QDQ": str(files[1]), "QONNX": str(files[2])}
    argv = [named.get(a, a) for a in argv]
    code, out, err = run(capsys, *argv)
    assert code == 1 and out == ""
    assert err.startswith("inq bench: error: ") and message in err and err.count("\n") == 1, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dir.onnx", "garbage.onnx", "model.pt"]


@pytest.mark.parametrize("place", ["read-only", "under a file"])
def test_a_json_that_cannot_be_written_is_refused_before_timing(
    files, tmp_path: Path, capsys, monkeypatch, place
) -> None:
    """One line and no timing (no progress line on stderr) where --json cannot be written: a
    read-only folder (mkstemp refused, as root is refused on a read-only file system), or a
    folder to make under a file."""
    if place == "read-only":
        target, where = tmp_path / "new" / "bench.json", str(tmp_path)

        def refused(*args: object, **kwargs: object) -> tuple[int, str]:
            raise OSError(errno.EROFS, "Read-only file system")

        monkeypatch.setattr(tempfile, "mkstemp", refused)
        message = f"--json {target}: cannot write in {where} (Read-only file system)"
    else:
        (tmp_path / "file").write_text("")
        target = tmp_path / "file" / "bench.json"
        message = f"--json {target}: {tmp_path / 'file'} is not a directory"
    code, out, err = run(capsys, files[0], *FAST, "--json", target)
    assert (code, out, err) == (1, "", f"inq bench: error: {message}\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == (["file"] if place != "read-only" else [])


def test_no_warm_up_is_a_choice(files, capsys, forked) -> None:
    """--warmup 0 with --repeats: the first run of each file is timed too."""
    code, out, err = run(capsys, files[0], *FAST[:-1], "0")
    assert FAST[-2:] == ["--warmup", "1"] and code == 0, err
    assert "median of 2 runs after 0 warm-up" in out


def test_a_run_that_fails_in_a_worker_is_one_line(tmp_path: Path, capsys) -> None:
    """A graph that loads but cannot run at the batch (a Reshape to a fixed batch of 1): the
    worker process's error comes back as the command's one line, and the workers stop."""
    shape = numpy_helper.from_array(np.array([1, 192], dtype=np.int64), "shape")
    graph = helper.make_graph(
        [helper.make_node("Reshape", ["input", "shape"], ["flat"])],
        "fixed",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", 3, 8, 8])],
        [helper.make_tensor_value_info("flat", TensorProto.FLOAT, [1, 192])],
        [shape],
    )
    path = tmp_path / "fixed.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), path)
    code, _, err = run(capsys, path, *FAST[:2], "--batches", "2", *FAST[4:])
    *progress, last = err.splitlines()
    assert code == 1 and progress == ["batch 2, 1 thread: 1 files, 2 runs each, interleaved"]
    assert last.startswith(f"inq bench: error: {path}: does not run at batch 2: "), err


def test_the_same_file_twice_is_two_rows_against_the_first(
    files, tmp_path: Path, capsys, forked
) -> None:
    """Each row has its own timings (the reference row 1.00x by construction); the second copy
    of a file is named apart. --json into a folder that does not exist yet: made at the end."""
    out_json = tmp_path / "new" / "bench.json"
    code, out, err = run(capsys, files[0], files[0], *FAST, "--json", out_json)
    assert code == 0, err
    table = out.splitlines()[-5:-1]
    assert table[2].startswith("float.onnx ") and table[2].endswith(" 1.00x")
    assert table[3].startswith("float.onnx (2) ")
    results = json.loads(out_json.read_text())["results"]
    assert [r["file"] for r in results] == ["float.onnx", "float.onnx (2)"]
    assert results[0]["speedup"] == 1.0
    assert results[1]["speedup"] == results[0]["median_ms"] / results[1]["median_ms"]


def test_missing_onnx_extra_is_one_line(files, capsys, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # import onnxruntime -> ImportError
    code, _, err = run(capsys, files[0], *FAST)
    assert code == 1 and err.count("\n") == 1
    assert err.startswith("inq bench: error: inq bench onnx needs the onnx extra: pip install")


def test_bench_help_names_both_targets(capsys) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["bench", "--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert re.search(r"^ +kernel +time the Triton kernels", out, flags=re.M)
    assert re.search(r"^ +onnx +ONNX Runtime CPU latency", out, flags=re.M)
    with pytest.raises(SystemExit):
        main(["bench"])  # a target is required
    assert "TARGET" in capsys.readouterr().err


def test_both_runtimes_side_by_side_with_the_peer(files, tmp_path: Path, capsys, forked) -> None:
    """--runtime both: a kernel line and a table row per file in each runtime (the peer, made by
    ONNX Runtime, timed in both too), the speed-ups against the first file in the same runtime;
    OpenVINO runs every conv/linear of ORT's QDQ files in int8 and of the float file in f32."""
    float_file, qdq, _ = files
    out_json = tmp_path / "bench.json"
    code, out, err = run(capsys, float_file, qdq, "--peer", "--runtime", "both", *FAST,
                         "--json", out_json)  # fmt: skip
    assert code == 0, err
    rows = [(n, r) for n in ("float.onnx", "qdq.onnx", PEER_NAME) for r in RUNTIMES]
    ov = {n: _ops_line(out, rf"{re.escape(n)} \[openvino\]") for n in ("float.onnx", "qdq.onnx")}
    assert ov["float.onnx"].endswith("  conv/linear: 0 int8, 3 f32"), ov
    assert re.search(r"  conv/linear: 3 int8 \(.*\)$", ov["qdq.onnx"]), ov
    assert "conv/linear: 3 integer" in _ops_line(out, r"qdq\.onnx \[onnxruntime\]")
    assert re.search(r"^OpenVINO \d+\.\d+.*INFERENCE_PRECISION_HINT=f32", out, flags=re.M)
    table = out.splitlines()[-7:-1]
    assert [line.split("  ")[0] for line in table] == [f"{n} [{r}]" for n, r in rows]
    assert table[0].endswith(" 1.00x") and table[1].endswith(" 1.00x")  # each runtime's 1st
    assert "batch 1, 1 thread: 3 files in 2 runtimes, 2 runs each, interleaved" in err

    payload = json.loads(out_json.read_text())
    assert payload["openvino"] == out.split("OpenVINO ")[1].split(",")[0]
    assert payload["settings"]["runtimes"] == list(RUNTIMES)
    results = payload["results"]
    assert [(r["file"], r["runtime"]) for r in results] == rows
    first = {r["runtime"]: r["median_ms"] for r in results[:2]}
    for r in results:
        assert r["speedup"] == first[r["runtime"]] / r["median_ms"] and r["median_ms"] > 0
    qdq_record = payload["files"][1]
    assert qdq_record["openvino_precisions"] == ov["qdq.onnx"].split("  ")[-1]
    layers = qdq_record["openvino_layers"]
    assert len(layers) == 3 and all(x["int8"] and x["precision"] in ("u8", "i8") for x in layers)
    assert {x["layer_type"] for x in layers} <= {"Convolution", "FullyConnected", "MatMul"}


def test_each_runtime_is_timed_in_its_own_process(
    files, tmp_path: Path, capsys, monkeypatch
) -> None:
    """--runtime both: no session is made (and so no run timed) in the calling process; each
    runtime has its worker process, and the output and the JSON say so. (Timed side by side in
    one process, OpenVINO's and ONNX Runtime's thread pools slowed each other's runs: ORT rows
    ~3x slower than the same file timed alone, issue 46.)"""
    import inq.deploy.bench as bench

    def in_this_process(*args: object) -> None:
        raise AssertionError("a runtime session made in the calling process")

    monkeypatch.setattr(bench, "_session", in_this_process)
    workers = []  # the command's own workers, as it starts them (spawned)

    class Seen(bench.RuntimeWorkers):
        def load(self, files: list[OnnxFile]) -> None:
            workers.append(self.pids)
            super().load(files)

    monkeypatch.setattr(bench, "RuntimeWorkers", Seen)
    out_json = tmp_path / "bench.json"
    code, out, err = run(capsys, files[0], "--runtime", "both", *FAST, "--json", out_json)
    assert code == 0, err
    assert f"\n{bench.ISOLATION}: neither runtime's threads take cores from" in out
    assert ", interleaved, each runtime in its own process, in turn\n" in err
    payload = json.loads(out_json.read_text())
    assert payload["settings"]["isolation"] == bench.ISOLATION
    (pids,) = workers
    assert list(pids) == list(RUNTIMES)
    assert len(set(pids.values())) == 2 and os.getpid() not in pids.values()


def test_openvino_alone_and_without_its_extra(files, capsys, monkeypatch, forked) -> None:
    """--runtime openvino: only OpenVINO's lines and rows; without the module, one message."""
    code, out, err = run(capsys, files[0], "--runtime", "openvino", *FAST)
    assert code == 0, err
    assert "ONNX Runtime " not in out and "conv/linear: 0 integer" not in out
    assert out.splitlines()[-1].startswith("float.onnx [openvino] ")
    monkeypatch.setitem(sys.modules, "openvino", None)  # import openvino -> ImportError
    code, out, err = run(capsys, files[0], "--runtime", "both", *FAST)
    assert (code, out) == (1, "")
    assert err == (
        "inq bench: error: --runtime openvino needs the openvino extra: pip install "
        "'inq[openvino]' (openvino is missing)\n"
    )
