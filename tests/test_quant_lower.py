"""Lowering a packed model to integers (inq.quant.lower): folding, bounds, calibration; what the
plan refuses is in test_quant_trace.py."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from export_fixtures import packed_model
from hypothesis import given
from hypothesis import strategies as st
from torch import nn

from inq.models import ResNetCIFAR
from inq.quant.integer import IntegerModel, program_problems
from inq.quant.lower import IntegerModelError, Lowering, quantize_multiplier, signed_powers


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _randomize_bn(model: nn.Module, seed: int = 0) -> None:
    gen = _gen(seed)
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            c = m.num_features
            m.running_mean.copy_(torch.randn(c, generator=gen) * 0.3)
            m.running_var.copy_(torch.rand(c, generator=gen) + 0.5)
            m.weight.data.copy_(torch.randn(c, generator=gen))  # negative scales too
            m.bias.data.copy_(torch.randn(c, generator=gen) * 0.2)


def _assert_close_to_float(model: nn.Module, int_model: IntegerModel, x: torch.Tensor) -> None:
    """8-bit activations: the logits' mean error under 0.1 of their spread, and at least 90 %
    of the argmaxes the float model's."""
    with torch.no_grad():
        reference = model(x).double()
        logits = int_model(x).double() * int_model.output_scale()
    relative = (logits - reference).abs().mean() / reference.std()
    assert relative < 0.1, relative
    assert float((logits.argmax(1) == reference.argmax(1)).double().mean()) >= 0.9


def _conv_block(bits: int = 5) -> nn.Module:
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 6, 3, padding=1, bias=False), nn.BatchNorm2d(6), nn.ReLU(),
        nn.Conv2d(6, 4, 1),
    )  # fmt: skip
    _randomize_bn(model)
    return packed_model(model, bits)


@given(st.floats(min_value=-1e6, max_value=1e6).filter(lambda v: v == 0 or abs(v) > 1e-9))
def test_quantize_multiplier_is_a_31_bit_fraction(value: float) -> None:
    m, s = quantize_multiplier(value)
    assert abs(m) < 2**31 and 0 <= s <= 62
    assert s == 0 or m % 2 == 1  # normalised
    assert abs(m * 2.0**-s - value) <= abs(value) * 2**-30


def _nonzero_digits(m: int) -> int:
    """Non-zero digits of ``m`` in canonical signed-digit form (no two adjacent)."""
    count = 0
    while m:
        if m % 2:
            m -= 2 - (m % 4)  # digit +1 where m = 1 mod 4, -1 where m = 3 mod 4
            count += 1
        m //= 2
    return count


@given(
    st.floats(min_value=-1e6, max_value=1e6).filter(lambda v: abs(v) > 1e-9),
    st.integers(min_value=1, max_value=6),
)
def test_requant_terms_make_a_multiplier_of_that_many_signed_powers(value: float, terms: int):
    m, s = quantize_multiplier(value, terms=terms)
    assert m * 2.0**-s == sum(signed_powers(value, terms))  # exactly the greedy sum
    assert _nonzero_digits(abs(m)) <= terms and (s == 0 or m % 2 == 1)
    assert math.copysign(1, m) == math.copysign(1, value)
    # each greedy term at least halves what is left: the error shrinks with every term
    assert abs(m * 2.0**-s - value) <= abs(value) * 2.0**-terms
    if terms == 1:  # the nearest power of two
        lower = 2.0 ** math.floor(math.log2(abs(value)))
        assert abs(abs(m * 2.0**-s) - abs(value)) == min(abs(value) - lower, 2 * lower - abs(value))


@pytest.mark.parametrize("terms", [1, 2])
def test_requant_terms_leave_no_multiplier_of_more_terms_in_the_model(terms: int) -> None:
    """``Lowering(requant_terms=K)``: every conv channel's multiplier has at most K non-zero
    signed digits (K=1: a pure shift), and the model still computes what the float one does
    within the bound the multipliers' own error allows (each within ``2**-K`` of its value)."""
    model = _conv_block()
    x = torch.randn(8, 3, 7, 7, generator=_gen(1))
    lowering = Lowering(model, act_bits=8, requant_terms=terms)
    lowering.calibrate([x])
    int_model = lowering.integer_model()
    t = int_model.tensors()
    for op in int_model.ops:
        if op.op == "conv":
            assert all(_nonzero_digits(abs(int(m))) <= terms for m in t[f"{op.name}.multiplier"])
    exact = Lowering(model, act_bits=8)
    exact.calibrate([x])
    reference = exact.integer_model()
    assert [op.attrs["scale"] for op in int_model.ops] == [
        op.attrs["scale"] for op in reference.ops
    ]  # the same scales: only the multipliers differ
    got, want = int_model(x).double(), reference(x).double()
    assert float(((got - want).abs() <= want.abs() * 2.0**-terms + 2).double().mean()) > 0.9


