#!/usr/bin/env bash
# The accuracy study of experiments/RESULTS.md (issue 6), in one command:
#
#   experiments/run_study.sh [OUT_DIR] [SEEDS]      # defaults: multirun/study_digits/<time>, 0,1,2,3,4
#
# Every job uses experiments/study_digits.yaml. Per seed, one float model is pretrained once
# (the 5-bit one-shot job) and every other job starts from its checkpoints/float.pt. Then:
# INQ at 5, 4, 3 and 2 bits with the paper's schedule for each bit-width (and the default
# 0.3/0.6/0.8/1 at 5 bits), magnitude and random partition; STE with the same epoch budget as
# INQ at each bit-width; one-shot rounding at each bit-width. Finally the runs' summary.json
# files are collected into experiments/RESULTS.md and experiments/study_digits.png.
set -euo pipefail
cd "$(dirname "$0")/.."
out=$(realpath -m "${1:-multirun/study_digits/$(date +%Y-%m-%d_%H-%M-%S)}")
seeds=${2:-0,1,2,3,4}
declare -A schedule=(
  [5]="[0.5,0.75,0.875,1.0]"
  [4]="[0.3,0.5,0.8,0.9,0.95,1.0]"
  [3]="[0.2,0.4,0.6,0.7,0.8,0.9,0.95,1.0]"
  [2]="[0.2,0.4,0.6,0.7,0.8,0.85,0.9,0.95,0.975,1.0]"
)

train() {  # train GROUP OVERRIDES...: one Hydra multirun over the seeds into OUT_DIR/GROUP
  local group=$1 subdir=${SUBDIR:-'${hydra.job.num}_seed${trainer.seed}'}
  shift
  echo "== $group: $*"
  inq-train --config-dir experiments --config-name study_digits --multirun \
    "hydra.sweep.dir=$out/$group" "hydra.sweep.subdir=$subdir" \
    "trainer.seed=$seeds" "$@" >"$out/$group.log" 2>&1 ||
    { tail -n 20 "$out/$group.log"; exit 1; }
}

mkdir -p "$out"
start=$SECONDS
SUBDIR='seed${trainer.seed}' train float inq.method=oneshot inq.bits=5
from_float="model.checkpoint=$out/float/seed\${trainer.seed}/checkpoints/float.pt"
train oneshot inq.method=oneshot inq.bits=2,3,4 "$from_float"
train inq5_default inq.bits=5 'inq.portions=[0.3,0.6,0.8,1.0]' "$from_float"
for bits in 5 4 3 2; do
  train "inq${bits}" "inq.bits=$bits" "inq.portions=${schedule[$bits]}" \
    inq.strategy=magnitude,random "$from_float"
  train "ste${bits}" inq.method=ste "inq.bits=$bits" "inq.portions=${schedule[$bits]}" \
    "$from_float"
done
echo "all jobs done in $((SECONDS - start)) s; runs in $out"
python experiments/collect_study.py "$out"
