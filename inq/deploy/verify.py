"""Verify an export: every quantized weight lies in its layer's level set, every mask is full,
every other tensor is one a trained model can hold, and the contents match their digest.

Works on masked checkpoints (:mod:`inq.masked`) and packed files (:mod:`inq.packed`), which
define what is valid (:func:`inq.masked.masked_layer_problem`, :func:`inq.masked.masked_problems`,
:meth:`inq.packed.PackedFile.problems`); the report names each offending tensor and says why,
and counts the levels each layer uses (QONNX files: :func:`inq.deploy.qonnx.verify_qonnx`, on
this report). A digest recomputed after an edit
proves nothing about the contents: an impossible tensor fails whatever the digest says.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from inq.artefact import Header, open_artefact, read_header
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
