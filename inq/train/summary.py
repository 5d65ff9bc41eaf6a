"""The results of a run: ``summary.json`` and the float-vs-INQ table ``inq-train`` prints.

``summary.json`` holds the accuracy of every phase (``float``, ``stages``), the level-set
settings (``bits`` and, where ``inq.layer_bits`` gives some layers other bits, ``layer_bits``:
every quantized layer's own), ``distill`` (weight, temperature) where the run distilled, the
timings and, added by :mod:`inq.train.app`, the files the run
wrote (``files``), the packed file's sizes (``packed``) and the integer model's accuracy
(``integer``); with ``inq.bits=auto``, ``allocation`` (:meth:`inq.allocate.Allocation.as_dict`:
per layer its weights, sensitivity at each choice, bits and bytes; the average bits and bytes).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from inq.fileio import atomic_path
from inq.runfiles import SUMMARY
from inq.scheduler import INQScheduler
from inq.train.config import Config, to_dict
from inq.train.phases import ALLOCATE, Phase

__all__ = ["METHOD_LABELS", "summarize", "table", "write_summary", "zero_fraction"]

METHOD_LABELS = {"inq": "INQ", "oneshot": "one-shot", "ste": "STE"}  # inq.method, as printed


def summarize(
    cfg: Config,
    sched: INQScheduler,
    phases: Sequence[Phase],
    history: Mapping[str, dict[str, float]],
    timings: Mapping[str, float],
    *,
    prune_targets: Mapping[str, float],
    world_size: int,
) -> dict[str, Any]:
    """The body of ``summary.json`` for a run of ``cfg`` whose ``phases`` are all done:
    ``history`` holds each phase's metrics (``portion``, ``pruned``, ``acc``, ...) and
    ``timings`` its seconds, from the end of the phase before (so ``allocate``, the seconds
    ``inq.bits=auto`` took, are also the next phase's, the first after ``float``);
    ``prune_targets`` the pruned layers'
    target sparsities (empty: the run did not prune).

    Example:
        >>> from omegaconf import OmegaConf
        >>> from torch import nn
        >>> cfg = Config()
        >>> sched = INQScheduler(nn.Linear(4, 2), bits=4, portions=(1.0,))
        >>> _ = sched.step()
        >>> phases = [Phase("float", 0, 1, 0.1, "all"), Phase("stage1", 1, 2, 0.01, "all")]
        >>> metrics = {"float": {"portion": 0.0, "acc": 0.9},
        ...            "stage1": {"portion": 1.0, "acc": 0.8}}
        >>> summary = summarize(cfg, sched, phases, metrics, {"float": 1.0, "stage1": 2.0},
        ...                     prune_targets={}, world_size=1)
        >>> summary["float_acc"], summary["final_acc"], summary["retrain_epochs"]
        (0.9, 0.8, 2)
    """
    stages = [p.name for p in phases if p.name != "float"]
    mixed = any(bits != sched.bits for bits in sched.layer_bits.values())
    summary = {
        "method": cfg.inq.method.name,
        "float_acc": history["float"]["acc"],
        "final_acc": history[phases[-1].name]["acc"],
        "bits": sched.bits,
        **({"layer_bits": sched.layer_bits} if mixed else {}),
        **({"allocation": history[ALLOCATE]} if ALLOCATE in history else {}),
        "portions": list(sched.portions),
        "strategy": sched.strategy,
        "n1_rule": sched.n1_rule,
        "granularity": sched.granularity,
        "zero_fraction": zero_fraction(sched),
        "pruned_fraction": sched.pruned_fraction(),
        "seed": cfg.trainer.seed,
        "retrain_epochs": sum(p.epochs for p in phases if p.stage > 0),
        **({"distill": to_dict(cfg.inq.distill)} if cfg.inq.distill.weight > 0 else {}),
        "stages": {name: history[name] for name in stages},
        "float": history["float"],
        "timings_s": timings,
        "world_size": world_size,
    }
    if prune_targets:
        summary["prune"] = {**to_dict(cfg.prune), "targets": prune_targets}
    return summary


def zero_fraction(sched: INQScheduler) -> float:
    """Share of the quantized weights whose level is zero.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> layer = nn.Linear(2, 2, bias=False)
        >>> _ = layer.weight.data.copy_(torch.tensor([[1.0, 0.01], [0.0, -0.5]]))
        >>> sched = INQScheduler(layer, bits=3, portions=(1.0,))
        >>> _ = sched.step()
        >>> zero_fraction(sched)
        0.5
    """
    zeros = sum(int((layer.codes == 0).sum()) for layer in sched.layers)
    return zeros / max(1, sum(layer.count for layer in sched.layers))


def write_summary(out_dir: Path, summary: Mapping[str, Any]) -> Path:
    """Write ``summary`` as ``out_dir``'s :data:`~inq.runfiles.SUMMARY` (indented JSON,
    atomically); returns its path.

    Example:
        >>> import tempfile
        >>> write_summary(Path(tempfile.mkdtemp()), {"final_acc": 0.5}).read_text()
        '{\\n  "final_acc": 0.5\\n}\\n'
    """
    path = out_dir / SUMMARY
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(summary, indent=2) + "\n")
    return path


def table(summary: Mapping[str, Any]) -> str:
    """The float-vs-quantized table of a summary: one row per phase (with a ``pruned`` column
    for runs that prune), the integer model's if there is one, and the accuracy change.

    Example:
        >>> print(table({"method": "inq", "bits": 5, "float_acc": 0.9, "final_acc": 0.91,
        ...     "float": {"portion": 0.0, "acc": 0.9},
        ...     "stages": {"stage1": {"portion": 1.0, "acc": 0.91}}}))
        phase      quantized  val acc
        float           0.0%   90.00%
        stage1        100.0%   91.00%
        float 90.00% -> 5-bit INQ 91.00% (+1.00 points)

        Layers at other bits than the default are named:

        >>> table({"method": "inq", "bits": 4, "layer_bits": {"0": 8, "3": 4, "12": 8},
        ...        "float_acc": 0.9, "final_acc": 0.9, "float": {"portion": 0.0, "acc": 0.9},
        ...        "stages": {}}).splitlines()[-1]
        'float 90.00% -> 4-bit INQ (8-bit: 0, 12) 90.00% (+0.00 points)'
    """
    rows = [("float", summary["float"]), *summary["stages"].items()]
    pruned = any(m.get("pruned") for _, m in rows)  # a column only for runs that prune
    lines = [f"{'phase':<10} {'quantized':>9}{'   pruned' if pruned else ''} {'val acc':>8}"]
    for name, m in rows:
        column = f" {100 * m.get('pruned', 0.0):>7.1f}%" if pruned else ""
        lines.append(f"{name:<10} {100 * m['portion']:>8.1f}%{column} {100 * m['acc']:>7.2f}%")
    delta = 100 * (summary["final_acc"] - summary["float_acc"])
    if "integer" in summary:
        act, acc = f"{summary['integer']['act_bits']}-bit act", summary["integer"]["acc"]
        lines.append(f"{'integer':<10} {act:>9} {100 * acc:>7.2f}%")
    others: dict[int, list[str]] = {}  # layers at other bits than the default, by bits
    for name, bits in summary.get("layer_bits", {}).items():
        if bits != summary["bits"]:
            others.setdefault(bits, []).append(name)
    own = "".join(f" ({bits}-bit: {', '.join(names)})" for bits, names in sorted(others.items()))
    if "allocation" in summary:
        a = summary["allocation"]
        lines.append(
            f"bits chosen ({a['method']}): {a['avg_bits']:.3f} average bits, "
            f"{a['total_bytes']} bytes of {a['budget_bytes']}"
        )
    lines.append(
        f"float {100 * summary['float_acc']:.2f}% -> {summary['bits']}-bit "
        f"{METHOD_LABELS[summary['method']]}{own} "
        f"{100 * summary['final_acc']:.2f}% ({delta:+.2f} points)"
    )
    return "\n".join(lines)
