"""Small fully quantized models and their masked checkpoints, for the export/deployment tests."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from inq.export import save_masked
from inq.scheduler import INQScheduler


class MixedNet(nn.Module):
    """Conv2d (odd channel counts), batch norm, a depthwise conv, Conv1d and Linear layers."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 5, 3, padding=1)
        self.bn = nn.BatchNorm2d(5)
        self.depthwise = nn.Conv2d(5, 5, 3, stride=2, groups=5, bias=False)
        self.seq = nn.Conv1d(5, 7, 3)
        self.fc = nn.Linear(7 * 1, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.depthwise(torch.relu(self.bn(self.conv(x))))  # [N, 5, 3, 3]
        x = self.seq(x.flatten(2))  # [N, 7, 7]
        return self.fc(x.mean(-1, keepdim=True).flatten(1))


def quantize(model: nn.Module, bits: int, portions: tuple[float, ...] = (1.0,)) -> INQScheduler:
    """Run every INQ stage of ``model`` (no training) and return the finished scheduler."""
    sched = INQScheduler(model, bits=bits, portions=portions)
    while not sched.done:
        sched.step()
    return sched


def masked_file(
    folder: Path, bits: int = 5, seed: int = 0, model: nn.Module | None = None
) -> tuple[Path, nn.Module]:
    """A fully quantized model (``MixedNet`` by default) saved as a masked checkpoint."""
    torch.manual_seed(seed)
    model = MixedNet() if model is None else model
    sched = quantize(model, bits)
    path = folder / f"mixed{bits}.safetensors"
    save_masked(path, model, sched, {"name": "mixed"})
    return path, model
