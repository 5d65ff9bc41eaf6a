"""A static time model of the linear and convolution kernels and of the linear layers' cuBLAS
baseline, from SASS figures and the launch alone (``inq bench kernel --static``; no GPU).

For one benchmark case and one tiling (the GPU keeps the fastest the dispatcher offers, as
:func:`inq.kernels.triton.swar.choose` does, and so does the model) the time is the sum of:

- **the harness**: a fixed floor per timed call (event resolution, one kernel's start and
  drain: 3.5 us, a one-element ``add_`` on the issue-47 H200 run) and, under the dirty-flush
  harness, the write-back of the dirty L2 lines the kernel's reads displace (more DRAM
  traffic, never absorbed into constants);
- **the kernel** on its busiest SM: a prologue and an epilogue (a DRAM latency each) per round
  of CTAs it starts (occupancy from registers, shared memory and warps), its main loops, and
  the output tiles written at the copy bandwidth. The main loops take the larger of

  * *throughput*: what the SM's CTA-iterations take of its most used resource, added up:
    compute (tensor-core time plus instruction issue; each warp instruction holds its
    scheduler :attr:`Device.issue_cycles`, since decode loops are integer ops, whose pipe is
    half a warp wide, or :attr:`Device.dependent_cycles` shared by the scheduler's warps where
    they are too few to hide their dependences; decode and MMA take turns whatever the wgmma
    wait depth, as the issue-47 H200 run measured), the SM's share of the copy bandwidth for
    the codes (read from DRAM once for all the batch tiles that use them), or its share of L2
    bandwidth for codes and activation tiles (every weight-row tile reads the same
    activations, so they come from the L2);
  * *latency*: each CTA's iterations wait for their async-copy stages, which must cover the
    DRAM latency (Little's law: an iteration takes at least ``latency / (stages - 1)``);

  and the kernel takes at least its DRAM traffic at the copy bandwidth
  (:attr:`Device.copy_gbps`, what a device-to-device copy reaches);
- **split K**: the reduce kernel (a launch gap, a latency, partial sums in and the output out).

A convolution is the same sum for its implicit GEMM (:func:`predict_conv`): pixels by output
channels over the taps' channels, its activations gathered from the L2 a step at a time.
The dense baseline is the same model for a warp-specialized GEMM (MMA overlapped): its DRAM
traffic, or its waves of 128 x 128 tensor-core tiles, and a DRAM latency each side. Device
figures are data-sheet numbers, measurements or stated assumptions, the same for every shape;
:func:`calibrate` compares the model with the committed GPU records.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from inq.codes import code_width
from inq.kernels.layout import CHUNK_WORDS
from inq.kernels.shapes import LINEAR_BATCHES, LINEAR_SHAPES

__all__ = [
    "CLEAN",
    "DEVICES",
    "DIRTY",
    "H100",
    "H200",
    "HARNESSES",
    "Calibration",
    "Check",
    "ConvCase",
    "ConvEstimate",
    "ConvTiling",
    "Device",
    "Estimate",
    "Figures",
    "Harness",
    "Launch",
    "Prediction",
    "Tiling",
    "calibrate",
    "calibration_records",
    "conv_tiling",
    "conv_tilings",
    "device_name",
    "estimate_convs",
    "estimate_linear",
    "format_calibration",
    "format_conv_estimates",
    "format_estimates",
    "load_calibration",
    "predict",
    "predict_conv",
    "predict_dense",
    "predict_linear",
    "table_problems",
    "variant_name",
]

_MIB = 1 << 20


@dataclass(frozen=True)
class Device:
    """A GPU's figures for the model: data sheet, or stated assumptions (see each field)."""

    name: str
    dram_gbps: float  # HBM peak (data sheet)
    l2_bytes: int  # what torch reports as L2_cache_size
    copy_fraction: float = 0.886  # device-to-device copy / peak: 4255 of 4800 GB/s (H200, issue 32)
    sms: int = 132
    # the SM clock at which the data sheet's dense fp16 peak holds: 989 TFLOP/s = 132 SMs x
    # 4096 flops a clock x 1.83 GHz
    clock_ghz: float = 1.83
    mma_per_clock: int = 2048  # dense fp16 multiply-accumulates per SM per clock
    schedulers: int = 4  # warp schedulers per SM
    # scheduler cycles per warp instruction in a decode loop: the integer pipe is 16 lanes wide
    # per scheduler, so its instructions (most of a decode loop) issue every other clock
    issue_cycles: float = 2.0
    # cycles between one warp's instructions in a decode loop when it is alone on its
    # scheduler (dependences): Nsight Compute, the batch-1 linear kernel on the H200 (issue 47
    # run, 0.97 warps a scheduler): 3.29
    dependent_cycles: float = 3.3
    # DRAM latency under a streaming load (assumed; published idle figures for HBM3 on Hopper
    # are 0.5-0.7 us, and queues add to them)
    latency_us: float = 0.8
    # L2 bandwidth: Chips and Cheese measured 5.5 TB/s on an H100 PCIe (114 SMs, power-limited
    # to 1.4-1.75 GHz, 2023); scaled to 132 SMs at this clock, about 7 TB/s
    l2_gbps: float = 7000.0
    launch_gap_us: float = 2.0  # a second kernel in the same stream (the split-K reduce)

    @property
    def fp16_tflops(self) -> float:
        return 2 * self.mma_per_clock * self.sms * self.clock_ghz / 1e3

    @property
    def copy_gbps(self) -> float:
        return self.dram_gbps * self.copy_fraction

    def roofline_us(self, moved: int, flops: int) -> float:
        """Microseconds to move ``moved`` bytes or do ``flops`` fp16 flops, whichever binds."""
        return max(moved / self.dram_gbps / 1e3, flops / self.fp16_tflops / 1e6)


