"""CPU behaviour of ``inq bench kernel``: a clear error without a GPU."""

from __future__ import annotations

import re

import pytest
import torch

from inq.cli import main
from inq.kernels import static


@pytest.mark.skipif(torch.cuda.is_available(), reason="tests the message where no GPU exists")
def test_bench_kernel_without_gpu_is_one_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "kernel"]) == 1
    err = capsys.readouterr().err
    assert "needs a CUDA GPU" in err and err.count("\n") == 1


@pytest.mark.slow
def test_static_check_reports_each_variant_as_it_is_compiled(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--static`` compiles 185 variants (minutes on a small machine): a line on stderr per
    variant compiled, so that it is seen to progress. Two variants here, one process."""
    two = static.variants()[:2]
    monkeypatch.setattr(static, "variants", lambda: two)
    assert main(["bench", "kernel", "--static", "--bits", "4", "--jobs", "1"]) == 0
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 2, lines
    for done, (line, variant) in enumerate(zip(lines, two, strict=True), 1):
        assert re.fullmatch(rf"\[{done}/2, \d+ s\] sm_90 {variant.name} {variant.dtype}: ok", line)
