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

Subcommands live in :data:`COMMANDS` (name -> :class:`Command`); add one there to extend the
tool. Errors a user can cause end in one line on stderr and exit status 1.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import signal
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from types import FrameType
from typing import Any

import torch

import inq
from inq import project, runfiles
from inq.artefact import open_artefact
from inq.bench_onnx import ONNX_HELP, add_onnx_arguments, run_onnx
from inq.data import (
    build_eval_loader,
    calibration_loader,
    changed_split,
    data_record,
    describe_input,
    eval_data_config,
    finetune_loader,
    input_preprocessing,
    input_shape,
)
from inq.evaluation import evaluate
from inq.export_hls4ml import BACKEND as HLS_BACKEND
from inq.export_hls4ml import MANIFEST as HLS_MANIFEST
from inq.export_hls4ml import export_hls4ml
from inq.export_onnx import (
    OnnxModel,
    export_onnx,
    export_qdq,
    load_onnx,
    onnx_digest_problem,
    recorded_descriptions,
    unchecked_digest,
)
from inq.export_qonnx import QonnxModel, export_qonnx, is_qonnx
from inq.fileio import (
    LOCK_NAME,
    WRITE_FAILURES,
    DirBusy,
    describe_os_error,
    lock_dir,
    lock_holder,
)
from inq.kernels.bench import BENCH_HELP, add_bench_arguments, run_bench
from inq.levels import describe_n1
from inq.masked import MASKED_FORMATS
from inq.nn import from_packed
from inq.openvino_runtime import RUNTIMES, OpenVinoModel, openvino_version
from inq.packed import PackStats, export_packed, pack_stats
from inq.quant.bench import integer_pair
from inq.quant.integer import (
    INT_FORMAT,
    IntegerModel,
    IntOp,
    problem_line,
    program_problems,
    save_integer,
)
from inq.quant.observers import CALIBRATIONS
from inq.quant.pipeline import QuantSettings, RealOutput, quantize
from inq.runfiles import (
    INTEGER_MODEL,
    MASKED_CHECKPOINT,
    ONNX_MODEL,
    PACKED_FILE,
    RUN,
    command_file,
    load_model,
)
from inq.verify import VerifyReport, verify_file, verify_qonnx

__all__ = ["COMMANDS", "Command", "main"]

PACKED_SUFFIX = ".inq.safetensors"
INT_SUFFIX = ".int.safetensors"
SAFETENSORS, ONNX = ".safetensors", ".onnx"  # what an output's name ends in, by its format
CALIBRATE_ACT_BITS = 8  # inq-train makes an integer model only when quant.act_bits is set


@dataclass(frozen=True)
class Command:
    """One subcommand: its help line, how it adds its arguments, and what it runs (exit code)."""

    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]


# ---------------------------------------------------------------------------------- export


def _export_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "source",
        help="a run directory or a masked checkpoint; with --onnx also a packed file or an "
        "integer model (inq calibrate); with --qonnx, --hls4ml or --rtl an integer model, or a "
        "run directory holding one",
    )
    p.add_argument(
        "-o",
        "--output",
        help=f"packed file, *{SAFETENSORS} (default: <source stem>{PACKED_SUFFIX} beside the "
        f"source; of a run directory, <run>{PACKED_SUFFIX} beside the run)",
    )
    p.add_argument(
        "--onnx",
        action="store_true",
        help=f"write ONNX instead (opset 18, dynamic batch; -o FILE{ONNX} needed): the "
        "float-activation model, or of an integer model (inq calibrate) its Q/DQ graph",
    )
    p.add_argument(
        "--qonnx",
        action="store_true",
        help=f"write the integer model (a file, or a run's) as QONNX (-o FILE{ONNX} needed; "
        "pip install 'inq[fpga]'): qonnx's executor computes it bit for bit",
    )
    p.add_argument(
        "--hls4ml",
        action="store_true",
        help="write the integer model (a file, or a run's) as an hls4ml project (-o DIR needed; "
        "pip install 'inq[fpga]') and compile its C simulation with g++: it computes the integer "
        "model bit for bit",
    )
    p.add_argument(
        "--rtl",
        action="store_true",
        help="write the integer model (a file, or a run's) as a Verilog project (-o DIR needed; "
        "pip install 'inq[rtl]'): streaming layers of constant adder graphs, no multiplier; "
        "simulated with Verilator and checked bit for bit before it is kept",
    )
    p.add_argument("--stage-delay", type=float, metavar="D",
                   help="with --rtl: the adder graphs' register stages, at most D adders deep "
                   "(da4ml's delay units; default: 6): lower for a faster clock, at the cost of "
                   "flip-flops and latency")  # fmt: skip
    p.add_argument("--hardware", type=float, metavar="MHZ",
                   help="with --rtl: also synthesize (Yosys, for ECP5) and place and route "
                   "(nextpnr, ECP5-85k) for a MHZ clock, and write a bitstream: LUTs, FFs, DSPs, "
                   "fmax (minutes or more, with the design's size)")  # fmt: skip
    p.add_argument("--io", choices=("parallel", "stream"),
                   help="with --hls4ml: hls4ml's io_type (parallel, the default: every layer "
                   "unrolled; stream: line buffers, for images larger than digits' 8x8: "
                   "compiles in minutes where parallel does not)")  # fmt: skip
    p.add_argument("--data", nargs="*", default=[], metavar="NAME|KEY=VALUE",
                   help="with --onnx/--qonnx/--hls4ml/--rtl, for a file that records no data: the "
                   "input size")  # fmt: skip
    p.add_argument(
        "--dense",
        action="store_true",
        help="store every layer as dense code rows (default: sparse, a bitmap or gaps, where "
        "that is smaller)",
    )
    _force_arg(p, project=True)


