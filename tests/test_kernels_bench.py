"""CPU-checkable parts of ``inq bench kernel``: the models it times, its tables and records,
its arguments, and the pieces of its three timing harnesses that need no GPU (rotation,
flushes, the dispatcher's choice); one GPU test times a linear op each way."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from dataclasses import asdict
from functools import partial
from types import SimpleNamespace

import pytest
import torch
from torch import Tensor, nn

from inq.codes import pack_codes
from inq.kernels import bench
from inq.kernels.bench import (
    GRAPH_CALLS,
    MAX_COPIES,
    BenchResult,
    EndToEnd,
    Floor,
    Harness,
    OpLayer,
    OpTime,
    Tiling,
    Timings,
    add_bench_arguments,
    bench_record,
    bound,
    format_end_to_end,
    format_floor,
    format_int8_ops,
    format_table,
    int8_gemm_shape,
    integer_op_times,
    quantized_resnet18,
    rotation_copies,
    time_graph,
    to_op_layers,
)
from inq.kernels.layout import cached_kernel_weight
from inq.pow2 import pow2_levels, pow2_n1, pow2_quantize


def test_end_to_end_models_compute_the_same_function() -> None:
    """The converted ResNet-18 holds only op layers and gives the float model's logits bit for
    bit (both use the same exactly decoded weights on the CPU)."""
    float_model = quantized_resnet18(bits=4)
    for m in float_model.modules():
        if isinstance(m, nn.Conv2d | nn.Linear):
            levels = pow2_levels(pow2_n1(m.weight), 4)
            assert torch.isin(m.weight, levels).all()
    op_model = to_op_layers(float_model, bits=4)
    layers = [m for m in op_model.modules() if isinstance(m, OpLayer)]
    assert [layer.op for layer in layers].count(torch.ops.inq.shift_conv2d) == 20
    assert [layer.op for layer in layers].count(torch.ops.inq.shift_linear) == 1
    assert not any(isinstance(m, nn.Conv2d | nn.Linear) for m in op_model.modules())
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        assert torch.equal(op_model(x), float_model(x))


@pytest.mark.parametrize("bias", [True, False])
def test_op_layer_keeps_the_conv_geometry(bias: bool) -> None:
    conv = nn.Conv2d(4, 6, 3, stride=2, padding=2, dilation=2, groups=2, bias=bias)
    with torch.no_grad():
        conv.weight.copy_(pow2_quantize(conv.weight, n1=-1, bits=5))
    layer = OpLayer(conv, bits=5)
    assert layer.packed.dtype == torch.uint8 and layer.packed.shape[0] == 6
    x = torch.randn(2, 4, 9, 9)
    with torch.no_grad():
        assert torch.equal(layer(x), conv(x))


def test_end_to_end_table_has_one_row_per_case() -> None:
    rows = [EndToEnd(1, 4, "fp16", 1.0, 2.0, 0.5, 0.25), EndToEnd(32, 4, "fp16", 3, 3, 2, 4)]
    table = format_end_to_end(rows).splitlines()
    assert len(table) == 4
    assert table[2].split()[-1] == "2.00x" and table[3].split()[-1] == "0.50x"


def test_integer_ops_are_timed_one_by_one_on_a_whole_runs_values(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each op runs alone (``step``) as the forward runs them (``schedule``: a residual add with
    its convolution) on the values one whole ``run`` computed, with the clean flush and
    --extra-repeats; a conv op, alone or with its add, also times cuBLASLt's int8 GEMM of its
    shape (padded as ``torch._int_mm`` takes it); the table sums the ops against the graph."""
    stepped: list[tuple[str, str | None, float]] = []
    conv = {"weight_shape": [4, 2, 3, 3], "groups": 1}  # K = 18: padded to 24
    ops = [SimpleNamespace(name="input", op="input", attrs={}),
           SimpleNamespace(name="c1", op="conv", attrs=conv),
           SimpleNamespace(name="c2", op="conv", attrs=conv),
           SimpleNamespace(name="a1", op="add", attrs={})]  # fmt: skip

    class Program:
        def schedule(self) -> list[tuple[SimpleNamespace, object]]:
            return [(ops[0], None), (ops[1], None), (ops[3], (ops[2], 0))]

        def run(self, x: Tensor) -> dict[str, Tensor]:
            feature_map = torch.zeros(2, 4, 5, 5, dtype=torch.int8)
            return {"input": x + 1, "c1": feature_map, "c2": feature_map, "a1": feature_map}

        def step(self, op: SimpleNamespace, values: dict[str, Tensor], x: Tensor,
                 conv: tuple[SimpleNamespace, int] | None) -> Tensor:  # fmt: skip
            stepped.append((op.name, conv and conv[0].name, float(values["input"])))
            return values[op.name]

    products: list[tuple[int, ...]] = []

    def timed(fn: Callable[[], Tensor], repeats: int, flush: object) -> float:
        out = fn()
        if isinstance(fn, partial) and fn.func is torch._int_mm:
            products.append((*fn.args[0].shape, *fn.args[1].shape))
            assert out.dtype == torch.int32 and fn.args[1].stride() == (1, 24)  # (N, K) rows
            return 3.0 * repeats
        return 2.0 * repeats

    harness = cpu_harness()
    monkeypatch.setattr(bench, "time_cuda", timed)
    times = integer_op_times(Program(), torch.tensor(1.0), harness)
    assert times == [OpTime("input", "input", 6.0), OpTime("c1", "conv", 6.0, (50, 24, 8), 9.0),
                     OpTime("a1", "conv+add", 6.0, (50, 24, 8), 9.0)]  # fmt: skip
    assert products == [(50, 24, 24, 8)] * 2  # M: 2 x 5 x 5 pixels; N: 4 channels padded to 8
    assert stepped == [("input", None, 2.0), ("c1", None, 2.0), ("a1", "c2", 2.0)]
    row = EndToEnd(32, 4, "fp16", 1.0, 2.0, 0.5, 0.25, 0.1, 0, times)
    table = format_int8_ops([row, EndToEnd(1, 4, "fp16", 1.0, 2.0, 0.5, 0.25)]).splitlines()
    assert len(table) == 2 + 3 + 1 and table[2].split()[-1] == "6.0"
    assert table[3].split()[-3:] == ["9.0", "1.50x", "50x24x8"]
    assert table[-1].endswith("3 ops 18.0 us alone, 100.0 us as one graph")
    assert format_int8_ops([EndToEnd(1, 4, "fp16", 1.0, 2.0, 0.5, 0.25)]) == ""


