"""From a model to the plan of its integer ops: ``torch.fx`` tracing and grouping.

:func:`trace_model` traces the model with ``torch.fx``; the packed layers
:class:`inq.nn.ShiftConv2d` and :class:`inq.nn.ShiftLinear` stay leaves. :func:`plan` groups its
nodes into integer ops (:class:`Step`): a packed layer with the BatchNorm and activation (ReLU,
ReLU6 or Hardtanh) that follow it; an add with its activation; average pooling; and ops that are
exact on integers (max pooling, ReLU, ReLU6/Hardtanh as a clamp, flatten, slicing, zero padding,
dropout in eval). Each value an op creates is a *quantization point*: the model input, every
conv/linear block, add and average pool (:mod:`inq.quant.lower` calibrates and lowers them).

Which node becomes which op is one table, ``_HANDLERS``, from the node's kind (a module type, a
function, a method name) to a small handler: a new op is one entry and one handler. A module
matches the entry of its class or of the nearest base class that has one. Any other node is
refused with one message that names it and lists what is supported.

Example:
    >>> from torch import nn
    >>> from inq.nn import ShiftLinear
    >>> from inq.pow2 import pow2_quantize
    >>> fc = nn.Linear(4, 3)
    >>> with torch.no_grad():
    ...     _ = fc.weight.copy_(pow2_quantize(fc.weight, n1=-1, bits=5))
    >>> net = nn.Sequential(ShiftLinear.from_float(fc, n1=-1, bits=5), nn.ReLU())
    >>> [(s.name, s.op, s.relu) for s in plan(trace_model(net))]
    [('input', 'input', False), ('_0', 'linear', True)]
"""

from __future__ import annotations

import functools
import math
import operator
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NoReturn

import torch
import torch.nn.functional as F
from torch import fx, nn

from inq.nn import ShiftConv2d, ShiftLinear

__all__ = ["IntegerModelError", "Step", "check_expressible", "plan", "trace_model"]

_RELU = (0.0, math.inf)  # a ReLU's bounds
_SUPPORTED = (
    "packed conv2d/linear with BatchNorm and ReLU/ReLU6/Hardtanh, add, ReLU, ReLU6, Hardtanh, "
    "max/average pooling, flatten, slicing, zero padding"
)


class IntegerModelError(ValueError):
    """The model has a layer or a value the integer model cannot express."""


@dataclass
class Step:
    """Consecutive FX nodes that become one integer op; ``nodes[-1]`` gives its value.

    ``name`` is the op's (and its value's) name, ``op`` its kind in :mod:`inq.quant.integer`,
    ``inputs`` the names of the steps it reads; ``module``/``bn`` say what a conv or linear block
    folds. ``clamp`` holds the real bounds its value is clamped to: of the activation a conv,
    linear or add folds (ReLU ``(0, inf)``, ReLU6 ``(0, 6)``, Hardtanh ``(min_val, max_val)``),
    or of a ``relu``/``clamp`` op; None where there is none.
    """

    name: str
    op: str
    inputs: list[str]
    nodes: list[fx.Node]
    attrs: dict[str, Any] = field(default_factory=dict)
    module: str | None = None  # the packed layer
    bn: str | None = None
    clamp: tuple[float, float] | None = None
    signed: bool | None = None  # of a quantization point; None: decided by the data

    @property
    def relu(self) -> bool:
        """Whether its activation is a ReLU."""
        return self.clamp == _RELU

    @property
    def point(self) -> bool:
        """Whether the step creates a new quantized value (observed, given its own scale)."""
        return self.op in ("input", "conv", "linear", "add", "avgpool")


class _Tracer(fx.Tracer):
    def is_leaf_module(self, m: nn.Module, qualname: str) -> bool:
        return isinstance(m, ShiftConv2d | ShiftLinear) or super().is_leaf_module(m, qualname)


def trace_model(model: nn.Module) -> fx.GraphModule:
    """``model`` traced with ``torch.fx``, its packed layers kept as leaves.

    Example:
        >>> gm = trace_model(nn.Sequential(nn.Flatten(), nn.ReLU()))
        >>> [n.op for n in gm.graph.nodes]
        ['placeholder', 'call_module', 'call_module', 'output']

    Raises:
        IntegerModelError: if ``torch.fx`` cannot trace it (data-dependent control flow, ...).
    """
    try:
        return fx.GraphModule(model, _Tracer().trace(model))
    except (torch.fx.proxy.TraceError, TypeError, NotImplementedError) as err:
        raise IntegerModelError(f"cannot trace the model with torch.fx: {err}") from err


