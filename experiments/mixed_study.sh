#!/usr/bin/env bash
# Mixed precision chosen for the user (issue 50), one command per network:
#
#   experiments/mixed_study.sh CONFIG [OUT_DIR] [SEEDS]
#       CONFIG   fashion_mnist (experiments/study_fashion_mnist.yaml: the width-8 CNN) or
#                resnet20 (experiments/study_resnet20.yaml: ResNet-20 on Fashion-MNIST)
#       OUT_DIR  default runs/mixed_<CONFIG>; finished runs are skipped, stopped ones resumed
#       SEEDS    default 0,1,2
#   RECORD=FILE experiments/mixed_study.sh ...  # keep the finished runs there instead
#   JOBS=2 experiments/mixed_study.sh ...   # that many runs at once (one CPU thread each)
#
# Per seed: the float model once (the 5-bit one-shot job writes it), then, each from that float
# checkpoint with distillation from it (weight 0.5, T 4, as the README recommends) and the
# low-bit level sets for every job (inq=lowbit: mse n1 per output channel, the 8-stage schedule):
#   uniform 2, 3 and 4 bits; the 8-bit-ends rule (first and last layer at 8 bits, the rest at 2);
#   inq.bits=auto with each sensitivity method (loss, hessian) at 2.5, 3.0 and 4.0 average bits
#   and at the ends rule's size, sizes counted nominally (b bits a weight, inq.auto.size=nominal,
#   so that 2 and 3 bits differ), choices 2, 3, 4, 5, 8.
# The float models run first; then all seeds' low-bit jobs form one queue, job by job.
# Each finished run is also kept in the tracked experiments/mixed_<CONFIG>_runs.json
# (experiments/study_record.py): on a fresh machine, whose OUT_DIR is empty, the recorded runs are
# skipped, and only the float models are trained again (checked to come out the same).
# Finally the runs' summary.json files are collected into OUT_DIR/RESULTS.md and a plot.
set -euo pipefail
cd "$(dirname "$0")/.."
source experiments/seeds.sh
config=${1:?usage: experiments/mixed_study.sh fashion_mnist|resnet20 [OUT_DIR] [SEEDS]}
[[ -f "experiments/study_$config.yaml" ]] ||
  { echo "mixed_study: no experiments/study_$config.yaml" >&2; exit 2; }
out=$(realpath -m "${2:-runs/mixed_$config}")
seeds=${3:-0,1,2}
declare -A ends=([resnet20]='["conv:8","fc:8"]' [fashion_mnist]='["0:8","15:8"]')
declare -A model=([resnet20]='resnet20 --in-channels 1 --layer-bits conv:8 fc:8'
  [fashion_mnist]='mnist_cnn --width 8 --in-channels 1 --layer-bits 0:8 15:8')
# the ends rule's size in average bits (rounded down: auto may not exceed it)
ends_bits=$(python experiments/rule_size.py ${model[$config]} --bits 2)
ends_bits=$(python -c "import math; print(math.floor($ends_bits * 1e4) / 1e4)")
record=${RECORD:-experiments/mixed_${config}_runs.json}
common=(inq=lowbit inq.distill.weight=0.5 inq.distill.temperature=4)

job() {  # job SEED NAME OVERRIDES...: train, then keep the finished run in the record
  train "$@" && python experiments/study_record.py save "$out" "$record" >/dev/null
}

float_model() {  # float_model SEED: the seed's float model (the 5-bit one-shot job writes it)
  job "$1" float inq.method=oneshot inq.bits=5
}

lowbit() {  # lowbit SEED NAME: one low-bit job, from the seed's float model
  local seed=$1 name=$2 settings method
  case $name in
    uniform*) settings=("inq.bits=${name#uniform}") ;;
    ends2) settings=(inq.bits=2 "inq.layer_bits=${ends[$config]}") ;;
    auto_*)
      method=${name#auto_} method=${method%%_*}
      settings=(inq.bits=auto inq.auto.size=nominal "inq.budget.avg_bits=${name##*_}"
        "inq.auto.method=$method")
      ;;
  esac
  job "$seed" "$name" "${common[@]}" "${settings[@]}" trainer.float_epochs=0 \
    "model.checkpoint=$out/float/seed$seed/checkpoints/float.pt"
}

mkdir -p "$out"
python experiments/study_record.py restore "$record" "$out"
start=$SECONDS
echo "mixed-precision study $config (ends rule: $ends_bits bits), seeds $seeds," \
  "${JOBS:-1} at once -> $out"
run_seeds float_model "$seeds"
names=(uniform2 uniform3 uniform4 ends2)
for budget in 2.5 3.0 4.0 "$ends_bits"; do names+=("auto_loss_$budget" "auto_hessian_$budget"); done
jobs_list=()
for name in "${names[@]}"; do
  for seed in ${seeds//,/ }; do jobs_list+=("$seed $name"); done
done
run_all lowbit "${jobs_list[@]}"
echo "all jobs done in $((SECONDS - start)) s; runs in $out"
python experiments/collect_mixed.py "$out" --name "$config"
