"""``inq bench``: time the GPU kernels against cuBLAS / cuDNN (``kernel``; ``--static``
without a GPU: the sm_90 SASS check), or ONNX files in ONNX Runtime or OpenVINO on the CPU
(``onnx``). Each target is a :class:`~inq.cli.base.Command` of its own in
:data:`BENCH_TARGETS`; the benchmarks themselves live beside what they time.

::

    inq bench kernel --json out.json                 # GPU kernels vs cuBLAS / cuDNN
    inq bench kernel --static                        # no GPU: sm_90 SASS check
    inq bench onnx m.onnx m.qdq.onnx --peer          # ONNX Runtime CPU latency
"""

from __future__ import annotations

import argparse
from functools import partial

from inq.cli.base import Command
from inq.deploy.bench import ONNX_HELP, add_onnx_arguments, run_onnx
from inq.kernels.bench import BENCH_HELP, add_bench_arguments, run_bench
from inq.quant.bench import integer_pair

BENCH_TARGETS: dict[str, Command] = {
    "kernel": Command(BENCH_HELP, add_bench_arguments, partial(run_bench, integer=integer_pair)),
    "onnx": Command(ONNX_HELP, add_onnx_arguments, run_onnx),
}


def _bench_args(p: argparse.ArgumentParser) -> None:
    targets = p.add_subparsers(dest="target", required=True, metavar="TARGET")
    for name, target in BENCH_TARGETS.items():
        t = targets.add_parser(name, help=target.help, description=target.help)
        target.add_arguments(t)
        t.set_defaults(run_target=target.run)


def _bench(args: argparse.Namespace) -> int:
    return args.run_target(args)


COMMAND = Command(
    "time the GPU kernels (kernel), or ONNX files in ONNX Runtime or OpenVINO on the CPU (onnx)",
    _bench_args,
    _bench,
)
