#!/usr/bin/env bash
# The checks a lent GPU machine is for, in one command (CI never runs this: it has no GPU).
#
#   benchmarks/gpu_check.sh OUT_DIR [quick|short|full] [WHEEL_DIR]
#
# 1. machine facts (nvidia-smi, torch, nvcc); 2. `--build-all` of the compiled ops, CUDA ones included;
# 3. the CUDA ops' correctness tests and the accelerator/ops-face tests, with the GPU present;
# 4. the training example on one GPU (fp32, bf16, ZeRO-3, CPU-offloaded optimizer, 1-bit Adam,
#    checkpoint + resume); 5. bench_train.py on one GPU: ZeRO 0-3 (and 2+offload), fp32 and bf16,
#    dslaunch vs DeepSpeed (loss curves, tokens/s, peak GPU memory), JSON into OUT_DIR.
# WHEEL_DIR: wheels to install first (the machine cannot download: DeepSpeed and its missing deps).
# Every step runs even if an earlier one failed, each under a time limit (STEP_TIMEOUT, default 120 s;
# the bench 300 s), and appends to OUT_DIR/gpu_check.log as it goes (one file, complete up to the
# moment even if the whole command is killed); a summary line per step ends the output.
set -u
OUT=${1:?usage: gpu_check.sh OUT_DIR [quick|short|full] [WHEEL_DIR]}
MODE=${2:-quick}
WHL=${3:-}
PY=${PYTHON:-python3}
LOG=$OUT/gpu_check.log
STEP_TIMEOUT=${STEP_TIMEOUT:-120}
mkdir -p "$OUT"
: >"$LOG"
if [ -n "$WHL" ]; then
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$WHL"/*.whl \
        || { echo "wheel install failed"; exit 1; }
    export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 DSLAUNCH_CACHE_DIR=/tmp/dslaunch-ops
SUMMARY=()

step() {  # step NAME COMMAND...: run it under the time limit, log it, remember its exit status
    local name=$1; shift
    local t0=$SECONDS rc
    echo "== $name: $*" | tee -a "$LOG"
    timeout -k 10 "$STEP_TIMEOUT" "$@" >"$OUT/step.log" 2>&1
    rc=$?
    cat "$OUT/step.log" >>"$LOG"
    grep -v '^dslaunch:  \|^\[rank 0\]  ' "$OUT/step.log" | tail -n 8
    rm -f "$OUT/step.log"
    SUMMARY+=("$(printf '%-24s rc=%-3s %4ss' "$name" "$rc" $((SECONDS - t0)))")
    echo "${SUMMARY[-1]}" >>"$LOG"
}

train() {  # train NAME CONFIG [ARGS...]: the example on one GPU through the CLI
    local name=$1 cfg=$2; shift 2
    step "example-$name" $PY -m dslaunch run --nproc-per-node 1 examples/train_gpt.py --config "$cfg" \
        --log-every 20 "$@"
}

if [ "$MODE" != short ]; then  # short: the training steps only (a re-check after a fix)
step facts bash -c "nvidia-smi; $PY -c 'import torch; print(torch.__version__, torch.version.cuda, \
torch.cuda.get_device_name())'; nvcc --version | tail -2; $PY -c 'import deepspeed; print(deepspeed.__version__)'"
step ops-build $PY -m dslaunch.kernels.builder --build-all
step ops-tests $PY -m pytest -q -p no:cacheprovider tests/test_ops_cuda.py tests/test_ops_report.py \
    tests/test_accelerator.py tests/test_ops_face.py
train fp32 configs/gpt_small.json --steps 60
train bf16 configs/gpt_small_bf16.yaml --steps 60
train zero3 configs/zero3.json --steps 60
fi
train zero2-offload configs/zero2_offload.json --steps 60
train onebit configs/onebit_adam.json --steps 60
train save configs/zero3.json --steps 30 --checkpoint-dir /tmp/gpu-ckpt
train resume configs/zero3.json --steps 60 --checkpoint-dir /tmp/gpu-ckpt --resume
if [ "$MODE" = full ]; then
    BENCH=(--stages 0,1,2,3,2+offload --precision fp32,bf16 --repeats 2 --steps 30 --warmup 5 --micro-batch 32)
elif [ "$MODE" = short ]; then
    BENCH=(--stages 0,2,3 --precision fp32 --repeats 1 --steps 10 --warmup 3 --micro-batch 32 --no-warmup-runs)
else
    BENCH=(--stages 0,3 --precision bf16,fp32 --repeats 1 --steps 15 --warmup 3 --micro-batch 32 --no-warmup-runs)
fi
# DeepSpeed 0.19.8's JIT builder cannot parse arch entries such as "9.0a" that an image may set here
export TORCH_CUDA_ARCH_LIST=$($PY -c 'import torch; print("%d.%d" % torch.cuda.get_device_capability())')
STEP_TIMEOUT=${BENCH_TIMEOUT:-300} step bench $PY benchmarks/bench_train.py --device cuda --nproc 1 --peers deepspeed --peer-python "$PY" \
    --omp-threads 4 --results-dir "$OUT" --show-losses 3 --keep-logs "${BENCH[@]}"
RUNS=$(sed -n 's/.*run directories under //p' "$LOG" | head -1)
[ -n "$RUNS" ] && tar -czf "$OUT/bench_runs.tgz" -C "$RUNS" .
echo "== summary"
printf '%s\n' "${SUMMARY[@]}"
