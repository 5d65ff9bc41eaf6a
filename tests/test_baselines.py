"""Baselines: after one-shot rounding or STE fine-tuning every target weight is in its level set."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils import parametrize

import inq
from inq.baselines import STEQuantizer, oneshot_quantize
from inq.deploy.verify import verify_masked
from inq.masked import load_masked, save_masked
from inq.scheduler import INQScheduler


def net(seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Conv2d(1, 4, 3, padding=1),
        nn.BatchNorm2d(4),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(4 * 6 * 6, 5),
    )


def batch(seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(16, 1, 6, 6, generator=g), torch.randint(0, 5, (16,), generator=g)


def targets(model: nn.Module) -> dict[str, nn.Parameter]:
    return {"0": model[0].weight, "4": model[4].weight}


def assert_in_level_set(weight: torch.Tensor, n1: int, bits: int) -> None:
    assert bool(torch.isin(weight.detach(), inq.pow2_levels(n1, bits)).all())


def train_steps(model: nn.Module, optimizer: torch.optim.Optimizer, steps: int) -> None:
    x, y = batch()
    for _ in range(steps):
        optimizer.zero_grad()
        F.cross_entropy(model(x), y).backward()
        optimizer.step()


def ste_run(bits: int, steps: int = 5, lr: float = 0.5) -> tuple[nn.Module, STEQuantizer]:
    model = net()
    ste = STEQuantizer(model, INQScheduler(model, bits=bits, portions=(1.0,)))
    train_steps(model, torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9), steps)
    return model, ste


# ------------------------------------------------------------------------- oneshot


@pytest.mark.parametrize("bits", [2, 3, 4, 5, 8])
def test_oneshot_snaps_every_target_weight_by_eq4_with_n1_of_the_float_weights(bits: int) -> None:
    model = net()
    before = {k: w.detach().clone() for k, w in targets(model).items()}
    bias = model[4].bias.detach().clone()
    sched = oneshot_quantize(model, bits=bits)
    assert sched.done and sched.quantized_fraction() == 1.0
    for layer, (key, w0) in zip(sched.layers, before.items(), strict=True):
        assert layer.name == key and layer.n1 == inq.pow2_n1(w0)
        assert bool(layer.mask.all())
        assert torch.equal(layer.weight, inq.pow2_quantize(w0, layer.n1, bits))
        assert_in_level_set(layer.weight, layer.n1, bits)
    assert torch.equal(model[4].bias, bias)  # biases stay float


def test_oneshot_leaves_excluded_layers_float() -> None:
    model = net()
    fc = model[4].weight.detach().clone()
    sched = oneshot_quantize(model, bits=3, exclude="4")
    assert [layer.name for layer in sched.layers] == ["0"]
    assert torch.equal(model[4].weight, fc)
    with pytest.raises(ValueError, match="matches no conv/linear layer"):
        oneshot_quantize(net(), bits=3, include="nope")


# ------------------------------------------------------------------------- STE


@pytest.mark.parametrize("bits", [2, 3, 5])
def test_ste_forward_uses_exact_powers_of_two_and_passes_the_gradient_straight_through(
    bits: int,
) -> None:
    model = net()
    n1 = {k: inq.pow2_n1(w) for k, w in targets(model).items()}
    ste = STEQuantizer(model, INQScheduler(model, bits=bits, portions=(1.0,)))
    shadows = {k: m.parametrizations.weight.original for k, m in (("0", model[0]), ("4", model[4]))}
    # the reference: a plain copy whose weights hold the snapped values
    reference = net()
    reference.load_state_dict(
        {
            k.replace("parametrizations.weight.original", "weight"): v
            for k, v in model.state_dict().items()
        }
    )
    with torch.no_grad():
        for key, shadow in shadows.items():
            assert not bool(torch.isin(shadow, inq.pow2_levels(n1[key], bits)).all())
            reference.get_submodule(key).weight.copy_(inq.pow2_quantize(shadow, n1[key], bits))
    x, y = batch()
    F.cross_entropy(model(x), y).backward()
    F.cross_entropy(reference(x), y).backward()
    for key, shadow in shadows.items():
        assert torch.equal(model.get_submodule(key).weight, reference.get_submodule(key).weight)
        assert torch.equal(shadow.grad, reference.get_submodule(key).weight.grad)  # identity
    assert [layer.n1 for layer in ste.scheduler.layers] == list(n1.values())


def test_ste_trains_float_shadows_with_n1_fixed_from_the_initial_weights() -> None:
    initial = {k: inq.pow2_n1(w) for k, w in targets(net()).items()}
    model, ste = ste_run(bits=3, steps=20, lr=2.0)  # large steps: the weights move a lot
    assert ste.active
    keys = list(model.state_dict())
    assert "0.parametrizations.weight.original" in keys and "0.weight" not in keys
    shadow = model[4].parametrizations.weight.original
    assert inq.pow2_n1(shadow) != initial["4"]  # the shadow's own scale changed ...
    assert [layer.n1 for layer in ste.scheduler.layers] == list(initial.values())  # ... n1 not
    assert not bool(torch.isin(shadow, inq.pow2_levels(initial["4"], 3)).all())


@pytest.mark.parametrize("bits", [2, 4])
def test_finalize_keeps_the_last_forward_values_drops_the_shadows_and_freezes(bits: int) -> None:
    model, ste = ste_run(bits)
    originals = [
        model[0].parametrizations.weight.original,
        model[4].parametrizations.weight.original,
    ]
    model.eval()
    x, _ = batch(2)
    with torch.no_grad():
        seen = model(x)
    sched = ste.finalize()
    assert not ste.active and sched is ste.scheduler and sched.done
    assert not parametrize.is_parametrized(model)
    assert sorted(model.state_dict()) == sorted(net().state_dict())  # the plain keys again
    assert [model[0].weight, model[4].weight] == originals  # the same Parameter objects
    for layer in sched.layers:
        assert bool(layer.mask.all())
        assert_in_level_set(layer.weight, layer.n1, bits)
    with torch.no_grad():
        assert torch.equal(model(x), seen)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9, weight_decay=1e-3)
    sched.attach(optimizer)
    frozen = [w.detach().clone() for w in originals]
    train_steps(model.train(), optimizer, 3)
    assert all(torch.equal(w, f) for w, f in zip(originals, frozen, strict=True))
    with pytest.raises(RuntimeError, match="already called"):
        ste.finalize()


def test_ste_trains_a_compiled_model_without_recompiling_each_step() -> None:
    """Under torch.compile the STE's snapping compiles once per layer (its n1 and shape are
    guards), then steps reuse the graphs; finalize gives the level sets' values. Graphs and
    guards are Dynamo's, whatever the backend: AOTAutograd's traces them forward and backward
    without inductor's C++ builds (20 s with a cold cache; inductor itself runs in
    test_scheduler.py and test_nn.py)."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    model = net()
    ste = STEQuantizer(model, INQScheduler(model, bits=4, portions=(1.0,)))
    compiled = torch.compile(model, backend="aot_eager")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9)
    shadow = model[4].parametrizations.weight.original.detach().clone()
    train_steps(compiled, optimizer, 2)
    graphs = counters["stats"]["unique_graphs"]
    train_steps(compiled, optimizer, 4)
    assert counters["stats"]["unique_graphs"] == graphs > 0
    assert not torch.equal(model[4].parametrizations.weight.original, shadow)  # it trained
    sched = ste.finalize()
    for layer in sched.layers:
        assert_in_level_set(layer.weight, layer.n1, 4)


