"""Static GPU check of the Triton kernels, no GPU needed: ``inq bench kernel --static``.

Every kernel variant the launchers use (kernel x tiles x dtype x code width) is compiled ahead
of time for an H100 (sm_90, Triton's ``ASTSource`` and its bundled ptxas), with the argument
specialisations Triton makes at run time for the benchmark shapes (16-byte aligned pointers,
sizes and row strides divisible by 16, unit strides). From the metadata and the SASS
(``cuobjdump``) it asserts:

- no register spills (no local memory);
- registers and shared memory within the SM's budget (65536 registers, 227 KiB);
- 64/128-bit code loads (``LDG.E.64`` / ``LDG.E.128``) in the GEMV;
- tensor-core instructions (``HMMA``/``HGMMA``) in every fp16/bf16 GEMM and conv tile;
- and, for a variant with a :class:`Budget`, what decides its speed, read in its main loop (the
  largest loop closed by a backward branch, :func:`loop_stats`): issued lane-ops (instructions x
  32 lanes x warps) per decoded weight or per multiply-accumulate, integer-pipe lane-ops likewise,
  no byte/halfword global loads, no shuffles in a GEMV loop, async copies feeding a tensor-core
  loop.

:func:`figures` hands the compiled linear variants to the time model (:mod:`inq.kernels.model`).
:func:`roofline` turns the benchmark shapes (:mod:`inq.kernels.shapes`) into bytes moved and
flops, and the time each op and its cuBLAS/cuDNN fp16 baseline would take at the device's peak
bandwidth and tensor-core rate: what the kernels can reach, not what they do (only
``inq bench kernel`` on a GPU says that).
"""

from __future__ import annotations

import math
import multiprocessing
import os
import re
import subprocess
import tempfile
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from inq.codes import row_bytes
from inq.kernels.layout import CHUNK_WORDS
from inq.kernels.model import H100, Device, Figures
from inq.kernels.shapes import CONV_BATCHES, LINEAR_BATCHES, LINEAR_SHAPES, resnet18_convs

__all__ = [
    "IMMA_BUDGET",
    "IMMA_SKINNY_BUDGET",
    "Budget",
    "CompiledVariant",
    "Grid",
    "LoopStats",
    "Roofline",
    "Variant",
    "compile_variant",
    "conv_mma_variants",
    "ctas_per_sm",
    "figures",
    "format_grids",
    "format_roofline",
    "format_static",
    "imma_grids",
    "imma_variants",
    "loop_stats",
    "roofline",
    "static_check",
    "swar_variants",
    "variants",
]

_MAX_REGISTERS = 65536  # per SM (sm_90)
_MAX_SHARED = 227 * 1024  # per block (sm_90)
_SM_SHARED = 228 * 1024  # per SM
_MIN_EXP = {"fp16": -24, "bf16": -133, "fp32": -149}  # as inq.kernels.triton.decode.MIN_EXP


@dataclass(frozen=True)
class Budget:
    """What a variant's main loop may cost (``None``: not checked). Lane-ops are SASS
    instructions x 32 lanes x warps, per decoded weight or per multiply-accumulate (MAC)."""

    per_weight: float | None = None  # issued lane-ops per decoded weight
    int_per_weight: float | None = None  # integer-pipe lane-ops per decoded weight
    per_mac: float | None = None  # issued lane-ops per MAC (tensor-core tiles)
    int_per_mac: float | None = None  # integer-pipe lane-ops per MAC
    no_shuffles: bool = False  # no SHFL (a reduction) in the loop
    async_copies: bool = False  # LDGSTS/UTMALDG in the loop (operands fed to the MMA)
    overlap: bool = False  # the loop's wgmma waited to depth >= 1 (decode overlaps the MMA)


@dataclass(frozen=True)
class Variant:
    """One compiled kernel: ``kernel`` names the ``@triton.jit`` function in its module."""

    name: str
    module: str
    kernel: str
    dtype: str  # activation dtype: fp16, bf16, fp32 (int8 or uint8 for the integer kernels)
    constexprs: dict[str, Any] = field(hash=False)
    num_warps: int = 4
    num_stages: int = 3
    wide_loads: bool = False  # the SASS must hold 64/128-bit global loads
    tensor_cores: bool = False  # the SASS must hold HMMA/HGMMA
    loop_weights: int = 0  # weights one CTA decodes per main-loop iteration
    loop_macs: int = 0  # multiply-accumulates one CTA does per main-loop iteration
    budget: Budget | None = None
    out_dtype: str | None = None  # Triton type of out_ptr's elements, if not the default
    # arguments the launches really pass unaligned: compiled without the multiple-of-16
    # specialisation Triton makes for them elsewhere (a first conv's 3 or 4 channels)
    unaligned: frozenset[str] = frozenset()


@dataclass
class LoopStats:
    """The main loop of a kernel's SASS: instruction counts by kind (per warp, one iteration)."""

    instructions: int
    int_ops: int  # integer-pipe instructions (IMAD, IADD3, LOP3, SHF, ISETP, SEL, LEA, PRMT, ...)
    loads: dict[str, int]  # global loads by kind, e.g. {"LDG.E.128": 2}
    async_copies: int  # LDGSTS, UTMALDG, UBLKCP
    shuffles: int  # SHFL
    barriers: int  # BAR
    mma: int  # HMMA, HGMMA, IMMA
    wgmma_wait: int | None  # smallest N of WARPGROUP.DEPBAR.LE gsb0, N (0: waits for every MMA)


