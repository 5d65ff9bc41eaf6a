#!/usr/bin/env bash
# The pruning + INQ study of experiments/RESULTS.md (issue 15): accuracy against compression ratio.
#
#   experiments/prune_study.sh [DATASET] [OUT_DIR] [SEEDS]
#       DATASET  digits (default) or fashion_mnist: settings from experiments/study_<DATASET>.yaml
#       OUT_DIR  default multirun/prune_<DATASET>/<time>; must not exist yet
#       SEEDS    default 0
#   JOBS=2 experiments/prune_study.sh ...   # run that many jobs at once (one CPU thread each)
#   UPDATE_RESULTS=1 ...                    # also replace the dataset's section of RESULTS.md
#   SPECS="5:0.85 5:0.9" ...                # other runs: BITS:SPARSITY[:FC_SPARSITY] each
#   PRUNE_EPOCHS=3 INQ_EPOCHS=2 ...         # a longer retraining budget (default 1 and the
#                                           # study config's inq.epochs)
#   FLOAT=DIR/float_seed0 ...               # start from that run's float model (one seed)
#
# Per seed one float model is pretrained, and every job starts from its checkpoint: magnitude
# pruning in 3 rounds (cubic schedule, PRUNE_EPOCHS of retraining each; the first conv, <1 % of
# the weights, keeps at least half of its weights, as Deep Compression spares it), then INQ with
# the paper's schedule for the bit-width and least-squares level sets per layer (inq.n1_rule=mse,
# which the issue-11 study found as good as the paper's at 5-4 bits and far better at 3). Grid:
# sparsity 0-90 % at 3, 4 and 5 bits, and at 5 bits also 85, 93 and 95 %; then three 5-bit runs
# with Deep Compression's profile: the fully connected layer (most of the weights) pruned to
# 95-97 %, the convolutions to 70-80 %. Each run's packed file is measured (summary.json
# "packed") and the runs are collected into OUT_DIR/RESULTS.md and a plot.
set -euo pipefail
cd "$(dirname "$0")/.."
dataset=${1:-digits}
[[ -f "experiments/study_$dataset.yaml" ]] ||
  { echo "prune_study: no experiments/study_$dataset.yaml (use digits or fashion_mnist)" >&2; exit 2; }
out=$(realpath -m "${2:-multirun/prune_$dataset/$(date +%Y-%m-%d_%H-%M-%S)}")
[[ ! -e "$out" ]] || { echo "prune_study: $out exists; give a new folder" >&2; exit 2; }
seeds=${3:-0}
prune_epochs=${PRUNE_EPOCHS:-1}
specs=${SPECS:-5:0 5:0.5 5:0.7 5:0.8 5:0.85 5:0.9 5:0.93 5:0.95 5:0.7:0.95 5:0.8:0.95 \
5:0.8:0.97 4:0 4:0.5 4:0.7 4:0.8 4:0.9 3:0 3:0.5 3:0.7 3:0.8 3:0.9}
inq_epochs=()
[[ -z ${INQ_EPOCHS:-} ]] || inq_epochs=("inq.epochs=$INQ_EPOCHS")
declare -A fc_layer=([digits]=12 [fashion_mnist]=15)  # the models' last (linear) layers
declare -A schedule=(
  [5]="[0.5,0.75,0.875,1.0]"
  [4]="[0.3,0.5,0.8,0.9,0.95,1.0]"
  [3]="[0.2,0.4,0.6,0.7,0.8,0.9,0.95,1.0]"
)

train() {  # train SEED NAME OVERRIDES...: one run into OUT_DIR/NAME_seedSEED
  local seed=$1 name=$2
  shift 2
  inq-train --config-dir experiments --config-name "study_$dataset" \
    "hydra.run.dir=$out/${name}_seed$seed" "trainer.seed=$seed" "$@" \
    >>"$out/${name}_seed$seed.log" 2>&1 || { tail -n 20 "$out/${name}_seed$seed.log"; return 1; }
}

job() {  # job SEED BITS:SPARSITY[:FC_SPARSITY]
  local seed=$1 bits sparsity fc layers name
  IFS=: read -r bits sparsity fc <<<"$2"
  layers="0:$(python -c "print(min($sparsity, 0.5))")" name="b${bits}_s$sparsity"
  [[ -z $fc ]] || { layers+=",${fc_layer[$dataset]}:$fc" name+="_fc$fc"; }
  train "$seed" "$name" "model.checkpoint=${FLOAT:-$out/float_seed$seed}/checkpoints/float.pt" \
    trainer.float_epochs=0 "inq.bits=$bits" "inq.portions=${schedule[$bits]}" inq.n1_rule=mse \
    "prune.sparsity=$sparsity" "prune.layers=[$layers]" prune.steps=3 \
    "prune.epochs=$prune_epochs" "${inq_epochs[@]}"
}

mkdir -p "$out"
start=$SECONDS
echo "pruning study $dataset, seeds $seeds, ${JOBS:-1} at once -> $out"
failed=0
for seed in ${seeds//,/ }; do
  [[ -n ${FLOAT:-} ]] || train "$seed" float inq.method=oneshot
  for spec in $specs; do
    while (($(jobs -rp | wc -l) >= ${JOBS:-1})); do wait -n || failed=$((failed + 1)); done
    job "$seed" "$spec" &
  done
done
while (($(jobs -rp | wc -l))); do wait -n || failed=$((failed + 1)); done
echo "all jobs done in $((SECONDS - start)) s ($failed failed); runs in $out"
update=()
[[ -z ${UPDATE_RESULTS:-} ]] || update=(--update-results)
python experiments/collect_prune.py "$out" --dataset "$dataset" "${update[@]}"
