"""An export's project directory (an hls4ml project, an RTL design): every file it wrote is
listed with its sha256 in :data:`MANIFEST`, beside the export's format, so that ``--force``
replaces only a project inq wrote, unchanged, and ``inq verify DIR`` can check one.

Example:
    >>> import tempfile
    >>> folder = Path(tempfile.mkdtemp())
    >>> _ = (folder / "a.v").write_text("module a; endmodule")
    >>> project_problem(folder, "inq-rtl/1", "an RTL project")
    'holds no inq_project.json: it is not an RTL project inq wrote'
    >>> write_manifest(folder, "inq-rtl/1")
    >>> project_problem(folder, "inq-rtl/1", "an RTL project") is None
    True
    >>> project_format(folder)
    'inq-rtl/1'
    >>> _ = (folder / "notes.txt").write_text("mine")
    >>> project_problem(folder, "inq-rtl/1", "an RTL project")
    'holds a file the export did not write: notes.txt'
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tqdm import tqdm

from inq.fileio import abandoned, atomic_path, stops_held

__all__ = [
    "HLS4ML_FORMAT",
    "MANIFEST",
    "RTL_FORMAT",
    "may_write",
    "project_format",
    "project_problem",
    "run_build",
    "stop_abandoned_builds",
    "write_manifest",
]

MANIFEST = "inq_project.json"  # in a project: its format and every file's sha256
HLS4ML_FORMAT = "inq-hls4ml/1"  # inq export --hls4ml (inq.deploy.hls4ml)
RTL_FORMAT = "inq-rtl/1"  # inq export --rtl (inq.rtl)


def write_manifest(folder: Path, fmt: str) -> None:
    """Record every file under ``folder`` with its sha256 in ``folder/MANIFEST``, as ``fmt``."""
    files = {path: _sha256(folder / path) for path in _files(folder)}
    text = json.dumps({"format": fmt, "files": files}, indent=1, sort_keys=True)
    with atomic_path(folder / MANIFEST) as tmp:
        tmp.write_text(text + "\n")


def _manifest(folder: Path) -> dict[str, object] | None:
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    return manifest if isinstance(manifest, dict) else None


def project_format(folder: Path) -> str | None:
    """The format its manifest records, or None where ``folder`` holds no readable one."""
    manifest = _manifest(folder)
    fmt = None if manifest is None else manifest.get("format")
    return fmt if isinstance(fmt, str) else None


def project_problem(folder: Path, fmt: str, what: str) -> str | None:
    """Why the directory ``folder`` is not ``what`` (a project of format ``fmt``) exactly as
    inq wrote it (a file it did not write, or one changed since), or None if it is."""
    manifest = _manifest(folder)
    listed = manifest.get("files") if manifest and manifest.get("format") == fmt else None
    if not isinstance(listed, dict):
        return f"holds no {MANIFEST}: it is not {what} inq wrote"
    found = [path for path in _files(folder) if path != MANIFEST]
    others = [path for path in found if path not in listed]
    if others:
        more = f" (and {len(others) - 1} more)" if len(others) > 1 else ""
        return f"holds a file the export did not write: {others[0]}{more}"
    changed = next((path for path in found if _sha256(folder / path) != listed[path]), None)
    return None if changed is None else f"{changed} was changed since the export wrote it"


def may_write(out: Path, force: bool, fmt: str, what: str) -> None:
    """Refuse ``out`` unless it is absent, empty, or (``force``) ``what`` inq wrote, as it
    wrote it (:func:`project_problem`).

    Raises:
        ValueError: ``out`` is a file, the current directory or one holding it, a directory
            that is not empty and no ``force``, or with ``force`` not an unchanged project.
    """
    if out.is_symlink():
        raise ValueError(f"-o {out}: a symbolic link; name the directory itself")
    if out.exists() and not out.is_dir():
        raise ValueError(f"-o {out}: a file; {what} is a directory")
    here = Path.cwd()
    if out.exists() and (here == out.resolve() or out.resolve() in here.parents):
        raise ValueError(f"-o {out}: the current directory (or one holding it); name another")
    if not out.is_dir() or not any(out.iterdir()):
        return
    if not force:
        raise ValueError(f"{out} is not empty; choose another -o, or --force to replace it")
    problem = project_problem(out, fmt, what)
    if problem is not None:
        raise ValueError(
            f"{out} {problem}; --force replaces only {what} inq wrote, as it wrote it: "
            "choose another -o"
        )


def run_build(command: list[str], cwd: Path, what: str) -> tuple[int, str]:
    """Run ``command`` in ``cwd`` in a process group of its own, killed whole if the caller
    stops (a build tool's children would run on otherwise), with the elapsed time on a
    terminal; returns its exit status and output (stdout and stderr, kept in memory: a full
    disk would swallow a log file)."""
    build = None
    # a stop while the progress line was being set up (tqdm's first lock takes milliseconds), or
    # while Popen returned after the fork, left the build running: Popen held, the try around it
    try:
        with stops_held():
            build = subprocess.Popen(
                command, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                errors="replace", start_new_session=True,
            )  # fmt: skip
        with tqdm(desc=what, bar_format="{desc}: {elapsed}", disable=None, file=sys.stderr,
                  leave=False) as shown:  # fmt: skip
            while True:
                try:
                    output, _ = build.communicate(timeout=1)
                    break
                except subprocess.TimeoutExpired:
                    shown.refresh()
    except BaseException:
        if build is not None:
            os.killpg(build.pid, signal.SIGKILL)
            build.wait()
            if build.stdout is not None:
                build.stdout.close()
        raise
    return build.returncode, output


def stop_abandoned_builds(out: Path) -> None:
    """Kill what still works in the temporary project of an export to ``out`` that was killed
    (SIGKILL gives it no chance to stop its g++): every process whose working directory is in
    one, found through ``/proc``. :func:`inq.fileio.atomic_dir` then deletes the directory."""
    killed = []
    for folder in (f.resolve() for f in abandoned(out) if f.is_dir() and not f.is_symlink()):
        for proc in Path("/proc").glob("[0-9]*"):
            with contextlib.suppress(OSError):  # gone, or not ours to look at
                cwd = Path(os.readlink(proc / "cwd").removesuffix(" (deleted)"))
                if cwd == folder or folder in cwd.parents:
                    os.kill(int(proc.name), signal.SIGKILL)
                    killed.append(proc)
    deadline = time.monotonic() + 5
    while any(map(_running, killed)) and time.monotonic() < deadline:
        time.sleep(0.01)  # SIGKILL is delivered, not yet acted on: wait until they are gone


def _running(proc: Path) -> bool:
    """Whether the process ``/proc/<pid>`` is there and not a zombie (dead, not yet reaped)."""
    try:
        return (proc / "stat").read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False


def _files(folder: Path) -> list[str]:
    """Every file (or link, not followed) under ``folder``, as sorted relative POSIX paths."""
    return sorted(
        path.relative_to(folder).as_posix()
        for path in folder.rglob("*")
        if path.is_symlink() or not path.is_dir()
    )


def _sha256(path: Path) -> str:
    if path.is_symlink():
        return "link:" + os.readlink(path)
    return hashlib.sha256(path.read_bytes()).hexdigest()
