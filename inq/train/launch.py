"""``inq-torchrun``: ``torchrun`` running ``inq-train``, whose failures end in one line.

Plain ``torchrun $(which inq-train) ...`` works too, but when a rank stops (a config error,
Ctrl-C, SIGTERM) torchrun prints its own ``ChildFailedError``/``SignalException`` traceback and a
failure table after the run's one-line message. This entry point is torchrun itself (its
argument parser and launcher, :mod:`torch.distributed.run`), with ``inq.train.app`` as the
training script and those failure paths ending quietly in the ranks' exit status.

Example (shell)::

    inq-torchrun --nproc_per_node=2 hydra.run.dir=outputs/ddp     # torchrun's options first
    inq-torchrun --nproc_per_node=2 trainer.resume=outputs/ddp    # as a stopped run says
"""

from __future__ import annotations

import logging
import os
import signal
import sys
from typing import NoReturn

from torch.distributed.elastic.multiprocessing.api import SignalException
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.run import get_args_parser, run

from inq.errors import raised_while_handling

__all__ = ["main"]

# marks where inq-train's overrides stop in torchrun's parse; not an option (no "-"): argparse
# would refuse "--..." as an unknown option where no override comes before it
_END = "inq-overrides-end"


def main(argv: list[str] | None = None) -> None:
    """Console entry point: ``inq-torchrun [TORCHRUN OPTIONS] [INQ-TRAIN OVERRIDES]``."""
    # torchrun's parser takes the first word that is not one of its options as the script,
    # the rest as its arguments; the marker keeps a call without overrides parseable.
    args = get_args_parser().parse_args([*(sys.argv[1:] if argv is None else argv), _END])
    overrides = [args.training_script, *args.training_script_args][:-1]
    args.module, args.no_python = True, False
    args.training_script, args.training_script_args = "inq.train.app", overrides
    _quiet_torchrun_logs()
    try:
        run(args)
    except ChildFailedError as failed:
        sys.exit(_exit_code(failed))
    except KeyboardInterrupt:
        sys.exit(128 + signal.SIGINT)
    except Exception as err:
        stop = _signal_behind(err)
        if stop is None:
            raise
        _end_stopped(128 + int(stop.sigval))  # the ranks got it too; rank 0 said how to go on


def _quiet_torchrun_logs() -> None:
    """Silence torchrun's own log lines (each of its loggers has its level set on import): its
    OMP_NUM_THREADS note, and its failure and shutdown lines, which repeat what rank 0 says."""
    for name in list(logging.root.manager.loggerDict):
        if name.startswith(("torch.distributed.run", "torch.distributed.elastic")):
            logging.getLogger(name).setLevel(logging.CRITICAL)


def _end_stopped(code: int) -> NoReturn:
    """End the launcher that a signal stopped, at once (``os._exit``), its output flushed.

    When a signal stops it, torchrun leaves its rendezvous open (for the other nodes of an
    elastic job), and with it the rendezvous's keep-alive thread, a daemon that nothing here
    can reach to stop. Caught inside a store call as the interpreter shuts down, that thread is
    ended by CPython inside pybind11's GIL guard, whose destructor cannot unwind: the launcher
    aborted ("terminate called without an active exception") instead of ending in the stop's
    status. Nothing is left to do by then: torchrun has stopped the ranks and waited for them.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _signal_behind(err: BaseException) -> SignalException | None:
    """The signal that stopped torchrun: ``err``, or an exception it was raised while handling.

    A signal that lands in torchrun's metrics wrapper (``elastic.metrics.prof``, around each
    monitoring step of its agent) before the wrapper has set ``start`` comes out as the
    UnboundLocalError of that wrapper's ``finally``; torchrun has stopped the ranks all the same.

    Example:
        >>> stop = SignalException("Process 1 got signal: 15", sigval=signal.SIGTERM)
        >>> late = UnboundLocalError("cannot access local variable 'start'")
        >>> late.__context__ = stop
        >>> _signal_behind(late) is stop, _signal_behind(stop) is stop, _signal_behind(OSError())
        (True, True, None)
    """
    return raised_while_handling(err, SignalException)


def _exit_code(failed: ChildFailedError) -> int:
    """The run's exit status: a failed rank's own (rank 0's first: it printed the run's message),
    not that of a rank the launcher stopped with SIGTERM when another failed first; a rank other
    than 0 that failed alone is named here.

    Example:
        >>> from torch.distributed.elastic.multiprocessing.errors import ProcessFailure
        >>> def failure(rank, code):
        ...     return ProcessFailure(local_rank=rank, pid=1, exitcode=code, error_file="")
        >>> _exit_code(ChildFailedError("inq", {0: failure(0, -15), 1: failure(1, 1)}))
        1
    """
    failures = dict(sorted(failed.failures.items()))  # by global rank
    own = [f.exitcode for f in failures.values() if f.exitcode > 0]
    code = own[0] if own else 128 + abs(next(iter(failures.values())).exitcode)
    if 0 not in failures:
        rank, first = failed.get_first_failure()
        print(
            f"inq-torchrun: rank {rank} stopped with exit status {first.exitcode}; "
            "see its output above",
            file=sys.stderr,
        )
    return code