H100 = Device("H100 SXM", 3350.0, 50 * _MIB)
H200 = Device("H200", 4800.0, 60 * _MIB)
DEVICES = {device.name: device for device in (H100, H200)}


@dataclass(frozen=True)
class Harness:
    """How a figure was timed: the fixed cost of one timed call, and whether the flush before
    it left the L2 full of dirty lines (``flush.zero_()``, the issue 31/32 records)."""

    name: str
    floor_us: float  # CUDA-event resolution, one kernel's start and drain (measured, H200)
    dirty_l2: bool


DIRTY = Harness("dirty flush", 3.5, True)
CLEAN = Harness("clean flush", 3.5, False)
HARNESSES = {h.name: h for h in (DIRTY, CLEAN)}


@dataclass(frozen=True)
class Figures:
    """What the model needs of one compiled variant (fields of its static record)."""

    num_warps: int
    num_stages: int
    ctas_per_sm: int
    loop_instructions: int  # per warp, one main-loop iteration
    wgmma_wait: int | None  # smallest wgmma wait depth in the loop (None: no wgmma); recorded,
    # the time does not depend on it (measured: a depth-7 wait did not overlap decode and MMA)
    tensor_cores: bool

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> Figures:
        keys = ("num_warps", "num_stages", "ctas_per_sm", "loop_instructions", "wgmma_wait")
        return cls(*(record[key] for key in keys), tensor_cores=bool(record["mma"]))


@dataclass(frozen=True)
class Tiling:
    """One launch of the tensor-core linear kernel (the fields of a ``SwarConfig`` it needs)."""

    block_m: int  # rows of x a CTA covers
    block_n: int  # weight rows a CTA covers
    split_k: int

    @property
    def name(self) -> str:
        return f"{self.block_m}x{self.block_n}" + (f"/{self.split_k}" if self.split_k > 1 else "")


@dataclass(frozen=True)
class Prediction:
    """The model's time of one case on one tiling, term by term (microseconds)."""

    tiling: str
    ctas: int
    rounds: int  # the busiest SM's CTAs start in this many rounds (waves)
    resident: int  # CTAs one SM runs at once
    iteration_us: float  # one main-loop iteration of the resident CTAs
    bound: str  # what bounds the main loop: "compute", "latency", "bandwidth" or "dram"
    inflight_kib: float  # code bytes in async copies per SM (Little's law: x latency = bandwidth)
    kernel_us: float
    reduce_us: float
    harness_us: float  # the harness's floor
    dram_bytes: int  # what the kernel must move (codes, activations, output, partial sums)
    evicted_bytes: int  # dirty L2 lines its reads write back (the dirty-flush harness)

    @property
    def total_us(self) -> float:
        return self.kernel_us + self.reduce_us + self.harness_us

    @property
    def dram_gbps(self) -> float:
        """Bandwidth of the kernel's own traffic over the kernel's time (no harness)."""
        return self.dram_bytes / (self.kernel_us + self.reduce_us) / 1e3


def _evicted(read: int, device: Device, harness: Harness) -> int:
    """Bytes of dirty L2 lines that reading ``read`` bytes writes back under ``harness``: DRAM
    traffic the kernel pays where DRAM binds it (in the background where compute does)."""
    return min(read, device.l2_bytes) if harness.dirty_l2 else 0


@dataclass(frozen=True)
class Launch:
    """One launch of a tiled tensor-core kernel as the model sees it (bytes and MACs of one
    CTA's main-loop iteration, the kernel's whole traffic)."""

    name: str  # the tiling, as the tables print it
    ctas: int
    iterations: int  # main-loop iterations of one CTA
    weight_bytes: int  # weights one CTA loads an iteration
    sharers: int  # CTAs reading the same weights (they come from DRAM once for all)
    act_bytes: int  # activations one CTA loads an iteration (re-read: from the L2)
    macs: int  # multiply-accumulates of one CTA's iteration
    mma_per_clock: int  # the tensor cores' rate for its operands, an SM
    stored: int  # bytes all CTAs store (outputs or partial sums)
    dram: int  # bytes the kernel must move
    read: int  # bytes it reads from DRAM (what a dirty L2 writes back for)
    reduce: int  # bytes of a second pass (0: none): the split-K reduce, the input's padding


