"""End to end: the console script on tiny settings, its artefacts, sweeps and bad input."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from train_helpers import TINY, inq_train, killed_and_resumed, refused_run

from inq import INQScheduler, pow2_levels
from inq.errors import ConfigError
from inq.masked import load_masked
from inq.models import build_model
from inq.packed import load_packed


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("run")
    proc = inq_train(*TINY, f"hydra.run.dir={out}")
    (out / "stdout.txt").write_text(proc.stdout)
    return out


@pytest.mark.slow
def test_export_holds_only_power_of_two_weights_with_full_masks(run_dir: Path) -> None:
    ckpt = load_masked(run_dir / "model_masked.safetensors")
    assert (ckpt.bits, ckpt.stage, ckpt.portions) == (5, 4, (0.3, 0.6, 0.8, 1.0))
    assert len(ckpt.masks) == 4
    for key, mask in ckpt.masks.items():
        assert mask.all(), key
        assert torch.isin(ckpt.state[key], pow2_levels(ckpt.n1[key], ckpt.bits)).all(), key
    model = build_model(ckpt.model)  # the metadata alone rebuilds the architecture
    model.load_state_dict(ckpt.state)


@pytest.mark.slow
def test_packed_export_decodes_to_the_masked_weights(run_dir: Path) -> None:
    masked = load_masked(run_dir / "model_masked.safetensors")
    packed = load_packed(run_dir / "model.inq.safetensors").state_dict()
    for key, value in masked.state.items():
        assert torch.equal(packed[key], value), key
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["files"]["packed"] == str(run_dir / "model.inq.safetensors")
    packed_sizes = summary["packed"]
    assert packed_sizes["dense_bytes"] / packed_sizes["fp32_bytes"] == pytest.approx(
        8 / 32, rel=0.02
    )
    assert packed_sizes["ratio"] <= 5 / 32 * 1.01  # a bitmap and 4-bit values: at most ~5 bits


@pytest.mark.slow
def test_summary_checkpoints_and_table(run_dir: Path) -> None:
    summary = json.loads((run_dir / "summary.json").read_text())
    assert list(summary["stages"]) == ["stage1", "stage2", "stage3", "stage4"]
    assert summary["stages"]["stage4"]["portion"] == 1.0
    assert summary["final_acc"] == summary["stages"]["stage4"]["acc"]
    assert 0.0 <= summary["float_acc"] <= 1.0
    assert set(summary["timings_s"]) == {"float", "stage1", "stage2", "stage3", "stage4"}
    folder = run_dir / "checkpoints"
    # trainer.keep_checkpoints=1: the newest stage checkpoint only, a second name of latest.pt
    assert sorted(p.name for p in folder.iterdir()) == ["float.pt", "latest.pt", "stage4.pt"]
    assert (folder / "stage4.pt").samefile(folder / "latest.pt")
    for name in ("latest", "float", "stage4"):
        state = torch.load(folder / f"{name}.pt", weights_only=True)
        assert state["format"] == "inq-train/1"
    stdout = (run_dir / "stdout.txt").read_text()
    assert "-> 5-bit INQ" in stdout
    for row in ("float", "stage1", "stage4"):
        assert f"\n{row} " in stdout


@pytest.mark.slow
def test_readme_names_every_file_of_a_run(run_dir: Path) -> None:
    """Issue 12: model.inq.safetensors was missing from the README's list of a run's files."""
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    paragraph = readme.split("Each run directory", 1)[1].split("Resume is", 1)[0]
    made = sorted(p.name for p in run_dir.iterdir() if p.name not in (".hydra", "stdout.txt"))
    assert made and [name for name in made if f"`{name}" not in paragraph] == []


@pytest.mark.slow
def test_tensorboard_events_carry_the_tags(run_dir: Path) -> None:
    events = EventAccumulator(str(run_dir / "tb"), size_guidance={"scalars": 0, "histograms": 0})
    events.Reload()
    scalars, histograms = set(events.Tags()["scalars"]), set(events.Tags()["histograms"])
    model = build_model({"name": "digits_cnn", "num_classes": 10, "in_channels": 1})
    layers = [layer.name for layer in INQScheduler(model).layers]
    expected = {"train/loss", "train/acc", "train/lr", "val/loss", "val/acc", "inq/stage"}
    expected |= {"inq/quantized_fraction"}
    expected |= {f"inq/quantized_fraction/{name}" for name in layers}
    expected |= {f"inq/quant_error/{name}" for name in layers}
    assert expected <= scalars
    assert {f"weights/{name}" for name in layers} <= histograms
    assert "val/acc_top5" not in scalars  # 10 classes: top-5 says little
    assert events.Scalars("inq/quantized_fraction")[-1].value == 1.0
    stages = [(e.step, e.value) for e in events.Scalars("inq/stage")]
    assert stages[-1][1] == 4
    # issue 33: no tag gets two points at one step (at a stage boundary: the new stage's)
    for tag in scalars:
        steps = [e.step for e in events.Scalars(tag)]
        assert len(steps) == len(set(steps)), tag
    assert [value for _, value in stages] == [1, 2, 3, 4, 4]  # stage k from its start on


@pytest.mark.slow
def test_final_bias_norm_epochs_leave_the_quantized_weights_alone(tmp_path: Path) -> None:
    inq_train(
        *TINY, "inq.final_epochs=1", "trainer.keep_checkpoints=2", f"hydra.run.dir={tmp_path}"
    )
    kept = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert kept == ["bias_norm.pt", "float.pt", "latest.pt", "stage4.pt"]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert list(summary["stages"])[-1] == "bias_norm"
    assert summary["final_acc"] == summary["stages"]["bias_norm"]["acc"]
    before = torch.load(tmp_path / "checkpoints" / "stage4.pt", weights_only=True)["model"]
    after = load_masked(tmp_path / "model_masked.safetensors")
    for key in after.masks:  # the quantized weights: bit for bit as at the last stage
        assert torch.equal(after.state[key], before[key]), key
    trained = [k for k in before if k not in after.masks and k.endswith(("bias", "weight"))]
    assert trained and any(not torch.equal(after.state[k], before[k]) for k in trained)


@pytest.mark.slow
def test_multirun_gives_each_job_its_own_directory(tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    inq_train("-m", "inq.bits=3,4", *TINY, "inq.portions=[0.5,1.0]", f"hydra.sweep.dir={sweep}")
    bits = [json.loads((sweep / job / "summary.json").read_text())["bits"] for job in ("0", "1")]
    assert bits == [3, 4]
    assert load_masked(sweep / "1" / "model_masked.safetensors").bits == 4


@pytest.mark.slow
@pytest.mark.parametrize(
    ("overrides", "message"),
    [  # the console's paths: Hydra's errors and a ConfigError, each in one line
        (["inq.bitz=5"], "inq-train: error: inq.bitz: unknown key; inq has ['auto', 'bits', "),
        (["prune.schedule=exp"], "prune.schedule: must be one of cubic, linear, got 'exp'\n"),
        (["inq.bits=9"], "inq-train: error: inq.bits: bits must be an integer from 2 to 8"),
    ],
)
def test_bad_input_ends_in_one_message_naming_the_key(
    tmp_path: Path, overrides: list[str], message: str
) -> None:
    proc = inq_train(*overrides, f"hydra.run.dir={tmp_path / 'run'}", check=False)
    assert proc.returncode != 0
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr


@pytest.mark.parametrize(
    ("overrides", "message"),
    [  # ConfigErrors from every stage of a run's set-up, which the console prints as one line
        (["data=cifar10", "data.root=/no/such/dir"], "data.root: /no/such/dir"),
        (["data.num_classes=5"], "data.num_classes: digits has 10 classes, not 5"),
        (["data.in_channels=3"], "data.in_channels: digits images have 1 channel(s), not 3"),
        (["model.name=resnet1000"], "model.name: unknown model 'resnet1000'"),
        (["model.checkpoint=GARBAGE"], "model.checkpoint: cannot read"),
        (["inq.include=[conv9]"], "inq.include: include pattern 'conv9'"),
        (["quant.act_bits=9"], "quant.act_bits: from 2 to 8, got 9"),
        (["prune.layers=[head:0.9]"], "prune.layers: pattern 'head' matches no"),
        (["inq.exclude=[*]"], "inq.exclude: exclude ['*'] leaves no layer"),
        (["trainer.amp=true"], "trainer.amp: float16 autocast runs on a CUDA"),
        (["trainer.amp=fp16"], "trainer.amp: float16 autocast runs on a CUDA"),
        (  # refused before any training: Hardswish has no integer form here
            [
                "data=synthetic",
                "model=torchvision",
                "model.name=mobilenet_v3_small",
                "quant.act_bits=8",
            ],
            "quant.act_bits: no integer model of mobilenet_v3_small: the integer model cannot "
            "express module 'features.0.2' (Hardswish)",
        ),
    ],
)
def test_a_run_refuses_bad_input_naming_the_key(
    tmp_path: Path, overrides: list[str], message: str
) -> None:
    from hydra import compose, initialize_config_module

    from inq.train.config import register

    garbage = tmp_path / "float.pt"
    garbage.write_bytes(b"\x00garbage")
    register()
    with initialize_config_module("inq.conf", version_base="1.3"):
        cfg = compose("config", [o.replace("GARBAGE", str(garbage)) for o in overrides])
    assert str(refused_run(cfg, tmp_path / "run")).startswith(message)
    assert not (tmp_path / "run").exists()  # a refused start leaves nothing


@pytest.mark.slow
def test_what_hydra_would_fail_on_ends_in_one_line(tmp_path: Path) -> None:
    """Issue 33: Hydra's own tracebacks (a run directory that is a file), a Slurm sweep without
    Slurm (which left a multirun/ folder behind): the callback runs on both of Hydra's paths."""
    (tmp_path / "afile").write_text("mine")
    cases = {
        ("hydra.run.dir=afile",): "hydra.run.dir: afile is a file, not a directory",
        ("-m", "hydra/launcher=submitit_slurm", "inq.bits=4,5"): "hydra/launcher: submitit_slurm "
        "submits to Slurm, but",
    }
    for overrides, message in cases.items():
        proc = inq_train(*overrides, cwd=tmp_path, check=False)
        assert proc.returncode == 1, (overrides, proc.stderr)
        assert proc.stderr.startswith(f"inq-train: error: {message}"), proc.stderr
        assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
        assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"], overrides


