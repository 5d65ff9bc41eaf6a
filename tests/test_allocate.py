"""inq.allocate: the exact knapsack against brute force, sizes against the packed codec, the
two sensitivities, the budget's refusals, pinned layers and determinism."""

from __future__ import annotations

import itertools
import math
import re
from fractions import Fraction

import pytest
import torch
from helpers import BackpropOnce
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import inq
from inq.allocate import (
    Allocation,
    MethodError,
    allocate,
    allocate_bits,
    check_method,
    hessian_traces,
    layer_bytes,
    loss_sensitivities,
    solve_knapsack,
)
from inq.codes import pack_codes
from inq.levels import select_n1
from inq.pow2 import pow2_quantize, pow2_quantize_codes
from inq.scheduler import _select_targets

CE = nn.functional.cross_entropy


def brute_force(costs: list[list[int]], values: list[list[float]], capacity: int) -> list[int]:
    """Every combination: least exact value, then least cost, then the smallest index list."""
    best = None
    for pick in itertools.product(*(range(len(c)) for c in costs)):
        cost = sum(c[j] for c, j in zip(costs, pick, strict=True))
        if cost > capacity:
            continue
        value = sum((Fraction(v[j]) for v, j in zip(values, pick, strict=True)), Fraction(0))
        key = (value, cost, pick)
        if best is None or key < best:
            best = key
    assert best is not None
    return list(best[2])


@st.composite
def instances(draw: st.DrawFn) -> tuple[list[list[int]], list[list[float]], int]:
    groups = draw(st.integers(1, 5))
    options = [draw(st.integers(1, 4)) for _ in range(groups)]
    costs = [[draw(st.integers(0, 12)) for _ in range(k)] for k in options]
    # few distinct values (quarters, some negative), so ties are common; and odd floats
    value = st.one_of(
        st.integers(-8, 8).map(lambda q: q / 4),
        st.floats(-10, 10, allow_nan=False, allow_subnormal=False),
    )
    values = [[draw(value) for _ in range(k)] for k in options]
    least = sum(min(c) for c in costs)
    capacity = draw(st.integers(least, least + 30))
    return costs, values, capacity


@settings(max_examples=300, deadline=None)
@given(instances())
def test_the_solver_is_exact_with_brute_force_tie_breaks(
    instance: tuple[list[list[int]], list[list[float]], int],
) -> None:
    costs, values, capacity = instance
    assert solve_knapsack(costs, values, capacity) == brute_force(costs, values, capacity)


@settings(max_examples=200, deadline=None)
@given(instances(), st.data())
def test_a_negative_trace_chooses_as_a_trace_clamped_at_zero(
    instance: tuple[list[list[int]], list[list[float]], int], data: st.DataObject
) -> None:
    """A layer whose Hessian trace estimate is negative: its sensitivities ``t * e(b)`` are
    <= 0 and non-decreasing in ``b`` while its sizes grow. The allocation is then the one with
    that layer's sensitivities all 0 (the trace clamped), whatever the other layers are."""
    costs, values, capacity = instance
    k = len(costs[0])
    sizes = sorted(data.draw(st.lists(st.integers(0, 12), min_size=k, max_size=k)))
    errors = sorted(data.draw(st.lists(st.floats(0, 4), min_size=k, max_size=k)), reverse=True)
    trace = data.draw(st.floats(-3, -1e-3))
    costs = [sizes, *costs[1:]]
    capacity = max(capacity, sum(min(c) for c in costs))
    negative = [[trace * e for e in errors], *values[1:]]
    clamped = [[0.0] * k, *values[1:]]
    assert solve_knapsack(costs, negative, capacity) == solve_knapsack(costs, clamped, capacity)


def test_the_solver_refuses_what_it_cannot_solve() -> None:
    with pytest.raises(ValueError, match="cheapest choice costs 4 > 3"):
        solve_knapsack([[2, 5], [2]], [[0.0, 0.0], [0.0]], 3)
    with pytest.raises(ValueError, match="finite"):
        solve_knapsack([[1]], [[float("nan")]], 3)
    with pytest.raises(ValueError, match="as many costs as values"):
        solve_knapsack([[1, 2]], [[0.0]], 3)
    assert solve_knapsack([], [], 0) == []


