"""The targets of ``inq export`` (inq.deploy.target, inq.deploy.TARGETS): the command's flags and
options come from the registry, and each target's check passes on what it wrote and fails on a
changed file."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from export_fixtures import residual_integer_model
from onnx import numpy_helper

from inq.cli import build_parser
from inq.deploy import TARGETS
from inq.deploy.onnx import export_qdq
from inq.deploy.qonnx import export_qonnx


def test_every_target_is_a_flag_of_inq_export_with_its_options() -> None:
    assert list(TARGETS) == ["onnx", "qonnx", "hls4ml", "rtl"]
    export = build_parser().parse_args(["export", "x"])
    for target in TARGETS.values():
        assert getattr(export, target.name) is False
        assert all(getattr(export, option) is None for option in target.options)
        assert target.suffix in ("", ".onnx") and target.source.kinds


@pytest.mark.parametrize(
    ("name", "export"), [("onnx", export_qdq), ("qonnx", export_qonnx)], ids=["onnx", "qonnx"]
)
def test_a_targets_check_passes_its_output_and_fails_a_changed_one(
    name: str, export, tmp_path: Path
) -> None:
    path = tmp_path / "m.onnx"
    export(residual_integer_model(), path, (2, 4, 4))
    check = TARGETS[name].check
    assert check(path) is None
    proto = onnx.load(path)
    weight = max(proto.graph.initializer, key=lambda t: int(np.prod(t.dims)))
    values = numpy_helper.to_array(weight).copy()
    values.flat[0] = -values.flat[0] if values.flat[0] else 1
    weight.CopyFrom(numpy_helper.from_array(values, weight.name))
    onnx.save(proto, path)  # its recorded digest no longer matches
    assert check(path) is not None