def _force_arg(p: argparse.ArgumentParser, project: bool = False) -> None:
    hls4ml = ", or an hls4ml or RTL project inq wrote and nobody changed since" if project else ""
    p.add_argument(
        "--force",
        action="store_true",
        help=f"replace an existing output file{hls4ml} (never a file an inq-train run wrote for "
        "itself, nor other files)",
    )


def default_output(source: Path, suffix: str) -> Path:
    """Where a command writes the model it makes of ``source`` when no ``-o`` is given: beside
    the source, its name's stem plus ``suffix``; for a run directory, or a file in one, beside
    the run (``<run>`` + ``suffix``), so that the run's own files stay its own.

    Example:
        >>> default_output(Path("out/mixed4.safetensors"), ".inq.safetensors")
        PosixPath('out/mixed4.inq.safetensors')
        >>> default_output(Path("."), ".int.safetensors") == Path.cwd().with_suffix(
        ...     ".int.safetensors")
        True
    """
    home = source if source.is_dir() else source.parent
    if source.is_dir() or runfiles.is_run(home):
        home = home.resolve() if home.name in ("", "..") else home
        return home.parent / (home.name + suffix)
    stem = source.name.removesuffix(SAFETENSORS).removesuffix(".inq").removesuffix(".int")
    return home / (stem + suffix)


@contextmanager
def writing(output: Path, source: Path, force: bool = False, suffix: str = SAFETENSORS
            ) -> Iterator[None]:  # fmt: skip
    """Checks, before any work, that ``output`` may be written from ``source`` (in a format
    whose names end in ``suffix``; ``""`` for a directory, an hls4ml project), and holds an
    inq-train run directory's lock while the block writes into it: the one rule of every
    export, which writes, replaces or deletes nothing but its own output.

    Example:
        >>> with writing(Path("."), Path("model.inq.safetensors")):
        ...     pass
        Traceback (most recent call last):
        ...
        ValueError: -o .: a directory; name the file to write

    Raises:
        ValueError: ``output`` is a directory or ``source`` itself, is not named ``*suffix``,
            exists (without ``force``), is a file of an inq-train run (one its ``summary.json``
            lists, or one of the names the run writes), or its run directory is in use; for a
            directory, ``output`` is a run directory or holds ``source``.
    """
    if suffix:
        _file_output(output, source, force, suffix)
    else:
        _directory_output(output, source)
    folder = output.parent
    if output.resolve() in _run_files(folder) or (
        runfiles.is_run(folder) and output.name in runfiles.OWN_FILES
    ):
        raise ValueError(
            f"{output} belongs to the run in {folder} (inq-train writes it there); write "
            "elsewhere with -o"
        )
    if suffix and output.exists() and not force:
        raise ValueError(f"{output} exists; choose another -o, or --force to replace it")
    # an inq-train run's lock, taken only to write (a refusal leaves its pid as it was)
    lock = lock_dir(folder) if (folder / LOCK_NAME).exists() else None
    try:
        yield
    finally:
        if lock is not None:
            lock.close()


def _file_output(output: Path, source: Path, force: bool, suffix: str) -> None:
    if output.is_dir():
        raise ValueError(f"-o {output}: a directory; name the file to write")
    if not output.name.endswith(suffix):
        what = "an ONNX file's name" if suffix == ONNX else "the output is safetensors, whose name"
        hint = "; add --onnx to write ONNX" if output.suffix == ONNX else ""
        raise ValueError(f"-o {output}: {what} ends in {suffix}{hint}")
    if output.exists() and output.resolve() == source.resolve():
        raise ValueError(f"{output}: the output would replace the file it is made from; choose -o")


def _directory_output(output: Path, source: Path) -> None:
    if runfiles.is_run(output):
        if (pid := lock_holder(output)) is not None:  # looks without writing its pid there
            raise DirBusy(output, pid)
        raise ValueError(f"-o {output}: an inq-train run directory; write the project elsewhere")
    if output.is_dir() and output.resolve() in source.resolve().parents:
        raise ValueError(
            f"-o {output}: holds {source.resolve()}, the model the project is made from; choose "
            "another -o"
        )


