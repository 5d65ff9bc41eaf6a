"""Inference ops on packed power-of-two codes (``torch.ops.inq.*``).

Importing this package registers ``inq::shift_linear``, ``inq::shift_conv2d`` (pure-PyTorch
reference, :mod:`inq.kernels.ops`, any device), ``inq::shift_linear_int8``,
``inq::shift_conv2d_int8``, their ``_requant`` forms, ``inq::requant_add``, the two fused
(``inq::shift_conv2d_int8_requant_add``) and
``inq::quantize_input`` (integer references, :mod:`inq.kernels.int8`), ``inq::max_pool2d_int``
and ``inq::avg_pool2d_requant`` (the integer model's pooling, :mod:`inq.kernels.pool`), and the
Triton kernels of :mod:`inq.kernels.triton` as their CUDA implementations
(``torch.library.register_kernel``).
Triton compiles each kernel variant on its first call and caches it on disk. Where triton is
not installed, the references run on CUDA too.
"""

import torch

from inq.kernels.int8 import (
    shift_conv2d_int8,
    shift_conv2d_int8_requant,
    shift_conv2d_int8_requant_add,
    shift_linear_int8,
    shift_linear_int8_requant,
)
from inq.kernels.ops import (
    shift_conv2d,
    shift_conv2d_reference,
    shift_linear,
    shift_linear_reference,
)
from inq.kernels.pool import avg_pool2d_requant, max_pool2d_int

__all__ = [
    "avg_pool2d_requant",
    "max_pool2d_int",
    "shift_conv2d",
    "shift_conv2d_int8",
    "shift_conv2d_int8_requant",
    "shift_conv2d_int8_requant_add",
    "shift_linear",
    "shift_linear_int8",
    "shift_linear_int8_requant",
]

try:
    from inq.kernels import triton as _triton
except ImportError:  # no triton in this environment: the references serve every device
    _triton = None

if _triton is not None:
    _FLOATS = _triton.FLOAT_DTYPES

    @torch.library.register_kernel("inq::shift_linear", "cuda")
    def _shift_linear_cuda(x, packed, bits, n1, in_features, bias, n1_rows=None):
        if x.dtype not in _FLOATS:  # float64: the reference (cuBLAS)
            return shift_linear_reference(x, packed, bits, n1, in_features, bias, n1_rows)
        return _triton.shift_linear(x, packed, bits, n1, in_features, bias, n1_rows=n1_rows)

    @torch.library.register_kernel("inq::shift_conv2d", "cuda")
    def _shift_conv2d_cuda(x, packed, bits, n1, weight_shape, bias, stride, padding, dilation,
                           groups, n1_rows=None):  # fmt: skip
        if x.dtype not in _FLOATS:
            return shift_conv2d_reference(
                x, packed, bits, n1, weight_shape, bias, stride, padding, dilation, groups, n1_rows
            )
        args = (x, packed, bits, n1, weight_shape, bias, stride, padding, dilation, groups)
        return _triton.shift_conv2d(*args, n1_rows=n1_rows)

    torch.library.register_kernel("inq::shift_linear_int8", "cuda", _triton.shift_linear_int8)
    torch.library.register_kernel("inq::shift_conv2d_int8", "cuda", _triton.shift_conv2d_int8)
    for _name in ("shift_linear_int8_requant", "shift_conv2d_int8_requant",
                  "shift_conv2d_int8_requant_add", "requant_add", "quantize_input",
                  "max_pool2d_int", "avg_pool2d_requant"):  # fmt: skip
        torch.library.register_kernel(f"inq::{_name}", "cuda", getattr(_triton, _name))
