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

What makes a checkpoint valid is defined here too: :func:`masked_layer_problem` (a quantized
weight in its level set, its mask full) and :func:`masked_problems` (everything else), with
:func:`state_problems`, the check of the tensors stored as they are, which the packed format
(:mod:`inq.packed`) stores alike and checks with the same function.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from inq.fileio import (
    SafetensorsFile,
    digest_problem,
    metadata_n1,
    n1_json,
    open_safetensors,
    write_safetensors,
)
from inq.pow2 import N1, check_bits, pow2_quantize
from inq.scheduler import INQScheduler

__all__ = [
    "MASKED_FORMAT",
    "MASKED_FORMATS",
    "MASK_SUFFIX",
    "MaskedCheckpoint",
    "load_masked",
    "masked_layer_problem",
    "masked_problems",
    "save_masked",
    "state_problems",
    "state_tensor_problem",
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


def load_masked(path: str | os.PathLike[str] | SafetensorsFile) -> MaskedCheckpoint:
    """Read a file written by :func:`save_masked` (safetensors only, nothing is unpickled), from
    its path or opened already (:func:`inq.artefact.open_artefact` opens any of inq's files).

    Raises:
        ValueError: if the file is missing, not a safetensors file, or not an INQ masked checkpoint.
    """
    file = open_safetensors(path)
    path, metadata = file.path, file.metadata
    if metadata.get("format") not in MASKED_FORMATS:
        found = metadata.get("format")
        raise ValueError(f"{path}: not an INQ masked checkpoint (format {found!r})")
    tensors_read = file.tensors()
    tensors = dict(tensors_read)
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


# ---------------------------------------------------------------------------------- checks


def state_tensor_problem(key: str, tensor: torch.Tensor) -> str | None:
    """Why ``tensor``, stored as it is under ``key`` in a masked or packed file (a bias, a norm
    layer's parameters or statistics, a buffer), cannot be a trained model's, or None.

    Every float tensor must be finite; a norm layer's ``running_var`` is a non-negative float
    tensor; ``num_batches_tracked`` is one non-negative integer.

    Example:
        >>> state_tensor_problem("bn.running_var", torch.tensor([1.0, 0.0])) is None
        True
        >>> state_tensor_problem("fc.bias", torch.tensor([0.5, float("nan")]))
        '1 non-finite value(s) (first: nan at flat index 1)'
        >>> state_tensor_problem("bn.running_var", torch.tensor([1.0, -0.5]))
        'a variance cannot be negative: 1 negative value(s) (first: -0.5 at flat index 1)'
        >>> state_tensor_problem("bn.num_batches_tracked", torch.tensor(-1))
        'a count of batches cannot be negative, got -1'
    """
    name = key.rpartition(".")[2]
    if tensor.is_floating_point():
        bad = _first(~torch.isfinite(tensor), tensor)
        if bad:
            return f"{bad[0]} non-finite value(s) (first: {bad[1]} at flat index {bad[2]})"
    if name == "running_var":
        if not tensor.is_floating_point():
            return f"a running variance must be a float tensor, got {tensor.dtype}"
        bad = _first(tensor < 0, tensor)
        if bad:
            return (
                f"a variance cannot be negative: {bad[0]} negative value(s) (first: {bad[1]} "
                f"at flat index {bad[2]})"
            )
    if name == "num_batches_tracked":
        if tensor.is_floating_point() or tensor.dtype == torch.bool:
            return f"a count of batches must be an integer tensor, got {tensor.dtype}"
        if tensor.numel() != 1:
            return f"a count of batches must be one number, got shape {list(tensor.shape)}"
        if int(tensor) < 0:
            return f"a count of batches cannot be negative, got {int(tensor)}"
    return None


def state_problems(tensors: dict[str, torch.Tensor]) -> list[tuple[str, str]]:
    """``(key, problem)`` for every tensor of ``tensors`` that :func:`state_tensor_problem`
    refuses, in key order; empty if all are sound.

    Example:
        >>> state_problems({"b": torch.zeros(2), "a.running_var": torch.tensor([-1.0])})
        [('a.running_var', 'a variance cannot be negative: 1 negative value(s) (first: -1.0 at flat index 0)')]
    """  # noqa: E501
    problems = ((key, state_tensor_problem(key, tensors[key])) for key in sorted(tensors))
    return [(key, problem) for key, problem in problems if problem]


def _first(bad: torch.Tensor, tensor: torch.Tensor) -> tuple[int, float, int] | None:
    """``(count, first value, its flat index)`` of the entries ``bad`` marks, or None."""
    if not bool(bad.any()):
        return None
    index = int(bad.flatten().nonzero()[0])
    return int(bad.sum()), tensor.flatten()[index].item(), index


def masked_layer_problem(ckpt: MaskedCheckpoint, key: str) -> str | None:
    """Why quantized weight ``key`` of a masked checkpoint is not exportable, or None.

    Checks that the weight and its mask exist with the same shape, that the mask is fully set,
    and that every value (bit pattern included: ``-0.0`` has no code) lies in the level set of
    the layer's ``n1`` (per row if it is a tensor) and bits (:meth:`MaskedCheckpoint.bits_of`).

    Example:
        >>> w = torch.tensor([[0.5, -0.25], [0.3, 0.0]])
        >>> full = torch.ones(2, 2, dtype=torch.bool)
        >>> ckpt = MaskedCheckpoint({"w": w}, {"w": full}, {"w": -1}, 3, (1.0,), 1, "magnitude")
        >>> masked_layer_problem(ckpt, "w")
        '1 weight(s) off the 3-bit level set of n1=-1 (first: 0.30000001192092896 at flat index 2)'
    """
    weight, mask = ckpt.state.get(key), ckpt.masks.get(key)
    if weight is None:
        return "listed as quantized but the checkpoint holds no such tensor"
    if mask is None or mask.dtype != torch.bool or mask.shape != weight.shape:
        return "its mask is missing or is not a bool tensor of the weight's shape"
    if not bool(mask.all()):
        index = int((~mask).flatten().nonzero()[0])
        return (
            f"mask not fully set: {int((~mask).sum())} of {mask.numel()} entries still float "
            f"(first at flat index {index})"
        )
    bits, n1 = ckpt.bits_of(key), ckpt.n1.get(key)
    if n1 is None:
        return "no n1 recorded: the layer was never partitioned"
    try:
        snapped = pow2_quantize(weight, n1, bits)
    except (ValueError, TypeError) as err:
        return str(err)
    off = _bits(snapped) != _bits(weight)
    if bool(off.any()):
        index = int(off.flatten().nonzero()[0])
        n1 = ckpt.n1[key]
        if isinstance(n1, torch.Tensor):
            row = index // max(1, math.prod(weight.shape[1:]))
            where = f"level sets of its channels (first: channel {row}, n1={int(n1[row])}, value"
        else:
            where = f"level set of n1={n1} (first:"
        return (
            f"{int(off.sum())} weight(s) off the {bits}-bit {where} "
            f"{weight.flatten()[index].item()!r} at flat index {index})"
        )
    return None


def masked_problems(ckpt: MaskedCheckpoint) -> list[tuple[str, str]]:
    """``(key, problem)`` for what makes a masked checkpoint invalid besides its quantized
    weights (those are :func:`masked_layer_problem`'s): each tensor stored as it is
    (:func:`state_problems`), then a ``model`` or ``data`` description that is not a JSON object.

    Example:
        >>> w = torch.tensor([[0.5]])
        >>> ckpt = MaskedCheckpoint({"w": w, "bn.running_var": torch.tensor([-1.0])},
        ...                         {"w": torch.ones(1, 1, dtype=torch.bool)}, {"w": -1}, 3,
        ...                         (1.0,), 1, "magnitude", model=[])
        >>> for key, problem in masked_problems(ckpt):
        ...     print(key, "-", problem)
        bn.running_var - a variance cannot be negative: 1 negative value(s) (first: -1.0 at flat index 0)
        model - must be a JSON object, got []
    """  # noqa: E501
    stored = {k: v for k, v in ckpt.state.items() if k not in ckpt.masks}
    problems = state_problems(stored)
    for name, value in (("model", ckpt.model), ("data", ckpt.data)):
        if not isinstance(value, dict):
            problems.append((name, f"must be a JSON object, got {value!r}"))
    return problems


def _bits(t: torch.Tensor) -> torch.Tensor:
    """The raw bit pattern of a float tensor, so ``-0.0`` and ``0.0`` differ."""
    return t.view({4: torch.int32, 2: torch.int16}[t.element_size()])
