"""inq-train with ``inq.bits=auto``: the config's checks, the scheduler built from an
allocation, and (slow) a run that chooses, shows and uses the bits and resumes to the same
ones after a kill in the allocation."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers import BackpropOnce
from omegaconf import OmegaConf
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from train_helpers import TINY, inq_train, inq_train_here, killed_and_resumed

from inq import models
from inq.errors import ConfigError
from inq.masked import load_masked
from inq.models import build_model
from inq.packed import load_packed
from inq.train.build import build_scheduler
from inq.train.config import Config, SGDConfig, validate
from inq.train.phases import ALLOCATE

AUTO = ("inq.bits=auto", "inq.budget.avg_bits=6", "inq.auto.choices=[4,8]", "inq.auto.batches=1")


def config(**inq: Any) -> Config:
    cfg = OmegaConf.merge(OmegaConf.structured(Config), {"optim": SGDConfig(), "inq": inq})
    return validate(cfg)


@pytest.mark.parametrize(
    ("inq", "key", "message"),
    [
        ({"bits": "auto"}, "inq.budget", "needs one budget"),
        ({"bits": "auto", "budget": {"avg_bits": 4, "bytes": 100}}, "inq.budget", "one budget"),
        ({"bits": "four"}, "inq.bits", "an integer from 2 to 8, or auto"),
        ({"budget": {"avg_bits": 4.0}}, "inq.budget.avg_bits", "no effect without inq.bits=auto"),
        ({"auto": {"method": "hessian"}}, "inq.auto.method", "no effect without inq.bits=auto"),
        ({"bits": "auto", "budget": {"avg_bits": 0}}, "inq.budget.avg_bits", "must be > 0"),
        ({"bits": "auto", "budget": {"bytes": -1}}, "inq.budget.bytes", "must be >= 0"),
        (
            {"bits": "auto", "budget": {"bytes": 9}, "auto": {"choices": []}},
            "inq.auto.choices",
            "is empty",
        ),
        (
            {"bits": "auto", "budget": {"bytes": 9}, "auto": {"choices": [4, 9]}},
            "inq.auto.choices",
            "from 2 to 8",
        ),
    ],
)
def test_the_config_refuses_bad_auto_settings_in_one_line(
    inq: dict[str, Any], key: str, message: str
) -> None:
    with pytest.raises(ConfigError, match=message) as refused:
        config(**inq)
    assert refused.value.key == key and "\n" not in str(refused.value)


def digits_model() -> torch.nn.Module:
    return build_model({"name": "digits_cnn", "num_classes": 10, "in_channels": 1, "width": 16})


@pytest.mark.parametrize(
    ("inq", "key", "message"),
    [
        ({"budget": {"avg_bits": 3.0}}, "inq.budget.avg_bits", "the smallest takes"),
        ({"budget": {"bytes": 100}}, "inq.budget.bytes", "the smallest takes"),
        ({"budget": {"avg_bits": 4.5}, "layer_bits": ["7:8"]}, "inq.layer_bits", "pinned"),
    ],
)
def test_a_budget_no_allocation_meets_is_refused_before_training(
    inq: dict[str, Any], key: str, message: str
) -> None:
    cfg = config(bits="auto", **inq)
    with pytest.raises(ConfigError, match=message) as refused:
        build_scheduler(digits_model(), cfg)
    assert refused.value.key == key


def test_the_scheduler_takes_the_recorded_allocation() -> None:
    cfg = config(bits="auto", budget={"avg_bits": 6.0}, layer_bits=["0:8"])
    model = digits_model()
    before = build_scheduler(model, cfg)  # pinned layer at 8, the others at the largest choice
    assert before.layer_bits == {"0": 8, "3": 8, "7": 8, "12": 8}
    rows = [("0", 144, 8), ("3", 4608, 4), ("7", 18432, 5), ("12", 640, 4)]
    record = {"layers": [{"name": n, "params": p, "bits": b} for n, p, b in rows]}
    sched = build_scheduler(model, cfg, {"history": {ALLOCATE: record}})
    assert sched.layer_bits == {"0": 8, "3": 4, "7": 5, "12": 4}
    assert sched.bits == 5  # the bits most weights got


def test_a_method_the_model_cannot_run_is_refused_before_training(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Hessian traces of a model without second derivatives: refused at the start in one line
    naming the key, not after the float phase (it was), and nothing of a run is left."""
    build = models.build_model
    monkeypatch.setattr(models, "build_model", lambda info: BackpropOnce(build(info)))
    run = tmp_path / "run"
    argv = (*TINY, *AUTO, "inq.auto.method=hessian", f"hydra.run.dir={run}")
    status, out, err = inq_train_here(*argv, cwd=tmp_path)
    assert status == 1 and not out
    assert err.startswith(
        "inq-train: error: inq.auto.method: method 'hessian' cannot differentiate this model "
        "twice: "
    ), err
    assert err.endswith("; the loss method runs forward only\n") and err.count("\n") == 1
    assert not run.exists(), sorted(run.rglob("*"))


