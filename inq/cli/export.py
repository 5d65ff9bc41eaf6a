"""``inq export``: a masked checkpoint (or a run's) as packed low-bit codes, and any model file
as ONNX; the FPGA targets (QONNX, hls4ml, RTL) are :mod:`inq.cli.export_fpga`.

::

    inq export RUN_OR_CHECKPOINT -o model.inq.safetensors   # masked checkpoint -> packed codes
    inq export RUN --onnx -o model.onnx                      # float-activation ONNX model
    inq export m.int.safetensors --onnx -o m.qdq.onnx        # integer model as a Q/DQ graph
    inq export m.int.safetensors --rtl -o prj/               # Verilog, no multiplier
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from inq.artefact import open_artefact
from inq.cli.base import Command, command_data
from inq.cli.export_fpga import run_hls4ml, run_qonnx, run_rtl
from inq.cli.info import sizes_line
from inq.cli.output import ONNX, PACKED_SUFFIX, SAFETENSORS, default_output, force_arg, writing
from inq.data import data_record, input_shape
from inq.deploy.onnx import export_onnx, export_qdq
from inq.masked import MASKED_FORMATS
from inq.packed import export_packed
from inq.runfiles import (
    INTEGER_MODEL,
    MASKED_CHECKPOINT,
    PACKED_FILE,
    RUN,
    command_file,
    load_model,
)


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
    force_arg(p, project=True)


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
        return run_qonnx(args)
    for flag in ("hardware", "stage_delay"):
        if getattr(args, flag) is not None and not args.rtl:
            raise ValueError(f"--{flag.replace('_', '-')}: only with --rtl")
    if args.hls4ml:
        return run_hls4ml(args)
    if args.rtl:
        return run_rtl(args)
    header = command_file(args.source, "export", (RUN, MASKED_CHECKPOINT), MASKED_FORMATS,
                          MASKED_CHECKPOINT)  # fmt: skip
    source = header.path
    output = Path(args.output or default_output(Path(args.source), PACKED_SUFFIX))
    with writing(output, source, args.force):
        ckpt = open_artefact(header)
        ckpt.data = data_record(ckpt.data)
        stats = export_packed(ckpt, output, sparse=not args.dense)
    print(f"{source} -> {output}")
    print(sizes_line(stats))
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


COMMAND = Command(
    "write a model as packed low-bit codes, ONNX, QONNX, an hls4ml project or Verilog (RTL)",
    _export_args,
    _export,
)
