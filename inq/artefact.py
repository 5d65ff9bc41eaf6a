"""One way in to every file inq writes: what a file is, from its header read once, and the
typed object it holds.

:func:`read_header` tells a file's kind by its contents (a name can lie): a safetensors file by
its ``format`` metadata (masked checkpoint, packed file, integer model), a training checkpoint
by its pickle's first bytes (never unpickled), an ONNX model by its ``.onnx`` name once it is
neither. :func:`open_artefact` then returns what the file holds, reading the tensors through
the file the header came from, so a command that checks what it was given and then loads it
reads each header one time:

=====================  ==========================================================
kind                   :func:`open_artefact` returns
=====================  ==========================================================
masked checkpoint      :class:`inq.masked.MaskedCheckpoint`
packed file            :class:`inq.packed.PackedFile`
integer model          :class:`inq.quant.integer.IntegerModel`
ONNX model             :class:`OnnxFile` (its path: classifying needs no ``onnx`` extra)
=====================  ==========================================================
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from inq.fileio import SafetensorsFile
from inq.masked import MASKED_FORMATS, MaskedCheckpoint, load_masked
from inq.packed import PACKED_FORMATS, PackedFile, load_packed
from inq.quant.integer import INT_FORMAT, IntegerModel, load_integer

__all__ = [
    "CHECKPOINT",
    "INTEGER_MODEL",
    "MASKED_CHECKPOINT",
    "NO_KIND",
    "ONNX_MODEL",
    "PACKED_FILE",
    "Artefact",
    "Header",
    "OnnxFile",
    "open_artefact",
    "read_header",
]

# What a file can be (Header.kind), as commands name it in their messages
CHECKPOINT = "training checkpoint (for trainer.resume)"
MASKED_CHECKPOINT = "masked checkpoint"
PACKED_FILE = "packed file"
INTEGER_MODEL = "integer model"
ONNX_MODEL = "ONNX model"
NO_KIND = "file of no kind inq reads"
_PICKLE_MAGIC = (b"PK\x03\x04", b"\x80")  # torch.save's zip, or a bare pickle (never loaded)
_KINDS = ((MASKED_FORMATS, MASKED_CHECKPOINT), (PACKED_FORMATS, PACKED_FILE),
          ((INT_FORMAT,), INTEGER_MODEL))  # fmt: skip


@dataclass(frozen=True)
class OnnxFile:
    """An ONNX model file, told by its name once its contents are no other kind: nothing of it
    is read, so classifying needs no ``onnx`` extra (:class:`inq.deploy.onnx.OnnxModel` loads
    and runs it)."""

    path: Path


Artefact = MaskedCheckpoint | PackedFile | IntegerModel | OnnxFile


@dataclass(frozen=True)
class Header:
    """What the file at ``path`` is, from its header: ``kind`` (one of the kinds above, or a
    description of another file), its ``format`` metadata (safetensors files), the ``file``
    opened once (safetensors files; :func:`open_artefact` loads the tensors through it), and
    ``problem``, why it cannot be read as safetensors (None if it can)."""

    path: Path
    kind: str
    format: str | None = None
    file: SafetensorsFile | None = None
    problem: str | None = None

    def safetensors(self) -> SafetensorsFile:
        """The open safetensors file.

        Raises:
            ValueError: the file is not safetensors (why, as the safetensors reader says it).
        """
        if self.file is None:
            raise ValueError(self.problem)
        return self.file


def read_header(path: str | os.PathLike[str]) -> Header:
    """What the file ``path`` is, by its contents (a name can lie); reads the safetensors header
    or the first bytes, nothing more, and keeps the file open for :func:`open_artefact`.

    Example:
        >>> read_header("no/such/file.onnx")
        Traceback (most recent call last):
        ...
        ValueError: no/such/file.onnx: no such file or directory

    Raises:
        ValueError: ``path`` does not exist, is a directory, or cannot be read.
    """
    if Path(path).is_dir():
        raise ValueError(f"{path}: a directory; name a file")
    if not Path(path).exists():
        raise ValueError(f"{path}: no such file or directory")
    try:
        file = SafetensorsFile(path)
    except ValueError as err:  # not a safetensors file, or one cut short
        damaged = _damaged(Path(path))
        if damaged is not None:
            raise ValueError(f"{path}: {damaged}") from None
        return Header(Path(path), _sniff(Path(path)), problem=str(err))
    fmt = file.metadata.get("format")
    kind = next((kind for formats, kind in _KINDS if fmt in formats), None)
    return Header(Path(path), kind or f"safetensors file of no INQ format (format {fmt!r})",
                  fmt, file)  # fmt: skip


def _damaged(path: Path) -> str | None:
    """What is wrong with a file that safetensors cannot read but that begins as one (a header
    length, then ``{"``), or is named as one and too short to tell: cut short (a full disk, an
    interrupted copy) or changed; None otherwise."""
    try:
        with open(path, "rb") as f:
            head = f.read(10)
            length = int.from_bytes(head[:8], "little")
            header = f.read(min(length, 100 << 20) - 2) if head[8:10] == b'{"' else b""
        size = path.stat().st_size
    except OSError:
        return None  # said by _sniff
    if size < 10 and path.suffix == ".safetensors":  # too short to tell, but named as one
        return f"cut short: {size} B, too short for a safetensors file"
    if not header:
        return None
    if size < 8 + length:
        return f"cut short: a safetensors file whose header alone is {8 + length} B, {size} B here"
    try:
        ends = [end for v in json.loads(head[8:] + header).values() if isinstance(v, dict)
                for end in v.get("data_offsets", [])[1:]]  # fmt: skip
        needs = 8 + length + max(ends, default=0)
    except (ValueError, TypeError, AttributeError):
        needs = 8 + length
    if size < needs:
        return f"cut short: a safetensors file of {needs} B by its header, {size} B here"
    return "a damaged safetensors file: its header does not describe its contents"


def _sniff(path: Path) -> str:
    """The kind of a file that is not safetensors, by its first bytes, then its name."""
    try:
        with open(path, "rb") as f:
            head = f.read(4)
    except OSError as err:
        raise ValueError(f"{path}: cannot read ({err.strerror})") from None
    if head.startswith(_PICKLE_MAGIC):
        return CHECKPOINT
    return ONNX_MODEL if path.suffix == ".onnx" else NO_KIND


def open_artefact(source: str | os.PathLike[str] | Header, validate: bool = True) -> Artefact:
    """The artefact the file ``source`` holds (a path, or its :func:`read_header` to reuse):
    a masked checkpoint, a packed file, an integer model or an ONNX file (table above). Each
    file's header is read once: given a :class:`Header`, not again.

    ``validate=False`` loads a packed file or an integer model without refusing invalid codes,
    an unsound program or a digest that does not match (for ``inq verify``, which reports
    every problem); a masked checkpoint is never refused for those (see :mod:`inq.deploy.verify`).

    Example:
        >>> import tempfile, pathlib
        >>> from torch import nn
        >>> from inq.masked import save_masked
        >>> from inq.scheduler import INQScheduler
        >>> net = nn.Linear(8, 2)
        >>> sched = INQScheduler(net, bits=4, portions=(1.0,))
        >>> _ = sched.step()
        >>> file = pathlib.Path(tempfile.mkdtemp()) / "net.safetensors"
        >>> save_masked(file, net, sched)
        >>> type(open_artefact(file)).__name__
        'MaskedCheckpoint'
        >>> header = read_header(file)
        >>> header.kind, header.format
        ('masked checkpoint', 'inq-masked/3')
        >>> open_artefact(header).bits
        4

    Raises:
        ValueError: the file is missing, cannot be read (a truncated header: "cannot read as
            safetensors"), is of no kind inq opens (a training checkpoint, a safetensors file
            of another format: the message says which), or is invalid (the loader's message).
    """
    header = source if isinstance(source, Header) else read_header(source)
    file = header.file
    if file is not None and header.kind == MASKED_CHECKPOINT:
        return load_masked(file)
    if file is not None and header.kind == PACKED_FILE:
        return load_packed(file, validate)
    if file is not None and header.kind == INTEGER_MODEL:
        return load_integer(file, validate)
    if header.kind == ONNX_MODEL:
        return OnnxFile(header.path)
    if header.kind == NO_KIND:
        raise ValueError(header.problem)  # why it is not safetensors: a truncated header, ...
    raise ValueError(
        f"{header.path}: {header.kind}, not a file inq opens (a masked checkpoint, a packed "
        "file, an integer model or an ONNX model)"
    )
