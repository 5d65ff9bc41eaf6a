"""The run directory: one process at a time, never a second run over a first one's files.

A directory holds a run once any file a run writes is in it (:data:`RUN_FILES`, the exported
models included); only ``trainer.resume`` continues such a run. A new run starts only in an empty
directory, or beside other files with ``trainer.allow_nonempty_dir=true``. A run killed before
its first checkpoint leaves only its start (:data:`START_FILES`): nothing worth keeping, so the
next process that owns the directory (a new run, or ``trainer.resume``, which starts it again
from its recorded config) clears it. A process owns its directory through an advisory lock
(``fcntl.flock`` on :data:`LOCK_NAME`), which the kernel drops when the process dies, however
it dies, so a killed run never leaves the directory locked. The owner also writes ``app.log`` (one
per run, appended to by every resumed process) and removes temporary files of saves that a kill
cut short. :func:`claimed` is all of this for one run, on every rank of a distributed one.
"""

from __future__ import annotations

import logging
import shutil
import signal
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

import yaml
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from inq.errors import ConfigError, raised_while_handling
from inq.fileio import (
    LOCK_NAME,
    WRITE_FAILURES,
    DirBusy,
    atomic_path,
    describe_os_error,
    lock_dir,
)
from inq.runfiles import INTEGER, LATEST, MASKED, PACKED, SUMMARY
from inq.train.checkpoint import CHECKPOINT_DIR, resolve_resume
from inq.train.config import TrainerConfig, to_dict
from inq.train.distributed import launch_command, share, teardown

__all__ = [
    "LOCK_NAME",
    "LOG_NAME",
    "RECORDED_CONFIG",
    "RESULT_FILES",
    "RUN_FILES",
    "START_FILES",
    "TB_DIR",
    "Claim",
    "RunDir",
    "RunStopped",
    "claimed",
    "describe_os_error",
    "diverged_hint",
    "holds_run",
    "remove_if_empty",
    "remove_unused",
    "saved_nothing",
    "stop_signals",
]

log = logging.getLogger("inq.train")

LOG_NAME = "app.log"
TB_DIR = "tb"  # the TensorBoard event files (inq.train.monitor)
RECORDED_CONFIG = ".hydra/config.yaml"  # the config a run started with
START_FILES = (".hydra", LOG_NAME, TB_DIR, CHECKPOINT_DIR)  # a run's start, before it saves
RESULT_FILES = (LATEST, SUMMARY, MASKED, PACKED, INTEGER)
RUN_FILES = START_FILES + RESULT_FILES
LOG_FORMAT = "[%(asctime)s][%(name)s][%(levelname)s] - %(message)s"


@dataclass(frozen=True)
class Claim:
    """The directory a run owns and how it goes on there; the same on every rank."""

    home: Path
    resume_path: Path | None = None  # the checkpoint it resumes from
    continues: bool = False  # in its own directory, which a failed start must not delete
    recorded: dict[str, Any] | None = None  # the config of a run started again from nothing


@contextmanager
def claimed(
    trainer: TrainerConfig,
    hydra_dir: Path,
    dir_chosen: bool,
    main: bool,
    hydra_files: Mapping[str, str] | None = None,
) -> Iterator[Claim]:
    """Own the run's directory for the block: a resumed run's own, else ``hydra_dir``, which
    must hold no run (rank 0 decides; ``main`` says this is rank 0, which owns and logs).

    ``dir_chosen`` says the user picked ``hydra_dir`` (False for Hydra's timestamped default,
    which is removed again if left unused). A new run's directory gets ``hydra_files``
    (``{relative path: text}``) once it is known to hold no other run; a continued one loses
    the temporaries of saves a kill cut short. Ctrl-C, SIGTERM and failed writes in the block
    end as :class:`RunStopped`; a new run that stops before its first checkpoint leaves nothing.

    Example:
        >>> import tempfile
        >>> folder = Path(tempfile.mkdtemp()) / "run"
        >>> with claimed(TrainerConfig(), folder, dir_chosen=True, main=True) as claim:
        ...     claim.home == folder, claim.resume_path
        (True, None)

    Raises:
        ConfigError: the directory holds another run or is busy, or ``trainer.resume`` names
            nothing to resume.
        RunStopped: on Ctrl-C, SIGTERM or a failed write (disk full, read-only) in the block.
    """
    hydra_dir = hydra_dir.absolute()  # summary.json names the run's files by absolute paths
    owner, claim, note = _claim_on_rank0(trainer, hydra_dir, dir_chosen, main)
    try:
        with stop_signals():
            if owner is not None:
                owner.start(claim.continues, hydra_files or {}, note)
            yield claim
    except BaseException as err:
        cause = raised_while_handling(err, KeyboardInterrupt) or err
        stop = (
            RunStopped.after(cause, claim.home)
            if isinstance(cause, (KeyboardInterrupt, OSError))
            else err
        )
        if owner is not None:  # a new run that stopped before its first checkpoint leaves nothing
            owner.log_stop(stop)
            owner.release(discard=not claim.continues)
            remove_unused(claim.home, dir_chosen)
        if stop is not err:
            raise stop from None
        raise
    finally:
        if owner is not None:
            owner.release()


