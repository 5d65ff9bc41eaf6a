"""The integer model (inq.quant.integer): its arithmetic, its overflow checks and its file."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from export_fixtures import packed_model
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors import safe_open
from torch import nn

from inq.io import read_safetensors, safetensors_bytes, write_safetensors
from inq.kernels.int8 import shift_linear_int8_reference
from inq.packed import pack_codes
from inq.quant.integer import (
    INT32_MAX,
    IntegerModel,
    accumulator_bound,
    load_integer,
    program_problems,
    requantize,
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


@settings(max_examples=60, deadline=None)
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
