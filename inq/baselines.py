"""Baselines that INQ is compared with, on the same power-of-two level sets.

- :func:`oneshot_quantize`: round every target weight to its level set at once, no retraining (the
  power-of-two mode of Ristretto). It is an :class:`~inq.scheduler.INQScheduler` with the single
  portion 1.0, stepped once.
- :class:`STEQuantizer`: quantization-aware fine-tuning of all target weights at once with a
  straight-through estimator. The parameters stay float "shadow" weights; every forward pass sees
  their power-of-two values, and the gradient passes through the rounding as if it were the
  identity. :meth:`STEQuantizer.finalize` snaps the shadows and hands back a fully quantized
  scheduler, so :func:`inq.masked.save_masked` and ``verify`` work unchanged. Weights the
  scheduler pruned stay exactly zero (they get no gradient).

Both take the level sets (n1 per layer or channel, by the scheduler's ``n1_rule`` and
``granularity``) from the weights when they start (the float model), like INQ.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import nn
from torch.nn.utils import parametrize

from inq.pow2 import pow2_quantize
from inq.scheduler import INQScheduler, QuantizedLayer

__all__ = ["STEQuantizer", "oneshot_quantize"]


def oneshot_quantize(
    model: nn.Module,
    bits: int = 5,
    include: str | Sequence[str] | None = None,
    exclude: str | Sequence[str] | None = None,
    n1_rule: str = "max",
    granularity: str = "layer",
    layer_bits: Mapping[str, int] | None = None,
) -> INQScheduler:
    """Snap every target weight of ``model`` to its power-of-two level set, all at once.

    Returns the fully quantized scheduler (every mask set), ready for
    :func:`inq.masked.save_masked`.

    Example:
        >>> model = nn.Sequential(nn.Linear(8, 4), nn.ReLU(), nn.Linear(4, 2))
        >>> sched = oneshot_quantize(model, bits=3)
        >>> sched.done, sched.quantized_fraction()
        (True, 1.0)
        >>> oneshot_quantize(model, bits=3, layer_bits={"0": 8}).layer_bits
        {'0': 8, '2': 3}

    Raises:
        ValueError: as :class:`~inq.scheduler.INQScheduler` (bad bits, patterns, NaN weights).
    """
    scheduler = INQScheduler(
        model,
        bits=bits,
        portions=(1.0,),
        include=include,
        exclude=exclude,
        n1_rule=n1_rule,
        granularity=granularity,
        layer_bits=layer_bits,
    )
    scheduler.step()
    return scheduler


class STEQuantizer:
    """Straight-through-estimator fine-tuning of ``scheduler``'s target weights in ``model``.

    ``scheduler`` must be an unstepped :class:`~inq.scheduler.INQScheduler` with
    ``portions=(1.0,)`` over ``model``; it selects the layers and holds their level sets (chosen
    now from the weights unless already set, e.g. by ``load_state_dict`` on a resume), so its
    ``state_dict()`` is all a checkpoint needs. While active, each target module's ``weight`` is
    parametrized (:mod:`torch.nn.utils.parametrize`): the parameter, under
    ``<module>.parametrizations.weight.original`` in the state dict, is the float shadow; the
    forward pass uses ``pow2_quantize(shadow, n1, bits)`` exactly, with each layer's own ``n1`` and
    ``bits`` (:attr:`~inq.scheduler.QuantizedLayer.bits`).

    Example:
        >>> torch.manual_seed(0)  # doctest: +ELLIPSIS
        <torch._C.Generator object at ...>
        >>> model = nn.Sequential(nn.Linear(8, 4), nn.ReLU(), nn.Linear(4, 2))
        >>> ste = STEQuantizer(model, INQScheduler(model, bits=3, portions=(1.0,)))
        >>> optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        >>> for _ in range(3):
        ...     optimizer.zero_grad()
        ...     model(torch.randn(16, 8)).square().mean().backward()
        ...     optimizer.step()
        >>> sched = ste.finalize()       # shadows snapped, every mask set
        >>> sched.done, ste.active
        (True, False)

    Raises:
        ValueError: if the scheduler was already stepped or has other portions than ``(1.0,)``.
    """

    def __init__(self, model: nn.Module, scheduler: INQScheduler) -> None:
        if scheduler.stage != 0 or scheduler.portions != (1.0,):
            raise ValueError(
                "STEQuantizer needs an unstepped INQScheduler with portions=(1.0,), got "
                f"{scheduler!r}"
            )
        self.scheduler = scheduler
        by_weight = {id(layer.weight): layer for layer in scheduler.layers}
        self._modules = [
            (module, by_weight[id(module.weight)])
            for module in model.modules()
            if id(getattr(module, "weight", None)) in by_weight  # tied weights: every user
        ]
        scheduler.fix_level_sets()
        for module, layer in self._modules:
            parametrize.register_parametrization(module, "weight", _StraightThrough(layer))
        self.active = True

    def finalize(self) -> INQScheduler:
        """Snap the shadows to their power-of-two values and drop the parametrization.

        Each module's ``weight`` is a plain parameter again (the same object the optimizer holds),
        equal to what the last forward pass used; the returned scheduler has every mask set and,
        if attached to an optimizer, keeps the weights frozen from now on.

        Raises:
            RuntimeError: if called twice.
        """
        if not self.active:
            raise RuntimeError("STEQuantizer.finalize() was already called")
        for module, _ in self._modules:
            parametrize.remove_parametrizations(module, "weight", leave_parametrized=False)
        self.active = False
        self.scheduler.step()  # portion 1.0 with the stored n1: the same Eq. 4 values
        return self.scheduler


class _StraightThrough(nn.Module):
    """Forward: the power-of-two values, exactly; backward: the identity (``d q / d w = 1``)."""

    def __init__(self, layer: QuantizedLayer) -> None:
        super().__init__()
        self.layer = layer  # n1 is read live: a resume may restore it later

    def forward(self, shadow: torch.Tensor) -> torch.Tensor:
        snapped = pow2_quantize(shadow, self.layer.n1, self.layer.bits)
        through = snapped + (shadow - shadow.detach())  # exactly ``snapped``; gradient 1
        if self.layer.count == 0:
            return through
        return torch.where(self.layer.mask, 0.0, through)  # pruned: exactly zero, no gradient
