#!/usr/bin/env bash
# Wheels the GPU machine lacks (it cannot download), for benchmarks/gpu_check.sh's peer runs:
# DeepSpeed 0.19.8 built without ops (its JIT builds them there) and the packages it needs that the
# GPU image does not have, for that machine's Python 3.12 on x86-64.
#
#   benchmarks/gpu_wheels.sh [DIR]      # default .whl (keep it out of git: .git/info/exclude)
set -euo pipefail
DIR=${1:-.whl}
PY=${PYTHON:-python3}
mkdir -p "$DIR"
DS_BUILD_OPS=0 $PY -m pip wheel -q --no-deps --no-build-isolation -w "$DIR" deepspeed==0.19.8
for spec in hjson==3.1.0 pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 \
        typing-inspection==0.4.5 typing-extensions==4.16.0; do
    $PY -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 -d "$DIR" "$spec"
done
ls -la "$DIR"