def _run_files(folder: Path) -> set[Path]:
    """The files an inq-train run in ``folder`` recorded as its results (a relative path in its
    ``summary.json`` is relative to ``folder``, wherever the command runs)."""
    try:
        files = json.loads((folder / runfiles.SUMMARY).read_text()).get("files", {})
        return {(folder / path).resolve() for path in files.values()}
    except (OSError, ValueError, AttributeError, TypeError):  # no run, or no readable summary
        return set()


def _export(args: argparse.Namespace) -> int:
    chosen = [flag for flag in ("onnx", "qonnx", "hls4ml", "rtl") if getattr(args, flag)]
    if len(chosen) > 1:
        raise ValueError(f"{' and '.join('--' + flag for flag in chosen)}: choose one")
    if args.io is not None and not args.hls4ml:
        with_ = f"--{chosen[0]}" if chosen else "the packed export"
        raise ValueError(f"--io {args.io}: only with --hls4ml, not with {with_}")
    if args.dense and chosen:
        raise ValueError(f"--dense: only with the packed export, not with --{chosen[0]}")
    if args.data and not chosen:
        raise ValueError(
            "--data: only with --onnx, --qonnx, --hls4ml or --rtl (the packed file keeps the data "
            "record of the checkpoint it is made from)"
        )
    if args.onnx:
        return _export_onnx(args)
    if args.qonnx:
        return _export_qonnx(args)
    for flag in ("hardware", "stage_delay"):
        if getattr(args, flag) is not None and not args.rtl:
            raise ValueError(f"--{flag.replace('_', '-')}: only with --rtl")
    if args.hls4ml:
        return _export_hls4ml(args)
    if args.rtl:
        return _export_rtl(args)
    header = command_file(args.source, "export", (RUN, MASKED_CHECKPOINT), MASKED_FORMATS,
                          MASKED_CHECKPOINT)  # fmt: skip
    source = header.path
    output = Path(args.output or default_output(Path(args.source), PACKED_SUFFIX))
    with writing(output, source, args.force):
        ckpt = open_artefact(header)
        ckpt.data = data_record(ckpt.data)
        stats = export_packed(ckpt, output, sparse=not args.dense)
    print(f"{source} -> {output}")
    print(_sizes(stats))
    return 0


def _export_onnx(args: argparse.Namespace) -> int:
    header = command_file(args.source, "export --onnx",
                          (RUN, MASKED_CHECKPOINT, PACKED_FILE, INTEGER_MODEL))  # fmt: skip
    if not args.output:
        raise ValueError(f"--onnx needs -o FILE{ONNX}")
    source, output = Path(args.source), Path(args.output)
    with writing(output, source, args.force, ONNX):
        if header.kind == INTEGER_MODEL:  # the integer model: Q/DQ
            int_model = open_artefact(header)
            data, _ = command_data(int_model.info.get("data", {}), args.data)
            int_model.info["data"] = data
            stats = export_qdq(int_model, output, input_shape(data))
            read = source
            form = (
                "TensorRT form: int8, zero point 0, checked against TensorRT's parser rules"
                if stats["form"] == "tensorrt"
                else "uint8 form; for TensorRT calibrate with --symmetric"
            )
            what = (
                f"Q/DQ graph of the integer model ({form}), {stats['int8_layers']} conv/linear "
                f"layers with int8 weights, {stats['float_layers']} with exact float weights"
                + (" (integers beyond ±64)" if stats["float_layers"] else "")
            )
        else:
            packed, read = load_model(header)
            data, _ = command_data(packed.data, args.data)
            packed.metadata["data"] = json.dumps(data)  # the file records what it was made for
            stats = export_onnx(packed, output, input_shape(data))
            what = "float activations, every quantized weight an exact initializer"
    print(
        f"{read} -> {args.output}: ONNX opset {stats['opset']}, dynamic batch, "
        f"{stats['nodes']} nodes, {stats['initializers']} initializers, {stats['bytes']} B; {what}"
    )
    return 0


def _export_qonnx(args: argparse.Namespace) -> int:
    header = command_file(args.source, "export --qonnx", (RUN, INTEGER_MODEL), (INT_FORMAT,),
                          INTEGER_MODEL)  # fmt: skip
    if not args.output:
        raise ValueError(f"--qonnx needs -o FILE{ONNX}")
    output = Path(args.output)
    with writing(output, header.path, args.force, ONNX):
        int_model = open_artefact(header)
        data, _ = command_data(int_model.info.get("data", {}), args.data)
        int_model.info["data"] = data  # the file records the data it was made for
        stats = export_qonnx(int_model, output, input_shape(data))
    print(
        f"{header.path} -> {output}: QONNX, {stats['nodes']} nodes ({stats['quant_nodes']} "
        f"Quant), {stats['initializers']} initializers, {stats['bytes']} B; batch 1, integer "
        "steps exact (qonnx's executor equals the integer model)"
    )
    return 0


