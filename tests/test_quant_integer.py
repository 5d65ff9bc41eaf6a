"""The integer model (inq.quant.integer): its arithmetic, its overflow checks and its file."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from export_fixtures import (
    mobilenet_inputs,
    mobilenet_integer_model,
    packed_model,
    residual_integer_model,
)
from helpers import residual_net
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors import safe_open
from torch import nn

from inq.codes import pack_codes
from inq.fileio import DIGEST_KEY, read_safetensors, safetensors_bytes, write_safetensors
from inq.kernels.int8 import shift_linear_int8_reference
from inq.quant.integer import (
    INT32_MAX,
    IntegerModel,
    accumulator_bound,
    load_integer,
    program_problems,
    requantize,
    residual_fusions,
    save_integer,
)
from inq.quant.lower import Lowering


def _int_model(seed: int = 0) -> IntegerModel:
    torch.manual_seed(seed)
    model = packed_model(
        nn.Sequential(
            nn.Conv2d(2, 4, 3, bias=False),
            nn.BatchNorm2d(4),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Flatten(),
            nn.Linear(4, 3),
        )
    )
    lowering = Lowering(model, act_bits=8)
    lowering.calibrate([torch.randn(8, 2, 4, 4)])
    return lowering.integer_model({"model": {"name": "tiny"}, "act_bits": 8})


@given(st.integers(-(2**40), 2**40), st.integers(0, 40))
def test_requantize_rounds_half_up(v: int, shift: int) -> None:
    got = int(requantize(torch.tensor([v]), 1, shift, -(2**62), 2**62))
    assert got == (v + (1 << shift >> 1)) >> shift  # python's >> is floor, like torch's
    assert abs(got - v / 2**shift) <= 0.5


@settings(max_examples=60)
@given(st.integers(2, 8), st.integers(1, 40), st.integers(0, 10), st.booleans(), st.data())
def test_accumulator_bound_bounds_the_op(bits, k, frac, unsigned, data) -> None:
    seed = data.draw(st.integers(0, 2**31))
    gen = torch.Generator().manual_seed(seed)
    top = 1 << (bits - 1)
    codes = torch.randint(top, 2 * top, (3, k), generator=gen)
    codes = torch.where(torch.rand(3, k, generator=gen) < 0.2, 0, codes).to(torch.uint8)
    negative = ((codes.long() >> (bits - 2)) & 1) == 1
    x_max = 255 if unsigned else 128
    bound = accumulator_bound(codes, bits, frac, x_max)
    for row in range(3):  # the worst input for each row: x_max against its signs
        if unsigned:
            x = torch.where(negative[row], 0, 255).to(torch.uint8)
        else:
            x = torch.where(negative[row], 127, -128).to(torch.int8)
        y = shift_linear_int8_reference(x[None], pack_codes(codes, bits), bits, k, frac)
        assert abs(int(y[0, row])) <= int(bound[row])


def test_program_problems_catch_overflow_and_non_integers() -> None:
    model = _int_model()
    assert program_problems(model) == []
    params = model.params["_0"]
    params.bias[1] = INT32_MAX - 5
    assert "channel 1: accumulator + bias can reach" in dict(program_problems(model))["_0"]
    params.bias[1] = 0
    model.ops[1].attrs["frac"] = 30
    assert "frac=30 can overflow" in dict(program_problems(model))["_0"]
    model.ops[1].attrs["frac"] = 7
    params.shift[0] = 63
    assert "shifts must lie in 0..62" in dict(program_problems(model))["_0"]
    params.shift[0] = 1
    params.multiplier = params.multiplier.float()
    assert "are not integer" in dict(program_problems(model))["_0"]


def test_save_refuses_an_unsound_model(tmp_path: Path) -> None:
    model = _int_model()
    model.params["_0"].bias[0] = INT32_MAX
    with pytest.raises(ValueError, match="unsound at op '_0'"):
        save_integer(tmp_path / "m.int.safetensors", model)
    assert not (tmp_path / "m.int.safetensors").exists()


def test_file_round_trip_holds_integers_only(tmp_path: Path) -> None:
    model = _int_model()
    path = tmp_path / "m.int.safetensors"
    save_integer(path, model)
    loaded = load_integer(path)
    with safe_open(path, "pt") as f:
        dtypes = {f.get_tensor(k).dtype for k in f.keys()}  # noqa: SIM118
    assert dtypes <= {torch.uint8, torch.int32}
    assert [op.as_json() for op in loaded.ops] == [op.as_json() for op in model.ops]
    assert loaded.info == model.info
    x = torch.randn(5, 2, 4, 4)
    assert torch.equal(loaded(x), model(x)) and loaded(x).dtype == torch.int32
    save_integer(tmp_path / "again.int.safetensors", loaded)
    assert (tmp_path / "again.int.safetensors").read_bytes() == path.read_bytes()


def test_modified_or_foreign_files_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "m.int.safetensors"
    save_integer(path, _int_model())
    tensors, metadata = read_safetensors(path)
    tensors = {k: v.clone() for k, v in tensors.items()}
    tensors["_0.shift"][0] = 9
    tampered = tmp_path / "t.int.safetensors"
    tampered.write_bytes(safetensors_bytes(tensors, metadata))  # the old digest
    with pytest.raises(ValueError, match="do not match their sha256 digest"):
        load_integer(tampered)
    assert load_integer(tampered, validate=False).digest_problem is not None
    write_safetensors(tmp_path / "x.safetensors", {"w": torch.ones(1)}, {"format": "other"})
    with pytest.raises(ValueError, match="not an INQ integer model"):
        load_integer(tmp_path / "x.safetensors")


def test_program_problems_check_ranges_arity_and_the_int32_minimum() -> None:
    model = _int_model()
    pool = next(op for op in model.ops if op.op == "maxpool")
    pool.attrs["hi"] = 100  # narrower than its input claims: would weaken the next bounds
    assert "is not its input's 0..255" in dict(program_problems(model))[pool.name]
    pool.attrs["hi"] = 255
    model.params["_0"].bias[0] = -(2**31)  # |INT32_MIN| does not fit int32
    assert "accumulator + bias can reach" in dict(program_problems(model))["_0"]
    model.params["_0"].bias[0] = 0
    pool.inputs = []
    assert "takes 1 input(s)" in dict(program_problems(model))[pool.name]


# ------------------------------------------------- impossible files, re-signed with a new digest

Edit = Callable[[dict[str, torch.Tensor], dict[str, dict[str, Any]], dict[str, Any]], None]


def resign(src: Path, dst: Path, edit: Edit) -> Path:
    """``src`` with ``edit(tensors, attrs by op name, info)`` applied, written with a digest
    recomputed over the edited contents (as a tool that edits files could)."""
    tensors, metadata = read_safetensors(src)
    tensors = {k: v.clone() for k, v in tensors.items()}
    program = json.loads(metadata["program"])
    skip = ("format", "program", DIGEST_KEY)
    info = {k: json.loads(v) for k, v in metadata.items() if k not in skip}
    edit(tensors, {op["name"]: op["attrs"] for op in program}, info)
    new = {"format": metadata["format"], "program": json.dumps(program)}
    write_safetensors(dst, tensors, new | {k: json.dumps(v) for k, v in info.items()})
    return dst


def _set(where: str, key: str, value: Any) -> Edit:
    """An edit of op ``where``'s attribute ``key``, or (``where="info"``) of the descriptions."""

    def edit(tensors, attrs, info) -> None:
        (info if where == "info" else attrs[where])[key] = value

    return edit


