"""The ``inq`` command: export, verify, evaluate and inspect INQ exports.

::

    inq export RUN_OR_CHECKPOINT -o model.inq.safetensors   # masked checkpoint -> packed codes
    inq export RUN --onnx -o model.onnx                      # float-activation ONNX model
    inq export m.int.safetensors --onnx -o m.qdq.onnx        # integer model as a Q/DQ graph
    inq verify FILE                                          # every weight in its level set?
    inq eval model.inq.safetensors                          # rebuild, evaluate on its data
    inq info model.inq.safetensors                          # sizes, ratio, bits, layers
    inq calibrate RUN --calibration mse -o m.int.safetensors # integer model (int8 activations)
    inq eval m.int.safetensors                               # ... evaluated in integer arithmetic
    inq bench kernel --json out.json                         # GPU kernels vs cuBLAS / cuDNN
    inq bench kernel --static                                # no GPU: sm_90 SASS check
    inq bench onnx m.onnx m.qdq.onnx --peer                  # ONNX Runtime CPU latency

One module per subcommand (:mod:`inq.cli.export`, ``calibrate``, ``eval``, ``info``,
``verify``, ``bench``), each with its ``COMMAND`` (:class:`inq.cli.base.Command`), on a shared
base (:mod:`inq.cli.base`: the data and device arguments, the one error path;
:mod:`inq.cli.output`: where a command may write). Add a module and its line in
:data:`COMMANDS` to extend the tool. Errors a user can cause end in one line on stderr and exit
status 1.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

import inq
from inq.cli import base
from inq.cli.bench import COMMAND as BENCH
from inq.cli.calibrate import COMMAND as CALIBRATE
from inq.cli.eval import COMMAND as EVAL
from inq.cli.export import COMMAND as EXPORT
from inq.cli.info import COMMAND as INFO
from inq.cli.verify import COMMAND as VERIFY

__all__ = ["COMMANDS", "build_parser", "main"]

COMMANDS: dict[str, base.Command] = {
    "export": EXPORT,
    "verify": VERIFY,
    "eval": EVAL,
    "info": INFO,
    "calibrate": CALIBRATE,
    "bench": BENCH,
}


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every command in :data:`COMMANDS`."""
    parser = argparse.ArgumentParser(
        prog="inq", description="Export, verify, evaluate and inspect INQ models."
    )
    parser.add_argument("--version", action="version", version=f"inq {inq.__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, command in COMMANDS.items():
        p = sub.add_parser(name, help=command.help, description=command.help)
        command.add_arguments(p)
        p.set_defaults(run=command.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``inq``; returns the exit status (0 ok, 1 failure, 2 bad usage from argparse, 130
    after Ctrl-C, 143 after SIGTERM; :func:`inq.cli.base.run`).

    Example:
        >>> main(["verify", "missing.safetensors"])
        1
    """
    return base.run(build_parser().parse_args(argv))
