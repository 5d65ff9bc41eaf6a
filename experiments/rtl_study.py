"""The RTL study of issue 49: INQ power-of-two weights against uniform int4/int8 weights of the
same network and sparsity, through the same generator (:mod:`inq.rtl`), on ECP5.

Variants of one network (runs of ``inq-train`` from the same float weights, one seed):

- ``inq3``, ``inq4``, ``inq5``: the integer models the runs wrote (``model.int.safetensors``);
- ``int4``, ``int8``: the float weights the 4-bit run started from (``checkpoints/float.pt``),
  quantized per output channel, symmetric (``scale = max|w| / (2**(b-1) - 1)``), with exactly the
  weights zero in the 4-bit INQ model forced to zero; the INQ 4-bit program's activation scales
  and ranges; BatchNorm folded as :mod:`inq.quant.lower` folds it (bias in accumulator units,
  multiplier and shift per channel by :func:`inq.quant.lower.quantize_multiplier`), recomputed
  for the uniform weight scale. The conv/linear ops carry ``weights`` (int8) in place of
  ``codes``, which :mod:`inq.rtl.logic` turns into the same kind of adder graph.

Every variant is evaluated exactly in integers (:class:`UniformModel`: int64 conv/linear, bias,
round-half-up requantization, clamp; checked equal to the INQ models' own arithmetic on the whole
test split before it is trusted), exported with :func:`inq.rtl.export_rtl` (which simulates 32
random frames, with and without handshake stalls, and refuses a design that differs), and
synthesized by Yosys ``synth_ecp5`` with each layer module kept as a hierarchy boundary (per-layer
and whole-network cells in one run).

    python experiments/rtl_study.py export OUT NET RUN3 RUN4 RUN5 [VARIANT...]  # accuracy, RTL
    python experiments/rtl_study.py count OUT NET RUN3 RUN4 RUN5    # the same, no Verilog
    python experiments/rtl_study.py synth OUT/NET/VARIANT           # Yosys, per layer
    python experiments/rtl_study.py pnr OUT/NET/VARIANT MHZ         # library synth + nextpnr
    python experiments/rtl_study.py report OUT experiments/rtl_study.json experiments/rtl_study.png

``count`` gives accuracy, sparsity and da4ml adders per layer without writing or simulating
Verilog (``OUT/NET/count.json``). ``export`` writes ``OUT/NET/study.json`` and one project per
variant (with VARIANTs named, only those: their records replace theirs in an existing
``study.json``, the others are kept); ``synth`` and ``pnr`` write ``VARIANT/hw/study_*.json``;
``report`` gathers them into one JSON, prints the tables and plots.
"""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from inq.codes import unpack_codes
from inq.data import build_datasets, eval_data_config, input_shape
from inq.kernels.int8 import requantize_channels
from inq.project import run_build
from inq.quant.integer import IntegerModel, IntOp, load_integer
from inq.quant.lower import quantize_multiplier
from inq.rtl import STAGE_DELAY, RtlModel, export_rtl
from inq.rtl.design import plan
from inq.rtl.logic import adders, layer_graph, pipelined
from inq.rtl.synth import HW_DIR, place_and_route, synthesize, tool

WEIGHT_OPS = ("conv", "linear")
INT32 = (-(1 << 31), (1 << 31) - 1)
SIMULATE_SPLIT = 1000  # test splits up to this size are simulated whole


# ------------------------------------------------------------------------- the integer model


class UniformModel(IntegerModel):
    """An integer program whose conv/linear ops carry integer ``weights`` (the weight's shape)
    in place of codes: ``clamp(((x * w) + bias) * multiplier >> shift)`` per output channel,
    exactly (int64 products and sums, round half up). Other ops run as the integer model's."""

    def run(self, x: Tensor) -> dict[str, Tensor]:
        values: dict[str, Tensor] = {}
        for op in self.ops:
            arg = values[op.inputs[0]] if op.inputs else x
            if op.op in WEIGHT_OPS:
                values[op.name] = _weighted(op, self.op_tensors(op.name), arg)
            else:  # the op alone, as an integer model of one op reading ``arg``
                alone = IntegerModel([IntOp(op.name, op.op, [], op.attrs)], {})
                values[op.name] = alone.run(arg)[op.name]
        return values


