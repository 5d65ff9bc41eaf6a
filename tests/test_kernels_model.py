"""The static time model (``inq.kernels.model``): its terms by hand, its monotonicity, and its
calibration against every committed GPU record (the CI band of issue 47)."""

from __future__ import annotations

import json
import sys
from dataclasses import asdict, replace
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from train_helpers import load_experiment

from inq.cli import main
from inq.kernels.model import (
    CLEAN,
    DIRTY,
    H100,
    H200,
    Calibration,
    ConvCase,
    Figures,
    Tiling,
    calibrate,
    calibration_records,
    conv_tiling,
    estimate_convs,
    estimate_linear,
    format_conv_estimates,
    load_calibration,
    predict_conv,
    predict_dense,
    predict_linear,
    table_problems,
    variant_name,
)
from inq.kernels.shapes import resnet18_convs

RECORDS = sorted((Path(__file__).parent.parent / "experiments" / "gpu").glob("model_*.json"))
SKINNY = Figures(num_warps=4, num_stages=4, ctas_per_sm=5, loop_instructions=365, wgmma_wait=0,
                 tensor_cores=True)  # fmt: skip


@pytest.mark.parametrize("path", RECORDS, ids=[p.name for p in RECORDS])
def test_the_model_explains_every_committed_record(path: Path) -> None:
    """Median |error| <= 15 %, every record within +-35 %, kernel and cuBLAS alike, and the
    measured order of the tilings where a run timed each one."""
    checks = calibrate(load_calibration(path))
    summary = Calibration.of(checks)
    assert summary.median_error <= 0.15, summary
    worst = max(checks, key=lambda c: abs(c.error))
    assert summary.max_error <= 0.35, worst
    assert {c.kernel for c in checks} == {"inq", "cuBLAS"}
    assert not [c for c in checks if c.ranking is False]


def test_records_exist() -> None:
    assert RECORDS, "no experiments/gpu/model_*.json to calibrate against"


def test_the_terms_by_hand() -> None:
    """28672 x 8192 at batch 1, 4-bit codes, 16 x 128 tiles: 224 CTAs, 2 on the busiest SM,
    64 chunks each; tensor-core and issue cycles add (decode and MMA take turns); DRAM at the
    copy bandwidth."""
    p = predict_linear(28672, 8192, 1, 4, Tiling(16, 128, 1), SKINNY, H200, CLEAN)
    assert (p.ctas, p.rounds, p.resident, p.bound) == (224, 1, 2, "compute")
    cycles = 16 * 128 * 128 / 2048 + 4 * 365 * 2 / 4  # tensor + issue, one CTA's iteration
    assert p.iteration_us == pytest.approx(2 * cycles / 1830)
    copy = 4800e3 * 0.886  # bytes a microsecond
    stored = 224 * 16 * 128 * 2 / copy
    assert p.kernel_us == pytest.approx(0.8 + 64 * p.iteration_us + 0.8 + stored)
    assert (p.reduce_us, p.harness_us) == (0.0, 3.5)
    assert p.inflight_kib == 2 * 3 * 128 * 64 / 1024  # 2 CTAs x 3 stages ahead x 8 KiB
    codes = 28672 * 64 * 16 * 4
    assert p.dram_bytes == codes + 2 * (8192 + 28672) and p.evicted_bytes == 0
    dirty = predict_linear(28672, 8192, 1, 4, Tiling(16, 128, 1), SKINNY, H200, DIRTY)
    assert dirty.evicted_bytes == 60 << 20  # the whole dirty L2 is written back
    assert dirty.total_us == p.total_us  # in the background: compute binds


