#!/usr/bin/env bash
# Low bits with distillation and 8-bit first/last layers (issue 25), one command per network:
#
#   experiments/distill_study.sh CONFIG [OUT_DIR] [SEEDS]
#       CONFIG   resnet20 (experiments/study_resnet20.yaml: ResNet-20 on Fashion-MNIST) or
#                fashion_mnist (experiments/study_fashion_mnist.yaml: the width-8 CNN)
#       OUT_DIR  default runs/distill_<CONFIG>; runs that finished there are skipped, a run that
#                was stopped is resumed (trainer.resume), so the command can simply be repeated
#       SEEDS    default 0,1
#   JOBS=2 experiments/distill_study.sh ...   # that many seeds at once (one CPU thread each)
#
# Per seed: the float model (pretrained once, in the 5-bit one-shot job), then at 5 and 4 bits the
# paper's level sets (inq=default), at 3 and 2 bits inq=lowbit (mse n1 per channel, its 8-stage
# schedule), each as INQ, INQ + distillation and STE + distillation (STE gets INQ's epoch budget);
# at 3 and 2 bits also INQ + distillation with the first and last layer at 8 bits. Every job
# starts from the seed's float checkpoint, which is also the distillation teacher. Finally the
# runs' summary.json files are collected into OUT_DIR/RESULTS.md and a plot.
set -euo pipefail
cd "$(dirname "$0")/.."
source experiments/seeds.sh
config=${1:?usage: experiments/distill_study.sh resnet20|fashion_mnist [OUT_DIR] [SEEDS]}
[[ -f "experiments/study_$config.yaml" ]] ||
  { echo "distill_study: no experiments/study_$config.yaml" >&2; exit 2; }
out=$(realpath -m "${2:-runs/distill_$config}")
seeds=${3:-0,1}
declare -A ends=([resnet20]='["conv:8","fc:8"]' [fashion_mnist]='["0:8","15:8"]')
kd=(inq.distill.weight=0.5 inq.distill.temperature=4)

one_seed() {
  local seed=$1 bits
  train "$seed" float inq.method=oneshot inq.bits=5
  local from_float=("model.checkpoint=$out/float/seed$seed/checkpoints/float.pt" trainer.float_epochs=0)
  for bits in 5 4 3 2; do
    local levels=("inq.bits=$bits")
    ((bits >= 4)) || levels=(inq=lowbit "inq.bits=$bits")
    train "$seed" "inq$bits" "${levels[@]}" "${from_float[@]}"
    train "$seed" "inq${bits}_kd" "${levels[@]}" "${kd[@]}" "${from_float[@]}"
    train "$seed" "ste${bits}_kd" inq.method=ste "${levels[@]}" "${kd[@]}" "${from_float[@]}"
    if ((bits <= 3)); then
      train "$seed" "inq${bits}_kd_ends8" "${levels[@]}" "${kd[@]}" \
        "inq.layer_bits=${ends[$config]}" "${from_float[@]}"
    fi
  done
  echo "seed $seed done"
}

mkdir -p "$out"
start=$SECONDS
echo "distillation study $config, seeds $seeds, ${JOBS:-1} at once -> $out"
run_seeds one_seed "$seeds"
echo "all jobs done in $((SECONDS - start)) s; runs in $out"
python experiments/collect_distill.py "$out" --name "$config"
