"""Packed power-of-two codes: the deployable form of a fully quantized model.

Each quantized weight is stored as rows of packed codes (:mod:`inq.codes` defines the layout).

A packed file is a ``.safetensors`` file, readable with the ``safetensors`` library alone:

- each quantized weight in the smaller of two storages (``storage`` in its metadata):

  - ``"dense"``: the packed ``uint8`` rows above under ``"<weight key>.inq_codes"``;
  - ``"bitmap"`` or ``"gaps"`` (sparse, for pruned layers): the non-zero codes at ``bits - 1``
    bits each under ``"<weight key>.inq_values"`` and their positions, a bitmap or relative gaps,
    under ``"<weight key>.inq_index"`` (:mod:`inq.sparse` defines both), chosen when that makes
    the file smaller than the dense rows do;

- every other tensor of the model's state (biases, norm layers, buffers) as it is;
- string metadata: ``format`` (``"inq-packed/3"``), ``bits`` (the default bit-width; each layer's
  own is in ``layers``), ``portions``, ``strategy``, ``n1_rule``, ``granularity``, ``layers``
  (JSON ``{weight key: {"module", "bits", "n1", "shape", "width", "dtype", "storage"}}``, the
  layer's own bits, n1 an int or a list with one int per row; sparse layers add
  ``"nonzero"``, ``"gap_bits"`` and ``"symbols"``), ``model`` (the masked checkpoint's model
  description, to rebuild the model) and ``data`` (the data config it was trained on; absent in
  older files).

Decoding reproduces the masked checkpoint's weights bit for bit; in memory every layer holds its
dense rows (:attr:`PackedLayer.packed`), which the inference ops read. Files of format
``"inq-packed/2"`` (dense only) and ``"inq-packed/1"`` (also one n1 per layer) still load; every
format records each layer's bits, so a model with per-layer bit-widths needs no newer one.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import nn

from inq.codes import code_width, codes_problem, decode_weight, pack_codes, row_bytes, unpack_codes
from inq.fileio import (
    SafetensorsFile,
    digest_problem,
    metadata_n1,
    n1_json,
    open_safetensors,
    write_safetensors,
)
from inq.masked import (
    MASKED_FORMATS,
    MaskedCheckpoint,
    load_masked,
    masked_layer_problem,
    masked_problems,
    state_problems,
)
from inq.pow2 import N1, check_bits, pow2_encode
from inq.sparse import LAYOUTS, SparseCodes, decode_sparse, encode_sparse

__all__ = [
    "CODES_SUFFIX",
    "INDEX_SUFFIX",
    "PACKED_FORMAT",
    "PACKED_FORMATS",
    "VALUES_SUFFIX",
    "PackStats",
    "PackedFile",
    "PackedLayer",
    "export_packed",
    "load_packed",
    "n1_problem",
    "pack_stats",
    "packed_from_masked",
]

PACKED_FORMAT = "inq-packed/3"
PACKED_FORMATS = ("inq-packed/1", "inq-packed/2", PACKED_FORMAT)  # what load_packed reads
CODES_SUFFIX, VALUES_SUFFIX, INDEX_SUFFIX = ".inq_codes", ".inq_values", ".inq_index"
# A sparse layer's second tensor and its counts lengthen the file's header by this much
# (measured: 120-128 bytes); it is stored sparse only when that still saves bytes.
SPARSE_HEADER_BYTES = 128
_MAX_WEIGHTS = 2**31  # per layer, far above real ones: a tampered shape cannot exhaust memory
_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def n1_problem(n1: N1, rows: int, dtype: torch.dtype) -> str | None:
    """Why ``n1`` (an int, or an int tensor with one per row of ``rows``) is not a valid top
    exponent of a ``dtype`` weight, or None: the top level ``2**n1`` must be a non-zero finite
    ``dtype`` value.

    Example:
        >>> n1_problem(-3, 4, torch.float32), n1_problem(torch.tensor([0, 1]), 2, torch.float16)
        (None, None)
        >>> n1_problem(200, 4, torch.float32)
        'n1=200 puts the top level 2**n1 outside torch.float32 (-149..127)'
        >>> n1_problem(torch.tensor([0, 1]), 3, torch.float32)
        '2 per-row n1 values for 3 rows'
    """
    low, high = _exponent_range(dtype)
    if isinstance(n1, torch.Tensor) and tuple(n1.shape) != (rows,):
        return f"{n1.numel()} per-row n1 values for {rows} rows"
    if isinstance(n1, int):
        extremes: tuple[int, ...] = (n1,)
    else:  # per row; no rows, nothing to check
        extremes = (int(n1.min()), int(n1.max())) if n1.numel() else ()
    for value in extremes:
        if not low <= value <= high:
            return f"n1={value} puts the top level 2**n1 outside {dtype} ({low}..{high})"
    return None


# ---------------------------------------------------------------------------------- file


@dataclass
class PackedLayer:
    """One quantized weight in packed form; ``packed`` is ``uint8 [shape[0], row_bytes]``;
    ``sparse`` is how the file stores it when sparse (None: the dense rows)."""

    module: str
    packed: torch.Tensor
    bits: int
    n1: N1  # an int, or int32 [shape[0]]: one per row
    shape: tuple[int, ...]
    dtype: torch.dtype
    sparse: SparseCodes | None = None

    @property
    def storage(self) -> str:
        """``"dense"``, ``"bitmap"`` or ``"gaps"``: how the file stores this layer."""
        return "dense" if self.sparse is None else self.sparse.layout

    @property
    def stored_bytes(self) -> int:
        """Bytes of this layer's tensors in the file."""
        return self.packed.numel() if self.sparse is None else self.sparse.nbytes

    @property
    def k(self) -> int:
        """Codes per row: the product of ``shape[1:]``."""
        return math.prod(self.shape[1:])

    def codes(self) -> torch.Tensor:
        """The ``uint8`` codes in the weight's shape."""
        return unpack_codes(self.packed, self.bits, self.k).reshape(self.shape)

    def weight(self) -> torch.Tensor:
        """The decoded weight, bit for bit the masked checkpoint's."""
        return decode_weight(self.packed, self.bits, self.n1, self.shape, self.dtype)

    def problem(self) -> str | None:
        """Why this layer is not a valid packed weight (layout, n1 range, codes), or None."""
        expected = [self.shape[0], row_bytes(self.k, self.bits)]
        if self.packed.dtype != torch.uint8 or list(self.packed.shape) != expected:
            return (
                f"packed codes are {self.packed.dtype} {list(self.packed.shape)}, expected "
                f"uint8 {expected} for shape {list(self.shape)} at {self.bits} bits"
            )
        bad_n1 = n1_problem(self.n1, self.shape[0], self.dtype)
        if bad_n1:
            return bad_n1
        if code_width(self.bits) == 4 and self.k % 2 and bool((self.packed[:, -1] >> 4).any()):
            return "a padding nibble at the end of an odd-length row is not zero"
        return codes_problem(self.codes(), self.bits)