H200_L2 = 60 << 20


@pytest.mark.parametrize(
    ("copy_bytes", "copies"),
    [
        (8 << 20, 15),  # 4096x4096 4-bit codes: 15 x 8 MiB = twice the L2 exactly
        ((8 << 20) + 1, 15),
        ((8 << 20) - 1, 16),
        (61 << 20, 2),  # a copy larger than L2: the least, two
        (1 << 30, 2),
        (1 << 20, MAX_COPIES),  # 120 wanted: capped
        (0, MAX_COPIES),
    ],
)
def test_rotation_copies(copy_bytes: int, copies: int) -> None:
    assert rotation_copies(H200_L2, copy_bytes) == copies


def test_rotation_sweeps_twice_the_l2_within_its_memory_bound() -> None:
    for copy_bytes in [1 << k for k in range(10, 32)] + [3 * 10**6, 7 * 10**7, 123_457]:
        copies = rotation_copies(H200_L2, copy_bytes)
        assert 2 <= copies <= MAX_COPIES
        if copies < MAX_COPIES:
            assert copies * copy_bytes >= 2 * H200_L2 or copies == 2
        assert copies * copy_bytes < max(2 * H200_L2 + copy_bytes, 2 * copy_bytes + 1)


def cpu_harness() -> Harness:
    return Harness(torch.ones(1 << 10, dtype=torch.uint8), repeats=7, extra_repeats=3)


def test_clean_flush_only_reads_and_dirty_flush_writes() -> None:
    harness = cpu_harness()
    assert harness.l2_bytes == 512
    version = harness.flush._version
    harness.clean_flush()
    assert harness.flush._version == version and bool((harness.flush == 1).all())
    harness.dirty_flush()
    assert harness.flush._version > version and not harness.flush.any()
    assert harness.copies(torch.empty(100, dtype=torch.uint8), torch.empty(28)) == 5  # 1024 / 212


def test_bound_puts_the_tensors_first() -> None:
    call = bound(torch.clamp, 0, 1)(torch.tensor([-2.0, 0.5, 3.0]))
    assert call().tolist() == [0.0, 0.5, 1.0]


def test_time_graph_rotates_in_whole_rounds(monkeypatch: pytest.MonkeyPatch) -> None:
    """One replay calls every copy in turn, in rounds, to at least GRAPH_CALLS calls; the time
    is the replay's over the calls."""
    calls: list[int] = []
    timed: list[tuple[int, object]] = []

    def fake_time(fn, repeats, flush):  # one "replay", 90 us
        fn()
        timed.append((repeats, flush))
        return 90.0

    monkeypatch.setattr(bench, "cuda_graph", lambda fn: fn)
    monkeypatch.setattr(bench, "time_cuda", fake_time)
    per_call = time_graph(lambda i: partial(calls.append, i), 3, 5, print)
    assert GRAPH_CALLS == 16
    assert calls == [0, 1, 2] * 6 and per_call == 90.0 / 18
    assert timed == [(5, print)]
    calls.clear()
    assert time_graph(lambda i: partial(calls.append, i), 40, 5, print) == 90.0 / 40
    assert calls == list(range(40))


