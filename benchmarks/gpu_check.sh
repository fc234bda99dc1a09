#!/usr/bin/env bash
# The checks a lent GPU machine is for, in one command that fits its lease (CI never runs this: it
# has no GPU). Issue 31's run: offload bench vs DeepSpeed first (what the targets are about), then
# every engine path on CUDA, ZeRO-Inference, the HF Trainer.
#
#   benchmarks/gpu_check.sh OUT_DIR [WHEEL_DIR]
#
# WHEEL_DIR: wheels to install first (the machine cannot download: DeepSpeed built with
# DS_BUILD_OPS=0, hjson, pydantic 2 and its parts). BUDGET (seconds, default 540) bounds the whole
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
    timeout -k 10 "$t" "$@" >"$OUT/step.log" 2>&1
    rc=$?
    cat "$OUT/step.log" >>"$LOG"
    grep -v '^dslaunch:  \|^\[rank 0\]  ' "$OUT/step.log" | tail -n 6
    rm -f "$OUT/step.log"
    SUMMARY+=("$(printf '%-22s rc=%-3s %4ss' "$name" "$rc" $((SECONDS - t1)))")
    echo "${SUMMARY[-1]}" | tee -a "$LOG"
    tar -czf "$OUT/results.tgz" -C "$R" . 2>/dev/null
}

step facts 30 bash -c "nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; nproc; \
free -g | head -2; $PY -c 'import torch, transformers; print(torch.__version__, torch.version.cuda, \
torch.cuda.get_device_name(), transformers.__version__)'; PYTHONPATH=/tmp/site $PY -c 'import deepspeed; \
print(\"deepspeed\", deepspeed.__version__)' 2>&1 | tail -1"

# op builds in the background (ours and DeepSpeed's CPU Adam), so that no timed run pays for one
(PYTHONPATH=$PWD:/tmp/site timeout 240 $PY benchmarks/bench_gpu_train.py --prebuild-only \
    --peer-python "$PY" --peer-pythonpath /tmp/site >"$R/prebuild.log" 2>&1; echo "prebuild rc=$?" >>"$R/prebuild.log") &
PREBUILD=$!

step cuda-tests 90 $PY -m pytest -q -p no:cacheprovider -x tests/test_offload_pipeline.py \
    tests/test_offload_states.py tests/test_accelerator.py
wait $PREBUILD; tail -3 "$R/prebuild.log" | tee -a "$LOG"

step offload-bench 260 $PY benchmarks/bench_gpu_train.py --device cuda --size 355m \
    --configs z2off,z3off --rounds 2 --steps 8 --warmup 3 --omp-threads 8 \
    --peer-python "$PY" --peer-pythonpath /tmp/site --budget 240 --run-timeout 90 \
    --results-dir "$R"
step offload-step 60 $PY benchmarks/bench_offload_step.py --device cuda --size 355m --steps 6 \
    --out "$R/offload_step.json"
step cuda-paths 150 $PY benchmarks/cuda_paths.py --device cuda --prebuild --budget 130 \
    --out "$R/cuda_paths.json"
step zero-inference 90 $PY benchmarks/bench_zero_inference.py --device cuda \
    --peer-python "$PY" --peer-pythonpath /tmp/site --results-dir "$R"
step zero-bench 120 $PY benchmarks/bench_gpu_train.py --device cuda --size 355m \
    --configs z3,z2 --rounds 1 --steps 8 --warmup 3 --omp-threads 8 \
    --peer-python "$PY" --peer-pythonpath /tmp/site --budget 100 --run-timeout 60 \
    --results-dir "$R"
echo "== summary ($(( SECONDS - T0 ))s)" | tee -a "$LOG"
printf '%s\n' "${SUMMARY[@]}" | tee -a "$LOG"
