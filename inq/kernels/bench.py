"""``inq bench kernel``: the Triton ops against cuBLAS (``F.linear``) and cuDNN (``F.conv2d``).

``--static`` needs no GPU: it compiles every kernel variant for sm_90 and checks its SASS, then
prints a roofline of the benchmark shapes (:mod:`inq.kernels.static`).

Every op timing is the median of ``--repeats`` runs, each measured with CUDA events after the L2
cache was flushed (a write of twice its size), so weights come from HBM as in real inference.
A short spin kernel queued before each timed run keeps the GPU busy while Python launches the
op, so the figures are GPU time, not host launch overhead. Baselines use the same weights
decoded to fp16/bf16; cuDNN runs channels_last. The device-to-device copy bandwidth measured in
the same run is the roofline: effective GB/s of an op counts the bytes it must move (packed
codes, activations, bias, output) over its time.

Cases: linear GEMV / skinny / large-batch shapes of LLM layers; every convolution of a
ResNet-18 (random weights, power-of-two quantized) at 224x224, batch 1 and 32, with a per-layer
table and the sums; and the whole ResNet-18 with every conv and linear layer computed by its inq
op (:class:`OpLayer`, what ``inq.nn``'s shift modules compute) against the float model (same
weights, cuDNN, channels_last), end to end: host-measured eager latency (what a Python
caller waits for) and the GPU time of one CUDA-graph replay. The shapes are
:mod:`inq.kernels.shapes`. Prints tables and writes JSON (``--json``).

Example::

    inq bench kernel --json experiments/kernel_bench.json   # needs a GPU
    inq bench kernel --static                               # any machine with triton
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from inq.codes import decode_weight, pack_codes
from inq.fileio import atomic_path
from inq.kernels import model, static
from inq.kernels.shapes import CONV_BATCHES, LINEAR_BATCHES, LINEAR_SHAPES, resnet18_convs
from inq.pow2 import pow2_encode, pow2_n1, pow2_quantize

__all__ = [
    "BENCH_HELP",
    "BenchResult",
    "EndToEnd",
    "IntegerFactory",
    "OpLayer",
    "add_bench_arguments",
    "run_bench",
    "time_cuda",
]

BENCH_HELP = (
    "time the Triton kernels against cuBLAS and cuDNN (GPU), or check them for sm_90 "
    "without one (--static): inq bench kernel [--static]"
)

_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}


@dataclass
class BenchResult:
    """One row of the tables and of the JSON file."""

    op: str  # "linear" or "conv2d"
    name: str  # shape, or the ResNet-18 layer
    batch: int
    bits: int
    dtype: str
    time_us: float  # inq op, median
    baseline_us: float  # cuBLAS / cuDNN on the decoded weight, median
    speedup: float  # baseline_us / time_us
    bytes_moved: int  # codes + activations + bias + output, each once
    gbps: float  # bytes_moved / time
    copy_fraction: float  # gbps / device-to-device copy bandwidth


_LEAD_CYCLES = 2_000_000  # about 1 ms of spinning: longer than any launch from Python


def time_cuda(fn: Callable[[], object], repeats: int, flush: Tensor) -> float:
    """Median GPU microseconds of ``fn`` over ``repeats`` runs, L2 flushed before each.

    Example::

        flush = torch.empty(2 * torch.cuda.get_device_properties(0).L2_cache_size,
                            dtype=torch.uint8, device="cuda")
        us = time_cuda(partial(F.linear, x, weight), repeats=50, flush=flush)
    """
    for _ in range(3):  # warm-up: kernel build and load, cuBLAS heuristics, allocator
        fn()
    times = []
    for _ in range(repeats):
        flush.zero_()
        torch.cuda._sleep(_LEAD_CYCLES)  # the GPU waits for no launch inside the timed region
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000.0)
    return statistics.median(times)


def copy_bandwidth(flush: Tensor, repeats: int) -> float:
    """Device-to-device copy bandwidth in GB/s (read + write), on 1 GiB."""
    src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    us = time_cuda(lambda: dst.copy_(src), repeats, flush)
    return 2 * src.numel() / us / 1e3


def quantized(weight: Tensor, bits: int) -> tuple[Tensor, int]:
    """Packed codes and n1 of a float weight, power-of-two quantized."""
    n1 = pow2_n1(weight)
    codes = pow2_encode(pow2_quantize(weight, n1, bits), n1, bits)
    return pack_codes(codes, bits), n1


def bench_linear(
    bits: int, dtype: torch.dtype, batches: list[int], repeats: int, flush: Tensor, copy: float
) -> list[BenchResult]:
    results = []
    for out_f, in_f in LINEAR_SHAPES:
        packed, n1 = quantized(torch.randn(out_f, in_f, device="cuda") * 0.02, bits)
        weight = decode_weight(packed, bits, n1, (out_f, in_f), dtype)
        for batch in batches:
            x = torch.randn(batch, in_f, device="cuda", dtype=dtype)
            op = partial(torch.ops.inq.shift_linear, x, packed, bits, n1, in_f, None)
            ours = time_cuda(op, repeats, flush)
            base = time_cuda(partial(F.linear, x, weight), repeats, flush)
            moved = packed.numel() + (x.numel() + batch * out_f) * x.element_size()
            results.append(
                _result("linear", f"{out_f}x{in_f}", batch, bits, dtype, ours, base, moved, copy)
            )
    return results


def bench_resnet18(
    bits: int, dtype: torch.dtype, batches: list[int], repeats: int, flush: Tensor, copy: float
) -> list[BenchResult]:
    results = []
    for batch in batches:
        for name, conv, shape, out_shape in resnet18_convs(batch):
            packed, n1 = quantized(conv.weight.detach().cuda(), bits)
            wshape = list(conv.weight.shape)
            weight = decode_weight(packed, bits, n1, tuple(wshape), dtype)
            weight_cl = weight.to(memory_format=torch.channels_last)
            x = torch.randn(shape, device="cuda", dtype=dtype)
            x_cl = x.to(memory_format=torch.channels_last)
            args = _geometry(conv)
            op = partial(torch.ops.inq.shift_conv2d, x_cl, packed, bits, n1, wshape, None, *args)
            ours = time_cuda(op, repeats, flush)
            base = time_cuda(partial(F.conv2d, x_cl, weight_cl, None, *args), repeats, flush)
            moved = packed.numel() + (x.numel() + math.prod(out_shape)) * x.element_size()
            results.append(_result("conv2d", name, batch, bits, dtype, ours, base, moved, copy))
    return results


def _geometry(conv: nn.Conv2d) -> tuple[list[int], list[int], list[int], int]:
    """Stride, padding, dilation and groups of ``conv`` as ``inq::shift_conv2d`` takes them."""
    return list(conv.stride), list(conv.padding), list(conv.dilation), conv.groups


@dataclass
class EndToEnd:
    """ResNet-18 forward, converted (inq ops) vs float (cuDNN), same weights."""

    batch: int
    bits: int
    dtype: str
    float_eager_ms: float  # host latency of one forward, median (Python launch overhead in)
    inq_eager_ms: float
    float_graph_ms: float  # GPU time of one CUDA-graph replay, median (L2 flushed before)
    inq_graph_ms: float
    int8_graph_ms: float | None = None  # the integer model (int8 activations), as a graph
    int8_logits_differ: int | None = None  # of its int32 logits, vs the CPU reference


# (quantized float model, bits) -> (its integer model on CUDA, the same on the CPU): made
# above the kernels (inq.quant), handed in by the CLI
IntegerFactory = Callable[[nn.Module, int], tuple[nn.Module, nn.Module]]


def quantized_resnet18(bits: int) -> nn.Module:
    """Torchvision ResNet-18 (random init, eval) with every conv/linear weight power-of-two
    quantized in place."""
    from torchvision.models import resnet18

    torch.manual_seed(0)
    model = resnet18().eval()
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.Conv2d | nn.Linear):
                m.weight.copy_(pow2_quantize(m.weight, pow2_n1(m.weight), bits))
    return model


class OpLayer(nn.Module):
    """A Conv2d or Linear whose forward is one call of its ``torch.ops.inq`` op on the packed
    codes of its (power-of-two) weight: what ``inq.nn``'s ShiftConv2d / ShiftLinear compute,
    built here because the kernels do not import the layers above them.

    Example:
        >>> fc = nn.Linear(8, 2)
        >>> with torch.no_grad():
        ...     _ = fc.weight.copy_(pow2_quantize(fc.weight, n1=-1, bits=4))
        >>> x = torch.randn(3, 8)
        >>> torch.equal(OpLayer(fc, bits=4)(x), fc(x))
        True
    """

    packed: Tensor
    bias: Tensor | None

    def __init__(self, module: nn.Conv2d | nn.Linear, bits: int) -> None:
        super().__init__()
        packed, self.n1 = quantized(module.weight.detach(), bits)
        self.bits = bits
        self.register_buffer("packed", packed)
        bias = module.bias
        self.register_buffer("bias", None if bias is None else bias.detach().clone())
        if isinstance(module, nn.Conv2d):
            self.op, self.size = torch.ops.inq.shift_conv2d, list(module.weight.shape)
            self.geometry: tuple[object, ...] = _geometry(module)
        else:
            self.op, self.size, self.geometry = torch.ops.inq.shift_linear, module.in_features, ()

    def forward(self, x: Tensor) -> Tensor:
        return self.op(x, self.packed, self.bits, self.n1, self.size, self.bias, *self.geometry)


def to_op_layers(model: nn.Module, bits: int) -> nn.Module:
    """A copy of a power-of-two quantized model with its Conv2d / Linear layers as
    :class:`OpLayer` s."""
    model = copy.deepcopy(model)
    for name, m in list(model.named_modules()):
        if isinstance(m, nn.Conv2d | nn.Linear):
            parent, _, attr = name.rpartition(".")
            setattr(model.get_submodule(parent), attr, OpLayer(m, bits))
    return model


def time_host(fn: Callable[[], object], repeats: int) -> float:
    """Median milliseconds from calling ``fn`` to its GPU work being done (eager latency)."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def cuda_graph(fn: Callable[[], object]) -> Callable[[], object]:
    """``fn`` captured once as a CUDA graph; returns the replay."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):  # warm-up outside the capture (allocator, cuDNN plans, kernel load)
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def bench_end_to_end(
    bits: int,
    dtype: torch.dtype,
    batches: list[int],
    repeats: int,
    flush: Tensor,
    integer: IntegerFactory | None = None,
) -> list[EndToEnd]:
    """ResNet-18 (random weights, power-of-two quantized) as the float model in cuDNN, the
    shift model, and (given ``integer``) the integer model, whose logits on CUDA are first
    compared with its CPU reference on two images."""
    base = quantized_resnet18(bits)
    models = {
        "float": base.to("cuda", dtype, memory_format=torch.channels_last),
        "inq": to_op_layers(base, bits).to("cuda", dtype),
    }
    int8, differ = None, None
    if integer is not None:
        int8, reference = integer(quantized_resnet18(bits), bits)
        x = torch.randn(2, 3, 224, 224)
        with torch.inference_mode():
            differ = int((int8(x.cuda()).cpu() != reference(x)).sum())
    results = []
    for batch in batches:
        x = torch.randn(batch, 3, 224, 224, device="cuda", dtype=dtype)
        x = x.contiguous(memory_format=torch.channels_last)
        eager, graph = {}, {}
        with torch.inference_mode():
            for name, model in models.items():
                run = partial(model, x)
                eager[name] = time_host(run, repeats)
                graph[name] = time_cuda(cuda_graph(run), repeats, flush) / 1e3
            int8_ms = None
            if int8 is not None:  # it quantizes fp32 images itself
                images = torch.randn(batch, 3, 224, 224, device="cuda")
                int8_ms = time_cuda(cuda_graph(partial(int8, images)), repeats, flush) / 1e3
        results.append(EndToEnd(batch, bits, _dtype_name(dtype), *eager.values(), *graph.values(),
                                int8_ms, differ))  # fmt: skip
    return results


def format_end_to_end(results: list[EndToEnd]) -> str:
    """The end-to-end table: eager and CUDA-graph milliseconds, speed-ups over the float
    graph, and the integer model's logits against its reference."""
    head = (
        f"{'ResNet-18 224x224':<18}{'batch':>6}{'bits':>5}{'dtype':>6}"
        f"{'float eager':>13}{'inq eager':>11}{'float graph':>13}{'inq graph':>11}{'speedup':>9}"
        f"{'int8 graph':>12}{'speedup':>9}  int8 logits vs reference"
    )
    rows = []
    for r in results:
        int8 = ("" if r.int8_graph_ms is None else
                f"{r.int8_graph_ms:>12.3f}{r.float_graph_ms / r.int8_graph_ms:>8.2f}x  "
                f"{r.int8_logits_differ} of 2000 differ")  # fmt: skip
        rows.append(
            f"{'end to end (ms)':<18}{r.batch:>6}{r.bits:>5}{r.dtype:>6}"
            f"{r.float_eager_ms:>13.3f}{r.inq_eager_ms:>11.3f}{r.float_graph_ms:>13.3f}"
            f"{r.inq_graph_ms:>11.3f}{r.float_graph_ms / r.inq_graph_ms:>8.2f}x{int8}"
        )
    return _table(head, rows)


