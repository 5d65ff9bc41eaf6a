"""Collect the mixed-precision study (``experiments/mixed_study.sh``) into a table and a plot.

Reads ``<job>/seed<k>/summary.json`` under the study's folder, where the job's name says what
it ran: ``uniform<b>`` (every layer at b bits), ``ends<b>`` (first and last layer at 8 bits, the
rest at b), ``auto_<method>_<budget>`` (``inq.bits=auto`` with that sensitivity method under
that average-bits budget); ``float`` is the float model every job started from. A job's size is
its average bits a weight counted nominally (b bits a weight): the allocation's own figure for
``auto`` jobs, and for the others their bits weighted by the layers' weights (read from an auto
job's allocation, which lists every layer). Writes the table (mean and sample standard deviation
over seeds, the mean difference to the float model), the issue's goals checked on the means, the
allocation's share of the run's time, and a PNG of accuracy against size.

By default both go into the study's folder (``RESULTS.md``, ``mixed_<name>.png``);
``--update-results`` writes the tracked ``experiments/RESULTS.md`` section and plot instead.

Usage::

    python experiments/collect_mixed.py runs/mixed_fashion_mnist --name fashion_mnist
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
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from collect_study import HERE, Built, Stats, _relative, publish, save_figure, study_parser

JOB = re.compile(
    r"uniform(?P<uniform>\d)|ends(?P<ends>\d)|auto_(?P<method>loss|hessian)_(?P<budget>[\d.]+)"
)
GAIN_AT_3 = 0.3  # auto at 3.0 average bits against uniform 3-bit, in points (the goal)


@dataclass(frozen=True)
class Run:
    """One finished job of one seed: accuracies as fractions, its size in average bits."""

    group: str  # "uniform 3", "ends 2", "auto loss 2.5", ...
    seed: int
    float_acc: float
    final_acc: float
    avg_bits: float
    allocate_share: float | None  # the allocation's seconds over the run's (auto jobs)

    @property
    def delta(self) -> float:
        """Accuracy minus the float model's, in points."""
        return 100.0 * (self.final_acc - self.float_acc)


def group_of(job: str) -> str | None:
    """The group a job name stands for, ``None`` for the float job (or anything else).

    Example:
        >>> group_of("uniform3"), group_of("ends2"), group_of("auto_hessian_5.97"), group_of("x")
        ('uniform 3', 'ends 2', 'auto hessian 5.97', None)
    """
    match = JOB.fullmatch(job)
    if match is None:
        return None
    if match["uniform"]:
        return f"uniform {match['uniform']}"
    if match["ends"]:
        return f"ends {match['ends']}"
    return f"auto {match['method']} {match['budget']}"


def _avg_bits(summary: dict[str, Any], params: dict[str, int]) -> float:
    """A run's nominal average bits: the allocation's, or its layers' bits weighted by size."""
    if "allocation" in summary:
        return float(summary["allocation"]["avg_bits"])
    bits = summary.get("layer_bits") or dict.fromkeys(params, summary["bits"])
    return sum(params[name] * b for name, b in bits.items()) / sum(params[name] for name in bits)


def load_runs(root: Path) -> list[Run]:
    """The study's finished runs.

    Raises:
        ValueError: if ``root`` holds no finished job, or no auto job to read the layers from.
    """
    summaries = {}
    for path in sorted(root.glob("*/seed*/summary.json")):
        group = group_of(path.parent.parent.name)
        if group is not None:
            summaries[path] = (group, json.loads(path.read_text()))
    if not summaries:
        raise ValueError(f"{root}: no finished job (<job>/seed<k>/summary.json)")
    layers = next((s["allocation"]["layers"] for _, s in summaries.values() if "allocation" in s),
                  None)  # fmt: skip
    if layers is None:
        raise ValueError(f"{root}: no finished auto job, whose allocation lists the layers")
    params = {layer["name"]: int(layer["params"]) for layer in layers}
    runs = []
    for group, s in summaries.values():
        timings = s.get("timings_s", {})
        # each phase's seconds run from the end of the one before: the allocation's are also
        # the next phase's, so the run's wall time is the phases' sum without them
        run_time = sum(v for k, v in timings.items() if k != "allocate")
        share = timings["allocate"] / run_time if "allocate" in timings else None
        runs.append(Run(group, int(s["seed"]), float(s["float_acc"]), float(s["final_acc"]),
                        _avg_bits(s, params), share))  # fmt: skip
    return runs


def by_group(runs: Sequence[Run]) -> dict[str, list[Run]]:
    """Runs by group, uniform first, then the ends rule, then auto by method and budget."""
    groups: dict[str, list[Run]] = defaultdict(list)
    for run in runs:
        groups[run.group].append(run)

    def order(name: str) -> tuple[int, str, float]:
        kind, *rest = name.split()
        return ({"uniform": 0, "ends": 1}.get(kind, 2), rest[0], float(rest[-1]))

    return {name: groups[name] for name in sorted(groups, key=order)}


def mean_delta(runs: Sequence[Run]) -> float:
    return statistics.fmean(r.delta for r in runs)