def _export_hls4ml(args: argparse.Namespace) -> int:
    header = command_file(args.source, "export --hls4ml", (RUN, INTEGER_MODEL), (INT_FORMAT,),
                          INTEGER_MODEL)  # fmt: skip
    if not args.output:
        raise ValueError("--hls4ml needs -o DIR (the project's directory)")
    output = Path(args.output)
    io_type = f"io_{args.io or 'parallel'}"
    with writing(output, header.path, args.force, suffix=""):
        int_model = open_artefact(header)
        data, _ = command_data(int_model.info.get("data", {}), args.data)
        _, layers = export_hls4ml(int_model, output, input_shape(data), args.force, lambda: print(
            f"{header.path} -> {output}: hls4ml project ({HLS_BACKEND}, {io_type}); compiling "
            "its C simulation with g++ ...", flush=True), io_type)  # fmt: skip
    print(f"{'layer':<12} {'op':<6} {'weight':<12} {'accum':<14} {'scale':<14} {'result':<20} "
          "non-pow2")  # fmt: skip
    for layer in layers:
        types = layer.types
        print(f"{layer.name:<12} {layer.op:<6} {types.get('weight', '-'):<12} "
              f"{types.get('accum', '-'):<14} {types.get('scale', '-'):<14} "
              f"{types.get('result', '-'):<20} {layer.non_pow2}/{layer.constants}")  # fmt: skip
    weights = sum(layer.non_pow2 for layer in layers if "weight" in layer.types)
    scales = sum(layer.non_pow2 for layer in layers if "scale" in layer.types)
    print(f"weights multiplied by a non-power-of-two constant: {weights}; requantization "
          f"multipliers: {scales}; C simulation == integer model on 64 random inputs")  # fmt: skip
    print(f"synthesis (Vitis HLS, not run here): cd {output} && vitis-run --tcl build_prj.tcl "
          "--mode hls")  # fmt: skip
    return 0


def _export_rtl(args: argparse.Namespace) -> int:
    header = command_file(args.source, "export --rtl", (RUN, INTEGER_MODEL), (INT_FORMAT,),
                          INTEGER_MODEL)  # fmt: skip
    if not args.output:
        raise ValueError("--rtl needs -o DIR (the project's directory)")
    from inq.rtl import STAGE_DELAY, export_rtl, hardware_line  # da4ml, Verilator: rtl extra

    output = Path(args.output)
    with writing(output, header.path, args.force, suffix=""):
        int_model = open_artefact(header)
        data, _ = command_data(int_model.info.get("data", {}), args.data)
        int_model.info["data"] = data
        note = f"{header.path} -> {output}: Verilog written; building its Verilator simulation"
        record = export_rtl(int_model, output, input_shape(data), args.force,
                            stage_delay=args.stage_delay or STAGE_DELAY,
                            before_build=lambda: print(note + " ...", flush=True),
                            hardware=args.hardware)  # fmt: skip
    print(f"{'layer':<10} {'op':<8} {'window':<7} {'input':<10} {'adders':>7} {'stages':>6}"
          f" {'flush':>5}")  # fmt: skip
    for layer in record["layers"]:
        print(f"{layer['name']:<10} {layer['op']:<8} {layer['window']:<7} {layer['frame']:<10} "
              f"{layer['adders']:>7} {layer['stages']:>6} {layer['flush']:>5}")  # fmt: skip
    multipliers = sum(layer["multipliers"] for layer in record["layers"])
    print(f"multipliers: {multipliers}; a frame every {record['interval_cycles']} cycles, "
          f"latency {record['latency_cycles']} cycles; Verilator simulation == integer model "
          "on random inputs, with and without stalls")  # fmt: skip
    if "hardware" in record:
        print(hardware_line(record["hardware"], record["interval_cycles"]))
    return 0


# ---------------------------------------------------------------------------------- verify


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
    """``inq verify`` of an hls4ml or RTL project: every file as the export wrote it (its sha256
    in the project's manifest), no other file; 1 otherwise."""
    rtl = project.project_format(Path(path)) == project.RTL_FORMAT
    flag, fmt = ("rtl", project.RTL_FORMAT) if rtl else ("hls4ml", project.HLS4ML_FORMAT)
    what = f"{'RTL' if rtl else 'hls4ml'} project"
    problem = project.project_problem(Path(path), fmt, "an " + what)
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
    level sets (:func:`inq.verify.verify_qonnx`), one line on stderr per problem, then a
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
    """``inq verify`` of an ONNX file that is not QONNX: its digest only (it records no level
    sets; the file it was made from has them); 1 if it does not match or it has none."""
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


# ---------------------------------------------------------------------------------- info


def _info_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "file",
        help="a packed file (inq export), an integer model (inq calibrate), a masked checkpoint "
        "(shown packed, as inq export would write it), an ONNX or QONNX model or a run directory "
        "(its packed file)",
    )


