"""INQScheduler: targets, argument checks, stages, freezing under every optimizer, exact resume."""

from __future__ import annotations

import functools
import io
import math
from collections.abc import Callable, Iterable, Iterator

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import inq
from inq import INQScheduler, quantized_count
from inq.levels import select_n1
from inq.scheduler import FLOAT_CODE, QuantizedLayer, check_portions

Batch = tuple[torch.Tensor, torch.Tensor]
OptimizerFactory = Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer]
ODD_SIZES = (1, 3, 7, 13, 101)


@pytest.fixture(autouse=True, scope="module")
def one_intra_op_thread() -> Iterator[None]:
    """The tensors here are tiny: extra threads only fight over shared CPU cores (3x slower)."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


# ---------------------------------------------------------------- models and data


class DigitsNet(nn.Module):
    """A tiny conv + linear classifier for 8x8 digits (BatchNorm and biases stay float)."""

    def __init__(self, dropout: float = 0.0) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 6, kernel_size=3, padding=1)
        self.norm = nn.BatchNorm2d(6)
        self.drop = nn.Dropout(dropout)
        self.fc = nn.Linear(6 * 4 * 4, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.norm(self.conv(x))), 2)
        return self.fc(self.drop(x.flatten(1)))


def digits_net(seed: int, dropout: float = 0.0) -> DigitsNet:
    torch.manual_seed(seed)
    return DigitsNet(dropout)


@functools.lru_cache(maxsize=1)
def digits_batches(batch_size: int = 48, count: int = 8) -> tuple[Batch, ...]:
    """``count`` fixed batches of real 8x8 digits from scikit-learn (scaled to [0, 1])."""
    from sklearn.datasets import load_digits

    data = load_digits()
    images = torch.tensor(data.images, dtype=torch.float32).unsqueeze(1) / 16.0
    labels = torch.tensor(data.target, dtype=torch.long)
    n = batch_size * count
    return tuple(
        (images[i : i + batch_size], labels[i : i + batch_size]) for i in range(0, n, batch_size)
    )


def frozen_snapshot(sched: INQScheduler) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """(mask, weight values) of every layer, recorded right after ``sched.step()``."""
    return {
        layer.name: (layer.mask.clone(), layer.weight.detach().clone()) for layer in sched.layers
    }


def assert_frozen_exact(
    sched: INQScheduler, snapshot: dict[str, tuple[torch.Tensor, torch.Tensor]], when: str
) -> None:
    for layer in sched.layers:
        mask, values = snapshot[layer.name]
        assert torch.equal(layer.mask, mask), f"{layer.name}: mask changed {when}"
        assert torch.equal(layer.weight.detach()[mask], values[mask]), (
            f"{layer.name}: a frozen weight moved {when}"
        )


def assert_frozen_grads_zero(sched: INQScheduler) -> None:
    for layer in sched.layers:
        grad = layer.weight.grad
        assert grad is not None
        frozen = grad[layer.mask]
        assert torch.equal(frozen, torch.zeros_like(frozen)), f"{layer.name}: frozen grad != 0"


def frozen_state_keys(optimizer: torch.optim.Optimizer, sched: INQScheduler) -> set[str]:
    """Check that weight-shaped optimizer state is zero on frozen entries; return its keys."""
    checked: set[str] = set()
    for layer in sched.layers:
        for key, value in optimizer.state.get(layer.weight, {}).items():
            if isinstance(value, torch.Tensor) and value.shape == layer.weight.shape:
                frozen = value[layer.mask]
                assert torch.equal(frozen, torch.zeros_like(frozen)), (
                    f"{layer.name}: optimizer state {key!r} of frozen entries is not zero"
                )
                checked.add(key)
    return checked


def float_weights_moved(
    sched: INQScheduler, snapshot: dict[str, tuple[torch.Tensor, torch.Tensor]]
) -> bool:
    """True if every layer that still has float weights saw some of them change."""
    return all(
        not torch.equal(layer.weight.detach()[~mask], values[~mask])
        for layer in sched.layers
        for mask, values in [snapshot[layer.name]]
        if not mask.all()
    )


def optimizer_settings(optimizer: torch.optim.Optimizer) -> list[tuple[list[int], dict]]:
    return [
        ([id(p) for p in group["params"]], {k: v for k, v in group.items() if k != "params"})
        for group in optimizer.param_groups
    ]


def layer_by_name(sched: INQScheduler, name: str) -> QuantizedLayer:
    return next(layer for layer in sched.layers if layer.name == name)


# ---------------------------------------------------------------- target selection


class EveryKindOfLayer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.c1 = nn.Conv1d(2, 3, 3)
        self.c2 = nn.Conv2d(2, 3, 3)
        self.c3 = nn.Conv3d(2, 3, 3)
        self.t1 = nn.ConvTranspose1d(3, 2, 3)
        self.t2 = nn.ConvTranspose2d(3, 2, 3)
        self.t3 = nn.ConvTranspose3d(3, 2, 3)
        self.fc = nn.Linear(4, 5)
        self.bn = nn.BatchNorm2d(3)
        self.ln = nn.LayerNorm(5)
        self.gn = nn.GroupNorm(1, 3)
        self.emb = nn.Embedding(10, 4)
        self.head = nn.Sequential(nn.Linear(5, 2, bias=False))


def test_targets_are_conv_convtranspose_and_linear_weights_only() -> None:
    model = EveryKindOfLayer()
    sched = INQScheduler(model)
    names = [layer.name for layer in sched.layers]
    assert names == ["c1", "c2", "c3", "t1", "t2", "t3", "fc", "head.0"]
    for layer in sched.layers:
        assert layer.weight is model.get_submodule(layer.name).weight
    targeted = {id(layer.weight) for layer in sched.layers}
    for name, param in model.named_parameters():
        if not name.endswith("weight") or name.split(".")[0] in {"bn", "ln", "gn", "emb"}:
            assert id(param) not in targeted, f"{name} must not be quantized"


def test_biases_and_norms_stay_float_through_all_stages() -> None:
    model = EveryKindOfLayer()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    sched = INQScheduler(model, bits=3)
    while not sched.done:
        sched.step()
    for key, value in model.state_dict().items():
        if key.endswith("bias") or key.split(".")[0] in {"bn", "ln", "gn", "emb"}:
            assert torch.equal(value, before[key]), f"{key} changed"
        else:
            assert not torch.equal(value, before[key]), f"{key} was not quantized"


@pytest.mark.parametrize(
    ("include", "exclude", "expected"),
    [
        ("c*", None, ["c1", "c2", "c3"]),
        (["t?", "fc"], None, ["t1", "t2", "t3", "fc"]),
        (None, "head.*", ["c1", "c2", "c3", "t1", "t2", "t3", "fc"]),
        (None, ["c1", "t*"], ["c2", "c3", "fc", "head.0"]),
        ("c*", "c2", ["c1", "c3"]),
        ("*", None, ["c1", "c2", "c3", "t1", "t2", "t3", "fc", "head.0"]),
    ],
)
def test_include_and_exclude_patterns(
    include: str | list[str] | None, exclude: str | list[str] | None, expected: list[str]
) -> None:
    sched = INQScheduler(EveryKindOfLayer(), include=include, exclude=exclude)
    assert [layer.name for layer in sched.layers] == expected


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"include": "conv*"}, "include pattern 'conv\\*' matches no conv/linear layer"),
        ({"exclude": ["fc", "nope"]}, "exclude pattern 'nope' matches no"),
        ({"include": "bn"}, "include pattern 'bn' matches no"),  # a norm layer is no target
        ({"include": "fc", "exclude": "fc"}, "exclude .fc. leaves no layer"),
    ],
)
def test_bad_patterns_raise(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        INQScheduler(EveryKindOfLayer(), **kwargs)


def test_tied_weights_are_quantized_once() -> None:
    first = nn.Linear(6, 6, bias=False)
    second = nn.Linear(6, 6, bias=False)
    second.weight = first.weight
    model = nn.Sequential(first, nn.ReLU(), second, nn.Linear(6, 2))
    sched = INQScheduler(model, portions=(0.5, 1.0))
    assert [layer.name for layer in sched.layers] == ["0", "3"]
    sched.step()
    assert layer_by_name(sched, "0").count == 18
    assert model[0].weight is model[2].weight
    assert sched.quantized_fraction() == (18 + 6) / (36 + 12)


def test_model_without_targets_raises() -> None:
    with pytest.raises(ValueError, match="no Conv/ConvTranspose/Linear layer"):
        INQScheduler(nn.Sequential(nn.BatchNorm1d(3), nn.ReLU(), nn.Embedding(3, 3)))


def test_lazy_module_raises() -> None:
    with pytest.raises(ValueError, match="lazy"):
        INQScheduler(nn.Sequential(nn.LazyLinear(3)))


# ---------------------------------------------------------------- argument checks


@pytest.mark.parametrize(
    ("portions", "message"),
    [
        ((), "must not be empty"),
        ((0.3, 0.3, 1.0), "strictly increasing"),
        ((0.6, 0.3, 1.0), "strictly increasing"),
        ((0.5, 1.0, 1.0), "strictly increasing"),
        ((0.3, 0.6, 0.8), "end at 1.0"),
        ((0.0, 1.0), "lie in \\(0, 1\\]"),
        ((-0.5, 1.0), "lie in"),
        ((0.5, 1.5), "lie in"),
        ((math.nan, 1.0), "lie in"),
    ],
)
def test_bad_portions_raise(portions: tuple[float, ...], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        INQScheduler(nn.Linear(3, 3), portions=portions)


@pytest.mark.parametrize("bits", [1, 9, 0, 2.5])
def test_bad_bits_raise(bits: object) -> None:
    with pytest.raises(ValueError, match="bits must be an integer from 2 to 8"):
        INQScheduler(nn.Linear(3, 3), bits=bits)  # type: ignore[arg-type]


def test_unknown_strategy_raises() -> None:
    with pytest.raises(ValueError, match=r"strategy must be one of .*'pruning'"):
        INQScheduler(nn.Linear(3, 3), strategy="pruning")


def test_stepping_past_the_last_stage_raises() -> None:
    sched = INQScheduler(nn.Linear(3, 3), portions=(0.5, 1.0))
    assert sched.step() == 0.5
    assert sched.step() == 1.0
    assert sched.done
    with pytest.raises(RuntimeError, match="all 2 stages are done"):
        sched.step()
    assert sched.stage == 2


def test_attach_rejects_optimizer_without_the_weights() -> None:
    sched = INQScheduler(nn.Linear(3, 3))
    foreign = torch.optim.SGD(nn.Linear(3, 3).parameters(), lr=0.1)
    with pytest.raises(ValueError, match="holds none of the quantized weights"):
        sched.attach(foreign)


def test_attach_accepts_an_optimizer_holding_some_weights_and_is_idempotent() -> None:
    model = nn.Sequential(nn.Linear(3, 3), nn.Linear(3, 3))
    sched = INQScheduler(model)
    optimizer = torch.optim.SGD(model[1].parameters(), lr=0.1, weight_decay=0.5)
    sched.attach(optimizer)
    sched.attach(optimizer)  # a second attach adds no second hook
    assert len(sched._optimizers) == 1


# ---------------------------------------------------------------- stages


def test_step_returns_portion_and_updates_fractions() -> None:
    model = nn.Sequential(nn.Linear(7, 13), nn.ReLU(), nn.Conv1d(1, 3, 5))
    sched = INQScheduler(model)
    sizes = {"0": 91, "2": 15}
    assert sched.stage == 0 and not sched.done
    assert sched.quantized_fraction() == 0.0
    for stage, portion in enumerate(inq.DEFAULT_PORTIONS, start=1):
        assert sched.step() == portion
        assert sched.stage == stage
        counts = {name: quantized_count(portion, n) for name, n in sizes.items()}
        per_layer = sched.quantized_fraction(per_layer=True)
        assert per_layer == {name: counts[name] / sizes[name] for name in sizes}
        assert sched.quantized_fraction() == sum(counts.values()) / sum(sizes.values())
        assert f"stage={stage}/4" in repr(sched)
    assert sched.done and sched.quantized_fraction() == 1.0


@pytest.mark.parametrize(
    "portions", [(0.3, 0.6, 0.8, 1.0), (0.5, 0.75, 0.875, 1.0), (0.1, 0.5, 0.9, 1.0), (1.0,)]
)
@pytest.mark.parametrize("strategy", ["magnitude", "random", "error"])
def test_counts_exact_for_odd_layer_sizes(portions: tuple[float, ...], strategy: str) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(*(nn.Linear(n, 1) for n in ODD_SIZES))
    sched = INQScheduler(model, portions=portions, strategy=strategy)
    previous = {layer.name: layer.mask.clone() for layer in sched.layers}
    for portion in portions:
        sched.step()
        for layer, n in zip(sched.layers, ODD_SIZES, strict=True):
            assert layer.count == int(layer.mask.sum()) == quantized_count(portion, n)
            assert not (previous[layer.name] & ~layer.mask).any(), "mask shrank"
            previous[layer.name] = layer.mask.clone()


@pytest.mark.parametrize("bits", [2, 3, 5, 8])
def test_step_snaps_new_weights_and_leaves_float_ones(bits: int) -> None:
    torch.manual_seed(1)
    model = nn.Sequential(nn.Conv2d(2, 4, 3), nn.Flatten(), nn.Linear(16, 5))
    sched = INQScheduler(model, bits=bits)
    for _ in sched.portions:
        before = [layer.weight.detach().clone() for layer in sched.layers]
        old_masks = [layer.mask.clone() for layer in sched.layers]
        sched.step()
        for layer, pre, old in zip(sched.layers, before, old_masks, strict=True):
            assert layer.n1 is not None
            weight = layer.weight.detach()
            new = layer.mask & ~old
            expected = inq.pow2_quantize(pre, layer.n1, bits)
            assert torch.equal(weight[new], expected[new])
            assert torch.equal(weight[old], pre[old]), "an earlier frozen weight changed"
            assert torch.equal(weight[~layer.mask], pre[~layer.mask]), "a float weight changed"
            levels = inq.pow2_levels(layer.n1, bits).double()
            assert torch.isin(weight[layer.mask].double(), levels).all()


def test_magnitude_strategy_freezes_the_largest_weights_first() -> None:
    model = nn.Linear(5, 2, bias=False)
    with torch.no_grad():
        model.weight.copy_(torch.tensor([[0.1, -0.9, 0.3, 0.2, 0.05], [0.5, 0.4, -0.6, 0.7, 0.0]]))
    sched = INQScheduler(model, portions=(0.3, 1.0))
    sched.step()
    assert sched.layers[0].mask.tolist() == [
        [False, True, False, False, False],
        [False, False, True, True, False],
    ]


def test_random_strategy_is_seeded() -> None:
    def masks(seed: int) -> list[torch.Tensor]:
        sched = INQScheduler(digits_net(0), strategy="random", seed=seed)
        sched.step()
        sched.step()
        return [layer.mask for layer in sched.layers]

    same = zip(masks(4), masks(4), strict=True)
    assert all(torch.equal(a, b) for a, b in same)
    assert not all(torch.equal(a, b) for a, b in zip(masks(4), masks(5), strict=True))


def test_n1_is_fixed_at_the_first_step() -> None:
    model = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 4))
    initial = [inq.pow2_n1(m.weight) for m in model]
    sched = INQScheduler(model, bits=4)
    assert all(layer.n1 is None for layer in sched.layers)
    sched.step()
    assert [layer.n1 for layer in sched.layers] == initial
    with torch.no_grad():
        for m in model:
            m.weight.mul_(100.0)  # float weights grow far past the first maximum
    sched.enforce()
    sched.step()
    assert [layer.n1 for layer in sched.layers] == initial
    while not sched.done:
        sched.step()
    for layer, n1 in zip(sched.layers, initial, strict=True):
        assert layer.weight.abs().max().item() == math.ldexp(1.0, n1)  # clamped, not zeroed
        assert torch.isin(layer.weight.detach(), inq.pow2_levels(n1, 4)).all()


def test_step_is_atomic_when_a_layer_has_nan_at_the_first_stage() -> None:
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
    with torch.no_grad():
        model[1].weight[2, 3] = math.nan
    before = [m.weight.detach().clone() for m in model]
    sched = INQScheduler(model)
    with pytest.raises(ValueError, match="NaN or infinity"):
        sched.step()
    assert sched.stage == 0
    for layer, pre in zip(sched.layers, before, strict=True):
        assert layer.n1 is None and layer.count == 0 and not layer.mask.any()
        assert torch.equal(layer.weight.detach().nan_to_num(7.0), pre.nan_to_num(7.0))


@pytest.mark.parametrize("bad", [math.nan, math.inf])
@pytest.mark.parametrize("strategy", ["magnitude", "random", "error"])
def test_step_is_atomic_when_a_float_weight_turns_non_finite_later(
    bad: float, strategy: str
) -> None:
    model = nn.Sequential(nn.Linear(6, 5), nn.Linear(5, 3))
    sched = INQScheduler(model, strategy=strategy)
    sched.step()
    second = sched.layers[1]
    free = (~second.mask).nonzero()[-1]
    with torch.no_grad():
        second.weight[tuple(free)] = bad
    state_before = [(layer.mask.clone(), layer.codes.clone(), layer.n1) for layer in sched.layers]
    first_weight = sched.layers[0].weight.detach().clone()
    with pytest.raises(ValueError, match="NaN or infinity"):
        sched.step()
    assert sched.stage == 1
    for layer, (mask, codes, n1) in zip(sched.layers, state_before, strict=True):
        assert torch.equal(layer.mask, mask) and torch.equal(layer.codes, codes)
        assert layer.n1 == n1 and layer.count == int(mask.sum())
    assert torch.equal(sched.layers[0].weight.detach(), first_weight)


def test_enforce_restores_frozen_weights_written_by_other_means() -> None:
    model = nn.Linear(6, 4)
    sched = INQScheduler(model, portions=(0.5, 1.0))
    sched.step()
    snapshot = frozen_snapshot(sched)
    with torch.no_grad():
        model.weight.add_(0.123)
    floats = model.weight.detach()[~sched.layers[0].mask].clone()
    sched.enforce()
    assert_frozen_exact(sched, snapshot, "after enforce()")
    assert torch.equal(model.weight.detach()[~sched.layers[0].mask], floats)


def test_the_value_cache_follows_every_change_of_the_state() -> None:
    """``cache_values`` on and off side by side give the same bits through pruning, each stage,
    training, a ``load_state_dict`` back to an earlier stage and a dtype change; the cache is
    rebuilt at each change of the state and only then."""
    models = [digits_net(seed=4) for _ in range(2)]
    scheds = [INQScheduler(models[0], bits=4), INQScheduler(models[1], bits=4, cache_values=True)]
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.05, weight_decay=0.05) for m in models]
    for sched, optimizer in zip(scheds, optimizers, strict=True):
        sched.attach(optimizer)
    cached = scheds[1].layers[0]

    def train_both_and_compare(when: str) -> None:
        for model, optimizer in zip(models, optimizers, strict=True):
            train_one_stage(model, optimizer, digits_batches()[:2])
        theirs = models[1].state_dict()
        for key, mine in models[0].state_dict().items():
            assert torch.equal(mine, theirs[key]), f"{key} differs {when}"

    saved = None
    for when, change in [
        ("prune", lambda s: s.prune(0.2)),
        ("stage 1", lambda s: s.step()),
        ("stage 2", lambda s: s.step()),
    ]:
        mask = cached.mask
        assert cached.mask is mask  # no change, no rebuild
        for sched in scheds:
            change(sched)
        assert cached.mask is not mask, f"the cache was not rebuilt at {when}"
        train_both_and_compare(f"after {when}")
        saved = saved or scheds[0].state_dict()  # after pruning: stage 0
    for sched in scheds:
        sched.step()
        sched.load_state_dict(saved)  # back to the pruned model at stage 0
    assert cached.count == cached.pruned and torch.equal(cached.mask, cached.codes == 0)
    train_both_and_compare("after load_state_dict")
    for model, sched in zip(models, scheds, strict=True):
        model.double()
        with torch.no_grad():
            for layer in sched.layers:
                layer.weight.add_(0.01)
        sched.enforce()
    assert cached._stage_cache().values.dtype == torch.float64
    for mine, theirs in zip(*(s.layers for s in scheds), strict=True):
        assert torch.equal(mine.weight, theirs.weight)
        assert bool((theirs.weight.detach()[theirs.mask] == 0).all())


@pytest.mark.parametrize("cache_values", [False, True])
def test_the_guarantee_holds_in_a_loop_of_ones_own_around_a_compiled_model(
    cache_values: bool,
) -> None:
    """torch.compile of the model: the gradient hooks and the write-back after each step work
    around the compiled graph, and no stage change recompiles it. Hooks, guards and recompiles
    live in dynamo and AOTAutograd, which ``aot_eager`` runs without inductor's C++ build (19 s
    on a cold cache, every CI run); inductor itself is covered on the trainer's path
    (test_train_loop.py: ``trainer.compile=true``)."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    model = digits_net(seed=5)
    compiled = torch.compile(model, backend="aot_eager")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=0.05)
    sched = INQScheduler(model, bits=5, portions=(0.5, 1.0), cache_values=cache_values)
    sched.attach(optimizer)
    graphs = []
    for stage in range(2):
        sched.step()
        snapshot = frozen_snapshot(sched)
        for images, labels in digits_batches()[:3]:
            optimizer.zero_grad(set_to_none=True)
            F.cross_entropy(compiled(images), labels).backward()
            assert_frozen_grads_zero(sched)
            optimizer.step()
            assert_frozen_exact(sched, snapshot, f"after a compiled step at stage {stage}")
        graphs.append(counters["stats"]["unique_graphs"])
    assert graphs == [1, 1]
    for layer in sched.layers:
        assert torch.isin(layer.weight.detach(), inq.pow2_levels(layer.n1, 5)).all()


