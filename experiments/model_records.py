"""Write the time model's calibration file for a GPU run (see ``inq.kernels.model``).

Joins the fp16 linear and convolution records of ``inq bench kernel --json`` with the figures of
the variants that ran, from ``inq bench kernel --static --json`` compiled with the GPU's Triton,
so that the model can be checked against the run after the kernels change. Runs since issue 47
record the tilings they offered; for an older run, make the file at the commit the run was made
with (the tilings are then what the dispatcher offers):

    python3 experiments/model_records.py experiments/gpu/kernel_bench_issue31_h200.json \\
        experiments/static/issue31_triton3.6.json --harness "dirty flush" --triton 3.6.0 \\
        -o experiments/gpu/model_issue31_h200.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from inq.fileio import atomic_path
from inq.kernels import model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bench", type=Path, help="inq bench kernel --json output")
    parser.add_argument("static", type=Path, help="inq bench kernel --static --json output")
    parser.add_argument("--harness", choices=sorted(model.HARNESSES), required=True)
    parser.add_argument("--triton", required=True, help="the Triton version the GPU ran")
    parser.add_argument("-o", "--output", type=Path, required=True)
    args = parser.parse_args()
    static = json.loads(args.static.read_text())
    variants = static["variants"] if isinstance(static, dict) else static  # older files: a list
    data = model.calibration_records(
        json.loads(args.bench.read_text()), variants, model.HARNESSES[args.harness], args.triton
    )
    with atomic_path(args.output) as tmp:
        tmp.write_text(json.dumps(data, indent=1) + "\n")
    checks = model.calibrate(data)
    print(model.format_calibration(checks, str(args.output)))


if __name__ == "__main__":
    main()
