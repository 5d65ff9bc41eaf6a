"""INQScheduler: staged partition, power-of-two snapping and frozen weights (Algorithm 1).

The scheduler owns one ``uint8`` per targeted weight: the power-of-two code of a frozen weight,
or :data:`FLOAT_CODE` (not a valid code at any bit-width) while the weight is still float. That
byte is the whole state: no bool mask beside it, no float shadow copy. Freezing is enforced twice:

1. a gradient hook zeroes the gradient of every frozen weight before it is accumulated, so
   gradient clipping, AMP's inf checks and DDP's all-reduce only ever see the float weights;
2. after every ``optimizer.step()`` (a step post-hook, installed by :meth:`INQScheduler.attach`),
   every frozen weight is rewritten from its code, so weight decay, momentum or any other state
   of any optimizer cannot move it, not even by one ulp.

Each step costs 6 small kernels a layer (the hook's mask and ``where``; the mask, a decode
from the codes and a ``where`` after the step). ``cache_values=True`` keeps each layer's mask and
frozen values from one stage change to the next, so a step costs 2 kernels a layer for ``1 +
itemsize`` more bytes a weight (5 in float32); the launches are what shows on a GPU.

Pruning (:meth:`INQScheduler.prune`, before the first stage) uses the same state: a pruned weight
is frozen with the zero code, so it stays exactly 0.0 through retraining, every stage and every
export, and the portions of the stages count the remaining weights only.

Every layer has its own bit-width (:attr:`QuantizedLayer.bits`): ``bits`` unless a
``layer_bits`` glob names it (most low-bit work keeps the first and last layer at 8 bits), and
everything per layer (level set, n1 rule, partition, codes) uses it.
"""

from __future__ import annotations

import fnmatch
import itertools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple, overload

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from inq.levels import check_level_options, select_n1
from inq.partition import STRATEGIES, grow_mask, prune_mask, quantized_count
from inq.pow2 import (
    N1,
    broadcast_n1,
    check_bits,
    check_quantizable,
    decode_unchecked,
    pow2_quantize,
    pow2_quantize_codes,
)

__all__ = [
    "DEFAULT_PORTIONS",
    "FLOAT_CODE",
    "TARGET_TYPES",
    "INQScheduler",
    "QuantizedLayer",
    "TargetError",
    "assign_layer_bits",
    "check_portions",
]

DEFAULT_PORTIONS = (0.3, 0.6, 0.8, 1.0)


class TargetError(ValueError):
    """The model and the arguments that pick its target layers do not fit; ``argument`` names
    the one to change: ``"include"``, ``"exclude"``, ``"layer_bits"``, or ``"model"`` (it has no
    layer INQ can quantize)."""

    def __init__(self, argument: str, message: str) -> None:
        super().__init__(message)
        self.argument = argument


TARGET_TYPES = (
    nn.Linear,
    nn.Conv1d,
    nn.Conv2d,
    nn.Conv3d,
    nn.ConvTranspose1d,
    nn.ConvTranspose2d,
    nn.ConvTranspose3d,
)
# 2 added n1_rule and granularity (version 1 loads as "max"/"layer"); 3 added pruned counts;
# 4 added each layer's bits (versions 1-3 load with every layer at the state's "bits")
_STATE_VERSION = 4
FLOAT_CODE = 1  # valid codes are 0 and 2**(bits-1) .. 2**bits - 1, so 1 never is one