def test_remove_hooks_stops_freezing() -> None:
    model = nn.Linear(6, 4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, weight_decay=0.5)
    sched = INQScheduler(model, portions=(0.5, 1.0))
    sched.attach(optimizer)
    sched.step()
    sched.remove_hooks()
    snapshot = frozen_snapshot(sched)
    model(torch.ones(2, 6)).sum().backward()
    optimizer.step()
    mask, values = snapshot[sched.layers[0].name]
    assert not torch.equal(model.weight.detach()[mask], values[mask])


def test_detach_stops_freezing_for_that_optimizer_only() -> None:
    model = nn.Linear(6, 4)
    kept = torch.optim.SGD(model.parameters(), lr=0.1, weight_decay=0.5)
    dropped = torch.optim.SGD(model.parameters(), lr=0.1, weight_decay=0.5)
    sched = INQScheduler(model, portions=(0.5, 1.0))
    sched.attach(kept)
    sched.attach(dropped)
    sched.step()
    sched.detach(dropped)
    sched.detach(dropped)  # idempotent
    mask, values = frozen_snapshot(sched)[sched.layers[0].name]
    model(torch.ones(2, 6)).sum().backward()
    dropped.step()  # weight decay moves every weight, frozen ones included
    assert not torch.equal(model.weight.detach()[mask], values[mask])
    kept.step()  # still attached: frozen weights are restored after its step
    assert torch.equal(model.weight.detach()[mask], values[mask])


