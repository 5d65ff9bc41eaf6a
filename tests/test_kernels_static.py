"""The static sm_90 check (``inq bench kernel --static``): every Triton kernel variant compiles
for an H100 without a GPU, with no spills, within budget, with wide code loads in the GEMV and
tensor-core instructions in the fp16/bf16 tiles; and the roofline's arithmetic."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from inq.cli import main
from inq.kernels.static import H100, roofline, variants

pytestmark = pytest.mark.slow


def test_every_variant_compiles_for_sm90_and_passes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "static.json"
    status = main(["bench", "kernel", "--static", "--bits", "4", "--json", str(out)])
    printed = capsys.readouterr().out
    assert status == 0, printed
    compiled = json.loads(out.read_text())["compiled"]
    assert len(compiled) == len(variants())
    for row in compiled:
        variant = row["variant"]
        assert row["problems"] == [], variant["name"]
        assert row["local_bytes"] == 0 and row["registers"] <= 255
        if "gemv" in variant["name"]:
            assert row["wide_loads"] > 0, variant["name"]
        if variant["tensor_cores"]:
            assert variant["dtype"] in ("fp16", "bf16") and row["mma"] > 0, variant["name"]
    assert "roofline at H100 SXM" in printed


def test_roofline_counts_bytes_and_flops() -> None:
    rows = {(r.op, r.name, r.batch): r for r in roofline([4])}
    gemv = rows[("linear", "4096x4096", 1)]
    assert gemv.inq_bytes == 4096 * 2048 + 2 * (4096 + 4096)  # nibbles + fp16 x and y
    assert gemv.base_bytes == 2 * 4096 * 4096 + 2 * (4096 + 4096)
    assert gemv.inq_us == pytest.approx(gemv.inq_bytes / H100.bandwidth_gbps / 1e3)
    assert 3.9 < gemv.speedup < 4.0  # memory bound: the weight bytes set the ratio
    big = rows[("linear", "4096x4096", 1024)]
    assert big.inq_us == big.base_us == pytest.approx(big.flops / H100.fp16_tflops / 1e6)
    conv1 = rows[("conv2d", "conv1", 1)]
    assert conv1.flops == 2 * 64 * 112 * 112 * 3 * 7 * 7