@dataclass
class QuantizedLayer:
    """One target weight: its module name, the parameter, and its INQ state.

    ``codes`` (``uint8``, the weight's shape) holds the power-of-two code (see :mod:`inq.pow2`)
    of each quantized entry and :data:`FLOAT_CODE` where the weight is still float; ``n1`` is None
    until the first partition, then an int (one level set) or an int32 tensor ``[O]`` on the CPU
    (one per output channel); ``count`` is the number of frozen entries, ``pruned`` of those
    the ones pruned before the first stage (zero codes; the stages' portions count the rest);
    ``bits`` is the layer's bit-width (the scheduler's ``bits`` or its ``layer_bits`` entry).
    The scheduler replaces ``codes`` and ``n1`` with new objects whenever they change (never in
    place), which is what keeps the stage cache (``cache_values``) in step with them.
    """

    name: str
    weight: nn.Parameter
    codes: torch.Tensor
    bits: int
    n1: N1 | None = None
    count: int = 0
    pruned: int = 0
    cache_values: bool = False
    _cache: _StageCache | None = field(default=None, init=False, repr=False, compare=False)

    @property
    def mask(self) -> torch.Tensor:
        """Bool tensor, True where the weight is quantized (frozen); computed from ``codes``
        (with ``cache_values``, once per stage: treat it as read-only)."""
        if self.cache_values:
            return self._stage_cache().mask
        self._follow_weight_device()
        return self.codes != FLOAT_CODE

    def frozen_values(self) -> torch.Tensor:
        """The snapped values of the quantized entries (NaN where the weight is still float), at
        the layer's own ``bits``."""
        self._follow_weight_device()
        n1 = 0 if self.n1 is None else self.n1
        return decode_unchecked(self.codes, n1, self.bits, self.weight.dtype)

    def _stage_cache(self) -> _StageCache:
        """The mask and the frozen values in the weight's dtype, rebuilt when ``codes``,
        ``n1``, the weight's device or its dtype changed (a stage, a prune, a load, ``.to()``)."""
        self._follow_weight_device()
        cache = self._cache
        if (
            cache is None
            or cache.codes is not self.codes
            or cache.n1 is not self.n1
            or cache.values.dtype != self.weight.dtype
        ):
            cache = _StageCache(self.codes, self.n1, self.codes != FLOAT_CODE, self.frozen_values())
            self._cache = cache
        return cache

    def _follow_weight_device(self) -> None:
        # model.to(device) after the scheduler was built moves the weights but not our state
        if self.codes.device != self.weight.device:
            self.codes = self.codes.to(self.weight.device)


class _StageCache(NamedTuple):
    """What :attr:`QuantizedLayer.cache_values` keeps between stages: the ``codes`` and ``n1``
    objects it was built from, the mask and the frozen values (NaN where float)."""

    codes: torch.Tensor
    n1: N1 | None
    mask: torch.Tensor
    values: torch.Tensor