def test_check_portions_is_public_and_names_the_rule() -> None:
    assert check_portions([0.5, 0.75, 0.875, 1]) == (0.5, 0.75, 0.875, 1.0)
    with pytest.raises(ValueError, match="strictly increasing"):
        check_portions([0.5, 0.5, 1.0])


# ---------------------------------------------------------------- the freezing guarantee

OPTIMIZERS: dict[str, tuple[OptimizerFactory, set[str]]] = {
    "sgd": (lambda p: torch.optim.SGD(p, lr=0.1), set()),
    "sgd_momentum": (lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9), {"momentum_buffer"}),
    "sgd_nesterov": (
        lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, nesterov=True),
        {"momentum_buffer"},
    ),
    "sgd_weight_decay": (
        lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, weight_decay=0.05),
        {"momentum_buffer"},
    ),
    "adam": (lambda p: torch.optim.Adam(p, lr=0.01), {"exp_avg", "exp_avg_sq"}),
    "adam_l2": (
        lambda p: torch.optim.Adam(p, lr=0.01, weight_decay=0.01, amsgrad=True),
        {"exp_avg", "exp_avg_sq", "max_exp_avg_sq"},
    ),
    "adamw": (
        lambda p: torch.optim.AdamW(p, lr=0.01, weight_decay=0.1),
        {"exp_avg", "exp_avg_sq"},
    ),
    "rmsprop_momentum": (
        lambda p: torch.optim.RMSprop(p, lr=0.003, momentum=0.9, centered=True, weight_decay=0.01),
        {"square_avg", "momentum_buffer", "grad_avg"},
    ),
    "adagrad": (lambda p: torch.optim.Adagrad(p, lr=0.05, weight_decay=0.01), {"sum"}),
    "adamw_fused": (
        lambda p: torch.optim.AdamW(p, lr=0.01, weight_decay=0.1, fused=True),
        {"exp_avg", "exp_avg_sq"},
    ),
    "sgd_foreach": (
        lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, weight_decay=0.05, foreach=True),
        {"momentum_buffer"},
    ),
}
STEPS_PER_STAGE = 8


