"""Datasets and loaders: the digits split, resumable order, sharded evaluation, bad roots."""

from __future__ import annotations

import gzip
from collections import Counter
from pathlib import Path

import pytest
import torch
from torch.utils.data import Dataset

from inq.data import (
    FASHION_MNIST_ROOT,
    ResumableSampler,
    batches_per_epoch,
    build_datasets,
    build_eval_loader,
    build_train_loader,
    changed_split,
    data_record,
    eval_data_config,
    input_preprocessing,
    read_idx,
)
from inq.errors import ConfigError

DIGITS = {
    "name": "digits",
    "in_channels": 1,
    "image_size": 8,
    "val_fraction": 0.25,
    "split_seed": 0,
}


def test_digits_split_is_stratified_and_fixed() -> None:
    cfg = {"name": "digits", "val_fraction": 0.25, "split_seed": 0}
    train, val = build_datasets(cfg)
    assert (len(train), len(val)) == (1347, 450)
    held_out = Counter(val.tensors[1].tolist())
    total = held_out + Counter(train.tensors[1].tolist())
    assert all(abs(held_out[c] - 0.25 * total[c]) <= 1 for c in range(10))  # per class 25 %
    again = build_datasets(cfg)[1]
    assert torch.equal(again.tensors[0], val.tensors[0])


def test_synthetic_sizes_and_caps() -> None:
    cfg = {"name": "synthetic", "num_classes": 4, "in_channels": 3, "image_size": 6}
    train, val = build_datasets({**cfg, "train_size": 40, "val_size": 12})
    assert (len(train), len(val)) == (40, 12)
    assert train[0][0].shape == (3, 6, 6)
    digits_train, _ = build_datasets({"name": "digits", "train_size": 100})
    assert len(digits_train) == 100


def test_resumed_epoch_continues_the_same_order() -> None:
    data = list(range(50))
    full = ResumableSampler(data, num_replicas=1, rank=0, seed=3)
    full.set_epoch(7)
    order = list(full)
    assert sorted(i for _, i in order) == data and {e for e, _ in order} == {7}
    full.set_epoch(7, start=20)
    assert list(full) == order[20:] and len(full) == 30
    full.set_epoch(8)
    assert [i for _, i in full] != [i for _, i in order]


class RandomlyAugmented(Dataset):
    """Each read draws from torch's global generator, like torchvision's random transforms."""

    def __len__(self) -> int:
        return 24

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        return index + torch.rand(3), index


@pytest.mark.parametrize("workers", [0, 2])
def test_augmentation_depends_only_on_seed_epoch_and_sample(workers: int) -> None:
    """Resumed mid-epoch, with or without worker processes, every sample gets the same random
    draw as in the uninterrupted epoch (what makes resume bit-identical with num_workers > 0)."""
    cfg = {"batch_size": 4, "num_workers": workers}
    loader = build_train_loader(cfg, RandomlyAugmented(), seed=5)
    reference = build_train_loader({"batch_size": 4}, RandomlyAugmented(), seed=5)
    reference.sampler.set_epoch(2)
    whole = torch.cat([x for x, _ in reference])
    loader.sampler.set_epoch(2, start=8)
    assert torch.equal(torch.cat([x for x, _ in loader]), whole[8:])
    loader.sampler.set_epoch(3)
    assert not torch.equal(torch.cat([x for x, _ in loader]), whole)


def test_train_loader_leaves_the_global_rng_alone() -> None:
    train, _ = build_datasets({"name": "synthetic", "train_size": 64, "val_size": 8})
    loader = build_train_loader({"batch_size": 16}, train, seed=0)
    assert batches_per_epoch(loader) == 4
    state = torch.get_rng_state()
    list(loader)
    assert torch.equal(torch.get_rng_state(), state)


def test_eval_shards_cover_every_sample_once() -> None:
    cfg = {"name": "synthetic", "train_size": 8, "val_size": 11, "eval_batch_size": 4}
    seen = [
        y
        for rank in range(3)
        for _, labels in build_eval_loader(cfg, rank=rank, world_size=3)
        for y in labels.tolist()
    ]
    assert len(seen) == 11


