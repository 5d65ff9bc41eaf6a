"""The time model's estimate of the integer ResNet-18 (int8 activations, 4- and 5-bit
weights) as one CUDA graph, op by op, against a GPU run of ``inq bench kernel`` (issue 48). An
experiment, not yet part of ``inq.kernels.model``: the GPU runs so far timed the whole graph
only (the bench times each op since 2026-11-28; the next run will have them).

Each op as the integer model runs it on CUDA (``inq.quant.integer``): the input quantization;
every convolution on the int8 tensor-core kernel, on the faster launch ``imma_launches``
offers (the requantization in its epilogue, or, where K is split, a zeroed int32 sum and a
requantization pass); the 3x3 max pool; the 8 requantized residual adds; the global average
pool and the classifier. ``IntegerModel.forward`` runs each block's second convolution and
its residual add as one op (the add in the epilogue or the requantization pass, reading the
skip), as ``inq bench kernel`` times them; ``run`` takes them one at a time. Both are
estimated.

A convolution goes through ``inq.kernels.model.predict`` with its variant's figures from an
``inq bench kernel --static --json`` file (the GPU's Triton) and the tensor cores' int8 rate
(twice fp16's); the one-pass ops are a DRAM latency each side and their bytes at the copy
bandwidth. The graph is the sum plus one harness floor. No constant is fitted here.

    python experiments/integer_estimate.py experiments/static/2026-12-08_triton3.6.json \\
        experiments/gpu/kernel_bench_issue47_h200.json
"""

from __future__ import annotations

import argparse
import itertools
import json
from pathlib import Path

from inq.kernels import model
from inq.kernels.shapes import resnet18_convs
from inq.kernels.static import imma_variant_name
from inq.kernels.triton.imma import ImmaConfig, imma_launches, k_steps


def imma_us(figures: dict, pixels: int, o: int, c: int, taps: int, read: int,
            device: model.Device, residual: bool = False,
            parts: int = 1) -> tuple[float, str]:  # fmt: skip
    """One requantized int8 convolution (or the classifier: ``taps`` 1) of ``parts`` weight
    parts (5-bit weights of 128: two products), with ``residual`` its residual add after (the
    skip read where the output is written): microseconds and variant of the fastest launch
    ``imma_launches`` offers (the GPU times them and keeps it)."""
    return min(launch_us(figures, cfg, pixels, o, c, taps, read, device, residual, parts)
               for cfg in imma_launches(pixels, o, 1, c, taps, device.sms))  # fmt: skip


