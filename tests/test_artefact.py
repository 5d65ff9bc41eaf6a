"""inq.artefact: one way in to every file inq writes, each header read once."""

from __future__ import annotations

import shutil
from collections import Counter
from pathlib import Path

import pytest
import torch
from deploy_helpers import shared_residual_integer_model
from export_fixtures import digits_masked, masked_file
from safetensors.torch import save_file

import inq.fileio
from inq import runfiles
from inq.artefact import (
    CHECKPOINT,
    INTEGER_MODEL,
    MASKED_CHECKPOINT,
    NO_KIND,
    ONNX_MODEL,
    PACKED_FILE,
    OnnxFile,
    open_artefact,
    read_header,
)
from inq.cli import main
from inq.masked import MaskedCheckpoint, load_masked
from inq.packed import PackedFile, export_packed
from inq.quant.integer import IntegerModel, save_integer


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    """One file of each kind inq opens."""
    masked, _ = masked_file(tmp_path)
    packed = tmp_path / "m.inq.safetensors"
    export_packed(masked, packed)
    integer = tmp_path / "m.int.safetensors"
    save_integer(integer, shared_residual_integer_model())
    onnx = tmp_path / "m.onnx"
    onnx.write_bytes(b"\x08\x09 protobuf")  # never parsed: classifying needs no onnx extra
    return {"masked": masked, "packed": packed, "integer": integer, "onnx": onnx}


def test_each_kind_opens_as_its_typed_object(files: dict[str, Path]) -> None:
    expected = {
        "masked": (MASKED_CHECKPOINT, "inq-masked/3", MaskedCheckpoint),
        "packed": (PACKED_FILE, "inq-packed/3", PackedFile),
        "integer": (INTEGER_MODEL, "inq-int/1", IntegerModel),
        "onnx": (ONNX_MODEL, None, OnnxFile),
    }
    for name, (kind, fmt, cls) in expected.items():
        header = read_header(files[name])
        assert (header.kind, header.format, header.path) == (kind, fmt, files[name])
        assert type(open_artefact(files[name])) is cls
        assert type(open_artefact(header)) is cls  # the header, reused
    ckpt = open_artefact(files["masked"])
    assert isinstance(ckpt, MaskedCheckpoint)
    reference = load_masked(files["masked"])
    for key, value in reference.state.items():
        assert torch.equal(ckpt.state[key], value)
    assert open_artefact(files["onnx"]) == OnnxFile(files["onnx"])


def test_what_is_no_artefact_is_one_clear_error(files: dict[str, Path], tmp_path: Path) -> None:
    pickle = tmp_path / "latest.pt"
    pickle.write_bytes(b"PK\x03\x04 torch.save's zip")
    other = tmp_path / "other.safetensors"
    save_file({"w": torch.ones(2)}, other, {"format": "someone-else/1"})
    truncated = tmp_path / "cut.safetensors"
    whole = files["packed"].read_bytes()
    truncated.write_bytes(whole[:20])  # inside the header
    cut = tmp_path / "cut.int.safetensors"
    cut.write_bytes(whole[:-10])  # inside the tensors: issue 46 called it "of no kind"
    tiny = tmp_path / "tiny.int.safetensors"
    tiny.write_bytes(whole[:4])  # the re-trial of issue 46: "a file of no kind inq reads"
    changed = tmp_path / "changed.safetensors"
    changed.write_bytes(whole[:10] + b"!" + whole[11:])  # the header is no longer JSON
    notes = tmp_path / "notes.txt"
    notes.write_text("hello")
    cases = {
        tmp_path / "missing.safetensors": "missing.safetensors: no such file or directory",
        tmp_path: "a directory; name a file",
        pickle: f"{pickle}: {CHECKPOINT}, not a file inq opens",
        other: "safetensors file of no INQ format (format 'someone-else/1'), not a file inq opens",
        truncated: f"{truncated}: cut short: a safetensors file whose header alone is "
        f"{8 + int.from_bytes(whole[:8], 'little')} B, 20 B here",
        cut: f"{cut}: cut short: a safetensors file of {len(whole)} B by its header, "
        f"{len(whole) - 10} B here",
        tiny: f"{tiny}: cut short: 4 B, too short for a safetensors file",
        changed: f"{changed}: a damaged safetensors file: its header does not describe its "
        "contents",
        notes: f"{notes}: cannot read as safetensors (",
    }
    for path, message in cases.items():
        with pytest.raises(ValueError) as err:
            open_artefact(path)
        assert message in str(err.value), (path, str(err.value))
        assert "\n" not in str(err.value)
    assert read_header(notes).kind == NO_KIND


def test_an_invalid_artefact_fails_with_its_loaders_message(files: dict[str, Path]) -> None:
    data = bytearray(files["packed"].read_bytes())
    data[-1] ^= 0xFF  # a code byte: off the level set, and the digest no longer matches
    files["packed"].write_bytes(bytes(data))
    with pytest.raises(
        ValueError, match=r"m\.inq\.safetensors: '.*': 1 code\(s\) outside the 5-bit"
    ):
        open_artefact(files["packed"])
    packed = open_artefact(files["packed"], validate=False)  # for inq verify
    assert isinstance(packed, PackedFile) and packed.digest_problem is not None


@pytest.fixture
def header_reads(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """How often each file's safetensors header is read (every read opens it through
    ``inq.fileio.safe_open``)."""
    reads: Counter[str] = Counter()
    real = inq.fileio.safe_open

    def counting(path: str, *args: str) -> object:
        reads[Path(path).name] += 1
        return real(path, *args)

    monkeypatch.setattr(inq.fileio, "safe_open", counting)
    return reads


def test_open_artefact_reads_the_header_once(files: dict[str, Path], header_reads) -> None:
    for name in ("masked", "packed", "integer"):
        open_artefact(read_header(files[name]))
    assert header_reads == {files[n].name: 1 for n in ("masked", "packed", "integer")}


def test_each_command_reads_each_header_once(capsys, tmp_path: Path, header_reads) -> None:
    """``inq export``, ``calibrate``, ``eval``, ``info`` and ``verify``, from a run directory
    and from the files themselves: each file a command reads, its header once."""
    run = tmp_path / "run"
    run.mkdir()
    shutil.copy(digits_masked(tmp_path), run / runfiles.MASKED)
    packed, integer = tmp_path / "d.inq.safetensors", tmp_path / "d.int.safetensors"
    qonnx = tmp_path / "d.qonnx.onnx"
    commands = [
        (["export", run, "-o", packed], [runfiles.MASKED]),
        (["calibrate", run, "--batches", "1", "-o", integer], [runfiles.MASKED]),
        (["calibrate", packed, "--batches", "1", "-o", integer, "--force"], [packed.name]),
        (["eval", packed], [packed.name]),
        (["eval", integer], [integer.name]),
        (["eval", run], [runfiles.MASKED]),
        (["info", packed], [packed.name]),
        (["info", integer], [integer.name]),
        (["verify", packed], [packed.name]),
        (["verify", run / runfiles.MASKED], [runfiles.MASKED]),
        (["verify", integer], [integer.name]),
        (["export", integer, "--qonnx", "-o", qonnx], [integer.name]),
        (["eval", qonnx], [qonnx.name]),  # the attempt to read it as safetensors
        (["verify", qonnx], [qonnx.name]),
    ]
    for argv, names in commands:
        header_reads.clear()
        assert main([str(a) for a in argv]) == 0, capsys.readouterr().err
        assert header_reads == dict.fromkeys(names, 1), argv
    capsys.readouterr()
