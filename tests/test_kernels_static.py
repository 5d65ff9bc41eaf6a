"""The static sm_90 check (``inq bench kernel --static``): every Triton kernel variant compiles
for an H100 without a GPU, with no spills, within budget, with wide code loads in the GEMV and
tensor-core instructions in the fp16/bf16 tiles; and the roofline's arithmetic."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from inq.cli import main
from inq.kernels.model import H100
from inq.kernels.static import imma_grids, loop_stats, roofline, variants

pytestmark = pytest.mark.slow


def test_every_variant_compiles_for_sm90_and_passes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "static.json"
    calibration = Path(__file__).parent.parent / "experiments/gpu/model_issue31_h200.json"
    status = main(["bench", "kernel", "--static", "--bits", "4", "--json", str(out),
                   "--calibration", str(calibration)])  # fmt: skip
    printed = capsys.readouterr().out
    assert status == 0, printed
    payload = json.loads(out.read_text())
    records = payload["variants"]
    assert [r["name"] for r in records] == [v.name for v in variants()]
    by_name = {v.name: v for v in variants()}
    for row in records:
        variant = by_name[row["name"]]
        assert row["problems"] == [], row["name"]
        assert row["local_bytes"] == 0 and row["registers"] <= 255
        assert row["ctas_per_sm"] >= 1
        if variant.budget is not None:  # read in its main loop
            assert row["loop_instructions"] > 0 and row["instructions_per_weight"] > 0
        if variant.tensor_cores:
            assert row["dtype"] in ("fp16", "bf16", "int8", "uint8") and row["mma"] > 0, row["name"]
            assert row["lane_ops_per_mac"] > 0
    # every linear kernel on the kernel layout has a budget, and the CI fails where one leaves it
    linear = [r for r in records if r["name"].startswith("linear ") and r["loop_instructions"]]
    assert linear and all(r["budget"] is not None for r in linear)
    for row in linear:
        if "per_weight" in row["budget"] and row["budget"]["per_weight"] is not None:
            assert row["instructions_per_weight"] <= row["budget"]["per_weight"], row["name"]
    # every int8 tensor-core variant has a budget, and is in it; the flat steps of a first
    # conv compiled as it runs, its channel count no multiple of 16
    imma = [r for r in records if r["kernel"] == "_imma_kernel"]
    assert imma and all(r["budget"] is not None for r in imma)
    flat = [v for v in variants() if v.kernel == "_imma_kernel" and "flat" in v.name]
    assert flat and all(v.unaligned == {"C", "CG"} for v in flat)
    assert "roofline at H100 SXM" in printed and "model estimate on H100 SXM" in printed
    assert "model estimate on H200" in printed and f"model against {calibration}" in printed
    # the time model on this commit's kernels: every fp16 linear case at 4 bits, both devices
    assert len(payload["estimates"]) == 2 * 4 * 4
    # and every ResNet-18 convolution at both batches, per layer, with the sums
    assert len(payload["conv_estimates"]) == 2 * 2 * 20
    assert "model estimate of ResNet-18's convolutions" in printed
    assert len(payload["calibration"][str(calibration)]) == 64
    assert "grids on 132 SMs" in printed and "FAIL" not in printed


def test_loop_stats_reads_the_largest_backward_branch_loop() -> None:
    """The main loop is the longest span closed by a backward branch; a trailing self-branch
    (the trap after EXIT) and forward branches are not loops; loads are counted by kind, and a
    wgmma wait's depth is read."""
    lines = [
        "MOV R1, c[0x0][0x28]",
        "@P0 BRA 0x90",  # forward: not a loop
        "LDG.E.U8 R4, desc[UR4][R2.64]",  # 0x20: loop start
        "LDGSTS.E.BYPASS.128 [R5], desc[UR4][R2.64]",
        "SHF.R.U32.HI R6, RZ, 0x4, R4",
        "HGMMA.64x64x16.F32 R24, gdesc[UR4], R24",
        "WARPGROUP.DEPBAR.LE gsb0, 0x1",
        "SHFL.BFLY PT, R7, R6, 0x1, 0x1f",
        "@P1 BRA 0x20",
        "EXIT",
        "BRA 0xa0",
    ]
    sass = "\n".join(f"/*{16 * i:04x}*/ {line} ;" for i, line in enumerate(lines))
    stats = loop_stats(sass)
    assert stats is not None
    assert (stats.instructions, stats.int_ops, stats.shuffles, stats.mma) == (7, 1, 1, 1)
    assert stats.loads == {"LDG.E.U8": 1} and stats.async_copies == 1 and stats.wgmma_wait == 1
    assert loop_stats("/*0000*/ EXIT ;") is None


