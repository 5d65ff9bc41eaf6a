"""``inq calibrate``: the integer model of a run, packed file or masked checkpoint: int8 (or
fewer-bit) activations calibrated on its data, BatchNorm folded, requantization as shifts or
multipliers; written, then shown as ``inq info`` shows it, with its accuracy on the calibration
images.

::

    inq calibrate RUN --calibration mse -o m.int.safetensors
    inq calibrate RUN --symmetric -o m.sym.int.safetensors  # zero point 0: TensorRT's form
    inq calibrate RUN --requant-terms 1                     # requantization by shifts only
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable, Iterator
from pathlib import Path

import torch

from inq.cli.base import Command, command_data, data_args, eval_device
from inq.cli.info import integer_table
from inq.cli.output import INT_SUFFIX, SAFETENSORS, default_output, force_arg, writing
from inq.data import calibration_loader, data_record, finetune_loader
from inq.quant.integer import save_integer
from inq.quant.observers import CALIBRATIONS
from inq.quant.pipeline import QuantSettings, quantize
from inq.runfiles import MASKED_CHECKPOINT, PACKED_FILE, RUN, command_file, load_model

CALIBRATE_ACT_BITS = 8  # inq-train makes an integer model only when quant.act_bits is set


def _calibrate_args(p: argparse.ArgumentParser) -> None:
    defaults = QuantSettings()
    p.add_argument("source", help="a run directory, a packed file or a masked checkpoint")
    data_args(p)
    p.add_argument(
        "--calibration",
        choices=CALIBRATIONS,
        default=defaults.calibration,
        help=f"how activation ranges are chosen (default: {defaults.calibration})",
    )
    p.add_argument("--act-bits", type=int, default=CALIBRATE_ACT_BITS,
                   help=f"activation bits, 2-8 (default: {CALIBRATE_ACT_BITS})")  # fmt: skip
    p.add_argument(
        "--input-bits",
        type=int,
        default=defaults.input_bits,
        help=f"bits of the model input, 2-8 (default: {defaults.input_bits}: images are 8-bit)",
    )
    p.add_argument(
        "--batches",
        type=int,
        default=defaults.batches,
        help=f"calibration batches of eval_batch_size images (default: {defaults.batches})",
    )
    p.add_argument(
        "--epochs",
        type=int,
        default=defaults.epochs,
        help=f"fine-tuning epochs with fake-quantized activations (default: {defaults.epochs})",
    )
    p.add_argument("--float-scales", action="store_true",
                   help="any activation scale, not only powers of two (requantizations then "
                   "need multipliers)")  # fmt: skip
    p.add_argument(
        "--symmetric",
        action="store_true",
        help="int8 activations with zero point 0 everywhere, TensorRT's form (its Q/DQ export "
        "has no uint8): ReLU outputs use 0..127 at twice the scale",
    )
    p.add_argument(
        "--symmetric-tolerance",
        type=float,
        default=defaults.symmetric_tolerance,
        help="with --symmetric, refuse if symmetric activations lose more than this share of "
        "the calibration images' top-1 agreement with the float model, against unsigned ones "
        f"(default: {defaults.symmetric_tolerance})",
    )
    p.add_argument(
        "--requant-terms",
        type=int,
        metavar="K",
        help="each requantization multiplier a sum of at most K signed powers of two (1: a "
        "pure shift), so that hardware needs no multiplier (inq export --rtl); default: 31-bit "
        "multipliers",
    )
    p.add_argument(
        "-o",
        "--output",
        help=f"integer model, *{SAFETENSORS} (default: <source stem>{INT_SUFFIX} beside the "
        f"source; of a run directory, <run>{INT_SUFFIX} beside the run)",
    )
    force_arg(p)


def _calibrate(args: argparse.Namespace) -> int:
    settings = QuantSettings(
        act_bits=args.act_bits,
        input_bits=args.input_bits,
        calibration=args.calibration,
        pow2_scales=not args.float_scales,
        batches=args.batches,
        epochs=args.epochs,
        symmetric=args.symmetric,
        symmetric_tolerance=args.symmetric_tolerance,
        requant_terms=args.requant_terms,
    )
    problem = settings.problem()
    if problem is not None:  # before any work
        field, message = problem
        flag = "--" + field.replace("_", "-")
        raise ValueError(f"{flag} {getattr(args, field)}: {message}")
    device = eval_device(args.device)
    header = command_file(args.source, "calibrate", (RUN, MASKED_CHECKPOINT, PACKED_FILE))
    packed, read = load_model(header)
    output = Path(args.output or default_output(Path(args.source), INT_SUFFIX))
    data, _ = command_data(packed.data, args.data)
    with writing(output, read, args.force):
        finetune = finetune_loader(data, seed=0) if settings.epochs else ()  # else unused
        labels: list[torch.Tensor] = []
        calibration = _images(calibration_loader(data, settings.batches, seed=0), labels)
        record = data_record(data)
        int_model, report = quantize(packed, calibration, settings, device, finetune, record)
        save_integer(output, int_model)
    tuned = (
        f", fine-tuned {args.epochs} epochs in {report['finetune_s']:.1f} s" if args.epochs else ""
    )
    print(
        f"{args.source} -> {output}: {args.act_bits}-bit activations, {args.calibration} "
        f"calibration on {data['name']} in {report['calibration_s']:.1f} s{tuned}"
    )
    print(integer_table(int_model, str(output)))
    print(_sample_accuracy(report["top1"], torch.cat(labels), output))
    return 0


def _images(
    batches: Iterable[tuple[torch.Tensor, torch.Tensor]], labels: list[torch.Tensor]
) -> Iterator[torch.Tensor]:
    """The images of each ``(x, y)`` batch, its labels appended to ``labels``."""
    for x, y in batches:
        labels.append(y)
        yield x


def _sample_accuracy(top1: dict[str, torch.Tensor], labels: torch.Tensor, output: Path) -> str:
    """The line that says whether the integer model works: its accuracy and the model's with
    float activations (the source's) on the calibration images the lowering kept, and how often
    the two agree."""
    count = len(top1["integer"])
    labels = labels[:count]

    def accuracy(predicted: torch.Tensor) -> str:
        return f"{100 * (predicted == labels).double().mean().item():.1f} %"

    agree = 100 * (top1["integer"] == top1["float"]).double().mean().item()
    return (
        f"on {count} calibration images: accuracy {accuracy(top1['integer'])} (with float "
        f"activations {accuracy(top1['float'])}), the same top-1 class on {agree:.1f} %; "
        f"inq eval {output} for the held-out accuracy"
    )


COMMAND = Command(
    "integer model: calibrate int8 activations, fold BatchNorm", _calibrate_args, _calibrate
)
