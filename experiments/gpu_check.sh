#!/usr/bin/env bash
# On a CUDA machine, in one command (at most 9 minutes of GPU time by default, about 6 on the
# H200 run of 2026-11-27, machine start excluded), writing everything into LOG_DIR (default: a
# new temporary directory outside the repository, printed first; copy what you keep into
# experiments/gpu/ under a dated name; on the device tool, tar LOG_DIR into $OUT: only 8 files
# come back), the most wanted first:
#   bench   the kernel benchmark against cuBLAS/cuDNN, each op timed three ways: one call
#           after a clean L2 flush (a read-only sweep; the goals' figure, 50 runs), one after
#           the former dirty flush (a write of twice L2, whose write-back lands in the call; 10
#           runs), and per call back to back in one CUDA graph over rotating copies of its
#           inputs (10 replays); each tiling the linear and conv dispatchers offer (clean, 10
#           runs each); each harness's floor first (an add_, copies of 8-128 MiB); and ResNet-18
#           end to end as CUDA graphs (cuDNN fp16, shift fp16, the integer model on int8 tensor
#           cores, whose logits must equal its CPU reference's, and each of its ops alone)
#           (bench.log, kernel_bench.json); with the static step, the time model against this run
#           (experiments/model_records.py, clean and dirty flush: model_clean.json,
#           model_dirty.json; copy them into experiments/gpu/ under a dated name, where CI checks
#           the model against every one; without it, make them here afterwards from a static
#           check compiled with the GPU's Triton, which needs no GPU), and the model's estimate
#           of the integer ResNet-18 op by op beside each op's time (integer_estimate.log);
#   ncu     Nsight Compute on the batch-1 and a batch-1024 linear kernel: DRAM throughput,
#           issue slots, pipe utilisation, warp stall reasons (ncu_batch1.txt, ncu_batch1024.txt);
#   imma    the int8 tensor-core tests on the GPU, fused requantization and residual adds and
#           a small ResNet's integer model with them (imma.log);
#   convtests  the conv kernel tests on the GPU (convtest.log);
# and, when named in STEPS:
#   static  the static sm_90 check with this machine's Triton (static.log, static.json);
#   tests   the linear and layout kernel tests on the GPU (test.log; over 3 minutes of compiling);
#   train_speed  images/s of training steps, plain and with INQ attached (60 % frozen, with and
#           without cache_values), ResNet-20 and ResNet-18, fp16 and bf16, eager then
#           torch.compile, for 60 s (the groups left then are skipped and listed; the whole
#           benchmark: python3 experiments/bench_train.py) (train_speed.log, train_speed.json);
#   train   a short inq-train on CUDA (ResNet-20 on synthetic 32x32 data, AMP on, integer phase);
#   integer that run's integer model on the CUDA kernels against its CPU reference, bit for bit;
#   ddp     a one-GPU torchrun (NCCL) of the same training.
# Usage: [STEPS="..."] experiments/gpu_check.sh [LOG_DIR] [extra args for `inq bench kernel`]
# STEPS default: "bench ncu imma convtests". Each step stops after its own limit (bench 300 s,
# each ncu run 45, imma 60, convtests 100, tests 180, the others 120; the first calls compile
# every kernel they use), or after STEP_TIMEOUT seconds where that is set; train_speed after
# min(its limit, 90) (it starts groups for 30 s less, which leaves 30 s to the group in flight).
# Needs torch (CUDA) with triton, torchvision, safetensors, scikit-learn, pytest, hypothesis,
# omegaconf, and for the training steps hydra-core and tensorboard. Runs from a plain checkout
# too (python3 -m puts the repository root on the import path). LOG_DIR is taken relative to
# the directory it is started from.
# Exit status: 0 when every step passed; 1 when one failed (the last line names each failed
# step with its exit status; 124: it ran out of time); 2 without a CUDA GPU, at once, having run
# and written nothing.
set -uo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
steps=" ${STEPS:-bench ncu imma convtests} "
wanted() { [[ $steps == *" $1 "* ]]; }
for name in $steps; do
  [[ " tests convtests imma static bench ncu train_speed train integer ddp " == *" $name "* ]] || {
    echo "gpu_check.sh: STEPS names no step $name (steps: tests convtests imma static bench ncu train_speed train integer ddp)" >&2
    exit 2
  }