@dataclass
class PackedFile:
    """A loaded packed file: quantized ``layers`` and the other ``tensors``, keyed as in the
    model's state dict, plus the ``model`` description and the file's string ``metadata``;
    ``digest_problem`` as in :class:`inq.masked.MaskedCheckpoint`."""

    layers: dict[str, PackedLayer]
    tensors: dict[str, torch.Tensor]
    model: dict[str, Any]
    metadata: dict[str, str]
    digest_problem: str | None = None

    @property
    def data(self) -> dict[str, Any]:
        """The data config the model was trained on (``{}`` if the file records none)."""
        data: dict[str, Any] = json.loads(self.metadata.get("data", "{}"))
        return data

    def problems(self) -> list[tuple[str, str]]:
        """``(key, problem)`` for everything that makes the file invalid: each quantized layer
        (:meth:`PackedLayer.problem`), then each other tensor (:func:`state_problems`); empty
        if it is sound. The digest is :attr:`digest_problem`'s.

        Example:
            >>> layer = PackedLayer("fc", torch.zeros(1, 1, dtype=torch.uint8), 4, 0, (1, 2),
            ...                     torch.float32)
            >>> PackedFile({"fc.weight": layer}, {"fc.bias": torch.zeros(1)}, {}, {}).problems()
            []
            >>> bad = PackedFile({"fc.weight": layer}, {"fc.bias": torch.tensor([float("inf")])},
            ...                  {}, {})
            >>> bad.problems()
            [('fc.bias', '1 non-finite value(s) (first: inf at flat index 0)')]
        """
        layers = [(key, layer.problem()) for key, layer in self.layers.items()]
        return [(key, p) for key, p in layers if p is not None] + state_problems(self.tensors)

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The model's full state dict with every quantized weight decoded."""
        return {**self.tensors, **{key: layer.weight() for key, layer in self.layers.items()}}

    def load_into(self, model: nn.Module) -> None:
        """Load the file's state, every quantized weight decoded, into ``model``.

        Raises:
            ValueError: if the file's tensors do not match the model's state (keys or shapes).
        """
        expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
        found: dict[str, tuple[int, ...]] = {k: tuple(v.shape) for k, v in self.tensors.items()}
        found.update({k: layer.shape for k, layer in self.layers.items()})
        problems = []
        missing = [k for k in expected if k not in found]
        unexpected = [k for k in found if k not in expected]
        wrong = [
            f"{k} {found[k]} vs {expected[k]}"
            for k in expected
            if found.get(k, expected[k]) != expected[k]
        ]
        misplaced = [
            k
            for k, layer in self.layers.items()
            if k != (f"{layer.module}.weight" if layer.module else "weight")
        ]
        for label, items in (
            ("missing", missing),
            ("unexpected", unexpected),
            ("shape (file vs model)", wrong),
            ("module name does not match", misplaced),
        ):
            if items:
                problems.append(
                    f"{label}: {', '.join(items[:5])}" + (" ..." if len(items) > 5 else "")
                )
        if problems:
            name = self.model.get("name", type(model).__name__)
            raise ValueError(
                f"the packed file does not match the model {name!r}: " + "; ".join(problems)
            )
        model.load_state_dict(self.state_dict())


