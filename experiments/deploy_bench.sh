#!/usr/bin/env bash
# Deployment speed in ONNX Runtime (issue 24): for ResNet-20 (32x32) and torchvision's ResNet-18
# (224x224), a short 4-bit INQ run on synthetic data with an 8-bit integer model, then side by
# side in one `inq bench onnx` run each: a plain `torch.onnx.export(..., optimize=True)` of the
# same model (BatchNorm folded into the weights), inq's float export, inq's Q/DQ export, and ONNX
# Runtime's own quantize_static of inq's float export (--peer). Synthetic data is enough: speed
# does not depend on the weights' values. Runs that finished are kept (delete runs/deploy to redo).
# With `runtimes` (issue 37): the same runs also calibrated with --symmetric (TensorRT's form), and
# the float, uint8 Q/DQ and TensorRT-form Q/DQ exports timed in ONNX Runtime and OpenVINO side by side.
#   experiments/deploy_bench.sh [OUT_DIR]            # ~25 min on 2 cores, most of it timing
#   experiments/deploy_bench.sh [OUT_DIR] runtimes   # the runtimes comparison (~20 min)
set -euo pipefail
out=${1:-runs/deploy}
mode=${2:-onnxruntime}
mkdir -p "$out"

train() {  # name, then inq-train overrides
    local name=$1
    shift
    [ -f "$out/$name/model.int.safetensors" ] && return
    inq-train "$@" inq.bits=4 quant.act_bits=8 trainer.progress=false hydra.run.dir="$out/$name"
}
train resnet20 model=resnet20 data=synthetic data.image_size=32 data.train_size=512 \
    data.val_size=128 trainer.float_epochs=2 inq.epochs=1
train resnet18 model=torchvision model.name=resnet18 data=synthetic data.image_size=224 \
    data.train_size=64 data.val_size=32 data.batch_size=16 data.eval_batch_size=16 \
    trainer.float_epochs=1 inq.epochs=1

plain_export() {  # run dir -> plain.onnx: what torch.onnx.export gives with its optimizer on
    python - "$1" <<'EOF'
import contextlib, io, sys
import torch
from inq.data import eval_data_config, input_shape
from inq.models import build_model
from inq.packed import load_packed

run = sys.argv[1]
packed = load_packed(f"{run}/model.inq.safetensors")
model = build_model(packed.model)
packed.load_into(model)
example = torch.zeros(2, *input_shape(eval_data_config(packed.data, [])))
with contextlib.redirect_stdout(io.StringIO()):
    torch.onnx.export(model.eval(), (example,), f"{run}/plain.onnx", dynamo=True,
                      input_names=["input"], dynamic_shapes=({0: torch.export.Dim("batch")},),
                      optimize=True)
EOF
}

if [ "$mode" = runtimes ]; then
    for name in resnet20 resnet18; do
        run=$out/$name
        # the runs learn nothing from synthetic data (chance accuracy): top-1 agreement says
        # nothing there, so the symmetric refusal is switched off; speed does not depend on it
        inq calibrate "$run" --symmetric --symmetric-tolerance 1 --act-bits 8 \
            -o "$run/model.sym.int.safetensors" --force
        inq export "$run" --onnx -o "$run/float.onnx" --force
        inq export "$run/model.int.safetensors" --onnx -o "$run/qdq.onnx" --force
        inq export "$run/model.sym.int.safetensors" --onnx -o "$run/trt.onnx" --force
        inq bench onnx "$run/float.onnx" "$run/qdq.onnx" "$run/trt.onnx" --runtime both \
            --json "$out/$name.runtimes.json" | tee "$out/$name.runtimes.txt"
    done
    exit 0
fi

for name in resnet20 resnet18; do
    run=$out/$name
    plain_export "$run"
    inq export "$run" --onnx -o "$run/float.onnx" --force
    inq export "$run/model.int.safetensors" --onnx -o "$run/qdq.onnx" --force
    inq bench onnx "$run/float.onnx" "$run/plain.onnx" "$run/qdq.onnx" --peer \
        --json "$out/$name.json" | tee "$out/$name.txt"
done
