"""inq.kernels.ops: the reference ops against F.linear / F.conv2d on the decoded weights."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

import inq.kernels  # noqa: F401  (registers torch.ops.inq.*)
from inq.codes import pack_codes, unpack_codes
from inq.pow2 import pow2_decode

FLOATS = [torch.float32, torch.float64, torch.bfloat16]


def random_weight(shape: tuple[int, ...], bits: int, n1: int, seed: int):
    """(packed codes, decoded weight) of random valid codes; decoded with pow2_decode."""
    g = torch.Generator().manual_seed(seed)
    codes = torch.randint(1 << (bits - 1), 1 << bits, shape, generator=g)
    codes = torch.where(torch.rand(shape, generator=g) < 0.25, 0, codes).to(torch.uint8)
    return pack_codes(codes, bits), pow2_decode(codes, n1, bits)


def test_schemas_are_the_contract() -> None:
    assert str(torch.ops.inq.shift_linear.default._schema) == (
        "inq::shift_linear(Tensor x, Tensor packed, int bits, int n1, int in_features, "
        "Tensor? bias, Tensor? n1_rows=None) -> Tensor"
    )
    assert str(torch.ops.inq.shift_conv2d.default._schema) == (
        "inq::shift_conv2d(Tensor x, Tensor packed, int bits, int n1, int[] weight_shape, "
        "Tensor? bias, int[] stride, int[] padding, int[] dilation, int groups, "
        "Tensor? n1_rows=None) -> Tensor"
    )


@settings(max_examples=40)
@given(
    bits=st.integers(2, 8),
    n1=st.integers(-6, 2),
    out_features=st.integers(1, 17),
    in_features=st.integers(1, 33),
    lead=st.lists(st.integers(1, 4), max_size=2),
    use_bias=st.booleans(),
    dtype=st.sampled_from(FLOATS),
    seed=st.integers(0, 2**16),
)
def test_shift_linear_is_f_linear_on_decoded_weights(
    bits, n1, out_features, in_features, lead, use_bias, dtype, seed
) -> None:
    packed, weight = random_weight((out_features, in_features), bits, n1, seed)
    g = torch.Generator().manual_seed(seed + 1)
    x = torch.randn(*lead, in_features, generator=g).to(dtype)
    bias = torch.randn(out_features, generator=g) if use_bias else None
    out = torch.ops.inq.shift_linear(x, packed, bits, n1, in_features, bias)
    expected = F.linear(x, weight.to(dtype), None if bias is None else bias.to(dtype))
    # the same F.linear call on the same (exactly decoded) weight: equal bit for bit
    assert out.dtype == dtype and out.shape == (*lead, out_features)
    torch.testing.assert_close(out, expected, atol=0, rtol=0)


@settings(max_examples=40)
@given(
    bits=st.integers(2, 8),
    cin_per_group=st.integers(1, 3),
    out_per_group=st.integers(1, 3),
    groups=st.integers(1, 3),
    kernel=st.tuples(st.integers(1, 3), st.integers(1, 3)),
    stride=st.tuples(st.integers(1, 3), st.integers(1, 2)),
    padding=st.tuples(st.integers(0, 2), st.integers(0, 2)),
    dilation=st.tuples(st.integers(1, 2), st.integers(1, 2)),
    batch=st.sampled_from([None, 1, 3]),
    use_bias=st.booleans(),
    dtype=st.sampled_from(FLOATS),
    seed=st.integers(0, 2**16),
)
def test_shift_conv2d_is_f_conv2d_on_decoded_weights(
    bits,
    cin_per_group,
    out_per_group,
    groups,
    kernel,
    stride,
    padding,
    dilation,
    batch,
    use_bias,
    dtype,
    seed,
) -> None:
    shape = (out_per_group * groups, cin_per_group, *kernel)
    packed, weight = random_weight(shape, bits, -2, seed)
    g = torch.Generator().manual_seed(seed + 1)
    size = [max(k * d, 5) for k, d in zip(kernel, dilation, strict=True)]
    x = torch.randn(*([batch] if batch else []), cin_per_group * groups, *size, generator=g)
    x = x.to(dtype)
    bias = torch.randn(shape[0], generator=g) if use_bias else None
    args = (list(stride), list(padding), list(dilation), groups)
    out = torch.ops.inq.shift_conv2d(x, packed, bits, -2, list(shape), bias, *args)
    b = None if bias is None else bias.to(dtype)
    if dtype == torch.bfloat16:  # on the CPU: float32, rounded once (see shift_conv2d_reference)
        x, b = x.float(), None if b is None else b.float()
    expected = F.conv2d(x, weight.to(dtype).to(x.dtype), b, *args).to(dtype)
    torch.testing.assert_close(out, expected, atol=0, rtol=0)


def test_depthwise_conv() -> None:
    packed, weight = random_weight((8, 1, 3, 3), 4, -1, 0)
    x = torch.randn(2, 8, 9, 9)
    out = torch.ops.inq.shift_conv2d(
        x, packed, 4, -1, [8, 1, 3, 3], None, [2, 2], [1, 1], [1, 1], 8
    )
    torch.testing.assert_close(out, F.conv2d(x, weight, None, 2, 1, 1, 8), atol=0, rtol=0)


@pytest.mark.parametrize("bits", [3, 6])
def test_opcheck(bits: int) -> None:
    # schema, fake (meta) implementation, dispatch under AOT autograd, dynamic shapes
    packed, _ = random_weight((6, 9), bits, 0, 1)
    for x, bias in ((torch.randn(4, 9), torch.randn(6)), (torch.randn(2, 3, 9), None)):
        torch.library.opcheck(torch.ops.inq.shift_linear.default, (x, packed, bits, 0, 9, bias))
    packed, _ = random_weight((6, 2, 3, 3), bits, 0, 2)
    conv = ([6, 2, 3, 3], torch.randn(6), [2, 1], [1, 0], [1, 2], 2)
    for x in (torch.randn(2, 4, 7, 8), torch.randn(4, 7, 8)):
        torch.library.opcheck(torch.ops.inq.shift_conv2d.default, (x, packed, bits, 0, *conv))


def test_ops_compile_without_graph_breaks() -> None:
    lin_packed, lin_w = random_weight((5, 12), 5, -1, 3)
    conv_packed, conv_w = random_weight((3, 2, 3, 3), 3, 0, 4)

    def net(x: torch.Tensor) -> torch.Tensor:
        y = torch.ops.inq.shift_conv2d(
            x, conv_packed, 3, 0, [3, 2, 3, 3], None, [1, 1], [1, 1], [1, 1], 1
        )
        y = torch.relu(y).flatten(1)[:, :12]
        return torch.ops.inq.shift_linear(y, lin_packed, 5, -1, 12, None)

    compiled = torch.compile(net, fullgraph=True, backend="aot_eager")
    x = torch.randn(2, 2, 4, 4)
    expected = F.linear(torch.relu(F.conv2d(x, conv_w, padding=1)).flatten(1)[:, :12], lin_w)
    torch.testing.assert_close(compiled(x), expected, atol=0, rtol=0)


@settings(max_examples=30)
@given(
    bits=st.integers(2, 8),
    n1=st.integers(-3, 2),
    rows=st.lists(st.integers(-4, 0), min_size=1, max_size=9),
    in_features=st.integers(1, 20),
    seed=st.integers(0, 2**16),
)
def test_n1_rows_give_each_output_row_its_own_level_set(bits, n1, rows, in_features, seed) -> None:
    """Row r decodes with n1 + n1_rows[r]: the op equals F.linear / F.conv2d on that weight."""
    n1_rows = torch.tensor(rows, dtype=torch.int32)
    packed, _ = random_weight((len(rows), in_features), bits, 0, seed)
    codes = unpack_codes(packed, bits, in_features)
    weight = pow2_decode(codes, n1 + n1_rows, bits)
    for r in range(len(rows)):  # the per-row decode is the per-layer decode of each row
        assert torch.equal(weight[r], pow2_decode(codes[r], n1 + rows[r], bits))
    x = torch.randn(3, in_features, generator=torch.Generator().manual_seed(seed))
    out = torch.ops.inq.shift_linear(x, packed, bits, n1, in_features, None, n1_rows)
    torch.testing.assert_close(out, F.linear(x, weight), atol=0, rtol=0)
    image = x[:, None, None, :].expand(3, in_features, 2, in_features).contiguous()
    shape = [len(rows), in_features, 1, 1]
    conv_packed = pack_codes(codes.reshape(shape), bits)
    out = torch.ops.inq.shift_conv2d(
        image, conv_packed, bits, n1, shape, None, [1, 1], [0, 0], [1, 1], 1, n1_rows
    )
    expected = F.conv2d(image, weight.reshape(shape))
    torch.testing.assert_close(out, expected, atol=0, rtol=0)


def test_backward_to_input_and_bias_is_gradcheck_exact() -> None:
    """Issue 12: the ops had no autograd formula, so a packed model could not sit in a training
    graph. float64 gradcheck of the input and bias gradients, per-row n1 included."""
    g = torch.Generator().manual_seed(0)
    packed, _ = random_weight((5, 7), 4, -1, seed=3)
    x = torch.randn(2, 3, 7, dtype=torch.float64, generator=g, requires_grad=True)
    bias = torch.randn(5, dtype=torch.float64, generator=g, requires_grad=True)
    rows = torch.tensor([0, -1, -2, 0, -3], dtype=torch.int32)
    assert torch.autograd.gradcheck(
        lambda x, b: torch.ops.inq.shift_linear(x, packed, 4, -1, 7, b, rows), (x, bias)
    )
    conv_packed, _ = random_weight((4, 2, 3, 3), 5, 0, seed=4)
    for image in (torch.randn(2, 4, 6, 5, dtype=torch.float64), torch.randn(4, 5, 5).double()):
        image.requires_grad_(True)
        assert torch.autograd.gradcheck(
            lambda x, b: torch.ops.inq.shift_conv2d(
                x, conv_packed, 5, 0, [4, 2, 3, 3], b[:4], [2, 1], [1, 0], [1, 2], 2
            ),
            (image, bias),
        )


def test_bfloat16_conv_on_the_cpu_is_one_rounding_of_the_exact_result() -> None:
    """PyTorch's CPU bfloat16 conv2d returns uninitialised values for this grouped, dilated
    geometry (torch 2.15); the op computes in float32 and rounds once. Bound: one bfloat16
    rounding (2**-8 relative) plus float32 accumulation (24 products, 2**-24 * 24 * sum|x w|)."""
    shape, bits, seed = (4, 2, 2, 3), 8, 3643
    packed, weight = random_weight(shape, bits, -2, seed)
    x = torch.randn(1, 4, 5, 6, generator=torch.Generator().manual_seed(seed + 1))
    x = x.to(torch.bfloat16)
    args = ([1, 2], [1, 0], [1, 2], 2)
    out = torch.ops.inq.shift_conv2d(x, packed, bits, -2, list(shape), None, *args)
    exact = F.conv2d(x.double(), weight.double(), None, *args)
    magnitude = F.conv2d(x.double().abs(), weight.double().abs(), None, *args)
    bound = 2**-8 * exact.abs() + 2**-24 * 24 * magnitude
    assert ((out.double() - exact).abs() <= bound).all()
