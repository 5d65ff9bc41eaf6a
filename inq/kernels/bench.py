"""``inq bench kernel``: the Triton ops against cuBLAS (``F.linear``) and cuDNN (``F.conv2d``).

``--static`` needs no GPU: it compiles every kernel variant for sm_90 and checks its SASS, then
prints a roofline of the benchmark shapes (:mod:`inq.kernels.static`).

Every op is timed three ways, each a median:

- ``time_us``, the figure of the goals and of ``speedup``: one call after a *clean* flush of
  the L2 cache, a read-only sweep over twice its size. It leaves the cache holding clean lines
  only (the write-back of lines dirtied before happens during the sweep), so the call's misses
  evict without writing back, and its weights come from HBM as in real inference.
  ``--repeats`` runs.
- ``time_dirty_us``: the harness up to issue 47, one call after a *write* of twice the L2 size.
  That leaves the cache full of dirty lines, whose write-back to HBM lands inside the timed
  call (perhaps the roughly fixed 10-12 us in every op at batch 1-16 of the H200 records of
  issue 31). Kept so that those records can be read against the clean figures.
  ``--extra-repeats`` runs.
- ``time_graph_us``: per call, with at least :data:`GRAPH_CALLS` calls back to back in one CUDA
  graph, no flush between them, rotating over copies of the op's inputs that together span
  twice the L2 cache (:func:`rotation_copies`), as inference runs layer after layer.
  ``--extra-repeats`` replays.

A short spin kernel queued before each timed run keeps the GPU busy while Python launches it,
so the figures are GPU time, not host launch overhead; 50 ms of flushes before each op's
timings bring the clocks up after a pause. Each harness's floor, a one-element
``add_`` and device-to-device copies of 8, 32 and 128 MiB, is printed first. Linear and
convolution rows also time, with the clean flush, every tiling the dispatcher offers for the
call (:func:`inq.kernels.triton.swar.swar_config`,
:func:`inq.kernels.triton.conv_mma.conv_mma_grids`) and name the one it picked. Baselines use the
same weights decoded to fp16/bf16; cuDNN runs channels_last. The device-to-device copy
bandwidth measured in the same run is the roofline: effective GB/s of an op counts the bytes it
must move (packed codes, activations, bias, output) over its clean-flush time.

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
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from inq.codes import decode_weight, pack_codes
from inq.fileio import atomic_path
from inq.kernels import model, static
from inq.kernels.layout import cached_kernel_weight
from inq.kernels.shapes import CONV_BATCHES, LINEAR_BATCHES, LINEAR_SHAPES, resnet18_convs
from inq.pow2 import pow2_encode, pow2_n1, pow2_quantize

__all__ = [
    "BENCH_HELP",
    "GRAPH_CALLS",
    "MAX_COPIES",
    "BenchResult",
    "EndToEnd",
    "Floor",
    "Harness",
    "IntegerFactory",
    "OpLayer",
    "OpTime",
    "Tiling",
    "Timings",
    "add_bench_arguments",
    "bound",
    "format_int8_ops",
    "int8_gemm_shape",
    "integer_op_times",
    "rotation_copies",
    "run_bench",
    "time_cuda",
    "time_graph",
]

BENCH_HELP = (
    "time the Triton kernels against cuBLAS and cuDNN (GPU), or check them for sm_90 "
    "without one (--static): inq bench kernel [--static]"
)

_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
GRAPH_CALLS = 16  # calls per graph replay, at least: they share the replay's own start
MAX_COPIES = 64  # rotation copies at most: each a launch per replay and, for inq ops, a layout
FLOOR_COPY_MIB = (8, 32, 128)

Op = Callable[[], object]


@dataclass
class Tiling:
    """One tiling the linear dispatcher offers for a call
    (:class:`inq.kernels.triton.swar.SwarConfig`), timed alone with the clean flush."""

    kernel: str  # "mma" or "gemv"
    block_m: int
    block_n: int
    split_k: int
    num_warps: int
    num_stages: int
    time_us: float


@dataclass
class BenchResult:
    """One row of the tables and of the JSON file. ``time_us`` and ``baseline_us`` (single
    calls after a clean flush) are the figures the goals and ``speedup`` refer to; the module
    docstring says what the dirty and graph figures measure."""

    op: str  # "linear" or "conv2d"
    name: str  # shape, or the ResNet-18 layer
    batch: int
    bits: int
    dtype: str
    time_us: float  # inq op, clean flush, median
    baseline_us: float  # cuBLAS / cuDNN on the decoded weight, clean flush, median
    speedup: float  # baseline_us / time_us
    bytes_moved: int  # codes + activations + bias + output, each once
    gbps: float  # bytes_moved / time_us
    copy_fraction: float  # gbps / device-to-device copy bandwidth
    time_dirty_us: float  # inq op, dirty flush (the harness up to issue 47)
    baseline_dirty_us: float
    time_graph_us: float  # inq op, per call back to back in a CUDA graph
    baseline_graph_us: float
    graph_copies: int  # copies of the inputs both graphs rotate over
    tilings: list[Tiling] = field(default_factory=list)  # on the tensor-core kernels only
    chosen: int | None = None  # the index in tilings the dispatcher runs
    launch: dict[str, Any] | None = None  # conv2d: the launch made (model.ConvTiling's fields)


@dataclass
class Timings:
    """One op's median microseconds under the three harnesses (see the module docstring)."""

    clean_us: float
    dirty_us: float
    graph_us: float