@pytest.mark.parametrize("cache_values", [False, True])
@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_frozen_weights_stay_exact_under_every_optimizer(name: str, cache_values: bool) -> None:
    make_optimizer, state_keys = OPTIMIZERS[name]
    model = digits_net(seed=0)
    optimizer = make_optimizer(model.parameters())
    settings_before = optimizer_settings(optimizer)
    sched = INQScheduler(model, bits=5, cache_values=cache_values)
    sched.attach(optimizer)
    batches = digits_batches()
    losses = []

    for stage in range(len(sched.portions)):
        sched.step()
        snapshot = frozen_snapshot(sched)
        checked = frozen_state_keys(optimizer, sched)
        if stage > 0:
            assert checked == state_keys, f"expected state {state_keys}, saw {checked}"
        for step in range(STEPS_PER_STAGE):
            images, labels = batches[step % len(batches)]
            optimizer.zero_grad(set_to_none=True)
            loss = F.cross_entropy(model(images), labels)
            loss.backward()
            assert_frozen_grads_zero(sched)
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=0.5)
            optimizer.step()
            assert_frozen_exact(sched, snapshot, f"after optimizer step {step} of stage {stage}")
            losses.append(loss.item())
        assert float_weights_moved(sched, snapshot), "training moved no float weight"

    assert sched.done
    for layer in sched.layers:
        assert torch.isin(layer.weight.detach(), inq.pow2_levels(layer.n1, 5)).all()
    assert all(math.isfinite(v) for v in losses)
    assert optimizer_settings(optimizer) == settings_before, "the optimizer was modified"


@pytest.mark.parametrize("cache_values", [False, True])
@pytest.mark.parametrize("name", ["sgd_weight_decay", "adamw"])
def test_frozen_weights_stay_exact_with_autocast_and_grad_scaler(
    name: str, cache_values: bool
) -> None:
    make_optimizer, _ = OPTIMIZERS[name]
    model = digits_net(seed=1)
    optimizer = make_optimizer(model.parameters())
    portions = (0.5, 0.75, 0.875, 1.0)
    sched = INQScheduler(model, bits=4, portions=portions, cache_values=cache_values)
    sched.attach(optimizer)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**12)
    batches = digits_batches()
    skipped = 0

    for stage in range(len(sched.portions)):
        sched.step()
        snapshot = frozen_snapshot(sched)
        for step in range(6):
            images, labels = batches[step]
            optimizer.zero_grad(set_to_none=True)
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = F.cross_entropy(model(images), labels)
            scaler.scale(loss).backward()
            assert_frozen_grads_zero(sched)
            inject_inf = step == 2
            if inject_inf:
                poison_a_float_gradient(model, sched)
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
            params_before = [p.detach().clone() for p in model.parameters()]
            scale_before = scaler.get_scale()
            scaler.step(optimizer)
            scaler.update()
            if inject_inf:
                skipped += 1
                assert scaler.get_scale() < scale_before, "the scaler did not see the inf"
                for p, before in zip(model.parameters(), params_before, strict=True):
                    assert torch.equal(p.detach(), before), "a skipped step changed a weight"
            assert_frozen_exact(sched, snapshot, f"after scaler step {step} of stage {stage}")
    assert skipped == len(sched.portions)


@pytest.mark.parametrize("cache_values", [False, True])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_frozen_weights_stay_exact_in_low_precision_models(
    dtype: torch.dtype, cache_values: bool
) -> None:
    model = digits_net(seed=3).to(dtype)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=0.05)
    sched = INQScheduler(model, bits=6, cache_values=cache_values)
    sched.attach(optimizer)
    for stage in range(len(sched.portions)):
        sched.step()
        snapshot = frozen_snapshot(sched)
        for layer in sched.layers:
            values = layer.weight.detach()[layer.mask].double()
            assert torch.isin(values, inq.pow2_levels(layer.n1, 6).double()).all()
        for images, labels in digits_batches()[:4]:
            optimizer.zero_grad()
            F.cross_entropy(model(images.to(dtype)).float(), labels).backward()
            assert_frozen_grads_zero(sched)
            optimizer.step()
            assert_frozen_exact(sched, snapshot, f"in a {dtype} model at stage {stage}")


def poison_a_float_gradient(model: DigitsNet, sched: INQScheduler) -> None:
    """Put an inf into the gradient of a still-float weight (or a bias once all are frozen)."""
    for layer in sched.layers:
        free = (~layer.mask).nonzero()
        if len(free):
            layer.weight.grad[tuple(free[0])] = math.inf
            return
    model.fc.bias.grad[0] = math.inf


def test_clearing_optimizer_state_happens_at_every_stage() -> None:
    """Momentum built while a weight was float must not survive into its frozen life."""
    model = digits_net(seed=2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    sched = INQScheduler(model, portions=(0.5, 1.0))
    sched.attach(optimizer)
    images, labels = digits_batches()[0]
    sched.step()
    for _ in range(3):
        optimizer.zero_grad()
        F.cross_entropy(model(images), labels).backward()
        optimizer.step()
    buffers = [optimizer.state[layer.weight]["momentum_buffer"] for layer in sched.layers]
    newly_frozen = [~layer.mask for layer in sched.layers]
    assert all(bool((buf[new] != 0).any()) for buf, new in zip(buffers, newly_frozen, strict=True))
    sched.step()
    frozen_state_keys(optimizer, sched)


# ---------------------------------------------------------------- state_dict and resume


def train_one_stage(
    model: nn.Module, optimizer: torch.optim.Optimizer, batches: Iterable[Batch]
) -> None:
    model.train()
    for images, labels in batches:
        optimizer.zero_grad(set_to_none=True)
        F.cross_entropy(model(images), labels).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
        optimizer.step()


def make_run(
    seed: int, strategy: str, **options: object
) -> tuple[DigitsNet, torch.optim.Optimizer, INQScheduler]:
    model = digits_net(seed, dropout=0.25)  # dropout makes the result depend on the RNG
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01, weight_decay=0.05)
    sched = INQScheduler(model, bits=5, strategy=strategy, seed=11, **options)
    sched.attach(optimizer)
    return model, optimizer, sched