def plan(graph_module: fx.GraphModule, float_layers: bool = False) -> list[Step]:
    """The integer ops of a traced model, in order (see the module docstring).

    With ``float_layers``, plain ``nn.Conv2d``/``nn.Linear`` layers stand for the packed layers
    INQ will make of them: :func:`check_expressible` asks before any training is spent.

    Example:
        >>> net = nn.Sequential(nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten())
        >>> [(s.op, s.bn, s.relu) for s in plan(trace_model(net), float_layers=True)]
        [('input', None, False), ('conv', '1', True), ('flatten', None, False)]

    Raises:
        IntegerModelError: a node the integer model cannot express (the message names it), not
            exactly one input, or an output that is not the last op's value.
    """
    return _Planner(graph_module, float_layers).plan()


def check_expressible(model: nn.Module) -> None:
    """Raise :class:`IntegerModelError` if the integer model cannot express ``model`` once INQ
    has packed its Conv2d and Linear layers (``inq-train quant.act_bits`` asks this first).

    Example:
        >>> check_expressible(nn.Sequential(nn.Conv2d(1, 4, 3), nn.ReLU(), nn.Flatten(),
        ...                                 nn.Linear(144, 10)))
        >>> check_expressible(nn.Sequential(nn.Conv2d(1, 4, 3), nn.SiLU()))
        Traceback (most recent call last):
        ...
        inq.quant.trace.IntegerModelError: the integer model cannot express module '1' (SiLU); supported: packed conv2d/linear with BatchNorm and ReLU/ReLU6/Hardtanh, add, ReLU, ReLU6, Hardtanh, max/average pooling, flatten, slicing, zero padding
    """  # noqa: E501
    plan(trace_model(model), float_layers=True)


# ---------------------------------------------------------------------------------- planning


class _Planner:
    """Walks the graph once; :data:`_HANDLERS` turns each node into a step."""

    def __init__(self, graph_module: fx.GraphModule, float_layers: bool = False) -> None:
        self.graph_module, self.float_layers = graph_module, float_layers
        self.modules = dict(graph_module.named_modules())
        self._by_name: dict[str, Step] = {}

    def plan(self) -> list[Step]:
        if sum(n.op == "placeholder" for n in self.graph_module.graph.nodes) != 1:
            raise IntegerModelError("the model must take exactly one input tensor")
        steps: list[Step] = []
        value: dict[fx.Node, str] = {}  # FX node -> name of the step whose value it is
        done: set[fx.Node] = set()
        for node in self.graph_module.graph.nodes:
            if node in done:
                continue
            if node.op == "output":
                self._check_output(node, value, steps)
                continue
            step = self._step(node, value)
            if step is None:  # an alias: dropout, identity
                value[node] = value[node.args[0]]
                continue
            steps.append(step)
            self._by_name[step.name] = step
            done.update(step.nodes)
            value[step.nodes[-1]] = step.name
        return steps

    def module(self, node: fx.Node) -> nn.Module | None:
        """The module a ``call_module`` node calls (None for other nodes)."""
        return _module(node, self.modules)

    def signed(self, name: str) -> bool | None:
        """Whether a value can be negative (None: the input's, decided by the data)."""
        return self._by_name[name].signed

    def _step(self, node: fx.Node, value: dict[fx.Node, str]) -> Step | None:
        if node.op == "placeholder":
            return Step("input", "input", [], [node], signed=None)
        args = [a for a in node.args if isinstance(a, fx.Node)]
        unknown = [a.name for a in args if a not in value]
        if unknown:
            raise IntegerModelError(f"{node.name}: its inputs {unknown} are no integer values")
        return _handler(node, self.modules)(self, node, [value[a] for a in args])

    def _check_output(self, node: fx.Node, value: dict[fx.Node, str], steps: list[Step]) -> None:
        out = node.args[0]
        if not isinstance(out, fx.Node) or value.get(out) != steps[-1].name:
            raise IntegerModelError("the model must return one tensor, computed last")


_Handler = Callable[[_Planner, fx.Node, list[str]], Step | None]


