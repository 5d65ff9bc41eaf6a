"""Every config group option and every experiment composes, validates and instantiates."""

from __future__ import annotations

import copy
import os
from collections.abc import Iterator
from enum import Enum
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir, initialize_config_module
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import ConfigCompositionException
from omegaconf import DictConfig, OmegaConf
from train_helpers import TINY, inq_train, inq_train_here, refused_run

from inq.data import FASHION_MNIST_ROOT, build_datasets
from inq.errors import ConfigError
from inq.levels import GRANULARITIES, N1_RULES
from inq.models import build_model
from inq.partition import STRATEGIES
from inq.prune import SCHEDULES
from inq.train.build import build_lr_schedule, build_optimizer
from inq.train.config import (
    AdamWConfig,
    Config,
    Granularity,
    N1Rule,
    PruneSchedule,
    SGDConfig,
    Strategy,
    register,
    to_dict,
    validate,
)
from inq.train.phases import plan_phases

CONF = Path(__file__).parents[1] / "conf"
EXPERIMENTS = Path(__file__).parents[1] / "experiments"
OPTIONS = [
    (group.name, option.stem)
    for group in sorted(CONF.iterdir())
    if group.is_dir() and not group.name.startswith("_")
    for option in sorted(group.glob("*.yaml"))
]
NEEDS_ROOT = {"cifar10", "cifar100", "imagenet", "mnist"}
if not Path(FASHION_MNIST_ROOT).is_dir():  # the Debian package is not installed here
    NEEDS_ROOT.add("fashion_mnist")


@pytest.fixture
def conf() -> Iterator[None]:
    register()
    with initialize_config_module("inq.conf", version_base="1.3"):
        yield


@pytest.fixture(scope="module")
def default_config() -> DictConfig:
    """``compose("config")``, once: the tests of value overrides apply theirs to a copy."""
    register()
    with initialize_config_module("inq.conf", version_base="1.3"):
        return compose("config")


def overridden(cfg: DictConfig, overrides: list[str]) -> DictConfig:
    """A copy of ``cfg`` with ``key=value`` overrides applied as ``compose`` applies them (the
    parsed value merged in at its key), without composing the defaults again (~0.1 s each)."""
    cfg = copy.deepcopy(cfg)
    for override in OverridesParser.create().parse_overrides(overrides):
        assert not override.is_add() and not override.is_delete(), override
        OmegaConf.update(cfg, override.key_or_group, override.value(), merge=True)
    return cfg


def _instantiate(cfg) -> None:
    """Build everything a run builds from ``cfg`` except the datasets with a local root."""
    cfg = validate(cfg)
    data = to_dict(cfg.data)
    if data["name"] in NEEDS_ROOT:
        with pytest.raises(ConfigError, match=r"^data\.root: "):
            build_datasets(data)
    else:
        train, val = build_datasets(data)
        assert len(train) and len(val)
    model = build_model(to_dict(cfg.model))
    size = cfg.data.image_size if cfg.model.name != "resnet18" else 64
    x = torch.zeros(2, cfg.data.in_channels, size, size)
    assert model.eval()(x).shape == (2, cfg.data.num_classes)
    phases = plan_phases(cfg)
    optimizer = build_optimizer(cfg.optim, model, phases[-1].params, phases[-1].lr)
    build_lr_schedule(cfg.lr, optimizer, epochs=2, steps_per_epoch=3)


def test_the_groups_are_all_there() -> None:
    groups = {g for g, _ in OPTIONS}
    assert groups == {"data", "model", "optim", "lr", "inq", "trainer"}


@pytest.mark.parametrize(("group", "option"), OPTIONS)
def test_every_option_composes_and_instantiates(conf, group: str, option: str) -> None:
    overrides = [f"{group}={option}"]
    if group == "model" and option == "mnist_cnn":  # 28x28 grayscale
        overrides.append("data=mnist")
    elif group == "model" and option != "digits_cnn":  # RGB models on RGB data
        overrides.append("data=synthetic")
    _instantiate(compose("config", overrides=overrides))


@pytest.mark.parametrize("name", sorted(p.stem for p in EXPERIMENTS.glob("*.yaml")))
def test_every_experiment_composes_and_instantiates(name: str) -> None:
    register()
    with initialize_config_dir(str(EXPERIMENTS), version_base="1.3"):
        overrides = ["hydra.searchpath=[pkg://inq.conf]"]
        if "imagenet" in name:
            overrides.append("model.checkpoint=/some/resnet18.pth")
        cfg = compose(name, overrides=overrides)
        assert "hydra" not in cfg
        _instantiate(cfg)


def test_a_misspelt_key_is_refused_by_the_schema(conf) -> None:
    with pytest.raises(ConfigCompositionException, match="bitz"):
        compose("config", overrides=["inq.bitz=5"])