def finish(model: nn.Module, optimizer: torch.optim.Optimizer, sched: INQScheduler) -> None:
    batches = digits_batches()
    while not sched.done:
        sched.step()
        train_one_stage(model, optimizer, batches[:3])


def same_n1(a: object, b: object) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and torch.equal(a, b)
    return a == b


def checkpoint(model: nn.Module, optimizer: torch.optim.Optimizer, sched: INQScheduler) -> dict:
    """What a training checkpoint holds, through ``torch.save`` and a ``weights_only`` load."""
    buffer = io.BytesIO()
    torch.save(
        {
            "model": model.state_dict(),
            "optimizer": optimizer.state_dict(),
            "inq": sched.state_dict(),
            "rng": torch.get_rng_state(),
        },
        buffer,
    )
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


def resume_and_finish(
    saved: dict, strategy: str, **options: object
) -> tuple[nn.Module, INQScheduler]:
    """A fresh run (other initial weights) restored from ``saved`` and taken to the end."""
    model, optimizer, sched = make_run(99, strategy, **options)
    model.load_state_dict(saved["model"])
    optimizer.load_state_dict(saved["optimizer"])
    sched.load_state_dict(saved["inq"])
    assert sched.stage == saved["inq"]["stage"]
    torch.set_rng_state(saved["rng"])
    finish(model, optimizer, sched)
    return model, sched


def assert_same_run(
    model: nn.Module, sched: INQScheduler, other: nn.Module, other_sched: INQScheduler
) -> None:
    for key, value in model.state_dict().items():
        assert torch.equal(other.state_dict()[key], value), f"{key} differs after resume"
    for original, restored in zip(sched.layers, other_sched.layers, strict=True):
        assert same_n1(original.n1, restored.n1)
        assert torch.equal(original.mask, restored.mask)
        assert torch.equal(original.codes, restored.codes)


@pytest.mark.parametrize(
    ("strategy", "levels"),
    [
        ("magnitude", {}),
        ("random", {}),
        ("magnitude", {"n1_rule": "mse"}),
        ("random", {"n1_rule": "mse", "granularity": "channel"}),
    ],
)
@pytest.mark.parametrize("caches", [(False, False), (False, True), (True, False)])
def test_resume_from_state_dicts_is_bit_exact(
    strategy: str, levels: dict[str, str], caches: tuple[bool, bool]
) -> None:
    """Also across ``cache_values``: the cache is no state, and it changes no bit."""
    model, optimizer, sched = make_run(0, strategy, cache_values=caches[0], **levels)
    for _ in range(2):
        sched.step()
        train_one_stage(model, optimizer, digits_batches()[:3])
    saved = checkpoint(model, optimizer, sched)
    finish(model, optimizer, sched)  # the original run goes on
    resumed = resume_and_finish(saved, strategy, cache_values=caches[1], **levels)
    assert_same_run(model, sched, *resumed)


def test_load_state_dict_writes_frozen_values_and_keeps_n1() -> None:
    model, _, sched = make_run(seed=0, strategy="magnitude")
    sched.step()
    state = sched.state_dict()
    assert state["stage"] == 1 and state["bits"] == 5
    other_model, _, other = make_run(seed=5, strategy="magnitude")
    other.load_state_dict(state)
    assert other.stage == 1
    assert [layer.n1 for layer in other.layers] == [layer.n1 for layer in sched.layers]
    for mine, theirs in zip(sched.layers, other.layers, strict=True):
        assert torch.equal(theirs.weight.detach()[mine.mask], mine.weight.detach()[mine.mask])
        assert theirs.count == mine.count
    # the unchanged n1 is used at the next stage even though the float weights differ
    other.step()
    assert [layer.n1 for layer in other.layers] == [layer.n1 for layer in sched.layers]
    assert other_model is not model


def test_state_dict_before_first_step_round_trips() -> None:
    model = nn.Linear(3, 3)
    sched = INQScheduler(model)
    buffer = io.BytesIO()
    torch.save(sched.state_dict(), buffer)
    buffer.seek(0)
    fresh = INQScheduler(nn.Linear(3, 3))
    fresh.load_state_dict(torch.load(buffer, weights_only=True))
    assert fresh.stage == 0 and fresh.layers[0].n1 is None and fresh.layers[0].count == 0


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: INQScheduler(digits_net(0), bits=4), "bits=5 but this scheduler has bits=4"),
        (lambda: INQScheduler(digits_net(0), portions=(0.5, 1.0)), "portions="),
        (lambda: INQScheduler(digits_net(0), strategy="random"), "strategy="),
        (lambda: INQScheduler(digits_net(0), seed=3), "seed="),
        (lambda: INQScheduler(digits_net(0), n1_rule="mse"), "n1_rule='max' but"),
        (lambda: INQScheduler(digits_net(0), granularity="channel"), "granularity='layer' but"),
        (lambda: INQScheduler(digits_net(0), exclude="fc"), "holds layers .* target layers"),
        (lambda: INQScheduler(nn.Sequential(nn.Linear(2, 2))), "holds layers"),
    ],
)
def test_load_state_dict_rejects_mismatches(
    build: Callable[[], INQScheduler], message: str
) -> None:
    source = INQScheduler(digits_net(0), bits=5)
    source.step()
    target = build()
    with pytest.raises(ValueError, match=message):
        target.load_state_dict(source.state_dict())


def test_load_state_dict_rejects_shape_mismatch_and_bad_version() -> None:
    source = INQScheduler(nn.Sequential(nn.Linear(4, 5)))
    source.step()
    with pytest.raises(ValueError, match="does not match the weight's shape"):
        INQScheduler(nn.Sequential(nn.Linear(4, 6))).load_state_dict(source.state_dict())
    state = source.state_dict()
    state["version"] = 99
    with pytest.raises(ValueError, match="version"):
        INQScheduler(nn.Sequential(nn.Linear(4, 5))).load_state_dict(state)
    state = source.state_dict()
    state["stage"] = 7
    with pytest.raises(ValueError, match="stage 7"):
        INQScheduler(nn.Sequential(nn.Linear(4, 5))).load_state_dict(state)


def test_load_state_dict_rejects_corrupt_codes() -> None:
    def two_layers() -> nn.Module:
        return nn.Sequential(nn.Linear(4, 5), nn.Linear(5, 3))

    source = INQScheduler(two_layers(), bits=4)
    source.step()
    for bad_code in (2, 16):  # below the 4-bit nonzero range, and a 5-bit code
        state = source.state_dict()
        codes = state["layers"]["1"]["codes"].view(-1)  # the second layer: the first is fine
        codes[torch.nonzero(codes != FLOAT_CODE)[0]] = bad_code
        target = INQScheduler(two_layers(), bits=4)
        with pytest.raises(ValueError, match="'1' holds invalid codes"):
            target.load_state_dict(state)
        assert target.stage == 0 and [layer.count for layer in target.layers] == [0, 0]


# ---------------------------------------------------------------- level-set options


@pytest.mark.parametrize("bits", [2, 3, 5])
@pytest.mark.parametrize("n1_rule", ["max", "mse"])
def test_per_channel_level_sets_are_exact(bits: int, n1_rule: str) -> None:
    """Every quantized weight lies in its own row's level set, chosen from the float weights."""
    model = digits_net(0)
    floats = {name: p.detach().clone() for name, p in model.named_parameters()}
    sched = INQScheduler(model, bits=bits, n1_rule=n1_rule, granularity="channel")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-3)
    sched.attach(optimizer)
    finish(model, optimizer, sched)
    for layer in sched.layers:
        weight = layer.weight.detach()
        assert layer.n1.dtype == torch.int32 and layer.n1.shape == (weight.shape[0],)
        assert torch.equal(
            layer.n1, select_n1(floats[f"{layer.name}.weight"], bits, n1_rule, "channel")
        )
        for row, n1 in zip(weight, layer.n1.tolist(), strict=True):
            assert torch.equal(inq.pow2_quantize(row, n1, bits), row)  # in the row's own set
        assert torch.equal(inq.pow2_encode(weight, layer.n1, bits), layer.codes)


