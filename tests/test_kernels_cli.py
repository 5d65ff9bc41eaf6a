"""CPU behaviour of the kernel tooling: clear errors without a GPU or toolkit, one warning."""

from __future__ import annotations

import warnings

import pytest
import torch

import inq.kernels.build as kbuild
from inq.cli import main


@pytest.mark.skipif(torch.cuda.is_available(), reason="tests the message where no GPU exists")
def test_bench_kernel_without_gpu_is_one_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "kernel"]) == 1
    assert "needs a CUDA GPU" in capsys.readouterr().err


def test_build_kernels_without_toolkit_is_one_clear_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(kbuild, "find_cuda_home", lambda: None)
    assert main(["build-kernels"]) == 1
    assert "no CUDA toolkit found" in capsys.readouterr().err


def test_failed_build_warns_once_and_returns_none(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(verbose: bool = False):
        raise kbuild.KernelBuildError("no CUDA toolkit found")

    monkeypatch.setattr(kbuild, "build", broken)
    kbuild.load_extension.cache_clear()
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert kbuild.load_extension() is None
            assert kbuild.load_extension() is None
        assert len(caught) == 1
        assert "using the PyTorch reference ops" in str(caught[0].message)
    finally:
        kbuild.load_extension.cache_clear()