def _channel(op: str, field: str, channel: int, value: int) -> Edit:
    def edit(tensors, attrs, info) -> None:
        tensors[f"{op}.{field}"][channel] = value

    return edit


def _denormalise(tensors, attrs, info) -> None:  # 1 >> 4 written as 2 >> 5: the same factor
    tensors["skip.multiplier"][0], tensors["skip.shift"][0] = 2, 5


def _denormalise_add(tensors, attrs, info) -> None:  # [1, 2] >> 0 written as [2, 4] >> 1
    attrs["add"].update(multipliers=[2, 4], shift=1)


@pytest.fixture(scope="module")
def residual_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    model = residual_integer_model()
    assert program_problems(model) == []  # negative conv multipliers (BatchNorm) are valid
    assert int(model.op_tensors("conv")["multiplier"].min()) < 0
    path = tmp_path_factory.mktemp("int") / "residual.int.safetensors"
    save_integer(path, model)
    return path


@pytest.mark.parametrize(
    ("edit", "where", "problem"),
    [
        (_set("add", "multipliers", [-1, 2]), "add",
         "multipliers must be two integers from 1 to 2**31 - 1, got [-1, 2]"),
        (_set("pool", "multiplier", -1), "pool",
         "multiplier must be an integer from 1 to 2**31 - 1, got -1"),
        (_set("pool", "multiplier", 2**31), "pool",
         "multiplier must be an integer from 1 to 2**31 - 1, got 2147483648"),
        (_set("info", "act_bits", 9), "act_bits", "must be an integer from 2 to 8, got 9"),
        (_set("info", "input_bits", 1), "input_bits", "must be an integer from 2 to 8, got 1"),
        (_set("info", "act_bits", 4), "conv",
         "range -128..127 is not within act_bits=4's (-8..7 or 0..15)"),
        (_set("info", "model", [1]), "model", "must be a JSON object, got [1]"),
        (_set("info", "data", "digits"), "data", "must be a JSON object, got 'digits'"),
        (_set("info", "weight_bits", [4]), "conv",
         "bits=5 is not among the file's weight_bits [4]"),
        (_set("input", "scale", float("inf")), "input", "scale inf must be a finite number > 0"),
        (_set("fc", "scale", True), "fc", "scale must be a number, got True"),
        (_set("add", "shift", 1.5), "add", "shift must be an integer from 0 to 62, got 1.5"),
        (_set("add", "hi", 511), "add",
         "range 0..511 is not within act_bits=8's (-128..127 or 0..255)"),
        (_set("conv", "lo", -(2**31)), "conv",
         "range -2147483648..127 is not within act_bits=8's (-128..127 or 0..255)"),
        (_set("flatten", "scale", 0.5), "flatten", "scale 0.5 is not its input's 0.00390625"),
        (_set("conv", "stride", [0, 1]), "conv", "stride must be two integers >= 1, got [0, 1]"),
        (_set("conv", "groups", 3), "conv", "groups=3 does not divide the 4 output channels"),
        (_set("conv", "n1", 500), "conv",
         "n1=500 puts the top level 2**n1 outside torch.float32 (-149..127)"),
        (_set("pool", "input_size", [0, 4]), "pool",
         "input_size must be two integers >= 1, got [0, 4]"),
        (_denormalise_add, "add", "multipliers [2, 4] >> 1 are not normalised (all even)"),
        (_channel("conv", "multiplier", 1, -(2**31)), "conv",
         "channel 1: multiplier -2**31 is out of range"),
        (_denormalise, "skip",
         "channel 0: multiplier 2 >> 5 is not normalised (even with a non-zero shift)"),
    ],
)  # fmt: skip
def test_impossible_files_fail_whatever_their_digest(
    residual_file: Path, tmp_path: Path, edit: Edit, where: str, problem: str
) -> None:
    bad = resign(residual_file, tmp_path / "bad.int.safetensors", edit)
    kind = "metadata" if where in ("act_bits", "input_bits", "model", "data") else "op"
    with pytest.raises(ValueError) as err:
        load_integer(bad)
    assert str(err.value) == f"{bad}: {kind} {where!r}: {problem}"
    model = load_integer(bad, validate=False)
    assert model.digest_problem is None  # the digest was recomputed: only the checks catch it
    assert program_problems(model)[0] == (where, problem)  # what `inq verify` reports