@pytest.mark.parametrize("k", range(-20, 20, 3))
def test_powers_of_two_are_pure_shifts(k: int) -> None:
    assert quantize_multiplier(2.0**k) == ((1, -k) if k <= 0 else (2**k, 0))


def test_conv_bn_relu_stays_within_its_derived_bound() -> None:
    """Integer block vs float math on the same quantized input. With exact accumulator ``z``,
    folded bias ``beta = round(b / (a s_acc))`` and ``M = a s_acc / s_out ~ m 2**-r``, the
    integer result ``floor(((z + beta) m + 2**(r-1)) / 2**r)`` differs from the real
    ``t = (a s_acc z + b) / s_out`` by at most ``1/2`` (final rounding) ``+ |M|/2`` (bias
    rounding) ``+ |z + beta| 2**-(r+1)`` (multiplier rounding); clamping cannot add to it."""
    model = _conv_block()
    x = torch.randn(8, 3, 7, 7, generator=_gen(1))
    lowering = Lowering(model, act_bits=8)
    lowering.calibrate([x])
    int_model = lowering.integer_model()
    values = int_model.run(x)
    op = int_model.ops[1]
    assert (op.op, op.attrs["bn"], op.attrs["relu"]) == ("conv", "1", True)
    s_in, s_out = int_model.ops[0].attrs["scale"], op.attrs["scale"]
    t = int_model.tensors()
    bias, _, r = (t[f"_0.{k}"].double()[:, None, None] for k in ("bias", "multiplier", "shift"))
    conv, bn = model[0], model[1]
    w = conv.dequantize(torch.float64)
    acc_scale = s_in * 2.0 ** (conv.effective_n1 - op.attrs["frac"])
    z = F.conv2d(values["input"].double() * s_in, w, padding=1) / acc_scale  # exact integers
    assert torch.equal(z, z.round())
    a = (bn.weight / torch.sqrt(bn.running_var + bn.eps)).double()[:, None, None]
    b = (bn.bias.double() - bn.running_mean.double() * a[:, 0, 0])[:, None, None]
    real = (a * acc_scale * z + b) / s_out
    bound = 0.5 + (a * acc_scale / s_out).abs() / 2 + (z + bias).abs() * 2.0 ** -(r + 1)
    got = values["_0"].double()
    assert got.dtype == torch.float64 and values["_0"].dtype == torch.uint8
    assert bool(((got - real.clamp(0, 255)).abs() <= bound + 1e-9).all())
    assert float((got == torch.floor(real + 0.5).clamp(0, 255)).double().mean()) > 0.99


def test_last_linear_without_bias_is_exact() -> None:
    torch.manual_seed(0)
    fc = nn.Linear(12, 5, bias=False)
    model = packed_model(nn.Sequential(fc), bits=4)
    x = torch.randn(6, 12, generator=_gen(2))
    lowering = Lowering(model, act_bits=8)
    lowering.calibrate([x])
    int_model = lowering.integer_model()
    values = int_model.run(x)
    logits = values["_0"].double() * int_model.output_scale()
    q_in = values["input"].double() * int_model.ops[0].attrs["scale"]
    assert values["_0"].dtype == torch.int32
    assert torch.equal(logits, q_in @ model[0].dequantize(torch.float64).T)
    assert int(int_model.tensors()["_0.multiplier"].abs().max()) == 1  # pure shifts


