"""Speed and memory of the core library on this machine's CPU (figures, not pass/fail tests).

    python experiments/bench_core.py            # all four figures (about 2 minutes on 2 cores)
    python experiments/bench_core.py --json out.json
    python experiments/bench_core.py --only step --device cuda --amp   # 1. on a GPU, with AMP

1. step-time ratio: training a CIFAR ResNet-20 with an attached INQScheduler (60 % frozen) vs
   plain training, same data and optimizer; steps interleaved, medians, and images/s of each.
   Goal <= 1.03; with and without ``cache_values``. Beside it, the kernels (the ATen ops that
   touch tensor data, nested ones included, read from the profiler) that the attached scheduler
   adds to one training step of MLPs of 1, 4, 16 and 64 linear layers: the launch overhead a
   CPU can count (issue 36: goal <= 2 per step, or <= 2 per layer).
2. time of one ``INQScheduler.step()`` (partition + snap) on torchvision ResNet-50 (25.6 M
   parameters, random init), per stage. Goal <= 2 s.
3. extra training memory per targeted weight, ResNet-50: the scheduler's own tensors (without
   and with ``cache_values``); the peak RSS (Linux) of training steps with INQ attached (60 %
   frozen) minus that without; and the transient peak of ``step()`` over the RSS before it.
   Each RSS figure twice: with glibc's
   default malloc, which keeps freed blocks of up to 32 MiB in the heap (RSS counts them), and
   with ``MALLOC_MMAP_THRESHOLD_=65536``, which returns large frees to the OS at once, so RSS
   follows the live tensors. Goal <= 2 bytes.
4. speed-up of ``pow2_quantize`` over a per-element Python loop of Eq. 4 on 300 k weights.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
from torch import nn
from torch.profiler import ProfilerActivity

import inq
from inq.models import build_model


def _sgd(model: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4)


def _train_step(model: nn.Module, optimizer: torch.optim.Optimizer, scaler, x, y) -> float:
    """One optimizer step (float16 autocast + grad scaling where ``scaler`` is enabled); its
    wall-clock seconds, the GPU's work included."""
    if x.is_cuda:
        torch.cuda.synchronize()
    start = time.perf_counter()
    optimizer.zero_grad()
    with torch.autocast(x.device.type, torch.float16, enabled=scaler.is_enabled()):
        loss = nn.functional.cross_entropy(model(x), y)
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    if x.is_cuda:
        torch.cuda.synchronize()
    return time.perf_counter() - start


def step_time_ratio(
    steps: int, batch: int, device: str = "cpu", amp: bool = False
) -> dict[str, float]:
    """Median step time of plain training and of training with an attached scheduler (60 %
    frozen), without and with ``cache_values``; the three arms interleaved."""
    torch.manual_seed(0)
    dev = torch.device(device)
    plain = build_model({"name": "resnet20", "num_classes": 10, "in_channels": 3}).to(dev)
    arms = {"plain": plain, "inq": copy.deepcopy(plain), "inq_cached": copy.deepcopy(plain)}
    optimizers = {name: _sgd(model) for name, model in arms.items()}
    for name in ("inq", "inq_cached"):
        sched = inq.INQScheduler(arms[name], bits=5, cache_values=name == "inq_cached")
        sched.attach(optimizers[name])
        sched.step(), sched.step()  # 30 %, 60 % frozen
    scalers = {name: torch.amp.GradScaler(dev.type, enabled=amp) for name in arms}
    x = torch.randn(batch, 3, 32, 32, device=dev)
    y = torch.randint(0, 10, (batch,), device=dev)
    times: dict[str, list[float]] = {name: [] for name in arms}
    for step in range(3 + steps):  # 3 warm-up steps; interleaved, so load drift hits all alike
        for name, model in arms.items():
            seconds = _train_step(model, optimizers[name], scalers[name], x, y)
            if step >= 3:
                times[name].append(seconds)
    median = {name: statistics.median(t) for name, t in times.items()}
    figures = {f"{name}_step_ms": 1e3 * t for name, t in median.items()}
    figures |= {f"{name}_images_per_s": batch / t for name, t in median.items()}
    figures["ratio"] = median["inq"] / median["plain"]
    figures["ratio_cached"] = median["inq_cached"] / median["plain"]
    figures["frozen_fraction"] = sched.quantized_fraction()
    return figures


# ATen ops that launch no kernel of their own: allocation, views and metadata, and the
# conversions whose copy, if any, is a child op counted on its own
_NO_KERNEL = frozenset(
    {
        *("empty", "empty_strided", "empty_like", "resize_", "set_", "scalar_tensor"),
        *("view", "as_strided", "_reshape_alias", "reshape", "_unsafe_view", "view_as"),
        *("expand", "expand_as", "t", "transpose", "permute", "unsqueeze", "squeeze"),
        *("slice", "select", "unbind", "split", "flatten", "detach", "alias", "lift_fresh"),
        *("resolve_conj", "resolve_neg", "to", "_to_copy", "contiguous", "clone"),
    }
)