def predict(launch: Launch, fig: Figures, device: Device = H200,
            harness: Harness = CLEAN) -> Prediction:  # fmt: skip
    """The time of ``launch`` with the compiled ``fig`` (see the module docstring)."""
    clock = device.clock_ghz * 1e3  # cycles per microsecond
    tensor = launch.macs / launch.mma_per_clock if fig.tensor_cores else 0.0
    per_sm = -(-launch.ctas // device.sms)  # CTAs on the busiest SM
    occupancy = max(1, fig.ctas_per_sm)
    rounds = -(-per_sm // occupancy)  # they start in this many rounds
    resident = min(occupancy, per_sm)
    # a scheduler issues every issue_cycles, or as fast as its few warps' dependences allow
    warps = max(1.0, resident * fig.num_warps / device.schedulers)
    interval = max(device.issue_cycles, device.dependent_cycles / warps)
    issue = fig.num_warps * fig.loop_instructions * interval / device.schedulers
    compute = tensor + issue  # cycles, one CTA's iteration: decode and MMA take turns
    # what one CTA's iteration takes of the SM's shared resources: its CTAs add up
    shared = {
        "compute": compute / clock,
        "bandwidth": launch.weight_bytes / launch.sharers / (device.copy_gbps * 1e3 / device.sms),
        "l2": (launch.weight_bytes + launch.act_bytes) / (device.l2_gbps * 1e3 / device.sms),
    }
    bound = max(shared, key=shared.__getitem__)
    busy = per_sm * launch.iterations * shared[bound]
    # each CTA's iterations wait for their stages: at least latency / (stages in flight)
    waiting = rounds * launch.iterations * device.latency_us / max(1, fig.num_stages - 1)
    if waiting > busy:
        bound = "latency"
    loop = max(busy, waiting)
    # a prologue and an epilogue a round, and the stores
    kernel = 2 * rounds * device.latency_us + loop + launch.stored / device.copy_gbps / 1e3
    evicted = _evicted(launch.read, device, harness)
    if (launch.dram + evicted) / device.copy_gbps / 1e3 > kernel:
        kernel, bound = (launch.dram + evicted) / device.copy_gbps / 1e3, "dram"
    reduce = 0.0
    if launch.reduce:
        reduce = device.launch_gap_us + device.latency_us + launch.reduce / device.copy_gbps / 1e3
    inflight = resident * max(1, fig.num_stages - 1) * launch.weight_bytes / 1024
    return Prediction(launch.name, launch.ctas, rounds, resident,
                      loop / (rounds * max(1, launch.iterations)), bound, inflight, kernel,
                      reduce, harness.floor_us, launch.dram, evicted)  # fmt: skip


def predict_linear(
    out_f: int, in_f: int, batch: int, bits: int, tiling: Tiling, fig: Figures,
    device: Device = H200, harness: Harness = CLEAN,
) -> Prediction:  # fmt: skip
    """The time of ``x [batch, in_f] @ W.T`` (fp16, ``bits``-bit codes) on the tensor-core
    linear kernel with ``tiling`` and the compiled ``fig`` (see the module docstring).

    Example:
        >>> fig = Figures(4, 4, 5, 365, 0, True)
        >>> p = predict_linear(28672, 8192, 1, 4, Tiling(16, 128, 1), fig)
        >>> p.ctas, p.resident, p.bound, round(p.total_us)
        (224, 2, 'compute', 65)
    """
    per_word = 8 if bits <= 4 else 4
    chunks = -(-in_f // (16 * per_word))
    tiles = -(-batch // tiling.block_m) * -(-out_f // tiling.block_n)
    split = tiling.split_k
    codes = out_f * chunks * CHUNK_WORDS * 4
    dram = codes + 2 * batch * (in_f + out_f)
    partial = 4 * split * batch * out_f if split > 1 else 0  # fp32 partial sums
    launch = Launch(
        tiling.name, tiles * split, -(-chunks // split),
        weight_bytes=tiling.block_n * CHUNK_WORDS * 4,  # one chunk of each weight row
        sharers=-(-batch // tiling.block_m), act_bytes=tiling.block_m * 16 * per_word * 2,
        macs=tiling.block_m * tiling.block_n * 16 * per_word, mma_per_clock=device.mma_per_clock,
        stored=tiles * split * tiling.block_m * tiling.block_n * (4 if split > 1 else 2),
        dram=dram + 2 * partial, read=codes + 2 * batch * in_f,
        reduce=partial + 2 * batch * out_f if split > 1 else 0,
    )  # fmt: skip
    return predict(launch, fig, device, harness)


@dataclass(frozen=True)
class ConvCase:
    """One fp16 convolution (``groups=1``) as the model sees it: its shapes."""

    input_shape: tuple[int, ...]  # N, C, H, W
    weight_shape: tuple[int, ...]  # O, C, KH, KW
    output_shape: tuple[int, ...]  # N, O, OH, OW

    @property
    def pixels(self) -> int:
        n, _, oh, ow = self.output_shape
        return n * oh * ow


@dataclass(frozen=True)
class ConvTiling:
    """One launch of a convolution kernel: the tensor-core kernel on the linear kernels'
    layout (``padded``: K is each tap's channels padded to whole chunks), the few-channels
    kernel (a first convolution: its whole K an iteration) or the implicit GEMM on packed
    codes."""

    variant: str  # the static check's name of the variant that runs
    block_m: int  # output pixels a CTA covers
    block_n: int  # output channels a CTA covers
    block_k: int  # K columns of a main-loop iteration (of a chunk the slots it multiplies)
    split_k: int
    padded: bool

    @property
    def name(self) -> str:
        tiles = f"{self.block_m}x{self.block_n}" + ("" if self.padded else f"x{self.block_k}")
        return tiles + (f"/{self.split_k}" if self.split_k > 1 else "")


def conv_tiling(case: ConvCase, bits: int, sms: int) -> ConvTiling:
    """The launch ``inq::shift_conv2d`` makes for ``case`` with fp16 activations on ``sms``
    SMs before a GPU has timed what it offers (:func:`conv_tilings`): its default.

    Raises:
        ValueError: a depthwise convolution (one channel a group): not modelled.
    """
    return conv_tilings(case, bits, sms)[0]


def conv_tilings(case: ConvCase, bits: int, sms: int) -> list[ConvTiling]:
    """The launches ``inq::shift_conv2d`` offers for ``case`` with fp16 activations on ``sms``
    SMs (:func:`inq.kernels.triton.conv.shift_conv2d`'s choice, where the kernel layout holds
    the weight, as it does for the power-of-two codes of a trained layer), the default first;
    a GPU keeps the fastest (:func:`inq.kernels.triton.swar.choose`).

    Raises:
        ValueError: a depthwise convolution (one channel a group): not modelled.
    """
    from inq.kernels.layout import chunk_columns
    from inq.kernels.triton.conv import conv_config
    from inq.kernels.triton.conv_mma import (
        chunk_pairs,
        conv_mma_fits,
        conv_mma_grids,
        conv_mma_name,
    )

    o, c, kh, kw = case.weight_shape
    if conv_mma_fits(c, bits):
        chunk = chunk_columns(bits)
        pairs = chunk_pairs(c, chunk // CHUNK_WORDS)  # the columns a chunk multiplies
        return [ConvTiling(conv_mma_name(g.block_m, g.block_n, chunk // CHUNK_WORDS, pairs),
                           g.block_m, g.block_n, min(chunk, 32 * pairs), g.split, True)
                for g in conv_mma_grids(case.pixels, o, c, kh * kw, chunk, sms)]  # fmt: skip
    cfg = conv_config(case.pixels, o, c, kh * kw)
    if cfg.kernel not in ("implicit_gemm", "few_channels"):
        raise ValueError(f"the time model has no {cfg.kernel} convolution ({case.weight_shape})")
    return [ConvTiling(cfg.variant, cfg.block_m, cfg.block_n, cfg.block_k, 1, False)]


def predict_conv(
    case: ConvCase, bits: int, tiling: ConvTiling, fig: Figures,
    device: Device = H200, harness: Harness = CLEAN,
) -> Prediction:  # fmt: skip
    """The time of the convolution ``case`` (fp16, ``bits``-bit codes) launched as ``tiling``
    with the compiled ``fig``: an implicit GEMM of ``pixels x out_channels`` over
    ``K = KH*KW*C`` (padded to whole chunks a tap on the kernel layout), through the same terms
    as a linear layer (:func:`predict`). Each iteration gathers the pixels' activations of one
    K step (the masked-off padding is not read) from the L2; the input comes from DRAM once.
    ``fig`` is the variant the static check compiles (3x3 taps, whole chunks of channels): a
    7x7 or 1x1 convolution, or channels that fill half a chunk (a channel mask on each load),
    run the same loop with other index arithmetic, which the model does not see.

    Example:
        >>> case = ConvCase((32, 64, 56, 56), (64, 64, 3, 3), (32, 64, 56, 56))
        >>> tiling = conv_tiling(case, 4, H200.sms)  # 64 channels: half of each chunk
        >>> tiling.variant, tiling.name, tiling.block_k
        ('conv mma 128x64, 64 of 128 columns', '128x64', 64)
        >>> fig = Figures(4, 3, 4, 177, 0, True)  # the variant's figures (Triton 3.8)
        >>> round(predict_conv(case, 4, tiling, fig).total_us)  # the whole chunk: 48.4 measured
        31
    """
    if tiling.variant.startswith("conv few channels"):
        return _predict_few_channels(case, bits, tiling, fig, device, harness)
    n, c, h, w = case.input_shape
    o, _, kh, kw = case.weight_shape
    pixels, step = case.pixels, tiling.block_k
    if tiling.padded:  # the kernel layout: 16 words a weight row and chunk
        per_tap = -(-c // step)
        steps, row_bytes, real = kh * kw * per_tap, CHUNK_WORDS * 4, -(-c // per_tap)
    else:  # packed codes, K = (c, kh, kw) in steps of block_k
        steps, real = -(-c * kh * kw // step), step
        row_bytes = step * code_width(bits) // 8  # nibble or byte codes
    split = tiling.split_k
    tiles = -(-pixels // tiling.block_m) * -(-o // tiling.block_n)
    codes = o * steps * row_bytes
    read = codes + 2 * n * c * h * w
    output = 2 * pixels * o
    partial = 4 * split * pixels * o if split > 1 else 0  # fp32 partial sums
    launch = Launch(
        tiling.name, tiles * split, -(-steps // split),
        weight_bytes=tiling.block_n * row_bytes, sharers=-(-pixels // tiling.block_m),
        act_bytes=tiling.block_m * min(step, real) * 2,
        macs=tiling.block_m * tiling.block_n * step, mma_per_clock=device.mma_per_clock,
        stored=tiles * split * tiling.block_m * tiling.block_n * (4 if split > 1 else 2),
        dram=read + output + 2 * partial, read=read,
        reduce=partial + output if split > 1 else 0,
    )  # fmt: skip
    return predict(launch, fig, device, harness)


def _predict_few_channels(
    case: ConvCase, bits: int, tiling: ConvTiling, fig: Figures, device: Device, harness: Harness
) -> Prediction:  # fmt: skip
    """:func:`predict_conv` for the few-channels kernel: a main-loop iteration is a pixel tile
    (its whole K, the weights decoded before the loop), one program an SM walking them; the
    input's padded channels-last copy (``F.pad``) is a pass before it."""
    from inq.kernels.triton.conv import FEW_CHANNELS_PROGRAMS, few_channels_columns, pixel_block

    n, c, h, w = case.input_shape
    o, _, kh, kw = case.weight_shape
    _, _, oh, ow = case.output_shape
    block_h, block_w = pixel_block(tiling.block_m, ow)
    tiles = n * -(-oh // block_h) * -(-ow // block_w)
    programs = min(tiles, device.sms * FEW_CHANNELS_PROGRAMS)
    out_tiles = -(-o // tiling.block_n)
    # the padded channels-last copy (the case has no padding: "same", kh - 1 rows, is close)
    pad_bytes = 2 * n * few_channels_columns(c, kh * kw)[1] * (h + kh - 1) * (w + kw - 1)
    codes = o * -(-c * kh * kw * code_width(bits) // 8)
    output = 2 * case.pixels * o
    launch = Launch(
        tiling.name, programs * out_tiles, -(-tiles // programs), weight_bytes=0, sharers=1,
        act_bytes=block_h * block_w * tiling.block_k * 2,
        macs=block_h * block_w * tiling.block_n * tiling.block_k,
        mma_per_clock=device.mma_per_clock, stored=output, dram=pad_bytes + output + codes,
        read=pad_bytes + codes, reduce=2 * n * c * h * w + pad_bytes,
    )  # fmt: skip
    return predict(launch, fig, device, harness)


_DENSE_TILE = 128  # the square tile of a Hopper fp16 GEMM, split along K to fill the SMs


def predict_dense(
    out_f: int, in_f: int, batch: int, device: Device = H200, harness: Harness = CLEAN
) -> float:
    """Microseconds of cuBLAS fp16 ``F.linear`` as the model sees a warp-specialized GEMM: its
    DRAM traffic at the copy bandwidth, or its waves of 128 x 128 tensor-core tiles (K split
    where the tiles alone leave SMs idle), whichever binds, a DRAM latency each side, and the
    harness's floor.

    Example:
        >>> round(predict_dense(4096, 4096, 1), 1)  # 33.6 MB at 4.25 TB/s, 2 latencies, floor
        13.0
    """
    read = 2 * out_f * in_f + 2 * batch * in_f
    moved = read + 2 * batch * out_f + _evicted(read, device, harness)
    tiles = -(-batch // _DENSE_TILE) * -(-out_f // _DENSE_TILE)
    split = max(1, device.sms // tiles)
    tile_macs = min(batch, _DENSE_TILE) * _DENSE_TILE * -(-in_f // split)
    waves = -(-tiles * split // device.sms)
    tensor = waves * tile_macs / device.mma_per_clock / (device.clock_ghz * 1e3)
    # a DRAM latency before the first bytes and after the last, as the tiled kernels pay
    return max(moved / device.copy_gbps / 1e3, tensor) + 2 * device.latency_us + harness.floor_us


def _swar_tilings(batch: int, out_f: int, in_f: int, bits: int, sms: int) -> list[Any]:
    """The ``SwarConfig`` s the dispatcher offers for one fp16 case (the GPU times them)."""
    from inq.kernels.triton.swar import candidates, swar_config

    chunks = -(-in_f // (16 * (8 if bits <= 4 else 4)))
    return [swar_config(batch, out_f, chunks, False, sms, choice=choice)
            for choice in range(candidates(batch, False))]  # fmt: skip


def variant_name(block_m: int, block_n: int) -> str:
    """The static check's name of the tensor-core linear variant with these tiles."""
    return f"linear mma {block_m}x{block_n}"


@dataclass(frozen=True)
class Estimate:
    """The model's time of one linear benchmark case against cuBLAS fp16 (not a measurement)."""

    name: str  # "out x in"
    batch: int
    bits: int
    device: str
    options: tuple[Prediction, ...]  # each tiling on offer, the dispatcher's default first
    cublas_us: float

    @property
    def best(self) -> Prediction:
        """The fastest tiling on offer (what the GPU's timed choice should keep)."""
        return min(self.options, key=lambda p: p.total_us)

    @property
    def speedup(self) -> float:
        return self.cublas_us / self.best.total_us

    def record(self) -> dict[str, Any]:
        return {"name": self.name, "batch": self.batch, "bits": self.bits, "device": self.device,
                "estimate_us": self.best.total_us, "cublas_us": self.cublas_us,
                "speedup": self.speedup, "dram_gbps": self.best.dram_gbps,
                "prediction": asdict(self.best)}  # fmt: skip


def estimate_linear(
    figures: dict[tuple[str, int], Figures],
    bits_list: Iterable[int],
    device: Device = H200,
    harness: Harness = CLEAN,
) -> list[Estimate]:
    """The model's estimate of every fp16 linear benchmark case from ``figures`` (compiled
    variants by :func:`variant_name` and bits): the fastest tiling on offer, and cuBLAS."""
    out = []
    for bits in bits_list:
        for out_f, in_f in LINEAR_SHAPES:
            for batch in LINEAR_BATCHES:
                options = []
                for cfg in _swar_tilings(batch, out_f, in_f, bits, device.sms):
                    fig = figures.get((variant_name(cfg.block_m, cfg.block_n), code_width(bits)))
                    if fig is not None:
                        tiling = Tiling(cfg.block_m, cfg.block_n, cfg.split_k)
                        options.append(predict_linear(out_f, in_f, batch, bits, tiling, fig,
                                                      device, harness))  # fmt: skip
                if options:
                    cublas = predict_dense(out_f, in_f, batch, device, harness)
                    out.append(Estimate(f"{out_f}x{in_f}", batch, bits, device.name,
                                        tuple(options), cublas))  # fmt: skip
    return out


def table_problems(estimates: list[Estimate], slack: float = 0.25) -> list[str]:
    """Where the dispatcher's default tiling (the first of its bucket, what runs until the GPU
    has timed the others, and under CUDA-graph capture) is more than ``slack`` slower than the
    model's fastest: the tables of tilings per batch bucket must pick by the model."""
    return [
        f"{e.name} batch {e.batch} {e.bits}-bit on {e.device}: default {e.options[0].tiling} "
        f"{e.options[0].total_us:.1f} us, {e.best.tiling} {e.best.total_us:.1f} us"
        for e in estimates
        if e.options[0].total_us > (1 + slack) * e.best.total_us
    ]


def format_estimates(rows: list[Estimate], device: Device, harness: Harness = CLEAN) -> str:
    """The estimate table: each case's fastest tiling, what bounds it, and cuBLAS."""
    head = (f"{'shape':<12}{'batch':>6}{'bits':>5}  {'tiling':<11}{'CTAs':>6}{'res':>4}"
            f"{'bound':>10}{'KiB/SM':>8}{'est us':>8}{'% copy':>7}{'cuBLAS us':>10}"
            f"{'speedup':>8}")  # fmt: skip
    title = (f"model estimate on {device.name} ({device.sms} SMs, {device.clock_ghz} GHz, "
             f"{device.dram_gbps:.0f} GB/s, {harness.name} harness): estimates, not "
             "measurements")  # fmt: skip
    body = [
        f"{r.name:<12}{r.batch:>6}{r.bits:>5}  {r.best.tiling:<11}{r.best.ctas:>6}"
        f"{r.best.resident:>4}{r.best.bound:>10}{r.best.inflight_kib:>8.0f}"
        f"{r.best.total_us:>8.1f}{100 * r.best.dram_gbps / device.copy_gbps:>6.0f}%"
        f"{r.cublas_us:>10.1f}{r.speedup:>7.2f}x"
        for r in rows
    ]
    return "\n".join([title, head, "-" * len(head), *body])


@dataclass(frozen=True)
class ConvEstimate:
    """The model's time of one ResNet-18 convolution on its launch (not a measurement)."""

    name: str  # the layer, e.g. "layer1.0.conv1"
    batch: int
    bits: int
    device: str
    tiling: ConvTiling
    prediction: Prediction

    def record(self) -> dict[str, Any]:
        return {"op": "conv2d", "name": self.name, "batch": self.batch, "bits": self.bits,
                "device": self.device, "estimate_us": self.prediction.total_us,
                "variant": self.tiling.variant, "prediction": asdict(self.prediction)}  # fmt: skip


def estimate_convs(
    figures: dict[tuple[str, int], Figures],
    bits_list: Iterable[int],
    device: Device = H200,
    harness: Harness = CLEAN,
) -> list[ConvEstimate]:
    """The model's time of every convolution of the benchmark's ResNet-18 (224x224, batches
    of :data:`inq.kernels.shapes.CONV_BATCHES`) on the fastest launch ``inq::shift_conv2d``
    offers, from ``figures`` (compiled variants by name and bits: 5 to 8 bits take the byte-code
    variant's figures); layers whose variant was not compiled are left out."""
    from inq.kernels.shapes import CONV_BATCHES

    out = []
    cases = {batch: _resnet18_cases(batch) for batch in CONV_BATCHES}
    for bits in bits_list:
        for batch in CONV_BATCHES:
            for name, case in cases[batch].items():
                timed = [(predict_conv(case, bits, t, figures[key], device, harness), t)
                         for t in conv_tilings(case, bits, device.sms)
                         if (key := (t.variant, code_width(bits))) in figures]  # fmt: skip
                if timed:  # the GPU keeps the fastest
                    p, tiling = min(timed, key=lambda pt: pt[0].total_us)
                    out.append(ConvEstimate(name, batch, bits, device.name, tiling, p))
    return out


def format_conv_estimates(rows: list[ConvEstimate], device: Device) -> str:
    """A layer per line, the estimated microseconds per (batch, bits), and their sums."""
    columns = sorted({(r.batch, r.bits) for r in rows})
    layers = list(dict.fromkeys(r.name for r in rows))
    time = {(r.name, r.batch, r.bits): r.prediction.total_us for r in rows}
    head = f"{'layer':<24}" + "".join(f"{f'b{b} {k}-bit':>13}" for b, k in columns)
    body = [f"{name:<24}" + "".join(f"{time[name, b, k]:>13.1f}" if (name, b, k) in time
                                    else f"{'-':>13}" for b, k in columns)
            for name in layers]  # fmt: skip
    total = f"{'sum':<24}" + "".join(
        f"{sum(t for (_, tb, tk), t in time.items() if (tb, tk) == c):>13.1f}" for c in columns
    )
    title = (f"model estimate of ResNet-18's convolutions (inq::shift_conv2d, fp16) on "
             f"{device.name}, us: estimates, not measurements")  # fmt: skip
    return "\n".join([title, head, "-" * len(head), *body, total])


@dataclass(frozen=True)
class Check:
    """One measured figure against the model's prediction for it."""

    name: str
    batch: int
    bits: int
    kernel: str  # "inq" (a linear layer's fastest tiling on offer, a conv's launch) or "cuBLAS"
    measured_us: float
    predicted_us: float
    tiling: str
    ranking: bool | None = None  # measured order of the tilings = predicted (None: not timed)

    @property
    def error(self) -> float:
        return self.predicted_us / self.measured_us - 1


def calibration_records(
    bench: dict[str, Any], static_records: list[dict[str, Any]], harness: Harness, triton: str
) -> dict[str, Any]:
    """What the model needs of every fp16 record of ``inq bench kernel --json`` output
    ``bench`` as ``harness`` timed it: for a linear layer the tilings offered for it, each with
    its launch and its own time where the run timed each (clean flush); for a ResNet-18
    convolution its shapes and the launch the dispatcher makes (runs since issue 47: earlier
    ones timed convolution kernels since replaced); each with the figures of its variant in
    ``static_records`` (``inq bench kernel --static --json`` output, compiled with the GPU's
    Triton ``triton``), so the calibration can be recomputed after the kernels change."""
    device = DEVICES[device_name(bench["device"])]
    # runs since issue 47 time each op with every harness; older ones with the dirty flush only
    if "harness" not in bench and not harness.dirty_l2:
        raise ValueError("the bench file predates the clean flush: its figures are dirty-flush")
    suffix = "_dirty" if "harness" in bench and harness.dirty_l2 else ""
    figures = {(r["name"], r["bits"]): r for r in static_records if r["dtype"] == "fp16"}
    cases: dict[int, dict[str, ConvCase]] = {}  # ResNet-18's convolutions by batch, then name
    records = []
    for r in bench["results"]:
        if r["dtype"] != "fp16" or r["op"] not in ("linear", "conv2d"):
            continue
        measured = {"time_us": r[f"time{suffix}_us"], "baseline_us": r[f"baseline{suffix}_us"]}
        common = {key: r[key] for key in ("name", "batch", "bits")}
        if r["op"] == "conv2d":
            if "harness" not in bench:
                continue
            if r["batch"] not in cases:
                cases[r["batch"]] = _resnet18_cases(r["batch"])
            case = cases[r["batch"]][r["name"]]
            # the launch as the run recorded it; earlier runs recorded none, and get what the
            # dispatcher makes now (so make their file at the commit of the run); runs that
            # timed each launch on offer keep them all, with their times
            launch = r.get("launch")
            tiling = ConvTiling(**launch) if launch else conv_tiling(case, r["bits"], device.sms)
            offered, timed = [tiling], [None]
            shown = [(t["block_m"], t["block_n"], t["split_k"]) for t in r.get("tilings", [])]
            now = conv_tilings(case, r["bits"], device.sms)
            if len(shown) > 1 and shown == [(t.block_m, t.block_n, t.split_k) for t in now]:
                offered, timed = now, [t["time_us"] for t in r["tilings"]]
            ran = [asdict(t) | {"time_us": None if harness.dirty_l2 else us, "figures": asdict(
                       Figures.from_record(figures[(t.variant, code_width(r["bits"]))]))}
                   for t, us in zip(offered, timed, strict=True)]  # fmt: skip
            records.append({"op": "conv2d"} | common | measured | {"case": asdict(case),
                           "tilings": ran})  # fmt: skip
            continue
        out_f, in_f = map(int, r["name"].split("x"))
        # the tilings the run offered, as it recorded them; older runs recorded none, and get
        # what the dispatcher offers now (so make their file at the commit of the run)
        offered = r.get("tilings") or [
            {"block_m": c.block_m, "block_n": c.block_n, "split_k": c.split_k,
             "num_stages": c.num_stages, "time_us": None}
            for c in _swar_tilings(r["batch"], out_f, in_f, r["bits"], device.sms)
        ]  # fmt: skip
        tilings = []
        for t in offered:
            static = figures[(variant_name(t["block_m"], t["block_n"]), code_width(r["bits"]))]
            fig = Figures.from_record(static | {"num_stages": t["num_stages"]})
            time = None if harness.dirty_l2 else t["time_us"]  # tilings are timed clean
            tilings.append({key: t[key] for key in ("block_m", "block_n", "split_k")}
                           | {"figures": asdict(fig), "time_us": time})  # fmt: skip
        records.append({"op": "linear"} | common | measured | {"tilings": tilings})
    return {"device": device.name, "harness": harness.name, "triton": triton, "records": records}


def _resnet18_cases(batch: int) -> dict[str, ConvCase]:
    """The benchmark's ResNet-18 convolutions at ``batch`` by name (:mod:`inq.kernels.shapes`)."""
    from inq.kernels.shapes import resnet18_convs

    return {layer.name: ConvCase(layer.input_shape, tuple(layer.conv.weight.shape),
                                 layer.output_shape)
            for layer in resnet18_convs(batch)}  # fmt: skip


def device_name(reported: str) -> str:
    """The :data:`DEVICES` key of a device name torch reports.

    Example:
        >>> device_name("NVIDIA H200")
        'H200'
    """
    for name in DEVICES:
        if name.split()[0] in reported.split():
            return name
    raise ValueError(f"no model figures for the device {reported!r} (known: {', '.join(DEVICES)})")


_RECORD_KEYS = frozenset({"name", "batch", "bits", "time_us", "baseline_us", "tilings"})


def load_calibration(path: Path) -> dict[str, Any]:
    """A calibration file (:func:`calibration_records` output); ``ValueError`` in one line if
    it is not one."""
    problem = None
    try:
        data = json.loads(path.read_text())
        if data.get("device") not in DEVICES or data.get("harness") not in HARNESSES:
            problem = f"device or harness not one of {sorted(DEVICES)} / {sorted(HARNESSES)}"
        elif any(_RECORD_KEYS - record.keys() for record in data["records"]):
            problem = f"a record lacks one of {sorted(_RECORD_KEYS)}"
        elif any(r.get("op") == "conv2d" and ("case" not in r or len(r["tilings"]) != 1)
                 for r in data["records"]):  # fmt: skip
            problem = "a convolution record lacks its case or has other than one launch"
    except (ValueError, KeyError, TypeError, AttributeError) as err:
        problem = repr(err)
    if problem is not None:
        raise ValueError(f"{path} is not a calibration file of the time model: {problem}")
    return data


def _spread(records: list[dict[str, Any]]) -> float:
    """How far apart a run timed the same launch (same shape, bits, tiling and grid, e.g. at
    batch 1 and 16): the largest ratio minus one, 0 where no launch was timed twice."""
    times: dict[tuple[Any, ...], list[float]] = {}
    for r in records:
        if r.get("op") == "conv2d":  # each shape a convolution of its own
            continue
        for t in r["tilings"]:
            if t["time_us"] is not None:
                grid = -(-r["batch"] // t["block_m"])
                key = (r["name"], r["bits"], t["block_m"], t["block_n"], t["split_k"], grid)
                times.setdefault(key, []).append(t["time_us"])
    return max((max(v) / min(v) - 1 for v in times.values()), default=0.0)


def _ranking(measured: list[float | None], predicted: list[float], spread: float) -> bool | None:
    """Whether the model orders every pair of tilings the run told apart (measured more than
    ``spread`` apart) as the run did; None where the run told none apart or timed none."""
    times = [t for t in measured if t is not None]
    if len(times) < len(measured):
        return None
    pairs = [(i, j) for i in range(len(times)) for j in range(i + 1, len(times))
             if max(times[i], times[j]) > (1 + spread) * min(times[i], times[j])]  # fmt: skip
    if not pairs:
        return None
    return all((times[i] < times[j]) == (predicted[i] < predicted[j]) for i, j in pairs)


def calibrate(data: dict[str, Any]) -> list[Check]:
    """The model against every record of a calibration file: for a linear layer the fastest
    tiling on offer against the measured op, the dense model against the measured cuBLAS
    baseline, and the order of the tilings where the run told them apart by more than it told
    the same launch apart from itself (:func:`_spread`); for a convolution the launch that
    ran, or the fastest of those it offered where the run timed each, against the measured op
    and in their order (cuDNN has no model here: its algorithm differs by layer)."""
    device, harness = DEVICES[data["device"]], HARNESSES[data["harness"]]
    spread = _spread(data["records"])
    checks = []
    for r in data["records"]:
        common = (r["name"], r["batch"], r["bits"])
        if r.get("op") == "conv2d":  # no model of cuDNN: the kernel alone
            case = ConvCase(**{k: tuple(v) for k, v in r["case"].items()})
            predicted = [
                predict_conv(case, r["bits"],
                             ConvTiling(**{k: t[k] for k in ConvTiling.__dataclass_fields__}),
                             Figures(**t["figures"]), device, harness)
                for t in r["tilings"]
            ]  # fmt: skip
        else:
            out_f, in_f = map(int, r["name"].split("x"))
            predicted = [
                predict_linear(out_f, in_f, r["batch"], r["bits"],
                               Tiling(t["block_m"], t["block_n"], t["split_k"]),
                               Figures(**t["figures"]), device, harness)
                for t in r["tilings"]
            ]  # fmt: skip
        best = min(predicted, key=lambda p: p.total_us)
        times = [t["time_us"] for t in r["tilings"]]
        ranking = _ranking(times, [p.total_us for p in predicted], spread)
        checks.append(Check(*common, "inq", r["time_us"], best.total_us, best.tiling, ranking))
        if r.get("op") != "conv2d":
            cublas = predict_dense(out_f, in_f, r["batch"], device, harness)
            checks.append(Check(*common, "cuBLAS", r["baseline_us"], cublas, "dense"))
    return checks


@dataclass(frozen=True)
class Calibration:
    """How far the model is from the records: median and largest relative error."""

    checks: list[Check] = field(repr=False)
    median_error: float
    max_error: float

    @classmethod
    def of(cls, checks: list[Check]) -> Calibration:
        errors = [abs(c.error) for c in checks]
        return cls(checks, statistics.median(errors), max(errors))


def format_calibration(checks: list[Check], source: str) -> str:
    """The table of predicted against measured microseconds, and the error summary."""
    head = (f"{'shape':<22}{'batch':>6}{'bits':>5}  {'kernel':<7}{'tiling':<11}"
            f"{'measured':>10}{'model':>9}{'error':>8}  ranking")  # fmt: skip
    body = [
        f"{c.name:<22}{c.batch:>6}{c.bits:>5}  {c.kernel:<7}{c.tiling:<11}{c.measured_us:>10.1f}"
        f"{c.predicted_us:>9.1f}{100 * c.error:>+7.0f}%  "
        f"{'-' if c.ranking is None else 'right' if c.ranking else 'WRONG'}"
        for c in checks
    ]
    summary = Calibration.of(checks)
    foot = (f"{len(checks)} records: median |error| {100 * summary.median_error:.1f} %, "
            f"largest {100 * summary.max_error:.1f} %")  # fmt: skip
    return "\n".join([f"model against {source}", head, "-" * len(head), *body, foot])