@dataclass
class Floor:
    """A harness's fixed cost: a trivial kernel or a device-to-device copy, timed each way."""

    case: str
    bytes_moved: int  # read + written
    time_us: float  # clean flush
    time_dirty_us: float
    time_graph_us: float


_LEAD_CYCLES = 2_000_000  # about 1 ms of spinning: longer than any launch from Python
# GPU seconds of flushes before each op is timed: after a pause (a kernel's compilation, the
# host building the next case) the clocks start low and ramp up; on the issue-47 H200 run the
# first case of each shape (batch 1) ran the same launch up to 52 % slower than batch 16
_WARM_S = 0.05


def _warm_clocks(flush: Op) -> None:
    """Keep the GPU busy with ``flush`` for :data:`_WARM_S` seconds, so that the timed calls
    find its clocks up."""
    end = time.perf_counter() + _WARM_S
    while time.perf_counter() < end:
        flush()
        torch.cuda.synchronize()


def time_cuda(fn: Op, repeats: int, flush: Op) -> float:
    """Median GPU microseconds of ``fn`` over ``repeats`` runs, ``flush`` run before each.

    Example::

        harness = Harness.for_device(repeats=50, extra_repeats=10)
        us = time_cuda(partial(F.linear, x, weight), 50, harness.clean_flush)
    """
    for _ in range(3):  # warm-up: kernel build and load, cuBLAS heuristics, allocator
        fn()
    _warm_clocks(flush)
    times = []
    for _ in range(repeats):
        flush()
        torch.cuda._sleep(_LEAD_CYCLES)  # the GPU waits for no launch inside the timed region
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000.0)
    return statistics.median(times)