def test_level_options_are_validated_and_shown() -> None:
    with pytest.raises(ValueError, match="n1_rule must be one of"):
        INQScheduler(nn.Linear(2, 2), n1_rule="min")
    with pytest.raises(ValueError, match="granularity must be one of"):
        INQScheduler(nn.Linear(2, 2), granularity="tensor")
    sched = INQScheduler(nn.Linear(2, 2), n1_rule="mse", granularity="channel")
    assert "n1_rule='mse', granularity='channel'" in repr(sched)


def test_version_1_state_loads_as_the_paper_level_sets() -> None:
    source = INQScheduler(digits_net(0))
    source.step()
    state = source.state_dict()
    state = {k: v for k, v in state.items() if k not in ("n1_rule", "granularity")}
    state["version"] = 1
    target = INQScheduler(digits_net(1))
    target.load_state_dict(state)
    assert [layer.n1 for layer in target.layers] == [layer.n1 for layer in source.layers]
    with pytest.raises(ValueError, match="n1_rule='max' but this scheduler has n1_rule='mse'"):
        INQScheduler(digits_net(1), n1_rule="mse").load_state_dict(state)


def test_load_state_dict_rejects_n1_of_the_wrong_granularity() -> None:
    source = INQScheduler(digits_net(0), granularity="channel")
    source.step()
    state = source.state_dict()
    state["layers"]["conv"]["n1"] = state["layers"]["conv"]["n1"][:-1]
    with pytest.raises(ValueError, match=r"'conv' holds n1 .* not one per channel"):
        INQScheduler(digits_net(0), granularity="channel").load_state_dict(state)


def test_fix_level_sets_chooses_n1_once() -> None:
    model = digits_net(0)
    sched = INQScheduler(model, bits=3, n1_rule="mse")
    sched.fix_level_sets()
    chosen = [layer.n1 for layer in sched.layers]
    with torch.no_grad():
        for layer in sched.layers:
            layer.weight.mul_(64)  # would give another n1 if chosen again
    sched.step()
    assert [layer.n1 for layer in sched.layers] == chosen


def test_error_partition_snaps_the_weights_closest_to_their_levels_first() -> None:
    model = nn.Linear(1, 6, bias=False)
    with torch.no_grad():  # n1 = 0 at 3 bits: levels 0, 0.5, 1
        model.weight.copy_(torch.tensor([[1.0], [0.74], [0.5], [0.3], [0.26], [0.9]]))
    sched = INQScheduler(model, bits=3, portions=(0.5, 1.0), strategy="error")
    sched.step()  # errors 0, 0.24, 0, 0.2, 0.24, 0.1: the three smallest
    assert sched.layers[0].mask.flatten().tolist() == [True, False, True, False, False, True]


# ---------------------------------------------------------------- pruning


@pytest.mark.parametrize("numel", ODD_SIZES)
@pytest.mark.parametrize("sparsity", [0.0, 0.3, 0.5, 0.9])
def test_prune_freezes_the_smallest_weights_at_exact_zero(numel: int, sparsity: float) -> None:
    torch.manual_seed(numel)
    model = nn.Linear(numel, 1, bias=False)
    sched = INQScheduler(model, bits=4, portions=(0.5, 1.0))
    weight = model.weight.detach().clone()
    expected = min(quantized_count(sparsity, numel), numel - 1)  # one weight always stays
    assert sched.prune(sparsity) == expected / numel
    layer = sched.layers[0]
    pruned = layer.mask
    assert layer.pruned == layer.count == int(pruned.sum()) == expected
    assert bool((layer.codes[pruned] == 0).all())
    assert torch.equal(model.weight.detach()[pruned], torch.zeros(layer.pruned))
    assert not bool(torch.signbit(model.weight.detach()[pruned]).any()), "-0.0 has no code"
    if 0 < layer.pruned < numel:  # every pruned |w| <= every kept |w|
        assert weight[pruned].abs().max() <= weight[~pruned].abs().min()
    assert sched.stage == 0 and not sched.done


def test_prune_breaks_ties_by_the_lower_flat_index() -> None:
    model = nn.Linear(6, 1, bias=False)
    with torch.no_grad():
        model.weight.copy_(torch.tensor([[0.2, -0.1, 0.1, 0.3, -0.1, 0.0]]))
    sched = INQScheduler(model, bits=5)
    sched.prune(0.5)
    assert sched.layers[0].mask.tolist() == [[False, True, True, False, False, True]]


@pytest.mark.parametrize(
    "options",
    [{}, {"strategy": "random"}, {"strategy": "error", "n1_rule": "mse", "granularity": "channel"}],
)
def test_stages_count_the_remaining_weights_and_pruned_zeros_stay(options: dict) -> None:
    model = digits_net(seed=0)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=0.01)
    sched = INQScheduler(model, bits=5, portions=(0.3, 0.6, 1.0), **options)
    sched.attach(optimizer)
    sched.prune({"conv": 0.5, "fc": 0.8})
    pruned = {layer.name: layer.mask.clone() for layer in sched.layers}
    train_one_stage(model, optimizer, digits_batches()[:3])
    for portion in sched.portions:
        sched.step()
        for layer in sched.layers:
            n, p = layer.weight.numel(), layer.pruned
            assert layer.count == p + quantized_count(portion, n - p)
            assert bool(layer.mask[pruned[layer.name]].all())
        train_one_stage(model, optimizer, digits_batches()[:3])
        for layer in sched.layers:
            kept = layer.weight.detach()[pruned[layer.name]]
            assert torch.equal(kept, torch.zeros_like(kept)), f"{layer.name}: a pruned weight moved"
    assert sched.pruned_fraction(per_layer=True) == {
        "conv": quantized_count(0.5, 54) / 54,
        "fc": quantized_count(0.8, 960) / 960,
    }


def test_iterative_pruning_grows_the_pruned_set_and_keeps_it_exact() -> None:
    model = digits_net(seed=1)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01, weight_decay=0.1)
    sched = INQScheduler(model, bits=3)
    sched.attach(optimizer)
    before = None
    for sparsity in (0.3, 0.6, 0.8):
        sched.prune(sparsity)
        mask = sched.layers[1].mask.clone()
        if before is not None:
            assert bool(mask[before].all()), "a pruned weight came back"
        before = mask
        assert frozen_state_keys(optimizer, sched) in (set(), {"exp_avg", "exp_avg_sq"})
        train_one_stage(model, optimizer, digits_batches()[:2])
        assert torch.equal(model.fc.weight.detach()[mask], torch.zeros(int(mask.sum())))
    assert sched.prune(0.8) == sched.pruned_fraction()  # the same target again: nothing changes


@pytest.mark.parametrize(
    ("sparsity", "error", "message"),
    [
        (1.0, ValueError, r"must lie in \[0, 1\)"),
        (-0.1, ValueError, r"must lie in \[0, 1\)"),
        ({"nope": 0.5}, ValueError, "no target layer named"),
    ],
)
def test_bad_pruning_raises(sparsity: object, error: type, message: str) -> None:
    sched = INQScheduler(digits_net(0))
    with pytest.raises(error, match=message):
        sched.prune(sparsity)  # type: ignore[arg-type]
    assert sched.pruned_fraction() == 0.0, "a refused prune() changed something"


def test_pruning_keeps_one_weight_of_a_layer_where_rounding_would_take_all() -> None:
    model = nn.Sequential(nn.Linear(10, 1, bias=False), nn.Linear(1, 16, bias=False))
    sched = INQScheduler(model, bits=5)
    assert quantized_count(0.96, 10) == 10
    sched.prune(0.96)
    assert [layer.pruned for layer in sched.layers] == [9, 15]
    assert all(bool((layer.weight != 0).any()) for layer in sched.layers)