def _launches_kernel(event) -> bool:
    """An ATen op that touches tensor data (not only 0-dim scalars, which a GPU run wraps on
    the host) and is no allocation, view or conversion wrapper."""
    name = event.name.removeprefix("aten::")
    return (
        event.name.startswith("aten::")
        and name not in _NO_KERNEL
        and any(len(shape) > 0 for shape in event.input_shapes)
    )


def _kernels(event) -> int:
    """The kernels under a profiler event: the lowest kernel-launching ops of its subtree. An op
    whose children launch kernels counts through them only (out-of-place ``masked_fill`` as its
    copy and ``masked_fill_``; on the CPU ``addmm`` as its bias copy): exact for the
    scheduler's elementwise ops, an undercount of some of the model's, which cancel out in
    the difference with plain training."""
    below = sum(_kernels(child) for child in event.cpu_children)
    return below or int(_launches_kernel(event))


def _kernels_of_step(model: nn.Module, optimizer: torch.optim.Optimizer, x, y) -> int:
    """The device kernels one training step would launch: every ATen op the profiler records,
    nested ones included (a ``TorchDispatchMode`` sees only the outermost, missing e.g. the
    copy inside an out-of-place ``masked_fill``)."""
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    with torch.profiler.profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        _train_step(model, optimizer, scaler, x, y)
    return sum(_kernels(event) for event in prof.events() if event.cpu_parent is None)


def scheduler_kernels_per_step(layer_counts: tuple[int, ...] = (1, 4, 16, 64)) -> dict[str, float]:
    """Kernels one training step launches with an attached ``INQScheduler`` (60 % frozen) minus
    those without it, for MLPs of ``L`` linear layers (``L`` in ``layer_counts``), with and
    without ``cache_values``: how the scheduler's launches grow with the number of layers."""
    figures: dict[str, float] = {}
    for layers in layer_counts:
        torch.manual_seed(0)
        plain = nn.Sequential(*[nn.Linear(32, 32) for _ in range(layers)])
        plain_opt = _sgd(plain)
        x, y = torch.randn(8, 32), torch.randint(0, 32, (8,))
        for label, cache in (("", False), ("cached_", True)):
            quantized = copy.deepcopy(plain)
            inq_opt = _sgd(quantized)
            sched = inq.INQScheduler(quantized, bits=5, cache_values=cache)
            sched.attach(inq_opt)
            sched.step(), sched.step()  # 30 %, 60 % frozen
            for _ in range(2):  # warm-up: optimizer state, caches
                _kernels_of_step(plain, plain_opt, x, y), _kernels_of_step(quantized, inq_opt, x, y)
            added = _kernels_of_step(quantized, inq_opt, x, y) - _kernels_of_step(
                plain, plain_opt, x, y
            )
            figures[f"{label}added_kernels_{layers}_layers"] = added
            figures[f"{label}added_kernels_per_layer_{layers}_layers"] = added / layers
    return figures


def partition_step_seconds() -> dict[str, float]:
    torch.manual_seed(0)
    model = build_model({"name": "resnet50", "num_classes": 1000})
    sched = inq.INQScheduler(model, bits=5)
    times = {}
    while not sched.done:
        start = time.perf_counter()
        portion = sched.step()
        times[f"step_to_{portion:g}_s"] = time.perf_counter() - start
    times["targeted_weights_M"] = sum(layer.weight.numel() for layer in sched.layers) / 1e6
    times["max_step_s"] = max(v for k, v in times.items() if k.startswith("step_to"))
    return times


def _rss_bytes(field: str) -> int:
    status = Path("/proc/self/status").read_text()
    return int(re.search(rf"{field}:\s+(\d+) kB", status).group(1)) * 1024


def _reset_peak_rss() -> None:
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS


def _peak_rss_child(with_inq: bool) -> None:
    """Print, as JSON, the RSS after a warm-up training step of ResNet-50, the peak while the
    scheduler is built and takes two stages (none without INQ), and the peak of three training
    steps after that."""
    torch.manual_seed(0)
    model = build_model({"name": "resnet50", "num_classes": 1000})
    optimizer, scaler = _sgd(model), torch.amp.GradScaler("cpu", enabled=False)
    x, y = torch.randn(2, 3, 64, 64), torch.randint(0, 1000, (2,))
    _train_step(model, optimizer, scaler, x, y)  # allocates gradients and momentum buffers
    _reset_peak_rss()
    base = _rss_bytes("VmRSS")
    if with_inq:
        sched = inq.INQScheduler(model, bits=5)
        sched.attach(optimizer)
        sched.step(), sched.step()
    steps_peak = _rss_bytes("VmHWM")
    _reset_peak_rss()
    for _ in range(3):
        _train_step(model, optimizer, scaler, x, y)
    print(json.dumps({"base": base, "steps_peak": steps_peak, "train_peak": _rss_bytes("VmHWM")}))


