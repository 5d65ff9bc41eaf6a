"""Inference ops on packed power-of-two codes (``torch.ops.inq.*``).

Importing this package registers ``inq::shift_linear`` and ``inq::shift_conv2d`` with their
pure-PyTorch reference (:mod:`inq.kernels.ops`, any device). CUDA hook: when a GPU is present and
:mod:`inq.kernels.cuda` exists, it is imported too and registers the CUDA implementations of the
same ops (``torch.library.register_kernel(..., "cuda")``).
"""

import importlib
import importlib.util

import torch

from inq.kernels.ops import shift_conv2d, shift_linear

__all__ = ["shift_conv2d", "shift_linear"]

if torch.cuda.is_available() and importlib.util.find_spec("inq.kernels.cuda") is not None:
    importlib.import_module("inq.kernels.cuda")