def _info(args: argparse.Namespace) -> int:
    header = command_file(
        args.file, "info", (PACKED_FILE, INTEGER_MODEL, MASKED_CHECKPOINT, ONNX_MODEL, RUN)
    )
    if header.kind == INTEGER_MODEL:
        print(integer_table(open_artefact(header), args.file))
        return 0
    if header.kind == ONNX_MODEL:
        proto = load_onnx(args.file)
        print(qonnx_summary(proto, args.file) if is_qonnx(proto) else
              onnx_summary(OnnxModel(args.file, proto), args.file))  # fmt: skip
        return 0
    packed, read = load_model(header)
    stored = header.kind == PACKED_FILE
    stats = pack_stats(packed, os.path.getsize(read) if stored else 0)
    how = "" if stored else ", shown packed as inq export would write it"
    print(f"{read}: {header.format}{how}; model {json.dumps(packed.model)}")
    if packed.data:
        print(_input_line(packed.data))
    bits = sorted({layer.bits for layer in packed.layers.values()})
    print(
        f"{len(packed.layers)} quantized layers (bits {bits}), {len(packed.tensors)} other tensors"
    )
    print(_sizes(stats))
    width = max([len("tensor"), *(len(k) for k in packed.layers)])
    n1_width = max([4, *(len(describe_n1(layer.n1)) for layer in packed.layers.values())])
    print(
        f"{'tensor':<{width}}  {'shape':<18}  bits  {'n1':>{n1_width}}   zeros  storage  "
        f"{'dense B':>8}  {'stored B':>8}  {'x fp32':>7}"
    )
    for key, layer in packed.layers.items():
        shape = "x".join(map(str, layer.shape))
        storage = layer.storage + (f"/{layer.sparse.gap_bits}" if layer.storage == "gaps" else "")
        zeros = float((layer.codes() == 0).double().mean()) if layer.packed.numel() else 0.0
        fp32 = 4 * math.prod(layer.shape)
        print(
            f"{key:<{width}}  {shape:<18}  {layer.bits:>4}  {describe_n1(layer.n1):>{n1_width}}  "
            f"{100 * zeros:>5.1f}%  {storage:<7}  {layer.packed.numel():>8}  "
            f"{layer.stored_bytes:>8}  {fp32 / max(1, layer.stored_bytes):>6.1f}x"
        )
    return 0


def _sizes(stats: PackStats) -> str:
    return (
        f"quantized weights: fp32 {stats.fp32_bytes} B -> {stats.packed_bytes} B in the file "
        f"(compression {stats.compression:.2f}x; dense rows {stats.dense_bytes} B); "
        f"other tensors {stats.other_bytes} B"
        + (f"; file {stats.file_bytes} B" if stats.file_bytes else "")
    )


def _input_line(data: dict) -> str:
    """The input preprocessing a file records with its data (or, in a file older than that
    record, what its dataset's loader does)."""
    recorded = data.get("input")
    if recorded is None:
        return describe_input(data_record(data)["input"]) + " (not recorded: the loader's)"
    return describe_input(recorded)


def onnx_summary(model: OnnxModel, path: str) -> str:
    """What ``inq info`` shows of an ONNX file: opset, size, inputs and outputs, and the model,
    data and input preprocessing it records."""
    head = f"ONNX opset {model.opset}, {model.nodes} nodes, {model.initializers} initializers"
    return _graph_summary(path, head, model.signature, model.model, model.data)


def qonnx_summary(proto: Any, path: str) -> str:
    """:func:`onnx_summary` of a QONNX file, read from the graph (ONNX Runtime cannot load its
    ``Quant`` nodes), with its count of ``Quant`` nodes."""
    from onnx import TensorProto

    nodes = proto.graph.node
    quants = sum(node.op_type == "Quant" for node in nodes)
    head = (f"QONNX model, {len(nodes)} nodes ({quants} Quant), {len(proto.graph.initializer)} "
            "initializers")  # fmt: skip
    signature = [
        (role, value.name, f"tensor({TensorProto.DataType.Name(kind.elem_type).lower()})",
         [d.dim_param or d.dim_value for d in kind.shape.dim])
        for role, values in (("input", proto.graph.input), ("output", proto.graph.output))
        for value in values
        for kind in [value.type.tensor_type]
    ]  # fmt: skip
    return _graph_summary(path, head, signature, *recorded_descriptions(proto, path))


def _graph_summary(
    path: str, head: str, signature: Sequence[tuple[str, str, str, Any]], model: dict, data: dict
) -> str:
    lines = [
        f"{path}: {head}, {os.path.getsize(path)} B",
        *(f"{role} {name}: {dtype} {dims}" for role, name, dtype, dims in signature),
        f"model {json.dumps(model)}",
    ]
    if data:
        lines += [f"data {data.get('name')}", _input_line(data)]
    else:
        lines.append("no data recorded: inq eval needs --data NAME")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------- eval