def test_harness_times_each_way_with_its_flush(monkeypatch: pytest.MonkeyPatch) -> None:
    """Clean flush with --repeats, dirty flush and graph with --extra-repeats; the graph's
    copy 0 runs on the inputs themselves, the others on equal clones."""
    harness = cpu_harness()
    runs: list[tuple[int, object]] = []
    seen: list[tuple[Tensor, ...]] = []

    def fake_time(fn, repeats, flush):
        fn()
        runs.append((repeats, flush))
        return float(len(runs))

    monkeypatch.setattr(bench, "cuda_graph", lambda fn: fn)
    monkeypatch.setattr(bench, "time_cuda", fake_time)
    x, w = torch.randn(2, 3), torch.randn(4, 3)
    timings = harness.time(lambda *t: partial(seen.append, t), (x, w), copies=2)
    assert runs == [(7, harness.clean_flush), (3, harness.dirty_flush), (3, harness.clean_flush)]
    assert timings == Timings(1.0, 2.0, 3.0 / GRAPH_CALLS)
    first, second = seen[2], seen[3]  # after the clean and the dirty run: the graph's copies
    assert first[0] is x and first[1] is w
    assert second[0] is not x and torch.equal(second[0], x) and torch.equal(second[1], w)


def result(op: str = "linear", tilings: list[Tiling] | None = None) -> BenchResult:
    ours, base = Timings(20.0, 31.5, 12.25), Timings(40.0, 52.0, 30.0)
    return bench._result(op, "4096x4096", 1, 4, torch.float16, ours, base, 8 << 20, 2000.0, 15,
                         tilings, 1 if tilings else None)  # fmt: skip


TILINGS = [Tiling("mma", 16, 128, 5, 4, 4, 21.5), Tiling("mma", 16, 64, 5, 4, 4, 20.0)]


def test_result_speedup_and_bandwidth_come_from_the_clean_figures() -> None:
    r = result(tilings=TILINGS)
    assert (r.time_us, r.time_dirty_us, r.time_graph_us) == (20.0, 31.5, 12.25)
    assert (r.baseline_us, r.baseline_dirty_us, r.baseline_graph_us) == (40.0, 52.0, 30.0)
    assert r.speedup == 2.0 and r.gbps == (8 << 20) / 20.0 / 1e3
    assert r.copy_fraction == r.gbps / 2000.0 and r.graph_copies == 15
    assert r.tilings == TILINGS and r.chosen == 1
    assert result().tilings == [] and result().chosen is None


def test_table_has_the_three_figures_of_each_op_and_the_tilings() -> None:
    head, rule, linear, conv = format_table([result(tilings=TILINGS), result("conv2d")]).split("\n")
    assert head.split()[5:14] == ["inq", "us", "dirty", "graph", "base", "us", "dirty", "graph",
                                  "speedup"]  # fmt: skip
    assert set(rule) == {"-"} and len(rule) == len(head)
    assert linear.split()[5:14] == ["20.0", "31.5", "12.2", "40.0", "52.0", "30.0", "2.00x",
                                    "419", "21%"]  # fmt: skip
    assert linear.endswith("21%  21.5 20.0*")
    assert conv.startswith("conv2d ") and conv.endswith("21%")


def test_floor_table() -> None:
    floor = [Floor("add_, one element", 8, 4.0, 9.5, 1.25), Floor("copy 8 MiB", 16 << 20, 9, 20, 6)]
    lines = format_floor(floor).splitlines()
    assert len(lines) == 4
    assert lines[2].split()[-3:] == ["4.0", "9.5", "1.2"]
    assert lines[3].startswith("copy 8 MiB ") and lines[3].split()[-3:] == ["9.0", "20.0", "6.0"]


