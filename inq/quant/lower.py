"""From a packed (float-activation) INQ model to an integer model.

:class:`Lowering` plans the model's integer ops with :mod:`inq.quant.trace` (``torch.fx``: a
packed layer with the BatchNorm and activation that follow it, an add with its activation,
pooling, ops exact on integers). Each value an op creates is a *quantization point*: the model
input, every conv/linear block, add and average pool. :meth:`Lowering.calibrate` runs the float
model on batches and observes each point (:mod:`inq.quant.observers`);
:meth:`Lowering.fake_quant_model` gives the model with :class:`inq.quant.fakequant.FakeQuant` at
each point for fine-tuning; and :meth:`Lowering.integer_model` computes the integers of
:mod:`inq.quant.integer`:

- a block's accumulator carries ``frac`` fractional bits, the largest offset its codes use (then
  every shift is exact), capped so the int32 sum cannot overflow;
- BatchNorm ``y = a * z + b`` (``a = gamma / sqrt(var + eps)``) folds into the requantization:
  the bias ``round(b / (a * s_acc))`` in accumulator units (int32) and the multiplier
  ``a * s_acc / s_out`` per channel, as 31-bit integer times ``2**-shift``
  (:func:`quantize_multiplier`); where that ratio is a power of two (no BatchNorm, power-of-two
  scales) it is a pure shift;
- the last block keeps int32 outputs (logits), scaled by the smallest channel scale;
- an activation (ReLU, ReLU6, Hardtanh) is a clamp to real bounds: it cuts the value's integer
  range ``lo..hi`` to the bounds' integers (:func:`clamp_range`), in the op that folds it or in
  a ``relu``/``clamp`` op of its own. Calibration observes the clamped values, so the scale fits
  them.

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
from collections.abc import Iterable
from typing import Any

import torch
from torch import Tensor, fx, nn

from inq.codes import unpack_codes
from inq.fileio import n1_json
from inq.kernels.int8 import max_frac_bits
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
from inq.quant.trace import IntegerModelError, Step, check_expressible, plan, trace_model

# IntegerModelError and check_expressible live in inq.quant.trace; importers use them from here too
__all__ = [
    "IntegerModelError",
    "Lowering",
    "check_expressible",
    "clamp_range",
    "quantize_multiplier",
    "signed_powers",
]

MULTIPLIER_BITS = 31
SAMPLE_IMAGES = 256  # calibration images kept to measure what symmetric activations cost


def quantize_multiplier(
    value: float, bits: int = MULTIPLIER_BITS, terms: int | None = None
) -> tuple[int, int]:
    """``(m, s)`` with ``m * 2**-s`` closest to ``value``, ``|m| < 2**bits``, ``0 <= s <= 62``,
    normalised: ``m`` odd unless ``s == 0`` (so a power of two ``2**-k`` gives ``(1, k)``).

    With ``terms``, ``m * 2**-s`` is instead a sum of at most ``terms`` signed powers of two
    (:func:`signed_powers`): a constant multiplication of that many shifts and ``terms - 1``
    adders in hardware, ``terms=1`` a pure shift.

    Example:
        >>> quantize_multiplier(0.25), quantize_multiplier(3.0), quantize_multiplier(0.0)
        ((1, 2), (3, 0), (0, 0))
        >>> m, s = quantize_multiplier(0.1)
        >>> m, s, abs(m / 2**s - 0.1) < 2**-34
        (858993459, 33, True)
        >>> quantize_multiplier(0.1, terms=1), quantize_multiplier(0.1, terms=2)  # 1/8, 1/8 - 1/32
        ((1, 3), (3, 5))

    Raises:
        IntegerModelError: if ``|value|`` needs ``2**bits`` or more.
    """
    if value == 0.0:
        return 0, 0
    if terms is not None:
        value = sum(signed_powers(value, terms, bits))
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


def signed_powers(value: float, terms: int, bits: int = MULTIPLIER_BITS) -> list[float]:
    """At most ``terms`` signed powers of two summing close to ``value``, most significant
    first: each the power nearest (in absolute error) to what the earlier ones leave, none
    more than ``bits - 1`` octaves below the first (so the sum is a ``bits``-bit multiplier).
    Greedy: for ``terms=1`` the nearest power of two.

    Example:
        >>> signed_powers(0.1, 1), signed_powers(0.1, 2), signed_powers(0.75, 3)
        ([0.125], [0.125, -0.03125], [0.5, 0.25])
    """
    parts: list[float] = []
    rest = value
    for _ in range(terms):
        if rest == 0.0:
            break
        low = 2.0 ** math.floor(math.log2(abs(rest)))
        power = math.copysign(low if abs(rest) - low <= 2 * low - abs(rest) else 2 * low, rest)
        if parts and abs(power) < abs(parts[0]) * 2.0 ** (1 - bits):
            break
        parts.append(power)
        rest -= power
    return parts


def clamp_range(
    scale: float, lo: int, hi: int, bounds: tuple[float, float] | None
) -> tuple[int, int]:
    """The integer range ``lo..hi`` (at ``scale``) of a value clamped to the real ``bounds``.

    Quantizing, ``q(v) = clamp(floor(v / scale + 1/2), lo, hi)`` (round half up, as the model
    input), is monotone, so quantizing a clamped value equals clamping the quantized value:
    ``q(clamp(v, low, high)) = clamp(q(v), q(low), q(high))``. The integer op clamps to
    ``q(low)..q(high)`` and computes exactly what the float model's clamp gives.

    Example:
        >>> clamp_range(2**-5, 0, 255, (0.0, 6.0))  # ReLU6: 6 / 2**-5 = 192
        (0, 192)
        >>> clamp_range(2**-6, -128, 127, (-1.0, 1.0)), clamp_range(0.5, -128, 127, (0, math.inf))
        ((-64, 64), (0, 127))
    """
    if bounds is None:
        return lo, hi

    def q(v: float) -> int:
        return math.floor(min(max(v / scale + 0.5, lo), hi))

    return q(bounds[0]), q(bounds[1])


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
        symmetric: bool = False,
        requant_terms: int | None = None,
    ) -> None:
        act_range(act_bits, signed=True)  # validates the bits
        act_range(input_bits, signed=True)
        self.act_bits, self.calibration, self.pow2 = act_bits, calibration, pow2
        self.input_bits, self.symmetric = input_bits, symmetric
        self.requant_terms = requant_terms
        model.eval()
        self.graph_module = trace_model(model)
        self.modules = dict(self.graph_module.named_modules())
        self.steps = plan(self.graph_module)
        self.observers = {
            s.name: Observer(calibration, s.signed, seed=i)
            for i, s in enumerate(self.steps)
            if s.point and not self._is_last(s)
        }
        self.shapes: dict[str, tuple[int, ...]] = {}  # step name -> input shape (per sample)
        self.fake_quants: dict[str, FakeQuant] = {}
        self.sample: Tensor | None = None  # the first calibration images (symmetric_agreement)
        # what the observers pick, once per form (symmetric or not): the mse search is costly
        self._calibrated: dict[bool, dict[str, float]] = {}

    def _is_last(self, step: Step) -> bool:
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
        seen, kept = 0, []
        with torch.no_grad():
            for x in batches:
                if sum(map(len, kept)) < SAMPLE_IMAGES:
                    kept.append(x[: SAMPLE_IMAGES - sum(map(len, kept))])
                recorder.run(x)
                seen += 1
        if not seen:
            raise IntegerModelError("no calibration data: the batches were empty")
        self.sample = torch.cat(kept)
        self._calibrated = {}

    def signed(self, point: str) -> bool:
        """Whether a point's integers are signed: all are for symmetric activations (int8
        with zero point 0, TensorRT's form), else those that can be negative."""
        return self.symmetric or self.observers[point].signed

    def symmetric_agreement(self) -> tuple[float, float | None]:
        """How often the calibrated integer model's top-1 class equals the float model's on
        the first :data:`SAMPLE_IMAGES` calibration images, with symmetric activations and
        with unsigned ones where values cannot be negative: ``(symmetric, unsigned)``;
        ``unsigned`` is None where that model cannot be made (a folded bias beyond int32 at
        the finer unsigned scales).

        Raises:
            IntegerModelError: if the model was not calibrated, or its symmetric integer model
                cannot be made.
        """
        if self.sample is None:
            raise IntegerModelError("calibrate the model first")
        with torch.no_grad():
            reference = self.graph_module(self.sample).argmax(-1)
        chosen, agreement = self.symmetric, []
        try:
            for symmetric in (True, False):
                self.symmetric = symmetric
                try:
                    model = self.integer_model().to(self.sample.device)
                except IntegerModelError:
                    if symmetric:
                        raise
                    return agreement[0], None
                with torch.no_grad():
                    top1 = model(self.sample).argmax(-1)
                agreement.append(float((top1 == reference).float().mean()))
        finally:
            self.symmetric = chosen
        return agreement[0], agreement[1]

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
            if node in last:  # a folded clamp needs no narrower range: the graph clamps first
                name = last[node]
                bits = self.bits(name)
                lo, hi = act_range(bits, self.signed(name))
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
        if self.symmetric not in self._calibrated:
            self._calibrated[self.symmetric] = {
                name: obs.scale(self.bits(name), self.pow2, self.signed(name))
                for name, obs in self.observers.items()
            }
        return self._calibrated[self.symmetric]

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
                lo, hi = act_range(self.bits(step.name), self.signed(step.name))
                out = {"scale": scales[step.name], "lo": lo, "hi": hi}
            else:  # an op on one value, or the last conv/linear (its range: _weight_op)
                out = dict(ins[0].attrs)
            out["lo"], out["hi"] = clamp_range(out["scale"], out["lo"], out["hi"], step.clamp)
            op = IntOp(step.name, step.op, step.inputs, {**step.attrs})
            if step.op in ("conv", "linear"):
                tensors.update(self._weight_op(step, op, ins[0].attrs, out))
            elif step.op == "add":
                op.attrs.update(out, **_add_params(ins, out["scale"]))
            elif step.op == "avgpool":
                op.attrs.update(out, **self._avgpool_params(step, ins[0].attrs, out["scale"]))
            else:
                op.attrs.update({k: out[k] for k in ("scale", "lo", "hi")})
            values[step.name] = op
        return IntegerModel(list(values.values()), tensors, info)

    def _avgpool_params(self, step: Step, x: dict[str, Any], scale: float) -> dict[str, Any]:
        if step.attrs["kernel"] is None:
            size = self.shapes.get(step.name)
            if size is None:
                raise IntegerModelError(f"{step.name}: not calibrated")
            count, extra = size[-1] * size[-2], {"input_size": list(size[-2:])}
        else:
            count, extra = math.prod(step.attrs["kernel"]), {}
        m, s = quantize_multiplier(x["scale"] / (scale * count), terms=self.requant_terms)
        return {"multiplier": m, "shift": s, **extra}

    def _weight_op(
        self, step: Step, op: IntOp, x: dict[str, Any], out: dict[str, Any]
    ) -> dict[str, Tensor]:
        layer = self.modules[step.module]
        rows, k = layer.weight_shape[0], math.prod(layer.weight_shape[1:])
        codes = unpack_codes(layer.packed, layer.bits, k).cpu()
        offsets = codes.to(torch.int64) & ((1 << (layer.bits - 2)) - 1)
        used = int(offsets[codes != 0].max()) if bool((codes != 0).any()) else 0
        frac = min(used, max_frac_bits(k, unsigned=x["lo"] >= 0))
        exponents = torch.as_tensor(layer.effective_n1).to("cpu", torch.int64).expand(rows)
        acc_scale = torch.ldexp(torch.full((rows,), x["scale"], dtype=torch.float64),
                                (exponents - frac).double())  # fmt: skip
        a, b = _affine(layer, self.modules.get(step.bn) if step.bn else None, rows)
        if not bool(torch.isfinite(a).all() and torch.isfinite(b).all()):
            raise IntegerModelError(f"layer {step.module!r}: its bias or BatchNorm is not finite")
        last = self._is_last(step)
        if last:  # logits: int32 at the finest channel scale
            nonzero = (a * acc_scale).abs()[a != 0]
            scale = float(nonzero.min()) if nonzero.numel() else 1.0
            lo, hi = clamp_range(scale, INT32_MIN, INT32_MAX, step.clamp)
            out = {"scale": scale, "lo": lo, "hi": hi}
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
            m, s = quantize_multiplier(float(ratio[c]), terms=self.requant_terms)
            multipliers.append(m)
            shifts.append(s)
        if last:
            peak = max(
                (int(bound[c]) + abs(int(bias[c]))) * abs(float(ratio[c])) for c in range(rows)
            )
            if peak >= INT32_MAX:
                raise IntegerModelError(f"layer {step.module!r}: the logits can overflow int32")
        op.attrs.update(out, bits=layer.bits, frac=frac, n1=n1_json(layer.effective_n1))
        if step.op == "conv":
            op.attrs.update(weight_shape=list(layer.weight_shape), stride=list(layer.stride),
                            padding=list(layer.padding), dilation=list(layer.dilation),
                            groups=layer.groups)  # fmt: skip
        else:
            op.attrs.update(in_features=layer.in_features, out_features=layer.out_features)
        clamp = None if step.clamp is None or step.relu else list(step.clamp)  # ReLU6, Hardtanh
        op.attrs.update(module=step.module, bn=step.bn, relu=step.relu, clamp=clamp)
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