def _result(
    op: str,
    name: str,
    batch: int,
    bits: int,
    dtype: torch.dtype,
    ours: float,
    base: float,
    moved: int,
    copy: float,
) -> BenchResult:
    gbps = moved / ours / 1e3
    return BenchResult(
        op, name, batch, bits, _dtype_name(dtype), ours, base, base / ours, moved, gbps, gbps / copy
    )


def format_table(results: list[BenchResult]) -> str:
    head = (
        f"{'op':<7}{'shape/layer':<22}{'batch':>6}{'bits':>5}{'dtype':>6}{'inq us':>10}"
        f"{'base us':>10}{'speedup':>9}{'GB/s':>9}{'% copy':>8}"
    )
    rows = [
        f"{r.op:<7}{r.name:<22}{r.batch:>6}{r.bits:>5}{r.dtype:>6}{r.time_us:>10.1f}"
        f"{r.baseline_us:>10.1f}{r.speedup:>8.2f}x{r.gbps:>9.0f}{100 * r.copy_fraction:>7.0f}%"
        for r in results
    ]
    return _table(head, rows)


def _table(head: str, rows: list[str]) -> str:
    return "\n".join([head, "-" * len(head), *rows])


def _dtype_name(dtype: torch.dtype) -> str:
    return next(name for name, value in _DTYPES.items() if value == dtype)