# ------------------------------------------------------------------ ReLU6 / Hardtanh: clamps


def _clamp_model() -> IntegerModel:
    """conv, max pooling, a standalone Hardtanh(-1, 1) (a ``clamp`` op), flatten, linear."""
    torch.manual_seed(0)
    model = packed_model(
        nn.Sequential(nn.Conv2d(2, 4, 3), nn.MaxPool2d(2), nn.Hardtanh(-1.0, 1.0), nn.Flatten(),
                      nn.Linear(4, 3))
    )  # fmt: skip
    lowering = Lowering(model, act_bits=8)
    lowering.calibrate([2 * torch.randn(16, 2, 4, 4)])
    return lowering.integer_model({"act_bits": 8})


def test_clamp_ranges_are_checked_against_the_input() -> None:
    model = _clamp_model()
    assert program_problems(model) == []
    pool, clamp, flatten = model.ops[2:5]
    lo, hi = clamp.attrs["lo"], clamp.attrs["hi"]
    assert clamp.op == "clamp" and pool.attrs["lo"] < lo < 0 < hi < pool.attrs["hi"]
    clamp.attrs["hi"] = flatten.attrs["hi"] = 128  # beyond its int8 input
    assert dict(program_problems(model))[clamp.name] == (
        f"range {lo}..128 is not within its input's -128..127"
    )
    clamp.attrs["hi"] = flatten.attrs["hi"] = 0  # any range within the input's is sound
    assert program_problems(model) == []
    clamp.attrs["scale"] *= 2
    assert "is not its input's" in dict(program_problems(model))[clamp.name]


