"""Test session set-up: without a GPU, the Triton kernels run under the Triton interpreter;
Hypothesis profiles; the fast tests run before the slow ones.

``TRITON_INTERPRET`` is read when a ``@triton.jit`` function is defined, so it is set here,
before any test imports :mod:`inq.kernels`. With a GPU the kernels compile and run on it.
"""

import dataclasses
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


def _device_calls_without_repatching() -> None:
    """The Triton interpreter patches ``triton.language`` for a launch, and again (never
    restored, so never needed) at every call of a ``@triton.jit`` helper inside it: a scan of
    the whole module each time, a fifth of the kernels' interpreted time. Here a helper's call
    inside a launch whose modules are patched already (by the launch, or by an earlier helper
    of it: ``triton.language.standard``'s ``cdiv``, ``zeros``, ... see ``triton.language.core``,
    which the kernels' own modules do not) does nothing; launches patch and restore as before.
    Where Triton's interpreter lacks these internals, it is left as it is."""
    try:
        import triton.language as tl
        from triton.runtime import interpreter
    except ImportError:
        return
    patch, launch = getattr(interpreter, "_patch_lang", None), interpreter.GridExecutor.__call__
    if patch is None or not hasattr(interpreter, "_LangPatchScope"):
        return
    patched: list[set[int]] = []  # the modules patched since the launch in progress began
    starting = False  # a launch has begun and not yet patched

    def modules(fn) -> frozenset[int]:
        return frozenset(id(v) for v in fn.__globals__.values() if v is tl or v is tl.core)

    def patch_lang(fn):
        nonlocal starting
        helper = bool(patched) and not starting
        if helper and modules(fn) <= patched[-1]:
            return interpreter._LangPatchScope()  # the launch's patch is in place
        scope = patch(fn)
        if helper:  # never restored: in place to the launch's end
            patched[-1] |= modules(fn)
        if starting:  # the launch's own patch: in place until its restore
            starting = False
            patched.append(set(modules(fn)))
            restore = scope.restore

            def restore_and_end() -> None:
                patched.pop()
                restore()

            scope.restore = restore_and_end
        return scope

    def run_launch(self, *args, **kwargs):
        nonlocal starting
        starting = True
        try:
            return launch(self, *args, **kwargs)
        finally:
            starting = False

    interpreter._patch_lang = patch_lang
    interpreter.GridExecutor.__call__ = run_launch


def _no_overflow_checks_that_cannot_fail() -> None:
    """Triton's interpreter widens every integer add, sub and mul to int64 to check it for
    overflow (``sanitize_overflow``) and hands the check to ``device_assert``, which does
    nothing unless ``debug`` is on: an int32 product that wraps passes either way. Where debug is
    off (the default, as on the GPU, which compiles no overflow check either), the check is
    dropped: two fifths of the kernels' interpreted time, and no test can tell it ran."""
    try:
        from triton.runtime import interpreter
    except ImportError:
        return
    builder = getattr(interpreter, "interpreter_builder", None)
    options = getattr(builder, "options", None)
    if options is not None and not options.debug and getattr(options, "sanitize_overflow", False):
        builder.options = dataclasses.replace(options, sanitize_overflow=False)


if os.environ.get("TRITON_INTERPRET") == "1":
    _device_calls_without_repatching()
    _no_overflow_checks_that_cannot_fail()

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


def pytest_configure(config: pytest.Config) -> None:
    """With ``-n`` and no ``--dist`` of the caller's: xdist's ``worksteal``, so that a worker
    that runs out of tests takes queued ones from the other (the tests' lengths range from
    milliseconds to seconds: an even split at the start ends unevenly). Set here, not in
    pytest's options, so that ``-p no:xdist`` still works."""
    given = any(arg.startswith(("--dist", "-d")) for arg in config.invocation_params.args)
    if getattr(config.option, "dist", "no") == "load" and not given:
        config.option.dist = "worksteal"
