"""The integer model of a run on the CUDA kernels against its reference (the CPU), bit for bit.

    python3 experiments/gpu_integer_check.py RUN_DIR [--batches N]

Evaluates ``RUN_DIR/model.int.safetensors`` on its recorded validation data twice, on the CPU
(the PyTorch reference of every ``inq::`` op) and on CUDA (the Triton kernels), and prints
whether the int32 logits are identical, the accuracy of each, and the images/s of each.
Exits 1 if any logit differs.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

from inq.data import build_eval_loader
from inq.quant.integer import load_integer


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path, help="an inq-train run directory with quant.act_bits")
    parser.add_argument("--batches", type=int, default=4, help="validation batches (default 4)")
    args = parser.parse_args()
    reference = load_integer(args.run / "model.int.safetensors")
    on_gpu = load_integer(args.run / "model.int.safetensors").to("cuda")
    images = differing = correct_cpu = correct_gpu = 0
    seconds = {"cpu": 0.0, "cuda": 0.0}
    for batch, (x, y) in enumerate(build_eval_loader(reference.info["data"])):
        if batch == args.batches:
            break
        start = time.perf_counter()
        expected = reference(x)
        seconds["cpu"] += time.perf_counter() - start
        torch.cuda.synchronize()
        start = time.perf_counter()
        got = on_gpu(x.cuda())
        torch.cuda.synchronize()
        seconds["cuda"] += time.perf_counter() - start
        got = got.cpu()
        differing += int((got != expected).sum())
        correct_cpu += int((expected.argmax(1) == y).sum())
        correct_gpu += int((got.argmax(1) == y).sum())
        images += len(y)
    print(
        f"integer model {args.run}: {images} images, {differing} int32 logits differ between "
        f"CUDA kernels and the CPU reference; accuracy CPU {100 * correct_cpu / images:.2f} %, "
        f"CUDA {100 * correct_gpu / images:.2f} %; images/s CPU "
        f"{images / seconds['cpu']:.0f}, CUDA {images / seconds['cuda']:.0f} (first call "
        "included: Triton compiles)"
    )
    return 1 if differing else 0


if __name__ == "__main__":
    sys.exit(main())
