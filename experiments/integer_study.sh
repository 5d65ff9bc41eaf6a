#!/usr/bin/env bash
# Integer model vs the float-activation INQ model it comes from (issue 13), for one finished run:
# every calibration method at 8, 6 and 4-bit activations, and 4 bits after fake-quant
# fine-tuning; both models evaluated by `inq eval` on the run's validation data. Prints a
# Markdown table (the rows of experiments/RESULTS.md).
#   experiments/integer_study.sh RUN_DIR [FINETUNE_EPOCHS]
set -euo pipefail
run=${1:?usage: experiments/integer_study.sh RUN_DIR [FINETUNE_EPOCHS]}
epochs=${2:-1}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

accuracy() { inq eval "$1" | sed -E 's/.*accuracy ([0-9.]+)%.*/\1/'; }

float=$(accuracy "$run/model.inq.safetensors")
echo "| activations | calibration | fine-tuning | integer acc | float-activation acc | difference | calibration time |"
echo "| --- | --- | --- | --- | --- | --- | --- |"
row() {  # bits calibration epochs
    local out="$work/m.int.safetensors" seconds acc
    seconds=$(inq calibrate "$run" --act-bits "$1" --calibration "$2" --epochs "$3" -o "$out" |
        sed -nE '1s/.*calibration on [^ ]+ in ([0-9.]+) s.*/\1/p')
    acc=$(accuracy "$out")
    printf '| %s-bit | %s | %s | %s %% | %s %% | %+.2f | %s s |\n' "$1" "$2" \
        "$([ "$3" = 0 ] && echo none || echo "$3 epoch(s)")" "$acc" "$float" \
        "$(echo "$acc - $float" | bc -l)" "$seconds"
}
for bits in 8 6 4; do
    for calibration in max percentile mse; do
        row "$bits" "$calibration" 0
    done
done
row 4 mse "$epochs"
