"""experiments/bench_core.py's count of the kernels the scheduler adds to a training step."""

from __future__ import annotations

import torch
from torch import nn
from train_helpers import load_experiment

bench_core = load_experiment("bench_core")


def kernels_of(step) -> list[str]:
    """The names of the kernel-launching ops :func:`bench_core._kernels` finds under ``step()``."""
    with torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True
    ) as prof:
        step()
    names: list[str] = []

    def walk(event) -> None:
        below = [child for child in event.cpu_children if bench_core._kernels(child)]
        if below:
            for child in below:
                walk(child)
        elif bench_core._launches_kernel(event):
            names.append(event.name)

    for event in prof.events():
        if event.cpu_parent is None:
            walk(event)
    return names


def test_the_counter_sees_the_forward_the_backward_and_the_optimizer() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 3))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x, y = torch.randn(2, 4), torch.tensor([0, 2])
    scaler = torch.amp.GradScaler("cpu", enabled=False)

    def step() -> None:
        bench_core._train_step(model, optimizer, scaler, x, y)

    step()  # the momentum buffers exist from here on
    names = kernels_of(step)
    assert bench_core._kernels_of_step(model, optimizer, x, y) == len(names) > 0
    assert {"aten::mm", "aten::nll_loss_forward", "aten::_log_softmax"} <= set(names)
    assert any(name.startswith(("aten::add_", "aten::_foreach")) for name in names)  # SGD
    assert not set(names) & {f"aten::{op}" for op in bench_core._NO_KERNEL}


def test_nested_copies_count_and_views_and_host_scalars_do_not() -> None:
    grad, mask = torch.randn(64), torch.rand(64) > 0.5
    assert kernels_of(lambda: grad.masked_fill(mask, 0.0)) == ["aten::copy_", "aten::masked_fill_"]
    assert kernels_of(lambda: torch.where(mask, 0.0, grad)) == ["aten::where"]
    assert kernels_of(lambda: grad.view(8, 8).t()) == []


def test_the_cached_scheduler_adds_two_kernels_a_layer_and_the_default_six() -> None:
    figures = bench_core.scheduler_kernels_per_step((1, 3))
    assert figures["added_kernels_1_layers"] == 6 and figures["added_kernels_3_layers"] == 18
    # the gradient hook's where and the write-back's where, whatever the number of layers
    assert figures["cached_added_kernels_1_layers"] == 2
    assert figures["cached_added_kernels_3_layers"] == 6
