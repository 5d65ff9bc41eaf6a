"""RTL figures for RESULTS: export integer models with ``inq export --rtl`` (optionally with
the hardware flow), simulate each on its data set's whole test split and count the logits that
differ from the integer model's.

    python experiments/rtl_figures.py OUT.json MODEL.int.safetensors[:MHZ] ...

``:MHZ`` adds Yosys (ECP5 and Xilinx) and nextpnr (``--hardware MHZ``). Each project goes to
``OUT.d/<stem>``; the JSON holds, per model, the export's ``design.json`` record, the wall time
of each step and the test-split comparison.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch

from inq.data import build_datasets, eval_data_config, input_shape
from inq.quant.integer import load_integer
from inq.rtl import RtlModel, export_rtl


def figures(path: Path, mhz: float | None, folder: Path) -> dict[str, object]:
    model = load_integer(path)
    data = eval_data_config(model.info["data"], [])
    start = time.perf_counter()
    record = export_rtl(model, folder, input_shape(data), force=True, hardware=mhz, xilinx=True)
    export_s = time.perf_counter() - start
    x, labels = build_datasets(data)[1].tensors
    start = time.perf_counter()
    got = RtlModel(folder).integers(x)
    sim_s = time.perf_counter() - start
    want = torch.cat([model(x[i : i + 1000]) for i in range(0, len(x), 1000)])
    return {
        "model": str(path),
        "record": record,
        "export_s": round(export_s, 1),
        "simulate_s": round(sim_s, 1),
        "images": len(x),
        "differing_logits": int((got != want).sum()),
        "differing_images": int((got != want).any(dim=1).sum()),
        "accuracy": float((got.argmax(1) == labels).double().mean()),
    }


def main(argv: list[str]) -> None:
    out = Path(argv[0])
    rows = []
    for spec in argv[1:]:
        path, _, mhz = spec.partition(":")
        folder = out.with_suffix(".d") / Path(path).name.removesuffix(".safetensors")
        rows.append(figures(Path(path), float(mhz) if mhz else None, folder))
        out.write_text(json.dumps(rows, indent=1) + "\n")
        print(json.dumps({k: v for k, v in rows[-1].items() if k != "record"}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
