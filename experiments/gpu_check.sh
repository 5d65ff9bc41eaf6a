#!/usr/bin/env bash
# On a CUDA machine: the kernel tests on the GPU, the static sm_90 check, the kernel benchmark.
# Usage: experiments/gpu_check.sh [LOG_DIR] [extra args for `inq bench kernel`]
# Logs (gpu.txt, test.log, static.log, bench.log, kernel_bench.json) go to LOG_DIR (default:
# gpu_logs). Needs torch (CUDA) with triton, torchvision, safetensors, scikit-learn, pytest and
# hypothesis; not Hydra. Runs from a plain checkout too (python3 -m puts the repository root on
# the import path).
set -uo pipefail
cd "$(dirname "$0")/.."
logs=${1:-gpu_logs}
shift || true
mkdir -p "$logs"
export PYTHONUNBUFFERED=1
unset TRITON_INTERPRET  # compiled kernels on the GPU, not the interpreter
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$logs/gpu.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda,
'triton', triton.__version__)" | tee -a "$logs/gpu.txt"

start=$(date +%s)
python3 -m pytest tests/test_kernels_triton.py tests/test_kernels_ops.py tests/test_nn.py -q \
  --tb=short -p no:cacheprovider >"$logs/test.log" 2>&1
echo "kernel tests (GPU): exit $? after $(($(date +%s) - start)) s"
grep -E "passed|failed|error" "$logs/test.log" | tail -n 3
grep -E "^(FAILED|ERROR)" "$logs/test.log" | head -n 20

start=$(date +%s)
python3 -m inq.cli bench kernel --static >"$logs/static.log" 2>&1
echo "static check: exit $? after $(($(date +%s) - start)) s"

start=$(date +%s)
python3 -m inq.cli bench kernel --json "$logs/kernel_bench.json" "$@" 2>&1 | tee "$logs/bench.log"
echo "bench: exit $? after $(($(date +%s) - start)) s"
