"""inq.runfiles: one rule for finding a model file in a run directory."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from export_fixtures import masked_file

from inq import runfiles
from inq.export import MASKED_FORMATS
from inq.packed import export_packed, read_format
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
    assert find_model(run_dir, MASKED_FORMATS) == run_dir / runfiles.MASKED
    packed, path = load_model(run_dir)
    assert path == run_dir / runfiles.PACKED
    masked_packed, _ = load_model(run_dir / runfiles.MASKED)  # packed in memory: the same codes
    assert packed.layers.keys() == masked_packed.layers.keys()
    for key, layer in packed.layers.items():
        assert torch.equal(layer.codes(), masked_packed.layers[key].codes())


def test_a_directory_without_run_files_gives_its_only_model(run_dir: Path) -> None:
    (run_dir / runfiles.MASKED).rename(run_dir / "renamed.safetensors")
    assert find_model(run_dir, MASKED_FORMATS) == run_dir / "renamed.safetensors"
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
    assert read_format(run_dir / runfiles.PACKED) not in MASKED_FORMATS