def memory_per_weight() -> dict[str, float]:
    model = build_model({"name": "resnet50", "num_classes": 1000})
    sched = inq.INQScheduler(model, bits=5)
    targeted = sum(layer.weight.numel() for layer in sched.layers)
    cached = inq.INQScheduler(model, bits=5, portions=(0.3, 1.0), cache_values=True)
    cached.step()  # builds every layer's stage cache
    cache_bytes = sum(
        la.codes.nbytes + la._stage_cache().mask.nbytes + la._stage_cache().values.nbytes
        for la in cached.layers
    )
    figures = {
        "targeted_weights_M": targeted / 1e6,
        "scheduler_state_bytes_per_weight": sum(la.codes.nbytes for la in sched.layers) / targeted,
        "cache_values_state_bytes_per_weight": cache_bytes / targeted,
    }

    def child(flag: str, env: dict[str, str]) -> dict[str, int]:
        cmd = [sys.executable, __file__, "--rss-child", flag]
        done = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env)
        return json.loads(done.stdout)

    allocators = {"glibc": {}, "mmap64k": {"MALLOC_MMAP_THRESHOLD_": "65536"}}
    for label, extra in allocators.items():
        env = {**os.environ, **extra}
        plain, with_inq = child("plain", env), child("inq", env)
        figures[f"train_peak_rss_delta_bytes_per_weight_{label}"] = (
            with_inq["train_peak"] - plain["train_peak"]
        ) / targeted
        figures[f"step_transient_peak_bytes_per_weight_{label}"] = (
            with_inq["steps_peak"] - with_inq["base"]
        ) / targeted
    return figures


def _eq4_scalar(w: float, n1: int, bits: int) -> float:
    """The paper's Eq. 4 for one weight, written the obvious way (with inq's clamp)."""
    n2 = n1 + 1 - 2 ** (bits - 2)
    a = abs(w)
    if a < 2.0 ** (n2 - 1):
        return 0.0
    for e in range(n2, n1 + 1):  # beta = 2**e when (alpha + beta)/2 <= |w| < 3*beta/2
        if a < 1.5 * 2.0**e:
            return math.copysign(2.0**e, w)
    return math.copysign(2.0**n1, w)


def quantize_speedup(numel: int) -> dict[str, float]:
    torch.manual_seed(0)
    w = torch.randn(numel) * 0.05
    n1 = inq.pow2_n1(w)
    start = time.perf_counter()
    looped = torch.tensor([_eq4_scalar(v, n1, 5) for v in w.tolist()])
    loop_s = time.perf_counter() - start
    vector_times = []
    for _ in range(20):
        start = time.perf_counter()
        vectorised = inq.pow2_quantize(w, n1, 5)
        vector_times.append(time.perf_counter() - start)
    if not torch.equal(looped, vectorised):
        raise AssertionError("pow2_quantize disagrees with the scalar Eq. 4 loop")
    vector_s = statistics.median(vector_times)
    return {"loop_s": loop_s, "vectorised_ms": 1e3 * vector_s, "speedup": loop_s / vector_s}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="also write the figures to this JSON file")
    parser.add_argument("--steps", type=int, default=30, help="timed steps per arm (ratio)")
    parser.add_argument("--batch", type=int, default=128, help="batch size (ratio)")
    parser.add_argument("--device", default="cpu", help="of the step-time ratio (cpu, cuda)")
    parser.add_argument("--amp", action="store_true", help="float16 autocast in the ratio")
    parser.add_argument("--only", choices=("step",), help="only the step-time ratio")
    parser.add_argument("--rss-child", choices=("plain", "inq"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rss_child:
        return _peak_rss_child(args.rss_child == "inq")
    where = torch.cuda.get_device_name() if args.device.startswith("cuda") else "CPU"
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {where}")
    figures = {
        "step_time_ratio": step_time_ratio(args.steps, args.batch, args.device, args.amp),
        "scheduler_kernels_per_step": scheduler_kernels_per_step(),
    }
    if args.only is None:
        figures["partition_step"] = partition_step_seconds()
        figures["memory"] = memory_per_weight()
        figures["pow2_quantize_300k"] = quantize_speedup(300_000)
    for name, values in figures.items():
        print(f"\n{name}")
        for key, value in values.items():
            print(f"  {key:36s} {value:12.4f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(figures, f, indent=2)


if __name__ == "__main__":
    main()
