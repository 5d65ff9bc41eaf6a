"""inq.packed: packed files, size ratios, and bad input."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from export_fixtures import MixedNet, masked_file, masked_v2, quantize
from helpers import rewritten
from safetensors import safe_open
from safetensors.torch import save_file
from torch import nn

from inq.fileio import DIGEST_KEY, read_safetensors, write_safetensors
from inq.masked import load_masked, save_masked
from inq.packed import (
    CODES_SUFFIX,
    INDEX_SUFFIX,
    PACKED_FORMAT,
    SPARSE_HEADER_BYTES,
    VALUES_SUFFIX,
    export_packed,
    load_packed,
)
from inq.pow2 import pow2_encode
from inq.scheduler import FLOAT_CODE, INQScheduler
from inq.sparse import encode_sparse


@pytest.mark.parametrize("bits", range(2, 9))
def test_export_load_reproduces_the_masked_checkpoint(tmp_path: Path, bits: int) -> None:
    path, _ = masked_file(tmp_path, bits)
    stats = export_packed(path, tmp_path / "m.inq.safetensors")
    ckpt, packed = load_masked(path), load_packed(tmp_path / "m.inq.safetensors")
    state = packed.state_dict()
    assert state.keys() == ckpt.state.keys()
    for key, value in ckpt.state.items():
        assert state[key].dtype == value.dtype
        assert torch.equal(state[key], value), key
    assert set(packed.layers) == set(ckpt.masks)
    for key, layer in packed.layers.items():
        assert (layer.bits, layer.n1, layer.shape) == (
            bits,
            ckpt.n1[key],
            tuple(ckpt.state[key].shape),
        )
        assert torch.equal(layer.codes(), pow2_encode(ckpt.state[key], layer.n1, bits))
    assert packed.model == {"name": "mixed"}
    assert stats.file_bytes == (tmp_path / "m.inq.safetensors").stat().st_size
    with safe_open(tmp_path / "m.inq.safetensors", "pt") as f:  # plain safetensors, documented keys
        assert f.metadata()["format"] == PACKED_FORMAT
        stored = {
            key + suffix
            for key, layer in packed.layers.items()
            for suffix in (
                (CODES_SUFFIX,) if layer.storage == "dense" else (VALUES_SUFFIX, INDEX_SUFFIX)
            )
        }
        assert {*stored, "conv.bias"} <= set(f.keys())


def test_half_precision_weights_round_trip(tmp_path: Path) -> None:
    model = nn.Sequential(nn.Linear(9, 5), nn.Linear(5, 3)).to(torch.bfloat16)
    save_masked(tmp_path / "m.safetensors", model, quantize(model, 6), {})
    export_packed(tmp_path / "m.safetensors", tmp_path / "p.safetensors")
    state = load_packed(tmp_path / "p.safetensors").state_dict()
    for key, value in model.state_dict().items():
        assert state[key].dtype == torch.bfloat16 and torch.equal(state[key], value)


@pytest.mark.parametrize(
    ("bits", "expected"), [(2, 4 / 32), (3, 4 / 32), (4, 4 / 32), (5, 8 / 32), (8, 8 / 32)]
)
def test_size_ratio_of_realistic_layers(tmp_path: Path, bits: int, expected: float) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(64, 128, 3), nn.Conv2d(128, 128, 3, groups=128), nn.Linear(512, 257)
    )
    save_masked(tmp_path / "m.safetensors", model, quantize(model, bits), {})
    stats = export_packed(tmp_path / "m.safetensors", tmp_path / "p.safetensors", sparse=False)
    assert stats.fp32_bytes == 4 * sum(m.weight.numel() for m in model)
    assert stats.ratio == pytest.approx(expected, rel=0.03)
    assert stats.packed_bytes == stats.dense_bytes
    # the file is the packed codes plus the float biases plus a small header
    overhead = stats.file_bytes - stats.packed_bytes - stats.other_bytes
    assert 0 < overhead < 4096


def _edit_layer(field: str, value):
    def edit(meta: dict[str, str]) -> None:
        layers = json.loads(meta["layers"])
        layers["fc.weight"][field] = value
        meta["layers"] = json.dumps(layers)

    return edit


@pytest.fixture
def packed_file(tmp_path: Path) -> Path:
    path, _ = masked_file(tmp_path, bits=4)
    export_packed(path, tmp_path / "p.inq.safetensors", sparse=False)  # the dense rows
    return tmp_path / "p.inq.safetensors"


def _set_code(tensors, key: str, value: int) -> None:
    tensors[key + CODES_SUFFIX][0, 0] = value


@pytest.mark.parametrize(
    ("edit_tensors", "edit_meta", "match"),
    [
        (lambda t: _set_code(t, "conv.weight", 0x31), None, r"'conv.weight'.*outside the 4-bit"),
        (lambda t: t.pop("fc.weight" + CODES_SUFFIX), None, "corrupt INQ packed file metadata"),
        (lambda t: t.update(x=t.pop("fc.weight" + CODES_SUFFIX)), None, "corrupt"),
        (lambda t: t.update({"fc.weight": torch.zeros(3, 7)}), None, "both packed and as a tensor"),
        (
            lambda t: t.update({"extra" + CODES_SUFFIX: torch.zeros(1, 1, dtype=torch.uint8)}),
            None,
            "no layer metadata",
        ),
        (None, _edit_layer("bits", 5), "bad width"),
        (None, _edit_layer("bits", 9), "bits must be an integer"),
        (None, _edit_layer("shape", []), "bad width 4 or shape"),
        (None, _edit_layer("shape", [3, 9]), r"'fc.weight'.*expected uint8 \[3, 5\]"),
        (None, _edit_layer("shape", [2**21, 2**11]), "bad width 4 or shape"),
        (None, _edit_layer("n1", 200), "outside torch.float32"),
        (None, _edit_layer("n1", "x"), "expected an integer"),
        (None, _edit_layer("dtype", "int8"), "corrupt"),
        (None, lambda m: m.pop("layers"), "corrupt"),
        (None, lambda m: m.update(model="[1]"), "must be a JSON object"),
        (None, lambda m: m.update(format="inq-packed/9"), "not an INQ packed file"),
    ],
)
def test_tampered_files_fail_with_one_clear_error(packed_file, edit_tensors, edit_meta, match):
    bad = rewritten(packed_file, packed_file.with_name("bad.safetensors"), edit_tensors, edit_meta)
    with pytest.raises(ValueError, match=match):
        load_packed(bad)


@pytest.mark.parametrize(
    ("edit_tensors", "edit_meta"),
    [
        (lambda t: _set_code(t, "conv.weight", 0x8), None),  # another valid code
        (lambda t: t["fc.bias"].add_(1.0), None),  # a float tensor
        (None, _edit_layer("n1", -3)),  # a valid n1: the whole layer scaled by 2
        (None, _edit_layer("dtype", "float16")),
        (None, lambda m: m.pop(DIGEST_KEY)),
    ],
)
def test_valid_looking_edits_fail_the_digest(packed_file, edit_tensors, edit_meta) -> None:
    bad = rewritten(packed_file, packed_file.with_name("bad.safetensors"), edit_tensors, edit_meta)
    with pytest.raises(ValueError, match="sha256 digest"):
        load_packed(bad)
    assert "sha256 digest" in load_packed(bad, validate=False).digest_problem
    assert load_packed(packed_file).digest_problem is None


def test_padding_nibble_must_be_zero(packed_file: Path) -> None:
    def set_padding(tensors) -> None:  # fc.weight is 3x7: every row ends in a padding nibble
        tensors["fc.weight" + CODES_SUFFIX][1, -1] |= 0x80

    bad = rewritten(packed_file, packed_file.with_name("bad.safetensors"), set_padding)
    with pytest.raises(ValueError, match="padding nibble"):
        load_packed(bad)


def test_truncated_and_foreign_files(packed_file: Path, tmp_path: Path) -> None:
    data = packed_file.read_bytes()
    (tmp_path / "cut.safetensors").write_bytes(data[: len(data) - 10])
    (tmp_path / "text.safetensors").write_text("not a tensor file")
    save_file({"w": torch.zeros(2)}, tmp_path / "plain.safetensors")
    for name, match in [
        ("cut", "cannot read as safetensors"),
        ("text", "cannot read as safetensors"),
        ("plain", "not an INQ packed file"),
        ("missing", "cannot read as safetensors"),
    ]:
        with pytest.raises(ValueError, match=match):
            load_packed(tmp_path / f"{name}.safetensors")


def test_a_masked_checkpoint_is_not_a_packed_file(tmp_path: Path) -> None:
    path, _ = masked_file(tmp_path)
    with pytest.raises(ValueError, match="run `inq export` on it first"):
        load_packed(path)


def _files(folder: Path) -> set[str]:
    return {p.name for p in folder.iterdir()}


def _plant(key: str, index: tuple[int, ...], value: float):
    def edit(tensors) -> None:
        tensors[key][index] = value

    return edit


@pytest.mark.parametrize(
    ("plant", "match"),
    [
        (_plant("fc.weight", (1, 2), 0.3), r"'fc.weight'.*off the 5-bit.*0.30000001192092896"),
        (_plant("conv.weight", (0, 0, 0, 0), -0.0), r"'conv.weight'.*-0.0"),
        (_plant("seq.weight", (0, 0, 0), float("nan")), r"'seq.weight'.*NaN"),
    ],
)
def test_export_refuses_off_level_weights_and_writes_nothing(tmp_path: Path, plant, match):
    path, _ = masked_file(tmp_path, 5)
    bad = rewritten(path, tmp_path / "bad.safetensors", plant)
    before = _files(tmp_path)
    with pytest.raises(ValueError, match=match):
        export_packed(bad, tmp_path / "out.safetensors")
    assert _files(tmp_path) == before  # no output, no temp file left behind


def test_export_refuses_an_unfinished_run(tmp_path: Path) -> None:
    model = MixedNet()
    sched = quantize(model, 5, portions=(0.5, 1.0))
    sched.layers[0].codes[0, 0, 0, 1] = FLOAT_CODE  # as if the last stage skipped one weight
    sched.layers[0].count -= 1
    save_masked(tmp_path / "m.safetensors", model, sched, {})
    with pytest.raises(ValueError, match=r"'conv.weight'.*mask not fully set.*flat index 1"):
        export_packed(tmp_path / "m.safetensors", tmp_path / "out.safetensors")
    assert not (tmp_path / "out.safetensors").exists()


PER_CHANNEL = {"n1_rule": "mse", "granularity": "channel"}


@pytest.mark.parametrize("bits", range(2, 9))
def test_per_channel_round_trip_through_masked_and_packed(tmp_path: Path, bits: int) -> None:
    path, model = masked_file(tmp_path, bits, **PER_CHANNEL)
    export_packed(path, tmp_path / "m.inq.safetensors")
    ckpt, packed = load_masked(path), load_packed(tmp_path / "m.inq.safetensors")
    assert (ckpt.n1_rule, ckpt.granularity) == ("mse", "channel")
    assert packed.metadata["granularity"] == "channel"
    for key, layer in packed.layers.items():
        n1 = ckpt.n1[key]
        assert n1.dtype == torch.int32 and n1.shape == (layer.shape[0],)
        assert torch.equal(layer.n1, n1)
        assert torch.equal(layer.weight(), ckpt.state[key])  # bit for bit
        assert torch.equal(ckpt.state[key], model.state_dict()[key])
    assert len({int(v) for n1 in ckpt.n1.values() for v in n1}) > 1  # really per channel


def test_per_channel_n1_of_the_wrong_length_is_one_clear_error(tmp_path: Path) -> None:
    path, _ = masked_file(tmp_path, 4, **PER_CHANNEL)
    packed = tmp_path / "m.inq.safetensors"
    export_packed(path, packed)
    bad = rewritten(packed, tmp_path / "bad.safetensors", None, _edit_layer("n1", [-3, -4]))
    with pytest.raises(ValueError, match="2 per-row n1 values for 3 rows"):
        load_packed(bad, validate=True)


@pytest.mark.parametrize("kind", ["masked", "packed"])
def test_files_of_format_1_still_load(tmp_path: Path, kind: str) -> None:
    """Files written before per-channel level sets (format /1: int n1, no level options)."""
    path, _ = masked_file(tmp_path, 4)
    if kind == "packed":
        export_packed(path, tmp_path / "p.safetensors", sparse=False)
        path = tmp_path / "p.safetensors"
    tensors, metadata = read_safetensors(path)
    metadata = {k: v for k, v in metadata.items() if k not in ("n1_rule", "granularity", "sha256")}
    metadata["format"] = metadata["format"][:-1] + "1"
    old = tmp_path / f"old_{kind}.safetensors"
    write_safetensors(old, tensors, metadata)
    if kind == "packed":
        loaded = load_packed(old)
        assert loaded.metadata["format"] == "inq-packed/1"
        assert all(isinstance(layer.n1, int) for layer in loaded.layers.values())
        assert load_packed(path).state_dict().keys() == loaded.state_dict().keys()
    else:
        ckpt = load_masked(old)
        assert (ckpt.n1_rule, ckpt.granularity) == ("max", "layer")
        assert ckpt.n1 == load_masked(path).n1
        assert ckpt.digest_problem is None


# ---------------------------------------------------------------- sparse storage


def _tensor_bytes_in_file(path: Path) -> dict[str, int]:
    """Each tensor's byte length as the safetensors header records it (the file, measured)."""
    with open(path, "rb") as f:
        header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
    return {
        k: v["data_offsets"][1] - v["data_offsets"][0] for k, v in header.items() if k[0] != "_"
    }