def results_table(runs: Sequence[Run]) -> str:
    """One row a group: its size, accuracy (mean ± sd over seeds), difference to the float model
    and, for auto, the allocation's share of the run's wall time."""
    lines = ["| job | average bits | accuracy | vs float | seeds | allocation's share of the run |",
             "| --- | ---: | ---: | ---: | ---: | ---: |"]  # fmt: skip
    for name, found in by_group(runs).items():
        shares = [r.allocate_share for r in found if r.allocate_share is not None]
        share = f"{100 * max(shares):.1f} % (largest)" if shares else "—"
        lines.append(
            f"| {name} | {statistics.fmean(r.avg_bits for r in found):.3f} | "
            f"{Stats.of([r.final_acc for r in found])} % | {mean_delta(found):+.2f} | "
            f"{len(found)} | {share} |"
        )
    return "\n".join(lines)


def _paired(runs: Sequence[Run], base: Sequence[Run]) -> list[float]:
    """Per seed both ran, the difference of their differences to the float model (points)."""
    ours = {r.seed: r.delta for r in base}
    return [r.delta - ours[r.seed] for r in runs if r.seed in ours]


def goal_check(runs: Sequence[Run]) -> str:
    """The issue's goals, on the seeds both sides ran (each seed's difference to its own float
    model, paired): auto at 3.0 against uniform 3 + 0.3, auto at 2.5 against uniform 3, auto at
    the ends rule's size against the rule; both methods."""
    groups = by_group(runs)
    uniform3, ends = (
        groups.get("uniform 3"),
        next((v for k, v in groups.items() if k.startswith("ends")), None),
    )
    lines = []
    for method in ("loss", "hessian"):
        autos = {
            float(k.split()[-1]): v for k, v in groups.items() if k.startswith(f"auto {method}")
        }
        checks = [("3.0", 3.0, uniform3, GAIN_AT_3, "uniform 3-bit + 0.3"),
                  ("2.5", 2.5, uniform3, 0.0, "uniform 3-bit")]  # fmt: skip
        if ends:
            size = statistics.fmean(r.avg_bits for r in ends)
            rule = min(autos, key=lambda b: abs(b - size), default=None)
            if rule is not None and abs(rule - size) < 0.01:
                checks.append(
                    (f"{rule:g}", rule, ends, 0.0, f"the 8-bit-ends rule ({ends[0].group})")
                )
        for label, budget, base, margin, what in checks:
            auto = autos.get(budget)
            goal = f"auto ({method}) at {label} average bits >= {what}"
            if not auto or not base:
                lines.append(f"- {goal}: not run")
                continue
            paired = _paired(auto, base)
            if not paired:
                lines.append(f"- {goal}: no seed run by both")
                continue
            gap = statistics.fmean(paired)
            verdict = "met" if gap >= margin else f"missed by {margin - gap:.2f} points"
            lines.append(f"- {goal}: {gap:+.2f} points (n={len(paired)}), {verdict}")
    return "\n".join(lines)


def plot(runs: Sequence[Run], path: Path, name: str) -> None:
    """Accuracy against average bits: the uniform line, the ends rule, auto by method."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for group, found in by_group(runs).items():
        label = "auto " + group.split()[1] if group.startswith("auto") else group.split()[0]
        size = statistics.fmean(r.avg_bits for r in found)
        series[label].append((size, statistics.fmean(100 * r.final_acc for r in found)))
    fig, ax = plt.subplots(figsize=(6, 4))
    for label, points in series.items():
        ax.plot(*zip(*sorted(points), strict=True), marker="o", label=label)
    ax.set_xlabel("average bits a weight (nominal)")
    ax.set_ylabel("test accuracy (%)")
    ax.set_title(f"mixed precision: {name}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    save_figure(fig, path)


def render(runs: Sequence[Run], plot_path: Path, results: Path) -> str:
    """The generated block: table, goal checks, plot link."""
    link = Path(_relative(plot_path, results.parent))
    seeds = sorted({r.seed for r in runs})
    return "\n\n".join(
        [
            f"Generated by `experiments/collect_mixed.py` from {len(runs)} runs (seeds "
            f"{', '.join(map(str, seeds))}). Test accuracy; ± is the sample standard deviation "
            "over seeds; *vs float* each run's accuracy minus that of the float model it started "
            "from (same seed), averaged.",
            results_table(runs),
            "The issue's goals, per seed both sides ran (paired), averaged:",
            goal_check(runs),
            f"![accuracy vs average bits]({link.as_posix()})",
        ]
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Command line entry point; returns the exit status."""
    args = study_parser(__doc__.split("\n\n")[0]).parse_args(argv)
    folder = HERE if args.update_results else args.study

    def build(plot_path: Path, results: Path) -> Built:
        runs = load_runs(args.study)
        body = render(runs, plot_path, results)
        return body, len(runs), partial(plot, runs, name=args.name)

    title = f"## Mixed precision chosen for the user: {args.name} (issue 50)"
    return publish("collect_mixed", folder, title, f"mixed_{args.name}", build)


if __name__ == "__main__":
    sys.exit(main())
