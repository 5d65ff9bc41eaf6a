"""Tracing a model and planning its integer ops (inq.quant.trace): the handler table, fusion,
signedness, and what is refused."""

from __future__ import annotations

import math
import operator
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from export_fixtures import packed_model
from torch import fx, nn

from inq.models import ResNetCIFAR
from inq.nn import ShiftConv2d, ShiftLinear
from inq.quant import integer, trace
from inq.quant.trace import IntegerModelError, check_expressible, plan, trace_model

UNSUPPORTED = (
    r"the integer model cannot express {}; supported: packed conv2d/linear with BatchNorm and "
    r"ReLU/ReLU6/Hardtanh, add, ReLU, ReLU6, Hardtanh, max/average pooling, flatten, slicing, "
    r"zero padding$"
)


class _Fn(nn.Module):
    """A model whose forward is ``fn``."""

    def __init__(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fn(x)


def _graph(target: Callable[..., torch.Tensor]) -> fx.GraphModule:
    """``target(x, x)`` as a graph, for a function the tracer records as another one."""
    graph = fx.Graph()
    x = graph.placeholder("x")
    graph.output(graph.call_function(target, (x, x)))
    return fx.GraphModule(nn.Module(), graph)


def _ops(model: nn.Module, float_layers: bool = False) -> list[str]:
    graph_module = model if isinstance(model, fx.GraphModule) else trace_model(model)
    return [s.op for s in plan(graph_module, float_layers)]


def _packed(layer: nn.Module) -> nn.Module:
    torch.manual_seed(0)
    return packed_model(nn.Sequential(layer))


# Every entry of the handler table: (model, float_layers, the ops it plans to, or the refusal).
EXAMPLES: dict[tuple[str, object], tuple[Callable[[], nn.Module], bool, list[str] | str]] = {
    ("call_module", ShiftConv2d): (lambda: _packed(nn.Conv2d(1, 2, 3)), False,
                                         ["input", "conv"]),
    ("call_module", ShiftLinear): (lambda: _packed(nn.Linear(3, 2)), False,
                                         ["input", "linear"]),
    ("call_module", nn.Conv2d): (lambda: nn.Sequential(nn.Conv2d(1, 2, 3)), True,
                                 ["input", "conv"]),
    ("call_module", nn.Linear): (lambda: nn.Sequential(nn.Linear(3, 2)), True,
                                 ["input", "linear"]),
    ("call_module", nn.modules.conv._ConvNd): (lambda: nn.Sequential(nn.Conv1d(1, 2, 3)), True,
                                               "the integer model has Conv2d and Linear layers"),
    ("call_module", nn.modules.batchnorm._BatchNorm): (
        lambda: nn.Sequential(nn.MaxPool2d(1), nn.BatchNorm2d(1)), True,
        "BatchNorm '1' does not directly follow"),
    ("call_module", nn.Identity): (lambda: nn.Sequential(nn.Identity(), nn.ReLU()), False,
                                   ["input", "relu"]),  # an alias: no op of its own
    ("call_module", nn.Dropout): (lambda: nn.Sequential(nn.Dropout(), nn.ReLU()), False,
                                  ["input", "relu"]),
    ("call_module", nn.ReLU): (lambda: nn.Sequential(nn.ReLU()), False, ["input", "relu"]),
    ("call_function", F.relu): (lambda: _Fn(F.relu), False, ["input", "relu"]),
    ("call_function", torch.relu): (lambda: _Fn(torch.relu), False, ["input", "relu"]),
    ("call_function", torch.relu_): (lambda: _Fn(torch.relu_), False, ["input", "relu"]),
    ("call_method", "relu"): (lambda: _Fn(lambda x: x.relu()), False, ["input", "relu"]),
    ("call_method", "relu_"): (lambda: _Fn(lambda x: x.relu_()), False, ["input", "relu"]),
    ("call_module", nn.Hardtanh): (lambda: nn.Sequential(nn.Hardtanh()), False,
                                   ["input", "clamp"]),
    ("call_function", F.hardtanh): (lambda: _Fn(lambda x: F.hardtanh(x, -2.0, 2.0)), False,
                                    ["input", "clamp"]),
    ("call_function", F.relu6): (lambda: _Fn(F.relu6), False, ["input", "clamp"]),
    ("call_module", nn.MaxPool2d): (lambda: nn.Sequential(nn.MaxPool2d(2)), False,
                                    ["input", "maxpool"]),
    ("call_module", nn.AvgPool2d): (lambda: nn.Sequential(nn.AvgPool2d(2)), False,
                                    ["input", "avgpool"]),
    ("call_module", nn.AdaptiveAvgPool2d): (lambda: nn.Sequential(nn.AdaptiveAvgPool2d(1)),
                                            False, ["input", "avgpool"]),
    ("call_function", F.adaptive_avg_pool2d): (lambda: _Fn(lambda x: F.adaptive_avg_pool2d(x, 1)),
                                               False, ["input", "avgpool"]),
    ("call_module", nn.Flatten): (lambda: nn.Sequential(nn.Flatten()), False,
                                  ["input", "flatten"]),
    ("call_function", torch.flatten): (lambda: _Fn(lambda x: torch.flatten(x, 1)), False,
                                       ["input", "flatten"]),
    ("call_method", "flatten"): (lambda: _Fn(lambda x: x.flatten(1)), False,
                                 ["input", "flatten"]),
    ("call_function", operator.add): (lambda: _Fn(lambda x: x + x), False, ["input", "add"]),
    ("call_function", operator.iadd): (lambda: _graph(operator.iadd), False, ["input", "add"]),
    ("call_function", torch.add): (lambda: _Fn(lambda x: torch.add(x, x)), False,
                                   ["input", "add"]),
    ("call_method", "add"): (lambda: _Fn(lambda x: x.add(x)), False, ["input", "add"]),
    ("call_method", "add_"): (lambda: _Fn(lambda x: x.add_(x)), False, ["input", "add"]),
    ("call_function", operator.getitem): (lambda: _Fn(lambda x: x[:, 1:]), False,
                                          ["input", "slice"]),
    ("call_function", F.pad): (lambda: _Fn(lambda x: F.pad(x, (1, 1))), False, ["input", "pad"]),
}  # fmt: skip


def test_the_handler_table_covers_exactly_the_kinds_the_planner_accepts() -> None:
    assert set(EXAMPLES) == set(trace._HANDLERS)
    planned = {op for _, _, ops in EXAMPLES.values() if isinstance(ops, list) for op in ops}
    assert planned == set(integer._RUN)  # every op the integer model runs, and no other


def _kind_id(kind: tuple[str, object]) -> str:
    """``call_function-torch.nn.functional.relu``: the same on every run (a function's repr
    holds its address)."""
    op, target = kind
    where = getattr(target, "__module__", None)
    return f"{op}-{f'{where}.' if where else ''}{getattr(target, '__name__', target)}"


@pytest.mark.parametrize("kind", list(EXAMPLES), ids=_kind_id)
def test_each_node_kind_becomes_its_op(kind: tuple[str, object]) -> None:
    build, float_layers, expected = EXAMPLES[kind]
    if isinstance(expected, str):
        with pytest.raises(IntegerModelError, match=expected):
            _ops(build(), float_layers)
    else:
        assert _ops(build(), float_layers) == expected


def test_float_layers_are_refused_unless_they_stand_for_packed_ones() -> None:
    with pytest.raises(IntegerModelError, match=r"'0' \(Linear\) has float weights"):
        _ops(nn.Sequential(nn.Linear(4, 3)))
    assert _ops(nn.Sequential(nn.Linear(4, 3)), float_layers=True) == ["input", "linear"]


@pytest.mark.parametrize(
    ("model", "what"),
    [
        (nn.Sequential(nn.Flatten(), nn.Sigmoid()), r"module '1' \(Sigmoid\)"),
        (nn.Sequential(nn.Conv2d(1, 2, 3), nn.Hardswish()), r"module '1' \(Hardswish\)"),
        (nn.Sequential(nn.Conv2d(1, 2, 3), nn.BatchNorm2d(2), nn.SiLU()), r"module '2' \(SiLU\)"),
        (nn.Sequential(nn.GELU()), r"module '0' \(GELU\)"),
        (nn.Sequential(nn.Dropout2d()), r"module '0' \(Dropout2d\)"),
        (_Fn(lambda x: torch.cat([x, x], 1)), r"call_function <built-in method cat .*>"),
        (_Fn(lambda x: x.sigmoid()), "call_method sigmoid"),
    ],
    ids=["module", "hardswish", "silu", "gelu", "module-dropout2d", "function", "method"],
)
def test_unsupported_nodes_are_refused_with_one_message(model: nn.Module, what: str) -> None:
    with pytest.raises(IntegerModelError, match=f"^{UNSUPPORTED.format(what)}") as err:
        _ops(model, float_layers=True)
    assert "\n" not in str(err.value)


def test_a_parameter_read_in_forward_is_unsupported() -> None:
    class Offset(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = nn.Parameter(torch.ones(1))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + self.w

    with pytest.raises(IntegerModelError, match=f"^{UNSUPPORTED.format('get_attr w')}"):
        _ops(Offset())


@pytest.mark.parametrize(
    ("model", "message"),
    [
        (nn.Sequential(nn.Conv2d(1, 2, 3, padding=1, padding_mode="reflect")),
         "layer '0': only zero padding is supported"),
        (nn.Sequential(nn.AvgPool2d(2, padding=1)), "average pooling with padding"),
        (nn.Sequential(nn.AdaptiveAvgPool2d(2)), "_0: adaptive average pooling only to 1x1"),
        (_Fn(lambda x: torch.add(x, x, alpha=2)), "add: only the sum of two tensors"),
        (_Fn(lambda x: x + 1), "add: only the sum of two tensors"),
        (_Fn(lambda x: F.pad(x, (1, 1), value=1.0)), "pad: only zero padding is supported"),
        (_Fn(lambda x: x[0]), r"getitem: only slicing with ':' and '\.\.\.' is supported"),
        (_Fn(lambda x: x if x.sum() > 0 else -x), "cannot trace the model with torch.fx"),
        (_Fn(lambda x: (F.relu(x), x.relu())[0]), "must return one tensor, computed last"),
    ],
    ids=["conv-padding-mode", "avgpool-padding", "adaptive-2x2", "add-alpha", "add-constant",
         "pad-value", "index", "control-flow", "output-not-last"],
)  # fmt: skip
def test_what_it_cannot_express_is_named(model: nn.Module, message: str) -> None:
    with pytest.raises(IntegerModelError, match=message):
        _ops(model, float_layers=True)


def test_exactly_one_input() -> None:
    class Two(nn.Module):
        def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return x + y

    with pytest.raises(IntegerModelError, match="exactly one input tensor"):
        _ops(Two())


def test_in_place_op_on_a_shared_value_is_refused() -> None:
    class InPlace(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = self.fc(x)
            return F.relu(y, inplace=True) + y  # eager: y is changed for the add too

    with pytest.raises(IntegerModelError, match="relu: an in-place op on a value with other"):
        _ops(packed_model(InPlace()))


def test_in_place_dropout_is_an_alias_even_on_a_shared_value() -> None:
    """Dropout in eval changes nothing, in place or not."""

    class Drop(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.drop = nn.Dropout(inplace=True)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.drop(x) + x

    steps = plan(trace_model(Drop().eval()))
    assert [(s.op, s.inputs) for s in steps] == [("input", []), ("add", ["input", "input"])]


def test_resnet_blocks_fuse_and_know_their_sign() -> None:
    """conv + BatchNorm + ReLU and add + ReLU become one op each; a ReLU'd value is unsigned,
    a conv without ReLU signed, the input's sign is left to the data."""
    torch.manual_seed(0)
    steps = plan(trace_model(ResNetCIFAR(depth=8, num_classes=4, in_channels=3, width=4)), True)
    by_name = {s.name: s for s in steps}
    first = steps[1]
    assert (first.op, first.bn, first.relu, first.signed) == ("conv", "bn", True, False)
    assert len(first.nodes) == 3
    adds = [s for s in steps if s.op == "add"]
    assert adds and all(s.relu and s.signed is False and len(s.nodes) == 2 for s in adds)
    for s in adds:  # the residual branch: a conv + BatchNorm without ReLU, signed
        branch = [by_name[i] for i in s.inputs if by_name[i].op == "conv"]
        assert any(b.bn and not b.relu and b.signed for b in branch)
    assert steps[0].signed is None and steps[-1].op == "linear"
    points = [s.op for s in steps if s.point]
    assert set(points) == {"input", "conv", "add", "avgpool", "linear"}


def test_a_module_called_twice_gives_two_steps() -> None:
    class Shared(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.relu, self.pool = nn.ReLU(), nn.AdaptiveAvgPool2d(1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.pool(self.relu(x)) + self.pool(x)

    steps = plan(trace_model(Shared()))
    names = [s.name for s in steps]
    assert len(names) == len(set(names))
    pools = [s for s in steps if s.op == "avgpool"]
    assert len(pools) == 2 and {p.signed for p in pools} == {False, None}


def test_check_expressible_asks_of_the_float_model() -> None:
    check_expressible(ResNetCIFAR(depth=8, num_classes=4, in_channels=3, width=4))
    check_expressible(nn.Sequential(nn.Conv2d(1, 4, 3), nn.ReLU6()))
    with pytest.raises(IntegerModelError, match=r"module '1' \(SiLU\)"):
        check_expressible(nn.Sequential(nn.Conv2d(1, 4, 3), nn.SiLU()))


# ------------------------------------------------------------------ ReLU6 / Hardtanh: clamps


@pytest.mark.parametrize(
    ("act", "bounds", "signed"),
    [
        (nn.ReLU(), (0.0, math.inf), False),
        (nn.ReLU6(inplace=True), (0.0, 6.0), False),
        (nn.Hardtanh(-1.0, 1.0), (-1.0, 1.0), True),
        (nn.Hardtanh(0.5, 2.0), (0.5, 2.0), False),
    ],
    ids=["relu", "relu6", "hardtanh", "hardtanh-positive"],
)
def test_an_activation_after_conv_bn_folds_as_its_bounds(
    act: nn.Module, bounds: tuple[float, float], signed: bool
) -> None:
    """No op of its own: the conv's value is clamped to the bounds; it is unsigned where the
    lower bound is >= 0."""
    net = nn.Sequential(nn.Conv2d(1, 2, 3), nn.BatchNorm2d(2), act, nn.Flatten())
    steps = plan(trace_model(net), float_layers=True)
    assert [s.op for s in steps] == ["input", "conv", "flatten"]
    conv = steps[1]
    assert (conv.bn, conv.clamp, conv.signed, len(conv.nodes)) == ("1", bounds, signed, 3)
    assert conv.relu == isinstance(act, nn.ReLU)
    assert steps[2].signed == signed


def test_an_activation_after_an_add_folds() -> None:
    relu6 = plan(trace_model(_Fn(lambda x: F.relu6(x + x))))
    assert [(s.op, s.clamp, s.signed) for s in relu6] == [
        ("input", None, None),
        ("add", (0.0, 6.0), False),
    ]
    hardtanh = plan(trace_model(_Fn(lambda x: F.hardtanh(x + x, min_val=-0.5, max_val=3.0))))
    assert [(s.op, s.clamp, s.signed) for s in hardtanh][1] == ("add", (-0.5, 3.0), True)


def test_a_standalone_relu6_or_hardtanh_is_a_clamp_op() -> None:
    """Not after a conv/linear/add (here after max pooling): its own op, no quantization
    point; signed as its input unless the lower bound is >= 0."""
    net = _packed(nn.Conv2d(1, 2, 3))
    for act, bounds, signed in [(nn.Hardtanh(-1.0, 1.0), (-1.0, 1.0), True),
                                (nn.ReLU6(), (0.0, 6.0), False)]:  # fmt: skip
        steps = plan(trace_model(nn.Sequential(net[0], nn.MaxPool2d(2), act)))
        assert [s.op for s in steps] == ["input", "conv", "maxpool", "clamp"]
        clamp = steps[-1]
        assert (clamp.clamp, clamp.signed, clamp.point) == (bounds, signed, False)
        assert steps[1].clamp is None and steps[1].signed


def test_clamp_bounds_must_be_ordered_numbers() -> None:
    with pytest.raises(IntegerModelError, match="hardtanh: the bounds must be numbers min <= max"):
        _ops(_Fn(lambda x: F.hardtanh(x, 2.0, 1.0)))


def test_in_place_relu6_on_a_shared_value_is_refused() -> None:
    with pytest.raises(IntegerModelError, match="relu6: an in-place op on a value with other"):
        _ops(_Fn(lambda x: F.relu6(x, inplace=True) + x))


def test_torchvision_mobilenet_v2_folds_every_relu6() -> None:
    """Conv-BN-ReLU6 blocks, depthwise convs, residual adds without activation, Dropout and
    Linear: every ReLU6 folds into its conv, no clamp op is left."""
    torchvision = pytest.importorskip("torchvision")
    net = torchvision.models.mobilenet_v2(num_classes=10, width_mult=0.25)
    check_expressible(net)
    steps = plan(trace_model(net), float_layers=True)
    kinds = [s.op for s in steps]
    residuals = sum(getattr(m, "use_res_connect", False) for m in net.modules())
    assert "clamp" not in kinds and kinds.count("add") == residuals > 0
    convs = [s for s in steps if s.op == "conv"]
    relu6 = sum(isinstance(m, nn.ReLU6) for m in net.modules())
    assert sum(s.clamp == (0.0, 6.0) for s in convs) == relu6 > 0
    assert all(s.bn and s.signed == (s.clamp is None) for s in convs)
    assert all(s.clamp is None and s.signed for s in steps if s.op == "add")
    assert kinds[-3:] == ["avgpool", "flatten", "linear"]
