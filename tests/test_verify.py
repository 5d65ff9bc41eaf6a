"""inq.verify: level-set and mask checks of masked checkpoints and packed files."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from export_fixtures import masked_file
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from torch import nn

from inq.export import MASK_SUFFIX
from inq.packed import CODES_SUFFIX, PackedFile, PackedLayer, export_packed, pack_codes
from inq.verify import verify_file, verify_packed


def _tamper(src: Path, edit) -> Path:
    tensors = load_file(src)
    with safe_open(src, "pt") as f:
        metadata = f.metadata()
    edit(tensors)
    dst = src.with_name("tampered.safetensors")
    save_file(tensors, dst, metadata=metadata)
    return dst


@pytest.fixture
def masked(tmp_path: Path) -> Path:
    return masked_file(tmp_path, bits=5)[0]


def test_a_finished_run_verifies(masked: Path, tmp_path: Path) -> None:
    export_packed(masked, tmp_path / "p.safetensors")
    for path, kind in ((masked, "masked"), (tmp_path / "p.safetensors", "packed")):
        report = verify_file(path)
        assert report.ok and report.first_problem is None and report.kind == kind
        assert [layer.key for layer in report.layers] == [
            "conv.weight",
            "depthwise.weight",
            "seq.weight",
            "fc.weight",
        ]
        assert all(1 <= layer.levels_used <= 17 for layer in report.layers)
    assert verify_file(masked).layers == verify_file(tmp_path / "p.safetensors").layers


def test_verify_catches_a_planted_off_level_weight(masked: Path) -> None:
    def plant(t) -> None:
        t["seq.weight"][2, 1, 0] = 0.1

    report = verify_file(_tamper(masked, plant))
    assert not report.ok
    assert report.first_problem.key == "seq.weight"
    assert "off the 5-bit level set" in report.first_problem.problem
    assert "flat index 33" in report.first_problem.problem  # [2, 1, 0] of a [7, 5, 3] weight
    assert [layer.problem is None for layer in report.layers] == [True, True, False, True]


def test_verify_catches_a_cleared_mask_bit(masked: Path) -> None:
    def clear(t) -> None:
        t["fc.weight" + MASK_SUFFIX][0, 4] = False

    report = verify_file(_tamper(masked, clear))
    assert report.first_problem.key == "fc.weight"
    assert "mask not fully set: 1 of 21 entries still float (first at flat index 4)" in (
        report.first_problem.problem
    )


@pytest.mark.parametrize(("bits", "code"), [(4, 1), (4, 7), (3, 9), (3, 3), (5, 100), (2, 1)])
def test_verify_catches_packed_codes_outside_the_level_set(bits: int, code: int) -> None:
    codes = torch.full((2, 5), 1 << (bits - 1), dtype=torch.uint8)
    codes[1, 3] = code
    packed = pack_codes(codes, 4 if bits <= 4 else 8)  # same layout; skips the b-bit range check
    layer = PackedLayer("fc", packed, bits, 0, (2, 5), torch.float32)
    report = verify_packed(PackedFile({"fc.weight": layer}, {}, {}, {}))
    assert report.first_problem.key == "fc.weight"
    assert f"first: {code} at flat index 8" in report.first_problem.problem


def test_verify_of_a_tampered_packed_file_names_the_tensor(masked: Path, tmp_path: Path) -> None:
    export_packed(masked, tmp_path / "p.safetensors", sparse=False)

    def tamper(t) -> None:
        t["depthwise.weight" + CODES_SUFFIX][0, 0] = 0x7F  # top bit clear, not zero

    report = verify_file(_tamper(tmp_path / "p.safetensors", tamper))
    assert report.first_problem.key == "depthwise.weight"
    assert report.layers[1].levels_used is None


def test_levels_used_and_zeros() -> None:
    codes = torch.tensor([[0, 0, 8, 9], [8, 15, 0, 0]], dtype=torch.uint8)
    layer = PackedLayer("fc", pack_codes(codes, 4), 4, -1, (2, 4), torch.float32)
    (row,) = verify_packed(PackedFile({"fc.weight": layer}, {}, {}, {})).layers
    assert (row.levels_used, row.levels, row.zeros) == (4, 9, 0.5)


def test_verify_file_rejects_other_formats(tmp_path: Path) -> None:
    save_file({"w": torch.zeros(1)}, tmp_path / "x.safetensors", metadata={"format": "pt"})
    with pytest.raises(ValueError, match="not an INQ masked checkpoint or packed file"):
        verify_file(tmp_path / "x.safetensors")


def test_verify_names_an_off_level_weight_of_a_per_channel_layer(tmp_path: Path) -> None:
    conv = nn.Conv2d(3, 6, 3)
    with torch.no_grad():
        conv.weight.mul_(2.0 ** torch.arange(6).view(6, 1, 1, 1))  # rows of different scales
    path, _ = masked_file(tmp_path, 3, model=conv, n1_rule="mse", granularity="channel")
    clean = verify_file(path)
    assert clean.ok
    assert any(".." in line for line in clean.table().splitlines()[1:])  # n1 ranges shown

    def plant(t) -> None:
        row = t["weight"][4]
        row.view(-1)[2] = row.abs().max() * 0.7  # between two levels of any level set

    report = verify_file(_tamper(path, plant))
    assert not report.ok and report.first_problem.key == "weight"
    problem = report.first_problem.problem
    assert "off the 3-bit level sets of its channels (first: channel 4, n1=" in problem
    assert f"flat index {4 * 3 * 3 * 3 + 2}" in problem
