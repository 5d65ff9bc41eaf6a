"""``inq verify``: proves every quantized weight of a file lies in its layer's level set and
the file is as inq wrote it (its sha256 digest); exits 1 and names the offending tensor, op or
file otherwise.

::

    inq verify model.inq.safetensors     # packed codes (or a masked checkpoint)
    inq verify m.int.safetensors         # integer model: codes, integers, no overflow
    inq verify m.qonnx.onnx              # QONNX: weights on their level sets and grids
    inq verify prj/                      # an hls4ml or RTL project: every file as written
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from inq import project
from inq.artefact import open_artefact
from inq.cli.base import Command
from inq.deploy import TARGETS
from inq.deploy.hls4ml import MANIFEST as HLS_MANIFEST
from inq.deploy.onnx import load_onnx, onnx_digest_problem
from inq.deploy.qonnx import is_qonnx, verify_qonnx
from inq.deploy.verify import VerifyReport, verify_file
from inq.quant.integer import IntegerModel, problem_line, program_problems
from inq.runfiles import INTEGER_MODEL, MASKED_CHECKPOINT, ONNX_MODEL, PACKED_FILE, command_file


def _verify_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", help="a masked checkpoint, a packed file, an integer model, a QONNX "
                   "file (inq export --qonnx) or an hls4ml or RTL project directory (inq export "
                   "--hls4ml/--rtl: every file as the export wrote it)")  # fmt: skip


def _verify(args: argparse.Namespace) -> int:
    if (Path(args.file) / HLS_MANIFEST).is_file():
        return _verify_project(args.file)
    header = command_file(
        args.file, "verify", (MASKED_CHECKPOINT, PACKED_FILE, INTEGER_MODEL, ONNX_MODEL)
    )
    if header.kind == INTEGER_MODEL:
        return _verify_integer(args.file, open_artefact(header, validate=False))
    if header.kind == ONNX_MODEL:
        return _verify_qonnx(args.file)
    report = verify_file(header)
    print(f"{args.file} ({report.kind})")
    print(report.table())
    bad = report.first_problem
    if bad is not None:
        print(f"inq verify: {args.file}: {bad.key!r}: {bad.problem}", file=sys.stderr)
        return 1
    if report.file_problem is not None:
        print(f"inq verify: {args.file}: {report.file_problem}", file=sys.stderr)
        return 1
    what = "every mask is full" if report.kind == "masked" else "every code is valid"
    print(
        f"OK: {len(report.layers)} quantized tensors lie in their level sets; {what}; "
        "the contents match their sha256 digest"
    )
    return 0


def _verify_project(path: str) -> int:
    """``inq verify`` of an hls4ml or RTL project: its target's check (every file as the export
    wrote it, its sha256 in the project's manifest, no other file); 1 otherwise."""
    rtl = project.project_format(Path(path)) == project.RTL_FORMAT
    flag, what = ("rtl", "RTL project") if rtl else ("hls4ml", "hls4ml project")
    problem = TARGETS[flag].check(Path(path))
    if problem is not None:
        print(f"inq verify: {path}: {problem}", file=sys.stderr)
        return 1
    print(f"{path} ({what}): OK: every file is as inq export --{flag} wrote it (sha256)")
    return 0


def _verify_integer(path: str, model: IntegerModel) -> int:
    problems = dict(program_problems(model))
    print(f"{path} (integer model)")
    width = max(len("op"), *(len(op.name) for op in model.ops))
    for op in model.ops:
        status = f"FAIL: {problems[op.name]}" if op.name in problems else "ok"
        print(f"{op.name:<{width}}  {op.op:<8}  {status}")
    problem = next(iter(problems.items()), None)
    if problem is not None:
        print(f"inq verify: {path}: {problem_line(model, *problem)}", file=sys.stderr)
        return 1
    if model.digest_problem:
        print(f"inq verify: {path}: {model.digest_problem}", file=sys.stderr)
        return 1
    print(
        f"OK: {len(model.ops)} ops; every code is valid, every tensor an integer, no int32 "
        "accumulator or int64 product can overflow; the contents match their sha256 digest"
    )
    return 0


def _verify_qonnx(path: str) -> int:
    """``inq verify`` of a QONNX file: a table of its Conv/Gemm weights against their recorded
    level sets (:func:`inq.deploy.qonnx.verify_qonnx`), one line on stderr per problem, then a
    summary; 1 on any problem."""
    proto = load_onnx(path, check=False)  # the digest is one of the problems reported
    if not is_qonnx(proto):
        return _verify_onnx_digest(path, proto)
    report = verify_qonnx(proto, path)
    print(f"{path} (QONNX model)")
    print(report.table())
    problems = _qonnx_problems(report)
    for problem in problems:
        print(f"inq verify: {path}: {problem}", file=sys.stderr)
    layers = len(report.layers)
    if problems:
        failed = sum(layer.problem is not None for layer in report.layers)
        print(f"inq verify: {path}: {len(problems)} problem(s); {failed} of {layers} weight "
              "layers fail", file=sys.stderr)  # fmt: skip
        return 1
    print(
        f"OK: {layers} Conv/Gemm weights lie in their recorded level sets (0 or a signed power "
        "of two), on their Quant nodes' grids; the contents match their sha256 digest"
    )
    return 0


def _verify_onnx_digest(path: str, proto: Any) -> int:
    """``inq verify`` of an ONNX file that is not QONNX, already read: its digest only, as the
    ONNX target checks it (it records no level sets; the file it was made from has them); 1 if
    it does not match or it has none."""
    problem = onnx_digest_problem(proto, required=True)
    if problem is not None:
        print(f"inq verify: {path}: {problem}", file=sys.stderr)
        return 1
    print(
        f"{path} (ONNX model): OK: the contents match their sha256 digest (an ONNX export "
        "records no level sets: verify the file it was made from for those)"
    )
    return 0


def _qonnx_problems(report: VerifyReport) -> list[str]:
    """One line per problem of a QONNX report, each naming its node (or metadata key)."""
    problems = [f"node {layer.key!r}: {layer.problem}" for layer in report.layers if layer.problem]
    problems += [f"{key!r}: {problem}" for key, problem in report.other_problems]
    if report.digest_problem is not None:
        problems.append(report.digest_problem)
    if not report.layers:
        problems.append("no Conv/Gemm node: nothing to verify")
    return problems


COMMAND = Command(
    "prove every quantized weight lies in its level set and a file is as inq wrote it",
    _verify_args,
    _verify,
)
