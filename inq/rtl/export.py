"""``inq export MODEL --rtl -o DIR``: the integer model as a synthesizable Verilog project,
simulated with Verilator and checked equal to the integer model before it is kept.

The project (:mod:`inq.rtl.design`) holds ``inq_top.v`` (valid/ready streams in and out), one
file per layer (its window and pipelined adder graph), ``window.v``, da4ml's adder cells, the
C++ testbench ``tb.cpp`` and the compiled simulator ``sim/Vinq_top``, and ``design.json``:
the input's quantization (so that float images can be fed, :class:`RtlModel`), the frame
geometry, the interval, the latency measured in simulation and, per layer, its adders and
register stages. The manifest :data:`inq.project.MANIFEST` lists every file with its sha256.

Like the other exports it refuses an op it has no form for in one line, before writing; it
builds and checks in a temporary directory that replaces ``DIR`` whole only once the
simulation has matched the integer model on random frames (and with random handshake stalls).

Example::

    report = export_rtl(load_integer("model.int.safetensors"), "rtl_prj", (1, 8, 8))
    model = RtlModel("rtl_prj")
    logits = model(images)  # int32, as the integer model's
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from inq import project
from inq.fileio import atomic_dir, describe_os_error
from inq.kernels.int8 import quantize_input
from inq.quant.integer import IntegerModel
from inq.rtl.design import Design, plan, write_design
from inq.rtl.logic import adders, multipliers
from inq.rtl.sim import build, simulate, testbench_config, testbench_source
from inq.rtl.synth import place_and_route, synthesize

__all__ = ["DESIGN", "PROJECT_FORMAT", "RtlModel", "export_rtl", "rtl_problem"]

PROJECT_FORMAT = project.RTL_FORMAT
DESIGN = "design.json"
STAGE_DELAY = 6.0  # da4ml delay units (about an adder each) between register stages
_WHAT = "an RTL project"
_CHECK_FRAMES = 32


@dataclass
class RtlLayer:
    """What the export reports of one layer."""

    name: str
    op: str
    window: str
    frame: str
    adders: int
    multipliers: int
    stages: int
    flush: int


def export_rtl(
    model: IntegerModel,
    out_dir: str | os.PathLike[str],
    shape: Sequence[int],
    force: bool = False,
    stage_delay: float = STAGE_DELAY,
    before_build: Callable[[], None] | None = None,
    hardware: float | None = None,
    xilinx: bool = False,
) -> dict[str, Any]:
    """Write ``model`` for inputs of ``shape`` ``(C, H, W)`` as an RTL project in ``out_dir``,
    build its Verilator simulation and check it against ``model``; returns ``design.json``'s
    record (layers, interval, latency).

    ``out_dir`` must be absent or empty, or, with ``force``, an RTL project this function wrote,
    unchanged. ``before_build`` is called once the design is written, before the slow part.
    ``hardware`` (a clock in MHz) adds the figures of :mod:`inq.rtl.synth` to the record
    (``"hardware"``): Yosys for ECP5 (``xilinx``: and for Xilinx), nextpnr on an ECP5-85k timed
    for that clock, and a bitstream where the design fits (where it does not, nextpnr's reason
    instead).

    Raises:
        ValueError: an op with no streaming form (:class:`inq.rtl.design.RtlRefusal`), no
            da4ml or Verilator (naming the ``rtl`` extra), an output directory that may not be
            replaced, a build failure, or a simulation that differs from the integer model.
    """
    out = Path(out_dir)
    design = plan(model, (int(shape[0]), int(shape[1]), int(shape[2])))
    project.may_write(out, force, PROJECT_FORMAT, _WHAT)
    project.stop_abandoned_builds(out)
    try:
        with atomic_dir(out) as staging:
            record = _write(model, design, staging, stage_delay)  # the Verilog, the testbench
            if before_build is not None:
                before_build()
            build(staging)
            record["latency_cycles"] = _check(model, design, staging)
            if hardware is not None:
                record["hardware"] = _hardware(staging, hardware, xilinx)
            (staging / DESIGN).write_text(json.dumps(record, indent=1) + "\n")
            project.write_manifest(staging, PROJECT_FORMAT)
    except OSError as err:
        raise ValueError(f"-o {out}: cannot write the project ({describe_os_error(err)})") from None
    return record


def _hardware(folder: Path, mhz: float, xilinx: bool) -> dict[str, Any]:
    figures = synthesize(folder, xilinx)
    try:
        figures["ecp5_pnr"] = place_and_route(folder, mhz)
    except ValueError as err:  # too big for the device, say: the synthesis figures stand
        figures["ecp5_pnr"] = {"error": str(err)}
    for part in ("ecp5", "xilinx"):
        figures.get(part, {}).pop("cells", None)
    return figures


def _write(model: IntegerModel, design: Design, folder: Path, stage_delay: float) -> dict[str, Any]:
    files, pipelines = write_design(design, stage_delay)
    for name, text in files.items():
        (folder / name).write_text(text)
    (folder / "tb.cpp").write_text(testbench_source())
    (folder / "tb_config.h").write_text(testbench_config(design))
    layers = [
        RtlLayer(
            layer.op.name,
            layer.op.op,
            f"{layer.window.kh}x{layer.window.kw}",
            f"{layer.h}x{layer.w}x{layer.window.channels}",
            adders(pipeline),
            multipliers(pipeline),
            len(pipeline.solutions) + 1,
            layer.flush,
        )
        for layer, pipeline in zip(design.layers, pipelines, strict=True)
    ]
    record = {
        "format": PROJECT_FORMAT,
        "input": {key: model.ops[0].attrs[key] for key in ("scale", "lo", "hi")},
        "input_shape": [design.in_channels, design.in_h, design.in_w],
        "output_shape": list(design.out_shape),
        "output_scale": model.output_scale(),
        "frame_gap": design.frame_gap,
        "interval_cycles": design.interval,
        "stage_delay": stage_delay,
        "layers": [vars(layer) for layer in layers],
        "model": model.info.get("model", {}),
        "data": model.info.get("data", {}),
    }
    return record


def _check(model: IntegerModel, design: Design, folder: Path) -> int:
    """Simulate random frames, with and without handshake stalls; the latency in cycles.

    Raises:
        ValueError: a simulated output differs from the integer model's.
    """
    g = torch.Generator().manual_seed(0)
    scale = model.ops[0].attrs["scale"]
    hi = max(abs(model.ops[0].attrs["lo"]), model.ops[0].attrs["hi"]) * scale
    x = (torch.rand(_CHECK_FRAMES, design.in_channels, design.in_h, design.in_w, generator=g)
         * 2.2 - 1.1) * hi  # fmt: skip
    values = model.run(x)
    frames = values[model.ops[0].name].numpy().astype(np.int64)
    want = values[model.ops[-1].name].numpy()
    latencies = []
    for seed in (0, 1):
        got, stats = simulate(folder, frames, seed, design.out_shape)
        differ = int((got.reshape(want.shape) != want).reshape(len(want), -1).any(1).sum())
        if differ:
            raise ValueError(
                f"the RTL simulation differs from the integer model on {differ} of "
                f"{len(want)} random inputs{' (with handshake stalls)' if seed else ''}"
            )
        latencies.append(int(stats["latency"]))
    return latencies[0]  # without stalls


def rtl_problem(folder: Path) -> str | None:
    """Why ``folder`` is not an RTL project inq wrote, unchanged, or None."""
    return project.project_problem(folder, PROJECT_FORMAT, _WHAT)


class RtlModel(torch.nn.Module):
    """An RTL project as a module: float images in (quantized as the integer model's input
    op does), the simulated design's outputs out as real values (float64, the int32 outputs
    times the output scale, as :class:`inq.quant.pipeline.RealOutput` gives the integer
    model's), in the integer model's shape; :meth:`integers` gives the int32 outputs.

    Raises:
        ValueError: ``folder`` is not an RTL project inq wrote, unchanged.
    """

    def __init__(self, folder: str | os.PathLike[str]) -> None:
        super().__init__()
        problem = rtl_problem(Path(folder))
        if problem is not None:
            raise ValueError(f"{folder}: {problem}")
        self.folder = Path(folder)
        self.record = json.loads((self.folder / DESIGN).read_text())

    def integers(self, x: Tensor) -> Tensor:
        q = self.record["input"]
        frames = quantize_input(x.cpu(), q["scale"], q["lo"], q["hi"]).numpy().astype(np.int64)
        out, _ = simulate(self.folder, frames, output_shape=self.record["output_shape"])
        result = torch.from_numpy(out.copy())
        return result.flatten(1) if self.record["output_shape"][1:] == [1, 1] else result

    def forward(self, x: Tensor) -> Tensor:
        return self.integers(x).double() * self.record["output_scale"]
