"""The inference ops ``inq::shift_linear`` and ``inq::shift_conv2d``: reference implementation.

Both take a weight as packed power-of-two codes (see :mod:`inq.packed`). The reference decodes
the codes to the input's dtype (exactly: every level is a power of two, built from its exponent
bits) and calls ``F.linear`` / ``F.conv2d``; it runs on any device and is what faster kernels
are tested against. A device kernel overrides it with
``torch.library.register_kernel("inq::shift_linear", "cuda")``. Fake implementations make both
ops traceable by ``torch.compile``. Both have a backward with respect to the input and the
bias (the weights are fixed codes), so a packed model can sit inside a training graph:
distillation, activation quantization.

``n1`` is the layer's top exponent; with per-channel level sets, ``n1_rows`` (an integer tensor
``[O]``) adds one exponent per output row: row ``r`` decodes with ``n1 + n1_rows[r]``.

Example:
    >>> from inq.codes import pack_codes
    >>> codes = torch.tensor([[8, 13], [0, 9]], dtype=torch.uint8)  # 4 bits: [[2, -1], [0, 1]]
    >>> torch.ops.inq.shift_linear(torch.tensor([[1.0, 3.0]]), pack_codes(codes, 4), 4, 1, 2, None)
    tensor([[-1.,  3.]])
    >>> packed = pack_codes(torch.full((1, 4), 8, dtype=torch.uint8), bits=4)  # all 2**-2
    >>> torch.ops.inq.shift_conv2d(torch.ones(1, 1, 3, 3), packed, 4, -2, [1, 1, 2, 2],
    ...                            None, [1, 1], [0, 0], [1, 1], 1)
    tensor([[[[1., 1.],
              [1., 1.]]]])
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor
from torch._prims_common import suggest_memory_format

from inq.codes import decode_weight

__all__ = [
    "conv2d_output_size",
    "effective_n1",
    "output_format",
    "shift_conv2d",
    "shift_conv2d_reference",
    "shift_linear",
    "shift_linear_reference",
]


def effective_n1(n1: int, n1_rows: Tensor | None) -> int | Tensor:
    """The n1 of every output row (its level set's top exponent): ``n1``, or ``n1 + n1_rows``
    (int32 ``[O]``). ``inq.nn``'s layers call it ``effective_n1`` too.

    Example:
        >>> effective_n1(-2, torch.tensor([0, -1]))
        tensor([-2, -3], dtype=torch.int32)
    """
    return n1 if n1_rows is None else (n1_rows.to(torch.int32) + n1)


def shift_linear_reference(
    x: Tensor,
    packed: Tensor,
    bits: int,
    n1: int,
    in_features: int,
    bias: Tensor | None,
    n1_rows: Tensor | None = None,
) -> Tensor:
    """Decode + ``F.linear``: the reference every ``inq::shift_linear`` kernel must match."""
    n1_of_rows = effective_n1(n1, n1_rows)
    weight = decode_weight(packed, bits, n1_of_rows, (packed.shape[0], in_features), x.dtype)
    return F.linear(x, weight, None if bias is None else bias.to(x.dtype))


def shift_conv2d_reference(
    x: Tensor,
    packed: Tensor,
    bits: int,
    n1: int,
    weight_shape: list[int],
    bias: Tensor | None,
    stride: list[int],
    padding: list[int],
    dilation: list[int],
    groups: int,
    n1_rows: Tensor | None = None,
) -> Tensor:
    """Decode + ``F.conv2d`` (the result dense in :func:`output_format`): the reference of
    ``inq::shift_conv2d``.

    On the CPU a bfloat16/float16 convolution runs in float32 and is rounded once: PyTorch's
    own (oneDNN) returns uninitialised values for some geometries (torch 2.15, a grouped,
    dilated convolution with one output column).
    """
    weight = decode_weight(packed, bits, effective_n1(n1, n1_rows), tuple(weight_shape), x.dtype)
    b = None if bias is None else bias.to(x.dtype)
    if x.device.type == "cpu" and x.dtype in (torch.bfloat16, torch.float16):
        b = None if b is None else b.float()
        y = F.conv2d(x.float(), weight.float(), b, stride, padding, dilation, groups)
        return y.to(x.dtype).contiguous(memory_format=output_format(x))
    y = F.conv2d(x, weight, b, stride, padding, dilation, groups)
    return y.contiguous(memory_format=output_format(x))


def output_format(x: Tensor) -> torch.memory_format:
    """The memory format of a convolution's or pooling's result for input ``x``, as PyTorch
    picks it (``F.conv2d``, ``F.max_pool2d``): channels_last for a channels_last batch, else
    contiguous.

    Example:
        >>> output_format(torch.empty(2, 3, 4, 5).to(memory_format=torch.channels_last))
        torch.channels_last
    """
    return suggest_memory_format(x)


def conv2d_output_size(
    height_width: tuple[int, int] | list[int],
    weight_shape: list[int],
    stride: list[int],
    padding: list[int],
    dilation: list[int],
) -> list[int]:
    """Output height and width of a 2-d convolution.

    Example:
        >>> conv2d_output_size((32, 32), [8, 3, 3, 3], [2, 2], [1, 1], [1, 1])
        [16, 16]
    """
    return [
        (height_width[i] + 2 * padding[i] - dilation[i] * (weight_shape[i + 2] - 1) - 1)
        // stride[i]
        + 1
        for i in range(2)
    ]


@torch.library.custom_op(
    "inq::shift_linear",
    mutates_args=(),
    schema="(Tensor x, Tensor packed, int bits, int n1, int in_features, Tensor? bias, "
    "Tensor? n1_rows=None) -> Tensor",
)
def shift_linear(
    x: Tensor,
    packed: Tensor,
    bits: int,
    n1: int,
    in_features: int,
    bias: Tensor | None,
    n1_rows: Tensor | None = None,
) -> Tensor:
    """``F.linear(x, W, bias)`` for the weight ``W [O, in_features]`` that ``packed`` encodes."""
    return shift_linear_reference(x, packed, bits, n1, in_features, bias, n1_rows)


@shift_linear.register_fake
def _(
    x: Tensor,
    packed: Tensor,
    bits: int,
    n1: int,
    in_features: int,
    bias: Tensor | None,
    n1_rows: Tensor | None = None,
):
    torch._check(x.shape[-1] == in_features, lambda: "shift_linear: x.shape[-1] != in_features")
    return x.new_empty((*x.shape[:-1], packed.shape[0]))


@torch.library.custom_op(
    "inq::shift_conv2d",
    mutates_args=(),
    schema="(Tensor x, Tensor packed, int bits, int n1, int[] weight_shape, Tensor? bias, "
    "int[] stride, int[] padding, int[] dilation, int groups, Tensor? n1_rows=None) -> Tensor",
)
def shift_conv2d(
    x: Tensor,
    packed: Tensor,
    bits: int,
    n1: int,
    weight_shape: list[int],
    bias: Tensor | None,
    stride: list[int],
    padding: list[int],
    dilation: list[int],
    groups: int,
    n1_rows: Tensor | None = None,
) -> Tensor:
    """``F.conv2d`` with the weight ``[O, Cin/groups, kh, kw]`` that ``packed`` encodes.

    ``x`` is ``[N, Cin, H, W]`` or unbatched ``[Cin, H, W]``; the result is dense in ``x``'s
    memory format (:func:`output_format`): channels_last in, channels_last out, as ``F.conv2d``.
    """
    return shift_conv2d_reference(
        x, packed, bits, n1, weight_shape, bias, stride, padding, dilation, groups, n1_rows
    )


@shift_conv2d.register_fake
def _(
    x: Tensor,
    packed: Tensor,
    bits: int,
    n1: int,
    weight_shape: list[int],
    bias: Tensor | None,
    stride: list[int],
    padding: list[int],
    dilation: list[int],
    groups: int,
    n1_rows: Tensor | None = None,
):
    torch._check(
        x.shape[-3] == weight_shape[1] * groups, lambda: "shift_conv2d: channels do not match"
    )
    spatial = conv2d_output_size(x.shape[-2:], weight_shape, stride, padding, dilation)
    shape = (*x.shape[:-3], weight_shape[0], *spatial)
    return torch.empty(shape, dtype=x.dtype, device=x.device, memory_format=output_format(x))


# ---------------------------------------------------------------------------------- autograd


@torch.library.custom_op("inq::decode_weight", mutates_args=())
def _decode_op(
    packed: Tensor,
    bits: int,
    n1: int,
    shape: list[int],
    dtype: torch.dtype,
    n1_rows: Tensor | None = None,
) -> Tensor:
    """The decoded weight, as an op: opaque to ``torch.compile`` (the backward needs it)."""
    return decode_weight(packed, bits, effective_n1(n1, n1_rows), tuple(shape), dtype)


@_decode_op.register_fake
def _(packed, bits, n1, shape, dtype, n1_rows=None):
    return packed.new_empty(shape, dtype=dtype)


def _linear_setup(ctx, inputs, output) -> None:
    x, packed, bits, n1, in_features, bias, *rest = inputs
    ctx.save_for_backward(packed, rest[0] if rest else None)
    ctx.meta = (bits, n1, in_features, x.dtype, None if bias is None else bias.dtype)


def _linear_backward(ctx, grad):
    packed, n1_rows = ctx.saved_tensors
    bits, n1, in_features, dtype, bias_dtype = ctx.meta
    weight = _decode_op(packed, bits, n1, [packed.shape[0], in_features], dtype, n1_rows)
    grad_x = grad.to(dtype) @ weight
    grad_bias = None
    if bias_dtype is not None and ctx.needs_input_grad[5]:
        grad_bias = grad.reshape(-1, grad.shape[-1]).sum(0).to(bias_dtype)
    return grad_x, None, None, None, None, grad_bias, None


def _conv_setup(ctx, inputs, output) -> None:
    x, packed, bits, n1, weight_shape, bias, stride, padding, dilation, groups, *rest = inputs
    ctx.save_for_backward(packed, rest[0] if rest else None)
    ctx.meta = (
        bits, n1, tuple(weight_shape), tuple(x.shape), x.dtype,
        None if bias is None else bias.dtype, stride, padding, dilation, groups,
    )  # fmt: skip


def _conv_backward(ctx, grad):
    packed, n1_rows = ctx.saved_tensors
    bits, n1, shape, x_shape, dtype, bias_dtype, stride, padding, dilation, groups = ctx.meta
    weight = _decode_op(packed, bits, n1, list(shape), dtype, n1_rows)
    batched = len(x_shape) == 4
    g = (grad if batched else grad.unsqueeze(0)).to(dtype)
    full = x_shape if batched else (1, *x_shape)
    grad_x = torch.nn.grad.conv2d_input(full, weight, g, stride, padding, dilation, groups)
    grad_bias = None
    if bias_dtype is not None and ctx.needs_input_grad[5]:
        grad_bias = g.sum((0, 2, 3)).to(bias_dtype)
    grad_x = grad_x if batched else grad_x.squeeze(0)
    return grad_x, None, None, None, None, grad_bias, None, None, None, None, None


torch.library.register_autograd("inq::shift_linear", _linear_backward, setup_context=_linear_setup)
torch.library.register_autograd("inq::shift_conv2d", _conv_backward, setup_context=_conv_setup)