def launch_us(figures: dict, cfg: ImmaConfig, pixels: int, o: int, c: int, taps: int, read: int,
              device: model.Device, residual: bool, parts: int) -> tuple[float, str]:  # fmt: skip
    """:func:`imma_us` on the launch ``cfg``."""
    steps = k_steps(c, taps, cfg.block_k)
    split, fused = cfg.split_k, cfg.split_k == 1
    name = imma_variant_name(cfg.block_m, cfg.block_n, cfg.block_k, cfg.tapwise, not fused,
                             fused, parts=parts, residual=residual and fused)  # fmt: skip
    skip = pixels * o if residual and fused else 0  # read in the epilogue
    added = pixels * o if residual and not fused else 0  # read by the requantization pass
    # the requantized variants are compiled for uint8 input; a 16-row tile only split
    fig = next(figures[n] for n in (name, name.replace(", requantized", ", split-K"))
               if n in figures)  # fmt: skip
    tiles = -(-pixels // cfg.block_m) * -(-o // cfg.block_n)
    weights = o * steps * cfg.block_k * parts
    stored = tiles * split * cfg.block_m * cfg.block_n * (1 if fused else 4)
    launch = model.Launch(
        name, tiles * split, -(-steps // split), weight_bytes=cfg.block_n * cfg.block_k * parts,
        sharers=-(-pixels // cfg.block_m), act_bytes=cfg.block_m * cfg.block_k,
        macs=cfg.block_m * cfg.block_n * cfg.block_k * parts,
        mma_per_clock=2 * device.mma_per_clock,
        stored=stored, dram=weights + read + pixels * o * (1 if fused else 4) + skip,
        read=weights + read + skip, reduce=0,
    )  # fmt: skip
    time = model.predict(launch, fig, device).kernel_us
    if not fused:  # the int32 sums zeroed, then requantized (and added) in a pass of their own
        time += one_pass(4 * pixels * o, device) + one_pass(5 * pixels * o + added, device)
    return time, name


def one_pass(moved: int, device: model.Device) -> float:
    """A memory-bound kernel: a DRAM latency each side and ``moved`` bytes at the copy rate."""
    return 2 * device.latency_us + moved / device.copy_gbps / 1e3


def estimate(figures: dict, batch: int, device: model.Device, fused: bool = False,
             parts: int = 1) -> list[tuple[str, float, str]]:  # fmt: skip
    """(op name as the integer model names it, microseconds, what runs) for every op, ``fused``
    as ``IntegerModel.forward`` runs them (each block's second conv with its residual add),
    else one at a time; ``parts`` 2: 5-bit weights, every layer's ``+-128`` a second product
    (all 21 of the bench's ResNet-18). The images come as the bench passes them (NCHW), so
    conv1 first copies its int8 input to channels_last (``imma_conv2d``'s permute), within
    its op."""
    ops = [("input", one_pass(batch * 3 * 224 * 224 * 5, device), "fp32 -> int8")]
    convs = resnet18_convs(batch)
    # a block's residual add follows its last conv: the shortcut's where it has one
    downsampled = {c.name.removesuffix(".downsample.0") for c in convs if "downsample" in c.name}
    adds, pending = 0, ("", 0.0, "")
    for layer in convs:
        n, c, h, w = layer.input_shape
        _, o, oh, ow = layer.output_shape
        kh, kw = layer.conv.kernel_size
        residual = fused and layer.name.endswith("conv2")  # the add's first input
        us, name = imma_us(figures, n * oh * ow, o, c, kh * kw, n * c * h * w, device, residual,
                           parts)  # fmt: skip
        if layer.name == "conv1":  # its NCHW input copied to channels_last first, then a pool
            ops.append(("conv1", us + one_pass(2 * n * c * h * w, device), name))
            ops.append(("maxpool", one_pass(n * o * oh * ow * 5 // 4, device), "3x3, stride 2"))
            continue
        add = f"add{f'_{adds}' if adds else ''}"  # the next residual add's name
        if residual:  # run where the add is, named as the add (IntegerModel.schedule)
            pending = (add, us, f"{name} + residual add")
        else:
            ops.append((layer.name.replace(".", "_"), us, name))
        if layer.name.endswith("downsample.0") or (
            layer.name.endswith("conv2") and layer.name.removesuffix(".conv2") not in downsampled
        ):  # the block's add
            ops.append(pending if fused else (add, one_pass(3 * n * o * oh * ow, device),
                                              "requantized add"))  # fmt: skip
            adds += 1
    ops.append(("avgpool", one_pass(batch * 512 * 50, device), "global average"))
    ops.append(("flatten", 0.0, "a view"))
    us, name = imma_us(figures, batch, 1000, 512, 1, batch * 512, device, parts=parts)
    ops.append(("fc", us, name))
    return ops


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("static", type=Path, help="inq bench kernel --static --json output")
    parser.add_argument("bench", type=Path, nargs="?", help="inq bench kernel --json output")
    args = parser.parse_args()
    variants = json.loads(args.static.read_text())["variants"]
    figures = {r["name"]: model.Figures.from_record(r) for r in variants
               if r["name"].startswith("int8 mma") and r["dtype"] == "uint8"}  # fmt: skip
    bench = json.loads(args.bench.read_text()) if args.bench else {}
    runs = bench.get("end_to_end", [])
    device = model.DEVICES[model.device_name(bench["device"])] if bench else model.H200
    for (bits, parts), batch in itertools.product(((4, 1), (5, 2)), (1, 32)):
        ops = estimate(figures, batch, device, fused=True, parts=parts)
        apart = (sum(us for _, us, _ in estimate(figures, batch, device, parts=parts))
                 + model.CLEAN.floor_us)  # fmt: skip
        run = next((r for r in runs if r["batch"] == batch and r["bits"] == bits), {})
        measured = {o["name"]: o["time_us"] for o in run.get("int8_ops", [])}
        print(f"integer ResNet-18, batch {batch}, {bits}-bit weights, {device.name} (model "
              "estimate, us; measured beside it where the run timed each op)")  # fmt: skip
        for name, us, what in ops:
            seen = f"{measured[name]:>9.1f}" if name in measured else f"{'-':>9}"
            print(f"  {name:<24}{us:>8.1f}{seen}  {what}")
        total = sum(us for _, us, _ in ops) + model.CLEAN.floor_us
        print(f"  graph: {total:.1f} us, {len(ops)} ops (each block's second conv and its add "
              f"one op, as IntegerModel.forward runs them since 2026-12-08); apart, as "
              f"before: {apart:.1f} us")  # fmt: skip
        graph = run.get("int8_graph_ms")
        if graph:  # a run before 2026-12-08 timed the ops apart
            fused = any(o["op"] == "conv+add" for o in run.get("int8_ops", []))
            which = total if fused else apart
            print(f"  measured graph: {1e3 * graph:.1f} us; this commit's kernels, run as it "
                  f"ran them, {100 * (which / (1e3 * graph) - 1):+.0f} % (a run of other "
                  f"kernels compares as far as they are alike)")  # fmt: skip


if __name__ == "__main__":
    main()
