"""ResNet-18 (224x224) end to end on a GPU as CUDA graphs: the float model in cuDNN (fp16,
channels_last), the shift model (``inq::shift_conv2d``/``shift_linear``, fp16) and the integer
model (int8 activations, ``inq::shift_conv2d_int8`` on int8 tensor cores), and the integer
model's logits on the GPU against its CPU reference, bit for bit.

    python3 experiments/bench_integer.py [--bits 4 5] [--batches 1 32] [--json OUT.json]

The network has random weights (no data set can be downloaded here), quantized to powers of
two; its BatchNorm statistics and activation ranges come from 8 batches of random images, so
the timings are those of the real shapes and code paths, not of a trained model. Exits 1 if a
logit differs.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from torch import nn

from inq.kernels.bench import (
    cuda_graph,
    quantized,
    quantized_resnet18,
    time_cuda,
    to_op_layers,
)
from inq.nn import ShiftConv2d, ShiftLinear
from inq.quant.lower import Lowering


def shift_model(model: nn.Module, bits: int) -> nn.Module:
    """``model`` (power-of-two weights) with ShiftConv2d/ShiftLinear layers, as the integer
    lowering takes it."""
    for name, m in list(model.named_modules()):
        if isinstance(m, nn.Conv2d | nn.Linear):
            _, n1 = quantized(m.weight.detach(), bits)
            kind = ShiftConv2d if isinstance(m, nn.Conv2d) else ShiftLinear
            layer = kind.from_float(m, n1, bits)
            parent, _, attr = name.rpartition(".")
            setattr(model.get_submodule(parent), attr, layer)
    return model


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bits", type=int, nargs="+", default=[4, 5])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("bench_integer: needs a CUDA GPU", file=sys.stderr)
        return 1
    torch.manual_seed(0)
    flush = torch.empty(2 * torch.cuda.get_device_properties(0).L2_cache_size, dtype=torch.uint8,
                        device="cuda")  # fmt: skip
    rows, differing = [], 0
    for bits in args.bits:
        base = quantized_resnet18(bits)
        shifted = shift_model(quantized_resnet18(bits), bits).cuda()
        lowering = Lowering(shifted, act_bits=8)
        with torch.no_grad():
            lowering.calibrate([torch.randn(16, 3, 224, 224, device="cuda") for _ in range(8)])
        integer = lowering.integer_model().cuda()  # outside inference mode: see cached_layout
        reference = lowering.integer_model().cpu()
        x = torch.randn(2, 3, 224, 224)
        with torch.inference_mode():
            got, want = integer(x.cuda()).cpu(), reference(x)
        differing += int((got != want).sum())
        print(f"{bits} bits: integer model on CUDA vs CPU reference: {int((got != want).sum())} "
              f"of {got.numel()} int32 logits differ", flush=True)  # fmt: skip
        models = {
            "float fp16 (cuDNN)": base.to("cuda", torch.float16, memory_format=torch.channels_last),
            "shift fp16": to_op_layers(base, bits).to("cuda", torch.float16),
            "integer int8": integer,
        }
        for batch in args.batches:
            images = torch.randn(batch, 3, 224, 224, device="cuda")
            row = {"bits": bits, "batch": batch}
            with torch.inference_mode():
                half = images.half().contiguous(memory_format=torch.channels_last)
                for name, model in models.items():
                    x = images if name.startswith("integer") else half  # it quantizes fp32

                    def run(m: nn.Module = model, x: torch.Tensor = x) -> torch.Tensor:
                        return m(x)

                    row[name] = time_cuda(cuda_graph(run), args.repeats, flush) / 1e3
            rows.append(row)
            float_ms = row["float fp16 (cuDNN)"]
            print(f"{bits} bits, batch {batch:>3}: " + ", ".join(
                f"{k} {v:.3f} ms ({float_ms / v:.2f}x)" for k, v in row.items()
                if k not in ("bits", "batch")), flush=True)  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "differing_logits": differing}, indent=2))
    return 1 if differing else 0


if __name__ == "__main__":
    sys.exit(main())