def test_pruning_never_shrinks_and_stops_once_the_stages_start() -> None:
    sched = INQScheduler(digits_net(0))
    sched.prune(0.5)
    with pytest.raises(ValueError, match="pruning only grows"):
        sched.prune({"fc": 0.4})
    sched.step()
    with pytest.raises(RuntimeError, match="before the first step"):
        sched.prune(0.6)


def test_pruned_state_resumes_exactly_and_old_states_load_unpruned() -> None:
    sched = make_run(seed=0, strategy="magnitude")[2]
    sched.prune(0.6)
    state = sched.state_dict()
    restored = make_run(seed=5, strategy="magnitude")[2]
    restored.load_state_dict(state)
    for original, copy in zip(sched.layers, restored.layers, strict=True):
        assert copy.pruned == original.pruned
        assert torch.equal(copy.codes, original.codes)
    for one in (sched, restored):
        one.step()
    assert [c.count for c in restored.layers] == [c.count for c in sched.layers]
    old = {**INQScheduler(digits_net(0)).state_dict(), "version": 2}
    for layer in old["layers"].values():
        del layer["pruned"]
    fresh = INQScheduler(digits_net(0))
    fresh.load_state_dict(old)
    assert fresh.pruned_fraction() == 0.0


@pytest.mark.parametrize("stage", [0, 2])
@pytest.mark.parametrize("pruned", [-10, +10, 3.7, True, "3"])
def test_load_state_dict_rejects_pruned_counts_that_do_not_match_the_codes(
    stage: int, pruned: object
) -> None:
    sched = INQScheduler(digits_net(0))
    sched.prune(0.5)
    for _ in range(stage):
        sched.step()
    state = sched.state_dict()
    fc = state["layers"]["fc"]
    fc["pruned"] = fc["pruned"] + pruned if type(pruned) is int else pruned
    with pytest.raises(ValueError, match=r"'fc' (holds invalid codes|has pruned=)"):
        INQScheduler(digits_net(0)).load_state_dict(state)
    assert INQScheduler(digits_net(0)).load_state_dict(sched.state_dict()) is None


def test_ste_keeps_pruned_weights_at_zero() -> None:
    from inq.baselines import STEQuantizer

    model = digits_net(seed=2)
    sched = INQScheduler(model, bits=4, portions=(1.0,))
    sched.prune(0.7)
    pruned = sched.layers[1].mask.clone()
    ste = STEQuantizer(model, sched)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, weight_decay=0.01)
    train_one_stage(model, optimizer, digits_batches()[:2])
    ste.finalize()
    assert torch.equal(model.fc.weight.detach()[pruned], torch.zeros(int(pruned.sum())))


# ---------------------------------------------------------------- stages that add no weight

# DigitsNet's conv has 54 weights (5 left after pruning 90 %): stage 2 adds none of them
NO_NEW_WEIGHT_PORTIONS = (0.5, 0.501, 1.0)


@pytest.mark.parametrize("granularity", ["channel", "layer"])
@pytest.mark.parametrize("strategy", ["magnitude", "random", "error"])
@pytest.mark.parametrize("n1_rule", ["max", "mse"])
@pytest.mark.parametrize("sparsity", [0.0, 0.9])
def test_a_stage_that_adds_no_weight_to_a_layer_leaves_it_as_it_is(
    granularity: str, strategy: str, n1_rule: str, sparsity: float
) -> None:
    sched = INQScheduler(
        digits_net(0),
        bits=3,
        portions=NO_NEW_WEIGHT_PORTIONS,
        strategy=strategy,
        n1_rule=n1_rule,
        granularity=granularity,
    )
    sched.prune(sparsity)
    sched.step()
    conv = layer_by_name(sched, "conv")
    codes, weight, count = conv.codes.clone(), conv.weight.detach().clone(), conv.count
    assert sched.step() == 0.501
    assert conv.count == count
    assert torch.equal(conv.codes, codes) and torch.equal(conv.weight.detach(), weight)
    for layer in sched.layers:  # fc may gain weights; every layer holds its exact count
        remaining = layer.weight.numel() - layer.pruned
        assert layer.count == int(layer.mask.sum())
        assert layer.count == layer.pruned + quantized_count(0.501, remaining)
    sched.step()
    for layer in sched.layers:
        assert torch.equal(inq.pow2_encode(layer.weight.detach(), layer.n1, 3), layer.codes)


@pytest.mark.parametrize("saved_at", [1, 2])
@pytest.mark.parametrize(("strategy", "sparsity"), [("magnitude", 0.0), ("random", 0.9)])
def test_resume_through_a_stage_that_adds_no_weight_is_bit_exact(
    saved_at: int, strategy: str, sparsity: float
) -> None:
    """Saved before the empty stage (the restored run takes it) or right after it."""
    options = {"portions": NO_NEW_WEIGHT_PORTIONS, "granularity": "channel"}
    model, optimizer, sched = make_run(seed=0, strategy=strategy, **options)
    sched.prune(sparsity)
    for _ in range(saved_at):
        sched.step()
        train_one_stage(model, optimizer, digits_batches()[:3])
    saved = checkpoint(model, optimizer, sched)
    finish(model, optimizer, sched)
    assert_same_run(model, sched, *resume_and_finish(saved, strategy, **options))


def with_empty_layers() -> nn.ModuleDict:
    """One ordinary layer and two without weights: no output row, and rows of no weight."""
    torch.manual_seed(0)
    return nn.ModuleDict(
        {"fc": nn.Linear(4, 3), "no_rows": nn.Linear(3, 0), "empty_rows": nn.Conv2d(0, 2, 3)}
    )


@pytest.mark.filterwarnings("ignore:Initializing zero-element tensors is a no-op")
@pytest.mark.parametrize("granularity", ["layer", "channel"])
@pytest.mark.parametrize("n1_rule", ["max", "mse"])
def test_empty_layers_go_through_pruning_every_stage_and_a_resume(
    granularity: str, n1_rule: str
) -> None:
    options = {"bits": 4, "portions": (0.5, 1.0), "n1_rule": n1_rule, "granularity": granularity}
    sched = INQScheduler(with_empty_layers(), **options)
    assert sched.prune(0.5) == 0.5
    assert sched.pruned_fraction(per_layer=True) == {"fc": 0.5, "no_rows": 0.0, "empty_rows": 0.0}
    assert sched.step() == 0.5
    # an empty layer has no weight to count: it reports the portion reached
    assert sched.quantized_fraction(per_layer=True) == {
        "fc": 0.75,
        "no_rows": 0.5,
        "empty_rows": 0.5,
    }
    buffer = io.BytesIO()
    torch.save(sched.state_dict(), buffer)
    buffer.seek(0)
    restored = INQScheduler(with_empty_layers(), **options)
    restored.load_state_dict(torch.load(buffer, weights_only=True))
    for one in (sched, restored):
        one.step()
        assert one.done and one.quantized_fraction() == 1.0
    for original, copy in zip(sched.layers, restored.layers, strict=True):
        assert same_n1(original.n1, copy.n1) and torch.equal(original.codes, copy.codes)
    no_rows, empty_rows = sched.layers[1:]
    expected = {"layer": (0, 0), "channel": (torch.zeros(0), torch.zeros(2))}[granularity]
    for layer, n1 in zip((no_rows, empty_rows), expected, strict=True):
        assert same_n1(layer.n1, n1 if isinstance(n1, int) else n1.to(torch.int32))
        assert layer.count == 0 and layer.codes.numel() == 0


def test_current_n1_is_the_choice_the_first_stage_makes() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 4), torch.nn.Linear(4, 3))
    sched = INQScheduler(model, bits=4, n1_rule="mse", granularity="channel")
    before = [sched.current_n1(layer) for layer in sched.layers]
    sched.step()
    for layer, n1 in zip(sched.layers, before, strict=True):
        assert torch.equal(torch.as_tensor(layer.n1), torch.as_tensor(n1))
        assert sched.current_n1(layer) is layer.n1


