"""Collect a pruning study's ``summary.json`` files into ``RESULTS.md`` and a plot (issue 15).

Reads every ``summary.json`` under a sweep directory (``experiments/prune_study.sh``; keys used:
``bits``, ``seed``, ``float_acc``, ``final_acc``, ``zero_fraction``, ``portions``,
``retrain_epochs``, ``prune`` (settings and targets, absent without pruning) and ``packed``: the
bytes the packed file holds for the quantized tensors and in all, as written) and writes

- a table per run: bits, target sparsity, retraining budget, measured zero weights, fp32 and
  stored bytes of the quantized tensors, the compression ratio (fp32 / stored), the whole file's
  ratio, test accuracy and the change from the float model the run started from; the goal check
  of the issue; the paper's Table 5 beside;
- a PNG: accuracy against compression ratio, one line per bit-width (and budget, and profile).

Both go between the markers ``<!-- study:prune_<dataset>:start -->`` / ``...:end -->`` of
``OUT/RESULTS.md`` (default: the sweep directory; ``--update-results``: the tracked
``experiments/RESULTS.md`` and ``experiments/prune_<dataset>.png``).

Usage::

    python experiments/collect_prune.py multirun/prune_fashion_mnist/<stamp> --dataset fashion_mnist
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # the sibling collector, also when loaded by path from the tests
from collect_study import Built, _relative, publish, save_figure, sweep_parser  # noqa: E402

# The INQ paper's Table 5 (AlexNet on ImageNet, dynamic network surgery + INQ, no Huffman
# coding) and Deep Compression (Han et al. 2016) on the same network, as the issue quotes them.
PAPER_TABLE5 = (
    ("Deep Compression: pruning + quantization", "8 conv / 5 fc", "27x"),
    ("Deep Compression: + Huffman coding", "8 conv / 5 fc", "35x"),
    ("INQ paper: DNS + INQ", "5", "53x (top-1 error +0.08 points)"),
    ("INQ paper: DNS + INQ", "4", "71x"),
    ("INQ paper: DNS + INQ", "3", "89x"),
)
GOALS = {"fashion_mnist": (5, 25.0, -1.0)}  # bits, least compression ratio, least points vs float


@dataclass(frozen=True)
class PruneRun:
    """One finished run of the pruning study (accuracies as fractions, sizes in bytes)."""

    bits: int
    seed: int
    sparsity: float  # the target of the layers without an override
    targets: dict[str, float]
    zero_fraction: float
    float_acc: float
    final_acc: float
    fp32_bytes: int
    stored_bytes: int
    file_bytes: int
    path: Path
    other_bytes: int = 0  # the model's other tensors (biases, BatchNorm) as stored
    prune_epochs: tuple[int, int] = (0, 0)  # rounds, epochs each
    inq_epochs: tuple[int, int] = (0, 0)  # stages, epochs each

    @property
    def budget(self) -> str:
        """Retraining epochs: pruning rounds x epochs + INQ stages x epochs.

        Example:
            >>> PruneRun(5, 0, 0.8, {}, 0.8, 0.9, 0.9, 4, 1, 9, Path("."), 0, (3, 1), (4, 2)).budget
            '3x1 + 4x2'
        """
        prune = f"{self.prune_epochs[0]}x{self.prune_epochs[1]} + " if self.prune_epochs[0] else ""
        return prune + f"{self.inq_epochs[0]}x{self.inq_epochs[1]}"

    @property
    def file_compression(self) -> float:
        """The whole model as fp32 / the whole packed file (header and float tensors included)."""
        return (self.fp32_bytes + self.other_bytes) / self.file_bytes

    @property
    def compression(self) -> float:
        """fp32 bytes of the quantized tensors / their bytes in the packed file."""
        return self.fp32_bytes / self.stored_bytes

    @property
    def delta(self) -> float:
        """Accuracy change from the float model, in points."""
        return 100 * (self.final_acc - self.float_acc)

    @property
    def label(self) -> str:
        """The target sparsity, with the layers that differ from it.

        Example:
            >>> PruneRun(5, 0, 0.8, {"0": 0.5, "3": 0.8, "15": 0.95}, 0.9, 0.9, 0.9, 4, 1, 9,
            ...          Path(".")).label
            '80 % (0: 50 %, 15: 95 %)'
        """
        if not self.targets:
            return "0 %"
        others = [f"{k}: {100 * v:g} %" for k, v in self.targets.items() if v != self.sparsity]
        return f"{100 * self.sparsity:g} %" + (f" ({', '.join(others)})" if others else "")


def load_runs(root: Path) -> list[PruneRun]:
    """Every INQ run under ``root`` (the shared float/one-shot run is left out).

    Raises:
        ValueError: if there is none or a summary lacks a key.
    """
    runs = []
    for path in sorted(root.rglob("summary.json")):
        try:
            s = json.loads(path.read_text())
            if s["method"] != "inq":
                continue
            prune, stages = s.get("prune", {}), len(s["portions"])
            runs.append(
                PruneRun(
                    bits=int(s["bits"]),
                    seed=int(s["seed"]),
                    sparsity=float(prune.get("sparsity", 0.0)),
                    targets={k: float(v) for k, v in prune.get("targets", {}).items()},
                    zero_fraction=float(s["zero_fraction"]),
                    float_acc=float(s["float_acc"]),
                    final_acc=float(s["final_acc"]),
                    fp32_bytes=int(s["packed"]["fp32_bytes"]),
                    stored_bytes=int(s["packed"]["packed_bytes"]),
                    file_bytes=int(s["packed"]["file_bytes"]),
                    path=path,
                    other_bytes=int(s["packed"]["other_bytes"]),
                    prune_epochs=(int(prune.get("steps", 0)), int(prune.get("epochs", 0))),
                    inq_epochs=(stages, int(s["retrain_epochs"]) // stages),
                )
            )
        except (KeyError, TypeError, ValueError) as err:
            raise ValueError(f"{path}: not a pruning study summary ({err!r})") from None
    if not runs:
        raise ValueError(f"no INQ summary.json under {root}")
    return sorted(runs, key=lambda r: (-r.bits, r.seed, r.zero_fraction))


def results_table(runs: Sequence[PruneRun]) -> str:
    """One row per run: settings, measured sparsity and sizes, accuracy."""
    lines = [
        "| bits | seed | pruned (target) | epochs | zero weights | fp32 B | stored B "
        "| compression | file B | file ratio | test acc. % | vs float, points |",
        "|---:|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in runs:
        lines.append(
            f"| {r.bits} | {r.seed} | {r.label} | {r.budget} | {100 * r.zero_fraction:.1f} % "
            f"| {r.fp32_bytes} | {r.stored_bytes} | **{r.compression:.1f}x** | {r.file_bytes} "
            f"| {r.file_compression:.1f}x | {100 * r.final_acc:.2f} | {r.delta:+.2f} |"
        )
    return "\n".join(lines)


def goal_check(runs: Sequence[PruneRun], dataset: str) -> str:
    """The issue's goal on ``dataset`` (if it has one): the runs that meet it, or the closest."""
    if dataset not in GOALS:
        return "No goal is set on this dataset; it shows the shape of the curves."
    bits, ratio, points = GOALS[dataset]
    candidates = [r for r in runs if r.bits == bits]
    met = [r for r in candidates if r.compression >= ratio and r.delta >= points]
    head = f"Goal: at {bits} bits, compression >= {ratio:g}x within {-points:g} point of float."
    if met:
        best = max(met, key=lambda r: r.compression)
        return (
            f"{head} **Met** by {len(met)} run(s); the most compressed: {best.label} pruned, "
            f"{best.compression:.1f}x at {best.delta:+.2f} points "
            f"({100 * best.final_acc:.2f} % vs float {100 * best.float_acc:.2f} %)."
        )
    within = [r for r in candidates if r.delta >= points]
    best = max(within, key=lambda r: r.compression, default=None)
    closest = (
        f" The most compressed within {-points:g} point: {best.compression:.1f}x." if best else ""
    )
    return f"{head} **Not met.**{closest}"


