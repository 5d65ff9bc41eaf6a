"""CPU behaviour of ``inq bench kernel``: a clear error without a GPU."""

from __future__ import annotations

import pytest
import torch

from inq.cli import main


@pytest.mark.skipif(torch.cuda.is_available(), reason="tests the message where no GPU exists")
def test_bench_kernel_without_gpu_is_one_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "kernel"]) == 1
    err = capsys.readouterr().err
    assert "needs a CUDA GPU" in err and err.count("\n") == 1
