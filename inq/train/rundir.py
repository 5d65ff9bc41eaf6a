"""The run directory: one process at a time, never a second run over a first one's files.

A directory holds a run once anything of one is in it (:data:`RUN_FILES`); only
``trainer.resume`` continues such a run. A run killed before its first checkpoint leaves only
its start (:data:`START_FILES`): nothing worth keeping, so the next process that owns the
directory (a new run, or ``trainer.resume``, which starts it again from its recorded config)
clears it. A process owns its directory through an advisory lock
(``fcntl.flock`` on :data:`LOCK_NAME`), which the kernel drops when the process dies, however it
dies, so a killed run never leaves the directory locked. The owner also writes ``app.log`` (one
per run, appended to by every resumed process) and removes temporary files of saves that a kill
cut short.
"""

from __future__ import annotations

import errno
import logging
import shutil
import signal
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from types import FrameType

from inq.errors import ConfigError
from inq.io import LOCK_NAME, DirBusy, lock_dir

__all__ = [
    "LOCK_NAME",
    "LOG_NAME",
    "RESULT_FILES",
    "RUN_FILES",
    "START_FILES",
    "RunDir",
    "RunStopped",
    "describe_os_error",
    "holds_run",
    "remove_if_empty",
    "saved_nothing",
    "stop_signals",
]

LOG_NAME = "app.log"
START_FILES = (".hydra", LOG_NAME, "tb", "checkpoints")  # a run's start, before it saves
RESULT_FILES = ("checkpoints/latest.pt", "summary.json", "model_masked.safetensors")
RUN_FILES = START_FILES + RESULT_FILES
LOG_FORMAT = "[%(asctime)s][%(name)s][%(levelname)s] - %(message)s"


def holds_run(path: Path) -> bool:
    """True if ``path`` holds any file of a run (:data:`RUN_FILES`).

    Example:
        >>> import tempfile
        >>> folder = Path(tempfile.mkdtemp())
        >>> holds_run(folder), (folder / "app.log").touch(), holds_run(folder)
        (False, None, True)
    """
    return any((path / name).exists() for name in RUN_FILES)


def saved_nothing(path: Path) -> bool:
    """True if ``path`` holds only the start of a run (:data:`START_FILES`): one that stopped
    before its first checkpoint.

    Example:
        >>> import tempfile
        >>> folder = Path(tempfile.mkdtemp())
        >>> (folder / "app.log").touch()
        >>> saved_nothing(folder), (folder / "summary.json").touch(), saved_nothing(folder)
        (True, None, False)
    """
    return holds_run(path) and not _holds_results(path)


def _holds_results(path: Path) -> bool:
    return any((path / name).exists() for name in RESULT_FILES)


class RunDir:
    """Exclusive ownership of a run directory by this process.

    Example:
        >>> import tempfile
        >>> folder = Path(tempfile.mkdtemp()) / "run"
        >>> owner = RunDir(folder, key="hydra.run.dir")
        >>> RunDir(folder, key="hydra.run.dir")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        inq.errors.ConfigError: hydra.run.dir: another inq-train process (pid ...) ...
        >>> owner.release()
    """

    def __init__(self, path: Path, key: str) -> None:
        self.path, self.key = path, key
        self.log_handler: logging.Handler | None = None
        try:
            self.lock = lock_dir(path)
        except DirBusy as busy:
            raise ConfigError(
                key, f"another inq-train process (pid {busy.pid}) is running in {path}; wait for it"
            ) from None
        except OSError as err:
            raise ConfigError(key, f"cannot write to {path}: {describe_os_error(err)}") from None

    def remove_temporaries(self) -> list[Path]:
        """Delete the ``.<name>.*.tmp`` files of saves a kill cut short, in the run directory
        and its ``checkpoints/`` (safe: this process owns them, so no save is in flight)."""
        folders = (self.path, self.path / "checkpoints")
        found = [p for folder in folders for p in folder.glob(".*.*.tmp") if p.is_file()]
        for p in found:
            p.unlink()
        return found

    def clear_start(self, keep_config: bool = False) -> None:
        """Delete the start of a run that saved nothing (:func:`saved_nothing`); with
        ``keep_config``, its ``.hydra/`` (the config a restart takes) and ``app.log`` stay."""
        for name in ("tb", "checkpoints"):  # checkpoints/: temporaries of a first save cut short
            shutil.rmtree(self.path / name, ignore_errors=True)
        if not keep_config:
            shutil.rmtree(self.path / ".hydra", ignore_errors=True)
            (self.path / LOG_NAME).unlink(missing_ok=True)

    def start_log(self) -> None:
        """Append this process's log records to the run's ``app.log``."""
        self.log_handler = logging.FileHandler(self.path / LOG_NAME, mode="a")
        self.log_handler.setFormatter(logging.Formatter(LOG_FORMAT))
        logging.getLogger().addHandler(self.log_handler)

    def release(self, discard: bool = False) -> None:
        """Stop logging and unlock (again: nothing). With ``discard`` (a new run that failed to
        start), delete what it wrote, and the directory if that leaves it empty; a run that
        saved a checkpoint is never discarded."""
        if self.lock.closed:
            return
        if self.log_handler is not None:
            logging.getLogger().removeHandler(self.log_handler)
            self.log_handler.close()
            self.log_handler = None
        if discard and not _holds_results(self.path):
            self.clear_start()
            (self.path / LOCK_NAME).unlink(missing_ok=True)
            remove_if_empty(self.path)
        self.lock.close()  # closing the file drops the lock