def _eval_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "file",
        help="a packed file (inq export), an integer model (inq calibrate), an ONNX model (inq "
        "export --onnx; run in ONNX Runtime on the CPU), a QONNX model (inq export --qonnx; run "
        "in qonnx's executor, pip install 'inq[fpga]'), an RTL project (inq export --rtl; its "
        "Verilator simulation), a masked checkpoint or a run directory (its packed file)",
    )
    _data_args(p, "; ONNX files run on the CPU")
    p.add_argument(
        "--runtime",
        choices=RUNTIMES,
        default=RUNTIMES[0],
        help="which runtime runs an ONNX file on the CPU (default: onnxruntime; openvino needs "
        "pip install 'inq[openvino]')",
    )
    p.add_argument(
        "--resplit",
        action="store_true",
        help="allow --data split_seed/val_fraction other than the run's: the images held out "
        "then include training images, and the figure is labelled so (not the held-out accuracy)",
    )


def _data_args(p: argparse.ArgumentParser, device_note: str = "") -> None:
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


def _eval(args: argparse.Namespace) -> int:

    device = eval_device(args.device)
    read = args.file
    rtl = Path(read).is_dir() and runfiles.file_kind(read) == runfiles.RTL_PROJECT
    header = None if rtl else command_file(
        args.file, "eval", (PACKED_FILE, INTEGER_MODEL, ONNX_MODEL, MASKED_CHECKPOINT, RUN)
    )  # fmt: skip
    kind = runfiles.RTL_PROJECT if header is None else header.kind
    if args.runtime != RUNTIMES[0] and kind != ONNX_MODEL:
        raise ValueError(f"--runtime {args.runtime} runs ONNX files; {read} is not one ({kind})")
    if header is None:
        from inq.rtl import RtlModel  # Verilator's build of the project: the rtl extra

        model = RtlModel(read)
        description, recorded = model.record["model"], model.record["data"]
        device = torch.device("cpu")
        what = "its Verilog, simulated by Verilator"
    elif header.kind == ONNX_MODEL:
        onnx_model, what = _onnx_model(args.file, args.runtime)
        description, recorded = onnx_model.model, onnx_model.data
        model: torch.nn.Module = onnx_model
        device = torch.device("cpu")
    elif header.kind == INTEGER_MODEL:
        int_model = open_artefact(header)
        description, recorded = int_model.info.get("model", {}), int_model.info.get("data", {})
        model = RealOutput(int_model)
        what = f"integer arithmetic, {int_model.info.get('act_bits')}-bit activations"
    else:
        packed, read = load_model(header)
        description, recorded = packed.model, packed.data
        model = from_packed(packed)
        what = "float activations"
    cfg, resplit = command_data(recorded, args.data, args.resplit)
    if isinstance(model, QonnxModel) and not any(
        word.startswith("eval_batch_size=") for word in args.data
    ):
        cfg["eval_batch_size"] = model.batch  # few large executor calls
    for key in ("in_channels", "num_classes"):
        if key in description and description[key] != cfg[key]:
            raise ValueError(
                f"the model has {key}={description[key]}, the {cfg['name']} data "
                f"{key}={cfg[key]}: evaluate it on the data it was trained on"
            )
    expected = recorded.get("input")
    if expected is not None and expected != input_preprocessing(cfg):
        raise ValueError(
            f"{read} records its input as {describe_input(expected)}; inq's {cfg['name']} "
            f"loader gives {describe_input(input_preprocessing(cfg))}: the accuracy would mean "
            "nothing"
        )
    metrics = evaluate(model.to(device), build_eval_loader(cfg), device)
    total, correct = int(metrics["count"]), round(metrics["acc"] * metrics["count"])
    split = f", re-split {' '.join(resplit)}: NOT the held-out accuracy" if resplit else ""
    print(
        f"{read} ({what}) on {cfg['name']} ({total} samples{split}): accuracy "
        f"{100 * correct / total:.2f}% ({correct}/{total}), loss {metrics['loss']:.4f}"
    )
    return 0


def _onnx_model(path: str, runtime: str = "onnxruntime") -> tuple[OnnxModel | QonnxModel, str]:
    """The ONNX file at ``path`` as a module to evaluate, and where it runs: with ``runtime``
    ``openvino`` in OpenVINO (a QONNX file refused), else a QONNX file
    (:func:`inq.export_qonnx.is_qonnx`) in qonnx's executor, any other in ONNX Runtime; where
    is followed by why the file's digest was not checked, if it was not
    (:func:`inq.export_onnx.unchecked_digest`)."""
    proto = load_onnx(path)
    unchecked = unchecked_digest(proto)
    note = f"; {unchecked}" if unchecked else ""
    if runtime == "openvino":
        return OpenVinoModel(path, proto), f"OpenVINO {openvino_version()}, CPU{note}"
    if is_qonnx(proto):
        return QonnxModel(proto, path), f"QONNX, qonnx's executor, CPU{note}"
    return OnnxModel(path, proto), f"ONNX Runtime, CPU{note}"


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


