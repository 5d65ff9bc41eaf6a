# Sourced by the study scripts: run_all FUNC ITEM... calls FUNC with each ITEM's words as its
# arguments, JOBS (default 1) at once, and returns when all have finished (also when one fails:
# nothing is left running); a failed call fails run_all. run_seeds FUNC SEEDS does the same for
# each seed of the comma-separated SEEDS. train SEED NAME OVERRIDES... runs one inq-train of
# experiments/study_$config.yaml into $out/NAME/seedSEED (the caller sets config and out),
# skipped when it finished, resumed when it was stopped.
run_all() {
  local func=$1 pids=() item pid failed=0
  shift
  for item in "$@"; do
    while (($(jobs -rp | wc -l) >= ${JOBS:-1})); do wait -n || failed=1; done
    # shellcheck disable=SC2086  # an item is its words
    "$func" $item &
    pids+=($!)
  done
  for pid in "${pids[@]}"; do wait "$pid" || failed=1; done
  return "$failed"
}

run_seeds() {
  # shellcheck disable=SC2086
  run_all "$1" ${2//,/ }
}

train() {  # train SEED NAME OVERRIDES...: one run into $out/NAME/seedSEED, skipped when done
  local seed=$1 name=$2 dir="$out/$2/seed$1" log="$out/$2/seed$1.log"
  shift 2
  [[ -f "$dir/summary.json" ]] && return 0
  mkdir -p "$out/$name"
  local start=("hydra.run.dir=$dir")
  if [[ -f "$dir/checkpoints/latest.pt" ]]; then
    start+=("trainer.resume=$dir")
  elif [[ -d "$dir" ]]; then  # stopped before its first checkpoint: keep it aside, start over
    mv "$dir" "$dir.stopped.$(date +%s)"
  fi
  inq-train --config-dir experiments --config-name "study_$config" "trainer.seed=$seed" \
    "${start[@]}" "$@" ${EXTRA:-} >>"$log" 2>&1 || { tail -n 20 "$log"; return 1; }
}