def test_a_warp_alone_on_its_scheduler_issues_at_its_dependences() -> None:
    """One CTA of 4 warps an SM (4096 x 4096 at batch 1 on 16 x 128 tiles, K split 4): one
    warp a scheduler, whose instructions issue every 3.3 cycles, not every 2."""
    p = predict_linear(4096, 4096, 1, 4, Tiling(16, 128, 4), SKINNY, H200, CLEAN)
    assert (p.ctas, p.resident) == (128, 1)
    cycles = 16 * 128 * 128 / 2048 + 4 * 365 * 3.3 / 4
    assert p.iteration_us == pytest.approx(cycles / 1830)


def test_split_k_adds_a_reduce_pass() -> None:
    p = predict_linear(4096, 4096, 1, 4, Tiling(16, 128, 5), SKINNY, H200, CLEAN)
    assert p.ctas == 32 * 5 and p.tiling == "16x128/5"
    moved = 4 * 5 * 4096 + 2 * 4096  # fp32 partial sums in, fp16 output out
    assert p.reduce_us == pytest.approx(2.0 + 0.8 + moved / (4800e3 * 0.886))


@given(
    batch=st.sampled_from([1, 16, 64, 256, 1024]),
    out_f=st.sampled_from([1024, 4096, 28672]),
    in_f=st.sampled_from([1024, 4096, 11008]),
    bits=st.sampled_from([4, 8]),
    split=st.integers(1, 4),
    warps=st.sampled_from([4, 8]),
    stages=st.integers(2, 6),
    occupancy=st.integers(1, 6),
    instructions=st.integers(50, 600),
)
def test_the_model_is_monotone(
    batch: int, out_f: int, in_f: int, bits: int, split: int, warps: int, stages: int,
    occupancy: int, instructions: int,
) -> None:  # fmt: skip
    """More stages, more CTAs per SM or fewer instructions never make a kernel slower; a
    deeper wgmma wait changes nothing (measured: no overlap, decode and MMA take turns); a
    dirty L2 never makes it faster; the H100's lower bandwidth never faster."""
    tiling = Tiling(min(128, max(16, batch)), 128, split)
    fig = Figures(warps, stages, occupancy, instructions, 0, True)

    def time(f: Figures = fig, harness=CLEAN, device=H200) -> float:
        return predict_linear(out_f, in_f, batch, bits, tiling, f, device, harness).total_us

    base = time()
    assert time(replace(fig, wgmma_wait=1)) == base
    assert time(replace(fig, num_stages=stages + 1)) <= base
    assert time(replace(fig, ctas_per_sm=occupancy + 1)) <= base + 1e-9
    assert time(replace(fig, loop_instructions=instructions - 10)) <= base
    assert time(harness=DIRTY) >= base
    assert time(device=H100) >= base


