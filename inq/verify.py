"""Verify an export: every quantized weight lies in its layer's level set, every mask is full,
every other tensor is one a trained model can hold, and the contents match their digest.

Works on masked checkpoints (:mod:`inq.masked`) and packed files (:mod:`inq.packed`), which
define what is valid (:func:`inq.masked.masked_layer_problem`, :func:`inq.masked.masked_problems`,
:meth:`inq.packed.PackedFile.problems`); the report names each offending tensor and says why,
and counts the levels each layer uses. QONNX files (:func:`verify_qonnx`): each Conv/Gemm
weight against the level set the file records for its layer. A digest recomputed after an edit
proves nothing about the contents: an impossible tensor fails whatever the digest says.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from inq.artefact import Header, open_artefact, read_header
from inq.fileio import metadata_n1
from inq.levels import describe_n1
from inq.masked import (
    MASKED_FORMATS,
    MaskedCheckpoint,
    masked_layer_problem,
    masked_problems,
    state_problems,
)
from inq.packed import PACKED_FORMATS, PackedFile
from inq.pow2 import N1, pow2_encode

__all__ = [
    "LayerReport",
    "VerifyReport",
    "verify_file",
    "verify_masked",
    "verify_packed",
    "verify_qonnx",
]


@dataclass(frozen=True)
class LayerReport:
    """One quantized tensor: its settings, the distinct levels it uses, its fraction of zeros,
    and ``problem`` (None when it verifies)."""

    key: str
    bits: int
    n1: N1 | None  # None: a masked layer never partitioned (its problem says so)
    levels_used: int | None
    zeros: float | None
    problem: str | None = None

    @property
    def levels(self) -> int:
        """Size of the layer's level set: ``2**(bits-1) + 1``."""
        return (1 << (self.bits - 1)) + 1


@dataclass(frozen=True)
class VerifyReport:
    """The result of verifying one file (``kind`` is ``"masked"``, ``"packed"`` or ``"QONNX"``):
    one report
    per quantized layer, the digest's problem, and ``(key, problem)`` for every other tensor or
    metadata entry that is invalid."""

    path: str
    kind: str
    layers: tuple[LayerReport, ...]
    digest_problem: str | None = None
    other_problems: tuple[tuple[str, str], ...] = ()

    @property
    def ok(self) -> bool:
        return self.file_problem is None and all(layer.problem is None for layer in self.layers)

    @property
    def file_problem(self) -> str | None:
        """The first problem outside the quantized layers: an invalid tensor or metadata entry
        (``"'<key>': <why>"``), else the digest's; None if there is none."""
        if self.other_problems:
            key, problem = self.other_problems[0]
            return f"{key!r}: {problem}"
        return self.digest_problem

    @property
    def first_problem(self) -> LayerReport | None:
        return next((layer for layer in self.layers if layer.problem), None)

    def table(self) -> str:
        """A fixed-width table: tensor, bits, n1, levels used, zeros %, status."""
        width = max([len("tensor"), *(len(layer.key) for layer in self.layers)])
        n1_width = max([4, *(len(describe_n1(layer.n1)) for layer in self.layers)])
        lines = [f"{'tensor':<{width}}  bits  {'n1':>{n1_width}}  levels   zeros  status"]
        for layer in self.layers:
            used = "-" if layer.levels_used is None else f"{layer.levels_used}/{layer.levels}"
            zeros = "-" if layer.zeros is None else f"{100 * layer.zeros:.1f}%"
            status = "ok" if layer.problem is None else "FAIL"
            lines.append(
                f"{layer.key:<{width}}  {layer.bits:>4}  {describe_n1(layer.n1):>{n1_width}}  "
                f"{used:>6}  {zeros:>6}  "
                f"{status}"
            )
        return "\n".join(lines)


