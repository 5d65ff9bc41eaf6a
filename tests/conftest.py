"""Test session set-up: without a GPU, the Triton kernels run under the Triton interpreter.

``TRITON_INTERPRET`` is read when a ``@triton.jit`` function is defined, so it is set here,
before any test imports :mod:`inq.kernels`. With a GPU the kernels compile and run on it.
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
