#!/usr/bin/env bash
# The checks a lent GPU machine is for, in one command that fits its lease (CI never runs this: it
# has no GPU). Issue 31's run: offload bench vs DeepSpeed first (what the targets are about), then
# every engine path on CUDA, ZeRO-Inference, the HF Trainer.
#
#   benchmarks/gpu_check.sh OUT_DIR [WHEEL_DIR]
#
# WHEEL_DIR: wheels to install first (the machine cannot download: DeepSpeed built with
# DS_BUILD_OPS=0, hjson, pydantic 2 and its parts: benchmarks/gpu_wheels.sh makes them). BUDGET (seconds, default 540) bounds the whole
# command: each step runs under min(its own limit, what is left), a step with under 20 s left is
# skipped, and the benches are told their share so they stop starting runs in time. Each step
# appends to OUT_DIR/gpu_check.log as it goes (complete up to the moment even if the command is
# killed); the results (JSON, run logs) go under a scratch folder that is packed into
# OUT_DIR/results.tgz after every step; a summary line per step ends the output.
set -u
OUT=${1:?usage: gpu_check.sh OUT_DIR [WHEEL_DIR]}
WHL=${2:-}
BUDGET=${BUDGET:-540}
PY=${PYTHON:-python3}
LOG=$OUT/gpu_check.log
R=${RESULTS:-/tmp/gpu-results}
T0=$SECONDS
mkdir -p "$OUT" "$R"
: >"$LOG"
if [ -n "$WHL" ]; then
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$WHL"/*.whl \
        >>"$LOG" 2>&1 || { echo "wheel install failed"; tail -5 "$LOG"; exit 1; }
    export PEER_PYTHONPATH=/tmp/site
fi
# dslaunch from this tree; DeepSpeed only where a peer run asks for it (PEER_PYTHONPATH)
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 DSLAUNCH_CACHE_DIR=/tmp/dslaunch-ops
# DeepSpeed 0.19.8's JIT builder cannot parse arch entries such as "9.0a" that an image may set
export TORCH_CUDA_ARCH_LIST=$($PY -c 'import torch; print("%d.%d" % torch.cuda.get_device_capability())')
export DSLAUNCH_CUDA_ARCHS=${TORCH_CUDA_ARCH_LIST/./}
SUMMARY=()

left() { echo $((BUDGET - (SECONDS - T0))); }

step() {  # step NAME LIMIT COMMAND...: run it under min(LIMIT, time left), log it, keep its status
    local name=$1 limit=$2; shift 2
    local t=$(( $(left) - 5 )) t1=$SECONDS rc
    [ "$t" -gt "$limit" ] && t=$limit
    if [ "$t" -lt 20 ]; then
        SUMMARY+=("$(printf '%-22s skipped (budget)' "$name")"); echo "${SUMMARY[-1]}" | tee -a "$LOG"
        return
    fi
    echo "== $name (limit ${t}s, $(( SECONDS - T0 ))s in): $*" | tee -a "$LOG"
    local from=$(( $(stat -c %s "$LOG") + 1 ))
    timeout -k 10 "$t" "$@" >>"$LOG" 2>&1  # straight into the log: complete if we are killed
    rc=$?
    tail -c +"$from" "$LOG" | grep -v '^dslaunch:  \|^\[rank 0\]  ' | tail -n 6
    SUMMARY+=("$(printf '%-22s rc=%-3s %4ss' "$name" "$rc" $((SECONDS - t1)))")
    echo "${SUMMARY[-1]}" | tee -a "$LOG"
    tar -czf "$OUT/results.tgz" -C "$R" . 2>/dev/null
}

step facts 30 bash -c "nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; nproc; \
free -g | head -2; $PY -c 'import torch, transformers; print(torch.__version__, torch.version.cuda, \
torch.cuda.get_device_name(), transformers.__version__)'; PYTHONPATH=/tmp/site $PY -c 'import deepspeed; \
print(\"deepspeed\", deepspeed.__version__)' 2>&1 | tail -1"

# the offload-pipeline and offload_states tests with real streams and pinned memory
step cuda-tests 90 $PY -m pytest -q -p no:cacheprovider tests/test_offload_pipeline.py \
    tests/test_offload_states.py tests/test_accelerator.py
GPU_TRAIN=(--device cuda --size 355m --omp-threads 16 --peer-python "$PY" --peer-pythonpath /tmp/site
           --results-dir "$R/gpu_train")
# the targets: ZeRO-2 + offload_optimizer, ZeRO-3 + offload_param/optimizer, dslaunch vs DeepSpeed
# (--prebuild: both runtimes' JIT ops built before the first timed run)
step offload-bench 250 $PY benchmarks/bench_gpu_train.py "${GPU_TRAIN[@]}" --configs z2off,z3off \
    --rounds 2 --steps 8 --warmup 3 --prebuild --prebuild-timeout 100 --budget 240 --run-timeout 75
step cuda-paths 110 $PY benchmarks/cuda_paths.py --device cuda --prebuild --budget 100 \
    --out "$R/cuda_paths.json"
step zero-inference 75 $PY benchmarks/bench_zero_inference.py --hidden 4096 --layers 16 --heads 32 \
    --intermediate 11008 --vocab 32000 --batch 4 --prompt-len 512 --new-tokens 8 --prefill-iters 1 \
    --gpu-cap-gb 4 --check --omp-threads 16 --timeout 60 --peer-python "$PY" \
    --peer-pythonpath /tmp/site --results-dir "$R"
step offload-step 45 $PY benchmarks/bench_offload_step.py --device cuda --size 355m --steps 5 \
    --out "$R/offload_step.json"
step zero-bench 120 $PY benchmarks/bench_gpu_train.py "${GPU_TRAIN[@]}" --configs z3,z2 --rounds 1 \
    --steps 8 --warmup 3 --budget 110 --run-timeout 50
step hf-trainer 70 $PY benchmarks/bench_gpu_train.py "${GPU_TRAIN[@]}" --script hf --configs z3 \
    --rounds 1 --steps 6 --warmup 2 --budget 60 --run-timeout 55
echo "== summary ($(( SECONDS - T0 ))s)" | tee -a "$LOG"
printf '%s\n' "${SUMMARY[@]}" | tee -a "$LOG"
tar -czf "$OUT/results.tgz" -C "$R" . 2>/dev/null