def _weighted(op: IntOp, t: dict[str, Tensor], x: Tensor) -> Tensor:
    a, w = op.attrs, t["weights"].to(torch.int64)
    if op.op == "linear":
        acc = x.to(torch.int64) @ w.T
        channel = -1
    else:
        kh, kw = w.shape[2:]
        n, (oh, ow) = x.shape[0], _out_size(x.shape[2:], a, kh, kw)
        # the gather in float64 is exact (integers below 2**8), the products in int64
        cols = F.unfold(x.double(), (kh, kw), padding=a["padding"], stride=a["stride"])
        acc = (w.flatten(1) @ cols.to(torch.int64)).view(n, -1, oh, ow)
        channel = 1
    return requantize_channels(acc, t["bias"], t["multiplier"], t["shift"], a["lo"], a["hi"],
                               channel_dim=channel)  # fmt: skip


def _out_size(size: torch.Size, a: dict[str, Any], kh: int, kw: int) -> tuple[int, int]:
    (h, w), (sh, sw), (ph, pw) = size, a["stride"], a["padding"]
    return (h + 2 * ph - kh) // sh + 1, (w + 2 * pw - kw) // sw + 1


def code_weights(model: IntegerModel, op: IntOp) -> Tensor:
    """The integer weights ``[O, ...]`` of an INQ op's codes in accumulator units:
    ``(-1)**s * 2**(frac - offset)``, exact where no offset exceeds ``frac``.

    Raises:
        ValueError: an offset beyond ``frac`` (a floored term: no integer weight equals it).
    """
    a, t = op.attrs, model.op_tensors(op.name)
    shape = a["weight_shape"] if op.op == "conv" else [a["out_features"], a["in_features"]]
    codes = unpack_codes(t["codes"], a["bits"], math.prod(shape[1:])).to(torch.int64)
    nonzero, negative = (codes >> (a["bits"] - 1)) != 0, ((codes >> (a["bits"] - 2)) & 1) != 0
    offset = codes & ((1 << (a["bits"] - 2)) - 1)
    if bool((nonzero & (offset > a["frac"])).any()):
        raise ValueError(f"{op.name}: an offset beyond frac={a['frac']} floors a term")
    magnitude = torch.where(nonzero, 1 << (a["frac"] - offset).clamp(min=0), 0)
    return torch.where(negative, -magnitude, magnitude).view(shape)


def as_uniform_program(model: IntegerModel) -> UniformModel:
    """``model`` (INQ codes) with every code replaced by its integer weight: the evaluator's
    check, it must give ``model``'s outputs exactly."""
    tensors = {}
    for op in model.ops:
        for key, value in model.op_tensors(op.name).items():
            if key == "codes":
                tensors[f"{op.name}.weights"] = code_weights(model, op).to(torch.int32)
            else:
                tensors[f"{op.name}.{key}"] = value
    return UniformModel(list(model.ops), tensors, model.info)


def _affine(state: dict[str, Tensor], op: IntOp, rows: int) -> tuple[Tensor, Tensor]:
    """``(a, b)`` of ``bn(z + bias) = a * z + b`` per channel, float64, from the float state
    (as :func:`inq.quant.lower._affine`)."""
    bias = state.get(f"{op.attrs['module']}.bias")
    bias = bias.double() if bias is not None else torch.zeros(rows, dtype=torch.float64)
    bn = op.attrs.get("bn")
    if not bn:
        return torch.ones(rows, dtype=torch.float64), bias
    mean, var = state[f"{bn}.running_mean"].double(), state[f"{bn}.running_var"].double()
    a = state[f"{bn}.weight"].double() / torch.sqrt(var + 1e-5)  # BatchNorm2d's eps
    return a, state[f"{bn}.bias"].double() + a * (bias - mean)


