"""CUDA implementations of ``inq::shift_linear``, ``shift_conv2d`` and ``shift_linear_int8``.

Imported by :mod:`inq.kernels` when a GPU is present. The kernels (``inq/kernels/csrc``) are
compiled on the first CUDA call (:func:`inq.kernels.build.load_extension`, cached on disk); if
that fails the reason is shown once as a warning and the PyTorch reference runs instead.

Which kernel runs:

- linear, batch ``<= SMALL_BATCH_MAX`` rows: fused decode + GEMV / skinny GEMM that reads only
  the packed codes (tensor-core MMA for nibble codes with fp16/bf16, CUDA-core FMA otherwise).
- linear, larger batches: the weight is decoded once into a temporary in the activation dtype
  (from the caching allocator) and multiplied by cuBLAS; compute-bound batches amortise that.
- conv2d: depthwise filters run a direct kernel on the codes. Ungrouped convolutions with nibble
  codes, fp16/bf16 and at most ``IMPLICIT_CONV_MAX_PIXELS`` output pixels (N*OH*OW: small
  batches and late layers, where reading the weight dominates) run the tensor-core kernel as an
  implicit GEMM on the codes. The others decode their weight once (a temporary, like above) and
  call cuDNN.

Results match the reference up to fp32 summation order; the decoded-weight paths round each
weight to the activation dtype exactly as the reference does (fp16 flushes levels below 2**-24).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from inq.kernels import int8 as _int8  # defines inq::shift_linear_int8
from inq.kernels.build import load_extension
from inq.kernels.ops import conv2d_output_size, shift_conv2d_reference, shift_linear_reference

__all__ = ["IMPLICIT_CONV_MAX_PIXELS", "SMALL_BATCH_MAX"]

# Crossovers to the decoded-weight paths (cuBLAS / cuDNN). First guesses: tune them per GPU with
# ``inq bench kernel``.
SMALL_BATCH_MAX = 32  # rows of x up to which the fused small-batch kernels run
IMPLICIT_CONV_MAX_PIXELS = 4096  # output pixels up to which the implicit-GEMM conv runs
_FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


@torch.library.register_kernel("inq::shift_linear", "cuda")
def _shift_linear(
    x: Tensor, packed: Tensor, bits: int, n1: int, in_features: int, bias: Tensor | None
) -> Tensor:
    ext = load_extension() if x.dtype in _FLOAT_DTYPES else None
    b = None if bias is None else bias.to(x.dtype).contiguous()
    if ext is None:
        return shift_linear_reference(x, packed, bits, n1, in_features, bias)
    packed = packed.contiguous()
    rows = x.reshape(-1, in_features)
    if rows.shape[0] > SMALL_BATCH_MAX:
        weight = ext.decode_weight(packed, bits, n1, in_features, x.dtype)
        return F.linear(x, weight, b)
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    y = ext.shift_linear_small_batch(rows, packed, bits, n1, in_features, b)
    return y.reshape(*x.shape[:-1], packed.shape[0])


@torch.library.register_kernel("inq::shift_conv2d", "cuda")
def _shift_conv2d(
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
) -> Tensor:
    ext = load_extension() if x.dtype in _FLOAT_DTYPES else None
    b = None if bias is None else bias.to(x.dtype).contiguous()
    out_channels, group_channels, kh, kw = weight_shape
    if ext is None:
        return shift_conv2d_reference(
            x, packed, bits, n1, weight_shape, bias, stride, padding, dilation, groups
        )
    packed = packed.contiguous()
    batched = x.unsqueeze(0) if x.dim() == 3 else x
    if group_channels == 1 and groups == batched.shape[1]:
        y = ext.depthwise_conv2d(
            batched, packed, bits, n1, weight_shape, b, stride, padding, dilation
        )
    elif _implicit_gemm_fits(batched, bits, weight_shape, stride, padding, dilation, groups):
        y = ext.nibble_conv2d(batched, packed, bits, n1, weight_shape, b, stride, padding, dilation)
    else:
        weight = ext.decode_weight(packed, bits, n1, group_channels * kh * kw, x.dtype)
        weight = weight.view(out_channels, group_channels, kh, kw)
        y = F.conv2d(batched, weight, b, stride, padding, dilation, groups).contiguous()
    return y.squeeze(0) if x.dim() == 3 else y


def _implicit_gemm_fits(
    x: Tensor,
    bits: int,
    weight_shape: list[int],
    stride: list[int],
    padding: list[int],
    dilation: list[int],
    groups: int,
) -> bool:
    """Whether the tensor-core implicit-GEMM kernel serves this (batched) convolution."""
    if groups != 1 or bits > 4 or x.dtype == torch.float32:
        return False
    if torch.cuda.get_device_capability(x.device)[0] < 8:
        return False
    size = conv2d_output_size(x.shape[2:], weight_shape, stride, padding, dilation)
    return x.shape[0] * math.prod(size) <= IMPLICIT_CONV_MAX_PIXELS


@torch.library.register_kernel("inq::shift_linear_int8", "cuda")
def _shift_linear_int8(
    x: Tensor, packed: Tensor, bits: int, in_features: int, frac_bits: int
) -> Tensor:
    _int8.check_int8_args(x, bits, in_features, frac_bits)
    ext = load_extension()
    if ext is None:
        return _int8.shift_linear_int8_reference(x, packed, bits, in_features, frac_bits)
    rows = x.reshape(-1, in_features)
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    y = ext.shift_linear_int8(rows, packed.contiguous(), bits, in_features, frac_bits)
    return y.reshape(*x.shape[:-1], packed.shape[0])
