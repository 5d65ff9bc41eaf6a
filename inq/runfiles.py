"""The files of an ``inq-train`` run directory, what kind of file a path is, and how a command
finds a model in a run.

``inq-train`` writes these names; ``inq export``, ``calibrate`` and ``eval`` read them. A command
given a directory takes the first of the run's own files that it can use, else the only such
file anywhere under the directory. :func:`file_kind` tells every command what it was given (by
content, not by name), so that each can say "X is a <kind>; it takes <kinds>".
"""

from __future__ import annotations

import os
from collections.abc import Collection, Sequence
from pathlib import Path

from inq.fileio import read_safetensors_metadata
from inq.masked import MASKED_FORMATS, load_masked
from inq.packed import PACKED_FORMATS, PackedFile, load_packed, packed_from_masked, read_format

__all__ = [
    "CHECKPOINT",
    "DIRECTORY",
    "INTEGER",
    "INTEGER_MODEL",
    "INT_FORMAT",
    "LATEST",
    "MASKED",
    "MASKED_CHECKPOINT",
    "ONNX_MODEL",
    "OWN_FILES",
    "PACKED",
    "PACKED_FILE",
    "RUN",
    "SUMMARY",
    "file_kind",
    "find_model",
    "is_run",
    "load_model",
    "refuse_kind",
]

MASKED = "model_masked.safetensors"  # the masked checkpoint (inq.masked)
PACKED = "model.inq.safetensors"  # its packed codes (inq.packed)
INTEGER = "model.int.safetensors"  # the integer model, with quant.act_bits (inq.quant)
SUMMARY = "summary.json"  # the results, and the files above it wrote ("files")
LATEST = "checkpoints/latest.pt"  # where trainer.resume continues from
OWN_FILES = (MASKED, PACKED, INTEGER)  # the model files a run writes for itself
INT_FORMAT = "inq-int/1"  # the integer model's format (inq.quant.integer reads and writes it)

# What a path can be (file_kind), as commands name it in their messages
RUN = "run directory"
DIRECTORY = "directory"
CHECKPOINT = "training checkpoint (for trainer.resume)"
MASKED_CHECKPOINT = "masked checkpoint"
PACKED_FILE = "packed file"
INTEGER_MODEL = "integer model"
ONNX_MODEL = "ONNX model"
_PICKLE_MAGIC = (b"PK\x03\x04", b"\x80")  # torch.save's zip, or a bare pickle (never loaded)

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


def is_run(folder: str | os.PathLike[str]) -> bool:
    """Whether ``folder`` is an ``inq-train`` run directory: it holds the run's lock file or
    its :data:`SUMMARY`."""
    folder = Path(folder)
    return folder.is_dir() and any((folder / name).exists() for name in (".lock", SUMMARY))


def file_kind(path: str | os.PathLike[str]) -> str:
    """What ``path`` is, by its contents (a name can lie): :data:`RUN`, :data:`DIRECTORY`,
    :data:`CHECKPOINT`, :data:`MASKED_CHECKPOINT`, :data:`PACKED_FILE`,
    :data:`INTEGER_MODEL`, :data:`ONNX_MODEL` (a ``.onnx`` file that is none of the others), or
    a description of another file. Reads a header at most; nothing is unpickled.

    Example:
        >>> file_kind("no/such/file.onnx")
        Traceback (most recent call last):
        ...
        ValueError: no/such/file.onnx: no such file or directory

    Raises:
        ValueError: ``path`` does not exist.
    """
    path = Path(path)
    if path.is_dir():
        return RUN if is_run(path) or any((path / n).is_file() for n in OWN_FILES) else DIRECTORY
    if not path.exists():
        raise ValueError(f"{path}: no such file or directory")
    try:
        fmt = read_safetensors_metadata(path).get("format")
    except ValueError:  # not a safetensors file
        pass
    else:
        kinds = ((MASKED_FORMATS, MASKED_CHECKPOINT), (PACKED_FORMATS, PACKED_FILE),
                 ((INT_FORMAT,), INTEGER_MODEL))  # fmt: skip
        named = next((kind for formats, kind in kinds if fmt in formats), None)
        return named or f"safetensors file of no INQ format (format {fmt!r})"
    try:
        with open(path, "rb") as f:
            head = f.read(4)
    except OSError as err:
        raise ValueError(f"{path}: cannot read ({err.strerror})") from None
    if head.startswith(_PICKLE_MAGIC):
        return CHECKPOINT
    if path.suffix == ".onnx":
        return ONNX_MODEL
    return "file of no kind inq reads"


def refuse_kind(path: str | os.PathLike[str], command: str, takes: Sequence[str]) -> str:
    """The kind of ``path`` (:func:`file_kind`) if ``command`` takes it, else one message: what
    the path is, what the command takes, and what to pass instead.

    Raises:
        ValueError: ``path`` is missing or of a kind not in ``takes``.
    """
    kind = file_kind(path)
    if kind in takes or (kind == DIRECTORY and RUN in takes):  # a directory: the one model in it
        return kind
    accepted = ", ".join(takes[:-1]) + (" or " if len(takes) > 1 else "") + takes[-1]
    raise ValueError(
        f"{path} is {_a(kind)}; inq {command} takes {_a(accepted)}{_instead(path, kind)}"
    )


def _a(noun: str) -> str:
    return ("an " if noun[0] in "aeiouAEIOU" else "a ") + noun


def _instead(path: str | os.PathLike[str], kind: str) -> str:
    """What to pass instead of ``path`` (of ``kind``), as the end of a sentence."""
    path = Path(path)
    if kind == CHECKPOINT:
        run = path.parent.parent if path.parent.name == "checkpoints" else None
        where = f" ({run})" if run is not None else ""
        return f"; pass its run directory{where} or one of the run's model files"
    if kind in (RUN, DIRECTORY):
        own = [str(path / n) for n in OWN_FILES if (path / n).is_file()]
        return f"; pass one of its files: {', '.join(own)}" if own else "; pass a model file"
    if kind == ONNX_MODEL:
        return "; pass the file it was exported from"
    return ""


def _format_or_none(path: Path) -> str | None:
    try:
        return read_format(path)
    except ValueError:
        return None
