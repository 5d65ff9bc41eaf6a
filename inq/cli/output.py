"""Where an ``inq`` command writes the file or project it makes: its default name
(:func:`default_output`), the ``--force`` argument, and the one rule every export keeps
(:func:`writing`): it writes, replaces or deletes nothing but its own output.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from inq import runfiles
from inq.fileio import LOCK_NAME, DirBusy, lock_dir, lock_holder

PACKED_SUFFIX = ".inq.safetensors"
INT_SUFFIX = ".int.safetensors"
SAFETENSORS, ONNX = ".safetensors", ".onnx"  # what an output's name ends in, by its format


def force_arg(p: argparse.ArgumentParser, project: bool = False) -> None:
    """The ``--force`` argument (:func:`writing` reads it); ``project``: the command also writes
    hls4ml or RTL projects."""
    hls4ml = ", or an hls4ml or RTL project inq wrote and nobody changed since" if project else ""
    p.add_argument(
        "--force",
        action="store_true",
        help=f"replace an existing output file{hls4ml} (never a file an inq-train run wrote for "
        "itself, nor other files)",
    )


def default_output(source: Path, suffix: str) -> Path:
    """Where a command writes the model it makes of ``source`` when no ``-o`` is given: beside
    the source, its name's stem plus ``suffix``; for a run directory, or a file in one, beside
    the run (``<run>`` + ``suffix``), so that the run's own files stay its own.

    Example:
        >>> default_output(Path("out/mixed4.safetensors"), ".inq.safetensors")
        PosixPath('out/mixed4.inq.safetensors')
        >>> default_output(Path("."), ".int.safetensors") == Path.cwd().with_suffix(
        ...     ".int.safetensors")
        True
    """
    home = source if source.is_dir() else source.parent
    if source.is_dir() or runfiles.is_run(home):
        home = home.resolve() if home.name in ("", "..") else home
        return home.parent / (home.name + suffix)
    stem = source.name.removesuffix(SAFETENSORS).removesuffix(".inq").removesuffix(".int")
    return home / (stem + suffix)


@contextmanager
def writing(output: Path, source: Path, force: bool = False, suffix: str = SAFETENSORS
            ) -> Iterator[None]:  # fmt: skip
    """Checks, before any work, that ``output`` may be written from ``source`` (in a format
    whose names end in ``suffix``; ``""`` for a directory, an hls4ml project), and holds an
    inq-train run directory's lock while the block writes into it: the one rule of every
    export, which writes, replaces or deletes nothing but its own output.

    Example:
        >>> with writing(Path("."), Path("model.inq.safetensors")):
        ...     pass
        Traceback (most recent call last):
        ...
        ValueError: -o .: a directory; name the file to write

    Raises:
        ValueError: ``output`` is a directory or ``source`` itself, is not named ``*suffix``,
            exists (without ``force``), is a file of an inq-train run (one its ``summary.json``
            lists, or one of the names the run writes), or its run directory is in use; for a
            directory, ``output`` is a run directory or holds ``source``.
    """
    if suffix:
        _file_output(output, source, force, suffix)
    else:
        _directory_output(output, source)
    folder = output.parent
    if output.resolve() in _run_files(folder) or (
        runfiles.is_run(folder) and output.name in runfiles.OWN_FILES
    ):
        raise ValueError(
            f"{output} belongs to the run in {folder} (inq-train writes it there); write "
            "elsewhere with -o"
        )
    if suffix and output.exists() and not force:
        raise ValueError(f"{output} exists; choose another -o, or --force to replace it")
    # an inq-train run's lock, taken only to write (a refusal leaves its pid as it was)
    lock = lock_dir(folder) if (folder / LOCK_NAME).exists() else None
    try:
        yield
    finally:
        if lock is not None:
            lock.close()


def _file_output(output: Path, source: Path, force: bool, suffix: str) -> None:
    if output.is_dir():
        raise ValueError(f"-o {output}: a directory; name the file to write")
    if not output.name.endswith(suffix):
        what = "an ONNX file's name" if suffix == ONNX else "the output is safetensors, whose name"
        hint = "; add --onnx to write ONNX" if output.suffix == ONNX else ""
        raise ValueError(f"-o {output}: {what} ends in {suffix}{hint}")
    if output.exists() and output.resolve() == source.resolve():
        raise ValueError(f"{output}: the output would replace the file it is made from; choose -o")


def _directory_output(output: Path, source: Path) -> None:
    if runfiles.is_run(output):
        if (pid := lock_holder(output)) is not None:  # looks without writing its pid there
            raise DirBusy(output, pid)
        raise ValueError(f"-o {output}: an inq-train run directory; write the project elsewhere")
    if output.is_dir() and output.resolve() in source.resolve().parents:
        raise ValueError(
            f"-o {output}: holds {source.resolve()}, the model the project is made from; choose "
            "another -o"
        )


def _run_files(folder: Path) -> set[Path]:
    """The files an inq-train run in ``folder`` recorded as its results (a relative path in its
    ``summary.json`` is relative to ``folder``, wherever the command runs)."""
    try:
        files = json.loads((folder / runfiles.SUMMARY).read_text()).get("files", {})
        return {(folder / path).resolve() for path in files.values()}
    except (OSError, ValueError, AttributeError, TypeError):  # no run, or no readable summary
        return set()
