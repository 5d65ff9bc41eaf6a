"""Distillation: the loss is cross-entropy and T^2 * KL mixed exactly, only the student learns,
and the frozen teacher is a detached copy."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from inq.distill import distill_loss, frozen_teacher, kd_loss


def logits(batch: int = 16, classes: int = 10, seed: int = 0) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(seed)
    student = torch.randn(batch, classes, generator=gen) * 3
    teacher = torch.randn(batch, classes, generator=gen) * 3
    targets = torch.randint(0, classes, (batch,), generator=gen)
    return student, teacher, targets


def reference_kl(student: torch.Tensor, teacher: torch.Tensor, t: float) -> torch.Tensor:
    """KL(p_teacher || p_student) at temperature t, written out in float64, batch mean."""
    p_s = torch.softmax(student.double() / t, 1)
    p_t = torch.softmax(teacher.double() / t, 1)
    return (p_t * (p_t.log() - p_s.log())).sum(1).mean()


def test_weight_zero_is_cross_entropy_bit_for_bit() -> None:
    student, teacher, targets = logits()
    loss = distill_loss(student, teacher, targets, weight=0.0, temperature=4.0)
    assert torch.equal(loss, F.cross_entropy(student, targets))
    # the teacher's logits are not looked at: even NaN ones change nothing
    nan = torch.full_like(teacher, float("nan"))
    assert torch.equal(distill_loss(student, nan, targets, 0.0, 4.0), loss)


@pytest.mark.parametrize("temperature", [0.5, 1.0, 4.0, 20.0])
def test_weight_one_is_t_squared_kl(temperature: float) -> None:
    student, teacher, targets = logits()
    loss = distill_loss(student, teacher, targets, weight=1.0, temperature=temperature)
    assert torch.equal(loss, kd_loss(student, teacher, temperature))
    expected = temperature**2 * reference_kl(student, teacher, temperature)
    torch.testing.assert_close(loss.double(), expected, rtol=1e-5, atol=1e-6)


def test_a_weight_mixes_the_two_terms() -> None:
    student, teacher, targets = logits()
    ce = F.cross_entropy(student, targets)
    kd = kd_loss(student, teacher, 2.0)
    loss = distill_loss(student, teacher, targets, weight=0.3, temperature=2.0)
    assert torch.equal(loss, 0.7 * ce + 0.3 * kd)


def test_equal_logits_give_no_distillation_term() -> None:
    student, _, _ = logits()
    assert float(kd_loss(student, student.clone(), 4.0)) == pytest.approx(0.0, abs=1e-6)


def test_the_gradient_reaches_the_student_only() -> None:
    student, teacher, targets = logits()
    student.requires_grad_(True)
    teacher.requires_grad_(True)
    distill_loss(student, teacher, targets, weight=0.5, temperature=4.0).backward()
    assert teacher.grad is None
    assert student.grad is not None and bool(student.grad.abs().sum() > 0)
    # the distillation term's gradient: T^2 * (p_s - p_t) / T / batch = T * (p_s - p_t) / batch
    s = student.detach().requires_grad_(True)
    kd_loss(s, teacher, 4.0).backward()
    expected = 4.0 * (torch.softmax(s / 4, 1) - torch.softmax(teacher.detach() / 4, 1)) / len(s)
    torch.testing.assert_close(s.grad, expected, rtol=1e-5, atol=1e-7)


@settings(max_examples=200)
@given(
    batch=st.integers(1, 9),
    classes=st.integers(2, 40),
    temperature=st.floats(0.05, 50.0),
    weight=st.floats(0.0, 1.0),
    scale=st.floats(0.0, 30.0),
    seed=st.integers(0, 2**16),
)
def test_the_loss_is_at_least_the_weighted_cross_entropy(
    batch: int, classes: int, temperature: float, weight: float, scale: float, seed: int
) -> None:
    gen = torch.Generator().manual_seed(seed)
    student = torch.randn(batch, classes, generator=gen) * scale
    teacher = torch.randn(batch, classes, generator=gen) * scale
    targets = torch.randint(0, classes, (batch,), generator=gen)
    kd = kd_loss(student, teacher, temperature)
    assert torch.isfinite(kd) and float(kd) >= -1e-5 * temperature**2  # KL >= 0, up to rounding
    loss = distill_loss(student, teacher, targets, weight, temperature)
    floor = (1 - weight) * F.cross_entropy(student, targets)
    assert float(loss) >= float(floor) - 1e-5 * max(1.0, temperature**2)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"weight": 1.5, "temperature": 4.0}, r"weight must lie in \[0, 1\], got 1.5"),
        ({"weight": -0.1, "temperature": 4.0}, r"weight must lie in \[0, 1\], got -0.1"),
        ({"weight": 0.5, "temperature": 0.0}, "temperature must be > 0, got 0.0"),
        ({"weight": 0.0, "temperature": -1.0}, "temperature must be > 0, got -1.0"),
    ],
)
def test_bad_settings_are_refused(kwargs: dict[str, float], message: str) -> None:
    student, teacher, targets = logits()
    with pytest.raises(ValueError, match=message):
        distill_loss(student, teacher, targets, **kwargs)


def test_logits_of_different_shapes_are_refused() -> None:
    student, teacher, _ = logits()
    with pytest.raises(ValueError, match=r"differ in shape: \(16, 10\) vs \(16, 9\)"):
        kd_loss(student, teacher[:, :9], 4.0)


def test_the_frozen_teacher_is_a_detached_copy_in_eval_mode() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 5), nn.BatchNorm1d(5), nn.Dropout(0.5), nn.Linear(5, 3))
    model(torch.randn(32, 6))  # BatchNorm statistics that are not the initial ones
    teacher = frozen_teacher(model)
    assert not teacher.training and model.training
    assert all(not p.requires_grad for p in teacher.parameters())
    assert all(p.requires_grad for p in model.parameters())
    for (name, mine), (_, theirs) in zip(
        model.state_dict().items(), teacher.state_dict().items(), strict=True
    ):
        assert torch.equal(mine, theirs) and mine.data_ptr() != theirs.data_ptr(), name

    # distilling trains the student; the teacher stays as it was, bit for bit
    before = {k: v.clone() for k, v in teacher.state_dict().items()}
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9)
    x, y = torch.randn(16, 6), torch.arange(16) % 3
    for _ in range(3):
        with torch.no_grad():
            teacher_logits = teacher(x)
        loss = distill_loss(model(x), teacher_logits, y, weight=0.7, temperature=2.0)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert all(p.grad is None for p in teacher.parameters())
    assert all(torch.equal(teacher.state_dict()[k], v) for k, v in before.items())
    assert not torch.equal(model[0].weight, teacher[0].weight)
    assert torch.equal(teacher(x), teacher(x))  # eval mode: no dropout, running statistics
