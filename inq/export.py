"""Masked checkpoint: the model's state with exact power-of-two weights, masks and metadata.

A ``.safetensors`` file anyone can read with the ``safetensors`` library:

- every tensor of ``model.state_dict()`` under its usual key (quantized weights exact);
- one bool mask per quantized weight under ``"<weight key>.inq_mask"`` (True = quantized);
- string metadata: ``format`` (``"inq-masked/3"``), ``bits`` (the default bit-width),
  ``portions``, ``stage``, ``strategy``, ``n1_rule``, ``granularity``, ``layers`` (JSON
  ``{weight key: {"module": name, "bits": bits, "n1": n1}}``: the layer's own bit-width, and n1
  an int, or a list with one int per output channel) and ``model`` (JSON the caller passes to
  name the model, e.g. its config, so it can be rebuilt) and ``data`` (JSON: the data config the
  model was trained on, ``{}`` if not given; ``inq eval`` starts from it).

Files of format ``"inq-masked/2"`` (no per-layer bits: every layer at ``bits``) and
``"inq-masked/1"`` (also one n1 per layer, no ``n1_rule``/``granularity``: the paper's "max"
rule per layer) still load.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from inq.fileio import digest_problem, metadata_n1, n1_json, read_safetensors, write_safetensors
from inq.pow2 import N1, check_bits
from inq.scheduler import INQScheduler

__all__ = [
    "MASKED_FORMAT",
    "MASKED_FORMATS",
    "MASK_SUFFIX",
    "MaskedCheckpoint",
    "load_masked",
    "save_masked",
]

MASKED_FORMAT = "inq-masked/3"
MASKED_FORMATS = ("inq-masked/1", "inq-masked/2", MASKED_FORMAT)  # what load_masked reads
MASK_SUFFIX = ".inq_mask"


@dataclass
class MaskedCheckpoint:
    """A loaded masked checkpoint.

    ``state`` is the model state dict; ``masks`` and ``n1`` are keyed by weight key (e.g.
    ``"features.0.weight"``), n1 an int or an int32 tensor ``[O]`` (one per output channel);
    ``bits`` is the default bit-width and ``layer_bits`` each layer's own (a key it lacks is at
    ``bits``: :meth:`bits_of`); ``model`` is the caller's model description; ``digest_problem``
    says why the file's contents do not match the digest written with them (None if they do).
    """

    state: dict[str, torch.Tensor]
    masks: dict[str, torch.Tensor]
    n1: dict[str, N1 | None]  # None for a layer not partitioned yet
    bits: int
    portions: tuple[float, ...]
    stage: int
    strategy: str
    model: dict[str, Any] = field(default_factory=dict)
    data: dict[str, Any] = field(default_factory=dict)
    digest_problem: str | None = None
    n1_rule: str = "max"
    granularity: str = "layer"
    layer_bits: dict[str, int] = field(default_factory=dict)

    def bits_of(self, key: str) -> int:
        """The bit-width of quantized weight ``key``: its own, else the checkpoint's ``bits``.

        Example:
            >>> ckpt = MaskedCheckpoint({}, {}, {}, 4, (1.0,), 1, "magnitude",
            ...                         layer_bits={"conv1.weight": 8})
            >>> ckpt.bits_of("conv1.weight"), ckpt.bits_of("fc.weight")
            (8, 4)
        """
        return self.layer_bits.get(key, self.bits)


def save_masked(
    path: str | os.PathLike[str],
    model: nn.Module,
    scheduler: INQScheduler,
    model_info: dict[str, Any] | None = None,
    data_info: dict[str, Any] | None = None,
) -> None:
    """Write ``model`` and ``scheduler``'s masks to ``path`` atomically.

    ``model_info`` describes the model (so it can be rebuilt), ``data_info`` the data it was
    trained on (so it is evaluated on the same): both are stored as JSON metadata.

    Example:
        >>> import tempfile, pathlib
        >>> net = nn.Sequential(nn.Linear(4, 3))
        >>> sched = INQScheduler(net, bits=4, portions=(1.0,))
        >>> _ = sched.step()
        >>> file = pathlib.Path(tempfile.mkdtemp()) / "net.safetensors"
        >>> save_masked(file, net, sched, {"name": "toy"})
        >>> ckpt = load_masked(file)
        >>> ckpt.bits, ckpt.model, bool(ckpt.masks["0.weight"].all())
        (4, {'name': 'toy'}, True)
        >>> ckpt.layer_bits
        {'0.weight': 4}
    """
    scheduler.enforce()
    keys: dict[int, str] = {}
    for k, p in model.named_parameters(remove_duplicate=False):
        keys.setdefault(id(p), k)  # a tied weight goes under its first name, like the scheduler
    tensors: dict[str, torch.Tensor] = {}
    storages: set[int] = set()
    for k, v in model.state_dict().items():
        t = v.detach().cpu().contiguous()
        if t.untyped_storage().data_ptr() in storages:  # safetensors refuses shared storage
            t = t.clone()
        storages.add(t.untyped_storage().data_ptr())
        tensors[k] = t
    layers = {}
    for layer in scheduler.layers:
        key = keys[id(layer.weight)]
        tensors[key + MASK_SUFFIX] = layer.mask.cpu().contiguous()
        n1 = None if layer.n1 is None else n1_json(layer.n1)
        layers[key] = {"module": layer.name, "bits": layer.bits, "n1": n1}
    metadata = {
        "format": MASKED_FORMAT,
        "bits": str(scheduler.bits),
        "portions": json.dumps(list(scheduler.portions)),
        "stage": str(scheduler.stage),
        "strategy": scheduler.strategy,
        "n1_rule": scheduler.n1_rule,
        "granularity": scheduler.granularity,
        "layers": json.dumps(layers),
        "model": json.dumps(model_info or {}),
        "data": json.dumps(data_info or {}),
    }
    write_safetensors(path, tensors, metadata)


def load_masked(path: str | os.PathLike[str]) -> MaskedCheckpoint:
    """Read a file written by :func:`save_masked` (safetensors only, nothing is unpickled).

    Raises:
        ValueError: if the file is missing, not a safetensors file, or not an INQ masked checkpoint.
    """
    tensors_read, metadata = read_safetensors(path)
    tensors = dict(tensors_read)
    if metadata.get("format") not in MASKED_FORMATS:
        found = metadata.get("format")
        raise ValueError(f"{path}: not an INQ masked checkpoint (format {found!r})")
    try:
        layers = json.loads(metadata["layers"])
        masks = {key: tensors.pop(key + MASK_SUFFIX) for key in layers}
        stray = [k for k in tensors if k.endswith(MASK_SUFFIX)]
        if stray:
            raise ValueError(f"masks {stray} have no layer metadata")
        bits = check_bits(int(metadata["bits"]))
        return MaskedCheckpoint(
            state=tensors,
            masks=masks,
            n1={key: _n1(info["n1"]) for key, info in layers.items()},
            bits=bits,
            portions=tuple(json.loads(metadata["portions"])),
            stage=int(metadata["stage"]),
            strategy=metadata["strategy"],
            model=json.loads(metadata["model"]),
            data=json.loads(metadata.get("data", "{}")),
            digest_problem=digest_problem(tensors_read, metadata),
            n1_rule=metadata.get("n1_rule", "max"),
            granularity=metadata.get("granularity", "layer"),
            # inq-masked/1 and /2: every layer at the file's bits
            layer_bits={key: check_bits(info.get("bits", bits)) for key, info in layers.items()},
        )
    except (KeyError, ValueError, TypeError) as err:
        raise ValueError(f"{path}: corrupt INQ masked checkpoint metadata ({err!r})") from err


def _n1(value: object) -> N1 | None:
    return None if value is None else metadata_n1(value)  # None: not partitioned yet