@dataclass(frozen=True)
class PackStats:
    """Sizes of the quantized tensors: as fp32, as stored in the file and as dense rows (bytes).

    ``ratio`` = packed / fp32; ``compression`` = fp32 / packed, the paper's compression ratio
    (Table 5). ``other_bytes`` counts the tensors stored as they are; ``file_bytes`` is the file
    on disk (0 when not measured).
    """

    fp32_bytes: int
    packed_bytes: int
    other_bytes: int
    file_bytes: int = 0
    dense_bytes: int = 0

    @property
    def ratio(self) -> float:
        return self.packed_bytes / self.fp32_bytes if self.fp32_bytes else 0.0

    @property
    def compression(self) -> float:
        return self.fp32_bytes / self.packed_bytes if self.packed_bytes else math.inf

    def as_dict(self) -> dict[str, float]:
        """The sizes, the ratio and the compression, for ``summary.json``."""
        return {**asdict(self), "ratio": self.ratio, "compression": self.compression}


def pack_stats(packed: PackedFile, file_bytes: int = 0) -> PackStats:
    """Sizes of ``packed``'s quantized tensors as fp32, as stored and as dense rows.

    Example:
        >>> layer = PackedLayer("fc", torch.zeros(8, 32, dtype=torch.uint8), 4, 0, (8, 64),
        ...                     torch.float32)
        >>> stats = pack_stats(PackedFile({"fc.weight": layer}, {}, {}, {}))
        >>> stats.ratio, stats.compression
        (0.125, 8.0)
    """
    return PackStats(
        fp32_bytes=sum(4 * math.prod(layer.shape) for layer in packed.layers.values()),
        packed_bytes=sum(layer.stored_bytes for layer in packed.layers.values()),
        other_bytes=sum(t.numel() * t.element_size() for t in packed.tensors.values()),
        file_bytes=file_bytes,
        dense_bytes=sum(layer.packed.numel() for layer in packed.layers.values()),
    )


