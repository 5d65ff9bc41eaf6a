"""What every ``inq`` subcommand shares: the :class:`Command` record, the data and device
arguments, and the one way a command ends (:func:`run`: an error a user can cause in one line on
stderr and exit status 1, an interrupt as 130 or 143). Where a command may write its output is
:mod:`inq.cli.output`.

A subcommand is a module of :mod:`inq.cli` with a ``COMMAND`` built from these, listed in
:data:`inq.cli.COMMANDS`.
"""

from __future__ import annotations

import argparse
import re
import signal
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import FrameType

import torch

from inq.data import changed_split, eval_data_config
from inq.fileio import WRITE_FAILURES, describe_os_error


@dataclass(frozen=True)
class Command:
    """One subcommand: its help line, how it adds its arguments, and what it runs (exit code)."""

    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]


def data_args(p: argparse.ArgumentParser, device_note: str = "") -> None:
    """The ``--data`` and ``--device`` arguments of a command that reads data (read them with
    :func:`command_data` and :func:`eval_device`); ``device_note`` ends the device's help."""
    p.add_argument(
        "--data",
        nargs="*",
        default=[],
        metavar="NAME|KEY=VALUE",
        help="settings on top of the data config the file records (inq-train records it), "
        "e.g. --data root=/data/cifar10 eval_batch_size=512; a file that records none needs "
        "the dataset name: --data digits",
    )
    default = "cuda" if torch.cuda.is_available() else "cpu"
    p.add_argument(
        "--device",
        default=default,
        help=f"cpu or cuda[:N] (default here: {default}){device_note}",
    )


def command_data(
    recorded: dict, words: Sequence[str], resplit: bool | None = None
) -> tuple[dict, list[str]]:
    """The data config a command works on (:func:`inq.data.eval_data_config`: the recorded one,
    ``--data`` on top), and the split settings it changes: refused unless ``resplit`` (a
    command's ``--resplit``; ``None`` where it has none: it would record the split).

    Raises:
        ValueError: a bad ``--data``, or one that changes which images are held out.
    """
    cfg = eval_data_config(recorded, words)  # a ConfigError is a ValueError: one line
    changed = changed_split(recorded, cfg)
    if changed and not resplit:
        flag = "" if resplit is None else ", or add --resplit to evaluate on that split anyway"
        raise ValueError(
            f"--data {' '.join(changed)}: changes which images are held out (the model was "
            f"trained on some of the new ones); leave it out{flag}"
        )
    return cfg, changed


def eval_device(name: str) -> torch.device:
    """The device ``--device`` names, refused with one message if this machine lacks it.

    Example:
        >>> eval_device("cpu")
        device(type='cpu')
        >>> eval_device("tpu")
        Traceback (most recent call last):
        ...
        ValueError: --device tpu: use cpu or cuda[:N]
    """
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ValueError(f"--device {name}: use cpu or cuda[:N]") from None
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"--device {name}: use cpu or cuda[:N]")
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if (device.index or 0) >= count:
            raise ValueError(f"--device {name}: this machine has {count} CUDA GPU(s); use cpu")
    return device


_EXIT_BY_SIGNAL = {signal.SIGINT: 130, signal.SIGTERM: 143}  # 128 + the signal's number
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")  # colour codes some libraries put in errors


def _os_error(err: OSError) -> str:
    """One line for an error of the system: a failed write as "cannot write PATH: disk full
    (...)" (:func:`inq.fileio.describe_os_error`), another as "PATH: <the system's words>"."""
    if err.errno is None or err.strerror is None:  # no (errno, strerror) to say it with
        return str(err)
    if err.errno in WRITE_FAILURES:
        where = f" {err.filename}" if err.filename else ""
        return f"cannot write{where}: {describe_os_error(err)}"
    return f"{err.filename}: {err.strerror}" if err.filename else err.strerror


def run(args: argparse.Namespace) -> int:
    """Run the command ``args`` names (``args.run``, ``args.command``: set by
    :func:`inq.cli.build_parser`); returns its exit status, or 1 after an error a user can cause
    (a ``ValueError`` or ``OSError``: one line on stderr), 130 after Ctrl-C, 143 after SIGTERM.

    A signal is recorded and unwinds the command (nothing half-written stays: every file is
    written atomically). Whatever error the unwinding turns into on its way out (libraries
    catch it and raise their own), an interrupted command says so, never that its input failed.
    """
    received: list[int] = []

    def interrupt(signum: int, frame: FrameType | None) -> None:
        received.append(signum)
        raise KeyboardInterrupt

    previous = {signum: signal.signal(signum, interrupt) for signum in _EXIT_BY_SIGNAL}
    try:
        return args.run(args)
    except BaseException as err:
        if received or isinstance(err, KeyboardInterrupt):
            print(f"inq {args.command}: interrupted; nothing was written", file=sys.stderr)
            return _EXIT_BY_SIGNAL[received[0] if received else signal.SIGINT]
        if not isinstance(err, ValueError | OSError):
            raise
        message = _os_error(err) if isinstance(err, OSError) else str(err)
        print(f"inq {args.command}: error: {_ANSI.sub('', message)}", file=sys.stderr)
        return 1
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
