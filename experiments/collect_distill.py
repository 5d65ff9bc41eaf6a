"""Collect the distillation study (``experiments/distill_study.sh``) into a table and a plot.

Reads ``<job>/seed<k>/summary.json`` under the study's folder, where the job's name says what
it ran: ``inq<b>`` (INQ), ``inq<b>_kd`` (INQ + distillation), ``ste<b>_kd`` (STE +
distillation), ``inq<b>_kd_ends8`` (INQ + distillation, first and last layer at 8 bits); the
``float`` job is the float model every other job started from. Writes the table (mean and
sample standard deviation over seeds, and the per-seed difference to the float model, averaged),
the issue's goals checked on those differences, and a PNG of the differences against bits.

By default both go into the study's folder (``RESULTS.md``, ``distill_<name>.png``);
``--update-results`` writes the tracked ``experiments/RESULTS.md`` section and plot instead.

Usage::

    python experiments/collect_distill.py runs/distill_resnet20 --name resnet20
"""

from __future__ import annotations

import json
import re
import statistics
import sys
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from collect_study import HERE, Built, Stats, _relative, publish, save_figure, study_parser

JOB = re.compile(r"(?P<method>inq|ste)(?P<bits>\d)(?P<kd>_kd)?(?P<ends>_ends8)?")
METHODS = ("INQ", "INQ + KD", "STE", "STE + KD", "INQ + KD, 8-bit ends")
BITS = (5, 4, 3, 2)
# The goals: (method, bits) -> least difference to the float model, in points. The
# ResNet-20 ternary goal is for all layers at 2 bits; the 8-bit-ends rows are shown against the
# same bounds, for reference.
GOALS = {
    "resnet20": {("INQ + KD", 5): -0.1, ("INQ + KD", 4): -0.1, ("INQ + KD", 3): -0.3,
                 ("INQ + KD", 2): -1.0, ("INQ + KD, 8-bit ends", 3): -0.3,
                 ("INQ + KD, 8-bit ends", 2): -1.0},
    "fashion_mnist": {("INQ + KD", 3): -0.5, ("INQ + KD", 2): -1.5,
                      ("INQ + KD, 8-bit ends", 3): -0.5, ("INQ + KD, 8-bit ends", 2): -1.5},
}  # fmt: skip
KD_VS_STE = -0.2  # INQ + KD against STE + KD, at every bit-width


@dataclass(frozen=True)
class Run:
    """One finished job of one seed: accuracies as fractions."""

    method: str
    bits: int
    seed: int
    float_acc: float
    final_acc: float

    @property
    def delta(self) -> float:
        """Accuracy minus the float model's, in points."""
        return 100.0 * (self.final_acc - self.float_acc)


def method_of(job: str) -> tuple[str, int] | None:
    """The method and bits a job name stands for, ``None`` for the float job.

    Example:
        >>> method_of("inq3_kd_ends8"), method_of("ste2_kd"), method_of("ste2"), method_of("float")
        (('INQ + KD, 8-bit ends', 3), ('STE + KD', 2), ('STE', 2), None)
    """
    match = JOB.fullmatch(job)
    if match is None:
        return None
    kd, ends = bool(match["kd"]), bool(match["ends"])
    name = ("STE" if match["method"] == "ste" else "INQ") + (" + KD" if kd else "")
    return (name + ", 8-bit ends" if ends else name), int(match["bits"])


def load_runs(root: Path) -> tuple[list[Run], dict[int, float]]:
    """The study's runs and the float model's accuracy per seed.

    Raises:
        ValueError: if ``root`` holds no finished job.
    """
    runs, floats = [], {}
    for path in sorted(root.glob("*/seed*/summary.json")):
        summary = json.loads(path.read_text())
        job = path.parent.parent.name
        seed = int(summary["seed"])
        if job == "float":
            floats[seed] = float(summary["float_acc"])
            continue
        what = method_of(job)
        if what is not None:
            runs.append(Run(*what, seed, float(summary["float_acc"]), float(summary["final_acc"])))
    if not runs:
        raise ValueError(f"{root}: no finished job (<job>/seed<k>/summary.json)")
    return runs, floats


def by_cell(runs: Sequence[Run]) -> dict[tuple[str, int], list[Run]]:
    cells: dict[tuple[str, int], list[Run]] = defaultdict(list)
    for run in runs:
        cells[run.method, run.bits].append(run)
    return cells