def export_packed(
    masked: MaskedCheckpoint | str | os.PathLike[str],
    out_path: str | os.PathLike[str],
    sparse: bool = True,
) -> PackStats:
    """Write the packed file of a fully quantized masked checkpoint atomically.

    Each layer is stored sparse (bitmap or gaps) where that makes the file smaller than its
    dense rows do (:data:`SPARSE_HEADER_BYTES` counted); ``sparse=False`` stores every layer's
    dense rows.

    Example:
        >>> import tempfile, pathlib
        >>> from torch import nn
        >>> from inq.masked import save_masked
        >>> from inq.scheduler import INQScheduler
        >>> net = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))
        >>> sched = INQScheduler(net, bits=4, portions=(1.0,))
        >>> _ = sched.step()
        >>> folder = pathlib.Path(tempfile.mkdtemp())
        >>> save_masked(folder / "net.safetensors", net, sched, {"name": "mlp"})
        >>> stats = export_packed(folder / "net.safetensors", folder / "net.inq.safetensors")
        >>> stats.packed_bytes, stats.fp32_bytes, stats.compression
        (1184, 9472, 8.0)
        >>> packed = load_packed(folder / "net.inq.safetensors")
        >>> torch.equal(packed.state_dict()["0.weight"], net[0].weight)
        True

        A pruned layer is stored sparse:

        >>> sched = INQScheduler(net, bits=4, portions=(1.0,))
        >>> _ = sched.prune({"0": 0.9})
        >>> _ = sched.step()
        >>> save_masked(folder / "net.safetensors", net, sched, {"name": "mlp"})
        >>> stats = export_packed(folder / "net.safetensors", folder / "net.inq.safetensors")
        >>> load_packed(folder / "net.inq.safetensors").layers["0.weight"].storage
        'gaps'
        >>> stats.packed_bytes < stats.dense_bytes
        True

    Raises:
        ValueError: if the checkpoint cannot be read, a mask is not fully set, or a quantized
            weight is off its level set (the message names the first such tensor).
    """
    ckpt = masked if isinstance(masked, MaskedCheckpoint) else load_masked(masked)
    tensors, metadata = _pack(ckpt, sparse)
    packed = _parse(tensors, metadata, out_path)  # first: never write a file that cannot load
    write_safetensors(out_path, tensors, metadata)
    return pack_stats(packed, os.path.getsize(out_path))


def packed_from_masked(ckpt: MaskedCheckpoint, sparse: bool = True) -> PackedFile:
    """The packed file of a fully quantized masked checkpoint, in memory (what
    :func:`export_packed` would write).

    Raises:
        ValueError: as :func:`export_packed`.
    """
    tensors, metadata = _pack(ckpt, sparse)
    return _parse(tensors, metadata, "<memory>")


def _pack(ckpt: MaskedCheckpoint, sparse: bool) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    bad = masked_problems(ckpt)
    if bad:
        raise ValueError(f"cannot pack {bad[0][0]!r}: {bad[0][1]}")
    tensors = {k: v.contiguous() for k, v in ckpt.state.items() if k not in ckpt.masks}
    layers = {}
    for key in ckpt.masks:
        problem = masked_layer_problem(ckpt, key)
        if problem:
            raise ValueError(f"cannot pack {key!r}: {problem}")
        weight, n1, bits = ckpt.state[key], ckpt.n1[key], ckpt.bits_of(key)
        assert n1 is not None  # masked_layer_problem refuses a layer without one
        dtype = next(name for name, d in _DTYPES.items() if d == weight.dtype)
        codes = pow2_encode(weight, n1, bits)
        dense = pack_codes(codes, bits)
        layers[key] = {
            "module": key.rpartition(".")[0],
            "bits": bits,
            "n1": n1_json(n1),
            "shape": list(weight.shape),
            "width": code_width(bits),
            "dtype": dtype,
            "storage": "dense",
        }
        small = encode_sparse(codes, bits) if sparse else None
        if small is not None and small.nbytes + SPARSE_HEADER_BYTES < dense.numel():
            tensors[key + VALUES_SUFFIX], tensors[key + INDEX_SUFFIX] = small.values, small.index
            layers[key].update(
                storage=small.layout,
                nonzero=small.nonzero,
                gap_bits=small.gap_bits,
                symbols=small.symbols,
            )
        else:
            tensors[key + CODES_SUFFIX] = dense
    metadata = {
        "format": PACKED_FORMAT,
        "bits": str(ckpt.bits),
        "portions": json.dumps(list(ckpt.portions)),
        "strategy": ckpt.strategy,
        "n1_rule": ckpt.n1_rule,
        "granularity": ckpt.granularity,
        "layers": json.dumps(layers),
        "model": json.dumps(ckpt.model),
        "data": json.dumps(ckpt.data),
    }
    if ckpt.digest_problem:
        raise ValueError(f"cannot pack: {ckpt.digest_problem}")
    return tensors, metadata