def test_batchnorm_folding_identities() -> None:
    model = _conv_block()
    bn = model[1]
    with torch.no_grad():  # scales a = gamma / sqrt(var + eps) that are powers of two
        bn.eps = 0.0
        bn.running_var.fill_(1.0)
        bn.weight.copy_(torch.tensor([0.5, -2.0, 1.0, 4.0, -0.25, 1.0]))
    x = torch.randn(4, 3, 7, 7, generator=_gen(3))
    lowering = Lowering(model, act_bits=8)
    lowering.calibrate([x])
    int_model = lowering.integer_model()
    t = int_model.tensors()
    op = int_model.ops[1]
    s_in, s_out = int_model.ops[0].attrs["scale"], op.attrs["scale"]
    acc_scale = s_in * 2.0 ** (model[0].effective_n1 - op.attrs["frac"])
    a = bn.weight.double() / torch.sqrt(bn.running_var.double() + bn.eps)
    b = bn.bias.double() - bn.running_mean.double() * a
    m, r = t["_0.multiplier"].double(), t["_0.shift"].double()
    # the scale: a power of two times powers of two -> a shift (and the sign) only
    assert torch.equal(m.abs(), torch.ones(6, dtype=torch.float64))
    assert torch.equal(m * 2**-r, a * acc_scale / s_out)
    # the shift: an int32 bias in accumulator units, off by at most half a unit
    assert bool(
        ((t["_0.bias"].double() * a * acc_scale - b).abs() <= a.abs() * acc_scale / 2).all()
    )
    assert t["_0.bias"].dtype == torch.int32


def test_resnet_residuals_lower_and_track_the_float_model() -> None:
    torch.manual_seed(0)
    float_model = ResNetCIFAR(depth=8, num_classes=4, in_channels=3, width=4)
    _randomize_bn(float_model)
    model = packed_model(float_model, bits=5)
    x = torch.randn(64, 3, 8, 8, generator=_gen(4))
    lowering = Lowering(model, act_bits=8, calibration="mse")
    lowering.calibrate(x.split(16))
    int_model = lowering.integer_model()
    kinds = [op.op for op in int_model.ops]
    for kind in ("conv", "add", "slice", "pad", "avgpool", "flatten", "linear"):
        assert kind in kinds, kind
    _assert_close_to_float(model, int_model, x)


def test_symmetric_activations_are_signed_everywhere_at_twice_the_scale() -> None:
    """ReLU outputs use 0..127 at 2x (or 4x, where max/255 is within 0.4 % below a power of
    two) the unsigned scale; the input and every other point are int8; the file is sound."""
    model = _conv_block()
    x = torch.randn(8, 3, 7, 7, generator=_gen(2)).abs()  # a non-negative input: signed anyway
    points = {}
    for symmetric in (False, True):
        lowering = Lowering(model, act_bits=8, symmetric=symmetric)
        lowering.calibrate([x])
        int_model = lowering.integer_model({"act_bits": 8, "symmetric": symmetric})
        assert program_problems(int_model) == []
        points[symmetric] = {op.name: op.attrs for op in int_model.ops[:-1]}
    for name, unsigned in points[False].items():
        symmetric = points[True][name]
        assert symmetric["lo"] >= -128 and symmetric["hi"] <= 127, name
        if unsigned["lo"] == 0 and name != "input":
            assert symmetric["lo"] == 0 and symmetric["scale"] / unsigned["scale"] in (2, 4)
    assert points[False]["input"]["lo"] == 0 and points[True]["input"]["lo"] == -128


def test_a_symmetric_file_with_an_unsigned_range_is_refused() -> None:
    lowering = Lowering(_conv_block(), act_bits=8)
    lowering.calibrate([torch.randn(8, 3, 7, 7, generator=_gen(2))])
    int_model = lowering.integer_model({"act_bits": 8, "symmetric": True})
    relu = next(op for op in int_model.ops if op.attrs["lo"] == 0 and op.attrs["hi"] == 255)
    assert program_problems(int_model)[0] == (
        relu.name, "range 0..255 is not within act_bits=8's (symmetric) (-128..127)"
    )  # fmt: skip


