"""Inference ops on packed power-of-two codes (``torch.ops.inq.*``).

Importing this package registers ``inq::shift_linear``, ``inq::shift_conv2d`` (pure-PyTorch
reference, :mod:`inq.kernels.ops`, any device) and ``inq::shift_linear_int8`` (integer
reference, :mod:`inq.kernels.int8`). With a GPU, :mod:`inq.kernels.cuda` is imported too and
registers the CUDA implementations of the same ops (``torch.library.register_kernel``).
"""

import torch

from inq.kernels.int8 import shift_linear_int8
from inq.kernels.ops import shift_conv2d, shift_linear

__all__ = ["shift_conv2d", "shift_linear", "shift_linear_int8"]

if torch.cuda.is_available():
    import inq.kernels.cuda  # noqa: F401  (registers the CUDA kernels)
