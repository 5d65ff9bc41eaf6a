"""Sparse storage of one layer's power-of-two codes: a bitmap or relative gaps, plus the values.

A layer's ``bits``-bit codes (see :mod:`inq.pow2`: 0 is a zero weight, every other code has its
top bit ``2**(bits-1)`` set) are taken in flat order (``codes.flatten()``, row-major) and
stored as a :class:`SparseCodes`: two ``uint8`` byte strings, ``values`` and ``index``, and
three counts, ``nonzero``, ``gap_bits`` and ``symbols``. The reader must know ``bits`` and the
number of codes ``numel`` (the layer's shape) from elsewhere.

Bit streams. Both byte strings are little-endian bit streams of fixed-width unsigned fields
(:func:`pack_bits`): field ``i`` of width ``w`` occupies stream bits ``i*w .. i*w+w-1``, its bit
``j`` (``j = 0`` is the field's least significant bit) at stream bit ``i*w + j``, and stream bit
``t`` is bit ``t % 8`` (``0`` = least significant) of byte ``t // 8``. A stream of ``n`` fields
is exactly ``ceil(n*w / 8)`` bytes long; the padding bits after the last field are zero.

``values``: the ``nonzero`` non-zero codes in flat order, each without its always-set top bit
(``code - 2**(bits-1)``), as fields of width ``bits - 1``.

``index``, layout ``"bitmap"`` (``gap_bits = symbols = 0``): ``numel`` fields of width 1, field
``k`` set iff code ``k`` is non-zero.

``index``, layout ``"gaps"`` (relative gaps, as in Deep Compression but with an escape symbol
instead of filler zeros): ``symbols`` fields of width ``g = gap_bits`` (2..8); let
``M = 2**g - 1``. Let ``z_i`` be the number of zero codes between non-zero ``i-1`` and non-zero
``i`` (for the first non-zero: the zeros before it). Each ``z_i`` is written as ``z_i // M``
escape symbols ``M`` (skip ``M`` zeros, no value) followed by one value symbol ``z_i % M``
(skip that many zeros, then the next non-zero). Zeros after the last non-zero are not written,
so the last symbol is a value symbol and there are exactly ``nonzero`` value symbols.

:func:`encode_sparse` stores the smaller of the bitmap and the gaps at each ``g`` (size =
``len(values) + len(index)`` bytes; ties go to the bitmap, then to the smaller ``g``);
:func:`decode_sparse` restores the codes bit for bit and rejects any inconsistent input.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from inq.pow2 import check_bits

__all__ = ["LAYOUTS", "SparseCodes", "decode_sparse", "encode_sparse", "pack_bits", "unpack_bits"]

LAYOUTS = ("bitmap", "gaps")
GAP_BITS = tuple(range(2, 9))


def _check_int(name: str, value: object, low: int, high: int | None = None) -> int:
    """``value`` if it is an int in ``low..high``; ValueError naming ``name`` otherwise."""
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
    if high is not None and value > high:
        raise ValueError(f"{name} must be an integer from {low} to {high}, got {value!r}")
    return value


def pack_bits(values: torch.Tensor, width: int) -> torch.Tensor:
    """Pack integers in ``[0, 2**width)`` into a little-endian bit stream of ``width``-bit fields.

    Returns ``uint8 [ceil(n * width / 8)]`` on the values' device (see the module docstring).

    Example:
        >>> pack_bits(torch.tensor([1, 3, 0, 2]), width=2)
        tensor([141], dtype=torch.uint8)

    Raises:
        ValueError: if ``width`` is not in 1..8, ``values`` is not a 1-D integer tensor, or a
            value is outside ``[0, 2**width)``.
    """
    _check_int("width", width, 1, 8)
    dtype = values.dtype if isinstance(values, torch.Tensor) else None
    if dtype is None or dtype.is_floating_point or dtype.is_complex or dtype == torch.bool:
        raise ValueError(f"pack_bits needs an integer tensor, got {dtype or type(values)}")
    if values.dim() != 1:
        raise ValueError(f"pack_bits needs a 1-D tensor, got shape {list(values.shape)}")
    if values.numel():
        low, high = (int(m) for m in torch.aminmax(values))
        if low < 0 or high >= 1 << width:
            raise ValueError(f"pack_bits: values {low}..{high} do not fit in {width} bits")
    nbytes = (values.numel() * width + 7) // 8
    shifts = torch.arange(8, dtype=torch.uint8, device=values.device)
    stream = ((values.to(torch.uint8)[:, None] >> shifts[:width]) & 1).flatten()
    stream = torch.nn.functional.pad(stream, (0, 8 * nbytes - stream.numel()))
    return (stream.view(nbytes, 8) << shifts).sum(dim=1, dtype=torch.uint8)  # no carries: = OR


def unpack_bits(data: torch.Tensor, width: int, count: int) -> torch.Tensor:
    """Inverse of :func:`pack_bits`: the first ``count`` ``width``-bit fields, ``uint8 [count]``.

    Example:
        >>> unpack_bits(torch.tensor([141], dtype=torch.uint8), width=2, count=4)
        tensor([1, 3, 0, 2], dtype=torch.uint8)

    Raises:
        ValueError: if ``width`` or ``count`` is bad, ``data`` is not ``uint8`` 1-D of exactly
            ``ceil(count * width / 8)`` bytes, or a padding bit after the last field is set.
    """
    _check_int("width", width, 1, 8)
    _check_int("count", count, 0)
    nbytes = (count * width + 7) // 8
    if (
        not isinstance(data, torch.Tensor)
        or data.dtype != torch.uint8
        or data.dim() != 1
        or data.numel() != nbytes
    ):
        got = f"{data.dtype} {list(data.shape)}" if isinstance(data, torch.Tensor) else type(data)
        raise ValueError(f"expected uint8 [{nbytes}] for {count} {width}-bit fields, got {got}")
    shifts = torch.arange(8, dtype=torch.uint8, device=data.device)
    stream = ((data[:, None] >> shifts) & 1).flatten()
    if bool(stream[count * width :].any()):
        raise ValueError(f"bits set beyond the {count} {width}-bit fields (padding must be zero)")
    fields = stream[: count * width].view(count, width) << shifts[:width]
    return fields.sum(dim=1, dtype=torch.uint8)


@dataclass(frozen=True, eq=False)
class SparseCodes:
    """One layer's codes in sparse form (format in the module docstring).

    ``values`` and ``index`` are ``uint8`` byte strings; ``gap_bits`` and ``symbols`` are 0 for
    the bitmap layout. Equality is identity (the fields are tensors).
    """

    layout: str
    values: torch.Tensor
    index: torch.Tensor
    nonzero: int
    gap_bits: int = 0
    symbols: int = 0

    @property
    def nbytes(self) -> int:
        """Stored size in bytes: ``len(values) + len(index)``."""
        return self.values.numel() + self.index.numel()


def encode_sparse(
    codes: torch.Tensor, bits: int, *, layout: str | None = None, gap_bits: int | None = None
) -> SparseCodes:
    """The smallest sparse encoding of ``bits``-bit codes (any shape, taken flat).

    Ties go to the bitmap, then to the smaller gap width. ``layout`` and ``gap_bits`` restrict
    the choice (``gap_bits`` implies ``layout="gaps"``), e.g. to build one candidate.

    Example:
        >>> codes = torch.tensor([0, 5, 0, 0, 7] + [0] * 7 + [4] + [0] * 17, dtype=torch.uint8)
        >>> sparse = encode_sparse(codes, bits=3)
        >>> sparse.layout, sparse.gap_bits, sparse.symbols, sparse.nbytes
        ('gaps', 2, 5, 3)
        >>> sparse.values, sparse.index
        (tensor([13], dtype=torch.uint8), tensor([249,   1], dtype=torch.uint8))
        >>> torch.equal(decode_sparse(sparse, bits=3, numel=30), codes)
        True

    Raises:
        ValueError: if ``codes`` are not ``uint8``, hold a code that is not a valid ``bits``-bit
            level code, or ``layout``/``gap_bits`` rule out every candidate.
    """
    check_bits(bits)
    if not isinstance(codes, torch.Tensor) or codes.dtype != torch.uint8:
        raise ValueError(f"encode_sparse needs uint8 codes, got {getattr(codes, 'dtype', codes)}")
    flat = codes.flatten()
    bad = (flat != 0) & ((flat >> (bits - 1)) != 1)
    if bool(bad.any()):
        index = int(bad.nonzero()[0])
        raise ValueError(
            f"{int(bad.sum())} code(s) outside the {bits}-bit level set (first: "
            f"{int(flat[index])} at flat index {index}; valid: 0 and "
            f"{1 << (bits - 1)}..{(1 << bits) - 1})"
        )
    mask = flat != 0
    where = mask.nonzero().flatten()
    zeros = torch.diff(where, prepend=where.new_full((1,), -1)) - 1  # z_i
    nonzero = where.numel()
    sizes = {("bitmap", 0): (flat.numel() + 7) // 8}
    for g in GAP_BITS:
        sizes["gaps", g] = ((nonzero + int((zeros // ((1 << g) - 1)).sum())) * g + 7) // 8
    allowed = [
        key
        for key in sizes
        if (layout is None or key[0] == layout) and (gap_bits is None or key == ("gaps", gap_bits))
    ]
    if not allowed:
        raise ValueError(f"no encoding has layout={layout!r} and gap_bits={gap_bits!r}")
    chosen, g = min(allowed, key=lambda key: sizes[key])  # min keeps the first of equal sizes
    values = pack_bits(flat[mask] - (1 << (bits - 1)), bits - 1)
    if chosen == "bitmap":
        return SparseCodes("bitmap", values, pack_bits(mask.view(torch.uint8), 1), nonzero)
    escape = (1 << g) - 1
    runs = zeros // escape + 1  # symbols per non-zero: the escapes, then its value symbol
    ends = torch.cumsum(runs, 0) - 1
    symbols = torch.full((int(runs.sum()),), escape, dtype=torch.uint8, device=flat.device)
    symbols[ends] = (zeros % escape).to(torch.uint8)
    return SparseCodes("gaps", values, pack_bits(symbols, g), nonzero, g, symbols.numel())


def decode_sparse(sparse: SparseCodes, bits: int, numel: int) -> torch.Tensor:
    """The flat ``uint8 [numel]`` codes that ``sparse`` stores, bit for bit.

    Example:
        >>> sparse = encode_sparse(torch.tensor([0, 6, 0, 7], dtype=torch.uint8), bits=3)
        >>> decode_sparse(sparse, bits=3, numel=4)
        tensor([0, 6, 0, 7], dtype=torch.uint8)

    Raises:
        ValueError: if anything is inconsistent: an unknown layout, a count out of range, byte
            strings of the wrong length or with padding bits set, a bitmap whose popcount is not
            ``nonzero``, gaps whose value symbols are not ``nonzero`` or reach past ``numel``.
    """
    check_bits(bits)
    _check_int("numel", numel, 0)
    if sparse.layout not in LAYOUTS:
        raise ValueError(f"unknown sparse layout {sparse.layout!r} (expected one of {LAYOUTS})")
    nonzero = _check_int("nonzero", sparse.nonzero, 0, numel)
    values = _unpack("values", sparse.values, bits - 1, nonzero)
    if sparse.layout == "bitmap":
        if sparse.gap_bits != 0 or sparse.symbols != 0:
            raise ValueError(
                f"a bitmap has gap_bits = symbols = 0, got {sparse.gap_bits!r}, {sparse.symbols!r}"
            )
        mask = _unpack("bitmap index", sparse.index, 1, numel)
        positions = mask.nonzero().flatten()
        if positions.numel() != nonzero:
            raise ValueError(f"bitmap has {positions.numel()} bits set but nonzero = {nonzero}")
    else:
        g = _check_int("gap_bits", sparse.gap_bits, GAP_BITS[0], GAP_BITS[-1])
        count = _check_int("symbols", sparse.symbols, 0)
        symbols = _unpack("gaps index", sparse.index, g, count).to(torch.int64)
        is_value = symbols != (1 << g) - 1
        found = int(is_value.sum())
        if found != nonzero:
            raise ValueError(f"gaps hold {found} value symbols but nonzero = {nonzero}")
        if count and not bool(is_value[-1]):
            raise ValueError("gaps end with an escape symbol (trailing zeros are not written)")
        # an escape advances by M, a value symbol s by s + 1 and lands on the last position
        positions = (torch.cumsum(symbols + is_value, 0) - 1)[is_value]
        if nonzero and int(positions[-1]) >= numel:
            raise ValueError(f"gaps place a value at position {int(positions[-1])} >= {numel}")
    out = torch.zeros(numel, dtype=torch.uint8, device=values.device)
    out[positions] = values + (1 << (bits - 1))
    return out


def _unpack(what: str, data: torch.Tensor, width: int, count: int) -> torch.Tensor:
    """:func:`unpack_bits`, with ``what`` named in its error."""
    try:
        return unpack_bits(data, width, count)
    except ValueError as err:
        raise ValueError(f"sparse {what}: {err}") from err
