"""Datasets and loaders from the resolved ``data`` config dict (usable without Hydra).

Datasets: ``digits`` (scikit-learn's bundled 8x8 digits, a stratified held-out split),
``fashion_mnist``/``mnist`` (the gzip idx files of the 60k/10k split under ``data.root``; Debian's
``dataset-fashion-mnist`` package installs Fashion-MNIST's in :data:`FASHION_MNIST_ROOT`),
``cifar10``/``cifar100`` (torchvision's python version under ``data.root``), ``imagenet`` (an
ImageFolder tree ``data.root/{train,val}/<class>/*``) and ``synthetic`` (Gaussian class templates
plus noise). Nothing is downloaded.

Training order is a pure function of (seed, epoch): :class:`ResumableSampler` can restart an epoch
at any batch, and :class:`SeededSamples` draws each sample's random augmentation from a generator
seeded by (seed, epoch, index), whichever worker process loads it. Together they make a resumed
run bit-identical to an uninterrupted one, with any ``num_workers``.
"""

from __future__ import annotations

import gzip
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, fields
from enum import Enum
from importlib import resources
from pathlib import Path
from typing import Any

import torch
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException
from torch.utils.data import DataLoader, Dataset, DistributedSampler, Subset, TensorDataset

from inq.errors import ConfigError

__all__ = [
    "DATASETS",
    "FASHION_MNIST_ROOT",
    "LOADER_KEYS",
    "SPLIT_KEYS",
    "DataConfig",
    "DataName",
    "ResumableSampler",
    "SeededSamples",
    "batches_per_epoch",
    "build_datasets",
    "build_eval_loader",
    "build_train_loader",
    "calibration_loader",
    "changed_split",
    "check_data",
    "data_record",
    "describe_input",
    "eval_data_config",
    "finetune_loader",
    "input_preprocessing",
    "input_shape",
    "read_idx",
]