INQ_HAS = "['auto', 'bits', 'budget', 'cache_values', 'distill', 'epochs', 'exclude',"


@pytest.mark.parametrize(
    ("argument", "message"),
    [
        ("quant.act_bits=abc", "quant.act_bits: must be an integer or null, got 'abc'"),
        ("quant.symmetric=maybe", "quant.symmetric: must be true or false, got 'maybe'"),
        ("trainer.compile=maybe", "trainer.compile: must be true or false, got 'maybe'"),
        ("trainer.channels_last=null", "trainer.channels_last: must be true or false, got null"),
        ("inq.bogus_key=1", f"inq.bogus_key: unknown key; inq has {INQ_HAS}"),
        ("inq.cache_values=2", "inq.cache_values: must be true, false or null, got 2"),  # not true
        ("optim.nesterov=1", "optim.nesterov: must be true or false, got 1"),
        ("lr.milestones=[0.5,x]", "lr.milestones: must be a list of numbers, got 'x'"),
        ("inq.strategy=largest", "inq.strategy: must be one of magnitude, random, error, got"),
        ("data=nonexistent", "data: no config 'nonexistent'; the options are cifar10, cifar100,"),
        ("inq.bits=[", "inq.bits=[: cannot parse this override: "),
    ],
)
def test_a_config_value_error_is_one_line_from_the_command_line(
    tmp_path: Path, argument: str, message: str
) -> None:
    """Issue 46: Hydra's and OmegaConf's 7-8 line report, and a number taken for a bool, end in
    one line naming the key, the value and what it must be; nothing is left behind."""
    run_dir = tmp_path / "run"
    status, out, err = inq_train_here(argument, f"hydra.run.dir={run_dir}", cwd=tmp_path)
    assert status == 1
    assert err.startswith(f"inq-train: error: {message}"), err
    assert err.count("\n") == 1 and not out, err
    assert not run_dir.exists()


def test_a_config_file_value_error_is_one_line(tmp_path: Path) -> None:
    """A bad value in an experiment file (not the command line) is the same one line."""
    (tmp_path / "bad.yaml").write_text("defaults:\n  - config\n  - _self_\ntrainer:\n  seed: x\n")
    status, out, err = inq_train_here("--config-dir", str(tmp_path), "--config-name", "bad",
                                      cwd=tmp_path)  # fmt: skip
    assert (status, out, err) == (
        1,
        "",
        "inq-train: error: trainer.seed: must be an integer, got 'x'\n",
    )