def test_symmetric_agreement_compares_both_forms_on_the_first_calibration_images() -> None:
    """At 2 activation bits a ReLU output keeps 0..1 symmetric against 0..3 unsigned: the
    symmetric model agrees less with the float one; the refusal names the settings."""
    from inq.quant.pipeline import QuantSettings, calibrate

    torch.manual_seed(0)
    model = packed_model(ResNetCIFAR(depth=8, num_classes=10, in_channels=3, width=8), bits=5)
    x = torch.randn(300, 3, 8, 8, generator=_gen(3))
    lowering = Lowering(model, act_bits=2, symmetric=True)
    settings = QuantSettings(act_bits=2, symmetric=True)
    with pytest.raises(IntegerModelError) as err:
        calibrate(lowering, x.split(150), settings)
    symmetric, unsigned = lowering.symmetric_agreement()
    assert lowering.sample is not None and len(lowering.sample) == 256  # from both batches
    assert unsigned is not None and unsigned - symmetric > settings.symmetric_tolerance
    assert f"on {100 * symmetric:.1f} % of 256 calibration images against" in str(err.value)
    assert "more than quant.symmetric_tolerance=0.01 (--symmetric-tolerance)" in str(err.value)
    assert lowering.symmetric and lowering.integer_model().ops[1].attrs["hi"] <= 1


def test_construction_refuses_what_the_plan_refuses() -> None:
    """The planning refusals themselves are tested in test_quant_trace.py."""
    with pytest.raises(IntegerModelError, match=r"cannot express module '1' \(Sigmoid\)"):
        Lowering(nn.Sequential(nn.Flatten(), nn.Sigmoid()))


def test_no_calibration_data_is_one_message() -> None:
    lowering = Lowering(_conv_block())
    with pytest.raises(IntegerModelError, match="calibrate the model first"):
        lowering.integer_model()
    with pytest.raises(IntegerModelError, match="no calibration data"):
        lowering.calibrate([])


def test_a_constant_channel_cannot_be_folded() -> None:
    model = _conv_block()
    with torch.no_grad():
        model[1].weight[2] = 0.0
        model[1].bias[2] = 1.0
    lowering = Lowering(model)
    lowering.calibrate([torch.randn(2, 3, 7, 7, generator=_gen(5))])
    with pytest.raises(IntegerModelError, match="layer '0', channel 2: BatchNorm scale 0"):
        lowering.integer_model()


def test_fake_quant_model_matches_the_integer_model_closely() -> None:
    model = _conv_block()
    x = torch.randn(8, 3, 7, 7, generator=_gen(6))
    lowering = Lowering(model, act_bits=8)
    lowering.calibrate([x])
    fq_model = lowering.fake_quant_model()
    assert sorted(lowering.fake_quants) == ["_0", "input"]
    assert lowering.scales() == {name: fq.scale() for name, fq in lowering.fake_quants.items()}
    int_model = lowering.integer_model()
    with torch.no_grad():
        simulated = fq_model(x).double()
    logits = int_model(x).double() * int_model.output_scale()
    # the same grid; the integer model's bias and multipliers are rounded (see the bound test)
    assert math.isclose(float((logits - simulated).abs().max()), 0.0, abs_tol=0.05)