def test_values_may_be_narrower_than_their_dtype_never_wider() -> None:
    model = _int_model()
    conv, pool, flatten = model.ops[1:4]  # the pooled and flattened values have conv's range
    assert (conv.op, conv.attrs["lo"], conv.attrs["hi"]) == ("conv", 0, 255)
    conv.attrs["hi"] = 192  # as a ReLU6 at scale 2**-5 makes it: still uint8
    assert dict(program_problems(model)) == {pool.name: "range 0..255 is not its input's 0..192"}
    pool.attrs["hi"] = flatten.attrs["hi"] = 192
    assert program_problems(model) == []
    conv.attrs["hi"] = pool.attrs["hi"] = flatten.attrs["hi"] = 256
    assert program_problems(model)[0] == (
        conv.name, "range 0..256 is not within act_bits=8's (-128..127 or 0..255)"
    )  # fmt: skip
    del model.info["act_bits"]
    assert program_problems(model)[0] == (
        conv.name, "range 0..256 is not within an activation range of 2-8 bits"
    )  # fmt: skip


def test_mobilenet_style_model_is_sound_round_trips_and_tracks_the_float_model(
    tmp_path: Path,
) -> None:
    """Conv-BN-ReLU6 (ranges cut to 0..192 where calibration saw the clamp at 6), depthwise
    convs, residual adds without activation, Dropout + Linear."""
    model, int_model = mobilenet_integer_model()
    assert program_problems(int_model) == []
    ranges = {(op.attrs["lo"], op.attrs["hi"]) for op in int_model.ops if op.op == "conv"}
    assert (0, 192) in ranges and (0, 255) in ranges and (-128, 127) in ranges
    assert sum(op.op == "add" for op in int_model.ops) == 2
    path = tmp_path / "m.int.safetensors"
    save_integer(path, int_model)
    loaded = load_integer(path)
    assert [op.as_json() for op in loaded.ops] == [op.as_json() for op in int_model.ops]
    x = mobilenet_inputs(64, seed=1)
    out = loaded(x)
    assert torch.equal(out, int_model(x)) and out.dtype == torch.int32
    with torch.no_grad():
        reference = model(x).double()
    logits = out.double() * loaded.output_scale()
    relative = (logits - reference).abs().mean() / reference.std()
    assert relative < 0.05, relative
    assert float((logits.argmax(1) == reference.argmax(1)).double().mean()) >= 0.9


def test_forward_runs_each_residual_add_with_its_convolution() -> None:
    """Each convolution only an add reads runs with that add as one op, whichever input of the
    add it is (the multipliers go with their inputs), and the logits are :meth:`run`'s bit for
    bit; a convolution that something else reads too stays on its own."""
    from inq.quant.bench import integer_pair

    model, _ = integer_pair(residual_net(4), 4, image_size=8, batches=2)
    x = torch.randn(3, 3, 8, 8, generator=torch.Generator().manual_seed(1))
    want = model.run(x)[model.ops[-1].name]
    fused = {add: (conv.name, index) for add, (conv, index) in residual_fusions(model.ops).items()}
    assert fused == {"add": ("_3_conv2", 0), "add_1": ("_4_conv2", 0)}  # not the downsample
    assert torch.equal(model(x), want)
    for add in (op for op in model.ops if op.op == "add"):  # the conv as the second input
        add.inputs.reverse()
        add.attrs["multipliers"].reverse()
    fused = {add: (conv.name, index) for add, (conv, index) in residual_fusions(model.ops).items()}
    assert fused == {"add": ("_3_conv2", 1), "add_1": ("_4_downsample_0", 0)}
    assert torch.equal(model(x), want)
    model.ops[-1].inputs = ["_4_downsample_0"]  # read twice now: the add's other conv fuses
    assert residual_fusions(model.ops)["add_1"] == (model.ops[6], 1)