def test_a_value_of_the_wrong_type_is_refused(conf) -> None:
    with pytest.raises(ConfigError, match=r"inq\.bits: an integer from 2 to 8, or auto"):
        validate(compose("config", overrides=["inq.bits=five"]))  # a string: auto or nothing
    with pytest.raises(ConfigCompositionException, match="strategy"):
        compose("config", overrides=["inq.strategy=largest"])
    with pytest.raises(ConfigCompositionException, match="n1_rule"):
        compose("config", overrides=["inq.n1_rule=least"])
    with pytest.raises(ConfigCompositionException, match="granularity"):
        compose("config", overrides=["inq.granularity=row"])


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("inq.bits=9", "inq.bits"),
        ("inq.bits=1", "inq.bits"),
        ("inq.portions=[0,1]", "inq.portions"),  # issue 12: the key, not just "inq"
        ("inq.portions=[0.5,0.4,1]", "inq.portions"),
        ("trainer.seed=-1", "trainer.seed"),  # issue 12: a traceback from numpy before
        ("trainer.seed=4294967296", "trainer.seed"),
        ("inq.epochs=-1", "inq.epochs"),
        ("data.batch_size=0", "data.batch_size"),
        ("optim.lr=0", "optim.lr"),
        ("trainer.device=tpu", "trainer.device"),
        ("lr.milestones=[1.5]", "lr.milestones"),
        ("data.train_size=0", "data.train_size"),
        ("data.val_size=0", "data.val_size"),
        ("data.image_size=0", "data.image_size"),
        ("model.width=0", "model.width"),
        ("optim.momentum=-1", "optim.momentum"),
        ("optim.weight_decay=-0.1", "optim.weight_decay"),
        ("trainer.float_epochs=0", "model.checkpoint"),
        ("prune.sparsity=1.0", "prune.sparsity"),
        ("prune.sparsity=-0.5", "prune.sparsity"),
        ("prune.layers=[fc:1.5]", "prune.layers fc"),
        ("prune.layers=[fc]", "prune.layers"),
        ("prune.layers=[fc:x]", "prune.layers"),
        ("prune.layers=[fc:0.9,fc:0.5]", "prune.layers"),
        ("inq.layer_bits=[conv1:9]", "inq.layer_bits"),
        ("inq.layer_bits=[conv1:1]", "inq.layer_bits"),
        ("inq.layer_bits=[conv1]", "inq.layer_bits"),
        ("inq.layer_bits=[conv1:x]", "inq.layer_bits"),
        ("inq.layer_bits=[conv1:8.5]", "inq.layer_bits"),
        ("inq.layer_bits=[conv1:8,conv1:4]", "inq.layer_bits"),
        ("prune.steps=0", "prune.steps"),
        ("prune.epochs=-1", "prune.epochs"),
        ("prune.lr=0", "prune.lr"),
        # issue 33: non-finite numbers, divergent momentum and settings without effect
        ("inq.lr=nan", "inq.lr"),
        ("optim.lr=inf", "optim.lr"),
        ("lr.milestones=[0.5,nan]", "lr.milestones"),
        ("optim.momentum=2", "optim.momentum"),
        ("optim.momentum=1", "optim.momentum"),
        ("lr.milestones=[0.75,0.5]", "lr.milestones"),
        ("lr.milestones=[0.5,0.5]", "lr.milestones"),
        ("lr.warmup_epochs=-1", "lr.warmup_epochs"),
        ("lr.gamma=0", "lr.gamma"),
        ("quant.epochs=2", "quant.epochs"),
        ("quant.calibration=mse", "quant.calibration"),
        ("quant.symmetric=true", "quant.symmetric"),
        ("quant.act_bits=8 quant.symmetric_tolerance=2", "quant.symmetric_tolerance"),
        ("quant.act_bits=8 quant.symmetric_tolerance=0.05", "quant.symmetric_tolerance"),
        ("model.checkpoint=x.pt trainer.float_epochs=5", "trainer.float_epochs"),
        ("trainer.resume=", "trainer.resume"),
        ("trainer.amp=int8", "trainer.amp"),
        ("inq.method=oneshot inq.distill.weight=0.5", "inq.distill.weight"),
        *([("trainer.device=cuda", "trainer.device")] if not torch.cuda.is_available() else []),
    ],
)
def test_validate_names_the_bad_key(default_config, override: str, key: str) -> None:
    cfg = overridden(default_config, override.split())
    with pytest.raises(ConfigError) as info:
        validate(cfg)
    assert info.value.key == key
    assert str(info.value).startswith(f"{key}: ")


@pytest.mark.parametrize(
    "overrides",
    [
        ["model.checkpoint=x.pt", "trainer.float_epochs=0"],  # the checkpoint, stated twice
        ["model.checkpoint=x.pt"],  # float_epochs left at its default: unused, and no surprise
        ["quant.act_bits=8", "quant.epochs=2"],
        ["inq.method=oneshot", "inq.distill.weight=0.5", "quant.act_bits=8", "quant.epochs=1"],
        ["inq.method=oneshot", "inq.distill.weight=0.5", "prune.sparsity=0.5"],
        ["lr.milestones=[0.25,0.5,0.75]"],
        ["trainer.amp=bf16", "trainer.compile=true", "trainer.channels_last=true"],
        ["trainer.amp=fp16", "inq.cache_values=true"],  # fp16: refused off CUDA by the Trainer
    ],
)
def test_meaningful_neighbours_of_the_refused_settings_pass(
    default_config, overrides: list[str]
) -> None:
    validate(overridden(default_config, overrides))


def test_a_missing_mandatory_value_is_named(conf) -> None:
    cfg = compose("config")
    OmegaConf.update(cfg, "model.checkpoint", "???")
    with pytest.raises(ConfigError, match=r"^model\.checkpoint: must be set"):
        validate(cfg)


def test_configs_ship_inside_the_package() -> None:
    import inq.conf

    shipped = Path(os.path.realpath(next(iter(inq.conf.__path__))))
    assert (shipped / "config.yaml").is_file()
    assert sorted(p.name for p in shipped.glob("*/*.yaml")) == sorted(
        p.name for p in CONF.glob("*/*.yaml")
    )


def test_a_force_added_unknown_key_is_refused_by_validate(conf) -> None:
    cfg = compose("config", overrides=["+inq.bitz=5"])
    with pytest.raises(ConfigError, match=r"^inq\.bitz: unknown key"):
        validate(cfg)


def test_adamw_betas_are_checked(conf) -> None:
    cfg = compose("config", overrides=["optim=adamw", "optim.betas=[0.9]"])
    with pytest.raises(ConfigError, match=r"^optim\.betas: two values"):
        validate(cfg)


def test_the_imagenet_experiment_needs_float_weights() -> None:
    register()
    with initialize_config_dir(str(EXPERIMENTS), version_base="1.3"):
        cfg = compose("imagenet_resnet18_5bit", overrides=["hydra.searchpath=[pkg://inq.conf]"])
    with pytest.raises(ConfigError, match=r"^model\.checkpoint: no float weights"):
        validate(cfg)