@pytest.fixture(scope="module")
def pruned_masked(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A pruned (conv 50 %, linear 92 %) and 5-bit quantized model."""
    torch.manual_seed(3)
    model = nn.Module()
    model.conv, model.fc = nn.Conv2d(3, 16, 3), nn.Linear(256, 64)
    sched = INQScheduler(model, bits=5, portions=(0.5, 1.0))
    sched.prune({"conv": 0.5, "fc": 0.92})
    while not sched.done:
        sched.step()
    path = tmp_path_factory.mktemp("pruned") / "m.safetensors"
    save_masked(path, model, sched, {"name": "mixed"})
    return path


def test_sparse_layers_decode_to_the_masked_checkpoint_and_measure_smaller(
    pruned_masked: Path, tmp_path: Path
) -> None:
    sparse_path, dense_path = tmp_path / "s.safetensors", tmp_path / "d.safetensors"
    stats = export_packed(pruned_masked, sparse_path)
    dense_stats = export_packed(pruned_masked, dense_path, sparse=False)
    ckpt, packed = load_masked(pruned_masked), load_packed(sparse_path)
    for key, value in ckpt.state.items():
        assert torch.equal(packed.state_dict()[key], value), key
    dense = load_packed(dense_path)
    on_disk = _tensor_bytes_in_file(sparse_path)
    for key, layer in packed.layers.items():
        assert torch.equal(layer.packed, dense.layers[key].packed), key
        best = encode_sparse(layer.codes(), 5)
        smaller = best.nbytes + SPARSE_HEADER_BYTES < layer.packed.numel()
        chosen = best.layout if smaller else "dense"
        assert layer.storage == chosen, key
        suffixes = (CODES_SUFFIX,) if chosen == "dense" else (VALUES_SUFFIX, INDEX_SUFFIX)
        assert layer.stored_bytes == sum(on_disk[key + suffix] for suffix in suffixes), key
    assert packed.layers["fc.weight"].storage == "gaps"  # 92 % zeros: gaps beat a bitmap
    assert stats.packed_bytes < dense_stats.packed_bytes == stats.dense_bytes
    assert stats.compression == stats.fp32_bytes / stats.packed_bytes
    assert stats.file_bytes < dense_stats.file_bytes


def test_sparse_values_take_bits_minus_one_bits(pruned_masked: Path, tmp_path: Path) -> None:
    export_packed(pruned_masked, tmp_path / "s.safetensors")
    for key, layer in load_packed(tmp_path / "s.safetensors").layers.items():
        if layer.sparse is not None:
            nonzero = int((layer.codes() != 0).sum())
            assert layer.sparse.nonzero == nonzero
            assert layer.sparse.values.numel() == math.ceil(nonzero * 4 / 8), key


@pytest.mark.parametrize(
    ("edit_tensors", "edit_meta", "match"),
    [
        (lambda t: t.pop("fc.weight" + INDEX_SUFFIX), None, "corrupt"),
        (
            lambda t: t.update({"fc.weight" + VALUES_SUFFIX: torch.zeros(1, dtype=torch.uint8)}),
            None,
            r"'fc.weight': sparse codes",
        ),
        (None, _edit_layer("nonzero", 10**6), r"'fc.weight': sparse codes"),
        (None, _edit_layer("symbols", 1), r"'fc.weight': sparse codes"),
        (None, _edit_layer("storage", "zip"), "unknown storage 'zip'"),
        (None, _edit_layer("storage", "dense"), "corrupt"),
    ],
)
def test_tampered_sparse_layers_fail_with_one_clear_error(
    pruned_masked: Path, tmp_path: Path, edit_tensors, edit_meta, match
) -> None:
    export_packed(pruned_masked, tmp_path / "s.safetensors")
    bad = rewritten(
        tmp_path / "s.safetensors", tmp_path / "bad.safetensors", edit_tensors, edit_meta
    )
    with pytest.raises(ValueError, match=match):
        load_packed(bad)


def test_a_valid_looking_edit_of_sparse_values_fails_the_digest(
    pruned_masked: Path, tmp_path: Path
) -> None:
    export_packed(pruned_masked, tmp_path / "s.safetensors")

    def flip(tensors) -> None:
        tensors["fc.weight" + VALUES_SUFFIX][0] ^= 1  # another sign: still a valid code

    bad = rewritten(tmp_path / "s.safetensors", tmp_path / "bad.safetensors", flip)
    with pytest.raises(ValueError, match="sha256 digest"):
        load_packed(bad)


# ------------------------------------------------- impossible files, re-signed with a new digest


@pytest.mark.parametrize(
    ("edit", "key", "problem"),
    [
        (_plant("bn.running_var", (0,), -1.0), "bn.running_var",
         "a variance cannot be negative: 1 negative value(s) (first: -1.0 at flat index 0)"),
        (_plant("bn.running_var", (3,), float("nan")), "bn.running_var",
         "1 non-finite value(s) (first: nan at flat index 3)"),
        (_plant("fc.bias", (2,), float("inf")), "fc.bias",
         "1 non-finite value(s) (first: inf at flat index 2)"),
        (lambda t: t.update({"bn.num_batches_tracked": torch.tensor(-1)}),
         "bn.num_batches_tracked", "a count of batches cannot be negative, got -1"),
        (lambda t: t.update({"bn.num_batches_tracked": torch.tensor([1, 2])}),
         "bn.num_batches_tracked", "a count of batches must be one number, got shape [2]"),
        (lambda t: t.update({"bn.running_var": torch.ones(5, dtype=torch.int32)}),
         "bn.running_var", "a running variance must be a float tensor, got torch.int32"),
    ],
)  # fmt: skip
def test_load_refuses_impossible_tensors_whatever_their_digest(
    packed_file: Path, edit, key: str, problem: str
) -> None:
    bad = rewritten(packed_file, packed_file.with_name("bad.safetensors"), edit, resign=True)
    with pytest.raises(ValueError) as err:
        load_packed(bad)
    assert str(err.value) == f"{bad}: {key!r}: {problem}"
    loaded = load_packed(bad, validate=False)
    assert loaded.digest_problem is None  # re-signed: only the checks catch it
    assert loaded.problems() == [(key, problem)]


def test_export_refuses_impossible_tensors_and_writes_nothing(tmp_path: Path) -> None:
    path, _ = masked_file(tmp_path, 5)
    bad = rewritten(
        path, tmp_path / "bad.safetensors", _plant("bn.running_var", (1,), -2.0), resign=True
    )
    before = _files(tmp_path)
    with pytest.raises(ValueError) as err:
        export_packed(bad, tmp_path / "out.safetensors")
    assert str(err.value) == (
        "cannot pack 'bn.running_var': a variance cannot be negative: 1 negative value(s) "
        "(first: -2.0 at flat index 1)"
    )
    assert _files(tmp_path) == before


@pytest.mark.parametrize("value", ["[1]", '"digits"'])
def test_the_data_description_must_be_a_json_object(packed_file: Path, value: str) -> None:
    bad = rewritten(packed_file, packed_file.with_name("bad.safetensors"), None,
                    lambda m: m.update(data=value), resign=True)  # fmt: skip
    with pytest.raises(ValueError) as err:
        load_packed(bad)
    found = json.loads(value)
    cause = TypeError(f"'data' must be a JSON object, got {found!r}")
    assert str(err.value) == f"{bad}: corrupt INQ packed file metadata ({cause!r})"


# ---------------------------------------------------------------- per-layer bits


@pytest.mark.parametrize("sparse", [False, True])
def test_mixed_bits_round_trip_masked_packed_decoded(tmp_path: Path, sparse: bool) -> None:
    """Nibble- and byte-packed layers in one file, each at its own bits, decode bit for bit."""
    from inq.codes import code_width

    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 5, 3), nn.Conv2d(5, 5, 3, groups=5), nn.Linear(64, 64), nn.Linear(64, 3)
    )
    layer_bits = {"0": 8, "2": 5, "3": 2}  # the depthwise conv: the default 3
    sched = INQScheduler(model, bits=3, portions=(0.5, 1.0), layer_bits=layer_bits)
    if sparse:
        sched.prune({"2": 0.9})
    while not sched.done:
        sched.step()
    save_masked(tmp_path / "m.safetensors", model, sched, {"name": "mixed"})
    export_packed(tmp_path / "m.safetensors", tmp_path / "p.safetensors", sparse=sparse)
    ckpt, packed = load_masked(tmp_path / "m.safetensors"), load_packed(tmp_path / "p.safetensors")
    expected = {"0.weight": 8, "1.weight": 3, "2.weight": 5, "3.weight": 2}
    assert ckpt.layer_bits == expected
    assert {key: layer.bits for key, layer in packed.layers.items()} == expected
    assert packed.metadata["bits"] == "3"
    info = json.loads(packed.metadata["layers"])
    assert {key: (i["bits"], i["width"]) for key, i in info.items()} == {
        key: (bits, code_width(bits)) for key, bits in expected.items()
    }
    assert packed.layers["2.weight"].storage == ("gaps" if sparse else "dense")
    state = packed.state_dict()
    for key, value in model.state_dict().items():
        assert torch.equal(state[key], value), key
    for key, layer in packed.layers.items():
        assert torch.equal(layer.codes(), pow2_encode(ckpt.state[key], layer.n1, layer.bits))


def test_old_masked_files_pack_with_every_layer_at_bits(tmp_path: Path) -> None:
    path, model = masked_file(tmp_path, 4)
    export_packed(masked_v2(path, tmp_path / "old.safetensors"), tmp_path / "p.safetensors")
    packed = load_packed(tmp_path / "p.safetensors")
    assert {layer.bits for layer in packed.layers.values()} == {4}
    state = packed.state_dict()
    for key, value in model.state_dict().items():
        assert torch.equal(state[key], value), key