def _events(run: Path) -> EventAccumulator:
    events = EventAccumulator(str(run / "tb"), size_guidance={"scalars": 0, "images": 0})
    events.Reload()
    return events


@pytest.mark.slow
def test_an_auto_run_shows_and_uses_the_chosen_bits(tmp_path: Path) -> None:
    run = tmp_path / "run"
    inq_train(*TINY, *AUTO, f"hydra.run.dir={run}")
    summary = json.loads((run / "summary.json").read_text())
    allocation = summary["allocation"]
    chosen = {row["name"]: row["bits"] for row in allocation["layers"]}
    assert set(chosen.values()) == {4, 8}  # 6 average bits: some layers at each
    assert allocation["avg_bits"] <= 6.0 and allocation["method"] == "loss"
    assert all(set(row["sensitivity"]) == {"4", "8"} for row in allocation["layers"])
    assert summary["layer_bits"] == chosen
    masked = load_masked(run / "model_masked.safetensors")
    packed = load_packed(run / "model.inq.safetensors")
    for name, bits in chosen.items():
        assert masked.bits_of(f"{name}.weight") == packed.layers[f"{name}.weight"].bits == bits
    # the budget counts what the packed file stores for the codes, exactly
    assert (
        sum(layer.packed.numel() for layer in packed.layers.values()) == (allocation["total_bytes"])
    )
    log = (run / "app.log").read_text()
    assert "bits chosen (inq.bits=auto, loss sensitivity, packed sizes" in log
    assert f"{allocation['total_bytes']} bytes of a {allocation['budget_bytes']}-byte" in log
    events = _events(run)
    assert "inq/auto/bits" in events.Tags()["images"]
    assert "inq/auto/table/text_summary" in events.Tags()["tensors"]
    assert events.Scalars("inq/auto/avg_bits")[-1].value == pytest.approx(allocation["avg_bits"])
    assert ALLOCATE not in summary["stages"]  # a record, not a phase of epochs


@pytest.mark.slow
def test_a_killed_allocation_resumes_to_the_same_bits(tmp_path: Path) -> None:
    settings = (*TINY, *AUTO, "inq.auto.method=hessian", "inq.auto.samples=2")
    whole, killed = tmp_path / "whole", tmp_path / "killed"
    inq_train(*settings, f"hydra.run.dir={whole}")
    # killed before the allocation's save (measured again), after it (read back), then done
    killed_and_resumed(settings, killed, ("allocate:1", "allocate:2"))
    first, again = (json.loads((d / "summary.json").read_text()) for d in (whole, killed))
    assert again["allocation"] == first["allocation"]
    for name in ("model_masked.safetensors", "model.inq.safetensors"):
        assert (killed / name).read_bytes() == (whole / name).read_bytes(), name
    saved = torch.load(killed / "checkpoints" / "latest.pt", weights_only=True)
    assert saved["history"][ALLOCATE] == first["allocation"]
    # from the end of the float phase (bits not chosen), another calibration batch size is
    # refused in one line, and the run's checkpoints and results stay as they were (its log
    # records the refusal)
    kept = [f for f in whole.rglob("*") if f.is_file() and f.suffix in (".pt", ".safetensors")]
    before = {f: f.read_bytes() for f in [*kept, whole / "summary.json"]}
    resume = f"trainer.resume={whole / 'checkpoints' / 'float.pt'}"
    status, _, err = inq_train_here(resume, "data.eval_batch_size=64", cwd=tmp_path)
    assert status == 1 and err == (
        "inq-train: error: data.eval_batch_size: sizes the batches inq.bits=auto measures, and "
        "this run has not chosen its bits yet: resume with data.eval_batch_size=256 (it may "
        "change once they are chosen)\n"
    )
    assert {f: f.read_bytes() for f in before} == before
