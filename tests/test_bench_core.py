"""experiments/bench_core.py's count of the ATen ops the scheduler adds to a training step."""

from __future__ import annotations

import torch
from torch import nn
from train_helpers import load_experiment

bench_core = load_experiment("bench_core")


def test_the_op_counter_sees_the_forward_the_backward_and_the_optimizer() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 3))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x, y = torch.randn(2, 4), torch.tensor([0, 2])
    seen: list[str] = []

    class Named(bench_core._OpCount):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.append(func.__name__)
            return super().__torch_dispatch__(func, types, args, kwargs)

    with Named() as counter:
        bench_core._train_step(model, optimizer, torch.amp.GradScaler("cpu", enabled=False), x, y)
    assert counter.ops == len(seen) > 0
    assert {"addmm.default", "nll_loss_backward.default", "mm.default"} <= set(seen)
    assert any(name.startswith(("add_", "_foreach")) for name in seen)  # the SGD update


def test_the_scheduler_adds_the_same_ops_for_every_layer_today() -> None:
    figures = bench_core.scheduler_ops_per_step((1, 3))
    one, three = figures["added_ops_1_layers"], figures["added_ops_3_layers"]
    assert one > 0 and three == 3 * one  # per layer: the baseline issue 36 is to cut
    assert figures["added_ops_per_layer_3_layers"] == one
