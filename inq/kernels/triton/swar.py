"""Linear kernels on the load-time weight layout (:mod:`inq.kernels.layout`).

A pair of codes becomes two 16-bit floats with one shift and one mask on an int32 word (SWAR);
``n1`` is applied once per output, as ``2**scale[row]`` on the fp32 sum, before the bias and
the one rounding to the output dtype. Which kernel runs (:func:`swar_config`):

- fp16/bf16 activations, every batch: :func:`_mma_kernel` on the tensor cores. The output is
  computed transposed (``out.T = W @ x.T``): the decoded weight tile is the MMA's register
  operand and the batch its narrow side (16 at least), one dot per chunk of codes
  (:func:`_chunk_dot`), waited for an iteration later so that decode and MMA overlap; codes and
  activations arrive by multi-stage async copies.
- fp32 activations (IEEE fp32 products, no TF32), up to :data:`GEMV_MAX_ROWS` rows:
  :func:`_gemv_kernel` on CUDA cores. Each thread keeps per-word partial sums (no reduction,
  shuffle or barrier in the loop) and reduces once after it; codes come in 128-bit loads. More
  rows: :func:`_mma_kernel` with IEEE fp32 dots (FMA).

Where the output tiles alone leave SMs idle, K is split: each split writes unscaled fp32 partial
sums and :func:`inq.kernels.triton.decode.reduce_kernel` adds them in split order (deterministic,
no atomics), scales, adds the bias and rounds once. Results differ from the reference only by fp32
summation order (the bound of ``tests/test_kernels_triton.py``). The sums are unscaled: fp16
activations times the stored levels (at most ``2**15``) stay far inside fp32's range; bf16 and fp32
activations (stored levels at most 16) could overflow it where the reference does not only beyond
about ``2**120`` in magnitude.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from torch import Tensor

from inq.kernels.layout import CHUNK_WORDS, KernelWeight
from inq.kernels.triton.decode import dot_upcast, finish, grouped_tile, reduce_partials

GEMV_MAX_ROWS = 8  # fp32 activations: CUDA-core GEMV up to here, then the FMA tile kernel
_MAX_SPLIT = 16
_WARPS_PER_SM = 8  # what a split-K launch aims for: two warps a scheduler

__all__ = [
    "SwarConfig",
    "candidates",
    "choose",
    "decode_pair",
    "launch",
    "offered",
    "remembered",
    "slot_dot",
    "swar_config",
    "swar_linear",
]


def _s32(value: int) -> int:
    """An unsigned 32-bit mask as the int32 Triton keeps it in (constants past 2**31 would be
    int64 and widen every operation)."""
    return value - (1 << 32) if value >= 1 << 31 else value


_NIB16 = tl.constexpr(_s32(0xCC00CC00))
_NIB_BF = tl.constexpr(_s32(0xC180C180))
_NIB_BF3 = tl.constexpr(_s32(0x81808180))
_BYTE16 = tl.constexpr(_s32(0xFF00FF00))
_BYTE_BF = tl.constexpr(_s32(0xBF80BF80))
_SIGNS = tl.constexpr(_s32(0x80008000))
_HIGH = tl.constexpr(_s32(0xFFFF0000))


@triton.jit
def decode_pair(w, G: tl.constexpr, PER_WORD: tl.constexpr, BF16: tl.constexpr):
    """Two 16-bit float patterns in one int32 (slot ``2G`` low, ``2G + 1`` high) from words
    ``w`` of the layout (see :mod:`inq.kernels.layout` for the bit positions). Each half comes
    from the same half of ``w`` alone (no shift carries a kept bit across), so a ``w`` made of
    the low (or high) halves of two words decodes to slot ``2G`` (``2G + 1``) of both."""
    if PER_WORD == 8:
        if not BF16:
            shift: tl.constexpr = 0 if G == 0 else 2 if G == 1 else 8 if G == 2 else 10
            return (w << shift) & _NIB16
        if G < 3:
            return (w << (2 * G)) & _NIB_BF
        return ((w << 6) & _NIB_BF3) | ((w << 14) & 0x40004000)
    if not BF16:
        return (w << (8 * G)) & _BYTE16
    if G == 0:
        return w & _BYTE_BF
    return ((w << 1) & _SIGNS) | ((w << 7) & 0x3F803F80)


@triton.jit
def bf16_to_f32(pair, HIGH: tl.constexpr):
    """The fp32 value of the low or high bf16 of ``pair``: its bits on top, zeros below."""
    if HIGH:
        return (pair & _HIGH).to(tl.float32, bitcast=True)
    return (pair << 16).to(tl.float32, bitcast=True)


@triton.jit
def slot_dot(pair, HIGH: tl.constexpr, xt, acc, IEEE: tl.constexpr):
    """``acc + W @ xt`` for the low or ``HIGH`` 16-bit weights of ``pair`` (``[rows, 16]``) and
    an activation tile ``xt [16, cols]``, in fp32: IEEE products for fp32 activations, or bf16
    under the interpreter (see ``dot_upcast``), the tensor cores otherwise."""
    if IEEE:  # one return: Triton compiles the code after a constexpr branch's return too
        acc = tl.dot(bf16_to_f32(pair, HIGH), xt.to(tl.float32), acc, input_precision="ieee")
    else:
        half = (pair >> 16) if HIGH else pair
        acc = tl.dot(half.to(tl.int16).to(xt.dtype, bitcast=True), xt, acc)
    return acc


@triton.jit
def _gemv_step(acc, words, x_ptr, rm, cols, K, stride_xm,
               PER_WORD: tl.constexpr, MASKED: tl.constexpr):  # fmt: skip
    """``acc[m, row, word] += sum over slots of w * x``, ``cols`` the slot-0 column of each
    word; ``MASKED`` only for the last step, where columns may pass ``K``."""
    for g in tl.static_range(PER_WORD // 2):
        pair = decode_pair(words, g, PER_WORD, True)
        for high in tl.static_range(2):
            w = bf16_to_f32(pair, high)
            k = cols + (2 * g + high) * 16
            ptrs = x_ptr + rm * stride_xm + k
            xv = tl.load(ptrs, mask=k < K, other=0.0) if MASKED else tl.load(ptrs)
            acc += w * xv.to(tl.float32)
    return acc


@triton.jit
def _gemv_kernel(
    x_ptr, words_ptr, scale_ptr, bias_ptr, out_ptr, part_ptr,
    M, N, K, KW, stride_xm, words_per_split,
    PER_WORD: tl.constexpr, HAS_BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_O: tl.constexpr, BLOCK_W: tl.constexpr, SPLIT_K: tl.constexpr,
):  # fmt: skip
    pid_o = tl.program_id(0)
    pid_k = tl.program_id(1)
    # 3-d tiles [x rows, weight rows, words], so that words, activations and sums share one
    # layout (2-d loads broadcast into a 3-d sum go through shared memory)
    rows = pid_o * BLOCK_O + tl.arange(0, BLOCK_O)[None, :, None]
    row_ok = rows < N
    # rows of x past M read row M - 1 (never stored): the loads need no mask
    rm = tl.minimum(tl.arange(0, BLOCK_M), M - 1)[:, None, None]
    w_idx = tl.arange(0, BLOCK_W)[None, None, :]
    chunk: tl.constexpr = 16 * PER_WORD
    col0 = (w_idx // 16) * chunk + w_idx % 16  # slot-0 column of each word, from w0
    word_ptrs = words_ptr + rows * KW + w_idx
    acc = tl.zeros([BLOCK_M, BLOCK_O, BLOCK_W], tl.float32)
    start = pid_k * words_per_split
    stop = tl.minimum(start + words_per_split, KW)
    # steps whose columns all lie below K need no mask; the rest (the last chunk) do
    unmasked = tl.minimum(stop, K // chunk * 16)
    full = start + tl.maximum(unmasked - start, 0) // BLOCK_W * BLOCK_W
    for w0 in range(start, full, BLOCK_W):
        words = tl.load(word_ptrs + w0, mask=row_ok, other=0)
        cols = w0 // 16 * chunk + col0
        acc = _gemv_step(acc, words, x_ptr, rm, cols, K, stride_xm, PER_WORD, False)
    for w0 in range(full, stop, BLOCK_W):
        words = tl.load(word_ptrs + w0, mask=row_ok & (w0 + w_idx < stop), other=0)
        cols = w0 // 16 * chunk + col0
        acc = _gemv_step(acc, words, x_ptr, rm, cols, K, stride_xm, PER_WORD, True)
    total = tl.sum(acc, axis=2)
    rm, rows = tl.arange(0, BLOCK_M), pid_o * BLOCK_O + tl.arange(0, BLOCK_O)
    finish(total, rm, rows, rm < M, rows < N, pid_k, scale_ptr, bias_ptr, out_ptr, part_ptr, M, N,
           True, HAS_BIAS, SPLIT_K)  # fmt: skip


@triton.jit
def _slot_pair(lo, hi, G: tl.constexpr, PER_WORD: tl.constexpr, BF16: tl.constexpr,
               BLOCK_N: tl.constexpr):  # fmt: skip
    """Code slots ``2G`` and ``2G + 1`` of a chunk as ``[BLOCK_N, 32]`` 16-bit patterns in K
    order, from its packed low and high halves (see :func:`_chunk_dot`)."""
    both = tl.join(decode_pair(lo, G, PER_WORD, BF16), decode_pair(hi, G, PER_WORD, BF16))
    pairs = tl.reshape(tl.permute(both, (0, 2, 1)), [BLOCK_N, 16])  # column pairs, K order
    bits = tl.join(pairs.to(tl.int16), (pairs >> 16).to(tl.int16))
    return tl.reshape(bits, [BLOCK_N, 32])


@triton.jit
def _cat(a, b, ROWS: tl.constexpr, COLS: tl.constexpr):
    """``[a | b]`` for two ``[ROWS, COLS]`` tiles (a join and a permutation: register names)."""
    return tl.reshape(tl.permute(tl.join(a, b), (0, 2, 1)), [ROWS, 2 * COLS])


@triton.jit
def _chunk_dot(acc, words, x_ptrs, k0, K, PER_WORD: tl.constexpr, BF16: tl.constexpr,
               IEEE: tl.constexpr, MASKED: tl.constexpr, BLOCK_N: tl.constexpr):  # fmt: skip
    """``acc + W @ x.T`` for one chunk ``words [BLOCK_N, 16]`` (its first column ``k0``) in one
    dot over the whole chunk, the activation tile ``x.T [16 * PER_WORD, cols]`` read at
    ``x_ptrs + k0`` (``MASKED``: columns from ``K`` on read as 0). One dot is one chain of
    wgmma that Triton waits for an iteration later (depth 1), so the next chunk's decode runs
    while the tensor cores work; a dot per slot waits for each (depth 0).

    The words are the ``paired`` layout: word ``2j`` holds the low halves of the layout's words
    ``2j`` and ``2j + 1``, word ``2j + 1`` their high halves. Decoded, each holds two weights
    adjacent in K, the pair the MMA's register operand keeps in one register, so no decoded
    weight is moved again. Joins and permutations put the slots in K order; they only rename
    registers."""
    lo, hi = tl.split(tl.reshape(words, [BLOCK_N, 8, 2]))  # even slots, odd slots
    w = _cat(_slot_pair(lo, hi, 0, PER_WORD, BF16, BLOCK_N),
             _slot_pair(lo, hi, 1, PER_WORD, BF16, BLOCK_N), BLOCK_N, 32)  # fmt: skip
    if PER_WORD == 8:
        w = _cat(w, _cat(_slot_pair(lo, hi, 2, PER_WORD, BF16, BLOCK_N),
                         _slot_pair(lo, hi, 3, PER_WORD, BF16, BLOCK_N), BLOCK_N, 32),
                 BLOCK_N, 64)  # fmt: skip
    w = w.to(tl.bfloat16 if BF16 else tl.float16, bitcast=True)
    if MASKED:
        xt = tl.load(x_ptrs + k0, mask=(k0 + tl.arange(0, 16 * PER_WORD) < K)[:, None], other=0.0)
    else:
        xt = tl.load(x_ptrs + k0)
    if IEEE:  # under the interpreter (see dot_upcast)
        return tl.dot(w.to(tl.float32), xt.to(tl.float32), acc, input_precision="ieee")
    return tl.dot(w.to(xt.dtype), xt, acc)


@triton.jit
def _mma_kernel(
    x_ptr, words_ptr, scale_ptr, bias_ptr, out_ptr, part_ptr,
    M, N, K, KW, stride_xm, chunks_per_split,
    PER_WORD: tl.constexpr, BF16: tl.constexpr, HAS_BIAS: tl.constexpr, IEEE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SPLIT_K: tl.constexpr, GROUP_N: tl.constexpr,
    PACKED: tl.constexpr,
):  # fmt: skip
    rn, rm = grouped_tile(tl.program_id(0), N, M, BLOCK_N, BLOCK_M, GROUP_N)
    pid_k = tl.program_id(1)
    x_rows = tl.minimum(rm, M - 1)  # rows past M read row M - 1 and are never stored
    w16 = tl.arange(0, 16)
    chunk: tl.constexpr = 16 * PER_WORD
    acc = tl.zeros([BLOCK_N, BLOCK_M], tl.float32)
    first = pid_k * chunks_per_split
    last = tl.minimum(first + chunks_per_split, KW // 16)
    if PACKED:
        # one dot a chunk (_chunk_dot); rows past N read row N - 1 and are never stored, and
        # only a chunk reaching past K (the last one, at most) masks its activations
        word_ptrs = words_ptr + tl.minimum(rn, N - 1)[:, None] * KW + w16[None, :]
        x_ptrs = x_ptr + x_rows[None, :] * stride_xm + tl.arange(0, chunk)[:, None]
        full = tl.maximum(first, tl.minimum(last, K // chunk))
        for c in range(first, full):
            words = tl.load(word_ptrs + c * 16)
            acc = _chunk_dot(acc, words, x_ptrs, c * chunk, K, PER_WORD, BF16, IEEE, False,
                             BLOCK_N)  # fmt: skip
        if full < last:
            words = tl.load(word_ptrs + full * 16)
            acc = _chunk_dot(acc, words, x_ptrs, full * chunk, K, PER_WORD, BF16, IEEE, True,
                             BLOCK_N)  # fmt: skip
    else:  # fp32 activations: one K=16 dot per code slot
        word_ptrs = words_ptr + rn[:, None] * KW + w16[None, :]
        x_ptrs = x_ptr + x_rows[None, :] * stride_xm + w16[:, None]  # x.T tile [16, BLOCK_M]
        for c in range(first, last):
            words = tl.load(word_ptrs + c * 16, mask=(rn < N)[:, None], other=0)
            for g in tl.static_range(PER_WORD // 2):
                pair = decode_pair(words, g, PER_WORD, BF16)
                for high in tl.static_range(2):
                    k0 = c * chunk + (2 * g + high) * 16
                    xt = tl.load(x_ptrs + k0, mask=(k0 + w16 < K)[:, None], other=0.0)
                    acc = slot_dot(pair, high, xt, acc, IEEE)
    # acc is out.T: rows of the weight by rows of x
    finish(tl.trans(acc), rm, rn, rm < M, rn < N, pid_k, scale_ptr, bias_ptr, out_ptr, part_ptr,
           M, N, True, HAS_BIAS, SPLIT_K)  # fmt: skip


@dataclass(frozen=True)
class SwarConfig:
    """Tiles of one launch on the kernel layout: ``kernel`` is "gemv" or "mma"; ``block_n``
    counts weight rows; ``block_w`` words per GEMV step."""

    kernel: str
    block_m: int
    block_n: int
    block_w: int
    split_k: int
    num_warps: int
    num_stages: int


# candidates per batch bucket of the tensor-core kernel: (weight rows per tile, warps, stages),
# the first the default. The time model (inq.kernels.model) ranks one of them first at every
# benchmark shape, and the default within 25 % of it (the static check fails otherwise): 256-row
# tiles from batch 64 read each activation tile from the L2 half as often per weight (the
# model's bound there); at batch <= 32, 64-row tiles win where K is split, 128-row ones on the
# largest weights. They differ in tiling only, never in the split of K or the order of its
# loop, so whichever a GPU picks, every output is the same sum in the same order. Each is a
# variant of the static check within its budget: the narrower tiles of bf16 at batch <= 64 are
# not (integer lane-ops per weight over 2.5), so bf16 has only the default there.
_MMA_CANDIDATES = {
    16: [(128, 4, 4), (64, 4, 4)],
    32: [(128, 4, 4), (64, 4, 4)],
    64: [(256, 8, 3), (128, 4, 3)],
    128: [(256, 8, 3), (128, 8, 3)],
}


def swar_config(
    rows: int,
    out_features: int,
    chunks: int,
    fp32: bool,
    sms: int,
    split_k: int | None = None,
    choice: int = 0,
    bf16: bool = False,
) -> SwarConfig:
    """The kernel and tiles for ``rows`` of x times a weight of ``out_features`` rows and
    ``chunks`` chunks of :data:`CHUNK_WORDS` words (see the module docstring); ``choice``
    picks one of the :func:`candidates` for ``bf16`` or fp16 activations (0: the default).

    fp16/bf16 run the tensor-core kernel at every batch: its decoded tile is the register
    operand of the MMA, the batch the narrow side (16 at least), and async copies keep code
    bytes in flight (the static check's figures per weight are below the GEMV's). fp32
    activations multiply in IEEE fp32 (no TF32): the GEMV up to :data:`GEMV_MAX_ROWS` rows, then
    an FMA tile. ``split_k`` (default, where the default tiles alone leave SMs idle: the most
    splits that still start in one round, two CTAs of 4 warps an SM on tensor cores, one CTA
    an SM otherwise, at most 16) is clamped so that every split gets a
    chunk.

    Example:
        >>> swar_config(1, 4096, 32, fp32=False, sms=132)
        SwarConfig(kernel='mma', block_m=16, block_n=128, block_w=16, split_k=8, num_warps=4, num_stages=4)
    """  # noqa: E501
    tiles = _tilings(rows, fp32, bf16)
    if choice >= len(tiles):
        raise ValueError(f"no tiling {choice} for {rows} rows")
    default, cfg = tiles[0], tiles[choice]
    steps = -(-chunks * CHUNK_WORDS // cfg.block_w)
    if split_k is None:  # the most splits whose CTAs start in one round with 8 warps an SM
        # (two CTAs of 4, one of 8): a second round for a few SMs costs more than the SMs the
        # last split leaves idle, and a scheduler needs two warps to hide a decode loop's
        # dependences (the time model, inq.kernels.model, and Nsight Compute on the H200)
        count = -(-rows // default.block_m) * -(-out_features // default.block_n)
        per_sm = _WARPS_PER_SM // default.num_warps if default.kernel == "mma" else 1
        slots = sms * max(1, per_sm)
        split_k = min(_MAX_SPLIT, max(1, slots // count)) if count < slots else 1
    split_k = max(1, min(split_k, steps))
    split_k = -(-steps // -(-steps // split_k))  # no empty split
    return SwarConfig(cfg.kernel, cfg.block_m, cfg.block_n, cfg.block_w, split_k,
                      cfg.num_warps, cfg.num_stages)  # fmt: skip


def candidates(rows: int, fp32: bool, bf16: bool = False) -> int:
    """How many tilings :func:`swar_config` offers for ``rows`` of x (see its ``choice``)."""
    return len(_tilings(rows, fp32, bf16))


def _tilings(rows: int, fp32: bool, bf16: bool) -> list[SwarConfig]:
    """The tilings on offer for ``rows`` of x, K not yet split."""
    if fp32 and rows <= GEMV_MAX_ROWS:
        block_m = triton.next_power_of_2(rows)
        # (weight rows, words) per step: the fewest lane-ops per weight without spills
        block_n, block_w = {1: (64, 32), 2: (64, 16), 4: (64, 16), 8: (32, 32)}[block_m]
        return [SwarConfig("gemv", block_m, block_n, block_w, 1, 4, 1)]
    if fp32:
        return [SwarConfig("mma", 32, 64, CHUNK_WORDS, 1, 4, 3)]
    block_m = min(128, max(16, triton.next_power_of_2(rows)))
    options = _MMA_CANDIDATES[block_m][: 1 if bf16 and block_m <= 64 else None]
    return [SwarConfig("mma", block_m, n, CHUNK_WORDS, 1, warps, stages)
            for n, warps, stages in options]  # fmt: skip


@functools.lru_cache(maxsize=1024)
def _launch_options(
    rows: int, n: int, chunks: int, fp32: bool, sms: int, split_k: int | None, bf16: bool
) -> tuple[SwarConfig, ...]:
    """Every tiling :func:`swar_config` offers for one call's shape, made once per shape."""
    return tuple(swar_config(rows, n, chunks, fp32, sms, split_k, choice, bf16)
                 for choice in range(candidates(rows, fp32, bf16)))  # fmt: skip