def test_ste_export_verifies_as_exact_powers_of_two(tmp_path: Path) -> None:
    model, ste = ste_run(bits=3)
    file = tmp_path / "ste.safetensors"
    save_masked(file, model, ste.finalize(), {"name": "toy"})
    ckpt = load_masked(file)
    assert sorted(ckpt.masks) == ["0.weight", "4.weight"]
    assert not any("original" in key for key in ckpt.state)
    report = verify_masked(ckpt)
    assert report.ok, report.table()


def test_ste_resumes_from_model_and_scheduler_state() -> None:
    model, ste = ste_run(bits=3)
    model_state = copy.deepcopy(model.state_dict())
    sched_state = ste.scheduler.state_dict()
    x, _ = batch(3)
    model.eval()
    fresh = net(seed=7)  # other initial weights: other n1 until the state is loaded
    resumed = STEQuantizer(fresh, INQScheduler(fresh, bits=3, portions=(1.0,)))
    fresh.load_state_dict(model_state)
    resumed.scheduler.load_state_dict(sched_state)
    fresh.eval()
    with torch.no_grad():
        assert torch.equal(fresh(x), model(x))
    for a, b in zip(ste.finalize().layers, resumed.finalize().layers, strict=True):
        assert a.n1 == b.n1 and torch.equal(a.weight, b.weight)


