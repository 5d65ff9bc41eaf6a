"""The files of an ``inq-train`` run directory, and how a command finds a model in one.

``inq-train`` writes these names; ``inq export``, ``calibrate`` and ``eval`` read them. A command
given a directory takes the first of the run's own files that it can use, else the only such
file anywhere under the directory.
"""

from __future__ import annotations

import os
from collections.abc import Collection
from pathlib import Path

from inq.export import MASKED_FORMATS, load_masked
from inq.packed import PACKED_FORMATS, PackedFile, load_packed, packed_from_masked, read_format

__all__ = [
    "INTEGER",
    "LATEST",
    "MASKED",
    "PACKED",
    "SUMMARY",
    "find_model",
    "load_model",
]

MASKED = "model_masked.safetensors"  # the masked checkpoint (inq.export)
PACKED = "model.inq.safetensors"  # its packed codes (inq.packed)
INTEGER = "model.int.safetensors"  # the integer model, with quant.act_bits (inq.quant)
SUMMARY = "summary.json"  # the results, and the files above it wrote ("files")
LATEST = "checkpoints/latest.pt"  # where trainer.resume continues from

_BY_PREFERENCE = (PACKED, MASKED)


def find_model(
    source: str | os.PathLike[str], formats: Collection[str], what: str = "masked checkpoint"
) -> Path:
    """The model file ``source`` names, of one of ``formats`` (``what`` in errors): the file
    itself or, in a directory, the run's own file (:data:`PACKED`, then :data:`MASKED`) if it
    has one of them, else the only such file under it.

    Example:
        >>> find_model("no/such/run", MASKED_FORMATS)
        Traceback (most recent call last):
        ...
        ValueError: no/such/run: no such file or directory

    Raises:
        ValueError: ``source`` does not exist, is a file of another format, or is a directory
            holding no such file, or several and none of the run's own.
    """
    path = Path(source)
    wanted = ", ".join(sorted(formats))
    if path.is_dir():
        for name in _BY_PREFERENCE:
            if (path / name).is_file() and _format_or_none(path / name) in formats:
                return path / name
        found = [p for p in sorted(path.rglob("*.safetensors")) if _format_or_none(p) in formats]
        if len(found) != 1:
            count = f"no {what}" if not found else f"{len(found)} {what}s"
            listing = "".join(f"\n  {p}" for p in found)
            raise ValueError(f"{path}: {count} (*.safetensors, {wanted}); pass one{listing}")
        return found[0]
    if not path.exists():
        raise ValueError(f"{path}: no such file or directory")
    fmt = read_format(path)
    if fmt not in formats:
        raise ValueError(f"{path}: not an INQ {what} (format {fmt!r})")
    return path


def load_model(source: str | os.PathLike[str]) -> tuple[PackedFile, Path]:
    """The packed model ``source`` names (:func:`find_model`; a masked checkpoint is packed in
    memory), and the file it was read from.

    Raises:
        ValueError: as :func:`find_model`, or if the file is invalid.
    """
    path = find_model(
        source, (*PACKED_FORMATS, *MASKED_FORMATS), "packed file or masked checkpoint"
    )
    if read_format(path) in PACKED_FORMATS:
        return load_packed(path), path
    return packed_from_masked(load_masked(path)), path


def _format_or_none(path: Path) -> str | None:
    try:
        return read_format(path)
    except ValueError:
        return None
