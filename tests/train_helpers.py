"""Shared helpers of the inq-train tests: run the console script on tiny settings, load the
study scripts of ``experiments/``."""

from __future__ import annotations

import importlib.util
import io
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from types import ModuleType
from typing import Any

INQ_TRAIN = Path(sys.executable).with_name("inq-train")
INQ_TORCHRUN = Path(sys.executable).with_name("inq-torchrun")
# float pretraining + 4 stages of one epoch each, 8 steps per epoch: seconds on one CPU thread
TINY = (
    "trainer.float_epochs=1",
    "inq.epochs=1",
    "data.train_size=256",
    "data.batch_size=32",
    "trainer.log_every=2",
)


def torchrun_logs(tmp_path: Path) -> list[str]:
    """torchrun's option that puts its log folder in the test's ``tmp_path``: by default each
    run makes a ``torchelastic_*`` folder in the system's temporary folder and leaves it."""
    return [f"--log-dir={tmp_path / 'torchrun'}"]


def inq_train(
    *overrides: str,
    env: dict[str, str] | None = None,
    check: bool = True,
    cwd: Path | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run ``inq-train`` with Hydra overrides; assert success unless ``check`` is False.

    Without ``cwd`` it runs in a fresh temporary directory, so that the timestamped default
    directory Hydra makes (and a resumed run discards) is its own, whatever runs beside it."""
    with tempfile.TemporaryDirectory() as scratch:
        proc = subprocess.run(
            [str(INQ_TRAIN), *overrides],
            capture_output=True,
            text=True,
            env={**os.environ, **(env or {})},
            timeout=600,
            cwd=cwd or scratch,
        )
    if check:
        assert proc.returncode == 0, (
            f"inq-train failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        )
    return proc


class _Terminal(io.StringIO):
    """A captured stderr that says it is a terminal, as a console's does."""

    def isatty(self) -> bool:
        return True


def inq_train_here(*args: str, cwd: Path, terminal: bool = False) -> tuple[int, str, str]:
    """Run ``inq-train``'s console entry point with ``args`` in this process, in ``cwd``:
    (exit status, stdout, stderr). For what does not depend on a process of its own (its
    refusals, a short run), without the ~2 s of a new interpreter importing torch; logging,
    the working directory and torch's thread count as they were before. ``terminal``: stderr
    says it is a terminal (``isatty``), as a console's does."""
    import contextlib
    import logging

    import torch

    from inq.train.app import main

    out, err = io.StringIO(), (_Terminal() if terminal else io.StringIO())
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    argv, here, threads = sys.argv, Path.cwd(), torch.get_num_threads()
    sys.argv = ["inq-train", *args]
    os.chdir(cwd)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            main()
        status = 0
    except SystemExit as stop:
        status = stop.code if isinstance(stop.code, int) else 1
    finally:
        sys.argv = argv
        os.chdir(here)
        root.handlers[:] = handlers
        root.setLevel(level)
        torch.set_num_threads(threads)
    return status, out.getvalue(), err.getvalue()


def killed_and_resumed(settings: tuple[str, ...], run_dir: Path, kills: tuple[str, ...]) -> None:
    """Run ``inq-train`` with ``settings`` into ``run_dir``, killed (SIGKILL) at each point of
    ``kills`` in turn (``inq.train.checkpoint``'s kill points) and resumed after each, then to
    the end."""
    from inq.train.checkpoint import KILL_ENV

    for kill_at in (*kills, None):
        resume = (f"trainer.resume={run_dir}",) if run_dir.exists() else ()
        proc = inq_train(*settings, f"hydra.run.dir={run_dir}", *resume,
                         env={KILL_ENV: kill_at or ""}, check=kill_at is None)  # fmt: skip
        assert proc.returncode == (-9 if kill_at else 0), proc.stderr[-2000:]


def load_experiment(name: str) -> ModuleType:
    """Import ``experiments/<name>.py`` (not a package) under ``name``."""
    path = Path(__file__).resolve().parents[1] / "experiments" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


def refused_run(cfg: Any, run_dir: Path) -> Any:
    """The ConfigError with which ``inq.train.app.run`` refuses ``cfg`` (it must), in this
    process; the torch thread count that ``run`` sets is restored."""
    import pytest
    import torch

    from inq.errors import ConfigError
    from inq.train.app import run

    threads = torch.get_num_threads()
    try:
        with pytest.raises(ConfigError) as refused:
            run(cfg, run_dir)
    finally:
        torch.set_num_threads(threads)
    return refused.value
