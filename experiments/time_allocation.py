"""Time ``inq.bits=auto``'s loss sensitivities alone, as ``inq-train`` measures them (the
calibration batches of ``inq.data.calibration_loader``, the lowbit level sets), on a float
checkpoint: the allocation's cost without the rest of a run (issue 50).

    python experiments/time_allocation.py runs/mixed_resnet20/float/seed0/checkpoints/float.pt \\
        --model resnet20 --data fashion_mnist --out sensitivities.json

Prints the seconds (one thread) and writes the sensitivities as JSON (to compare two versions
of the code bit for bit with ``cmp``).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from torch.nn.functional import cross_entropy

from inq.allocate import loss_sensitivities
from inq.data import calibration_loader
from inq.fileio import atomic_path
from inq.models import build_model
from inq.scheduler import INQScheduler
from inq.train.checkpoint import load_float_weights


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoint", type=Path, help="a float checkpoint (checkpoints/float.pt)")
    parser.add_argument("--model", default="resnet20")
    parser.add_argument("--data", default="fashion_mnist")
    parser.add_argument("--in-channels", type=int, default=1)
    parser.add_argument("--batches", type=int, default=4, help="inq.auto.batches")
    parser.add_argument("--eval-batch-size", type=int, default=256, help="data.eval_batch_size")
    parser.add_argument("--choices", type=int, nargs="+", default=[2, 3, 4, 5, 8])
    parser.add_argument("--out", type=Path, help="write the sensitivities here (JSON)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    model = build_model({"name": args.model, "num_classes": 10, "in_channels": args.in_channels})
    load_float_weights(model, str(args.checkpoint))
    data = {"name": args.data, "eval_batch_size": args.eval_batch_size}
    batches = list(calibration_loader(data, args.batches, seed=0))
    sched = INQScheduler(model, bits=4)  # the layers INQ quantizes, as inq-train finds them
    weights = {layer.name: layer.weight for layer in sched.layers}
    sched.remove_hooks()
    start = time.perf_counter()
    found = loss_sensitivities(
        model, cross_entropy, batches, weights, args.choices, "mse", "channel"
    )
    seconds = time.perf_counter() - start
    print(f"loss sensitivities of {len(weights)} layers x {len(args.choices)} choices on "
          f"{args.batches} batches of {args.eval_batch_size}: {seconds:.1f} s")  # fmt: skip
    if args.out is not None:
        with atomic_path(args.out) as tmp:
            tmp.write_text(json.dumps(found, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