def test_the_dense_model() -> None:
    """cuBLAS at batch 1 is its weight bytes at the copy bandwidth, a DRAM latency each side
    and the floor; the dirty flush adds the write-back of the lines its reads displace; at
    large batch the tensor cores bind."""
    read, copy, ends = 2 * 4096 * 4096 + 2 * 4096, 4800e3 * 0.886, 2 * 0.8 + 3.5
    clean = (read + 2 * 4096) / copy + ends
    assert predict_dense(4096, 4096, 1, H200, CLEAN) == pytest.approx(clean)
    assert predict_dense(4096, 4096, 1, H200, DIRTY) == pytest.approx(
        (2 * read + 2 * 4096) / copy + ends
    )
    waves = -(-8 * 224 // 132)  # 128 x 128 tiles of a 1024 x 28672 output
    tensor = waves * 128 * 128 * 8192 / 2048 / 1830
    assert predict_dense(28672, 8192, 1024, H200, CLEAN) == pytest.approx(tensor + ends)


def _bench(tilings: list[dict] | None = None) -> dict:
    """A run before issue 47 (the dirty flush only), or with ``tilings`` one since."""
    record = {"op": "linear", "name": "4096x4096", "batch": 1, "bits": 4, "dtype": "fp16",
              "time_us": 14.0, "baseline_us": 17.6}  # fmt: skip
    conv = record | {"op": "conv2d", "name": "layer1.0.conv1", "time_dirty_us": 50.0,
                     "baseline_dirty_us": 30.0}  # fmt: skip
    bench = {"device": "NVIDIA H200", "results": [record, conv]}
    if tilings is not None:
        record |= {"tilings": tilings, "time_dirty_us": 15.0, "baseline_dirty_us": 20.0}
        bench["harness"] = {"repeats": 50}
    return bench


HALF_CHUNK = "conv mma 128x64, 64 of 128 columns"  # layer1's 64 channels in nibble chunks


def _static() -> list[dict]:
    conv = {"name": HALF_CHUNK, "bits": 4, "dtype": "fp16", "num_warps": 4,
            "num_stages": 3, "ctas_per_sm": 2, "loop_instructions": 261, "wgmma_wait": 0,
            "mma": 8}  # fmt: skip
    return [conv] + [{"name": variant_name(16, n), "bits": 4, "dtype": "fp16", "num_warps": 4,
                      "ctas_per_sm": 5, "loop_instructions": 365 - n, "wgmma_wait": 0,
                      "mma": 16} for n in (64, 128)]  # fmt: skip


def test_calibration_records_keep_what_the_model_needs() -> None:
    """One record per fp16 linear case, each tiling on offer with its launch and figures; the
    measured order of the tilings is checked where each was timed."""
    data = calibration_records(_bench(), _static(), DIRTY, "3.6.0")
    assert (data["device"], data["harness"], data["triton"]) == ("H200", "dirty flush", "3.6.0")
    (record,) = data["records"]
    assert [(t["block_m"], t["block_n"], t["split_k"]) for t in record["tilings"]] == [
        (16, 128, 8), (16, 64, 8)
    ]  # fmt: skip  # what the dispatcher offers now: the run recorded none
    assert record["tilings"][0]["figures"]["loop_instructions"] == 237
    assert record["tilings"][0]["figures"]["num_stages"] == 4  # from the launch
    assert [c.ranking for c in calibrate(data)] == [None, None]
    with pytest.raises(ValueError, match="predates the clean flush"):
        calibration_records(_bench(), _static(), CLEAN, "3.6.0")
    timed = [{"block_m": 16, "block_n": n, "split_k": 5, "num_stages": 4, "time_us": t}
             for n, t in ((128, 9.0), (64, 12.0))]  # fmt: skip
    dirty = calibration_records(_bench(timed), _static(), DIRTY, "3.6.0")["records"][0]
    assert (dirty["time_us"], dirty["baseline_us"]) == (15.0, 20.0)
    assert [t["time_us"] for t in dirty["tilings"]] == [None, None]  # timed with a clean flush
    predicted = calibrate(calibration_records(_bench(timed), _static(), CLEAN, "3.6.0"))
    assert dirty["tilings"][0]["split_k"] == 5  # as the run recorded it
    swapped = [t | {"time_us": 21.0 - t["time_us"]} for t in timed]
    found = calibrate(calibration_records(_bench(swapped), _static(), CLEAN, "3.6.0"))
    assert {predicted[0].ranking, found[0].ranking} == {True, False}


def test_a_convolution_record_keeps_its_shapes_and_launch() -> None:
    """A run since issue 47: each ResNet-18 convolution with its shapes, the launch the
    dispatcher makes and its variant's figures, checked against the kernel alone (cuDNN has
    no model); a run before it timed conv kernels since replaced, and gives none."""
    timed = [{"block_m": 16, "block_n": 128, "split_k": 5, "num_stages": 4, "time_us": 9.0}]
    data = calibration_records(_bench(timed), _static(), DIRTY, "3.6.0")
    conv = data["records"][1]
    assert (conv["op"], conv["time_us"], conv["baseline_us"]) == ("conv2d", 50.0, 30.0)
    assert conv["case"] == {"input_shape": (1, 64, 56, 56), "weight_shape": (64, 64, 3, 3),
                            "output_shape": (1, 64, 56, 56)}  # fmt: skip
    (launch,) = conv["tilings"]
    assert (launch["variant"], launch["split_k"], launch["padded"]) == (HALF_CHUNK, 1, True)
    assert launch["figures"]["loop_instructions"] == 261
    checks = calibrate(json.loads(json.dumps(data)))  # as read back from its file
    assert [(c.name, c.kernel) for c in checks] == [
        ("4096x4096", "inq"), ("4096x4096", "cuBLAS"), ("layer1.0.conv1", "inq")
    ]  # fmt: skip
    assert checks[2].measured_us == 50.0 and checks[2].tiling == "128x64"
    assert len(calibration_records(_bench(), _static(), DIRTY, "3.6.0")["records"]) == 1
    # a run since the launch is recorded: its launch, not what the dispatcher makes now
    recorded = _bench(timed)
    recorded["results"][1]["launch"] = launch | {"block_m": 64, "block_n": 128}
    del recorded["results"][1]["launch"]["figures"], recorded["results"][1]["launch"]["time_us"]
    ran = calibration_records(recorded, _static(), DIRTY, "3.6.0")["records"][1]["tilings"][0]
    assert (ran["block_m"], ran["block_n"]) == (64, 128)
    # 5-bit codes run the byte-code variant (the run's network widths are 4 and 5 bits)
    five = _bench(timed)
    five["results"][1] |= {"bits": 5}
    byte_codes = _static()[0] | {"name": "conv mma 128x64", "bits": 8, "loop_instructions": 183}
    (launch,) = calibration_records(five, [*_static(), byte_codes], DIRTY, "3.6.0")["records"][1][
        "tilings"
    ]
    assert (launch["block_k"], launch["figures"]["loop_instructions"]) == (64, 183)


def test_a_convolution_record_keeps_each_launch_on_offer_and_its_order() -> None:
    """A run that timed both pixel tiles of a convolution (``layer4.0.conv2`` at batch 32,
    offered as 64x128/2 and 128x128/2): both kept, with their figures and (clean flush) times;
    the model's faster one is checked against the op, and its order against the run's."""
    offer = [(64, 128, 2, 4, 29.0), (128, 128, 2, 8, 25.0)]
    timed = [{"kernel": "conv mma", "block_m": m, "block_n": n, "split_k": k, "num_warps": w,
              "num_stages": 3, "time_us": us} for m, n, k, w, us in offer]  # fmt: skip
    bench = _bench([])
    bench["results"][1] |= {"name": "layer4.0.conv2", "batch": 32, "time_us": 25.0,
                            "tilings": timed, "chosen": 1}  # fmt: skip
    static = [_static()[0] | {"name": f"conv mma {m}x128", "num_warps": w, "ctas_per_sm": 6 // w,
                              "loop_instructions": 350 if m == 64 else 244}
              for m, w in ((64, 4), (128, 8))]  # fmt: skip
    record = calibration_records(bench, static + _static(), CLEAN, "3.6.0")["records"][1]
    assert [(t["block_m"], t["split_k"], t["time_us"]) for t in record["tilings"]] == [
        (64, 2, 29.0), (128, 2, 25.0)
    ]  # fmt: skip
    assert [t["figures"]["loop_instructions"] for t in record["tilings"]] == [350, 244]
    check = calibrate(json.loads(json.dumps({"device": "H200", "harness": "clean flush",
                                             "records": [record]})))[0]  # fmt: skip
    assert (check.tiling, check.ranking) == ("128x128/2", True)
    dirty = calibration_records(bench, static + _static(), DIRTY, "3.6.0")["records"][1]
    assert [t["time_us"] for t in dirty["tilings"]] == [None, None]  # timed with a clean flush


def test_a_convolution_launches_as_the_dispatcher_does() -> None:
    """3 input channels take the few-channels kernel (K = 147 whole: 64 taps x 4); wider
    convolutions take the kernel layout, a chunk (128 columns of nibbles, 64 of bytes) an
    iteration, K split to fill the SMs where the tiles are few."""
    first = conv_tiling(ConvCase((1, 3, 224, 224), (64, 3, 7, 7), (1, 64, 112, 112)), 4, 132)
    assert (first.variant, first.block_k, first.split_k, first.padded) == (
        "conv few channels 128x64x256", 256, 1, False
    )  # fmt: skip
    depthwise = ConvCase((1, 1, 8, 8), (4, 1, 3, 3), (1, 4, 6, 6))
    with pytest.raises(ValueError, match="no depthwise convolution"):
        conv_tiling(depthwise, 4, 132)
    last = ConvCase((1, 512, 7, 7), (512, 512, 3, 3), (1, 512, 7, 7))  # 4 tiles
    assert conv_tiling(last, 4, 132).name == "64x128/18"  # 36 chunks, 2 a CTA
    assert (conv_tiling(last, 8, 132).block_k, conv_tiling(last, 8, 132).split_k) == (64, 24)


def test_the_few_channels_terms_by_hand() -> None:
    """ResNet's first conv at batch 32: 32 x 14 x 7 tiles of 8 x 16 pixels, one program an SM
    walking 24 of them (the busiest SM), a 128 x 64 x 256 MMA each (64 taps x 4 channels);
    the padded channels-last copy is the second pass; fewer loop instructions are never
    slower."""
    case = ConvCase((32, 3, 224, 224), (64, 3, 7, 7), (32, 64, 112, 112))
    fig = Figures(8, 1, 1, 592, 0, True)
    tiling = conv_tiling(case, 4, H200.sms)
    p = predict_conv(case, 4, tiling, fig)
    assert (p.ctas, p.rounds, p.resident, p.bound) == (132, 1, 1, "compute")
    padded = 2 * 32 * 4 * 230 * 230
    assert p.dram_bytes == padded + 2 * 32 * 112 * 112 * 64 + 64 * 74  # 147 nibbles a row
    tile = (8 * 592 * H200.issue_cycles / 4 + 128 * 64 * 256 / H200.mma_per_clock) / 1830
    assert p.kernel_us == pytest.approx(
        2 * H200.latency_us + 24 * tile + 2 * 32 * 112 * 112 * 64 / H200.copy_gbps / 1e3
    )  # fmt: skip
    assert p.reduce_us > H200.launch_gap_us  # the padded copy
    assert predict_conv(case, 4, tiling, replace(fig, loop_instructions=500)).total_us < p.total_us


def test_each_convolution_launch_is_the_models_choice() -> None:
    """Every ResNet-18 convolution at batch 1 and 32, nibble and byte codes: the launch the
    dispatcher makes is within 10 % of the model's fastest K split for it, with the figures of
    the variants compiled by the GPU's Triton (committed: ``inq bench kernel --static``)."""
    static = Path(__file__).parents[1] / "experiments/static/issue48_triton3.6.json"
    figures = {(r["name"], r["bits"]): Figures.from_record(r)
               for r in json.loads(static.read_text())["variants"]
               if r["dtype"] == "fp16" and r["loop_instructions"]}  # fmt: skip
    checked = 0
    for bits in (4, 8):
        for batch in (1, 32):
            for layer in resnet18_convs(batch):
                case = ConvCase(layer.input_shape, tuple(layer.conv.weight.shape),
                                layer.output_shape)  # fmt: skip
                tiling = conv_tiling(case, bits, H200.sms)
                fig = figures[(tiling.variant, bits)]
                chosen = predict_conv(case, bits, tiling, fig).total_us
                best = min(predict_conv(case, bits, replace(tiling, split_k=split), fig).total_us
                           for split in range(1, 73))  # fmt: skip
                assert chosen <= 1.1 * best, (layer.name, batch, bits, tiling.name)
                checked += 1
    assert checked == 80


def test_the_convolution_terms_by_hand() -> None:
    """layer1's 3x3 conv at batch 1, nibble codes: 25 tiles of 128 pixels x 64 channels, one
    chunk a tap (64 channels padded to 128), 9 iterations; DRAM once for codes, input and
    output. Padding is not read: 64 channels cost no more than 128 would; fewer loop
    instructions are never slower."""
    case = ConvCase((1, 64, 56, 56), (64, 64, 3, 3), (1, 64, 56, 56))
    fig = Figures(4, 3, 2, 261, 0, True)
    tiling = conv_tiling(case, 4, H200.sms)
    p = predict_conv(case, 4, tiling, fig)
    assert (p.ctas, p.rounds, p.resident, p.reduce_us) == (25, 1, 1, 0.0)
    assert p.dram_bytes == 64 * 9 * 64 + 2 * 64 * 56 * 56 + 2 * 3136 * 64
    wide = ConvCase((1, 128, 56, 56), (64, 128, 3, 3), (1, 64, 56, 56))
    assert predict_conv(wide, 4, conv_tiling(wide, 4, H200.sms), fig).total_us >= p.total_us
    fewer = replace(fig, loop_instructions=200)
    assert predict_conv(case, 4, tiling, fewer).total_us <= p.total_us


def test_conv_estimates_cover_the_network_per_layer() -> None:
    """Every ResNet-18 convolution whose variant was compiled, at both batches, and the sums."""
    fig = Figures(4, 3, 2, 261, 0, True)
    figures = {(name, 4): fig for name in ("conv mma 64x128", HALF_CHUNK)}
    rows = estimate_convs(figures, [4, 5], H200)
    assert {r.tiling.variant for r in rows} == {"conv mma 64x128", HALF_CHUNK}
    assert {r.bits for r in rows} == {4}
    assert {(r.name, r.batch) for r in rows} >= {("layer1.0.conv1", 32), ("layer3.1.conv2", 1)}
    table = format_conv_estimates(rows, H200)
    total = sum(r.prediction.total_us for r in rows if r.batch == 1)
    assert "estimates, not measurements" in table and f"{total:.1f}" in table.splitlines()[-1]
    assert rows[0].record()["estimate_us"] == rows[0].prediction.total_us


def test_estimates_take_the_fastest_tiling(tmp_path: Path) -> None:
    figures = {(variant_name(16, n), 4): replace(SKINNY, loop_instructions=300) for n in (64, 128)}
    rows = estimate_linear(figures, [4], H200)
    assert {r.batch for r in rows} == {1, 16}  # only the 16-row variants were given
    for r in rows:
        assert r.speedup == r.cublas_us / r.best.total_us
        assert r.record()["estimate_us"] == r.best.total_us


def test_the_default_tiling_must_be_the_models_choice() -> None:
    """A bucket's first tiling runs until the GPU has timed the others (and under graph
    capture): the check names a case where the model finds another over 25 % faster."""
    slow = replace(SKINNY, loop_instructions=1200)  # twice the rows, 3.3x the instructions
    figures = {(variant_name(16, 128), 4): slow, (variant_name(16, 64), 4): SKINNY}
    problems = table_problems(estimate_linear(figures, [4], H200))
    assert problems and all("default 16x128" in p and "16x64" in p for p in problems)
    figures[(variant_name(16, 128), 4)] = SKINNY
    assert table_problems(estimate_linear(figures, [4], H200)) == []


def test_a_bad_calibration_file_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "model.json"
    bad.write_text(json.dumps({"device": "A100", "harness": "dirty flush", "records": []}))
    with pytest.raises(ValueError, match="not a calibration file"):
        load_calibration(bad)
    assert main(["bench", "kernel", "--static", "--calibration", str(bad)]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(bad) in err
    conv = {"op": "conv2d", "name": "conv1", "batch": 1, "bits": 4, "time_us": 1.0,
            "baseline_us": 1.0, "tilings": []}  # fmt: skip
    bad.write_text(json.dumps({"device": "H200", "harness": "clean flush", "records": [conv]}))
    with pytest.raises(ValueError, match="convolution record lacks its case"):
        load_calibration(bad)


def test_a_ranking_counts_only_where_the_run_tells_the_tilings_apart() -> None:
    """The same launch timed 30 % apart (batch 1 and 16 on 16-row tiles) makes two tilings
    20 % apart a tie; 40 % apart they are ranked, and a wrong order is reported."""

    def record(batch: int, fast: float, slow: float) -> dict:
        tilings = [{"block_m": 16, "block_n": n, "split_k": 4, "time_us": t,
                    "figures": asdict(replace(SKINNY, loop_instructions=li))}
                   for n, t, li in ((128, slow, 365), (64, fast, 182))]  # fmt: skip
        return {"name": "4096x4096", "batch": batch, "bits": 4, "time_us": fast,
                "baseline_us": 14.0, "tilings": tilings}  # fmt: skip

    def rankings(*records: dict) -> list[bool | None]:
        data = {"device": "H200", "harness": "clean flush", "records": list(records)}
        return [c.ranking for c in calibrate(data) if c.kernel == "inq"]

    assert rankings(record(1, 10.0, 12.0), record(16, 13.0, 15.6)) == [None, None]
    assert rankings(record(1, 10.0, 14.0), record(16, 13.0, 18.2)) == [True, True]
    assert rankings(record(1, 14.0, 10.0), record(16, 18.2, 13.0)) == [False, False]


def test_the_integer_estimate_has_each_op_of_the_integer_resnet18(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """experiments/integer_estimate.py: the integer ResNet-18's 33 ops under their names in
    the integer model (checked against one built on the CPU when the script was written), a
    residual add after each block's last conv, every op but the flatten (a view) a positive
    time; as ``IntegerModel.forward`` runs them, 25, each block's last conv and its add one op
    named as the add; with a bench file, the graph's measured time beside the sum."""
    script = load_experiment("integer_estimate")
    static = Path(__file__).parents[1] / "experiments/static/2026-12-08_triton3.6.json"
    figures = {r["name"]: Figures.from_record(r) for r in json.loads(static.read_text())["variants"]
               if r["name"].startswith("int8 mma") and r["dtype"] == "uint8"}  # fmt: skip
    ops = script.estimate(figures, 1, H200)
    names = [name for name, _, _ in ops]
    assert len(ops) == 33 and names[:6] == [
        "input", "conv1", "maxpool", "layer1_0_conv1", "layer1_0_conv2", "add"
    ]  # fmt: skip
    assert names[-4:] == ["add_7", "avgpool", "flatten", "fc"]
    assert [name for name, us, _ in ops if us <= 0] == ["flatten"]
    assert names.index("add_2") == names.index("layer2_0_downsample_0") + 1
    for batch in (1, 32):
        apart = script.estimate(figures, batch, H200)
        fused = script.estimate(figures, batch, H200, fused=True)
        assert [name for name, _, _ in fused] == [n for n, _, _ in apart if "conv2" not in n]
        assert [what for _, _, what in fused].count("requantized add") == 0
        assert all(what.endswith("+ residual add") for name, _, what in fused if "add" in name)
        # the adds' passes go; the skips are read where the convs write
        assert sum(us for _, us, _ in fused) < sum(us for _, us, _ in apart)
        five = script.estimate(figures, batch, H200, fused=True, parts=2)  # 5 bits: +-128
        assert [name for name, _, _ in five] == [name for name, _, _ in fused]
        assert all("2 parts" in what for _, _, what in five if "int8 mma" in what)
        assert sum(us for _, us, _ in five) > sum(us for _, us, _ in fused)
    bench = Path(__file__).parents[1] / "experiments/gpu/kernel_bench_issue47_h200.json"
    monkeypatch.setattr(sys, "argv", ["integer_estimate.py", str(static), str(bench)])
    script.main()
    assert "measured graph: 222.5" in capsys.readouterr().out