class INQScheduler:
    """Incremental Network Quantization of a model's conv/linear weights.

    Example:
        >>> model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
        >>> optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
        >>> sched = INQScheduler(model, bits=5)
        >>> sched.attach(optimizer)
        >>> sched.step()                      # stage 1: 30 % of each layer snapped and frozen
        0.3
        >>> round(sched.quantized_fraction(), 2)
        0.3

        Per-layer bit-widths: the first layer at 8 bits, the others at ``bits``:

        >>> sched = INQScheduler(model, bits=4, layer_bits={"0": 8})
        >>> [(layer.name, layer.bits) for layer in sched.layers]
        [('0', 8), ('2', 4)]

    Args:
        model: the float model; its conv/linear weights are the targets (never biases or norms).
        bits: bit-width b in [2, 8]; 2**(b-2) magnitudes plus zero, signed. The default of
            every layer that ``layer_bits`` does not name.
        portions: accumulated quantized fractions, strictly increasing, ending at 1.0.
        strategy: ``"magnitude"`` (largest weights first), ``"random"`` or ``"error"``
            (smallest rounding error to the level set first; see :mod:`inq.partition`).
        seed: seeds the ``random`` partition (identical draw on every process).
        n1_rule: how each level set's n1 is chosen at the first :meth:`step`: ``"max"`` (the
            paper's ``floor(log2(4 max|W| / 3))``) or ``"mse"`` (least squared rounding error of
            the float weights); see :mod:`inq.levels`.
        granularity: ``"layer"`` (one level set per layer, the paper) or ``"channel"`` (one per
            output channel: per slice along the weight's dim 0).
        include: glob patterns (``fnmatch``) of module names to quantize; default all targets.
        exclude: glob patterns of module names to leave in float.
        layer_bits: ``{glob: bits}``: a quantized layer whose module name a glob matches
            (``fnmatch``; the first match, in the mapping's order) gets that bit-width instead
            of ``bits`` (see :func:`assign_layer_bits`).
        cache_values: keep each layer's mask and frozen values (in the weight's dtype) from one
            stage change to the next, so a training step costs 2 kernels per layer (the
            gradient hook's and the write-back's) instead of 6, for ``1 + itemsize`` more bytes
            a weight (5 for float32: 6 in all, against 1). Results are bit for bit the same.

    Raises:
        ValueError: on bad bits, portions, strategy, n1_rule or granularity, a pattern that
            matches no conv/linear layer, a model with no target layer left, or a
            ``layer_bits`` glob that sets no layer's bits.
    """

    def __init__(
        self,
        model: nn.Module,
        bits: int = 5,
        portions: Sequence[float] = DEFAULT_PORTIONS,
        strategy: str = "magnitude",
        seed: int = 0,
        include: str | Sequence[str] | None = None,
        exclude: str | Sequence[str] | None = None,
        n1_rule: str = "max",
        granularity: str = "layer",
        layer_bits: Mapping[str, int] | None = None,
        cache_values: bool = False,
    ) -> None:
        self.bits = check_bits(bits)
        self.portions = check_portions(portions)
        if strategy not in STRATEGIES:
            raise ValueError(f"strategy must be one of {STRATEGIES}, got {strategy!r}")
        check_level_options(n1_rule, granularity)
        self.strategy, self.n1_rule, self.granularity = strategy, n1_rule, granularity
        self.seed = int(seed)
        self.stage = 0
        targets = _select_targets(model, include, exclude)
        own_bits = assign_layer_bits([name for name, _ in targets], self.bits, layer_bits)
        self._layers = tuple(
            QuantizedLayer(
                name=name,
                weight=weight,
                codes=torch.full_like(weight, FLOAT_CODE, dtype=torch.uint8),
                bits=own_bits[name],
                cache_values=cache_values,
            )
            for name, weight in targets
        )
        # attached optimizers and their step post-hooks, in attach order
        self._optimizers: dict[torch.optim.Optimizer, RemovableHandle] = {}
        self._grad_hooks = [
            layer.weight.register_hook(self._grad_hook(layer))  # type: ignore[no-untyped-call]
            for layer in self._layers  # (torch's stub leaves Tensor.register_hook untyped)
        ]

    # ------------------------------------------------------------------ public API

    @property
    def layers(self) -> tuple[QuantizedLayer, ...]:
        """The target layers, in module order."""
        return self._layers

    @property
    def layer_bits(self) -> dict[str, int]:
        """``{layer name: bits}`` of every target layer, in module order."""
        return {layer.name: layer.bits for layer in self._layers}

    @property
    def done(self) -> bool:
        """True once the last portion (1.0) has been applied."""
        return self.stage == len(self.portions)

    def attach(self, optimizer: torch.optim.Optimizer) -> None:
        """Keep frozen weights exact after every ``optimizer.step()``; call once per optimizer.

        Also clears the optimizer state of frozen entries now and at every later :meth:`step`.

        Raises:
            ValueError: if the optimizer holds none of the target weights.
        """
        held = {id(p) for group in optimizer.param_groups for p in group["params"]}
        if not any(id(layer.weight) in held for layer in self._layers):
            raise ValueError(
                "attach(): the optimizer holds none of the quantized weights; build it from "
                "model.parameters() of the model given to INQScheduler"
            )
        if optimizer in self._optimizers:
            return
        self._optimizers[optimizer] = optimizer.register_step_post_hook(lambda *_: self.enforce())
        self._clear_optimizer_state(optimizer)

    def step(self) -> float:
        """Go to the next stage: partition each layer, snap the new weights, freeze them.

        Returns the new accumulated portion. The level sets (n1 of each layer or channel) are
        chosen from the weights at the first call (:meth:`fix_level_sets`) and kept from then on.
        Either every layer advances or, on error, none does.

        Raises:
            RuntimeError: if every stage is already done.
            ValueError: if a weight holds NaN or infinity.
        """
        if self.done:
            raise RuntimeError(
                f"INQScheduler.step(): all {len(self.portions)} stages are done (portion "
                f"{self.portions[-1]} reached); check sched.done before stepping"
            )
        portion = self.portions[self.stage]
        # Check every layer before changing any, then advance one layer at a time: the
        # temporaries of one layer are all that exists beside the state at any moment.
        n1s = self._checked_n1s()
        for layer, n1 in zip(self._layers, n1s, strict=True):
            self._advance(layer, n1, portion)
        self.stage += 1
        self.enforce()
        for optimizer in self._optimizers:
            self._clear_optimizer_state(optimizer)
        return portion

    def prune(self, sparsity: float | Mapping[str, float]) -> float:
        """Prune by magnitude: freeze the smallest ``|w|`` of each layer at exactly zero.

        After the call ``quantized_count(sparsity, N)`` of a layer's ``N`` weights are pruned
        (the smallest first, ties to the lower flat index; pruned weights stay pruned; at least
        one weight of a layer stays). Call it
        before the first :meth:`step`, once or with growing sparsity between rounds of retraining
        (iterative pruning); :meth:`step` then quantizes its portions of the remaining weights.
        Returns the pruned fraction of all target weights.

        Example:
            >>> model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
            >>> sched = INQScheduler(model, bits=5, portions=(0.5, 1.0))
            >>> sched.prune({"0": 0.75, "2": 0.5})
            0.7
            >>> bool((model[0].weight == 0).sum() >= 96)
            True
            >>> _ = sched.step()                  # half of the remaining weights quantized
            >>> sched.quantized_fraction(per_layer=True)["0"]
            0.875

        Args:
            sparsity: the pruned fraction of every layer, in ``[0, 1)``, or ``{layer name:
                fraction}`` (layers left out keep what they have).

        Raises:
            RuntimeError: once :meth:`step` has started the stages.
            ValueError: on a fraction outside ``[0, 1)`` or below what a layer already has
                pruned, an unknown layer name, or NaN/infinite weights.
        """
        if self.stage:
            raise RuntimeError(
                "INQScheduler.prune(): prune before the first step(); the stages have started"
            )
        names = [layer.name for layer in self._layers]
        targets = dict.fromkeys(names, sparsity) if not isinstance(sparsity, Mapping) else sparsity
        unknown = [name for name in targets if name not in names]
        if unknown:
            raise ValueError(f"prune(): no target layer named {unknown}; layers are {names}")
        counts = {}
        for layer in self._layers:  # check every layer before changing any
            fraction = float(targets.get(layer.name, 0.0))
            if not 0.0 <= fraction < 1.0:
                raise ValueError(f"prune(): sparsity of {layer.name!r} must lie in [0, 1)")
            numel = layer.weight.numel()
            want = min(quantized_count(fraction, numel), max(numel - 1, 0))  # one weight stays
            if layer.name in targets and want < layer.pruned:
                raise ValueError(
                    f"prune(): {layer.name!r} has {layer.pruned} weights pruned already, more "
                    f"than sparsity {fraction} asks for; pruning only grows"
                )
            count = max(want, layer.pruned)
            if not bool(torch.isfinite(layer.weight.detach()).all()):
                raise ValueError(f"prune(): layer {layer.name!r} holds NaN or infinity")
            counts[layer.name] = count
        for layer in self._layers:
            pruned = prune_mask(layer.weight.detach(), layer.mask, counts[layer.name])
            codes = layer.codes.clone()  # a new tensor, as in _advance
            codes[pruned] = 0
            layer.codes, layer.count = codes, counts[layer.name]
            layer.pruned = layer.count
        self.enforce()
        for optimizer in self._optimizers:
            self._clear_optimizer_state(optimizer)
        return self.pruned_fraction()

    @overload
    def pruned_fraction(self, per_layer: Literal[False] = False) -> float: ...
    @overload
    def pruned_fraction(self, per_layer: Literal[True]) -> dict[str, float]: ...
    def pruned_fraction(self, per_layer: bool = False) -> float | dict[str, float]:
        """Fraction of target weights pruned by :meth:`prune`: in total, or ``{name: fraction}``
        (0.0 for an empty layer)."""
        if per_layer:
            return {
                layer.name: _share(layer.pruned, layer.weight.numel(), 0.0)
                for layer in self._layers
            }
        total = sum(layer.weight.numel() for layer in self._layers)
        return _share(sum(layer.pruned for layer in self._layers), total, 0.0)

    def fix_level_sets(self) -> None:
        """Choose every layer's n1 from its current weights now, if not chosen yet.

        :meth:`step` does this at the first stage; the STE baseline calls it before training.

        Raises:
            ValueError: if a weight holds NaN or infinity.
        """
        for layer, n1 in zip(self._layers, self._checked_n1s(), strict=True):
            layer.n1 = n1

    def current_n1(self, layer: QuantizedLayer) -> N1:
        """``layer``'s n1: the one fixed at the first stage or, before it, the one a stage would
        choose from the weights now.

        Example:
            >>> fc = torch.nn.Linear(4, 2)
            >>> sched = INQScheduler(fc, bits=5)
            >>> with torch.no_grad():
            ...     _ = fc.weight.fill_(0.3)
            >>> sched.current_n1(sched.layers[0])  # floor(log2(4 * 0.3 / 3))
            -2
        """
        if layer.n1 is not None:
            return layer.n1
        n1 = select_n1(layer.weight.detach(), layer.bits, self.n1_rule, self.granularity)
        return n1.cpu() if isinstance(n1, torch.Tensor) else n1

    @torch.no_grad()
    def enforce(self) -> None:
        """Write every frozen weight's snapped value into the model (exact, idempotent).

        :meth:`attach` runs this after each optimizer step; call it yourself after updating
        weights by other means (a custom optimizer, EMA, loading a float state dict).
        """
        for layer in self._layers:
            if layer.count == 0:
                continue
            values = layer._stage_cache().values if layer.cache_values else layer.frozen_values()
            if layer.count == layer.weight.numel():
                layer.weight.copy_(values)
            else:
                torch.where(layer.mask, values, layer.weight, out=layer.weight)

    @overload
    def quantized_fraction(self, per_layer: Literal[False] = False) -> float: ...
    @overload
    def quantized_fraction(self, per_layer: Literal[True]) -> dict[str, float]: ...
    def quantized_fraction(self, per_layer: bool = False) -> float | dict[str, float]:
        """Fraction of target weights that are quantized (pruned ones included: frozen at the
        zero code): in total, or ``{name: fraction}``. An empty layer, with no weight to count,
        reports the portion reached (0.0 before the first stage)."""
        reached = self.portions[self.stage - 1] if self.stage else 0.0
        if per_layer:
            return {
                layer.name: _share(layer.count, layer.weight.numel(), reached)
                for layer in self._layers
            }
        total = sum(layer.weight.numel() for layer in self._layers)
        return _share(sum(layer.count for layer in self._layers), total, reached)

    def detach(self, optimizer: torch.optim.Optimizer) -> None:
        """Stop enforcing after ``optimizer``'s steps (e.g. before replacing it); idempotent."""
        handle = self._optimizers.pop(optimizer, None)
        if handle is not None:
            handle.remove()

    def remove_hooks(self) -> None:
        """Detach from the model and all optimizers; frozen weights are no longer kept exact."""
        for handle in [*self._grad_hooks, *self._optimizers.values()]:
            handle.remove()
        self._grad_hooks.clear()
        self._optimizers.clear()

    def state_dict(self) -> dict[str, Any]:
        """Everything needed for an exact resume: settings, stage, and per layer bits, n1, codes
        and pruned count.

        Holds only ints, floats, strings and tensors: loads with ``torch.load(weights_only=True)``.
        """
        return {
            "version": _STATE_VERSION,
            "bits": self.bits,
            "portions": list(self.portions),
            "strategy": self.strategy,
            "seed": self.seed,
            "n1_rule": self.n1_rule,
            "granularity": self.granularity,
            "stage": self.stage,
            "layers": {
                layer.name: {
                    "bits": layer.bits,
                    "n1": layer.n1,
                    "codes": layer.codes.cpu(),
                    "pruned": layer.pruned,
                }
                for layer in self._layers
            },
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` output and write the frozen values into the model.

        States of versions 1 to 3 (before per-layer bits) hold every layer at their ``bits``.

        Raises:
            ValueError: if the state was made with other settings (per-layer bits included) or
                for another model, or holds codes that are not valid codes of a layer's bits.
        """
        if state.get("version") not in (1, 2, 3, _STATE_VERSION):
            raise ValueError(f"unsupported INQ scheduler state version {state.get('version')!r}")
        state = {"n1_rule": "max", "granularity": "layer", **state}  # version 1: the paper's
        for key in ("bits", "portions", "strategy", "seed", "n1_rule", "granularity"):
            mine = getattr(self, key)
            theirs = tuple(state[key]) if key == "portions" else state[key]
            if theirs != mine:
                raise ValueError(
                    f"INQ state was saved with {key}={theirs!r} but this scheduler has "
                    f"{key}={mine!r}; build the scheduler with the same settings to resume"
                )
        saved = state["layers"]
        names = [layer.name for layer in self._layers]
        if list(saved) != names:
            raise ValueError(
                f"INQ state holds layers {list(saved)} but this model's target layers are "
                f"{names}; resume with the same model and include/exclude patterns"
            )
        own = self.layer_bits
        saved_bits = {n: saved[n].get("bits", state["bits"]) for n in names}  # 1-3: all at bits
        differ = {n: b for n, b in saved_bits.items() if b != own[n]}
        if differ:
            wanted = {n: own[n] for n in differ}
            raise ValueError(
                f"INQ state was saved with layer bits {differ} but this scheduler has {wanted}; "
                "build the scheduler with the same bits and layer_bits to resume"
            )
        stage = int(state["stage"])
        if not 0 <= stage <= len(self.portions):
            raise ValueError(f"INQ state has stage {stage}, outside 0..{len(self.portions)}")
        for layer in self._layers:  # check everything before changing anything
            top = 1 << (layer.bits - 1)
            codes, n1 = saved[layer.name]["codes"], saved[layer.name]["n1"]
            pruned = saved[layer.name].get("pruned", 0)  # versions 1 and 2 knew no pruning
            if not isinstance(pruned, int) or isinstance(pruned, bool):
                raise ValueError(f"INQ state for {layer.name!r} has pruned={pruned!r}, not an int")
            numel = layer.weight.numel()
            expected = pruned  # frozen entries at this stage
            if stage:
                expected += quantized_count(self.portions[stage - 1], numel - pruned)
            if codes.shape != layer.weight.shape or codes.dtype != torch.uint8:
                raise ValueError(f"INQ state for {layer.name!r} does not match the weight's shape")
            # <= 2 * top - 1, not < 2 * top: at 8 bits 2 * top = 256 wraps to 0 in a uint8 compare
            valid = (codes == FLOAT_CODE) | (codes == 0) | ((codes >= top) & (codes <= 2 * top - 1))
            frozen = int((codes != FLOAT_CODE).sum())
            if (
                not bool(valid.all())
                or not 0 <= pruned <= int((codes == 0).sum())
                or frozen != expected
                or (stage == 0 and bool((codes > FLOAT_CODE).any()))
                or (n1 is None and stage > 0)
            ):
                raise ValueError(f"INQ state for {layer.name!r} holds invalid codes (corrupt?)")
            if n1 is not None and not self._n1_fits(n1, layer.weight):
                raise ValueError(
                    f"INQ state for {layer.name!r} holds n1 {n1!r}, not one per "
                    f"{self.granularity} for this weight"
                )
        for layer in self._layers:
            codes, n1 = saved[layer.name]["codes"], saved[layer.name]["n1"]
            layer.codes = codes.to(layer.weight.device, copy=True)
            if isinstance(n1, torch.Tensor):
                layer.n1 = n1.to("cpu", torch.int32, copy=True)
            else:
                layer.n1 = None if n1 is None else int(n1)
            layer.count = int((codes != FLOAT_CODE).sum())
            layer.pruned = int(saved[layer.name].get("pruned", 0))
        self.stage = stage
        self.enforce()

    def __repr__(self) -> str:
        own = {name: b for name, b in self.layer_bits.items() if b != self.bits}
        return (
            f"INQScheduler(bits={self.bits}, {f'layer_bits={own}, ' if own else ''}"
            f"portions={self.portions}, strategy={self.strategy!r}, "
            f"n1_rule={self.n1_rule!r}, granularity={self.granularity!r}, "
            f"stage={self.stage}/{len(self.portions)}, layers={len(self._layers)}, "
            f"{'cache_values=True, ' if self._layers[0].cache_values else ''}"
            f"quantized={self.quantized_fraction():.1%})"
        )

    # ------------------------------------------------------------------ internals

    def _checked_n1s(self) -> list[N1]:
        """Every layer's n1 (chosen from the weights if not yet), once the weights are known to
        be quantizable with it."""
        n1s = []
        for layer in self._layers:
            weight = layer.weight.detach()
            try:
                n1 = self.current_n1(layer)
                check_quantizable(weight, n1)
            except ValueError as err:
                raise ValueError(f"INQScheduler.step(): layer {layer.name!r}: {err}") from err
            n1s.append(n1)
        return n1s

    def _n1_fits(self, n1: object, weight: torch.Tensor) -> bool:
        if self.granularity == "layer":
            return isinstance(n1, int) and not isinstance(n1, bool)
        return (
            isinstance(n1, torch.Tensor)
            and not n1.is_floating_point()
            and tuple(n1.shape) == (weight.shape[0],)
        )

    def _advance(self, layer: QuantizedLayer, n1: N1, portion: float) -> None:
        """Partition and snap one layer whose weights passed :meth:`_checked_n1`."""
        weight = layer.weight.detach()
        count = layer.pruned + quantized_count(portion, weight.numel() - layer.pruned)
        key = f"{layer.name}/stage{self.stage + 1}"
        old = layer.mask
        snapped = pow2_quantize(weight, n1, layer.bits) if self.strategy == "error" else None
        new = grow_mask(weight, old, count, self.strategy, self.seed, key, snapped)
        new &= ~old
        codes = layer.codes.clone()  # a new tensor: state_dict() copies taken earlier keep theirs
        n1_new = n1 if isinstance(n1, int) else broadcast_n1(n1, weight).expand(weight.shape)[new]
        codes[new] = pow2_quantize_codes(weight[new], n1_new, layer.bits)  # only the new ones
        layer.n1, layer.codes, layer.count = n1, codes, count

    @staticmethod
    def _grad_hook(layer: QuantizedLayer) -> Callable[[torch.Tensor], torch.Tensor | None]:
        def mask_frozen_grad(grad: torch.Tensor) -> torch.Tensor | None:
            if layer.count == 0:
                return None
            return torch.where(layer.mask, 0.0, grad)  # one kernel; masked_fill copies first

        return mask_frozen_grad

    def _clear_optimizer_state(self, optimizer: torch.optim.Optimizer) -> None:
        # Momentum and adaptive statistics of a weight that was float before this stage would
        # keep pushing it; zeroing them makes the frozen entries' update exactly zero.
        with torch.no_grad():
            for layer in self._layers:
                state = optimizer.state.get(layer.weight, {}).values()
                tensors = [v for v in state if torch.is_tensor(v) and v.shape == layer.weight.shape]
                if layer.count and tensors:
                    mask = layer.mask
                    for value in tensors:
                        value.masked_fill_(mask.to(value.device), 0)


def _share(part: int, whole: int, empty: float) -> float:
    """``part / whole``, or ``empty`` where ``whole`` is 0 (an empty layer has no share)."""
    return part / whole if whole else empty


def _as_patterns(patterns: str | Sequence[str] | None) -> list[str] | None:
    return [patterns] if isinstance(patterns, str) else None if patterns is None else list(patterns)


def _select_targets(
    model: nn.Module,
    include: str | Sequence[str] | None,
    exclude: str | Sequence[str] | None,
) -> list[tuple[str, nn.Parameter]]:
    candidates: dict[str, nn.Parameter] = {}
    seen: set[int] = set()
    for name, module in model.named_modules():
        weight = getattr(module, "weight", None)
        if not isinstance(module, TARGET_TYPES) or not isinstance(weight, nn.Parameter):
            continue
        if isinstance(weight, nn.parameter.UninitializedParameter):
            raise TargetError(
                "model", f"{name!r} is a lazy module; run one forward pass before INQScheduler"
            )
        if id(weight) not in seen:  # a tied weight is quantized once, under its first name
            seen.add(id(weight))
            candidates[name] = weight
    if not candidates:
        raise TargetError(
            "model", "the model has no Conv/ConvTranspose/Linear layer for INQ to quantize"
        )
    chosen = list(candidates)
    for role, patterns in (("include", _as_patterns(include)), ("exclude", _as_patterns(exclude))):
        if patterns is None:
            continue
        for pattern in patterns:
            if not any(fnmatch.fnmatchcase(name, pattern) for name in candidates):
                raise TargetError(
                    role,
                    f"{role} pattern {pattern!r} matches no conv/linear layer; layer names are "
                    f"{list(candidates)}",
                )
        hit = [n for n in chosen if any(fnmatch.fnmatchcase(n, p) for p in patterns)]
        chosen = hit if role == "include" else [n for n in chosen if n not in hit]
    if not chosen:  # each include pattern matches a layer, so exclude emptied the selection
        raise TargetError(
            "exclude", f"exclude {exclude!r} leaves no layer to quantize; relax the patterns"
        )
    return [(name, candidates[name]) for name in chosen]


def assign_layer_bits(
    names: Sequence[str], bits: int, layer_bits: Mapping[str, int] | None = None
) -> dict[str, int]:
    """The bit-width of each layer: the first ``layer_bits`` glob (``fnmatch``, in the mapping's
    order) that matches its name, else ``bits``.

    Globs may overlap (the first match wins), but every glob must set at least one layer: one
    that matches no layer, or only layers an earlier glob already set, is refused (a typo, or an
    order that silently does nothing).

    Example:
        >>> assign_layer_bits(["conv1", "conv2", "fc"], 4, {"conv1": 8, "fc": 8})
        {'conv1': 8, 'conv2': 4, 'fc': 8}
        >>> assign_layer_bits(["conv1", "conv2", "fc"], 4, {"conv1": 6, "conv*": 3})
        {'conv1': 6, 'conv2': 3, 'fc': 4}
        >>> assign_layer_bits(["conv1", "fc"], 4, {"conv9": 8})  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        inq.scheduler.TargetError: layer_bits glob 'conv9' matches no quantized layer; ...

    Raises:
        ValueError: on ``bits`` outside 2..8.
        TargetError: (a ValueError) on a glob's bits outside 2..8, or a glob that sets no
            layer's bits.
    """
    check_bits(bits)
    rules = dict(layer_bits or {})
    for glob, value in rules.items():
        try:
            check_bits(value)
        except ValueError as err:
            raise TargetError("layer_bits", f"layer_bits[{glob!r}]: {err}") from None
    chosen: dict[str, int] = {}
    for glob, value in rules.items():
        matched = [name for name in names if fnmatch.fnmatchcase(name, glob)]
        mine = [name for name in matched if name not in chosen]
        if not mine:
            shown = list(names[:8]) + (["..."] if len(names) > 8 else [])
            why = (
                f"sets no layer: every layer it matches ({', '.join(matched[:4])}"
                f"{', ...' if len(matched) > 4 else ''}) is set by an earlier glob; put it first"
                if matched
                else "matches no quantized layer"
            )
            raise TargetError("layer_bits", f"layer_bits glob {glob!r} {why}; layers are {shown}")
        chosen.update(dict.fromkeys(mine, value))
    return {name: chosen.get(name, bits) for name in names}


def check_portions(portions: Sequence[float]) -> tuple[float, ...]:
    """Validated accumulated portions: non-empty, in (0, 1], strictly increasing, ending at 1.0.

    Example:
        >>> check_portions([0.5, 0.75, 0.875, 1])
        (0.5, 0.75, 0.875, 1.0)

    Raises:
        ValueError: saying which rule the portions break.
    """
    values = tuple(float(p) for p in portions)
    if not values:
        raise ValueError("portions must not be empty; e.g. (0.3, 0.6, 0.8, 1.0)")
    if any(not 0.0 < p <= 1.0 for p in values):
        raise ValueError(f"every portion must lie in (0, 1], got {values}")
    if any(b <= a for a, b in itertools.pairwise(values)):
        raise ValueError(f"portions must be strictly increasing, got {values}")
    if values[-1] != 1.0:
        raise ValueError(f"portions must end at 1.0 so every weight is quantized, got {values}")
    return values