def test_json_record_carries_every_harness_figure() -> None:
    floor = [Floor("add_, one element", 8, 4.0, 9.5, 1.25)]
    e2e = [EndToEnd(1, 4, "fp16", 1.0, 2.0, 0.5, 0.25)]
    record = bench_record("GPU", 3000.0, cpu_harness(), floor, [result(tilings=TILINGS)], e2e)
    back = json.loads(json.dumps(record))
    assert back["harness"] == {
        "l2_bytes": 512,
        "repeats": 7,
        "extra_repeats": 3,
        "graph_calls": GRAPH_CALLS,
        "max_copies": MAX_COPIES,
        "floor": [asdict(floor[0])],
    }
    (row,) = back["results"]
    for key in ("time_us", "time_dirty_us", "time_graph_us", "baseline_us", "baseline_dirty_us",
                "baseline_graph_us", "speedup", "graph_copies"):  # fmt: skip
        assert isinstance(row[key], int | float), key
    assert row["tilings"][1] == {"kernel": "mma", "block_m": 16, "block_n": 64, "split_k": 5,
                                 "num_warps": 4, "num_stages": 4, "time_us": 20.0}  # fmt: skip
    assert row["chosen"] == 1
    assert back["end_to_end"][0]["inq_graph_ms"] == 0.25 and back["copy_gbps"] == 3000.0


def test_repeat_arguments() -> None:
    parser = argparse.ArgumentParser()
    add_bench_arguments(parser)
    args = parser.parse_args([])
    assert (args.repeats, args.extra_repeats) == (50, 10)
    args = parser.parse_args(["--repeats", "20", "--extra-repeats", "3"])
    assert (args.repeats, args.extra_repeats) == (20, 3)
    for bad in (["--extra-repeats", "0"], ["--repeats", "-1"], ["--repeats", "x"]):
        with pytest.raises(SystemExit):
            parser.parse_args(bad)


def test_offered_names_the_tiling_the_dispatcher_runs() -> None:
    """``swar.offered`` gives the tilings of a call and the pick ``choose`` remembers for them
    (the default before one); a weight the layout cannot hold (fp16 byte codes spanning 40
    powers) has no layout: the generic kernels run."""
    pytest.importorskip("triton")
    from inq.kernels.layout import kernel_weight
    from inq.kernels.triton import swar

    x = torch.full((2, 128), 2**-10, dtype=torch.float16)
    nibbles = pack_codes(torch.randint(8, 16, (16, 128), dtype=torch.uint8), 4)
    layout = kernel_weight(nibbles, 4, 0, 128, torch.float16)
    options, chosen = swar.offered(x, layout, sms=132)
    assert chosen == 0 and len(options) == swar.candidates(2, fp32=False) == 2
    _, key = swar._offer(x, layout, 132, None)
    swar._CHOSEN[key] = 1
    try:
        assert swar.offered(x, layout, sms=132) == (options, 1)
    finally:
        del swar._CHOSEN[key]
    wide = torch.full((16, 128), 128, dtype=torch.uint8)
    wide[:, 1] = 128 + 39  # 2**15 and 2**-24 in one row
    assert cached_kernel_weight(pack_codes(wide, 8), 8, 15, 128, torch.float16) is None


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_harnesses_and_tilings_on_the_gpu() -> None:
    harness = Harness.for_device(repeats=3, extra_repeats=2)
    packed, n1 = bench.quantized(torch.randn(256, 512, device="cuda") * 0.02, 4)
    x = torch.randn(4, 512, device="cuda", dtype=torch.float16)
    op = bound(torch.ops.inq.shift_linear, 4, n1, 512, None)
    timings = harness.time(op, (x, packed), harness.copies(x, packed))
    assert all(0 < us < 1e5 for us in asdict(timings).values())
    tilings, chosen = bench.linear_tilings(x, packed, 4, n1, harness)
    assert tilings and chosen is not None and 0 <= chosen < len(tilings)
    assert all(t.kernel == "mma" and t.time_us > 0 for t in tilings)
    conv = torch.nn.Conv2d(64, 128, 3, padding=1, bias=False).cuda()  # 1,024 pixels: 2 launches
    packed, n1 = bench.quantized(conv.weight.detach(), 4)
    images = torch.randn(1, 64, 32, 32, device="cuda", dtype=torch.float16)
    tilings, chosen = bench.conv_tilings(images, packed, 4, n1, conv, harness)
    assert [t.block_m for t in tilings] == [64, 128] and chosen in (0, 1)
    assert all(t.kernel == "conv mma" and t.time_us > 0 for t in tilings)
    # the int8 reference takes the padded shapes (cuBLASLt: M > 16, K and N multiples of 8)
    conv1 = SimpleNamespace(op="conv", attrs={"weight_shape": [64, 3, 7, 7], "groups": 1})
    fc = SimpleNamespace(op="linear", attrs={"in_features": 512})
    for op, out in ((conv1, torch.empty(1, 64, 112, 112)), (fc, torch.empty(1, 1000))):
        shape = int8_gemm_shape(op, out)
        assert shape is not None and bench._time_int_mm(shape, x.device, harness) > 0
