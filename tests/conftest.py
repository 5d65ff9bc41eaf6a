"""Test session set-up: without a GPU, the Triton kernels run under the Triton interpreter;
Hypothesis profiles; the fast tests run before the slow ones.

``TRITON_INTERPRET`` is read when a ``@triton.jit`` function is defined, so it is set here,
before any test imports :mod:`inq.kernels`. With a GPU the kernels compile and run on it.
"""

import os

import pytest
import torch
from hypothesis import HealthCheck, settings

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

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
