"""The weight layout the linear kernels consume, made once per weight (never per call).

Packed codes (:mod:`inq.codes`, the file format) say "sign, offset ``o`` below ``n1``". The
kernels want something else: 16-bit floats they can build with one or two integer operations
per *pair* of weights, and ``n1`` out of the inner loop. So each row is re-encoded:

- ``n1`` is factored out: a level ``+-2**(n1 - o)`` is stored as ``+-2**(c_r - o)`` with a
  constant ``c_r`` per row, and the kernels multiply row ``r``'s fp32 sum once by
  ``2**scale[r]`` (``scale[r] = n1_r - c_r``), which is exact (a power of two). Per-row ``n1``
  (per-channel level sets) then costs one vector load per row tile.
- Levels the reference flushes in the activation dtype (below its smallest subnormal) are
  re-encoded as the zero code, so the kernels need no flush test.
- Codes are packed into int32 words, 8 nibbles or 4 bytes per word, each at the bit positions
  where a shift and a mask turn a *pair* of them into two fp16 or bf16 values in the halves of
  one word (SWAR). ``fmt`` says which: "fp16" (fp16 activations) or "bf16" (bf16 and fp32
  activations; a bf16 is the top half of an fp32, so the CUDA-core path widens it with a shift).
- Rows are cut into chunks of :data:`CHUNK_WORDS` words. Slot ``p`` of word ``w`` in chunk ``c``
  holds the weight of column ``k = c * CHUNK_WORDS * per_word + p * CHUNK_WORDS + w``: each slot
  of a chunk is 16 consecutive columns, so a kernel reads the activations it multiplies with
  contiguous loads, and a tensor core takes a slot as one K=16 step. Columns past ``K`` hold the
  zero code.
- ``paired`` (the layout of fp16/bf16 linear layers): words ``2j`` and ``2j + 1`` of a chunk
  are stored as the low halves of both, then the high halves of both. A decoded pair then
  holds two weights adjacent in K, the two halves of one register of the tensor cores'
  operand, with no instruction to bring them together (a half swap: its own inverse).

The stored values per code width and format (``o' = o - o_min`` of the row's live codes):

======== ====== ========================================= ===================================
width    fmt    stored level                              decoded by (per pair ``g``)
======== ====== ========================================= ===================================
nibble   fp16   ``+-2**(4 - o)``, ``o <= 3``               ``(w << (0, 2, 8, 10)[g]) & 0xCC00CC00``
nibble   bf16   ``+-2**(4 - o)``                           shifts 0, 2, 4 & 0xC180C180; pair 3 two
byte     fp16   ``+-2**(15 - o')`` (e5m2 = top fp16 byte)  ``(w << (0, 8)[g]) & 0xFF00FF00``
byte     bf16   ``+-2**(-o')``                             ``w & 0xBF80BF80``; pair 1 two shifts
======== ====== ========================================= ===================================

A weight this cannot hold exactly (fp16 byte codes whose live levels span more than 32 powers,
or a scale ``2**scale[r]`` outside the normal fp32 range) has no layout: :func:`kernel_weight`
returns ``None`` and the launcher uses the generic kernels, which decode the codes themselves.

Example:
    >>> from inq.codes import pack_codes
    >>> codes = torch.tensor([[8, 13, 0, 9]], dtype=torch.uint8)  # 2**n1, -2**(n1-1), 0, 2**(n1-1)
    >>> kw = kernel_weight(pack_codes(codes, 4), 4, -1, 4, torch.float16)
    >>> kw.words.shape, kw.scale.tolist(), kw.fmt
    (torch.Size([1, 16]), [-5], 'fp16')
    >>> torch.equal(dequantize(kw)[:, :4], torch.tensor([[0.5, -0.25, 0.0, 0.25]]))
    True
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import torch
from torch import Tensor

from inq.codes import code_width, unpack_codes
from inq.pow2 import check_top_level

__all__ = [
    "CHUNK_WORDS",
    "MIN_EXP",
    "KernelWeight",
    "cached_kernel_weight",
    "cached_layout",
    "chunk_columns",
    "dequantize",
    "kernel_weight",
    "layout_format",
]

T = TypeVar("T")
CHUNK_WORDS = 16
# exponent of the smallest power of two each activation dtype holds (its smallest subnormal)
MIN_EXP = {torch.float32: -149, torch.bfloat16: -133, torch.float16: -24}
# where the fields of a nibble code (sign, nonzero bit n, exponent bits j1, j0) sit in its
# 16-bit half, per pair g
_NIBBLE_FP16 = [(15, 14, 11, 10), (13, 12, 9, 8), (7, 6, 3, 2), (5, 4, 1, 0)]
_NIBBLE_BF16 = [(15, 14, 8, 7), (13, 12, 6, 5), (11, 10, 4, 3), (9, 0, 2, 1)]


@dataclass(frozen=True)
class KernelWeight:
    """A weight in the kernels' layout (see the module docstring).

    ``words`` is int32 ``[rows, chunks * CHUNK_WORDS]``; ``scale`` int32 ``[rows]``: row ``r``'s
    sums are multiplied by ``2**scale[r]``.
    """

    words: Tensor
    scale: Tensor
    per_word: int  # codes per int32 word: 8 (nibbles) or 4 (bytes)
    fmt: str  # "fp16" or "bf16": what a decoded pair of codes is
    paired: bool = False  # words 2j, 2j + 1 hold their low halves, then their high halves


def chunk_columns(bits: int) -> int:
    """Columns of one chunk of the layout: :data:`CHUNK_WORDS` words of ``bits``-bit codes.

    Example:
        >>> chunk_columns(4), chunk_columns(5)
        (128, 64)
    """
    return CHUNK_WORDS * 32 // code_width(bits)


def layout_format(dtype: torch.dtype) -> str:
    """The 16-bit format the kernels decode codes to for activations of ``dtype``."""
    return "fp16" if dtype == torch.float16 else "bf16"


def kernel_weight(
    packed: Tensor,
    bits: int,
    n1: int | Tensor,
    in_features: int,
    dtype: torch.dtype,
    paired: bool | None = None,
) -> KernelWeight | None:
    """``packed`` codes (``uint8 [rows, row_bytes]``, top exponent ``n1``: an int or one per
    row) in the layout of the kernels for ``dtype`` activations, or ``None`` where that layout
    cannot hold the weight exactly (see the module docstring). Runs on ``packed``'s device.
    ``paired`` (default: for fp16 and bf16, whose linear kernel multiplies on the tensor cores)
    stores the halves of word pairs together.

    Raises:
        ValueError: where a top level ``2**n1`` overflows ``dtype``.
    """
    check_top_level(n1, dtype)
    rows = packed.shape[0]
    device = packed.device
    codes = unpack_codes(packed, bits, in_features).to(torch.int32)
    n1_rows = (n1.to(device=device, dtype=torch.int64) if isinstance(n1, Tensor)
               else torch.full((rows,), int(n1), dtype=torch.int64, device=device))  # fmt: skip
    offset = codes & ((1 << (bits - 2)) - 1)
    sign = (codes >> (bits - 2)) & 1
    live = (codes != 0) & (n1_rows[:, None] - offset >= MIN_EXP[dtype])
    per_word = 32 // code_width(bits)
    fmt = layout_format(dtype)
    if per_word == 8:
        top = 4
        stored = 4 | (3 - offset)  # the nonzero bit n, then j of 2**(1 + j) = 2**(4 - o)
    else:  # levels relative to the row's largest live one (offset o_min)
        o_min = torch.where(live, offset, 63).amin(1) if in_features else offset.new_zeros(rows)
        rel = offset - o_min[:, None]
        if fmt == "fp16":
            if bool((live & (rel > 31)).any()):
                return None  # e5m2 holds 2**15 .. 2**-16: 32 powers
            # 2**(15 - rel): normal (exponent field 30 - rel), or the subnormals 2**-15, 2**-16
            stored = torch.where(rel <= 29, (30 - rel) << 2, 1 << (31 - rel).clamp(0, 1))
            top = 15 + o_min
        else:
            stored = 127 - rel  # the bf16 exponent field of 2**-rel
            top = o_min
    scale = n1_rows - top
    any_live = live.any(1)
    if bool((any_live & ((scale < -126) | (scale > 127))).any()):
        return None  # 2**scale is no normal fp32: the generic kernels
    scale = torch.where(any_live, scale, 0).to(torch.int32)
    field = torch.where(live, (sign << (7 if per_word == 4 else 3)) | stored, 0)
    words = _pack(field, per_word, fmt)
    paired = dtype != torch.float32 if paired is None else paired
    return KernelWeight(_pair_halves(words) if paired else words, scale, per_word, fmt, paired)


# id(packed) -> (weak reference to packed, {key: (versions, weak reference to the per-row
# tensor or None, layout)}); by id, as tensors do not hash by
# value, and dropped when packed dies
_CACHE: dict[int, tuple[weakref.ref, dict]] = {}


def _entries(packed: Tensor) -> dict:
    held = _CACHE.get(id(packed))
    if held is None or held[0]() is not packed:
        key = id(packed)

        def forget(ref: weakref.ref) -> None:
            if _CACHE.get(key, (None,))[0] is ref:
                del _CACHE[key]

        held = _CACHE[key] = (weakref.ref(packed, forget), {})
    return held[1]


def cached_kernel_weight(
    packed: Tensor,
    bits: int,
    n1: int | Tensor,
    in_features: int,
    dtype: torch.dtype,
    n1_rows: Tensor | None = None,
) -> KernelWeight | None:
    """:func:`kernel_weight` (top exponents ``n1``, plus ``n1_rows`` per row if given), made
    once per weight and kept as long as ``packed`` lives.

    The entry belongs to the ``packed`` tensor object (and to the per-row tensor, if any):
    replacing one gives a new entry, and changing one in place (which bumps its version
    counter) rebuilds it, so a layout is never stale. Entries of per-row tensors that died are
    dropped.

    Example:
        >>> from inq.codes import pack_codes
        >>> packed = pack_codes(torch.tensor([[8, 13]], dtype=torch.uint8), 4)
        >>> first = cached_kernel_weight(packed, 4, 0, 2, torch.float16)
        >>> first is cached_kernel_weight(packed, 4, 0, 2, torch.float16)
        True
        >>> packed.fill_(0x88)  # in place: the next call rebuilds
        tensor([[136]], dtype=torch.uint8)
        >>> first is cached_kernel_weight(packed, 4, 0, 2, torch.float16)
        False
    """
    rows = n1 if isinstance(n1, Tensor) else n1_rows
    base = 0 if isinstance(n1, Tensor) else int(n1)
    key = (bits, in_features, dtype, base, None if rows is None else id(rows))

    def build() -> KernelWeight | None:
        effective = n1 if rows is None else rows.to(torch.int64) + base
        return kernel_weight(packed, bits, effective, in_features, dtype)

    return cached_layout(packed, key, build, rows)


def cached_layout(
    packed: Tensor, key: tuple, build: Callable[[], T], rows: Tensor | None = None
) -> T:
    """``build()``, made once per ``packed`` tensor object and ``key`` (and per-row tensor
    ``rows``, if any), rebuilt when either changes in place, dropped when ``packed`` dies.

    Inference tensors (made under ``torch.inference_mode``) have no version counter: for them
    the layout is made once, and an in-place change of one (possible only in inference mode)
    is not seen; move or load a model outside inference mode to keep that guarantee."""
    versions = (_version(packed), 0 if rows is None else _version(rows))
    entries = _entries(packed)
    hit = entries.get(key)
    if hit is not None and hit[0] == versions and (hit[1] is None or hit[1]() is rows):
        return hit[2]
    for stale in [k for k, (_, ref, _) in entries.items() if ref is not None and ref() is None]:
        del entries[stale]
    layout = build()
    entries[key] = (versions, None if rows is None else weakref.ref(rows), layout)
    return layout


def _version(t: Tensor) -> int:
    return -1 if t.is_inference() else t._version


def _pack(field: Tensor, per_word: int, fmt: str) -> Tensor:
    """Per-weight fields (sign on top of the exponent bits: 4 or 8 bits) into int32 words."""
    rows, k = field.shape
    chunk = CHUNK_WORDS * per_word
    chunks = -(-k // chunk)
    padded = torch.zeros(rows, max(chunks, 1) * chunk, dtype=torch.int64, device=field.device)
    padded[:, :k] = field
    slots = padded.view(rows, -1, per_word, CHUNK_WORDS)  # [rows, chunk, slot p, word w]
    words = torch.zeros(rows, slots.shape[1], CHUNK_WORDS, dtype=torch.int64, device=field.device)
    for p in range(per_word):
        g, half = divmod(p, 2)
        words |= _place(slots[:, :, p], g, per_word, fmt) << (16 * half)
    return _int32(words).view(rows, -1)


def _pair_halves(words: Tensor) -> Tensor:
    """Words ``2j`` and ``2j + 1`` of each chunk as (the low halves of both, the high halves of
    both): the high half of the first and the low half of the second trade places. Applied
    twice, the words come back."""
    rows = words.shape[0]
    a, b = (words.to(torch.int64) & 0xFFFFFFFF).view(rows, -1, 2).unbind(-1)
    low = (a & 0xFFFF) | ((b & 0xFFFF) << 16)
    high = (a >> 16) | (b & 0xFFFF0000)
    return _int32(torch.stack((low, high), -1).view(rows, -1))


def _int32(words: Tensor) -> Tensor:
    """Unsigned 32-bit words held in int64 as the int32 of the same bits."""
    return torch.where(words >= 1 << 31, words - (1 << 32), words).to(torch.int32)


def _place(field: Tensor, g: int, per_word: int, fmt: str) -> Tensor:
    """The 16-bit half holding ``field`` as code of pair ``g``."""
    if per_word == 4:  # byte: sign bit 7, exponent bits 6..0
        if fmt == "fp16":  # the e5m2 byte is the top byte of the fp16 (pair 0) or the low one
            return field << (8 if g == 0 else 0)
        if g == 0:  # bf16 sign at 15, exponent field 0xxxxxxx at bits 14..7
            return ((field & 0x80) << 8) | ((field & 0x7F) << 7)
        return ((field & 0x80) << 7) | (field & 0x7F)  # sign at 14, exponent at 6..0
    positions = (_NIBBLE_FP16 if fmt == "fp16" else _NIBBLE_BF16)[g]  # sign, n, j1, j0
    out = torch.zeros_like(field)
    for bit, position in zip((3, 2, 1, 0), positions, strict=True):
        out |= ((field >> bit) & 1) << position
    return out


def dequantize(weight: KernelWeight) -> Tensor:
    """The fp32 weight ``[rows, chunks * chunk]`` that ``weight`` stands for, decoded the way the
    kernels decode it (SWAR masks, then ``2**scale``): the layout's own test oracle."""
    stored = _pair_halves(weight.words) if weight.paired else weight.words
    words = stored.to(torch.int64) & 0xFFFFFFFF
    rows = words.shape[0]
    words = words.view(rows, -1, CHUNK_WORDS)
    slots = []
    for p in range(weight.per_word):
        g, half = divmod(p, 2)
        pair = _decode_pair(words, g, weight.per_word, weight.fmt)
        bits16 = (pair >> (16 * half)) & 0xFFFF
        slots.append(_half_to_float(bits16, weight.fmt))
    value = torch.stack(slots, 2).view(rows, -1)  # [rows, chunk, slot, word] flattened
    return value * torch.exp2(weight.scale.double())[:, None].float()


def _decode_pair(w: Tensor, g: int, per_word: int, fmt: str) -> Tensor:
    """The kernels' SWAR decode of pair ``g``: two 16-bit floats in one 32-bit word."""
    shl = lambda v, n: (v << n) & 0xFFFFFFFF  # noqa: E731
    if per_word == 4:
        if fmt == "fp16":
            return shl(w, 8 * g) & 0xFF00FF00
        if g == 0:
            return w & 0xBF80BF80
        return (shl(w, 1) & 0x80008000) | (shl(w, 7) & 0x3F803F80)
    if fmt == "fp16":
        return shl(w, (0, 2, 8, 10)[g]) & 0xCC00CC00
    if g < 3:
        return shl(w, 2 * g) & 0xC180C180
    return (shl(w, 6) & 0x81808180) | (shl(w, 14) & 0x40004000)


def _half_to_float(bits16: Tensor, fmt: str) -> Tensor:
    view = torch.float16 if fmt == "fp16" else torch.bfloat16
    signed = torch.where(bits16 >= 1 << 15, bits16 - (1 << 16), bits16).to(torch.int16)
    return signed.view(view).float()
