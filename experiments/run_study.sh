#!/usr/bin/env bash
# The accuracy studies of experiments/RESULTS.md (issues 6 and 11), one command each:
#
#   experiments/run_study.sh [DATASET] [OUT_DIR] [SEEDS]
#       DATASET  digits (default) or fashion_mnist: uses experiments/study_<DATASET>.yaml
#       OUT_DIR  default multirun/study_<DATASET>/<time>; must not exist yet
#       SEEDS    default 0,1,2,3,4 (digits) or 0,1,2 (fashion_mnist)
#   JOBS=2 experiments/run_study.sh ...   # run that many seeds at once (one CPU thread each)
#   UPDATE_RESULTS=1 ...                  # also replace the dataset's section of RESULTS.md
#   EXTRA="data.train_size=512 trainer.float_epochs=1" ...   # overrides added to every job
#
# Per seed, one float model is pretrained once (the 5-bit one-shot job) and every other job starts
# from its checkpoints/float.pt. Then, at 5, 4, 3 and 2 bits with the paper's schedule for each
# bit-width: INQ with the paper's level sets (n1 = floor(log2(4 max|W|/3)) per layer), with
# n1_rule=mse per layer and with n1_rule=mse per output channel (magnitude partition, and error
# partition: smallest rounding error first); STE with the same epoch budget on
# the paper's and on the mse-per-channel level sets (digits only: the paper's, the 0.3/0.6/0.8/1
# schedule at 5 bits and random partition too); one-shot rounding on both kinds of level set.
# Finally the runs' summary.json files are collected into OUT_DIR/RESULTS.md and a plot there.
set -euo pipefail
cd "$(dirname "$0")/.."
source experiments/seeds.sh
dataset=${1:-digits}
[[ -f "experiments/study_$dataset.yaml" ]] ||
  { echo "run_study: no experiments/study_$dataset.yaml (use digits or fashion_mnist)" >&2; exit 2; }
out=$(realpath -m "${2:-multirun/study_$dataset/$(date +%Y-%m-%d_%H-%M-%S)}")
[[ ! -e "$out" ]] || { echo "run_study: $out exists; give a new folder" >&2; exit 2; }
default_seeds=0,1,2,3,4
[[ $dataset == digits ]] || default_seeds=0,1,2
seeds=${3:-$default_seeds}
declare -A schedule=(
  [5]="[0.5,0.75,0.875,1.0]"
  [4]="[0.3,0.5,0.8,0.9,0.95,1.0]"
  [3]="[0.2,0.4,0.6,0.7,0.8,0.9,0.95,1.0]"
  [2]="[0.2,0.4,0.6,0.7,0.8,0.85,0.9,0.95,0.975,1.0]"
)
mse_channel=(inq.n1_rule=mse inq.granularity=channel)

train() {  # train SEED GROUP OVERRIDES...: Hydra (multi)run of one seed into OUT_DIR/GROUP
  local seed=$1 group=$2
  shift 2
  inq-train --config-dir experiments --config-name "study_$dataset" --multirun \
    "hydra.sweep.dir=$out/$group" 'hydra.sweep.subdir=${hydra.job.num}_seed${trainer.seed}' \
    "trainer.seed=$seed" "$@" ${EXTRA:-} >>"$out/$group.seed$seed.log" 2>&1 ||
    { tail -n 20 "$out/$group.seed$seed.log"; return 1; }
}

one_seed() {  # every job of one seed, in order
  local seed=$1 bits
  train "$seed" float inq.method=oneshot inq.bits=5
  local from_float=("model.checkpoint=$out/float/0_seed$seed/checkpoints/float.pt" trainer.float_epochs=0)
  train "$seed" oneshot inq.method=oneshot inq.bits=2,3,4 "${from_float[@]}"
  train "$seed" oneshot_mse_channel inq.method=oneshot inq.bits=2,3,4,5 "${mse_channel[@]}" \
    "${from_float[@]}"
  for bits in 5 4 3 2; do
    local common=("inq.bits=$bits" "inq.portions=${schedule[$bits]}" "${from_float[@]}")
    train "$seed" "inq$bits" "${common[@]}"
    train "$seed" "inq${bits}_mse" "${common[@]}" inq.n1_rule=mse
    train "$seed" "inq${bits}_mse_channel" "${common[@]}" "${mse_channel[@]}"
    train "$seed" "inq${bits}_mse_channel_error" "${common[@]}" "${mse_channel[@]}" \
      inq.strategy=error
    train "$seed" "ste${bits}_mse_channel" inq.method=ste "${common[@]}" "${mse_channel[@]}"
    if [[ $dataset == digits ]]; then
      train "$seed" "ste$bits" inq.method=ste "${common[@]}"
      train "$seed" "inq${bits}_random" "${common[@]}" inq.strategy=random
    fi
  done
  if [[ $dataset == digits ]]; then
    train "$seed" inq5_default inq.bits=5 'inq.portions=[0.3,0.6,0.8,1.0]' "${from_float[@]}"
  fi
  echo "seed $seed done"
}

mkdir -p "$out"
start=$SECONDS
echo "study $dataset, seeds $seeds, ${JOBS:-1} at once -> $out"
run_seeds one_seed "$seeds"
echo "all jobs done in $((SECONDS - start)) s; runs in $out"
update=()
[[ -z ${UPDATE_RESULTS:-} ]] || update=(--update-results)
python experiments/collect_study.py "$out" --dataset "$dataset" "${update[@]}"
