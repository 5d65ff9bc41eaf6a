"""The one interface every target of ``inq export`` implements (:class:`Target`: what it reads,
its options, what it writes, how its output is checked), and what a target is handed to write
(:class:`Job`). :data:`inq.deploy.TARGETS` lists them; the command builds its ``--NAME`` flags,
their options and their refusals from that list, so a new target is one module and one line.

Example::

    TARGET = Target(
        name="qonnx",                                   # inq export --qonnx
        help="write the integer model as QONNX ...",
        source=INTEGER_SOURCE,                           # a file, or a run's integer model
        output=f"FILE{ONNX}", suffix=ONNX,              # what -o names
        write=_write,                                   # Job -> the lines it prints after
        check=_check,                                   # a written file -> its problem, or None
    )
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from inq.artefact import Header, open_artefact
from inq.quant.integer import INT_FORMAT, IntegerModel
from inq.runfiles import INTEGER_MODEL, RUN

__all__ = ["INTEGER_SOURCE", "PROJECT_DIR", "Job", "Source", "Target"]


@dataclass(frozen=True)
class Job:
    """What ``inq export --NAME`` hands its target once the source is found and the output may
    be written: ``header`` the file to read (a run directory's model for a run), ``source`` the
    path as given, ``output`` the ``-o`` path, ``args`` the command's arguments (the target's own
    options among them, ``--force``), ``data`` the data config to export for (from the one the
    file records, ``--data`` on top)."""

    header: Header
    source: Path
    output: Path
    args: argparse.Namespace
    data: Callable[[dict[str, Any]], dict[str, Any]]

    def integer_model(self) -> IntegerModel:
        """The integer model ``header`` names (for a target that reads only those)."""
        model = open_artefact(self.header)
        assert isinstance(model, IntegerModel)  # the formats the target takes
        return model


@dataclass(frozen=True)
class Source:
    """What a target reads: files of ``kinds`` (:mod:`inq.runfiles`); for
    :data:`~inq.runfiles.RUN`, the run's model of ``formats``, called ``model`` in a refusal
    (``()``: any model :func:`inq.runfiles.load_model` reads)."""

    kinds: tuple[str, ...]
    formats: tuple[str, ...] = ()
    model: str = ""


INTEGER_SOURCE = Source((RUN, INTEGER_MODEL), (INT_FORMAT,), INTEGER_MODEL)  # a file, or a run's
PROJECT_DIR = "DIR (the project's directory)"  # what -o names for a target that writes a project


def _no_options(parser: argparse.ArgumentParser) -> None:
    pass


@dataclass(frozen=True)
class Target:
    """One thing ``inq export --NAME`` writes.

    ``source``: what it reads (:class:`Source`). ``output``: what ``-o`` must name,
    ``suffix``: how its name ends (``""``: a directory). ``write``: writes the output (each
    export checks what it wrote, bit for bit, before it keeps it) and returns the lines to
    print. ``check``: why a written output fails ``inq verify`` (None where it passes).
    ``add_options`` adds the target's own options, named in ``options`` (their ``dest``): each
    is refused without ``--NAME``.
    """

    name: str
    help: str
    source: Source
    output: str
    suffix: str
    write: Callable[[Job], list[str]]
    check: Callable[[Path], str | None]
    add_options: Callable[[argparse.ArgumentParser], None] = _no_options
    options: tuple[str, ...] = ()
