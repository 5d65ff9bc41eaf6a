#!/usr/bin/env bash
# On a CUDA machine, in one command (about 10 minutes of GPU time):
#   1. the kernel tests on the GPU, the static sm_90 check, the kernel benchmark;
#   2. a short inq-train on CUDA (ResNet-20 on synthetic 32x32 data, AMP on, integer phase);
#   3. that run's integer model on the CUDA kernels against its CPU reference, bit for bit;
#   4. a one-GPU torchrun (NCCL) of the same training;
#   5. images/s of a training step (ResNet-20, AMP) with and without the INQ scheduler attached.
# Usage: [STEPS="..."] experiments/gpu_check.sh [LOG_DIR] [extra args for `inq bench kernel`]
# STEPS picks some of: tests static bench train integer ddp step (default: all, in that order;
# integer needs train). Each step stops after STEP_TIMEOUT seconds (default 480).
# Logs go to LOG_DIR (default: gpu_logs). Needs torch (CUDA) with triton, torchvision,
# safetensors, scikit-learn, pytest, hypothesis, hydra-core and tensorboard. Runs from a plain
# checkout too (python3 -m puts the repository root on the import path).
set -uo pipefail
cd "$(dirname "$0")/.."
logs=${1:-gpu_logs}
shift || true
mkdir -p "$logs"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
unset TRITON_INTERPRET  # compiled kernels on the GPU, not the interpreter
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$logs/gpu.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda,
'triton', triton.__version__)" | tee -a "$logs/gpu.txt"

steps=" ${STEPS:-tests static bench train integer ddp step} "
wanted() { [[ $steps == *" $1 "* ]]; }

step() {  # step NAME LOG COMMAND...: run it, log its output, print its exit status and time
  local name=$1 log=$2
  shift 2
  local start=$(date +%s)
  timeout "${STEP_TIMEOUT:-480}" "$@" >"$logs/$log" 2>&1
  local rc=$?
  echo "$name: exit $rc after $(($(date +%s) - start)) s (log: $logs/$log)"
  return $rc
}

if wanted tests; then
  step "kernel tests (GPU)" test.log python3 -m pytest tests/test_kernels_triton.py \
    tests/test_kernels_ops.py tests/test_nn.py -q --tb=short -p no:cacheprovider
  grep -E "passed|failed|error" "$logs/test.log" | tail -n 3
  grep -E "^(FAILED|ERROR)" "$logs/test.log" | head -n 20
fi

wanted static && step "static check" static.log python3 -m inq.cli bench kernel --static

if wanted bench; then
  step "kernel bench" bench.log python3 -m inq.cli bench kernel --json "$logs/kernel_bench.json" "$@"
  cat "$logs/bench.log"
fi

train=(model=resnet20 data=synthetic data.image_size=32 data.train_size=8192 data.batch_size=128
  trainer.device=cuda trainer.amp=true trainer.float_epochs=3 inq.epochs=1 trainer.progress=false
  quant.act_bits=8 quant.batches=4)
if wanted train; then
  rm -rf "$logs/train"
  step "inq-train on CUDA (AMP)" train.log python3 -m inq.train.app "${train[@]}" \
    hydra.run.dir="$logs/train"
  tail -n 9 "$logs/train.log"
fi

if wanted integer; then
  step "integer model: CUDA kernels vs reference" integer.log \
    python3 experiments/gpu_integer_check.py "$logs/train"
  tail -n 3 "$logs/integer.log"
fi

if wanted ddp; then
  rm -rf "$logs/ddp"
  step "torchrun, 1 GPU (NCCL)" ddp.log torchrun --standalone --nproc_per_node=1 \
    -m inq.train.app "${train[@]}" hydra.run.dir="$logs/ddp"
  tail -n 2 "$logs/ddp.log"
fi

if wanted step; then
  step "training step, with and without INQ" step.log python3 experiments/bench_core.py \
    --only step --device cuda --amp --batch 256 --steps 50 --json "$logs/step.json"
  cat "$logs/step.log"
fi
