"""The FPGA targets of ``inq export``: the integer model (a file, or a run's) as QONNX, as an
hls4ml project and as a Verilog project, each checked bit for bit against the integer model
before it is kept. :mod:`inq.cli.export` parses the arguments and calls these.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from inq.artefact import Header, open_artefact
from inq.cli.base import command_data
from inq.cli.output import ONNX, writing
from inq.data import input_shape
from inq.deploy.hls4ml import BACKEND as HLS_BACKEND
from inq.deploy.hls4ml import export_hls4ml
from inq.deploy.qonnx import export_qonnx
from inq.quant.integer import INT_FORMAT
from inq.runfiles import INTEGER_MODEL, RUN, command_file


def _integer_source(args: argparse.Namespace, flag: str, output: str) -> tuple[Header, Path]:
    """The integer model ``inq export --FLAG`` is asked to write (a file, or a run's), and its
    ``-o`` (``output`` says what it must name)."""
    header = command_file(args.source, f"export --{flag}", (RUN, INTEGER_MODEL), (INT_FORMAT,),
                          INTEGER_MODEL)  # fmt: skip
    if not args.output:
        raise ValueError(f"--{flag} needs -o {output}")
    return header, Path(args.output)


def run_qonnx(args: argparse.Namespace) -> int:
    """``inq export --qonnx``: the integer model as QONNX, for FINN and hls4ml."""
    header, output = _integer_source(args, "qonnx", f"FILE{ONNX}")
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


def run_hls4ml(args: argparse.Namespace) -> int:
    """``inq export --hls4ml``: an hls4ml project, its C simulation checked."""
    header, output = _integer_source(args, "hls4ml", "DIR (the project's directory)")
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


def run_rtl(args: argparse.Namespace) -> int:
    """``inq export --rtl``: a Verilog project, its Verilator simulation checked."""
    header, output = _integer_source(args, "rtl", "DIR (the project's directory)")
    from inq.rtl import STAGE_DELAY, export_rtl, hardware_line  # da4ml, Verilator: rtl extra

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
