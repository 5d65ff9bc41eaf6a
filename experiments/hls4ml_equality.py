"""hls4ml C simulation against the integer model it comes from (issue 35): for each run directory
(an ``inq-train`` run with ``quant.act_bits=8``, e.g. one ``experiments/qonnx_equality.py``
trained), export its integer model as an hls4ml project (:func:`inq.deploy.hls4ml.export_hls4ml`,
g++ compiles the C simulation) and count the logits where the C simulation differs from the
integer model over the test split (or its first ``--images``). Prints one Markdown row per run:
differing logits, the integer model's accuracy on those images, the count of weight constants
that are not 0 or a power of two, the requantization multipliers, compile and simulation time.

Usage::

    python experiments/hls4ml_equality.py /tmp/q/digits_b2 /tmp/q/digits_b4 /tmp/q/digits_b5
    python experiments/hls4ml_equality.py /tmp/q/fashion_mnist_b4 --io stream --images 2000
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", type=Path, nargs="+", help="run directories with model.int")
    parser.add_argument("--io", choices=("parallel", "stream"), default="parallel")
    parser.add_argument("--images", type=int, help="the first N test images (default: all)")
    return parser.parse_args(argv)


def compare(run: Path, io_type: str, images: int | None) -> dict[str, object]:
    """Export ``run``'s integer model as an hls4ml project in ``run/hls4ml_<io>`` and compare
    its C simulation with the integer model on the test split."""
    import torch

    from inq.data import build_datasets, eval_data_config
    from inq.deploy.hls4ml import export_hls4ml, run_csim
    from inq.quant.integer import load_integer

    model = load_integer(run / "model.int.safetensors")
    began = time.perf_counter()
    hls_model, layers = export_hls4ml(model, run / f"hls4ml_{io_type}", force=True,
                                      io_type=io_type)  # fmt: skip
    compiled = time.perf_counter() - began
    x, y = build_datasets(eval_data_config(model.info["data"], []))[1].tensors
    x, y = x[:images], y[:images]
    with torch.no_grad():
        expected = (model(x).double() * model.output_scale()).reshape(len(x), -1).numpy()
    began = time.perf_counter()
    got = run_csim(hls_model, x.numpy())
    simulated = time.perf_counter() - began
    assert got.shape == expected.shape and np.isfinite(got).all()
    return {
        "images": len(x), "logits": expected.size, "differing": int((got != expected).sum()),
        "accuracy": float((expected.argmax(1) == y.numpy()).mean()),
        "weights_non_pow2": sum(layer.non_pow2 for layer in layers if "weight" in layer.types),
        "weights": sum(layer.constants for layer in layers if "weight" in layer.types),
        "multipliers": sum(layer.non_pow2 for layer in layers if "scale" in layer.types),
        "compile_s": compiled, "csim_s": simulated,
    }  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    """Export, compile and compare every run; print the table."""
    args = parse_args(argv)
    print("| run | io | test images | differing logits | integer acc | weights not 0/±2^k | "
          "requant multipliers | compile | C simulation |")  # fmt: skip
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for run in args.runs:
        r = compare(run, f"io_{args.io}", args.images)
        print(f"| {run.name} | {args.io} | {r['images']:,} | {r['differing']} of "
              f"{r['logits']:,} | {100 * r['accuracy']:.2f} % | {r['weights_non_pow2']} of "
              f"{r['weights']:,} | {r['multipliers']} | {r['compile_s']:.0f} s | "
              f"{r['csim_s']:.0f} s |", flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