def test_ste_refuses_a_stepped_or_staged_scheduler() -> None:
    model = net()
    with pytest.raises(ValueError, match=r"portions=\(1.0,\)"):
        STEQuantizer(model, INQScheduler(model, bits=3))
    stepped = INQScheduler(model, bits=3, portions=(1.0,))
    stepped.step()
    with pytest.raises(ValueError, match="unstepped"):
        STEQuantizer(model, stepped)


def test_ste_quantizes_every_user_of_a_tied_weight() -> None:
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
    model[1].weight = model[0].weight
    ste = STEQuantizer(model, INQScheduler(model, bits=2, portions=(1.0,)))
    assert len(ste.scheduler.layers) == 1
    n1 = ste.scheduler.layers[0].n1
    assert_in_level_set(model[0].weight, n1, 2)
    assert_in_level_set(model[1].weight, n1, 2)


# ------------------------------------------------------------------------- per-layer bits


def test_oneshot_takes_per_layer_bits() -> None:
    model = net()
    before = {k: w.detach().clone() for k, w in targets(model).items()}
    sched = oneshot_quantize(model, bits=3, layer_bits={"0": 8})
    assert sched.layer_bits == {"0": 8, "4": 3}
    for layer in sched.layers:
        expected = inq.pow2_quantize(before[layer.name], layer.n1, layer.bits)
        assert torch.equal(layer.weight, expected)
        assert_in_level_set(layer.weight, layer.n1, layer.bits)
    with pytest.raises(ValueError, match="layer_bits glob 'fc' matches no quantized layer"):
        oneshot_quantize(net(), bits=3, layer_bits={"fc": 8})


def test_ste_forward_and_finalize_use_each_layers_own_bits(tmp_path: Path) -> None:
    model = net()
    sched = INQScheduler(model, bits=2, portions=(1.0,), layer_bits={"4": 8})
    ste = STEQuantizer(model, sched)
    train_steps(model, torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9), 3)
    with torch.no_grad():
        seen = {k: model.get_submodule(k).weight.clone() for k in ("0", "4")}  # the forward's
    shadows = {k: model.get_submodule(k).parametrizations.weight.original for k in ("0", "4")}
    for layer in sched.layers:
        own = inq.pow2_quantize(shadows[layer.name].detach(), layer.n1, layer.bits)
        assert torch.equal(seen[layer.name], own)
    assert len(seen["0"].unique()) <= 3  # ternary
    assert len(seen["4"].unique()) > 3  # an 8-bit level set
    sched = ste.finalize()
    for layer in sched.layers:
        assert torch.equal(layer.weight.detach(), seen[layer.name])
        assert_in_level_set(layer.weight, layer.n1, layer.bits)
    save_masked(tmp_path / "ste.safetensors", model, sched)
    ckpt = load_masked(tmp_path / "ste.safetensors")
    assert ckpt.layer_bits == {"0.weight": 2, "4.weight": 8}
    assert verify_masked(ckpt).ok