@pytest.mark.parametrize("name", ["cifar10", "cifar100", "imagenet"])
def test_missing_dataset_directory_names_data_root(tmp_path: Path, name: str) -> None:
    with pytest.raises(ConfigError, match=r"^data\.root: .*needs a local directory"):
        build_datasets({"name": name, "root": None})
    with pytest.raises(ConfigError, match=r"^data\.root: .* is not a directory"):
        build_datasets({"name": name, "root": str(tmp_path / "absent")})
    with pytest.raises(ConfigError, match=r"^data\.root: "):
        build_datasets({"name": name, "root": str(tmp_path)})  # exists but holds no data


def test_an_imagefolder_tree_without_images_names_data_root(tmp_path: Path) -> None:
    for split in ("train/cat", "val/cat"):
        (tmp_path / split).mkdir(parents=True)  # class folders, but no images in them
    with pytest.raises(ConfigError, match=r"^data\.root: .*not an ImageFolder tree"):
        build_datasets({"name": "imagenet", "root": str(tmp_path)})


def test_unknown_dataset_names_data_name() -> None:
    with pytest.raises(ConfigError, match=r"^data\.name: unknown dataset 'emnist'"):
        build_datasets({"name": "emnist"})


# ---------------------------------------------------------------- idx files ((Fashion-)MNIST


def write_idx(path: Path, array: torch.Tensor, compress: bool = True) -> None:
    """An unsigned-byte idx file, written independently of inq's reader."""
    header = bytes([0, 0, 8, array.dim()]) + b"".join(n.to_bytes(4, "big") for n in array.shape)
    data = header + array.to(torch.uint8).numpy().tobytes()
    if compress:
        path.with_name(path.name + ".gz").write_bytes(gzip.compress(data))
    else:
        path.write_bytes(data)


def idx_folder(folder: Path, train: int = 12, test: int = 5, compress: bool = True) -> Path:
    g = torch.Generator().manual_seed(0)
    for prefix, n in (("train", train), ("t10k", test)):
        images = torch.randint(0, 256, (n, 28, 28), generator=g)
        write_idx(folder / f"{prefix}-images-idx3-ubyte", images, compress)
        write_idx(folder / f"{prefix}-labels-idx1-ubyte", torch.arange(n) % 10, compress)
    return folder


@pytest.mark.parametrize("compress", [True, False])
@pytest.mark.parametrize("name", ["fashion_mnist", "mnist"])
def test_idx_datasets_read_every_image_and_label(tmp_path: Path, name: str, compress: bool) -> None:
    idx_folder(tmp_path, compress=compress)
    train, val = build_datasets({"name": name, "root": str(tmp_path)})
    assert (len(train), len(val)) == (12, 5)
    image, label = train[3]
    assert image.shape == (1, 28, 28) and image.dtype == torch.float32 and int(label) == 3
    raw = read_idx(tmp_path / ("train-images-idx3-ubyte" + (".gz" if compress else "")))
    mean, std = {"fashion_mnist": (0.2860, 0.3530), "mnist": (0.1307, 0.3081)}[name]
    assert torch.equal(image[0], (raw[3].float() / 255 - mean) / std)


def test_evaluation_needs_only_the_test_split(tmp_path: Path) -> None:
    idx_folder(tmp_path)
    for stem in ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"):
        (tmp_path / f"{stem}.gz").unlink()
    cfg = {"name": "fashion_mnist", "root": str(tmp_path), "eval_batch_size": 2}
    assert [len(y) for _, y in build_eval_loader(cfg)] == [2, 2, 1]
    with pytest.raises(ConfigError, match=r"has no train-images-idx3-ubyte\.gz"):
        build_datasets(cfg)  # training does need it


def test_a_size_or_channel_count_the_images_contradict_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"^data\.image_size: digits images are 8x8, not 16$"):
        build_datasets({"name": "digits", "image_size": 16})
    with pytest.raises(ConfigError, match=r"^data\.in_channels: digits images have 1 channel"):
        build_eval_loader({"name": "digits", "in_channels": 3})


