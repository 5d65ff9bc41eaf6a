"""File I/O: atomic writes (a reader sees the old file or the whole new one) and safe reads."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file

__all__ = ["atomic_path", "metadata_int", "read_safetensors", "read_safetensors_metadata"]


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; on success fsync it and rename it over ``path``.

    Example:
        >>> import tempfile, pathlib
        >>> target = pathlib.Path(tempfile.mkdtemp()) / "x.txt"
        >>> with atomic_path(target) as tmp:
        ...     _ = tmp.write_text("done")
        >>> target.read_text()
        'done'
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    os.close(fd)
    tmp = Path(name)
    tmp.chmod(0o666 & ~_umask())  # mkstemp makes it 0600; give it the mode open() would
    try:
        yield tmp
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)


def _umask() -> int:
    mask = os.umask(0)  # the only way to read it is to set it
    os.umask(mask)
    return mask


def metadata_int(value: object) -> int:
    """``value`` if it is an int (not a bool), for numbers read from a file's JSON metadata.

    Raises:
        TypeError: otherwise.
    """
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"expected an integer, got {value!r}")
    return value


def read_safetensors_metadata(path: str | os.PathLike[str]) -> dict[str, str]:
    """The string metadata of a safetensors file (reads the header only).

    Raises:
        ValueError: if the file is missing or not a safetensors file.
    """
    try:
        with safe_open(path, "pt") as f:
            return f.metadata() or {}
    except (OSError, SafetensorError) as err:
        raise ValueError(f"{path}: cannot read as safetensors ({err})") from err


def read_safetensors(
    path: str | os.PathLike[str],
) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """All tensors and the metadata of a safetensors file; nothing is unpickled.

    Raises:
        ValueError: if the file is missing, truncated or not a safetensors file.
    """
    metadata = read_safetensors_metadata(path)
    try:
        return load_file(path), metadata
    except (OSError, SafetensorError) as err:
        raise ValueError(f"{path}: cannot read as safetensors ({err})") from err
