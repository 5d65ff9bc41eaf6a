"""QONNX export against the integer model it comes from (issue 35): for each bit width, train the
README's CNN for the data set with ``inq-train`` (a short, fixed budget: the point is equality,
not accuracy), with ``quant.act_bits=8`` so the run ends with its integer model, export it as
QONNX (:func:`inq.deploy.qonnx.export_qonnx`) and count the outputs where ``qonnx``'s executor
(:func:`inq.deploy.qonnx.run_qonnx`, in chunks: it opens one onnxruntime session per node per
call) differs from the integer model over the whole test split (digits: the 450 held-out images;
Fashion-MNIST: the 10,000 test images). Prints one Markdown row per bit width: differing logits,
the integer model's accuracy, the exporter's counts, the executor's time.

Usage::

    python experiments/qonnx_equality.py --data digits --bits 2 4 5 --epochs 6 --out /tmp/q
    python experiments/qonnx_equality.py --data fashion_mnist --bits 2 4 5 --epochs 1 \\
        --train-size 10000 --out /tmp/q   # after: apt-get install dataset-fashion-mnist

Extra Hydra overrides go to every run (``--override 'inq.layer_bits=[0:8,15:8]'``).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

MODELS = {"digits": "digits_cnn", "fashion_mnist": "mnist_cnn"}  # the README's CNN per data set


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", choices=sorted(MODELS), default="digits")
    parser.add_argument("--bits", type=int, nargs="+", default=[2, 4, 5])
    parser.add_argument("--epochs", type=int, default=6, help="float epochs and per INQ stage")
    parser.add_argument("--train-size", type=int, help="cap on the training images (all)")
    parser.add_argument("--threads", type=int, default=2, help="trainer.num_threads")
    parser.add_argument("--chunk", type=int, default=2000, help="images per executor call")
    parser.add_argument("--override", action="append", default=[], help="extra Hydra override")
    parser.add_argument("--out", type=Path, required=True, help="run directories go here")
    return parser.parse_args(argv)


def train(args: argparse.Namespace, bits: int) -> Path:
    """Run ``inq-train`` for ``bits`` into ``OUT/<data>_b<bits>``; its run directory."""
    run = args.out / f"{args.data}_b{bits}"
    command = [
        "inq-train", f"data={args.data}", f"model={MODELS[args.data]}", f"inq.bits={bits}",
        f"trainer.float_epochs={args.epochs}", f"inq.epochs={args.epochs}",
        f"trainer.num_threads={args.threads}", "trainer.progress=false", "quant.act_bits=8",
        f"hydra.run.dir={run}", *args.override,
    ]  # fmt: skip
    if args.train_size:
        command.append(f"data.train_size={args.train_size}")
    print("$", " ".join(command), file=sys.stderr, flush=True)
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    return run


def compare(run: Path, chunk: int) -> dict[str, object]:
    """Export ``run``'s integer model as QONNX and compare qonnx's executor with it on the
    whole test split: differing logits, accuracy, exporter counts, executor seconds."""
    import torch

    from inq.data import build_datasets, eval_data_config
    from inq.deploy.qonnx import export_qonnx, qonnx_graph, run_qonnx
    from inq.quant.integer import load_integer

    model = load_integer(run / "model.int.safetensors")
    stats = export_qonnx(model, run / "model.qonnx.onnx")
    x, y = build_datasets(eval_data_config(model.info["data"], []))[1].tensors
    proto = qonnx_graph(model)
    differing, correct, seconds = 0, 0, 0.0
    for start in range(0, len(x), chunk):
        xs = x[start : start + chunk]
        with torch.no_grad():
            expected = (model(xs).double() * model.output_scale()).numpy()
        began = time.perf_counter()
        got = run_qonnx(proto, xs.numpy())
        seconds += time.perf_counter() - began
        differing += int((got != expected).sum())
        correct += int((expected.argmax(1) == y[start : start + chunk].numpy()).sum())
        assert got.shape == expected.shape and np.isfinite(got).all()
    return {"images": len(x), "logits": int(y.numel() * expected.shape[1]),
            "differing": differing, "accuracy": correct / len(x), "seconds": seconds,
            **stats}  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    """Train, export and compare at every bit width; print the table."""
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for bits in args.bits:
        result = compare(train(args, bits), args.chunk)
        rows.append(
            f"| {MODELS[args.data]} | {bits}-bit | {result['images']} | "
            f"{result['differing']} of {result['logits']:,} | {100 * result['accuracy']:.2f} % | "
            f"{result['nodes']} / {result['quant_nodes']} / {result['initializers']} / "
            f"{result['bytes']:,} | {result['seconds']:.1f} s |"
        )
        print(rows[-1], file=sys.stderr, flush=True)
    print("| model | weights | test images | differing logits | integer acc | "
          "nodes / Quant / initializers / bytes | executor time |")  # fmt: skip
    print("| --- | --- | --- | --- | --- | --- | --- |")
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