class _SharedModules(nn.Module):
    """One pooling module and one ReLU module called on two paths."""

    def __init__(self) -> None:
        super().__init__()
        self.c1, self.c2 = nn.Conv2d(2, 4, 3, padding=1), nn.Conv2d(2, 4, 1)
        self.relu, self.pool = nn.ReLU(), nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(4, 3, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, b = self.relu(self.c1(x)), self.relu(self.c2(x))
        return self.fc(torch.flatten(self.pool(a) + self.pool(b), 1))


def test_a_module_called_twice_gives_two_ops() -> None:
    torch.manual_seed(0)
    model = packed_model(_SharedModules(), bits=5)
    x = torch.randn(32, 2, 6, 6, generator=_gen(7))
    lowering = Lowering(model, act_bits=8)
    lowering.calibrate([x])
    int_model = lowering.integer_model()
    names = [op.name for op in int_model.ops]
    assert len(names) == len(set(names))
    assert [op.op for op in int_model.ops].count("avgpool") == 2
    with torch.no_grad():
        reference = model(x).double()
    logits = int_model(x).double() * int_model.output_scale()
    assert (logits - reference).abs().max() < 0.05 * reference.abs().max()


def test_per_channel_level_sets_lower_exactly() -> None:
    torch.manual_seed(0)
    model = packed_model(nn.Sequential(nn.Linear(10, 6, bias=False)), 4, granularity="channel")
    assert model[0].n1_rows is not None
    x = torch.randn(5, 10, generator=_gen(8))
    lowering = Lowering(model, act_bits=8)
    lowering.calibrate([x])
    int_model = lowering.integer_model()
    values = int_model.run(x)
    q_in = values["input"].double() * int_model.ops[0].attrs["scale"]
    logits = values["_0"].double() * int_model.output_scale()
    assert torch.equal(logits, q_in @ model[0].dequantize(torch.float64).T)


# ------------------------------------------------------------------ ReLU6 / Hardtanh: clamps


def test_relu6_after_conv_bn_folds_and_clamps_exactly() -> None:
    """ReLU6 folds into the conv's requantization, which clamps to ``0..round(6 / s)``. With
    power-of-two BatchNorm scales and no BatchNorm shift the requantization is exact, so the
    integers are the float math's ``clamp(floor(y / s + 1/2), 0, round(6 / s))``: quantizing
    the clamped value."""
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 6, 3, padding=1, bias=False), nn.BatchNorm2d(6), nn.ReLU6(),
        nn.Conv2d(6, 4, 1),
    )  # fmt: skip
    bn = model[1]
    with torch.no_grad():  # a = gamma (powers of two, some negative), b = 0
        bn.eps = 0.0
        bn.weight.copy_(torch.tensor([0.5, -2.0, 1.0, 4.0, -0.25, 1.0]))
    model = packed_model(model)
    x = 4 * torch.randn(8, 3, 7, 7, generator=_gen(9))
    lowering = Lowering(model, act_bits=8)
    lowering.calibrate([x])
    int_model = lowering.integer_model()
    assert [op.op for op in int_model.ops] == ["input", "conv", "conv"]  # no op of its own
    op = int_model.ops[1]
    s_in, s_out = int_model.ops[0].attrs["scale"], op.attrs["scale"]
    assert s_out == 2**-5  # calibration saw the clamped values: 6 / 255 needs 2**-5
    assert (op.attrs["relu"], op.attrs["clamp"], op.attrs["lo"], op.attrs["hi"]) == (
        False, [0.0, 6.0], 0, 192,
    )  # fmt: skip
    values = int_model.run(x)
    conv = model[0]
    acc_scale = s_in * 2.0 ** (conv.effective_n1 - op.attrs["frac"])
    z = F.conv2d(values["input"].double() * s_in, conv.dequantize(torch.float64), padding=1)
    real = bn.weight.double()[:, None, None] * z / s_out  # exact: powers of two
    assert torch.equal(z / acc_scale, (z / acc_scale).round())
    assert values["_0"].dtype == torch.uint8
    assert torch.equal(values["_0"].double(), torch.floor(real + 0.5).clamp(0, 192))
    assert int(values["_0"].max()) == 192 and bool((real > 192).any())  # it does clamp


def test_a_standalone_hardtanh_is_an_exact_clamp_op() -> None:
    """Hardtanh(-1, 1) after max pooling: its own ``clamp`` op at its input's scale, range
    ``round(-1 / s)..round(1 / s)``."""
    torch.manual_seed(0)
    model = packed_model(
        nn.Sequential(nn.Conv2d(2, 4, 3), nn.MaxPool2d(2), nn.Hardtanh(-1.0, 1.0), nn.Flatten(),
                      nn.Linear(4, 3))
    )  # fmt: skip
    x = 2 * torch.randn(16, 2, 4, 4, generator=_gen(10))
    lowering = Lowering(model, act_bits=8)
    lowering.calibrate([x])
    int_model = lowering.integer_model({"act_bits": 8})
    assert program_problems(int_model) == []
    kinds = [op.op for op in int_model.ops]
    assert kinds == ["input", "conv", "maxpool", "clamp", "flatten", "linear"]
    pool, clamp = int_model.ops[2], int_model.ops[3]
    s = clamp.attrs["scale"]
    assert s == pool.attrs["scale"] and set(clamp.attrs) == {"scale", "lo", "hi"}
    lo, hi = clamp.attrs["lo"], clamp.attrs["hi"]
    assert (lo, hi) == (math.floor(-1 / s + 0.5), math.floor(1 / s + 0.5))
    values = int_model.run(x)
    pooled = values[pool.name]
    assert bool(((pooled < lo) | (pooled > hi)).any())  # it does clamp
    assert values[clamp.name].dtype == torch.int8
    assert torch.equal(values[clamp.name], pooled.clamp(lo, hi))


