"""Static GPU check of the Triton kernels, no GPU needed: ``inq bench kernel --static``.

Every kernel variant the launchers use (kernel x tiles x dtype x code width) is compiled ahead
of time for an H100 (sm_90, Triton's ``ASTSource`` and its bundled ptxas), with the argument
specialisations Triton makes at run time for the benchmark shapes (16-byte aligned pointers,
sizes and row strides divisible by 16, unit strides). From the metadata and the SASS
(``cuobjdump``) it asserts:

- no register spills (no local memory);
- registers and shared memory within the SM's budget (65536 registers, 227 KiB);
- 64/128-bit code loads (``LDG.E.64`` / ``LDG.E.128``) in the GEMV;
- tensor-core instructions (``HMMA``/``HGMMA``) in every fp16/bf16 GEMM and conv tile.

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
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from inq.codes import row_bytes
from inq.kernels.shapes import CONV_BATCHES, LINEAR_BATCHES, LINEAR_SHAPES, resnet18_convs

__all__ = [
    "H100",
    "CompiledVariant",
    "Roofline",
    "Variant",
    "compile_variant",
    "format_roofline",
    "format_static",
    "roofline",
    "static_check",
    "variants",
]

_MAX_REGISTERS = 65536  # per SM (sm_90)
_MAX_SHARED = 227 * 1024  # per block (sm_90)
_MIN_EXP = {"fp16": -24, "bf16": -133, "fp32": -149}  # as inq.kernels.triton.decode.MIN_EXP


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


def variants() -> list[Variant]:
    """Every kernel variant the launchers pick (see ``linear_config`` and ``conv_config``)."""
    from inq.kernels.triton import int8
    from inq.kernels.triton.conv import conv_config
    from inq.kernels.triton.linear import linear_config

    out: list[Variant] = []
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
            name = f"linear {cfg.kernel} {cfg.block_m}x{cfg.block_n}x{cfg.block_k}{suffix}"
            if cfg.kernel == "gemv":
                tiles |= {"BLOCK_O": cfg.block_n, "BLOCK_B": cfg.block_k * width // 8}
                cx = flags | tiles
                out.append(Variant(name, "linear", "_gemv_kernel", dtype, cx, *launch, True))
            else:
                tiles |= {"BLOCK_N": cfg.block_n, "BLOCK_K": cfg.block_k, "GROUP_M": 8}
                cx = flags | tiles | {"UPCAST": False, "IEEE": ieee}
                kernel = "_gemm_kernel"
                out.append(Variant(name, "linear", kernel, dtype, cx, *launch, False, mma))
        for pixels, og, cg in ((12544, 64, 64), (196, 512, 256), (12544, 1, 1)):
            cfg = conv_config(pixels, og, cg, 9, fp32=ieee)  # ResNet-18 early, late; depthwise
            cx = flags | {"KH": 3, "KW": 3, "BLOCK_M": cfg.block_m, "BLOCK_N": cfg.block_n}
            launch = (cfg.num_warps, cfg.num_stages)
            if cfg.kernel == "depthwise":
                name = f"conv depthwise {cfg.block_m}x{cfg.block_n}{suffix}"
                out.append(Variant(name, "conv", "_depthwise_kernel", dtype, cx, *launch))
            else:
                name = f"conv implicit gemm {cfg.block_m}x{cfg.block_n}x{cfg.block_k}{suffix}"
                cx |= {"UPCAST": False, "IEEE": ieee, "BLOCK_K": cfg.block_k}
                kernel = "_implicit_gemm_kernel"
                out.append(Variant(name, "conv", kernel, dtype, cx, *launch, False, mma))
    for dtype in ("fp16", "bf16", "fp32"):
        reduce = {"SPLIT_K": 4, "HAS_BIAS": True, "BLOCK": 1024}
        out.append(Variant("linear split-K reduce", "linear", "_reduce_kernel", dtype, reduce))
    tiles = {"BLOCK_M": int8.BLOCK_M, "BLOCK_O": int8.BLOCK_O, "BLOCK_K": int8.BLOCK_K}
    name = f"int8 shift-add {int8.BLOCK_M}x{int8.BLOCK_O}x{int8.BLOCK_K}"
    for dtype in ("int8", "uint8"):  # the load and its widening differ
        for bits in (4, 8):
            codes = {"BITS": bits, "WIDTH": 4 if bits <= 4 else 8}
            out.append(Variant(name, "int8", "_int8_kernel", dtype, codes | tiles))
            for og in (64, 1):  # a full channel tile; depthwise
                cfg = int8.conv_int8_config(og)
                m, n, k = cfg.block_m, cfg.block_n, cfg.block_k
                cx = codes | {"KH": 3, "KW": 3, "BLOCK_M": m, "BLOCK_N": n, "BLOCK_K": k}
                conv = f"int8 conv shift-add {m}x{n}x{k}"
                launch = (cfg.num_warps, cfg.num_stages)
                out.append(Variant(conv, "int8", "_conv_int8_kernel", dtype, cx, *launch))
    return out


# pointer arguments by name; every other non-constexpr argument is an i32
_POINTERS = {"codes_ptr": "*u8", "n1_ptr": "*i32", "part_ptr": "*fp32"}
# integer arguments that are multiples of 16 for the benchmark shapes (Triton specialises them)
_DIVISIBLE = {"K", "KB", "N", "row_stride", "stride_xm", "bytes_per_split", "total", "sxn"}
_UNIT = {"stride_xk", "sxw"}  # unit strides: Triton makes them constants at run time


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
    out_element = "i32" if variant.dtype in ("int8", "uint8") else element
    signature, constexprs, attrs = {}, dict(variant.constexprs), {}
    for index, param in enumerate(fn.params):
        name = param.name
        if param.is_constexpr or name in _UNIT:
            signature[name] = "constexpr"
            constexprs.setdefault(name, 1)
        elif name.endswith("_ptr"):
            kind = _POINTERS.get(name)
            if kind is None:
                kind = f"*{out_element if name == 'out_ptr' else element}"
                if variant.kernel == "_reduce_kernel" and name == "part_ptr":
                    kind = "*fp32"
            signature[name] = kind
            attrs[(index,)] = [["tt.divisibility", 16]]
        else:
            signature[name] = "i32"
            if name in _DIVISIBLE:
                attrs[(index,)] = [["tt.divisibility", 16]]
    source = ASTSource(fn, signature, constexprs=constexprs, attrs=attrs)
    options = {"num_warps": variant.num_warps, "num_stages": variant.num_stages,
               "enable_fp_fusion": True}  # fmt: skip
    compiled = triton.compile(source, target=GPUTarget("cuda", arch, 32), options=options)
    usage, sass = _inspect_cubin(compiled.asm["cubin"])
    wide = len(re.findall(r"\bLDG\.E(?:\.[A-Z]+)*\.(?:64|128)\b", sass))
    mma = len(re.findall(r"\b(?:HMMA|HGMMA)\b", sass))
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
    return CompiledVariant(variant, registers, local, shared, wide, mma, problems)


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


def static_check(jobs: int | None = None) -> list[CompiledVariant]:
    """Compile and check every :func:`variants` entry in ``jobs`` fresh processes (spawned
    without ``TRITON_INTERPRET``, so this works from an interpreted session too)."""
    todo = variants()
    env_interpret = os.environ.pop("TRITON_INTERPRET", None)
    try:
        workers = jobs or min(8, os.cpu_count() or 1)
        spawn = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(max_workers=workers, mp_context=spawn) as pool:
            return list(pool.map(compile_variant, todo))
    finally:
        if env_interpret is not None:
            os.environ["TRITON_INTERPRET"] = env_interpret


def format_static(results: list[CompiledVariant]) -> str:
    """The table ``inq bench kernel --static`` prints."""
    head = (
        f"{'kernel (sm_90)':<34}{'dtype':>6}{'bits':>5}{'warps':>6}{'regs':>6}{'smem KiB':>10}"
        f"{'local':>7}{'wide LDG':>9}{'MMA':>6}  check"
    )
    rows = []
    for r in results:
        v = r.variant
        bits = v.constexprs.get("BITS", "")
        verdict = "ok" if not r.problems else "FAIL: " + "; ".join(r.problems)
        rows.append(
            f"{v.name:<34}{v.dtype:>6}{bits!s:>5}{v.num_warps:>6}{r.registers:>6}"
            f"{r.shared_bytes / 1024:>10.1f}{r.local_bytes:>7}{r.wide_loads:>9}{r.mma:>6}"
            f"  {verdict}"
        )
    return "\n".join([head, "-" * len(head), *rows])


@dataclass(frozen=True)
class Device:
    """Peak figures of a GPU for the roofline (vendor data sheet)."""

    name: str
    bandwidth_gbps: float  # HBM, GB/s
    fp16_tflops: float  # dense tensor-core fp16, fp32 accumulation


H100 = Device("H100 SXM", 3350.0, 989.0)


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

    def bound(moved: int, flops: int) -> float:
        return max(moved / device.bandwidth_gbps / 1e3, flops / device.fp16_tflops / 1e6)

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
    lines = [
        f"roofline at {device.name} peaks ({device.bandwidth_gbps:.0f} GB/s, "
        f"{device.fp16_tflops:.0f} fp16 TFLOP/s): estimates, not measurements",
        head,
        "-" * len(head),
    ]
    lines += [
        f"{r.op:<7}{r.name:<22}{r.batch:>6}{r.bits:>5}{r.inq_bytes / 1e6:>9.2f}"
        f"{r.base_bytes / 1e6:>9.2f}{r.flops / 1e9:>8.2f}{r.inq_us:>9.1f}{r.base_us:>9.1f}"
        f"{r.speedup:>8.2f}x"
        for r in rows
    ]
    return "\n".join(lines)
