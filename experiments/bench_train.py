"""Images/s of training steps with and without INQ, eager and compiled (figures, not tests).

    python experiments/bench_train.py                    # on CUDA: every model, dtype and mode
    python experiments/bench_train.py --json out.json --budget-s 60   # what fits in a minute
    python experiments/bench_train.py --device cpu --models resnet20 --dtypes fp32 --batch 32
    python experiments/bench_train.py --device cpu --threads 1   # a CPU other processes share

Each group is one model, one autocast dtype and one mode (eager, or ``torch.compile(model)``
with the default inductor backend). A group trains three copies of the same randomly
initialised model on one synthetic batch (SGD, momentum 0.9, weight decay 5e-4, cross-entropy,
each optimizer step :func:`inq.fit.fit_step`, the package's only one):

- ``plain``: no scheduler;
- ``inq``: an attached ``INQScheduler(bits=5)`` after two stages (60 % of the weights frozen);
- ``inq_cached``: the same with ``cache_values=True`` (the stage's mask and frozen values kept:
  2 kernels a layer a step instead of 6).

Models: CIFAR ResNet-20 on 32x32 inputs (batch 256 on CUDA) and torchvision ResNet-18 with 1000
classes on 224x224 inputs (batch 128 on CUDA); on the CPU both at batch 32 and ResNet-18 on
64x64 inputs (``--image-size``), which the output says. Dtypes: float16 autocast with a
``GradScaler`` and bfloat16 autocast without one on CUDA; float32 (no autocast) and bfloat16 CPU
autocast on the CPU. CUDA steps are timed with ``torch.cuda.synchronize()`` on either side.

Per group: a first step per arm, timed on its own (compiled: dynamo and inductor compile the
forward and the backward there, the other arms reuse the graphs; ``torch._dynamo.reset()``
starts every compiled group afresh; inductor's on-disk caches as found, a warm one cutting the
compile seconds tenfold, unless ``--cold-compile`` turns them off), then ``--warmup``
untimed steps, then ``--steps`` timed ones, the three arms interleaved step by step (the order
rotating) so that load drift hits all alike; medians. After the timed steps every frozen weight
of each INQ arm must equal its power of two (``torch.equal`` against the decoded codes), or the
run stops with an AssertionError; the table's ``exact`` column says it held.

Printed: one row per group (images/s of each arm; ``ratio`` = median step time with INQ over
plain, goal <= 1.05 on a GPU and <= 1.03 on the CPU (issue 36); the first steps' seconds, that
is the compilation), then the speed of compiled over eager plain training per model and dtype.
Groups run eager first; after ``--budget-s`` seconds, or when a like group (same model and
mode, else same mode) took longer than what is left, the remaining groups are skipped and
listed as skipped. ``--json`` rewrites its file after every group, so a run stopped from outside
keeps the groups it finished. On a CPU that other processes use, give ``--threads 1``: two
threads that wait on each other's core make a step of the eager ResNet-20 ten times slower.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

import inq
from inq.fit import fit_step
from inq.models import build_model

ARMS = ("plain", "inq", "inq_cached")
MODELS = ("resnet20", "resnet18")
DTYPES: dict[str, torch.dtype | None] = {
    "fp32": None,
    "fp16": torch.float16,
    "bf16": torch.bfloat16,
}
MODES = ("eager", "compiled")
GOAL = {"cuda": 1.05, "cpu": 1.03}  # step time with INQ over plain (issue 36)


@dataclass(frozen=True)
class Group:
    """One row of the table: a model at one input size and batch, one dtype, one mode."""

    model: str
    dtype: str
    mode: str
    batch: int
    image_size: int


def _build(name: str) -> tuple[nn.Module, int]:
    """The float model ``name`` (random init) and its number of classes."""
    if name == "resnet20":
        return build_model({"name": "resnet20", "num_classes": 10, "in_channels": 3}), 10
    if name == "resnet18":
        return build_model({"name": "resnet18", "num_classes": 1000}), 1000
    raise ValueError(f"unknown model {name!r} (models: {', '.join(MODELS)})")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def check_frozen(sched: inq.INQScheduler) -> int:
    """Assert that every frozen weight equals its power of two (bit for bit); return how many
    frozen weights were checked.

    Raises:
        AssertionError: naming the first layer with a frozen weight off its value.
    """
    checked = 0
    for layer in sched.layers:
        weight, mask = layer.weight.detach(), layer.mask
        got, want = weight[mask], layer.frozen_values()[mask]
        if not torch.equal(got, want):
            off = int((got != want).sum())
            raise AssertionError(
                f"{layer.name}: {off} of {got.numel()} frozen weights differ from their power of "
                "two after the timed steps"
            )
        checked += got.numel()
    return checked


def bench_group(
    group: Group, *, device: str, steps: int, warmup: int, log: Callable[[str], None] = print
) -> dict[str, Any]:
    """Train the three arms of ``group`` for ``1 + warmup + steps`` steps each, interleaved;
    return its figures: per arm the median step time, images/s and the first step's seconds
    (the compilation, when compiled), the ratios to plain, the frozen fraction and the number
    of frozen weights found exact after the timed steps.

    Raises:
        AssertionError: a frozen weight of an INQ arm is not its power of two after the steps.
    """
    dev = torch.device(device)
    amp = DTYPES[group.dtype]
    if group.mode == "compiled":
        torch._dynamo.reset()  # every compiled group compiles afresh: its own compile seconds
    torch.manual_seed(0)
    float_model, classes = _build(group.model)
    models = {name: copy.deepcopy(float_model).to(dev) for name in ARMS}
    optimizers = {
        name: torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=5e-4)
        for name, model in models.items()
    }
    scheds = {}
    for name in ("inq", "inq_cached"):
        sched = inq.INQScheduler(models[name], bits=5, cache_values=name == "inq_cached")
        sched.attach(optimizers[name])
        sched.step(), sched.step()  # 30 %, 60 % frozen
        scheds[name] = sched
    nets: dict[str, nn.Module] = dict(models)
    if group.mode == "compiled":
        nets = {name: torch.compile(model) for name, model in models.items()}  # type: ignore[misc]
    scalers = {
        name: torch.amp.GradScaler(dev.type) if amp is torch.float16 else None for name in ARMS
    }
    x = torch.randn(group.batch, 3, group.image_size, group.image_size, device=dev)
    y = torch.randint(0, classes, (group.batch,), device=dev)

    def timed(name: str) -> float:
        _sync(dev)
        start = time.perf_counter()
        fit_step(nets[name], optimizers[name], x, y, scaler=scalers[name], amp=amp or False)
        _sync(dev)
        return time.perf_counter() - start

    first = {}
    for name in ARMS:
        if group.mode == "compiled":
            log(f"  compiling {group.model} {group.dtype} ({name}) ...")
        first[name] = timed(name)
    times: dict[str, list[float]] = {name: [] for name in ARMS}
    for step in range(warmup + steps):  # interleaved, the order rotating: drift hits all alike
        for name in ARMS[step % 3 :] + ARMS[: step % 3]:
            seconds = timed(name)
            if step >= warmup:
                times[name].append(seconds)
    checked = {name: check_frozen(sched) for name, sched in scheds.items()}
    median = {name: statistics.median(t) for name, t in times.items()}
    figures: dict[str, Any] = {
        "model": group.model,
        "dtype": group.dtype,
        "mode": group.mode,
        "batch": group.batch,
        "image_size": group.image_size,
        "status": "done",
    }
    figures |= {f"{name}_step_ms": 1e3 * t for name, t in median.items()}
    figures |= {f"{name}_images_per_s": group.batch / t for name, t in median.items()}
    figures["ratio"] = median["inq"] / median["plain"]
    figures["ratio_cached"] = median["inq_cached"] / median["plain"]
    figures |= {f"{name}_first_step_s": s for name, s in first.items()}
    figures["compile_s"] = sum(first.values()) if group.mode == "compiled" else None
    figures["frozen_fraction"] = scheds["inq"].quantized_fraction()
    figures["frozen_exact"] = True
    figures["frozen_checked"] = sum(checked.values())
    return figures


def run_groups(
    groups: Iterable[Group],
    *,
    device: str,
    steps: int,
    warmup: int,
    budget_s: float | None = None,
    on_done: Callable[[dict[str, Any]], None] = lambda figures: None,
    log: Callable[[str], None] = print,
) -> list[dict[str, Any]]:
    """:func:`bench_group` of each group in turn, ``on_done`` called after each (run or
    skipped). A group is skipped once ``budget_s`` seconds have passed since the first, or when
    a like group (the same model and mode, else the same mode) took longer than is left."""
    start = time.monotonic()
    took: dict[tuple[str, str], float] = {}
    results = []
    for group in groups:
        left = math.inf if budget_s is None else budget_s - (time.monotonic() - start)
        like = took.get((group.model, group.mode)) or max(
            (s for (_, mode), s in took.items() if mode == group.mode), default=0.0
        )
        if left <= 0 or like > left:
            why = (
                "budget spent" if left <= 0 else f"{left:.0f} s left, a like group took {like:.0f}"
            )
            figures: dict[str, Any] = {**group.__dict__, "status": "skipped", "why": why}
        else:
            began = time.monotonic()
            figures = bench_group(group, device=device, steps=steps, warmup=warmup, log=log)
            seconds = time.monotonic() - began
            figures["group_s"] = seconds
            took[group.model, group.mode] = max(seconds, took.get((group.model, group.mode), 0))
        results.append(figures)
        on_done(figures)
    return results


def compiled_over_eager(results: list[dict[str, Any]]) -> dict[str, float]:
    """Images/s of compiled over eager plain training, per model and dtype (both measured)."""
    done = {(r["model"], r["dtype"], r["mode"]): r for r in results if r["status"] == "done"}
    return {
        f"{model}/{dtype}": compiled["plain_images_per_s"]
        / done[model, dtype, "eager"]["plain_images_per_s"]
        for (model, dtype, mode), compiled in done.items()
        if mode == "compiled" and (model, dtype, "eager") in done
    }


HEADER = (
    f"{'model':8s} {'size':>4s} {'batch':>5s} {'dtype':5s} {'mode':8s} {'plain/s':>9s} "
    f"{'INQ/s':>9s} {'cached/s':>9s} {'ratio':>6s} {'cached':>6s} {'compile':>7s} exact"
)


def row(r: dict[str, Any]) -> str:
    """One line of the table for a group's figures (or its skip)."""
    head = f"{r['model']:8s} {r['image_size']:4d} {r['batch']:5d} {r['dtype']:5s} {r['mode']:8s}"
    if r["status"] != "done":
        return f"{head} skipped ({r['why']})"
    compile_s = "-" if r["compile_s"] is None else f"{r['compile_s']:.1f}"
    return (
        f"{head} {r['plain_images_per_s']:9.1f} {r['inq_images_per_s']:9.1f} "
        f"{r['inq_cached_images_per_s']:9.1f} {r['ratio']:6.3f} {r['ratio_cached']:6.3f} "
        f"{compile_s:>7s} {'yes' if r['frozen_exact'] else 'NO'}"
    )


