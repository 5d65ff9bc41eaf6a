#!/usr/bin/env bash
# Issue 37: what TensorRT's form (symmetric int8 activations, zero point 0) costs in accuracy,
# and whether both runtimes compute what the integer model does. One Fashion-MNIST run of the
# accuracy study's CNN (experiments/study_fashion_mnist.yaml) at 4-bit weights, calibrated by
# `inq calibrate` four ways on the same images (8- and 4-bit activations, unsigned and
# symmetric), each integer model and its Q/DQ export evaluated on all 10,000 test images in
# ONNX Runtime and OpenVINO. Budget, fixed before any result: one seed, the study's epochs. A
# symmetric calibration that `inq calibrate` refuses (beyond --symmetric-tolerance) is printed
# and then made with the bound off, to measure what it costs.
#   experiments/runtime_accuracy.sh [OUT_DIR]     # ~6 min on 2 cores
set -euo pipefail
out=${1:-runs/runtime_accuracy}
run=$out/fashion4
[ -f "$run/model.inq.safetensors" ] || inq-train --config-dir experiments \
    --config-name study_fashion_mnist inq.bits=4 hydra.run.dir="$run"
inq export "$run" --onnx -o "$run/float.onnx" --force
accuracy() { "$@" | grep -o 'accuracy [0-9.]*% ([0-9/]*)'; }
echo "packed (float activations): $(accuracy inq eval "$run/model.inq.safetensors")"
for rt in onnxruntime openvino; do
    echo "float export, $rt: $(accuracy inq eval "$run/float.onnx" --runtime $rt)"
done
for bits in 8 4; do
    for form in unsigned symmetric; do
        name=$run/a$bits.$form
        flag=$([ $form = symmetric ] && echo --symmetric || true)
        calibrate=(inq calibrate "$run" --act-bits $bits $flag -o "$name.int.safetensors" --force)
        if ! refused=$("${calibrate[@]}" 2>&1 > /dev/null); then  # beyond the bound: say so, and
            echo "$bits-bit activations, $form: $refused"    # measure it all the same
            "${calibrate[@]}" --symmetric-tolerance 1 > /dev/null
        fi
        inq export "$name.int.safetensors" --onnx -o "$name.onnx" --force
        echo "$bits-bit activations, $form, integer model: $(accuracy inq eval "$name.int.safetensors")"
        for rt in onnxruntime openvino; do
            echo "$bits-bit activations, $form, Q/DQ export, $rt: $(accuracy inq eval "$name.onnx" --runtime $rt)"
        done
    done
done