# (device, dtype, layout, rows bucket, out_features, words per row, split_k) -> chosen candidate
_CHOSEN: dict[tuple, int] = {}


def choose(key: tuple, count: int, run: Callable[[int], None], timer=None) -> int:
    """The candidate of ``count`` that runs fastest, timed once per ``key`` on the GPU (each
    run once to compile, then the median of 3) and remembered; 0 without a choice to make,
    under the interpreter, or while a CUDA graph is being captured.

    Example:
        >>> choose(("doc",), 3, run=lambda i: None, timer=lambda run, i: [5.0, 2.0, 9.0][i])
        1
        >>> choose(("doc",), 3, run=lambda i: None)  # remembered: not timed again
        1
    """
    if key in _CHOSEN:
        return _CHOSEN[key]
    if count == 1:
        return 0
    if timer is None:
        if not torch.cuda.is_available() or torch.cuda.is_current_stream_capturing():
            return 0
        timer = _median_ms
    _CHOSEN[key] = min(range(count), key=lambda i: timer(run, i))
    return _CHOSEN[key]


def remembered(key: tuple) -> int:
    """The candidate :func:`choose` picked for ``key``, else the default (0)."""
    return _CHOSEN.get(key, 0)


def _median_ms(run: Callable[[int], None], index: int) -> float:
    run(index)  # compile and load
    times = []
    for _ in range(3):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run(index)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[1]