def paper_table() -> str:
    """The paper's Table 5 rows the issue cites."""
    lines = ["| method (AlexNet, ImageNet) | bits | compression |", "|---|---|---:|"]
    lines += [f"| {m} | {b} | {c} |" for m, b, c in PAPER_TABLE5]
    return "\n".join(lines)


def plot(runs: Sequence[PruneRun], path: Path, dataset: str = "digits") -> None:
    """The change in accuracy from each run's float model (so seeds with different float models
    share an axis) against the measured compression ratio, one line per bit-width; the goal's
    corner where the dataset has one."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    ax.axhline(0.0, color="0.3", ls="--", lw=1, label="float")
    if dataset in GOALS:
        _, ratio, points = GOALS[dataset]
        ax.axhline(points, color="0.6", ls=":", lw=1)
        ax.axvline(ratio, color="0.6", ls=":", lw=1, label=f"goal: >= {ratio:g}x, >= {points:g}")
    lines: dict[str, list[PruneRun]] = defaultdict(list)
    least = min(r.prune_epochs[1] * r.prune_epochs[0] for r in runs if r.prune_epochs[0])
    for r in runs:
        uniform = all(v <= r.sparsity for v in r.targets.values())  # none pruned harder
        longer = r.prune_epochs[0] * r.prune_epochs[1] > least
        name = f"{r.bits} bits" + ("" if uniform else ", fc pruned harder")
        lines[name + (f", {r.budget} epochs" if longer else "")].append(r)
    for name, members in sorted(lines.items(), reverse=True):
        members.sort(key=lambda r: r.compression)
        ax.plot(
            [r.compression for r in members],
            [r.delta for r in members],
            "o-" if "," not in name else "s--",
            label=name,
        )
    ax.set_xscale("log")
    ax.set_xlabel("compression ratio (fp32 bytes / bytes in the packed file), log scale")
    ax.set_ylabel("test accuracy - float, points")
    ax.set_title("pruning + INQ: accuracy vs measured compression")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8, loc="lower left")
    save_figure(fig, path)


def render(runs: Sequence[PruneRun], plot_path: Path, results: Path, dataset: str) -> str:
    """The generated block: table, goal check, plot link, the paper's Table 5."""
    link = Path(_relative(plot_path, results.parent))
    seeds = sorted({r.seed for r in runs})
    return "\n\n".join(
        [
            f"Generated by `experiments/collect_prune.py` from {len(runs)} runs (seed "
            f"{', '.join(map(str, seeds))}). *epochs*: pruning rounds x retraining epochs + INQ "
            "stages x epochs. *zero weights* counts pruned weights and those INQ rounds to zero. "
            "*stored B*: the bytes of the quantized tensors' codes and position indexes in the "
            "packed file (its tensor sizes, which the tests check against the file's own offsets); "
            "*compression* = fp32 B / stored B, the paper's ratio. *file B*: the whole file, with "
            "biases, BatchNorm and a JSON header of about 2-4 kB that these small models cannot "
            "hide; *file ratio* = the model's fp32 bytes / file B. *vs float*: the change from the "
            "float model the run started from.",
            results_table(runs),
            goal_check(runs, dataset),
            f"![accuracy vs compression]({link.as_posix()})",
            "The paper's Table 5, as the issue cites it (a 61 M-weight AlexNet, far more "
            "redundant than these small CNNs; compare the trend, not the values):",
            paper_table(),
        ]
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Command line entry point; returns the exit status."""
    args = sweep_parser(__doc__.split("\n\n")[0]).parse_args(argv)
    folder = HERE if args.update_results else args.sweep

    def build(plot_path: Path, results: Path) -> Built:
        runs = load_runs(args.sweep)
        body = render(runs, plot_path, results, args.dataset)
        return body, len(runs), partial(plot, runs, dataset=args.dataset)

    title = f"## Pruning + INQ: accuracy vs compression on {args.dataset} (issue 15)"
    return publish("collect_prune", folder, title, f"prune_{args.dataset}", build)


if __name__ == "__main__":
    sys.exit(main())