# ---------------------------------------------------------------- per-layer bits


class FourLayers(nn.Module):
    """Two convs and two linear layers, for per-layer bit-widths."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 4, 3)
        self.conv2 = nn.Conv2d(4, 5, 3)
        self.fc1 = nn.Linear(20, 9)
        self.fc2 = nn.Linear(9, 3)


FOUR_LAYERS = ("conv1", "conv2", "fc1", "fc2")


@settings(max_examples=40)
@given(
    bits=st.integers(2, 8),
    own=st.lists(st.one_of(st.none(), st.integers(2, 8)), min_size=4, max_size=4),
    strategy=st.sampled_from(["magnitude", "random", "error"]),
    n1_rule=st.sampled_from(["max", "mse"]),
    granularity=st.sampled_from(["layer", "channel"]),
    seed=st.integers(0, 2**16),
)
def test_every_weight_lies_in_its_own_layers_level_set(
    bits: int, own: list[int | None], strategy: str, n1_rule: str, granularity: str, seed: int
) -> None:
    torch.manual_seed(seed)
    model = FourLayers()
    floats = {name: getattr(model, name).weight.detach().clone() for name in FOUR_LAYERS}
    layer_bits = {name: b for name, b in zip(FOUR_LAYERS, own, strict=True) if b is not None}
    sched = INQScheduler(
        model,
        bits=bits,
        portions=(0.4, 0.7, 1.0),
        strategy=strategy,
        n1_rule=n1_rule,
        granularity=granularity,
        layer_bits=layer_bits,
    )
    sched.attach(optimizer := torch.optim.SGD(model.parameters(), lr=0.1, weight_decay=0.1))
    generator = torch.Generator().manual_seed(seed)
    while not sched.done:
        sched.step()
        for p in model.parameters():  # a training step: every float weight moves
            p.grad = torch.randn(p.shape, generator=generator)
        optimizer.step()
    for layer in sched.layers:
        expected = layer_bits.get(layer.name, bits)  # no match: the default
        assert layer.bits == sched.layer_bits[layer.name] == expected
        weight = layer.weight.detach()
        assert inq.pow2_n2(0, expected) == 1 - 2 ** (expected - 2)
        n1 = select_n1(floats[layer.name], expected, n1_rule, granularity)
        assert same_n1(layer.n1, n1)  # chosen at the layer's own bits
        assert torch.equal(inq.pow2_quantize(weight, layer.n1, expected), weight)  # bit exact
        assert torch.equal(inq.pow2_encode(weight, layer.n1, expected), layer.codes)
        if granularity == "layer":
            assert bool(torch.isin(weight, inq.pow2_levels(layer.n1, expected)).all())
        else:
            for row, row_n1 in zip(weight, layer.n1.tolist(), strict=True):
                assert bool(torch.isin(row, inq.pow2_levels(row_n1, expected)).all())
    assert sched.bits == bits


def test_layer_bits_globs_first_match_wins_and_overlaps_are_fine() -> None:
    sched = INQScheduler(FourLayers(), bits=4, layer_bits={"conv1": 8, "conv*": 3, "fc2": 8})
    assert sched.layer_bits == {"conv1": 8, "conv2": 3, "fc1": 4, "fc2": 8}
    assert "layer_bits={'conv1': 8, 'conv2': 3, 'fc2': 8}" in repr(sched)
    assert "layer_bits" not in repr(INQScheduler(FourLayers(), bits=4, layer_bits={"fc1": 4}))
    codes = sched.layers[0].codes  # 8-bit codes reach 255
    sched.step()
    assert int(sched.layers[0].codes.max()) >= 128 and codes.dtype == torch.uint8


@pytest.mark.parametrize(
    ("layer_bits", "message"),
    [
        ({"conv9": 8}, r"^layer_bits glob 'conv9' matches no quantized layer; layers are \["),
        ({"conv*": 3, "conv1": 8}, r"^layer_bits glob 'conv1' sets no layer: every layer it "),
        ({"fc1": 9}, r"^layer_bits\['fc1'\]: bits must be an integer from 2 to 8"),
        ({"fc1": 1}, r"^layer_bits\['fc1'\]: bits must be an integer from 2 to 8"),
        ({"fc1": 4.0}, r"^layer_bits\['fc1'\]: bits must be an integer"),
        ({"fc2": 8}, r"^layer_bits glob 'fc2' matches no quantized layer"),  # excluded
    ],
)
def test_bad_layer_bits_raise_one_message(layer_bits: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message) as info:
        INQScheduler(FourLayers(), exclude="fc2", layer_bits=layer_bits)
    assert "\n" not in str(info.value)


def test_an_unmatched_glob_lists_a_few_layer_names() -> None:
    model = nn.Sequential(*(nn.Linear(2, 2) for _ in range(12)))
    with pytest.raises(ValueError, match=r"layers are \['0', '1', .* '7', '\.\.\.'\]$"):
        INQScheduler(model, layer_bits={"head": 8})


def test_mixed_bits_state_round_trips_exactly_and_refuses_other_bits() -> None:
    layer_bits = {"conv": 8, "fc": 3}
    model, optimizer, sched = make_run(seed=0, strategy="random", layer_bits=layer_bits)
    sched.step()
    train_one_stage(model, optimizer, digits_batches()[:3])
    saved = checkpoint(model, optimizer, sched)
    assert saved["inq"]["version"] == 4 and saved["inq"]["bits"] == 5
    assert {n: layer["bits"] for n, layer in saved["inq"]["layers"].items()} == layer_bits
    finish(model, optimizer, sched)
    assert_same_run(model, sched, *resume_and_finish(saved, "random", layer_bits=layer_bits))
    for other, message in [
        ({}, r"saved with layer bits \{'conv': 8, 'fc': 3\} but this scheduler has "
             r"\{'conv': 5, 'fc': 5\}; build the scheduler with the same bits and layer_bits"),
        ({"conv": 8}, r"saved with layer bits \{'fc': 3\} but this scheduler has \{'fc': 5\}"),
    ]:  # fmt: skip
        target = make_run(seed=1, strategy="random", layer_bits=other)[2]
        with pytest.raises(ValueError, match=message):
            target.load_state_dict(saved["inq"])
        assert target.stage == 0


@pytest.mark.parametrize("version", [1, 2, 3])
def test_states_before_per_layer_bits_load_with_every_layer_at_bits(version: int) -> None:
    source = INQScheduler(digits_net(0), bits=4)
    source.step()
    state = source.state_dict()
    for layer in state["layers"].values():
        del layer["bits"]
    state["version"] = version
    target = INQScheduler(digits_net(1), bits=4)
    target.load_state_dict(state)
    assert target.layer_bits == {"conv": 4, "fc": 4}
    for original, copy in zip(source.layers, target.layers, strict=True):
        assert torch.equal(copy.codes, original.codes)
        assert torch.equal(copy.weight.detach()[copy.mask], original.weight.detach()[copy.mask])
    with pytest.raises(
        ValueError, match=r"saved with layer bits \{'conv': 4\} but .*\{'conv': 8\}"
    ):
        INQScheduler(digits_net(1), bits=4, layer_bits={"conv": 8}).load_state_dict(state)


def test_mixed_bits_prune_and_codes_follow_each_layer() -> None:
    model = digits_net(0)
    sched = INQScheduler(model, bits=2, portions=(0.5, 1.0), layer_bits={"fc": 8})
    sched.prune({"conv": 0.5, "fc": 0.25})
    while not sched.done:
        sched.step()
    conv, fc = sched.layers
    assert conv.pruned == 27 and fc.pruned == 240
    assert set(conv.codes.unique().tolist()) <= {0, 2, 3}  # ternary: 2-bit codes
    assert int(fc.codes.max()) >= 128  # 8-bit codes
    for layer in sched.layers:
        assert torch.equal(layer.frozen_values(), layer.weight.detach())
