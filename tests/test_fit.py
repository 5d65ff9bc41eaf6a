"""The one training step (inq.fit): the plain step bit for bit, distillation, clipping, and the
INQ scheduler's guarantee inside it."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from inq.distill import distill_loss, frozen_teacher
from inq.fit import Distill, fit_step
from inq.scheduler import FLOAT_CODE, INQScheduler


def _net(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    return torch.randn(5, 6, generator=gen), torch.randint(0, 3, (5,), generator=gen)


def test_a_plain_step_is_the_textbook_step_bit_for_bit() -> None:
    x, y = _batch()
    ours, theirs = _net(), _net()
    opt_ours = torch.optim.SGD(ours.parameters(), lr=0.1, momentum=0.9)
    opt_theirs = torch.optim.SGD(theirs.parameters(), lr=0.1, momentum=0.9)
    for _ in range(3):
        loss, logits, kd = fit_step(ours, opt_ours, x, y)
        opt_theirs.zero_grad()
        expected = F.cross_entropy(theirs(x), y)
        expected.backward()
        opt_theirs.step()
        assert torch.equal(loss, expected) and kd is None and logits.shape == (5, 3)
    for a, b in zip(ours.parameters(), theirs.parameters(), strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("weight", [0.0, 0.5, 1.0])
def test_the_distilled_step_is_distill_loss(weight: float) -> None:
    x, y = _batch()
    net = _net()
    teacher = frozen_teacher(_net(seed=5))
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
    with torch.no_grad():
        expected = distill_loss(net(x), teacher(x), y, weight, 2.0)
    loss, _, kd = fit_step(net, optimizer, x, y, distill=Distill(teacher, weight, 2.0))
    assert torch.equal(loss.detach(), expected)
    assert (kd is None) == (weight == 0)


def test_clipping_bounds_the_gradient_the_step_takes() -> None:
    x, y = _batch()
    net = _net()
    optimizer = torch.optim.SGD(net.parameters(), lr=1.0)
    fit_step(net, optimizer, x, y, grad_clip=(net.parameters(), 1e-3))
    norm = float(torch.cat([p.grad.flatten() for p in net.parameters()]).norm())
    # clip_grad_norm_ scales by 1e-3 / (norm + 1e-6) < 1e-3 / norm; the float32 products add at
    # most a relative 2**-24 each, so the clipped norm is below 1e-3 * (1 + 1e-6)
    assert 1e-3 * 0.99 < norm <= 1e-3 * (1 + 1e-6)


def test_frozen_weights_stay_exact_through_the_step() -> None:
    x, y = _batch()
    net = _net()
    sched = INQScheduler(net, bits=4, portions=(0.5, 1.0))
    sched.step()
    optimizer = torch.optim.Adam(net.parameters(), lr=0.1)
    sched.attach(optimizer)
    frozen = {layer.name: layer.weight.detach().clone() for layer in sched.layers}
    for _ in range(3):
        fit_step(net, optimizer, x, y, grad_clip=(net.parameters(), 0.5))
    for layer in sched.layers:
        mask = layer.codes != FLOAT_CODE
        assert torch.equal(layer.weight.detach()[mask], frozen[layer.name][mask])


def test_a_bad_distillation_is_refused() -> None:
    with pytest.raises(ValueError, match="weight must lie in"):
        Distill(nn.Identity(), 1.5, 4.0)
    with pytest.raises(ValueError, match="temperature be > 0"):
        Distill(nn.Identity(), 0.5, 0.0)


def test_a_bfloat16_step_of_a_channels_last_conv_net_keeps_frozen_weights_exact() -> None:
    torch.manual_seed(2)
    net = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 4 * 4, 3))
    net = net.to(memory_format=torch.channels_last)
    sched = INQScheduler(net, bits=5, portions=(0.5, 1.0), cache_values=True)
    sched.step()
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9, weight_decay=0.1)
    sched.attach(optimizer)
    frozen = {layer.name: layer.weight.detach().clone() for layer in sched.layers}
    x = torch.randn(4, 3, 6, 6).to(memory_format=torch.channels_last)
    y = torch.tensor([0, 1, 2, 0])
    for _ in range(3):
        loss, logits, _ = fit_step(net, optimizer, x, y, amp=torch.bfloat16)
        assert logits.dtype == torch.bfloat16 and loss.dtype == torch.float32
        for layer in sched.layers:  # after every step, whatever the autocast dtype
            mask = layer.codes != FLOAT_CODE
            assert torch.equal(layer.weight.detach()[mask], frozen[layer.name][mask])
            assert not torch.equal(layer.weight.detach()[~mask], frozen[layer.name][~mask])
    assert net[0].weight.is_contiguous(memory_format=torch.channels_last)