def verify_masked(ckpt: MaskedCheckpoint, path: str = "") -> VerifyReport:
    """Check every quantized weight of a masked checkpoint (see :func:`masked_layer_problem`),
    its other tensors and descriptions (:func:`masked_problems`) and its digest.

    Example:
        >>> from torch import nn
        >>> from inq.scheduler import INQScheduler
        >>> net = nn.Linear(16, 4)
        >>> sched = INQScheduler(net, bits=5, portions=(1.0,))
        >>> _ = sched.step()
        >>> ckpt = MaskedCheckpoint(dict(net.state_dict()), {"weight": sched.layers[0].mask},
        ...                         {"weight": sched.layers[0].n1}, 5, (1.0,), 1, "magnitude")
        >>> verify_masked(ckpt).ok
        True
        >>> ckpt.state["weight"][0, 3] = 0.3
        >>> verify_masked(ckpt).first_problem.problem  # doctest: +ELLIPSIS
        '1 weight(s) off the 5-bit level set of n1=... (first: 0.30000001192092896 at flat index 3)'
        >>> ckpt.state["bias"][1] = float("nan")
        >>> verify_masked(ckpt).file_problem
        "'bias': 1 non-finite value(s) (first: nan at flat index 1)"
    """
    reports = []
    for key in ckpt.masks:
        problem = masked_layer_problem(ckpt, key)
        weight, bits = ckpt.state.get(key), ckpt.bits_of(key)  # each layer's own level set
        n1 = ckpt.n1.get(key)  # None (never partitioned) comes with a problem
        codes = None if problem or weight is None or n1 is None else pow2_encode(weight, n1, bits)
        reports.append(_report(key, bits, n1, codes, problem))
    others = tuple(masked_problems(ckpt))
    return VerifyReport(path, "masked", tuple(reports), ckpt.digest_problem, others)


def verify_packed(packed: PackedFile, path: str = "") -> VerifyReport:
    """Check every packed layer (layout, n1 range, and codes: 0 or top bit set, in range), every
    other tensor (:func:`inq.masked.state_problems`) and the digest.

    Example:
        >>> from inq.codes import pack_codes
        >>> from inq.packed import PackedLayer
        >>> codes = torch.tensor([[8, 12, 0, 15]], dtype=torch.uint8)
        >>> layer = PackedLayer("fc", pack_codes(codes, 4), 4, 0, (1, 4), torch.float32)
        >>> report = verify_packed(PackedFile({"fc.weight": layer}, {}, {}, {}))
        >>> report.ok, report.layers[0].levels_used
        (True, 4)
        >>> bn = {"bn.running_var": torch.tensor([1.0, -2.0])}
        >>> verify_packed(PackedFile({"fc.weight": layer}, bn, {}, {})).file_problem
        "'bn.running_var': a variance cannot be negative: 1 negative value(s) (first: -2.0 at flat index 1)"
    """  # noqa: E501
    reports = []
    for key, layer in packed.layers.items():
        problem = layer.problem()
        codes = None if problem else layer.codes()
        reports.append(_report(key, layer.bits, layer.n1, codes, problem))
    others = tuple(state_problems(packed.tensors))
    return VerifyReport(path, "packed", tuple(reports), packed.digest_problem, others)


def verify_file(source: str | os.PathLike[str] | Header) -> VerifyReport:
    """Verify a masked checkpoint or a packed file (a path, or its header,
    :func:`inq.artefact.read_header`), chosen by the file's ``format`` metadata; the file is
    opened once (:func:`inq.artefact.open_artefact`), a packed one without refusing what the
    report is to show.

    Raises:
        ValueError: if the file cannot be read or is neither kind of INQ file.
    """
    header = source if isinstance(source, Header) else read_header(source)
    path = header.safetensors().path  # as the caller named it
    if header.format not in MASKED_FORMATS + PACKED_FORMATS:
        raise ValueError(
            f"{path}: not an INQ masked checkpoint or packed file (format "
            f"{header.format!r}; expected one of {MASKED_FORMATS + PACKED_FORMATS})"
        )
    artefact = open_artefact(header, validate=False)
    if isinstance(artefact, MaskedCheckpoint):
        return verify_masked(artefact, str(path))
    assert isinstance(artefact, PackedFile)  # the formats checked above
    return verify_packed(artefact, str(path))