done
case $(python3 -c "import torch; print(torch.cuda.is_available())" 2>/dev/null) in
  True) ;;
  False)
    echo "gpu_check.sh: no CUDA GPU (torch.cuda.is_available() is False): nothing run" >&2
    exit 2
    ;;
  *)
    echo "gpu_check.sh: python3 cannot import torch: nothing run" >&2
    exit 2
    ;;
esac
python3 -c "import omegaconf" 2>/dev/null || {  # inq imports it; the GPU image lacks it
  echo "gpu_check.sh: python3 cannot import omegaconf (inq.data needs it): install it, or carry" \
    "its wheel and antlr4-python3-runtime's: nothing run" >&2
  exit 2
}
if (($#)); then
  logs=$1
  shift
else
  logs=$(mktemp -d "${TMPDIR:-/tmp}/inq-gpu-check.XXXXXX") || exit 2
fi
mkdir -p "$logs" && logs=$(cd "$logs" && pwd) || exit 2
cd "$repo"
echo "gpu_check.sh: logs in $logs"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
unset TRITON_INTERPRET  # compiled kernels on the GPU, not the interpreter
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$logs/gpu.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda,
'triton', triton.__version__)" | tee -a "$logs/gpu.txt"

declare -A limits=([bench]=300 [ncu]=45 [imma]=60 [convtests]=100 [tests]=180)
limit_of() { echo "${STEP_TIMEOUT:-${limits[$1]:-120}}"; }  # a step's limit in seconds
step() {  # [limit=S] step NAME LOG COMMAND...: run it (for at most S seconds), log its output,
  local name=$1 log=$2  # print its exit status and time
  shift 2
  local start=$(date +%s)
  timeout "${limit:?}" "$@" >"$logs/$log" 2>&1
  local rc=$?  # timeout's status: the command's own, or 124 when it ran out of time
  echo "$name: exit $rc after $(($(date +%s) - start)) s (log: $logs/$log)"
  ran=$((ran + 1))
  ((rc == 0)) || failed+=("$name (exit $rc)")
  return $rc
}
ran=0
failed=()

wanted static && limit=$(limit_of static) step "static check" static.log python3 -m inq.cli bench kernel --static \
  --bits 4 --json "$logs/static.json"

if wanted bench; then
  limit=$(limit_of bench) step "kernel bench" bench.log python3 -m inq.cli bench kernel --json "$logs/kernel_bench.json" "$@"
  cat "$logs/bench.log"
  if wanted static; then  # the time model against this run, each flush apart (model_*.json)
    triton=$(awk '/triton/ {print $NF}' "$logs/gpu.txt")
    for flush in clean dirty; do
      limit=$(limit_of model) step "time model vs this run ($flush flush)" "model_$flush.log" python3 \
        experiments/model_records.py "$logs/kernel_bench.json" "$logs/static.json" \
        --harness "$flush flush" --triton "${triton:-unknown}" -o "$logs/model_$flush.json"
      tail -n 1 "$logs/model_$flush.log"
    done
    # the integer ResNet-18 op by op, the model's estimate beside each op's measured time
    limit=$(limit_of model) step "integer model estimate vs this run" integer_estimate.log \
      python3 experiments/integer_estimate.py "$logs/static.json" "$logs/kernel_bench.json"
    tail -n 1 "$logs/integer_estimate.log"
  fi
fi

if wanted ncu; then
  if command -v ncu >/dev/null; then
    for batch in 1 1024; do
      limit=$(limit_of ncu) step "ncu, linear 4096x4096 at batch $batch" "ncu_batch$batch.txt" ncu --launch-skip 3 \
        --launch-count 1 -k "regex:_mma_kernel|_gemv_kernel" --section SpeedOfLight --section SchedulerStats \
        --section WarpStateStats --section ComputeWorkloadAnalysis \
        --section MemoryWorkloadAnalysis python3 experiments/gpu_ncu.py "$batch"
      grep -E "DRAM Throughput|Memory Throughput|Issue Slots Busy|Issued Warp|No Eligible|Duration" \
        "$logs/ncu_batch$batch.txt" | head -n 8
    done
  else
    echo "ncu: not installed on this machine; no profile taken"
  fi
fi

if wanted imma; then
  limit=$(limit_of imma) step "int8 tensor-core and conv tests (GPU)" imma.log python3 -m pytest \
    tests/test_kernels_triton.py tests/test_kernels_int8_layout.py -q --tb=short \
    -p no:cacheprovider -k "imma or requant or conv_int8 or opcheck_int8 or fused_residual"
  grep -E "passed|failed|error" "$logs/imma.log" | tail -n 3
  grep -E "^(FAILED|ERROR)" "$logs/imma.log" | head -n 20
fi

if wanted convtests; then
  limit=$(limit_of convtests) step "conv tests (GPU)" convtest.log python3 -m pytest tests/test_kernels_triton.py \
    -k "shift_conv2d" -q --tb=short -p no:cacheprovider
  grep -E "passed|failed|error" "$logs/convtest.log" | tail -n 3
fi

if wanted tests; then  # the linear kernels and their layout (the conv tests: STEPS=convtests)
  limit=$(limit_of tests) step "kernel tests (GPU)" test.log python3 -m pytest tests/test_kernels_triton.py \
    tests/test_kernels_layout.py -k "linear or layout or decode or every_path or generic" \
    -q --tb=short -p no:cacheprovider
  grep -E "passed|failed|error" "$logs/test.log" | tail -n 3
  grep -E "^(FAILED|ERROR)" "$logs/test.log" | head -n 20
fi

if wanted train_speed; then  # groups start for 30 s less than its limit, the eager ones first
  speed_limit=$(limit_of train_speed)
  speed_limit=$((speed_limit < 90 ? speed_limit : 90))
  limit=$speed_limit step "training speed, with and without INQ" train_speed.log python3 \
    experiments/bench_train.py --device cuda --json "$logs/train_speed.json" \
    --budget-s $((speed_limit > 30 ? speed_limit - 30 : 0))
  cat "$logs/train_speed.log"
fi

train=(model=resnet20 data=synthetic data.image_size=32 data.train_size=8192 data.batch_size=128
  trainer.device=cuda trainer.amp=true trainer.float_epochs=3 inq.epochs=1 trainer.progress=false
  quant.act_bits=8 quant.batches=4)
if wanted train; then
  rm -rf "$logs/train"
  limit=$(limit_of train) step "inq-train on CUDA (AMP)" train.log python3 -m inq.train.app "${train[@]}" \
    hydra.run.dir="$logs/train"
  tail -n 9 "$logs/train.log"
fi

if wanted integer; then
  limit=$(limit_of integer) step "integer model: CUDA kernels vs reference" integer.log \
    python3 experiments/gpu_integer_check.py "$logs/train"
  tail -n 3 "$logs/integer.log"
fi

if wanted ddp; then
  rm -rf "$logs/ddp"
  limit=$(limit_of ddp) step "torchrun, 1 GPU (NCCL)" ddp.log torchrun --standalone --nproc_per_node=1 \
    -m inq.train.app "${train[@]}" hydra.run.dir="$logs/ddp"
  tail -n 2 "$logs/ddp.log"
fi

if ((${#failed[@]})); then
  summary=$(printf '; %s' "${failed[@]}")
  echo "gpu_check.sh: ${#failed[@]} of $ran steps failed: ${summary:2} (logs: $logs)"
  exit 1
fi
echo "gpu_check.sh: all $ran steps passed (logs: $logs)"