def _handler(node: fx.Node, modules: dict[str, nn.Module]) -> _Handler:
    """The entry of :data:`_HANDLERS` for ``node`` (a module by its class's MRO)."""
    if node.op == "call_module":
        keys = [("call_module", cls) for cls in type(_module(node, modules)).__mro__]
    else:
        keys = [(node.op, node.target)]
    return next((_HANDLERS[k] for k in keys if k in _HANDLERS), _unsupported)


def _module(node: fx.Node, modules: dict[str, nn.Module]) -> nn.Module | None:
    return modules.get(str(node.target)) if node.op == "call_module" else None


def _fold_activation(
    p: _Planner, node: fx.Node
) -> tuple[list[fx.Node], tuple[float, float] | None]:
    """The ReLU, ReLU6 or Hardtanh that is ``node``'s only user (a list: empty if there is
    none), and its bounds, to fold into ``node``'s op."""
    act = _only_user(node, lambda u: _handler(u, p.modules) in (_relu, _clamp))
    return ([], None) if act is None else ([act], _bounds(p, act))


def _bounds(p: _Planner, node: fx.Node) -> tuple[float, float]:
    """The real bounds a ReLU, ReLU6 or Hardtanh node clamps its input to."""
    module = p.module(node)
    if _handler(node, p.modules) is _relu:
        return _RELU
    if module is not None:
        low, high = module.min_val, module.max_val
    elif node.target is F.relu6:
        low, high = 0.0, 6.0
    else:
        low, high = _arg(node, 1, "min_val", -1.0), _arg(node, 2, "max_val", 1.0)
    if not (isinstance(low, int | float) and isinstance(high, int | float) and low <= high):
        raise IntegerModelError(f"{node.name}: the bounds must be numbers min <= max")
    return float(low), float(high)


def _only_user(node: fx.Node, test: Callable[[fx.Node], bool]) -> fx.Node | None:
    users = list(node.users)
    return users[0] if len(users) == 1 and test(users[0]) else None


def _check_in_place(node: fx.Node, modules: dict[str, nn.Module]) -> None:
    """Refuse an in-place op on a value that something else reads too: eager PyTorch changes
    that value for its other readers, the traced graph does not."""
    module = _module(node, modules)
    in_place = (
        getattr(module, "inplace", False)
        or node.kwargs.get("inplace", False)
        or node.target in (torch.relu_, operator.iadd, "relu_", "add_")
    )
    first = node.args[0] if node.args else None
    if in_place and isinstance(first, fx.Node) and len(first.users) > 1:
        raise IntegerModelError(
            f"{node.name}: an in-place op on a value with other readers; use the out-of-place op"
        )


def _value_op(handler: _Handler) -> _Handler:
    """A handler of an op on values (which may run in place): the in-place check comes first.
    Layers (folded or refused) and aliases are not checked."""

    @functools.wraps(handler)
    def checked(p: _Planner, node: fx.Node, inputs: list[str]) -> Step | None:
        _check_in_place(node, p.modules)
        return handler(p, node, inputs)

    return checked


# ---------------------------------------------------------------------------------- handlers


def _weight_layer(p: _Planner, node: fx.Node, inputs: list[str]) -> Step:
    """A packed conv/linear with the BatchNorm and activation that follow it (each the only
    user)."""
    module = p.module(node)
    pre_pad = module.pre_pad if isinstance(module, ShiftConv2d) else None
    if isinstance(module, nn.Conv2d) and (
        module.padding_mode != "zeros" or isinstance(module.padding, str)
    ):
        pre_pad = module.padding_mode
    if pre_pad is not None:
        raise IntegerModelError(f"layer {node.target!r}: only zero padding is supported")
    nodes, bn = [node], None
    bn_node = _only_user(node, lambda u: isinstance(p.module(u), nn.modules.batchnorm._BatchNorm))
    if bn_node is not None:
        nodes.append(bn_node)
        bn = str(bn_node.target)
    folded, clamp = _fold_activation(p, nodes[-1])
    nodes += folded
    op = "conv" if isinstance(module, ShiftConv2d | nn.Conv2d) else "linear"
    return Step(node.name, op, inputs, nodes, module=str(node.target), bn=bn, clamp=clamp,
                signed=clamp is None or clamp[0] < 0)  # fmt: skip