def swar_linear(
    x: Tensor, weight: KernelWeight, bias: Tensor | None, out: Tensor, sms: int,
    split_k: int | None = None,
) -> None:  # fmt: skip
    """``out = x @ W.T + bias`` for 2-d contiguous ``x`` and ``weight`` in the kernel layout;
    ``bias`` (if any) in ``x``'s dtype. On a GPU the first call of a shape times the
    candidate tilings (:func:`choose`); they give the same result."""
    options, key = _offer(x, weight, sms, split_k)
    count = len(options) if x.is_cuda else 1
    best = choose(key, count, lambda i: launch(x, weight, bias, out, options[i]))
    launch(x, weight, bias, out, options[best])


def _offer(
    x: Tensor, weight: KernelWeight, sms: int, split_k: int | None
) -> tuple[tuple[SwarConfig, ...], tuple]:
    """The tilings on offer for one call, and the key :func:`choose` remembers its pick by."""
    n, kw = weight.words.shape
    options = _launch_options(x.shape[0], n, kw // CHUNK_WORDS, x.dtype == torch.float32, sms,
                              split_k, weight.fmt == "bf16")  # fmt: skip
    return options, (x.device, x.dtype, weight.per_word, options[0].block_m, n, kw,
                     options[0].split_k)  # fmt: skip