def uniform_variant(inq4: IntegerModel, state: dict[str, Tensor], bits: int) -> UniformModel:
    """The float weights ``state`` as uniform ``bits``-bit weights (per output channel,
    symmetric), zero where ``inq4``'s weights are, in ``inq4``'s program (its activation
    scales and ranges); bias, multiplier and shift recomputed for the new weight scale."""
    qmax = (1 << (bits - 1)) - 1
    terms = inq4.info.get("requant_terms")
    ops, tensors, scales = [], {}, {}
    for op in inq4.ops:
        attrs = dict(op.attrs)
        if op.op in WEIGHT_OPS:
            w = state[f"{attrs['module']}.weight"].double()
            rows = w.shape[0]
            scale = w.flatten(1).abs().amax(1) / qmax
            scale = torch.where(scale > 0, scale, 1.0)
            view = [-1] + [1] * (w.dim() - 1)
            q = torch.round(w / scale.view(view)).clamp(-qmax, qmax)
            q[code_weights(inq4, op) == 0] = 0  # the INQ 4-bit model's zeros: equal sparsity
            a, b = _affine(state, op, rows)
            acc_scale = scales[op.inputs[0]] * scale
            if op is inq4.ops[-1]:  # logits: int32 at the finest channel scale, as lowered
                attrs["scale"] = float((a * acc_scale).abs()[a != 0].min())
                attrs["lo"], attrs["hi"] = INT32
            ratio = a * acc_scale / attrs["scale"]
            bias = torch.where(a != 0, torch.round(b / (a * acc_scale)), 0.0)
            pairs = [quantize_multiplier(float(r), terms=terms) for r in ratio]
            for key in ("bits", "frac", "n1"):
                attrs.pop(key, None)
            attrs["weight_bits"] = bits
            tensors[f"{op.name}.weights"] = q.to(torch.int8)
            tensors[f"{op.name}.bias"] = bias.to(torch.int32)
            for key, column in (("multiplier", 0), ("shift", 1)):
                values = [pair[column] for pair in pairs]
                tensors[f"{op.name}.{key}"] = torch.tensor(values, dtype=torch.int32)
        scales[op.name] = attrs["scale"]
        ops.append(IntOp(op.name, op.op, list(op.inputs), attrs))
    return UniformModel(ops, tensors, inq4.info)


def sparsity(model: IntegerModel) -> dict[str, float]:
    """The fraction of zero weights per conv/linear op and over all (``"all"``)."""
    counts = {}
    for op in model.ops:
        if op.op in WEIGHT_OPS:
            t = model.op_tensors(op.name)
            w = t["weights"] if "weights" in t else code_weights(model, op)
            counts[op.name] = (int((w == 0).sum()), w.numel())
    out = {name: zeros / n for name, (zeros, n) in counts.items()}
    out["all"] = sum(z for z, _ in counts.values()) / sum(n for _, n in counts.values())
    return out


# ------------------------------------------------------------------------------- export


def _logits(model: IntegerModel, x: Tensor) -> Tensor:
    with torch.no_grad():
        return torch.cat([model(x[i : i + 500]) for i in range(0, len(x), 500)])


def variants(runs: list[Path]) -> tuple[dict[str, IntegerModel], Tensor, Tensor, Any]:
    """The five variants of the runs ``[3-bit, 4-bit, 5-bit]``, the test split's images and
    labels, and its data config; the evaluator checked against the INQ models first.

    Raises:
        SystemExit: the evaluator differs from an INQ model's own arithmetic.
    """
    paths = {
        f"inq{b}": run / "model.int.safetensors" for b, run in zip((3, 4, 5), runs, strict=True)
    }
    inq = {name: load_integer(path) for name, path in paths.items()}
    data = eval_data_config(inq["inq4"].info["data"], [])
    x, labels = build_datasets(data)[1].tensors
    for name, model in inq.items():  # the evaluator against the INQ models' own arithmetic
        if not torch.equal(_logits(as_uniform_program(model), x), _logits(model, x)):
            raise SystemExit(f"{name}: the integer-weights evaluator differs from the model")
    state = torch.load(runs[1] / "checkpoints" / "float.pt", weights_only=True)["model"]
    out: dict[str, IntegerModel] = dict(inq)
    out |= {f"int{b}": uniform_variant(inq["inq4"], state, b) for b in (4, 8)}
    return out, x, labels, data


def export(out: Path, net: str, runs: list[Path], only: list[str] | None = None) -> None:
    """Variants of the three runs (3, 4, 5 bits), their accuracy on the whole test split and
    their RTL projects, into ``out/net``; with ``only``, just those variants, their records
    merged into an existing ``study.json``.

    Raises:
        SystemExit: ``only`` names a variant that does not exist.
    """
    folder = out / net
    folder.mkdir(parents=True, exist_ok=True)
    models, x, labels, data = variants(runs)
    if only:
        unknown = sorted(set(only) - set(models))
        if unknown:
            raise SystemExit(f"no variant {unknown}; variants: {sorted(models)}")
        models = {name: models[name] for name in only}
    study = folder / "study.json"
    records = json.loads(study.read_text()) if only and study.is_file() else {}
    for name, model in models.items():
        start = time.perf_counter()
        logits = _logits(model, x)
        accuracy = float((logits.argmax(1) == labels).double().mean())
        try:
            record = export_rtl(model, folder / name, input_shape(data), force=True)
        except ValueError as err:  # a design that differs from its model is not measured
            records[name] = {"accuracy": accuracy, "sparsity": sparsity(model), "error": str(err)}
            print(name, json.dumps(records[name]))
            study.write_text(json.dumps(records, indent=1) + "\n")
            continue
        records[name] = {
            "accuracy": accuracy,
            "images": len(x),
            "sparsity": sparsity(model),
            "interval_cycles": record["interval_cycles"],
            "latency_cycles": record["latency_cycles"],
            "layers": record["layers"],
            "adders": sum(layer["adders"] for layer in record["layers"]),
            "multipliers": sum(layer["multipliers"] for layer in record["layers"]),
            "export_s": round(time.perf_counter() - start, 1),
        }
        if len(x) <= SIMULATE_SPLIT:  # the whole test split through the simulation too
            got = RtlModel(folder / name).integers(x)
            records[name]["split_differing_logits"] = int((got != logits).sum())
        print(name, json.dumps({k: v for k, v in records[name].items() if k != "layers"}))
        study.write_text(json.dumps(records, indent=1) + "\n")


