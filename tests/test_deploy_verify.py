"""inq.deploy.verify: level-set and mask checks of masked checkpoints and packed files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from export_fixtures import masked_file, residual_integer_model
from helpers import TensorEdit, rewritten
from safetensors.torch import save_file
from torch import nn

from inq.cli import main
from inq.codes import pack_codes
from inq.deploy.verify import verify_file, verify_packed
from inq.fileio import read_safetensors, write_safetensors
from inq.masked import MASK_SUFFIX
from inq.packed import CODES_SUFFIX, PackedFile, PackedLayer, export_packed
from inq.quant.integer import save_integer


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

    report = verify_file(rewritten(masked, masked.with_name("tampered.safetensors"), plant))
    assert not report.ok
    assert report.first_problem.key == "seq.weight"
    assert "off the 5-bit level set" in report.first_problem.problem
    assert "flat index 33" in report.first_problem.problem  # [2, 1, 0] of a [7, 5, 3] weight
    assert [layer.problem is None for layer in report.layers] == [True, True, False, True]


def test_verify_catches_a_cleared_mask_bit(masked: Path) -> None:
    def clear(t) -> None:
        t["fc.weight" + MASK_SUFFIX][0, 4] = False

    report = verify_file(rewritten(masked, masked.with_name("tampered.safetensors"), clear))
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

    report = verify_file(
        rewritten(tmp_path / "p.safetensors", tmp_path / "tampered.safetensors", tamper)
    )
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

    report = verify_file(rewritten(path, path.with_name("tampered.safetensors"), plant))
    assert not report.ok and report.first_problem.key == "weight"
    problem = report.first_problem.problem
    assert "off the 3-bit level sets of its channels (first: channel 4, n1=" in problem
    assert f"flat index {4 * 3 * 3 * 3 + 2}" in problem


# ------------------------------------------------- impossible files, re-signed with a new digest


def _put(key: str, index: int | None, value: float) -> TensorEdit:
    def edit(tensors) -> None:
        if index is None:
            tensors[key] = torch.tensor(value, dtype=torch.int64)
        else:
            tensors[key][index] = value

    return edit


IMPOSSIBLE_TENSORS = [
    (_put("bn.running_var", 2, -0.25), "bn.running_var",
     "a variance cannot be negative: 1 negative value(s) (first: -0.25 at flat index 2)"),
    (_put("bn.running_var", 1, float("nan")), "bn.running_var",
     "1 non-finite value(s) (first: nan at flat index 1)"),
    (_put("bn.running_mean", 0, float("-inf")), "bn.running_mean",
     "1 non-finite value(s) (first: -inf at flat index 0)"),
    (_put("conv.bias", 4, float("inf")), "conv.bias",
     "1 non-finite value(s) (first: inf at flat index 4)"),
    (_put("bn.weight", 3, float("nan")), "bn.weight",
     "1 non-finite value(s) (first: nan at flat index 3)"),
    (_put("bn.num_batches_tracked", None, -3), "bn.num_batches_tracked",
     "a count of batches cannot be negative, got -3"),
    (lambda t: t.update({"bn.num_batches_tracked": torch.tensor(2.0)}),
     "bn.num_batches_tracked", "a count of batches must be an integer tensor, got torch.float32"),
]  # fmt: skip


@pytest.mark.parametrize("kind", ["masked", "packed"])
@pytest.mark.parametrize(("edit", "key", "problem"), IMPOSSIBLE_TENSORS)
def test_impossible_tensors_fail_whatever_their_digest(
    masked: Path, tmp_path: Path, kind: str, edit: TensorEdit, key: str, problem: str
) -> None:
    path = masked
    if kind == "packed":
        path = tmp_path / "p.safetensors"
        export_packed(masked, path)
    report = verify_file(rewritten(path, path.with_name("resigned.safetensors"), edit, resign=True))
    assert not report.ok
    assert report.digest_problem is None and all(layer.problem is None for layer in report.layers)
    assert report.other_problems == ((key, problem),)
    assert report.file_problem == f"{key!r}: {problem}"


def test_a_masked_checkpoint_needs_json_object_descriptions(masked: Path) -> None:
    def edit(metadata) -> None:
        metadata["model"], metadata["data"] = "[1]", '"digits"'

    resigned = masked.with_name("resigned.safetensors")
    report = verify_file(rewritten(masked, resigned, None, edit, resign=True))
    assert not report.ok and report.digest_problem is None
    assert report.other_problems == (
        ("model", "must be a JSON object, got [1]"),
        ("data", "must be a JSON object, got 'digits'"),
    )


def _verify_error(capsys: pytest.CaptureFixture[str], path: Path) -> str:
    """``inq verify PATH``'s one error line (it must fail)."""
    assert main(["verify", str(path)]) == 1
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1
    return lines[0]