def time_graph(
    make: Callable[[int], Op], copies: int, repeats: int, flush: Op, calls: int = GRAPH_CALLS
) -> float:
    """Median GPU microseconds per call of an op run back to back in one CUDA graph: whole
    rounds over the ``copies`` ops ``make(i)`` (each on its own copy of the inputs), at least
    ``calls`` calls, ``flush`` before each of ``repeats`` replays.

    Example::

        weights = [torch.randn(4096, 4096, device="cuda", dtype=torch.float16) for _ in range(4)]
        us = time_graph(lambda i: partial(F.linear, x, weights[i]), 4, 10, harness.clean_flush)
    """
    sequence = [make(i) for i in range(copies)] * -(-calls // copies)

    def run() -> None:
        for op in sequence:
            op()

    return time_cuda(cuda_graph(run), repeats, flush) / len(sequence)


def rotation_copies(l2_bytes: int, copy_bytes: int) -> int:
    """How many copies of an op's inputs (``copy_bytes`` each) a back-to-back graph rotates
    over, so that each call finds its inputs in HBM: enough to sweep twice the L2 cache before
    one comes round again, at least 2, at most :data:`MAX_COPIES` (smaller ops then sweep less
    than that, and part of their data comes from L2). They hold less than twice the L2 size
    plus one copy, or two copies.

    Example:
        >>> rotation_copies(60 << 20, 8 << 20)  # an H200; a 4096x4096 4-bit weight
        15
        >>> rotation_copies(60 << 20, 300 << 20), rotation_copies(60 << 20, 4)
        (2, 64)
    """
    return max(2, min(MAX_COPIES, -(-2 * l2_bytes // max(copy_bytes, 1))))


def bound(fn: Callable[..., object], *args: object) -> Callable[..., Op]:
    """A factory of calls of ``fn``: given tensors, the call ``fn(*tensors, *args)``; how
    :meth:`Harness.time` builds an op on each copy of its inputs.

    Example:
        >>> call = bound(torch.add, 1)(torch.tensor([2]))
        >>> call()
        tensor([3])
    """
    return lambda *tensors: partial(fn, *tensors, *args)


@dataclass(frozen=True, eq=False)  # a tensor field: compared by identity
class Harness:
    """The three ways :func:`run_bench` times an op, on a flush buffer of twice the L2 size:
    ``repeats`` runs for the clean flush (the goals' figure), ``extra_repeats`` for the others.

    Example::

        harness = Harness.for_device(repeats=50, extra_repeats=10)
        x, weight = ...  # CUDA tensors
        t = harness.time(bound(F.linear), (x, weight), harness.copies(x, weight))
        t.clean_us, t.dirty_us, t.graph_us
    """

    flush: Tensor  # uint8
    repeats: int
    extra_repeats: int

    @classmethod
    def for_device(cls, repeats: int, extra_repeats: int) -> Harness:
        l2 = torch.cuda.get_device_properties(0).L2_cache_size
        flush = torch.zeros(2 * max(l2, 1 << 20), dtype=torch.uint8, device="cuda")
        return cls(flush, repeats, extra_repeats)

    @property
    def l2_bytes(self) -> int:
        return self.flush.numel() // 2

    def clean_flush(self) -> None:
        """Read the buffer: L2 ends up holding its lines, all clean, and the lines left dirty
        by what ran before are written back during the sweep, before the timed region."""
        # float32: a sum keeps it in place (an integer one would first write an int64 copy)
        self.flush.view(torch.float32).sum()

    def dirty_flush(self) -> None:
        """Write the buffer (the harness up to issue 47): L2 ends up full of dirty lines."""
        self.flush.zero_()

    def copies(self, *inputs: Tensor) -> int:
        """:func:`rotation_copies` for an op on ``inputs``."""
        return rotation_copies(self.l2_bytes, sum(t.nbytes for t in inputs))

    def time(self, build: Callable[..., Op], inputs: tuple[Tensor, ...], copies: int) -> Timings:
        """``build(*inputs)`` under the three harnesses; the graph's calls rotate over
        ``copies`` ops, each built on its own clones of ``inputs`` (the first on them)."""

        def make(i: int) -> Op:
            return build(*(t if i == 0 else t.clone() for t in inputs))

        op = build(*inputs)
        return Timings(
            time_cuda(op, self.repeats, self.clean_flush),
            time_cuda(op, self.extra_repeats, self.dirty_flush),
            time_graph(make, copies, self.extra_repeats, self.clean_flush),
        )


def harness_floor(harness: Harness) -> list[Floor]:
    """What each harness times for a one-element ``add_`` and for device-to-device copies of
    :data:`FLOOR_COPY_MIB` MiB: the fixed cost under every figure it gives."""
    one = torch.zeros(1, device="cuda")
    cases: list[tuple[str, int, Callable[..., Op], tuple[Tensor, ...]]] = [
        ("add_, one element", 2 * one.nbytes, bound(Tensor.add_, 1), (one,))
    ]
    for mib in FLOOR_COPY_MIB:
        src = torch.empty(mib << 20, dtype=torch.uint8, device="cuda")
        dst = torch.empty_like(src)
        cases.append((f"copy {mib} MiB", 2 * src.nbytes, bound(Tensor.copy_), (dst, src)))
    floor = []
    for case, moved, build, inputs in cases:
        t = harness.time(build, inputs, harness.copies(*inputs))
        floor.append(Floor(case, moved, t.clean_us, t.dirty_us, t.graph_us))
    return floor


def copy_bandwidth(harness: Harness) -> float:
    """Device-to-device copy bandwidth in GB/s (read + write), on 1 GiB, clean flush."""
    src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    us = time_cuda(partial(dst.copy_, src), harness.repeats, harness.clean_flush)
    return 2 * src.numel() / us / 1e3


def quantized(weight: Tensor, bits: int) -> tuple[Tensor, int]:
    """Packed codes and n1 of a float weight, power-of-two quantized."""
    n1 = pow2_n1(weight)
    codes = pow2_encode(pow2_quantize(weight, n1, bits), n1, bits)
    return pack_codes(codes, bits), n1


def linear_tilings(
    x: Tensor, packed: Tensor, bits: int, n1: int, harness: Harness
) -> tuple[list[Tiling], int | None]:
    """Every tiling the dispatcher offers for ``inq::shift_linear`` on ``x`` (2-d) and
    ``packed``, each timed alone with the clean flush on the op's own cached kernel layout, and
    the index of the one it runs; ``([], None)`` where the generic kernels run."""
    from inq.kernels.triton import swar
    from inq.kernels.triton.decode import sm_count

    in_f = x.shape[1]
    torch.ops.inq.shift_linear(x, packed, bits, n1, in_f, None)  # makes the layout, picks
    layout = cached_kernel_weight(packed, bits, n1, in_f, x.dtype)
    if layout is None:  # the generic kernels
        return [], None
    options, chosen = swar.offered(x, layout, sm_count(x.device))
    out = x.new_empty(x.shape[0], layout.words.shape[0])
    tilings = []
    for cfg in options:
        run = partial(swar.launch, x, layout, None, out, cfg)
        us = time_cuda(run, harness.extra_repeats, harness.clean_flush)
        tilings.append(Tiling(cfg.kernel, cfg.block_m, cfg.block_n, cfg.split_k,
                              cfg.num_warps, cfg.num_stages, us))  # fmt: skip
    return tilings, chosen


def bench_linear(
    bits: int, dtype: torch.dtype, batches: list[int], harness: Harness, copy: float
) -> list[BenchResult]:
    results = []
    for out_f, in_f in LINEAR_SHAPES:
        packed, n1 = quantized(torch.randn(out_f, in_f, device="cuda") * 0.02, bits)
        weight = decode_weight(packed, bits, n1, (out_f, in_f), dtype)
        op = bound(torch.ops.inq.shift_linear, bits, n1, in_f, None)
        for batch in batches:
            x = torch.randn(batch, in_f, device="cuda", dtype=dtype)
            tilings, chosen = linear_tilings(x, packed, bits, n1, harness)
            copies = harness.copies(x, packed)  # the fp16 weight's copies are larger
            ours = harness.time(op, (x, packed), copies)
            base = harness.time(bound(F.linear), (x, weight), copies)
            moved = packed.numel() + (x.numel() + batch * out_f) * x.element_size()
            results.append(_result("linear", f"{out_f}x{in_f}", batch, bits, dtype, ours, base,
                                   moved, copy, copies, tilings, chosen))  # fmt: skip
    return results


def bench_resnet18(
    bits: int, dtype: torch.dtype, batches: list[int], harness: Harness, copy: float
) -> list[BenchResult]:
    from inq.kernels.triton.decode import sm_count

    results = []
    for batch in batches:
        for name, conv, shape, out_shape in resnet18_convs(batch):
            packed, n1 = quantized(conv.weight.detach().cuda(), bits)
            wshape = list(conv.weight.shape)
            weight = decode_weight(packed, bits, n1, tuple(wshape), dtype)
            weight_cl = weight.to(memory_format=torch.channels_last)
            x = torch.randn(shape, device="cuda", dtype=dtype)
            x_cl = x.to(memory_format=torch.channels_last)  # clones keep the memory format
            args = _geometry(conv)
            copies = harness.copies(x_cl, packed)
            op = bound(torch.ops.inq.shift_conv2d, bits, n1, wshape, None, *args)
            ours = harness.time(op, (x_cl, packed), copies)
            base = harness.time(bound(F.conv2d, None, *args), (x_cl, weight_cl), copies)
            moved = packed.numel() + (x.numel() + math.prod(out_shape)) * x.element_size()
            tilings, chosen = conv_tilings(x_cl, packed, bits, n1, conv, harness)
            result = _result("conv2d", name, batch, bits, dtype, ours, base, moved, copy, copies,
                             tilings, chosen)  # fmt: skip
            case = model.ConvCase(shape, tuple(wshape), out_shape)
            offered = model.conv_tilings(case, bits, sm_count(x.device))
            result.launch = asdict(offered[chosen or 0])
            results.append(result)
    return results


def conv_tilings(
    x: Tensor, packed: Tensor, bits: int, n1: int, conv: nn.Conv2d, harness: Harness
) -> tuple[list[Tiling], int | None]:
    """Every launch the tensor-core convolution offers for ``inq::shift_conv2d`` on ``x`` and
    ``packed`` (the geometry of ``conv``), each timed alone with the clean flush, and the index
    of the one it runs; ``([], None)`` where another kernel runs."""
    from inq.kernels.triton import conv_mma as cm

    wshape = list(conv.weight.shape)
    stride, padding, dilation, groups = geometry = _geometry(conv)
    out = torch.ops.inq.shift_conv2d(x, packed, bits, n1, wshape, None, *geometry)  # picks
    layout = cm.conv_layout(packed, bits, n1, wshape, x.dtype)
    if groups != 1 or not cm.conv_mma_fits(wshape[1], bits) or layout is None:
        return [], None
    grids, chosen = cm.offered_grids(x, layout, wshape, stride, padding, dilation, out)
    tilings = []
    for grid in grids:
        run = partial(cm.launch_grid, x, layout, wshape, None, stride, padding, dilation, out,
                      grid)  # fmt: skip
        us = time_cuda(run, harness.extra_repeats, harness.clean_flush)
        tilings.append(Tiling("conv mma", grid.block_m, grid.block_n, grid.split, grid.warps,
                              3, us))  # fmt: skip
    return tilings, chosen


def _geometry(conv: nn.Conv2d) -> tuple[list[int], list[int], list[int], int]:
    """Stride, padding, dilation and groups of ``conv`` as ``inq::shift_conv2d`` takes them."""
    return list(conv.stride), list(conv.padding), list(conv.dilation), conv.groups


@dataclass
class OpTime:
    """One op of the integer model timed alone (GPU microseconds, clean flush), and for a conv
    or linear op the int8 product of its shape on cuBLASLt (:func:`int8_gemm_shape`)."""

    name: str
    op: str
    time_us: float
    gemm: tuple[int, int, int] | None = None  # (M, K, N) timed on cuBLASLt, padded
    cublaslt_us: float | None = None  # torch._int_mm on that shape, clean flush


def int8_gemm_shape(op: Any, out: Tensor) -> tuple[int, int, int] | None:
    """``(M, K, N)`` of the int8 product a conv or linear op of the integer model computes (its
    output ``out``), padded to what ``torch._int_mm`` takes on CUDA (M > 16: at least 32; K and
    N multiples of 8); ``None`` for other ops and grouped convolutions. A conv is its implicit
    GEMM: a row per output pixel, a column per output channel, ``K`` its taps' channels.

    Example:
        >>> from types import SimpleNamespace
        >>> conv1 = SimpleNamespace(op="conv", attrs={"weight_shape": [64, 3, 7, 7], "groups": 1})
        >>> int8_gemm_shape(conv1, torch.empty(1, 64, 112, 112))  # K: 147 padded to 152
        (12544, 152, 64)
        >>> fc = SimpleNamespace(op="linear", attrs={"in_features": 512})
        >>> int8_gemm_shape(fc, torch.empty(1, 1000))  # one row padded to 32
        (32, 512, 1000)
    """
    a = op.attrs
    if op.op == "conv" and a["groups"] == 1:
        out_c, in_c, kh, kw = a["weight_shape"]
        m, k, n = out.shape[0] * out.shape[2] * out.shape[3], in_c * kh * kw, out_c
    elif op.op == "linear":
        m, k, n = out.shape[0], a["in_features"], out.shape[1]
    else:
        return None
    return max(m, 32), -(-k // 8) * 8, -(-n // 8) * 8


def _time_int_mm(shape: tuple[int, int, int], device: torch.device, harness: Harness) -> float:
    """``torch._int_mm`` (cuBLASLt's int8 GEMM, int32 out) of ``shape``, the weights ``(N, K)``
    row-major as the kernels keep them (the "TN" form int8 GEMMs run fastest in)."""
    m, k, n = shape
    a = torch.randint(-128, 128, (m, k), dtype=torch.int8, device=device)
    b = torch.randint(-128, 128, (n, k), dtype=torch.int8, device=device).t()
    return time_cuda(partial(torch._int_mm, a, b), harness.extra_repeats, harness.clean_flush)


@dataclass
class EndToEnd:
    """ResNet-18 forward, converted (inq ops) vs float (cuDNN), same weights."""

    batch: int
    bits: int
    dtype: str
    float_eager_ms: float  # host latency of one forward, median (Python launch overhead in)
    inq_eager_ms: float
    float_graph_ms: float  # GPU time of one CUDA-graph replay, median (clean flush before)
    inq_graph_ms: float
    int8_graph_ms: float | None = None  # the integer model (int8 activations), as a graph
    int8_logits_differ: int | None = None  # of its int32 logits, vs the CPU reference
    int8_ops: list[OpTime] = field(default_factory=list)  # each op of the integer model alone


# (quantized float model, bits) -> (its integer model on CUDA, the same on the CPU): made
# above the kernels (inq.quant), handed in by the CLI
IntegerFactory = Callable[[nn.Module, int], tuple[nn.Module, nn.Module]]


def integer_op_times(model: Any, x: Tensor, harness: Harness) -> list[OpTime]:
    """Each op of the integer model ``model`` (an ``inq.quant.integer.IntegerModel``: its
    ``schedule``, ``run`` and ``step``) as its forward runs them (a residual add with its
    convolution: op ``"conv+add"``, named as the add), timed alone on ``x`` after a clean flush,
    its inputs the values one whole run computed: what each layer costs, to add up against the
    graph; beside each conv and linear op, cuBLASLt's int8 GEMM of its shape (no im2col, no
    requantization: what the vendor's int8 tensor-core product of the same MACs takes)."""
    times = []
    with torch.inference_mode():
        values = model.run(x)
        for op, conv in model.schedule():
            alone = time_cuda(partial(model.step, op, values, x, conv), harness.extra_repeats,
                              harness.clean_flush)  # fmt: skip
            product = op if conv is None else conv[0]
            gemm = int8_gemm_shape(product, values[product.name])
            reference = None if gemm is None else _time_int_mm(gemm, x.device, harness)
            kind = op.op if conv is None else "conv+add"
            times.append(OpTime(op.name, kind, alone, gemm, reference))
    return times


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
    harness: Harness,
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
                eager[name] = time_host(run, harness.repeats)
                graph[name] = time_cuda(cuda_graph(run), harness.repeats, harness.clean_flush) / 1e3
            int8_ms, ops = None, []
            if int8 is not None:  # it quantizes fp32 images itself
                images = torch.randn(batch, 3, 224, 224, device="cuda")
                replay = cuda_graph(partial(int8, images))
                int8_ms = time_cuda(replay, harness.repeats, harness.clean_flush) / 1e3
                ops = integer_op_times(int8, images, harness)
        results.append(EndToEnd(batch, bits, _dtype_name(dtype), *eager.values(), *graph.values(),
                                int8_ms, differ, ops))  # fmt: skip
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


def format_int8_ops(results: list[EndToEnd]) -> str:
    """The integer model op by op (each timed alone; beside a conv or linear op, cuBLASLt's
    int8 GEMM of its shape and our speed-up over it), and their sum against the graph."""
    rows = []
    for r in results:
        for t in r.int8_ops:
            ref = ("" if t.cublaslt_us is None else
                   f"{t.cublaslt_us:>11.1f}{t.cublaslt_us / t.time_us:>8.2f}x  "
                   f"{'x'.join(map(str, t.gemm or ()))}")  # fmt: skip
            rows.append(f"{'int8 op (us)':<14}{r.batch:>6}{r.bits:>5}  {t.name:<28}{t.op:<10}"
                        f"{t.time_us:>9.1f}{ref}")  # fmt: skip
        if r.int8_ops and r.int8_graph_ms is not None:
            total, graph = sum(t.time_us for t in r.int8_ops), 1e3 * r.int8_graph_ms
            rows.append(f"{'int8 ops, sum':<14}{r.batch:>6}{r.bits:>5}  {len(r.int8_ops)} ops "
                        f"{total:.1f} us alone, {graph:.1f} us as one graph")  # fmt: skip
    head = (f"{'integer model':<14}{'batch':>6}{'bits':>5}  {'op':<28}{'kind':<10}{'us':>9}"
            f"{'cuBLASLt':>11}{'speedup':>9}  int8 GEMM MxKxN (padded)")  # fmt: skip
    return _table(head, rows) if rows else ""


def _result(
    op: str,
    name: str,
    batch: int,
    bits: int,
    dtype: torch.dtype,
    ours: Timings,
    base: Timings,
    moved: int,
    copy: float,
    copies: int,
    tilings: list[Tiling] | None = None,
    chosen: int | None = None,
) -> BenchResult:
    gbps = moved / ours.clean_us / 1e3
    return BenchResult(
        op, name, batch, bits, _dtype_name(dtype), ours.clean_us, base.clean_us,
        base.clean_us / ours.clean_us, moved, gbps, gbps / copy, ours.dirty_us, base.dirty_us,
        ours.graph_us, base.graph_us, copies, tilings or [], chosen,
    )  # fmt: skip


def format_table(results: list[BenchResult]) -> str:
    """The per-op table: microseconds of the inq op and of the baseline after a clean flush,
    after a dirty one and back to back in a graph; speed-up, GB/s and % of copy bandwidth from
    the clean figures; each tiling of a linear op, the one the dispatcher runs starred.

    Example:
        >>> t = Timings(clean_us=20.0, dirty_us=30.0, graph_us=10.0)
        >>> row = _result("linear", "4096x4096", 1, 4, torch.float16, t, t, 8 << 20, 2000.0, 15,
        ...               [Tiling("mma", 16, 128, 5, 4, 4, 20.0)], 0)
        >>> print(format_table([row]).splitlines()[-1])
        linear 4096x4096                  1    4  fp16     20.0    30.0    10.0     20.0    30.0    10.0    1.00x    419     21%  20.0*
    """  # noqa: E501
    head = (
        f"{'op':<7}{'shape/layer':<22}{'batch':>6}{'bits':>5}{'dtype':>6}"
        f"{'inq us':>9}{'dirty':>8}{'graph':>8}{'base us':>9}{'dirty':>8}{'graph':>8}"
        f"{'speedup':>9}{'GB/s':>7}{'% copy':>8}  tilings us (* chosen)"
    )
    rows = [
        f"{r.op:<7}{r.name:<22}{r.batch:>6}{r.bits:>5}{r.dtype:>6}"
        f"{r.time_us:>9.1f}{r.time_dirty_us:>8.1f}{r.time_graph_us:>8.1f}"
        f"{r.baseline_us:>9.1f}{r.baseline_dirty_us:>8.1f}{r.baseline_graph_us:>8.1f}"
        f"{r.speedup:>8.2f}x{r.gbps:>7.0f}{100 * r.copy_fraction:>7.0f}%  "
        + " ".join(f"{t.time_us:.1f}{'*' * (i == r.chosen)}" for i, t in enumerate(r.tilings))
        for r in results
    ]
    return _table(head, [row.rstrip() for row in rows])


def format_floor(floor: list[Floor]) -> str:
    """The harness floor: microseconds of each case under each harness.

    Example:
        >>> print(format_floor([Floor("add_, one element", 8, 4.0, 9.5, 1.5)]))
        harness floor        clean us  dirty us  graph us
        -------------------------------------------------
        add_, one element         4.0       9.5       1.5
    """
    head = f"{'harness floor':<19}{'clean us':>10}{'dirty us':>10}{'graph us':>10}"
    rows = [
        f"{f.case:<19}{f.time_us:>10.1f}{f.time_dirty_us:>10.1f}{f.time_graph_us:>10.1f}"
        for f in floor
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
        >>> args.static, args.bits, args.network_bits, args.conv_batches, args.repeats
        (True, [4], [4, 5], [1, 32], 50)
    """
    parser.add_argument("--bits", type=int, nargs="+", default=[4, 8], help="code bits")
    parser.add_argument(
        "--network-bits",
        type=int,
        nargs="+",
        default=[4, 5],
        help="code bits of the ResNet-18 convolutions and end-to-end rows (GPU)",
    )
    parser.add_argument("--dtype", choices=sorted(_DTYPES), default="fp16")
    parser.add_argument("--batches", type=int, nargs="+", default=LINEAR_BATCHES)
    parser.add_argument("--conv-batches", type=int, nargs="+", default=CONV_BATCHES)
    parser.add_argument(
        "--repeats",
        type=_runs,
        default=50,
        help="runs per op after a clean flush: the goals' figure",
    )
    parser.add_argument(
        "--extra-repeats",
        type=_runs,
        default=10,
        help="runs per op after a dirty flush, CUDA-graph replays per op, runs per linear tiling",
    )
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


def _runs(text: str) -> int:
    """A count of timed runs: a whole number, at least 1."""
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is no count of runs (a whole number >= 1)")
    return int(text)


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
    convs = {device.name: model.estimate_convs(figures, args.bits, device)
             for device in (model.H200, model.H100)}  # fmt: skip
    checks = {path: model.calibrate(data) for path, data in calibrations.items()}
    print(static.format_static(results))
    print()
    print(static.format_grids(grids))
    for device in (model.H200, model.H100):
        print()
        print(model.format_estimates(estimates[device.name], device))
        print()
        print(model.format_conv_estimates(convs[device.name], device))
    for path, found in checks.items():
        print()
        print(model.format_calibration(found, str(path)))
    print()
    print(static.format_roofline(rows))
    table = [p for rows in estimates.values() for p in model.table_problems(rows)]
    print(f"tiling tables against the model: {'; '.join(table) or 'each default within 25 %'}")
    failed = [r for r in results if r.problems] + [g for g in grids if g.problem] + table
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        payload = {
            "variants": [r.record() for r in results],  # one per variant, comparable across commits
            "estimates": [e.record() for rows in estimates.values() for e in rows],
            "conv_estimates": [e.record() for rows in convs.values() for e in rows],
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
    harness = Harness.for_device(args.repeats, args.extra_repeats)
    copy = copy_bandwidth(harness)
    device = torch.cuda.get_device_name(0)
    print(f"{device}: device-to-device copy {copy:.0f} GB/s, L2 {harness.l2_bytes >> 20} MiB")
    floor = harness_floor(harness)
    print(format_floor(floor), flush=True)
    results: list[BenchResult] = []
    end_to_end: list[EndToEnd] = []
    for bits in args.bits:
        results += bench_linear(bits, dtype, args.batches, harness, copy)
    for bits in [] if args.skip_conv else args.network_bits:
        results += bench_resnet18(bits, dtype, args.conv_batches, harness, copy)
        end_to_end += bench_end_to_end(bits, dtype, args.conv_batches, harness, integer)
    print(format_table(results))
    if not args.skip_conv:
        print(_network_totals(results))
        print(format_end_to_end(end_to_end))
        print(format_int8_ops(end_to_end))
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        record = bench_record(device, copy, harness, floor, results, end_to_end)
        with atomic_path(args.json) as tmp:
            tmp.write_text(json.dumps(record, indent=2) + "\n")
        print(f"wrote {args.json}")
    if any(r.int8_logits_differ for r in end_to_end):
        print("inq bench kernel: integer logits on CUDA differ from the reference", file=sys.stderr)
        return 1
    return 0


def bench_record(
    device: str,
    copy: float,
    harness: Harness,
    floor: list[Floor],
    results: list[BenchResult],
    end_to_end: list[EndToEnd],
) -> dict[str, Any]:
    """What ``--json`` writes: the device and software, the harness (its settings and floor),
    a record per op (:class:`BenchResult`, tilings nested) and per end-to-end case."""
    return {
        "device": device,
        "copy_gbps": copy,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "harness": {
            "l2_bytes": harness.l2_bytes,
            "repeats": harness.repeats,
            "extra_repeats": harness.extra_repeats,
            "graph_calls": GRAPH_CALLS,
            "max_copies": MAX_COPIES,
            "floor": [asdict(f) for f in floor],
        },
        "results": [asdict(r) for r in results],
        "end_to_end": [asdict(r) for r in end_to_end],
    }
