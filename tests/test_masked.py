"""Masked checkpoint (inq.masked): exact round trip, plain safetensors readability, errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from export_fixtures import masked_v2
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from torch import nn

import inq
from inq import INQScheduler
from inq.fileio import read_safetensors
from inq.masked import MASK_SUFFIX, MASKED_FORMAT, load_masked, save_masked


def small_cnn(seed: int) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Conv2d(1, 5, 3),
        nn.BatchNorm2d(5),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(5 * 3 * 3, 7),
        nn.Linear(7, 3, bias=False),
    )


def quantized_model(stages: int, bits: int = 5) -> tuple[nn.Sequential, INQScheduler]:
    model = small_cnn(seed=0)
    model(torch.randn(4, 1, 5, 5))  # BatchNorm running statistics become non-trivial
    sched = INQScheduler(model, bits=bits, portions=(0.5, 0.75, 0.875, 1.0), strategy="random")
    for _ in range(stages):
        sched.step()
    return model, sched


@pytest.mark.parametrize("stages", [0, 2, 4])
def test_round_trip_is_exact(tmp_path: Path, stages: int) -> None:
    model, sched = quantized_model(stages)
    path = tmp_path / "model.safetensors"
    info = {"name": "small_cnn", "layers": [1, 5, 7, 3]}
    save_masked(path, model, sched, info)

    ckpt = load_masked(path)
    expected_state = model.state_dict()
    assert set(ckpt.state) == set(expected_state)
    for key, value in expected_state.items():
        assert ckpt.state[key].dtype == value.dtype
        assert torch.equal(ckpt.state[key], value), f"{key} differs"
    keys = {"0": "0.weight", "4": "4.weight", "5": "5.weight"}
    assert set(ckpt.masks) == set(keys.values())
    for layer in sched.layers:
        assert torch.equal(ckpt.masks[keys[layer.name]], layer.mask)
        assert ckpt.n1[keys[layer.name]] == layer.n1
    assert ckpt.bits == 5
    assert ckpt.portions == (0.5, 0.75, 0.875, 1.0)
    assert ckpt.stage == stages
    assert ckpt.strategy == "random"
    assert ckpt.model == info

    fresh = small_cnn(seed=1)
    fresh.load_state_dict(ckpt.state)
    for key, value in fresh.state_dict().items():
        assert torch.equal(value, expected_state[key])


def test_quantized_weights_in_file_are_in_their_level_sets(tmp_path: Path) -> None:
    model, sched = quantized_model(stages=4, bits=3)
    path = tmp_path / "done.safetensors"
    save_masked(path, model, sched)
    ckpt = load_masked(path)
    for key, mask in ckpt.masks.items():
        assert bool(mask.all())
        levels = inq.pow2_levels(ckpt.n1[key], ckpt.bits)
        assert torch.isin(ckpt.state[key], levels).all()
    assert ckpt.model == {}


def test_save_enforces_frozen_values_first(tmp_path: Path) -> None:
    model, sched = quantized_model(stages=2)
    exact = model[4].weight.detach().clone()
    with torch.no_grad():
        model[4].weight.add_(1e-3)  # e.g. an optimizer step without an attached scheduler
    path = tmp_path / "m.safetensors"
    save_masked(path, model, sched)
    mask = sched.layers[1].mask
    assert torch.equal(load_masked(path).state["4.weight"][mask], exact[mask])


def test_file_is_plain_safetensors_with_documented_metadata(tmp_path: Path) -> None:
    model, sched = quantized_model(stages=1)
    path = tmp_path / "m.safetensors"
    save_masked(path, model, sched, {"arch": "cnn"})
    with safe_open(path, "pt") as f:
        metadata = f.metadata()
        keys = set(f.keys())
        mask = f.get_tensor("0.weight" + MASK_SUFFIX)
    assert metadata["format"] == MASKED_FORMAT
    assert metadata["bits"] == "5" and metadata["stage"] == "1"
    assert json.loads(metadata["portions"]) == [0.5, 0.75, 0.875, 1.0]
    layers = json.loads(metadata["layers"])
    assert layers["0.weight"] == {"module": "0", "bits": 5, "n1": sched.layers[0].n1}
    assert json.loads(metadata["model"]) == {"arch": "cnn"}
    assert keys == set(model.state_dict()) | {k + MASK_SUFFIX for k in layers}
    assert mask.dtype == torch.bool and torch.equal(mask, sched.layers[0].mask)


def test_tied_weights_are_saved_and_masked_once(tmp_path: Path) -> None:
    first, second = nn.Linear(4, 4), nn.Linear(4, 4)
    second.weight = first.weight
    model = nn.Sequential(first, nn.ReLU(), second)
    sched = INQScheduler(model, bits=4, portions=(0.5, 1.0))
    sched.step()
    path = tmp_path / "tied.safetensors"
    save_masked(path, model, sched)
    ckpt = load_masked(path)
    assert set(ckpt.masks) == {"0.weight"}
    assert torch.equal(ckpt.state["0.weight"], ckpt.state["2.weight"])
    assert torch.equal(ckpt.state["0.weight"], first.weight.detach())
    rebuilt = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4))
    rebuilt.load_state_dict(ckpt.state)
    assert torch.equal(rebuilt[2].weight, first.weight)


def test_save_replaces_an_existing_file(tmp_path: Path) -> None:
    path = tmp_path / "m.safetensors"
    path.write_bytes(b"old")
    model, sched = quantized_model(stages=1)
    save_masked(path, model, sched)
    assert load_masked(path).stage == 1
    assert [p.name for p in tmp_path.iterdir()] == ["m.safetensors"]


# ---------------------------------------------------------------- errors


def test_missing_file_raises_value_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="cannot read as safetensors"):
        load_masked(tmp_path / "nope.safetensors")


@pytest.mark.parametrize(
    "content", [b"", b"ab", b"definitely not a safetensors file", b"\xff" * 64]
)
def test_non_safetensors_file_raises_value_error(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "junk.safetensors"
    path.write_bytes(content)
    with pytest.raises(ValueError, match="cannot read as safetensors"):
        load_masked(path)


def test_directory_raises_value_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="cannot read"):
        load_masked(tmp_path)


@pytest.mark.parametrize("metadata", [None, {"format": "something-else/2"}, {"bits": "5"}])
def test_other_safetensors_files_are_rejected(tmp_path: Path, metadata: dict | None) -> None:
    path = tmp_path / "other.safetensors"
    save_file({"w": torch.ones(2)}, path, metadata=metadata)
    with pytest.raises(ValueError, match="not an INQ masked checkpoint"):
        load_masked(path)


@pytest.mark.parametrize(
    "broken",
    [
        {"layers": "{not json"},
        {"layers": json.dumps({"missing.weight": {"module": "m", "n1": 0}})},
        {"bits": "five"},
        {"bits": "9"},
        {"layers": json.dumps({"0.weight": {"module": "0", "bits": 9, "n1": 0}})},
        {"stage": None},
    ],
)
def test_corrupt_metadata_raises_value_error(tmp_path: Path, broken: dict) -> None:
    model, sched = quantized_model(stages=1)
    good = tmp_path / "good.safetensors"
    save_masked(good, model, sched)
    with safe_open(good, "pt") as f:
        metadata = dict(f.metadata())
    tensors = load_file(good)
    for key, value in broken.items():
        if value is None:
            del metadata[key]
        else:
            metadata[key] = value
    bad = tmp_path / "bad.safetensors"
    save_file(tensors, bad, metadata=metadata)
    with pytest.raises(ValueError, match="corrupt INQ masked checkpoint"):
        load_masked(bad)


# ---------------------------------------------------------------- per-layer bits


def test_each_layers_bits_round_trip(tmp_path: Path) -> None:
    model = small_cnn(seed=0)
    sched = INQScheduler(model, bits=4, portions=(0.5, 1.0), layer_bits={"0": 8, "5": 2})
    sched.step()
    path = tmp_path / "mixed.safetensors"
    save_masked(path, model, sched)
    with safe_open(path, "pt") as f:
        metadata = f.metadata()
    assert metadata["format"] == MASKED_FORMAT == "inq-masked/3" and metadata["bits"] == "4"
    layers = json.loads(metadata["layers"])
    assert {key: info["bits"] for key, info in layers.items()} == {
        "0.weight": 8,
        "4.weight": 4,
        "5.weight": 2,
    }
    ckpt = load_masked(path)
    assert ckpt.bits == 4 and ckpt.layer_bits == {"0.weight": 8, "4.weight": 4, "5.weight": 2}
    assert [ckpt.bits_of(key) for key in ("0.weight", "4.weight", "5.weight")] == [8, 4, 2]
    for layer in sched.layers:
        key = f"{layer.name}.weight"
        assert torch.equal(ckpt.state[key], layer.weight.detach())
        frozen = ckpt.state[key][ckpt.masks[key]]
        assert bool(torch.isin(frozen, inq.pow2_levels(layer.n1, layer.bits)).all())


def test_masked_files_before_per_layer_bits_load_with_every_layer_at_bits(
    tmp_path: Path,
) -> None:
    """Format /2 (and /1) wrote no bits per layer: every layer is at the file's bits."""
    model, sched = quantized_model(stages=4, bits=3)
    path = tmp_path / "new.safetensors"
    save_masked(path, model, sched)
    layers = json.loads(read_safetensors(path)[1]["layers"])
    old = masked_v2(path, tmp_path / "old.safetensors")
    ckpt, new = load_masked(old), load_masked(path)
    assert ckpt.digest_problem is None
    assert ckpt.bits == 3 and ckpt.layer_bits == new.layer_bits == dict.fromkeys(layers, 3)
    for key, value in new.state.items():
        assert torch.equal(ckpt.state[key], value)


def test_import_inq_reaches_the_submodules_readme_names() -> None:
    """``inq.masked.save_masked`` after a plain ``import inq`` (README's table), and still no
    submodule imported by ``import inq`` itself."""
    code = (
        "import sys, inq; assert not [m for m in sys.modules if m.startswith('inq.')]; "
        "print(inq.masked.save_masked.__name__, inq.packed.load_packed.__name__, "
        "inq.nn.from_packed.__name__, 'runfiles' in dir(inq))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.stdout.split() == ["save_masked", "load_packed", "from_packed", "True"], done.stderr
