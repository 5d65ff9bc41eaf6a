"""inq.nn: shift modules equal their float counterparts; converted models equal masked ones."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from export_fixtures import DIGITS_DATA, MixedNet, digits_run, masked_file
from torch import nn

from inq.levels import describe_n1, select_n1
from inq.masked import load_masked
from inq.nn import ShiftConv2d, ShiftLinear, convert_model, from_packed
from inq.packed import export_packed, load_packed
from inq.pow2 import pow2_quantize


def snapped(module: nn.Module, n1: int | torch.Tensor, bits: int) -> nn.Module:
    with torch.no_grad():
        module.weight.copy_(pow2_quantize(module.weight, n1, bits))
    return module


@pytest.mark.filterwarnings("ignore:Using padding='same' with even kernel")
@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"stride": 2, "padding": 1},
        {"stride": (1, 2), "padding": (2, 0), "dilation": (2, 1)},
        {"groups": 2, "padding": 1, "bias": False},
        {"groups": 6, "out_channels": 6},  # depthwise
        {"padding": "same", "kernel_size": 4},  # asymmetric "same"
        {"padding": "valid"},
        {"padding": 1, "padding_mode": "reflect"},
        {"padding": (1, 2), "padding_mode": "circular"},
        {"padding": 2, "padding_mode": "replicate", "dilation": 2},
    ],
)
def test_shift_conv2d_equals_conv2d(kwargs: dict) -> None:
    torch.manual_seed(0)
    args = {"in_channels": 6, "out_channels": 4, "kernel_size": 3, **kwargs}
    conv = snapped(nn.Conv2d(**args), n1=-2, bits=5)
    shift = ShiftConv2d.from_float(conv, n1=-2, bits=5)
    for x in (torch.randn(2, 6, 9, 8), torch.randn(6, 7, 7)):
        assert torch.equal(shift(x), conv(x))
    assert torch.equal(shift.dequantize(), conv.weight)
    assert shift.packed.dtype == torch.uint8
    assert shift.packed.shape == (conv.out_channels, conv.weight[0].numel())  # bytes at 5 bits


@pytest.mark.parametrize("bits", [2, 4, 8])
def test_shift_linear_equals_linear(bits: int) -> None:
    torch.manual_seed(bits)
    fc = snapped(nn.Linear(13, 5), n1=-1, bits=bits)
    shift = ShiftLinear.from_float(fc, n1=-1, bits=bits)
    for x in (torch.randn(13), torch.randn(4, 13), torch.randn(2, 3, 13)):
        assert torch.equal(shift(x), fc(x))
    x64 = torch.randn(3, 13, dtype=torch.float64)  # computes in the input's dtype
    assert torch.equal(shift(x64), fc.double()(x64))


def test_from_float_refuses_off_level_weights() -> None:
    with pytest.raises(ValueError, match="not in the 5-bit level set"):
        ShiftLinear.from_float(nn.Linear(4, 4), n1=-1, bits=5)


def test_shift_modules_state_and_device_moves() -> None:
    fc = snapped(nn.Linear(7, 3), n1=0, bits=3)
    shift = ShiftLinear.from_float(fc, n1=0, bits=3)
    assert set(shift.state_dict()) == {"packed", "bias"}
    assert shift.state_dict()["packed"].shape == (3, 4)  # nibbles: ceil(7 / 2) bytes a row
    half = shift.to(torch.bfloat16)
    assert half.packed.dtype == torch.uint8 and half.bias.dtype == torch.bfloat16
    assert half(torch.randn(2, 7, dtype=torch.bfloat16)).dtype == torch.bfloat16
    assert "bits=3" in repr(shift)


@pytest.fixture
def mixed(tmp_path: Path) -> tuple[Path, nn.Module]:
    path, model = masked_file(tmp_path, bits=4)
    export_packed(path, tmp_path / "p.safetensors")
    return tmp_path / "p.safetensors", model.eval()


def test_convert_model_swaps_layers_and_keeps_outputs(mixed) -> None:
    path, model = mixed
    converted = convert_model(MixedNet().eval(), load_packed(path))
    assert isinstance(converted.conv, ShiftConv2d) and isinstance(converted.depthwise, ShiftConv2d)
    assert isinstance(converted.fc, ShiftLinear)
    assert type(converted.seq) is nn.Conv1d  # no shift op for Conv1d: exact float weights
    assert torch.equal(converted.seq.weight, model.seq.weight)
    x = torch.randn(5, 3, 7, 7)
    assert torch.equal(converted(x), model(x))


def test_convert_a_bare_layer(tmp_path: Path) -> None:
    path, fc = masked_file(tmp_path, bits=6, model=nn.Linear(9, 4))
    export_packed(path, tmp_path / "p.safetensors")
    shift = convert_model(nn.Linear(9, 4), load_packed(tmp_path / "p.safetensors"))
    x = torch.randn(2, 9)
    assert isinstance(shift, ShiftLinear) and torch.equal(shift(x), fc(x))


def test_model_metadata_mismatch_is_one_clear_error(mixed) -> None:
    path, _ = mixed
    other = nn.Sequential(nn.Conv2d(3, 5, 3), nn.Linear(7, 3))
    with pytest.raises(ValueError, match=r"does not match the model 'mixed': missing: 0\.weight"):
        convert_model(other, load_packed(path))
    wider = MixedNet()
    wider.fc = nn.Linear(7, 4)
    with pytest.raises(
        ValueError, match=r"shape \(file vs model\): fc.weight \(3, 7\) vs \(4, 7\)"
    ):
        convert_model(wider, load_packed(path))
    with pytest.raises(ValueError, match="unknown model 'mixed'"):
        from_packed(path)  # the metadata names a model the app's builder does not know


@pytest.mark.slow
def test_compiled_converted_model(mixed) -> None:
    path, model = mixed
    compiled = torch.compile(from_packed(path, MixedNet()), fullgraph=True)
    x = torch.randn(3, 3, 7, 7)
    with torch.no_grad():
        # Inductor fuses the float ops around the shift ops; sums may round differently
        torch.testing.assert_close(compiled(x), model(x), atol=1e-5, rtol=1e-5)


@pytest.mark.slow
def test_digits_end_to_end(tmp_path: Path) -> None:
    from inq.data import build_datasets

    path, model = digits_run(tmp_path)
    export_packed(path, tmp_path / "digits.inq.safetensors")
    converted = from_packed(tmp_path / "digits.inq.safetensors")  # rebuilt from the metadata
    assert sum(isinstance(m, ShiftConv2d | ShiftLinear) for m in converted.modules()) == 4
    reloaded = model.__class__(10, 1, 8).eval()  # the masked checkpoint's own float weights
    reloaded.load_state_dict(load_masked(path).state)
    x, y = build_datasets(DIGITS_DATA)[1].tensors
    with torch.no_grad():
        masked_logits, packed_logits = reloaded(x), converted(x)
        # the reference ops run the same float kernels on bit-identical weights: equal exactly
        assert torch.equal(packed_logits, masked_logits)
        assert torch.equal(masked_logits, model(x))
        eager_compiled = torch.compile(converted, fullgraph=True, backend="aot_eager")(x)
    assert torch.equal(packed_logits.argmax(1), masked_logits.argmax(1))
    torch.testing.assert_close(eager_compiled, masked_logits, atol=1e-5, rtol=1e-5)
    accuracy = (packed_logits.argmax(1) == y).float().mean().item()
    assert accuracy > 0.85, accuracy


def test_per_channel_shift_modules_equal_their_float_layers() -> None:
    torch.manual_seed(3)
    conv = nn.Conv2d(3, 5, 3, padding=1)
    fc = nn.Linear(11, 4)
    for module in (conv, fc):
        rows = select_n1(module.weight, 3, "mse", "channel")
        snapped(module, rows, 3)
        shift = (ShiftConv2d if module is conv else ShiftLinear).from_float(module, rows, 3)
        x = torch.randn(2, 3, 6, 6) if module is conv else torch.randn(2, 11)
        assert torch.equal(shift(x), module(x))
        assert torch.equal(shift.dequantize(), module.weight)
        assert shift.n1 == 0 and torch.equal(shift.n1_rows, rows)
        assert set(shift.state_dict()) == {"packed", "bias", "n1_rows"}
        assert f"n1={describe_n1(rows)}" in repr(shift)


def test_per_channel_packed_model_equals_the_masked_one(tmp_path: Path) -> None:
    path, model = masked_file(tmp_path, bits=3, n1_rule="mse", granularity="channel")
    export_packed(path, tmp_path / "p.safetensors")
    converted = convert_model(MixedNet().eval(), load_packed(tmp_path / "p.safetensors"))
    assert converted.fc.n1_rows is not None and converted.conv.n1_rows is not None
    x = torch.randn(5, 3, 7, 7)
    with torch.no_grad():
        assert torch.equal(converted(x), model.eval()(x))
        features = torch.randn(4, 7)  # the op alone: the compiled graph calls the same kernel
        compiled = torch.compile(converted.fc, fullgraph=True)
        assert torch.equal(compiled(features), converted.fc(features))


@pytest.mark.parametrize(
    "backend", [None, "aot_eager", pytest.param("inductor", marks=pytest.mark.slow)]
)
def test_a_packed_model_trains_its_float_parts(mixed, backend: str | None) -> None:
    """Issue 12: with grad enabled the shift modules failed ("no autograd formula"), eagerly and
    under torch.compile. Gradients flow through them to the input and to the float parameters
    (BatchNorm, the Conv1d's bias) and match the masked model's. (The shift modules hold their
    biases as buffers, and the masked model's quantized weights get no gradient; the ops' bias
    gradient is checked in test_kernels_ops.py.) The missing formula was AOTAutograd's to find:
    ``aot_eager`` finds it without inductor's C++ build of a forward and a backward (15 s on a
    cold cache), which the slow case adds."""
    path, model = mixed
    converted = convert_model(MixedNet(), load_packed(path)).train()
    model.train()
    net = torch.compile(converted, backend=backend) if backend else converted
    x = torch.randn(4, 3, 7, 7, requires_grad=True)
    net(x).square().sum().backward()
    grad_x = x.grad.clone()
    x.grad = None
    model(x).square().sum().backward()
    # the same math in another order (the shift ops' kernels, not the float layers'): a float32
    # sum of n < 200 terms is off by at most n * 2**-24 < 1.2e-5 relative; 1e-4 covers two sums
    torch.testing.assert_close(grad_x, x.grad, rtol=1e-4, atol=1e-5)
    for name in ("bn.weight", "bn.bias", "seq.bias"):
        mine = converted.get_parameter(name).grad
        torch.testing.assert_close(mine, model.get_parameter(name).grad, rtol=1e-4, atol=1e-5)