def test_a_last_linear_with_relu6_keeps_int32_logits_cut_at_6() -> None:
    torch.manual_seed(0)
    model = packed_model(nn.Sequential(nn.Linear(12, 5, bias=False), nn.ReLU6()), bits=4)
    x = 16 * torch.randn(6, 12, generator=_gen(2))
    lowering = Lowering(model, act_bits=8)
    lowering.calibrate([x])
    int_model = lowering.integer_model()
    values = int_model.run(x)
    s = int_model.output_scale()
    assert (int_model.ops[-1].attrs["lo"], int_model.ops[-1].attrs["hi"]) == (0, 6 / s)
    logits = values["_0"].double() * s
    q_in = values["input"].double() * int_model.ops[0].attrs["scale"]
    reference = q_in @ model[0].dequantize(torch.float64).T
    assert torch.equal(logits, reference.clamp(0, 6)) and bool((reference > 6).any())


def test_torchvision_mobilenet_v2_lowers_and_tracks_the_float_model() -> None:
    """Conv-BN-ReLU6 (ranges cut at 6), depthwise convs, residual adds without activation,
    Dropout + Linear: a sound program close to the float model."""
    torchvision = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    float_model = torchvision.models.mobilenet_v2(num_classes=10, width_mult=0.25)
    _randomize_bn(float_model)
    model = packed_model(float_model, bits=5)
    x = 4 * torch.randn(32, 3, 32, 32, generator=_gen(11))
    lowering = Lowering(model, act_bits=8)
    lowering.calibrate(x.split(16))
    int_model = lowering.integer_model({"act_bits": 8, "input_bits": 8})
    assert program_problems(int_model) == []
    convs = [op for op in int_model.ops if op.op == "conv"]
    assert any(op.attrs["groups"] == op.attrs["weight_shape"][0] > 1 for op in convs)
    assert any(op.attrs["clamp"] == [0.0, 6.0] and op.attrs["hi"] < 255 for op in convs)
    _assert_close_to_float(model, int_model, x)


# ------------------------------------------------------------------ per-layer bits


def _mixed_bits_model(model: nn.Module, bits: int, layer_bits: dict[str, int]) -> nn.Module:
    """``model`` quantized (no training) with per-layer bits, as packed shift modules."""
    from inq.masked import MaskedCheckpoint
    from inq.nn import convert_model
    from inq.packed import packed_from_masked
    from inq.scheduler import INQScheduler

    sched = INQScheduler(model, bits=bits, portions=(1.0,), layer_bits=layer_bits)
    sched.step()
    keys = {layer.name: f"{layer.name}.weight" for layer in sched.layers}
    ckpt = MaskedCheckpoint(
        {k: v.detach().clone() for k, v in model.state_dict().items()},
        {keys[layer.name]: layer.mask.clone() for layer in sched.layers},
        {keys[layer.name]: layer.n1 for layer in sched.layers},
        bits,
        sched.portions,
        sched.stage,
        sched.strategy,
        layer_bits={keys[name]: b for name, b in sched.layer_bits.items()},
    )
    return convert_model(model, packed_from_masked(ckpt)).eval()


def test_each_layer_lowers_at_its_own_bits_and_stays_exact() -> None:
    torch.manual_seed(0)
    model = _mixed_bits_model(
        nn.Sequential(nn.Linear(12, 8), nn.ReLU(), nn.Linear(8, 5, bias=False)), 3, {"2": 8}
    )
    assert (model[0].bits, model[2].bits) == (3, 8)  # inq.nn modules carry their own bits
    x = torch.randn(6, 12, generator=_gen(3))
    lowering = Lowering(model, act_bits=8)
    lowering.calibrate([x])
    int_model = lowering.integer_model({"act_bits": 8, "input_bits": 8, "weight_bits": [3, 8]})
    assert program_problems(int_model) == []
    _, first, last = int_model.ops
    assert [(op.op, op.attrs["bits"]) for op in (first, last)] == [("linear", 3), ("linear", 8)]
    values = int_model.run(x)
    logits = values[last.name].double() * int_model.output_scale()
    q_mid = values[first.name].double() * first.attrs["scale"]
    assert torch.equal(logits, q_mid @ model[2].dequantize(torch.float64).T)  # 8-bit: exact
    wrong = [op.name for op in int_model.ops if op.attrs.get("bits") == 8]
    int_model.info["weight_bits"] = [3]
    assert [where for where, _ in program_problems(int_model)] == wrong