@pytest.mark.parametrize("shape", [(16, 3, 3, 3), (10, 7), (3, 1), (5, 2, 3)])
@pytest.mark.parametrize("bits", [2, 3, 4, 5, 8])
def test_packed_sizes_are_the_codecs(shape: tuple[int, ...], bits: int) -> None:
    codes = pow2_quantize_codes(torch.randn(shape), n1=0, bits=bits)
    assert layer_bytes(shape, bits) == pack_codes(codes, bits).numel()
    assert layer_bytes(shape, bits, "nominal") == -(-codes.numel() * bits // 8)


def net(seed: int = 0, bn: bool = False) -> nn.Module:
    torch.manual_seed(seed)
    norm: list[nn.Module] = [nn.BatchNorm2d(6), nn.Dropout(0.5)] if bn else [nn.Identity()] * 2
    layers = [nn.Conv2d(1, 6, 3), nn.ReLU(), *norm, nn.Flatten()]
    layers += [nn.Linear(6 * 6 * 6, 16), nn.ReLU(), nn.Linear(16, 10)]  # "0", "5", "7"
    return nn.Sequential(*layers)


def batches(seed: int = 1) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(16, 1, 8, 8, generator=g), torch.randint(0, 10, (16,), generator=g))]


def bits_of(model: nn.Module) -> dict[str, torch.Tensor]:
    """Every state tensor's raw bits (``torch.equal`` would take -0.0 for 0.0)."""
    return {
        k: v.clone().view(torch.int32) if v.is_floating_point() else v.clone()
        for k, v in model.state_dict().items()
    }


def test_the_loss_method_restores_the_model_bit_for_bit() -> None:
    model = net(bn=True)
    model.train()
    model[3].eval()  # a module left in its own mode
    before, modes = bits_of(model), [m.training for m in model.modules()]
    allocation = allocate(model, CE, batches(), avg_bits=6.0, choices=(2, 3, 5))
    after = bits_of(model)
    assert before.keys() == after.keys()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert [m.training for m in model.modules()] == modes
    assert all("forward" not in m.__dict__ for m in model.modules())  # the replay's wrappers
    own = model[7].forward = lambda x: x[:, :10]  # a forward set on the module stays
    allocate(model, CE, batches(), avg_bits=6.0, choices=(2, 3, 5))
    assert model[7].forward is own
    assert set(allocation.bits) == {"0", "5", "7"}


class TiedLate(nn.Module):
    """A weight tied across two layers, its first name the one called last; a functional use
    of another layer's weight before that layer runs; a leaf that calls a module it does not
    own; an in-place ReLU after a kept output."""

    def __init__(self) -> None:
        super().__init__()
        self.late, self.early, self.fc = (nn.Linear(6, 6) for _ in range(3))
        self.head = nn.Linear(6, 10)
        self.early.weight = self.late.weight
        self.act = nn.ReLU(inplace=True)
        self.scale = Calls(nn.Tanh())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.act(self.early(x.flatten(1)[:, :6]))
        h = self.scale(h) + nn.functional.linear(h, self.fc.weight)  # fc's weight, fc not yet
        h = self.act(self.late(h)) + self.fc(h)
        return self.head(h)


