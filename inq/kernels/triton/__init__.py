"""Triton kernels of the ``inq::`` ops (registered as their CUDA implementations).

The launchers take the ops' arguments and run on CUDA tensors, or on CPU tensors under the
Triton interpreter (``TRITON_INTERPRET=1`` set before triton is imported), which is how CI
tests them without a GPU.
"""

from inq.kernels.triton.conv import shift_conv2d
from inq.kernels.triton.decode import FLOAT_DTYPES, decode_weight
from inq.kernels.triton.int8 import (
    quantize_input,
    requant_add,
    shift_conv2d_int8,
    shift_conv2d_int8_requant,
    shift_conv2d_int8_requant_add,
    shift_linear_int8,
    shift_linear_int8_requant,
)
from inq.kernels.triton.linear import shift_linear
from inq.kernels.triton.pool import avg_pool2d_requant, max_pool2d_int

__all__ = [
    "FLOAT_DTYPES",
    "avg_pool2d_requant",
    "decode_weight",
    "max_pool2d_int",
    "quantize_input",
    "requant_add",
    "shift_conv2d",
    "shift_conv2d_int8",
    "shift_conv2d_int8_requant",
    "shift_conv2d_int8_requant_add",
    "shift_linear",
    "shift_linear_int8",
    "shift_linear_int8_requant",
]