def count(out: Path, net: str, runs: list[Path]) -> None:
    """Accuracy, sparsity and da4ml adders per layer of every variant, without Verilog (the
    same graphs :func:`export` writes), into ``out/net/count.json``."""
    models, x, labels, data = variants(runs)
    records = {}
    for name, model in models.items():
        design = plan(model, input_shape(data))
        layers = {
            layer.name: adders(
                pipelined(layer_graph(layer.op, layer.tensors, layer.window), STAGE_DELAY)
            )
            for layer in design.layers
        }
        records[name] = {
            "accuracy": float((_logits(model, x).argmax(1) == labels).double().mean()),
            "images": len(x),
            "sparsity": sparsity(model),
            "adders": sum(layers.values()),
            "layers": layers,
        }
        print(name, json.dumps(records[name]), flush=True)
    (out / net).mkdir(parents=True, exist_ok=True)
    (out / net / "count.json").write_text(json.dumps(records, indent=1) + "\n")


# ------------------------------------------------------------------------------- hardware


def _cells(stat: dict[str, Any]) -> dict[str, int]:
    return {str(k): int(v) for k, v in stat.get("num_cells_by_type", {}).items()}


def ecp5_figures(cells: dict[str, int]) -> dict[str, int]:
    """The ECP5 figures of Yosys cell counts (as :func:`inq.rtl.synth.synthesize` reads them)."""
    return {
        "luts": cells.get("LUT4", 0),
        "carry_cells": cells.get("CCU2C", 0),
        "ffs": sum(v for k, v in cells.items() if k.startswith("TRELLIS_FF")),
        "dsps": cells.get("MULT18X18D", 0) + cells.get("ALU54B", 0),
        "bram": cells.get("DP16KD", 0),
        "lutram": cells.get("TRELLIS_DPR16X4", 0),
    }


def synth_layers(project: Path) -> dict[str, Any]:
    """Yosys ``synth_ecp5`` of ``inq_board`` with every layer module kept whole
    (``keep_hierarchy``): each layer's cells (window, adder graph, registers), the rest (top
    level, output buffer), and their sum, the whole network."""
    hw = project / HW_DIR
    hw.mkdir(exist_ok=True)
    sources = sorted(p.name for p in project.glob("*.v"))
    layers = sorted(
        (p.stem for p in project.glob("layer*.v")), key=lambda s: int(s.rsplit("_", 1)[-1])
    )
    script = "; ".join(
        [*(f"read_verilog -DSYNTHESIS ../{name}" for name in sources),
         "hierarchy -top inq_board", f"setattr -mod -set keep_hierarchy 1 {' '.join(layers)}",
         "synth_ecp5 -top inq_board", "tee -q -o study_layers_stat.json stat -json"]
    )  # fmt: skip
    start = time.perf_counter()
    code, output = run_build([tool("yosys"), "-q", "-p", script], hw, "yosys synth_ecp5")
    if code != 0:
        raise SystemExit(f"yosys failed: {output.strip()[-500:]}")
    stat = json.loads((hw / "study_layers_stat.json").read_text())
    modules = {name.lstrip("\\"): _cells(m) for name, m in stat["modules"].items()}
    per_layer = {name: ecp5_figures(modules[name]) for name in layers}
    rest = ecp5_figures(modules["inq_board"])
    whole = {k: rest[k] + sum(f[k] for f in per_layer.values()) for k in rest}
    figures = {"layers": per_layer, "top": rest, "whole": whole,
               "yosys_s": round(time.perf_counter() - start, 1)}  # fmt: skip
    (hw / "study_synth.json").write_text(json.dumps(figures, indent=1) + "\n")
    return figures