class Calls(nn.Module):
    """A leaf module (its ``inner`` is hidden from ``children``) that calls another one."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = [inner]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return 2 * self.inner[0](x)


def plain_loss_sensitivities(model: nn.Module, data, weights, choices) -> dict:
    """The definition: a whole forward pass for each layer and bits."""
    with torch.no_grad():
        model.eval()

        def mean_loss() -> float:
            return math.fsum(float(CE(model(x), y)) for x, y in data) / len(data)

        base, result = mean_loss(), {}
        for name, w in weights.items():
            saved, result[name] = w.clone(), {}
            for bits in choices:
                w.copy_(pow2_quantize(saved, select_n1(saved, bits), bits))
                result[name][bits] = mean_loss() - base
            w.copy_(saved)
    return result


@pytest.mark.parametrize("cache_bytes", [0, 40_000, 2**30])
@pytest.mark.parametrize("model_name", ["sequential", "resnet20", "tied"])
def test_the_loss_method_reuses_activations_bit_for_bit(model_name: str, cache_bytes: int) -> None:
    """The outputs kept from each batch's float forward stand in for the calls a snapped layer
    cannot reach, whatever is kept (nothing, some, all): the same sensitivities as whole
    forward passes, bit for bit (residual adds and in-place ReLUs, a tied weight first named by
    the layer called last, a functional use of a weight, a leaf calling a module)."""
    torch.manual_seed(2)
    model = {
        "sequential": lambda: net(bn=True),
        "resnet20": lambda: inq.models.build_model(
            {"name": "resnet20", "num_classes": 10, "in_channels": 1}
        ),
        "tied": TiedLate,
    }[model_name]()
    for module in model.modules():  # BatchNorm statistics other than 0 and 1
        if isinstance(module, nn.BatchNorm2d):
            module.running_mean.uniform_(-0.5, 0.5)
            module.running_var.uniform_(0.5, 2.0)
    data = batches() + batches(seed=3)
    weights = dict(_select_targets(model, None, None))
    choices = (2, 4, 8)
    expected = plain_loss_sensitivities(model, data, weights, choices)
    found = loss_sensitivities(model, CE, data, weights, choices, cache_bytes=cache_bytes)
    assert found == expected
    assert any(v != 0 for row in found.values() for v in row.values())


def test_the_loss_sensitivity_is_the_loss_increase_of_one_snapped_layer() -> None:
    model, data = net(), batches()
    weights = {"5": model[5].weight}
    found = loss_sensitivities(model, CE, data, weights, (3,))["5"][3]
    x, y = data[0]
    with torch.no_grad():
        base = float(CE(model(x), y))
        w = model[5].weight
        saved = w.clone()
        w.copy_(pow2_quantize(saved, select_n1(saved, 3), 3))
        snapped = float(CE(model(x), y))
        w.copy_(saved)
    assert found == pytest.approx(snapped - base, abs=0, rel=1e-12)


def test_the_hessian_trace_of_a_quadratic_is_exact() -> None:
    """Loss 1/2 |X w|^2 with X = diag(a): H = diag(a^2), and v^T H v = sum a^2 for every
    Rademacher v: Hutchinson's estimate is the trace exactly, at any seed."""
    layer = nn.Linear(4, 1, bias=False)
    x = torch.diag(torch.tensor([1.0, 2.0, 3.0, 0.5]))

    def loss(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return (out**2).sum() / 2

    for seed in (0, 1, 2):
        traces = hessian_traces(layer, loss, [(x, x)], {"w": layer.weight}, samples=3, seed=seed)
        assert traces == {"w": 1 + 4 + 9 + 0.25}


def test_the_hessian_trace_estimate_converges_on_a_full_quadratic() -> None:
    """A dense H = X^T X: the estimate is unbiased (mean over many vectors near tr(H))."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(6, 5, generator=g)
    layer = nn.Linear(5, 1, bias=False)

    def loss(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return (out**2).sum() / 2

    traces = hessian_traces(layer, loss, [(x, x)], {"w": layer.weight}, samples=500)
    assert traces["w"] == pytest.approx(float((x**2).sum()), rel=0.1)


def test_the_hessian_sensitivity_is_mean_trace_times_squared_error() -> None:
    model, data = net(), batches()
    allocation = allocate(model, CE, data, avg_bits=8.0, choices=(2, 4), method="hessian")
    weights = {name: model[int(name)].weight for name in ("0", "5", "7")}
    traces = hessian_traces(model, CE, data, weights, samples=8, seed=0)
    w = model[5].weight.detach()
    error = float(((w.double() - pow2_quantize(w, select_n1(w, 2), 2).double()) ** 2).sum())
    row = {layer.name: layer for layer in allocation.layers}["5"]
    assert row.sensitivity[2] == pytest.approx(traces["5"] / w.numel() * error, rel=1e-9)
    assert bits_of(model).keys()  # the model still works


@pytest.mark.parametrize("method", ["loss", "hessian"])
def test_allocations_are_deterministic_and_optimal(method: str) -> None:
    first = allocate(net(), CE, batches(), avg_bits=5.0, method=method, choices=(2, 4, 5, 8))
    again = allocate(net(), CE, batches(), avg_bits=5.0, method=method, choices=(2, 4, 5, 8))
    assert first == again
    assert first.total_bytes <= first.budget_bytes
    assert first.avg_bits <= 5.0
    # no allocation within the budget has a smaller summed sensitivity
    rows = first.layers
    best = min(
        sum(r.sensitivity[b] for r, b in zip(rows, pick, strict=True))
        for pick in itertools.product(first.choices, repeat=len(rows))
        if sum(layer_bytes(r.shape, b) for r, b in zip(rows, pick, strict=True))
        <= first.budget_bytes
    )
    assert first.sensitivity == pytest.approx(best, abs=1e-12)
    assert Allocation.from_dict(first.as_dict()) == first


def test_pinned_layers_keep_their_bits_and_count_in_the_budget() -> None:
    model = net()
    found = allocate(model, CE, batches(), max_bytes=2000, choices=(2, 4), pinned={"0": 8, "7": 6})
    rows = {layer.name: layer for layer in found.layers}
    assert (rows["0"].bits, rows["7"].bits) == (8, 6)
    assert rows["0"].pinned and rows["0"].sensitivity == {}
    assert not rows["5"].pinned and set(rows["5"].sensitivity) == {2, 4}
    assert found.total_bytes == 54 + 160 + rows["5"].nbytes <= 2000
    assert "pinned" in found.table()
    bits = allocate_bits(model, CE, batches(), max_bytes=2000, choices=(2, 4), pinned={"0": 8})
    sched = inq.INQScheduler(model, bits=4, layer_bits=bits)
    assert sched.layer_bits == bits


def test_every_layer_pinned_measures_nothing() -> None:
    found = allocate(net(), CE, [], avg_bits=8.0, pinned={"*": 5})
    assert found.bits == {"0": 5, "5": 5, "7": 5}


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"avg_bits": 3.0}, r"no allocation of \[4, 8\] bits fits .* the smallest takes"),
        ({"max_bytes": 10}, r"fits 10 bytes .* smallest takes 1838 bytes \(4\.0066 average bits\)"),
        ({"avg_bits": 8.0, "choices": ()}, "choices is empty"),
        ({"avg_bits": 8.0, "choices": (4, 9)}, "bits must be an integer from 2 to 8"),
        ({"avg_bits": 8.0, "choices": (1,)}, "bits must be an integer from 2 to 8"),
        ({"avg_bits": 8.0, "method": "fisher"}, "method must be one of"),
        ({"avg_bits": 8.0, "size": "huge"}, "size must be one of"),
        (
            {"avg_bits": 4.0, "pinned": {"5": 8}},
            r"pinned layers alone take 3456 bytes .* fits is "
            r"3566 bytes \(7\.7733 average bits\)",
        ),
        ({"avg_bits": 8.0, "pinned": {"conv9": 8}}, "matches no quantized layer"),
        ({}, "exactly one budget"),
        ({"avg_bits": 4.0, "max_bytes": 4}, "exactly one budget"),
        ({"avg_bits": -1.0}, "avg_bits must be a number > 0"),
        ({"avg_bits": 8.0, "samples": 0, "method": "hessian"}, "samples must be >= 1"),
    ],
)
def test_bad_input_is_refused_in_one_line(options: dict[str, object], message: str) -> None:
    kwargs = {"choices": (4, 8), **options}
    with pytest.raises(ValueError, match=message) as refused:
        allocate(net(), CE, batches(), **kwargs)  # type: ignore[arg-type]
    assert "\n" not in str(refused.value)


@pytest.mark.parametrize("pinned", [None, {"5": 8}])
def test_the_budget_a_refusal_names_is_met(pinned: dict[str, int] | None) -> None:
    """Given back as typed, the average bits the message names are enough: rounded up, not
    to nearest (an ``avg_bits`` budget is floored to whole bytes)."""
    with pytest.raises(ValueError, match=r"\((\d+\.\d+) average bits\)(, or pin|$)") as refused:
        allocate(net(), CE, batches(), choices=(4, 8), avg_bits=3.0, pinned=pinned)
    named = float(re.findall(r"\((\d+\.\d+) average bits\)", str(refused.value))[-1])
    found = allocate(net(), CE, batches(), choices=(4, 8), avg_bits=named, pinned=pinned)
    assert found.total_bytes <= found.budget_bytes
    with pytest.raises(ValueError, match=r"^(no allocation|the pinned layers alone)"):
        allocate(net(), CE, batches(), choices=(4, 8), avg_bits=named - 1e-4, pinned=pinned)


def test_no_batches_and_a_non_finite_loss_are_refused() -> None:
    with pytest.raises(ValueError, match="batches is empty"):
        allocate(net(), CE, [], avg_bits=8.0)
    x, y = batches()[0]
    with pytest.raises(ValueError, match="not finite"):
        allocate(net(), CE, [(x * float("inf"), y)], avg_bits=8.0)


def test_a_model_without_second_derivatives_is_refused_for_hessian() -> None:
    """allocate refuses it, and check_method finds it first from one example; on a model that
    has them, check_method leaves gradients, flags and the global RNG as they were."""
    data = [(torch.randn(5, 4), torch.randint(0, 3, (5,)))]
    for refuse in (
        lambda: allocate(BackpropOnce(nn.Linear(4, 3)), CE, data, avg_bits=8.0, method="hessian"),
        lambda: check_method(BackpropOnce(nn.Linear(4, 3)), CE, data[0], "hessian"),
    ):
        with pytest.raises(MethodError, match=r"^method 'hessian' cannot differentiate this model"):
            refuse()
    model, rng = net(bn=True).train(), torch.get_rng_state()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    check_method(model, CE, batches()[0], "hessian")
    check_method(model, CE, batches()[0], "loss")  # forward only: nothing to try
    assert torch.equal(torch.get_rng_state(), rng) and model.training
    assert all(p.grad is None for p in model.parameters())
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    with pytest.raises(ValueError, match="method must be one of"):
        check_method(model, CE, batches()[0], "trace")
    # pinned layers are not measured, so not tried: all pinned, nothing to differentiate
    once = BackpropOnce(nn.Linear(4, 3))
    assert allocate(once, CE, data, avg_bits=8.0, method="hessian", pinned={"*": 8}).bits == {
        "model": 8
    }
    check_method(once, CE, data[0], "hessian", pinned={"*": 8})


def test_a_non_finite_hessian_loss_is_named_as_such() -> None:
    """Not as an unsolvable knapsack, nor as a model that cannot be differentiated twice."""
    x, y = batches()[0]
    with pytest.raises(ValueError, match=r"^the loss on a calibration batch is nan, not finite$"):
        allocate(net(), CE, [(x * float("inf"), y)], avg_bits=8.0, method="hessian")


def test_packed_budgets_see_nibbles_and_bytes() -> None:
    """2 to 4 bits all take a nibble in the packed file, 5 to 8 a byte: at a packed budget of
    4.05 average bits (4 and the padding of the conv's rows of 9) no layer gets 8 bits; nominal
    sizes let 2 and 3 bits buy room for others."""
    packed = allocate(net(), CE, batches(), avg_bits=4.05, choices=(2, 3, 4, 8))
    assert packed.total_bytes == 30 + 1728 + 80 and set(packed.bits.values()) <= {2, 3, 4}
    nominal = allocate(net(), CE, batches(), avg_bits=4.0, choices=(2, 3, 4, 8), size="nominal")
    assert nominal.avg_bits <= 4.0
