"""Keep a long study's finished runs in a tracked file, so that a new machine resumes it.

A study script writes each run into ``OUT/<job>/seed<k>/`` (checkpoints, logs, ``summary.json``),
and those folders are not tracked: a session that ends on one machine and resumes on a fresh one
would start the study over. This file keeps what the collectors read, each finished run's
``summary.json`` (without its local file paths), keyed by ``<job>/seed<k>``:

- ``save OUT RECORD`` adds the runs finished under ``OUT`` to ``RECORD`` (under a lock: seeds run
  in parallel), and refuses a run whose float model's accuracy differs from the one recorded for
  its seed: a float model made again on another machine must be the same model, or the study's
  paired differences would mix models;
- ``restore RECORD OUT`` writes each recorded run's ``summary.json`` back where it is missing,
  except the float runs': the jobs still to run need the float checkpoint, so the float model
  is trained again (and ``save`` checks that it came out the same).

Usage::

    python experiments/study_record.py save OUT experiments/mixed_resnet20_runs.json
    python experiments/study_record.py restore experiments/mixed_resnet20_runs.json OUT
"""

from __future__ import annotations

import argparse
import fcntl
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from inq.fileio import atomic_path

FLOAT_JOB = "float"
LOCAL = ("files",)  # summary keys that name files on the machine that ran it


def finished(out: Path) -> dict[str, dict[str, Any]]:
    """The runs finished under ``out``, keyed ``<job>/seed<k>``, without their local paths."""
    runs = {}
    for path in sorted(out.glob("*/seed*/summary.json")):
        summary = json.loads(path.read_text())
        key = f"{path.parent.parent.name}/{path.parent.name}"
        runs[key] = {k: v for k, v in summary.items() if k not in LOCAL}
    return runs


def check_float_models(runs: dict[str, dict[str, Any]]) -> None:
    """Raise ``ValueError`` if two runs of one seed started from float models of different
    accuracy (the float model was made again and came out different)."""
    seen: dict[int, tuple[str, float]] = {}
    for key, summary in runs.items():
        seed, acc = int(summary["seed"]), float(summary["float_acc"])
        first = seen.setdefault(seed, (key, acc))
        if first[1] != acc:
            raise ValueError(
                f"seed {seed}: {key} started from a float model of accuracy {acc!r}, "
                f"{first[0]} from one of {first[1]!r}: the float model was not reproduced"
            )


def save(out: Path, record: Path) -> int:
    """Merge the runs finished under ``out`` into ``record``; how many were new. The seeds that
    save at once take turns on a lock in ``out`` (not on ``record``, which each save replaces)."""
    with (out / ".record.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        runs = json.loads(record.read_text()) if record.exists() else {}
        new = {k: v for k, v in finished(out).items() if k not in runs}
        merged = dict(sorted({**runs, **new}.items()))
        check_float_models(merged)
        with atomic_path(record) as tmp:
            tmp.write_text(json.dumps(merged, indent=1, sort_keys=True) + "\n")
    return len(new)


def restore(record: Path, out: Path) -> int:
    """Write the recorded runs' ``summary.json`` under ``out`` where missing (float runs
    excepted); how many were written."""
    if not record.exists():
        return 0
    written = 0
    for key, summary in json.loads(record.read_text()).items():
        path = out / key / "summary.json"
        if key.split("/")[0] == FLOAT_JOB or path.exists():
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({**summary, "restored_from": str(record)}, indent=1) + "\n")
        written += 1
    return written


def main(argv: Sequence[str] | None = None) -> int:
    """Command line entry point; returns the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    for name, first, second in (("save", "out", "record"), ("restore", "record", "out")):
        command = commands.add_parser(name)
        command.add_argument(first, type=Path)
        command.add_argument(second, type=Path)
    args = parser.parse_args(argv)
    try:
        if args.command == "save":
            print(f"study_record: {save(args.out, args.record)} new run(s) in {args.record}")
        else:
            print(f"study_record: {restore(args.record, args.out)} run(s) restored to {args.out}")
    except (OSError, ValueError, KeyError) as err:
        print(f"study_record: error: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
