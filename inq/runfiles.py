"""The files of an ``inq-train`` run directory, what kind of file a path is, and how a command
finds a model in a run.

``inq-train`` writes these names; ``inq export``, ``calibrate`` and ``eval`` read them. A command
given a directory takes the first of the run's own files that it can use, else the only such
file anywhere under the directory. :func:`file_kind` tells every command what it was given (by
content, not by name, :func:`inq.artefact.read_header`), so that each can say "X is a <kind>;
it takes <kinds>"; :func:`command_file` does that and finds the model in a run, and hands the
command the file's header, read once, for :func:`inq.artefact.open_artefact`.
"""

from __future__ import annotations

import os
from collections.abc import Collection, Sequence
from pathlib import Path

from inq.artefact import (
    CHECKPOINT,
    INTEGER_MODEL,
    MASKED_CHECKPOINT,
    ONNX_MODEL,
    PACKED_FILE,
    Header,
    open_artefact,
    read_header,
)
from inq.fileio import DirBusy, lock_holder
from inq.masked import MASKED_FORMATS, MaskedCheckpoint
from inq.packed import PACKED_FORMATS, PackedFile, packed_from_masked
from inq.project import MANIFEST as PROJECT_MANIFEST
from inq.project import RTL_FORMAT, project_format
from inq.quant.integer import INT_FORMAT

__all__ = [
    "CHECKPOINT",
    "DIRECTORY",
    "HLS_PROJECT",
    "INTEGER",
    "INTEGER_MODEL",
    "INT_FORMAT",
    "LATEST",
    "MASKED",
    "MASKED_CHECKPOINT",
    "MODEL_FORMATS",
    "ONNX_MODEL",
    "OWN_FILES",
    "PACKED",
    "PACKED_FILE",
    "PROJECT_MANIFEST",
    "RTL_PROJECT",
    "RUN",
    "SUMMARY",
    "command_file",
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

# What a directory can be (file_kind); a file's kinds are inq.artefact's
RUN = "run directory"
HLS_PROJECT = "hls4ml project (inq export --hls4ml)"
RTL_PROJECT = "RTL project (inq export --rtl)"
DIRECTORY = "directory"

MODEL_FORMATS = (*PACKED_FORMATS, *MASKED_FORMATS)  # what load_model reads (as packed)
_MODEL = "packed file or masked checkpoint"
_BY_PREFERENCE = (PACKED, MASKED)


def find_model(
    source: str | os.PathLike[str], formats: Collection[str], what: str = "masked checkpoint"
) -> Header:
    """The model file ``source`` names, of one of ``formats`` (``what`` in errors), as its
    header (:func:`inq.artefact.read_header`, read once): the file itself or, in a directory,
    the run's own file (:data:`PACKED`, then :data:`MASKED`) if it has one of them, else the
    only such file under it.

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
        own = [path / name for name in _BY_PREFERENCE]
        for header in map(_header_or_none, own):
            if header is not None and header.format in formats:
                return header
        others = (p for p in sorted(path.rglob("*.safetensors")) if p not in own)
        found = [h for h in map(_header_or_none, others) if h is not None and h.format in formats]
        if not found and (pid := lock_holder(path)) is not None:
            raise DirBusy(path, pid)  # a run that has written nothing yet
        if len(found) != 1:
            count = f"no {what}" if not found else f"{len(found)} {what}s"
            listing = "".join(f"\n  {h.path}" for h in found)
            raise ValueError(f"{path}: {count} (*.safetensors, {wanted}); pass one{listing}")
        return found[0]
    header = read_header(path)
    header.safetensors()  # refuses a file that is not safetensors
    if header.format not in formats:
        raise ValueError(f"{path}: not an INQ {what} (format {header.format!r})")
    return header


def load_model(source: str | os.PathLike[str] | Header) -> tuple[PackedFile, Path]:
    """The packed model ``source`` names (:func:`find_model`, or the header it gave; a masked
    checkpoint is packed in memory), and the file it was read from.

    Raises:
        ValueError: as :func:`find_model`, or if the file is invalid.
    """
    header = source if isinstance(source, Header) else find_model(source, MODEL_FORMATS, _MODEL)
    model = open_artefact(header)
    if isinstance(model, MaskedCheckpoint):
        model = packed_from_masked(model)
    if not isinstance(model, PackedFile):
        raise ValueError(f"{header.path}: {header.kind}, not a {_MODEL}")
    return model, header.path


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
    return _directory_kind(Path(path)) if Path(path).is_dir() else read_header(path).kind


def _directory_kind(path: Path) -> str:
    if (path / PROJECT_MANIFEST).is_file():
        return RTL_PROJECT if project_format(path) == RTL_FORMAT else HLS_PROJECT
    return RUN if is_run(path) or any((path / n).is_file() for n in OWN_FILES) else DIRECTORY


def command_file(
    source: str | os.PathLike[str],
    command: str,
    takes: Sequence[str],
    formats: Collection[str] = MODEL_FORMATS,
    what: str = _MODEL,
) -> Header:
    """The file ``inq command`` works on, as its header (read once, for
    :func:`inq.artefact.open_artefact`): ``source`` itself if it is of a kind in ``takes``,
    or, for a directory (:data:`RUN` in ``takes``), the model of one of ``formats`` in it
    (:func:`find_model`). Refused as :func:`refuse_kind` refuses.

    Example:
        >>> command_file("no/such/model.safetensors", "eval", (PACKED_FILE, RUN))
        Traceback (most recent call last):
        ...
        ValueError: no/such/model.safetensors: no such file or directory

    Raises:
        ValueError: as :func:`refuse_kind`, then as :func:`find_model`.
    """
    path = Path(source)
    header = None if path.is_dir() else read_header(source)
    _refuse(source, _directory_kind(path) if header is None else header.kind, command, takes)
    return find_model(source, formats, what) if header is None else header


def refuse_kind(path: str | os.PathLike[str], command: str, takes: Sequence[str]) -> str:
    """The kind of ``path`` (:func:`file_kind`) if ``command`` takes it, else one message: what
    the path is, what the command takes, and what to pass instead.

    Raises:
        ValueError: ``path`` is missing or of a kind not in ``takes``.
    """
    kind = file_kind(path)
    _refuse(path, kind, command, takes)
    return kind


def _refuse(path: str | os.PathLike[str], kind: str, command: str, takes: Sequence[str]) -> None:
    if kind in takes or (kind == DIRECTORY and RUN in takes):  # a directory: the one model in it
        return
    accepted = ", ".join(takes[:-1]) + (" or " if len(takes) > 1 else "") + takes[-1]
    raise ValueError(
        f"{path} is {_a(kind)}; inq {command} takes {_a(accepted)}{_instead(path, kind)}"
    )


def _a(noun: str) -> str:
    return ("an " if noun[0] in "aeiouAEIOU" or noun.startswith(("hls", "RTL")) else "a ") + noun


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
    if kind in (ONNX_MODEL, HLS_PROJECT, RTL_PROJECT):
        return "; pass the file it was exported from"
    return ""


def _header_or_none(path: Path) -> Header | None:
    """``path``'s header, or None where there is no readable file (a candidate, not a choice)."""
    try:
        return read_header(path) if path.is_file() else None
    except ValueError:
        return None