def _float_layer(p: _Planner, node: fx.Node, inputs: list[str]) -> Step:
    """A plain Conv2d/Linear: what INQ will pack (``float_layers``), else refused."""
    module = p.module(node)
    if p.float_layers and type(module) in (nn.Conv2d, nn.Linear):
        return _weight_layer(p, node, inputs)
    if isinstance(module, nn.Conv2d) and type(module) is not nn.Conv2d:
        _other_conv(p, node, inputs)
    raise IntegerModelError(
        f"layer {node.target!r} ({type(module).__name__}) has float weights: the integer "
        "model needs every conv/linear quantized (packed power-of-two codes)"
    )


def _other_conv(p: _Planner, node: fx.Node, inputs: list[str]) -> NoReturn:
    raise IntegerModelError(
        f"layer {node.target!r} ({type(p.module(node)).__name__}): the integer model has Conv2d "
        "and Linear layers only"
    )


def _stray_batchnorm(p: _Planner, node: fx.Node, inputs: list[str]) -> NoReturn:
    """A BatchNorm that :func:`_weight_layer` did not fold."""
    raise IntegerModelError(
        f"BatchNorm {node.target!r} does not directly follow a packed conv/linear layer "
        "(its only user): it cannot be folded into a requantization"
    )


def _alias(p: _Planner, node: fx.Node, inputs: list[str]) -> None:
    """Identity, and dropout (the model is in eval mode): the value of the input."""
    return None


@_value_op
def _relu(p: _Planner, node: fx.Node, inputs: list[str]) -> Step:
    return Step(node.name, "relu", inputs[:1], [node], clamp=_RELU, signed=False)


@_value_op
def _clamp(p: _Planner, node: fx.Node, inputs: list[str]) -> Step:
    """ReLU6 or Hardtanh not folded into a conv/linear/add: a clamp of the integers."""
    low, high = _bounds(p, node)
    signed = p.signed(inputs[0]) if low < 0 else False
    return Step(node.name, "clamp", inputs[:1], [node], clamp=(low, high), signed=signed)


@_value_op
def _maxpool(p: _Planner, node: fx.Node, inputs: list[str]) -> Step:
    m = p.module(node)
    geometry = {"kernel": "kernel_size", "stride": "stride", "padding": "padding",
                "dilation": "dilation"}  # fmt: skip
    attrs: dict[str, Any] = {k: _pair(getattr(m, a)) for k, a in geometry.items()}
    attrs["ceil_mode"] = m.ceil_mode
    return Step(node.name, "maxpool", inputs[:1], [node], attrs, signed=p.signed(inputs[0]))


@_value_op
def _avgpool(p: _Planner, node: fx.Node, inputs: list[str]) -> Step:
    """Average pooling without padding, or global (adaptive to 1x1: ``kernel`` None)."""
    module = p.module(node)
    attrs: dict[str, Any]
    if isinstance(module, nn.AvgPool2d):
        m = module
        if m.padding not in (0, (0, 0)) or m.ceil_mode or m.divisor_override:
            raise IntegerModelError(f"{node.target!r}: average pooling with padding, ceil "
                                    "mode or a divisor override is not supported")  # fmt: skip
        attrs = {"kernel": _pair(m.kernel_size), "stride": _pair(m.stride or m.kernel_size)}
    else:
        size = module.output_size if module is not None else _arg(node, 1, "output_size", None)
        if _pair(size) != [1, 1]:
            raise IntegerModelError(f"{node.name}: adaptive average pooling only to 1x1")
        attrs = {"kernel": None, "stride": None}
    return Step(node.name, "avgpool", inputs[:1], [node], attrs, signed=p.signed(inputs[0]))


@_value_op
def _flatten(p: _Planner, node: fx.Node, inputs: list[str]) -> Step:
    module = p.module(node)
    start = module.start_dim if module else _arg(node, 1, "start_dim", 0)
    end = module.end_dim if module else _arg(node, 2, "end_dim", -1)
    attrs = {"start_dim": start, "end_dim": end}
    return Step(node.name, "flatten", inputs[:1], [node], attrs, signed=p.signed(inputs[0]))


