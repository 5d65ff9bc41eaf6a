"""``inq export --rtl``: the integer model as a Verilog project (:func:`inq.rtl.export_rtl`:
streaming layers of constant adder graphs, no multiplier), simulated with Verilator and checked
bit for bit before it is kept. :mod:`inq.rtl` is imported only to write (da4ml and Verilator
are the ``rtl`` extra), so this target loads without them.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from inq import project
from inq.data import input_shape
from inq.deploy.target import INTEGER_SOURCE, PROJECT_DIR, Job, Target

__all__ = ["TARGET"]


def _write(job: Job) -> list[str]:
    """A Verilog project, its Verilator simulation checked; a line per layer."""
    from inq.rtl import STAGE_DELAY, export_rtl, hardware_line  # da4ml, Verilator: rtl extra

    int_model = job.integer_model()
    data = job.data(int_model.info.get("data", {}))
    int_model.info["data"] = data
    note = f"{job.header.path} -> {job.output}: Verilog written; building its Verilator simulation"
    record = export_rtl(int_model, job.output, input_shape(data), job.args.force,
                        stage_delay=job.args.stage_delay or STAGE_DELAY,
                        before_build=lambda: print(note + " ...", flush=True),
                        hardware=job.args.hardware)  # fmt: skip
    lines = [f"{'layer':<10} {'op':<8} {'window':<7} {'input':<10} {'adders':>7} {'stages':>6}"
             f" {'flush':>5}"]  # fmt: skip
    for layer in record["layers"]:
        lines.append(f"{layer['name']:<10} {layer['op']:<8} {layer['window']:<7} "
                     f"{layer['frame']:<10} {layer['adders']:>7} {layer['stages']:>6} "
                     f"{layer['flush']:>5}")  # fmt: skip
    multipliers = sum(layer["multipliers"] for layer in record["layers"])
    lines.append(f"multipliers: {multipliers}; a frame every {record['interval_cycles']} cycles, "
                 f"latency {record['latency_cycles']} cycles; Verilator simulation == integer "
                 "model on random inputs, with and without stalls")  # fmt: skip
    if "hardware" in record:
        lines.append(hardware_line(record["hardware"], record["interval_cycles"]))
    return lines


def _check(path: Path) -> str | None:
    """Every file of the project as the export wrote it (its manifest's sha256), no other."""
    return project.project_problem(path, project.RTL_FORMAT, "an RTL project")


def _add_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--stage-delay", type=float, metavar="D",
                   help="with --rtl: the adder graphs' register stages, at most D adders deep "
                   "(da4ml's delay units; default: 6): lower for a faster clock, at the cost of "
                   "flip-flops and latency")  # fmt: skip
    p.add_argument("--hardware", type=float, metavar="MHZ",
                   help="with --rtl: also synthesize (Yosys, for ECP5) and place and route "
                   "(nextpnr, ECP5-85k) for a MHZ clock, and write a bitstream: LUTs, FFs, DSPs, "
                   "fmax (minutes or more, with the design's size)")  # fmt: skip


TARGET = Target(
    name="rtl",
    help="write the integer model (a file, or a run's) as a Verilog project (-o DIR needed; "
    "pip install 'inq[rtl]'): streaming layers of constant adder graphs, no multiplier; "
    "simulated with Verilator and checked bit for bit before it is kept",
    source=INTEGER_SOURCE,
    output=PROJECT_DIR,
    suffix="",
    write=_write,
    check=_check,
    add_options=_add_options,
    options=("stage_delay", "hardware"),
)