def load_packed(
    path: str | os.PathLike[str] | SafetensorsFile, validate: bool = True
) -> PackedFile:
    """Read a file written by :func:`export_packed` (safetensors only, nothing is unpickled), from
    its path or opened already (:func:`inq.artefact.open_artefact` opens any of inq's files).

    With ``validate`` (the default) the file is checked (:meth:`PackedFile.problems`: every
    layer's codes, every other tensor finite, norm statistics in range, then the digest), so a
    tampered file fails here with the offending tensor's name rather than load silently.

    Raises:
        ValueError: if the file is missing, truncated, not a safetensors file, not a packed INQ
            file, has inconsistent metadata, or (with ``validate``) holds invalid codes or an
            impossible tensor, or was modified after it was written.
    """
    file = open_safetensors(path)
    path, metadata = file.path, file.metadata
    fmt = metadata.get("format")
    if fmt not in PACKED_FORMATS:
        hint = "; run `inq export` on it first" if fmt in MASKED_FORMATS else ""
        raise ValueError(f"{path}: not an INQ packed file (format {fmt!r}){hint}")
    tensors = file.tensors()
    packed = _parse(tensors, metadata, path)
    packed.digest_problem = digest_problem(tensors, metadata)
    if validate:
        problems = packed.problems()
        if problems:
            raise ValueError(f"{path}: {problems[0][0]!r}: {problems[0][1]}")
        if packed.digest_problem:
            raise ValueError(f"{path}: {packed.digest_problem}")
    return packed


def _parse(tensors: dict[str, torch.Tensor], metadata: dict[str, str], path: object) -> PackedFile:
    tensors = dict(tensors)
    try:
        layers = {}
        for key, info in json.loads(metadata["layers"]).items():
            bits = check_bits(info["bits"])
            shape = tuple(info["shape"])
            if (
                info["width"] != code_width(bits)
                or not shape
                or not all(isinstance(n, int) and n >= 0 for n in shape)
                or math.prod(shape) > _MAX_WEIGHTS  # a sparse layer's data does not bound it
            ):
                raise ValueError(f"{key!r}: bad width {info['width']} or shape {list(shape)}")
            if key in tensors:
                raise ValueError(f"{key!r} is stored both packed and as a tensor")
            storage = info.get("storage", "dense")  # inq-packed/1 and /2 are dense
            sparse = None
            if storage == "dense":
                packed = tensors.pop(key + CODES_SUFFIX)
            elif storage in LAYOUTS:
                sparse = SparseCodes(
                    layout=storage,
                    values=tensors.pop(key + VALUES_SUFFIX),
                    index=tensors.pop(key + INDEX_SUFFIX),
                    nonzero=info["nonzero"],
                    gap_bits=info["gap_bits"],
                    symbols=info["symbols"],
                )
                try:
                    codes = decode_sparse(sparse, bits, math.prod(shape))
                except ValueError as err:
                    raise ValueError(f"{key!r}: sparse codes: {err}") from None
                packed = pack_codes(codes.reshape(shape), bits)
            else:
                raise ValueError(f"{key!r}: unknown storage {storage!r}")
            layers[key] = PackedLayer(
                module=str(info["module"]),
                packed=packed,
                bits=bits,
                n1=metadata_n1(info["n1"]),
                shape=shape,
                dtype=_DTYPES[info["dtype"]],
                sparse=sparse,
            )
        suffixes = (CODES_SUFFIX, VALUES_SUFFIX, INDEX_SUFFIX)
        stray = [k for k in tensors if k.endswith(suffixes)]
        if stray:
            raise ValueError(f"packed codes {stray} have no layer metadata")
        model = json.loads(metadata["model"])
        data = json.loads(metadata.get("data", "{}"))
        for name, value in (("model", model), ("data", data)):
            if not isinstance(value, dict):
                raise TypeError(f"{name!r} must be a JSON object, got {value!r}")
        return PackedFile(layers, tensors, model, dict(metadata))
    except (KeyError, ValueError, TypeError, AttributeError) as err:
        raise ValueError(f"{path}: corrupt INQ packed file metadata ({err!r})") from err


def _exponent_range(dtype: torch.dtype) -> tuple[int, int]:
    """Exponents ``e`` for which ``2**e`` is a non-zero finite value of ``dtype``."""
    info = torch.finfo(dtype)
    return int(math.log2(info.smallest_normal * info.eps)), int(math.log2(info.max))
