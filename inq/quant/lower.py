"""From a packed (float-activation) INQ model to an integer model.

:class:`Lowering` traces the model with ``torch.fx`` (the packed layers :class:`inq.nn.ShiftConv2d`
and :class:`inq.nn.ShiftLinear` stay leaves) and groups its nodes into integer ops: a packed
layer with the BatchNorm and ReLU that follow it; an add with its ReLU; average pooling; and
ops that are exact on integers (max pooling, ReLU, flatten, slicing, zero padding, dropout in
eval). Each value an op creates is a *quantization point*: the model input, every conv/linear
block, add and average pool. :meth:`Lowering.calibrate` runs the float model on batches and
observes each point (:mod:`inq.quant.observers`); :meth:`Lowering.fake_quant_model` gives the
model with :class:`inq.quant.fakequant.FakeQuant` at each point for fine-tuning; and
:meth:`Lowering.integer_model` computes the integers of :mod:`inq.quant.integer`:

- a block's accumulator carries ``frac`` fractional bits, the largest offset its codes use (then
  every shift is exact), capped so the int32 sum cannot overflow;
- BatchNorm ``y = a * z + b`` (``a = gamma / sqrt(var + eps)``) folds into the requantization:
  the bias ``round(b / (a * s_acc))`` in accumulator units (int32) and the multiplier
  ``a * s_acc / s_out`` per channel, as 31-bit integer times ``2**-shift``
  (:func:`quantize_multiplier`); where that ratio is a power of two (no BatchNorm, power-of-two
  scales) it is a pure shift;
- the last block keeps int32 outputs (logits), scaled by the smallest channel scale.

Example:
    >>> from torch import nn
    >>> from inq.nn import ShiftLinear
    >>> from inq.pow2 import pow2_quantize
    >>> fc = nn.Linear(4, 3)
    >>> with torch.no_grad():
    ...     _ = fc.weight.copy_(pow2_quantize(fc.weight, n1=-1, bits=5))
    >>> net = nn.Sequential(ShiftLinear.from_float(fc, n1=-1, bits=5))
    >>> lowering = Lowering(net, act_bits=8)
    >>> lowering.calibrate([torch.randn(16, 4)])
    >>> int_model = lowering.integer_model()
    >>> [op.op for op in int_model.ops]
    ['input', 'linear']
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, fx, nn

from inq.codes import unpack_codes
from inq.io import n1_json
from inq.kernels.int8 import max_frac_bits
from inq.nn import ShiftConv2d, ShiftLinear
from inq.quant.fakequant import FakeQuant
from inq.quant.integer import (
    INT32_MAX,
    INT32_MIN,
    MAX_SHIFT,
    IntegerModel,
    IntOp,
    accumulator_bound,
)
from inq.quant.observers import Observer, act_range

__all__ = ["IntegerModelError", "Lowering", "check_expressible", "quantize_multiplier"]

MULTIPLIER_BITS = 31


class IntegerModelError(ValueError):
    """The model has a layer or a value the integer model cannot express."""


def quantize_multiplier(value: float, bits: int = MULTIPLIER_BITS) -> tuple[int, int]:
    """``(m, s)`` with ``m * 2**-s`` closest to ``value``, ``|m| < 2**bits``, ``0 <= s <= 62``,
    normalised: ``m`` odd unless ``s == 0`` (so a power of two ``2**-k`` gives ``(1, k)``).

    Example:
        >>> quantize_multiplier(0.25), quantize_multiplier(3.0), quantize_multiplier(0.0)
        ((1, 2), (3, 0), (0, 0))
        >>> m, s = quantize_multiplier(0.1)
        >>> m, s, abs(m / 2**s - 0.1) < 2**-34
        (858993459, 33, True)

    Raises:
        IntegerModelError: if ``|value|`` needs ``2**bits`` or more.
    """
    if value == 0.0:
        return 0, 0
    _, exponent = math.frexp(value)  # 2**(exponent-1) <= |value| < 2**exponent
    shift = min(MAX_SHIFT, max(0, bits - exponent))
    m = round(math.ldexp(value, shift))
    if abs(m) >= 1 << bits:
        if shift == 0:
            raise IntegerModelError(f"a requantization factor {value} needs more than {bits} bits")
        m, shift = round(math.ldexp(value, shift - 1)), shift - 1
    if m == 0:
        raise IntegerModelError(f"a requantization factor {value} is below 2**-{MAX_SHIFT}")
    while shift > 0 and m % 2 == 0:
        m, shift = m // 2, shift - 1
    return m, shift


# ---------------------------------------------------------------------------------- tracing


class _Tracer(fx.Tracer):
    def is_leaf_module(self, m: nn.Module, qualname: str) -> bool:
        return isinstance(m, ShiftConv2d | ShiftLinear) or super().is_leaf_module(m, qualname)


_RELU = {F.relu, torch.relu, torch.relu_}
_ADD = {operator.add, operator.iadd, torch.add}
_FLATTEN = {torch.flatten}
_IDENTITY = (nn.Identity, nn.Dropout)


def _module(node: fx.Node, modules: dict[str, nn.Module]) -> nn.Module | None:
    return modules.get(str(node.target)) if node.op == "call_module" else None


def _is_relu(node: fx.Node, modules: dict[str, nn.Module]) -> bool:
    return (
        isinstance(_module(node, modules), nn.ReLU)
        or (node.op == "call_function" and node.target in _RELU)
        or (node.op == "call_method" and node.target in ("relu", "relu_"))
    )


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


def _only_user(node: fx.Node, test: Callable[[fx.Node], bool]) -> fx.Node | None:
    users = list(node.users)
    return users[0] if len(users) == 1 and test(users[0]) else None


@dataclass
class _Step:
    """Consecutive FX nodes that become one integer op; ``nodes[-1]`` gives its value."""

    name: str
    op: str
    inputs: list[str]
    nodes: list[fx.Node]
    attrs: dict[str, Any] = field(default_factory=dict)
    module: str | None = None  # the packed layer
    bn: str | None = None
    relu: bool = False
    signed: bool | None = None  # of a quantization point; None: decided by the data

    @property
    def point(self) -> bool:
        """Whether the step creates a new quantized value (observed, given its own scale)."""
        return self.op in ("input", "conv", "linear", "add", "avgpool")


class _Planner:
    """Groups the nodes of a traced model into integer ops (see the module docstring).

    With ``float_layers``, plain ``nn.Conv2d``/``nn.Linear`` layers stand for the packed layers
    INQ will make of them: :func:`check_expressible` asks before any training is spent.
    """

    def __init__(self, graph_module: fx.GraphModule, float_layers: bool = False) -> None:
        self.graph_module, self.float_layers = graph_module, float_layers
        self.modules = dict(graph_module.named_modules())
        self._by_name: dict[str, _Step] = {}

    def plan(self) -> list[_Step]:
        if sum(n.op == "placeholder" for n in self.graph_module.graph.nodes) != 1:
            raise IntegerModelError("the model must take exactly one input tensor")
        steps: list[_Step] = []
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
            if step.op in ("maxpool", "flatten", "slice", "pad"):
                step.signed = self._signed(step.inputs[0])
            steps.append(step)
            self._by_name[step.name] = step
            done.update(step.nodes)
            value[step.nodes[-1]] = step.name
        return steps

    def _signed(self, name: str) -> bool | None:
        """Whether a value can be negative (None: the input's, decided by the data)."""
        return self._by_name[name].signed

    def _step(self, node: fx.Node, value: dict[fx.Node, str]) -> _Step | None:
        modules = self.modules
        module = _module(node, modules)
        args = [a for a in node.args if isinstance(a, fx.Node)]
        unknown = [a.name for a in args if a not in value]
        if unknown and node.op != "placeholder":
            raise IntegerModelError(f"{node.name}: its inputs {unknown} are no integer values")
        inputs = [value[a] for a in args]
        name = node.name  # unique, also where one module is called twice
        if node.op == "placeholder":
            return _Step("input", "input", [], [node], signed=None)
        if isinstance(module, ShiftConv2d | ShiftLinear) or (
            self.float_layers and type(module) in (nn.Conv2d, nn.Linear)
        ):
            return self._weight_step(node, module, inputs)
        if isinstance(module, nn.modules.conv._ConvNd) and type(module) is not nn.Conv2d:
            raise IntegerModelError(
                f"layer {node.target!r} ({type(module).__name__}): the integer model has Conv2d "
                "and Linear layers only"
            )
        if isinstance(module, nn.Conv2d | nn.Linear):
            raise IntegerModelError(
                f"layer {node.target!r} ({type(module).__name__}) has float weights: the integer "
                "model needs every conv/linear quantized (packed power-of-two codes)"
            )
        if isinstance(module, nn.modules.batchnorm._BatchNorm):
            raise IntegerModelError(
                f"BatchNorm {node.target!r} does not directly follow a packed conv/linear layer "
                "(its only user): it cannot be folded into a requantization"
            )
        if isinstance(module, _IDENTITY):
            return None
        _check_in_place(node, modules)
        if _is_relu(node, modules):
            return _Step(name, "relu", inputs[:1], [node], signed=False)
        if isinstance(module, nn.MaxPool2d):
            m = module
            geometry = {"kernel": "kernel_size", "stride": "stride", "padding": "padding",
                        "dilation": "dilation"}  # fmt: skip
            attrs: dict[str, Any] = {k: _pair(getattr(m, a)) for k, a in geometry.items()}
            attrs["ceil_mode"] = m.ceil_mode
            return _Step(name, "maxpool", inputs[:1], [node], attrs=attrs)
        if isinstance(module, nn.AdaptiveAvgPool2d | nn.AvgPool2d) or (
            node.op == "call_function" and node.target is F.adaptive_avg_pool2d
        ):
            attrs = self._avgpool(node, module)
            return _Step(name, "avgpool", inputs[:1], [node], attrs, signed=self._signed(inputs[0]))
        if (
            isinstance(module, nn.Flatten)
            or node.target in _FLATTEN
            or (node.op == "call_method" and node.target == "flatten")
        ):
            start = module.start_dim if module else _arg(node, 1, "start_dim", 0)
            end = module.end_dim if module else _arg(node, 2, "end_dim", -1)
            return _Step(
                name, "flatten", inputs[:1], [node], attrs={"start_dim": start, "end_dim": end}
            )
        if node.op in ("call_function", "call_method") and (
            node.target in _ADD or node.target in ("add", "add_")
        ):
            if len(args) != 2 or node.kwargs.get("alpha", 1) != 1:
                raise IntegerModelError(f"{node.name}: only the sum of two tensors is supported")
            nodes = [node]
            relu = _only_user(node, lambda u: _is_relu(u, modules))
            if relu is not None:
                nodes.append(relu)
            signed = relu is None and any(self._signed(i) is not False for i in inputs)
            return _Step(name, "add", inputs, nodes, relu=relu is not None, signed=signed)
        if node.op == "call_function" and node.target is operator.getitem:
            return _Step(name, "slice", inputs[:1], [node], attrs={"index": _index(node)})
        if node.op == "call_function" and node.target is F.pad:
            pad, mode, fill = _pad_args(node)
            if mode != "constant" or fill not in (0, 0.0, None):
                raise IntegerModelError(f"{node.name}: only zero padding is supported")
            return _Step(name, "pad", inputs[:1], [node], attrs={"pad": list(pad)})
        what = (
            f"module {node.target!r} ({type(module).__name__})"
            if module
            else f"{node.op} {node.target}"
        )
        raise IntegerModelError(
            f"the integer model cannot express {what}; supported: packed conv2d/linear with "
            "BatchNorm and ReLU, add, ReLU, max/average pooling, flatten, slicing, zero padding"
        )

    def _weight_step(self, node: fx.Node, module: nn.Module, inputs: list[str]) -> _Step:
        pre_pad = module.pre_pad if isinstance(module, ShiftConv2d) else None
        if isinstance(module, nn.Conv2d) and (
            module.padding_mode != "zeros" or isinstance(module.padding, str)
        ):
            pre_pad = module.padding_mode
        if pre_pad is not None:
            raise IntegerModelError(f"layer {node.target!r}: only zero padding is supported")
        nodes, bn, relu = [node], None, False
        bn_node = _only_user(
            node, lambda u: isinstance(_module(u, self.modules), nn.modules.batchnorm._BatchNorm)
        )
        if bn_node is not None:
            nodes.append(bn_node)
            bn = str(bn_node.target)
        relu_node = _only_user(nodes[-1], lambda u: _is_relu(u, self.modules))
        if relu_node is not None:
            nodes.append(relu_node)
            relu = True
        op = "conv" if isinstance(module, ShiftConv2d | nn.Conv2d) else "linear"
        return _Step(node.name, op, inputs, nodes, module=str(node.target), bn=bn, relu=relu,
                     signed=not relu)  # fmt: skip

    def _avgpool(self, node: fx.Node, module: nn.Module | None) -> dict[str, Any]:
        if isinstance(module, nn.AvgPool2d):
            m = module
            if m.padding not in (0, (0, 0)) or m.ceil_mode or m.divisor_override:
                raise IntegerModelError(f"{node.target!r}: average pooling with padding, ceil "
                                        "mode or a divisor override is not supported")  # fmt: skip
            return {"kernel": _pair(m.kernel_size), "stride": _pair(m.stride or m.kernel_size)}
        size = module.output_size if module is not None else _arg(node, 1, "output_size", None)
        if _pair(size) != [1, 1]:
            raise IntegerModelError(f"{node.name}: adaptive average pooling only to 1x1")
        return {"kernel": None, "stride": None}

    def _check_output(self, node: fx.Node, value: dict[fx.Node, str], steps: list[_Step]) -> None:
        out = node.args[0]
        if not isinstance(out, fx.Node) or value.get(out) != steps[-1].name:
            raise IntegerModelError("the model must return one tensor, computed last")


def check_expressible(model: nn.Module) -> None:
    """Raise :class:`IntegerModelError` if the integer model cannot express ``model`` once INQ
    has packed its Conv2d and Linear layers (``inq-train quant.act_bits`` asks this first).

    Example:
        >>> check_expressible(nn.Sequential(nn.Conv2d(1, 4, 3), nn.ReLU(), nn.Flatten(),
        ...                                 nn.Linear(144, 10)))
        >>> check_expressible(nn.Sequential(nn.Conv2d(1, 4, 3), nn.ReLU6()))
        Traceback (most recent call last):
        ...
        inq.quant.lower.IntegerModelError: the integer model cannot express module '1' (ReLU6); supported: packed conv2d/linear with BatchNorm and ReLU, add, ReLU, max/average pooling, flatten, slicing, zero padding
    """  # noqa: E501
    _Planner(_trace(model), float_layers=True).plan()


def _trace(model: nn.Module) -> fx.GraphModule:
    try:
        return fx.GraphModule(model, _Tracer().trace(model))
    except (torch.fx.proxy.TraceError, TypeError, NotImplementedError) as err:
        raise IntegerModelError(f"cannot trace the model with torch.fx: {err}") from err


# ---------------------------------------------------------------------------------- lowering


class Lowering:
    """Trace, calibrate, fine-tune and lower one packed model (see the module docstring).

    Raises:
        IntegerModelError: (on construction) a layer the integer model cannot express: a float
            conv/linear, BatchNorm not after a packed layer, an unsupported op; the message
            names it.
    """

    def __init__(
        self,
        model: nn.Module,
        act_bits: int = 8,
        calibration: str = "max",
        pow2: bool = True,
        input_bits: int = 8,
    ) -> None:
        act_range(act_bits, signed=True)  # validates the bits
        act_range(input_bits, signed=True)
        self.act_bits, self.calibration, self.pow2 = act_bits, calibration, pow2
        self.input_bits = input_bits
        model.eval()
        self.graph_module = _trace(model)
        self.modules = dict(self.graph_module.named_modules())
        self.steps = _Planner(self.graph_module).plan()
        self.observers = {
            s.name: Observer(calibration, s.signed, seed=i)
            for i, s in enumerate(self.steps)
            if s.point and not self._is_last(s)
        }
        self.shapes: dict[str, tuple[int, ...]] = {}  # step name -> input shape (per sample)
        self.fake_quants: dict[str, FakeQuant] = {}
        self._calibrated: dict[str, float] | None = None  # what the observers pick, once

    def _is_last(self, step: _Step) -> bool:
        return step is self.steps[-1] and step.op in ("conv", "linear")

    # -------------------------------------------------------------------------- calibrate

    def calibrate(self, batches: Iterable[Tensor]) -> None:
        """Run the float model on ``batches`` (inputs only) and observe every point.

        Raises:
            IntegerModelError: if ``batches`` is empty.
        """
        watch = {s.nodes[-1]: s.name for s in self.steps if s.name in self.observers}
        inputs = {s.nodes[0]: s.name for s in self.steps if s.op == "avgpool"}
        lowering = self

        class Recorder(fx.Interpreter):
            def run_node(self, n: fx.Node) -> Any:
                if n in inputs:  # the map size a global pool was calibrated on
                    lowering.shapes[inputs[n]] = tuple(self.env[n.args[0]].shape[1:])
                out = super().run_node(n)
                if n in watch:
                    lowering.observers[watch[n]].update(out)
                return out

        recorder = Recorder(self.graph_module)
        seen = 0
        with torch.no_grad():
            for x in batches:
                recorder.run(x)
                seen += 1
        if not seen:
            raise IntegerModelError("no calibration data: the batches were empty")
        self._calibrated = None

    # -------------------------------------------------------------------------- fine-tune

    def fake_quant_model(self) -> fx.GraphModule:
        """The model with a :class:`FakeQuant` at every point, scales from calibration.

        It shares its packed layers and BatchNorms with the lowered model, so fine-tuning it
        changes what :meth:`integer_model` folds; the scales then come from its FakeQuants.
        """
        graph = fx.Graph()
        env: dict[fx.Node, fx.Node] = {}
        last = {s.nodes[-1]: s.name for s in self.steps if s.name in self.observers}
        for node in self.graph_module.graph.nodes:
            env[node] = graph.node_copy(node, lambda n: env[n])
            if node in last:
                name = last[node]
                bits = self.bits(name)
                lo, hi = act_range(bits, self.observers[name].signed)
                fq = FakeQuant(self._calibrated_scales()[name], lo, hi, self.pow2)
                self.fake_quants[name] = fq
                env[node] = graph.call_module(f"fq_{name}", (env[node],))
        root = nn.Module()
        for key, module in self.graph_module.named_children():
            root.add_module(key, module)
        for name, fq in self.fake_quants.items():
            root.add_module(f"fq_{name}", fq)
        return fx.GraphModule(root, graph)

    def scales(self) -> dict[str, float]:
        """The scale of every point: the fine-tuned ones if :meth:`fake_quant_model` was
        built, else what calibration picked."""
        if self.fake_quants:
            return {name: fq.scale() for name, fq in self.fake_quants.items()}
        return dict(self._calibrated_scales())

    def _calibrated_scales(self) -> dict[str, float]:
        if self._calibrated is None:  # the mse search is the costly part: run it once
            self._calibrated = {
                name: obs.scale(self.bits(name), self.pow2) for name, obs in self.observers.items()
            }
        return self._calibrated

    def bits(self, point: str) -> int:
        """The bits of a point's integers: ``input_bits`` for the model input, else
        ``act_bits``."""
        return self.input_bits if point == "input" else self.act_bits

    # -------------------------------------------------------------------------- integers

    def integer_model(self, info: dict[str, Any] | None = None) -> IntegerModel:
        """The integer model (see the module docstring); ``info`` goes into its file.

        Raises:
            IntegerModelError: if a point was never calibrated, or a channel's folded bias
                cannot fit the int32 accumulator (a BatchNorm scale near zero).
        """
        try:
            scales = self.scales()
        except ValueError as err:
            raise IntegerModelError(f"calibrate the model first: {err}") from None
        bad = [name for name, scale in scales.items() if not math.isfinite(scale) or scale <= 0]
        if bad:
            raise IntegerModelError(
                f"the scales of {bad} are not finite (did fine-tuning diverge?)"
            )
        values: dict[str, IntOp] = {}
        tensors: dict[str, Tensor] = {}
        for step in self.steps:
            ins = [values[i] for i in step.inputs]
            if step.point and step.name in scales:
                signed = self.observers[step.name].signed
                lo, hi = act_range(self.bits(step.name), signed)
                out = {"scale": scales[step.name], "lo": lo, "hi": hi}
            else:
                out = dict(ins[0].attrs) if ins else {}
            op = IntOp(step.name, step.op, step.inputs, {**step.attrs})
            if step.op in ("conv", "linear"):
                tensors.update(self._weight_op(step, op, ins[0].attrs, out))
            elif step.op == "add":
                op.attrs.update(out, **_add_params(ins, out["scale"]))
            elif step.op == "avgpool":
                op.attrs.update(out, **self._avgpool_params(step, ins[0].attrs, out["scale"]))
            else:
                op.attrs.update({k: out[k] for k in ("scale", "lo", "hi")})
                if step.op == "relu":
                    op.attrs["lo"] = max(0, op.attrs["lo"])
            values[step.name] = op
        return IntegerModel(list(values.values()), tensors, info)

    def _avgpool_params(self, step: _Step, x: dict[str, Any], scale: float) -> dict[str, Any]:
        if step.attrs["kernel"] is None:
            size = self.shapes.get(step.name)
            if size is None:
                raise IntegerModelError(f"{step.name}: not calibrated")
            count, extra = size[-1] * size[-2], {"input_size": list(size[-2:])}
        else:
            count, extra = math.prod(step.attrs["kernel"]), {}
        m, s = quantize_multiplier(x["scale"] / (scale * count))
        return {"multiplier": m, "shift": s, **extra}

    def _weight_op(
        self, step: _Step, op: IntOp, x: dict[str, Any], out: dict[str, Any]
    ) -> dict[str, Tensor]:
        layer = self.modules[step.module]
        rows, k = layer.weight_shape[0], math.prod(layer.weight_shape[1:])
        codes = unpack_codes(layer.packed, layer.bits, k).cpu()
        offsets = codes.to(torch.int64) & ((1 << (layer.bits - 2)) - 1)
        used = int(offsets[codes != 0].max()) if bool((codes != 0).any()) else 0
        frac = min(used, max_frac_bits(k, unsigned=x["lo"] >= 0))
        exponents = torch.as_tensor(layer.level_sets).to("cpu", torch.int64).expand(rows)
        acc_scale = torch.ldexp(torch.full((rows,), x["scale"], dtype=torch.float64),
                                (exponents - frac).double())  # fmt: skip
        a, b = _affine(layer, self.modules.get(step.bn) if step.bn else None, rows)
        if not bool(torch.isfinite(a).all() and torch.isfinite(b).all()):
            raise IntegerModelError(f"layer {step.module!r}: its bias or BatchNorm is not finite")
        last = self._is_last(step)
        if last:  # logits: int32 at the finest channel scale
            nonzero = (a * acc_scale).abs()[a != 0]
            scale = float(nonzero.min()) if nonzero.numel() else 1.0
            out = {"scale": scale, "lo": 0 if step.relu else INT32_MIN, "hi": INT32_MAX}
        bound = accumulator_bound(codes, layer.bits, frac, max(-x["lo"], x["hi"]))
        ratio = a * acc_scale / out["scale"]
        bias = torch.zeros(rows, dtype=torch.int64)
        multipliers, shifts = [], []
        for c in range(rows):
            if a[c] == 0:
                if round(float(b[c]) / out["scale"]) != 0:
                    raise IntegerModelError(
                        f"layer {step.module!r}, channel {c}: BatchNorm scale 0 with a non-zero "
                        "shift (a constant channel) cannot be expressed"
                    )
            else:
                bias[c] = round(float(b[c] / (a[c] * acc_scale[c])))
            if int(bound[c]) + abs(int(bias[c])) > INT32_MAX:
                raise IntegerModelError(
                    f"layer {step.module!r}, channel {c}: the folded bias {int(bias[c])} does not "
                    "fit the int32 accumulator (a BatchNorm scale near zero?)"
                )
            m, s = quantize_multiplier(float(ratio[c]))
            multipliers.append(m)
            shifts.append(s)
        if last:
            peak = max(
                (int(bound[c]) + abs(int(bias[c]))) * abs(float(ratio[c])) for c in range(rows)
            )
            if peak >= INT32_MAX:
                raise IntegerModelError(f"layer {step.module!r}: the logits can overflow int32")
        op.attrs.update(out, bits=layer.bits, frac=frac, n1=n1_json(layer.level_sets))
        if step.op == "conv":
            op.attrs.update(weight_shape=list(layer.weight_shape), stride=list(layer.stride),
                            padding=list(layer.padding), dilation=list(layer.dilation),
                            groups=layer.groups)  # fmt: skip
        else:
            op.attrs.update(in_features=layer.in_features, out_features=layer.out_features)
        op.attrs.update(module=step.module, bn=step.bn, relu=step.relu)
        return {
            f"{step.name}.codes": layer.packed.detach().cpu().contiguous(),
            f"{step.name}.bias": bias.to(torch.int32),
            f"{step.name}.multiplier": torch.tensor(multipliers, dtype=torch.int32),
            f"{step.name}.shift": torch.tensor(shifts, dtype=torch.int32),
        }


def _affine(layer: nn.Module, bn: nn.Module | None, rows: int) -> tuple[Tensor, Tensor]:
    """``(a, b)`` per channel with ``bn(z + layer_bias) = a * z + b`` (float64)."""
    bias = (
        layer.bias.detach().double().cpu()
        if layer.bias is not None
        else torch.zeros(rows, dtype=torch.float64)
    )
    if bn is None:
        return torch.ones(rows, dtype=torch.float64), bias
    if bn.running_mean is None or bn.running_var is None:
        raise IntegerModelError("a BatchNorm without running statistics cannot be folded")
    mean, var = bn.running_mean.double().cpu(), bn.running_var.double().cpu()
    gamma = bn.weight.detach().double().cpu() if bn.affine else torch.ones_like(mean)
    beta = bn.bias.detach().double().cpu() if bn.affine else torch.zeros_like(mean)
    a = gamma / torch.sqrt(var + bn.eps)
    return a, beta + a * (bias - mean)


def _add_params(ins: list[IntOp], scale: float) -> dict[str, Any]:
    ratios = [op.attrs["scale"] / scale for op in ins]
    _, exponent = math.frexp(max(ratios))
    shift = min(MAX_SHIFT, max(0, MULTIPLIER_BITS - 1 - exponent))
    multipliers = [round(math.ldexp(r, shift)) for r in ratios]
    if 0 in multipliers:
        raise IntegerModelError(f"the scales of an add differ by more than 2**{MAX_SHIFT}")
    while shift > 0 and all(m % 2 == 0 for m in multipliers):
        multipliers, shift = [m // 2 for m in multipliers], shift - 1
    return {"multipliers": multipliers, "shift": shift}


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


def _pad_args(node: fx.Node) -> tuple[Any, str, Any]:
    return _arg(node, 1, "pad", None), _arg(node, 2, "mode", "constant"), _arg(node, 3, "value", 0)