def test_a_budget_fails_what_decides_speed() -> None:
    """A variant over its lane-op budget, with byte loads, shuffles, or an MMA loop without
    async copies, is named with each reason."""
    from inq.kernels.static import Budget, CompiledVariant, LoopStats, Variant, _over_budget

    budget = Budget(per_weight=5, int_per_weight=2.5, no_shuffles=True, async_copies=True)
    variant = Variant("v", "linear", "k", "fp16", {}, num_warps=4, loop_weights=128,
                      budget=budget)  # fmt: skip
    loop = LoopStats(10, 4, {"LDG.E.128": 1}, 1, 0, 0, 0, None)  # 10 x 128 lanes / 128 = 10
    result = CompiledVariant(variant, 64, 0, 0, 1, 0, [], 4, loop)
    assert result.instructions_per_weight == 10 and result.int_ops_per_weight == 4
    assert _over_budget(result) == ["lane-ops/weight 10.0 > 5", "integer lane-ops/weight 4.0 > 2.5"]
    loop = LoopStats(4, 2, {"LDG.E.U8": 2}, 0, 3, 0, 0, None)
    problems = _over_budget(CompiledVariant(variant, 64, 0, 0, 0, 0, [], 4, loop))
    assert problems == [
        "byte/halfword global loads in the main loop: LDG.E.U8",
        "3 shuffles (SHFL) in the main loop",
        "no async copy (LDGSTS/UTMALDG) in the main loop",
    ]


def test_roofline_counts_bytes_and_flops() -> None:
    rows = {(r.op, r.name, r.batch): r for r in roofline([4])}
    gemv = rows[("linear", "4096x4096", 1)]
    assert gemv.inq_bytes == 4096 * 2048 + 2 * (4096 + 4096)  # nibbles + fp16 x and y
    assert gemv.base_bytes == 2 * 4096 * 4096 + 2 * (4096 + 4096)
    assert gemv.inq_us == pytest.approx(gemv.inq_bytes / H100.dram_gbps / 1e3)
    assert 3.9 < gemv.speedup < 4.0  # memory bound: the weight bytes set the ratio
    big = rows[("linear", "4096x4096", 1024)]
    assert big.inq_us == big.base_us == pytest.approx(big.flops / H100.fp16_tflops / 1e6)
    conv1 = rows[("conv2d", "conv1", 1)]
    assert conv1.flops == 2 * 64 * 112 * 112 * 3 * 7 * 7


def test_imma_grids_fill_the_sms_within_32_serial_steps() -> None:
    """Every ResNet-18 convolution at batch 1 and 32 launches at most 32 serial K steps a CTA
    (split-K where K is long), and the batch-1 layers are split to fill the SMs."""
    grids = imma_grids()
    assert {g.batch for g in grids} == {1, 32} and len(grids) == 40
    assert all(g.problem is None and 1 <= g.steps_per_cta <= 32 for g in grids)
    late = [g for g in grids if g.batch == 1 and g.layer.startswith("layer4")]
    assert all(g.split_k > 1 for g in late if "downsample" not in g.layer)
