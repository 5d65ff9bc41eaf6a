"""Power-of-two codes packed into rows: the one codec of the packed file and the kernels.

A quantized weight ``[O, ...]`` is flattened to ``[O, K]`` (``weight.reshape(O, -1)`` order) and
encoded with :func:`inq.pow2.pow2_encode`; each row is packed on its own into
``ceil(K * width / 8)`` bytes, ``width = 4`` when ``bits <= 4`` (nibbles: element ``k`` in byte
``k // 2``, low nibble for even ``k``; an odd row ends in a zero padding nibble) and ``8``
otherwise (one code per byte). Depends on :mod:`inq.pow2` only, so the kernels need no file
format.
"""

from __future__ import annotations

import math

import torch

from inq.pow2 import N1, check_bits, decode_unchecked

__all__ = [
    "code_width",
    "codes_problem",
    "decode_weight",
    "pack_codes",
    "row_bytes",
    "unpack_codes",
]


def code_width(bits: int) -> int:
    """Bits one code takes in a packed row: 4 (nibble) for ``bits <= 4``, else 8 (byte).

    Example:
        >>> code_width(3), code_width(5)
        (4, 8)
    """
    return 4 if check_bits(bits) <= 4 else 8


def row_bytes(k: int, bits: int) -> int:
    """Bytes of one packed row of ``k`` codes: ``ceil(k * width / 8)``.

    Example:
        >>> row_bytes(9, 4), row_bytes(9, 5)
        (5, 9)
    """
    return (k * code_width(bits) + 7) // 8


def pack_codes(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """Pack ``uint8`` codes of shape ``[O, ...]`` into ``uint8 [O, row_bytes(K, bits)]``.

    Runs on the codes' device. Codes must fit in ``bits`` bits; whether they are valid level
    codes is :func:`codes_problem`'s job.

    Example:
        >>> pack_codes(torch.tensor([[4, 7, 5]], dtype=torch.uint8), bits=3)
        tensor([[116,   5]], dtype=torch.uint8)

    Raises:
        ValueError: if the codes are not a ``uint8`` tensor of at least one dimension, or a code
            does not fit in ``bits`` bits.
    """
    if codes.dtype != torch.uint8 or codes.dim() == 0:
        raise ValueError(
            f"pack_codes needs uint8 codes of shape [O, ...], got {codes.dtype} {list(codes.shape)}"
        )
    if bool((codes >> check_bits(bits)).any()):
        raise ValueError(f"pack_codes: a code does not fit in {bits} bits")
    rows = codes.reshape(codes.shape[0], math.prod(codes.shape[1:]))
    if code_width(bits) == 8:
        return rows.contiguous()
    if rows.shape[1] % 2:
        rows = torch.nn.functional.pad(rows, (0, 1))
    return rows[:, 0::2] | (rows[:, 1::2] << 4)


def unpack_codes(packed: torch.Tensor, bits: int, k: int) -> torch.Tensor:
    """Inverse of :func:`pack_codes`: ``uint8 [O, row_bytes]`` to codes ``uint8 [O, k]``.

    Runs on the packed tensor's device; reshape the result to the weight's shape.

    Example:
        >>> unpack_codes(torch.tensor([[116, 5]], dtype=torch.uint8), bits=3, k=3)
        tensor([[4, 7, 5]], dtype=torch.uint8)

    Raises:
        ValueError: if ``packed`` is not ``uint8 [O, row_bytes(k, bits)]``.
    """
    expected = row_bytes(k, bits)
    if packed.dtype != torch.uint8 or packed.dim() != 2 or packed.shape[1] != expected:
        raise ValueError(
            f"unpack_codes: expected uint8 [O, {expected}] for {k} {bits}-bit codes per row, "
            f"got {packed.dtype} {list(packed.shape)}"
        )
    if code_width(bits) == 8:
        return packed
    nibbles = torch.stack((packed & 0xF, packed >> 4), dim=-1)
    return nibbles.reshape(packed.shape[0], 2 * expected)[:, :k]


def decode_weight(
    packed: torch.Tensor, bits: int, n1: N1, shape: tuple[int, ...], dtype: torch.dtype
) -> torch.Tensor:
    """The weight of ``shape`` and ``dtype`` that packed codes stand for (no validation).

    Codes are trusted here (this runs inside the inference ops); files are checked once, when
    :func:`inq.packed.load_packed` reads them. ``n1`` is an int or a tensor ``[O]`` (one per row).

    Example:
        >>> packed = pack_codes(torch.tensor([[4, 7], [0, 5]], dtype=torch.uint8), bits=3)
        >>> decode_weight(packed, bits=3, n1=-1, shape=(2, 2), dtype=torch.float32)
        tensor([[ 0.5000, -0.2500],
                [ 0.0000,  0.2500]])
    """
    codes = unpack_codes(packed, bits, math.prod(shape[1:]))
    return decode_unchecked(codes, n1, bits, dtype).reshape(shape)


def codes_problem(codes: torch.Tensor, bits: int) -> str | None:
    """Why ``codes`` are not all valid ``bits``-bit level codes, or None if they are.

    Valid codes are 0 and ``2**(bits-1) .. 2**bits - 1`` (top bit set, then sign and offset).

    Example:
        >>> codes_problem(torch.tensor([0, 4, 7], dtype=torch.uint8), bits=3)
        >>> codes_problem(torch.tensor([0, 1, 8], dtype=torch.uint8), bits=3)
        '2 code(s) outside the 3-bit level set (first: 1 at flat index 1; valid: 0 and 4..7)'
    """
    top, c = 1 << (bits - 1), codes.to(torch.int32)  # 2 * top = 256 does not fit in uint8
    bad = (c != 0) & ((c < top) | (c >= 2 * top))
    if not bool(bad.any()):
        return None
    index = int(bad.flatten().nonzero()[0])
    return (
        f"{int(bad.sum())} code(s) outside the {bits}-bit level set (first: "
        f"{int(codes.flatten()[index])} at flat index {index}; valid: 0 and {top}..{2 * top - 1})"
    )
