"""inq-train with inq.method=oneshot|ste: summaries, exact exports, STE kill-and-resume."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from train_helpers import TINY, inq_train

import inq
from inq.deploy.verify import verify_masked
from inq.masked import load_masked
from inq.train.checkpoint import KILL_ENV, load_checkpoint

STE = (*TINY, "inq.method=ste", "inq.bits=3", "trainer.checkpoint_every=3")


def summary_of(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


@pytest.mark.slow
def test_oneshot_rounds_the_float_model_once_without_retraining(tmp_path: Path) -> None:
    inq_train(*TINY, "inq.method=oneshot", "inq.bits=4", f"hydra.run.dir={tmp_path}")
    s = summary_of(tmp_path)
    assert (s["method"], s["bits"], s["portions"], s["seed"]) == ("oneshot", 4, [1.0], 0)
    assert s["retrain_epochs"] == 0 and list(s["stages"]) == ["oneshot"]
    float_state = load_checkpoint(tmp_path / "checkpoints" / "float.pt")["model"]
    ckpt = load_masked(tmp_path / "model_masked.safetensors")
    assert verify_masked(ckpt).ok
    for key, n1 in ckpt.n1.items():
        w = float_state[key]
        assert n1 == inq.pow2_n1(w)
        assert torch.equal(ckpt.state[key], inq.pow2_quantize(w, n1, 4))
    others = [k for k in float_state if k not in ckpt.n1]  # biases, BatchNorm: as trained
    assert "12.bias" in others and "1.running_var" in others
    assert all(torch.equal(ckpt.state[k], float_state[k]) for k in others)


@pytest.fixture(scope="module")
def ste_reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("ste")
    inq_train(*STE, "inq.final_epochs=1", f"hydra.run.dir={out}")
    return out


@pytest.mark.slow
def test_ste_trains_for_inq_epoch_budget_and_exports_exact_powers_of_two(
    ste_reference: Path,
) -> None:
    s = summary_of(ste_reference)
    assert (s["method"], s["bits"], s["portions"]) == ("ste", 3, [1.0])
    assert s["retrain_epochs"] == 4 * 1 + 1  # four default portions x inq.epochs + final_epochs
    assert list(s["stages"]) == ["ste"] and s["stages"]["ste"]["portion"] == 1.0
    report = verify_masked(load_masked(ste_reference / "model_masked.safetensors"))
    assert report.ok, report.table()
    # shadows only during training: the float checkpoint and the export hold plain weights
    for name in ("float.pt", "ste.pt"):
        keys = load_checkpoint(ste_reference / "checkpoints" / name)["model"].keys()
        assert not any("parametrizations" in k for k in keys), name
    float_model = load_checkpoint(ste_reference / "checkpoints" / "float.pt")["model"]
    ckpt = load_masked(ste_reference / "model_masked.safetensors")
    assert ckpt.n1 == {k: inq.pow2_n1(float_model[k]) for k in ckpt.n1}  # n1 of the float model


@pytest.mark.slow
def test_ste_killed_mid_training_and_in_the_final_eval_resumes_bit_identically(
    tmp_path: Path, ste_reference: Path
) -> None:
    run_dir = tmp_path / "run"
    # 8 steps per epoch: float is steps 1-8, STE 9-48. step:20 replays 2 steps from the
    # checkpoint at 18 (shadows under parametrized keys); eval:1 is the first evaluation of the
    # resumed process, after finalize, so the next resume finalizes again from latest.pt.
    for attempt, kill_at in enumerate(("step:20", "eval:1", None)):
        overrides = [*STE, "inq.final_epochs=1", f"hydra.run.dir={run_dir}"]
        if attempt:
            overrides.append(f"trainer.resume={run_dir}")
        proc = inq_train(*overrides, env={KILL_ENV: kill_at or ""}, check=kill_at is None)
        if kill_at:
            assert proc.returncode == -9, proc.stderr[-2000:]
    reference = load_file(ste_reference / "model_masked.safetensors")
    resumed = load_file(run_dir / "model_masked.safetensors")
    assert resumed.keys() == reference.keys()
    assert all(torch.equal(resumed[k], reference[k]) for k in reference)
    assert summary_of(run_dir)["final_acc"] == summary_of(ste_reference)["final_acc"]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["inq.method=qat"], "inq.method"),
        (["inq.method=ste", "inq.portions=[0.5]"], "inq-train: error: inq.portions: portions"),
    ],
)
def test_bad_method_settings_end_in_one_message(
    tmp_path: Path, overrides: list[str], message: str
) -> None:
    proc = inq_train(*overrides, f"hydra.run.dir={tmp_path}", check=False)
    assert proc.returncode != 0 and message in proc.stderr
    assert "Traceback" not in proc.stderr