def remove_if_empty(path: Path) -> None:
    """Delete the directory ``path`` if it exists and is empty."""
    with suppress(OSError):  # not empty, or already gone
        path.rmdir()


_WRITE_FAILURES = {  # errno: what a user calls it
    errno.ENOSPC: "disk full",
    errno.EDQUOT: "disk quota exceeded",
    errno.EROFS: "read-only file system",
    errno.EACCES: "permission denied",
    errno.EPERM: "permission denied",
    errno.EFBIG: "file too large (a file size limit, ulimit -f)",
}


def describe_os_error(err: OSError) -> str:
    """One line for a failed write, saying "disk full" or "read-only" where that is the cause.

    Example:
        >>> describe_os_error(OSError(errno.ENOSPC, "No space left on device"))
        'disk full (No space left on device)'
    """
    cause = _WRITE_FAILURES.get(err.errno or 0)
    detail = err.strerror or str(err)
    return f"{cause} ({detail})" if cause else detail


class Terminated(KeyboardInterrupt):
    """SIGTERM, turned into an exception so the run stops the way Ctrl-C stops it."""


@contextmanager
def stop_signals() -> Iterator[None]:
    """Within the block, SIGTERM raises :class:`Terminated` (Ctrl-C raises KeyboardInterrupt)."""

    def terminate(signum: int, frame: FrameType | None) -> None:
        raise Terminated

    previous = signal.signal(signal.SIGTERM, terminate)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


class RunStopped(Exception):
    """A run that stopped before its end, with what to do next; ``exit_code`` for the shell.

    Example:
        >>> stop = RunStopped.after(KeyboardInterrupt(), Path("/no/run"))
        >>> stop.exit_code, str(stop)
        (130, 'interrupted (Ctrl-C); no checkpoint was saved yet: start the run again')
    """

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code

    @classmethod
    def after(cls, cause: BaseException, run_dir: Path) -> RunStopped:
        """The stop that ``cause`` (Ctrl-C, SIGTERM or a failed write) made of the run in
        ``run_dir``."""
        if isinstance(cause, Terminated):
            what, code = "stopped by SIGTERM", 143
        elif isinstance(cause, KeyboardInterrupt):
            what, code = "interrupted (Ctrl-C)", 130
        elif isinstance(cause, OSError):
            detail = describe_os_error(cause).splitlines()[0]
            if cause.errno in _WRITE_FAILURES:
                what = f"cannot write {cause.filename or 'to the run directory'}: {detail}"
            else:
                what = f"I/O error{f' in {cause.filename}' if cause.filename else ''}: {detail}"
            code = 1
        else:
            what, code = str(cause), 1
        return cls(f"{what}; {resume_hint(run_dir)}", code)


def resume_hint(run_dir: Path) -> str:
    """How to go on with the run in ``run_dir``: resume from its checkpoint, or start again."""
    if (run_dir / "checkpoints" / "latest.pt").is_file():
        return f"continue from the last checkpoint with: inq-train trainer.resume={run_dir}"
    return "no checkpoint was saved yet: start the run again"