def _claim_on_rank0(
    trainer: TrainerConfig, hydra_dir: Path, dir_chosen: bool, main: bool
) -> tuple[RunDir | None, Claim, str | None]:
    """Rank 0 claims the directory (:func:`_claim`); every rank gets the claim, or leaves
    together on rank 0's error, an unused ``hydra_dir`` removed."""
    owner, claim, note, problem = None, None, None, None
    if main:
        try:
            owner, claim, note = _claim(trainer, hydra_dir, dir_chosen)
        except ConfigError as err:
            problem = err
    problem, claim = share((problem, claim))
    if problem is not None or claim.home != hydra_dir:
        remove_unused(hydra_dir, dir_chosen)
    if problem is not None:
        teardown()  # before raising: every rank knows the problem, so all leave together
        raise problem
    return owner, claim, note


def remove_unused(out_dir: Path, dir_chosen: bool) -> None:
    """Delete ``out_dir`` if empty and, if Hydra chose it (``outputs/<date>/<time>``), its
    ``<date>`` and ``outputs`` parents if that leaves them empty."""
    remove_if_empty(out_dir)
    if not dir_chosen:
        remove_if_empty(out_dir.parent)
        remove_if_empty(out_dir.parent.parent)


def _claim(
    trainer: TrainerConfig, hydra_dir: Path, dir_chosen: bool
) -> tuple[RunDir, Claim, str | None]:
    """The owned directory, the claim on it and what was done to it (for the run's log); the
    start of a run that saved nothing (:func:`saved_nothing`) is cleared, and ``trainer.resume``
    of one starts it again from its recorded config."""
    resume = Path(trainer.resume).expanduser().absolute() if trainer.resume else None
    if resume is not None and resume.is_dir() and saved_nothing(resume):
        _check_same_dir(resume, hydra_dir, dir_chosen)
        return _restart(RunDir(resume, "trainer.resume"))
    resume_path = resolve_resume(str(resume)) if resume is not None else None
    home = resume_path.parent.parent if resume_path is not None else hydra_dir
    if resume_path is not None and resume_path.parent.name == CHECKPOINT_DIR and holds_run(home):
        _check_same_dir(home, hydra_dir, dir_chosen)
        return RunDir(home, "trainer.resume"), Claim(home, resume_path, continues=True), None
    lock_was_there = (hydra_dir / LOCK_NAME).exists()
    owner = RunDir(hydra_dir, "hydra.run.dir")  # a new run (perhaps from a loose checkpoint)
    problem = _taken(hydra_dir, trainer.allow_nonempty_dir)
    if problem is not None:
        owner.release()
        if not lock_was_there:  # a refused run leaves nothing in a folder it does not own
            (hydra_dir / LOCK_NAME).unlink(missing_ok=True)
        raise ConfigError("hydra.run.dir", problem)
    note = None
    if saved_nothing(hydra_dir):
        owner.clear_start()
        note = "cleared the start of a run that stopped before its first checkpoint"
    return owner, Claim(hydra_dir, resume_path), note


def _taken(folder: Path, allow_nonempty: bool) -> str | None:
    """Why a new run cannot start in ``folder`` (None: it can): the results of a run are in it,
    or (unless ``allow_nonempty``) other files; the start of a run that saved nothing is no
    obstacle (it is cleared)."""
    results = _results(folder)
    if (folder / LATEST).exists():
        return (
            f"{folder} already holds a run: continue it with trainer.resume={folder}, or choose "
            "another directory"
        )
    if results:
        return f"{folder} holds files a run writes ({', '.join(results)}); choose another directory"
    others = sorted(
        p.name for p in _entries(folder) if p.name not in START_FILES and p.name != LOCK_NAME
    )
    if others and not allow_nonempty:
        shown = ", ".join(others[:5]) + (", ..." if len(others) > 5 else "")
        return (
            f"{folder} is not empty ({shown}); choose an empty or new directory, or set "
            "trainer.allow_nonempty_dir=true to write the run's files beside these"
        )
    return None


def _entries(folder: Path) -> list[Path]:
    try:
        return list(folder.iterdir())
    except FileNotFoundError:
        return []


def _check_same_dir(home: Path, hydra_dir: Path, dir_chosen: bool) -> None:
    if home.resolve() != hydra_dir.resolve() and dir_chosen:
        raise ConfigError(
            "hydra.run.dir",
            f"trainer.resume continues the run in {home}, not in {hydra_dir}: leave "
            f"hydra.run.dir out or set it to {home}",
        )