def test_idx_files_that_are_absent_or_bad_give_one_clear_message(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"^data\.root: .*mnist needs a local directory"):
        build_datasets({"name": "mnist", "root": None})
    with pytest.raises(ConfigError, match=r"has no train-images-idx3-ubyte\.gz"):
        build_datasets({"name": "fashion_mnist", "root": str(tmp_path)})
    with pytest.raises(ConfigError, match="apt-get install dataset-fashion-mnist"):
        build_datasets({"name": "fashion_mnist", "root": str(tmp_path)})
    idx_folder(tmp_path)
    labels = tmp_path / "t10k-labels-idx1-ubyte.gz"
    labels.write_bytes(gzip.compress(gzip.decompress(labels.read_bytes())[:-2]))
    with pytest.raises(ConfigError, match=r"t10k-labels.*3 bytes of data, its header says"):
        build_datasets({"name": "mnist", "root": str(tmp_path)})
    labels.write_bytes(b"not gzip")
    with pytest.raises(ConfigError, match=r"cannot read .*t10k-labels-idx1-ubyte\.gz"):
        build_datasets({"name": "mnist", "root": str(tmp_path)})


def test_fashion_mnist_defaults_to_the_debian_package_folder() -> None:
    assert FASHION_MNIST_ROOT == "/usr/share/datasets/fashion-mnist"
    if not Path(FASHION_MNIST_ROOT, "t10k-labels-idx1-ubyte.gz").is_file():
        with pytest.raises(ConfigError, match=FASHION_MNIST_ROOT):
            build_datasets({"name": "fashion_mnist"})
        return
    _, val = build_datasets({"name": "fashion_mnist"})  # the real files, where installed
    labels = torch.stack([val[i][1] for i in range(len(val))])
    assert len(val) == 10000 and torch.bincount(labels).tolist() == [1000] * 10


def test_the_split_keys_are_the_ones_that_change_the_held_out_images() -> None:
    """A changed split_seed or val_fraction moves training images into the validation set;
    nothing else changes which images are held out."""
    from inq.data import SPLIT_KEYS

    recorded = eval_data_config({}, ["digits"])
    train = build_datasets(recorded)[0].tensors[0]
    seen = {tuple(x.flatten().tolist()) for x in train}
    for key, value in (("split_seed", 3), ("val_fraction", 0.5)):
        cfg = eval_data_config(recorded, [f"{key}={value}"])
        assert changed_split(recorded, cfg) == [f"{key}={value}"]
        val = build_datasets(cfg)[1].tensors[0]
        assert any(tuple(x.flatten().tolist()) in seen for x in val), key
    assert set(SPLIT_KEYS) == {"split_seed", "val_fraction"}
    for words in (["eval_batch_size=7"], ["split_seed=0"], ["val_size=100"]):
        assert changed_split(recorded, eval_data_config(recorded, words)) == []
    assert changed_split({}, eval_data_config({}, ["digits", "split_seed=3"])) == []


def test_a_file_records_the_data_without_loader_settings_and_with_its_input() -> None:
    a = data_record(eval_data_config({}, ["digits", "num_workers=0"]))
    b = data_record(eval_data_config({}, ["digits", "num_workers=4"]))
    assert a == b and "num_workers" not in a
    assert a["input"] == {"layout": "NCHW", "shape": [1, 8, 8], "dtype": "float32",
                          "pixels": "0..16 (8x8 grey levels)", "scale": 1 / 16, "mean": [0.5],
                          "std": [0.5]}  # fmt: skip
    assert data_record(a) == a and data_record({}) == {}
    cifar = input_preprocessing({"name": "cifar10", "in_channels": 3, "image_size": 32})
    assert cifar["scale"] == 1 / 255 and len(cifar["mean"]) == len(cifar["std"]) == 3
    imagenet = input_preprocessing({"name": "imagenet", "in_channels": 3, "image_size": 224})
    assert (imagenet["resize"], imagenet["center_crop"]) == (256, 224)


def test_the_loaders_apply_the_recorded_preprocessing() -> None:
    """digits: x = (pixel * scale - mean) / std from scikit-learn's raw 0..16 pixels, bit for
    bit what the loader gives."""
    from sklearn.datasets import load_digits

    p = input_preprocessing(DIGITS)
    raw, _ = load_digits(return_X_y=True)
    x = (torch.tensor(raw, dtype=torch.float32) * p["scale"] - p["mean"][0]) / p["std"][0]
    loaded = torch.cat([build_datasets(DIGITS)[0].tensors[0], build_datasets(DIGITS)[1].tensors[0]])
    rows = {tuple(r.tolist()) for r in x.reshape(len(x), -1)}
    assert all(tuple(r.tolist()) in rows for r in loaded.reshape(len(loaded), -1))
