"""``inq eval``: rebuilds a model file and evaluates it on the data it records (``--data`` on
top): a packed file or masked checkpoint with float activations, an integer model in integer
arithmetic, an ONNX file in ONNX Runtime or OpenVINO, a QONNX file in qonnx's executor, an RTL
project in its Verilator simulation.

::

    inq eval model.inq.safetensors                 # rebuild, evaluate on its data
    inq eval m.int.safetensors --device cpu        # ... in integer arithmetic
    inq eval m.onnx --runtime openvino             # ONNX files run on the CPU
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from inq.artefact import open_artefact
from inq.cli.base import Command, command_data, data_args, eval_device
from inq.data import build_eval_loader, describe_input, input_preprocessing
from inq.deploy.onnx import OnnxModel, load_onnx, unchecked_digest
from inq.deploy.openvino import RUNTIMES, OpenVinoModel, openvino_version
from inq.deploy.qonnx import QonnxModel, is_qonnx
from inq.evaluation import evaluate
from inq.nn import from_packed
from inq.quant.pipeline import RealOutput
from inq.runfiles import (
    INTEGER_MODEL,
    MASKED_CHECKPOINT,
    ONNX_MODEL,
    PACKED_FILE,
    RTL_PROJECT,
    RUN,
    command_file,
    file_kind,
    load_model,
)


def _eval_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "file",
        help="a packed file (inq export), an integer model (inq calibrate), an ONNX model (inq "
        "export --onnx; run in ONNX Runtime on the CPU), a QONNX model (inq export --qonnx; run "
        "in qonnx's executor, pip install 'inq[fpga]'), an RTL project (inq export --rtl; its "
        "Verilator simulation), a masked checkpoint or a run directory (its packed file)",
    )
    data_args(p, "; ONNX files run on the CPU")
    p.add_argument(
        "--runtime",
        choices=RUNTIMES,
        default=RUNTIMES[0],
        help="which runtime runs an ONNX file on the CPU (default: onnxruntime; openvino needs "
        "pip install 'inq[openvino]')",
    )
    p.add_argument(
        "--resplit",
        action="store_true",
        help="allow --data split_seed/val_fraction other than the run's: the images held out "
        "then include training images, and the figure is labelled so (not the held-out accuracy)",
    )


def _eval(args: argparse.Namespace) -> int:

    device = eval_device(args.device)
    read = args.file
    rtl = Path(read).is_dir() and file_kind(read) == RTL_PROJECT
    header = None if rtl else command_file(
        args.file, "eval", (PACKED_FILE, INTEGER_MODEL, ONNX_MODEL, MASKED_CHECKPOINT, RUN)
    )  # fmt: skip
    kind = RTL_PROJECT if header is None else header.kind
    if args.runtime != RUNTIMES[0] and kind != ONNX_MODEL:
        raise ValueError(f"--runtime {args.runtime} runs ONNX files; {read} is not one ({kind})")
    if header is None:
        from inq.rtl import RtlModel  # Verilator's build of the project: the rtl extra

        model = RtlModel(read)
        description, recorded = model.record["model"], model.record["data"]
        device = torch.device("cpu")
        what = "its Verilog, simulated by Verilator"
    elif header.kind == ONNX_MODEL:
        onnx_model, what = _onnx_model(args.file, args.runtime)
        description, recorded = onnx_model.model, onnx_model.data
        model: torch.nn.Module = onnx_model
        device = torch.device("cpu")
    elif header.kind == INTEGER_MODEL:
        int_model = open_artefact(header)
        description, recorded = int_model.info.get("model", {}), int_model.info.get("data", {})
        model = RealOutput(int_model)
        what = f"integer arithmetic, {int_model.info.get('act_bits')}-bit activations"
    else:
        packed, read = load_model(header)
        description, recorded = packed.model, packed.data
        model = from_packed(packed)
        what = "float activations"
    cfg, resplit = command_data(recorded, args.data, args.resplit)
    if isinstance(model, QonnxModel) and not any(
        word.startswith("eval_batch_size=") for word in args.data
    ):
        cfg["eval_batch_size"] = model.batch  # few large executor calls
    for key in ("in_channels", "num_classes"):
        if key in description and description[key] != cfg[key]:
            raise ValueError(
                f"the model has {key}={description[key]}, the {cfg['name']} data "
                f"{key}={cfg[key]}: evaluate it on the data it was trained on"
            )
    expected = recorded.get("input")
    if expected is not None and expected != input_preprocessing(cfg):
        raise ValueError(
            f"{read} records its input as {describe_input(expected)}; inq's {cfg['name']} "
            f"loader gives {describe_input(input_preprocessing(cfg))}: the accuracy would mean "
            "nothing"
        )
    metrics = evaluate(model.to(device), build_eval_loader(cfg), device)
    total, correct = int(metrics["count"]), round(metrics["acc"] * metrics["count"])
    split = f", re-split {' '.join(resplit)}: NOT the held-out accuracy" if resplit else ""
    print(
        f"{read} ({what}) on {cfg['name']} ({total} samples{split}): accuracy "
        f"{100 * correct / total:.2f}% ({correct}/{total}), loss {metrics['loss']:.4f}"
    )
    return 0


def _onnx_model(path: str, runtime: str = "onnxruntime") -> tuple[OnnxModel | QonnxModel, str]:
    """The ONNX file at ``path`` as a module to evaluate, and where it runs: with ``runtime``
    ``openvino`` in OpenVINO (a QONNX file refused), else a QONNX file
    (:func:`inq.deploy.qonnx.is_qonnx`) in qonnx's executor, any other in ONNX Runtime; where
    is followed by why the file's digest was not checked, if it was not
    (:func:`inq.deploy.onnx.unchecked_digest`)."""
    proto = load_onnx(path)
    unchecked = unchecked_digest(proto)
    note = f"; {unchecked}" if unchecked else ""
    if runtime == "openvino":
        return OpenVinoModel(path, proto), f"OpenVINO {openvino_version()}, CPU{note}"
    if is_qonnx(proto):
        return QonnxModel(proto, path), f"QONNX, qonnx's executor, CPU{note}"
    return OnnxModel(path, proto), f"ONNX Runtime, CPU{note}"


COMMAND = Command(
    "evaluate a model file (packed, masked, integer, ONNX, QONNX) or an RTL project on its data",
    _eval_args,
    _eval,
)