@_value_op
def _add(p: _Planner, node: fx.Node, inputs: list[str]) -> Step:
    """The sum of two values, with the activation that follows it (its only user)."""
    if len(inputs) != 2 or node.kwargs.get("alpha", 1) != 1:
        raise IntegerModelError(f"{node.name}: only the sum of two tensors is supported")
    folded, clamp = _fold_activation(p, node)
    cut = clamp is not None and clamp[0] >= 0  # clamped at >= 0: unsigned
    signed = not cut and any(p.signed(i) is not False for i in inputs)
    return Step(node.name, "add", inputs, [node, *folded], clamp=clamp, signed=signed)


@_value_op
def _slice(p: _Planner, node: fx.Node, inputs: list[str]) -> Step:
    attrs = {"index": _index(node)}
    return Step(node.name, "slice", inputs[:1], [node], attrs, signed=p.signed(inputs[0]))


@_value_op
def _pad(p: _Planner, node: fx.Node, inputs: list[str]) -> Step:
    pad = _arg(node, 1, "pad", None)
    mode, fill = _arg(node, 2, "mode", "constant"), _arg(node, 3, "value", 0)
    if mode != "constant" or fill not in (0, 0.0, None):
        raise IntegerModelError(f"{node.name}: only zero padding is supported")
    attrs = {"pad": list(pad)}
    return Step(node.name, "pad", inputs[:1], [node], attrs, signed=p.signed(inputs[0]))


@_value_op
def _unsupported(p: _Planner, node: fx.Node, inputs: list[str]) -> NoReturn:
    """Every node kind without an entry: one message, naming the node."""
    module = p.module(node)
    what = (
        f"module {node.target!r} ({type(module).__name__})"
        if module
        else f"{node.op} {node.target}"
    )
    raise IntegerModelError(f"the integer model cannot express {what}; supported: {_SUPPORTED}")


_HANDLERS: dict[tuple[str, Any], _Handler] = {
    ("call_module", ShiftConv2d): _weight_layer,
    ("call_module", ShiftLinear): _weight_layer,
    ("call_module", nn.Conv2d): _float_layer,
    ("call_module", nn.Linear): _float_layer,
    ("call_module", nn.modules.conv._ConvNd): _other_conv,
    ("call_module", nn.modules.batchnorm._BatchNorm): _stray_batchnorm,
    ("call_module", nn.Identity): _alias,
    ("call_module", nn.Dropout): _alias,
    ("call_module", nn.ReLU): _relu,
    ("call_function", F.relu): _relu,
    ("call_function", torch.relu): _relu,
    ("call_function", torch.relu_): _relu,
    ("call_method", "relu"): _relu,
    ("call_method", "relu_"): _relu,
    ("call_module", nn.Hardtanh): _clamp,  # and nn.ReLU6, a Hardtanh
    ("call_function", F.hardtanh): _clamp,
    ("call_function", F.relu6): _clamp,
    ("call_module", nn.MaxPool2d): _maxpool,
    ("call_module", nn.AvgPool2d): _avgpool,
    ("call_module", nn.AdaptiveAvgPool2d): _avgpool,
    ("call_function", F.adaptive_avg_pool2d): _avgpool,
    ("call_module", nn.Flatten): _flatten,
    ("call_function", torch.flatten): _flatten,
    ("call_method", "flatten"): _flatten,
    ("call_function", operator.add): _add,
    ("call_function", operator.iadd): _add,
    ("call_function", torch.add): _add,
    ("call_method", "add"): _add,
    ("call_method", "add_"): _add,
    ("call_function", operator.getitem): _slice,
    ("call_function", F.pad): _pad,
}


def _pair(value: Any) -> list[int]:
    return [int(v) for v in value] if isinstance(value, tuple | list) else [int(value)] * 2


def _index(node: fx.Node) -> list[list[int | None] | None]:
    index = node.args[1] if isinstance(node.args[1], tuple) else (node.args[1],)
    out: list[list[int | None] | None] = []
    for item in index:
        if item is Ellipsis:
            out.append(None)
        elif isinstance(item, slice):
            out.append([item.start, item.stop, item.step])
        else:
            raise IntegerModelError(f"{node.name}: only slicing with ':' and '...' is supported")
    return out


def _arg(node: fx.Node, index: int, name: str, default: Any) -> Any:
    """Argument ``index`` (or keyword ``name``) of a function call in the graph."""
    return node.args[index] if len(node.args) > index else node.kwargs.get(name, default)