def _network_totals(results: list[BenchResult]) -> str:
    lines = []
    for batch in sorted({r.batch for r in results if r.op == "conv2d"}):
        rows = [r for r in results if r.op == "conv2d" and r.batch == batch]
        for bits in sorted({r.bits for r in rows}):
            sel = [r for r in rows if r.bits == bits]
            ours, base = sum(r.time_us for r in sel), sum(r.baseline_us for r in sel)
            lines.append(
                f"ResNet-18 convs, batch {batch}, {bits} bits: inq {ours:.0f} us, "
                f"cuDNN {base:.0f} us, speedup {base / ours:.2f}x"
            )
    return "\n".join(lines)


def add_bench_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments of ``inq bench kernel`` (the ``kernel`` target of ``inq bench``).

    Example:
        >>> parser = argparse.ArgumentParser(prog="inq bench kernel")
        >>> add_bench_arguments(parser)
        >>> args = parser.parse_args(["--static", "--bits", "4"])
        >>> args.static, args.bits, args.conv_batches
        (True, [4], [1, 32])
    """
    parser.add_argument("--bits", type=int, nargs="+", default=[4, 8], help="code bits")
    parser.add_argument("--dtype", choices=sorted(_DTYPES), default="fp16")
    parser.add_argument("--batches", type=int, nargs="+", default=LINEAR_BATCHES)
    parser.add_argument("--conv-batches", type=int, nargs="+", default=CONV_BATCHES)
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--skip-conv", action="store_true", help="linear shapes only")
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument(
        "--static",
        action="store_true",
        help="no GPU: compile every kernel variant for sm_90, check its SASS, print a roofline",
    )
    parser.add_argument("--jobs", type=int, help="--static: compile processes (default: CPUs)")
    parser.add_argument(
        "--calibration",
        type=Path,
        nargs="+",
        default=[],
        metavar="FILE",
        help="--static: also compare the time model with these measured records "
        "(experiments/gpu/model_*.json)",
    )


def run_static(args: argparse.Namespace) -> int:
    """``inq bench kernel --static``: the sm_90 compile table and the roofline; exit status 1
    if a variant fails a check (spills, budget, missing wide loads or tensor-core MMA)."""
    start = time.perf_counter()

    def compiled(done: int, total: int, result: static.CompiledVariant) -> None:
        verdict = "FAIL" if result.problems else "ok"
        print(f"[{done}/{total}, {time.perf_counter() - start:.0f} s] sm_90 {result.variant.name} "
              f"{result.variant.dtype}: {verdict}", file=sys.stderr, flush=True)  # fmt: skip

    try:
        calibrations = {path: model.load_calibration(path) for path in args.calibration}
    except (OSError, ValueError) as err:
        print(f"inq bench kernel --static: {err}", file=sys.stderr)
        return 1
    try:
        results = static.static_check(args.jobs, compiled)
    except (ImportError, RuntimeError, OSError) as err:
        print(f"inq bench kernel --static: cannot compile the kernels: {err}", file=sys.stderr)
        return 1
    rows = static.roofline(args.bits)
    grids = static.imma_grids()
    figures = static.figures(results)
    estimates = {device.name: model.estimate_linear(figures, args.bits, device)
                 for device in (model.H200, model.H100)}  # fmt: skip
    checks = {path: model.calibrate(data) for path, data in calibrations.items()}
    print(static.format_static(results))
    print()
    print(static.format_grids(grids))
    for device in (model.H200, model.H100):
        print()
        print(model.format_estimates(estimates[device.name], device))
    for path, found in checks.items():
        print()
        print(model.format_calibration(found, str(path)))
    print()
    print(static.format_roofline(rows))
    failed = [r for r in results if r.problems] + [g for g in grids if g.problem]
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        payload = {
            "variants": [r.record() for r in results],  # one per variant, comparable across commits
            "estimates": [e.record() for rows in estimates.values() for e in rows],
            "calibration": {str(path): [asdict(c) | {"error": c.error} for c in found]
                            for path, found in checks.items()},
        }  # fmt: skip
        with atomic_path(args.json) as tmp:
            tmp.write_text(json.dumps(payload, indent=2) + "\n")
        print(f"wrote {args.json}")
    if failed:
        print(f"inq bench kernel --static: {len(failed)} variant(s) or grid(s) failed",
              file=sys.stderr)  # fmt: skip
        return 1
    return 0


def run_bench(args: argparse.Namespace, integer: IntegerFactory | None = None) -> int:
    """Time the ops and print the tables (``--static``: :func:`run_static`), with ``integer``
    the integer model end to end too; exit status 0, or 1 (one line on stderr) where no GPU is
    visible or an integer logit differs from its reference.

    Example::

        parser = argparse.ArgumentParser(prog="inq bench kernel")
        add_bench_arguments(parser)
        run_bench(parser.parse_args(["--bits", "4", "--skip-conv"]))  # linear only
    """
    if args.static:
        return run_static(args)
    if not torch.cuda.is_available():
        print(
            "inq bench kernel: needs a CUDA GPU, and none is visible; nothing was timed",
            file=sys.stderr,
        )
        return 1
    dtype = _DTYPES[args.dtype]
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    flush = torch.empty(2 * max(l2, 1 << 20), dtype=torch.uint8, device="cuda")
    copy = copy_bandwidth(flush, args.repeats)
    device = torch.cuda.get_device_name(0)
    print(f"{device}: device-to-device copy {copy:.0f} GB/s, L2 {l2 >> 20} MiB")
    results: list[BenchResult] = []
    end_to_end: list[EndToEnd] = []
    for bits in args.bits:
        results += bench_linear(bits, dtype, args.batches, args.repeats, flush, copy)
        if not args.skip_conv:
            results += bench_resnet18(bits, dtype, args.conv_batches, args.repeats, flush, copy)
            end_to_end += bench_end_to_end(bits, dtype, args.conv_batches, args.repeats, flush,
                                           integer)  # fmt: skip
    print(format_table(results))
    if not args.skip_conv:
        print(_network_totals(results))
        print(format_end_to_end(end_to_end))
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        payload = {
            "device": device,
            "copy_gbps": copy,
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
            "results": [asdict(r) for r in results],
            "end_to_end": [asdict(r) for r in end_to_end],
        }
        with atomic_path(args.json) as tmp:
            tmp.write_text(json.dumps(payload, indent=2) + "\n")
        print(f"wrote {args.json}")
    if any(r.int8_logits_differ for r in end_to_end):
        print("inq bench kernel: integer logits on CUDA differ from the reference", file=sys.stderr)
        return 1
    return 0
