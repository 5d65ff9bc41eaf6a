"""The ``inq`` console script: :func:`inq.cli.main`, with ``inq --version`` answered before
importing it (it imports torch and every command: about 2 s, for one line)."""

from __future__ import annotations

import sys
from collections.abc import Sequence

import inq


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``inq`` with ``argv`` (default: the command line) as :func:`inq.cli.main` does;
    ``inq --version`` without importing it.

    Example:
        >>> main(["--version"])  # doctest: +ELLIPSIS
        inq ...
        0
    """
    args = sys.argv[1:] if argv is None else list(argv)
    if args == ["--version"]:
        print(f"inq {inq.__version__}")
        return 0
    from inq.cli import main as run

    return run(args)
