"""The average bits a quantized weight costs under a bits rule (``inq.bits`` and
``inq.layer_bits``), counted as ``inq.auto.size=nominal`` counts (b bits a weight): the budget at
which the mixed-precision study (``experiments/mixed_study.sh``) puts ``inq.bits=auto`` against
the rule.

    python experiments/rule_size.py mnist_cnn --width 8 --in-channels 1 --bits 2 \\
        --layer-bits 0:8 15:8
    5.974548
"""

from __future__ import annotations

import argparse

from inq.allocate import layer_bytes
from inq.models import build_model
from inq.scheduler import INQScheduler


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", help="model.name, e.g. mnist_cnn or resnet20")
    parser.add_argument("--width", type=int, default=16)
    parser.add_argument("--in-channels", type=int, default=3)
    parser.add_argument("--bits", type=int, required=True)
    parser.add_argument("--layer-bits", nargs="*", default=[], metavar="GLOB:BITS")
    args = parser.parse_args()
    model = build_model({"name": args.model, "width": args.width, "in_channels": args.in_channels})
    rules = {glob: int(bits) for glob, bits in (rule.rsplit(":", 1) for rule in args.layer_bits)}
    bits = INQScheduler(model, bits=args.bits, layer_bits=rules).layer_bits
    modules = dict(model.named_modules())
    shapes = {name: tuple(modules[name].weight.shape) for name in bits}
    total = sum(layer_bytes(shape, bits[name], "nominal") for name, shape in shapes.items())
    weights = sum(modules[name].weight.numel() for name in bits)
    print(f"{8 * total / weights:.6f}")


if __name__ == "__main__":
    main()
