"""build_model: every name builds, from a plain dict, and bad names say which key to fix."""

from __future__ import annotations

import pytest
import torch

from inq import INQScheduler
from inq.errors import ConfigError
from inq.models import build_model


@pytest.mark.parametrize(
    ("name", "shape", "layers"),
    [
        ("digits_cnn", (1, 8, 8), 4),
        ("resnet20", (3, 32, 32), 20),
        ("resnet32", (3, 32, 32), 32),
        ("resnet56", (3, 32, 32), 56),
        ("resnet18", (3, 64, 64), 21),  # torchvision, by name (with 3 1x1 shortcuts)
    ],
)
def test_models_build_from_a_plain_dict(name: str, shape: tuple[int, ...], layers: int) -> None:
    cfg = {"name": name, "num_classes": 7, "in_channels": shape[0], "width": 16}
    model = build_model(cfg).eval()
    assert model(torch.zeros(2, *shape)).shape == (2, 7)
    assert len(INQScheduler(model).layers) == layers  # depth = conv + linear layers, all quantized


def test_unknown_model_names_the_key() -> None:
    with pytest.raises(ConfigError, match=r"^model\.name: unknown model 'resnet1000'"):
        build_model({"name": "resnet1000"})


def test_torchvision_models_take_rgb() -> None:
    with pytest.raises(ConfigError, match=r"^model\.in_channels: "):
        build_model({"name": "resnet18", "in_channels": 1})