def offered(
    x: Tensor, weight: KernelWeight, sms: int, split_k: int | None = None
) -> tuple[tuple[SwarConfig, ...], int]:
    """The tilings :func:`swar_linear` offers for ``x`` and ``weight``, and the index of the
    one it runs: the pick :func:`choose` remembers for them, else the default (0).

    Example::

        options, chosen = offered(x, weight, sm_count(x.device))
        launch(x, weight, None, out, options[chosen])
    """
    options, key = _offer(x, weight, sms, split_k)
    return options, remembered(key)


def launch(x: Tensor, weight: KernelWeight, bias: Tensor | None, out: Tensor,
           cfg: SwarConfig) -> None:  # fmt: skip
    """``out = x @ W.T + bias`` with the tiling ``cfg`` (one of :func:`offered`)."""
    m, k = x.shape
    n, kw = weight.words.shape
    fp32 = x.dtype == torch.float32
    if weight.paired == fp32:  # the tensor-core kernel reads the paired layout, the rest not
        raise ValueError(f"a {'paired' if weight.paired else 'plain'} layout is not for "
                         f"{x.dtype} activations")  # fmt: skip
    part = out if cfg.split_k == 1 else x.new_empty((cfg.split_k, m, n), dtype=torch.float32)
    b = out if bias is None else bias  # any pointer: unused without HAS_BIAS
    steps = -(-kw // cfg.block_w)
    per_split = -(-steps // cfg.split_k)
    if cfg.kernel == "gemv":
        _gemv_kernel[(triton.cdiv(n, cfg.block_n), cfg.split_k)](
            x, weight.words, weight.scale, b, out, part,
            m, n, k, kw, x.stride(0), per_split * cfg.block_w,
            PER_WORD=weight.per_word, HAS_BIAS=bias is not None, BLOCK_M=cfg.block_m,
            BLOCK_O=cfg.block_n, BLOCK_W=cfg.block_w, SPLIT_K=cfg.split_k,
            num_warps=cfg.num_warps, num_stages=cfg.num_stages,
        )  # fmt: skip
    else:
        tiles = triton.cdiv(m, cfg.block_m) * triton.cdiv(n, cfg.block_n)
        _mma_kernel[(tiles, cfg.split_k)](
            x, weight.words, weight.scale, b, out, part,
            m, n, k, kw, x.stride(0), per_split,
            PER_WORD=weight.per_word, BF16=weight.fmt == "bf16", HAS_BIAS=bias is not None,
            IEEE=fp32 or dot_upcast(x.dtype), BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
            SPLIT_K=cfg.split_k, GROUP_N=8, PACKED=not fp32,
            num_warps=cfg.num_warps, num_stages=cfg.num_stages,
        )  # fmt: skip
    if cfg.split_k > 1:
        reduce_partials(part, weight.scale, bias, out)
