"""inq.evaluation: loss and accuracy over a loader."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from inq.evaluation import evaluate


class Fixed(nn.Module):
    """Returns the logits it was built with, whatever the input."""

    def __init__(self, logits: torch.Tensor) -> None:
        super().__init__()
        self.logits = logits

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.logits[: len(x)]


def test_counts_and_loss_are_exact() -> None:
    logits = torch.tensor([[2.0, 1.0, 0.0], [0.0, 3.0, 1.0], [1.0, 0.0, 5.0], [4.0, 0.0, 1.0]])
    y = torch.tensor([0, 2, 2, 1])
    loader = [(torch.zeros(2, 1), y[:2]), (torch.zeros(2, 1), y[2:])]
    metrics = evaluate(Fixed(logits), loader, torch.device("cpu"), top5=True)  # rows 0-1 twice
    first = logits[:2]
    expected_loss = (
        torch.nn.functional.cross_entropy(first.double(), y[:2], reduction="sum")
        + torch.nn.functional.cross_entropy(first.double(), y[2:], reduction="sum")
    ) / 4
    assert metrics["count"] == 4
    assert metrics["acc"] == 2 / 4  # row 0 is right for label 0, row 1 for label 1
    assert metrics["acc_top5"] == 1.0  # three classes: every label is in the top 5
    assert metrics["loss"] == pytest.approx(float(expected_loss), rel=1e-6)  # float32 logits


def test_float64_logits_are_compared_unrounded() -> None:
    """Two logits 1e-12 apart are one value in float32: the float64 ones keep the order."""
    logits = torch.tensor([[1.0, 1.0 + 1e-12]], dtype=torch.float64)
    metrics = evaluate(Fixed(logits), [(torch.zeros(1, 1), torch.tensor([1]))], torch.device("cpu"))
    assert metrics["acc"] == 1.0


def test_an_empty_loader_is_one_message() -> None:
    with pytest.raises(ValueError, match="no sample"):
        evaluate(nn.Linear(1, 2), [], torch.device("cpu"))


def test_the_training_mode_is_restored() -> None:
    model = nn.Sequential(nn.Linear(1, 2), nn.Dropout(0.5)).train()
    evaluate(model, [(torch.zeros(3, 1), torch.zeros(3, dtype=torch.long))], torch.device("cpu"))
    assert model.training