def environment(device: str) -> dict[str, Any]:
    """Versions and the device, as printed at the top and kept in the JSON."""
    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = "not installed"
    if device.startswith("cuda"):
        name = torch.cuda.get_device_name(torch.device(device))
    else:
        name = platform.processor() or platform.machine()
        if os.path.exists("/proc/cpuinfo"):
            with open("/proc/cpuinfo") as f:
                models = [
                    line.split(":", 1)[1].strip() for line in f if line.startswith("model name")
                ]
            name = models[0] if models else name
        threads = torch.get_num_threads()
        name = f"CPU {name}, {threads} thread{'s' if threads > 1 else ''}"
    return {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "triton": triton_version,
        "device": name,
        "python": platform.python_version(),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), help="default: cuda if available")
    parser.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS))
    parser.add_argument(
        "--dtypes",
        nargs="+",
        choices=tuple(DTYPES),
        help="default: fp16 bf16 (cuda), fp32 bf16 (cpu)",
    )
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    parser.add_argument(
        "--batch",
        type=int,
        help="every model's batch (default: cuda resnet20 256, resnet18 128; cpu 32)",
    )
    parser.add_argument("--steps", type=int, help="timed steps per arm (default: cuda 30, cpu 10)")
    parser.add_argument(
        "--warmup", type=int, help="untimed steps after the first (default: cuda 5, cpu 2)"
    )
    parser.add_argument(
        "--image-size", type=int, help="ResNet-18's input size (default: cuda 224, cpu 64)"
    )
    parser.add_argument("--threads", type=int, help="torch CPU threads (default: torch's)")
    parser.add_argument(
        "--cold-compile", action="store_true", help="no inductor caches: compile from scratch"
    )
    parser.add_argument("--budget-s", type=float, help="start no group after this many seconds")
    parser.add_argument("--json", help="also write the figures to this JSON file")
    args = parser.parse_args(argv)
    for flag, value, least in (("--batch", args.batch, 1), ("--steps", args.steps, 1)):
        if value is not None and value < least:
            parser.error(f"{flag} must be at least {least}, got {value}")
    if args.warmup is not None and args.warmup < 0:
        parser.error(f"--warmup must be at least 0, got {args.warmup}")
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: torch.cuda.is_available() is False")
    cuda = device == "cuda"
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.cold_compile:
        from torch._inductor import config as inductor_config

        inductor_config.force_disable_caches = True
    dtypes = args.dtypes or (["fp16", "bf16"] if cuda else ["fp32", "bf16"])
    steps = args.steps or (30 if cuda else 10)
    warmup = args.warmup if args.warmup is not None else (5 if cuda else 2)
    resnet18_size = args.image_size or (224 if cuda else 64)
    if cuda:
        torch.backends.cudnn.benchmark = True  # as training would; the warm-up autotunes

    def batch(model: str) -> int:
        return args.batch or (32 if not cuda else 256 if model == "resnet20" else 128)

    sizes = {"resnet20": 32, "resnet18": resnet18_size}
    groups = [
        Group(model, dtype, mode, batch(model), sizes[model])
        for mode in args.modes
        for model in args.models
        for dtype in dtypes
    ]
    env = environment(device)
    print(
        f"torch {env['torch']} (CUDA {env['cuda']}), triton {env['triton']}, python "
        f"{env['python']}; {env['device']}"
    )
    if not cuda and "resnet18" in args.models:
        print(f"CPU run: ResNet-18 on {resnet18_size}x{resnet18_size} inputs (224x224 on CUDA)")
    print(
        f"{steps} timed steps after {warmup} warm-up steps and a first (compiling) one, per arm;"
        "\nSGD momentum 0.9, weight decay 5e-4; INQ: 5 bits, 60 % frozen; compile: seconds of "
        f"the three arms' first steps (inductor caches {'off' if args.cold_compile else 'as found'}"
        ");\nratio: step time with INQ / plain (goal <= "
        f"{GOAL[device]:.2f} on {device})\n"
    )
    print(HEADER, flush=True)
    record: dict[str, Any] = {
        "environment": env,
        "settings": {
            "device": device,
            "steps": steps,
            "warmup": warmup,
            "budget_s": args.budget_s,
            "cold_compile": args.cold_compile,
        },
        "groups": [],
    }

    def done(figures: dict[str, Any]) -> None:
        print(row(figures), flush=True)
        record["groups"].append(figures)
        record["compiled_over_eager"] = compiled_over_eager(record["groups"])
        if args.json:  # after every group: a run stopped from outside keeps what it finished
            with open(args.json + ".tmp", "w") as f:
                json.dump(record, f, indent=2)
            os.replace(args.json + ".tmp", args.json)

    def log(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    results = run_groups(
        groups,
        device=device,
        steps=steps,
        warmup=warmup,
        budget_s=args.budget_s,
        on_done=done,
        log=log,
    )
    ran = [r for r in results if r["status"] == "done"]
    checked = sum(r["frozen_checked"] for r in ran)
    print(
        f"\nfrozen weights exact (torch.equal to their powers of two) after the timed steps of "
        f"all {2 * len(ran)} INQ arms: {checked} weights checked"
    )
    skipped = len(results) - len(ran)
    if skipped:
        print(f"{skipped} of {len(results)} groups skipped (--budget-s {args.budget_s:g})")
    ratios = record.get("compiled_over_eager", {})
    if ratios:
        print("\ncompiled / eager images/s, plain training:")
        for key, value in ratios.items():
            print(f"  {key:16s} {value:6.3f}x")


if __name__ == "__main__":
    main()
