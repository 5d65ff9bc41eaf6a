#!/usr/bin/env bash
# On a CUDA machine: build the kernels, run the CUDA tests, run the kernel benchmark.
# Usage: experiments/gpu_check.sh [LOG_DIR] [extra args for `inq bench kernel`]
# Logs (build.log, test.log, bench.log, kernel_bench.json) go to LOG_DIR (default: gpu_logs).
# Needs torch (CUDA), torchvision, safetensors, scikit-learn, pytest, ninja and nvcc; not Hydra.
# Runs from a plain checkout too (python3 -m puts the repository root on the import path).
set -uo pipefail
cd "$(dirname "$0")/.."
logs=${1:-gpu_logs}
shift || true
mkdir -p "$logs"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$logs/gpu.txt"
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)" | tee -a "$logs/gpu.txt"

start=$(date +%s)
python3 -m inq.cli build-kernels -v >"$logs/build.log" 2>&1
echo "build: exit $? after $(($(date +%s) - start)) s"; tail -n 3 "$logs/build.log"

start=$(date +%s)
python3 -m pytest -m cuda tests/test_kernels_cuda.py -q --tb=short -p no:cacheprovider \
  >"$logs/test.log" 2>&1
echo "cuda tests: exit $? after $(($(date +%s) - start)) s"
grep -E "passed|failed|error" "$logs/test.log" | tail -n 3
grep -E "^(FAILED|ERROR)" "$logs/test.log" | head -n 20

start=$(date +%s)
python3 -m inq.cli bench kernel --json "$logs/kernel_bench.json" "$@" 2>&1 | tee "$logs/bench.log"
echo "bench: exit $? after $(($(date +%s) - start)) s"