# ---------------------------------------------------------------------------------- calibrate


def _calibrate_args(p: argparse.ArgumentParser) -> None:
    defaults = QuantSettings()
    p.add_argument("source", help="a run directory, a packed file or a masked checkpoint")
    _data_args(p)
    p.add_argument(
        "--calibration",
        choices=CALIBRATIONS,
        default=defaults.calibration,
        help=f"how activation ranges are chosen (default: {defaults.calibration})",
    )
    p.add_argument("--act-bits", type=int, default=CALIBRATE_ACT_BITS,
                   help=f"activation bits, 2-8 (default: {CALIBRATE_ACT_BITS})")  # fmt: skip
    p.add_argument(
        "--input-bits",
        type=int,
        default=defaults.input_bits,
        help=f"bits of the model input, 2-8 (default: {defaults.input_bits}: images are 8-bit)",
    )
    p.add_argument(
        "--batches",
        type=int,
        default=defaults.batches,
        help=f"calibration batches of eval_batch_size images (default: {defaults.batches})",
    )
    p.add_argument(
        "--epochs",
        type=int,
        default=defaults.epochs,
        help=f"fine-tuning epochs with fake-quantized activations (default: {defaults.epochs})",
    )
    p.add_argument("--float-scales", action="store_true",
                   help="any activation scale, not only powers of two (requantizations then "
                   "need multipliers)")  # fmt: skip
    p.add_argument(
        "--symmetric",
        action="store_true",
        help="int8 activations with zero point 0 everywhere, TensorRT's form (its Q/DQ export "
        "has no uint8): ReLU outputs use 0..127 at twice the scale",
    )
    p.add_argument(
        "--symmetric-tolerance",
        type=float,
        default=defaults.symmetric_tolerance,
        help="with --symmetric, refuse if symmetric activations lose more than this share of "
        "the calibration images' top-1 agreement with the float model, against unsigned ones "
        f"(default: {defaults.symmetric_tolerance})",
    )
    p.add_argument(
        "--requant-terms",
        type=int,
        metavar="K",
        help="each requantization multiplier a sum of at most K signed powers of two (1: a "
        "pure shift), so that hardware needs no multiplier (inq export --rtl); default: 31-bit "
        "multipliers",
    )
    p.add_argument(
        "-o",
        "--output",
        help=f"integer model, *{SAFETENSORS} (default: <source stem>{INT_SUFFIX} beside the "
        f"source; of a run directory, <run>{INT_SUFFIX} beside the run)",
    )
    _force_arg(p)


def _calibrate(args: argparse.Namespace) -> int:
    settings = QuantSettings(
        act_bits=args.act_bits,
        input_bits=args.input_bits,
        calibration=args.calibration,
        pow2_scales=not args.float_scales,
        batches=args.batches,
        epochs=args.epochs,
        symmetric=args.symmetric,
        symmetric_tolerance=args.symmetric_tolerance,
        requant_terms=args.requant_terms,
    )
    problem = settings.problem()
    if problem is not None:  # before any work
        field, message = problem
        flag = "--" + field.replace("_", "-")
        raise ValueError(f"{flag} {getattr(args, field)}: {message}")
    device = eval_device(args.device)
    header = command_file(args.source, "calibrate", (RUN, MASKED_CHECKPOINT, PACKED_FILE))
    packed, read = load_model(header)
    output = Path(args.output or default_output(Path(args.source), INT_SUFFIX))
    data, _ = command_data(packed.data, args.data)
    with writing(output, read, args.force):
        finetune = finetune_loader(data, seed=0) if settings.epochs else ()  # else unused
        labels: list[torch.Tensor] = []
        calibration = _images(calibration_loader(data, settings.batches, seed=0), labels)
        record = data_record(data)
        int_model, report = quantize(packed, calibration, settings, device, finetune, record)
        save_integer(output, int_model)
    tuned = (
        f", fine-tuned {args.epochs} epochs in {report['finetune_s']:.1f} s" if args.epochs else ""
    )
    print(
        f"{args.source} -> {output}: {args.act_bits}-bit activations, {args.calibration} "
        f"calibration on {data['name']} in {report['calibration_s']:.1f} s{tuned}"
    )
    print(integer_table(int_model, str(output)))
    print(_sample_accuracy(report["top1"], torch.cat(labels), output))
    return 0


def _images(
    batches: Iterable[tuple[torch.Tensor, torch.Tensor]], labels: list[torch.Tensor]
) -> Iterator[torch.Tensor]:
    """The images of each ``(x, y)`` batch, its labels appended to ``labels``."""
    for x, y in batches:
        labels.append(y)
        yield x