@dataclass
class CompiledVariant:
    """What compiling a :class:`Variant` for sm_90 gave, and what failed its checks."""

    variant: Variant
    registers: int
    local_bytes: int  # spills (or a stack) put data in local memory
    shared_bytes: int
    wide_loads: int  # LDG.E.64 / LDG.E.128 instructions
    mma: int  # HMMA / HGMMA instructions
    problems: list[str]
    ctas_per_sm: int = 0
    loop: LoopStats | None = None

    def _per(self, count: int | None, amount: int) -> float | None:
        if self.loop is None or count is None or not amount:
            return None
        return count * 32 * self.variant.num_warps / amount

    @property
    def instructions_per_weight(self) -> float | None:
        return self._per(self.loop and self.loop.instructions, self.variant.loop_weights)

    @property
    def int_ops_per_weight(self) -> float | None:
        return self._per(self.loop and self.loop.int_ops, self.variant.loop_weights)

    @property
    def lane_ops_per_mac(self) -> float | None:
        return self._per(self.loop and self.loop.instructions, self.variant.loop_macs)

    @property
    def int_lane_ops_per_mac(self) -> float | None:
        return self._per(self.loop and self.loop.int_ops, self.variant.loop_macs)

    def record(self) -> dict[str, Any]:
        """One flat JSON record (``inq bench kernel --static --json``)."""
        v, loop = self.variant, self.loop
        return {
            "name": v.name,
            "kernel": v.kernel,
            "dtype": v.dtype,
            "bits": v.constexprs.get("BITS"),
            "num_warps": v.num_warps,
            "num_stages": v.num_stages,
            "registers": self.registers,
            "shared_bytes": self.shared_bytes,
            "local_bytes": self.local_bytes,
            "ctas_per_sm": self.ctas_per_sm,
            "loop_instructions": loop and loop.instructions,
            "instructions_per_weight": self.instructions_per_weight,
            "int_ops_per_weight": self.int_ops_per_weight,
            "lane_ops_per_mac": self.lane_ops_per_mac,
            "int_lane_ops_per_mac": self.int_lane_ops_per_mac,
            "loop_loads": loop and loop.loads,
            "async_copies": loop and loop.async_copies,
            "shuffles": loop and loop.shuffles,
            "barriers": loop and loop.barriers,
            "mma": self.mma,
            "wgmma_wait": loop and loop.wgmma_wait,
            "budget": None if v.budget is None else asdict(v.budget),
            "problems": self.problems,
        }


