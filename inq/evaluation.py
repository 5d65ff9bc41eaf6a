"""Loss and accuracy of a model over a loader: what ``inq eval`` prints and ``inq-train`` logs."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

__all__ = ["evaluate"]


@torch.no_grad()
def evaluate(
    model: nn.Module,
    loader: Iterable[tuple[torch.Tensor, torch.Tensor]],
    device: torch.device,
    top5: bool = False,
    on_batch: Callable[[], None] = lambda: None,
) -> dict[str, float]:
    """Mean loss, top-1 (and top-5) accuracy and the sample count over ``loader``, summed over
    all ranks of a process group. Logits are compared in their own precision, at least float32
    (an integer model's float64 logits have no ties from rounding).

    Example:
        >>> data = [(torch.randn(4, 3), torch.tensor([0, 1, 2, 0]))]
        >>> sorted(evaluate(nn.Linear(3, 3), data, torch.device("cpu"), top5=True))
        ['acc', 'acc_top5', 'count', 'loss']

    Raises:
        ValueError: if the loader yields no sample.
    """
    was_training = model.training
    model.eval()
    sums = torch.zeros(4, dtype=torch.float64, device=device)  # loss, top-1, top-5, count
    for x, y in loader:
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        logits = model(x)
        logits = logits if logits.dtype == torch.float64 else logits.float()
        sums[0] += F.cross_entropy(logits, y, reduction="sum")
        ranked = logits.topk(min(5, logits.shape[1]), dim=1).indices
        sums[1] += (ranked[:, 0] == y).sum()
        sums[2] += (ranked == y[:, None]).any(dim=1).sum()
        sums[3] += len(y)
        on_batch()
    model.train(was_training)
    if dist.is_initialized():
        dist.all_reduce(sums)
    loss, top1, top5_hits, count = sums.tolist()
    if not count:
        raise ValueError("nothing to evaluate: the loader gave no sample")
    metrics = {"loss": loss / count, "acc": top1 / count, "count": count}
    if top5:
        metrics["acc_top5"] = top5_hits / count
    return metrics
