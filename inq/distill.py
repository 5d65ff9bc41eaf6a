"""Knowledge distillation from the float model: the loss and the frozen teacher.

INQ retrains the still-float weights after each partition; with distillation the retrained
(student) model also learns the softened outputs of the float model it started from (the
teacher), as in Hinton et al., "Distilling the Knowledge in a Neural Network" (2015):

``loss = (1 - w) * CE(student, y) + w * T^2 * KL(softmax(teacher / T) || softmax(student / T))``

The ``T^2`` keeps the gradient of the distillation term on the scale of the cross-entropy's
whatever the temperature ``T``. ``w = 0`` is plain cross-entropy, bit for bit.

Example, in a loop of one's own::

    teacher = frozen_teacher(model)          # before the first INQ stage: the float model
    ...
    with torch.no_grad():
        teacher_logits = teacher(x)
    loss = distill_loss(model(x), teacher_logits, y, weight=0.5, temperature=4.0)
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["blend", "distill_loss", "frozen_teacher", "kd_loss"]


def kd_loss(
    student_logits: torch.Tensor, teacher_logits: torch.Tensor, temperature: float
) -> torch.Tensor:
    """The distillation term ``T^2 * KL(softmax(teacher / T) || softmax(student / T))``, the
    KL divergence summed over classes and averaged over the batch (dim 0); classes on dim 1.

    The gradient flows to ``student_logits`` only (the teacher's are detached).

    Example:
        >>> student = torch.tensor([[2.0, 0.0, -1.0]])
        >>> float(kd_loss(student, student, temperature=4.0))  # the same distribution
        0.0
        >>> float(kd_loss(student, torch.tensor([[0.0, 2.0, -1.0]]), 1.0)) > 0
        True

    Raises:
        ValueError: if ``temperature`` is not > 0 or the shapes differ.
    """
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if student_logits.shape != teacher_logits.shape:
        raise ValueError(
            f"student and teacher logits differ in shape: {tuple(student_logits.shape)} vs "
            f"{tuple(teacher_logits.shape)}"
        )
    student = F.log_softmax(student_logits / temperature, dim=1)
    teacher = F.log_softmax(teacher_logits.detach() / temperature, dim=1)
    kl = F.kl_div(student, teacher, reduction="batchmean", log_target=True)
    return kl * (temperature * temperature)


def distill_loss(
    student_logits: torch.Tensor,
    teacher_logits: torch.Tensor,
    targets: torch.Tensor,
    weight: float,
    temperature: float,
) -> torch.Tensor:
    """``(1 - weight) * F.cross_entropy(student_logits, targets) + weight *``
    :func:`kd_loss` ``(student_logits, teacher_logits, temperature)``.

    ``weight`` 0 returns ``F.cross_entropy(student_logits, targets)`` itself, bit for bit (the
    teacher's logits are not looked at); ``weight`` 1 is the distillation term alone.

    Example:
        >>> student = torch.tensor([[2.0, 0.0, -1.0], [0.5, 1.0, 0.0]])
        >>> teacher = torch.tensor([[3.0, 0.0, 0.0], [0.0, 2.0, 0.0]])
        >>> targets = torch.tensor([0, 1])
        >>> torch.equal(distill_loss(student, teacher, targets, 0.0, 4.0),
        ...             F.cross_entropy(student, targets))
        True
        >>> round(float(distill_loss(student, teacher, targets, 0.5, 4.0)), 4)
        0.2891

    Raises:
        ValueError: if ``weight`` is outside [0, 1] or ``temperature`` is not > 0.
    """
    if not 0.0 <= weight <= 1.0:
        raise ValueError(f"the distillation weight must lie in [0, 1], got {weight}")
    if weight == 0:
        if not temperature > 0:
            raise ValueError(f"temperature must be > 0, got {temperature}")
        return F.cross_entropy(student_logits, targets)
    kd = kd_loss(student_logits, teacher_logits, temperature)
    return blend(student_logits, targets, kd, weight)


def blend(
    student_logits: torch.Tensor, targets: torch.Tensor, kd: torch.Tensor, weight: float
) -> torch.Tensor:
    """``(1 - weight) * F.cross_entropy(student_logits, targets) + weight * kd`` for ``weight``
    in (0, 1]; at 1 the distillation term alone (the cross-entropy is not computed). For a loop
    that logs the :func:`kd_loss` term it has computed anyway.

    Example:
        >>> logits, targets = torch.tensor([[0.0, 0.0]]), torch.tensor([0])
        >>> round(float(blend(logits, targets, torch.tensor(1.0), 0.25)), 4)  # 0.75 ln 2 + 0.25
        0.7699
    """
    if weight == 1:
        return kd
    return (1.0 - weight) * F.cross_entropy(student_logits, targets) + weight * kd


def frozen_teacher(model: nn.Module) -> nn.Module:
    """A frozen copy of ``model`` to distill from: a deep copy (same device and weights, bit for
    bit), in eval mode (BatchNorm uses its running statistics, no dropout), with
    ``requires_grad`` off on every parameter, so no optimizer can move it and no gradient is
    computed for it. ``model`` itself is left as it is.

    Give it the plain model, not a ``DistributedDataParallel`` wrapper: each process holds its
    own copy, and the teacher's forward passes need no communication.

    Example:
        >>> model = nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3))
        >>> teacher = frozen_teacher(model)
        >>> teacher.training, any(p.requires_grad for p in teacher.parameters()), model.training
        (False, False, True)
        >>> torch.equal(teacher[0].weight, model[0].weight), teacher[0].weight is model[0].weight
        (True, False)
    """
    teacher = copy.deepcopy(model)
    teacher.eval()
    teacher.requires_grad_(False)
    return teacher
