"""inq.runfiles: one rule for finding a model file in a run directory."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from export_fixtures import masked_file

from inq import runfiles
from inq.fileio import lock_dir
from inq.masked import MASKED_FORMATS
from inq.packed import export_packed
from inq.runfiles import find_model, load_model


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    """A directory laid out as inq-train leaves it: the masked checkpoint and its packed file."""
    masked, _ = masked_file(tmp_path / "src")
    run = tmp_path / "run"
    run.mkdir()
    shutil.copy(masked, run / runfiles.MASKED)
    export_packed(run / runfiles.MASKED, run / runfiles.PACKED)
    return run


def test_a_run_gives_its_own_files_first(run_dir: Path) -> None:
    (run_dir / "nested").mkdir()
    shutil.copy(run_dir / runfiles.MASKED, run_dir / "nested" / "other.safetensors")
    assert find_model(run_dir, MASKED_FORMATS).path == run_dir / runfiles.MASKED
    packed, path = load_model(run_dir)
    assert path == run_dir / runfiles.PACKED
    masked_packed, _ = load_model(run_dir / runfiles.MASKED)  # packed in memory: the same codes
    assert packed.layers.keys() == masked_packed.layers.keys()
    for key, layer in packed.layers.items():
        assert torch.equal(layer.codes(), masked_packed.layers[key].codes())


def test_a_directory_without_run_files_gives_its_only_model(run_dir: Path) -> None:
    (run_dir / runfiles.MASKED).rename(run_dir / "renamed.safetensors")
    assert find_model(run_dir, MASKED_FORMATS).path == run_dir / "renamed.safetensors"
    (run_dir / runfiles.PACKED).unlink()
    shutil.copy(run_dir / "renamed.safetensors", run_dir / "copy.safetensors")
    with pytest.raises(ValueError, match=r"2 masked checkpoints .*pass one"):
        find_model(run_dir, MASKED_FORMATS)


def test_what_is_not_a_model_is_one_message(run_dir: Path, tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ValueError, match="no masked checkpoint"):
        find_model(empty, MASKED_FORMATS)
    with pytest.raises(ValueError, match="no such file"):
        load_model(tmp_path / "missing")
    with pytest.raises(ValueError, match=r"not an INQ masked checkpoint .format 'inq-packed/"):
        find_model(run_dir / runfiles.PACKED, MASKED_FORMATS)


def test_each_kind_of_file_is_told_by_its_contents(run_dir: Path, tmp_path: Path) -> None:
    from export_fixtures import residual_integer_model

    from inq.quant.integer import save_integer

    save_integer(run_dir / runfiles.INTEGER, residual_integer_model())
    (run_dir / "checkpoints").mkdir()
    (run_dir / runfiles.LATEST).write_bytes(b"PK\x03\x04 torch.save's zip")
    shutil.copy(run_dir / runfiles.PACKED, tmp_path / "named.onnx")  # a name can lie
    (tmp_path / "real.onnx").write_bytes(b"\x08\x09 protobuf")
    (tmp_path / "notes.txt").write_text("hello")
    (tmp_path / "empty").mkdir()
    kinds = {
        run_dir: runfiles.RUN,
        tmp_path / "empty": runfiles.DIRECTORY,
        run_dir / runfiles.LATEST: runfiles.CHECKPOINT,
        run_dir / runfiles.MASKED: runfiles.MASKED_CHECKPOINT,
        run_dir / runfiles.PACKED: runfiles.PACKED_FILE,
        run_dir / runfiles.INTEGER: runfiles.INTEGER_MODEL,
        tmp_path / "named.onnx": runfiles.PACKED_FILE,
        tmp_path / "real.onnx": runfiles.ONNX_MODEL,
        tmp_path / "notes.txt": "file of no kind inq reads",
    }
    assert {path: runfiles.file_kind(path) for path in kinds} == kinds
    with pytest.raises(ValueError, match="no such file or directory"):
        runfiles.file_kind(tmp_path / "missing")


def test_a_command_names_what_it_was_given_and_what_to_pass(run_dir: Path) -> None:
    (run_dir / "checkpoints").mkdir()
    (run_dir / runfiles.LATEST).write_bytes(b"PK\x03\x04")
    with pytest.raises(ValueError) as err:
        runfiles.refuse_kind(
            run_dir / runfiles.LATEST, "eval", (runfiles.PACKED_FILE, runfiles.RUN)
        )
    assert str(err.value) == (
        f"{run_dir / runfiles.LATEST} is a training checkpoint (for trainer.resume); inq eval "
        f"takes a packed file or run directory; pass its run directory ({run_dir}) or one of the "
        "run's model files"
    )
    with pytest.raises(ValueError) as err:
        runfiles.refuse_kind(run_dir, "verify", (runfiles.MASKED_CHECKPOINT, runfiles.PACKED_FILE))
    assert str(err.value).endswith(
        f"pass one of its files: {run_dir / runfiles.MASKED}, {run_dir / runfiles.PACKED}"
    )
    assert runfiles.refuse_kind(run_dir, "eval", (runfiles.RUN,)) == runfiles.RUN


def test_a_run_at_work_with_no_model_yet_says_so(tmp_path: Path) -> None:
    """The re-trial of issue 46: ``inq eval RUN`` while inq-train starts there said it held no
    model, listing format ids; it says the run is at work."""
    run_dir = tmp_path / "run"
    lock = lock_dir(run_dir)
    try:
        with pytest.raises(ValueError, match=r"^.*run: another process \(pid \d+\) is working "
                                             r"there; wait for it$"):  # fmt: skip
            runfiles.command_file(run_dir, "eval", (runfiles.RUN,))
    finally:
        lock.close()
    with pytest.raises(ValueError, match=r"^.*run: no packed file or masked checkpoint"):
        runfiles.command_file(run_dir, "eval", (runfiles.RUN,))