def verify_qonnx(proto: Any, path: str = "") -> VerifyReport:
    """Check every Conv/Gemm weight of a QONNX ``ModelProto`` (written by
    :func:`inq.export_qonnx.export_qonnx`) against the level set the file records for its node
    (:func:`inq.export_qonnx.qonnx_levels`): the weight is an initializer behind a QONNX
    ``Quant`` node of scale ``2**-frac`` and zero point 0; each value is 0 or ``±2**e`` with
    ``1 - 2**(bits-2) <= e <= 0`` (the level set ``{0, ±2**n2..±2**n1}`` as stored,
    ``w * 2**-n1``), an integer on the ``Quant`` grid and within its width (else the ``Quant``
    node would change it). One report per Conv/Gemm node; a level set recorded for no such node
    is a problem, and so is a file that does not match its sha256 digest
    (:func:`inq.export_onnx.onnx_digest_problem`: a weight's sign flipped stays in its level
    set, and only the digest tells).
    """
    from onnx import numpy_helper

    from inq.export_onnx import onnx_digest_problem
    from inq.export_qonnx import LEVELS_KEY, qonnx_levels

    values = {t.name: numpy_helper.to_array(t) for t in proto.graph.initializer}
    made_by = {out: node for node in proto.graph.node for out in node.output}
    levels = qonnx_levels(proto)
    reports = tuple(
        _qonnx_layer(node, made_by, values, levels.pop(node.name, None))
        for node in proto.graph.node
        if node.op_type in ("Conv", "Gemm")
    )
    others = tuple((LEVELS_KEY + name, "a level set recorded for no Conv/Gemm node")
                   for name in levels)  # fmt: skip
    digest = onnx_digest_problem(proto, required=True)
    return VerifyReport(path, "QONNX", reports, digest, others)


def _qonnx_layer(
    node: Any, made_by: dict[str, Any], values: dict[str, np.ndarray], record: Any
) -> LayerReport:
    """One Conv/Gemm node's weight against its recorded level set (see :func:`verify_qonnx`)."""
    from inq.export_qonnx import QONNX_DOMAIN

    quant = made_by.get(node.input[1]) if len(node.input) > 1 else None
    if (
        quant is None
        or quant.op_type != "Quant"
        or quant.domain != QONNX_DOMAIN
        or any(name not in values for name in quant.input[:4])
    ):
        problem = "its weight is not an initializer behind a QONNX Quant node"
        return LayerReport(node.name, 0, None, None, None, problem)
    weight = values[quant.input[0]].astype(np.float64)
    rows = weight.shape[0] if weight.ndim else 0
    bad = _record_problem(record, rows)
    if bad is not None:
        return LayerReport(node.name, 0, None, None, None, bad)
    bits, n1, frac = record["bits"], metadata_n1(record["n1"]), record["frac"]
    floored = "floor" in record  # a band of terms floored one by one: 0/1 taps on a unit grid
    problems = [
        p
        for p in (
            _quant_problem(quant, values, frac),
            _taps_problem(weight) if floored else _stored_level_problem(weight, bits, n1),
            _grid_problem(weight, quant, values, frac),
        )
        if p is not None
    ]
    used, zeros = len(np.unique(weight)), float((weight == 0).mean()) if weight.size else 0.0
    return LayerReport(node.name, bits, n1, used, zeros, "; ".join(problems) or None)


def _record_problem(record: Any, rows: int) -> str | None:
    """Why a recorded level set is not ``{"bits": 2..8, "n1": int or [rows ints], "frac": >= 0}``
    (None if it is)."""
    if record is None:
        return "no level set recorded for it (export the file again with this inq)"
    n1 = record.get("n1") if isinstance(record, dict) else None
    ok = (
        isinstance(record, dict)
        and isinstance(record.get("bits"), int)
        and 2 <= record["bits"] <= 8
        and isinstance(record.get("frac"), int)
        and record["frac"] >= 0
        and (isinstance(n1, int) or (isinstance(n1, list) and len(n1) == rows
                                      and all(isinstance(v, int) for v in n1)))
    )  # fmt: skip
    return None if ok else f"its recorded level set is not bits, n1, frac: {record!r}"