def variants() -> list[Variant]:
    """Every kernel variant the launchers pick (see ``linear_config`` and ``conv_config``)."""
    from inq.kernels.triton import int8
    from inq.kernels.triton.conv import conv_config, few_channels_columns, pixel_block
    from inq.kernels.triton.linear import linear_config

    out: list[Variant] = swar_variants()
    # the generic kernels: convolutions, and linear layers the kernel layout cannot hold
    # exactly (fp16 byte codes spanning more than 32 levels, a scale outside fp32)
    # per-row n1 (per-channel level sets) only loads one int32 per row tile more: checked on fp16
    settings = [(d, b, False) for d in ("fp16", "bf16", "fp32") for b in (4, 8)]
    settings += [("fp16", b, True) for b in (4, 8)]
    for dtype, bits, per_row in settings:
        mma, ieee = dtype != "fp32", dtype == "fp32"
        width = 4 if bits <= 4 else 8
        flags = {
            "BITS": bits,
            "WIDTH": width,
            "MIN_EXP": _MIN_EXP[dtype],
            "PER_ROW_N1": per_row,
            "HAS_BIAS": True,
        }
        suffix = ", n1 per row" if per_row else ""
        for rows in (1, 2, 4, 16, 32, 64, 256):
            cfg = linear_config(rows, 4096, 4096, bits, sms=132, fp32=ieee)
            tiles = {"BLOCK_M": cfg.block_m, "SPLIT_K": 2 if cfg.split_k > 1 else 1}
            launch = (cfg.num_warps, cfg.num_stages)
            name = f"generic {cfg.kernel} {cfg.block_m}x{cfg.block_n}x{cfg.block_k}{suffix}"
            if cfg.kernel == "gemv":
                tiles |= {"BLOCK_O": cfg.block_n, "BLOCK_B": cfg.block_k * width // 8}
                cx = flags | tiles
                work = _work(cfg.block_m, cfg.block_n, cfg.block_k)
                kernel = "_gemv_kernel"
                out.append(Variant(name, "linear", kernel, dtype, cx, *launch, True, **work))
            else:
                tiles |= {"BLOCK_N": cfg.block_n, "BLOCK_K": cfg.block_k, "GROUP_M": 8}
                cx = flags | tiles | {"UPCAST": False, "IEEE": ieee}
                kernel = "_gemm_kernel"
                work = _work(cfg.block_m, cfg.block_n, cfg.block_k)
                out.append(Variant(name, "linear", kernel, dtype, cx, *launch, False, mma, **work))
        for pixels, og, cg in ((12544, 64, 64), (196, 512, 256), (12544, 1, 1)):
            cfg = conv_config(pixels, og, cg, 9, fp32=ieee)  # ResNet-18 early, late; depthwise
            cx = flags | {"KH": 3, "KW": 3, "BLOCK_M": cfg.block_m, "BLOCK_N": cfg.block_n}
            launch = (cfg.num_warps, cfg.num_stages)
            if cfg.kernel == "depthwise":
                name = f"{cfg.variant}{suffix}"
                out.append(Variant(name, "conv", "_depthwise_kernel", dtype, cx, *launch))
            else:
                name = f"{cfg.variant}{suffix}"
                cx |= {"UPCAST": False, "IEEE": ieee, "BLOCK_K": cfg.block_k}
                kernel = "_implicit_gemm_kernel"
                work = _work(cfg.block_m, cfg.block_n, cfg.block_k)
                out.append(Variant(name, "conv", kernel, dtype, cx, *launch, False, mma, **work))
        if mma:  # ResNet's 7x7 first convolution: 3 channels (4 a tap), 49 taps (64), batch 32
            cfg = conv_config(32 * 112 * 112, 64, 3, 49)
            tap_columns, cp = few_channels_columns(3, 49)
            block_h, block_w = pixel_block(cfg.block_m, 112)
            even = 112 % block_h == 0 == 112 % block_w
            cx = flags | {"KH": 7, "KW": 7, "UPCAST": False, "BLOCK_H": block_h,
                          "BLOCK_W": block_w, "BLOCK_N": cfg.block_n, "TAPS": tap_columns,
                          "CP": cp, "EVEN": even}  # fmt: skip
            name = f"{cfg.variant}{suffix}"
            macs = cfg.block_m * cfg.block_n * cfg.block_k  # a pixel tile; the decode is before
            out.append(Variant(name, "conv", "_few_channels_kernel", dtype, cx, cfg.num_warps,
                               cfg.num_stages, False, True, loop_macs=macs))  # fmt: skip
    out += conv_mma_variants()
    out += imma_variants()
    # the integer model's elementwise ops (one pass each; memory-bound, no budget)
    out.append(Variant("int8 requantized add", "int8", "_requant_add_kernel", "uint8",
                       {"BLOCK": 1024}, out_dtype="u8"))  # fmt: skip
    out.append(Variant("int8 input quantization", "int8", "_quantize_input_kernel", "fp32",
                       {"BLOCK": 1024}, out_dtype="u8"))  # fmt: skip
    # the integer model's pooling, one pass each, channels_last (as the convs leave it) with
    # the tiles of pool_tiles(True): ResNet's 3x3 max pool, its global average, a 2x2 average
    pool = {"CHANNELS_LAST": True, "BLOCK_C": 64, "WIDE": False, "LOWEST": 0}
    for name, kernel, window in (("int8 max pool 3x3", "_max_pool_kernel", 3),
                                 ("int8 global average pool", "_global_avg_pool_kernel", 0),
                                 ("int8 average pool 2x2", "_avg_pool_kernel", 2)):  # fmt: skip
        cx = {**pool, "KH": window, "KW": window, "BLOCK_Q": 16, "BLOCK_P": 16}
        out.append(Variant(name, "pool", kernel, "uint8", cx, out_dtype="u8"))
    tiles = {"BLOCK_M": int8.BLOCK_M, "BLOCK_O": int8.BLOCK_O, "BLOCK_K": int8.BLOCK_K}
    name = f"int8 shift-add {int8.BLOCK_M}x{int8.BLOCK_O}x{int8.BLOCK_K}"
    for dtype in ("int8", "uint8"):  # the load and its widening differ
        for bits in (4, 8):
            codes = {"BITS": bits, "WIDTH": 4 if bits <= 4 else 8}
            work = _work(int8.BLOCK_M, int8.BLOCK_O, int8.BLOCK_K)
            out.append(Variant(name, "int8", "_int8_kernel", dtype, codes | tiles, **work))
            for og in (64, 1):  # a full channel tile; depthwise
                cfg = int8.conv_int8_config(og)
                m, n, k = cfg.block_m, cfg.block_n, cfg.block_k
                cx = codes | {"KH": 3, "KW": 3, "BLOCK_M": m, "BLOCK_N": n, "BLOCK_K": k}
                conv = f"int8 conv shift-add {m}x{n}x{k}"
                launch = (cfg.num_warps, cfg.num_stages)
                out.append(
                    Variant(conv, "int8", "_conv_int8_kernel", dtype, cx, *launch, **_work(m, n, k))
                )
    return out


def conv_mma_variants() -> list[Variant]:
    """The fp16/bf16 convolution on the kernel layout (:mod:`inq.kernels.triton.conv_mma`) in
    the tiles it offers for ResNet-18's convolutions at batch 1 and 32, nibble and byte codes
    (and, where a tap's channels fill part of a chunk, the slots it multiplies), with the
    linear kernels' budgets: per MAC for 128-pixel tiles, per weight for narrower ones (their
    decode is shared by fewer pixels), twice for byte codes."""
    from inq.kernels.shapes import CONV_BATCHES, resnet18_convs
    from inq.kernels.triton.conv_mma import chunk_pairs, conv_mma_grids, conv_mma_name

    launches = set()
    for batch in CONV_BATCHES:
        for layer in resnet18_convs(batch):
            n, o, oh, ow = layer.output_shape
            channels = layer.input_shape[1]
            if channels >= 32:  # conv1's 3 take the few-channels kernel
                for per_word in (8, 4):
                    pairs = chunk_pairs(channels, per_word)
                    chunk = 16 * per_word
                    for g in conv_mma_grids(n * oh * ow, o, channels, 9, chunk, 132):
                        launches.add((g.block_m, g.block_n, g.warps, per_word, pairs))
    out = []
    for m, n, warps, per_word, pairs in sorted(launches):
        for dtype in ("fp16", "bf16"):
            cx = {"KH": 3, "KW": 3, "PER_WORD": per_word, "BF16": dtype == "bf16",
                  "HAS_BIAS": True, "IEEE": False, "EVEN_C": True, "PAIRS": pairs,
                  "BLOCK_M": m, "BLOCK_N": n, "GROUP_N": 8,
                  "BITS": 4 if per_word == 8 else 8}  # fmt: skip
            work = _work(m, n, 32 * pairs)  # a chunk's multiplied slots a loop iteration
            budget = _budget("large" if m >= 128 else "skinny", per_word, m)
            out.append(Variant(conv_mma_name(m, n, per_word, pairs), "conv_mma",
                               "_conv_mma_kernel", dtype, cx, warps, 3, False, True, **work,
                               budget=budget))  # fmt: skip
    return out


# the int8 tensor-core kernel (issue 32): as the fp16 tensor-core loops, per MAC the tensor
# cores do; tiles of 16 rows (a linear layer at batch <= 16, where a GEMV would run) per weight,
# as the skinny byte-code tiles of issue 31
IMMA_BUDGET = Budget(per_mac=0.05, int_per_mac=0.025, async_copies=True)
IMMA_SKINNY_BUDGET = Budget(per_weight=10, int_per_weight=5, async_copies=True)
# flat steps (a first conv): each column's tap and channel from constants (0.09-0.10 lane-ops a
# MAC on Triton 3.6 and 3.8 at one part); dividing by the channel count per column cost 0.6
IMMA_FLAT_BUDGET = Budget(per_mac=0.125, async_copies=True)


def imma_variants() -> list[Variant]:
    """The int8 tensor-core kernel (:mod:`inq.kernels.triton.imma`) in every launch
    ``imma_launches`` offers for ResNet-18's convolutions at batch 1 and 32 and a 4096 x 4096
    linear layer, for int8 and uint8 activations and one or two weight parts, each with
    :data:`IMMA_BUDGET` (tap-wise K steps; the flat steps of a first conv, which gather per
    column, :data:`IMMA_FLAT_BUDGET`, compiled with the first conv's channel count: no
    multiple of 16)."""
    from inq.kernels.shapes import CONV_BATCHES, resnet18_convs
    from inq.kernels.triton.imma import imma_launches

    shapes = [(1, 4096, 1, 4096, 1), (256, 4096, 1, 4096, 1)]  # (pixels, O, groups, C, taps)
    for batch in CONV_BATCHES:
        for layer in resnet18_convs(batch):
            n, o, oh, ow = layer.output_shape
            c, kh, kw = layer.conv.weight.shape[1:]
            shapes.append((n * oh * ow, o, 1, c, kh * kw))
    configs = {}
    for pixels, o, groups, c, taps in shapes:
        for cfg in imma_launches(pixels, o // groups, groups, c, taps, sms=132):
            configs[(cfg.block_m, cfg.block_n, cfg.block_k, cfg.tapwise, cfg.split_k > 1)] = cfg
    out = []
    # the integer model's layers requantize in the epilogue (uint8 in, after a ReLU) unless
    # K is split, a block's last conv with its residual add after that; the bare ops store int32
    settings = [(d, p, False, False) for d in ("int8", "uint8") for p in (1, 2)]
    for (m, n, k, tapwise, split), cfg in sorted(configs.items()):
        fused = [] if split else [("uint8", p, True, add) for add in (False, True) for p in (1, 2)]
        for dtype, parts, requant, add in settings + fused:
            cx = {"KH": 3, "KW": 3, "UNSIGNED": dtype == "uint8", "PARTS": parts,
                  "TAPWISE": tapwise, "FLAT_CG": 1 if tapwise else 4,
                  "FLAT_C": 1 if tapwise else 4, "EVEN_K": True,
                  "EVEN_N": tapwise,
                  "SPLIT_K": 2 if split else 1, "REQUANT": requant, "ADD": add,
                  "BLOCK_M": m, "BLOCK_N": n, "BLOCK_K": k}  # fmt: skip
            name = imma_variant_name(m, n, k, tapwise, split, requant, parts, add)
            # MACs the tensor cores do: a second weight part is a second product
            work = _work(m, n, k * parts)
            budget = (IMMA_FLAT_BUDGET if not tapwise else IMMA_SKINNY_BUDGET if m <= 16
                      else IMMA_BUDGET)  # fmt: skip
            unaligned = frozenset() if tapwise else frozenset({"C", "CG"})  # 4 channels
            out.append(Variant(name, "imma", "_imma_kernel", dtype, cx, cfg.num_warps,
                               cfg.num_stages, False, True, **work, budget=budget,
                               out_dtype="u8" if requant else None,
                               unaligned=unaligned))  # fmt: skip
    return out


def imma_variant_name(block_m: int, block_n: int, block_k: int, tapwise: bool, split: bool,
                      requant: bool, parts: int, residual: bool = False) -> str:  # fmt: skip
    """The static check's name of an int8 tensor-core variant (:func:`imma_variants`).

    Example:
        >>> imma_variant_name(64, 128, 128, True, False, True, 1)
        'int8 mma 64x128x128, requantized, 1 part'
        >>> imma_variant_name(64, 128, 128, True, False, True, 2, residual=True)
        'int8 mma 64x128x128, requantized, residual add, 2 parts'
    """
    kind = ("" if tapwise else " flat") + (", split-K" if split else "")
    kind += ", requantized" if requant else ""
    kind += ", residual add" if residual else ""
    return f"int8 mma {block_m}x{block_n}x{block_k}{kind}, {parts} part{'s'[: parts - 1]}"


@dataclass(frozen=True)
class Grid:
    """The launch of the int8 tensor-core kernel for one ResNet-18 convolution."""

    layer: str
    batch: int
    tile: str  # "MxNxK", "flat" where the K steps are flat
    split_k: int
    ctas: int
    steps_per_cta: int  # serial K steps of one CTA

    @property
    def problem(self) -> str | None:
        """Why the launch misses the batch-1 goal of at most :data:`MAX_STEPS` serial steps."""
        from inq.kernels.triton.geometry import MAX_STEPS

        if self.steps_per_cta > MAX_STEPS:
            return f"{self.steps_per_cta} serial K steps a CTA > {MAX_STEPS}"
        return None


def imma_grids(sms: int = 132) -> list[Grid]:
    """Grid size and serial K steps per CTA of the int8 tensor-core kernel for every
    convolution of ResNet-18 (224x224) at batch 1 and 32 on ``sms`` SMs (an H100 SXM).

    Example:
        >>> grid = [g for g in imma_grids() if g.batch == 1][-1]
        >>> grid.layer, grid.tile, grid.split_k, grid.ctas, grid.steps_per_cta
        ('layer4.1.conv2', '64x128x128', 9, 36, 4)
    """
    import triton

    from inq.kernels.shapes import CONV_BATCHES, resnet18_convs
    from inq.kernels.triton.imma import imma_config, k_steps

    grids = []
    for batch in CONV_BATCHES:
        for layer in resnet18_convs(batch):
            n, o, oh, ow = layer.output_shape
            c, kh, kw = layer.conv.weight.shape[1:]
            cfg = imma_config(n * oh * ow, o, 1, c, kh * kw, sms)
            tiles = triton.cdiv(n * oh * ow, cfg.block_m) * triton.cdiv(o, cfg.block_n)
            steps = k_steps(c, kh * kw, cfg.block_k)
            tile = f"{cfg.block_m}x{cfg.block_n}x{cfg.block_k}{'' if cfg.tapwise else ' flat'}"
            grids.append(Grid(layer.name, batch, tile, cfg.split_k, tiles * cfg.split_k,
                              triton.cdiv(steps, cfg.split_k)))  # fmt: skip
    return grids


def format_grids(grids: list[Grid], sms: int = 132) -> str:
    """The grid table ``inq bench kernel --static`` prints."""
    head = (f"{'int8 MMA launch (ResNet-18)':<28}{'batch':>6}{'tile':>16}{'split':>6}{'CTAs':>6}"
            f"{'steps/CTA':>10}  check")  # fmt: skip
    rows = [
        f"{g.layer:<28}{g.batch:>6}{g.tile:>16}{g.split_k:>6}{g.ctas:>6}{g.steps_per_cta:>10}  "
        f"{'FAIL: ' + g.problem if g.problem else 'ok'}"
        for g in grids
    ]
    return _table(f"grids on {sms} SMs", head, rows)


# what a variant's main loop may cost (issue 31): 4-bit codes; byte codes get twice the decode
# budget. Only fp32 activations (IEEE fp32 products, no TF32) run on CUDA cores: the GEMV gets
# the batch-1 budget plus 1.25 per further row of x (its FMA and a share of the loads), and one
# integer op more per weight (widening bf16 to fp32); the tile kernel is bound by one FMA per MAC.
_NIBBLE_BUDGETS = {
    "gemv": Budget(per_weight=5, int_per_weight=3, no_shuffles=True),
    "skinny": Budget(per_weight=5, int_per_weight=2.5, async_copies=True),
    "large": Budget(per_mac=0.05, int_per_mac=0.025, async_copies=True),
    "fp32 tile": Budget(per_mac=1.5, int_per_mac=0.15, async_copies=True),
}


def _budget(kind: str, per_word: int, block_m: int) -> Budget:
    budget = _NIBBLE_BUDGETS[kind]
    scale = 1 if per_word == 8 else 2
    fields = {
        name: None if value is None else value * scale
        for name in ("per_weight", "int_per_weight", "per_mac", "int_per_mac")
        for value in [getattr(budget, name)]
    }
    if kind == "gemv":
        fields["per_weight"] += 1.25 * (block_m - 1)
    return Budget(**fields, no_shuffles=budget.no_shuffles, async_copies=budget.async_copies)


def swar_variants() -> list[Variant]:
    """The linear kernels on the kernel layout (:mod:`inq.kernels.triton.swar`): every
    configuration ``swar_config`` offers for a 4096 x 4096 weight, each with its
    :class:`Budget`."""
    from inq.kernels.triton.swar import candidates, swar_config

    out, seen = [], set()
    for dtype in ("fp16", "bf16", "fp32"):
        fp32, bf16 = dtype == "fp32", dtype != "fp16"
        for per_word in (8, 4):
            bits = 4 if per_word == 8 else 8
            chunks = 4096 // (16 * per_word)
            for rows in (1, 2, 4, 8, 16, 64, 256) if fp32 else (1, 16, 32, 64, 256):
                for choice in range(candidates(rows, fp32, bf16)):
                    cfg = swar_config(rows, 4096, chunks, fp32, 132, None, choice, bf16)
                    variant = _swar_variant(cfg, dtype, per_word, bits)
                    key = (variant.name, dtype, bits)
                    if key not in seen:
                        seen.add(key)
                        out.append(variant)
    for dtype in ("fp16", "bf16", "fp32"):
        reduce = {"SPLIT_K": 4, "HAS_SCALE": True, "HAS_BIAS": True, "BLOCK": 1024}
        out.append(Variant("linear split-K reduce", "decode", "reduce_kernel", dtype, reduce))
    return out


def _swar_variant(cfg: Any, dtype: str, per_word: int, bits: int) -> Variant:
    """The static-check variant of one :class:`inq.kernels.triton.swar.SwarConfig`."""
    fp32 = dtype == "fp32"
    common = {"PER_WORD": per_word, "HAS_BIAS": True, "BLOCK_M": cfg.block_m,
              "SPLIT_K": 2 if cfg.split_k > 1 else 1, "BITS": bits}  # fmt: skip
    launch = (cfg.num_warps, cfg.num_stages)
    if cfg.kernel == "gemv":
        cx = common | {"BLOCK_O": cfg.block_n, "BLOCK_W": cfg.block_w}
        kind, kernel = "gemv", "_gemv_kernel"
        work = _work(cfg.block_m, cfg.block_n, cfg.block_w * per_word)
    else:
        cx = common | {"BF16": dtype != "fp16", "IEEE": fp32, "BLOCK_N": cfg.block_n, "GROUP_N": 8,
                       "PACKED": not fp32}  # fmt: skip
        kind = "fp32 tile" if fp32 else "skinny" if cfg.block_m <= 64 else "large"
        kernel = "_mma_kernel"
        work = _work(cfg.block_m, cfg.block_n, CHUNK_WORDS * per_word)
    name = f"linear {cfg.kernel} {cfg.block_m}x{cfg.block_n}"
    mma = not fp32 and cfg.kernel == "mma"  # on the tensor cores, which must overlap decode
    budget = replace(_budget(kind, per_word, cfg.block_m), overlap=mma)
    return Variant(name, "swar", kernel, dtype, cx, *launch, cfg.kernel == "gemv", mma, **work,
                   budget=budget)  # fmt: skip


def _work(rows: int, cols: int, depth: int) -> dict[str, int]:
    """Weights decoded and MACs done per main-loop iteration of a ``rows x cols x depth`` tile
    (``cols x depth`` weights)."""
    return {"loop_weights": cols * depth, "loop_macs": rows * cols * depth}


# pointer arguments by name; every other non-constexpr argument is an i32
_POINTERS = {"codes_ptr": "*u8", "n1_ptr": "*i32", "part_ptr": "*fp32", "words_ptr": "*i32",
             "scale_ptr": "*i32", "w_ptr": "*i8", "row_sum_ptr": "*i32", "acc_bias_ptr": "*i32",
             "mult_ptr": "*i32", "shift_ptr": "*i32"}  # fmt: skip
# integer arguments that are multiples of 16 for the benchmark shapes (Triton specialises them)
_DIVISIBLE = {"K", "KB", "KW", "N", "row_stride", "stride_xm", "bytes_per_split", "words_per_split",
              "total", "sxn", "C", "CG", "COUT", "OG", "part_stride", "KWORDS"}  # fmt: skip
_UNIT = {"stride_xk", "sxw", "INNER"}  # unit strides: Triton makes them constants at run time
# int64 arguments (a float64's bits, multipliers, rounding halves)
_WIDE = {"scale_bits", "m_x", "m_y", "half", "m_conv", "m_skip", "add_half"}


def compile_variant(variant: Variant, arch: int = 90) -> CompiledVariant:
    """Compile ``variant`` for ``sm_<arch>`` and check its resources and instructions."""
    import importlib

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    fn = getattr(importlib.import_module(f"inq.kernels.triton.{variant.module}"), variant.kernel)
    if not hasattr(fn, "params"):
        raise RuntimeError("the static check compiles kernels: unset TRITON_INTERPRET first")
    element = {"int8": "i8", "uint8": "u8"}.get(variant.dtype, variant.dtype)
    out_element = variant.out_dtype or ("i32" if variant.dtype in ("int8", "uint8") else element)
    names = {param.name for param in fn.params}  # BITS may only label a variant
    constexprs = {k: v for k, v in variant.constexprs.items() if k in names}
    signature, attrs = {}, {}
    for index, param in enumerate(fn.params):
        name = param.name
        if param.is_constexpr or name in _UNIT:
            signature[name] = "constexpr"
            constexprs.setdefault(name, 1)
        elif name.endswith("_ptr"):
            kind = _POINTERS.get(name)
            if kind is None:
                kind = f"*{out_element if name == 'out_ptr' else element}"
            signature[name] = kind
            attrs[(index,)] = [["tt.divisibility", 16]]
        else:
            signature[name] = "i64" if name in _WIDE else "i32"
            if name in _DIVISIBLE and name not in variant.unaligned:
                attrs[(index,)] = [["tt.divisibility", 16]]
    source = ASTSource(fn, signature, constexprs=constexprs, attrs=attrs)
    options = {"num_warps": variant.num_warps, "num_stages": variant.num_stages,
               "enable_fp_fusion": True}  # fmt: skip
    compiled = triton.compile(source, target=GPUTarget("cuda", arch, 32), options=options)
    usage, sass = _inspect_cubin(compiled.asm["cubin"])
    wide = len(re.findall(r"\bLDG\.E(?:\.[A-Z]+)*\.(?:64|128)\b", sass))
    mma = len(re.findall(r"\b(?:HMMA|HGMMA|IMMA|IGMMA)\b", sass))
    registers, local = usage["REG"], usage["LOCAL"] + usage["STACK"]
    shared = max(compiled.metadata.shared, usage["SHARED"])
    problems = []
    if local:
        problems.append(f"{local} bytes of local memory (register spills)")
    if registers * variant.num_warps * 32 > _MAX_REGISTERS:
        problems.append(f"{registers} registers x {variant.num_warps * 32} threads > 65536")
    if shared > _MAX_SHARED:
        problems.append(f"{shared} bytes of shared memory > {_MAX_SHARED}")
    if variant.wide_loads and not wide:
        problems.append("no 64/128-bit global loads (LDG.E.64/.128)")
    if variant.tensor_cores and not mma:
        problems.append("no tensor-core instruction (HMMA/HGMMA)")
    result = CompiledVariant(
        variant, registers, local, shared, wide, mma, problems,
        ctas_per_sm(registers, variant.num_warps, shared), loop_stats(sass),
    )  # fmt: skip
    problems += _over_budget(result)
    return result


def ctas_per_sm(registers: int, warps: int, shared_bytes: int) -> int:
    """CTAs of one kernel an sm_90 SM holds at once: registers (allocated per warp in units of
    256), warps (64), shared memory (228 KiB, 1 KiB reserved per CTA) and 32 CTAs bound it.

    Example:
        >>> ctas_per_sm(128, 8, 64 * 1024)
        2
    """
    per_warp = -(-max(registers, 1) * 32 // 256) * 256
    limits = [32, 64 // warps, _MAX_REGISTERS // (per_warp * warps)]
    if shared_bytes:
        limits.append(_SM_SHARED // (shared_bytes + 1024))
    return max(0, min(limits))


_INSTRUCTION = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_.]*)([^;]*);")
# integer-pipe opcodes (the name before the first dot); uniform-datapath (U*) ones are per warp
_INT_PIPE = frozenset({"IMAD", "IADD", "IADD3", "LOP", "LOP3", "SHF", "SHL", "SHR", "ISETP", "SEL",
                       "LEA", "PRMT", "VIADD", "IMNMX", "VIMNMX", "SGXT", "BMSK", "IABS", "FLO",
                       "POPC", "BREV", "IDP", "ICMP"})  # fmt: skip


def loop_stats(sass: str) -> LoopStats | None:
    r"""Counts of the main loop: the longest run of instructions closed by a backward ``BRA``
    (software-pipelined loops keep one iteration in it), or ``None`` without a loop.

    Example:
        >>> sass = (
        ...     "/*0000*/ MOV R1, c[0x0][0x28] ;\n/*0010*/ LDG.E.128 R4, desc[UR4][R2.64] ;\n"
        ...     "/*0020*/ LOP3.LUT R5, R4, 0xf, RZ, 0xc0, !PT ;\n/*0030*/ FFMA R6, R5, R5, R6 ;\n"
        ...     "/*0040*/ @P0 BRA 0x10 ;\n/*0050*/ EXIT ;"
        ... )
        >>> stats = loop_stats(sass)
        >>> stats.instructions, stats.int_ops, stats.loads
        (4, 1, {'LDG.E.128': 1})
    """
    code = [(int(a, 16), op, rest) for a, op, rest in _INSTRUCTION.findall(sass)]
    index = {address: i for i, (address, _, _) in enumerate(code)}
    loops = []
    for end, (address, op, rest) in enumerate(code):
        found = re.search(r"0x([0-9a-f]+)", rest) if op.startswith("BRA") else None
        target = int(found.group(1), 16) if found else None
        if target is not None and target < address and target in index:
            loops.append((end - index[target] + 1, end))
    if not loops:
        return None
    size, end = max(loops)
    body = code[end - size + 1 : end + 1]
    ops = [op for _, op, _ in body]
    depths = (re.search(r"gsb0,\s*(0x[0-9a-f]+|\d+)", rest)
              for _, op, rest in body if op.startswith("WARPGROUP.DEPBAR"))  # fmt: skip
    waits = [int(found.group(1), 0) for found in depths if found]
    return LoopStats(
        instructions=len(ops),
        int_ops=sum(op.split(".")[0] in _INT_PIPE for op in ops),
        loads=dict(Counter(op for op in ops if op.split(".")[0] == "LDG")),
        async_copies=sum(op.startswith(("LDGSTS", "UTMALDG", "UBLKCP")) for op in ops),
        shuffles=sum(op.startswith("SHFL") for op in ops),
        barriers=sum(op.startswith("BAR") for op in ops),
        mma=sum(op.startswith(("HMMA", "HGMMA", "IMMA", "IGMMA")) for op in ops),
        wgmma_wait=min(waits) if waits else None,
    )


def _over_budget(result: CompiledVariant) -> list[str]:
    """Why ``result`` leaves its variant's :class:`Budget` (empty: within it)."""
    budget, loop = result.variant.budget, result.loop
    if budget is None:
        return []
    if loop is None:
        return ["no main loop found in the SASS"]
    problems = []
    limits = [
        ("lane-ops/weight", result.instructions_per_weight, budget.per_weight),
        ("integer lane-ops/weight", result.int_ops_per_weight, budget.int_per_weight),
        ("lane-ops/MAC", result.lane_ops_per_mac, budget.per_mac),
        ("integer lane-ops/MAC", result.int_lane_ops_per_mac, budget.int_per_mac),
    ]
    for what, value, limit in limits:
        if limit is not None and (value is None or value > limit):
            problems.append(f"{what} {value if value is None else round(value, 3)} > {limit}")
    narrow = sorted(k for k in loop.loads if re.search(r"\.(?:U|S)(?:8|16)\b", k))
    if narrow:
        problems.append(f"byte/halfword global loads in the main loop: {', '.join(narrow)}")
    if budget.no_shuffles and loop.shuffles:
        problems.append(f"{loop.shuffles} shuffles (SHFL) in the main loop")
    if budget.async_copies and not loop.async_copies:
        problems.append("no async copy (LDGSTS/UTMALDG) in the main loop")
    if budget.overlap and not loop.wgmma_wait:
        problems.append("wgmma waited to depth 0: decode and MMA take turns")
    return problems


def _inspect_cubin(cubin: bytes) -> tuple[dict[str, int], str]:
    """(resource usage, SASS) of a cubin, from the cuobjdump Triton ships."""
    from triton.backends.nvidia import compiler as nvidia

    tool = nvidia.get_cuobjdump_path() if hasattr(nvidia, "get_cuobjdump_path") else None
    tool = tool or str(Path(nvidia.__file__).parent / "bin" / "cuobjdump")
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "kernel.cubin")
        Path(path).write_bytes(cubin)
        res = subprocess.run([tool, "--dump-resource-usage", path], capture_output=True,
                             text=True, check=True).stdout  # fmt: skip
        sass = subprocess.run([tool, "-sass", path], capture_output=True, text=True,
                              check=True).stdout  # fmt: skip
    usage = {key: int(value) for key, value in re.findall(r"\b([A-Z]+):(\d+)", res)}
    return {k: usage.get(k, 0) for k in ("REG", "STACK", "SHARED", "LOCAL")}, sass


def static_check(
    jobs: int | None = None,
    progress: Callable[[int, int, CompiledVariant], None] | None = None,
) -> list[CompiledVariant]:
    """Compile and check every :func:`variants` entry in ``jobs`` fresh processes (spawned
    without ``TRITON_INTERPRET``, so this works from an interpreted session too); results in
    the order of :func:`variants`. ``progress(done, total, result)`` is called as each variant
    is compiled (in the order they finish)."""
    todo = variants()
    env_interpret = os.environ.pop("TRITON_INTERPRET", None)
    try:
        workers = jobs or min(8, os.cpu_count() or 1)
        spawn = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(max_workers=workers, mp_context=spawn) as pool:
            futures = [pool.submit(compile_variant, v) for v in todo]
            for done, future in enumerate(as_completed(futures), 1):
                if progress is not None:
                    progress(done, len(todo), future.result())
            return [future.result() for future in futures]
    finally:
        if env_interpret is not None:
            os.environ["TRITON_INTERPRET"] = env_interpret


def format_static(results: list[CompiledVariant]) -> str:
    """The table ``inq bench kernel --static`` prints: resources, then the main loop's cost
    (lane-ops per weight, or per MAC for tensor-core tiles; integer pipe after the slash)."""
    head = (
        f"{'kernel (sm_90)':<36}{'dtype':>6}{'bits':>5}{'warps':>6}{'regs':>5}{'CTA/SM':>7}"
        f"{'smem KiB':>9}{'loop':>6}{'ops/w':>14}{'ops/MAC':>14}{'shfl':>5}{'async':>6}"
        f"{'MMA':>5}  loads in loop; check"
    )
    rows = []

    def pair(total: float | None, integer: float | None, digits: int) -> str:
        return "-" if total is None else f"{total:.{digits}f}/{integer:.{digits}f}"

    for r in results:
        v, loop = r.variant, r.loop
        bits = v.constexprs.get("BITS", "")
        loads = "-" if loop is None else " ".join(f"{k}x{n}" for k, n in sorted(loop.loads.items()))
        verdict = ("ok" if v.budget else "ok (no budget)") if not r.problems else (
            "FAIL: " + "; ".join(r.problems))  # fmt: skip
        rows.append(
            f"{v.name:<36}{v.dtype:>6}{bits!s:>5}{v.num_warps:>6}{r.registers:>5}"
            f"{r.ctas_per_sm:>7}{r.shared_bytes / 1024:>9.1f}"
            f"{'-' if loop is None else loop.instructions:>6}"
            f"{pair(r.instructions_per_weight, r.int_ops_per_weight, 2):>14}"
            f"{pair(r.lane_ops_per_mac, r.int_lane_ops_per_mac, 3):>14}"
            f"{'-' if loop is None else loop.shuffles:>5}"
            f"{'-' if loop is None else loop.async_copies:>6}{r.mma:>5}  {loads}; {verdict}"
        )
    return _table(None, head, rows)


def figures(results: list[CompiledVariant]) -> dict[tuple[str, int], Figures]:
    """The model's figures of the compiled fp16 variants it times, by name and bits: the
    tensor-core linear kernel and the three convolution kernels."""
    timed = {("swar", "_mma_kernel"), ("conv_mma", "_conv_mma_kernel"),
             ("conv", "_implicit_gemm_kernel"), ("conv", "_few_channels_kernel")}  # fmt: skip
    return {(r.variant.name, r.variant.constexprs["BITS"]): Figures.from_record(r.record())
            for r in results
            if (r.variant.module, r.variant.kernel) in timed
            and r.variant.dtype == "fp16" and r.loop is not None}  # fmt: skip


def _table(title: str | None, head: str, rows: list[str]) -> str:
    lines = [] if title is None else [title]
    return "\n".join([*lines, head, "-" * len(head), *rows])


@dataclass(frozen=True)
class Roofline:
    """One benchmark case: bytes and flops of the inq op and its fp16 baseline, and the time
    each takes at the device's peak bandwidth or tensor-core rate, whichever binds."""

    op: str
    name: str
    batch: int
    bits: int
    inq_bytes: int
    base_bytes: int
    flops: int
    inq_us: float
    base_us: float

    @property
    def speedup(self) -> float:
        return self.base_us / self.inq_us


def roofline(bits_list: list[int], device: Device = H100) -> list[Roofline]:
    """The roofline of every linear and ResNet-18 conv case of ``inq bench kernel`` (fp16)."""
    bound = device.roofline_us
    rows = []

    def add(op: str, name: str, batch: int, codes: int, dense: int, act: int, flops: int) -> None:
        inq_us, base_us = bound(codes + act, flops), bound(dense + act, flops)
        rows.append(
            Roofline(op, name, batch, bits, codes + act, dense + act, flops, inq_us, base_us)
        )

    for bits in bits_list:
        for out_f, in_f in LINEAR_SHAPES:
            for batch in LINEAR_BATCHES:
                codes, dense = out_f * row_bytes(in_f, bits), 2 * out_f * in_f
                act, flops = 2 * batch * (in_f + out_f), 2 * batch * out_f * in_f
                add("linear", f"{out_f}x{in_f}", batch, codes, dense, act, flops)
        for batch in CONV_BATCHES:
            for name, conv, in_shape, out_shape in resnet18_convs(batch):
                out_c, *fan_in = conv.weight.shape
                codes = out_c * row_bytes(math.prod(fan_in), bits)
                act = 2 * (math.prod(in_shape) + math.prod(out_shape))
                flops = 2 * math.prod(out_shape) * math.prod(fan_in)
                add("conv2d", name, batch, codes, 2 * conv.weight.numel(), act, flops)
    return rows


def format_roofline(rows: list[Roofline], device: Device = H100) -> str:
    """The roofline table: estimated microseconds of the op and its fp16 baseline."""
    head = (
        f"{'op':<7}{'shape/layer':<22}{'batch':>6}{'bits':>5}{'inq MB':>9}{'fp16 MB':>9}"
        f"{'GFLOP':>8}{'inq us':>9}{'fp16 us':>9}{'fp16/inq':>9}"
    )
    title = (
        f"roofline at {device.name} peaks ({device.dram_gbps:.0f} GB/s, "
        f"{device.fp16_tflops:.0f} fp16 TFLOP/s): estimates, not measurements"
    )
    return _table(title, head, [
        f"{r.op:<7}{r.name:<22}{r.batch:>6}{r.bits:>5}{r.inq_bytes / 1e6:>9.2f}"
        f"{r.base_bytes / 1e6:>9.2f}{r.flops / 1e9:>8.2f}{r.inq_us:>9.1f}{r.base_us:>9.1f}"
        f"{r.speedup:>8.2f}x"
        for r in rows
    ])  # fmt: skip