@pytest.mark.parametrize("kind", ["masked", "packed"])
def test_inq_verify_names_an_impossible_tensor(
    capsys: pytest.CaptureFixture[str], masked: Path, tmp_path: Path, kind: str
) -> None:
    path = masked
    if kind == "packed":
        path = tmp_path / "p.safetensors"
        export_packed(masked, path)
    edit, key, problem = IMPOSSIBLE_TENSORS[0]
    bad = rewritten(path, path.with_name("resigned.safetensors"), edit, resign=True)
    assert _verify_error(capsys, bad) == f"inq verify: {bad}: {key!r}: {problem}"


@pytest.mark.parametrize(
    ("where", "key", "value", "problem"),
    [
        (None, "act_bits", 9, "metadata 'act_bits': must be an integer from 2 to 8, got 9"),
        ("add", "multipliers", [-1, 2],
         "op 'add': multipliers must be two integers from 1 to 2**31 - 1, got [-1, 2]"),
        ("pool", "multiplier", -1,
         "op 'pool': multiplier must be an integer from 1 to 2**31 - 1, got -1"),
    ],
)  # fmt: skip
def test_inq_verify_refuses_an_impossible_integer_model(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, where, key, value, problem: str
) -> None:
    """``problem`` as loading words it; ``inq verify`` names the key or op the same way."""
    path = tmp_path / "m.int.safetensors"
    save_integer(path, residual_integer_model())

    def edit(metadata) -> None:
        if where is None:
            metadata[key] = json.dumps(value)
        else:
            program = json.loads(metadata["program"])
            next(op for op in program if op["name"] == where)["attrs"][key] = value
            metadata["program"] = json.dumps(program)

    bad = rewritten(path, path.with_name("resigned.safetensors"), None, edit, resign=True)
    line = _verify_error(capsys, bad)
    assert line.startswith(f"inq verify: {bad}: ")
    assert line.endswith(problem.partition(" ")[2])  # after "op"/"metadata"
    assert main(["eval", str(bad), "--data", "digits"]) == 1
    assert capsys.readouterr().err == f"inq eval: error: {bad}: {problem}\n"


# ---------------------------------------------------------------- per-layer bits


def _mixed_masked(folder: Path) -> Path:
    """MixedNet quantized with ``conv`` at 8 bits, ``fc`` at 2 and the others at 4."""
    from export_fixtures import MixedNet

    from inq.masked import save_masked
    from inq.scheduler import INQScheduler

    torch.manual_seed(0)
    model = MixedNet()
    sched = INQScheduler(model, bits=4, portions=(1.0,), layer_bits={"conv": 8, "fc": 2})
    sched.step()
    path = folder / "mixed.safetensors"
    save_masked(path, model, sched, {"name": "mixed"})
    return path


def test_each_weight_is_checked_against_its_own_layers_level_set(tmp_path: Path) -> None:
    masked = _mixed_masked(tmp_path)
    export_packed(masked, tmp_path / "p.safetensors")
    for path in (masked, tmp_path / "p.safetensors"):
        report = verify_file(path)
        assert report.ok
        assert [(layer.key, layer.bits, layer.levels) for layer in report.layers] == [
            ("conv.weight", 8, 129),
            ("depthwise.weight", 4, 9),
            ("seq.weight", 4, 9),
            ("fc.weight", 2, 3),
        ]
        assert report.layers[0].levels_used > 9  # more levels than 4 bits have
    tensors, metadata = read_safetensors(masked)
    n1 = {key: info["n1"] for key, info in json.loads(metadata["layers"]).items()}
    # 2**(n1 - 5): a level of an 8-bit set, a quarter of a 4-bit set's smallest magnitude
    tensors["conv.weight"][0, 0, 0, 0] = 2.0 ** (n1["conv.weight"] - 5)  # fine at 8 bits
    tensors["seq.weight"][2, 1, 0] = 2.0 ** (n1["seq.weight"] - 5)  # not at 4
    planted = tmp_path / "planted.safetensors"
    write_safetensors(planted, tensors, {k: v for k, v in metadata.items() if k != "sha256"})
    report = verify_file(planted)
    assert report.digest_problem is None and report.first_problem.key == "seq.weight"
    assert "1 weight(s) off the 4-bit level set" in report.first_problem.problem
    assert [layer.problem is None for layer in report.layers] == [True, True, False, True]
