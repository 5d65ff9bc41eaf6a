"""Test session set-up: without a GPU, the Triton kernels run under the Triton interpreter;
Hypothesis profiles; the fast tests run before the slow ones.

``TRITON_INTERPRET`` is read when a ``@triton.jit`` function is defined, so it is set here,
before any test imports :mod:`inq.kernels`. With a GPU the kernels compile and run on it.
"""

import os
import sys

import pytest
import torch
from hypothesis import HealthCheck, settings

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# pytest-xdist's workers share the cores: torch's default of one thread per core in each worker
# would run workers x cores threads on them, each op waiting for threads descheduled by another.
if workers := int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0")):
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // workers))

# OpenVINO imports absl.logging, whose handler keeps the sys.stderr of its import and closes that
# stream when logging is reconfigured (Hydra does, in-process) while sys.stderr is another one.
# Under pytest that stream is pytest's own capture file: closing it breaks every later test of
# the process ("I/O operation on closed file"). Bound to the process's stderr, it is never closed.
try:
    from absl import logging as absl_logging
except ImportError:  # no openvino extra
    pass
else:
    absl_logging.get_absl_handler().python_handler.stream = sys.__stderr__

# "dev" (the default) draws new examples every run; "ci" (HYPOTHESIS_PROFILE=ci, as .ci/run sets
# it) draws the same ones every run, so a verdict of CI reproduces. No deadline in either: an
# example's time depends on the machine's load, not on the code under test.
settings.register_profile("dev", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("ci", settings.get_profile("dev"), derandomize=True, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Run the tests marked ``slow`` after all the others (in their order), so that a failure
    of the fast suite shows within minutes."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is not None)