# ---------------------------------------------------------------- inq.layer_bits


@pytest.mark.parametrize(
    ("override", "message"),
    [
        (
            "inq.layer_bits=[conv1:9]",
            "'conv1': bits must be an integer from 2 to 8 (one bit encodes zero), got 9",
        ),
        ("inq.layer_bits=[fc:x]", "entries are GLOB:BITS, e.g. conv1:8; got 'fc:x'"),
        ("inq.layer_bits=[conv*:8,conv*:4]", "'conv*' is given twice"),
    ],
)
def test_layer_bits_refusals_are_one_message(conf, override: str, message: str) -> None:
    cfg = compose("config", overrides=[override])
    with pytest.raises(ConfigError) as info:
        validate(cfg)
    assert str(info.value) == f"inq.layer_bits: {message}"


def test_layer_bits_and_prune_layers_parse_alike_once(conf) -> None:
    cfg = validate(compose("config", overrides=["inq.layer_bits=[0:8,'conv*:3',12:8]"]))
    assert cfg.inq.bits_by_glob == {"0": 8, "conv*": 3, "12": 8}
    assert cfg.inq.bits_by_glob is cfg.inq.bits_by_glob  # parsed at validation, then kept
    assert validate(compose("config")).inq.bits_by_glob == {}
    cfg = validate(compose("config", overrides=["prune.layers=[12:0.9,'f*:0.5']"]))
    assert cfg.prune.sparsity_by_glob == {"12": 0.9, "f*": 0.5} and cfg.prune.active


def test_validate_returns_the_config_typed(conf) -> None:
    cfg = validate(compose("config", overrides=["optim=adamw", "inq.strategy=random"]))
    assert isinstance(cfg, Config) and isinstance(cfg.optim, AdamWConfig)
    assert cfg.inq.strategy is Strategy.random and cfg.optim.betas == [0.9, 0.999]
    assert isinstance(validate(compose("config")).optim, SGDConfig)


@pytest.mark.parametrize(
    ("schema", "names"),
    [(Strategy, STRATEGIES), (N1Rule, N1_RULES), (Granularity, GRANULARITIES),
     (PruneSchedule, SCHEDULES)],
)  # fmt: skip
def test_the_schema_enums_list_the_library_options(schema: type[Enum], names: tuple) -> None:
    assert tuple(member.name for member in schema) == names


def test_a_layer_bits_glob_matching_no_layer_ends_the_run_before_training(
    conf, tmp_path: Path
) -> None:
    cfg = compose("config", overrides=["inq.layer_bits=[0:8,conv9:8]", *TINY])
    refused = refused_run(cfg, tmp_path / "run")
    assert refused.key == "inq.layer_bits"
    assert str(refused) == (
        "inq.layer_bits: layer_bits glob 'conv9' matches no quantized layer; layers are "
        "['0', '3', '7', '12']"
    )
    assert not (tmp_path / "run" / "checkpoints" / "float.pt").exists()  # no training


@pytest.mark.slow
def test_a_run_with_layer_bits_and_symmetric_activations_records_both(tmp_path: Path) -> None:
    import json

    from inq.masked import load_masked
    from inq.packed import load_packed
    from inq.quant.integer import load_integer

    run_dir = tmp_path / "run"
    settings = ("inq.bits=4", "inq.layer_bits=[0:8,12:8]", "quant.act_bits=8", "quant.batches=1",
                "quant.symmetric=true", "quant.symmetric_tolerance=0.05")  # fmt: skip
    proc = inq_train(*TINY, *settings, f"hydra.run.dir={run_dir}")
    bits = {"0": 8, "3": 4, "7": 4, "12": 8}
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["bits"] == 4 and summary["layer_bits"] == bits
    assert "-> 4-bit INQ (8-bit: 0, 12) " in proc.stdout + proc.stderr
    weights = {f"{name}.weight": b for name, b in bits.items()}
    assert load_masked(run_dir / "model_masked.safetensors").layer_bits == weights
    packed = load_packed(run_dir / "model.inq.safetensors")
    assert {key: layer.bits for key, layer in packed.layers.items()} == weights
    integer = load_integer(run_dir / "model.int.safetensors")
    assert integer.info["weight_bits"] == [4, 8] and integer.info["symmetric"] is True
    assert all(op.attrs["lo"] < 0 or op.attrs["hi"] <= 127 for op in integer.ops)
    assert [op.attrs["bits"] for op in integer.ops if "bits" in op.attrs] == [8, 4, 4, 8]
    state = torch.load(run_dir / "checkpoints" / "latest.pt", weights_only=True)["inq"]
    assert {name: layer["bits"] for name, layer in state["layers"].items()} == bits