def mean_delta(runs: Sequence[Run]) -> float:
    return statistics.fmean(r.delta for r in runs)


def results_table(runs: Sequence[Run], floats: dict[int, float]) -> str:
    """Rows: the float model and each method; columns: bits. A cell: accuracy (mean ± sd over
    seeds) and, below it, the mean difference to the float model."""
    cells = by_cell(runs)
    head = "| method | " + " | ".join(f"{b} bits" for b in BITS) + " |"
    lines = [head, "|" + " --- |" * (len(BITS) + 1)]
    lines.append(f"| float (seeds {len(floats)}) | {Stats.of(list(floats.values()))} %"
                 + " | " * (len(BITS) - 1) + " |")  # fmt: skip
    for method in METHODS:
        row = [method]
        for bits in BITS:
            found = cells.get((method, bits))
            row.append(
                f"{Stats.of([r.final_acc for r in found])} % ({mean_delta(found):+.2f}, "
                f"n={len(found)})"
                if found
                else "—"
            )
        if any(cell != "—" for cell in row[1:]):
            lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def goal_check(runs: Sequence[Run], name: str) -> str:
    """One line per goal: the measured mean difference, and met or missed by how much."""
    cells = by_cell(runs)
    lines = []
    for (method, bits), bound in GOALS.get(name, {}).items():
        found = cells.get((method, bits))
        lines.append(_verdict(f"{method} at {bits} bits >= float {bound:+.1f}", found, bound))
    for bits in BITS:
        inq, ste = cells.get(("INQ + KD", bits)), cells.get(("STE + KD", bits))
        if inq and ste:
            gap = mean_delta(inq) - mean_delta(ste)
            verdict = "met" if gap >= KD_VS_STE else f"missed by {KD_VS_STE - gap:.2f} points"
            lines.append(
                f"- INQ + KD >= STE + KD {KD_VS_STE:+.1f} at {bits} bits: {gap:+.2f} points, "
                f"{verdict}"
            )
    return "\n".join(lines)


def _verdict(goal: str, found: Sequence[Run] | None, bound: float) -> str:
    if not found:
        return f"- {goal}: not run"
    delta = mean_delta(found)
    verdict = "met" if delta >= bound else f"missed by {bound - delta:.2f} points"
    return f"- {goal}: {delta:+.2f} points (n={len(found)}), {verdict}"


def plot(runs: Sequence[Run], path: Path, name: str) -> None:
    """Difference to the float model against bits, one line per method (mean over seeds)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cells = by_cell(runs)
    fig, ax = plt.subplots(figsize=(6, 4))
    for method in METHODS:
        points = [(b, mean_delta(cells[method, b])) for b in BITS if (method, b) in cells]
        if points:
            ax.plot(*zip(*points, strict=True), marker="o", label=method)
    ax.axhline(0.0, color="grey", linewidth=0.8)
    ax.set_xlabel("bits")
    ax.set_ylabel("accuracy - float model (points)")
    ax.set_xticks(BITS)
    ax.set_title(f"distillation study: {name}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    save_figure(fig, path)


def render(runs: Sequence[Run], floats: dict[int, float], plot_path: Path, results: Path,
           name: str) -> str:  # fmt: skip
    """The generated block: table, goal checks, plot link."""
    link = Path(_relative(plot_path, results.parent))
    return "\n\n".join(
        [
            f"Generated by `experiments/collect_distill.py` from {len(runs)} runs. Test accuracy; "
            "± is the sample standard deviation over seeds; in brackets each run's accuracy "
            "minus that of the float model it started from (same seed), averaged, and the "
            "number of seeds.",
            results_table(runs, floats),
            "The issue's goals, on the mean of those differences:",
            goal_check(runs, name),
            f"![difference to float vs bits]({link.as_posix()})",
        ]
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Command line entry point; returns the exit status."""
    args = study_parser(__doc__.split("\n\n")[0]).parse_args(argv)
    folder = HERE if args.update_results else args.study

    def build(plot_path: Path, results: Path) -> Built:
        runs, floats = load_runs(args.study)
        body = render(runs, floats, plot_path, results, args.name)
        return body, len(runs), partial(plot, runs, name=args.name)

    title = f"## Distillation and 8-bit ends: {args.name} (issue 25)"
    return publish("collect_distill", folder, title, f"distill_{args.name}", build)


if __name__ == "__main__":
    sys.exit(main())