@pytest.mark.parametrize(
    ("folder", "message"),
    [
        ("", "hydra.run.dir: is empty; name the directory"),  # it trained into the cwd
        ("/proc/version/run", "hydra.run.dir: cannot make /proc/version/run: "),
    ],
)
def test_an_unusable_run_directory_ends_in_one_line(
    folder: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from inq.train.app import HydraChecks

    config = OmegaConf.create({"hydra": {"run": {"dir": folder}}})
    with pytest.raises(SystemExit) as stop:
        HydraChecks().on_run_start(config)
    assert stop.value.code == 1
    assert capsys.readouterr().err.startswith(f"inq-train: error: {message}")


@pytest.mark.slow
def test_a_checkpoint_holding_nan_is_refused(tmp_path: Path) -> None:
    model = build_model({"name": "digits_cnn", "num_classes": 10, "in_channels": 1, "width": 16})
    state = model.state_dict()
    state["1.bias"][0] = float("nan")
    torch.save(state, tmp_path / "float.pt")
    proc = inq_train(
        f"model.checkpoint={tmp_path / 'float.pt'}",
        f"hydra.run.dir={tmp_path / 'run'}",
        check=False,
    )
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert "model.checkpoint: " in proc.stderr
    assert "holds NaN or infinite values in '1.bias'" in proc.stderr


@pytest.mark.slow
def test_help_describes_inq() -> None:
    proc = inq_train("--help")
    assert proc.stdout.startswith("inq-train: Incremental Network Quantization")
    for text in ("inq-train trainer.resume=DIR", "data: cifar10, cifar100, digits", "bits: 5"):
        assert text in proc.stdout
    assert "optim: adamw, sgd\n" in proc.stdout  # issue 33: not the schemas as choices


@pytest.mark.slow
def test_progress_is_one_line_per_epoch_without_a_terminal(run_dir: Path) -> None:
    lines = [
        line for line in (run_dir / "stdout.txt").read_text().splitlines() if " epoch " in line
    ]
    pattern = (
        r"- (float|stage[1-4]) epoch 1/1: loss \d+\.\d{4}, acc \d+\.\d\d %, lr \S+, "
        r"elapsed \d+:\d\d, ETA \d+:\d\d$"
    )
    assert len(lines) == 5 and all(re.search(pattern, line) for line in lines), lines
    assert lines[-1].endswith("ETA 0:00")


def test_symmetric_activations_that_lose_too_much_name_the_tolerance() -> None:
    """The integer phase turns calibrate's refusal into the config error of the key to change
    (what it measures: test_quant_lower.py)."""
    from inq.quant.pipeline import SymmetricLossError
    from inq.train.integer import _no_integer_model_if_fails

    def refused() -> None:
        raise SymmetricLossError("symmetric activations ... 5.0 points lost")

    with pytest.raises(ConfigError) as info:
        _no_integer_model_if_fails(refused)
    assert info.value.key == "quant.symmetric_tolerance"
    assert str(info.value) == "quant.symmetric_tolerance: symmetric activations ... 5.0 points lost"


@pytest.mark.slow
def test_integer_phase_writes_a_sound_integer_model_and_resumes_exactly(tmp_path: Path) -> None:
    from inq.cli import main
    from inq.train.checkpoint import KILL_ENV

    quant = ("quant.act_bits=8", "quant.epochs=2", "quant.batches=2")
    whole, killed = tmp_path / "whole", tmp_path / "killed"
    inq_train(*TINY, *quant, f"hydra.run.dir={whole}")
    proc = inq_train(*TINY, *quant, f"hydra.run.dir={killed}", env={KILL_ENV: "quant:2"},
                     check=False)  # fmt: skip
    assert proc.returncode != 0 and not (killed / "model.int.safetensors").exists()
    inq_train(*TINY, *quant, f"trainer.resume={killed}")
    # killed after the first fine-tuning epoch, redone: the same integer model, byte for byte
    int_file = (whole / "model.int.safetensors").read_bytes()
    assert (killed / "model.int.safetensors").read_bytes() == int_file
    summary = json.loads((whole / "summary.json").read_text())
    integer = summary["integer"]
    assert integer["act_bits"] == 8 and len(integer["finetune_loss"]) == 2
    assert summary["files"]["integer"] == str(whole / "model.int.safetensors")
    assert main(["verify", str(whole / "model.int.safetensors")]) == 0
    # issue 33: resuming without the integer phase would orphan its file: refused, nothing lost
    proc = inq_train(f"trainer.resume={whole}", "quant.act_bits=null", check=False)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert "inq-train: error: quant.act_bits: " in proc.stderr
    assert (whole / "model.int.safetensors").read_bytes() == int_file
    events = EventAccumulator(str(whole / "tb"), size_guidance={"scalars": 0})
    events.Reload()
    scalars = set(events.Tags()["scalars"])
    assert {"quant/loss", "val/int_acc", "quant/log2_scale/input", "quant/clipped/input"} <= scalars
    assert events.Scalars("val/int_acc")[-1].value == pytest.approx(integer["acc"])
    assert len(events.Scalars("quant/log2_scale/input")) == 3  # calibration, 2 epochs
    killed_events = EventAccumulator(str(killed / "tb"), size_guidance={"scalars": 0})
    killed_events.Reload()
    assert [(e.step, e.value) for e in killed_events.Scalars("quant/loss")] == [
        (e.step, e.value) for e in events.Scalars("quant/loss")
    ]


@pytest.mark.slow
def test_pruned_run_keeps_its_zeros_everywhere_and_resumes_exactly(tmp_path: Path) -> None:
    import onnx
    from onnx import numpy_helper

    from inq.cli import main
    from inq.deploy.onnx import export_onnx
    from inq.quant.integer import load_integer

    prune = ("prune.sparsity=0.6", "prune.layers=[12:0.9]", "prune.steps=2", "prune.epochs=1")
    prune += ("quant.act_bits=8", "quant.batches=1")  # the integer model keeps the zeros too
    settings = (*TINY, *prune, "trainer.checkpoint_every=3", "trainer.keep_checkpoints=null")
    whole, killed = tmp_path / "whole", tmp_path / "killed"
    inq_train(*settings, f"hydra.run.dir={whole}")
    # killed mid-round 1 (steps 9-16), then after round 2
    killed_and_resumed(settings, killed, ("step:14", "prune:2"))
    for name in ("model_masked.safetensors", "model.inq.safetensors", "model.int.safetensors"):
        assert (killed / name).read_bytes() == (whole / name).read_bytes(), name

    summary = json.loads((whole / "summary.json").read_text())
    assert list(summary["stages"])[:2] == ["prune1", "prune2"]
    stage1 = summary["stages"]["stage1"]  # the log counts pruned weights as the table does
    assert (
        f"stage 1: {100 * stage1['portion']:.1f} % of the weights quantized "
        f"({100 * stage1['pruned']:.1f} % pruned to zero)"
    ) in (whole / "app.log").read_text()
    assert summary["prune"]["targets"] == {"0": 0.6, "3": 0.6, "7": 0.6, "12": 0.9}
    ckpt = load_masked(whole / "model_masked.safetensors")
    state = torch.load(whole / "checkpoints" / "latest.pt", weights_only=True)
    layers = state["inq"]["layers"]
    pruned_total = sum(layer["pruned"] for layer in layers.values())
    assert summary["pruned_fraction"] == pruned_total / sum(m.numel() for m in ckpt.masks.values())
    packed = load_packed(whole / "model.inq.safetensors")
    export_onnx(packed, tmp_path / "m.onnx", (1, 8, 8))
    onnx_weights = {
        t.name: torch.from_numpy(numpy_helper.to_array(t).copy())
        for t in onnx.load(tmp_path / "m.onnx").graph.initializer
    }
    int_model = load_integer(whole / "model.int.safetensors")
    int_codes = {  # the integer model's conv/linear ops hold the packed codes
        op.attrs["module"]: int_model.op_tensors(op.name)["codes"]
        for op in int_model.ops
        if "module" in op.attrs
    }
    prune2 = torch.load(whole / "checkpoints" / "prune2.pt", weights_only=True)
    for name, layer in prune2["inq"]["layers"].items():
        pruned = layer["codes"] == 0  # before stage 1 the only frozen weights are the pruned
        assert int(pruned.sum()) == layer["pruned"] == layers[name]["pruned"]
        key, zeros = f"{name}.weight", torch.zeros(int(pruned.sum()))
        assert torch.equal(int_codes[name], packed.layers[key].packed), key
        for weight in (ckpt.state[key], packed.layers[key].weight(), onnx_weights[key]):
            assert torch.equal(weight.reshape(pruned.shape)[pruned], zeros), key
    assert main(["verify", str(whole / "model.inq.safetensors")]) == 0
    events = EventAccumulator(str(whole / "tb"), size_guidance={"scalars": 0})
    events.Reload()
    sparsity = [e.value for e in events.Scalars("prune/sparsity/12")]
    assert sparsity[0] < sparsity[-1] == float(torch.tensor(576 / 640, dtype=torch.float32))