DATASETS = ("digits", "fashion_mnist", "mnist", "cifar10", "cifar100", "imagenet", "synthetic")
FASHION_MNIST_ROOT = "/usr/share/datasets/fashion-mnist"  # apt-get install dataset-fashion-mnist
_IDX_FILES = {  # split: (images, labels), as distributed (gzip) or unpacked
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "val": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}
# Each dataset's input: x[c] = (pixel[c] / top - mean[c]) / std[c], pixel[c] its stored values
_NORMALIZE: dict[str, tuple[int, tuple[float, ...], tuple[float, ...]]] = {
    "digits": (16, (0.5,), (0.5,)),  # scikit-learn's pixels are 0..16: x = pixel / 8 - 1
    "fashion_mnist": (255, (0.2860,), (0.3530,)),
    "mnist": (255, (0.1307,), (0.3081,)),
    "cifar10": (255, (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
    "cifar100": (255, (0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)),
    "imagenet": (255, (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)),
    "synthetic": (1, (0.0,), (1.0,)),  # the generated values are the input
}
_PIXELS = {"digits": "0..16 (8x8 grey levels)", "synthetic": "Gaussian values"}  # else 0..255
# Which images are held out: evaluating with other values counts training images too
SPLIT_KEYS = ("val_fraction", "split_seed")
# How the data is loaded, not which data: files do not record these (their bytes stay the same)
LOADER_KEYS = ("num_workers",)

DataName = Enum("DataName", DATASETS)  # the names Hydra's ``data.name`` accepts


@dataclass
class DataConfig:
    """The ``data`` config: which dataset, where, its geometry and loader settings."""

    name: DataName = DataName.digits
    root: str | None = None  # local dataset directory (cifar*, imagenet, *mnist)
    num_classes: int = 10
    in_channels: int = 1
    image_size: int = 8
    val_fraction: float = 0.25  # held-out share of digits (stratified)
    split_seed: int = 0
    train_size: int | None = None  # cap (synthetic: exact count); None = all
    val_size: int | None = None
    augment: bool = True
    batch_size: int = 64  # per process
    eval_batch_size: int = 256
    num_workers: int = 0


def check_data(data: Mapping[str, Any], prefix: str) -> None:
    """The ranges of the ``data`` settings; ``prefix`` names them (``data.`` or ``--data ``)."""
    if data["num_workers"] < 0:
        raise ConfigError(f"{prefix}num_workers", f"must be >= 0, got {data['num_workers']}")
    positive = ("batch_size", "eval_batch_size", "num_classes", "in_channels", "image_size")
    optional = ("train_size", "val_size")
    for key in positive + optional:
        value = data[key]
        if (value is not None or key in positive) and value <= 0:
            raise ConfigError(f"{prefix}{key}", f"must be > 0, got {value}")


def eval_data_config(recorded: Mapping[str, Any], words: Sequence[str]) -> dict[str, Any]:
    """The data config to evaluate a model on: what its run recorded, with ``words`` on top.

    ``words`` are an optional dataset ``NAME`` and ``KEY=VALUE`` settings of ``data``. A model
    whose file records its data is evaluated on that dataset only (same image size, channels and
    classes); ``NAME`` then just confirms it. Without a record, ``NAME`` picks ``conf/data``'s
    defaults.

    Example:
        >>> eval_data_config({}, ["digits", "eval_batch_size=100"])["eval_batch_size"]
        100
        >>> eval_data_config({"name": "synthetic", "image_size": 16}, [])["image_size"]
        16
        >>> eval_data_config({}, ["digits", "bogus=1"])  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        inq.errors.ConfigError: --data bogus: unknown key; data has [...]

    Raises:
        ConfigError: no dataset, a dataset other than the recorded one, an unknown key or a bad
            value.
    """
    names = [w for w in words if "=" not in w]
    settings = [w for w in words if "=" in w]
    if len(names) > 1:
        raise ConfigError("--data", f"one dataset name, got {names}")
    name = names[0] if names else recorded.get("name")
    if name is None:
        raise ConfigError("--data", "the file records no data config; name one, e.g. --data digits")
    if recorded and name != recorded.get("name"):
        raise ConfigError(
            "--data",
            f"the model was trained on {recorded.get('name')}, not {name}; its accuracy on "
            f"{name} would mean nothing (leave the name out to use {recorded.get('name')})",
        )
    known = [f.name for f in fields(DataConfig)]
    for word in settings:
        key = word.partition("=")[0]
        if key not in known:
            raise ConfigError(f"--data {key}", f"unknown key; data has {sorted(known)}")
    try:
        cfg = OmegaConf.structured(DataConfig)
        base = recorded or _packaged_data_config(str(name))
        cfg = OmegaConf.merge(cfg, {k: v for k, v in base.items() if k in known})
        cfg = OmegaConf.merge(cfg, OmegaConf.from_dotlist(settings))
    except OmegaConfBaseException as err:
        raise ConfigError("--data", str(err).splitlines()[0]) from None
    check_data(cfg, "--data ")
    return OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)  # type: ignore[return-value]


def _packaged_data_config(name: str) -> dict[str, Any]:
    path = resources.files("inq.conf") / "data" / f"{name}.yaml"
    if not path.is_file():
        raise ConfigError("--data", f"unknown dataset {name!r}; use one of {list(DATASETS)}")
    return OmegaConf.to_container(OmegaConf.create(path.read_text()), resolve=True)  # type: ignore[return-value]


def changed_split(recorded: Mapping[str, Any], cfg: Mapping[str, Any]) -> list[str]:
    """``KEY=VALUE`` of each :data:`SPLIT_KEYS` setting in which ``cfg`` differs from the data
    config a model file records (none if it records none): with those, its "held-out" images
    are not the ones the model was held out from.

    Example:
        >>> recorded = eval_data_config({}, ["digits"])
        >>> changed_split(recorded, eval_data_config(recorded, ["split_seed=3"]))
        ['split_seed=3']
        >>> changed_split(recorded, eval_data_config(recorded, ["eval_batch_size=7"]))
        []
    """
    if not recorded:
        return []
    base = eval_data_config(recorded, [])
    return [f"{key}={cfg[key]}" for key in SPLIT_KEYS if cfg.get(key) != base[key]]


def input_preprocessing(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """How an input of the data config ``cfg`` is made from an image, as a file records it for
    whoever feeds the model: layout and shape, then ``x[c] = (pixel[c] * scale - mean[c]) /
    std[c]`` (ImageNet: resized and centre-cropped first). The loaders apply exactly this.

    Example:
        >>> input_preprocessing({"name": "digits", "in_channels": 1, "image_size": 8})
        {'layout': 'NCHW', 'shape': [1, 8, 8], 'dtype': 'float32', 'pixels': '0..16 (8x8 grey levels)', 'scale': 0.0625, 'mean': [0.5], 'std': [0.5]}
    """  # noqa: E501
    name = str(cfg["name"])
    top, mean, std = _NORMALIZE[name]
    channels, size, _ = input_shape(cfg)
    if len(mean) == 1:
        mean, std = mean * channels, std * channels
    pixels = _PIXELS.get(name, "0..255 (8-bit" + (" RGB)" if channels == 3 else " grey levels)"))
    out = {"layout": "NCHW", "shape": [channels, size, size], "dtype": "float32",
           "pixels": pixels, "scale": 1 / top, "mean": list(mean), "std": list(std)}  # fmt: skip
    if name == "imagenet":
        out.update(resize=_imagenet_resize(size), center_crop=size)
    return out


def describe_input(preprocessing: Mapping[str, Any]) -> str:
    """One line of :func:`input_preprocessing`'s record, for ``inq info``.

    Example:
        >>> print(describe_input(input_preprocessing({"name": "digits", "in_channels": 1,
        ...                                            "image_size": 8})))
        input NCHW float32 [N, 1, 8, 8]: x = (pixel * 0.0625 - mean) / std, mean [0.5], std [0.5]; pixels 0..16 (8x8 grey levels)
    """  # noqa: E501
    p = preprocessing
    shape = ", ".join(map(str, ["N", *p["shape"]]))
    crop = (f"; resize the short side to {p['resize']}, centre-crop {p['center_crop']}"
            if "resize" in p else "")  # fmt: skip
    return (
        f"input {p['layout']} {p['dtype']} [{shape}]: x = (pixel * {p['scale']:.6g} - mean) / "
        f"std, mean {p['mean']}, std {p['std']}; pixels {p['pixels']}{crop}"
    )


def data_record(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """What a model file records of the data config ``cfg`` (``data``): every setting but the
    :data:`LOADER_KEYS`, and ``input``, its :func:`input_preprocessing`. ``{}`` for ``{}``.

    Example:
        >>> record = data_record(eval_data_config({}, ["digits", "num_workers=4"]))
        >>> "num_workers" in record, record["input"]["scale"]
        (False, 0.0625)
    """
    if not cfg:
        return {}
    defaults = {"in_channels": DataConfig.in_channels, "image_size": DataConfig.image_size}
    kept = {k: v for k, v in cfg.items() if k not in LOADER_KEYS and k != "input"}
    return {**kept, "input": input_preprocessing({**defaults, **kept})}


def input_shape(cfg: Mapping[str, Any]) -> tuple[int, int, int]:
    """(channels, height, width) of one input image.

    Example:
        >>> input_shape({"name": "digits", "in_channels": 1, "image_size": 8})
        (1, 8, 8)
    """
    size = int(cfg["image_size"])
    return int(cfg["in_channels"]), size, size


def build_datasets(cfg: Mapping[str, Any]) -> tuple[Dataset, Dataset]:
    """(train, validation) datasets of ``cfg["name"]``, capped to ``train_size``/``val_size``.

    Example:
        >>> train, val = build_datasets({"name": "digits", "val_fraction": 0.25, "split_seed": 0})
        >>> len(train), len(val), tuple(val[0][0].shape)
        (1347, 450, (1, 8, 8))

    Raises:
        ConfigError: unknown ``data.name``, or a missing or unreadable ``data.root``.
    """
    train, val = _build(cfg, with_train=True)
    assert train is not None
    return _cap(train, cfg.get("train_size")), val


def _build(cfg: Mapping[str, Any], with_train: bool) -> tuple[Dataset | None, Dataset]:
    """(train, validation) of ``cfg["name"]``; the training split only ``with_train`` where it
    is read from files (evaluation needs none), the validation split capped to ``val_size``."""
    name = str(cfg["name"])
    builders = {
        "digits": _digits,
        "fashion_mnist": _mnist,
        "mnist": _mnist,
        "cifar10": _cifar,
        "cifar100": _cifar,
        "imagenet": _imagenet,
        "synthetic": _synthetic,
    }
    if name not in builders:
        raise ConfigError("data.name", f"unknown dataset {name!r}; choose one of {DATASETS}")
    train, val = builders[name](cfg, with_train)
    _check_fits(cfg, val)
    return train, _cap(val, cfg.get("val_size"))


_CLASSES = {"digits": 10, "fashion_mnist": 10, "mnist": 10, "cifar10": 10, "cifar100": 100}


def _check_fits(cfg: Mapping[str, Any], dataset: Dataset) -> None:
    """Refuse ``data.num_classes``/``data.in_channels``/``data.image_size`` that the images or
    labels contradict (they size the model and its exports, which would fail deep inside)."""
    name = str(cfg["name"])
    classes = len(dataset.classes) if name == "imagenet" else _CLASSES.get(name)  # type: ignore[attr-defined]
    wanted = cfg.get("num_classes")
    if classes is not None and wanted is not None and int(wanted) != classes:
        raise ConfigError("data.num_classes", f"{name} has {classes} classes, not {wanted}")
    channels = int(dataset[0][0].shape[0])
    wanted = cfg.get("in_channels")
    if wanted is not None and int(wanted) != channels:
        raise ConfigError(
            "data.in_channels", f"{name} images have {channels} channel(s), not {wanted}"
        )
    size = tuple(dataset[0][0].shape[1:])
    wanted = cfg.get("image_size")
    if wanted is not None and size != (int(wanted), int(wanted)):
        what = "x".join(map(str, size))
        raise ConfigError("data.image_size", f"{name} images are {what}, not {wanted}")


def build_eval_loader(
    cfg: Mapping[str, Any], dataset: Dataset | None = None, rank: int = 0, world_size: int = 1
) -> DataLoader:
    """Loader over the validation set (or ``dataset``); with several ranks, each gets a shard.

    Shards are disjoint and unpadded, so summing counts over ranks counts every sample once.

    Example:
        >>> loader = build_eval_loader({"name": "digits", "eval_batch_size": 100})
        >>> sum(len(y) for _, y in loader)
        450
    """
    if dataset is None:
        dataset = _build(cfg, with_train=False)[1]
    if world_size > 1:
        dataset = Subset(dataset, range(rank, len(dataset), world_size))
    return DataLoader(
        dataset,
        batch_size=int(cfg.get("eval_batch_size", 256)),
        num_workers=int(cfg.get("num_workers", 0)),
    )


class ResumableSampler(DistributedSampler):
    """DistributedSampler whose epoch order is fixed by (seed, epoch) and can start mid-epoch.

    It yields ``(epoch, index)`` pairs, the keys of :class:`SeededSamples`.

    Example:
        >>> s = ResumableSampler(range(10), seed=0, num_replicas=1, rank=0)
        >>> s.set_epoch(3)
        >>> full = list(s)
        >>> full[0][0], sorted(i for _, i in full) == list(range(10))
        (3, True)
        >>> s.set_epoch(3, start=4)
        >>> list(s) == full[4:]
        True
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.start = 0

    def set_epoch(self, epoch: int, start: int = 0) -> None:
        """Select the epoch's order and skip its first ``start`` samples of this rank."""
        super().set_epoch(epoch)
        self.start = start

    def __iter__(self) -> Iterator[tuple[int, int]]:
        return ((self.epoch, i) for i in list(super().__iter__())[self.start :])

    def __len__(self) -> int:
        return self.num_samples - self.start


class SeededSamples(Dataset):
    """A dataset read by ``(epoch, index)``: the sample's random transforms draw from torch's
    generator seeded by (seed, epoch, index), and the caller's generator state is left as it was.

    So augmentation does not depend on which worker process loads a sample, or on where in the
    epoch a resumed run starts.

    Example:
        >>> class Noisy(Dataset):
        ...     def __len__(self): return 4
        ...     def __getitem__(self, i): return torch.rand(())
        >>> samples = SeededSamples(Noisy(), seed=0)
        >>> bool(samples[1, 2] == samples[1, 2]), bool(samples[1, 2] == samples[2, 2])
        (True, False)
    """

    def __init__(self, dataset: Dataset, seed: int) -> None:
        self.dataset, self.seed = dataset, seed

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]

    def __getitem__(self, key: tuple[int, int]) -> Any:
        epoch, index = key
        generator = torch.default_generator  # what CPU transforms draw from
        state = generator.get_state()
        generator.manual_seed(hash((self.seed, epoch, index)) & (2**63 - 1))
        try:
            return self.dataset[index]
        finally:
            generator.set_state(state)  # (torch.manual_seed would cost 50x more: every device)


def build_train_loader(
    cfg: Mapping[str, Any], dataset: Dataset, seed: int, rank: int = 0, world_size: int = 1
) -> DataLoader:
    """Shuffled training loader; its sampler is a :class:`ResumableSampler`.

    The loader has its own generator, so iterating it never draws from the global RNG.

    Example:
        >>> train, _ = build_datasets({"name": "synthetic", "train_size": 32, "val_size": 8})
        >>> loader = build_train_loader({"batch_size": 8}, train, seed=0)
        >>> loader.sampler.set_epoch(0, start=16)
        >>> len(list(loader))
        2
    """
    sampler = ResumableSampler(dataset, num_replicas=world_size, rank=rank, seed=seed)
    return DataLoader(
        SeededSamples(dataset, seed),
        batch_size=int(cfg["batch_size"]),
        sampler=sampler,
        num_workers=int(cfg.get("num_workers", 0)),
        generator=torch.Generator().manual_seed(seed),
        pin_memory=torch.cuda.is_available(),
    )


def calibration_loader(cfg: Mapping[str, Any], batches: int, seed: int) -> DataLoader:
    """``batches`` batches of ``eval_batch_size`` training images as evaluation sees them (no
    augmentation), drawn at random (seeded: a dataset sorted by class, as an ImageFolder is,
    would otherwise calibrate on a few classes).

    Example:
        >>> loader = calibration_loader({"name": "digits", "eval_batch_size": 100}, 2, seed=0)
        >>> [tuple(x.shape) for x, _ in loader]
        [(100, 1, 8, 8), (100, 1, 8, 8)]
    """
    train = build_datasets({**cfg, "augment": False})[0]
    size = int(cfg.get("eval_batch_size", 256))
    pick = torch.randperm(len(train), generator=torch.Generator().manual_seed(seed))
    return DataLoader(Subset(train, pick[: batches * size].tolist()), batch_size=size)


def finetune_loader(cfg: Mapping[str, Any], seed: int) -> DataLoader:
    """Training batches of ``batch_size``, augmented as in training (``augment``), reshuffled
    at each pass from ``seed``: what ``inq calibrate --epochs`` fine-tunes on.

    Example:
        >>> loader = finetune_loader({"name": "digits", "batch_size": 500}, seed=0)
        >>> [len(y) for _, y in loader]
        [500, 500, 347]
    """
    return DataLoader(
        build_datasets(cfg)[0],
        batch_size=int(cfg.get("batch_size", 64)),
        shuffle=True,
        generator=torch.Generator().manual_seed(seed),
    )


def batches_per_epoch(loader: DataLoader) -> int:
    """Batches in a full epoch of a :func:`build_train_loader` loader on this rank."""
    return math.ceil(loader.sampler.num_samples / loader.batch_size)


# ---------------------------------------------------------------------------- datasets


def _cap(dataset: Dataset, size: int | None) -> Dataset:
    if size is None or size >= len(dataset):
        return dataset
    return Subset(dataset, range(int(size)))


def _digits(cfg: Mapping[str, Any], with_train: bool) -> tuple[Dataset, Dataset]:
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    x, y = load_digits(return_X_y=True)
    fraction = float(cfg.get("val_fraction", 0.25))
    if not 0.0 < fraction < 1.0:
        raise ConfigError("data.val_fraction", f"must lie in (0, 1), got {fraction}")
    x_tr, x_va, y_tr, y_va = train_test_split(
        x, y, test_size=fraction, stratify=y, random_state=int(cfg.get("split_seed", 0))
    )

    top, (mean,), (std,) = _NORMALIZE["digits"]

    def tensors(x: Any, y: Any) -> TensorDataset:
        pixels = torch.as_tensor(x, dtype=torch.float32).reshape(-1, 1, 8, 8)
        return TensorDataset((pixels / top - mean) / std, torch.as_tensor(y, dtype=torch.long))

    return tensors(x_tr, y_tr), tensors(x_va, y_va)


def read_idx(path: str | Path) -> torch.Tensor:
    """The ``uint8`` array of an idx file (the MNIST format), gzip-compressed or not.

    Example:
        >>> import tempfile, pathlib
        >>> file = pathlib.Path(tempfile.mkdtemp()) / "labels-idx1-ubyte"
        >>> _ = file.write_bytes(bytes([0, 0, 8, 1, 0, 0, 0, 3, 7, 2, 9]))
        >>> read_idx(file)
        tensor([7, 2, 9], dtype=torch.uint8)

    Raises:
        ValueError: if the file is not an unsigned-byte idx file or its size does not match its
            header.
    """
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as f:
        data = f.read()
    if len(data) < 4 or data[:3] != bytes([0, 0, 8]) or not 1 <= data[3] <= 4:
        raise ValueError(f"{path}: not an unsigned-byte idx file (header {data[:4].hex()})")
    dims = data[3]
    header = 4 + 4 * dims
    shape = [int.from_bytes(data[4 + 4 * i : 8 + 4 * i], "big") for i in range(dims)]
    if len(data) != header + math.prod(shape):
        raise ValueError(
            f"{path}: {len(data) - header} bytes of data, its header says {shape} (truncated?)"
        )
    return torch.frombuffer(bytearray(data[header:]), dtype=torch.uint8).reshape(shape)


def _mnist(cfg: Mapping[str, Any], with_train: bool) -> tuple[Dataset | None, Dataset]:
    name = str(cfg["name"])
    default = FASHION_MNIST_ROOT if name == "fashion_mnist" else None
    hint = "the gzip idx files (train-images-idx3-ubyte.gz, t10k-labels-idx1-ubyte.gz, ...)" + (
        f"; `apt-get install dataset-fashion-mnist` puts them in {default}" if default else ""
    )
    root = _root({"root": default, **{k: v for k, v in cfg.items() if v is not None}}, hint)
    top, (mean,), (std,) = _NORMALIZE[name]
    splits: dict[str, Dataset] = {}
    for split, files in _IDX_FILES.items():
        if split == "train" and not with_train:
            continue
        images, labels = (_idx_tensor(root, stem, hint) for stem in files)
        if images.dim() != 3 or labels.dim() != 1 or len(images) != len(labels):
            raise ConfigError(
                "data.root",
                f"{root}: {split} images {list(images.shape)} and labels {list(labels.shape)} "
                "do not pair up",
            )
        x = (images.unsqueeze(1).to(torch.float32) / top - mean) / std
        splits[split] = TensorDataset(x, labels.to(torch.long))
    return splits.get("train"), splits["val"]


def _idx_tensor(root: Path, stem: str, hint: str) -> torch.Tensor:
    for path in (root / f"{stem}.gz", root / stem):
        if path.is_file():
            try:
                return read_idx(path)
            except (OSError, EOFError, ValueError) as err:  # gzip: BadGzipFile is an OSError
                raise ConfigError("data.root", f"cannot read {path}: {err}") from err
    raise ConfigError("data.root", f"{root} has no {stem}.gz (or {stem}): {hint}")


def _synthetic(cfg: Mapping[str, Any], with_train: bool) -> tuple[Dataset, Dataset]:
    generator = torch.Generator().manual_seed(int(cfg.get("split_seed", 0)))
    classes = int(cfg.get("num_classes", 10))
    shape = input_shape({"in_channels": 3, "image_size": 32, **cfg})
    templates = torch.randn(classes, *shape, generator=generator)

    def make(n: int) -> TensorDataset:
        labels = torch.arange(n) % classes
        noise = torch.randn(n, *shape, generator=generator)
        return TensorDataset(templates[labels] + 2.0 * noise, labels)

    return make(int(cfg.get("train_size") or 1024)), make(int(cfg.get("val_size") or 256))


def _root(cfg: Mapping[str, Any], hint: str) -> Path:
    root = cfg.get("root")
    if not root:
        raise ConfigError("data.root", f"{cfg['name']} needs a local directory: {hint}")
    path = Path(str(root)).expanduser()
    if not path.is_dir():
        raise ConfigError("data.root", f"{path} is not a directory: {hint}")
    return path


def _cifar(cfg: Mapping[str, Any], with_train: bool) -> tuple[Dataset | None, Dataset]:
    from torchvision import datasets, transforms

    name = str(cfg["name"])
    root = _root(cfg, f"put the python version of {name.upper()} there (no download at run time)")
    _, mean, std = _NORMALIZE[name]  # ToTensor divides by 255
    normalize = [transforms.ToTensor(), transforms.Normalize(mean, std)]
    augment = [transforms.RandomCrop(32, padding=4), transforms.RandomHorizontalFlip()]
    train_tf = transforms.Compose((augment if cfg.get("augment", True) else []) + normalize)
    cls = datasets.CIFAR10 if name == "cifar10" else datasets.CIFAR100
    try:
        val = cls(str(root), train=False, transform=transforms.Compose(normalize), download=False)
        train = (
            cls(str(root), train=True, transform=train_tf, download=False) if with_train else None
        )
        return train, val
    except RuntimeError as err:  # torchvision: "Dataset not found or corrupted"
        raise ConfigError("data.root", f"{root}: no readable {name} data ({err})") from err


def _imagenet(cfg: Mapping[str, Any], with_train: bool) -> tuple[Dataset | None, Dataset]:
    from torchvision import datasets, transforms

    root = _root(cfg, "an ImageFolder tree with train/<class>/*.JPEG and val/<class>/*.JPEG")
    for split in ("train", "val") if with_train else ("val",):
        if not (root / split).is_dir():
            raise ConfigError("data.root", f"{root / split} is missing (ImageFolder layout)")
    size = int(cfg.get("image_size", 224))
    _, mean, std = _NORMALIZE["imagenet"]  # ToTensor divides by 255
    normalize = [transforms.ToTensor(), transforms.Normalize(mean, std)]
    augment = [transforms.RandomResizedCrop(size), transforms.RandomHorizontalFlip()]
    plain = [transforms.Resize(_imagenet_resize(size)), transforms.CenterCrop(size)]
    train_tf = augment if cfg.get("augment", True) else plain
    try:
        val = datasets.ImageFolder(str(root / "val"), transforms.Compose(plain + normalize))
        if not with_train:
            return None, val
        return datasets.ImageFolder(
            str(root / "train"), transforms.Compose(train_tf + normalize)
        ), val
    except FileNotFoundError as err:  # torchvision: no class folder, or a class without images
        raise ConfigError("data.root", f"{root}: not an ImageFolder tree ({err})") from err


def _imagenet_resize(size: int) -> int:
    """The short side an ImageNet image is resized to before its centre ``size`` crop."""
    return size * 8 // 7
