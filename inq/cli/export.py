"""``inq export``: a masked checkpoint (or a run's) as packed low-bit codes, and any model file
as ONNX, QONNX, an hls4ml or a Verilog project: the targets of :data:`inq.deploy.TARGETS`, whose
flags, options and refusals this command builds from that list.

::

    inq export RUN_OR_CHECKPOINT -o model.inq.safetensors   # masked checkpoint -> packed codes
    inq export RUN --onnx -o model.onnx                      # float-activation ONNX model
    inq export m.int.safetensors --onnx -o m.qdq.onnx        # integer model as a Q/DQ graph
    inq export m.int.safetensors --rtl -o prj/               # Verilog, no multiplier
"""

from __future__ import annotations

import argparse
from pathlib import Path

from inq.artefact import open_artefact
from inq.cli.base import Command, command_data
from inq.cli.info import sizes_line
from inq.cli.output import PACKED_SUFFIX, SAFETENSORS, default_output, force_arg, writing
from inq.data import data_record
from inq.deploy import TARGETS
from inq.deploy.target import Job, Target
from inq.masked import MASKED_FORMATS
from inq.packed import export_packed
from inq.runfiles import MASKED_CHECKPOINT, RUN, command_file

_FLAGS = [f"--{name}" for name in TARGETS]


def _export_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "source",
        help="a run directory or a masked checkpoint; with --onnx also a packed file or an "
        "integer model (inq calibrate); with --qonnx, --hls4ml or --rtl an integer model, or a "
        "run directory holding one",
    )
    p.add_argument(
        "-o",
        "--output",
        help=f"packed file, *{SAFETENSORS} (default: <source stem>{PACKED_SUFFIX} beside the "
        f"source; of a run directory, <run>{PACKED_SUFFIX} beside the run)",
    )
    for target in TARGETS.values():
        p.add_argument(f"--{target.name}", action="store_true", help=target.help)
    for target in reversed(TARGETS.values()):  # the --rtl options came first, then --hls4ml's
        target.add_options(p)
    p.add_argument("--data", nargs="*", default=[], metavar="NAME|KEY=VALUE",
                   help=f"with {'/'.join(_FLAGS)}, for a file that records no data: the input "
                   "size")  # fmt: skip
    p.add_argument(
        "--dense",
        action="store_true",
        help="store every layer as dense code rows (default: sparse, a bitmap or gaps, where "
        "that is smaller)",
    )
    force_arg(p, project=True)


def _export(args: argparse.Namespace) -> int:
    chosen = [name for name in TARGETS if getattr(args, name)]
    if len(chosen) > 1:
        raise ValueError(f"{' and '.join('--' + name for name in chosen)}: choose one")
    with_ = f"--{chosen[0]}" if chosen else "the packed export"
    for target in TARGETS.values():
        for option in target.options:
            value = getattr(args, option)
            if value is not None and not getattr(args, target.name):
                flag = "--" + option.replace("_", "-")
                raise ValueError(f"{flag} {value}: only with --{target.name}, not with {with_}")
    if args.dense and chosen:
        raise ValueError(f"--dense: only with the packed export, not with --{chosen[0]}")
    if args.data and not chosen:
        raise ValueError(
            f"--data: only with {', '.join(_FLAGS[:-1])} or {_FLAGS[-1]} (the packed file keeps "
            "the data record of the checkpoint it is made from)"
        )
    if chosen:
        return _export_to(TARGETS[chosen[0]], args)
    header = command_file(args.source, "export", (RUN, MASKED_CHECKPOINT), MASKED_FORMATS,
                          MASKED_CHECKPOINT)  # fmt: skip
    source = header.path
    output = Path(args.output or default_output(Path(args.source), PACKED_SUFFIX))
    with writing(output, source, args.force):
        ckpt = open_artefact(header)
        ckpt.data = data_record(ckpt.data)
        stats = export_packed(ckpt, output, sparse=not args.dense)
    print(f"{source} -> {output}")
    print(sizes_line(stats))
    return 0


def _export_to(target: Target, args: argparse.Namespace) -> int:
    """``inq export --NAME``: the source it reads (a file, or a run's model), its ``-o``, the
    one rule every export keeps (:func:`inq.cli.output.writing`), then the target writes."""
    source = target.source
    model = {"formats": source.formats, "what": source.model} if source.formats else {}
    header = command_file(args.source, f"export --{target.name}", source.kinds, **model)
    if not args.output:
        raise ValueError(f"--{target.name} needs -o {target.output}")
    output = Path(args.output)
    with writing(output, header.path, args.force, target.suffix):
        lines = target.write(
            Job(
                header, Path(args.source), output, args, lambda rec: command_data(rec, args.data)[0]
            )
        )
    for line in lines:
        print(line)
    return 0


COMMAND = Command(
    "write a model as packed low-bit codes, ONNX, QONNX, an hls4ml project or Verilog (RTL)",
    _export_args,
    _export,
)
