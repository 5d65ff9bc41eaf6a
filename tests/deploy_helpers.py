"""Test helpers of the deployment tests: models built once per test process and shared between
tests and modules, and quick worker processes for ``inq bench onnx``.

A shared model is built by the same function with the same arguments as before; each call gets
its own deep copy (and its own copy of a file, in the caller's folder), so no test sees another's
changes, and torch's global random state is left as the build leaves it. Under pytest-xdist each
worker process builds its own.
"""

from __future__ import annotations

import atexit
import copy
import hashlib
import multiprocessing
import shutil
import tempfile
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from export_fixtures import DIGITS_DATA, digits_run, mobilenet_integer_model, quantize_on
from export_fixtures import residual_integer_model as _residual_integer_model
from torch import nn

from inq.quant.integer import IntegerModel

_BUILT: dict[tuple[Any, ...], tuple[Any, torch.Tensor]] = {}
_FOLDER: Path | None = None


def _once(key: tuple[Any, ...], build: Callable[[], Any]) -> Any:
    """``build()`` the first time ``key`` is asked for; every time a deep copy of what it made,
    with torch's global random state as right after the build (the builders seed it first, or
    run right after one that does, so that state is the same whatever it was before)."""
    if key not in _BUILT:
        _BUILT[key] = (build(), torch.get_rng_state())
    value, state = _BUILT[key]
    torch.set_rng_state(state)
    return copy.deepcopy(value)


def _folder() -> Path:
    """A folder of this process for the shared files, removed when the process ends."""
    global _FOLDER
    if _FOLDER is None:
        _FOLDER = Path(tempfile.mkdtemp(prefix="inq-tests-shared-"))
        atexit.register(shutil.rmtree, _FOLDER, ignore_errors=True)
    return _FOLDER


def shared_digits_run(folder: Path, bits: int = 5, epochs: int = 4) -> tuple[Path, nn.Module]:
    """:func:`export_fixtures.digits_run` (no scheduler options), trained once per process: its
    masked checkpoint copied into ``folder`` (the same name), and the trained model."""

    def build() -> tuple[Path, nn.Module]:
        where = _folder() / f"digits-{bits}-{epochs}"
        where.mkdir()
        return digits_run(where, bits=bits, epochs=epochs)

    masked, model = _once(("digits_run", bits, epochs), build)
    target = folder / masked.name
    shutil.copyfile(masked, target)
    return target, model


def shared_integer(masked: Path) -> IntegerModel:
    """The integer model (8-bit activations, :func:`export_fixtures.quantize_on` on the digits
    data) of the digits masked checkpoint ``masked``, built once per process for each content of
    the file."""
    from inq.masked import load_masked
    from inq.packed import packed_from_masked
    from inq.quant.pipeline import QuantSettings

    def build() -> IntegerModel:
        packed = packed_from_masked(load_masked(masked))
        return quantize_on(packed, DIGITS_DATA, QuantSettings(act_bits=8))[0]

    return _once(("integer", hashlib.sha256(masked.read_bytes()).hexdigest()), build)


def shared_digits_integer(folder: Path, bits: int) -> tuple[Path, IntegerModel]:
    """A digits run at ``bits`` (:func:`shared_digits_run`, 2 epochs) in ``folder`` and its
    integer model (:func:`shared_integer`)."""
    masked, _ = shared_digits_run(folder, bits=bits, epochs=2)
    return masked, shared_integer(masked)


def shared_mobilenet_integer_model(
    seed: int = 0, bits: int = 5, symmetric: bool = False
) -> tuple[nn.Module, IntegerModel]:
    """:func:`export_fixtures.mobilenet_integer_model`, built once per process."""
    key = ("mobilenet_integer_model", seed, bits, symmetric)
    return _once(key, lambda: mobilenet_integer_model(seed, bits, symmetric))


def shared_residual_integer_model(
    seed: int = 0, symmetric: bool = False, **levels: str
) -> IntegerModel:
    """:func:`export_fixtures.residual_integer_model`, built once per process."""
    key = ("residual_integer_model", seed, symmetric, *sorted(levels.items()))
    return _once(key, lambda: _residual_integer_model(seed, symmetric, **levels))


_FORKSERVER: Any = None


def forkserver_workers(monkeypatch: pytest.MonkeyPatch) -> None:
    """Start ``inq bench onnx``'s worker processes (:class:`inq.deploy.bench.RuntimeWorkers`)
    from a fork server that has imported :mod:`inq.deploy.bench` once, not each as a fresh
    interpreter (spawn) that imports torch again (~2 s apiece): still one process per runtime
    that loads only its own sessions, running the same worker code. For the tests whose
    property is the output, not how the processes start; the isolation tests keep spawn."""
    global _FORKSERVER
    import inq.deploy.bench as bench

    if _FORKSERVER is None:
        _FORKSERVER = multiprocessing.get_context("forkserver")
        _FORKSERVER.set_forkserver_preload(["inq.deploy.bench"])
    context = _FORKSERVER
    monkeypatch.setattr(
        bench, "multiprocessing", types.SimpleNamespace(get_context=lambda _: context)
    )