def _sample_accuracy(top1: dict[str, torch.Tensor], labels: torch.Tensor, output: Path) -> str:
    """The line that says whether the integer model works: its accuracy and the model's with
    float activations (the source's) on the calibration images the lowering kept, and how often
    the two agree."""
    count = len(top1["integer"])
    labels = labels[:count]

    def accuracy(predicted: torch.Tensor) -> str:
        return f"{100 * (predicted == labels).double().mean().item():.1f} %"

    agree = 100 * (top1["integer"] == top1["float"]).double().mean().item()
    return (
        f"on {count} calibration images: accuracy {accuracy(top1['integer'])} (with float "
        f"activations {accuracy(top1['float'])}), the same top-1 class on {agree:.1f} %; "
        f"inq eval {output} for the held-out accuracy"
    )


def integer_table(model: IntegerModel, path: str) -> str:
    """What ``inq info`` shows of an integer model: its settings, then one line per op with
    bits, accumulator fraction bits, output scale (as log2), range and requantization."""
    info = model.info
    weight_bits = info.get("weight_bits")  # every bit-width the layers use (each op: its own)
    if isinstance(weight_bits, list):
        weight_bits = "/".join(map(str, weight_bits))
    lines = [
        f"{path}: {INT_FORMAT}, model {json.dumps(info.get('model', {}))}",
        f"activations {info.get('act_bits')}-bit, input {info.get('input_bits')}-bit "
        f"({info.get('calibration')} calibration, "
        f"{'power-of-two' if info.get('pow2_scales', True) else 'float'} scales"
        f"{', symmetric: TensorRT form' if info.get('symmetric') else ''}), weights "
        f"{weight_bits}-bit; output scale {model.output_scale()!r}",
    ]
    width = max(len("op"), *(len(op.name) for op in model.ops))
    lines.append(f"{'op':<{width}}  {'kind':<8} {'bits':>4} {'frac':>4} {'log2 scale':>10}  "
                 f"{'range':<24} requantization")  # fmt: skip
    for op in model.ops:
        a = op.attrs
        requant = _requant_kind(op, model.op_tensors(op.name))
        log2, value_range = math.log2(a["scale"]), f"{a['lo']}..{a['hi']}"
        lines.append(
            f"{op.name:<{width}}  {op.op:<8} {a.get('bits', '-'):>4} {a.get('frac', '-'):>4} "
            f"{log2:>10.4g}  {value_range:<24} {requant}"
        )
    return "\n".join(lines)


def _requant_kind(op: IntOp, tensors: dict[str, torch.Tensor]) -> str:
    """``shift`` / ``multiplier`` counts of an op's requantizations (``-`` for none)."""
    if op.op in ("conv", "linear"):
        m = tensors["multiplier"].to(torch.int64).abs()
        shifts = int(((m & (m - 1)) == 0).sum())  # 0, 1 or a power of two
        return f"{shifts} shift, {m.numel() - shifts} multiplier (of {m.numel()} channels)"
    multipliers = op.attrs.get(
        "multipliers", [op.attrs["multiplier"]] if "multiplier" in op.attrs else None
    )
    if multipliers is None:
        return "-"
    pure = all(abs(m) & (abs(m) - 1) == 0 for m in multipliers)
    return f"{'shift' if pure else 'multiplier'} {multipliers} >> {op.attrs['shift']}"


# ---------------------------------------------------------------------------------- bench

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


# ---------------------------------------------------------------------------------- main

COMMANDS: dict[str, Command] = {
    "export": Command(
        "write a model as packed low-bit codes, ONNX, QONNX or an hls4ml project",
        _export_args,
        _export,
    ),
    "verify": Command(
        "prove every quantized weight lies in its level set and a file is as inq wrote it",
        _verify_args,
        _verify,
    ),
    "eval": Command(
        "evaluate a model file (packed, masked, integer, ONNX, QONNX) on its data",
        _eval_args,
        _eval,
    ),
    "info": Command(
        "sizes, bits, layers and input of a model file (packed, masked, integer, ONNX, QONNX)",
        _info_args,
        _info,
    ),
    "calibrate": Command(
        "integer model: calibrate int8 activations, fold BatchNorm", _calibrate_args, _calibrate
    ),
    "bench": Command(
        "time the GPU kernels (kernel), or ONNX files in ONNX Runtime or OpenVINO on the CPU "
        "(onnx)",
        _bench_args,
        _bench,
    ),
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


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``inq``; returns the exit status (0 ok, 1 failure, 2 bad usage from argparse, 130
    after Ctrl-C, 143 after SIGTERM).

    A signal is recorded and unwinds the command (nothing half-written stays: every file is
    written atomically). Whatever error the unwinding turns into on its way out (libraries
    catch it and raise their own), an interrupted command says so, never that its input failed.

    Example:
        >>> main(["verify", "missing.safetensors"])
        1
    """
    args = build_parser().parse_args(argv)
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


if __name__ == "__main__":
    sys.exit(main())