def _restart(owner: RunDir) -> tuple[RunDir, Claim, str]:
    """Start a run that stopped before its first checkpoint again, from the config it recorded."""
    try:
        recorded = to_dict(OmegaConf.load(owner.path / RECORDED_CONFIG))
        if not isinstance(recorded, dict):
            raise ValueError("not a mapping of settings")
    except (OSError, ValueError, yaml.YAMLError, OmegaConfBaseException) as err:
        owner.release()
        raise ConfigError(
            "trainer.resume",
            f"{owner.path} holds no checkpoint (its run stopped before saving one) and its "
            f"{RECORDED_CONFIG} cannot be read ({str(err).splitlines()[0]}); start a new run there",
        ) from None
    owner.clear_start(keep_config=True)
    note = "no checkpoint was saved; starting the run again from its recorded config"
    return owner, Claim(owner.path, continues=True, recorded=recorded), note


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
    return holds_run(path) and not _results(path)


def _results(path: Path) -> list[str]:
    """The :data:`RESULT_FILES` that ``path`` holds."""
    return [name for name in RESULT_FILES if (path / name).exists()]


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

    def start(self, continues: bool, hydra_files: Mapping[str, str], note: str | None) -> None:
        """Prepare the directory for this process's part of the run and start its log: a run
        that ``continues`` loses its temporaries (:meth:`remove_temporaries`), a new one gets
        ``hydra_files``; ``note`` (what was done to the directory) opens the log."""
        if continues:
            self.remove_temporaries()
        else:
            for name, text in hydra_files.items():
                with atomic_path(self.path / name) as tmp:
                    tmp.write_text(text)
        self.start_log()
        if note:
            log.info("%s: %s", self.path, note)

    def remove_temporaries(self) -> list[Path]:
        """Delete the ``.<name>.*.tmp`` files of saves a kill cut short, in the run directory
        and its ``checkpoints/`` (safe: this process owns them, so no save is in flight)."""
        folders = (self.path, self.path / CHECKPOINT_DIR)
        found = [p for folder in folders for p in folder.glob(".*.*.tmp") if p.is_file()]
        for p in found:
            p.unlink()
        return found

    def clear_start(self, keep_config: bool = False) -> None:
        """Delete the start of a run that saved nothing (:func:`saved_nothing`); with
        ``keep_config``, its ``.hydra/`` (the config a restart takes) and ``app.log`` stay."""
        for name in (TB_DIR, CHECKPOINT_DIR):  # checkpoints/: temporaries of a first save cut short
            shutil.rmtree(self.path / name, ignore_errors=True)
        if not keep_config:
            shutil.rmtree(self.path / ".hydra", ignore_errors=True)
            (self.path / LOG_NAME).unlink(missing_ok=True)

    def start_log(self) -> None:
        """Append this process's log records to the run's ``app.log``."""
        self.log_handler = logging.FileHandler(self.path / LOG_NAME, mode="a")
        self.log_handler.setFormatter(logging.Formatter(LOG_FORMAT))
        logging.getLogger().addHandler(self.log_handler)

    def log_stop(self, cause: BaseException) -> None:
        """Record in ``app.log`` only (the console gets it once, from the app) why the run
        stopped: its message, or the error's type for a bug."""
        if self.log_handler is not None:
            what = str(cause) if isinstance(cause, (RunStopped, ConfigError)) else repr(cause)
            record = log.makeRecord(
                log.name, logging.ERROR, __file__, 0, "stopped: %s", (what,), None
            )
            self.log_handler.handle(record)

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
        if discard and not _results(self.path):
            self.clear_start()
            (self.path / LOCK_NAME).unlink(missing_ok=True)
            remove_if_empty(self.path)
        self.lock.close()  # closing the file drops the lock


def remove_if_empty(path: Path) -> None:
    """Delete the directory ``path`` if it exists and is empty."""
    with suppress(OSError):  # not empty, or already gone
        path.rmdir()


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
            if cause.errno in WRITE_FAILURES:
                what = f"cannot write {cause.filename or 'to the run directory'}: {detail}"
            else:
                what = f"I/O error{f' in {cause.filename}' if cause.filename else ''}: {detail}"
            code = 1
        else:
            what, code = str(cause), 1
        return cls(f"{what}; {resume_hint(run_dir)}", code)


def diverged_hint(run_dir: Path) -> str:
    """What to do after training diverged in ``run_dir``: resuming would diverge again the same
    way, so start a new run with a smaller step, in another directory if this one saved a
    checkpoint (it keeps that run's files and log for comparison).

    Example:
        >>> diverged_hint(Path("/no/run"))
        'lower optim.lr (or inq.lr), or set trainer.grad_clip, and start the run again'
    """
    advice = "lower optim.lr (or inq.lr), or set trainer.grad_clip, and start the run again"
    if (run_dir / LATEST).is_file():
        return f"{advice} in a new directory ({run_dir} keeps this run's checkpoints and log)"
    return advice


def resume_hint(run_dir: Path) -> str:
    """How to go on with the run in ``run_dir``: resume from its checkpoint, or start again."""
    if (run_dir / LATEST).is_file():
        return (
            f"continue from the last checkpoint with: {launch_command()} trainer.resume={run_dir}"
        )
    return "no checkpoint was saved yet: start the run again"