def pnr(project: Path, mhz: float) -> dict[str, Any]:
    """The library's flow: :func:`synthesize` (flattened) and :func:`place_and_route`."""
    start = time.perf_counter()
    figures = synthesize(project)
    figures["ecp5"].pop("cells")
    figures["ecp5_pnr"] = place_and_route(project, mhz)
    figures["seconds"] = round(time.perf_counter() - start, 1)
    (project / HW_DIR / "study_pnr.json").write_text(json.dumps(figures, indent=1) + "\n")
    return figures


# ------------------------------------------------------------------------------- report


def report(out: Path, json_path: Path, png_path: Path) -> None:
    """Gather every network's records and hardware figures; print the tables; plot."""
    study: dict[str, Any] = {}
    for net_dir in sorted(p for p in out.iterdir() if (p / "study.json").is_file()):
        records = json.loads((net_dir / "study.json").read_text())
        for name, record in records.items():
            hw = net_dir / name / HW_DIR
            for key, file in (("synth", "study_synth.json"), ("pnr", "study_pnr.json")):
                if (hw / file).is_file():
                    record[key] = json.loads((hw / file).read_text())
        study[net_dir.name] = records
    json_path.write_text(json.dumps(study, indent=1) + "\n")
    for net, records in study.items():
        print(
            f"\n{net}: variant | acc | sparsity | adders | LUT4 | CCU2C | FF | DSP | DPR16X4"
            " | latency | interval | LUT4 vs inq4"
        )
        base = records["inq4"].get("synth", {}).get("whole", {}).get("luts")
        for name, r in records.items():
            if "error" in r:
                print(f"| {name} | {100 * r['accuracy']:.2f} % | not exported: {r['error']} |")
                continue
            w = r.get("synth", {}).get("whole", {})
            ratio = f"{w['luts'] / base:.2f}x" if w and base else "-"
            print(f"| {name} | {100 * r['accuracy']:.2f} % | {100 * r['sparsity']['all']:.1f} % "
                  f"| {r['adders']:,} | {_n(w, 'luts')} | {_n(w, 'carry_cells')} "
                  f"| {_n(w, 'ffs')} | {_n(w, 'dsps')} | {_n(w, 'lutram')} "
                  f"| {r['latency_cycles']} | {r['interval_cycles']} | {ratio} |")  # fmt: skip
    _plot(study, png_path)


def _n(figures: dict[str, int], key: str) -> str:
    return f"{figures[key]:,}" if key in figures else "-"


def _plot(study: dict[str, Any], png_path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(study), figsize=(5.5 * len(study), 4), squeeze=False)
    for ax, (net, records) in zip(axes[0], study.items(), strict=True):
        for name, r in records.items():
            if "synth" not in r:
                continue
            w = r["synth"]["whole"]
            marker = "o" if name.startswith("inq") else "s"
            ax.scatter(w["luts"] + 2 * w["carry_cells"], 100 * r["accuracy"], marker=marker)
            ax.annotate(name, (w["luts"] + 2 * w["carry_cells"], 100 * r["accuracy"]),
                        textcoords="offset points", xytext=(5, 3))  # fmt: skip
        ax.set_xscale("log")
        ax.set_xlabel("ECP5 LUT4 + 2 x CCU2C (Yosys synth_ecp5)")
        ax.set_ylabel("test accuracy (%)")
        ax.set_title(net)
        ax.grid(True, alpha=0.3)
    fig.suptitle("INQ vs uniform weights: same generator, same zeros", fontsize=10)
    fig.tight_layout()
    fig.savefig(png_path, dpi=120)


def main(argv: list[str]) -> None:
    command, args = argv[0], argv[1:]
    if command == "export":
        export(Path(args[0]), args[1], [Path(a) for a in args[2:5]], args[5:])
    elif command == "count":
        count(Path(args[0]), args[1], [Path(a) for a in args[2:5]])
    elif command == "synth":
        print(json.dumps(synth_layers(Path(args[0]))["whole"]))
    elif command == "pnr":
        figures = pnr(Path(args[0]), float(args[1]))
        print(json.dumps({k: v for k, v in figures.items() if k != "ecp5_pnr"}))
        print(json.dumps(figures["ecp5_pnr"]))
    elif command == "report":
        report(Path(args[0]), Path(args[1]), Path(args[2]))
    else:
        raise SystemExit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