def _quant_problem(quant: Any, values: dict[str, np.ndarray], frac: int) -> str | None:
    """Why the weight's ``Quant`` node does not have scale ``2**-frac`` and zero point 0."""
    scale, zero = values[quant.input[1]], values[quant.input[2]]
    if scale.size != 1 or float(scale) != 2.0**-frac or zero.size != 1 or float(zero) != 0:
        return (
            f"its Quant node {quant.name!r} has scale {scale.tolist()} and zero point "
            f"{zero.tolist()}; the level set records scale 2**-{frac}, zero point 0"
        )
    return None


def _stored_level_problem(weight: np.ndarray, bits: int, n1: N1) -> str | None:
    """Why a stored weight (``w * 2**-n1``) has values outside ``{0, ±2**(1-2**(bits-2))..±1}``."""
    lowest = 1 - (1 << (bits - 2))
    with np.errstate(invalid="ignore"):
        mantissa, exponent = np.frexp(np.abs(weight))  # |w| = mantissa * 2**exponent
        ok = (weight == 0) | ((mantissa == 0.5) & (exponent - 1 >= lowest) & (exponent - 1 <= 0))
    return _off(ok, weight, f"the {bits}-bit level set of n1={describe_n1(n1)}",
                f"stored as w * 2**-n1: 0 or ±2**{lowest}..±1")  # fmt: skip


def _taps_problem(weight: np.ndarray) -> str | None:
    """Why a floored band's taps are not all 0 or 1."""
    bad = int(((weight != 0) & (weight != 1)).sum())
    return f"{bad} tap(s) of a floored band not 0 or 1" if bad else None


def _grid_problem(
    weight: np.ndarray, quant: Any, values: dict[str, np.ndarray], frac: int
) -> str | None:
    """Why the weight's integers ``w * 2**frac`` are not integers within the ``Quant`` node's
    width (where they are not, the node changes the weight)."""
    width, signed = float(values[quant.input[3]]), _attr(quant, "signed", 1)
    narrow = _attr(quant, "narrow", 0)
    lo = -(2.0 ** (width - 1)) + narrow if signed else 0.0
    hi = 2.0 ** (width - int(signed)) - 1 - (narrow if not signed else 0)
    ints = np.ldexp(weight, frac)
    ok = np.isfinite(ints) & (ints == np.round(ints)) & (ints >= lo) & (ints <= hi)
    return _off(ok, weight, "its Quant node's grid", f"integers {lo:g}..{hi:g} times 2**-{frac}")


def _off(ok: np.ndarray, weight: np.ndarray, where: str, detail: str) -> str | None:
    """``"N weight(s) off <where> (<detail>; first: <value> at flat index <i>)"`` for the
    weights where ``ok`` is false, or None if there are none."""
    if bool(ok.all()):
        return None
    index = int(np.flatnonzero(~ok)[0])
    return (
        f"{int((~ok).sum())} weight(s) off {where} ({detail}; first: "
        f"{float(weight.flat[index])!r} at flat index {index})"
    )


def _attr(node: Any, name: str, default: int) -> int:
    """An int attribute of an ONNX node (``default`` if it has none)."""
    return next((int(a.i) for a in node.attribute if a.name == name), default)


def _report(
    key: str, bits: int, n1: N1 | None, codes: torch.Tensor | None, problem: str | None
) -> LayerReport:
    if codes is None:
        return LayerReport(key, bits, n1, None, None, problem)
    return LayerReport(
        key=key,
        bits=bits,
        n1=n1,
        levels_used=int(torch.unique(codes).numel()),
        zeros=float((codes == 0).double().mean()) if codes.numel() else 0.0,
        problem=problem,
    )
