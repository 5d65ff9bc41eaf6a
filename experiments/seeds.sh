# Sourced by the study scripts: run_seeds FUNC SEEDS calls FUNC SEED for each seed of the
# comma-separated SEEDS, JOBS (default 1) at once, and returns when all have finished (also
# when one fails: no seed is left running); a failed seed fails the call.
run_seeds() {
  local func=$1 seeds=$2 pids=() seed pid failed=0
  for seed in ${seeds//,/ }; do
    while (($(jobs -rp | wc -l) >= ${JOBS:-1})); do wait -n || failed=1; done
    "$func" "$seed" &
    pids+=($!)
  done
  for pid in "${pids[@]}"; do wait "$pid" || failed=1; done
  return "$failed"
}
